"""Reading committed segments: DataFrames for sink tasks, Arrow tables for the CLI.

A reader first plans (:meth:`Topics.plan_read
<herder.dataplane.topics.Topics.plan_read>`): which committed segments hold the
offsets it wants. Segment files do not know their base offset — it was given out at
commit — so each file's rows get their partition and first offset as literals.

Segments that say which run of offsets each file holds (:attr:`Segment.file_counts
<herder.dataplane.metadata.Segment.file_counts>`) hold each file's records in offset
order, so a record's offset is its file's first offset plus its row's index in the file
(Spark's ``_metadata.row_index``, read as :data:`ROW_INDEX`): such files need no ``seq``
column, and the batches staged by Spark have none. They are read file by file, only the
files a read needs, filtered only where a file is partly wanted; and since the union of
their scans keeps each scan's order, an ordered read of them costs no sort. A *ranged*
read makes each file one Spark partition — whole files in one scan that never cuts or
packs files, others a scan each, unioned (and the session keeps a union's inputs
apart, see :data:`~herder.dataplane.spark.SESSION_CONF`) — so it can say which offsets
each of its Spark partitions holds (:class:`~herder.connect.OffsetRange`): a sink can
write each partition out on its own, in order, with no shuffle. Other
segments' files carry ``seq``, each record's place in its segment: the offset is ``base +
seq``, rows outside the wanted range are filtered out (pushed down to the Parquet
reader), and an ordered read is sorted by (partition, offset) — a ranged one within
each segment, which it reads as one Spark partition.

A read of many files (a low-rate topic's small segments) reads them in one scan and
finds each row's file by its path (``_metadata.file_path``, whose last six components
are the path stored in the ensemble) in a literal map, which costs a lookup per row but
keeps the plan small. The columns are those of Spark's Kafka source
(:data:`~herder.connect.SINK_COLUMNS`).

Typed keys and values (:mod:`.typed`) are read as the segments' Spark types, merged
when they differ (a column added upstream: older records have it null); a read that
mixes typed segments with segments of bytes gives bytes, the typed values as
JsonConverter's envelope (:func:`~herder.dataplane.schemas.encode_column`). Fields of
a typed value that a segment keeps once rather than in its files
(:attr:`Segment.value_constants <herder.dataplane.metadata.Segment.value_constants>`)
are put back as literals in the projection of each of its files, so such files are
always read file by file.

The CLI reads a slice at a time with pyarrow instead, a batch of records at a time: no
JVM to start for a ``consume`` of a few records.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from herder.connect import OffsetRange, TopicPartition
from herder.dataplane.metadata import Segment, SegmentSlice
from herder.dataplane.records import HEADER_TYPE, HEADERS_DDL, SEGMENT_SCHEMA, no_headers
from herder.dataplane.spark import derived_session
from herder.dataplane.storage import Storage
from herder.dataplane.typed import PARTS, merge_types, restored_sql
from herder.dataplane.typed import ddl as typed_ddl

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

#: The schema of a segment file, as Spark reads it, with the DDL of its key and value.
FILE_SCHEMA = "key {key}, value {value}, headers " + HEADERS_DDL + ", timestamp bigint, seq bigint"
#: The schema of a segment file of bytes.
FILE_DDL = FILE_SCHEMA.format(key="binary", value="binary")
#: The schema of what a reader gets: Spark's Kafka source's columns, in its order.
SINK_DDL = (
    "topic string, partition int, offset bigint, timestamp timestamp, key binary, "
    f"value binary, headers {HEADERS_DDL}"
)
#: A column that Spark's Parquet reader fills with each row's index in its file: the
#: mechanism behind ``_metadata.row_index``, asked for by name. Unlike ``_metadata``,
#: which makes a scan build its whole struct for every row even when a reader uses none
#: of it, this column is pruned like any other when no one uses the offsets.
ROW_INDEX = "_tmp_metadata_row_index"
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
    ranged: bool = False,
    columns: Mapping[str, str | None] | None = None,
) -> tuple[DataFrame, list[OffsetRange] | None]:
    """The records of ``slices`` as one DataFrame; in (partition, offset) order if
    ``ordered``. With it, if ``ranged``, the offset range each of its Spark partitions
    holds, in the order of its partitions; or None if its partitions do not follow
    offset ranges. A ranged read's partitions each hold their range in offset order,
    but they need not come in offset order themselves: whole files are read in one scan,
    whose partitions come in the order Spark reads them (see :func:`_whole_files_scan`).
    ``columns``: the only ones a ranged read need give, and how (see
    :meth:`~herder.connect.SinkTask.columns_read`; a read of whole files then gives
    them alone); by default all.

    An ordered DataFrame's Spark partitions come in that order, each one's rows in it.
    An ordered ``ranged`` read of at most :data:`MAX_FILES_UNIONED` pieces (a
    positional file, see the module docstring, or a whole segment of another kind) has
    one Spark partition per piece, whose range it holds.
    """
    if not slices:
        return spark.createDataFrame([], SINK_DDL), None
    files = _files_of(slices)
    types = _ReadTypes.of(topic, files)
    # a mixed read converts each typed file's values on their own, and a file whose
    # segment keeps some of its values' fields once gets them back on its own: file by file
    few = len(files) <= MAX_FILES_UNIONED or bool(types.encoded) or any(f.constants for f in files)
    pieces = _pieces_of(files)
    if ranged and ordered and len(pieces) <= MAX_FILES_UNIONED:
        scanned = _whole_files_scan(spark, storage, topic, files, types, columns)
        if scanned is not None:
            return scanned
        # one Spark partition per piece (a positional file, or a whole segment of
        # another kind, sorted), in order: a union keeps its inputs' partitions in
        # order, so the DataFrame's are its pieces' ranges
        ranges = [
            OffsetRange(TopicPartition(topic, p[0].partition), p[0].from_offset, p[0].to_offset)
            for p in pieces
        ]
        return _piece_by_piece(spark, storage, topic, pieces, types), ranges
    if few:
        # one scan per file, in order: a scan's partitions follow its file's row order,
        # and a union keeps its inputs' partitions in order
        out = _file_by_file(spark, storage, topic, files, types)
    else:
        out = _one_scan(spark, storage, topic, files, types)
    if ordered and not (few and all(f.positional for f in files)):
        out = out.orderBy("partition", "offset")
    return out, None


@dataclass(frozen=True)
class _ReadTypes:
    """The types a read gives each part (:data:`~.typed.PARTS`), as DDL, and the parts
    whose typed files become bytes because other files hold bytes (a mixed read)."""

    ddl: dict[str, str]
    encoded: frozenset[str]
    #: the stored type of each part the read gives typed (see :mod:`.typed`)
    stored: dict[str, str]

    @classmethod
    def of(cls, topic: str, files: Sequence[_FileRead]) -> _ReadTypes:
        ddl, encoded, merged = {}, set(), {}
        for part in PARTS:
            stored = [f.types.get(part) for f in files]
            typed = [t for t in stored if t is not None]
            if len(typed) == len(stored):
                merged[part] = merge_types(list(dict.fromkeys(typed)), f"topic {topic}, {part}")
                ddl[part] = typed_ddl(merged[part])
            else:
                ddl[part] = "binary"
                if typed:
                    encoded.add(part)
        return cls(ddl, frozenset(encoded), merged)

    def restored_value(self, file: _FileRead) -> str:
        """SQL for a file's values with the fields its segment keeps once put back, of
        the type the file is read with (see :meth:`file_schema`)."""
        own = file.types["value"]
        stored = own if "value" in self.encoded else self.stored["value"]
        return restored_sql("value", stored, file.constants)

    def file_schema(self, file: _FileRead) -> str:
        """The DDL a file is read with: the read's types, or for a part the read
        gives as bytes, the file's own (converted after the scan)."""
        found = {}
        for part in PARTS:
            own = file.types.get(part)
            found[part] = typed_ddl(own) if part in self.encoded and own else self.ddl[part]
        return FILE_SCHEMA.format(**found)


