"""The trickle path (:mod:`herder.dataplane.trickle`) and the bulk path deliver the same.

The same batches are staged twice, into two topics: by Spark (trickle off) and by
pyarrow in the worker (trickle on). Both topics then read the same — through Spark, as
a sink's DataFrame, and through pyarrow, as a sink's Arrow table and the CLI's slices —
record for record, in the same order: keys, values, nulls, headers, timestamps,
partitions, offsets. The segments' metadata and files have the same shape (positional
files without ``seq`` for one partition, ``seq`` per partition for several). Typed
records (a DataFrame) always go through Spark, mix with trickle-staged bytes in one
topic, and are not read by the trickle path. Sinks that take Arrow tables write what
they write from DataFrames.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from bench.steps import PutContext
from pyspark.sql import functions as F
from pyspark.sql import types as T

from herder.connect import OffsetRange, SinkTask, SourceRecord, TopicPartition
from herder.connectors.directory import DirectorySinkTask
from herder.connectors.file import FileStreamSinkTask
from herder.dataplane import SegmentWriter, SparkRuntime, Storage, Topics
from herder.dataplane import records as records_module
from herder.dataplane.codec import CODECS, DEFAULT_CODEC, PRODUCER_COMPRESSION, segment_codec
from herder.dataplane.records import records_to_table
from herder.dataplane.trickle import (
    OFF,
    SINK_ARROW_SCHEMA,
    TRICKLE_MAX_BYTES,
    TRICKLE_MAX_RECORDS,
    TrickleLimits,
    read_slices,
)
from herder.errors import ConfigError
from tests.dataplane.conftest import connected, slice_rows
from tests.integration.conftest import ServerHandle

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.timeout(300)]

ON = TrickleLimits(max_records=1_000, max_bytes=1 << 20)
NOW = 1_750_000_000_000


def batches(topic: str) -> list[list[SourceRecord]]:
    """Polls of every shape a source gives: lines (one partition, no keys, one
    timestamp); keyed records with headers, timestamps and a null value over three
    partitions; records naming their partition; keyless records with their own
    timestamps."""
    lines = [SourceRecord({"f": 1}, {"p": i}, topic, b"line %d" % i) for i in range(40)]
    keyed = [
        SourceRecord({}, {}, topic, None if i == 7 else b"v%d" % i, key=b"k%d" % (i % 9),
                     timestamp_ms=1_700_000_000_000 + i,
                     headers=[("h", b"%d" % i), ("empty", None)] if i % 3 else [])
        for i in range(60)
    ]  # fmt: skip
    placed = [SourceRecord({}, {}, topic, b"p%d" % i, partition=i % 3) for i in range(12)]
    stamped = [
        SourceRecord({}, {}, topic, b"s%d" % i, timestamp_ms=1_600_000_000_000 + 10 * i)
        for i in range(25)
    ]
    return [lines, keyed, placed, stamped]


def creator(path: str) -> str:
    return pq.read_metadata(path).created_by


async def stage_all(topics: Topics, spark: SparkRuntime, topic: str, trickle: TrickleLimits) -> Any:
    """Stage and commit :func:`batches`; return every staged segment."""
    await topics.create(topic, 3)
    # one task name, so keyless records rotate through the same partitions; epochs of
    # their own, so the two writers stage into directories of their own
    epoch = 5 if trickle.enabled else 4
    writer = SegmentWriter(topics, spark, "stager-0", epoch, trickle=trickle)
    segments = []
    for records in batches(topic):
        staged = await writer.stage(records)
        assert staged.dir.startswith(f"_staging/stager-0-e{epoch}/")
        await topics.commit(staged)
        segments += staged.segments
    return segments


def spark_rows(df: Any) -> list[tuple[Any, ...]]:
    return [
        (r.partition, r.offset, int(r.timestamp.timestamp() * 1000), r.key, r.value,
         [(h.key, h.value) for h in r.headers])
        for r in df.collect()
    ]  # fmt: skip


def arrow_rows(table: Any) -> list[tuple[Any, ...]]:
    return [
        (r["partition"], r["offset"], int(r["timestamp"].timestamp() * 1000), r["key"],
         r["value"], [(h["key"], h["value"]) for h in r["headers"]])
        for r in table.to_pylist()
    ]  # fmt: skip


async def test_trickle_and_spark_stage_the_same_records_in_the_same_order(
    ensemble: ServerHandle, storage: Storage, spark: SparkRuntime
) -> None:
    # one clock for both: records without a timestamp get the same one
    async with connected(ensemble, storage, spark, clock=lambda: NOW) as topics:
        bulk = await stage_all(topics, spark, "bulk", OFF)
        trickle = await stage_all(topics, spark, "trickle", ON)

        # every file of one was written by Spark, of the other by pyarrow
        assert {creator(f"{storage.root}/{f}").split()[0] for s in bulk for f in s.files} == {
            "parquet-mr"
        }
        assert {creator(f"{storage.root}/{f}").split()[0] for s in trickle for f in s.files} == {
            "parquet-cpp-arrow"
        }
        # the same segments: partitions, counts, layout (positional or with seq), times
        for b, t in zip(bulk, trickle, strict=True):
            assert (b.partition, b.count, b.max_timestamp, b.key_type, b.value_type) == (
                t.partition, t.count, t.max_timestamp, t.key_type, t.value_type
            )  # fmt: skip
            assert (b.file_counts is None) == (t.file_counts is None)
            if b.file_counts is not None:
                assert sum(b.file_counts) == sum(t.file_counts or [])
            b_file, t_file = (pq.read_schema(f"{storage.root}/{s.files[0]}") for s in (b, t))
            assert t_file.names == b_file.names
            assert t_file.types == b_file.types
            b_meta, t_meta = (pq.read_metadata(f"{storage.root}/{s.files[0]}") for s in (b, t))
            assert (
                t_meta.metadata[b"org.apache.spark.sql.parquet.row.metadata"]
                == (b_meta.metadata[b"org.apache.spark.sql.parquet.row.metadata"])
            )

        # read through Spark, as a sink's DataFrame
        by_spark = {name: spark_rows(await topics.read(name, ordered=True)) for name in
                    ("bulk", "trickle")}  # fmt: skip
        assert len(by_spark["bulk"]) == sum(len(b) for b in batches("bulk"))
        assert by_spark["trickle"] == by_spark["bulk"]
        assert any(row[5] for row in by_spark["bulk"])  # headers came through
        assert any(row[4] is None for row in by_spark["bulk"])  # and a null value

        # read through pyarrow, as the trickle path's sinks get it, and as the CLI does
        for name in ("bulk", "trickle"):
            table = read_slices(storage, name, await topics.plan_read(name), 1 << 30)
            assert table is not None
            assert set(table["topic"].to_pylist()) == {name}
            assert arrow_rows(table) == by_spark["bulk"]
        assert slice_rows(storage, await topics.plan_read("trickle")) == slice_rows(
            storage, await topics.plan_read("bulk")
        )


#: each codec as a Parquet footer names it (pyarrow's "LZ4" is Parquet's LZ4_RAW)
FOOTER_CODECS = {"none": "UNCOMPRESSED", "gzip": "GZIP", "snappy": "SNAPPY", "lz4": "LZ4",
                 "zstd": "ZSTD"}  # fmt: skip


async def test_every_codec_stages_files_of_its_own_that_read_back_alike(
    ensemble: ServerHandle, storage: Storage, spark: SparkRuntime
) -> None:
    """``producer.compression.type``: Spark and pyarrow write each codec's files, named
    as Spark names them; one topic whose segments differ in their codecs reads back
    every record, in order, through Spark and through pyarrow."""
    async with connected(ensemble, storage, spark, clock=lambda: NOW) as topics:
        await topics.create("codec-mixed", 3)
        polls = batches("codec-mixed")[:2]  # lines into one partition; keyed ones into three
        for epoch, (name, codec) in enumerate(CODECS.items()):
            for trickle in (OFF, ON):
                writer = SegmentWriter(
                    topics, spark, "stager-0", 2 * epoch + trickle.enabled, trickle=trickle,
                    codec=codec,
                )  # fmt: skip
                for records in polls:
                    staged = await writer.stage(records)
                    for segment in staged.segments:
                        for file in segment.files:
                            assert file.endswith(f"{codec.suffix}.parquet"), (name, file)
                            meta = pq.read_metadata(f"{storage.root}/{file}")
                            used = {meta.row_group(g).column(c).compression
                                    for g in range(meta.num_row_groups)
                                    for c in range(meta.num_columns)}  # fmt: skip
                            assert used == {FOOTER_CODECS[name]}, (name, trickle, file)
                    await topics.commit(staged)
        by_spark = spark_rows(await topics.read("codec-mixed", ordered=True))
        assert len(by_spark) == 2 * len(CODECS) * sum(len(p) for p in polls)
        for partition in range(3):
            offsets = [row[1] for row in by_spark if row[0] == partition]
            assert offsets == list(range(len(offsets)))
        # each poll of lines came out as it went in, whichever codec stored it
        lines = [b"line %d" % i for i in range(40)]
        runs = []
        for partition in range(3):
            values = [row[4] for row in by_spark if row[0] == partition]
            found = [v for v in values if v is not None and v.startswith(b"line")]
            runs += [found[i : i + 40] for i in range(0, len(found), 40)]
        assert runs == [lines] * 2 * len(CODECS)
        table = read_slices(storage, "codec-mixed", await topics.plan_read("codec-mixed"), 1 << 30)
        assert table is not None
        assert arrow_rows(table) == by_spark


def test_the_codec_comes_from_the_worker_config() -> None:
    assert segment_codec({}) is DEFAULT_CODEC is CODECS["lz4"]
    assert segment_codec({PRODUCER_COMPRESSION: " ZSTD "}) is CODECS["zstd"]
    with pytest.raises(ConfigError, match=r"producer.compression.type='brotli'.*none, gzip"):
        segment_codec({PRODUCER_COMPRESSION: "brotli"})


async def test_batches_over_the_limits_go_through_spark(
    ensemble: ServerHandle, storage: Storage, spark: SparkRuntime
) -> None:
    async with connected(ensemble, storage, spark) as topics:
        await topics.create("limits", 1)
        few = TrickleLimits(max_records=10, max_bytes=1 << 20)
        writer = SegmentWriter(topics, spark, "limits-0", 1, trickle=few)
        small = [SourceRecord({}, {}, "limits", b"x") for _ in range(10)]
        many = [SourceRecord({}, {}, "limits", b"x") for _ in range(11)]
        wide = [SourceRecord({}, {}, "limits", b"x" * 600_000) for _ in range(2)]
        made = []
        for records in (small, many, wide):
            staged = await writer.stage(records)
            await topics.commit(staged)
            made.append(creator(f"{storage.root}/{staged.segments[0].files[0]}").split()[0])
        assert made == ["parquet-cpp-arrow", "parquet-mr", "parquet-mr"]
        # a delivery of more stored bytes than the limit is read by Spark
        assert read_slices(storage, "limits", await topics.plan_read("limits"), 1_000) is None


async def test_typed_records_stay_on_spark_and_mix_with_trickle_staged_bytes(
    ensemble: ServerHandle, storage: Storage, spark: SparkRuntime
) -> None:
    source = spark.session.createDataFrame(
        [(i, f"name {i}", [i, i + 1]) for i in range(5)], "id bigint, name string, seen array<int>"
    )
    typed = source.select(F.struct(*source.columns).alias("value"))
    reads = {}
    async with connected(ensemble, storage, spark, clock=lambda: NOW) as topics:
        for name, trickle in (("mixed-bulk", OFF), ("mixed-trickle", ON)):
            await topics.create(name, 1)
            writer = SegmentWriter(topics, spark, f"{name}-0", 1, trickle=trickle)
            head = [SourceRecord({}, {}, name, b'{"plain": %d}' % i, partition=0,
                                 headers=[("h", b"%d" % i)]) for i in range(3)]  # fmt: skip
            await topics.commit(await writer.stage(head))
            staged = await writer.stage(typed, name)
            assert staged.segments[0].value_type is not None
            assert creator(f"{storage.root}/{staged.segments[0].files[0]}").startswith("parquet-mr")
            await topics.commit(staged)
            # the trickle path does not read typed segments: their values are Spark's
            assert read_slices(storage, name, await topics.plan_read(name), 1 << 30) is None
            df = await topics.read(name, ordered=True)
            assert isinstance(df.schema["value"].dataType, T.BinaryType)  # envelopes
            reads[name] = spark_rows(df)
            # typed alone, read with their types
            typed_only = await topics.read(name, {0: (3, 8)}, ordered=True)
            assert typed_only.select("value.*").collect() == source.collect()
    assert reads["mixed-trickle"] == reads["mixed-bulk"]
    assert len(reads["mixed-bulk"]) == 8


@pytest.mark.parametrize("fmt", ["text", "json"])
async def test_sinks_write_an_arrow_table_as_they_write_its_dataframe(
    ensemble: ServerHandle, storage: Storage, spark: SparkRuntime, tmp_path: Path, fmt: str
) -> None:
    """DirectorySink (lines) and FileStreamSink: the same files from put_arrow as from put."""
    topic = f"sinks-{fmt}"
    values = [None if i == 4 else b'{"n": %d}' % i for i in range(30)]
    async with connected(ensemble, storage, spark) as topics:
        await topics.create(topic, 2)
        writer = SegmentWriter(topics, spark, f"{topic}-0", 1, trickle=ON)
        records = [SourceRecord({}, {}, topic, v, partition=i % 2) for i, v in enumerate(values)]
        await topics.commit(await writer.stage(records))
        df = await topics.read(topic, ordered=True)
        table = read_slices(storage, topic, await topics.plan_read(topic), 1 << 30)
    assert table is not None
    outputs = {}
    for how in ("put", "put_arrow"):
        out = tmp_path / how
        task = DirectorySinkTask()
        task.initialize(PutContext(None))
        task.start({"directory": str(out), "format": fmt, "topics": topic})
        task.bases = {TopicPartition(topic, 0): 0, TopicPartition(topic, 1): 0}
        assert task.accepts_arrow()
        await asyncio.to_thread(getattr(task, how), df if how == "put" else table)
        task.stop()
        outputs[how] = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
        lines = tmp_path / f"{how}.txt"
        file_task = FileStreamSinkTask()
        file_task.start({"file": str(lines)})
        assert file_task.accepts_arrow()
        await asyncio.to_thread(getattr(file_task, how), df if how == "put" else table)
        file_task.stop()
        outputs[how]["file"] = lines.read_bytes()
    assert outputs["put_arrow"] == outputs["put"]
    assert len(outputs["put"]) == 3  # a file per partition, and the FileStreamSink's
    assert outputs["put"]["file"].count(b"\n") == len(values)

    parquet = DirectorySinkTask()
    parquet.initialize(PutContext(None))
    parquet.start({"directory": str(tmp_path / "pq"), "format": "parquet", "topics": topic})
    assert not parquet.accepts_arrow()  # values parsed by Spark: DataFrames only
    parquet.stop()


def test_limits_come_from_the_worker_config() -> None:
    assert TrickleLimits.from_config({}).enabled
    off = TrickleLimits.from_config({"dataplane.trickle.max.records": "0"})
    assert not off.enabled and not off.takes(1, 1)
    set_ = TrickleLimits.from_config(
        {"dataplane.trickle.max.records": "5", "dataplane.trickle.max.bytes": "100"}
    )
    assert set_.takes(5, 100) and not set_.takes(6, 1) and not set_.takes(1, 101)
    with pytest.raises(ConfigError, match=re.escape(TRICKLE_MAX_BYTES)):
        TrickleLimits.from_config({"dataplane.trickle.max.bytes": "lots"})
    with pytest.raises(ConfigError, match=re.escape(TRICKLE_MAX_RECORDS)):
        TrickleLimits.from_config({"dataplane.trickle.max.records": "-1"})


def test_a_poll_of_plain_lines_converts_as_record_by_record(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The column-at-a-time conversion of plain lines gives the table the record-by-record
    pass gives; a poll with anything more (a null value is still plain) takes that pass."""
    lines = [SourceRecord({"f": 1}, {"p": i}, "t", b"line %d" % i) for i in range(1_000)]
    lines[5] = SourceRecord({"f": 1}, {"p": 5}, "t", None)
    keyed = [*lines, SourceRecord({}, {}, "t", b"v", key=b"k")]
    fast = {name: records_to_table(rs, {"t": 3}, {"t": 2}, NOW) for name, rs in
            (("lines", lines), ("keyed", keyed))}  # fmt: skip
    assert records_module._plain_values(lines, {"t": 3}, {"t": 2}, NOW) is not None
    assert records_module._plain_values(keyed, {"t": 3}, {"t": 2}, NOW) is None
    monkeypatch.setattr(records_module, "_plain_values", lambda *args: None)
    for name, rs in (("lines", lines), ("keyed", keyed)):
        assert fast[name].equals(records_to_table(rs, {"t": 3}, {"t": 2}, NOW))


