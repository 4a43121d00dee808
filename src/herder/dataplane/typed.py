"""Typed keys and values in segments: which parts are typed, and of what Spark type.

A source that hands the runtime a DataFrame whose ``key`` or ``value`` column is neither
``binary`` nor ``string`` (a struct of a table's columns, a decimal, an array …) has
that part stored as it is, a native column of the segment's Parquet file, so a Parquet
table in gives a Parquet table out with the same types, and no record is ever encoded
to JSON on the way. Spark keeps its own schema in every Parquet footer it writes
(:data:`SPARK_ROW_METADATA`); the writer reads each typed part's type from there and the
segment's metadata carries it (:attr:`Segment.value_type
<herder.dataplane.metadata.Segment.value_type>`), as Spark's JSON form of the type,
so readers plan a read without opening a file.

A topic's segments may differ: a column added upstream (schema evolution), or older
segments of bytes. :func:`merge_types` gives the one type a read of several typed
segments has: a struct with every field any of them has (in the order they first
appear; a field some lack is null in their records), integers and floats widened as
Spark's Parquet reader widens them. A read that mixes typed and untyped segments
gives bytes: the typed values as JsonConverter's envelope (see :mod:`.schemas`).

Everything here is pure: JSON in, JSON or DDL out.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Final

from herder.errors import NotSupported

#: The footer key under which Spark writes a Parquet file's Spark schema.
SPARK_ROW_METADATA: Final = b"org.apache.spark.sql.parquet.row.metadata"
#: The parts of a record that may be typed.
PARTS: Final = ("key", "value")
#: Types a part holds as bytes (Parquet stores both as BYTE_ARRAY).
BYTES_TYPES: Final = ("binary", "string")

#: Numeric types in the order Spark's Parquet reader widens them.
_INTEGERS = ("byte", "short", "integer", "long")
_FLOATS = ("float", "double")
#: Spark's JSON names of primitive types, as DDL spells them.
_DDL_NAMES = {"byte": "tinyint", "short": "smallint", "integer": "int", "long": "bigint"}


class IncompatibleTypes(NotSupported):
    """Segments of one topic whose typed values cannot be read as one type."""


def type_json(dtype: Any) -> str:
    """A Spark type's JSON form (as parsed from Spark's schema JSON), as stored."""
    return json.dumps(dtype, separators=(",", ":"), sort_keys=True)


def part_types(row_metadata: bytes | None) -> dict[str, str]:
    """The stored types of the typed parts of a file whose footer holds
    ``row_metadata`` (Spark's schema JSON; None for a file Spark did not write)."""
    if not row_metadata:
        return {}
    schema = json.loads(row_metadata)
    found = {}
    for field in schema.get("fields", []):
        if field["name"] in PARTS and field["type"] not in BYTES_TYPES:
            found[field["name"]] = type_json(field["type"])
    return found


def merge_types(types: Sequence[str], what: str) -> str:
    """One stored type that every type of ``types`` (oldest first) reads as.

    ``what`` names the part in an error (``topic orders, value``).
    """
    merged = json.loads(types[0])
    for other in types[1:]:
        merged = _merge(merged, json.loads(other), what)
    return type_json(merged)


def _merge(old: Any, new: Any, what: str) -> Any:
    if old == new:
        return old
    if isinstance(old, str) and isinstance(new, str):
        for ladder in (_INTEGERS, _FLOATS):
            if old in ladder and new in ladder:
                return ladder[max(ladder.index(old), ladder.index(new))]
        raise IncompatibleTypes(
            f"{what}: segments hold {old} and {new} values, which do not read as one type;"
            " write the changed values to a new topic"
        )
    if isinstance(old, dict) and isinstance(new, dict) and old["type"] == new["type"]:
        kind = old["type"]
        if kind == "struct":
            return _merge_structs(old, new, what)
        if kind == "array":
            return {
                **new,
                "elementType": _merge(old["elementType"], new["elementType"], what),
                "containsNull": old["containsNull"] or new["containsNull"],
            }
        if kind == "map" and old["keyType"] == new["keyType"]:
            return {
                **new,
                "valueType": _merge(old["valueType"], new["valueType"], what),
                "valueContainsNull": old["valueContainsNull"] or new["valueContainsNull"],
            }
    raise IncompatibleTypes(
        f"{what}: segments hold values of types {_ddl(old)} and {_ddl(new)}, which do not"
        " read as one type; write the changed values to a new topic"
    )


def _merge_structs(old: Mapping[str, Any], new: Mapping[str, Any], what: str) -> dict:
    olds = {f["name"]: f for f in old["fields"]}
    news = {f["name"]: f for f in new["fields"]}
    fields = []
    for name in [*olds, *(n for n in news if n not in olds)]:
        a, b = olds.get(name), news.get(name)
        if a is None or b is None:
            # a field some records lack is null in theirs
            fields.append({**(a or b or {}), "nullable": True})
            continue
        fields.append(
            {
                **b,
                "type": _merge(a["type"], b["type"], f"{what}.{name}"),
                "nullable": a["nullable"] or b["nullable"],
            }
        )
    return {"type": "struct", "fields": fields}


def ddl(stored: str) -> str:
    """A stored type in Spark's DDL, for a read schema (field names quoted)."""
    return _ddl(json.loads(stored))


def _ddl(dtype: Any) -> str:
    if isinstance(dtype, str):
        return _DDL_NAMES.get(dtype, dtype)
    kind = dtype["type"]
    if kind == "struct":
        inner = ",".join(
            "`" + f["name"].replace("`", "``") + "`:" + _ddl(f["type"]) for f in dtype["fields"]
        )
        return f"struct<{inner}>"
    if kind == "array":
        return f"array<{_ddl(dtype['elementType'])}>"
    if kind == "map":
        return f"map<{_ddl(dtype['keyType'])},{_ddl(dtype['valueType'])}>"
    if kind == "udt":
        return _ddl(dtype["sqlType"])
    raise IncompatibleTypes(f"a segment holds values of Spark type {json.dumps(dtype)}")
