"""Typed records: every Spark type with a Connect schema goes into JsonConverter's
envelope and comes back out equal, schemas are found and merged, and values that are
not envelopes are refused by the sinks that need types."""

from __future__ import annotations

import json

import pytest

from herder.dataplane import SparkRuntime
from herder.dataplane.schemas import (
    DECIMAL,
    MICRO_TIMESTAMP,
    connect_schema,
    distinct_schemas,
    encode_column,
    encode_rows,
    merged_struct,
    spark_type,
    with_decoded,
)
from herder.errors import ConfigError

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]

ROWS = """
SELECT 1L AS id, CAST(12.34 AS DECIMAL(12,2)) AS amount, DATE'2024-02-29' AS day,
  TIMESTAMP_NTZ'2024-01-01 10:11:12.123456' AS local,
  TIMESTAMP'2024-01-01 10:11:12.654321Z' AS instant,
  CAST('ab' AS BINARY) AS raw, array(1, 2) AS ints, map('a', DATE'2020-01-01') AS days,
  named_struct('x', 1, 'y', TIMESTAMP_NTZ'2020-01-01 00:00:00.000001') AS nested,
  CAST(NULL AS STRING) AS missing, true AS flag, CAST(7 AS TINYINT) AS tiny, 2.5f AS ratio
UNION ALL
SELECT 2L, CAST(-0.01 AS DECIMAL(12,2)), DATE'1969-12-31',
  TIMESTAMP_NTZ'1969-12-31 23:59:59.999999',
  TIMESTAMP'1970-01-01 00:00:00Z', CAST('' AS BINARY), array(), map(), NULL, 'x', false,
  CAST(-128 AS TINYINT), -1.0f
"""


def test_every_type_goes_through_the_envelope_unchanged(spark: SparkRuntime) -> None:
    from pyspark.sql import functions as F

    rows = spark.session.sql(ROWS)
    values = rows.select(encode_rows(rows, "orders").alias("value"))
    envelope = json.loads(values.first()["value"])
    assert envelope["schema"]["name"] == "orders"
    fields = {f["field"]: f for f in envelope["schema"]["fields"]}
    assert fields["amount"]["name"] == DECIMAL
    assert fields["amount"]["parameters"] == {"scale": "2", "connect.decimal.precision": "12"}
    assert fields["local"]["name"] == MICRO_TIMESTAMP
    assert envelope["payload"]["local"] == 1704103872123456
    assert envelope["payload"]["amount"] == 12.34
    assert envelope["payload"]["missing"] is None
    (schema,) = distinct_schemas(values)
    back = with_decoded(values, {"row": ("value", schema)}).select("row.*")
    assert back.schema.simpleString() == rows.schema.simpleString()
    assert sorted(back.collect()) == sorted(rows.collect())
    # a primitive value, and a null one
    ids = rows.select(encode_column(F.col("id"), rows.schema["id"].dataType).alias("k"))
    (key_schema,) = distinct_schemas(ids, "k")
    assert key_schema == {"type": "int64", "optional": False}
    decoded = with_decoded(ids, {"id": ("k", key_schema)}).select("id")
    assert sorted(r["id"] for r in decoded.collect()) == [1, 2]


def test_schemas_of_a_batch_come_oldest_first_and_merge_into_one(spark: SparkRuntime) -> None:
    older = spark.session.sql("SELECT 0L AS offset, 1 AS id, 'a' AS name")
    newer = spark.session.sql("SELECT 1L AS offset, 2 AS id, 'b' AS name, 3.5D AS score")
    values = older.select("offset", encode_rows(older.drop("offset")).alias("value")).unionByName(
        newer.select("offset", encode_rows(newer.drop("offset")).alias("value"))
    )
    schemas = distinct_schemas(values)
    assert [[f["field"] for f in s["fields"]] for s in schemas] == [
        ["id", "name"],
        ["id", "name", "score"],
    ]
    merged = merged_struct(schemas)
    assert [(f["field"], f["optional"]) for f in merged["fields"]] == [
        ("id", False),
        ("name", False),
        ("score", True),
    ]
    rows = with_decoded(values, {"r": ("value", merged)}).select("offset", "r.*").collect()
    assert sorted((r["id"], r["name"], r["score"]) for r in rows) == [(1, "a", None), (2, "b", 3.5)]


def test_values_without_a_schema_are_refused(spark: SparkRuntime) -> None:
    plain = spark.session.sql("""SELECT CAST('{"id": 1}' AS BINARY) AS value""")
    with pytest.raises(ConfigError, match="without a schema"):
        distinct_schemas(plain)


@pytest.mark.unit
def test_connect_schemas_map_back_to_the_same_spark_types() -> None:
    from pyspark.sql import types as T

    struct = T.StructType(
        [
            T.StructField("d", T.DecimalType(38, 10), False),
            T.StructField("when", T.TimestampType(), True),
            T.StructField("tags", T.ArrayType(T.StringType(), False), True),
            T.StructField("props", T.MapType(T.StringType(), T.LongType(), True), True),
        ]
    )
    assert spark_type(connect_schema(struct)) == struct
    assert spark_type({"type": "int64", "name": "org.apache.kafka.connect.data.Timestamp"}) == (
        T.TimestampType()
    )
