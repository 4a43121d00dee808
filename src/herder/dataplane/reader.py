"""Reading committed segments: DataFrames for sink tasks, Arrow tables for the CLI.

A reader first plans (:meth:`Topics.plan_read
<herder.dataplane.topics.Topics.plan_read>`): which committed segments hold the
offsets it wants. Segment files do not know their base offset — it was given out at
commit — so each file's rows get their segment's partition and base offset as literals:
the offset is ``base + seq``, and rows outside the wanted ``seq`` range are filtered out
(pushed down to the Parquet reader). A read of a few files unions one scan per file; a
read of many (a low-rate topic's small segments) reads them in one scan and finds each
row's segment by its file's path (``_metadata.file_path``, whose last six components are
the path stored in the ensemble) in a literal map, which costs a lookup per row but keeps
the plan small. The columns are those of Spark's Kafka source
(:data:`~herder.connect.SINK_COLUMNS`).

Segments that say which run of offsets each file holds (:attr:`Segment.file_counts
<herder.dataplane.metadata.Segment.file_counts>`) are read file by file, only the files
a read needs, filtered only where a file is partly wanted; and since each file's rows are
in offset order, so is the union of their scans: an ordered read of them costs no sort.
Other ordered reads are sorted by (partition, offset).

The CLI reads a segment at a time with pyarrow instead: no JVM to start for a
``consume`` of a few records.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from herder.dataplane.records import HEADER_TYPE, HEADERS_DDL, SEGMENT_SCHEMA
from herder.dataplane.storage import Storage
from herder.dataplane.topics import SegmentSlice

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

#: The schema of a segment file, as Spark reads it.
FILE_DDL = f"key binary, value binary, headers {HEADERS_DDL}, timestamp bigint, seq bigint"
#: The schema of what a reader gets: Spark's Kafka source's columns, in its order.
SINK_DDL = (
    "topic string, partition int, offset bigint, timestamp timestamp, key binary, "
    f"value binary, headers {HEADERS_DDL}"
)
#: Reads of at most this many files scan each file on its own (see the module docstring).
MAX_FILES_UNIONED = 32
#: Components of a segment file's path below the root (``_staging/w/b/topic=/partition=/f``).
_PATH_DEPTH = 6


def slices_dataframe(
    spark: SparkSession,
    storage: Storage,
    topic: str,
    slices: Sequence[SegmentSlice],
    *,
    ordered: bool = False,
) -> DataFrame:
    """The records of ``slices`` as one DataFrame; in (partition, offset) order if ``ordered``.

    An ordered DataFrame's Spark partitions come in that order, each one's rows in it.
    """
    from pyspark.sql import functions as F

    if not slices:
        return spark.createDataFrame([], SINK_DDL)
    if all(piece.segment.ordered for piece in slices):
        files = _files_of(slices)
        if len(files) <= MAX_FILES_UNIONED:
            # one scan per file, in order: a scan's partitions follow its file's row
            # order, and a union keeps its inputs' partitions in order
            return _file_by_file(spark, storage, topic, files)
    elif sum(len(piece.segment.files) for piece in slices) <= MAX_FILES_UNIONED:
        files = [
            _FileRead(piece.segment.partition, piece.segment.base_offset, path,
                      piece.from_offset, piece.to_offset, filtered=True,
                      timestamp=piece.segment.max_timestamp)
            for piece in slices
            for path in piece.segment.files
        ]  # fmt: skip
        out = _file_by_file(spark, storage, topic, files)
        return out.orderBy("partition", "offset") if ordered else out
    pairs = []
    paths = []
    for piece in slices:
        segment = piece.segment
        where = F.struct(
            F.lit(segment.partition).cast("int").alias("partition"),
            F.lit(segment.base_offset).cast("long").alias("base"),
            F.lit(piece.from_offset - segment.base_offset).cast("long").alias("lo"),
            F.lit(piece.to_offset - segment.base_offset).cast("long").alias("hi"),
            F.lit(segment.max_timestamp).cast("long").alias("timestamp"),
        )
        for path in segment.files:
            pairs += [F.lit(path), where]
            paths.append(storage.uri(path))
    located = F.create_map(*pairs)[
        F.substring_index(F.col("_metadata.file_path"), "/", -_PATH_DEPTH)
    ]
    rows = (
        spark.read.schema(FILE_DDL)
        .parquet(*paths)
        .withColumn("_segment", located)
        .where((F.col("seq") >= F.col("_segment.lo")) & (F.col("seq") < F.col("_segment.hi")))
    )
    out = rows.select(
        F.lit(topic).alias("topic"),
        F.col("_segment.partition").alias("partition"),
        (F.col("_segment.base") + F.col("seq")).alias("offset"),
        _timestamp(F.col("_segment.timestamp")),
        "key",
        "value",
        _headers(),
    )
    return out.orderBy("partition", "offset") if ordered else out


def _timestamp(shared: Column) -> Column:
    """Each record's timestamp: its own, or, in a file without them, ``shared``."""
    from pyspark.sql import functions as F

    return F.timestamp_millis(F.coalesce(F.col("timestamp"), shared)).alias("timestamp")


