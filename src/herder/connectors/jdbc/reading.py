"""A query's rows read on Spark's executors, split by key ranges.

The driver plans (:mod:`.source`): the query of one batch and, for a large one, the
ranges of a numeric key column that cut it into pieces of at most about
``parallel.split.rows`` rows, as many as keep every core busy (:func:`key_ranges`).
:func:`jdbc_dataframe` then has each piece read on an executor, in a transaction of its
own (on a connection each Python worker keeps for its next piece), as Arrow batches
(ADBC's binary COPY), one Spark partition per piece, in key order. Nothing passes
through the driver's Python.

The pieces are the partitions of a ``range`` of their numbers, mapped by
``mapInArrow`` to their rows, rather than a Python Data Source: a query of one costs the
driver three Python processes of its own (the source's lookup, creation and read
planning), each started cold the first time, and a round trip through each for every
batch after; ``mapInArrow`` runs only in the executors' Python workers.
"""

from __future__ import annotations

import atexit
import contextlib
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from herder.connect import ArrowPieces


def piece_count(rows: int, split_rows: int, parallelism: int | None) -> int:
    """How many pieces ``rows`` rows are read in: pieces of at most about ``split_rows``,
    and a multiple of ``parallelism`` of them, so that no core waits while another
    reads the rest. A batch of 250,000 rows in pieces of 250,000 would be one Spark
    task, read by one core while the other idles; on 2 cores it is two of 125,000."""
    count = max(1, -(-rows // max(1, split_rows)))
    if parallelism is not None and parallelism > 1:
        count = -(-count // parallelism) * parallelism
    return count


def key_ranges(low: int, high: int, count: int) -> list[tuple[int, int]]:
    """``[low, high]`` cut into at most ``count`` ranges ``[start, end)`` of equal width,
    in order."""
    step = max(1, -(-(high - low + 1) // max(1, count)))
    ranges = []
    start = low
    while start <= high:
        end = min(high + 1, start + step)
        ranges.append((start, end))
        start = end
    return ranges


#: Connections of this process (an executor's Python worker), by DSN, kept from one
#: piece to the next: a connection costs 0.03 s to open (the password's SCRAM
#: exchange), a quarter of reading a piece of 125,000 rows. One per database and user
#: a worker has read from; Spark ends a Python worker idle for a minute, and its
#: connections with it.
_KEPT: dict[str, Any] = {}
_closing_at_exit = False


def read_piece(
    dsn: str, sql: str, schema: StructType, snapshot: str | None = None
) -> Iterator[pa.RecordBatch]:
    """The rows of ``sql`` (on an executor), as Arrow batches of ``schema``'s types;
    with ``snapshot`` (an id from ``pg_export_snapshot()``), the rows as that snapshot
    sees them, whenever this runs. Read in a transaction of its own, on a connection
    this process keeps for the next piece once every row is read."""
    from pyspark.sql.pandas.types import to_arrow_schema

    from herder.connectors.jdbc.postgres import conform

    target = to_arrow_schema(schema, timezone="UTC")
    conn = _KEPT.pop(dsn, None)
    done = False
    try:
        if conn is not None:
            try:
                _begin(conn, snapshot)
            except Exception:
                # a kept connection the server has ended since: a new one
                with contextlib.suppress(Exception):
                    conn.close()
                conn = None
        if conn is None:
            import adbc_driver_postgresql.dbapi as dbapi

            conn = dbapi.connect(dsn)
            _begin(conn, snapshot)
        with conn.cursor() as cursor:
            cursor.execute(sql)
            for batch in cursor.fetch_record_batch():
                if batch.num_rows:
                    yield conform(batch, target)
        conn.rollback()
        done = True
    finally:
        if done:
            _keep(dsn, conn)
        elif conn is not None:
            # stopped midway (an error, or the reader went away): nothing to keep
            with contextlib.suppress(Exception):
                conn.close()


def _keep(dsn: str, conn: Any) -> None:
    global _closing_at_exit
    if not _closing_at_exit:
        # closed before the interpreter's teardown, whose collection of them would
        # print a driver's complaint on the way out
        atexit.register(_close_kept)
        _closing_at_exit = True
    other = _KEPT.pop(dsn, None)
    if other is not None and other is not conn:
        with contextlib.suppress(Exception):
            other.close()
    _KEPT[dsn] = conn


def _close_kept() -> None:
    while _KEPT:
        _, conn = _KEPT.popitem()
        with contextlib.suppress(Exception):
            conn.close()


def _begin(conn: Any, snapshot: str | None) -> None:
    """The first statements of a read's transaction (ADBC begins one on its own)."""
    from herder.connectors.jdbc.postgres import literal

    with conn.cursor() as cursor:
        if snapshot is not None:
            cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            cursor.execute(f"SET TRANSACTION SNAPSHOT {literal(snapshot)}")
        cursor.execute("SET TIME ZONE 'UTC'")


def jdbc_dataframe(
    session: SparkSession,
    dsn: str,
    query: str,
    schema: StructType,
    pieces: Sequence[str],
    snapshot: str | None = None,
) -> DataFrame:
    """The rows of ``query`` (SQL) with ``schema``, one Spark partition per condition of
    ``pieces``, in their order; with ``snapshot``, as that exported snapshot sees them
    (every piece the same database state, read whenever Spark runs the job)."""
    return jdbc_pieces(dsn, query, schema, pieces, snapshot).dataframe(session, schema)


def jdbc_pieces(
    dsn: str, query: str, schema: StructType, pieces: Sequence[str], snapshot: str | None = None
) -> ArrowPieces:
    """What :func:`jdbc_dataframe` reads, as Arrow pieces: the rows of ``query`` that
    meet each condition of ``pieces``, of ``schema``'s types."""
    from herder.connect import ArrowPieces

    statements = [f"SELECT * FROM ({query}) AS q WHERE {condition}" for condition in pieces]

    def read(index: int) -> Iterator[pa.RecordBatch]:
        return read_piece(dsn, statements[index], schema, snapshot)

    return ArrowPieces(len(statements), read)


def row_pieces(dsn: str, query: str, schema: StructType, pieces: Sequence[str]) -> ArrowPieces:
    """The rows :func:`jdbc_pieces` reads, each a typed value (a struct of its columns):
    the pieces of a batch of JdbcSource's records, and (:meth:`ArrowPieces.dataframe
    <herder.connect.ArrowPieces.dataframe>`) its DataFrame."""
    from herder.connect import ArrowPieces

    rows = jdbc_pieces(dsn, query, schema, pieces).read

    def read(index: int) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa

        for batch in rows(index):
            value = pa.StructArray.from_arrays(batch.columns, fields=list(batch.schema))
            yield pa.RecordBatch.from_arrays([value], names=["value"])

    return ArrowPieces(len(pieces), read)
