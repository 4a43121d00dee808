"""A connector's chain of transforms: Connect's config syntax, Spark expressions.

The config names the chain and its predicates as Connect's does::

    transforms=route,mask
    transforms.route.type=org.apache.kafka.connect.transforms.RegexRouter
    transforms.route.regex=(.*)-raw
    transforms.route.replacement=$1
    transforms.mask.type=MaskField$Value
    transforms.mask.fields=ssn
    transforms.mask.predicate=isOrders
    transforms.mask.negate=false
    predicates=isOrders
    predicates.isOrders.type=TopicNameMatches
    predicates.isOrders.pattern=orders.*

``type`` is Connect's class name, or its short form (``MaskField$Value``), or the
dotted name of a :class:`~herder.connect.Transformation` (:class:`~herder.connect.Predicate`)
subclass: whatever :func:`herder.connect.transforms.transformation_class` resolves.

:meth:`TransformChain.apply` turns a DataFrame of records into one with the chain's
result and an ``_error`` column: null for a record that went through, the failure
(stage, class, exception, message) for one that did not — that record is otherwise
left as it was when it failed, and later transforms skip it.

A typed key or value (a native column of the topic, :mod:`herder.dataplane.typed`) is
given as it is to transforms that handle typed parts (Connect's transforms with a
schema: struct fields changed with ``withField``, ``dropFields``, casts …), and stays
typed after the chain; one that a transform without typed support reads is made a
variant first, and leaves the chain as bytes (its converter's). A transform that
changes a typed part's type cannot be gated by a predicate: a column has one type, so
records it skips could not keep theirs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from herder.config import ConfigDef, Importance, InvalidConfiguration, Type
from herder.connect.transforms import (
    KEY,
    PART_COLUMNS,
    RAW_COLUMNS,
    VALUE,
    Outcome,
    Predicate,
    Record,
    Transformation,
    predicate_class,
    transformation_class,
)
from herder.dataplane.errors import STAGE_TRANSFORMATION
from herder.dataplane.transforms.converters import Converter
from herder.errors import ConfigError, NotSupported

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame
    from pyspark.sql.types import DataType

TRANSFORMS: Final = "transforms"
PREDICATES: Final = "predicates"
#: the working column holding a record's topic before the chain routed it
ORIGIN_TOPIC: Final = "_origin_topic"
ERROR: Final = "_error"
ERROR_DDL: Final = "struct<stage:string,class:string,exception:string,message:string>"
#: the exception class a failing record reports (``__connect.errors.exception.class.name``)
DATA_EXCEPTION: Final = "herder.dataplane.errors.RecordError"


def _aliases(settings: Mapping[str, Any], key: str) -> list[str]:
    raw = settings.get(key) or ""
    return [a.strip() for a in str(raw).split(",") if a.strip()]


def _scoped(settings: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    return {k[len(prefix) :]: v for k, v in settings.items() if k.startswith(prefix)}


_STEP_DEF: Final = (
    ConfigDef()
    .define("predicate", Type.STRING, default="", importance=Importance.MEDIUM,
            documentation="The alias of a predicate deciding which records this applies to.")
    .define("negate", Type.BOOLEAN, default=False, importance=Importance.MEDIUM,
            documentation="Apply where the predicate does not hold instead.")
)  # fmt: skip


@dataclass(frozen=True)
class Step:
    """One transform of the chain, with the predicate that gates it."""

    alias: str
    transform: Transformation
    predicate: Predicate | None = None
    negate: bool = False


def _configured(klass: type[Any], config: Mapping[str, Any], prefix: str) -> Any:
    instance = klass()
    try:
        values = klass.config_def().parse(config)
    except InvalidConfiguration as exc:
        raise InvalidConfiguration([f"{prefix}: {p}" for p in exc.problems]) from None
    try:
        instance.configure(values)
    except (ConfigError, NotSupported) as exc:
        raise InvalidConfiguration([f"{prefix}: {exc}"]) from None
    return instance


def _missing(key: str) -> str:
    return f'Missing required configuration "{key}" which has no default value.'


def _not_found(key: str, kind: object) -> str:
    return f"Invalid value {kind} for configuration {key}: Class {kind} could not be found."


def _build(settings: Mapping[str, Any]) -> tuple[list[Step], list[str]]:
    """The steps ``settings`` configure, and every problem found on the way."""
    problems: list[str] = []
    built: dict[str, Predicate] = {}
    for alias in _aliases(settings, PREDICATES):
        prefix = f"{PREDICATES}.{alias}."
        kind = settings.get(prefix + "type")
        if not kind:
            problems.append(_missing(prefix + "type"))
            continue
        klass = predicate_class(str(kind).strip())
        if klass is None:
            problems.append(_not_found(prefix + "type", kind))
            continue
        try:
            built[alias] = _configured(klass, _scoped(settings, prefix), prefix.rstrip("."))
        except InvalidConfiguration as exc:
            problems.extend(exc.problems)
    steps: list[Step] = []
    aliases = _aliases(settings, TRANSFORMS)
    if len(set(aliases)) != len(aliases):
        problems.append(
            f"Invalid value {settings.get(TRANSFORMS)} for configuration transforms: "
            "Duplicate alias provided."
        )
    for alias in aliases:
        prefix = f"{TRANSFORMS}.{alias}."
        kind = settings.get(prefix + "type")
        if not kind:
            problems.append(_missing(prefix + "type"))
            continue
        transform_kind = transformation_class(str(kind).strip())
        if transform_kind is None:
            problems.append(_not_found(prefix + "type", kind))
            continue
        scoped = _scoped(settings, prefix)
        try:
            gate = _STEP_DEF.parse(scoped)
            transform = _configured(transform_kind, scoped, prefix.rstrip("."))
        except InvalidConfiguration as exc:
            problems.extend(exc.problems)
            continue
        predicate = None
        if gate["predicate"]:
            predicate = built.get(gate["predicate"])
            if predicate is None:
                problems.append(
                    f"Invalid value {gate['predicate']} for configuration {prefix}predicate: "
                    "it names no predicate defined under predicates"
                )
                continue
        elif gate["negate"]:
            problems.append(f"{prefix}negate needs {prefix}predicate")
        steps.append(Step(alias, transform, predicate, gate["negate"]))
    return steps, problems


def validate_transforms(settings: Mapping[str, Any]) -> list[str]:
    """Every problem with the transforms, predicates and converters of a connector config."""
    _steps, problems = _build(settings)
    for part in (KEY, VALUE):
        try:
            Converter.from_settings(part, settings)
        except ConfigError as exc:
            problems.append(str(exc))
    return problems


def _parsed(steps: Sequence[Step]) -> frozenset[str]:
    """The parts of a record some step of a chain looks inside."""
    parsed: set[str] = set()
    for step in steps:
        parsed |= step.transform.reads
        if step.predicate is not None:
            parsed |= step.predicate.reads
    return frozenset(parsed)


class TransformChain:
    """The transforms of one connector, applied to DataFrames of its records."""

    def __init__(self, steps: Sequence[Step], key: Converter, value: Converter) -> None:
        self.steps = list(steps)
        self.converters = {KEY: key, VALUE: value}
        self.parsed = _parsed(self.steps)
        #: whether a record can fail in the chain, and whether one's topic can change in it
        #: (known exactly once it has been applied: what a transform changes is its outcome)
        self.may_fail = True
        self.routes = True
        #: the typed parts after the chain, by part, with their Spark types (known once
        #: it has been applied)
        self.types: dict[str, DataType] = {}

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any]) -> TransformChain:
        """The chain a connector config describes; InvalidConfiguration names every problem."""
        steps, problems = _build(settings)
        if problems:
            raise InvalidConfiguration(problems)
        return cls(
            steps, Converter.from_settings(KEY, settings), Converter.from_settings(VALUE, settings)
        )

    def __bool__(self) -> bool:
        return bool(self.steps)

    def apply(self, df: DataFrame, *, sink: bool) -> DataFrame:
        """``df`` (columns topic, partition, timestamp, key, value, headers, and offset for a
        sink) with the chain applied, its parsed parts in ``_key`` / ``_value`` and the
        failure of each record that failed in ``_error``."""
        from pyspark.sql import functions as F
        from pyspark.sql import types as T

        df = df.withColumns({ORIGIN_TOPIC: F.col("topic"), ERROR: F.lit(None).cast(ERROR_DDL)})
        may_fail = False
        raw_types = {f.name: f.dataType for f in df.schema.fields} if self.parsed else {}
        types: dict[str, DataType] = {}
        for part in sorted(self.parsed):
            raw = F.col(RAW_COLUMNS[part])
            raw_type = raw_types[RAW_COLUMNS[part]]
            if not isinstance(raw_type, T.BinaryType):
                if self._typed_readers(part, 0):
                    types[part] = raw_type
                    df = df.withColumn(PART_COLUMNS[part], raw)
                else:
                    df = df.withColumn(PART_COLUMNS[part], as_variant(raw, raw_type))
                continue
            converter = self.converters[part]
            envelopes = converter.parse_typed(df, RAW_COLUMNS[part]) if converter.schemas else None
            failure: Column | None
            if envelopes is not None:
                parsed, parsed_type, failure = envelopes
                if self._typed_readers(part, 0):
                    types[part] = parsed_type
                else:
                    parsed = as_variant(parsed, parsed_type)
            else:
                parsed, failure = converter.parse(raw)
            df = df.withColumn(PART_COLUMNS[part], parsed)
            if failure is not None:
                may_fail = True
                df = df.withColumn(ERROR, _failed(failure, converter.stage, converter.kind))
        routes = False
        for index, step in enumerate(self.steps):
            record = Record(
                topic=F.col("topic"),
                partition=F.col("partition"),
                offset=F.col("offset") if sink else F.lit(None).cast("long"),
                timestamp=F.col("timestamp"),
                headers=F.col("headers"),
                sink=sink,
                parsed=self.parsed,
                types=dict(types),
            )
            outcome = step.transform.apply(record)
            df = self._step(df, step, record, outcome)
            types.update(outcome.types)
            for part, dtype in outcome.types.items():
                if not self._typed_readers(part, index + 1):
                    # a later transform reads it as a variant
                    df = df.withColumn(
                        PART_COLUMNS[part], as_variant(F.col(PART_COLUMNS[part]), dtype)
                    )
                    del types[part]
            may_fail = may_fail or outcome.failure is not None
            routes = routes or "topic" in outcome.updates
        self.may_fail, self.routes, self.types = may_fail, routes, types
        return df

    def _typed_readers(self, part: str, first: int) -> bool:
        """Whether every step from ``first`` on that reads ``part`` handles typed parts
        (predicates see variants)."""
        for step in self.steps[first:]:
            if part in step.transform.reads and not step.transform.typed:
                return False
            if step.predicate is not None and part in step.predicate.reads:
                return False
        return True

    @staticmethod
    def _step(df: DataFrame, step: Step, record: Record, outcome: Outcome) -> DataFrame:
        """``df`` after ``step``, whose transform's effect is ``outcome``."""
        from pyspark.sql import functions as F

        applies: Column = F.col(ERROR).isNull()
        if step.predicate is not None:
            holds = F.coalesce(step.predicate.test(record), F.lit(False))
            applies = applies & (~holds if step.negate else holds)
        changes: dict[str, Column] = {}
        succeeds = applies
        if outcome.failure is not None:
            failure = F.when(applies, outcome.failure)
            succeeds = applies & failure.isNull()
            changes[ERROR] = F.coalesce(
                F.col(ERROR),
                F.when(
                    failure.isNotNull(),
                    F.struct(
                        F.lit(STAGE_TRANSFORMATION).alias("stage"),
                        F.lit(type(step.transform).class_name).alias("class"),
                        F.lit(DATA_EXCEPTION).alias("exception"),
                        F.concat(F.lit(f"{step.alias}: "), failure).alias("message"),
                    ),
                ),
            )
        for name, expr in outcome.updates.items():
            column = PART_COLUMNS.get(name, name)
            retyped = outcome.types.get(name)
            if retyped is not None and retyped != record.type_of(name):
                if step.predicate is not None:
                    raise NotSupported(
                        f"transforms.{step.alias}: it changes the type of typed {name}s"
                        f" (to {retyped.simpleString()}), so it cannot apply to some records"
                        f" only; drop transforms.{step.alias}.predicate"
                    )
                # failed records, which keep the part they came with, aside
                changes[column] = F.when(succeeds, expr)
                continue
            changes[column] = F.when(succeeds, expr).otherwise(F.col(column))
        if outcome.keep is not None:
            df = df.where(~F.coalesce(succeeds & ~outcome.keep, F.lit(False)))
        if changes:
            df = df.withColumns(changes)
        return df

    def output(self, part: str) -> Column:
        """``part`` after the chain: as it is if typed, else its bytes, serialized again
        if it was parsed."""
        from pyspark.sql import functions as F

        if part in self.types:
            return F.col(PART_COLUMNS[part])
        if part in self.parsed:
            return self.converters[part].serialize(F.col(PART_COLUMNS[part]))
        return F.col(RAW_COLUMNS[part])


def _failed(failure: Column, stage: str, executing: str) -> Column:
    from pyspark.sql import functions as F

    return F.coalesce(
        F.col(ERROR),
        F.when(
            failure.isNotNull(),
            F.struct(
                F.lit(stage).alias("stage"),
                F.lit(executing).alias("class"),
                F.lit(DATA_EXCEPTION).alias("exception"),
                failure.alias("message"),
            ),
        ),
    )


def as_variant(typed: Column, dtype: DataType) -> Column:
    """A typed part as a variant: a struct or map an object, an array an array."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    if isinstance(dtype, T.StructType | T.MapType | T.ArrayType):
        return F.to_variant_object(typed)
    return typed.cast("variant")
