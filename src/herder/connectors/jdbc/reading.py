"""A query's rows read on Spark's executors, split by key ranges: a Python Data Source.

The driver plans (:mod:`.source`): the query of one batch and, for a large one, the
ranges of a numeric key column that cut it into pieces of about
``parallel.split.rows`` rows. :class:`JdbcRangesDataSource` then reads each piece on an
executor, through a connection of its own, as Arrow batches (ADBC's binary COPY), one
Spark partition per piece, in key order. Nothing passes through the driver's Python.
"""

from __future__ import annotations

import json
import threading
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

#: The name Spark knows the data source by.
JDBC_FORMAT = "herder-jdbc"


@dataclass(frozen=True)
class Piece(InputPartition):
    """One Spark partition's share of the query: rows matching ``condition`` (SQL)."""

    condition: str


class JdbcRangesDataSource(DataSource):
    """``spark.read.format("herder-jdbc").schema(s).option("dsn", …).option("query", …)
    .option("pieces", json)``: the query's rows, each piece's (``WHERE`` condition, SQL)
    read by one Spark task."""

    @classmethod
    def name(cls) -> str:
        return JDBC_FORMAT

    def schema(self) -> str:
        raise ValueError("herder-jdbc needs a schema")

    def reader(self, schema: StructType) -> DataSourceReader:
        pieces = [Piece(c) for c in json.loads(self.options["pieces"])]
        return _Reader(self.options["dsn"], self.options["query"], pieces, schema)


class _Reader(DataSourceReader):
    def __init__(self, dsn: str, query: str, pieces: list[Piece], schema: StructType) -> None:
        self.dsn = dsn
        self.query = query
        self.pieces = pieces
        self.spark_schema = schema

    def partitions(self) -> Sequence[InputPartition]:
        return self.pieces

    def read(self, partition: InputPartition) -> Iterator[Any]:
        import adbc_driver_postgresql.dbapi as dbapi
        import pyarrow as pa
        from pyspark.sql.pandas.types import to_arrow_schema

        from herder.connectors.jdbc.postgres import conform

        assert isinstance(partition, Piece)
        target = to_arrow_schema(self.spark_schema, timezone="UTC")
        sql = f"SELECT * FROM ({self.query}) AS q WHERE {partition.condition}"
        with dbapi.connect(self.dsn) as conn, conn.cursor() as cursor:
            cursor.execute("SET TIME ZONE 'UTC'")
            cursor.execute(sql)
            reader: pa.RecordBatchReader = cursor.fetch_record_batch()
            for batch in reader:
                if batch.num_rows:
                    yield conform(batch, target)


_registered: weakref.WeakSet[SparkSession] = weakref.WeakSet()
_registering = threading.Lock()


def jdbc_dataframe(
    session: SparkSession, dsn: str, query: str, schema: StructType, pieces: Sequence[str]
) -> DataFrame:
    """The rows of ``query`` (SQL) with ``schema``, one Spark partition per condition of
    ``pieces``, in their order."""
    with _registering:
        if session not in _registered:
            session.dataSource.register(JdbcRangesDataSource)
            _registered.add(session)
    return (
        session.read.format(JDBC_FORMAT)
        .schema(schema)
        .option("dsn", dsn)
        .option("query", query)
        .option("pieces", json.dumps(list(pieces)))
        .load()
    )