def _one_scan(
    spark: SparkSession,
    storage: Storage,
    topic: str,
    files: Sequence[_FileRead],
    types: _ReadTypes,
) -> DataFrame:
    """The records of ``files`` in one Parquet scan, each row's file found by its path."""
    from pyspark.sql import functions as F

    pairs = []
    for file in files:
        where = F.struct(
            F.lit(file.partition).cast("int").alias("partition"),
            F.lit(file.first).cast("long").alias("first"),
            F.lit(file.positional).alias("positional"),
            F.lit(file.from_offset - file.first).cast("long").alias("lo"),
            F.lit(file.to_offset - file.first).cast("long").alias("hi"),
            F.lit(file.timestamp).cast("long").alias("timestamp"),
        )
        pairs += [F.lit(file.path), where]
    located = F.create_map(*pairs)[
        F.substring_index(F.col("_metadata.file_path"), "/", -_PATH_DEPTH)
    ]
    place = F.when(F.col("_file.positional"), F.col("_metadata.row_index")).otherwise(F.col("seq"))
    rows = (
        spark.read.schema(FILE_SCHEMA.format(**types.ddl))
        .parquet(*(storage.read_uri(file.path) for file in files))
        .withColumn("_file", located)
        .withColumn("_place", place)
        .where((F.col("_place") >= F.col("_file.lo")) & (F.col("_place") < F.col("_file.hi")))
    )
    return rows.selectExpr(
        *_sink_columns(topic, "_file.partition", "_file.first + _place", "_file.timestamp")
    )


