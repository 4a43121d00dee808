"""Segments whose files hold runs of offsets are read file by file, in order, unsorted.

A batch staged to one partition is written without Spark's ``partitionBy``, each file
a run of records (a task's rows, cut every ``MAX_RECORDS_PER_FILE``), and the segment
records how many each file holds: a record's offset is its file's first plus its row's
index in the file. Reading it back in offset order then needs no sort —
the plan has neither a Sort nor an Exchange, even with scans split into several Spark
partitions — and a read of some offsets scans only the files holding them. A batch
across partitions promises nothing and is sorted when read in order.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from zlib import crc32

import pytest
from pyspark.sql import functions as F

from herder.connect import OffsetRange, SourceRecord, TopicPartition
from herder.dataplane import SegmentWriter, SparkRuntime, Storage
from herder.dataplane import writer as writer_module
from herder.dataplane.datasource import line_ranges_dataframe, plan_line_ranges
from herder.dataplane.delivery import DeliveryPlan
from herder.dataplane.reader import ROW_INDEX, slice_batches
from herder.dataplane.staged import StagedBatch, StagedSegment
from herder.dataplane.storage import batch_dir
from tests.dataplane.conftest import connected, slice_rows
from tests.integration.conftest import ServerHandle

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.timeout(300)]


def executed_plan(df: Any) -> str:
    return str(df._jdf.queryExecution().executedPlan().toString())


@pytest.fixture
def small_splits(spark: SparkRuntime) -> Iterator[None]:
    """Scans cut into many Spark partitions, as big files are."""
    conf = spark.session.conf
    before = conf.get("spark.sql.files.maxPartitionBytes")
    conf.set("spark.sql.files.maxPartitionBytes", "2048")
    conf.set("spark.sql.files.openCostInBytes", "0")
    try:
        yield
    finally:
        conf.set("spark.sql.files.maxPartitionBytes", before)
        conf.unset("spark.sql.files.openCostInBytes")


async def test_single_partition_batches_are_read_in_order_without_a_sort(
    ensemble: ServerHandle,
    storage: Storage,
    spark: SparkRuntime,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    small_splits: None,
) -> None:
    monkeypatch.setattr(writer_module, "MAX_RECORDS_PER_FILE", 1_500)
    path = tmp_path / "backlog.txt"
    lines = [b"line %06d " % i + b"y" * (i % 31) for i in range(6_000)]
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    size = path.stat().st_size
    ranges = plan_line_ranges(str(path), 0, size, size // 3)
    polled = [SourceRecord({}, {}, "ordered", b"polled %05d" % i) for i in range(4_000)]

    async with connected(ensemble, storage, spark) as topics:
        await topics.create("ordered", 1)
        writer = SegmentWriter(topics, spark, "ordered-0", 1)
        df = await spark.run(lambda: line_ranges_dataframe(spark.session, str(path), ranges))
        first = await writer.stage(df, "ordered")
        # three ranges, each its task's file(s), each file at most 1,500 records
        [segment] = first.segments
        assert segment.file_counts is not None and sum(segment.file_counts) == len(lines)
        assert len(segment.files) >= 4 and max(segment.file_counts) <= 1_500
        await topics.commit(first)
        second = await writer.stage(polled)  # keyless: one partition for the batch
        [segment] = second.segments
        assert segment.file_counts == [1_500, 1_500, 1_000]  # c000, c001, c002
        await topics.commit(second)

        everything = [*lines, *(r.value for r in polled)]
        df, offset_ranges = await topics.read_ranged("ordered", ordered=True)
        # a Spark partition per file (however small Spark's splits), holding its offsets
        assert offset_ranges is not None and len(offset_ranges) > 7
        assert df.rdd.getNumPartitions() == len(offset_ranges)
        tp = TopicPartition("ordered", 0)
        assert all(r.topic_partition == tp for r in offset_ranges)
        bounds = [(r.from_offset, r.until_offset) for r in offset_ranges]
        # in the order Spark reads the files (the biggest first), which together hold
        # every offset once
        runs = sorted(bounds)
        assert [lo for lo, _ in runs] == [0, *(hi for _, hi in runs[:-1])]
        assert runs[-1][1] == len(lines) + len(polled)
        assert bounds != runs  # the files differ in size: not in offset order
        held = await spark.run(
            lambda: (
                df.groupBy(F.spark_partition_id().alias("p"))
                .agg(F.min("offset").alias("lo"), (F.max("offset") + 1).alias("hi"))
                .orderBy("p")
                .collect()
            )
        )
        assert [(r["lo"], r["hi"]) for r in held] == bounds
        # a read that is not ranged keeps Spark's splits (and its columnar union)
        split = await topics.read("ordered", ordered=True)
        assert split.rdd.getNumPartitions() > len(offset_ranges)
        assert "Coalesce" not in executed_plan(split)
        plan = executed_plan(df)
        assert "Sort" not in plan and "Exchange" not in plan
        # nor does it coalesce the splits of a file: it does not cut files (rows would
        # cross into the projection one copy at a time); nor union a scan per file
        assert "Coalesce" not in plan and "Union" not in plan
        # a row's index and file are read only for whoever uses the offsets: a sink that
        # writes values has its scan read values alone (``_metadata`` would build a
        # struct per row)
        assert ROW_INDEX in plan and "file_path" not in plan
        values_only = executed_plan(df.select("value"))
        assert ROW_INDEX not in values_only and "input_file_name" not in values_only
        got = await spark.run(df.collect)  # partition by partition
        assert sorted(r["offset"] for r in got) == list(range(len(everything)))
        in_ranges = [o for lo, hi in bounds for o in range(lo, hi)]
        assert [r["offset"] for r in got] == in_ranges
        assert [r["value"] for r in got] == [everything[o] for o in in_ranges]

        # offsets 5,000 to 7,000: the end of the first batch and the start of the second
        df, offset_ranges = await topics.read_ranged("ordered", {0: (5_000, 7_000)}, ordered=True)
        assert offset_ranges is not None
        assert offset_ranges[0].from_offset == 5_000 and offset_ranges[-1].until_offset == 7_000
        got = await spark.run(df.collect)
        assert [r["offset"] for r in got] == list(range(5_000, 7_000))
        assert [r["value"] for r in got] == everything[5_000:7_000]
        state = await topics.partition("ordered", 0)
        wanted = [
            f
            for s in state.live()
            for f, first_offset, end in s.file_ranges()
            if first_offset < 7_000 and end > 5_000
        ]
        assert sorted(Path(p).name for p in df.inputFiles()) == sorted(Path(p).name for p in wanted)
        assert len(wanted) < sum(len(s.files) for s in state.live())


async def test_batches_across_partitions_promise_no_order_and_are_sorted(
    ensemble: ServerHandle, storage: Storage, spark: SparkRuntime
) -> None:
    records = [
        SourceRecord({}, {}, "spread", b"v%04d" % i, key=b"k%d" % (i % 5)) for i in range(500)
    ]
    async with connected(ensemble, storage, spark) as topics:
        await topics.create("spread", 3)
        staged = await SegmentWriter(topics, spark, "spread-0", 1).stage(records)
        assert len(staged.segments) == 3
        assert all(s.file_counts is None for s in staged.segments)
        await topics.commit(staged)
        df, offset_ranges = await topics.read_ranged("spread", ordered=True, ranged=False)
        assert offset_ranges is None  # sorted: its partitions are not offset ranges
        assert "Sort" in executed_plan(df)
        got = await spark.run(df.collect)
        assert [(r["partition"], r["offset"]) for r in got] == sorted(
            (r["partition"], r["offset"]) for r in got
        )
        assert sorted(r["value"] for r in got) == sorted(r.value for r in records)

        # ranged: each segment is one Spark partition, sorted within it (no shuffle)
        df, offset_ranges = await topics.read_ranged("spread", ordered=True)
        assert offset_ranges == [
            OffsetRange(TopicPartition("spread", s.partition), 0, s.count)
            for s in sorted(staged.segments, key=lambda s: s.partition)
        ]
        assert "Exchange" not in executed_plan(df)
        parts = await spark.run(lambda: df.rdd.glom().collect())
        assert [[(r["partition"], r["offset"]) for r in part] for part in parts] == [
            [(r.topic_partition.partition, o) for o in range(r.from_offset, r.until_offset)]
            for r in offset_ranges
        ]


async def test_keyed_rows_for_a_topic_of_one_partition_are_staged_in_order(
    ensemble: ServerHandle, storage: Storage, spark: SparkRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A keyed DataFrame whose topic has one partition (a table snapshot's chunk) is
    staged as it comes, keys and all, like keyless rows: a positional segment whose
    files hold the DataFrame's rows in order, which every reader reads back by position,
    and a sink's delivery cuts at its files. Into a topic of several partitions, keys
    still pick the partition."""
    monkeypatch.setattr(writer_module, "MAX_RECORDS_PER_FILE", 400)
    count = 1_000

    def keyed(topic: str) -> Any:
        # three Spark partitions, so three tasks write files; string keys, some null
        ids = spark.session.range(0, count, 1, 3)
        key = F.when(F.col("id") % 10 != 0, F.format_string("k%d", F.col("id") % 7))
        value = F.format_string("v%04d", F.col("id")).cast("binary")
        return ids.select(key.alias("key"), value.alias("value"))

    def expected_key(i: int) -> bytes | None:
        return None if i % 10 == 0 else b"k%d" % (i % 7)

    expected = [(i, expected_key(i), b"v%04d" % i) for i in range(count)]
    async with connected(ensemble, storage, spark) as topics:
        await topics.create("snapshot", 1)
        writer = SegmentWriter(topics, spark, "snapshot-0", 1)
        staged = await writer.stage(await spark.run(keyed, "snapshot"), "snapshot")
        [segment] = staged.segments
        assert segment.file_counts is not None and sum(segment.file_counts) == count
        assert len(segment.files) >= 3 and max(segment.file_counts) <= 400
        assert segment.key_type is None  # bytes
        stored = storage.footer(segment.files[0]).schema.to_arrow_schema()
        assert stored.names[:2] == ["key", "value"] and "seq" not in stored.names
        assert str(stored.field("key").type) == "binary"
        await topics.commit(staged)

        for unioned in (0, 32):  # one scan of every file; file by file
            monkeypatch.setattr("herder.dataplane.reader.MAX_FILES_UNIONED", unioned)
            got = await spark.run((await topics.read("snapshot", ordered=True)).collect)
            assert [(r["offset"], r["key"], r["value"]) for r in got] == expected
            df = await topics.read("snapshot", {0: (350, 820)}, ordered=True)
            got = await spark.run(df.collect)
            assert [(r["offset"], r["key"], r["value"]) for r in got] == expected[350:820]
        plan = await topics.plan_read("snapshot", {0: (350, 820)})
        assert [(r["offset"], r["key"], r["value"]) for r in slice_rows(storage, plan)] == (
            expected[350:820]
        )

        # a sink's delivery from offset 350 takes whole files, as read in ranges
        tp = TopicPartition("snapshot", 0)
        delivery = DeliveryPlan(budget=500, ranged=True)
        delivery.take(tp, 350, await topics.partition("snapshot", 0))
        [(position, stop)] = delivery.by_topic["snapshot"].values()
        ends = list(itertools.accumulate(segment.file_counts))
        assert position == 350 and stop in ends and stop > 350
        assert [r.until_offset for r in delivery.ranges["snapshot"]] == [
            e for e in ends if 350 < e <= stop
        ]
        df, ranges = await topics.read_ranged("snapshot", {0: (position, stop)}, ordered=True)
        assert sorted(ranges) == delivery.ranges["snapshot"]  # Spark's order: biggest first
        parts = await spark.run(lambda: df.rdd.glom().collect())
        assert [[(r["offset"], r["key"]) for r in part] for part in parts] == [
            [(o, expected_key(o)) for o in range(r.from_offset, r.until_offset)] for r in ranges
        ]

        await topics.create("snapshot-spread", 3)
        staged = await writer.stage(await spark.run(keyed, "snapshot-spread"), "snapshot-spread")
        assert all(s.file_counts is None for s in staged.segments)
        await topics.commit(staged)
        got = await spark.run((await topics.read("snapshot-spread", ordered=True)).collect)
        by_value = sorted((r["value"], r["key"]) for r in got if r["key"] is not None)
        assert by_value == [(v, k) for _, k, v in expected if k is not None]
        assert len(got) == count
        keyed_rows = [r for r in got if r["key"] is not None]
        assert all(r["partition"] == crc32(r["key"]) % 3 for r in keyed_rows)
        assert len({r["partition"] for r in keyed_rows}) == 3
        for p in range(3):
            values = [r["value"] for r in got if r["partition"] == p]
            assert values == sorted(values)  # each partition in the DataFrame's order


