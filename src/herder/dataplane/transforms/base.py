"""What a transform or predicate is: Spark column expressions over a record.

A chain runs over a DataFrame with a row per record. A transform never sees rows: it
gets the record's fields as columns (:class:`Record`) and returns what it changes as
columns (:class:`Outcome`), plus, for records it cannot handle, a *failure* column —
the failure's message, null where the record is fine. The chain (:mod:`.chain`) then
keeps a failing record unchanged and marks it, so one bad record never fails a Spark
job and good and bad records part with a filter.

Keys and values are seen as Spark VARIANTs (semi-structured values: objects, arrays,
strings, numbers, booleans, binary): the key and value converters (:mod:`.converters`)
turn the stored bytes into variants before the first transform that looks inside them,
and back after the last. Schemaless, as Connect's transforms are without a schema:
fields are the top-level names of an object.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from herder.config import ConfigDef

if TYPE_CHECKING:
    from pyspark.sql import Column

__all__ = [
    "KEY",
    "VALUE",
    "Outcome",
    "Predicate",
    "Record",
    "Transformation",
    "field_path",
    "kind_of",
    "not_an_object",
]

KEY = "key"
VALUE = "value"
#: the working column of each part's variant, while a chain runs
PART_COLUMNS = {KEY: "_key", VALUE: "_value"}
#: what records carry when no converter has run on them
RAW_COLUMNS = {KEY: "key", VALUE: "value"}
#: Connect's package for its transforms and predicates; herder's take the same names
CONNECT_TRANSFORMS = "org.apache.kafka.connect.transforms"
CONNECT_PREDICATES = "org.apache.kafka.connect.transforms.predicates"
#: the exception class a failing record reports (``__connect.errors.exception.class.name``)
DATA_EXCEPTION = "herder.dataplane.errors.RecordError"


@dataclass(frozen=True)
class Record:
    """A record's fields as Spark columns, as a transform sees it.

    ``key`` and ``value`` are VARIANT columns (null for a null key, or a tombstone);
    they exist only for the parts the chain parses, so a transform must declare the
    parts it reads in :attr:`Transformation.reads`. ``offset`` is null for source
    records, which get an offset only when they are written.
    """

    topic: Column
    partition: Column
    offset: Column
    timestamp: Column
    headers: Column
    sink: bool
    parsed: frozenset[str] = field(default_factory=frozenset)

    def part(self, name: str) -> Column:
        """The key's or the value's variant (``name`` is ``"key"`` or ``"value"``)."""
        from pyspark.sql import functions as F

        if name not in self.parsed:
            raise RuntimeError(f"the chain did not parse the record's {name}")
        return F.col(PART_COLUMNS[name])

    def is_null(self, name: str) -> Column:
        """Whether the key or value is null (a tombstone, for the value)."""
        from pyspark.sql import functions as F

        column = PART_COLUMNS[name] if name in self.parsed else RAW_COLUMNS[name]
        return F.col(column).isNull()


@dataclass
class Outcome:
    """What a transform does to the records it applies to.

    ``updates`` maps the columns it changes (``topic``, ``partition``, ``timestamp``,
    ``headers``, or a part as ``"key"`` / ``"value"``) to their new expressions;
    ``failure`` is a string column, the failure's message where the record cannot be
    transformed (and null elsewhere); ``keep`` is a boolean column, false for records
    the transform drops.
    """

    updates: dict[str, Column] = field(default_factory=dict)
    failure: Column | None = None
    keep: Column | None = None


class _Plugin(ABC):
    """Shared by transforms and predicates: a name, a version, a ConfigDef."""

    #: Connect's full class name, e.g. ``org.apache.kafka.connect.transforms.Cast$Value``
    class_name: ClassVar[str]

    @classmethod
    def config_def(cls) -> ConfigDef:
        """The keys this plugin understands (without the ``transforms.<alias>.`` prefix)."""
        return ConfigDef()

    @classmethod
    def version(cls) -> str:
        from herder import __version__

        return __version__

    def configure(self, config: Mapping[str, Any]) -> None:  # noqa: B027 - optional hook
        """Take the parsed values of :meth:`config_def`; raise ConfigError for bad ones."""


class Transformation(_Plugin):
    """A single message transform (Connect's ``Transformation``).

    Subclasses declare their keys in :meth:`config_def`, read them in
    :meth:`configure`, and build their expressions in :meth:`apply`.
    """

    #: the parts (``"key"``, ``"value"``) whose contents the transform reads or writes
    reads: ClassVar[frozenset[str]] = frozenset()

    @abstractmethod
    def apply(self, record: Record) -> Outcome:
        """The transform's effect on ``record`` (see :class:`Outcome`)."""


class Predicate(_Plugin):
    """A condition on a record that decides whether a transform applies to it."""

    reads: ClassVar[frozenset[str]] = frozenset()

    @abstractmethod
    def test(self, record: Record) -> Column:
        """A boolean column: true where the predicate holds."""


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
