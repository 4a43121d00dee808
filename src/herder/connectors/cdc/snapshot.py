"""Snapshots of tables by primary-key chunks, merged with the change stream (DBLog).

No lock and no long transaction: a table is read one chunk (a primary-key range of
about ``snapshot.chunk.rows`` rows) at a time, each chunk cut into pieces that Spark's
executors read in parallel (JdbcSource's reader). Each chunk is read in one database
snapshot, exported by a short transaction (:class:`ExportedSnapshot`) that every piece
imports: the chunk is the table as it was at one instant, whenever Spark runs the read.
The task notes the stream's position before the export (low watermark) and the WAL
flushed after it (high watermark), then takes every transaction from the slot up to
the high watermark. Those changes are emitted first, then the chunk's rows as ``r``
events, *without* the rows whose keys those changes touched: a row read in the chunk is
then exactly the row as of the high watermark, so no change is lost or overtaken by an
older read (the method of Netflix's DBLog and Flink CDC's incremental snapshot). As the
snapshot fixes what the read sees, the rows need not be held anywhere between the
watermarks: Spark reads them once, as it writes the batch, and the exporting
transaction ends when the batch is written. The chunk's last key commits with the
batch, so a snapshot interrupted by a crash resumes after the last finished chunk.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from herder.connectors.jdbc.postgres import (
    Database,
    DatabaseError,
    TableId,
    first_line,
    literal,
    quote,
)
from herder.connectors.jdbc.reading import key_ranges, piece_count

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from herder.connect import ArrowPieces
    from herder.connectors.cdc.events import TableShape

_INTEGER_TYPES = ("smallint", "integer", "bigint")


@dataclass(frozen=True)
class SnapshotProgress:
    """What is left of a snapshot: tables to read (the first one in progress), the last
    key of the first one's finished chunks (None before its first chunk), and the
    highest key it had when its snapshot began (None before its first chunk).

    The snapshot of a table ends at that key, as Flink CDC's incremental snapshot
    does: rows inserted above it while the snapshot runs come by the stream, so a
    table that grows faster than its chunks are read is snapshotted all the same.
    """

    tables: tuple[str, ...]
    after: int | None = None
    until: int | None = None

    def to_offset(self) -> dict[str, Any]:
        return {
            "snapshot_tables": list(self.tables),
            "snapshot_after": self.after,
            "snapshot_until": self.until,
        }

    @classmethod
    def from_offset(cls, offset: dict[str, Any]) -> SnapshotProgress | None:
        tables = offset.get("snapshot_tables")
        if not tables:
            return None
        return cls(tuple(tables), offset.get("snapshot_after"), offset.get("snapshot_until"))

    def chunk_done(self, last: int | None, until: int | None = None) -> SnapshotProgress | None:
        """After the chunk ending at ``last`` (None: the table is done), of a snapshot
        that ends at key ``until``."""
        if last is not None:
            return SnapshotProgress(self.tables, last, until if until is not None else self.until)
        rest = self.tables[1:]
        return SnapshotProgress(rest) if rest else None


@dataclass(frozen=True)
class Chunk:
    table: TableId
    #: SQL conditions, one per piece read in parallel
    pieces: tuple[str, ...]
    #: the chunk's last key; None when the chunk is the rest of the table
    last: int | None
    rows: int


def splittable(shape: TableShape) -> bool:
    """Whether a table is cut into chunks: a one-column integer primary key."""
    types = {c.name: c.pg_type for c in shape.columns}
    return len(shape.key) == 1 and types[shape.key[0]] in _INTEGER_TYPES


def snapshot_end(query: Any, shape: TableShape) -> int | None:
    """The highest key of a splittable table now, where its snapshot will end; None
    for an empty table (or one that is read in one piece)."""
    if not splittable(shape):
        return None
    key = quote(shape.key[0])
    high = query(f"SELECT max({key}) FROM {shape.table.sql}")[0]
    return None if high is None else int(high)


#: How sparse a table's keys may be for its chunks to be planned as key ranges: at most
#: this many keys of its span per row (:func:`plan_chunk`).
DENSE_KEYS_PER_ROW = 2.0


def plan_chunk(
    query: Any,
    shape: TableShape,
    after: int | None,
    chunk_rows: int,
    split_rows: int,
    until: int | None = None,
    parallelism: int | None = None,
) -> Chunk | None:
    """The next chunk of ``shape``'s table past key ``after`` and up to key ``until``
    (see :class:`SnapshotProgress`), or None when it is done: in pieces of about
    ``split_rows`` rows, a multiple of ``parallelism`` (Spark's cores) of them, so that
    every core reads a share of each chunk.

    A table whose keys are dense (a span of at most :data:`DENSE_KEYS_PER_ROW` keys per
    row, by the row count the server's statistics estimate) is cut by key ranges, as
    Flink CDC cuts evenly distributed tables: a chunk spans ``chunk_rows`` times that
    many keys, and as its keys are unique it holds at most that many rows — twice
    ``chunk_rows`` at the most, whatever the estimate. Planning it costs a few index
    lookups (a chunk of 500,000 rows: under 5 ms, against 0.1 s to count its keys).
    Any other table's chunks are its next ``chunk_rows`` keys, counted.

    ``query(sql)`` runs a query and returns its first row.
    """
    table = shape.table
    if not splittable(shape):
        # one chunk, the whole table: its rows are all read at once
        if after is not None:
            return None
        return Chunk(table, ("TRUE",), None, -1)
    key = quote(shape.key[0])
    past = f"{key} > {int(after)}" if after is not None else "TRUE"
    if until is not None:
        past += f" AND {key} <= {int(until)}"
    estimate, lowest, highest, low = query(
        f"SELECT (SELECT reltuples FROM pg_class WHERE oid = {literal(table.sql)}::regclass),"
        f" (SELECT min({key}) FROM {table.sql}), (SELECT max({key}) FROM {table.sql}),"
        f" (SELECT min({key}) FROM {table.sql} WHERE {past})"
    )
    if low is None:
        return None
    low = int(low)
    span = int(highest) - int(lowest) + 1
    estimated = float(estimate) if estimate is not None else 0.0
    if estimated > 0 and span <= DENSE_KEYS_PER_ROW * estimated:
        keys_per_row = max(1.0, span / estimated)
        width = max(1, int(chunk_rows * keys_per_row))
        end = int(highest) if until is None else until
        high = min(low + width - 1, end)
        # the last chunk runs to where the table's snapshot ends
        last: int | None = high if high < end else None
        rows = max(1, round((high - low + 1) / keys_per_row))
        return Chunk(table, _pieces(key, low, high, rows, split_rows, parallelism), last, rows)
    row = query(
        f"SELECT count(*), max(k) FROM (SELECT {key} AS k FROM {table.sql}"
        f" WHERE {past} ORDER BY {key} LIMIT {int(chunk_rows)}) AS c"
    )
    rows, high = int(row[0]), int(row[1])
    # the last chunk of a table runs to its end: rows inserted past it come by the stream
    last = high if rows == chunk_rows and (until is None or high < until) else None
    return Chunk(table, _pieces(key, low, high, rows, split_rows, parallelism), last, rows)


def _pieces(
    key: str, low: int, high: int, rows: int, split_rows: int, parallelism: int | None
) -> tuple[str, ...]:
    """Keys ``low`` to ``high`` (about ``rows`` rows) cut into the conditions of pieces."""
    return tuple(
        f"{key} >= {start} AND {key} < {end}"
        for start, end in key_ranges(low, high, piece_count(rows, split_rows, parallelism))
    )


class ExportedSnapshot:
    """A snapshot of the database that readers on other connections import
    (``pg_export_snapshot``), held by a read-only REPEATABLE READ transaction until
    :meth:`close`: a chunk's pieces, read by Spark's executors whenever the batch is
    written, all see the database as it was when this was opened. The chunk is planned
    in it too, so it holds the table's ACCESS SHARE lock until the chunk is written: a
    DROP or ALTER of the table waits that long (a chunk's read, as DBLog's, and never the
    whole snapshot), then the next chunk finds the table changed. Like any open
    transaction it keeps VACUUM from removing rows it may see meanwhile.

    Made by :class:`SnapshotExporter`, on its connection."""

    def __init__(self, exporter: SnapshotExporter, conn: Any, snapshot_id: str) -> None:
        self._exporter = exporter
        self.conn = conn
        self.id = snapshot_id

    def first_row(self, sql: str) -> Any:
        """The first row of a query, as the snapshot sees the database."""
        with self.conn.cursor() as cursor:
            cursor.execute(sql)
            return cursor.fetchone()

    def close(self) -> None:
        """End the snapshot's transaction (its connection stays, for the next one)."""
        self._exporter.end(self.conn)


class SnapshotExporter:
    """Exports the snapshot of each chunk (:class:`ExportedSnapshot`) on one connection,
    kept from chunk to chunk: a new one for every chunk took 0.035-0.06 s of each, where
    a transaction's end and the next one's start take a few ms. A connection that no
    longer works (the server ended it) is replaced by a new one."""

    def __init__(self, database: Database) -> None:
        self.database = database
        self._conn: Any = None

    def export(self) -> ExportedSnapshot:
        for attempt in range(2):
            fresh = self._conn is None
            if fresh:
                self._conn = self.database.connect(autocommit=True)
            try:
                with self._conn.cursor() as cursor:
                    cursor.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
                    cursor.execute("SELECT pg_export_snapshot()")
                    snapshot_id = str(cursor.fetchone()[0])
                return ExportedSnapshot(self, self._conn, snapshot_id)
            except Exception as exc:
                self.close()
                if fresh or attempt:
                    raise DatabaseError(
                        f"cannot export a snapshot from {self.database.where()}: {first_line(exc)}"
                    ) from exc
        raise AssertionError("unreachable")

    def end(self, conn: Any) -> None:
        """End the transaction of a snapshot exported on ``conn``."""
        if conn is not self._conn:
            return
        try:
            with conn.cursor() as cursor:
                cursor.execute("ROLLBACK")
        except Exception:
            # a broken connection: the next export opens another
            self.close()

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()


def read_chunk(
    session: SparkSession, dsn: str, shape: TableShape, chunk: Chunk, snapshot: str | None
) -> DataFrame:
    """The chunk's rows as exported ``snapshot`` sees them, read on the executors when
    Spark runs the job that writes them."""
    from herder.connectors.jdbc.reading import jdbc_dataframe

    return jdbc_dataframe(
        session, dsn, _chunk_query(shape), _read_schema(shape), chunk.pieces, snapshot
    )


def _chunk_query(shape: TableShape) -> str:
    columns = ", ".join(quote(c.name) for c in shape.columns)
    return f"SELECT {columns} FROM {shape.table.sql}"


def _read_schema(shape: TableShape) -> StructType:
    """The rows' Spark schema as read: every column optional."""
    from pyspark.sql.types import StructField, StructType

    return StructType([StructField(f.name, f.dataType, True) for f in shape.row_type.fields])


def snapshot_pieces(
    dsn: str,
    shape: TableShape,
    chunk: Chunk,
    snapshot: str | None,
    touched: Sequence[dict[str, Any]],
) -> ArrowPieces | None:
    """The chunk's ``r`` events as Arrow pieces (a SourceBatch's ``pieces``): what
    :func:`snapshot_events` gives, each piece's rows as its executor reads them, with a
    key and a value of ``after`` alone (the rest of the envelope is the batch's
    ``constants``). None if rows must be left out by a key of several columns (the
    DataFrame joins those away)."""
    from herder.connect import ArrowPieces
    from herder.connectors.jdbc.reading import jdbc_pieces

    names = [c.name for c in shape.columns]
    key_columns = [names.index(k) for k in shape.key]
    left_out: list[int] = []
    if touched:
        if not splittable(shape):
            return None
        left_out = sorted({int(k[shape.key[0]]) for k in touched})
    rows = jdbc_pieces(dsn, _chunk_query(shape), _read_schema(shape), chunk.pieces, snapshot)

    def read(index: int) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa
        import pyarrow.compute as pc

        for batch in rows.read(index):
            if left_out:
                key = batch.column(key_columns[0])
                batch = batch.filter(pc.invert(pc.is_in(key, pa.array(left_out, key.type))))
            key = pa.StructArray.from_arrays(
                [batch.column(i) for i in key_columns],
                fields=[batch.schema.field(i) for i in key_columns],
            )
            after = pa.StructArray.from_arrays(batch.columns, fields=list(batch.schema))
            value = pa.StructArray.from_arrays([after], fields=[pa.field("after", after.type)])
            yield pa.RecordBatch.from_arrays([key, value], names=["key", "value"])

    return ArrowPieces(rows.count, read)


def snapshot_events(
    session: SparkSession,
    rows: DataFrame,
    shape: TableShape,
    touched: Sequence[dict[str, Any]],
    source: dict[str, Any],
    ts_ms: int,
) -> DataFrame:
    """The chunk's rows, but those whose keys are in ``touched``, as ``r`` events
    (typed records: key and value, all of ``shape``'s topic): the value is the envelope
    with the row as ``after``, and the same ``source``, ``op`` and ``ts_ms`` for the
    whole chunk, built by the executors as they read."""
    import pyarrow as pa
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import to_arrow_schema

    from herder.dataplane.typed import sql_name, struct_sql, type_json

    key_type = shape.key_type
    if touched and splittable(shape):
        # one integer column: a set the executors test each row against, no join
        name = shape.key[0]
        rows = rows.where(~F.col(f"`{name}`").isin(sorted({int(k[name]) for k in touched})))
    elif touched and key_type is not None:
        keys = session.createDataFrame(
            pa.Table.from_pylist(list(touched), schema=to_arrow_schema(key_type, timezone="UTC"))
        )
        rows = rows.join(keys, on=list(shape.key), how="left_anti")
    # one SQL expression, analysed once: built of Column objects, the envelope costs a
    # call into the JVM per literal and field (0.06-0.13 s a chunk, against 0.01 s)
    after = ", ".join(sql_name(f.name) for f in shape.row_type.fields)
    value = struct_sql(
        type_json(shape.value_type.jsonValue()),
        snapshot_constants(source, ts_ms),
        {"after": f"struct({after})"},
    )
    key = "CAST(NULL AS BINARY) AS key"
    if key_type is not None:
        key = f"struct({', '.join(sql_name(k) for k in shape.key)}) AS key"
    return rows.selectExpr(key, f"{value} AS value")


def snapshot_constants(source: dict[str, Any], ts_ms: int) -> dict[str, Any]:
    """What every ``r`` event of a chunk holds alike: all of its envelope but ``after``
    (a SourceBatch's ``constants``, kept once per segment)."""
    return {"before": None, "source": source, "op": "r", "ts_ms": ts_ms}
