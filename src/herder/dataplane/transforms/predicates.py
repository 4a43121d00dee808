"""Connect's predicates: which records a transform applies to.

A transform with ``transforms.<alias>.predicate=<name>`` applies only where the
predicate holds (or, with ``transforms.<alias>.negate=true``, only where it does not).
Predicates see the record as the transforms before them left it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from herder.config import ConfigDef, Importance, Type
from herder.connect.transforms import VALUE, Record
from herder.dataplane.transforms.builtin import CONNECT_PREDICATES, BuiltInPredicate
from herder.dataplane.transforms.routing import regex

if TYPE_CHECKING:
    from pyspark.sql import Column


class TopicNameMatches(BuiltInPredicate):
    """True for records whose topic matches ``pattern`` entirely."""

    class_name = f"{CONNECT_PREDICATES}.TopicNameMatches"

    @classmethod
    def config_def(cls) -> ConfigDef:
        return ConfigDef().define("pattern", Type.STRING, validator=regex,
                                  importance=Importance.MEDIUM,
                                  documentation="A Java regular expression for matching "
                                  "against the name of a record's topic.")  # fmt: skip

    def configure(self, config: Mapping[str, Any]) -> None:
        self.pattern = config["pattern"]

    def test(self, record: Record) -> Column:
        return record.topic.rlike(f"^(?:{self.pattern})$")


class HasHeaderKey(BuiltInPredicate):
    """True for records with at least one header named ``name``."""

    class_name = f"{CONNECT_PREDICATES}.HasHeaderKey"

    @classmethod
    def config_def(cls) -> ConfigDef:
        return ConfigDef().define("name", Type.STRING, importance=Importance.MEDIUM,
                                  documentation="The header name.")  # fmt: skip

    def configure(self, config: Mapping[str, Any]) -> None:
        self.name = config["name"]

    def test(self, record: Record) -> Column:
        from pyspark.sql import functions as F

        name = self.name
        return F.coalesce(F.exists(record.headers, lambda h: h["key"] == name), F.lit(False))


class RecordIsTombstone(BuiltInPredicate):
    """True for tombstones: records whose value is null."""

    class_name = f"{CONNECT_PREDICATES}.RecordIsTombstone"

    def test(self, record: Record) -> Column:
        return record.is_null(VALUE)
