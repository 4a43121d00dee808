"""How a running task moves data: the source and sink loops on Spark.

Every task's loop runs on the worker's event loop over the worker's shared ensemble
session and coordinator connections (so a worker's connections do not grow with its
tasks), and every call into the task's own code (``start``, ``poll``, ``put``,
``commit``, ``stop``) runs on the task's own thread, so a slow connector never holds up
another; Spark jobs run on the Spark runtime's pool. A task's fencing epoch is its own,
and its writes, multiplexed on the shared session, are each idempotent.

Source loop: take a fencing epoch for this incarnation (which fences every older one),
read the task's committed source offsets linearizably, then repeatedly poll a batch
(``batch.max.records`` / ``batch.max.ms``), stage it with Spark as Parquet segments (a
small one with pyarrow, :mod:`.trickle`), and
commit *the segment metadata and the source offsets in one ensemble transaction* that
checks the task's and the connector's fencing epochs and that this batch is the next
one of this task: exactly once, retries included, and a zombie never commits.

Sink loop: be a member of the connector's group ``connect-<name>``; read the records
past each assigned partition's committed offset as one DataFrame (a few records, for a
sink that takes them so, as an Arrow table: :mod:`.trickle`), ``put`` it, and
commit offsets through the coordinator with the member's generation, so a member that
lost its partitions cannot commit over their new owner.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from herder.connect import (
    SINK_COLUMNS,
    OffsetRange,
    SinkTask,
    SinkTaskContext,
    SourceBatch,
    SourceRecord,
    SourceTask,
    SourceTaskContext,
    Task,
    TopicPartition,
)
from herder.connect.source import OffsetReader
from herder.coordinator.apis import fencing_op
from herder.coordinator.client import CoordinatorClient, CoordinatorConnections
from herder.coordinator.offsets import TopicPartition as GroupPartition
from herder.dataplane.codec import segment_codec
from herder.dataplane.delivery import DeliveryPlan, in_turn
from herder.dataplane.fencing import connector_fence_id, current_epoch, task_fence_id
from herder.dataplane.metadata import PartitionState, SegmentSlice
from herder.dataplane.spark import SparkSettings, spark_runtime
from herder.dataplane.staged import StagedBatch
from herder.dataplane.storage import Storage, check_reachable
from herder.dataplane.topics import Topics, TxnRefused, slices_of
from herder.dataplane.transforms.pipeline import RecordPipeline, validate_record_handling
from herder.dataplane.trickle import TrickleLimits, read_slices
from herder.dataplane.writer import SegmentWriter
from herder.ensemble.client import EnsembleClient
from herder.ensemble.tailer import LogTailer
from herder.ensemble.txn import Append, CheckKeyValue, Op, Record
from herder.errors import (
    ConfigError,
    ErrorCode,
    Fenced,
    HerderError,
    IllegalGeneration,
    RebalanceInProgress,
    RetriableError,
    UnknownMemberId,
)
from herder.runtime.core.member import Generation
from herder.runtime.core.protocol import ConnectorTaskId
from herder.runtime.instance_ids import sink_task_instance_id
from herder.runtime.shell.member import GroupMember
from herder.runtime.stores import OffsetStore
from herder.runtime.task_metrics import HERDER, Sample, TaskMetrics
from herder.runtime.worker import ExecutionFactory, TaskControl
from herder.runtime.worker_config import WorkerConfig

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger(__name__)

BATCHES_LOG = "_batches"
#: Connect's name for the partition count of topics a source creates by writing to them
TOPIC_CREATION_PARTITIONS = "topic.creation.default.partitions"
RETENTION_CHECK_INTERVAL = "retention.check.interval.ms"
#: whether a worker starts its Spark session when it starts (herder's name; default true)
SPARK_WARMUP = "dataplane.spark.warmup"
DEFAULT_RETENTION_CHECK_INTERVAL_MS = 300_000
BATCH_MAX_RECORDS = "batch.max.records"
BATCH_MAX_MS = "batch.max.ms"
DEFAULT_BATCH_MAX_RECORDS = 50_000
DEFAULT_BATCH_MAX_MS = 500
SINK_POLL_MS = 100
SINK_MAX_RECORDS = "consumer.max.records"
DEFAULT_SINK_MAX_RECORDS = 2_000_000
#: how long a scrape of /metrics waits for the topics' end offsets
METRICS_TIMEOUT_S = 5.0


class TaskExecutions(ExecutionFactory):
    """The worker's execution factory: a source or sink loop for each task.

    Every execution of a worker runs on the worker's event loop and shares the worker's
    connections: its ensemble session (every task's reads and transactions are
    multiplexed over it, each still idempotent), its connections to the group
    coordinator (each sink task is still a group member of its own over them), and its
    follower of the source offsets — the herder's own, handed over by :meth:`share`, or
    else ones of the executions' own, opened on first use.
    """

    def __init__(self, config: WorkerConfig) -> None:
        if not config.storage_root:
            raise ConfigError("storage.root must name where topic data lives (a path or URI)")
        self.config = config
        self.storage = Storage(config.storage_root)
        settings = SparkSettings.from_properties(config.spark_properties())
        check_reachable(
            config.storage_root, settings.where, settings.spans_machines, config.storage_root_shared
        )
        self.spark = spark_runtime(config.spark_properties())
        # a JVM takes seconds to start: start it now, not when the first task needs it
        # (unless told not to: a worker whose tasks may never run a job saves the JVM)
        if config.originals.get(SPARK_WARMUP, "true").strip().lower() != "false":
            threading.Thread(target=self._warm_up, name="herder-spark-warmup", daemon=True).start()
        self.trickle = TrickleLimits.from_config(config.originals)
        self.codec = segment_codec(config.originals)
        self.retention_interval_ms = _int(
            config.originals, RETENTION_CHECK_INTERVAL, DEFAULT_RETENTION_CHECK_INTERVAL_MS
        )
        self.client = EnsembleClient(
            config.bootstrap, name="herder-tasks", security=config.ensemble_security
        )
        self.connections = CoordinatorConnections(
            config.bootstrap, security=config.ensemble_security
        )
        self.coordinator = CoordinatorClient(config.bootstrap, connections=self.connections)
        self.offsets = OffsetStore(self.client, config.offset_log)
        self.batches = _BatchMarkers(self.client)
        #: whether the session, coordinator connections and offsets are the worker's own
        #: (opened and closed by it) rather than these executions'
        self._shared = False
        self._opened: asyncio.Task[None] | None = None
        self._retention: asyncio.Task[None] | None = None
        self._closed = False
        #: the worker is stopping (its tasks end with it and come back with its restart)
        self.stopping_worker = False
        #: the topics as ``/metrics`` follows them (opened on its first scrape)
        self._metric_topics: Topics | None = None

    def share(
        self,
        client: EnsembleClient,
        coordinator: CoordinatorClient,
        connections: CoordinatorConnections,
        offsets: OffsetStore,
    ) -> None:
        """Use the worker's started session, coordinator connections and offset follower
        rather than open a second set of each (call before :meth:`open`)."""
        self.client, self.coordinator, self.connections = client, coordinator, connections
        self.offsets = offsets
        self.batches = _BatchMarkers(client)
        self._shared = True

    def worker_stopping(self) -> None:
        self.stopping_worker = True

    async def open(self) -> None:
        """Open the shared session and start following the source offsets (once)."""
        if self._closed:
            raise HerderError("the worker's task executions are closed")
        if self._opened is None or (self._opened.done() and self._opened.exception()):
            self._opened = asyncio.ensure_future(self._open())
        await asyncio.shield(self._opened)

    async def _open(self) -> None:
        if not self._shared and not self.client.session_id:  # not started by a try before
            await self.client.start()
        await self.client.create_log(BATCHES_LOG, compacted=True, if_absent=True)
        if not self._shared:
            await self.offsets.start()
        await self.batches.start()
        if self._retention is None:
            self._retention = asyncio.ensure_future(self._enforce_retention())

    async def close(self) -> None:
        """Stop the retention passes and close the shared connections (the worker's
        tasks have stopped by now)."""
        self._closed = True
        for task in (self._retention, self._opened):
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        if self._opened is not None:
            await self.batches.stop()
            if not self._shared:
                await self.offsets.stop()
                await self.coordinator.close()
                await self.connections.close()
                await self.client.close()

    @property
    def retention_stopped(self) -> bool:
        """Whether the retention passes are over (they end at :meth:`close`)."""
        return self._retention is None or self._retention.done()

    async def _enforce_retention(self) -> None:
        """Every interval, one retention pass over every topic (Kafka's log cleaner
        schedule), until :meth:`close`. Every worker runs it; the topic layer makes
        concurrent passes safe."""
        topics = Topics(self.client, self.storage)
        interval = self.retention_interval_ms / 1000
        while True:
            await asyncio.sleep(interval)
            try:
                for topic in await topics.list_topics():
                    report = await topics.enforce_retention(topic.name)
                    if report.retired or report.purged:
                        log.info(
                            "retention on %s: retired %s, purged %s",
                            topic.name,
                            report.retired,
                            report.purged,
                        )
            except Exception:
                log.exception("retention pass failed; retrying at the next interval")

    async def metric_samples(self) -> list[Sample]:
        """Each topic's end offset per partition (``herder_topic_end_offset``), as this
        worker's follower of the topic metadata has it after catching up."""
        if self._opened is None or not self._opened.done() or self._opened.exception():
            return []
        if self._metric_topics is None:
            self._metric_topics = Topics(self.client, self.storage)
        topics = self._metric_topics
        samples = []
        try:
            async with asyncio.timeout(METRICS_TIMEOUT_S):
                for topic in await topics.list_topics():
                    for state in await topics.partitions(topic.name):
                        samples.append(
                            Sample(
                                HERDER,
                                "topic-end-offset",
                                state.next_offset,
                                (("topic", topic.name), ("partition", str(state.partition))),
                            )
                        )
        except (TimeoutError, HerderError) as exc:
            log.info("topic end offsets left out of the metrics: %s", exc)
        return samples

    def validate_config(self, config: Mapping[str, str]) -> list[str]:
        """Problems with a connector config's transforms and errors.* keys, for the herder
        to refuse before the config is stored."""
        return validate_record_handling(config)

    def _warm_up(self) -> None:
        try:
            self.spark.start()
        except Exception:
            log.exception("starting Spark failed; tasks will report the error when they run")

    def __call__(
        self,
        task_id: ConnectorTaskId,
        task: Task,
        config: dict[str, str],
        connector_config: dict[str, str],
    ) -> SourceExecution | SinkExecution:
        settings = {**connector_config, **config}
        if isinstance(task, SourceTask):
            return SourceExecution(self, task_id, task, config, settings)
        if isinstance(task, SinkTask):
            return SinkExecution(self, task_id, task, config, settings)
        raise ConfigError(f"task {task_id} is neither a SourceTask nor a SinkTask")