class _Recording(SinkTask):
    """A sink that takes Arrow tables but writes DataFrames only: the default put_arrow."""

    offset_ranged = True

    def __init__(self) -> None:
        self.parts: list[list[tuple[str, int, int, bytes]]] = []

    def version(self) -> str:
        return "test"

    def start(self, config: dict[str, str]) -> None:
        self.config = config

    def stop(self) -> None:
        self.parts = []

    def accepts_arrow(self) -> bool:
        return True

    def put(self, df: Any) -> None:
        rows = df.rdd.glom().collect()
        self.parts = [[(r.topic, r.partition, r.offset, r.value) for r in part] for part in rows]


@pytest.mark.parametrize("ranged", [False, True])
def test_the_default_put_arrow_puts_the_table_as_a_dataframe_a_range_a_partition(
    spark: SparkRuntime, ranged: bool
) -> None:
    rows = [("t", p, o, f"{p}-{o}".encode()) for p in (0, 1) for o in range(5)]
    table = pa.Table.from_pylist(
        [{"topic": t, "partition": p, "offset": o, "timestamp": 1_700_000_000_000 + o,
          "key": None, "value": v, "headers": []} for t, p, o, v in rows],
        schema=SINK_ARROW_SCHEMA,
    )  # fmt: skip
    tp0, tp1 = TopicPartition("t", 0), TopicPartition("t", 1)
    ranges = [OffsetRange(tp0, 0, 2), OffsetRange(tp0, 2, 5), OffsetRange(tp1, 0, 5)]
    task = _Recording()
    task.initialize(PutContext(ranges if ranged else None))
    task.put_arrow(table)
    if ranged:
        assert task.parts == [rows[0:2], rows[2:5], rows[5:10]]
    else:
        assert [r for part in task.parts for r in part] == rows


