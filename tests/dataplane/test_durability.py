"""What a commit publishes is on disk first: staged segment files and DirectorySink's outputs.

A local ``storage.root`` is a topic's only copy, and a DirectorySink's offsets are
committed right after its ``put``. Each test records the files and directories that
``os.fsync`` is called on (by inode: a file fsynced under its temporary name is the same
file once renamed) and checks that everything the commit will point at is among them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from bench.steps import PutContext

from herder.connect import SourceRecord, TopicPartition
from herder.connectors.directory import DirectorySinkTask, output_name
from herder.dataplane import SegmentWriter, SparkRuntime, Storage
from herder.dataplane.reader import SINK_DDL
from tests.dataplane.conftest import connected
from tests.integration.conftest import ServerHandle

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.timeout(300)]


@pytest.fixture
def synced(monkeypatch: pytest.MonkeyPatch) -> Iterator[set[tuple[int, int]]]:
    """(device, inode) of everything this process fsyncs while the test runs."""
    seen: set[tuple[int, int]] = set()
    real = os.fsync

    def fsync(fd: int) -> None:
        real(fd)
        info = os.fstat(fd)
        seen.add((info.st_dev, info.st_ino))

    monkeypatch.setattr(os, "fsync", fsync)
    yield seen


def identity(path: str | Path) -> tuple[int, int]:
    info = os.stat(path)
    return info.st_dev, info.st_ino


def folders_from(path: Path, root: Path) -> list[Path]:
    """``path``'s directory and every directory above it, up to ``root``."""
    folders = []
    folder = path.parent
    while folder != root.parent:
        folders.append(folder)
        folder = folder.parent
    return folders


async def test_a_staged_batch_is_on_disk_before_it_can_be_committed(
    ensemble: ServerHandle, storage: Storage, spark: SparkRuntime, synced: set[tuple[int, int]]
) -> None:
    root = Path(storage.root)
    async with connected(ensemble, storage, spark) as topics:
        await topics.create("durable", 3)
        writer = SegmentWriter(topics, spark, "durable-0", 1)
        keyless = [SourceRecord({}, {}, "durable", b"v%d" % i) for i in range(50)]
        keyed = [SourceRecord({}, {}, "durable", b"v%d" % i, key=b"k%d" % i) for i in range(50)]
        for records in (keyless, keyed):  # one partition, written in order; then three
            staged = await writer.stage(records)
            files = [root / f for segment in staged.segments for f in segment.files]
            assert files and all(f.is_file() for f in files)
            for file in files:
                assert identity(file) in synced, f"{file} was not flushed"
                for folder in folders_from(file, root):
                    assert identity(folder) in synced, f"{folder}, above {file.name}, was not"
            await topics.commit(staged)
        assert len(staged.segments) > 1


async def test_directory_sink_outputs_are_on_disk_when_put_returns(
    spark: SparkRuntime, tmp_path: Path, synced: set[tuple[int, int]]
) -> None:
    directory = tmp_path / "new" / "out"  # two levels that start() creates
    rows = [("t", p, 7, None, None, b"line %d.%d" % (p, i), []) for p in (0, 1) for i in range(3)]
    for partitions in ([0], [0, 1]):  # one partition's lines are joined from Spark's parts
        synced.clear()
        task = DirectorySinkTask()
        task.initialize(PutContext(None))  # no offset ranges: the DataFrame is made here
        task.start({"directory": str(directory), "format": "text", "topics": "t"})
        if partitions == [0]:
            assert identity(directory.parent) in synced and identity(tmp_path) in synced
        owned = [TopicPartition("t", p) for p in partitions]
        task.bases = {tp: 7 for tp in owned}
        task.put(spark.session.createDataFrame([r for r in rows if r[1] in partitions], SINK_DDL))
        for tp in owned:
            output = directory / output_name(tp, 7, "text")
            assert output.read_bytes().count(b"\n") == 3
            assert identity(output) in synced, f"{output.name} was not flushed"
        assert identity(directory) in synced  # the names the outputs were renamed to
        task.stop()
