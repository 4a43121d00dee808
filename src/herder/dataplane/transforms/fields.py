"""Transforms on the fields of a key or value: Connect's field transforms.

Each has a ``$Key`` and a ``$Value`` form (ValueToKey has one). A null key or value
(and a tombstone) passes through untouched; one that is not an object fails the record
with Connect's message where the transform needs fields. Schemaless parts are variants
(here); typed ones, with a schema, are structs (:mod:`.structs`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from herder.config import ConfigDef, Importance, Type, ValidString
from herder.config.parsing import invalid_value
from herder.connect.transforms import KEY, VALUE, Outcome, Record
from herder.dataplane.transforms import structs
from herder.dataplane.transforms.builtin import (
    CONNECT_TRANSFORMS,
    BuiltInTransformation,
    as_map,
    field_path,
    get_field,
    is_absent,
    kind_of,
    not_an_object,
    to_variant,
)
from herder.errors import NotSupported

if TYPE_CHECKING:
    from pyspark.sql import Column

REPLACE_NULL = "replace.null.with.default"
_REPLACE_NULL_DOC = (
    "Connect's option for fields with schema defaults; schemaless records have none."
)


def with_replace_null(definition: ConfigDef) -> ConfigDef:
    return definition.define(
        REPLACE_NULL,
        Type.BOOLEAN,
        default=True,
        importance=Importance.MEDIUM,
        documentation=_REPLACE_NULL_DOC,
    )


def _bare(name: str) -> str:
    """A field name without Connect's ``!`` (required) or ``?`` (optional) suffix."""
    return name[:-1] if name.endswith(("!", "?")) else name


class PartTransform(BuiltInTransformation):
    """A transform of one part, named by its subclass (``$Key`` or ``$Value``)."""

    part: ClassVar[str] = VALUE
    typed = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.reads = frozenset({cls.part})


class InsertField(PartTransform):
    """Insert the record's topic, partition, offset, timestamp or a static value."""

    @classmethod
    def config_def(cls) -> ConfigDef:
        definition = ConfigDef()
        for key, doc in (
            ("topic.field", "Field for the topic."),
            ("partition.field", "Field for the partition."),
            ("offset.field", "Field for the offset (sink connectors only)."),
            ("timestamp.field", "Field for the record's timestamp, in epoch milliseconds."),
            ("static.field", "Field for the static value."),
            ("static.value", "The static value."),
        ):
            definition.define(key, Type.STRING, default=None, importance=Importance.MEDIUM,
                              documentation=doc)  # fmt: skip
        return with_replace_null(definition)

    def configure(self, config: Mapping[str, Any]) -> None:
        self.fields = {
            what: _bare(config[f"{what}.field"])
            for what in ("topic", "partition", "offset", "timestamp", "static")
            if config[f"{what}.field"]
        }
        self.static_value = config["static.value"]

    def apply(self, record: Record) -> Outcome:
        if record.type_of(self.part) is not None:
            return structs.insert_field(self, record)
        from pyspark.sql import functions as F

        values: dict[str, Column] = {
            "topic": record.topic,
            "partition": record.partition,
            "offset": record.offset,
            "timestamp": F.unix_millis(record.timestamp),
            "static": F.lit(self.static_value),
        }
        current = record.part(self.part)
        failure = not_an_object(current, "field insertion")
        if "offset" in self.fields and not record.sink:
            failure = F.when(
                ~is_absent(current),
                F.lit("Only SinkRecord supported for [field insertion], found: a source record"),
            )
        updated = current
        for what, name in self.fields.items():
            value = values[what]
            updated = F.when(value.isNull(), updated).otherwise(
                F.variant_set(updated, F.lit(field_path(name)), to_variant(value))
            )
        return Outcome({self.part: F.when(is_absent(current), current).otherwise(updated)}, failure)