def stage_with_seq(storage: Storage, task: str, batch: int, topic: str, values: list[bytes]) -> str:
    """A batch staged the way earlier versions staged one partition's records: files
    that carry ``seq`` besides the counts. Returns the file's path."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = f"{batch_dir(task, 1, batch)}/topic={topic}/partition=0/part-00000-old-c000.parquet"
    table = pa.table({"value": values, "seq": pa.array(range(len(values)), pa.int64())})
    storage.fs.create_dir(storage.fs_path(path.rsplit("/", 1)[0]), recursive=True)
    pq.write_table(table, storage.fs_path(path), filesystem=storage.fs)
    return path


async def test_files_with_and_without_seq_read_alike_in_every_reader(
    ensemble: ServerHandle,
    storage: Storage,
    spark: SparkRuntime,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """Ordered segments are read by row position: files written before ``seq`` was left
    out (which still carry it) and files without it give the same offsets, whether read
    file by file, in one scan of many files, or with pyarrow. Values staged from a
    ``string`` column (lines from Spark's text reader, whatever their bytes) are stored
    as they are and read back as the same bytes."""
    old = [b"old %04d" % i for i in range(300)]
    new = [SourceRecord({}, {}, "mixed", b"new %04d" % i) for i in range(400)]
    text = [b"text %04d" % i + (b" \xff\xfe" if i % 7 == 0 else b"") for i in range(200)]
    text_path = tmp_path / "lines.txt"
    text_path.write_bytes(b"".join(line + b"\n" for line in text))
    async with connected(ensemble, storage, spark) as topics:
        topic = await topics.create("mixed", 1)
        path = stage_with_seq(storage, "mixed-0", 0, "mixed", old)
        segment = StagedSegment("mixed", 0, len(old), [path], 1, 0, file_counts=[len(old)])
        await topics.commit(StagedBatch("mixed-0", 1, 0, [segment], {"mixed": topic.version}))
        writer = SegmentWriter(topics, spark, "mixed-0", 2)
        staged = await writer.stage(new)
        assert storage.footer(staged.segments[0].files[0]).schema.names == ["value"]
        await topics.commit(staged)
        lines = await spark.run(lambda: spark.session.read.text(str(text_path)))
        staged = await writer.stage(lines, "mixed")
        stored = storage.footer(staged.segments[0].files[0]).schema.to_arrow_schema()
        assert str(stored.field("value").type) == "string"  # not copied into binary
        await topics.commit(staged)

        everything = [*old, *(r.value for r in new), *text]
        window = (250, 350)  # the end of the old segment and the start of the new
        for unioned in (32, 0):  # file by file; one scan of every file
            monkeypatch.setattr("herder.dataplane.reader.MAX_FILES_UNIONED", unioned)
            got = await spark.run((await topics.read("mixed", ordered=True)).collect)
            assert [(r["offset"], r["value"]) for r in got] == list(enumerate(everything))
            df = await topics.read("mixed", {0: window}, ordered=True)
            got = await spark.run(df.collect)
            assert [r["offset"] for r in got] == list(range(*window))
            assert [r["value"] for r in got] == everything[slice(*window)]
        for window in ((250, 350), (600, 900)):  # the last: the text segment's lines
            plan = await topics.plan_read("mixed", {0: window})
            rows = slice_rows(storage, plan)
            assert [(r["offset"], r["value"]) for r in rows] == [
                (o, everything[o]) for o in range(*window) if o < len(everything)
            ]


async def test_the_cli_reader_reads_a_file_only_as_far_as_it_is_asked(
    ensemble: ServerHandle, storage: Storage, spark: SparkRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``consume`` reads an ordered segment's file a batch at a time, on demand, and
    stops at the slice's end: a few records of a file of millions cost a few batches."""
    pulled = []
    iter_batches = Storage.iter_batches

    def counted(self: Storage, rel: str, schema: Any, max_rows: int) -> Iterator[Any]:
        for batch in iter_batches(self, rel, schema, max_rows):
            pulled.append(batch.num_rows)
            yield batch

    monkeypatch.setattr(Storage, "iter_batches", counted)
    records = [SourceRecord({}, {}, "lazy", b"v%04d" % i) for i in range(1_000)]
    async with connected(ensemble, storage, spark) as topics:
        await topics.create("lazy", 1)
        staged = await SegmentWriter(topics, spark, "lazy-0", 1).stage(records)
        await topics.commit(staged)
        [piece] = await topics.plan_read("lazy", {0: (0, 1_000)})
        tables = slice_batches(storage, piece, 10)
        assert next(tables)["offset"].to_pylist() == list(range(10))
        assert pulled == [10]  # one batch read, not the file
        [piece] = await topics.plan_read("lazy", {0: (15, 35)})
        pulled.clear()
        got = [v for t in slice_batches(storage, piece, 10) for v in t["value"].to_pylist()]
        assert got == [r.value for r in records[15:35]]
        assert pulled == [10, 10, 10, 10]  # rows 0-39: as far as the slice's end, no further


async def test_a_read_fails_rather_than_give_offsets_without_a_row_index(
    ensemble: ServerHandle, storage: Storage, spark: SparkRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The row index is a column Spark's Parquet reader fills by its name; were a Spark to
    stop filling it, it would read as null, and a read must fail, not give null offsets
    or (in a partial read, whose filter compares them) no records at all."""
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import PySparkException

    from herder.dataplane import reader

    records = [SourceRecord({}, {}, "unindexed", b"v%d" % i) for i in range(20)]
    async with connected(ensemble, storage, spark) as topics:
        await topics.create("unindexed", 1)
        await topics.commit(await SegmentWriter(topics, spark, "unindexed-0", 1).stage(records))
        monkeypatch.setattr(reader, "ROW_INDEX", "no_such_column")
        for wanted in (None, {0: (5, 10)}):
            df = await topics.read("unindexed", wanted, ordered=True)
            with pytest.raises((PySparkException, Py4JJavaError), match="gave no row index"):
                await spark.run(df.select("offset").collect)


async def test_whole_files_are_found_by_their_names_in_any_storage_root(
    ensemble: ServerHandle, spark: SparkRuntime, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ranged read of whole files is one scan whose rows find their file by the name
    Spark gives it: a URI, escaped where a path is not. A root whose name has spaces,
    a quote and a percent sign still gives every record its offset."""
    monkeypatch.setattr(writer_module, "MAX_RECORDS_PER_FILE", 400)
    storage = Storage(str(tmp_path / "it's a 100% odd root"))
    values = [b"v%04d" % i + b"x" * (i % 7) for i in range(1_000)]
    async with connected(ensemble, storage, spark) as topics:
        await topics.create("odd", 1)
        writer = SegmentWriter(topics, spark, "odd-0", 1)
        await topics.commit(await writer.stage([SourceRecord({}, {}, "odd", v) for v in values]))
        df, ranges = await topics.read_ranged("odd", ordered=True)
        assert ranges is not None and len(ranges) == 3
        assert "Union" not in executed_plan(df)  # one scan
        parts = await spark.run(lambda: df.rdd.glom().collect())
        tp = TopicPartition("odd", 0)
        assert all(r.topic_partition == tp for r in ranges)
        assert [[(r["partition"], r["offset"], r["value"]) for r in part] for part in parts] == [
            [(0, o, values[o]) for o in range(r.from_offset, r.until_offset)] for r in ranges
        ]


@pytest.mark.timeout(300)
async def test_a_storage_root_named_like_a_glob_is_read_as_the_files_it_holds(
    ensemble: ServerHandle, tmp_path: Path, spark: SparkRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Spark reads a path as a Hadoop glob pattern unless told not to: a root named
    ``[1] {a,b} *?`` would match no file at all (``[1]`` is a class of one character).
    Every read of a topic's files reads each file itself: the ranged read of whole
    files, a read of a few files one by one, and the one scan of many."""
    monkeypatch.setattr(writer_module, "MAX_RECORDS_PER_FILE", 25)
    storage = Storage(str(tmp_path / "root [1] {a,b} *? \\ end"))
    values = [b"g%04d" % i for i in range(1_000)]
    async with connected(ensemble, storage, spark) as topics:
        await topics.create("globbed", 1)
        writer = SegmentWriter(topics, spark, "globbed-0", 1)
        records = [SourceRecord({}, {}, "globbed", v) for v in values]
        await topics.commit(await writer.stage(records[:75]))  # 3 files
        df, ranges = await topics.read_ranged("globbed", ordered=True)
        assert ranges is not None and len(ranges) == 3
        assert "Union" not in executed_plan(df)  # the one scan of whole files
        rows = await spark.run(lambda: df.orderBy("offset").collect())
        assert [(r["offset"], r["value"]) for r in rows] == list(enumerate(values[:75]))

        few = await topics.read("globbed")  # a scan per file
        rows = await spark.run(lambda: few.orderBy("offset").collect())
        assert [(r["offset"], r["value"]) for r in rows] == list(enumerate(values[:75]))

        await topics.commit(await writer.stage(records[75:]))  # 37 more files
        many = await topics.read("globbed", ordered=True)  # one scan of 40 files
        rows = await spark.run(lambda: many.collect())
        assert [(r["offset"], r["value"]) for r in rows] == list(enumerate(values))


async def test_whole_files_read_by_another_parquet_source_are_read_file_by_file(
    ensemble: ServerHandle, storage: Storage, spark: SparkRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the worker's Spark settings have Parquet read by Spark's other source, whose
    plan does not say which file each partition reads, a ranged read unions a scan per
    file instead, in offset order, as it does for files read in part."""
    from herder.dataplane.reader import unsplit_session

    monkeypatch.setattr(writer_module, "MAX_RECORDS_PER_FILE", 300)
    values = [b"w%04d" % i + b"y" * (i % 5) for i in range(1_000)]
    session = unsplit_session(spark.session)
    assert session is not None
    async with connected(ensemble, storage, spark) as topics:
        await topics.create("packed", 1)
        writer = SegmentWriter(topics, spark, "packed-0", 1)
        await topics.commit(await writer.stage([SourceRecord({}, {}, "packed", v) for v in values]))
        session.conf.set("spark.sql.sources.useV1SourceList", "")
        try:
            df, ranges = await topics.read_ranged("packed", ordered=True)
            assert ranges is not None
            assert [(r.from_offset, r.until_offset) for r in ranges] == [
                (0, 300), (300, 600), (600, 900), (900, 1_000)
            ]  # fmt: skip
            parts = await spark.run(lambda: df.rdd.glom().collect())
        finally:
            session.conf.unset("spark.sql.sources.useV1SourceList")
        assert [[(r["offset"], r["value"]) for r in part] for part in parts] == [
            [(o, values[o]) for o in range(r.from_offset, r.until_offset)] for r in ranges
        ]


async def test_a_ranged_read_of_whole_files_gives_each_row_its_files_place_and_time(
    ensemble: ServerHandle, storage: Storage, spark: SparkRuntime
) -> None:
    """One scan of every file, each file a Spark partition: a row's partition, offset and
    timestamp come from its file, whether the files share them (a literal) or not (a
    lookup by the file's name), as a read file by file gives them."""
    times = iter(range(1_000_000, 2_000_000, 1_000))
    async with connected(ensemble, storage, spark, clock=lambda: next(times)) as topics:
        await topics.create("placed", 2)
        writer = SegmentWriter(topics, spark, "placed-0", 1)
        for batch in range(4):  # keyless: each batch to a partition, the next in turn
            values = [b"batch %d line %04d" % (batch, i) for i in range(300 + 50 * batch)]
            df = await spark.run(
                lambda v=values: spark.session.createDataFrame([(x,) for x in v], "value binary")
            )
            await topics.commit(await writer.stage(df, "placed"))
        columns = ["partition", "offset", "timestamp", "value"]

        def rows(df: Any) -> list[tuple[Any, ...]]:
            return sorted(tuple(r[c] for c in columns) for r in df.collect())

        sorted_read = await topics.read("placed", ordered=True)
        expected = await spark.run(rows, sorted_read)
        assert {r[0] for r in expected} == {0, 1}
        assert len({r[2] for r in expected}) == 4  # a timestamp a batch
        first = (await topics.partition("placed", 0)).live()[0]
        reads = [
            (None, 4),  # both partitions' files: partitions and timestamps differ
            ({0: (0, 10**6)}, 2),  # one partition's: its timestamps differ
            ({0: (first.base_offset, first.end_offset)}, 1),  # one file: all literals
        ]
        for wanted, files in reads:
            df, offset_ranges = await topics.read_ranged("placed", wanted, ordered=True)
            assert offset_ranges is not None and len(offset_ranges) == files
            got = await spark.run(rows, df)
            assert got == [
                r
                for r in expected
                if wanted is None or (r[0] == 0 and wanted[0][0] <= r[1] < wanted[0][1])
            ]


async def test_a_reader_of_values_alone_gets_the_scan_of_whole_files_as_it_is(
    ensemble: ServerHandle, storage: Storage, spark: SparkRuntime
) -> None:
    """A ranged read that needs only what the files hold (a sink whose put reads values)
    gets Spark's scan of them, with no projection, in the same partitions holding the
    same ranges; one that needs a column worked out from the files (an offset), or a
    read of files in part, gets every column as before."""
    values = [b"v%04d" % i for i in range(900)]
    async with connected(ensemble, storage, spark) as topics:
        await topics.create("bare", 1)
        writer = SegmentWriter(topics, spark, "bare-0", 1)
        # two segments, a file each, the second the bigger: Spark reads it first
        for start, end in ((0, 300), (300, 900)):
            records = [SourceRecord({}, {}, "bare", v) for v in values[start:end]]
            await topics.commit(await writer.stage(records))

        def partitions(df: Any) -> tuple[list[str], list[list[bytes]]]:
            return df.columns, [[r["value"] for r in part] for part in df.rdd.glom().collect()]

        full, full_ranges = await topics.read_ranged("bare", ordered=True)
        bare, bare_ranges = await topics.read_ranged("bare", ordered=True, columns={"value": None})
        assert bare_ranges == full_ranges and full_ranges is not None
        columns, parts = await spark.run(partitions, bare)
        assert columns == ["value"]
        # the scan itself: no Project above it
        assert await spark.run(lambda: bare._jdf.queryExecution().analyzed().nodeName()) == (
            "LogicalRelation"
        )
        assert parts == (await spark.run(partitions, full))[1]
        assert parts == [values[r.from_offset : r.until_offset] for r in bare_ranges]
        assert [(r.from_offset, r.until_offset) for r in bare_ranges] == [(300, 900), (0, 300)]

        # a column the files do not hold as it is: the projection of them all
        # bytes as text: the same scan, of strings
        text, text_ranges = await topics.read_ranged(
            "bare", ordered=True, columns={"value": "string"}
        )
        assert text_ranges == full_ranges and text.dtypes == [("value", "string")]
        assert await spark.run(
            lambda: [[r["value"] for r in p] for p in text.rdd.glom().collect()]
        ) == [[v.decode() for v in part] for part in parts]
        mixed, _ = await topics.read_ranged(
            "bare", ordered=True, columns={"offset": None, "value": None}
        )
        assert mixed.columns == full.columns
        # files read in part: as before
        part, ranges = await topics.read_ranged(
            "bare", {0: (100, 800)}, ordered=True, columns={"value": "string"}
        )
        assert part.columns == full.columns and ranges is not None
        rows = await spark.run(lambda: [(r["offset"], r["value"]) for r in part.collect()])
        assert rows == [(o, values[o]) for o in range(100, 800)]
