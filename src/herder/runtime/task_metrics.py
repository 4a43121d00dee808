"""What a worker counts about its connectors and tasks, under Kafka Connect's metric names.

Connect's metrics live in groups (``connect-worker-metrics``, ``connector-metrics``,
``connector-task-metrics``, ``source-task-metrics``, ``sink-task-metrics``,
``task-error-metrics``), each metric named in kebab case. :class:`WorkerMetrics` keeps
them for one worker: the worker tells it about starts, failures and statuses, and each
task's execution records what it polls, writes, reads, puts and commits into the
:class:`TaskMetrics` it is handed. :meth:`WorkerMetrics.samples` reads them all out as
:class:`Sample` rows under Connect's group and metric names, which
:mod:`herder.runtime.rest.prometheus` turns into Prometheus text by one rule.

Rates (``…-rate``) are per second over the last :data:`RATE_WINDOW_S` seconds (Connect's
default sample window, 30 s, times its two samples is 60 s; one window of 30 s is close
enough to read the same). Averages and maxima (``…-avg``, ``…-max``) are over the
task's whole run, not a window; a figure with nothing to say yet is absent rather than
NaN. Counts are only ever added to from the task's own coroutine or threads; a lock
keeps a scrape from reading half an update.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from herder.runtime.core.protocol import ConnectorTaskId

__all__ = [
    "RATE_WINDOW_S",
    "JobTimes",
    "Sample",
    "TaskMetrics",
    "WorkerMetrics",
]

#: the window of every ``…-rate`` metric, in seconds
RATE_WINDOW_S = 30.0

WORKER = "connect-worker-metrics"
CONNECTOR = "connector-metrics"
TASK = "connector-task-metrics"
SOURCE = "source-task-metrics"
SINK = "sink-task-metrics"
ERRORS = "task-error-metrics"
#: herder's own figures, beside Connect's
HERDER = "herder"

Labels = tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class Sample:
    """One metric's value: its Connect group and name, labels, and a number or a string."""

    group: str
    name: str
    value: float | str
    labels: Labels = ()


