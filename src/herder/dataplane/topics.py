"""Topics: their definitions and segments in the ensemble, their files in storage.

:class:`Topics` is the metadata side of the data plane, shared by every task of a
worker (and by the CLI). It creates, lists and deletes topics, follows the segment logs
of the partitions it is asked about (incrementally: a refresh reads only what was
appended since the last one), turns a staged batch into the operations that commit it,
and runs retention and the reaping of dead staging directories. It starts no Spark
job: writing is :mod:`.writer`'s, reading into DataFrames :mod:`.reader`'s.

**Committing a batch.** :meth:`Topics.commit_ops` gives, for each segment of the batch,
a check of its segment log's end offset and the append of its record, with base
offsets taken from what this process last saw of the partition; plus a check of each
topic's version. :meth:`Topics.commit` runs the caller's own operations *first* and the
batch's after them in one transaction, so the caller's ops keep their indexes in the
result, and a refused fencing check is reported as such even when the partition moved
too. If the transaction is refused by one of the batch's end-offset checks, another
writer (or retention) got there first: the partitions are re-read and the commit is
tried again with new base offsets — the files stay as they are, since a record's
offset is counted from its segment's ``base_offset`` at read time. Any other refusal is
raised: one of the caller's ops as :class:`TxnRefused` (with its index), a topic that
changed as :class:`~herder.errors.UnknownTopicOrPartition`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec

from herder.connect.records import OffsetRange, TopicPartition
from herder.dataplane.metadata import (
    START_KEY,
    TOPICS_LOG,
    PartitionState,
    RetentionPlan,
    Segment,
    SegmentSlice,
    StartOffset,
    Topic,
    TopicSpec,
    check_topic_name,
    decode_topic,
    encode,
    parse_topic_config,
    plan_retention,
    segment_log,
)
from herder.dataplane.reader import slices_dataframe
from herder.dataplane.staged import StagedBatch
from herder.dataplane.storage import STAGING, FileEntry, Storage, batch_of, parse_writer_dir
from herder.ensemble.client import EnsembleClient
from herder.ensemble.txn import (
    Append,
    CheckEndOffset,
    CheckKeyVersion,
    CreateLog,
    DeleteLog,
    Op,
    TxnResult,
)
from herder.errors import (
    ConfigError,
    ErrorCode,
    HerderError,
    InvalidPartitions,
    TopicAlreadyExists,
    UnknownLog,
    UnknownTopicOrPartition,
    error_from_code,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from herder.dataplane.spark import SparkRuntime

log = logging.getLogger(__name__)

#: Kafka Connect's key for the partitions of a topic it creates.
DEFAULT_PARTITIONS_KEY = "topic.creation.default.partitions"
#: Offset ranges to read: partition -> (from, to), ``to`` None for "the current end".
OffsetRanges = Mapping[int, tuple[int, int | None]]


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class TxnRefused(HerderError):
    """One of the caller's own operations refused a commit; nothing was written.

    ``index`` is that operation's index in the ops the caller passed; ``code`` the
    refusal's (CHECK_FAILED for a failed check, e.g. a fencing epoch or a batch that
    is already committed).
    """

    def __init__(self, result: TxnResult) -> None:
        super().__init__(result.message)
        self.result = result
        self.index = result.failed_op
        self.code = ErrorCode(result.error_code)


@dataclass(frozen=True)
class BatchOps:
    """The operations that commit a staged batch, and what they publish.

    ``ops`` are to be placed after ``offset`` operations of the caller's in the same
    transaction; ``checks`` maps the index (within ``ops``) of each end-offset check to
    its partition, and :meth:`partition_of` does the same for an index of the whole
    transaction. The append of a segment's record follows its check.
    """

    ops: list[Op]
    segments: dict[TopicPartition, Segment]
    offset: int = 0
    checks: dict[int, TopicPartition] = field(default_factory=dict)

    def partition_of(self, index: int) -> TopicPartition | None:
        return self.checks.get(index - self.offset)


@dataclass(frozen=True)
class Committed:
    """A committed batch: the transaction's result and the segments it published."""

    result: TxnResult
    segments: dict[TopicPartition, Segment]
    attempts: int

    @property
    def zxid(self) -> int:
        return self.result.zxid


