"""ExtractNewRecordState on real change events: PostgresCdcSource's batch from a real
PostgreSQL, put through a sink's transform chain; each delete handling mode, tombstones
dropped or kept, envelope fields added, and the typed row readable by a sink."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from herder.connect import SourceBatch
from herder.dataplane import SparkRuntime
from herder.dataplane.transforms import TransformChain
from tests.connectors.cdc import cdc_config, cdc_task, dbname, with_topic
from tests.connectors.jdbc import Offsets
from tests.fixtures.postgres import PostgresServer

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.timeout(300)]

UNWRAP = "herder.connectors.cdc.unwrap.ExtractNewRecordState"


@pytest.fixture
def batch(spark: SparkRuntime, logical_postgres: PostgresServer, logical_database: str) -> Any:
    """One batch of a create, an update and a delete of table ``items``."""
    import time

    db = dbname(logical_database)
    logical_postgres.execute(
        "CREATE TABLE items (id integer PRIMARY KEY, name text, price numeric(8,2));"
        " ALTER TABLE items REPLICA IDENTITY FULL",
        db,
    )
    offsets = Offsets()
    task = cdc_task(
        cdc_config(logical_postgres, logical_database, snapshot_mode="no_data"), offsets
    )
    try:
        logical_postgres.execute(
            "BEGIN; INSERT INTO items VALUES (1, 'pen', 1.50), (2, 'ink', 3.00);"
            "UPDATE items SET price = 1.75 WHERE id = 1; DELETE FROM items WHERE id = 2; COMMIT",
            db,
        )
        deadline = time.monotonic() + 60
        found: SourceBatch | None = None
        while found is None:
            assert time.monotonic() < deadline, "no batch"
            found = task.poll()
        return found
    finally:
        task.stop()


def unwrap_config(**options: str) -> dict[str, str]:
    return {
        "transforms": "unwrap",
        "transforms.unwrap.type": UNWRAP,
        **{f"transforms.unwrap.{k.replace('_', '.')}": v for k, v in options.items()},
    }


def sink_records(batch: SourceBatch) -> Any:
    """The batch's records as a sink task is given them."""
    from pyspark.sql import functions as F

    from herder.dataplane.records import HEADERS_DDL

    return with_topic(batch).select(
        "topic",
        F.lit(0).alias("partition"),
        F.monotonically_increasing_id().alias("offset"),
        F.current_timestamp().alias("timestamp"),
        "key",
        "value",
        F.lit(None).cast(HEADERS_DDL).alias("headers"),
    )


def unwrapped(batch: SourceBatch, **options: str) -> list[tuple[Any, Any]]:
    """(key, row) of each record the chain keeps, in order; the row as its typed value
    has it, or decoded from its envelope (None for a tombstone)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    from herder.dataplane.schemas import distinct_schemas, merged_struct, with_decoded

    chain = TransformChain.from_settings(unwrap_config(**options))
    out = chain.apply(sink_records(batch), sink=True)
    assert out.where(F.col("_error").isNotNull()).count() == 0
    rows = out.select("offset", "key", chain.output("value").alias("value"))
    decoded = {}
    schemas: list[dict] | bool = True
    if isinstance(rows.schema["key"].dataType, StructType):
        rows = rows.withColumn("k", F.col("key"))
    else:
        decoded["k"] = ("key", merged_struct(distinct_schemas(rows, "key")))
    if isinstance(rows.schema["value"].dataType, StructType):
        rows = rows.withColumn("v", F.col("value"))
    else:
        schemas = distinct_schemas(rows, "value")
        if schemas:
            assert len(schemas) == 1
            decoded["v"] = ("value", schemas[0])
    typed = with_decoded(rows, decoded).orderBy("offset")
    return [
        (r["k"].asDict(), r["v"].asDict() if r["v"] is not None else None)
        for r in typed.select("k", "v" if schemas else F.lit(None).alias("v")).collect()
    ]


def test_none_turns_deletes_into_tombstones_and_keeps_tombstones(batch: SourceBatch) -> None:
    assert unwrapped(batch, delete_handling_mode="none", drop_tombstones="false") == [
        ({"id": 1}, {"id": 1, "name": "pen", "price": Decimal("1.50")}),
        ({"id": 2}, {"id": 2, "name": "ink", "price": Decimal("3.00")}),
        ({"id": 1}, {"id": 1, "name": "pen", "price": Decimal("1.75")}),
        ({"id": 2}, None),
        ({"id": 2}, None),
    ]


def test_drop_removes_deletes_and_tombstones(batch: SourceBatch) -> None:
    assert [k["id"] for k, _ in unwrapped(batch)] == [1, 2, 1]


def test_rewrite_marks_deletes_and_add_fields_copies_the_envelope(batch: SourceBatch) -> None:
    rows = unwrapped(batch, delete_handling_mode="rewrite", add_fields="op,table,lsn,source.ts_ms")
    assert [(r["id"], r["__op"], r["__deleted"], r["__table"]) for _, r in rows] == [
        (1, "c", "false", "items"),
        (2, "c", "false", "items"),
        (1, "u", "false", "items"),
        (2, "d", "true", "items"),
    ]
    assert all(r["__lsn"] > 0 and r["__source_ts_ms"] > 0 for _, r in rows)
    assert rows[3][1]["name"] == "ink"  # the row as it was before its delete


def test_with_schemas_enabled_the_row_comes_out_typed(batch: SourceBatch) -> None:
    """JsonConverter with ``schemas.enable=true`` gives the envelopes as typed values:
    the row comes out typed, with its columns' types and the added fields', so a sink
    (DirectorySink's Parquet, JdbcSink) writes those types."""
    config = unwrap_config(delete_handling_mode="rewrite", add_fields="op,lsn")
    config["value.converter.schemas.enable"] = "true"
    chain = TransformChain.from_settings(config)
    out = chain.apply(sink_records(batch), sink=True)
    rows = out.select("offset", chain.output("value").alias("value")).orderBy("offset")
    assert rows.schema["value"].dataType.simpleString() == (
        "struct<id:int,name:string,price:decimal(8,2),__op:string,__lsn:bigint,__deleted:string>"
    )
    found = [r["value"].asDict() for r in rows.collect()]
    assert [(r["id"], r["name"], r["price"], r["__op"], r["__deleted"]) for r in found] == [
        (1, "pen", Decimal("1.50"), "c", "false"),
        (2, "ink", Decimal("3.00"), "c", "false"),
        (1, "pen", Decimal("1.75"), "u", "false"),
        (2, "ink", Decimal("3.00"), "d", "true"),
    ]
    assert all(r["__lsn"] > 0 for r in found)
