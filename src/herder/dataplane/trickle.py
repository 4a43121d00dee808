"""The trickle path: small batches written and read by the worker itself, with pyarrow.

A Spark job costs a hundred milliseconds or more however few records it moves (job
planning, task scheduling, Python workers: SPARK_NOTES), and a record that crosses a
pipeline meets two of them, one to stage its batch and one to read it for the sink. At a
few records a second that is most of a record's latency, for no gain: a batch of a
handful of records is written by pyarrow in well under a millisecond.

So a batch of SourceRecords no bigger than the worker's trickle limits
(:data:`TRICKLE_MAX_RECORDS`, :data:`TRICKLE_MAX_BYTES`) is staged by the worker: the
same Parquet files Spark would write — in the same staging directory
(``_staging/<task>-e<epoch>/<batch>/topic=<t>/partition=<p>/``, so reaping and fencing
see no difference), named as Spark names its files, with the same columns, types,
statistics and Spark's schema in the footer — described and committed exactly as a
Spark-written batch is, in the same single ensemble transaction with the source
offsets. Readers cannot tell them apart, and need not.

On the sink side, a delivery of no more than the limits, of segments of bytes (not
typed), with no transforms, to a sink that takes Arrow tables
(:meth:`SinkTask.accepts_arrow <herder.connect.SinkTask.accepts_arrow>`), is read with
pyarrow (:func:`~herder.dataplane.reader.slice_batches`) and handed to the sink as one
table, instead of a DataFrame and a Spark job. Offsets are committed as after any put.
Such a sink is delivered small files (a trickle's segments) a trickle path's worth at
a time rather than gathered up to ``consumer.max.records`` for one Spark job, which
kept a sink behind a steady stream by seconds; a big file (bulk data) is still
delivered whole, through Spark.

Bulk data keeps moving through Spark: a batch over the limits, a SourceBatch (a
DataFrame), or typed records never take this path.
"""

from __future__ import annotations

import contextlib
import functools
import json
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import pyarrow as pa
import pyarrow.parquet as pq

from herder.connect import partitions_of
from herder.dataplane.codec import DEFAULT_CODEC, SegmentCodec
from herder.dataplane.records import HEADER_TYPE
from herder.dataplane.typed import SPARK_ROW_METADATA
from herder.errors import ConfigError

if TYPE_CHECKING:
    from herder.dataplane.metadata import SegmentSlice
    from herder.dataplane.storage import Storage

#: Worker config: most records a batch may hold to be staged, or a delivery to be read,
#: without Spark; 0 turns the trickle path off.
TRICKLE_MAX_RECORDS: Final = "dataplane.trickle.max.records"
#: Worker config: most bytes (Arrow bytes of a batch staged, stored bytes of a delivery
#: read) the trickle path takes.
TRICKLE_MAX_BYTES: Final = "dataplane.trickle.max.bytes"
#: Defaults chosen by measurement (``bench/trickle.py``, see bench/README.md): staging
#: and delivering a batch of 100-byte lines took the trickle path 1/88 of Spark's time
#: at 1 record, 1/28 at 1,000, 1/7.6 at 10,000 and 1/5.8 at 50,000 (2 cores, loaded).
#: So every batch of polled records up to the runtime's default ``batch.max.records``
#: takes it; bulk data — a SourceBatch (a DataFrame: a file's backlog, a directory, a
#: table), or bigger batches — goes through Spark.
DEFAULT_TRICKLE_MAX_RECORDS: Final = 50_000
DEFAULT_TRICKLE_MAX_BYTES: Final = 16 * 1024 * 1024

#: Columns whose min/max statistics a staged file keeps, as Spark's writer is told to
#: (see :data:`herder.dataplane.writer.STAGED_FILE_STATISTICS`).
_STATISTICS: Final = ("seq", "timestamp")
#: The columns of a staged file holding several partitions' rows, in Spark's order.
_SEQUENCED_COLUMNS: Final = ["key", "value", "headers", "timestamp", "seq"]
#: What the sink side gives a sink: the columns of
#: :data:`~herder.connect.SINK_COLUMNS`, in their order.
SINK_ARROW_SCHEMA: Final = pa.schema(
    [
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp", pa.timestamp("ms", tz="UTC")),
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("headers", HEADER_TYPE),
    ]
)