def _headers() -> Column:
    """Each record's headers; none (an empty list) in a file without them."""
    from pyspark.sql import functions as F

    empty = F.array().cast(HEADERS_DDL)
    return F.coalesce(F.col("headers"), empty).alias("headers")


@dataclass(frozen=True)
class _FileRead:
    """Offsets ``[from_offset, to_offset)`` of a segment's file; ``filtered`` if the
    file holds records outside them."""

    partition: int
    base_offset: int
    path: str
    from_offset: int
    to_offset: int
    filtered: bool
    #: the segment's newest timestamp: every record's, in a file without them
    timestamp: int


def _files_of(slices: Sequence[SegmentSlice]) -> list[_FileRead]:
    """The files of ordered segments that hold records of ``slices``, in offset order."""
    files = []
    for piece in slices:
        segment = piece.segment
        for path, first, end in segment.file_ranges():
            lo, hi = max(first, piece.from_offset), min(end, piece.to_offset)
            if lo < hi:
                files.append(
                    _FileRead(segment.partition, segment.base_offset, path, lo, hi,
                              filtered=lo > first or hi < end,
                              timestamp=segment.max_timestamp)
                )  # fmt: skip
    return files


def _file_by_file(
    spark: SparkSession, storage: Storage, topic: str, files: Sequence[_FileRead]
) -> DataFrame:
    """The records of ``files``, one Parquet scan per file, unioned in their order."""
    from functools import reduce

    from pyspark.sql import functions as F

    parts = []
    for file in files:
        rows = spark.read.schema(FILE_DDL).parquet(storage.uri(file.path))
        if file.filtered:
            lo = file.from_offset - file.base_offset
            hi = file.to_offset - file.base_offset
            rows = rows.where((F.col("seq") >= F.lit(lo)) & (F.col("seq") < F.lit(hi)))
        parts.append(
            rows.select(
                F.lit(topic).alias("topic"),
                F.lit(file.partition).cast("int").alias("partition"),
                (F.lit(file.base_offset).cast("long") + F.col("seq")).alias("offset"),
                _timestamp(F.lit(file.timestamp).cast("long")),
                "key",
                "value",
                _headers(),
            )
        )
    return reduce(lambda a, b: a.unionAll(b), parts)


#: What :func:`slice_table` gives: one row per record, in offset order.
SLICE_SCHEMA = pa.schema(
    [
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp", pa.int64()),
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("headers", HEADER_TYPE),
    ]
)


def slice_table(storage: Storage, piece: SegmentSlice) -> pa.Table:
    """The records of one slice, read with pyarrow, in offset order (timestamps in ms)."""
    segment = piece.segment
    table = storage.read_table(segment.files, schema=SEGMENT_SCHEMA)
    if table["headers"].null_count:
        no_headers = pa.array([[]] * table.num_rows, HEADER_TYPE)
        table = table.set_column(
            table.schema.get_field_index("headers"),
            "headers",
            pc.if_else(pc.is_null(table["headers"]), no_headers, table["headers"]),
        )
    if table["timestamp"].null_count:
        stamps = pc.fill_null(table["timestamp"], pa.scalar(segment.max_timestamp, pa.int64()))
        table = table.set_column(table.schema.get_field_index("timestamp"), "timestamp", stamps)
    offsets = pc.add(table["seq"], pa.scalar(segment.base_offset, pa.int64()))
    wanted = pc.and_(
        pc.greater_equal(offsets, piece.from_offset), pc.less(offsets, piece.to_offset)
    )
    table = table.append_column("offset", offsets).filter(wanted).sort_by("offset")
    partition = pa.array([segment.partition] * table.num_rows, pa.int32())
    return pa.table(
        [
            partition,
            table["offset"],
            table["timestamp"],
            table["key"],
            table["value"],
            table["headers"],
        ],
        schema=SLICE_SCHEMA,
    )