def _int(settings: Mapping[str, str], key: str, default: int) -> int:
    raw = settings.get(key, str(default))
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{key}={raw!r} is not a whole number") from None
    if value < 1:
        raise ConfigError(f"{key}={value} must be at least 1")
    return value


class _BatchMarkers:
    """The last committed batch marker of every source task, followed from ``_batches``
    once per worker rather than read whole by each task that starts."""

    def __init__(self, client: EnsembleClient) -> None:
        self._latest: dict[bytes, bytes | None] = {}
        self._tailer = LogTailer(client, BATCHES_LOG, self._on_record)

    def _on_record(self, record: Record) -> None:
        if record.key is not None:
            self._latest[record.key] = record.value

    async def start(self) -> None:
        await self._tailer.start()

    async def stop(self) -> None:
        await self._tailer.stop()

    async def last(self, key: bytes) -> bytes | None:
        """``key``'s marker as committed before this call (a linearizable read)."""
        await self._tailer.read_to_end()
        return self._latest.get(key)


class _Execution(ABC):
    def __init__(
        self,
        runtime: TaskExecutions,
        task_id: ConnectorTaskId,
        task: Task,
        config: dict[str, str],
        settings: dict[str, str],
    ) -> None:
        self.runtime = runtime
        self.task_id = task_id
        self.task = task
        self.config = config
        self.settings = settings
        self.name = f"{task_id.connector}-{task_id.task}"
        self.metrics = TaskMetrics(task_id, "")
        self.client = runtime.client
        self.topics = Topics(
            self.client,
            runtime.storage,
            spark=runtime.spark,
            default_partitions=_int(settings, TOPIC_CREATION_PARTITIONS, 1),
        )
        # transforms and errors.* handling between poll and write, read and put
        self.pipeline = RecordPipeline(
            settings,
            connector=task_id.connector,
            task=task_id.task,
            topics=self.topics,
            spark=runtime.spark,
            coordinator=runtime.coordinator,
            pool=self.name,
        )

    async def execute(self, control: TaskControl) -> None:
        self.metrics = control.metrics
        self.pipeline.metrics = control.metrics
        self.runtime.spark.job_times[self.name] = control.metrics.spark
        try:
            control.doing("connecting to the ensemble")
            await self.runtime.open()
            await self._execute(control)
        finally:
            if self.runtime.spark.job_times.get(self.name) is control.metrics.spark:
                del self.runtime.spark.job_times[self.name]

    @abstractmethod
    async def _execute(self, control: TaskControl) -> None:
        """The task's loop, until ``control.stopping`` is set."""


