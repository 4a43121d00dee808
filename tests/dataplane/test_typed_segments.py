"""Typed keys and values travel through topics as native Spark columns.

A DataFrame whose value is a struct (decimals, dates, timestamps, arrays, maps, nested
structs) is staged with its value as that struct in the segment's Parquet file, the
segment says so, and a read gives the same types back. Segments written before and
after a column was added upstream read as one DataFrame; segments of bytes (older
topics) still read as bytes, alongside typed ones as JsonConverter's envelope.
"""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal
from typing import Any

import pyarrow.parquet as pq
import pytest
from pyspark.sql import functions as F
from pyspark.sql import types as T

from herder.connect import SourceRecord
from herder.dataplane import SegmentWriter, SparkRuntime, Storage
from herder.dataplane.schemas import decode_column, parse_schema, schema_of
from herder.dataplane.transforms.converters import Converter
from herder.errors import ConfigError
from tests.dataplane.conftest import connected, slice_rows
from tests.integration.conftest import ServerHandle

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.timeout(300)]

ROW_DDL = (
    "id bigint, amount decimal(12,2), placed date, at timestamp, local timestamp_ntz,"
    " tags array<string>, attrs map<string,int>, address struct<city:string,zip:int>,"
    " paid boolean, blob binary"
)


def rows(spark: SparkRuntime, ids: range) -> Any:
    items = [
        (
            i,
            Decimal(i) + Decimal("0.25"),
            dt.date(2024, 1, 1) + dt.timedelta(days=i),
            dt.datetime(2024, 1, 1, 12, 0, 0, i, tzinfo=dt.UTC),
            dt.datetime(2024, 1, 1, 12, 0, 0, i),
            [f"t{i}", "x"],
            {"n": i},
            (f"city {i}", 1000 + i),
            i % 2 == 0,
            bytes([i % 256]),
        )
        for i in ids
    ]
    return spark.session.createDataFrame(items, ROW_DDL)


def typed(df: Any) -> Any:
    """Each row as a typed value, keyed by its id (a typed key)."""
    return df.select(
        F.col("id").alias("key"),
        F.struct(*[F.col(c) for c in df.columns]).alias("value"),
    )


async def test_a_typed_value_is_stored_and_read_back_with_its_types(
    ensemble: ServerHandle, storage: Storage, spark: SparkRuntime
) -> None:
    source = rows(spark, range(20))
    async with connected(ensemble, storage, spark) as topics:
        await topics.create("typed-in", 2)
        writer = SegmentWriter(topics, spark, "typed-in-0", 1)
        staged = await writer.stage(typed(source), "typed-in")
        committed = await topics.commit(staged)
        segments = list(committed.segments.values())
        assert {s.value_type is not None for s in segments} == {True}
        assert {json.loads(s.key_type or "null") for s in segments} == {"long"}
        # in the Parquet file the value is the struct itself, not bytes
        file_schema = pq.read_schema(storage.fs_path(segments[0].files[0]))
        assert file_schema.field("value").type.num_fields == len(source.columns)
        df = await topics.read("typed-in", ordered=True)
        assert df.schema["value"].dataType == source.schema
        assert isinstance(df.schema["key"].dataType, T.LongType)
        back = sorted(
            (r.asDict(recursive=True) for r in df.select("value.*").collect()),
            key=lambda r: r["id"],
        )
        assert back == [r.asDict(recursive=True) for r in source.orderBy("id").collect()]
        # the CLI shows a typed value as its JSON
        (partition,) = [p for p in await topics.plan_read("typed-in") if p.partition == 0][:1]
        shown = json.loads(slice_rows(storage, [partition])[0]["value"])
        assert set(shown) == set(source.columns)


