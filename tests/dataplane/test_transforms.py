"""Transforms and predicates on real DataFrames: each one, their configs, a chain.

Records are built as a sink reads them (topic, partition, offset, timestamp, key,
value, headers) in the shared local SparkSession; a chain is applied and its result
collected, keys and values decoded from JSON, with each record's failure if it failed.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pyarrow as pa
import pytest

import herder
from herder.config import ConfigDef, Importance, InvalidConfiguration, Type
from herder.connect import Outcome, Record, Transformation
from herder.connect.transforms import (
    installed_predicates,
    installed_transformations,
    transformation_class,
)
from herder.dataplane import SparkRuntime
from herder.dataplane.errors import RecordError
from herder.dataplane.records import HEADER_TYPE, HEADERS_DDL
from herder.dataplane.transforms import TransformChain, validate_transforms
from herder.dataplane.transforms.fields import InsertFieldValue
from herder.dataplane.transforms.pipeline import RecordPipeline

pytestmark = [pytest.mark.spark]

DAY_MS = 86_400_000
#: 2024-03-05T10:11:12Z
STAMP_MS = 1_709_633_472_000


def record(value: Any, **kw: Any) -> dict[str, Any]:
    """A record whose value (and key) is JSON-encoded unless given as bytes."""

    def encoded(v: Any) -> bytes | None:
        return v if v is None or isinstance(v, bytes) else json.dumps(v).encode()

    return {
        "topic": kw.get("topic", "orders"),
        "partition": kw.get("partition", 0),
        "timestamp": kw.get("timestamp", STAMP_MS),
        "key": encoded(kw.get("key")),
        "value": encoded(value),
        "headers": [(k, v.encode()) for k, v in kw.get("headers", {}).items()],
    }


def run(spark: SparkRuntime, config: dict[str, str], records: list[dict[str, Any]]) -> list[Any]:
    """The chain of ``config`` over ``records``: one dict per surviving record, in order."""
    from pyspark.sql import functions as F

    table = pa.table(
        {
            "topic": pa.array([r["topic"] for r in records], pa.string()),
            "partition": pa.array([r["partition"] for r in records], pa.int32()),
            "offset": pa.array(range(len(records)), pa.int64()),
            "timestamp": pa.array([r["timestamp"] for r in records], pa.int64()),
            "key": pa.array([r["key"] for r in records], pa.binary()),
            "value": pa.array([r["value"] for r in records], pa.binary()),
            "headers": pa.array([r["headers"] for r in records], HEADER_TYPE),
        }
    )
    df = spark.session.createDataFrame(table).withColumn(
        "timestamp", F.timestamp_millis(F.col("timestamp"))
    )
    chain = TransformChain.from_settings(config)
    out = chain.apply(df, sink=True)
    rows = (
        out.select(
            "offset",
            "topic",
            chain.output("key").alias("key"),
            chain.output("value").alias("value"),
            F.col("_error.stage").alias("stage"),
            F.col("_error.class").alias("class"),
            F.col("_error.message").alias("error"),
        )
        .orderBy("offset")
        .collect()
    )
    return [
        {
            "offset": r["offset"],
            "topic": r["topic"],
            "key": _decode(r["key"]),
            "value": _decode(r["value"]),
            "error": None if r["error"] is None else (r["stage"], r["class"], r["error"]),
        }
        for r in rows
    ]


def _decode(data: bytes | None) -> Any:
    if data is None:
        return None
    try:
        return json.loads(data)
    except ValueError:
        return bytes(data)


def values(results: list[dict[str, Any]]) -> list[Any]:
    return [r["value"] for r in results]


def chain(*steps: tuple[str, dict[str, str]], **extra: str) -> dict[str, str]:
    """A connector config with ``steps`` as (type, keys) under aliases t0, t1, …"""
    config = {"transforms": ",".join(f"t{i}" for i in range(len(steps)))}
    for i, (kind, keys) in enumerate(steps):
        config[f"transforms.t{i}.type"] = kind
        config.update({f"transforms.t{i}.{k}": v for k, v in keys.items()})
    config.update({k.replace("__", "."): v for k, v in extra.items()})
    return config


# -- each transform -----------------------------------------------------------------------


def test_insert_field(spark: SparkRuntime) -> None:
    config = chain(
        (
            "org.apache.kafka.connect.transforms.InsertField$Value",
            {
                "topic.field": "t",
                "partition.field": "p",
                "offset.field": "o!",
                "timestamp.field": "ts",
                "static.field": "s",
                "static.value": "x",
            },
        )
    )
    out = run(spark, config, [record({"a": 1}), record("text"), record(None)])
    assert out[0]["value"] == {"a": 1, "t": "orders", "p": 0, "o": 0, "ts": STAMP_MS, "s": "x"}
    assert out[1]["error"] == (
        "TRANSFORMATION",
        "org.apache.kafka.connect.transforms.InsertField$Value",
        "t0: Only Map objects supported in absence of schema for [field insertion], found: STRING",
    )
    assert out[1]["value"] == "text"  # a failed record is left as it was
    assert out[2]["value"] is None and out[2]["error"] is None  # tombstones pass


def test_replace_field(spark: SparkRuntime) -> None:
    rows = [record({"a": 1, "b": 2, "c": 3})]
    excluded = run(spark, chain(("ReplaceField$Value", {"exclude": "b", "renames": "a:x"})), rows)
    assert values(excluded) == [{"x": 1, "c": 3}]
    included = run(spark, chain(("ReplaceField$Value", {"include": "a,b"})), rows)
    assert values(included) == [{"a": 1, "b": 2}]
    keyed = run(
        spark, chain(("ReplaceField$Key", {"exclude": "k2"})), [record(1, key={"k1": 1, "k2": 2})]
    )
    assert keyed[0]["key"] == {"k1": 1} and keyed[0]["value"] == 1


def test_mask_field(spark: SparkRuntime) -> None:
    value = {"s": "secret", "n": 42, "f": 1.5, "b": True, "l": [1], "o": {"x": 1}, "keep": "k"}
    masked = run(spark, chain(("MaskField$Value", {"fields": "s,n,f,b,l,o"})), [record(value)])
    assert masked[0]["value"] == {
        "s": "",
        "n": 0,
        "f": 0,
        "b": False,
        "l": [],
        "o": {},
        "keep": "k",
    }
    replaced = run(
        spark,
        chain(("MaskField$Value", {"fields": "s,n", "replacement": "9"})),
        [record(value)],
    )
    assert replaced[0]["value"] == {**value, "s": "9", "n": 9}
    refused = run(
        spark, chain(("MaskField$Value", {"fields": "n", "replacement": "x"})), [record(value)]
    )
    assert refused[0]["error"] is not None and "replacement" in refused[0]["error"][2]


def test_cast(spark: SparkRuntime) -> None:
    rows = [record({"id": "12", "p": 3.75, "ok": "true"}), record({"id": "abc", "p": 1, "ok": "x"})]
    out = run(spark, chain(("Cast$Value", {"spec": "id:int32,p:int64,ok:boolean"})), rows)
    assert out[0]["value"] == {"id": 12, "p": 3, "ok": True} and out[0]["error"] is None
    stage, klass, message = out[1]["error"]
    assert (stage, klass) == ("TRANSFORMATION", "org.apache.kafka.connect.transforms.Cast$Value")
    assert message == "t0: Cannot cast field 'id' \"abc\" to int32"
    whole = run(spark, chain(("Cast$Key", {"spec": "string"})), [record(None, key=5)])
    assert whole[0]["key"] == "5"


def test_value_to_key(spark: SparkRuntime) -> None:
    out = run(spark, chain(("ValueToKey", {"fields": "id,missing"})), [record({"id": 7, "x": 1})])
    assert out[0]["key"] == {"id": 7, "missing": None}
    assert out[0]["value"] == {"id": 7, "x": 1}


def test_extract_field(spark: SparkRuntime) -> None:
    rows = [record({"a": {"b": 1}}, key={"k": "v"}), record({"z": 1}, key={"k": "w"})]
    out = run(spark, chain(("ExtractField$Value", {"field": "a"})), rows)
    assert values(out) == [{"b": 1}, None]
    keys = run(spark, chain(("ExtractField$Key", {"field": "k"})), rows)
    assert [r["key"] for r in keys] == ["v", "w"]


def test_hoist_field(spark: SparkRuntime) -> None:
    out = run(spark, chain(("HoistField$Value", {"field": "line"})), [record("hello"), record(3)])
    assert values(out) == [{"line": "hello"}, {"line": 3}]
    keys = run(spark, chain(("HoistField$Key", {"field": "id"})), [record(1, key=5)])
    assert keys[0]["key"] == {"id": 5}


def test_timestamp_converter(spark: SparkRuntime) -> None:
    rows = [record({"at": "2024-03-05 10:11:12", "n": STAMP_MS}), record({"at": "junk", "n": 0})]
    parsed = run(
        spark,
        chain(
            (
                "TimestampConverter$Value",
                {"field": "at", "target.type": "unix", "format": "yyyy-MM-dd HH:mm:ss"},
            )
        ),
        rows,
    )
    assert parsed[0]["value"]["at"] == STAMP_MS
    assert parsed[1]["error"] is not None and "junk" in parsed[1]["error"][2]
    formatted = run(
        spark,
        chain(
            (
                "TimestampConverter$Value",
                {"field": "n", "target.type": "string", "format": "yyyy-MM-dd'T'HH:mm"},
            ),
            ("TimestampConverter$Value", {"field": "at", "target.type": "Date",
                                          "format": "yyyy-MM-dd HH:mm:ss"}),
        ),
        rows[:1],
    )  # fmt: skip
    assert formatted[0]["value"] == {"n": "2024-03-05T10:11", "at": STAMP_MS - STAMP_MS % DAY_MS}
    seconds = run(
        spark,
        chain(
            ("TimestampConverter$Key", {"target.type": "Timestamp", "unix.precision": "seconds"})
        ),
        [record(None, key=1_709_633_472)],
    )
    assert seconds[0]["key"] == STAMP_MS


def test_regex_router(spark: SparkRuntime) -> None:
    config = chain(("RegexRouter", {"regex": "(.*)-raw", "replacement": "$1-clean"}))
    out = run(spark, config, [record(1, topic="orders-raw"), record(2, topic="other")])
    assert [r["topic"] for r in out] == ["orders-clean", "other"]


class Prefix(Transformation):
    """A transform of a connector author's: known by its dotted name, not installed."""

    @classmethod
    def config_def(cls) -> ConfigDef:
        return ConfigDef().define("prefix", Type.STRING, importance=Importance.HIGH)

    def configure(self, config: Mapping[str, Any]) -> None:
        self.prefix = config["prefix"]

    def apply(self, record: Record) -> Outcome:
        from pyspark.sql import functions as F

        return Outcome(updates={"topic": F.concat(F.lit(self.prefix), record.topic)})