class _Offsets(OffsetReader):
    def __init__(self, store: OffsetStore, connector: str) -> None:
        self.store = store
        self.connector = connector

    def offset(self, partition: Mapping[str, Any]) -> dict[str, Any] | None:
        return self.store.get(self.connector, partition)

    def offsets(self, partitions: Sequence[Mapping[str, Any]]) -> list[dict[str, Any] | None]:
        return [self.offset(p) for p in partitions]


class _SourceContext(SourceTaskContext):
    def __init__(self, config: dict[str, str], reader: OffsetReader) -> None:
        self._config = config
        self._reader = reader

    @property
    def configs(self) -> Mapping[str, str]:
        return self._config

    @property
    def offset_reader(self) -> OffsetReader:
        return self._reader


def columns_read_by(task: SinkTask, name: str) -> dict[str, str | None] | None:
    """The columns ``task`` says its ranged put reads (:meth:`SinkTask.columns_read`), in
    the order of a sink's records, each with how it reads it; a column they do not
    have, or a way to read it other than as given or (keys and values) as strings, is a
    ConfigError."""
    columns = task.columns_read()
    if columns is None:
        return None
    unknown = sorted(set(columns) - set(SINK_COLUMNS))
    if unknown:
        raise ConfigError(
            f"sink task {name} says its put reads column {unknown[0]!r}, which a sink's"
            f" records do not have (they have {', '.join(SINK_COLUMNS)})"
        )
    for column, how in columns.items():
        if how is not None and (how != "string" or column not in ("key", "value")):
            raise ConfigError(
                f"sink task {name} says its put reads column {column!r} as {how!r}: a"
                " column is read as the runtime gives it (None), or a key or value of"
                " bytes as 'string'"
            )
    return {c: columns[c] for c in SINK_COLUMNS if c in columns}


