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