class ReplaceField(PartTransform):
    """Keep (``include``), drop (``exclude``) and rename (``renames``) fields."""

    @classmethod
    def config_def(cls) -> ConfigDef:
        return with_replace_null(
            ConfigDef()
            .define("exclude", Type.LIST, default="", importance=Importance.MEDIUM,
                    documentation="Fields to drop; they win over include.")
            .define("include", Type.LIST, default="", importance=Importance.MEDIUM,
                    documentation="Fields to keep; empty keeps every field.")
            .define("renames", Type.LIST, default="", validator=_renames,
                    importance=Importance.MEDIUM,
                    documentation="Renames, as old:new pairs separated by commas.")
            .define("blacklist", Type.LIST, default=None, importance=Importance.LOW,
                    documentation="Deprecated name of exclude.")
            .define("whitelist", Type.LIST, default=None, importance=Importance.LOW,
                    documentation="Deprecated name of include.")
        )  # fmt: skip

    def configure(self, config: Mapping[str, Any]) -> None:
        self.exclude = list(config["exclude"] or config["blacklist"] or [])
        self.include = list(config["include"] or config["whitelist"] or [])
        self.renames = dict(pair.split(":", 1) for pair in config["renames"])

    def apply(self, record: Record) -> Outcome:
        if record.type_of(self.part) is not None:
            return structs.replace_field(self, record)
        from pyspark.sql import functions as F

        current = record.part(self.part)
        exclude, include, renames = self.exclude, self.include, self.renames

        def kept(name: Column, _value: Column) -> Column:
            keep = ~name.isin(exclude) if exclude else F.lit(True)
            return keep & name.isin(include) if include else keep

        def renamed(name: Column, _value: Column) -> Column:
            if not renames:
                return name
            pairs = list(renames.items())
            out = F.when(name == pairs[0][0], pairs[0][1])
            for old, new in pairs[1:]:
                out = out.when(name == old, new)
            return out.otherwise(name)

        fields = F.transform_keys(F.map_filter(as_map(current), kept), renamed)
        updated = F.when(is_absent(current), current).otherwise(F.to_variant_object(fields))
        return Outcome({self.part: updated}, not_an_object(current, "field replacement"))


def _renames(name: str, value: Any, /) -> None:
    for pair in value or []:
        parts = pair.split(":")
        if len(parts) != 2 or not all(parts):
            raise invalid_value(name, value, "Invalid rename mapping: " + pair)


class MaskField(PartTransform):
    """Replace fields' values with their type's empty value, or with ``replacement``."""

    @classmethod
    def config_def(cls) -> ConfigDef:
        return with_replace_null(
            ConfigDef()
            .define("fields", Type.LIST, validator=_non_empty, importance=Importance.HIGH,
                    documentation="Names of fields to mask.")
            .define("replacement", Type.STRING, default=None, importance=Importance.LOW,
                    documentation="Custom value replacement (for string and number fields).")
        )  # fmt: skip

    def configure(self, config: Mapping[str, Any]) -> None:
        self.fields = list(config["fields"])
        self.replacement: str | None = config["replacement"]
        self.numeric: float | int | None = None
        if self.replacement is not None:
            try:
                self.numeric = int(self.replacement)
            except ValueError:
                try:
                    self.numeric = float(self.replacement)
                except ValueError:
                    self.numeric = None

    def _masked(self, value: Column) -> tuple[Column, Column]:
        """(masked value, failure message) for one field's variant."""
        from pyspark.sql import functions as F

        kind = kind_of(value)
        numbers = ("TINYINT", "SMALLINT", "INT", "BIGINT", "FLOAT", "DOUBLE", "DECIMAL")
        number = kind.isin(*numbers)
        if self.replacement is None:
            masked = (
                F.when(kind == "STRING", to_variant(F.lit("")))
                .when(kind == "BOOLEAN", to_variant(F.lit(False)))
                .when(number, to_variant(F.lit(0)))
                .when(kind == "ARRAY", F.parse_json(F.lit("[]")))
                .when(kind == "OBJECT", F.parse_json(F.lit("{}")))
                .otherwise(value)
            )
            return masked, F.lit(None).cast("string")
        text = to_variant(F.lit(self.replacement))
        if self.numeric is None:
            masked = F.when(kind == "STRING", text).otherwise(value)
            failure = F.when(
                ~is_absent(value) & (kind != "STRING"),
                F.concat(
                    F.lit(f"Unable to mask a {self.replacement!r} replacement into a "),
                    kind,
                    F.lit(" field"),
                ),
            )
            return masked, failure
        masked = (
            F.when(kind == "STRING", text)
            .when(number, to_variant(F.lit(self.numeric)))
            .otherwise(value)
        )
        failure = F.when(
            ~is_absent(value) & (kind != "STRING") & ~number,
            F.concat(F.lit("Cannot mask value of type "), kind, F.lit(" with custom replacement")),
        )
        return masked, failure

    def apply(self, record: Record) -> Outcome:
        if record.type_of(self.part) is not None:
            return structs.mask_field(self, record)
        from pyspark.sql import functions as F

        current = record.part(self.part)
        updated = current
        failures = [not_an_object(current, "masking")]
        for name in self.fields:
            value = get_field(current, name)
            masked, failure = self._masked(value)
            failures.append(failure)
            updated = F.when(value.isNull(), updated).otherwise(
                F.variant_set(updated, F.lit(field_path(name)), masked)
            )
        return Outcome(
            {self.part: F.when(is_absent(current), current).otherwise(updated)},
            F.coalesce(*failures),
        )