def test_a_piece_is_cut_into_files_in_order_and_a_failed_one_leaves_none(
    storage: Storage,
) -> None:
    """A piece an executor writes (``write_piece``) starts a new file every so many
    rows, named as Spark's task would name them; a piece whose read fails midway
    leaves no file, finished or not; a batch is the files its pieces returned, not
    whatever else its folder holds (an attempt of a task that failed, or a twin)."""
    from herder.dataplane.trickle import write_piece
    from herder.dataplane.writer import _describe

    def rows(start: int, count: int, fail_after: int | None = None) -> Any:
        for first in range(start, start + count, 5):
            if fail_after is not None and first - start >= fail_after:
                raise RuntimeError("the database went away")
            values = pa.array([b"r%d" % i for i in range(first, first + 5)])
            yield pa.RecordBatch.from_arrays([values], names=["value"])

    folder = "_staging/pieces-e1/0000000000/topic=t/partition=0"
    first = write_piece(storage, folder, 0, rows(0, 15), 6)
    assert [(re.sub(r"-[0-9a-f-]{36}-", "-*-", p.rsplit("/", 1)[-1]), n) for p, n in first] == [
        ("part-00000-*-c000.lz4raw.parquet", 6),
        ("part-00000-*-c001.lz4raw.parquet", 6),
        ("part-00000-*-c002.lz4raw.parquet", 3),
    ]
    with pytest.raises(RuntimeError, match="went away"):
        write_piece(storage, folder, 1, rows(15, 15, fail_after=10), 6)
    second = write_piece(storage, folder, 1, rows(15, 15), 100)
    # a twin of piece 1, as a speculative attempt would leave
    write_piece(storage, folder, 1, rows(15, 15), 100)
    listed = [e.path for e in storage.list_dir(folder)]
    assert len(listed) == 5
    files = [p for p, _ in first + second]
    [segment] = _describe(storage, folder.rsplit("/", 2)[0], positional=True, timestamp=NOW,
                          only=files)  # fmt: skip
    assert segment.files == files and segment.file_counts == [6, 6, 3, 15]
    read = pa.concat_tables(pq.read_table(storage.fs_path(p)) for p in segment.files)
    assert read["value"].to_pylist() == [b"r%d" % i for i in range(30)]