# SQL strings rather than Column objects: a few calls into Spark's JVM per file, where
# Columns cost a couple of hundred (a third of a second for three files).


def _located_columns(partition: str, offset: str, shared_timestamp: str) -> list[str]:
    """SQL for a segment file's rows with what differs from file to file: the SQL of
    their partition, their offset and, for a file without timestamps, its segment's
    timestamp (in ms)."""
    return [
        f"CAST({partition} AS INT) AS partition",
        f"{offset} AS offset",
        f"coalesce(timestamp, CAST({shared_timestamp} AS BIGINT)) AS timestamp",
        "key",
        "value",
        "headers",
    ]


def _sink_columns(
    topic: str,
    partition: str = "partition",
    offset: str = "offset",
    shared_timestamp: str | None = None,
) -> list[str]:
    """SQL for the columns a reader gives: by default from those of
    :func:`_located_columns`, the same for every file, so a union of files is projected
    once; or, for a scan of several files, projected once too, straight from the SQL of
    their partition, their offset and the timestamp (in ms) of a file without
    timestamps, as :func:`_located_columns` takes them. Topic names are letters,
    digits, ``.``, ``_`` and ``-``: safe in a SQL literal."""
    timestamp = "timestamp"
    if shared_timestamp is not None:
        timestamp = f"coalesce(timestamp, CAST({shared_timestamp} AS BIGINT))"
    return [
        f"'{topic}' AS topic",
        f"CAST({partition} AS INT) AS partition",
        f"{offset} AS offset",
        f"timestamp_millis({timestamp}) AS timestamp",
        "key",
        "value",
        f"coalesce(headers, CAST(array() AS {HEADERS_DDL})) AS headers",
    ]


@dataclass(frozen=True)
class _FileRead:
    """Offsets ``[from_offset, to_offset)`` of a segment's file.

    ``positional``: the file holds a run of offsets from ``first`` in order, a row's
    offset is ``first`` plus its index in the file. Otherwise ``first`` is the segment's
    base offset and a row's offset is ``first + seq``. ``filtered`` if the file holds
    records outside the wanted offsets.
    """

    partition: int
    path: str
    first: int
    positional: bool
    from_offset: int
    to_offset: int
    filtered: bool
    #: the segment's newest timestamp: every record's, in a file without them
    timestamp: int
    #: the stored types of the segment's typed parts (see :mod:`.typed`)
    types: dict[str, str]
    #: the value's fields the segment keeps once, not in its files (see :mod:`.typed`)
    constants: dict[str, Any] = field(default_factory=dict)


def _files_of(slices: Sequence[SegmentSlice]) -> list[_FileRead]:
    """The files that hold records of ``slices``: of an ordered segment only those that
    do, in offset order; of another, all of them."""
    files = []
    for piece in slices:
        segment = piece.segment
        types, constants = segment.types, segment.constants
        if not segment.ordered:
            files += [
                _FileRead(segment.partition, path, segment.base_offset, False,
                          piece.from_offset, piece.to_offset, filtered=True,
                          timestamp=segment.max_timestamp, types=types, constants=constants)
                for path in segment.files
            ]  # fmt: skip
            continue
        for path, first, end in segment.file_ranges():
            lo, hi = max(first, piece.from_offset), min(end, piece.to_offset)
            if lo < hi:
                files.append(
                    _FileRead(segment.partition, path, first, True, lo, hi,
                              filtered=lo > first or hi < end,
                              timestamp=segment.max_timestamp, types=types,
                              constants=constants)
                )  # fmt: skip
    return files