@dataclass
class RetentionReport:
    """What a retention pass did, per partition: base offsets retired and purged."""

    retired: dict[int, list[int]] = field(default_factory=dict)
    purged: dict[int, list[int]] = field(default_factory=dict)


class _CommitSignals:
    """Commits made in this process, by topic: a reader waiting for new records of a
    topic (a sink task) is woken when a writer of the same worker (a source task, on
    a thread and event loop of its own) commits to it, rather than at its next poll.
    Commits by other processes are not seen here; readers keep polling for those."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._marks: dict[str, int] = {}
        self._waiters: dict[str, set[tuple[asyncio.AbstractEventLoop, asyncio.Event]]] = {}

    def marks(self, names: Iterable[str]) -> dict[str, int]:
        with self._lock:
            return {name: self._marks.get(name, 0) for name in names}

    def committed(self, names: Iterable[str]) -> None:
        with self._lock:
            woken = set()
            for name in names:
                self._marks[name] = self._marks.get(name, 0) + 1
                woken |= self._waiters.get(name, set())
        for loop, event in woken:
            with contextlib.suppress(RuntimeError):  # the waiter's loop has closed
                loop.call_soon_threadsafe(event.set)

    async def wait(self, marks: Mapping[str, int], timeout: float) -> bool:
        """Whether one of the topics of ``marks`` saw a commit since they were taken;
        waits up to ``timeout`` seconds for one."""
        waiter = (asyncio.get_running_loop(), asyncio.Event())
        with self._lock:
            if any(self._marks.get(name, 0) != mark for name, mark in marks.items()):
                return True
            for name in marks:
                self._waiters.setdefault(name, set()).add(waiter)
        try:
            async with asyncio.timeout(timeout):
                await waiter[1].wait()
            return True
        except TimeoutError:
            return False
        finally:
            with self._lock:
                for name in marks:
                    self._waiters.get(name, set()).discard(waiter)
                    if not self._waiters.get(name, True):
                        del self._waiters[name]


_signals = _CommitSignals()


class Topics:
    """Topic metadata through one ensemble client; files through ``storage``."""

    def __init__(
        self,
        client: EnsembleClient,
        storage: Storage | None = None,
        *,
        default_partitions: int = 1,
        default_config: Mapping[str, Any] | None = None,
        spark: SparkRuntime | None = None,
        clock: Callable[[], int] = wall_clock_ms,
        commit_attempts: int = 50,
    ) -> None:
        if default_partitions < 1:
            raise ConfigError(f"{DEFAULT_PARTITIONS_KEY}={default_partitions}: must be >= 1")
        self.client = client
        self._storage = storage
        self.default_partitions = default_partitions
        self.default_config = dict(default_config or {})
        parse_topic_config(self.default_config)
        self.spark = spark
        self.clock = clock
        self.commit_attempts = commit_attempts
        self._topics: dict[str, Topic] = {}
        self._topics_position = 0
        self._topics_lock = asyncio.Lock()
        self._states: dict[tuple[str, int, int], PartitionState] = {}
        self._locks: dict[tuple[str, int, int], asyncio.Lock] = {}

    @property
    def storage(self) -> Storage:
        if self._storage is None:
            raise ConfigError("no storage.root given: topic files cannot be reached")
        return self._storage

    # -- definitions -----------------------------------------------------------------

    async def refresh(self) -> None:
        """Read what ``_topics`` gained since the last refresh."""
        async with self._topics_lock:
            try:
                self._topics_position = await self._follow(
                    TOPICS_LOG, self._topics_position, self._apply_topic
                )
            except UnknownLog:
                self._topics.clear()

    def _apply_topic(self, record: Any) -> None:
        name = record.key.decode()
        topic = decode_topic(record)
        old = self._topics.get(name)
        if old is not None and (topic is None or topic.version != old.version):
            self._forget(name, old.version)
        if topic is None:
            self._topics.pop(name, None)
        else:
            self._topics[name] = topic

    def _forget(self, name: str, version: int) -> None:
        for key in [k for k in self._states if k[0] == name and k[1] == version]:
            del self._states[key]
            self._locks.pop(key, None)

    async def list_topics(self) -> list[Topic]:
        await self.refresh()
        return sorted(self._topics.values(), key=lambda t: t.name)

    async def get(self, name: str, *, refresh: bool = True) -> Topic:
        """The topic ``name``; UnknownTopicOrPartition if there is none."""
        if refresh or name not in self._topics:
            await self.refresh()
        topic = self._topics.get(name)
        if topic is None:
            raise UnknownTopicOrPartition(f"topic {name!r} does not exist")
        return topic

    async def create(
        self,
        name: str,
        partitions: int | None = None,
        config: Mapping[str, Any] | None = None,
        *,
        if_absent: bool = False,
    ) -> Topic:
        """Create topic ``name`` with its segment logs, in one transaction."""
        check_topic_name(name)
        count = self.default_partitions if partitions is None else partitions
        if count < 1:
            raise InvalidPartitions(f"topic {name!r}: partitions must be >= 1, not {count}")
        spec = TopicSpec(
            name=name,
            partitions=count,
            config=parse_topic_config({**self.default_config, **(config or {})}),
            created_ms=self.clock(),
        )
        key = name.encode()
        ops: list[Op] = [
            CreateLog(TOPICS_LOG, compacted=True, if_absent=True),
            CheckKeyVersion(TOPICS_LOG, key, None),
            Append(TOPICS_LOG, key, encode(spec)),
            *(CreateLog(segment_log(name, p), compacted=True) for p in range(count)),
        ]
        result = await self.client.transact(ops, check=False)
        if result.ok:
            topic = Topic(spec, result.zxid)
            self._topics[name] = topic
            log.info("created topic %s with %d partitions", name, count)
            return topic
        if result.failed_op == 1:
            if if_absent:
                return await self.get(name)
            raise TopicAlreadyExists(f"topic {name!r} already exists")
        raise error_from_code(result.error_code, result.message)

    async def ensure(self, name: str, partitions: int | None = None) -> Topic:
        """The topic ``name``, created with ``partitions`` (or the default) if absent.

        This is auto-creation: two workers racing to create the same topic both get
        the one that won. A topic this process already knows is returned without a
        round trip (if it was deleted since, the commit that uses it says so).
        """
        topic = self._topics.get(name)
        if topic is None:
            await self.refresh()
            topic = self._topics.get(name)
        if topic is not None:
            return topic
        return await self.create(name, partitions, if_absent=True)

    async def delete(self, name: str, *, delete_files: bool = True) -> Topic:
        """Delete ``name``, its segment logs and (with ``delete_files``) its segments' files.

        Files of batches staged for the topic but never committed are left to the
        reaping of their writers' directories.
        """
        for _ in range(self.commit_attempts):
            topic = await self.get(name)
            states = await self.partitions(name)
            key = name.encode()
            ops: list[Op] = [
                CheckKeyVersion(TOPICS_LOG, key, topic.version),
                *(CheckEndOffset(s.log, s.log_end) for s in states),
                Append(TOPICS_LOG, key, None),
                *(DeleteLog(s.log) for s in states),
            ]
            result = await self.client.transact(ops, check=False)
            if result.error_code == ErrorCode.CHECK_FAILED:
                continue  # a writer committed meanwhile: its files must go too
            result.raise_for_error()
            self._topics.pop(name, None)
            self._forget(name, topic.version)
            if delete_files:
                segments = [seg for s in states for seg in s.segments.values()]
                await asyncio.to_thread(self._delete_segment_files, name, segments)
            log.info("deleted topic %s", name)
            return topic
        raise HerderError(f"topic {name!r} kept changing; could not delete it")

    # -- partitions ------------------------------------------------------------------

    async def partition(self, name: str, partition: int, *, refresh: bool = True) -> PartitionState:
        """What is committed in one partition (without ``refresh``: as last seen)."""
        topic = await self.get(name, refresh=False)
        if not 0 <= partition < topic.partitions:
            raise UnknownTopicOrPartition(
                f"topic {name!r} has no partition {partition} (it has {topic.partitions})"
            )
        key = (name, topic.version, partition)
        state = self._states.get(key)
        if state is not None and not refresh:
            return state
        if state is None:
            state = self._states.setdefault(key, PartitionState(name, partition))
        await self._catch_up(topic, state)
        return state

    async def partitions(
        self, name: str, partitions: Iterable[int] | None = None
    ) -> list[PartitionState]:
        """Refreshed states of ``partitions`` (all by default), with one round trip
        for the partitions that did not change."""
        topic = await self.get(name)
        wanted = list(range(topic.partitions)) if partitions is None else list(partitions)
        for p in wanted:
            if not 0 <= p < topic.partitions:
                raise UnknownTopicOrPartition(f"topic {name!r} has no partition {p}")
        states = [
            self._states.setdefault((name, topic.version, p), PartitionState(name, p))
            for p in wanted
        ]
        try:
            ends = await self.client.end_offsets([s.log for s in states])
        except UnknownLog as exc:
            raise UnknownTopicOrPartition(f"topic {name!r} does not exist") from exc
        await asyncio.gather(
            *(self._catch_up(topic, s) for s in states if ends.get(s.log) != s.log_end)
        )
        return states

    async def _catch_up(self, topic: Topic, state: PartitionState) -> None:
        lock = self._locks.setdefault((topic.name, topic.version, state.partition), asyncio.Lock())
        async with lock:
            try:
                state.log_end = await self._follow(state.log, state.log_end, state.apply)
            except UnknownLog as exc:
                raise UnknownTopicOrPartition(f"topic {topic.name!r} does not exist") from exc

    async def _follow(self, log_name: str, position: int, apply: Callable[[Any], None]) -> int:
        """Apply the records of ``log_name`` from ``position`` to its end; return the end."""
        while True:
            reply = await self.client.read(log_name, position, max_records=2_000)
            for record in reply.records:
                apply(record)
            position = reply.next_offset
            if position >= reply.end_offset:
                return position

    async def end_offsets(self, name: str) -> dict[int, int]:
        """The offset the next record of each partition will get."""
        return {s.partition: s.next_offset for s in await self.partitions(name)}

    async def start_offsets(self, name: str) -> dict[int, int]:
        """The lowest offset a reader can still get in each partition."""
        result = {}
        for s in await self.partitions(name):
            live = s.live()
            result[s.partition] = max(
                s.start_offset, live[0].base_offset if live else s.next_offset
            )
        return result

    # -- committing ------------------------------------------------------------------

    async def commit_ops(self, staged: StagedBatch, *, offset: int = 0) -> BatchOps:
        """The operations that publish ``staged``, for a transaction in which ``offset``
        operations of the caller's come first.

        Base offsets come from this process's view of each partition; if another
        writer moved a partition since, the transaction is refused at that partition's
        :class:`CheckEndOffset` (see :meth:`BatchOps.partition_of`).
        """
        ops: list[Op] = [
            CheckKeyVersion(TOPICS_LOG, topic.encode(), version)
            for topic, version in sorted(staged.topic_versions.items())
        ]
        segments: dict[TopicPartition, Segment] = {}
        checks: dict[int, TopicPartition] = {}
        for part in staged.segments:
            state = await self.partition(part.topic, part.partition, refresh=False)
            segment = Segment(
                partition=part.partition,
                base_offset=state.next_offset,
                count=part.count,
                files=part.files,
                bytes=part.bytes,
                max_timestamp=part.max_timestamp,
                file_counts=part.file_counts,
                key_type=part.key_type,
                value_type=part.value_type,
                value_constants=part.value_constants,
            )
            tp = TopicPartition(part.topic, part.partition)
            segments[tp] = segment
            checks[len(ops)] = tp
            ops.append(CheckEndOffset(state.log, state.log_end))
            ops.append(Append(state.log, segment.key, encode(segment)))
        return BatchOps(ops, segments, offset, checks)

    @staticmethod
    def commit_marks(names: Iterable[str]) -> dict[str, int]:
        """Where this process's commits to ``names`` stand, for :meth:`wait_for_commit`."""
        return _signals.marks(names)

    @staticmethod
    async def wait_for_commit(marks: Mapping[str, int], timeout: float) -> bool:
        """Whether this process committed to a topic of ``marks`` since they were taken,
        waiting up to ``timeout`` seconds for it (commits of other processes are not
        seen: poll for those)."""
        return await _signals.wait(marks, timeout)

    async def commit(self, staged: StagedBatch, ops: Sequence[Op] = ()) -> Committed:
        """Publish ``staged`` together with the caller's ``ops``, atomically.

        Retries while the batch loses races for base offsets; raises
        :class:`TxnRefused` if one of ``ops`` refuses, UnknownTopicOrPartition if a
        topic was deleted (or recreated) since the batch was staged.
        """
        own = list(ops)
        for attempt in range(1, self.commit_attempts + 1):
            batch = await self.commit_ops(staged, offset=len(own))
            result = await self.client.transact([*own, *batch.ops], check=False)
            if result.ok:
                self._committed(staged, batch, result)
                _signals.committed(staged.topic_versions)
                return Committed(result, batch.segments, attempt)
            if result.failed_op < 0:
                raise error_from_code(result.error_code, result.message)
            if result.failed_op < len(own):
                raise TxnRefused(result)
            raced = batch.partition_of(result.failed_op)
            if raced is None or result.error_code != ErrorCode.CHECK_FAILED:
                await self.refresh()
                for topic, version in staged.topic_versions.items():
                    current = self._topics.get(topic)
                    if current is None or current.version != version:
                        raise UnknownTopicOrPartition(
                            f"topic {topic!r} was deleted since batch {staged.dir} was staged"
                        )
                raise error_from_code(result.error_code, result.message)
            log.debug(
                "commit of %s lost the race for %s (attempt %d); re-reading",
                staged.dir,
                raced,
                attempt,
            )
            touched = {(s.topic, s.partition) for s in staged.segments}
            await asyncio.gather(*(self.partition(t, p) for t, p in touched))
            await asyncio.sleep(random.uniform(0, 0.005 * min(attempt, 20)))
        raise HerderError(
            f"batch {staged.dir} lost the race for its partitions' offsets "
            f"{self.commit_attempts} times in a row"
        )

    def _committed(self, staged: StagedBatch, batch: BatchOps, result: TxnResult) -> None:
        """Take this process's own commit into its view without reading it back."""
        for index, tp in batch.checks.items():
            append_offset = result.offsets[batch.offset + index + 1]
            topic = self._topics.get(tp.topic)
            if topic is None or topic.version != staged.topic_versions.get(tp.topic):
                continue
            state = self._states.get((tp.topic, topic.version, tp.partition))
            if state is not None and state.log_end == append_offset:
                segment = batch.segments[tp]
                state.segments[segment.base_offset] = segment
                state.log_end = append_offset + 1

    # -- reading -----------------------------------------------------------------------

    async def plan_read(self, name: str, ranges: OffsetRanges | None = None) -> list[SegmentSlice]:
        """The committed segments holding the offsets of ``ranges``, in (partition, offset)
        order; every partition from its start to its current end by default."""
        states = await self.partitions(name, None if ranges is None else sorted(ranges))
        return slices_of(name, states, ranges)

    async def read(
        self,
        name: str,
        ranges: OffsetRanges | None = None,
        *,
        ordered: bool = False,
        pool: str | None = None,
    ) -> DataFrame:
        """Records of ``ranges`` as a DataFrame of SINK_COLUMNS (needs ``spark``)."""
        df, _ = await self.read_ranged(name, ranges, ordered=ordered, ranged=False, pool=pool)
        return df

    async def read_ranged(
        self,
        name: str,
        ranges: OffsetRanges | None = None,
        *,
        ordered: bool = False,
        ranged: bool = True,
        pool: str | None = None,
        slices: list[SegmentSlice] | None = None,
        columns: Mapping[str, str | None] | None = None,
    ) -> tuple[DataFrame, list[OffsetRange] | None]:
        """:meth:`read`, with, if ``ranged``, the offset range each of the DataFrame's
        Spark partitions holds, in their order, or None if they do not follow offset
        ranges (see :func:`~herder.dataplane.reader.slices_dataframe`). ``slices``: the
        read already planned from states at hand (:func:`slices_of`). ``columns``: the
        only columns a ranged DataFrame need have, and how (see
        :meth:`~herder.connect.SinkTask.columns_read`); the others may be left out."""
        if self.spark is None:
            raise ConfigError("reading a topic into a DataFrame needs a Spark runtime")
        runtime, storage = self.spark, self.storage
        if slices is None:
            slices = await self.plan_read(name, ranges)

        def build() -> tuple[DataFrame, list[OffsetRange] | None]:
            # for the next delivery's plan, which the event loop makes without a call
            # into the JVM: a cluster's executors come and go
            runtime.refresh_parallelism()
            return slices_dataframe(
                runtime.session,
                storage,
                name,
                slices,
                ordered=ordered,
                ranged=ranged,
                columns=columns,
            )

        return await runtime.run(build, pool=pool)

    # -- retention -------------------------------------------------------------------

    async def enforce_retention(self, name: str, now_ms: int | None = None) -> RetentionReport:
        """One retention pass over ``name``: purge retired segments whose delay is over,
        then retire the segments past ``retention.ms`` / ``retention.bytes``.

        Retiring commits the new start offset and marks the segments with the time
        their files may go (``retention.file.delete.delay.ms`` from now), so a reader
        that planned on them still finds their files; a later pass deletes the files
        and then the segments' records. Several workers may run passes at once: the
        start-offset record's version decides which of them retires.
        """
        now = self.clock() if now_ms is None else now_ms
        topic = await self.get(name)
        report = RetentionReport()
        delay = topic.config["retention.file.delete.delay.ms"]
        for state in await self.partitions(name):
            plan = plan_retention(state, topic.config, now)
            if plan.purge:
                await self._purge(name, state, plan)
                report.purged[state.partition] = [s.base_offset for s in plan.purge]
            if plan.retire and await self._retire(state, plan, now + delay):
                report.retired[state.partition] = [s.base_offset for s in plan.retire]
        return report

    async def _purge(self, name: str, state: PartitionState, plan: RetentionPlan) -> None:
        await asyncio.to_thread(self._delete_segment_files, name, plan.purge)
        ops: list[Op] = [Append(state.log, s.key, None) for s in plan.purge]
        await self.client.transact(ops)
        log.info(
            "topic %s partition %d: deleted the files of %d retired segments",
            name,
            state.partition,
            len(plan.purge),
        )

    async def _retire(self, state: PartitionState, plan: RetentionPlan, delete_after: int) -> bool:
        ops: list[Op] = [
            CheckKeyVersion(state.log, START_KEY, state.start_version),
            Append(state.log, START_KEY, encode(StartOffset(plan.new_start))),
            *(
                Append(
                    state.log,
                    s.key,
                    encode(msgspec.structs.replace(s, delete_after_ms=delete_after)),
                )
                for s in plan.retire
            ),
        ]
        result = await self.client.transact(ops, check=False)
        if result.failed_op == 0 and result.error_code == ErrorCode.CHECK_FAILED:
            log.info(
                "topic %s partition %d: another retention pass won", state.topic, state.partition
            )
            return False
        result.raise_for_error()
        log.info(
            "topic %s partition %d: retired %d segments; start offset is now %d",
            state.topic,
            state.partition,
            len(plan.retire),
            plan.new_start,
        )
        return True

    def _delete_segment_files(self, name: str, segments: Iterable[Segment]) -> None:
        storage = self.storage
        batches = set()
        for segment in segments:
            dirs = {f.rsplit("/", 1)[0] for f in segment.files}
            for directory in dirs:
                storage.delete_dir(directory)
                batches.add(batch_of(directory))
        for batch in batches:
            storage.delete_if_empty(f"{batch}/topic={name}")
            storage.delete_if_empty(batch)

    # -- staging -------------------------------------------------------------------

    async def reap_staging(self, task: str, epoch: int) -> list[str]:
        """Delete what ``task``'s writers of epochs before ``epoch`` staged and never
        committed; return the paths deleted.

        Call it once ``epoch`` is the task's fencing epoch in the ensemble: from then on
        no older incarnation can commit, so a batch no committed segment names is
        garbage. The ensemble is synced first, so every commit that happened before
        the epoch was taken is seen.
        """
        layout = await asyncio.to_thread(self._old_staging, task, epoch)
        if not layout:
            return []
        await self.client.sync()
        await self.refresh()
        named = {
            entry.path.rsplit("/", 1)[-1].removeprefix("topic=")
            for batches in layout.values()
            for entries in batches.values()
            for entry in entries
            if entry.is_dir and entry.path.rsplit("/", 1)[-1].startswith("topic=")
        }
        committed: set[str] = set()
        for name in named & set(self._topics):
            try:
                states = await self.partitions(name)
            except UnknownTopicOrPartition:
                continue
            committed.update(
                f"{batch_of(f)}/topic={name}"
                for s in states
                for seg in s.segments.values()
                for f in seg.files
            )
        return await asyncio.to_thread(self._reap, layout, committed)

    def _old_staging(self, task: str, epoch: int) -> dict[str, dict[str, list[FileEntry]]]:
        """writer dir -> batch dir -> its entries, for ``task``'s epochs before ``epoch``."""
        storage = self.storage
        layout: dict[str, dict[str, list[FileEntry]]] = {}
        for entry in storage.list_dir(STAGING):
            parsed = parse_writer_dir(entry.path.rsplit("/", 1)[-1])
            if entry.is_dir and parsed is not None and parsed[0] == task and parsed[1] < epoch:
                layout[entry.path] = {
                    batch.path: storage.list_dir(batch.path)
                    for batch in storage.list_dir(entry.path)
                    if batch.is_dir
                }
        return layout

    def _reap(
        self, layout: Mapping[str, Mapping[str, Sequence[FileEntry]]], committed: set[str]
    ) -> list[str]:
        storage = self.storage
        deleted = []
        for writer, batches in layout.items():
            for batch, entries in batches.items():
                for entry in entries:
                    if entry.path not in committed:
                        storage.delete(entry)
                        deleted.append(entry.path)
                storage.delete_if_empty(batch)
            if storage.delete_if_empty(writer):
                deleted.append(writer)
        if deleted:
            log.info("reaped %d uncommitted staging entries of %s", len(deleted), ", ".join(layout))
        return deleted


def slices_of(
    name: str, states: Iterable[PartitionState], ranges: OffsetRanges | None = None
) -> list[SegmentSlice]:
    """The committed segments of partition ``states`` of topic ``name`` that hold the
    offsets of ``ranges`` (from each partition's start to its end by default), in the
    states' order and by offset."""
    slices = []
    for state in states:
        start, stop = (0, None) if ranges is None else ranges[state.partition]
        stop = state.next_offset if stop is None else min(stop, state.next_offset)
        for segment in state.overlapping(start, stop):
            slices.append(
                SegmentSlice(
                    name,
                    segment,
                    max(start, segment.base_offset, state.start_offset),
                    min(stop, segment.end_offset),
                )
            )
    return slices