class _Rate:
    """Events per second over the last :data:`RATE_WINDOW_S` seconds."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._events: deque[tuple[float, float]] = deque()

    def add(self, count: float) -> None:
        if count:
            self._events.append((self._clock(), count))

    def per_second(self) -> float:
        now = self._clock()
        while self._events and self._events[0][0] < now - RATE_WINDOW_S:
            self._events.popleft()
        return sum(n for _, n in self._events) / RATE_WINDOW_S


@dataclass(slots=True)
class _Stat:
    """Count, sum and maximum of some measurement (a batch's size, a call's time)."""

    count: int = 0
    total: float = 0.0
    max: float | None = None

    def add(self, value: float) -> None:
        self.count += 1
        self.total += value
        self.max = value if self.max is None else max(self.max, value)

    @property
    def avg(self) -> float | None:
        return self.total / self.count if self.count else None


@dataclass(slots=True)
class JobTimes:
    """Spark jobs a task ran, and how long its submissions took in all."""

    jobs: int = 0
    seconds: float = 0.0
    _seen: set[int] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, seconds: float, job_ids: list[int] | None = None) -> None:
        """A submission took ``seconds``; ``job_ids`` are the jobs of the task's job
        group Spark still knows of (None where it cannot tell: one job is counted)."""
        with self._lock:
            self.seconds += seconds
            if job_ids is None:
                self.jobs += 1
                return
            ids = set(job_ids)
            self.jobs += len(ids - self._seen)
            # Spark forgets old jobs (spark.ui.retainedJobs): what it still knows is all
            # a later submission's jobs can be told apart from
            self._seen = ids


class TaskMetrics:
    """One task's metrics: ``connector-task-metrics`` and its source or sink group,
    ``task-error-metrics``, and herder's own (Spark jobs, sink lag)."""

    def __init__(
        self, task_id: ConnectorTaskId, kind: str, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.task_id = task_id
        #: "source", "sink", or "" until the execution says
        self.kind = kind
        self._clock = clock
        self._lock = threading.Lock()
        self.status = "unassigned"
        self._since = clock()
        self._created = self._since
        self._time_in: dict[str, float] = {}
        # source
        self.polled = 0
        self.written = 0
        self._poll_rate = _Rate(clock)
        self._write_rate = _Rate(clock)
        self.poll_batch_ms = _Stat()
        self.source_active = 0
        self._active_stat = _Stat()
        # sink
        self.read = 0
        self.sent = 0
        self._read_rate = _Rate(clock)
        self._send_rate = _Rate(clock)
        self.put_batch_ms = _Stat()
        self.partition_count = 0
        self.commit_completions = 0
        self.commit_skips = 0
        self.lag_records: int | None = None
        self.lag_seconds: float | None = None
        # both
        self.batch_size = _Stat()
        self.commit_ms = _Stat()
        self.commit_failures = 0
        # errors
        self.record_failures = 0
        self.record_errors = 0
        self.records_skipped = 0
        self.retries = 0
        self.errors_logged = 0
        self.dlq_requests = 0
        self.dlq_failures = 0
        self.last_error_ms = 0
        #: Spark work submitted in this task's scheduler pool
        self.spark = JobTimes()

    # -- what the worker records ------------------------------------------------------

    def set_status(self, status: str) -> None:
        with self._lock:
            now = self._clock()
            self._time_in[self.status] = self._time_in.get(self.status, 0.0) + now - self._since
            self.status, self._since = status, now

    def _ratio(self, status: str) -> float:
        now = self._clock()
        spent = self._time_in.get(status, 0.0) + (now - self._since if self.status == status else 0)
        lived = now - self._created
        return spent / lived if lived > 0 else 0.0

    # -- what a source task's execution records ----------------------------------------

    def source_polled(self, records: int, took_s: float) -> None:
        """A batch of ``records`` was gathered from ``poll()`` in ``took_s`` seconds."""
        with self._lock:
            self.polled += records
            self._poll_rate.add(records)
            self.poll_batch_ms.add(took_s * 1000)
            self.source_active = records
            self._active_stat.add(records)

    def source_committed(self, records: int, took_s: float) -> None:
        """``records`` were written to their topics and committed with their offsets."""
        with self._lock:
            self.written += records
            self._write_rate.add(records)
            self.batch_size.add(records)
            self.commit_ms.add(took_s * 1000)
            self.source_active = 0

    def source_abandoned(self) -> None:
        """The batch in flight was discarded (fenced, or a check failed)."""
        with self._lock:
            self.source_active = 0
            self.commit_failures += 1

    # -- what a sink task's execution records ----------------------------------------

    def sink_read(self, records: int) -> None:
        with self._lock:
            self.read += records
            self._read_rate.add(records)
            self.batch_size.add(records)

    def sink_put(self, records: int, took_s: float) -> None:
        """``records`` were handed to ``put()``, which took ``took_s`` seconds."""
        with self._lock:
            self.sent += records
            self._send_rate.add(records)
            self.put_batch_ms.add(took_s * 1000)

    def sink_committed(self, ok: bool, took_s: float) -> None:
        with self._lock:
            self.commit_ms.add(took_s * 1000)
            if ok:
                self.commit_completions += 1
            else:
                self.commit_failures += 1
                self.commit_skips += 1

    def sink_assigned(self, partitions: int) -> None:
        with self._lock:
            self.partition_count = partitions

    def sink_lag(self, records: int, seconds: float) -> None:
        """How far the task is behind its partitions' ends, after a delivery."""
        with self._lock:
            self.lag_records, self.lag_seconds = records, seconds

    # -- errors -------------------------------------------------------------------------

    def record_errors_seen(
        self, failed: int, *, skipped: bool, logged: bool, dead_letters: bool
    ) -> None:
        """``failed`` records failed in a converter or transform and were handled."""
        if not failed:
            return
        with self._lock:
            self.record_failures += failed
            self.record_errors += failed
            if skipped:
                self.records_skipped += failed
            if logged:
                self.errors_logged += failed
            self.last_error_ms = int(time.time() * 1000)
            if dead_letters:
                self.dlq_requests += 1

    def dead_letters_failed(self) -> None:
        with self._lock:
            self.dlq_failures += 1

    def retried(self) -> None:
        with self._lock:
            self.retries += 1
            self.record_failures += 1

    # -- reading ------------------------------------------------------------------------

    def samples(self) -> Iterator[Sample]:
        labels: Labels = (("connector", self.task_id.connector), ("task", str(self.task_id.task)))
        with self._lock:
            rows: list[tuple[str, str, float | str | None]] = [
                (TASK, "status", self.status),
                (TASK, "running-ratio", self._ratio("running")),
                (TASK, "pause-ratio", self._ratio("paused")),
                (TASK, "batch-size-avg", self.batch_size.avg),
                (TASK, "batch-size-max", self.batch_size.max),
                (TASK, "offset-commit-avg-time-ms", self.commit_ms.avg),
                (TASK, "offset-commit-max-time-ms", self.commit_ms.max),
                *self._commit_percentages(),
                (ERRORS, "total-record-failures", self.record_failures),
                (ERRORS, "total-record-errors", self.record_errors),
                (ERRORS, "total-records-skipped", self.records_skipped),
                (ERRORS, "total-retries", self.retries),
                (ERRORS, "total-errors-logged", self.errors_logged),
                (ERRORS, "deadletterqueue-produce-requests", self.dlq_requests),
                (ERRORS, "deadletterqueue-produce-failures", self.dlq_failures),
                (ERRORS, "last-error-timestamp", self.last_error_ms),
                (HERDER, "task-spark-jobs-total", self.spark.jobs),
                (HERDER, "task-spark-job-seconds-total", self.spark.seconds),
            ]
            if self.kind == "source":
                rows += [
                    (SOURCE, "source-record-poll-total", self.polled),
                    (SOURCE, "source-record-poll-rate", self._poll_rate.per_second()),
                    (SOURCE, "source-record-write-total", self.written),
                    (SOURCE, "source-record-write-rate", self._write_rate.per_second()),
                    (SOURCE, "poll-batch-avg-time-ms", self.poll_batch_ms.avg),
                    (SOURCE, "poll-batch-max-time-ms", self.poll_batch_ms.max),
                    (SOURCE, "source-record-active-count", self.source_active),
                    (SOURCE, "source-record-active-count-avg", self._active_stat.avg),
                    (SOURCE, "source-record-active-count-max", self._active_stat.max),
                ]
            elif self.kind == "sink":
                rows += [
                    (SINK, "sink-record-read-total", self.read),
                    (SINK, "sink-record-read-rate", self._read_rate.per_second()),
                    (SINK, "sink-record-send-total", self.sent),
                    (SINK, "sink-record-send-rate", self._send_rate.per_second()),
                    (SINK, "put-batch-avg-time-ms", self.put_batch_ms.avg),
                    (SINK, "put-batch-max-time-ms", self.put_batch_ms.max),
                    (SINK, "partition-count", self.partition_count),
                    (SINK, "offset-commit-completion-total", self.commit_completions),
                    (SINK, "offset-commit-skip-total", self.commit_skips),
                    (SINK, "sink-record-active-count", max(0, self.read - self.sent)),
                    (HERDER, "sink-task-lag-records", self.lag_records),
                    (HERDER, "sink-task-lag-seconds", self.lag_seconds),
                ]
        for group, name, value in rows:
            if value is not None:
                yield Sample(group, name, value, labels)

    def _commit_percentages(self) -> list[tuple[str, str, float | str | None]]:
        attempts = self.commit_ms.count + (self.commit_failures if self.kind == "source" else 0)
        if not attempts:
            return []
        failed = self.commit_failures / attempts
        return [
            (TASK, "offset-commit-success-percentage", 1.0 - failed),
            (TASK, "offset-commit-failure-percentage", failed),
        ]


class _Startups:
    def __init__(self) -> None:
        self.attempts = 0
        self.successes = 0
        self.failures = 0

    def samples(self, what: str) -> Iterator[tuple[str, float]]:
        yield f"{what}-startup-attempts-total", self.attempts
        yield f"{what}-startup-success-total", self.successes
        yield f"{what}-startup-failure-total", self.failures
        if self.attempts:
            yield f"{what}-startup-success-percentage", self.successes / self.attempts
            yield f"{what}-startup-failure-percentage", self.failures / self.attempts


@dataclass(slots=True)
class _ConnectorInfo:
    connector_class: str
    connector_type: str
    status: str = "unassigned"


class WorkerMetrics:
    """Every metric of one worker's connectors and tasks (see the module docstring)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._tasks: dict[ConnectorTaskId, TaskMetrics] = {}
        self._connectors: dict[str, _ConnectorInfo] = {}
        self.connector_startups = _Startups()
        self.task_startups = _Startups()

    def task(self, task_id: ConnectorTaskId, kind: str = "") -> TaskMetrics:
        """The metrics of a task starting here (fresh: a restart counts from zero)."""
        metrics = self._tasks[task_id] = TaskMetrics(task_id, kind, self._clock)
        return metrics

    def task_gone(self, task_id: ConnectorTaskId) -> None:
        self._tasks.pop(task_id, None)

    def tasks(self) -> list[TaskMetrics]:
        return list(self._tasks.values())

    def connector(self, name: str, connector_class: str, connector_type: str) -> None:
        self._connectors[name] = _ConnectorInfo(connector_class, connector_type)

    def connector_gone(self, name: str) -> None:
        self._connectors.pop(name, None)

    def connector_status(self, name: str, status: str) -> None:
        info = self._connectors.get(name)
        if info is not None:
            info.status = status

    def task_status(self, task_id: ConnectorTaskId, status: str) -> None:
        metrics = self._tasks.get(task_id)
        if metrics is not None:
            metrics.set_status(status)

    def samples(self, task_counts: dict[str, dict[str, int]] | None = None) -> Iterator[Sample]:
        """Every metric, Connect's groups first. ``task_counts`` are, per connector running
        here, its tasks by state as the status log has them (Connect's
        ``connector-…-task-count``)."""
        yield Sample(WORKER, "connector-count", len(self._connectors))
        yield Sample(WORKER, "task-count", len(self._tasks))
        for name, value in self.connector_startups.samples("connector"):
            yield Sample(WORKER, name, value)
        for name, value in self.task_startups.samples("task"):
            yield Sample(WORKER, name, value)
        for connector, counts in sorted((task_counts or {}).items()):
            labels: Labels = (("connector", connector),)
            yield Sample(WORKER, "connector-total-task-count", sum(counts.values()), labels)
            for state in ("running", "paused", "failed", "unassigned", "destroyed", "restarting"):
                yield Sample(WORKER, f"connector-{state}-task-count", counts.get(state, 0), labels)
        for name, info in sorted(self._connectors.items()):
            labels = (("connector", name),)
            yield Sample(CONNECTOR, "connector-class", info.connector_class, labels)
            yield Sample(CONNECTOR, "connector-type", info.connector_type, labels)
            yield Sample(CONNECTOR, "status", info.status, labels)
        for task_id in sorted(self._tasks, key=lambda t: (t.connector, t.task)):
            yield from self._tasks[task_id].samples()
