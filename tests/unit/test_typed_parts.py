"""Typed parts of segments: their stored types, merged across segments, as DDL."""

from __future__ import annotations

import json

import pytest

from herder.dataplane.typed import IncompatibleTypes, ddl, merge_types, part_types, type_json

pytestmark = [pytest.mark.unit, pytest.mark.timeout(10)]


def struct(*fields: tuple[str, object, bool]) -> dict:
    return {
        "type": "struct",
        "fields": [
            {"name": n, "type": t, "nullable": null, "metadata": {}} for n, t, null in fields
        ],
    }


def test_only_parts_that_are_not_bytes_are_typed() -> None:
    spark_schema = struct(
        ("key", "binary", True),
        ("value", struct(("id", "long", False)), True),
        ("headers", {"type": "array", "elementType": "string", "containsNull": True}, True),
        ("timestamp", "long", True),
    )
    found = part_types(json.dumps(spark_schema).encode())
    assert set(found) == {"value"}
    assert json.loads(found["value"]) == struct(("id", "long", False))
    assert part_types(None) == {}
    assert part_types(json.dumps(struct(("value", "string", True))).encode()) == {}


def test_a_field_added_upstream_is_kept_and_nullable_in_the_merged_type() -> None:
    old = struct(("id", "integer", False), ("note", "string", False))
    new = struct(
        ("id", "long", False), ("amount", "decimal(12,2)", False), ("note", "string", True)
    )
    merged = json.loads(merge_types([type_json(old), type_json(new)], "topic t, value"))
    assert merged == struct(
        ("id", "long", False),
        ("note", "string", True),
        ("amount", "decimal(12,2)", True),
    )


def test_nested_structs_arrays_and_maps_merge_field_by_field() -> None:
    inner_old = struct(("a", "integer", False))
    inner_new = struct(("a", "integer", False), ("b", "date", False))
    old = struct(
        ("items", {"type": "array", "elementType": inner_old, "containsNull": False}, True)
    )
    new = struct(("items", {"type": "array", "elementType": inner_new, "containsNull": True}, True))
    merged = json.loads(merge_types([type_json(old), type_json(new)], "v"))
    items = merged["fields"][0]["type"]
    assert items["containsNull"] is True
    assert [f["name"] for f in items["elementType"]["fields"]] == ["a", "b"]
    assert items["elementType"]["fields"][1]["nullable"] is True


def test_types_that_do_not_read_as_one_are_refused_naming_the_field() -> None:
    old = struct(("id", "long", False))
    new = struct(("id", "string", False))
    with pytest.raises(IncompatibleTypes, match=r"topic t, value\.id: .*long and string"):
        merge_types([type_json(old), type_json(new)], "topic t, value")


def test_ddl_quotes_field_names_and_spells_spark_types() -> None:
    dtype = struct(
        ("odd `name`", "long", False),
        ("m", {"type": "map", "keyType": "string", "valueType": "short",
               "valueContainsNull": True}, True),
        ("t", "timestamp_ntz", True),
    )  # fmt: skip
    assert ddl(type_json(dtype)) == (
        "struct<`odd ``name```:bigint,`m`:map<string,smallint>,`t`:timestamp_ntz>"
    )


def test_only_fields_a_segment_can_keep_once_are_constants() -> None:
    """Top-level fields of a struct value, of null, strings, booleans, numbers and
    structs of them that fit the field's type; and never every field."""
    from herder.dataplane.typed import usable_constants

    at = struct(("lsn", "long", True), ("db", "string", True))
    stored = json.dumps(
        struct(
            ("op", "string", True), ("n", "long", True), ("f", "double", True),
            ("ok", "boolean", True), ("day", "date", True), ("at", at, True),
        )
    )  # fmt: skip
    given = {"op": "r", "n": 3, "f": 2, "ok": True, "at": {"lsn": 5}, "missing": 1}
    assert usable_constants(stored, given) == {k: v for k, v in given.items() if k != "missing"}
    # a value of another type than its field's, or of a type kept as it is
    for wrong in ({"op": 3}, {"n": "3"}, {"n": True}, {"ok": 1}, {"f": float("nan")},
                  {"day": "2024-05-01"}, {"at": {"lsn": "x"}}, {"at": {"other": 1}}):  # fmt: skip
        assert usable_constants(stored, wrong) == {}, wrong
    assert usable_constants(stored, {"day": None}) == {"day": None}
    # integers within their type's range only
    assert usable_constants(stored, {"n": 2**63 - 1}) == {"n": 2**63 - 1}
    assert usable_constants(stored, {"n": 2**63}) == {}
    small = json.dumps(struct(("s", "short", True), ("b", "byte", True), ("x", "long", True)))
    assert usable_constants(small, {"s": -32768, "b": 127}) == {"s": -32768, "b": 127}
    assert usable_constants(small, {"s": 32768}) == usable_constants(small, {"b": -129}) == {}
    # every field alike: the first stays in the files
    two = json.dumps(struct(("a", "long", True), ("b", "string", True)))
    assert usable_constants(two, {"a": 1, "b": "x"}) == {"b": "x"}
    assert usable_constants('"binary"', {"a": 1}) == {}


def test_constants_are_put_back_as_literals_of_the_type_read() -> None:
    """Strings escaped for Spark's SQL, numbers cast to their (widened) type, a struct's
    fields the constant lacks null, and null values left null."""
    from herder.dataplane.typed import restored_sql

    stored = json.dumps(
        struct(
            ("after", struct(("id", "long", False)), True), ("op", "string", False),
            ("n", "long", True), ("f", "float", True),
            ("at", struct(("lsn", "long", True), ("db", "string", True)), True),
        )
    )  # fmt: skip
    sql = restored_sql("value", stored, {"op": "it's \\ ok", "n": 3, "f": 1.5, "at": {"lsn": 7}})
    assert sql == (
        "if(value IS NULL, NULL, named_struct('after', value.`after`, 'op', 'it\\'s \\\\ ok',"
        " 'n', CAST(3 AS bigint), 'f', CAST('1.5' AS float),"
        " 'at', named_struct('lsn', CAST(7 AS bigint), 'db', CAST(NULL AS string))))"
    )