def _non_empty(name: str, value: Any, /) -> None:
    if not value:
        raise invalid_value(name, value, "Empty list")


class ValueToKey(BuiltInTransformation):
    """The key becomes an object of the value's ``fields``."""

    class_name = f"{CONNECT_TRANSFORMS}.ValueToKey"
    reads = frozenset({KEY, VALUE})
    typed = True

    @classmethod
    def config_def(cls) -> ConfigDef:
        return with_replace_null(
            ConfigDef().define("fields", Type.LIST, validator=_non_empty,
                               importance=Importance.HIGH,
                               documentation="Field names on the record value to extract as "
                               "the record key.")
        )  # fmt: skip

    def configure(self, config: Mapping[str, Any]) -> None:
        self.fields = list(config["fields"])

    def apply(self, record: Record) -> Outcome:
        if record.type_of(VALUE) is not None:
            return structs.value_to_key(self, record)
        from pyspark.sql import functions as F

        value = record.part(VALUE)
        pairs: list[Column] = []
        for name in self.fields:
            pairs += [F.lit(name), get_field(value, name)]
        key = F.to_variant_object(F.create_map(*pairs))
        return Outcome(
            {KEY: F.when(is_absent(value), record.part(KEY)).otherwise(key)},
            not_an_object(value, "copying fields from value to key"),
        )


class ExtractField(PartTransform):
    """The key or value becomes one of its fields (null if it has none by that name)."""

    @classmethod
    def config_def(cls) -> ConfigDef:
        return with_replace_null(
            ConfigDef()
            .define("field", Type.STRING, importance=Importance.MEDIUM,
                    documentation="Field name to extract.")
            .define("field.syntax.version", Type.STRING, default="V1",
                    validator=ValidString.in_("V1", "V2", case_sensitive=False),
                    importance=Importance.LOW,
                    documentation="V1: field is a top-level name (V2, nested paths, is not "
                    "supported).")
        )  # fmt: skip

    def configure(self, config: Mapping[str, Any]) -> None:
        if str(config["field.syntax.version"]).upper() == "V2":
            raise NotSupported("field.syntax.version=V2 (nested field paths) is not supported")
        self.field = config["field"]

    def apply(self, record: Record) -> Outcome:
        if record.type_of(self.part) is not None:
            return structs.extract_field(self, record)
        from pyspark.sql import functions as F

        current = record.part(self.part)
        updated = F.when(is_absent(current), current).otherwise(get_field(current, self.field))
        return Outcome({self.part: updated}, not_an_object(current, "field extraction"))


class HoistField(PartTransform):
    """The key or value becomes an object with one field, ``field``, holding it."""

    @classmethod
    def config_def(cls) -> ConfigDef:
        return ConfigDef().define("field", Type.STRING, importance=Importance.MEDIUM,
                                  documentation="Field name for the single field that will "
                                  "be created in the resulting object.")  # fmt: skip

    def configure(self, config: Mapping[str, Any]) -> None:
        self.field = config["field"]

    def apply(self, record: Record) -> Outcome:
        if record.type_of(self.part) is not None:
            return structs.hoist_field(self, record)
        from pyspark.sql import functions as F

        current = record.part(self.part)
        hoisted = F.to_variant_object(F.create_map(F.lit(self.field), current))
        return Outcome({self.part: hoisted})


class InsertFieldKey(InsertField):
    class_name = f"{CONNECT_TRANSFORMS}.InsertField$Key"
    part = KEY


class InsertFieldValue(InsertField):
    class_name = f"{CONNECT_TRANSFORMS}.InsertField$Value"
    part = VALUE


class ReplaceFieldKey(ReplaceField):
    class_name = f"{CONNECT_TRANSFORMS}.ReplaceField$Key"
    part = KEY


class ReplaceFieldValue(ReplaceField):
    class_name = f"{CONNECT_TRANSFORMS}.ReplaceField$Value"
    part = VALUE


class MaskFieldKey(MaskField):
    class_name = f"{CONNECT_TRANSFORMS}.MaskField$Key"
    part = KEY


class MaskFieldValue(MaskField):
    class_name = f"{CONNECT_TRANSFORMS}.MaskField$Value"
    part = VALUE


class ExtractFieldKey(ExtractField):
    class_name = f"{CONNECT_TRANSFORMS}.ExtractField$Key"
    part = KEY


class ExtractFieldValue(ExtractField):
    class_name = f"{CONNECT_TRANSFORMS}.ExtractField$Value"
    part = VALUE


class HoistFieldKey(HoistField):
    class_name = f"{CONNECT_TRANSFORMS}.HoistField$Key"
    part = KEY


class HoistFieldValue(HoistField):
    class_name = f"{CONNECT_TRANSFORMS}.HoistField$Value"
    part = VALUE
