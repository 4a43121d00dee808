"""Transforms on where a record goes: RegexRouter, TimestampRouter, and Filter.

A router changes the record's topic: a source's records are written to the routed
topic (created if need be), a sink's ``put`` sees the routed name. Filter drops the
records it applies to — all of them, unless a predicate says which.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from herder.config import ConfigDef, Importance, Type
from herder.config.parsing import invalid_value
from herder.connect.transforms import Outcome, Record
from herder.dataplane.transforms.builtin import CONNECT_TRANSFORMS, BuiltInTransformation
from herder.dataplane.transforms.millis import format_millis


def regex(name: str, value: Any, /) -> None:
    """A validator for keys holding a regular expression."""
    try:
        re.compile(value)
    except (re.error, TypeError) as exc:
        raise invalid_value(name, value, f"Invalid regex: {exc}") from None


class RegexRouter(BuiltInTransformation):
    """Rename topics that match ``regex`` entirely, to ``replacement`` (``$1`` for groups)."""

    class_name = f"{CONNECT_TRANSFORMS}.RegexRouter"

    @classmethod
    def config_def(cls) -> ConfigDef:
        return (
            ConfigDef()
            .define("regex", Type.STRING, validator=regex, importance=Importance.HIGH,
                    documentation="Regular expression to use for matching.")
            .define("replacement", Type.STRING, importance=Importance.HIGH,
                    documentation="Replacement string.")
        )  # fmt: skip

    def configure(self, config: Mapping[str, Any]) -> None:
        self.regex = config["regex"]
        self.replacement = config["replacement"]

    def apply(self, record: Record) -> Outcome:
        from pyspark.sql import functions as F

        matches = record.topic.rlike(f"^(?:{self.regex})$")
        renamed = F.regexp_replace(record.topic, self.regex, self.replacement)
        return Outcome({"topic": F.when(matches, renamed).otherwise(record.topic)})


class TimestampRouter(BuiltInTransformation):
    """Rename topics to ``topic.format`` with ``${topic}`` and the record's ``${timestamp}``."""

    class_name = f"{CONNECT_TRANSFORMS}.TimestampRouter"

    @classmethod
    def config_def(cls) -> ConfigDef:
        return (
            ConfigDef()
            .define("topic.format", Type.STRING, default="${topic}-${timestamp}",
                    importance=Importance.HIGH,
                    documentation="Format string which can contain ${topic} and ${timestamp} "
                    "as placeholders for the topic and timestamp, respectively.")
            .define("timestamp.format", Type.STRING, default="yyyyMMdd",
                    importance=Importance.HIGH,
                    documentation="Format string for the timestamp (UTC).")
        )  # fmt: skip

    def configure(self, config: Mapping[str, Any]) -> None:
        self.topic_format = config["topic.format"]
        self.timestamp_format = config["timestamp.format"]

    def apply(self, record: Record) -> Outcome:
        from pyspark.sql import functions as F

        stamp = format_millis(F.unix_millis(record.timestamp), self.timestamp_format)
        pieces = []
        for i, chunk in enumerate(self.topic_format.split("${timestamp}")):
            if i:
                pieces.append(stamp)
            parts = chunk.split("${topic}")
            for j, text in enumerate(parts):
                if j:
                    pieces.append(record.topic)
                if text:
                    pieces.append(F.lit(text))
        topic = F.concat(*pieces) if pieces else F.lit("")
        failure = F.when(record.timestamp.isNull(), F.lit("Timestamp missing on record"))
        return Outcome({"topic": topic}, failure)


class Filter(BuiltInTransformation):
    """Drop the records it applies to (use a predicate to choose them)."""

    class_name = f"{CONNECT_TRANSFORMS}.Filter"

    def apply(self, record: Record) -> Outcome:
        from pyspark.sql import functions as F

        return Outcome(keep=F.lit(False))
