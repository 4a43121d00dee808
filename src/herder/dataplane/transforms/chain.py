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
    steps, problems = _build(settings)
    parsed = _parsed(steps)
    for part in (KEY, VALUE):
        try:
            converter = Converter.from_settings(part, settings)
            if part in parsed:
                converter.check_parsed()
        except (ConfigError, NotSupported) as exc:
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
        for part in self.parsed:
            self.converters[part].check_parsed()
        #: whether a record can fail in the chain, and whether one's topic can change in it
        #: (known exactly once it has been applied: what a transform changes is its outcome)
        self.may_fail = True
        self.routes = True

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

        df = df.withColumns({ORIGIN_TOPIC: F.col("topic"), ERROR: F.lit(None).cast(ERROR_DDL)})
        may_fail = False
        for part in sorted(self.parsed):
            converter = self.converters[part]
            variant, failure = converter.parse(F.col(RAW_COLUMNS[part]))
            df = df.withColumn(PART_COLUMNS[part], variant)
            if failure is not None:
                may_fail = True
                df = df.withColumn(ERROR, _failed(failure, converter.stage, converter.kind))
        record = Record(
            topic=F.col("topic"),
            partition=F.col("partition"),
            offset=F.col("offset") if sink else F.lit(None).cast("long"),
            timestamp=F.col("timestamp"),
            headers=F.col("headers"),
            sink=sink,
            parsed=self.parsed,
        )
        routes = False
        for step in self.steps:
            outcome = step.transform.apply(record)
            df = self._step(df, step, record, outcome)
            may_fail = may_fail or outcome.failure is not None
            routes = routes or "topic" in outcome.updates
        self.may_fail, self.routes = may_fail, routes
        return df

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
            changes[column] = F.when(succeeds, expr).otherwise(F.col(column))
        if outcome.keep is not None:
            df = df.where(~F.coalesce(succeeds & ~outcome.keep, F.lit(False)))
        if changes:
            df = df.withColumns(changes)
        return df

    def output(self, part: str) -> Column:
        """The bytes of ``part`` after the chain: serialized again if it was parsed."""
        from pyspark.sql import functions as F

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
