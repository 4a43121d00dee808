"""Connect's field transforms on typed keys and values: Spark expressions on structs.

With a schema, Connect's transforms change a record's schema along with its value. Here
the schema is the part's Spark type, known before a row is read (the topic holds the
part as a native column, :mod:`herder.dataplane.typed`), so each transform gives its
new type with its expression (:attr:`~herder.connect.transforms.Outcome.types`), and a
struct's fields are changed in place: ``withField``, ``getField``, a new ``struct``,
``try_cast``. A field a transform needs that the type lacks, or a part that is not a
struct where one is needed, fails each record with Connect's message (so
``errors.tolerance`` decides), which keeps its part as it came. A null key or value (a
tombstone) stays null.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from herder.connect.transforms import KEY, VALUE, Outcome, Record
from herder.dataplane.schemas import spark_type
from herder.dataplane.transforms.millis import DAY_MS, epoch_ntz, format_millis

if TYPE_CHECKING:
    from pyspark.sql import Column
    from pyspark.sql.types import DataType, StructType


# What each typed transform reads of its transform's settings (the transforms
# themselves, in :mod:`.fields` and :mod:`.cast`, call in here)


class _OnPart(Protocol):
    @property
    def part(self) -> str: ...


class _InsertsFields(_OnPart, Protocol):
    @property
    def fields(self) -> Mapping[str, str]: ...
    @property
    def static_value(self) -> str | None: ...


class _ReplacesFields(_OnPart, Protocol):
    @property
    def include(self) -> Sequence[str]: ...
    @property
    def exclude(self) -> Sequence[str]: ...
    @property
    def renames(self) -> Mapping[str, str]: ...


class _MasksFields(_OnPart, Protocol):
    @property
    def fields(self) -> Sequence[str]: ...
    @property
    def replacement(self) -> str | None: ...


class _NamesAField(_OnPart, Protocol):
    @property
    def field(self) -> str: ...


class _CopiesFields(Protocol):
    @property
    def fields(self) -> Sequence[str]: ...


class _Casts(_OnPart, Protocol):
    @property
    def casts(self) -> Mapping[str, str]: ...


class _ConvertsTimestamps(_NamesAField, Protocol):
    @property
    def target(self) -> str: ...
    @property
    def format(self) -> str: ...
    @property
    def scale(self) -> int: ...


def _fails(current: Column, message: str) -> Outcome:
    """Every record with a part fails with ``message``; the part is left as it is."""
    from pyspark.sql import functions as F

    return Outcome({}, F.when(current.isNotNull(), F.lit(message)))


def _not_a_struct(current: Column, dtype: DataType, purpose: str) -> Outcome:
    return _fails(
        current, f"Only Struct objects supported for [{purpose}], found: {dtype.simpleString()}"
    )


def _struct(dtype: DataType | None) -> StructType | None:
    from pyspark.sql import types as T

    return dtype if isinstance(dtype, T.StructType) else None


def _with_field(dtype: StructType, name: str, field_type: DataType) -> StructType:
    """``dtype`` after ``withField(name, …)`` of a ``field_type`` value: replaced in
    place, or added last."""
    from pyspark.sql import types as T

    fields = [
        T.StructField(f.name, field_type, True) if f.name == name else f for f in dtype.fields
    ]
    if name not in dtype.fieldNames():
        fields.append(T.StructField(name, field_type, True))
    return T.StructType(fields)


def insert_field(transform: _InsertsFields, record: Record) -> Outcome:
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    part = transform.part
    current, dtype = record.part(part), record.type_of(part)
    struct = _struct(dtype)
    if struct is None:
        return _not_a_struct(current, dtype or T.NullType(), "field insertion")
    if "offset" in transform.fields and not record.sink:
        return _fails(
            current, "Only SinkRecord supported for [field insertion], found: a source record"
        )
    values: dict[str, tuple[Column, DataType]] = {
        "topic": (record.topic, T.StringType()),
        "partition": (record.partition, T.IntegerType()),
        "offset": (record.offset, T.LongType()),
        "timestamp": (record.timestamp, T.TimestampType()),
        "static": (F.lit(transform.static_value).cast("string"), T.StringType()),
    }
    updated, new_type = current, struct
    for what, name in transform.fields.items():
        value, value_type = values[what]
        updated = updated.withField(name, value)
        new_type = _with_field(new_type, name, value_type)
    return Outcome({part: updated}, types={part: new_type})


def replace_field(transform: _ReplacesFields, record: Record) -> Outcome:
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    part = transform.part
    current, dtype = record.part(part), record.type_of(part)
    struct = _struct(dtype)
    if struct is None:
        return _not_a_struct(current, dtype or T.NullType(), "field replacement")
    kept = [
        f
        for f in struct.fields
        if f.name not in transform.exclude
        and (not transform.include or f.name in transform.include)
    ]
    renames = transform.renames
    new_type = T.StructType(
        [T.StructField(renames.get(f.name, f.name), f.dataType, f.nullable) for f in kept]
    )
    rebuilt = F.struct(*[current[f.name].alias(renames.get(f.name, f.name)) for f in kept])
    updated = F.when(current.isNull(), F.lit(None).cast(new_type)).otherwise(rebuilt)
    return Outcome({part: updated}, types={part: new_type})


def mask_field(transform: _MasksFields, record: Record) -> Outcome:
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    part = transform.part
    current, dtype = record.part(part), record.type_of(part)
    struct = _struct(dtype)
    if struct is None:
        return _not_a_struct(current, dtype or T.NullType(), "masking")
    types = {f.name: f.dataType for f in struct.fields}
    updated = current
    for name in transform.fields:
        if name not in types:
            return _fails(current, f"{name} is not a valid field name")
        field_type = types[name]
        masked = _masked(field_type, transform.replacement)
        if masked is None:
            how = "with custom replacement" if transform.replacement is not None else ""
            return _fails(
                current,
                f"Cannot mask value of type {field_type.simpleString()} {how}".rstrip(),
            )
        value = current[name]
        updated = updated.withField(name, F.when(value.isNull(), value).otherwise(masked))
    return Outcome({part: updated})


def _masked(dtype: DataType, replacement: str | None) -> Column | None:
    """The value a field of ``dtype`` is masked with (Connect's), or None if it cannot
    be masked so."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    numeric = isinstance(dtype, T.NumericType)
    if replacement is not None:
        if isinstance(dtype, T.StringType):
            return F.lit(replacement)
        if numeric and _is_number(replacement, dtype):
            return F.lit(replacement).cast(dtype)
        return None
    if isinstance(dtype, T.StringType):
        return F.lit("")
    if numeric:
        return F.lit(0).cast(dtype)
    if isinstance(dtype, T.BooleanType):
        return F.lit(False)
    if isinstance(dtype, T.DateType | T.TimestampType | T.TimestampNTZType):
        return F.lit(0).cast("timestamp").cast(dtype)
    if isinstance(dtype, T.ArrayType):
        return F.array().cast(dtype)
    if isinstance(dtype, T.MapType):
        return F.create_map().cast(dtype)
    return None


def _is_number(text: str, dtype: DataType) -> bool:
    """Whether ``text`` reads as a number of the numeric type ``dtype``."""
    from decimal import Decimal, InvalidOperation

    from pyspark.sql import types as T

    try:
        if isinstance(dtype, T.IntegralType):
            int(text)
        elif isinstance(dtype, T.DecimalType):
            Decimal(text)
        else:
            float(text)
    except (ValueError, InvalidOperation):
        return False
    return True


def extract_field(transform: _NamesAField, record: Record) -> Outcome:
    from pyspark.sql import types as T

    part = transform.part
    current, dtype = record.part(part), record.type_of(part)
    struct = _struct(dtype)
    if struct is None:
        return _not_a_struct(current, dtype or T.NullType(), "field extraction")
    if transform.field not in struct.fieldNames():
        return _fails(current, f"Unknown field: {transform.field}")
    field_type = struct[transform.field].dataType
    return Outcome({part: current[transform.field]}, types={part: field_type})


def hoist_field(transform: _NamesAField, record: Record) -> Outcome:
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    part = transform.part
    current, dtype = record.part(part), record.type_of(part)
    assert dtype is not None
    new_type = T.StructType([T.StructField(transform.field, dtype, True)])
    return Outcome({part: F.struct(current.alias(transform.field))}, types={part: new_type})


def value_to_key(transform: _CopiesFields, record: Record) -> Outcome:
    """The key becomes a struct of the value's fields. A tombstone keeps its key if it
    has the new key's type (and has none otherwise: a column has one type)."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    value, dtype = record.part(VALUE), record.type_of(VALUE)
    struct = _struct(dtype)
    if struct is None:
        return _not_a_struct(value, dtype or T.NullType(), "copying fields from value to key")
    missing = [f for f in transform.fields if f not in struct.fieldNames()]
    if missing:
        return _fails(value, f"Field does not exist: {missing[0]}")
    new_type = T.StructType([struct[f] for f in transform.fields])
    key = F.struct(*[value[f].alias(f) for f in transform.fields])
    old = record.part(KEY) if record.type_of(KEY) == new_type else F.lit(None).cast(new_type)
    return Outcome({KEY: F.when(value.isNull(), old).otherwise(key)}, types={KEY: new_type})


def cast(transform: _Casts, record: Record, whole: str) -> Outcome:
    """Cast$Key / Cast$Value: ``whole`` is the spec's key for a cast of the whole part."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    part = transform.part
    current, dtype = record.part(part), record.type_of(part)
    assert dtype is not None
    nested = (T.StructType, T.ArrayType, T.MapType)
    if whole in transform.casts:
        target = transform.casts[whole]
        if isinstance(dtype, nested):
            return _fails(current, f"Cannot cast a whole {part} of type {dtype.simpleString()}")
        new_type = spark_type({"type": target})
        converted, failure = _try_cast(current, new_type, f"the {part}", target)
        return Outcome({part: converted}, failure, types={part: new_type})
    struct = _struct(dtype)
    if struct is None:
        return _not_a_struct(current, dtype, "cast types")
    updated, new_type, failures = current, struct, []
    for name, target in transform.casts.items():
        if name not in struct.fieldNames():
            continue  # as Connect's: a spec's field the schema lacks is left alone
        field_type = struct[name].dataType
        if isinstance(field_type, nested):
            return _fails(
                current,
                f"Cast transformation does not support casting to/from {field_type.simpleString()}",
            )
        target_type = spark_type({"type": target})
        converted, failed = _try_cast(current[name], target_type, f"field {name!r}", target)
        failures.append(failed)
        updated = updated.withField(name, converted)
        new_type = _with_field(new_type, name, target_type)
    return Outcome(
        {part: updated}, F.coalesce(*failures) if failures else None, types={part: new_type}
    )


def _try_cast(value: Column, target: DataType, what: str, kind: str) -> tuple[Column, Column]:
    from pyspark.sql import functions as F

    converted = value.try_cast(target)
    failure = F.when(
        value.isNotNull() & converted.isNull(),
        F.concat(F.lit(f"Cannot cast {what} "), value.cast("string"), F.lit(f" to {kind}")),
    )
    return converted, failure


def convert_timestamp(transform: _ConvertsTimestamps, record: Record) -> Outcome:
    """TimestampConverter on a typed part: ``Timestamp`` is Spark's timestamp, ``Date``
    its date, ``Time`` milliseconds since midnight (an int, Connect's Time), ``unix``
    a long, ``string`` text in ``format``."""

    part = transform.part
    current, dtype = record.part(part), record.type_of(part)
    assert dtype is not None
    if not transform.field:
        millis, failure = _millis(transform, current, dtype)
        if millis is None:
            return _fails(current, f"Cannot read a timestamp from a {dtype.simpleString()}")
        converted, new_type = _from_millis(transform, millis)
        return Outcome({part: converted}, failure, types={part: new_type})
    struct = _struct(dtype)
    if struct is None:
        return _not_a_struct(current, dtype, "converting timestamp formats")
    if transform.field not in struct.fieldNames():
        return _fails(current, f"Unknown field: {transform.field}")
    value = current[transform.field]
    millis, failure = _millis(transform, value, struct[transform.field].dataType)
    if millis is None:
        field_type = struct[transform.field].dataType.simpleString()
        return _fails(current, f"Cannot read a timestamp from a {field_type}")
    converted, new_type = _from_millis(transform, millis)
    updated = current.withField(transform.field, converted)
    return Outcome(
        {part: updated}, failure, types={part: _with_field(struct, transform.field, new_type)}
    )


def _millis(
    transform: _ConvertsTimestamps, value: Column, dtype: DataType
) -> tuple[Column | None, Column | None]:
    """(epoch milliseconds of ``value``, failure message), or (None, None) for a type
    that holds no timestamp."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    if isinstance(dtype, T.TimestampType):
        return F.unix_millis(value), None
    if isinstance(dtype, T.TimestampNTZType):
        return F.timestamp_diff("MILLISECOND", epoch_ntz(), value), None
    if isinstance(dtype, T.DateType):
        return F.unix_date(value).cast("long") * DAY_MS, None
    if isinstance(dtype, T.IntegralType):
        scale = transform.scale
        number = value.cast("long")
        return (number * scale if scale > 0 else F.floor(number / -scale).cast("long")), None
    if isinstance(dtype, T.StringType) and transform.format:
        parsed = F.try_to_timestamp(value, F.lit(transform.format)).cast("timestamp_ntz")
        millis = F.timestamp_diff("MILLISECOND", epoch_ntz(), parsed)
        failure = F.when(
            value.isNotNull() & millis.isNull(),
            F.concat(
                F.lit("Cannot read a timestamp from "),
                value,
                F.lit(f" (format {transform.format!r})"),
            ),
        )
        return millis, failure
    return None, None


def _from_millis(transform: _ConvertsTimestamps, millis: Column) -> tuple[Column, DataType]:
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    target = transform.target
    if target == "string":
        return format_millis(millis, transform.format), T.StringType()
    if target == "unix":
        scale = transform.scale
        unix = F.floor(millis / scale).cast("long") if scale > 0 else millis * -scale
        return unix, T.LongType()
    if target == "Date":
        return F.date_from_unix_date(F.floor(millis / DAY_MS).cast("int")), T.DateType()
    if target == "Time":
        return F.pmod(millis, F.lit(DAY_MS)).cast("int"), T.IntegerType()
    return F.timestamp_millis(millis), T.TimestampType()