def test_a_chain_routes_when_a_transform_changes_the_topic(spark: SparkRuntime) -> None:
    """Whatever transform it is: the source side then writes to each record's own topic."""
    config = chain((f"{__name__}.Prefix", {"prefix": "x."}))
    out = run(spark, config, [record(1, topic="orders"), record(2, topic="other")])
    assert [r["topic"] for r in out] == ["x.orders", "x.other"]
    columns = "topic string, partition int, timestamp timestamp, key binary, value binary"
    df = spark.session.createDataFrame([], f"{columns}, headers {HEADERS_DDL}")
    prefixed = TransformChain.from_settings(config)
    prefixed.apply(df, sink=False)
    assert prefixed.routes
    masked = TransformChain.from_settings(chain(("MaskField$Value", {"fields": "ssn"})))
    masked.apply(df, sink=False)
    assert not masked.routes


def test_timestamp_router(spark: SparkRuntime) -> None:
    config = chain(
        ("TimestampRouter", {"topic.format": "${topic}_${timestamp}", "timestamp.format": "yyyyMM"})
    )
    out = run(spark, config, [record(1)])
    assert out[0]["topic"] == "orders_202403"


def test_filter_with_each_predicate_and_negate(spark: SparkRuntime) -> None:
    rows = [
        record({"n": 0}, topic="keep-me"),
        record({"n": 1}, topic="drop-me"),
        record(None, topic="keep-me"),
        record({"n": 3}, topic="keep-me", headers={"skip": "yes"}),
    ]
    predicates = {
        "predicates": "drop,tomb,hdr",
        "predicates.drop.type": "org.apache.kafka.connect.transforms.predicates.TopicNameMatches",
        "predicates.drop.pattern": "drop-.*",
        "predicates.tomb.type": "RecordIsTombstone",
        "predicates.hdr.type": "HasHeaderKey",
        "predicates.hdr.name": "skip",
    }
    for predicate, negate, kept in [
        ("drop", "false", [0, 2, 3]),
        ("tomb", "false", [0, 1, 3]),
        ("hdr", "false", [0, 1, 2]),
        ("hdr", "true", [3]),
        ("drop", "true", [1]),
    ]:
        config = {
            **chain(("Filter", {"predicate": predicate, "negate": negate})),
            **predicates,
        }
        assert [r["offset"] for r in run(spark, config, rows)] == kept, (predicate, negate)