class SourceExecution(_Execution):
    """Poll → stage with Spark → commit segments and offsets in one fenced transaction."""

    task: SourceTask

    async def _execute(self, control: TaskControl) -> None:
        connector = self.task_id.connector
        control.doing("taking its fencing epoch")
        coordinator = self.runtime.coordinator
        epoch = await coordinator.init_fencing(task_fence_id(connector, self.task_id.task))
        control.doing("reading its connector's fencing epoch")
        connector_epoch = await current_epoch(self.client, connector_fence_id(connector))
        control.doing("reading its committed source offsets")
        offsets = self.runtime.offsets
        await offsets.read_to_end()  # linearizable, after our epoch fenced older tasks
        self.task.initialize(_SourceContext(self.config, _Offsets(offsets, connector)))
        control.doing("in its start()")
        await control.call(self.task.start, dict(self.config))
        control.started()
        writer = SegmentWriter(
            self.topics,
            self.runtime.spark,
            task=self.name,
            epoch=epoch,
            trickle=self.runtime.trickle,
            codec=self.runtime.codec,
        )
        await writer.reap()
        checks: list[Op] = [fencing_op(task_fence_id(connector, self.task_id.task), epoch)]
        if connector_epoch is not None:
            checks.append(fencing_op(connector_fence_id(connector), connector_epoch))
        batch_key = self.name.encode()
        previous = await self._last_batch(batch_key)
        sequence = 0
        max_records = _int(self.settings, BATCH_MAX_RECORDS, DEFAULT_BATCH_MAX_RECORDS)
        max_ms = _int(self.settings, BATCH_MAX_MS, DEFAULT_BATCH_MAX_MS)
        log.info("source task %s running with fencing epoch %d", self.name, epoch)
        try:
            while not await control.wait_while_paused():
                polling_since = time.monotonic()
                batch = await self._gather(control, max_records, max_ms)
                if batch is None:
                    continue
                polled = len(batch) if isinstance(batch, list) else None
                if polled is not None:
                    self.metrics.source_polled(polled, time.monotonic() - polling_since)
                sequence += 1
                marker = json.dumps({"epoch": epoch, "batch": sequence}).encode()
                ops: list[Op] = [
                    *checks,
                    CheckKeyValue(BATCHES_LOG, batch_key, previous),
                    Append(BATCHES_LOG, batch_key, marker),
                    # a pass over every record: on the task's thread, not the worker's loop
                    *offsets.records(connector, await control.call(_latest_offsets, batch)),
                ]
                began = time.monotonic()
                data, topic = await self.pipeline.before_write(batch)
                # fields a source says every record holds alike, and the records as
                # pieces the executors write, unless transforms ran
                constants = pieces = None
                if isinstance(batch, SourceBatch) and not self.pipeline.chain:
                    constants, pieces = batch.constants, batch.pieces
                staged = await writer.stage(data, topic, constants=constants, pieces=pieces)
                if polled is None:  # a SourceBatch: its records are known once written
                    self.metrics.source_polled(staged.records, time.monotonic() - polling_since)
                if not await self._checked(control, batch, staged, writer):
                    self.metrics.source_abandoned()
                    continue
                staged_at = time.monotonic()
                try:
                    await self.topics.commit(staged, ops)
                except TxnRefused as exc:
                    self.metrics.source_abandoned()
                    await writer.discard(staged)
                    if exc.code == ErrorCode.CHECK_FAILED and exc.index < len(checks) + 1:
                        # said here too: a worker that is stopping this task (as a resumed
                        # zombie's is) does not report how its last batch ended
                        log.warning(
                            "source task %s (epoch %d): commit of batch %d refused (FENCED by a"
                            " newer incarnation); its %d staged records are discarded",
                            self.name,
                            epoch,
                            sequence,
                            staged.records,
                        )
                        raise Fenced(
                            f"source task {self.name} (epoch {epoch}) was fenced by a newer"
                            f" incarnation: {exc}"
                        ) from None
                    raise
                previous = marker
                self.metrics.source_committed(staged.records, time.monotonic() - staged_at)
                log.debug(
                    "source task %s: batch %d, %d records staged in %.3f s, committed in %.3f s",
                    self.name,
                    sequence,
                    staged.records,
                    staged_at - began,
                    time.monotonic() - staged_at,
                )
                await control.call(self._committed, batch)
        finally:
            await control.call(self.task.stop)

    def _committed(self, batch: list[SourceRecord] | SourceBatch) -> None:
        if isinstance(batch, list):
            for record in batch:
                self.task.commit_record(record)
        self.task.commit()

    async def _checked(
        self,
        control: TaskControl,
        batch: list[SourceRecord] | SourceBatch,
        staged: StagedBatch,
        writer: SegmentWriter,
    ) -> bool:
        """Whether a written batch may commit: a SourceBatch's ``check`` passes (or it has
        none). One that fails for now is discarded, and the task polled again."""
        if not isinstance(batch, SourceBatch) or batch.check is None:
            return True
        try:
            await control.call(batch.check)
        except RetriableError as exc:
            await writer.discard(staged)
            log.info(
                "source task %s: %d written records discarded before their commit, to be"
                " read again: %s",
                self.name,
                staged.records,
                exc,
            )
            return False
        return True

    async def _last_batch(self, key: bytes) -> bytes | None:
        return await self.runtime.batches.last(key)

    async def _gather(
        self, control: TaskControl, max_records: int, max_ms: int
    ) -> list[SourceRecord] | SourceBatch | None:
        """One batch: polls while records keep coming, until ``max_records`` or ``max_ms``.

        A poll that returns nothing after some records ends the batch: the task had no
        more to give (its poll waited for them as long as it waits), so they go now
        rather than at ``max_ms``. A SourceBatch stands alone.
        """
        records: list[SourceRecord] = []
        deadline = time.monotonic() + max_ms / 1000
        while not control.stopping.is_set() and not control.paused.is_set():
            polled = await self.pipeline.poll(lambda: control.call(self.task.poll))
            if isinstance(polled, SourceBatch):
                if records:
                    raise HerderError(f"task {self.name} mixed SourceRecords and a SourceBatch")
                return polled
            if not polled and records:
                break
            if polled:
                records.extend(polled)
            if len(records) >= max_records or time.monotonic() >= deadline:
                break
        return records or None


