"""Single message transforms and predicates: what one is, and how workers find them.

A transform rewrites a connector's records between a source task's ``poll`` and the
topic, or between the topic and a sink task's ``put`` (Connect's ``Transformation``); a
predicate decides which records a transform applies to (Connect's ``Predicate``).
Records move through Spark, so neither handles records one at a time: a transform gets
the record's fields as columns (:class:`Record`) and returns the columns it changes
(:class:`Outcome`), a predicate returns a boolean column. A minimal transform::

    from pyspark.sql import functions as F

    from herder.config import ConfigDef, Importance, Type
    from herder.connect import Outcome, Record, Transformation

    class Prefix(Transformation):
        # puts the configured prefix before every record's topic

        @classmethod
        def config_def(cls):
            return ConfigDef().define("prefix", Type.STRING, importance=Importance.HIGH,
                                      documentation="What to put before the topic.")

        def configure(self, config):
            self.prefix = config["prefix"]

        def apply(self, record: Record) -> Outcome:
            return Outcome(updates={"topic": F.concat(F.lit(self.prefix), record.topic)})

Make it known to workers through the ``herder.transforms`` entry-point group of your
package (``herder.predicates`` for a predicate), as connectors are through
``herder.connectors``::

    [project.entry-points."herder.transforms"]
    Prefix = "mypkg.prefix:Prefix"

then name it in a connector config as ``transforms.<alias>.type=Prefix`` or in full,
``mypkg.prefix.Prefix``; ``GET /connector-plugins?connectorsOnly=false`` lists it. A
class that is merely importable works by its full dotted name too, unlisted. herder's
own transforms and predicates are installed the same way, under Connect's names
(``org.apache.kafka.connect.transforms.Cast$Value``, or ``Cast$Value``).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import logging
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import TYPE_CHECKING, Any, ClassVar, Final

from herder.config import ConfigDef
from herder.connect.task import UNDEFINED_VERSION

if TYPE_CHECKING:
    from pyspark.sql import Column
    from pyspark.sql.types import DataType

__all__ = [
    "KEY",
    "PREDICATES_GROUP",
    "TRANSFORMS_GROUP",
    "VALUE",
    "Outcome",
    "Predicate",
    "Record",
    "Transformation",
    "installed_predicates",
    "installed_transformations",
    "predicate_class",
    "transformation_class",
]

log = logging.getLogger(__name__)

#: the entry-point groups workers find transforms and predicates in
TRANSFORMS_GROUP: Final = "herder.transforms"
PREDICATES_GROUP: Final = "herder.predicates"

KEY: Final = "key"
VALUE: Final = "value"
#: the working column of each part's variant, while a chain runs
PART_COLUMNS: Final = {KEY: "_key", VALUE: "_value"}
#: what records carry when no converter has run on them
RAW_COLUMNS: Final = {KEY: "key", VALUE: "value"}


@dataclass(frozen=True)
class Record:
    """A record's fields as Spark columns, as a transform sees it.

    ``key`` and ``value`` are seen as Spark VARIANTs (objects, arrays, strings, numbers,
    booleans, binary; null for a null key, or a tombstone), converted from the stored
    bytes by the connector's ``key.converter`` / ``value.converter``. They exist only for
    the parts the chain parses, so a transform must declare the parts it reads in
    :attr:`Transformation.reads`. ``offset`` is null for source records, which get an
    offset only when they are written.

    A *typed* part (``types`` has its Spark type: the topic holds it as a native
    column, a struct of a table's columns for instance) is seen as that column, for
    transforms that handle typed parts (:attr:`Transformation.typed`); for others the
    chain makes it a variant first.
    """

    topic: Column
    partition: Column
    offset: Column
    timestamp: Column
    headers: Column
    sink: bool
    parsed: frozenset[str] = field(default_factory=frozenset)
    types: Mapping[str, DataType] = field(default_factory=dict)

    def part(self, name: str) -> Column:
        """The key's or the value's variant, or its typed column (``name`` is ``"key"``
        or ``"value"``)."""
        from pyspark.sql import functions as F

        if name not in self.parsed:
            raise RuntimeError(f"the chain did not parse the record's {name}")
        return F.col(PART_COLUMNS[name])

    def type_of(self, name: str) -> DataType | None:
        """The Spark type of a typed part; None for a variant."""
        return self.types.get(name)

    def is_null(self, name: str) -> Column:
        """Whether the key or value is null (a tombstone, for the value)."""
        from pyspark.sql import functions as F

        column = PART_COLUMNS[name] if name in self.parsed else RAW_COLUMNS[name]
        return F.col(column).isNull()


@dataclass
class Outcome:
    """What a transform does to the records it applies to.

    ``updates`` maps the columns it changes (``topic``, ``partition``, ``timestamp``,
    ``headers``, or a part as ``"key"`` / ``"value"``, a variant) to their new
    expressions; ``failure`` is a string column, the failure's message where the record
    cannot be transformed (and null elsewhere): such a record is left as it was and
    handled as ``errors.tolerance`` says, so one bad record never fails a Spark job;
    ``keep`` is a boolean column, false for records the transform drops. ``types``
    gives the Spark type of each typed part it changes (a part it makes typed, or
    whose type it changes: a field added, dropped, cast).
    """

    updates: dict[str, Column] = field(default_factory=dict)
    failure: Column | None = None
    keep: Column | None = None
    types: dict[str, DataType] = field(default_factory=dict)


class _Plugin(ABC):
    """Shared by transforms and predicates: a name, a version, a ConfigDef."""

    #: the name configs and the REST API know it by: its full dotted name unless it
    #: sets one (herder's own take Connect's, e.g.
    #: ``org.apache.kafka.connect.transforms.Cast$Value``)
    class_name: ClassVar[str]
    #: the parts (``"key"``, ``"value"``) whose contents it reads or writes
    reads: ClassVar[frozenset[str]] = frozenset()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "class_name" not in cls.__dict__:
            cls.class_name = f"{cls.__module__}.{cls.__qualname__}"

    @classmethod
    def config_def(cls) -> ConfigDef:
        """The keys this plugin understands (without the ``transforms.<alias>.`` prefix)."""
        return ConfigDef()

    @classmethod
    def version(cls) -> str:
        """The plugin's version, shown by ``GET /connector-plugins``."""
        return UNDEFINED_VERSION

    def configure(self, config: Mapping[str, Any]) -> None:  # noqa: B027 - optional hook
        """Take the parsed values of :meth:`config_def`; raise ConfigError for bad ones."""


class Transformation(_Plugin):
    """A single message transform (Connect's ``Transformation``).

    Subclasses declare their keys in :meth:`config_def`, read them in
    :meth:`configure`, and build their expressions in :meth:`apply`. The worker makes
    one instance per connector config, with no arguments.
    """

    #: Whether :meth:`apply` handles typed parts (:meth:`Record.type_of`), giving the
    #: new type of each one it changes in :attr:`Outcome.types`. A typed part that a
    #: transform without it reads is made a variant, and stored as bytes after the chain.
    typed: ClassVar[bool] = False

    @abstractmethod
    def apply(self, record: Record) -> Outcome:
        """The transform's effect on ``record`` (see :class:`Outcome`)."""


class Predicate(_Plugin):
    """A condition on a record that decides whether a transform applies to it."""

    @abstractmethod
    def test(self, record: Record) -> Column:
        """A boolean column: true where the predicate holds."""


# -- finding them ---------------------------------------------------------------------------


def installed_transformations() -> tuple[type[Transformation], ...]:
    """Every transform installed under the ``herder.transforms`` entry points."""
    return _installed(TRANSFORMS_GROUP, Transformation)


def installed_predicates() -> tuple[type[Predicate], ...]:
    """Every predicate installed under the ``herder.predicates`` entry points."""
    return _installed(PREDICATES_GROUP, Predicate)


def transformation_class(name: str) -> type[Transformation] | None:
    """The transform a ``transforms.<alias>.type`` value names, or None: an installed one
    by its class name or the last part of it, else any importable subclass by its full
    dotted name."""
    return _lookup(name, installed_transformations(), Transformation)


def predicate_class(name: str) -> type[Predicate] | None:
    """The predicate a ``predicates.<alias>.type`` value names, or None (as
    :func:`transformation_class`)."""
    return _lookup(name, installed_predicates(), Predicate)


@cache
def _installed(group: str, base: type[Any]) -> tuple[type[Any], ...]:
    """The usable classes of ``group``'s entry points, sorted by class name, read once a
    process as Connect scans its plugin path once. One that fails to load, or names
    something else, is logged and skipped: one broken package must not take the others
    down."""
    found: dict[str, type[Any]] = {}
    for entry_point in importlib.metadata.entry_points(group=group):
        try:
            klass = entry_point.load()
        except Exception as exc:
            log.warning(
                "Skipping %s plugin %s = %s: %s", group, entry_point.name, entry_point.value, exc
            )
            continue
        if not _usable(klass, base):
            log.warning(
                "Skipping %s plugin %s = %s: not a concrete subclass of herder.connect.%s",
                group,
                entry_point.name,
                entry_point.value,
                base.__name__,
            )
            continue
        found.setdefault(klass.class_name, klass)
    return tuple(found[name] for name in sorted(found))


def _usable(obj: object, base: type[Any]) -> bool:
    return isinstance(obj, type) and issubclass(obj, base) and not inspect.isabstract(obj)


def _lookup(name: str, installed: tuple[type[Any], ...], base: type[Any]) -> type[Any] | None:
    for klass in installed:
        if name in (klass.class_name, klass.class_name.rpartition(".")[2]):
            return klass
    module, _, attribute = name.rpartition(".")
    if not module:
        return None
    try:
        found = getattr(importlib.import_module(module), attribute)
    except (ImportError, AttributeError, ValueError):
        return None
    return found if _usable(found, base) else None
