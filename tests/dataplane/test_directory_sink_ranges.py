"""DirectorySink given a read of a topic's files one Spark partition each (the runtime's
``offset_ranges``): an output per range, written by its partition's task, named by the
range's first offset, with no shuffle and nothing joined afterwards."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from bench.steps import PutContext

from herder.connect import OffsetRange, SourceRecord, TopicPartition
from herder.connectors import directory as directory_module
from herder.connectors.directory import DirectorySinkTask, output_name
from herder.dataplane import SegmentWriter, SparkRuntime, Storage
from herder.dataplane import delivery as delivery_module
from herder.dataplane import reader as reader_module
from herder.dataplane import writer as writer_module
from herder.dataplane.delivery import DeliveryPlan
from herder.dataplane.trickle import read_slices
from tests.dataplane.conftest import connected
from tests.integration.conftest import ServerHandle

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.timeout(300)]


def values_in(path: Path, fmt: str) -> list[bytes]:
    if fmt == "text":
        return path.read_bytes().splitlines()
    return [json.dumps({"n": n}).encode() for n in pq.read_table(path).column("n").to_pylist()]


@pytest.mark.parametrize("fmt", ["text", "parquet"])
async def test_each_offset_range_is_an_output_of_its_own(
    ensemble: ServerHandle,
    storage: Storage,
    spark: SparkRuntime,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    fmt: str,
) -> None:
    monkeypatch.setattr(writer_module, "MAX_RECORDS_PER_FILE", 1_000)

    def no_join(parts: list[str], target: str) -> None:
        raise AssertionError(f"{parts} joined: the ranges' files are the outputs")

    monkeypatch.setattr(directory_module, "join_parts", no_join)
    values = [json.dumps({"n": n}).encode() for n in range(2_500)]
    out = tmp_path / "out"
    topic = f"ranged-{fmt}"
    tp = TopicPartition(topic, 0)
    async with connected(ensemble, storage, spark) as topics:
        await topics.create(topic, 1)
        writer = SegmentWriter(topics, spark, f"{topic}-0", 1)
        staged = await writer.stage([SourceRecord({}, {}, topic, v) for v in values])
        [segment] = staged.segments
        assert segment.file_counts == [1_000, 1_000, 500]
        await topics.commit(staged)

        # from offset 500: the first file is read in part
        df, ranges = await topics.read_ranged(topic, {0: (500, 2_500)}, ordered=True)
        assert ranges == [OffsetRange(tp, 500, 1_000), OffsetRange(tp, 1_000, 2_000),
                          OffsetRange(tp, 2_000, 2_500)]  # fmt: skip
        task = DirectorySinkTask()
        task.initialize(PutContext(ranges))
        task.start({"directory": str(out), "format": fmt, "topics": topic})
        task.bases = {tp: 500}
        expected = [output_name(tp, first, fmt) for first in (500, 1_000, 2_000)]
        for _ in range(2):  # delivered again (a retry, a zombie): the outputs replace themselves
            await asyncio.to_thread(task.put, df)
            assert sorted(p.name for p in out.iterdir() if p.is_file()) == expected
            for name, r in zip(expected, ranges, strict=True):
                assert values_in(out / name, fmt) == values[r.from_offset : r.until_offset]
        task.stop()

        # without ranges (a read that is sorted, say), the batch is one output
        task = DirectorySinkTask()
        task.initialize(PutContext(None))
        task.start({"directory": str(tmp_path / "whole"), "format": fmt, "topics": topic})
        task.bases = {tp: 500}
        monkeypatch.undo()
        await asyncio.to_thread(task.put, df)
        [whole] = [p for p in (tmp_path / "whole").iterdir() if p.is_file()]
        assert whole.name == output_name(tp, 500, fmt)
        assert values_in(whole, fmt) == values[500:]
        task.stop()


async def test_a_range_spark_wrote_as_several_files_is_joined(
    ensemble: ServerHandle,
    storage: Storage,
    spark: SparkRuntime,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A session that cuts a task's output every so many rows: a range's files are one
    output, named by its range, though Spark reads the bigger file (the later offsets) first."""
    monkeypatch.setattr(writer_module, "MAX_RECORDS_PER_FILE", 1_000)
    values = [b"line %05d " % n + b"x" * (n // 10) for n in range(2_000)]
    out = tmp_path / "out"
    tp = TopicPartition("ranged-cut", 0)
    async with connected(ensemble, storage, spark) as topics:
        await topics.create(tp.topic, 1)
        writer = SegmentWriter(topics, spark, f"{tp.topic}-0", 1)
        await topics.commit(await writer.stage([SourceRecord({}, {}, tp.topic, v) for v in values]))
        df, ranges = await topics.read_ranged(tp.topic, ordered=True)
        # in the order Spark reads the files: the biggest first
        assert ranges == [OffsetRange(tp, 1_000, 2_000), OffsetRange(tp, 0, 1_000)]
        task = DirectorySinkTask()
        task.initialize(PutContext(ranges))
        task.start({"directory": str(out), "format": "text", "topics": tp.topic})
        task.bases = {tp: 0}
        conf = df.sparkSession.conf  # the read's session, which the write runs in
        conf.set("spark.sql.files.maxRecordsPerFile", "300")
        try:
            await asyncio.to_thread(task.put, df)
        finally:
            conf.unset("spark.sql.files.maxRecordsPerFile")
        task.stop()
    names = [output_name(tp, first, "text") for first in (0, 1_000)]
    assert sorted(p.name for p in out.iterdir() if p.is_file()) == names
    assert (out / names[0]).read_bytes().splitlines() == values[:1_000]
    assert (out / names[1]).read_bytes().splitlines() == values[1_000:]


async def _deliver(
    topics: Any,
    storage: Storage,
    task: DirectorySinkTask,
    topic: str,
    positions: dict[int, int],
    arrow: bool,
) -> dict[int, int]:
    """One delivery as the runtime plans it, by Spark or by the trickle path's pyarrow;
    where it reached."""
    states = {s.partition: s for s in await topics.partitions(topic)}
    plan = DeliveryPlan(1_000_000, ranged=task.offset_ranged)
    for partition, position in sorted(positions.items()):
        plan.take(TopicPartition(topic, partition), position, states[partition])
    wanted = plan.by_topic[topic]
    if arrow:
        slices = await topics.plan_read(topic, wanted)
        table = read_slices(storage, topic, slices, 1 << 30)
        assert table is not None
        task.context = PutContext(plan.ranges[topic])
        await asyncio.to_thread(task.put_arrow, table)
    else:
        df, ranges = await topics.read_ranged(topic, wanted, ordered=True)
        # its pieces, in the order Spark reads them (the biggest first)
        assert sorted(ranges) == plan.ranges[topic]
        task.context = PutContext(ranges)
        await asyncio.to_thread(task.put, df)
    return {p: stop for p, (_, stop) in wanted.items()}


@pytest.mark.parametrize("arrow", [False, True], ids=["spark", "arrow"])
@pytest.mark.parametrize("partitions", [1, 2])
async def test_a_zombie_that_reads_further_than_the_owner_writes_nothing_twice(
    ensemble: ServerHandle,
    storage: Storage,
    spark: SparkRuntime,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    partitions: int,
    arrow: bool,
) -> None:
    """A sink instance that lost its partitions without knowing it (a paused worker)
    delivers from the last commit again, after its successor did, and sees more segments
    than its successor saw: its outputs are the successor's, name for name and line for
    line, however many small segments it reads at once."""
    # reads of at most 4 pieces, so that a few segments are many
    monkeypatch.setattr(reader_module, "MAX_FILES_UNIONED", 4)
    monkeypatch.setattr(delivery_module, "MAX_FILES_UNIONED", 4)
    out = tmp_path / "out"
    topic = f"zombie-{partitions}-{arrow:d}"
    async with connected(ensemble, storage, spark) as topics:
        await topics.create(topic, partitions)
        writer = SegmentWriter(topics, spark, f"{topic}-0", 1)
        sent = 0

        async def produce(segments: int) -> None:
            nonlocal sent
            for _ in range(segments):  # small segments, as a trickle writes them
                batch = [
                    SourceRecord({}, {}, topic, b"%06d" % (sent + i), partition=i % partitions)
                    for i in range(3)
                ]
                await topics.commit(await writer.stage(batch))
                sent += len(batch)

        def started() -> DirectorySinkTask:
            task = DirectorySinkTask()
            task.initialize(PutContext(None))
            task.start({"directory": str(out), "format": "text", "topics": topic})
            task.bases = {TopicPartition(topic, p): 0 for p in range(partitions)}
            return task

        await produce(3)
        owner, zombie = started(), started()
        owner_at = await _deliver(
            topics, storage, owner, topic, dict.fromkeys(range(partitions), 0), arrow
        )
        await produce(9)
        await _deliver(topics, storage, zombie, topic, dict.fromkeys(range(partitions), 0), arrow)
        for _ in range(sent):  # each delivery takes at least one record
            if sum(owner_at.values()) >= sent:
                break
            owner_at.update(await _deliver(topics, storage, owner, topic, owner_at, arrow))
        assert sum(owner_at.values()) == sent, f"the owner stopped at {owner_at} of {sent}"
        await _deliver(topics, storage, zombie, topic, dict.fromkeys(range(partitions), 0), arrow)
        owner.stop()
        zombie.stop()
    lines = sorted(
        line for p in out.iterdir() if p.is_file() for line in p.read_bytes().splitlines()
    )
    assert lines == [b"%06d" % i for i in range(sent)]


async def test_lines_read_as_text_are_written_with_no_projection(
    ensemble: ServerHandle, storage: Storage, spark: SparkRuntime, tmp_path: Path
) -> None:
    """Lines read as DirectorySink writing text says it reads them (values alone, as
    text) are Spark's scan of the staged files, which a text put writes as it is: no
    projection copying each row, and each range's lines, bytes as they were, in its
    output; given bytes instead (a read of every column), it writes the same."""
    from herder.dataplane.datasource import whole_file_lines_dataframe

    source = tmp_path / "in.txt"
    lines = [b"line %05d \xe9\xff" % i for i in range(3_000)]  # not UTF-8: bytes as they are
    source.write_bytes(b"".join(line + b"\n" for line in lines))
    topic = "text-lines"
    tp = TopicPartition(topic, 0)
    async with connected(ensemble, storage, spark) as topics:
        await topics.create(topic, 1)
        writer = SegmentWriter(topics, spark, f"{topic}-0", 1)
        df = await spark.run(whole_file_lines_dataframe, spark.session, str(source))
        assert df is not None
        await topics.commit(await writer.stage(df, topic))

        for how, out in (("as text", tmp_path / "text"), ("as bytes", tmp_path / "bytes")):
            task = DirectorySinkTask()
            task.start({"directory": str(out), "format": "text", "topics": topic})
            columns = task.columns_read() if how == "as text" else None
            read, ranges = await topics.read_ranged(topic, ordered=True, columns=columns)
            assert ranges is not None
            task.initialize(PutContext(ranges))
            task.bases = {tp: 0}
            if how == "as text":
                assert read.dtypes == [("value", "string")]
                assert task._rows(read, located=False) is read
            await asyncio.to_thread(task.put, read)
            task.stop()
            written = {p.name: p.read_bytes().splitlines() for p in out.iterdir() if p.is_file()}
            assert written == {
                output_name(tp, r.from_offset, "text"): lines[r.from_offset : r.until_offset]
                for r in ranges
            }, how
