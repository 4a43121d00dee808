"""Lines read by planned byte ranges: the planner, the Arrow splitter, the Data Source,
and FileStreamSource handing a large backlog to Spark as a SourceBatch."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import pairwise
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pytest

from herder.connect import OffsetReader, SourceBatch, SourceTaskContext
from herder.connectors.file import FileStreamSourceTask
from herder.dataplane import SparkRuntime
from herder.dataplane.datasource import (
    MAX_PARTITION_BYTES,
    WHOLE_FILE_SPLIT_MAX_BYTES,
    ByteRange,
    balanced_split_bytes,
    last_line_end,
    line_ranges_dataframe,
    lines_to_array,
    plan_line_ranges,
    read_line_range,
    whole_file_lines_dataframe,
)
from herder.errors import RetriableError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


def write_lines(path: Path, count: int, first: int = 0, *, mode: str = "w") -> list[bytes]:
    lines = [b"line %06d " % i + b"y" * (i % 37) for i in range(first, first + count)]
    with open(path, mode + "b") as f:
        f.write(b"".join(line + b"\n" for line in lines))
    return lines


def append_lines(path: Path, lines: Sequence[bytes]) -> None:
    with open(path, "ab") as f:
        f.write(b"".join(line + b"\n" for line in lines))


def line_bytes(df: DataFrame) -> list[bytes]:
    """The ``value`` column's bytes, whether it is typed binary or (lines Spark's text
    reader gave, not decoded) string."""
    return df.toArrow().column("value").cast(pa.binary()).to_pylist()


@pytest.mark.unit
def test_lines_split_like_file_stream_source() -> None:
    buffer = b"a\nbb\r\n\r\n\n\rc\nd\r\r\n"
    assert lines_to_array(buffer).to_pylist() == [b"a", b"bb", b"", b"", b"\rc", b"d\r"]
    buffer = b"a\n\nbb\n\rc\rd\n\n"  # no CRLF: the fast path
    assert lines_to_array(buffer).to_pylist() == [b"a", b"", b"bb", b"\rc\rd", b""]
    assert lines_to_array(b"\n").to_pylist() == [b""]


@pytest.mark.unit
def test_backlogs_are_cut_into_a_multiple_of_the_cores() -> None:
    mb = 1_000_000
    assert balanced_split_bytes(200 * mb, 64 * mb, 2) == 50 * mb  # 4 ranges, not 3 + 1
    assert balanced_split_bytes(100 * mb, 64 * mb, 2) == 50 * mb
    assert balanced_split_bytes(100 * mb, 64 * mb, 8) == 12_500_000
    assert balanced_split_bytes(10 * mb, 64 * mb, 1) == 10 * mb  # one range either way
    assert balanced_split_bytes(200 * mb, 64 * mb, None) == 64 * mb  # unknown: as given


@pytest.mark.unit
def test_ranges_end_on_line_boundaries_and_cover_the_backlog(tmp_path: Path) -> None:
    path = tmp_path / "in.txt"
    lines = write_lines(path, 5_000)
    with open(path, "ab") as f:
        f.write(b"x" * 10_000 + b"\n")  # one line longer than a range
        f.write(b"no newline yet")
    data = path.read_bytes()
    end = last_line_end(str(path), 0, len(data))
    assert end == len(data) - len(b"no newline yet")
    start = data.index(b"line 000100")
    ranges = plan_line_ranges(str(path), start, end, 4_096)
    assert len(ranges) > 10
    assert ranges[0].start == start and ranges[-1].end == end
    for a, b in pairwise(ranges):
        assert a.end == b.start and data[a.end - 1 : a.end] == b"\n"
    read = [
        v
        for r in ranges
        for batch in read_line_range(str(path), r.start, r.end)
        for v in batch.column(0).to_pylist()
    ]
    assert read == [*lines[100:], b"x" * 10_000]


@pytest.mark.unit
def test_no_whole_line_means_no_range(tmp_path: Path) -> None:
    path = tmp_path / "in.txt"
    path.write_bytes(b"abc\n" + b"z" * 100)
    assert last_line_end(str(path), 4, 104) == 4
    assert plan_line_ranges(str(path), 0, 4, 1) == [ByteRange(0, 4)]


@pytest.mark.spark
@pytest.mark.timeout(300)
def test_executors_read_the_planned_ranges_in_order(spark: SparkRuntime, tmp_path: Path) -> None:
    path = tmp_path / "in.txt"
    lines = write_lines(path, 20_000)
    size = path.stat().st_size
    ranges = plan_line_ranges(str(path), 0, size, size // 5)
    df = line_ranges_dataframe(spark.session, str(path), ranges)
    assert df.rdd.getNumPartitions() == len(ranges) >= 5
    assert df.toArrow().column("value").to_pylist() == lines


class _Offsets(OffsetReader):
    def __init__(self, stored: Mapping[str, Any] | None) -> None:
        self.stored = stored

    def offsets(self, partitions: Sequence[Mapping[str, Any]]) -> list[Any]:
        return [self.stored for _ in partitions]


class _Context(SourceTaskContext):
    def __init__(self, stored: Mapping[str, Any] | None) -> None:
        self.reader = _Offsets(stored)

    @property
    def configs(self) -> Mapping[str, str]:
        return {}

    @property
    def offset_reader(self) -> OffsetReader:
        return self.reader


def start_source(path: Path, stored: Mapping[str, Any] | None, **more: str) -> FileStreamSourceTask:
    task = FileStreamSourceTask()
    task.initialize(_Context(stored))
    settings = {"file": str(path), "topic": "t", "poll.interval.ms": "10"}
    more = {k.replace("_", "."): v for k, v in more.items()}
    task.start(
        {**settings, "parallel.min.bytes": "50000", "parallel.split.bytes": "100000", **more}
    )
    return task


@pytest.mark.spark
@pytest.mark.timeout(300)
def test_file_stream_source_hands_a_backlog_to_spark_with_its_planned_position(
    spark: SparkRuntime, tmp_path: Path
) -> None:
    path = tmp_path / "in.txt"
    lines = write_lines(path, 30_000)
    resume = path.read_bytes().index(b"line 001000")
    partial = b"partial line, no newline yet"
    with open(path, "ab") as f:
        f.write(partial)
    task = start_source(path, {"position": resume})
    try:
        batch = task.poll()
        assert isinstance(batch, SourceBatch)
        end = path.stat().st_size - len(partial)
        assert list(batch.offsets) == [({"filename": str(path)}, {"position": end})]
        assert batch.topic == "t"
        table = batch.data.toArrow()
        assert table.column("value").to_pylist() == lines[1000:]
        assert table.column_names == ["value"]

        # a few appended lines are read in the task, and no SourceBatch follows
        # until those records are committed
        with open(path, "ab") as f:
            f.write(b" ends here\n")
        more = write_lines(path, 200, 30_000, mode="a")
        records = task.poll()
        assert isinstance(records, list)
        assert [r.value for r in records] == [partial + b" ends here", *more]
        assert records[-1].source_offset == {"position": path.stat().st_size}
        write_lines(path, 5_000, 30_200, mode="a")
        assert isinstance(task.poll(), list)
        task.commit()
        write_lines(path, 5_000, 35_200, mode="a")
        assert isinstance(task.poll(), SourceBatch)
    finally:
        task.stop()


@pytest.mark.spark
@pytest.mark.timeout(300)
def test_a_whole_file_goes_to_sparks_text_reader_and_is_read_again_if_it_grew(
    spark: SparkRuntime, tmp_path: Path
) -> None:
    path = tmp_path / "whole.txt"
    lines = write_lines(path, 20_000)
    odd = [b"crlf\r", b"a lone \r inside", b"", b"not utf-8 \xff\xfe", b"two \r\r"]
    append_lines(path, odd)
    # as FileStreamSource splits lines: "\r\n" ends one, a lone "\r" is kept
    expected = [*lines, b"crlf", b"a lone \r inside", b"", b"not utf-8 \xff\xfe", b"two \r"]
    conf = spark.session.conf
    conf.set("spark.sql.files.maxPartitionBytes", "65536")  # many splits, still in order
    task = start_source(path, None)
    try:
        batch = task.poll()
        assert isinstance(batch, SourceBatch) and batch.check is not None
        size = path.stat().st_size
        assert list(batch.offsets) == [({"filename": str(path)}, {"position": size})]
        assert "FileScan text" in batch.data._jdf.queryExecution().executedPlan().toString()
        assert batch.data.rdd.getNumPartitions() >= 8
        # each line's bytes, typed string as Spark's text reader gives them
        assert line_bytes(batch.data) == expected
        batch.check()  # the file did not change: the batch may commit

        # the same read, had the file grown before the job ended, may hold a line past
        # the planned end: the check refuses it, and the task reads the file again by
        # byte ranges, from the start
        more = write_lines(path, 10, 50_000, mode="a")
        with pytest.raises(RetriableError, match="changed while Spark read it"):
            batch.check()
        again = task.poll()
        assert isinstance(again, SourceBatch) and again.check is None
        assert list(again.offsets) == [({"filename": str(path)}, {"position": path.stat().st_size})]
        assert line_bytes(again.data) == [*expected, *more]
    finally:
        conf.unset("spark.sql.files.maxPartitionBytes")
        task.stop()


@pytest.mark.spark
@pytest.mark.timeout(300)
def test_a_file_met_from_its_start_is_one_batch_whatever_parallel_max_bytes_says(
    spark: SparkRuntime, tmp_path: Path
) -> None:
    path = tmp_path / "big.txt"
    lines = write_lines(path, 20_000)
    size = path.stat().st_size
    # ten times the bytes a batch read by ranges may hold: still one batch, read by
    # Spark's text reader
    task = start_source(path, None, parallel_max_bytes=str(size // 10))
    try:
        batch = task.poll()
        assert isinstance(batch, SourceBatch) and batch.check is not None
        assert list(batch.offsets) == [({"filename": str(path)}, {"position": size})]
        assert "FileScan text" in batch.data._jdf.queryExecution().executedPlan().toString()
        assert line_bytes(batch.data) == lines
    finally:
        task.stop()
    # above parallel.whole.max.bytes: batches of parallel.max.bytes, read by ranges
    task = start_source(
        path, None, parallel_max_bytes=str(size // 2), parallel_whole_max_bytes=str(size - 1)
    )
    try:
        first = task.poll()
        assert isinstance(first, SourceBatch) and first.check is None
        ((_, reached),) = first.offsets
        assert size // 2 - len(lines[0]) - 1 <= reached["position"] <= size // 2
        read = line_bytes(first.data)
        assert read == lines[: len(read)]
    finally:
        task.stop()
    # a last line not ended yet: not the whole file, so by ranges up to its last line
    with open(path, "ab") as f:
        f.write(b"partial")
    task = start_source(path, None, parallel_max_bytes=str(size * 2))
    try:
        batch = task.poll()
        assert isinstance(batch, SourceBatch) and batch.check is None
        assert list(batch.offsets) == [({"filename": str(path)}, {"position": size})]
        assert batch.data.toArrow().column("value").to_pylist() == lines
    finally:
        task.stop()


@pytest.mark.spark
@pytest.mark.timeout(300)
def test_a_whole_file_is_read_in_a_split_per_core_of_at_most_a_bound(
    spark: SparkRuntime, tmp_path: Path
) -> None:
    mib = 1 << 20
    cores = spark.parallelism
    assert cores is not None

    def splits(size: int) -> int:
        """Spark's splits of a whole file of ``size`` bytes: a sparse file (one line of
        zeros), as Spark plans a read by sizes alone and no byte of it is read here."""
        path = tmp_path / f"sparse-{size}.txt"
        with open(path, "wb") as f:
            f.truncate(size - 1)
            f.seek(size - 1)
            f.write(b"\n")
        data = whole_file_lines_dataframe(spark.session, str(path))
        assert data is not None
        return data.rdd.getNumPartitions()

    # more than 128 MiB per core, which Spark would cut into 128 MiB splits
    big = cores * 384 * mib + 1
    assert splits(big) == cores
    # past the bound, splits of the bound
    huge = cores * (WHOLE_FILE_SPLIT_MAX_BYTES + 512 * mib)
    assert splits(huge) == -(-huge // WHOLE_FILE_SPLIT_MAX_BYTES)
    # a split size the session sets (the worker's properties) is Spark's to apply
    spark.session.conf.set(MAX_PARTITION_BYTES, str(128 * mib))
    try:
        assert splits(big) == -(-big // (128 * mib))
    finally:
        spark.session.conf.unset(MAX_PARTITION_BYTES)


@pytest.mark.spark
@pytest.mark.timeout(300)
def test_a_derived_session_sets_only_the_confs_it_changes_and_is_made_once(
    spark: SparkRuntime,
) -> None:
    from herder.dataplane.spark import derived_session

    escaped = "spark.sql.parser.escapedStringLiterals"  # deprecated: setting it makes Spark warn
    conf = {MAX_PARTITION_BYTES: "1048576", escaped: "false"}
    derived = derived_session(spark.session, conf)
    assert derived is not None and derived is not spark.session
    assert derived.conf.get(MAX_PARTITION_BYTES, None) == "1048576"
    # held at its default, so not set (and not warned about)
    assert derived.conf.get(escaped, None) is None
    assert derived.conf.get(escaped) == "false"
    # herder's session confs, as the worker's session has them
    assert derived.conf.get("spark.sql.unionOutputPartitioning") == "false"
    assert derived_session(spark.session, dict(conf)) is derived
    assert derived_session(spark.session, {MAX_PARTITION_BYTES: "2097152"}) is not derived
    # the worker's session is not changed
    assert spark.session.conf.get(MAX_PARTITION_BYTES, None) is None


@pytest.mark.spark
@pytest.mark.timeout(300)
def test_a_whole_file_without_carriage_returns_is_read_with_no_expression_per_line(
    spark: SparkRuntime, tmp_path: Path
) -> None:
    path = tmp_path / "plain.txt"
    lines = write_lines(path, 20_000)
    odd = [b"", b"not utf-8 \xff\xfe", b"\xf0 cut short", b"last"]
    append_lines(path, odd)
    task = start_source(path, None)
    try:
        batch = task.poll()
        assert isinstance(batch, SourceBatch) and batch.check is not None
        plan = batch.data._jdf.queryExecution().executedPlan().toString()
        assert "FileScan text" in plan and "CASE" not in plan
        assert batch.data.dtypes == [("value", "string")]
        assert line_bytes(batch.data) == [*lines, *odd]
    finally:
        task.stop()


@pytest.mark.spark
@pytest.mark.timeout(300)
def test_only_whole_files_spark_can_be_given_as_they_are_go_to_its_text_reader(
    spark: SparkRuntime, tmp_path: Path
) -> None:
    globbed = tmp_path / "in[1].txt"  # Spark would read the name as a glob pattern
    lines = write_lines(globbed, 20_000)
    task = start_source(globbed, None)
    try:
        batch = task.poll()
        assert isinstance(batch, SourceBatch) and batch.check is None
        assert batch.data.toArrow().column("value").to_pylist() == lines
    finally:
        task.stop()
    resumed = tmp_path / "resumed.txt"  # not read from its start
    lines = write_lines(resumed, 20_000)
    task = start_source(resumed, {"position": len(lines[0]) + 1})
    try:
        batch = task.poll()
        assert isinstance(batch, SourceBatch) and batch.check is None
        assert batch.data.toArrow().column("value").to_pylist() == lines[1:]
    finally:
        task.stop()
