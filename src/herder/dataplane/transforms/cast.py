"""Cast and TimestampConverter: changing the type of a value or of its fields.

A value that does not convert fails its record (to the dead letter queue, with
``errors.tolerance=all``): each conversion is a ``try_`` expression whose null result
on a non-null input is the failure, so one bad record never fails the Spark job.

Times are UTC, as in Connect. TimestampConverter's ``Timestamp``, ``Date`` and
``Time`` targets are epoch milliseconds in schemaless records (a ``Date`` at midnight,
a ``Time`` counted from midnight), since JSON has no date type; ``format`` is a
datetime pattern as Spark reads it (the common letters are SimpleDateFormat's). On
typed keys and values (:mod:`.structs`) the targets are Spark's types.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

from herder.config import ConfigDef, Importance, Type, ValidString
from herder.config.parsing import invalid_value
from herder.connect.transforms import KEY, VALUE, Outcome, Record
from herder.dataplane.transforms import structs
from herder.dataplane.transforms.builtin import (
    CONNECT_TRANSFORMS,
    field_path,
    get_field,
    is_absent,
    kind_of,
    not_an_object,
    to_variant,
)
from herder.dataplane.transforms.fields import PartTransform, with_replace_null
from herder.dataplane.transforms.millis import DAY_MS, epoch_ntz, format_millis
from herder.errors import ConfigError

if TYPE_CHECKING:
    from pyspark.sql import Column

#: Connect's Cast types and the Spark type each becomes
CAST_TYPES: Final = {
    "int8": "tinyint",
    "int16": "smallint",
    "int32": "int",
    "int64": "bigint",
    "float32": "float",
    "float64": "double",
    "boolean": "boolean",
    "string": "string",
}
WHOLE: Final = ""


def _spec(name: str, value: Any, /) -> None:
    if not value:
        raise invalid_value(name, value, "Must specify at least one field to cast.")
    try:
        parse_spec(value)
    except ConfigError as exc:
        raise invalid_value(name, value, str(exc)) from None


def parse_spec(items: list[str]) -> dict[str, str]:
    """``["a:int32", "b:string"]`` or ``["int64"]`` (the whole value) as field → type."""
    casts: dict[str, str] = {}
    for item in items:
        field, sep, kind = item.rpartition(":")
        if not sep:
            if len(items) != 1:
                raise ConfigError("Cast of the whole value must be the only item of the spec")
            field = WHOLE
        kind = kind.strip().lower()
        if kind not in CAST_TYPES:
            raise ConfigError(
                f"Invalid type found in casting spec: {kind} (one of {', '.join(CAST_TYPES)})"
            )
        casts[field.strip()] = kind
    return casts


class Cast(PartTransform):
    """Cast fields, or the whole key or value, to another primitive type."""

    @classmethod
    def config_def(cls) -> ConfigDef:
        return with_replace_null(
            ConfigDef().define("spec", Type.LIST, validator=_spec, importance=Importance.HIGH,
                               documentation="field:type pairs (field1:int32,field2:string), "
                               "or a single type to cast the whole value. Types: "
                               + ", ".join(CAST_TYPES) + ".")
        )  # fmt: skip

    def configure(self, config: Mapping[str, Any]) -> None:
        self.casts = parse_spec(config["spec"])

    def _cast(self, value: Column, kind: str, what: str) -> tuple[Column, Column]:
        from pyspark.sql import functions as F

        cast = F.try_variant_get(value, "$", CAST_TYPES[kind])
        failure = F.when(
            ~is_absent(value) & cast.isNull(),
            F.concat(
                F.lit(f"Cannot cast {what} "),
                F.to_json(value),
                F.lit(f" to {kind}"),
            ),
        )
        return to_variant(cast), failure

    def apply(self, record: Record) -> Outcome:
        if record.type_of(self.part) is not None:
            return structs.cast(self, record, WHOLE)
        from pyspark.sql import functions as F

        current = record.part(self.part)
        if WHOLE in self.casts:
            cast, failure = self._cast(current, self.casts[WHOLE], f"the {self.part}")
            kind = kind_of(current)
            failure = F.coalesce(
                F.when(
                    kind.isin("OBJECT", "ARRAY"),
                    F.concat(F.lit(f"Cannot cast a whole {self.part} of type "), kind),
                ),
                failure,
            )
            return Outcome(
                {self.part: F.when(is_absent(current), current).otherwise(cast)}, failure
            )
        updated = current
        failures = [not_an_object(current, "cast types")]
        for name, target in self.casts.items():
            value = get_field(current, name)
            cast, failure = self._cast(value, target, f"field {name!r}")
            failures.append(failure)
            updated = F.when(is_absent(value), updated).otherwise(
                F.variant_set(updated, F.lit(field_path(name)), cast)
            )
        return Outcome(
            {self.part: F.when(is_absent(current), current).otherwise(updated)},
            F.coalesce(*failures),
        )


TARGET_TYPES: Final = ("string", "unix", "Date", "Time", "Timestamp")
PRECISIONS: Final = {
    "seconds": 1000,
    "milliseconds": 1,
    "microseconds": -1000,
    "nanoseconds": -1_000_000,
}


class TimestampConverter(PartTransform):
    """Convert a timestamp (the whole key or value, or a field) between forms."""

    @classmethod
    def config_def(cls) -> ConfigDef:
        return with_replace_null(
            ConfigDef()
            .define("target.type", Type.STRING, validator=ValidString.in_(*TARGET_TYPES),
                    importance=Importance.HIGH,
                    documentation="The desired timestamp representation: "
                    + ", ".join(TARGET_TYPES) + ".")
            .define("field", Type.STRING, default="", importance=Importance.HIGH,
                    documentation="The field holding the timestamp; empty for the whole value.")
            .define("format", Type.STRING, default="", importance=Importance.MEDIUM,
                    documentation="The datetime pattern of string timestamps, read and written.")
            .define("unix.precision", Type.STRING, default="milliseconds",
                    validator=ValidString.in_(*PRECISIONS), importance=Importance.LOW,
                    documentation="The precision of unix timestamps: seconds, milliseconds, "
                    "microseconds or nanoseconds.")
        )  # fmt: skip

    def configure(self, config: Mapping[str, Any]) -> None:
        self.target = config["target.type"]
        self.field = config["field"]
        self.format = config["format"]
        self.scale = PRECISIONS[config["unix.precision"]]
        if self.target == "string" and not self.format:
            raise ConfigError(
                "TimestampConverter requires format option to be specified when using "
                "string timestamps"
            )

    def _to_millis(self, value: Column) -> tuple[Column, Column]:
        """(epoch milliseconds, failure message) of a timestamp variant."""
        from pyspark.sql import functions as F

        kind = kind_of(value)
        number = F.try_variant_get(value, "$", "bigint")
        scale = self.scale
        unix = number * scale if scale > 0 else F.floor(number / -scale).cast("bigint")
        millis = F.when(kind.isin("TINYINT", "SMALLINT", "INT", "BIGINT", "DECIMAL"), unix)
        if self.format:
            text = F.try_variant_get(value, "$", "string")
            parsed = F.try_to_timestamp(text, F.lit(self.format)).cast("timestamp_ntz")
            millis = millis.when(
                kind == "STRING", F.timestamp_diff("MILLISECOND", epoch_ntz(), parsed)
            )
        failure = F.when(
            ~is_absent(value) & millis.isNull(),
            F.concat(
                F.lit("Cannot read a timestamp from "),
                F.to_json(value),
                F.lit(f" (format {self.format!r})" if self.format else " (no format is set)"),
            ),
        )
        return millis, failure

    def _from_millis(self, millis: Column) -> Column:
        from pyspark.sql import functions as F

        if self.target == "string":
            return to_variant(format_millis(millis, self.format))
        if self.target == "unix":
            scale = self.scale
            unix = F.floor(millis / scale).cast("bigint") if scale > 0 else millis * -scale
            return to_variant(unix)
        if self.target == "Date":
            return to_variant(millis - F.pmod(millis, F.lit(DAY_MS)))
        if self.target == "Time":
            return to_variant(F.pmod(millis, F.lit(DAY_MS)))
        return to_variant(millis)

    def apply(self, record: Record) -> Outcome:
        if record.type_of(self.part) is not None:
            return structs.convert_timestamp(self, record)
        from pyspark.sql import functions as F

        current = record.part(self.part)
        if not self.field:
            millis, failure = self._to_millis(current)
            converted = F.when(is_absent(current), current).otherwise(self._from_millis(millis))
            return Outcome({self.part: converted}, failure)
        value = get_field(current, self.field)
        millis, failure = self._to_millis(value)
        updated = F.when(is_absent(value), current).otherwise(
            F.variant_set(current, F.lit(field_path(self.field)), self._from_millis(millis))
        )
        return Outcome(
            {self.part: F.when(is_absent(current), current).otherwise(updated)},
            F.coalesce(not_an_object(current, "converting timestamp formats"), failure),
        )


class CastKey(Cast):
    class_name = f"{CONNECT_TRANSFORMS}.Cast$Key"
    part = KEY


class CastValue(Cast):
    class_name = f"{CONNECT_TRANSFORMS}.Cast$Value"
    part = VALUE


class TimestampConverterKey(TimestampConverter):
    class_name = f"{CONNECT_TRANSFORMS}.TimestampConverter$Key"
    part = KEY


class TimestampConverterValue(TimestampConverter):
    class_name = f"{CONNECT_TRANSFORMS}.TimestampConverter$Value"
    part = VALUE