def test_a_chain_record_by_record(spark: SparkRuntime) -> None:
    """Route, cast, mask only where a header says so, drop tombstones, rename, insert."""
    config = {
        **chain(
            ("RegexRouter", {"regex": "raw\\.(.*)", "replacement": "$1"}),
            ("Cast$Value", {"spec": "qty:int32"}),
            ("MaskField$Value", {"fields": "card", "predicate": "pii"}),
            ("Filter", {"predicate": "tomb"}),
            ("ReplaceField$Value", {"renames": "qty:quantity", "exclude": "debug"}),
            ("InsertField$Value", {"topic.field": "topic", "offset.field": "at"}),
        ),
        "predicates": "pii,tomb",
        "predicates.pii.type": "HasHeaderKey",
        "predicates.pii.name": "pii",
        "predicates.tomb.type": "RecordIsTombstone",
    }
    rows = [
        record({"qty": "2", "card": "4111", "debug": 1}, topic="raw.orders", headers={"pii": "1"}),
        record({"qty": "3", "card": "5500"}, topic="raw.orders"),
        record(None, topic="raw.orders"),
        record({"qty": "many", "card": "6011"}, topic="raw.orders", headers={"pii": "1"}),
        record({"qty": 5, "card": "3400"}, topic="audit"),
    ]
    out = run(spark, config, rows)
    assert [(r["offset"], r["topic"], r["value"], r["error"]) for r in out] == [
        (0, "orders", {"quantity": 2, "card": "", "topic": "orders", "at": 0}, None),
        (1, "orders", {"quantity": 3, "card": "5500", "topic": "orders", "at": 1}, None),
        # the Cast fails: later transforms skip the record, which keeps its routed topic
        (
            3,
            "orders",
            {"qty": "many", "card": "6011"},
            (
                "TRANSFORMATION",
                "org.apache.kafka.connect.transforms.Cast$Value",
                "t1: Cannot cast field 'qty' \"many\" to int32",
            ),
        ),
        (4, "audit", {"quantity": 5, "card": "3400", "topic": "audit", "at": 4}, None),
    ]


