"""Debezium's change events, as typed records: their schemas and the DataFrames of a batch.

A change event's key is the row's primary key (a struct, ``<topic>.Key``); its value is
Debezium's envelope (``<topic>.Envelope``): ``before`` and ``after`` (the row, or null),
``source`` (where the change comes from: connector, server name, database, schema,
table, transaction id, LSN, commit time, whether it is a snapshot read), ``op`` (``c``
create, ``u`` update, ``d`` delete, ``r`` snapshot read, ``t`` truncate) and ``ts_ms``
(when the connector handled it). A delete is followed by a tombstone (same key, null
value) so a compacted topic forgets the row.

Both are Spark structs, stored in topics as typed records (:mod:`herder.dataplane.typed`),
so a sink sees their Connect schemas as it does JdbcSource's rows, and a sink that takes
bytes gets them as its converter serialises them (JsonConverter's envelope of schema
and payload with ``schemas.enable=true``, as Debezium's events with that converter).
A topic's records have one type per batch: the events of each table shape are a batch
of their own (see :mod:`.source`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

from herder.connectors.jdbc.postgres import Column, TableId, spark_type_of

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

CONNECTOR = "postgresql"
VERSION = "1.0"
HEARTBEAT_PREFIX = "__debezium-heartbeat."


@dataclass(frozen=True)
class TableShape:
    """A table's columns at some point of its history, as change events carry them.
    (Its Spark types are worked out once: every change of the table asks for them.)"""

    table: TableId
    topic: str
    columns: tuple[Column, ...]
    key: tuple[str, ...]

    @cached_property
    def row_type(self) -> StructType:
        """``before`` / ``after``: every column, optional but for the key's."""
        from pyspark.sql.types import StructField, StructType

        where = f"table {self.table}"
        return StructType(
            [
                StructField(c.name, spark_type_of(c, where), c.name not in self.key)
                for c in self.columns
            ]
        )

    @cached_property
    def names(self) -> list[str]:
        return [c.name for c in self.columns]

    @cached_property
    def readers(self) -> list[Callable[[object], object]]:
        """What reads each column's text output, in column order."""
        from herder.connectors.cdc.changes import reader_of

        return [reader_of(f.dataType) for f in self.row_type.fields]

    @cached_property
    def key_type(self) -> StructType | None:
        from pyspark.sql.types import StructType

        if not self.key:
            return None
        fields = {f.name: f for f in self.row_type.fields}
        return StructType([fields[k] for k in self.key])

    @cached_property
    def value_type(self) -> StructType:
        from pyspark.sql.types import LongType, StringType, StructField, StructType

        row = self.row_type
        return StructType(
            [
                StructField("before", row, True),
                StructField("after", row, True),
                StructField("source", source_type(), False),
                StructField("op", StringType(), False),
                StructField("ts_ms", LongType(), True),
            ]
        )


def source_type() -> StructType:
    """The ``source`` block of Debezium's PostgreSQL connector."""
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    return StructType(
        [
            StructField("version", StringType(), False),
            StructField("connector", StringType(), False),
            StructField("name", StringType(), False),
            StructField("ts_ms", LongType(), False),
            StructField("snapshot", StringType(), True),
            StructField("db", StringType(), False),
            StructField("schema", StringType(), False),
            StructField("table", StringType(), False),
            StructField("txId", LongType(), True),
            StructField("lsn", LongType(), True),
        ]
    )


def source_block(
    shape: TableShape, server: str, db: str, ts_ms: int, snapshot: str, tx_id: int | None,
    lsn: int | None,
) -> dict[str, Any]:  # fmt: skip
    return {
        "version": VERSION,
        "connector": CONNECTOR,
        "name": server,
        "ts_ms": ts_ms,
        "snapshot": snapshot,
        "db": db,
        "schema": shape.table.schema,
        "table": shape.table.name,
        "txId": tx_id,
        "lsn": lsn,
    }


@dataclass
class Run:
    """Consecutive change events of one table in one shape: a batch of their own, of one
    topic whose keys and values have one type each."""

    shape: TableShape
    rows: list[dict[str, Any]] = field(default_factory=list)

    def dataframe(self, session: SparkSession) -> DataFrame:
        """The events as typed records (``key``, ``value``), in order."""
        import pyarrow as pa
        from pyspark.sql import functions as F
        from pyspark.sql.pandas.types import to_arrow_schema
        from pyspark.sql.types import StructField, StructType

        shape = self.shape
        key_type = shape.key_type
        fields = [StructField("value", shape.value_type, True)]
        if key_type is not None:
            fields.insert(0, StructField("key", key_type, True))
        rows = self.rows if key_type is not None else [{"value": r["value"]} for r in self.rows]
        spark_type = StructType(fields)
        table = pa.Table.from_pylist(rows, schema=to_arrow_schema(spark_type, timezone="UTC"))
        # with the Spark type given: Arrow's zone-less timestamps would read as Spark's
        # ``timestamp`` rather than ``timestamp_ntz``
        df = session.createDataFrame(table, schema=spark_type)
        if key_type is None:
            df = df.select(F.lit(None).cast("binary").alias("key"), "value")
        return df


class EventBatch:
    """Change events in the order they happened, grouped into runs of one table shape
    (the events of a table keep their order: a table's runs follow each other)."""

    def __init__(self) -> None:
        self.runs: list[Run] = []
        self._current: dict[TableId, Run] = {}
        self.count = 0

    def add(
        self, shape: TableShape, key: dict[str, Any] | None, value: dict[str, Any] | None
    ) -> None:
        run = self._current.get(shape.table)
        if run is None or run.shape != shape:
            run = Run(shape)
            self.runs.append(run)
            self._current[shape.table] = run
        run.rows.append({"key": key, "value": value})
        self.count += 1


def heartbeat(session: SparkSession, server: str, ts_ms: int) -> DataFrame:
    """Debezium's heartbeat record: key ``{serverName}``, value ``{ts_ms}``."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    from herder.dataplane.schemas import encode_column

    key_type = StructType([StructField("serverName", StringType(), False)])
    value_type = StructType([StructField("ts_ms", LongType(), False)])
    df = session.range(1).select(
        F.struct(F.lit(server).alias("serverName")).alias("k"),
        F.struct(F.lit(ts_ms).alias("ts_ms")).alias("v"),
    )
    return df.select(
        F.lit(HEARTBEAT_PREFIX + server).alias("topic"),
        encode_column(F.col("k"), key_type, "io.debezium.connector.common.ServerNameKey").alias(
            "key"
        ),
        encode_column(F.col("v"), value_type, "io.debezium.connector.common.Heartbeat").alias(
            "value"
        ),
    )
