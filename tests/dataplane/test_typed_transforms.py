"""Transforms on typed keys and values: Connect's transforms with a schema, on structs.

Records are built as a sink reads a topic of typed values (a struct of a table's
columns, a typed key); a chain is applied and its output read back with its Spark type:
fields inserted, dropped, renamed, masked, cast, extracted, converted, with Connect's
messages for what cannot be done. JsonConverter envelopes read with
``schemas.enable=true`` become typed values for the chain.
"""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal
from typing import Any

import pytest

from herder.dataplane import SparkRuntime
from herder.dataplane.transforms import TransformChain
from herder.errors import NotSupported

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]

T_ = "org.apache.kafka.connect.transforms."
VALUE_DDL = "id bigint, amount decimal(12,2), note string, placed date, at timestamp, ssn string"


def typed_records(spark: SparkRuntime, count: int = 3) -> Any:
    """A sink's DataFrame whose keys (bigint) and values (structs) are typed; the last
    record a tombstone."""
    from pyspark.sql import functions as F

    rows = [
        (
            i,
            (
                i,
                Decimal(i) + Decimal("0.50"),
                f"note {i}",
                dt.date(2024, 1, 1) + dt.timedelta(days=i),
                dt.datetime(2024, 3, 5, 10, 11, 12, tzinfo=dt.UTC),
                f"ssn-{i}",
            )
            if i < count - 1
            else None,
        )
        for i in range(count)
    ]
    df = spark.session.createDataFrame(rows, f"k bigint, v struct<{_struct(VALUE_DDL)}>")
    return df.select(
        F.lit("orders").alias("topic"),
        F.lit(0).alias("partition"),
        F.monotonically_increasing_id().alias("offset"),
        F.timestamp_millis(F.lit(1_709_633_472_000)).alias("timestamp"),
        F.col("k").alias("key"),
        F.col("v").alias("value"),
        F.array().cast("array<struct<key:string,value:binary>>").alias("headers"),
    )


def _struct(ddl: str) -> str:
    return ",".join(f.replace(" ", ":", 1) for f in ddl.split(", "))


def applied(df: Any, config: dict[str, str]) -> tuple[Any, list[dict[str, Any]]]:
    """The chain's output: its value type, and (key, value, error) per record."""
    from pyspark.sql import functions as F

    chain = TransformChain.from_settings(config)
    out = chain.apply(df, sink=True).select(
        "offset",
        chain.output("key").alias("key"),
        chain.output("value").alias("value"),
        F.col("_error.message").alias("error"),
    )
    rows = [r.asDict(recursive=True) for r in out.orderBy("offset").collect()]
    return out.schema, rows


def test_replace_insert_mask_and_cast_change_fields_and_their_types(
    spark: SparkRuntime,
) -> None:
    from pyspark.sql import types as T

    schema, rows = applied(
        typed_records(spark),
        {
            "transforms": "drop,insert,mask,cast,stamp",
            "transforms.drop.type": T_ + "ReplaceField$Value",
            "transforms.drop.exclude": "ssn",
            "transforms.drop.renames": "note:comment",
            "transforms.insert.type": T_ + "InsertField$Value",
            "transforms.insert.topic.field": "from_topic",
            "transforms.insert.offset.field": "from_offset",
            "transforms.insert.static.field": "origin",
            "transforms.insert.static.value": "db1",
            "transforms.mask.type": T_ + "MaskField$Value",
            "transforms.mask.fields": "amount,comment",
            "transforms.cast.type": T_ + "Cast$Value",
            "transforms.cast.spec": "id:string,nosuch:int32",
            "transforms.stamp.type": T_ + "TimestampConverter$Value",
            "transforms.stamp.field": "at",
            "transforms.stamp.target.type": "unix",
        },
    )
    value_type = schema["value"].dataType
    assert isinstance(value_type, T.StructType)
    assert [(f.name, f.dataType.simpleString()) for f in value_type.fields] == [
        ("id", "string"),
        ("amount", "decimal(12,2)"),
        ("comment", "string"),
        ("placed", "date"),
        ("at", "bigint"),
        ("from_topic", "string"),
        ("from_offset", "bigint"),
        ("origin", "string"),
    ]
    first = rows[0]["value"]
    assert first == {
        "id": "0",
        "amount": Decimal("0.00"),
        "comment": "",
        "placed": dt.date(2024, 1, 1),
        "at": 1_709_633_472_000,
        "from_topic": "orders",
        "from_offset": rows[0]["offset"],
        "origin": "db1",
    }
    assert rows[2]["value"] is None  # a tombstone stays one
    assert all(r["error"] is None for r in rows)