def test_converters(spark: SparkRuntime) -> None:
    rows = [record(b"not json"), record(b"plain text")]
    json_out = run(spark, chain(("HoistField$Value", {"field": "v"})), rows[:1])
    assert json_out[0]["error"] == (
        "VALUE_CONVERTER",
        "org.apache.kafka.connect.json.JsonConverter",
        "Converting byte[] to the record's value failed: not valid JSON",
    )
    text = run(
        spark,
        chain(("HoistField$Value", {"field": "v"}), value__converter="StringConverter"),
        rows[1:],
    )
    assert text[0]["value"] == {"v": "plain text"}
    # a part no transform looks into is never converted: its bytes pass as they are
    routed = run(spark, chain(("RegexRouter", {"regex": ".*", "replacement": "x"})), rows)
    assert values(routed) == [b"not json", b"plain text"]


# -- configs and plugins --------------------------------------------------------------------


def test_type_names_resolve_to_the_same_class() -> None:
    for name in (
        "org.apache.kafka.connect.transforms.InsertField$Value",
        "InsertField$Value",
        "herder.dataplane.transforms.fields.InsertFieldValue",
    ):
        assert transformation_class(name) is InsertFieldValue
    assert transformation_class("NoSuchTransform") is None


def test_bad_configs_name_every_key() -> None:
    problems = validate_transforms(
        {
            "transforms": "a,b,c,d",
            "transforms.a.type": "NoSuch",
            "transforms.b.type": "Cast$Value",
            "transforms.b.spec": "x:int99",
            "transforms.c.type": "Filter",
            "transforms.c.predicate": "undefined",
            "transforms.d.type": "TimestampConverter$Value",
            "transforms.d.target.type": "string",
            "value.converter": "AvroConverter",
        }
    )
    joined = "\n".join(problems)
    assert "transforms.a.type: Class NoSuch could not be found" in joined
    assert "transforms.b" in joined and "int99" in joined
    assert "transforms.c.predicate" in joined
    assert "requires format option" in joined
    assert "value.converter" in joined
    assert len(problems) == 5
    with pytest.raises(InvalidConfiguration):
        TransformChain.from_settings({"transforms": "a", "transforms.a.type": "NoSuch"})
    # typed values (JsonConverter's envelopes) are for transforms to look inside
    # (tests/dataplane/test_typed_transforms.py)
    chain = TransformChain.from_settings(
        {
            "value.converter.schemas.enable": "true",
            "transforms": "m",
            "transforms.m.type": "org.apache.kafka.connect.transforms.MaskField$Value",
            "transforms.m.fields": "a",
        }
    )
    assert chain.converters["value"].schemas


