"""Converters: a record's stored bytes as the variant transforms see, and back.

Topics hold keys and values as bytes. When a chain has a transform that looks inside
the key or the value, that part is converted first, with Connect's converter names
(``key.converter`` / ``value.converter`` of the connector config):

* ``org.apache.kafka.connect.json.JsonConverter`` (the default): the bytes are JSON,
  schemaless; bytes that are not JSON fail the record at stage ``*_CONVERTER``. With
  ``schemas.enable=true`` the bytes are typed records, Connect's envelope of schema and
  payload (:mod:`herder.dataplane.schemas`): a chain that looks inside them gets them as
  typed values (:meth:`Converter.parse_typed`: the batch's schemas are found first, in
  one job), and a value that is no envelope fails its record;
* ``org.apache.kafka.connect.storage.StringConverter``: the bytes are UTF-8 text, a
  string; a string goes back as its text, anything else as JSON;
* ``org.apache.kafka.connect.converters.ByteArrayConverter``: the bytes as they are;
  bytes go back as they are, a string as its UTF-8 text, anything else as JSON.

A part no transform looks into is never converted: its bytes pass through untouched.
Objects come back as JSON with their fields in name order (variants keep them so).

Topics also hold *typed* keys and values, native Spark columns (:mod:`..typed`). A
sink that takes bytes gets them serialised with its converter
(:meth:`Converter.serialize_typed`), which is where JsonConverter's envelope lives:
with ``schemas.enable=true`` a typed value becomes ``{"schema": …, "payload": …}``,
without it the payload's plain JSON; StringConverter gives a string's text and any
other value's JSON; ByteArrayConverter takes only bytes, as Connect's does.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from herder.errors import ConfigError, NotSupported

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame
    from pyspark.sql.types import DataType

JSON: Final = "org.apache.kafka.connect.json.JsonConverter"
STRING: Final = "org.apache.kafka.connect.storage.StringConverter"
BYTES: Final = "org.apache.kafka.connect.converters.ByteArrayConverter"
KINDS: Final = (JSON, STRING, BYTES)


def _resolve(setting: str, name: str) -> str:
    for kind in KINDS:
        if name in (kind, kind.rsplit(".", 1)[1]):
            return kind
    raise ConfigError(
        f"Invalid value {name} for configuration {setting}: herder's converters are "
        + ", ".join(KINDS)
    )


@dataclass(frozen=True)
class Converter:
    """One of the converters above, for one part (``key`` or ``value``)."""

    kind: str
    part: str
    #: JsonConverter's ``schemas.enable``: the part holds typed records (envelopes)
    schemas: bool = False

    @classmethod
    def from_settings(cls, part: str, settings: Mapping[str, Any]) -> Converter:
        setting = f"{part}.converter"
        kind = _resolve(setting, str(settings.get(setting) or JSON).strip())
        schemas = str(settings.get(f"{setting}.schemas.enable", "false")).strip().lower()
        return cls(kind, part, kind == JSON and schemas == "true")

    def parse_typed(self, df: DataFrame, raw: str) -> tuple[Column, DataType, Column] | None:
        """Envelopes (column ``raw`` of ``df``) as typed values: the values, their Spark
        type, and the failure where a value is no envelope. Finding the batch's schemas
        costs a job; None if it has no envelope (then parse as schemaless JSON)."""
        from pyspark.sql import functions as F

        from herder.dataplane.schemas import (
            decode_column,
            merged_struct,
            parse_schema,
            schema_of,
            spark_type,
        )

        column = F.col(raw)
        heads = df.where(column.isNotNull()).select(schema_of(column).alias("s")).distinct()
        schemas = [parse_schema(row["s"]) for row in heads.collect() if row["s"] is not None]
        found = [s for s in schemas if s is not None]
        if not found:
            return None
        if len(found) == 1:
            schema = found[0]
        elif all(s.get("type") == "struct" for s in found):
            schema = merged_struct(found)
        else:
            raise NotSupported(
                f"{self.part}.converter.schemas.enable=true: a batch holds {self.part}s of"
                f" {len(found)} schemas that are not all structs; transforms need one type"
            )
        failure = F.when(
            column.isNotNull() & schema_of(column).isNull(),
            F.lit(
                f"Converting byte[] to the record's {self.part} failed: JsonConverter with"
                ' schemas.enable requires "schema" and "payload" fields and may not contain'
                " additional fields. If you are trying to deserialize plain JSON data, set"
                " schemas.enable=false in your converter configuration."
            ),
        )
        return decode_column(column, schema), spark_type(schema), failure

    @property
    def stage(self) -> str:
        """Connect's stage name for a failure of this converter."""
        return f"{self.part.upper()}_CONVERTER"

    def parse(self, raw: Column) -> tuple[Column, Column | None]:
        """The variant of ``raw`` bytes, and the failure message where they do not convert."""
        from pyspark.sql import functions as F

        if self.kind == JSON:
            parsed = F.try_parse_json(raw.cast("string"))
            failure = F.when(
                raw.isNotNull() & parsed.isNull(),
                F.lit(f"Converting byte[] to the record's {self.part} failed: not valid JSON"),
            )
            return parsed, failure
        if self.kind == STRING:
            return raw.cast("string").cast("variant"), None
        return raw.cast("variant"), None

    def serialize(self, variant: Column) -> Column:
        """The bytes that store ``variant``."""
        from pyspark.sql import functions as F

        as_json = F.to_json(variant).cast("binary")
        if self.kind == JSON:
            return as_json
        kind = F.schema_of_variant(variant)
        as_text = F.try_variant_get(variant, "$", "string").cast("binary")
        if self.kind == STRING:
            return F.when(kind == "STRING", as_text).otherwise(as_json)
        return (
            F.when(kind == "BINARY", F.try_variant_get(variant, "$", "binary"))
            .when(kind == "STRING", as_text)
            .otherwise(as_json)
        )

    def serialize_typed(self, typed: Column, dtype: DataType, topic: str) -> Column:
        """The bytes of typed values ``typed`` (of Spark type ``dtype``, from ``topic``),
        as this converter serialises them; null stays null."""
        from pyspark.sql import types as T

        from herder.dataplane.schemas import encode_column, json_payload

        if self.kind == JSON:
            if self.schemas:
                return encode_column(typed, dtype)
            return json_payload(typed, dtype).cast("binary")
        if self.kind == STRING:
            if isinstance(dtype, T.StringType):
                return typed.cast("binary")
            return json_payload(typed, dtype).cast("binary")
        if isinstance(dtype, T.BinaryType):
            return typed
        raise ConfigError(
            f"{self.part}.converter={BYTES} takes bytes, but the {self.part}s of topic"
            f" {topic} are typed ({dtype.simpleString()}): set {self.part}.converter to"
            f" {JSON} or {STRING}"
        )