@dataclass(frozen=True)
class TrickleLimits:
    """How small a batch is for the trickle path."""

    max_records: int = DEFAULT_TRICKLE_MAX_RECORDS
    max_bytes: int = DEFAULT_TRICKLE_MAX_BYTES

    @classmethod
    def from_config(cls, settings: Mapping[str, str]) -> TrickleLimits:
        """The limits a worker config sets (the defaults where it sets none)."""
        return cls(
            _non_negative(settings, TRICKLE_MAX_RECORDS, DEFAULT_TRICKLE_MAX_RECORDS),
            _non_negative(settings, TRICKLE_MAX_BYTES, DEFAULT_TRICKLE_MAX_BYTES),
        )

    @property
    def enabled(self) -> bool:
        return self.max_records > 0 and self.max_bytes > 0

    def takes(self, records: int, size: int) -> bool:
        """Whether ``records`` records of ``size`` bytes take the trickle path."""
        return self.enabled and 0 < records <= self.max_records and size <= self.max_bytes


#: The trickle path turned off: every batch goes through Spark.
OFF: Final = TrickleLimits(0, 0)


def _non_negative(settings: Mapping[str, str], key: str, default: int) -> int:
    raw = settings.get(key, str(default)).strip()
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{key}={raw!r} is not a whole number") from None
    if value < 0:
        raise ConfigError(f"{key}={value} must be 0 (trickle path off) or more")
    return value


# -- staging ------------------------------------------------------------------------------


def write_in_order(
    storage: Storage,
    batch: str,
    topic: str,
    partition: int,
    table: pa.Table,
    codec: SegmentCodec = DEFAULT_CODEC,
) -> None:
    """Stage ``table`` — one partition's rows in order, in the columns of a segment file
    that :func:`~herder.dataplane.writer._lean` kept — as Spark's ordered write would
    (:func:`~herder.dataplane.writer._write_partition`): one file, no ``seq``."""
    _write_file(storage, f"{batch}/topic={topic}/partition={partition}", table, codec)


def write_partitioned(
    storage: Storage, batch: str, table: pa.Table, codec: SegmentCodec = DEFAULT_CODEC
) -> None:
    """Stage ``table`` (of :data:`~herder.dataplane.records.STAGE_SCHEMA`), whose rows go
    to several partitions, as Spark's partitioned write would
    (:func:`~herder.dataplane.writer._write`): a directory per partition, each holding a
    file of its rows with their ``seq``."""
    for tp, rows in partitions_of(table):
        place = f"{batch}/topic={tp.topic}/partition={tp.partition}"
        _write_file(storage, place, rows.select(_SEQUENCED_COLUMNS), codec)


def _write_file(storage: Storage, folder: str, table: pa.Table, codec: SegmentCodec) -> None:
    """One staged file in ``folder``, as Spark's Parquet writer lays it out: its name
    (``part-<task>-<job>-c<file>``, which orders a partition's files), ``codec``, one
    row group, statistics only for :data:`_STATISTICS`, and Spark's own schema in the
    footer (which gives the types of typed parts, :mod:`.typed`)."""
    with _FileWriter(storage, folder, 0, table.schema, codec) as writer:
        writer.write(table)


#: Rows of a piece (:func:`write_piece`) gathered into one row group, at most.
PIECE_ROW_GROUP_ROWS: Final = 1 << 17


def write_piece(
    storage: Storage,
    folder: str,
    index: int,
    batches: Iterator[pa.RecordBatch],
    max_rows_per_file: int,
    codec: SegmentCodec = DEFAULT_CODEC,
) -> list[tuple[str, int]]:
    """Stage one piece of a batch (:class:`~herder.connect.ArrowPieces`), read on an
    executor, as Spark's task ``index`` would write it into ``folder``: its rows in
    order, in row groups of up to :data:`PIECE_ROW_GROUP_ROWS`, a new file (``c001``,
    …) every ``max_rows_per_file`` rows. Returns each file written and its rows; a piece
    without any writes none. A piece that fails leaves no file of its own behind."""
    files: list[tuple[str, int]] = []
    writer: _FileWriter | None = None
    pending: list[pa.RecordBatch] = []
    in_file = 0

    def flush() -> None:
        nonlocal pending
        if pending:
            assert writer is not None
            writer.write(pa.Table.from_batches(pending))
            pending = []

    try:
        for whole in batches:
            start = 0
            while start < whole.num_rows:
                if writer is None:
                    writer = _FileWriter(storage, folder, index, whole.schema, codec, len(files))
                    in_file = 0
                batch = whole.slice(start, max_rows_per_file - in_file)
                start += batch.num_rows
                in_file += batch.num_rows
                pending.append(batch)
                if sum(b.num_rows for b in pending) >= PIECE_ROW_GROUP_ROWS:
                    flush()
                if in_file >= max_rows_per_file:
                    flush()
                    writer.close()
                    files.append((writer.path, in_file))
                    writer = None
        if writer is not None:
            flush()
            writer.close()
            files.append((writer.path, in_file))
            writer = None
    except BaseException:
        if writer is not None:
            writer.abandon()
        for path, _rows in files:
            with contextlib.suppress(Exception):
                storage.fs.delete_file(storage.fs_path(path))
        raise
    return files