def _file_by_file(
    spark: SparkSession,
    storage: Storage,
    topic: str,
    files: Sequence[_FileRead],
    types: _ReadTypes,
) -> DataFrame:
    """The records of ``files``, one Parquet scan per file, unioned in their order.

    Spark's JVM analyses each DataFrame as it is made, which costs a read some 10 ms per
    expression list: each scan projects only what differs from file to file, and the
    union is projected once into the columns a reader gives (two files: 65 ms, from 95).
    """
    return _union(_located_scans(spark, storage, files, types)).selectExpr(*_sink_columns(topic))


def _located_scans(
    spark: SparkSession,
    storage: Storage,
    files: Sequence[_FileRead],
    types: _ReadTypes,
    *,
    one_partition_each: bool = False,
) -> list[DataFrame]:
    """A Parquet scan of each of ``files``, its rows in the columns of
    :func:`_located_columns`; each scan read by one Spark task if ``one_partition_each``
    (Spark would otherwise cut a file into splits sized from the whole session's
    parallelism, some of them empty)."""
    from pyspark.sql import functions as F

    def scan(file: _FileRead) -> DataFrame:
        schema, place = types.file_schema(file), "seq"
        if file.positional:
            # a Spark without this mechanism would give nulls: fail the read instead
            missing = f"raise_error('Spark gave no row index for {file.path}')"
            schema, place = f"{schema}, {ROW_INDEX} bigint", f"coalesce({ROW_INDEX}, {missing})"
        rows = spark.read.schema(schema).parquet(storage.read_uri(file.path))
        if file.constants:
            # the fields the file leaves out are null as read: their one value instead
            rows = rows.withColumn("value", F.expr(types.restored_value(file)))
        encode = [part for part in types.encoded if part in file.types]
        if encode:
            rows = _as_envelopes(rows, encode)
        if one_partition_each:
            # on the scan (measured: a text write of two files 3% faster than with the
            # projection under the coalesce)
            rows = rows.coalesce(1)
        if file.filtered:
            lo = file.from_offset - file.first
            hi = file.to_offset - file.first
            rows = rows.where(f"{place} >= {lo} AND {place} < {hi}")
        offset = f"CAST({file.first} AS BIGINT) + {place}"
        return rows.selectExpr(*_located_columns(str(file.partition), offset, str(file.timestamp)))

    return [scan(file) for file in files]


def _union(parts: Sequence[DataFrame]) -> DataFrame:
    """``parts`` unioned in their order (a union keeps its inputs' partitions in order)."""
    from functools import reduce

    return reduce(lambda a, b: a.unionAll(b), parts)


def _pieces_of(files: Sequence[_FileRead]) -> list[list[_FileRead]]:
    """``files`` grouped into the pieces reads are cut at (see
    :meth:`~herder.dataplane.metadata.PartitionState.piece_ends`): a positional file
    alone, the files of another segment together."""
    pieces: list[list[_FileRead]] = []
    for file in files:
        previous = pieces[-1][-1] if pieces else None
        if (
            previous is not None
            and not file.positional
            and not previous.positional
            and (previous.partition, previous.first) == (file.partition, file.first)
        ):
            pieces[-1].append(file)
        else:
            pieces.append([file])
    return pieces