def test_value_to_key_and_extract_field_make_new_typed_parts(spark: SparkRuntime) -> None:
    from pyspark.sql import types as T

    schema, rows = applied(
        typed_records(spark),
        {
            "transforms": "key,extract",
            "transforms.key.type": T_ + "ValueToKey",
            "transforms.key.fields": "id,placed",
            "transforms.extract.type": T_ + "ExtractField$Value",
            "transforms.extract.field": "amount",
        },
    )
    assert schema["key"].dataType == T.StructType(
        [T.StructField("id", T.LongType(), True), T.StructField("placed", T.DateType(), True)]
    )
    assert schema["value"].dataType == T.DecimalType(12, 2)
    assert rows[1]["key"] == {"id": 1, "placed": dt.date(2024, 1, 2)}
    assert rows[1]["value"] == Decimal("1.50")


def test_what_a_schema_lacks_fails_the_records_with_connects_messages(
    spark: SparkRuntime,
) -> None:
    _, rows = applied(
        typed_records(spark),
        {
            "transforms": "extract",
            "transforms.extract.type": T_ + "ExtractField$Value",
            "transforms.extract.field": "nosuch",
            "errors.tolerance": "all",
        },
    )
    assert rows[0]["error"] == "extract: Unknown field: nosuch"
    assert rows[2]["error"] is None  # the tombstone has no field to lack
    _, rows = applied(
        typed_records(spark),
        {
            "transforms": "mask",
            "transforms.mask.type": T_ + "MaskField$Value",
            "transforms.mask.fields": "placed",
            "transforms.mask.replacement": "x",
        },
    )
    assert rows[0]["error"] == "mask: Cannot mask value of type date with custom replacement"
    _, rows = applied(
        typed_records(spark),
        {"transforms": "insert", "transforms.insert.type": T_ + "InsertField$Key",
         "transforms.insert.topic.field": "t"},
    )  # fmt: skip
    assert rows[0]["error"] == (
        "insert: Only Struct objects supported for [field insertion], found: bigint"
    )


def test_a_type_changing_transform_cannot_apply_to_some_records_only(
    spark: SparkRuntime,
) -> None:
    config = {
        "transforms": "drop",
        "transforms.drop.type": T_ + "ReplaceField$Value",
        "transforms.drop.exclude": "ssn",
        "transforms.drop.predicate": "orders",
        "predicates": "orders",
        "predicates.orders.type": "TopicNameMatches",
        "predicates.orders.pattern": "orders",
    }
    with pytest.raises(NotSupported, match=r"drop transforms\.drop\.predicate"):
        applied(typed_records(spark), config)


def test_envelopes_read_with_schemas_enabled_become_typed_values(spark: SparkRuntime) -> None:
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    from herder.dataplane.schemas import encode_column

    typed = typed_records(spark)
    value_type = typed.schema["value"].dataType
    enveloped = typed.withColumn("value", encode_column(F.col("value"), value_type))
    not_one = spark.session.createDataFrame(
        [("orders", 0, 99, b'{"id": 5}')], "topic string, partition int, offset long, value binary"
    ).select(
        "topic",
        "partition",
        "offset",
        F.timestamp_millis(F.lit(0)).alias("timestamp"),
        F.lit(7).cast("bigint").alias("key"),
        "value",
        F.array().cast("array<struct<key:string,value:binary>>").alias("headers"),
    )
    schema, rows = applied(
        enveloped.unionByName(not_one),
        {
            "value.converter.schemas.enable": "true",
            "transforms": "keep",
            "transforms.keep.type": T_ + "ReplaceField$Value",
            "transforms.keep.include": "id,amount",
            "errors.tolerance": "all",
        },
    )
    assert schema["value"].dataType == T.StructType(
        [
            T.StructField("id", T.LongType(), True),
            T.StructField("amount", T.DecimalType(12, 2), True),
        ]
    )
    assert rows[0]["value"] == {"id": 0, "amount": Decimal("0.50")}
    assert rows[-1]["offset"] == 99
    assert rows[-1]["error"] is not None and 'requires "schema" and "payload"' in rows[-1]["error"]
    assert json.loads(json.dumps(rows[1]["value"], default=str)) == {"id": 1, "amount": "1.50"}