class _FileWriter:
    """A staged file being written (see :func:`_write_file`): file ``number`` (``c000``,
    …) of Spark's task ``index``."""

    def __init__(
        self,
        storage: Storage,
        folder: str,
        index: int,
        schema: pa.Schema,
        codec: SegmentCodec,
        number: int = 0,
    ) -> None:
        storage.fs.create_dir(storage.fs_path(folder), recursive=True)
        self._storage = storage
        name = f"part-{index:05d}-{uuid.uuid4()}-c{number:03d}{codec.suffix}.parquet"
        self.path = f"{folder}/{name}"
        self._schema = schema
        self._out = storage.fs.open_output_stream(storage.fs_path(self.path))
        self._writer = pq.ParquetWriter(
            self._out,
            schema,
            compression=codec.arrow,
            write_statistics=[c for c in _STATISTICS if c in schema.names],
            # Spark's footer has its own schema and no Arrow one
            store_schema=False,
        )

    def write(self, table: pa.Table) -> None:
        self._writer.write_table(table, row_group_size=max(1, table.num_rows))

    def close(self) -> None:
        self._writer.add_key_value_metadata({SPARK_ROW_METADATA: spark_schema_json(self._schema)})
        self._writer.close()
        self._out.close()

    def abandon(self) -> None:
        """Delete a file left half written, without finishing it: a file with its
        footer would be a readable part of a piece."""
        # the writer must not finish the file when it is collected either
        self._writer.is_open = False
        with contextlib.suppress(Exception):
            self._out.close()
        with contextlib.suppress(Exception):
            self._storage.fs.delete_file(self._storage.fs_path(self.path))

    def __enter__(self) -> _FileWriter:
        return self

    def __exit__(self, kind: object, *rest: object) -> None:
        if kind is None:
            self.close()
        else:
            self.abandon()


@functools.lru_cache(maxsize=64)
def spark_schema_json(schema: pa.Schema) -> str:
    """``schema`` as Spark writes its schema into a Parquet footer (a StructType's JSON).

    Kept per schema: a batch's files share few schemas, and the conversion costs more
    than writing a file of a few records."""
    from pyspark.sql.pandas.types import from_arrow_schema

    # in Spark's order of keys (``json()`` sorts them)
    return json.dumps(from_arrow_schema(schema).jsonValue(), separators=(",", ":"))


# -- reading ------------------------------------------------------------------------------


def read_slices(
    storage: Storage, topic: str, slices: Sequence[SegmentSlice], max_bytes: int
) -> pa.Table | None:
    """The records of ``slices`` as one table of :data:`SINK_ARROW_SCHEMA`, in
    (partition, offset) order; or None if they are not for the trickle path: typed
    segments (whose values a sink gets as Spark types or converted by Spark), or more
    than ``max_bytes`` stored."""
    from herder.dataplane.reader import slice_batches

    stored = 0
    for piece in slices:
        if piece.segment.types:
            return None
        share = (piece.to_offset - piece.from_offset) / max(1, piece.segment.count)
        stored += int(piece.segment.bytes * share)
    if stored > max_bytes:
        return None
    tables = [t for piece in slices for t in slice_batches(storage, piece)]
    if not tables:
        return SINK_ARROW_SCHEMA.empty_table()
    rows = pa.concat_tables(tables)
    return pa.table(
        [
            pa.repeat(pa.scalar(topic, pa.string()), rows.num_rows),
            rows["partition"],
            rows["offset"],
            rows["timestamp"].cast(pa.timestamp("ms", tz="UTC")),
            rows["key"],
            rows["value"],
            rows["headers"],
        ],
        schema=SINK_ARROW_SCHEMA,
    )