def _whole_files_scan(
    spark: SparkSession,
    storage: Storage,
    topic: str,
    files: Sequence[_FileRead],
    types: _ReadTypes,
    columns: Mapping[str, str | None] | None = None,
) -> tuple[DataFrame, list[OffsetRange]] | None:
    """The records of ``files`` in one Parquet scan that reads each file as a Spark
    partition of its own, and the offset range each partition holds, in the order
    Spark reads them (it reads the biggest file first, not the first offsets); None
    unless every file is positional, wanted whole and read as it is stored (no value
    fields put back, no envelope), or where there is no :func:`unsplit_session`.

    One scan costs less than a union of a scan per file (:func:`_piece_by_piece`):
    Spark resolves one relation rather than one a file, sends the job's tasks one
    Hadoop configuration rather than one a file, and reads every file in the same
    compiled code. Measured in one process, interleaved, a text write of 10,000,000
    records staged in 8 files: planned in 0.09 s and written in 1.17 s, against 0.17 s
    and 1.35 s as a union (plain Spark's scan of the same files: 0.05 s and 1.08 s).

    A row's partition, offset and timestamp come from its file: a literal where every
    file has the same, else found by the file's name (``input_file_name()``, the name
    Spark's scan gives it) in a literal map, a lookup per row, but only for a reader
    that uses them (a sink writing values reads values alone). Which file each Spark
    partition reads is Spark's own planning, asked of the scan once; the same relation
    is planned alike for whatever derives from it.

    Where the reader wants ``columns`` a segment file holds as they are (keys and
    values), the scan of them is the DataFrame, with no projection: Spark analyses a
    projection of every column at each delivery, only for it to be pruned away again.
    Bytes wanted as strings are read as strings, which Parquet's bytes are either way.
    """
    unsplit = unsplit_session(spark)
    if unsplit is None or types.encoded or not files:
        return None
    if any(not f.positional or f.filtered or f.constants for f in files):
        return None
    # only what the files hold as it is (keys, values): the scan alone, of them
    stored = columns if columns and set(columns) <= set(types.ddl) else None
    if stored is not None:
        # bytes wanted as text are read as strings; typed parts as they are typed
        read_as = {c: "string" if how == "string" and types.ddl[c] == "binary" else types.ddl[c]
                   for c, how in stored.items()}  # fmt: skip
        schema = ", ".join(f"{c} {t}" for c, t in read_as.items())
    else:
        schema = f"{FILE_SCHEMA.format(**types.ddl)}, {ROW_INDEX} bigint"
    rows = unsplit.read.schema(schema).parquet(*(storage.read_uri(f.path) for f in files))
    read = _files_read(rows)
    if read is None:
        return None
    ordered = [f for name in read for f in files if _names(name, f.path)]
    if len(ordered) != len(files) or len(set(map(id, ordered))) != len(files):
        wanted = [f.path for f in files]
        raise RuntimeError(f"Spark planned to read {read}, which are not the files {wanted}")
    ranges = [
        OffsetRange(TopicPartition(topic, f.partition), f.from_offset, f.to_offset) for f in ordered
    ]
    if stored is not None:
        return rows, ranges
    unknown = "raise_error('Spark read a file the read did not plan: ' || input_file_name())"

    def by_file(values: list[str]) -> str:
        # the one value if every file has it (its files are the relation's, fixed when
        # it was made); else a lookup by the name of the file a row comes from
        if len(set(values)) == 1:
            return values[0]
        pairs = ", ".join(f"{_sql_string(n)}, {v}" for n, v in zip(read, values, strict=True))
        return f"coalesce(map({pairs})[input_file_name()], {unknown})"

    missing = "raise_error('Spark gave no row index for ' || input_file_name())"
    first = by_file([f"CAST({f.first} AS BIGINT)" for f in ordered])
    # one projection, which Spark analyses in some 7 ms a DataFrame
    out = rows.selectExpr(
        *_sink_columns(
            topic,
            by_file([str(f.partition) for f in ordered]),
            f"{first} + coalesce({ROW_INDEX}, {missing})",
            by_file([f"CAST({f.timestamp} AS BIGINT)" for f in ordered]),
        )
    )
    return out, ranges


def _files_read(rows: DataFrame) -> list[str] | None:
    """The file each Spark partition of a scan reads, as Spark names it (the name
    ``input_file_name()`` gives), in the order of its partitions; None if a partition
    reads several (the worker's properties bound the partitions of a scan:
    ``spark.sql.files.maxPartitionNum``), or if the scan is not Spark's file scan
    (a worker's properties may have Parquet read by another source)."""
    from py4j.protocol import Py4JError

    try:
        scan = rows._jdf.queryExecution().executedPlan().collectLeaves().head()
        names = []
        for partition in scan.inputRDD().partitions():
            files = partition.files()
            if len(files) != 1:
                return None
            names.append(str(files[0].filePath().toString()))
    except Py4JError:
        log.debug("a scan's files were not found in its plan; read file by file", exc_info=True)
        return None
    return names