def _latest_offsets(
    batch: list[SourceRecord] | SourceBatch,
) -> list[tuple[Mapping[str, Any], Any]]:
    if isinstance(batch, SourceBatch):
        return [(p, o) for p, o in batch.offsets]
    latest: dict[str, tuple[Mapping[str, Any], Any]] = {}
    # a task usually gives its records one partition object: its key is made once
    # (a JSON dump per record cost a poll of 50,000 lines 0.1 CPU-s)
    last: Mapping[str, Any] | None = None
    key = ""
    for record in batch:
        partition = record.source_partition
        if partition is not last:
            last, key = partition, json.dumps(partition, sort_keys=True)
        latest[key] = (partition, record.source_offset)
    return list(latest.values())


class _SinkContext(SinkTaskContext):
    def __init__(self, execution: SinkExecution) -> None:
        self._execution = execution
        self._paused: set[TopicPartition] = set()
        self.rewinds: dict[TopicPartition, int] = {}
        #: the offset ranges of the DataFrame of the put in progress
        self.ranges: Sequence[OffsetRange] | None = None

    @property
    def configs(self) -> Mapping[str, str]:
        return self._execution.config

    def assignment(self) -> frozenset[TopicPartition]:
        return frozenset(self._execution.positions)

    def committed(self, partition: TopicPartition) -> tuple[int, str] | None:
        return self._execution.committed.get(partition)

    def offset(self, partition: TopicPartition, offset: int) -> None:
        self.rewinds[partition] = offset

    def pause(self, *partitions: TopicPartition) -> None:
        self._paused.update(partitions)

    def resume(self, *partitions: TopicPartition) -> None:
        self._paused.difference_update(partitions)

    def paused(self) -> frozenset[TopicPartition]:
        return frozenset(self._paused)

    def request_commit(self) -> None:
        """Nothing to do: the offsets of every put are committed as soon as it returns."""

    def offset_ranges(self) -> Sequence[OffsetRange] | None:
        return self.ranges


def _topics_of(settings: Mapping[str, str]) -> list[str]:
    return [t.strip() for t in settings.get("topics", "").split(",") if t.strip()]


#: an offset commit refused because this member's generation is over
_GENERATION_OVER = (IllegalGeneration, UnknownMemberId, RebalanceInProgress)