def test_every_transform_and_predicate_is_installed() -> None:
    """herder's own are found as a third party's are: through the entry points."""
    transforms = {k.class_name: k for k in installed_transformations()}
    predicates = {k.class_name: k for k in installed_predicates()}
    prefix = "org.apache.kafka.connect.transforms."
    assert set(transforms) >= {prefix + name for name in (
        "InsertField$Key", "InsertField$Value", "ReplaceField$Key", "ReplaceField$Value",
        "MaskField$Key", "MaskField$Value", "Cast$Key", "Cast$Value", "ValueToKey",
        "ExtractField$Key", "ExtractField$Value", "HoistField$Key", "HoistField$Value",
        "TimestampConverter$Key", "TimestampConverter$Value", "RegexRouter",
        "TimestampRouter", "Filter",
    )}  # fmt: skip
    assert set(predicates) >= {
        prefix + "predicates." + name
        for name in ("TopicNameMatches", "HasHeaderKey", "RecordIsTombstone")
    }
    cast = transforms[prefix + "Cast$Value"]
    assert "spec" in cast.config_def().keys
    assert cast.version() == herder.__version__


# -- the task's side: source batches and sink batches ------------------------------------


def _task_pipeline(spark: SparkRuntime, settings: dict[str, str]) -> RecordPipeline:
    nothing: Any = None
    return RecordPipeline(
        settings, connector="c", task=0, topics=nothing, spark=spark, coordinator=nothing
    )


def test_a_source_batch_dataframe_goes_through_the_chain_with_its_dead_letters(
    spark: SparkRuntime,
) -> None:
    settings = {
        **chain(("Cast$Value", {"spec": "n:int64"}), ("RegexRouter", {"regex": "in",
                                                                       "replacement": "out"})),
        "errors.tolerance": "all",
        "errors.deadletterqueue.topic.name": "dlq",
        "errors.deadletterqueue.context.headers.enable": "true",
    }  # fmt: skip
    df = spark.session.createDataFrame(
        [('{"n": "1"}',), ('{"n": "x"}',)], "value string"
    )  # no key, headers, partition or timestamp: the runtime's defaults
    out = _task_pipeline(spark, settings)._source_job(df, "in", STAMP_MS)
    rows = sorted(out.collect(), key=lambda r: r["topic"])
    assert [(r["topic"], _decode(r["value"])) for r in rows] == [
        ("dlq", {"n": "x"}),
        ("out", {"n": 1}),
    ]
    assert all(r["timestamp"].timestamp() * 1000 == STAMP_MS for r in rows)
    context = {h["key"]: bytes(h["value"]).decode() for h in rows[0]["headers"]}
    assert context["__connect.errors.topic"] == "in"
    assert context["__connect.errors.stage"] == "TRANSFORMATION"
    assert "__connect.errors.offset" not in context  # a source record has none yet


def test_a_sink_batch_fails_under_tolerance_none(spark: SparkRuntime) -> None:
    from pyspark.sql import functions as F

    df = spark.session.createDataFrame(
        [("t", 0, 5, b'{"n": "x"}')], "topic string, partition int, offset long, value binary"
    ).select(
        "topic",
        "partition",
        "offset",
        F.timestamp_millis(F.lit(STAMP_MS)).alias("timestamp"),
        F.lit(None).cast("binary").alias("key"),
        "value",
        F.array().cast("array<struct<key:string,value:binary>>").alias("headers"),
    )
    pipeline = _task_pipeline(spark, chain(("Cast$Value", {"spec": "n:int64"})))
    with pytest.raises(RecordError, match=r"offset=5.*Cannot cast field 'n'"):
        pipeline._sink_job(df)