def _names(name: str, path: str) -> bool:
    """Whether Spark's ``name`` for a file (a URI) names the file at ``path`` in storage."""
    from urllib.parse import unquote

    return unquote(name).endswith("/" + path)


def _sql_string(text: str) -> str:
    """``text`` as a Spark SQL string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _piece_by_piece(
    spark: SparkSession,
    storage: Storage,
    topic: str,
    pieces: Sequence[Sequence[_FileRead]],
    types: _ReadTypes,
) -> DataFrame:
    """The records of ``pieces`` in order, each piece one Spark partition in offset
    order: a positional file is one already (read in :func:`unsplit_session`, where a
    scan never cuts a file, or coalesced where there is none); a segment's files with
    ``seq`` are read together into one partition and sorted within it (no shuffle).
    The union of the pieces is projected once into the columns a reader gives, and
    belongs to the unsplit session where there is one."""
    unsplit = unsplit_session(spark)
    session = unsplit or spark
    parts = []
    for piece in pieces:
        if piece[0].positional:
            parts += _located_scans(
                session, storage, piece, types, one_partition_each=unsplit is None
            )
        else:
            rows = _union(_located_scans(session, storage, piece, types)).coalesce(1)
            parts.append(rows.sortWithinPartitions("offset"))
    return _union(parts).selectExpr(*_sink_columns(topic))


#: a session where a scan reads each file whole, as one Spark partition
UNSPLIT_CONF: Mapping[str, str] = {
    # a file is one split whatever its size: no cap on a split's bytes, and no share of
    # the cores to cut it down to
    "spark.sql.files.maxPartitionBytes": str(1 << 62),
    "spark.sql.files.minPartitionNum": "1",
    # nor packs files together: a file opens at the cost of a whole split
    "spark.sql.files.openCostInBytes": str(1 << 62),
    # nor runs a scan as one task (a plan Spark deems small), whatever the worker's
    # properties say: a ranged read's partitions are its files
    "spark.sql.optimizer.singleTaskExecution.enabled": "false",
    # and reads SQL string literals with their escapes (_sql_string), whatever the
    # worker's properties say
    "spark.sql.parser.escapedStringLiterals": "false",
}


def unsplit_session(spark: SparkSession) -> SparkSession | None:
    """A :func:`~herder.dataplane.spark.derived_session` of ``spark`` in which a scan
    never cuts a file into splits (:data:`UNSPLIT_CONF`), so that a scan of one file is
    one Spark partition; None under Spark Connect, which has no such session.

    Spark cuts a file bigger than its share of the session's cores into splits, so a
    ranged read would otherwise coalesce each file's scan into one partition. Rows then
    cross from the scan's compiled code to the projection's above it one at a time, as
    copies: a text write of 10,000,000 records took 2.4 s that way against 1.8 s for the
    same scans unsplit (plain Spark: 1.7 s). The worker's session keeps splitting files
    for every other read. A ranged read's DataFrame, and whatever a sink derives from
    it, belongs to this session.
    """
    return derived_session(spark, UNSPLIT_CONF)


def _as_envelopes(rows: DataFrame, parts: Sequence[str]) -> DataFrame:
    """``rows`` with the typed ``parts`` as bytes: JsonConverter's envelopes."""
    from herder.dataplane.schemas import encode_column

    return rows.withColumns(
        {part: encode_column(rows[part], rows.schema[part].dataType) for part in parts}
    )


#: What :func:`slice_batches` gives: one row per record, in offset order.
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
#: Rows in each table :func:`slice_batches` gives, at most.
SLICE_BATCH_ROWS = 10_000