async def test_typed_rows_for_a_topic_of_one_partition_keep_their_order_and_types(
    ensemble: ServerHandle, storage: Storage, spark: SparkRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A table snapshot's chunk — a struct key, a struct value — into a topic of one
    partition is staged in its order, without numbering (a positional segment), and
    read back with its types, in that order, whole or in part."""
    monkeypatch.setattr("herder.dataplane.writer.MAX_RECORDS_PER_FILE", 8)
    source = rows(spark, range(30))
    chunk = source.select(
        F.struct("id").alias("key"), F.struct(*[F.col(c) for c in source.columns]).alias("value")
    )
    async with connected(ensemble, storage, spark) as topics:
        await topics.create("typed-chunk", 1)
        writer = SegmentWriter(topics, spark, "typed-chunk-0", 1)
        staged = await writer.stage(chunk, "typed-chunk")
        [segment] = staged.segments
        assert segment.file_counts is not None and len(segment.files) >= 4
        assert json.loads(segment.key_type or "null")["fields"][0]["name"] == "id"
        assert json.loads(segment.value_type or "null")["type"] == "struct"
        file_schema = pq.read_schema(storage.fs_path(segment.files[0]))
        assert file_schema.names[:2] == ["key", "value"] and "seq" not in file_schema.names
        await topics.commit(staged)

        expected = [r.asDict(recursive=True) for r in source.collect()]
        df = await topics.read("typed-chunk", ordered=True)
        assert df.schema["key"].dataType == chunk.schema["key"].dataType
        assert df.schema["value"].dataType == source.schema
        got = df.select("offset", "key.id", "value").collect()
        assert [(r["offset"], r["id"]) for r in got] == [(i, i) for i in range(30)]
        assert [r["value"].asDict(recursive=True) for r in got] == expected
        part = (await topics.read("typed-chunk", {0: (6, 19)}, ordered=True)).collect()
        assert [r["offset"] for r in part] == list(range(6, 19))
        assert [r["key"]["id"] for r in part] == list(range(6, 19))
        assert [r["value"].asDict(recursive=True) for r in part] == expected[6:19]
        # the CLI shows a typed key and value as their JSON
        shown = slice_rows(storage, await topics.plan_read("typed-chunk", {0: (6, 19)}))
        assert [json.loads(r["key"]) for r in shown] == [{"id": i} for i in range(6, 19)]
        assert [json.loads(r["value"])["id"] for r in shown] == list(range(6, 19))


async def test_segments_before_and_after_a_column_was_added_read_as_one_dataframe(
    ensemble: ServerHandle, storage: Storage, spark: SparkRuntime
) -> None:
    older = spark.session.createDataFrame([(i, f"n{i}") for i in range(5)], "id int, note string")
    newer = spark.session.createDataFrame(
        [(i, f"n{i}", Decimal("1.50")) for i in range(5, 8)],
        "id bigint, note string, amount decimal(12,2)",
    )
    async with connected(ensemble, storage, spark) as topics:
        await topics.create("evolving", 1)
        writer = SegmentWriter(topics, spark, "evolving-0", 1)
        for df in (older, newer):
            row = F.struct(*[F.col(c) for c in df.columns]).alias("value")
            await topics.commit(await writer.stage(df.select(row), "evolving"))
        read = await topics.read("evolving", ordered=True)
        fields = {f.name: f.dataType for f in read.schema["value"].dataType.fields}
        assert fields == {
            "id": T.LongType(),
            "note": T.StringType(),
            "amount": T.DecimalType(12, 2),
        }
        got = [tuple(r) for r in read.select("offset", "value.*").collect()]
        assert got == [(i, i, f"n{i}", None) for i in range(5)] + [
            (i, i, f"n{i}", Decimal("1.50")) for i in range(5, 8)
        ]


async def test_a_read_of_byte_segments_and_typed_ones_gives_bytes_and_envelopes(
    ensemble: ServerHandle, storage: Storage, spark: SparkRuntime
) -> None:
    source = rows(spark, range(3))
    async with connected(ensemble, storage, spark) as topics:
        await topics.create("bytes-then-typed", 1)
        writer = SegmentWriter(topics, spark, "bytes-then-typed-0", 1)
        old = [SourceRecord({}, {}, "bytes-then-typed", b'{"plain": true}', partition=0)]
        await topics.commit(await writer.stage(old))
        only_bytes = await topics.read("bytes-then-typed")
        assert isinstance(only_bytes.schema["value"].dataType, T.BinaryType)
        await topics.commit(await writer.stage(typed(source).drop("key"), "bytes-then-typed"))
        read = await topics.read("bytes-then-typed", ordered=True)
        assert isinstance(read.schema["value"].dataType, T.BinaryType)
        values = read.select("offset", "value").collect()
        assert values[0]["value"] == b'{"plain": true}'
        # the typed ones as envelopes, which decode to what was written
        typed_rows = read.where("offset > 0")
        (head,) = {r[0] for r in typed_rows.select(schema_of(F.col("value"))).collect()}
        schema = parse_schema(head)
        assert schema is not None and schema["type"] == "struct"
        decoded = typed_rows.select(decode_column(F.col("value"), schema).alias("r"))
        assert [r.asDict(recursive=True) for r in decoded.select("r.*").collect()] == [
            r.asDict(recursive=True) for r in source.collect()
        ]


def test_converters_serialise_typed_values_for_sinks_that_take_bytes(
    spark: SparkRuntime,
) -> None:
    df = spark.session.createDataFrame(
        [(1, Decimal("2.50"), dt.date(2024, 3, 1))], "id int, amount decimal(5,2), day date"
    ).select(F.struct("id", "amount", "day").alias("value"))
    dtype = df.schema["value"].dataType

    def serialised(settings: dict[str, str]) -> str:
        converter = Converter.from_settings("value", settings)
        out = df.select(converter.serialize_typed(F.col("value"), dtype, "t").alias("v"))
        return bytes(out.first()["v"]).decode()

    envelope = json.loads(serialised({"value.converter.schemas.enable": "true"}))
    assert envelope["schema"]["type"] == "struct"
    assert [f["field"] for f in envelope["schema"]["fields"]] == ["id", "amount", "day"]
    assert envelope["payload"] == {"id": 1, "amount": 2.5, "day": 19783}
    plain = json.loads(serialised({"value.converter.schemas.enable": "false"}))
    assert plain == {"id": 1, "amount": 2.5, "day": "2024-03-01"}
    as_text = serialised({"value.converter": "org.apache.kafka.connect.storage.StringConverter"})
    assert json.loads(as_text) == plain
    raw = Converter.from_settings(
        "value", {"value.converter": "org.apache.kafka.connect.converters.ByteArrayConverter"}
    )
    with pytest.raises(ConfigError, match=r"ByteArrayConverter takes bytes.*topic t are typed"):
        raw.serialize_typed(F.col("value"), dtype, "t")


async def test_fields_every_record_holds_alike_are_kept_once_and_read_back_whole(
    ensemble: ServerHandle, storage: Storage, spark: SparkRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A snapshot chunk's change events share ``before``, ``source``, ``op`` and
    ``ts_ms``: staged with them as constants, the files hold ``after`` alone and the
    segment the rest, once. Every read gives the whole values back: Spark's, whole, in
    part, by ranges and (past the files one read unions) in one scan; the CLI's; a read
    merged with a later segment whose rows have a column more; and one mixed with a
    segment of bytes, as envelopes."""
    monkeypatch.setattr("herder.dataplane.writer.MAX_RECORDS_PER_FILE", 8)
    source = spark.session.createDataFrame(
        [(i, f"n{i}") for i in range(30)], "id bigint, note string"
    )
    row = "struct<id:bigint,note:string>"
    envelope = (
        f"named_struct('before', CAST(NULL AS {row}), 'after', struct(id, note),"
        " 'source', named_struct('name', 'p \\'q\\' \\\\z', 'lsn', CAST(99 AS BIGINT),"
        " 'txId', CAST(NULL AS BIGINT), 'snapshot', true), 'op', 'r', 'ts_ms', CAST(17 AS BIGINT))"
    )
    chunk = source.selectExpr("struct(id) AS key", f"{envelope} AS value")
    source_block = {"name": "p 'q' \\z", "lsn": 99, "txId": None, "snapshot": True}
    constants = {"before": None, "source": source_block, "op": "r", "ts_ms": 17, "gone": 1}
    expected = [
        {"before": None, "after": {"id": i, "note": f"n{i}"}, "source": source_block,
         "op": "r", "ts_ms": 17}
        for i in range(30)
    ]  # fmt: skip
    async with connected(ensemble, storage, spark) as topics:
        await topics.create("alike", 1)
        writer = SegmentWriter(topics, spark, "alike-0", 1)
        staged = await writer.stage(chunk, "alike", constants=constants)
        [segment] = staged.segments
        assert len(segment.files) >= 4
        assert json.loads(segment.value_constants or "{}") == {
            k: v for k, v in constants.items() if k != "gone"
        }
        assert json.loads(segment.value_type or "null") == json.loads(
            chunk.schema["value"].dataType.json()
        )
        file_schema = pq.read_schema(storage.fs_path(segment.files[0]))
        assert [f.name for f in file_schema.field("value").type] == ["after"]
        await topics.commit(staged)

        def values(df: Any) -> list[Any]:
            return [r["value"].asDict(recursive=True) for r in df.orderBy("offset").collect()]

        whole = await topics.read("alike", ordered=True)
        value_type = whole.schema["value"].dataType
        assert value_type.simpleString() == chunk.schema["value"].dataType.simpleString()
        assert values(whole) == expected
        assert values(await topics.read("alike", {0: (5, 19)}, ordered=True)) == expected[5:19]
        ranged, ranges = await topics.read_ranged("alike", ordered=True, ranged=True)
        assert ranges is not None and len(ranges) >= 4
        assert values(ranged) == expected
        monkeypatch.setattr("herder.dataplane.reader.MAX_FILES_UNIONED", 2)
        assert values(await topics.read("alike", ordered=True)) == expected
        shown = slice_rows(storage, await topics.plan_read("alike", {0: (3, 12)}))
        assert [json.loads(r["value"]) for r in shown] == expected[3:12]

        # a later segment, whose rows have a column more and keep every field
        later = spark.session.createDataFrame([(30, "n30", 7)], "id bigint, note string, qty int")
        wider = "struct<id:bigint,note:string,qty:int>"
        wide = envelope.replace(row, wider).replace("(id, note)", "(id, note, qty)")
        await topics.commit(
            await writer.stage(later.selectExpr("struct(id) AS key", f"{wide} AS value"), "alike")
        )
        merged = values(await topics.read("alike", ordered=True))
        assert merged[:30] == [
            {**e, "after": {**e["after"], "qty": None}} for e in expected
        ]  # fmt: skip
        assert merged[30]["after"] == {"id": 30, "note": "n30", "qty": 7}

        # and a segment of bytes: every value as an envelope of bytes
        await topics.commit(await writer.stage([SourceRecord({}, {}, "alike", b"{}", partition=0)]))
        mixed = (await topics.read("alike", ordered=True)).collect()
        assert [json.loads(r["value"])["payload"] for r in mixed[:3]] == expected[:3]
        assert mixed[-1]["value"] == b"{}"


async def test_a_batch_given_as_arrow_pieces_is_staged_as_its_dataframe_would_be(
    ensemble: ServerHandle, storage: Storage, spark: SparkRuntime
) -> None:
    """Pieces an executor reads as Arrow are written there, a file per piece in their
    order (one that reads nothing writes none); their values' constant fields are left
    out as the DataFrame's are; the segment holds the DataFrame's types and reads back
    as the same records."""
    import pyarrow as pa

    from herder.connect import ArrowPieces

    df = spark.session.range(30).selectExpr(
        "struct(id) AS key",
        "named_struct('before', CAST(NULL AS struct<id:bigint>), 'after', named_struct("
        "'id', id, 'note', concat('n', id)), 'op', 'r') AS value",
    )
    after = pa.struct([pa.field("id", pa.int64()), pa.field("note", pa.string())])

    def read(index: int) -> Any:
        import pyarrow as pa

        for start in (index * 10, index * 10 + 5)[: 2 if index < 3 else 0]:
            ids = pa.array(range(start, start + 5), pa.int64())
            notes = pa.array([f"n{i}" for i in range(start, start + 5)])
            row = pa.StructArray.from_arrays([ids, notes], fields=list(after))
            op = pa.array(["r"] * 5)  # a constant: the files leave it out
            yield pa.RecordBatch.from_arrays(
                [
                    pa.StructArray.from_arrays([ids], names=["id"]),
                    pa.StructArray.from_arrays([row, op], names=["after", "op"]),
                ],
                names=["key", "value"],
            )

    constants = {"before": None, "op": "r"}
    async with connected(ensemble, storage, spark) as topics:
        for name in ("by-pieces", "by-spark"):
            await topics.create(name, 1)
        by_pieces = await SegmentWriter(topics, spark, "by-pieces-0", 1).stage(
            df, "by-pieces", constants=constants, pieces=ArrowPieces(4, read)
        )
        by_spark = await SegmentWriter(topics, spark, "by-spark-0", 1).stage(
            df, "by-spark", constants=constants
        )
        [piece_segment], [spark_segment] = by_pieces.segments, by_spark.segments
        assert piece_segment.file_counts == [10, 10, 10]
        assert [f.rsplit("/", 1)[-1][:10] for f in piece_segment.files] == [
            "part-00000", "part-00001", "part-00002"
        ]  # fmt: skip
        file_schema = pq.read_schema(storage.fs_path(piece_segment.files[0]))
        assert [f.name for f in file_schema.field("value").type] == ["after"]
        for field in ("key_type", "value_type", "value_constants"):
            assert getattr(piece_segment, field) == getattr(spark_segment, field), field
        await topics.commit(by_pieces)
        await topics.commit(by_spark)

        def records(df: Any) -> list[Any]:
            return [(r["offset"], r["key"], r["value"]) for r in df.orderBy("offset").collect()]

        got = records(await topics.read("by-pieces", ordered=True))
        assert got == records(await topics.read("by-spark", ordered=True))
        assert [v.asDict(recursive=True) for _, _, v in got[:2]] == [
            {"before": None, "after": {"id": i, "note": f"n{i}"}, "op": "r"} for i in (0, 1)
        ]
        shown = slice_rows(storage, await topics.plan_read("by-pieces", {0: (8, 12)}))
        assert [json.loads(r["value"])["after"]["id"] for r in shown] == [8, 9, 10, 11]

        # pieces whose values lack a field the segment keeps in its files: an error
        def lacking(index: int) -> Any:
            for batch in read(index):
                value = batch.column("value")
                yield pa.RecordBatch.from_arrays(
                    [batch.column("key"), pa.StructArray.from_arrays([value.field("op")], ["op"])],
                    names=["key", "value"],
                )

        writer = SegmentWriter(topics, spark, "by-pieces-1", 1)
        with pytest.raises(Exception, match="no field 'after'"):
            await writer.stage(df, "by-pieces", constants=constants, pieces=ArrowPieces(1, lacking))

        # a constant a segment cannot keep once (not of its field's type): the files must
        # hold the field, which the pieces leave out, so Spark writes the DataFrame
        staged = await writer.stage(
            df, "by-pieces", constants={**constants, "op": 5}, pieces=ArrowPieces(4, read)
        )
        [segment] = staged.segments
        assert json.loads(segment.value_constants or "{}") == {"before": None}
        file_schema = pq.read_schema(storage.fs_path(segment.files[0]))
        assert [f.name for f in file_schema.field("value").type] == ["after", "op"]