class SinkExecution(_Execution):
    """Member of ``connect-<name>``: read past committed offsets, put, commit.

    The task is called from one place at a time: delivery (read, put, commit) and the
    membership callbacks (commit and close on revocation, open on assignment) hold one
    lock, so a rebalance never commits a position that a put in flight has already
    moved past, nor opens (and truncates) under a put.
    """

    task: SinkTask

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        #: next offset to deliver, per assigned partition
        self.positions: dict[TopicPartition, int] = {}
        self.committed: dict[TopicPartition, tuple[int, str]] = {}
        self._generation: Generation | None = None
        #: delivered records whose offset commit failed and is to be tried again
        self._uncommitted = False
        self._task_lock = asyncio.Lock()
        #: deliveries planned: which partition the next one starts at (see in_turn)
        self._turn = 0
        #: whether the task takes small batches as Arrow tables (asked after its start)
        self._accepts_arrow = False
        #: the columns the task's put reads of a ranged DataFrame (None: all of them)
        self._columns_read: dict[str, str | None] | None = None
        self.context = _SinkContext(self)
        #: where the task's code runs (the worker's, from the start of the execution)
        self.control = TaskControl(f"task-{self.name}")

    async def _ask_how_it_takes_batches(self, control: TaskControl) -> None:
        """Whether the started task takes small batches as Arrow tables, and which
        columns its ranged put reads: asked once, as a task's answers follow from its
        config."""
        self._accepts_arrow = await control.call(self.task.accepts_arrow)
        self._columns_read = await control.call(columns_read_by, self.task, self.name)

    async def _execute(self, control: TaskControl) -> None:
        topics = _topics_of(self.settings)
        if not topics:
            raise ConfigError(f"sink connector {self.task_id.connector} names no topics")
        self.control = control
        self.task.initialize(self.context)
        control.doing("in its start()")
        await control.call(self.task.start, dict(self.config))
        await self._ask_how_it_takes_batches(control)
        control.started()
        control.doing("joining its connector's group")
        for topic in topics:
            await self.topics.ensure(topic)
        member = GroupMember(
            self.runtime.config.bootstrap,
            f"connect-{self.task_id.connector}",
            protocol_type="consumer",
            protocols=lambda: [("range", json.dumps(sorted(topics)).encode())],
            assign=self._assign_partitions,
            on_assigned=self._on_assigned,
            on_revoked=self._on_revoked,
            session_timeout_ms=self.runtime.config.session_timeout_ms,
            heartbeat_interval_ms=self.runtime.config.heartbeat_interval_ms,
            rebalance_timeout_ms=self.runtime.config.rebalance_timeout_ms,
            client_id=f"task-{self.name}",
            connections=self.runtime.connections,
            group_instance_id=self._group_instance_id(),
        )
        self.member = member
        self._partition_counts = {t: (await self.topics.get(t)).partitions for t in topics}
        await member.start()
        max_records = self.max_records()
        try:
            control.doing("running")
            while not await control.wait_while_paused():
                if member.failure is not None:
                    raise member.failure
                marks = self.topics.commit_marks(topics)
                delivered = await self._deliver(max_records)
                if not delivered:
                    # woken at once by a commit of this worker's (a source task's);
                    # other workers' commits are seen at the next poll
                    await self.topics.wait_for_commit(marks, SINK_POLL_MS / 1000)
        finally:
            # a task that moves or ends leaves its group at once, even a static one;
            # one that stops with its static worker keeps its place for the restart
            await member.close(leave=None if self.runtime.stopping_worker else True)
            await control.call(self.task.close, list(self.positions))
            await control.call(self.task.stop)

    def max_records(self) -> int:
        """The records one delivery reads (its budget, which whole files may stretch, see
        :class:`~.delivery.DeliveryPlan`): the connector's ``consumer.max.records``, or
        the task's own default (:attr:`SinkTask.max_records_per_delivery
        <herder.connect.SinkTask.max_records_per_delivery>`), or the runtime's."""
        default = self.task.max_records_per_delivery or DEFAULT_SINK_MAX_RECORDS
        return _int(self.settings, SINK_MAX_RECORDS, default)

    def _group_instance_id(self) -> str | None:
        """A static worker's sink task is static too, so the worker's restart does not
        rebalance its connector's group either; a dynamic worker's stays dynamic."""
        worker_instance_id = self.runtime.config.group_instance_id
        if worker_instance_id is None:
            return None
        return sink_task_instance_id(worker_instance_id, self.task_id.connector, self.task_id.task)

    def _assign_partitions(
        self, leader: str, protocol: str, members: Mapping[str, bytes]
    ) -> dict[str, bytes]:
        """Range assignment of every subscribed topic's partitions (Kafka's RangeAssignor)."""
        ids = sorted(members)
        out: dict[str, list[list[Any]]] = {m: [] for m in ids}
        subscribed = {m: set(json.loads(members[m] or b"[]")) for m in ids}
        for topic, count in sorted(self._partition_counts.items()):
            takers = [m for m in ids if topic in subscribed[m]]
            if not takers:
                continue
            per, extra = divmod(count, len(takers))
            start = 0
            for i, m in enumerate(takers):
                n = per + (1 if i < extra else 0)
                out[m] += [[topic, p] for p in range(start, start + n)]
                start += n
        return {m: json.dumps(v).encode() for m, v in out.items()}

    async def _on_assigned(self, generation: Generation, data: bytes) -> None:
        async with self._task_lock:
            await self._assigned(generation, data)

    async def _assigned(self, generation: Generation, data: bytes) -> None:
        partitions = [TopicPartition(t, p) for t, p in json.loads(data or b"[]")]
        self._generation = generation
        fetched = await self.member.fetch_offsets(
            [GroupPartition(tp.topic, tp.partition) for tp in partitions]
        )
        self.committed = {
            TopicPartition(gp.topic, gp.partition): value for gp, value in fetched.items()
        }
        self.positions = {tp: self.committed.get(tp, (0, ""))[0] for tp in partitions}
        self.metrics.sink_assigned(len(partitions))
        await self.control.call(self.task.open, partitions)
        for tp, offset in self.context.rewinds.items():
            if tp in self.positions:
                self.positions[tp] = offset
        self.context.rewinds.clear()
        # every partition has a committed position before its first put, so a sink that
        # keeps state in its metadata always finds some
        fresh = {tp: self.positions[tp] for tp in partitions if tp not in self.committed}
        if fresh:
            await self._commit(fresh)
        log.info(
            "sink task %s assigned %s (generation %d)",
            self.name,
            partitions,
            generation.generation_id,
        )

    async def _on_revoked(self) -> None:
        async with self._task_lock:
            await self._revoked()

    async def _revoked(self) -> None:
        if self.positions and self._generation is not None:
            try:
                await self._commit(dict(self.positions))
            except HerderError as exc:
                log.info("sink task %s: commit before rebalance refused: %s", self.name, exc)
        if self.positions:
            await self.control.call(self.task.close, list(self.positions))
        self.positions = {}
        self.metrics.sink_assigned(0)
        self._generation = None
        self._uncommitted = False

    async def _deliver(self, max_records: int) -> bool:
        async with self._task_lock:
            return await self._deliver_batch(max_records)

    async def _deliver_batch(self, max_records: int) -> bool:
        generation = self._generation
        if generation is None or not self.positions:
            return False
        # records a delivery of small files may hold and still take the trickle path
        plan = DeliveryPlan(
            max_records,
            ranged=self.task.offset_ranged,
            small_budget=self._trickle_budget(),
            spread=self.runtime.spark.known_parallelism or 1,
        )
        states: dict[str, dict[int, PartitionState]] = {}
        self._turn += 1
        for tp, position in in_turn(sorted(self.positions.items()), self._turn):
            if tp in self.context.paused() or not plan.wants(tp.topic):
                continue
            if tp.topic not in states:
                # only the partitions assigned to this task: with many tasks, each
                # following every partition's segment log would multiply the reads
                mine = sorted(p.partition for p in self.positions if p.topic == tp.topic)
                states[tp.topic] = {
                    s.partition: s for s in await self.topics.partitions(tp.topic, mine)
                }
            plan.take(tp, position, states[tp.topic].get(tp.partition))
        by_topic, reached = plan.by_topic, plan.reached
        if not reached:
            if self._uncommitted:
                await self._commit_positions()
            self._measure_lag(states)
            return False
        self.metrics.sink_read(sum(reached[tp] - self.positions[tp] for tp in reached))
        began = time.monotonic()
        reading = 0.0
        for topic, ranges in by_topic.items():
            read_at = time.monotonic()
            records = sum(stop - start for start, stop in ranges.values())
            # the segments read, from the states just refreshed: no round trip again
            slices = slices_of(topic, (states[topic][p] for p in sorted(ranges)), ranges)
            table = await self._read_trickle(topic, slices, records)
            if table is None:
                df, offset_ranges = await self.topics.read_ranged(
                    topic,
                    ranges,
                    ordered=True,
                    ranged=self.task.offset_ranged,
                    pool=self.name,
                    slices=slices,
                    # transforms may read any column, and give every one
                    columns=None if self.pipeline.chain else self._columns_read,
                )
                # transforms select and filter: each Spark partition keeps its offset range
                df = await self.pipeline.before_put(df)
                if not self.task.typed_records:
                    df = await self.pipeline.as_bytes(df, topic)
            reading += time.monotonic() - read_at
            failed = self.pipeline.failed_in_last_batch if table is None else 0
            put_began = time.monotonic()
            try:
                if table is None:
                    await self._put(df, offset_ranges)
                else:
                    await self._put_arrow(table, plan.ranges.get(topic))
            except RetriableError as exc:
                log.info("sink task %s: put will be retried: %s", self.name, exc)
                return False
            self.metrics.sink_put(max(0, records - failed), time.monotonic() - put_began)
        put_at = time.monotonic()
        self.positions.update(reached)
        committed = await self._commit_positions()
        self.metrics.sink_committed(committed, time.monotonic() - put_at)
        self._measure_lag(states)
        if committed:
            log.debug(
                "sink task %s: delivered up to %s: read and put in %.3f s (reads planned in"
                " %.3f s), committed in %.3f s",
                self.name,
                {f"{tp.topic}-{tp.partition}": o for tp, o in reached.items()},
                put_at - began,
                reading,
                time.monotonic() - put_at,
            )
        return True

    def _trickle_budget(self) -> int:
        """Records a delivery may hold to go by the trickle path; 0 if it cannot."""
        limits = self.runtime.trickle
        if not limits.enabled or self.pipeline.chain or not self._accepts_arrow:
            return 0
        return limits.max_records

    async def _read_trickle(
        self, topic: str, slices: list[SegmentSlice], records: int
    ) -> pa.Table | None:
        """A small delivery read with pyarrow for a task that takes Arrow tables, or
        None to read it with Spark (see :mod:`~herder.dataplane.trickle`): too big,
        typed, transformed, or a task that takes DataFrames only."""
        limits = self.runtime.trickle
        if not self._trickle_budget() or not limits.takes(records, 0):
            return None
        storage = self.runtime.storage
        return await asyncio.to_thread(read_slices, storage, topic, slices, limits.max_bytes)

    def _measure_lag(self, states: Mapping[str, Mapping[int, PartitionState]]) -> None:
        """How far this task is behind the partitions it just looked at: records past its
        position, and the age of the newest record of the oldest segment it has yet to
        deliver (an underestimate of the oldest undelivered record's age, by at most
        one segment's span)."""
        records = 0
        oldest_ms: int | None = None
        for tp, position in self.positions.items():
            state = states.get(tp.topic, {}).get(tp.partition)
            if state is None:
                continue
            behind = state.next_offset - position
            if behind <= 0:
                continue
            records += behind
            for segment in state.overlapping(position, None):
                if oldest_ms is None or segment.max_timestamp < oldest_ms:
                    oldest_ms = segment.max_timestamp
        seconds = 0.0
        if records and oldest_ms is not None:
            seconds = max(0.0, time.time() - oldest_ms / 1000)
        self.metrics.sink_lag(records, seconds)

    async def _put_arrow(self, table: pa.Table, ranges: Sequence[OffsetRange] | None) -> None:
        """``put_arrow``, with the delivery's pieces as the context's offset ranges: an
        offset-ranged sink writes an output per piece, as from a ranged DataFrame."""
        self.context.ranges = ranges if self.task.offset_ranged else None
        try:
            await self.control.call(self.task.put_arrow, table)
        finally:
            self.context.ranges = None

    async def _put(self, df: Any, offset_ranges: Sequence[OffsetRange] | None = None) -> None:
        """``put`` on a thread of its own, not a Spark job thread (it may wait on the
        system it writes to), with the Spark jobs it runs in the task's scheduler pool,
        as the task's reads are; ``offset_ranges`` are the context's meanwhile."""

        def put() -> None:
            with self.runtime.spark.pool(self.name):
                self.task.put(df)

        self.context.ranges = offset_ranges
        try:
            await self.control.call(put)
        finally:
            self.context.ranges = None

    async def _commit_positions(self) -> bool:
        """Commit what has been delivered; whether the commit went through.

        Refused because this member's generation is over: these records are written but
        not committed, and whoever owns the partitions next starts from the last commit
        (a file sink truncates back to it); nothing more is delivered until the group has
        assigned partitions again. Failed for now (no coordinator during an ensemble
        election, a timeout): the task goes on and the commit is tried again with the
        next delivery, or on its own when there is none, as Connect's sink tasks do.
        """
        try:
            await self._commit(dict(self.positions))
        except _GENERATION_OVER as exc:
            log.warning(
                "sink task %s: offset commit refused (%s); waiting for a new assignment",
                self.name,
                exc,
            )
            self._generation = None
            self._uncommitted = False
            return False
        except RetriableError as exc:
            log.warning(
                "sink task %s: offset commit failed (%s); it will be tried again", self.name, exc
            )
            self._uncommitted = True
            return False
        self._uncommitted = False
        return True

    async def _commit(self, offsets: dict[TopicPartition, int]) -> None:
        safe = await self.control.call(self.task.pre_commit, offsets)
        if not safe:
            return
        commits = {
            GroupPartition(tp.topic, tp.partition): (offset, self.task.commit_metadata(tp))
            for tp, offset in safe.items()
        }
        await self.member.commit_offsets(commits, generation=self._generation)
        for gp, value in commits.items():
            self.committed[TopicPartition(gp.topic, gp.partition)] = value