def slice_batches(
    storage: Storage, piece: SegmentSlice, max_rows: int = SLICE_BATCH_ROWS
) -> Iterator[pa.Table]:
    """The records of one slice, read with pyarrow, in offset order (timestamps in ms), as
    tables of at most ``max_rows`` records.

    An ordered segment's files are read a batch at a time, and only as far as the slice
    goes: a ``consume`` of a few records from a file of millions reads a few batches, and
    one of all of them holds a batch at a time. Another segment's files are read whole,
    to be sorted. Typed keys and values come as their JSON text (:func:`_as_json`).
    """
    segment = piece.segment
    schema = _file_schema(storage, segment)
    if not segment.ordered:
        table = storage.read_table(segment.files, schema=schema)
        offsets = pc.add(table["seq"], pa.scalar(segment.base_offset, pa.int64()))
        wanted = pc.and_(
            pc.greater_equal(offsets, piece.from_offset), pc.less(offsets, piece.to_offset)
        )
        table = table.append_column("offset", offsets).filter(wanted).sort_by("offset")
        for start in range(0, table.num_rows, max_rows):
            yield _slice_columns(segment, table.slice(start, max_rows))
        return
    for path, first, end in segment.file_ranges():
        lo, hi = max(first, piece.from_offset), min(end, piece.to_offset)
        if lo >= hi:
            continue
        position = first
        for batch in storage.iter_batches(path, schema, max_rows):
            start, stop = max(lo, position), min(hi, position + batch.num_rows)
            if start < stop:
                rows = pa.Table.from_batches([batch.slice(start - position, stop - start)])
                offsets = pa.array(np.arange(start, stop, dtype=np.int64))
                yield _slice_columns(segment, rows.append_column("offset", offsets))
            position += batch.num_rows
            if position >= hi:
                break


def _file_schema(storage: Storage, segment: Segment) -> pa.Schema:
    """The Arrow schema a segment's files are read with: :data:`SEGMENT_SCHEMA`, its
    typed parts of the types its first file holds."""
    if not segment.types:
        return SEGMENT_SCHEMA
    own = storage.footer(segment.files[0]).schema.to_arrow_schema()
    schema = SEGMENT_SCHEMA
    for part in segment.types:
        index = schema.get_field_index(part)
        schema = schema.set(index, own.field(part))
    return schema


def _as_json(column: pa.ChunkedArray) -> pa.Array:
    """Typed values as their JSON text: decimals, dates and times as strings, bytes as
    base64."""

    def default(value: object) -> object:
        if isinstance(value, bytes):
            return base64.b64encode(value).decode()
        return str(value)

    return pa.array(
        [
            None if v is None else json.dumps(v, default=default, separators=(",", ":")).encode()
            for v in column.to_pylist()
        ],
        pa.binary(),
    )


def _restored(column: pa.ChunkedArray, stored: str, constants: dict[str, Any]) -> pa.Array:
    """Struct values read from files that leave out the fields of ``constants``, with
    those fields put back: the struct of stored type ``stored``."""
    from pyspark.sql.pandas.types import to_arrow_type
    from pyspark.sql.types import StructType

    values = column.combine_chunks()
    count = len(values)
    children, fields = [], []
    for spark_field in StructType.fromJson(json.loads(stored)).fields:
        name = spark_field.name
        if name in constants:
            arrow_type = to_arrow_type(spark_field.dataType, timezone="UTC")
            value = constants[name]
            child = (
                pa.nulls(count, arrow_type)
                if value is None
                else pa.array([value] * count, arrow_type)
            )
        else:
            child = values.field(name)
        children.append(child)
        fields.append(pa.field(name, child.type, spark_field.nullable))
    return pa.StructArray.from_arrays(children, fields=fields, mask=values.is_null())


def _slice_columns(segment: Segment, table: pa.Table) -> pa.Table:
    """A segment's rows (with their offsets) as :data:`SLICE_SCHEMA`: missing headers
    empty, missing timestamps the segment's, typed parts as JSON."""
    constants = segment.constants
    if constants and segment.value_type is not None:
        index = table.schema.get_field_index("value")
        restored = _restored(table["value"], segment.value_type, constants)
        table = table.set_column(index, "value", restored)
    for part in segment.types:
        index = table.schema.get_field_index(part)
        table = table.set_column(index, part, _as_json(table[part]))
    headers = table["headers"]
    if headers.null_count:
        if headers.null_count == len(headers):
            headers = no_headers(len(headers))
        else:
            headers = pc.fill_null(headers, pa.scalar([], HEADER_TYPE))
        table = table.set_column(table.schema.get_field_index("headers"), "headers", headers)
    if table["timestamp"].null_count:
        stamps = pc.fill_null(table["timestamp"], pa.scalar(segment.max_timestamp, pa.int64()))
        table = table.set_column(table.schema.get_field_index("timestamp"), "timestamp", stamps)
    partition = pa.repeat(pa.scalar(segment.partition, pa.int32()), table.num_rows)
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
