"""What herder's own transforms and predicates share: Connect's names, herder's version,
and expressions over a record's key or value as a Spark VARIANT.

The API they implement is :mod:`herder.connect.transforms`, as any transform's is. Keys
and values are seen as VARIANTs (semi-structured values: objects, arrays, strings,
numbers, booleans, binary), converted from the stored bytes (:mod:`.converters`) before
the first transform that looks inside them and back after the last. Schemaless, as
Connect's transforms are without a schema: fields are the top-level names of an object.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from herder import __version__
from herder.connect.transforms import Predicate, Transformation

if TYPE_CHECKING:
    from pyspark.sql import Column

__all__ = [
    "CONNECT_PREDICATES",
    "CONNECT_TRANSFORMS",
    "BuiltInPredicate",
    "BuiltInTransformation",
    "as_map",
    "field_path",
    "get_field",
    "is_absent",
    "kind_of",
    "not_an_object",
    "to_variant",
]

#: Connect's package for its transforms and predicates; herder's take the same names
CONNECT_TRANSFORMS = "org.apache.kafka.connect.transforms"
CONNECT_PREDICATES = "org.apache.kafka.connect.transforms.predicates"


class BuiltInTransformation(Transformation):
    """One of herder's transforms: it reports herder's version."""

    @classmethod
    def version(cls) -> str:
        return __version__


class BuiltInPredicate(Predicate):
    """One of herder's predicates: it reports herder's version."""

    @classmethod
    def version(cls) -> str:
        return __version__


def field_path(name: str) -> str:
    """The variant path of the top-level field ``name``."""
    escaped = name.replace("\\", "\\\\").replace("'", "\\'")
    return f"$['{escaped}']"


def kind_of(variant: Column) -> Column:
    """The variant's kind as a word: OBJECT, ARRAY, STRING, BIGINT, DECIMAL, BOOLEAN …"""
    from pyspark.sql import functions as F

    return F.regexp_extract(F.schema_of_variant(variant), r"^[A-Z_]+", 0)


def is_absent(variant: Column) -> Column:
    """Null, or the JSON null: a value a field transform passes through untouched."""
    from pyspark.sql import functions as F

    return variant.isNull() | F.is_variant_null(variant)


def not_an_object(variant: Column, purpose: str) -> Column:
    """Connect's failure for a schemaless field transform given something not a map."""
    from pyspark.sql import functions as F

    kind = kind_of(variant)
    return F.when(
        ~is_absent(variant) & (kind != "OBJECT"),
        F.concat(
            F.lit(f"Only Map objects supported in absence of schema for [{purpose}], found: "),
            kind,
        ),
    )


def as_map(variant: Column) -> Column:
    """An object variant as ``map<string, variant>`` (null for anything else)."""
    from pyspark.sql import functions as F

    return F.try_variant_get(variant, "$", "map<string,variant>")


def get_field(variant: Column, name: str) -> Column:
    """Field ``name`` of an object variant, as a variant (null if absent)."""
    from pyspark.sql import functions as F

    return F.try_variant_get(variant, field_path(name), "variant")


def to_variant(column: Column) -> Column:
    """Any Spark value as a variant."""
    return column.cast("variant")
