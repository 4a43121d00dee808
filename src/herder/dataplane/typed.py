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
import math
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


def sql_name(name: str) -> str:
    """A field or column name quoted for Spark's SQL (and its DDL)."""
    return "`" + name.replace("`", "``") + "`"


def _ddl(dtype: Any) -> str:
    if isinstance(dtype, str):
        return _DDL_NAMES.get(dtype, dtype)
    kind = dtype["type"]
    if kind == "struct":
        inner = ",".join(sql_name(f["name"]) + ":" + _ddl(f["type"]) for f in dtype["fields"])
        return f"struct<{inner}>"
    if kind == "array":
        return f"array<{_ddl(dtype['elementType'])}>"
    if kind == "map":
        return f"map<{_ddl(dtype['keyType'])},{_ddl(dtype['valueType'])}>"
    if kind == "udt":
        return _ddl(dtype["sqlType"])
    raise IncompatibleTypes(f"a segment holds values of Spark type {json.dumps(dtype)}")


# -- constant fields -----------------------------------------------------------------------
#
# A batch may say that some top-level fields of its values are the same in every record
# (a snapshot chunk's change events share ``before``, ``source``, ``op`` and ``ts_ms``):
# its files then leave those fields out, its segment keeps their values once
# (:attr:`Segment.value_constants <herder.dataplane.metadata.Segment.value_constants>`),
# and every reader puts them back. Parquet writes every leaf of every row, null or not:
# a change event of 7 columns has 27 leaves, and a chunk of them took twice as long to
# write as the same rows flat.

#: Primitive types whose values a constant may hold, by Spark's JSON name.
_CONSTANT_TYPES: Final = {
    "string": str,
    "boolean": bool,
    **dict.fromkeys(_INTEGERS, int),
    **dict.fromkeys(_FLOATS, float),
}


def usable_constants(stored: str, constants: Mapping[str, Any]) -> dict[str, Any]:
    """Those of ``constants`` (field name → value) that a value of stored type
    ``stored`` can keep once: top-level fields of a struct, whose values are null or
    strings, booleans, numbers and structs of them, as their types say. At least one
    field is left in the files (a Parquet group cannot be empty)."""
    dtype = json.loads(stored)
    if not isinstance(dtype, dict) or dtype.get("type") != "struct":
        return {}
    fields = {f["name"]: f["type"] for f in dtype["fields"]}
    usable = {
        name: value
        for name, value in constants.items()
        if name in fields and _fits(value, fields[name])
    }
    if len(usable) == len(fields):
        usable.pop(next(iter(fields)))
    return usable


def _fits(value: Any, dtype: Any) -> bool:
    if value is None:
        return True
    if isinstance(dtype, str):
        kind = _CONSTANT_TYPES.get(dtype)
        if kind is None or (kind is not bool and isinstance(value, bool)):
            return False
        if kind is float:
            return isinstance(value, int | float) and math.isfinite(value)
        if kind is int:
            bits = {"byte": 8, "short": 16, "integer": 32, "long": 64}[dtype]
            return isinstance(value, int) and -(2 ** (bits - 1)) <= value < 2 ** (bits - 1)
        return isinstance(value, kind)
    if isinstance(dtype, dict) and dtype.get("type") == "struct" and isinstance(value, dict):
        fields = {f["name"]: f["type"] for f in dtype["fields"]}
        return set(value) <= set(fields) and all(_fits(v, fields[k]) for k, v in value.items())
    return False


def without_fields(stored: str, names: Sequence[str]) -> str:
    """A stored struct type without the fields ``names``: the type its files hold."""
    dtype = json.loads(stored)
    return type_json({**dtype, "fields": [f for f in dtype["fields"] if f["name"] not in names]})


def restored_sql(column: str, stored: str, constants: Mapping[str, Any]) -> str:
    """Spark SQL for the values of ``column`` (read as stored type ``stored``, the
    fields of ``constants`` absent from its files) with those fields put back: null
    values stay null."""
    names = [f["name"] for f in json.loads(stored)["fields"]]
    read = {name: f"{column}.{sql_name(name)}" for name in names}
    return f"if({column} IS NULL, NULL, {struct_sql(stored, constants, read)})"


def struct_sql(stored: str, constants: Mapping[str, Any], others: Mapping[str, str]) -> str:
    """Spark SQL for a struct of stored type ``stored``: the fields of ``constants`` as
    literals of their types, every other field the SQL ``others`` gives for it."""
    parts = []
    for f in json.loads(stored)["fields"]:
        name = f["name"]
        given = _literal(constants[name], f["type"]) if name in constants else others[name]
        parts.append(f"{_string(name)}, {given}")
    return f"named_struct({', '.join(parts)})"


def _literal(value: Any, dtype: Any) -> str:
    """``value`` as a Spark SQL literal of stored type ``dtype`` (a struct's fields
    that ``value`` lacks are null)."""
    if value is None:
        return f"CAST(NULL AS {_ddl(dtype)})"
    if isinstance(dtype, dict):
        return (
            "named_struct("
            + ", ".join(
                f"{_string(f['name'])}, {_literal(value.get(f['name']), f['type'])}"
                for f in dtype["fields"]
            )
            + ")"
        )
    if dtype == "string":
        return _string(value)
    if dtype == "boolean":
        return "TRUE" if value else "FALSE"
    if dtype in _FLOATS:
        return f"CAST({_string(repr(float(value)))} AS {_ddl(dtype)})"
    return f"CAST({int(value)} AS {_ddl(dtype)})"


def _string(text: str) -> str:
    """A Spark SQL string literal (backslashes are escapes in Spark's SQL)."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"
