"""Where a task's records meet its transforms and its error handling.

A source task's batch goes through :meth:`RecordPipeline.before_write` between poll and
write, a sink task's DataFrame through :meth:`RecordPipeline.before_put` between read
and put; with no ``transforms`` configured both hand the data back untouched and cost
nothing.

With transforms, one Spark plan applies the chain and parts good records from failed
ones (see :mod:`herder.dataplane.errors` for what ``errors.*`` does with the latter).
Nothing is collected but the failures that are logged or that fail the task, and only
when ``errors.tolerance=none`` or ``errors.log.enable`` asks for them; the result is
persisted while it is read more than once.

A source's dead letters are written in the same batch as its good records, so they
commit atomically with its offsets: exactly once. A sink's are written to their topic
before ``put`` (at least once, as the sink's records are), by a writer holding a
fencing epoch of its own.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import pyarrow as pa

from herder.connect.records import SINK_COLUMNS, SourceBatch, SourceRecord
from herder.connect.transforms import KEY, VALUE
from herder.coordinator.apis import fencing_op
from herder.coordinator.client import CoordinatorClient
from herder.dataplane.errors import (
    DLQ_TOPIC,
    HEADER_CLASS,
    HEADER_CONNECTOR,
    HEADER_EXCEPTION,
    HEADER_MESSAGE,
    HEADER_OFFSET,
    HEADER_PARTITION,
    HEADER_STAGE,
    HEADER_TASK,
    HEADER_TOPIC,
    LOGGED_PER_BATCH,
    ErrorHandling,
    Failure,
    error_config_def,
    report,
    task_failure,
)
from herder.dataplane.records import HEADER_TYPE, HEADERS_DDL
from herder.dataplane.spark import SparkRuntime
from herder.dataplane.topics import Topics, TxnRefused
from herder.dataplane.transforms.chain import (
    ERROR,
    ORIGIN_TOPIC,
    TransformChain,
    validate_transforms,
)
from herder.dataplane.typed import BYTES_TYPES
from herder.dataplane.writer import SegmentWriter
from herder.errors import Fenced, NotSupported, RetriableError
from herder.runtime.core.protocol import ConnectorTaskId
from herder.runtime.task_metrics import TaskMetrics

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

log = logging.getLogger(__name__)

T = TypeVar("T")

#: the columns of a source record before the chain: SOURCE_BATCH_COLUMNS, all present
_SOURCE_TABLE = pa.schema(
    [
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("headers", HEADER_TYPE),
        ("timestamp", pa.int64()),
    ]
)


def _bytes(value: object) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    raise TypeError(f"keys, values and headers are bytes, str or None, not {type(value).__name__}")


def records_table(records: Sequence[SourceRecord]) -> pa.Table:
    """SourceRecords as a table of their own partition (if any), key, value, headers."""
    return pa.table(
        [
            pa.array([r.topic for r in records], pa.string()),
            pa.array([r.partition for r in records], pa.int32()),
            pa.array([_bytes(r.key) for r in records], pa.binary()),
            pa.array([_bytes(r.value) for r in records], pa.binary()),
            pa.array([[(str(k), _bytes(v)) for k, v in r.headers] for r in records], HEADER_TYPE),
            pa.array([r.timestamp_ms for r in records], pa.int64()),
        ],
        schema=_SOURCE_TABLE,
    )


def validate_record_handling(config: Mapping[str, Any]) -> list[str]:
    """Every problem with a connector config's transforms, predicates, converters and
    ``errors.*`` keys, each naming its key (for validation before a config is stored)."""
    problems = validate_transforms(config)
    for name, value in error_config_def().validate(config).items():
        problems += [f"{name}: {error}" for error in value.errors]
    return problems


class RecordPipeline:
    """The transforms and error handling of one task."""

    def __init__(
        self,
        settings: Mapping[str, Any],
        *,
        connector: str,
        task: int,
        topics: Topics,
        spark: SparkRuntime,
        coordinator: CoordinatorClient,
        pool: str | None = None,
    ) -> None:
        self.chain = TransformChain.from_settings(settings)
        self.errors = ErrorHandling.from_settings(settings)
        self.connector = connector
        self.task = task
        self.name = f"{connector}-{task}"
        self.topics = topics
        self.spark = spark
        self.coordinator = coordinator
        self.pool = pool if pool is not None else self.name
        self._cached: list[DataFrame] = []
        self._dead_letter_writer: tuple[SegmentWriter, list[Any]] | None = None
        #: where failed records, retries and dead letters are counted (the task's metrics)
        self.metrics = TaskMetrics(ConnectorTaskId(connector, task), "")
        #: records of the latest batch that failed and were skipped or sent to the DLQ
        self.failed_in_last_batch = 0

    # -- retries ------------------------------------------------------------------------

    async def poll(self, poll: Callable[[], Awaitable[T]]) -> T | None:
        """``await poll()`` (the task's poll on its thread), retried per
        ``errors.retry.*`` on RetriableError.

        Once retries are spent the failure fails the task, or with
        ``errors.tolerance=all`` this poll counts as empty.
        """
        try:
            return await self.errors.retry(
                poll, f"poll of source task {self.name}", lambda: self.metrics.retried()
            )
        except RetriableError as exc:
            if not self.errors.tolerate_all:
                raise
            log.warning("source task %s: poll failed, skipped: %s", self.name, exc)
            return None

    # -- sources ------------------------------------------------------------------------

    async def before_write(
        self, batch: list[SourceRecord] | SourceBatch
    ) -> tuple[list[SourceRecord] | DataFrame, str | None]:
        """What to stage for a polled batch, and its one topic if known (else None)."""
        if isinstance(batch, SourceBatch):
            data: list[SourceRecord] | DataFrame = batch.data
            topic = batch.topic
        else:
            data, topic = batch, None
        self.failed_in_last_batch = 0
        if not self.chain:
            return data, topic
        self._release()
        now = self.topics.clock()
        frame = await self.spark.run(self._source_job, data, topic, now, pool=self.pool)
        if self.chain.routes or self.errors.dead_letters:
            return frame, None
        if topic is None and isinstance(batch, list):
            names = {r.topic for r in batch}
            topic = names.pop() if len(names) == 1 else None
        return frame, topic

    def _source_job(
        self, data: list[SourceRecord] | DataFrame, topic: str | None, now_ms: int
    ) -> DataFrame:
        from pyspark.sql import functions as F

        if isinstance(data, list):
            df = self.spark.session.createDataFrame(records_table(data))
        else:
            df = _source_columns(data, topic)
        df = df.withColumn(
            "timestamp",
            F.coalesce(F.timestamp_millis(F.col("timestamp")), F.timestamp_millis(F.lit(now_ms)))
            if isinstance(data, list)
            else F.coalesce(F.col("timestamp"), F.timestamp_millis(F.lit(now_ms))),
        )
        good, dead = self._split(self.chain.apply(df, sink=False), sink=False)
        out = good.select(
            "topic",
            "partition",
            self.chain.output(KEY).alias("key"),
            self.chain.output(VALUE).alias("value"),
            "headers",
            "timestamp",
        )
        if dead is None:
            return out
        for part in (KEY, VALUE):
            if out.schema[part].dataType != dead.schema[part].dataType:
                raise NotSupported(
                    f"task {self.name}: the transforms change the type of typed {part}s, and"
                    " a source's dead letters are written in the batch of its records, with"
                    f" one type: set {DLQ_TOPIC} empty, or leave the type alone"
                )
        return out.unionByName(
            dead.select(
                F.lit(self.errors.dead_letter_topic).alias("topic"),
                F.lit(None).cast("int").alias("partition"),
                "key",
                "value",
                "headers",
                "timestamp",
            )
        )

    # -- sinks --------------------------------------------------------------------------

    async def before_put(self, df: DataFrame) -> DataFrame:
        """The records to ``put``: transformed, without the failed ones (which are handled)."""
        self.failed_in_last_batch = 0
        if not self.chain:
            return df
        self._release()
        good, dead = await self.spark.run(self._sink_job, df, pool=self.pool)
        if dead is not None:
            try:
                written = await self.errors.retry(
                    lambda: self._write_dead_letters(dead),
                    f"dead letters of task {self.name}",
                    lambda: self.metrics.retried(),
                )
            except Exception:
                self.metrics.dead_letters_failed()
                raise
            if written:
                log.info(
                    "sink task %s: %d failed records written to %s",
                    self.name,
                    written,
                    self.errors.dead_letter_topic,
                )
        return good

    async def as_bytes(self, df: DataFrame, topic: str) -> DataFrame:
        """``df`` with typed keys and values serialised by the connector's converters,
        for a sink that takes bytes (see :attr:`~herder.connect.SinkTask.typed_records`)."""
        return await self.spark.run(self._bytes_job, df, topic, pool=self.pool)

    def _bytes_job(self, df: DataFrame, topic: str) -> DataFrame:
        from pyspark.sql import functions as F
        from pyspark.sql import types as T

        types = {f.name: f.dataType for f in df.schema.fields}
        # a DataFrame of the columns a task reads may lack either part
        typed = {
            part: types[part]
            for part in (KEY, VALUE)
            if part in types and not isinstance(types[part], T.BinaryType)
        }
        if not typed:
            return df
        converters = self.chain.converters
        return df.withColumns(
            {
                part: converters[part].serialize_typed(F.col(part), dtype, topic)
                for part, dtype in typed.items()
            }
        )

    def _sink_job(self, df: DataFrame) -> tuple[DataFrame, DataFrame | None]:
        from pyspark.sql import functions as F

        good, dead = self._split(self.chain.apply(df, sink=True), sink=True)
        out = good.select(
            *(
                self.chain.output(c).alias(c) if c in (KEY, VALUE) else F.col(c)
                for c in SINK_COLUMNS
            )
        )
        if dead is not None:
            dead = dead.select("key", "value", "headers", "timestamp")
        return out, dead

    async def _write_dead_letters(self, dead: DataFrame) -> int:
        writer, checks = await self._dead_letters_writer()
        topic = self.errors.dead_letter_topic
        staged = await writer.stage_dataframe(dead, topic)
        if not staged.segments:
            await writer.discard(staged)
            return 0
        try:
            await self.topics.commit(staged, checks)
        except TxnRefused:
            await writer.discard(staged)
            raise Fenced(
                f"sink task {self.name}: a newer incarnation holds the dead letter queue"
            ) from None
        return staged.records

    async def _dead_letters_writer(self) -> tuple[SegmentWriter, list[Any]]:
        if self._dead_letter_writer is None:
            fence = f"dlq-{self.name}"
            epoch = await self.coordinator.init_fencing(fence)
            writer = SegmentWriter(
                self.topics, self.spark, task=f"{self.name}.dlq", epoch=epoch, pool=self.pool
            )
            await writer.reap()
            self._dead_letter_writer = (writer, [fencing_op(fence, epoch)])
        return self._dead_letter_writer

    # -- both ---------------------------------------------------------------------------

    def _split(self, out: DataFrame, *, sink: bool) -> tuple[DataFrame, DataFrame | None]:
        """(records that went through, dead letters or None); raises under tolerance none."""
        from pyspark.sql import functions as F

        if not self.chain.may_fail:
            return out, None
        errors = self.errors
        check = not errors.tolerate_all or errors.log_failures
        # kept for the count of failed records too (task-error-metrics)
        out = out.persist()
        self._cached.append(out)
        failing = out.where(F.col(ERROR).isNotNull())
        found = True
        if check:
            failures = self._failures(failing, sink)
            if failures and not errors.tolerate_all:
                raise task_failure(self.name, failures[0])
            report(self.name, errors, failures)
            found = bool(failures)
        failed = failing.count() if found else 0
        self.failed_in_last_batch = failed
        self.metrics.record_errors_seen(
            failed,
            skipped=True,
            logged=errors.log_failures,
            dead_letters=errors.dead_letters and failed > 0,
        )
        found = failed > 0
        good = out.where(F.col(ERROR).isNull())
        if not (errors.dead_letters and found):
            return good, None
        headers = F.coalesce(F.col("headers"), F.array().cast(HEADERS_DDL))
        if errors.context_headers:
            headers = F.concat(headers, self._context_headers(sink))
        dead = failing.select(
            F.col(ORIGIN_TOPIC).alias("topic"),
            "key",
            "value",
            headers.alias("headers"),
            "timestamp",
        )
        return good, dead

    def _failures(self, failing: DataFrame, sink: bool) -> list[Failure]:
        from pyspark.sql import functions as F

        columns = [
            F.col(f"{ERROR}.stage"),
            F.col(f"{ERROR}.class"),
            F.col(f"{ERROR}.exception"),
            F.col(f"{ERROR}.message"),
            F.col(ORIGIN_TOPIC),
            F.col("partition"),
            F.col("offset") if sink else F.lit(None).cast("long"),
        ]
        if self.errors.log_messages:
            columns += [F.col("key"), F.col("value")]
        rows = failing.select(*columns).limit(LOGGED_PER_BATCH + 1).collect()
        return [Failure(*row) for row in rows]

    def _context_headers(self, sink: bool) -> Column:
        from pyspark.sql import functions as F

        pairs: list[tuple[str, Column]] = [(HEADER_TOPIC, F.col(ORIGIN_TOPIC))]
        if sink:
            pairs += [
                (HEADER_PARTITION, F.col("partition").cast("string")),
                (HEADER_OFFSET, F.col("offset").cast("string")),
            ]
        pairs += [
            (HEADER_CONNECTOR, F.lit(self.connector)),
            (HEADER_TASK, F.lit(str(self.task))),
            (HEADER_STAGE, F.col(f"{ERROR}.stage")),
            (HEADER_CLASS, F.col(f"{ERROR}.class")),
            (HEADER_EXCEPTION, F.col(f"{ERROR}.exception")),
            (HEADER_MESSAGE, F.col(f"{ERROR}.message")),
        ]
        return F.array(
            *(
                F.struct(F.lit(name).alias("key"), value.cast("binary").alias("value"))
                for name, value in pairs
            )
        )

    def _release(self) -> None:
        """Unpersist what the previous batch cached: it has been written or put by now."""
        while self._cached:
            self._cached.pop().unpersist(blocking=False)


def _source_columns(df: DataFrame, topic: str | None) -> DataFrame:
    """A SourceBatch's DataFrame with every column a chain reads, typed."""
    from pyspark.sql import functions as F

    types = dict(df.dtypes)

    def given(name: str, ddl: str, default: Column) -> Column:
        return (F.col(name).cast(ddl) if name in types else default).alias(name)

    def part(name: str) -> Column:
        """A key or value: bytes, or typed as it is (see :mod:`herder.dataplane.typed`)."""
        if name in types and types[name] not in BYTES_TYPES:
            return F.col(name)
        return given(name, "binary", null.cast("binary"))

    null = F.lit(None)
    return df.select(
        F.lit(topic).alias("topic") if topic is not None else F.col("topic").cast("string"),
        given("partition", "int", null.cast("int")),
        part("key"),
        part("value"),
        given("headers", HEADERS_DDL, F.array().cast(HEADERS_DDL)),
        given("timestamp", "timestamp", null.cast("timestamp")),
    )
