"""DirectorySource with several tasks: each file of the directory is read by one of them.

A source that writes a partitioned topic with ``tasks.max`` tasks needs its input
shared out: here three tasks of one connector poll one directory of 24 files (the
tasks' Spark reads are real); every file is in exactly one task's batches, every row
arrives once, and a task started again over the same committed offsets reads nothing
more. A config from before files were shared out (no task number) still reads them all.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from herder.connect import OffsetReader, SourceBatch, SourceTaskContext
from herder.connectors.directory import DirectorySourceConnector, DirectorySourceTask
from herder.dataplane import SparkRuntime

pytestmark = pytest.mark.spark

FILES = 24
ROWS_PER_FILE = 10


class Committed(OffsetReader):
    """The connector's committed source offsets, shared by its tasks as the runtime's are."""

    def __init__(self) -> None:
        self.stored: dict[str, Mapping[str, Any]] = {}

    def offsets(self, partitions: Sequence[Mapping[str, Any]]) -> list[Any]:
        return [self.stored.get(json.dumps(p, sort_keys=True)) for p in partitions]

    def commit(self, batch: SourceBatch) -> None:
        for partition, offset in batch.offsets:
            self.stored[json.dumps(partition, sort_keys=True)] = offset


class Context(SourceTaskContext):
    def __init__(self, reader: OffsetReader) -> None:
        self.reader = reader

    @property
    def configs(self) -> Mapping[str, str]:
        return {}

    @property
    def offset_reader(self) -> OffsetReader:
        return self.reader


def write_files(directory: Path) -> None:
    directory.mkdir()
    for f in range(FILES):
        rows = range(f * ROWS_PER_FILE, (f + 1) * ROWS_PER_FILE)
        (directory / f"part-{f}.json").write_text("".join(f'{{"id": {i}}}\n' for i in rows))


def started(config: dict[str, str], committed: Committed) -> DirectorySourceTask:
    task = DirectorySourceTask()
    task.initialize(Context(committed))
    task.start(config)
    return task


def drain(task: DirectorySourceTask, committed: Committed) -> tuple[set[str], list[int]]:
    """Poll ``task`` until it has nothing new; the files and the ids it read."""
    files: set[str] = set()
    ids: list[int] = []
    while (batch := task.poll()) is not None:
        files |= {partition["file"] for partition, _ in batch.offsets}
        ids += [json.loads(row["value"])["id"] for row in batch.data.collect()]
        committed.commit(batch)
    return files, ids


@pytest.mark.timeout(300)
def test_three_tasks_share_a_directorys_files(spark: SparkRuntime, tmp_path: Path) -> None:
    directory = tmp_path / "in"
    write_files(directory)
    connector = DirectorySourceConnector()
    connector.start(
        {"directory": str(directory), "format": "json", "topic": "t", "poll.interval.ms": "10"}
    )
    configs = connector.task_configs(3)
    assert len(configs) == 3
    committed = Committed()
    read = [drain(started(config, committed), committed) for config in configs]

    files = [f for f, _ in read]
    assert all(files), f"a task read no file: {[sorted(f) for f in files]}"
    for i, mine in enumerate(files):
        for theirs in files[i + 1 :]:
            assert not mine & theirs, f"files read twice: {sorted(mine & theirs)}"
    assert set().union(*files) == {f"part-{f}.json" for f in range(FILES)}
    assert sorted(i for _, ids in read for i in ids) == list(range(FILES * ROWS_PER_FILE))
    # a task started again (after a crash, on another worker) resumes from the commits
    assert drain(started(configs[1], committed), committed) == (set(), [])


@pytest.mark.timeout(300)
def test_a_config_without_a_task_number_reads_every_file(
    spark: SparkRuntime, tmp_path: Path
) -> None:
    directory = tmp_path / "in"
    write_files(directory)
    config = {"directory": str(directory), "format": "json", "topic": "t", "poll.interval.ms": "10"}
    committed = Committed()
    files, ids = drain(started(config, committed), committed)
    assert len(files) == FILES
    assert sorted(ids) == list(range(FILES * ROWS_PER_FILE))


@pytest.mark.timeout(300)
def test_files_named_like_globs_are_each_read_once(spark: SparkRuntime, tmp_path: Path) -> None:
    """Spark reads the paths it is given as glob patterns: ``a*.json`` would also read
    ``ab.json`` (its rows twice), and ``b[1].json`` would match no file. Each file is
    read as itself, once."""
    directory = tmp_path / "in {x} [y]"
    directory.mkdir()
    names = ["a*.json", "ab.json", "b[1].json", "c?.json", "d\\e.json", "f{g,h}.json"]
    for n, name in enumerate(names):
        (directory / name).write_text(f'{{"id": {2 * n}}}\n{{"id": {2 * n + 1}}}\n')
    config = {"directory": str(directory), "format": "json", "topic": "t", "poll.interval.ms": "10"}
    committed = Committed()
    files, ids = drain(started(config, committed), committed)
    assert files == set(names)
    assert sorted(ids) == list(range(2 * len(names)))
