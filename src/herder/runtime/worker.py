"""The connectors and tasks running on one worker, and their statuses.

The herder decides *what* runs here; the :class:`Worker` makes it so: it instantiates
plugins, starts and stops them, steers them to their target state, and publishes every
transition to ``_status`` with the worker's generation, so a status written by a worker
that has since lost the work can never overwrite its new owner's.

Connector code may block, so it never runs on the event loop: each running task has a
thread of its own (as Connect's ``WorkerTask``), started and ended with it, for every
call into the task's code, while the task's control work (fencing, offsets, commits,
its group membership) runs on the worker's event loop over the worker's shared
connections; calls into a connector (``start``, ``stop``, ``task_configs``) run on a
pool of their own, each with a deadline. So no number of running tasks delays the
herder or another task, and a worker's connections do not grow with its tasks. All of
these threads are daemons: a task whose ``poll`` never returns is abandoned after the
graceful timeout (its fencing makes it harmless) and cannot keep a stopped worker alive.

Every start belongs to a generation of the group. A start whose generation has been
revoked by the time it would begin is dropped, and a task id has at most one execution
here at any moment: a second start of a running task is refused, and one whose previous
execution was abandoned and has not ended yet waits for it.

How a task moves data is not the worker's business: a :class:`TaskExecution`, made by
the data plane, runs until it is told to stop, and says when its task's ``start`` has
returned: only then is the task RUNNING. The worker does watch what
a task hands over, to record the connector's *active topics* in ``_status`` as Connect
does: the topic of every record or batch a source task's ``poll`` returns, and the
topics of the partitions a sink task is ``open``-ed for.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import logging
import threading
import time
import traceback
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from herder import logcontext
from herder.config import resolve, restore_references
from herder.connect import (
    Connector,
    ConnectorContext,
    SinkTask,
    SourceBatch,
    SourceTask,
    Task,
    TopicPartition,
)
from herder.coordinator.client import CoordinatorClient, CoordinatorConnections
from herder.ensemble.client import EnsembleClient
from herder.errors import HerderError
from herder.runtime.core.config_state import TargetState
from herder.runtime.core.protocol import ConnectorTaskId
from herder.runtime.core.status import ConnectorStatus, State, TaskStatus, TopicStatus
from herder.runtime.plugins import Plugins
from herder.runtime.stores import OffsetStore, StatusStore
from herder.runtime.task_metrics import Sample, TaskMetrics, WorkerMetrics
from herder.runtime.threads import DaemonThreadPool, TaskThread

log = logging.getLogger(__name__)

T = TypeVar("T")

#: how often a source task's lag (``SourceTask.lag``) is measured for its status
LAG_REPORT_INTERVAL_S = 2.0


class ConnectorCallTimeout(HerderError):
    """A call into connector code did not return within its deadline."""


class TaskControl:
    """What a task's execution is told (stop, pause), what it tells back (started, doing
    what), and the thread its connector code runs on.

    The execution runs on the worker's event loop; every call into the task's code goes
    through :meth:`call`, on the task's own thread, so no task's ``poll`` or ``put``
    holds up another task or the herder. ``stopping`` and ``paused`` are also plain
    thread events, for code that checks them from that thread.
    """

    def __init__(
        self,
        name: str = "task",
        on_started: Callable[[], None] = lambda: None,
        on_thread_exit: Callable[[], None] = lambda: None,
        metrics: TaskMetrics | None = None,
    ) -> None:
        #: where the execution records what it moved (Connect's task metrics)
        self.metrics = metrics if metrics is not None else TaskMetrics(ConnectorTaskId("", 0), "")
        self.stopping = threading.Event()
        self.paused = threading.Event()
        self.activity = "being created"
        self._on_started = on_started
        self._thread = TaskThread(name, on_thread_exit)
        self._changed = asyncio.Event()

    def doing(self, what: str) -> None:
        """Say what the execution is doing (shown if it is slow to start or to stop)."""
        self.activity = what

    def started(self) -> None:
        """The task's ``start`` has returned: it is RUNNING (or PAUSED) from now on."""
        self.activity = "running"
        self._on_started()

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the task's thread (in the caller's log context)."""
        context = contextvars.copy_context()
        return await asyncio.wrap_future(self._thread.submit(context.run, fn, *args))

    def stop(self) -> None:
        self.stopping.set()
        self.paused.clear()
        self._changed.set()

    def pause(self) -> None:
        self.paused.set()
        self._changed.set()

    def resume(self) -> None:
        self.paused.clear()
        self._changed.set()

    async def wait_while_paused(self) -> bool:
        """Wait while paused; True once the task should stop."""
        while self.paused.is_set() and not self.stopping.is_set():
            self._changed.clear()
            await self._changed.wait()
        return self.stopping.is_set()

    async def sleep(self, seconds: float) -> bool:
        """Wait ``seconds``, or less if told to stop or pause; True if told to stop."""
        if not self.stopping.is_set():
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(seconds):
                    await self._changed.wait()
        return self.stopping.is_set()

    def end(self) -> None:
        """The execution is over: its thread ends once its last call returns."""
        self._thread.close()


class TaskExecution(Protocol):
    """Moves a task's data until ``control.stopping`` is set, on the worker's event loop.

    It starts the task, calls ``control.started()`` once the task's ``start`` returned,
    runs every call into the task through ``control.call``, and while paused must not
    poll or put. Raising marks the task FAILED.
    """

    async def execute(self, control: TaskControl) -> None: ...


class ExecutionFactory(Protocol):
    """Makes each task's :class:`TaskExecution`: the data plane, or a test's stand-in.

    The herder hands it the worker's connections once they are up (:meth:`share`), opens
    it (:meth:`open`), asks it about a connector config before storing it
    (:meth:`validate_config`), and the worker closes it last (:meth:`close`). A factory
    that subclasses this protocol need only implement ``__call__``: it inherits
    do-nothing versions of the rest.
    """

    def __call__(
        self,
        task_id: ConnectorTaskId,
        task: Task,
        config: dict[str, str],
        connector_config: dict[str, str],
    ) -> TaskExecution:
        """The execution of the started ``task`` with ``config`` (and its connector's)."""
        ...

    def share(
        self,
        client: EnsembleClient,
        coordinator: CoordinatorClient,
        connections: CoordinatorConnections,
        offsets: OffsetStore,
    ) -> None:
        """Use the worker's started ensemble session, coordinator connections and source
        offset follower for the tasks, rather than open a second set (before :meth:`open`)."""

    async def open(self) -> None:
        """Open what the executions share (the worker runs this in the background)."""

    def validate_config(self, config: Mapping[str, str]) -> list[str]:
        """Problems with a connector config that only the executions can judge (its
        transforms, converters, ``errors.*``), one line each; none by default."""
        return []

    def worker_stopping(self) -> None:
        """The worker is stopping: the tasks it stops from now on will run again in its
        next process (a static worker's sink tasks keep their group places for it)."""

    async def metric_samples(self) -> list[Sample]:
        """Metrics of what the executions share (the data plane's topics), for
        ``/metrics``; none by default."""
        return []

    async def close(self) -> None:
        """Stop what :meth:`open` started; the worker's tasks have stopped by now."""


class _Context(ConnectorContext):
    """A connector instance's line to the worker: only the instance still assigned is
    heard (a stopped one's late error must not fail its successor)."""

    def __init__(self, worker: Worker, assigned: _AssignedConnector) -> None:
        self._worker = worker
        self._assigned = assigned

    def request_task_reconfiguration(self) -> None:
        self._worker._call_soon(self._worker._reconfiguration_asked, self._assigned)

    def raise_error(self, error: BaseException) -> None:
        self._worker._call_soon(self._worker._connector_failed_later, self._assigned, error)


@dataclass
class _AssignedConnector:
    """A connector assigned here: running (``started``), paused, stopped or failed."""

    name: str
    config: dict[str, str]
    target: TargetState
    instance: Connector | None = None
    #: whether ``instance.start`` has returned and ``stop`` has not been called since
    started: bool = False
    failure: BaseException | None = None
    #: one lifecycle call of the connector at a time (start, stop, task_configs), as
    #: Connect never calls a connector's code concurrently
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    #: no longer assigned here (stopped, revoked, deleted): what it still does is moot
    gone: bool = False


@dataclass
class _TaskRun:
    """One execution of a task on this worker, from its start until it ends."""

    id: ConnectorTaskId
    generation: int
    target: TargetState
    control: TaskControl
    execution: asyncio.Task[None] | None = None
    #: done once the execution has returned and its thread has ended
    ended: asyncio.Future[None] | None = None
    started: bool = False
    failed: bool = False
    deadline: asyncio.TimerHandle | None = None


@dataclass
class _DeferredStart:
    """A start waiting for the task's abandoned execution to end."""

    generation: int
    config: dict[str, str]
    connector_config: dict[str, str]
    target: TargetState


def _trace(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc)).rstrip()


class Worker:
    """Instances of the connectors and tasks assigned to this worker."""

    def __init__(
        self,
        worker_id: str,
        plugins: Plugins,
        statuses: StatusStore,
        execution_factory: ExecutionFactory,
        *,
        task_shutdown_timeout_ms: int = 5_000,
        task_start_timeout_ms: int = 60_000,
        connector_call_timeout_ms: int = 60_000,
        topic_tracking: bool = True,
    ) -> None:
        self.worker_id = worker_id
        self.plugins = plugins
        self.statuses = statuses
        self.execution_factory = execution_factory
        self.task_shutdown_timeout_ms = task_shutdown_timeout_ms
        self.task_start_timeout_ms = task_start_timeout_ms
        self.connector_call_timeout_ms = connector_call_timeout_ms
        self.topic_tracking = topic_tracking
        #: the generation whose work runs here (statuses are published with it)
        self.generation = -1
        #: False once that generation is revoked: its starts are dropped from then on
        self._live = False
        #: called (on the loop) when a connector asks for its tasks to be reconfigured
        self.on_task_reconfiguration: Callable[[str], None] = lambda name: None
        self._calls = DaemonThreadPool("herder-connector")
        self._connectors: dict[str, _AssignedConnector] = {}
        self._tasks: dict[ConnectorTaskId, _TaskRun] = {}
        #: executions that did not stop within the graceful timeout and have not ended
        self._abandoned: dict[ConnectorTaskId, _TaskRun] = {}
        self._deferred: dict[ConnectorTaskId, _DeferredStart] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._background: set[asyncio.Future[None]] = set()
        #: Connect's worker, connector and task metrics of what runs here
        self.metrics = WorkerMetrics()

    @property
    def connectors(self) -> set[str]:
        """Connectors assigned to this worker and not failed."""
        return {n for n, c in self._connectors.items() if c.failure is None}

    @property
    def tasks(self) -> set[ConnectorTaskId]:
        """Tasks with an execution here (running, paused, starting or failed)."""
        return set(self._tasks)

    @property
    def held_back(self) -> set[ConnectorTaskId]:
        """Tasks whose start waits for their previous execution to end."""
        return set(self._deferred)

    @property
    def abandoned(self) -> set[ConnectorTaskId]:
        """Tasks whose execution did not stop in time and has not ended yet."""
        return set(self._abandoned)

    # -- generations --------------------------------------------------------------------

    def assigned(self, generation: int) -> None:
        """Generation ``generation``'s work may start from now on."""
        self.generation = generation
        self._live = True

    def revoked(self) -> None:
        """The current generation's work may no longer start (it is being revoked)."""
        self._live = False
        self._deferred.clear()

    def _current(self, generation: int, what: str) -> bool:
        if self._live and generation == self.generation:
            return True
        log.info(
            "not starting %s on %s: generation %d is no longer current",
            what,
            self.worker_id,
            generation,
        )
        return False

    # -- plumbing -----------------------------------------------------------------------

    def _call_soon(self, fn: Callable[..., object], *args: object) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            # the loop may close meanwhile: the worker is gone, and so is the news
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(fn, *args)

    async def call_connector(
        self,
        name: str,
        what: str,
        fn: Callable[..., T],
        *args: Any,
        timeout_ms: int | None = None,
        on_abandon: Callable[[asyncio.Future[T]], None] | None = None,
    ) -> T:
        """Run connector code on the connector pool, giving up after its deadline.

        A call that overruns raises :class:`ConnectorCallTimeout` and is logged naming it
        (and again when it returns, if it does); it holds up nothing else.
        ``on_abandon`` gets the call's future if the caller gives up on it (its deadline,
        or the caller cancelled), to clean up after it once it returns.
        """
        self._loop = asyncio.get_running_loop()
        deadline_ms = self.connector_call_timeout_ms if timeout_ms is None else timeout_ms
        with logcontext.scope(name):
            context = contextvars.copy_context()
        future = asyncio.wrap_future(self._calls.submit(context.run, fn, *args))
        try:
            async with asyncio.timeout(deadline_ms / 1000):
                return await asyncio.shield(future)
        except asyncio.CancelledError:
            if on_abandon is not None:
                on_abandon(future)
            raise
        except TimeoutError:
            if on_abandon is not None:
                on_abandon(future)
            call = f"{what} of connector {name}"
            log.warning(
                "%s did not return within %d ms; giving up on it (its thread is left to "
                "finish on its own)",
                call,
                deadline_ms,
            )
            future.add_done_callback(lambda _: log.info("%s returned at last", call))
            setting = (
                "connector.call.timeout.ms"
                if timeout_ms is None
                else "task.shutdown.graceful.timeout.ms"
            )
            raise ConnectorCallTimeout(
                f"{call} did not return within {deadline_ms} ms ({setting})"
            ) from None

    async def _publish(self, status: ConnectorStatus | TaskStatus) -> None:
        if isinstance(status, TaskStatus):
            self.metrics.task_status(status.id, status.state.value.lower())
        else:
            self.metrics.connector_status(status.id, status.state.value.lower())
        try:
            await self.statuses.put(status)
        except Exception:
            log.exception("could not publish status %s", status)

    # -- connectors -------------------------------------------------------------------

    async def start_connector(
        self, name: str, config: dict[str, str], target: TargetState, generation: int
    ) -> bool:
        """Instantiate connector ``name`` and (unless PAUSED/STOPPED) start it.

        Returns whether it runs in its target state; a failure is published (FAILED) and
        kept, see :meth:`connector_failure`.
        """
        self._loop = asyncio.get_running_loop()
        if not self._current(generation, f"connector {name}"):
            return False
        if name in self._connectors:
            log.error(
                "connector %s is already assigned to %s; refusing to start it twice",
                name,
                self.worker_id,
            )
            return False
        assigned = self._connectors[name] = _AssignedConnector(name, dict(config), target)
        self.metrics.connector_startups.attempts += 1
        async with assigned.lock:
            if assigned.gone or not await self._bring_up(assigned):
                return False
            self.metrics.connector_startups.successes += 1
            await self._publish(
                ConnectorStatus(name, _state_of(assigned.target), self.worker_id, self.generation)
            )
        log.info("connector %s started on %s (%s)", name, self.worker_id, assigned.target.value)
        return True

    async def _bring_up(self, assigned: _AssignedConnector) -> bool:
        """Instantiate (once) and, for STARTED, start; on failure publish FAILED. Called
        with the connector's lock held."""
        name = assigned.name
        try:
            if assigned.instance is None:
                klass = self.plugins.connector_class(assigned.config.get("connector.class", ""))
                instance = klass()
                instance.initialize(_Context(self, assigned))
                assigned.instance = instance
                self.metrics.connector(
                    name, klass.__name__, "sink" if _is_sink(instance) else "source"
                )
            if assigned.target is TargetState.STARTED:
                instance = assigned.instance
                # the connector sees its config's provider references resolved; the
                # stored config and every REST answer keep the references
                config = await asyncio.to_thread(resolve, assigned.config)
                await self.call_connector(
                    name,
                    "start()",
                    instance.start,
                    config,
                    on_abandon=lambda call: self._stop_once_started(name, instance, call),
                )
                assigned.started = True
        except Exception as exc:
            if assigned.gone:
                return False  # superseded: its failure is nobody's news now
            assigned.failure = exc
            self.metrics.connector_startups.failures += 1
            log.error("connector %s failed to start: %s", name, exc)
            await self._publish(
                ConnectorStatus(name, State.FAILED, self.worker_id, self.generation, _trace(exc))
            )
            return False
        if assigned.gone:
            # stopped (revoked, deleted, restarted) while its start() ran: stop it now
            await self._stop_instance(assigned)
            return False
        assigned.failure = None
        return True

    def _stop_once_started(self, name: str, instance: Connector, call: asyncio.Future[Any]) -> None:
        """A start() given up on (overdue, or its caller stopped): if it returns at last,
        the connector is stopped, since nobody counts it as running."""

        def returned(done: asyncio.Future[Any]) -> None:
            if not done.cancelled() and done.exception() is None:
                self._calls.submit(_quietly, f"stop() of connector {name}", instance.stop)

        call.add_done_callback(returned)

    def connector_failure(self, name: str) -> BaseException | None:
        """Why connector ``name``, assigned here, failed (None if it did not)."""
        assigned = self._connectors.get(name)
        return None if assigned is None else assigned.failure

    async def stop_connector(self, name: str, *, destroyed: bool = False) -> None:
        """Stop connector ``name`` here. A lifecycle call of it in flight (a start) is
        waited for up to the graceful timeout; after that it is stopped when that ends."""
        assigned = self._connectors.pop(name, None)
        if assigned is None:
            return
        assigned.gone = True
        self.metrics.connector_gone(name)
        try:
            async with asyncio.timeout(self.task_shutdown_timeout_ms / 1000):
                await assigned.lock.acquire()
        except TimeoutError:
            log.warning(
                "connector %s: a call into it is still running on %s; it is stopped once "
                "that returns",
                name,
                self.worker_id,
            )
            self._in_background(self._stop_when_free(assigned))
        else:
            try:
                await self._stop_instance(assigned)
            finally:
                assigned.lock.release()
        if destroyed:
            await self._publish(
                ConnectorStatus(name, State.DESTROYED, self.worker_id, self.generation)
            )
        log.info("connector %s stopped on %s", name, self.worker_id)

    async def _stop_when_free(self, assigned: _AssignedConnector) -> None:
        async with assigned.lock:
            await self._stop_instance(assigned)

    async def _stop_instance(self, assigned: _AssignedConnector) -> None:
        if not assigned.started or assigned.instance is None:
            return
        assigned.started = False
        try:
            await self.call_connector(
                assigned.name,
                "stop()",
                assigned.instance.stop,
                timeout_ms=self.task_shutdown_timeout_ms,
            )
        except Exception:
            log.exception("connector %s failed while stopping", assigned.name)

    async def publish_restarting(self, instance: str | ConnectorTaskId) -> None:
        """Tell everyone ``instance`` (a connector name or a task) is about to restart."""
        status: ConnectorStatus | TaskStatus
        if isinstance(instance, str):
            status = ConnectorStatus(instance, State.RESTARTING, self.worker_id, self.generation)
        else:
            status = TaskStatus(instance, State.RESTARTING, self.worker_id, self.generation)
        await self._publish(status)

    async def set_connector_target(self, name: str, target: TargetState) -> None:
        """Steer connector ``name`` (assigned here) to ``target``.

        A failed connector goes to STOPPED at once (as in Connect: stopping is how a
        user clears a failure before altering offsets); it stays FAILED for PAUSED or
        STARTED, which need a restart.
        """
        assigned = self._connectors.get(name)
        if assigned is None:
            return
        async with assigned.lock:
            if assigned.gone or (assigned.target is target and assigned.failure is None):
                return
            if assigned.failure is not None and target is not TargetState.STOPPED:
                log.info(
                    "connector %s has failed; it stays FAILED rather than going %s (restart it)",
                    name,
                    target.value,
                )
                assigned.target = target
                return
            assigned.failure = None
            assigned.target = target
            await self._stop_instance(assigned)
            if target is TargetState.STARTED and not await self._bring_up(assigned):
                return
            if not assigned.gone:
                await self._publish(
                    ConnectorStatus(name, _state_of(target), self.worker_id, self.generation)
                )

    async def task_configs(self, name: str, max_tasks: int) -> list[dict[str, str]]:
        """The task configs connector ``name`` (running here) wants now. One that hangs
        past its deadline fails the connector (FAILED, naming the call)."""
        assigned = self._connectors[name]
        async with assigned.lock:
            if assigned.gone or assigned.instance is None or not assigned.started:
                raise HerderError(f"connector {name} is not running on {self.worker_id}")
            try:
                configs = await self.call_connector(
                    name, "task_configs()", assigned.instance.task_configs, max_tasks
                )
            except ConnectorCallTimeout as exc:
                await self._connector_failed(assigned, exc)
                raise
        if not isinstance(configs, list):
            raise HerderError(f"connector {name}'s task_configs() returned {type(configs)}")
        return restore_references(
            assigned.config, [{str(k): str(v) for k, v in c.items()} for c in configs[:max_tasks]]
        )

    def is_assigned(self, name: str, instance: object) -> bool:
        """Whether ``instance`` (from :meth:`assignment_of`) is still connector ``name``
        as assigned here: not stopped, replaced or failed since."""
        assigned = self._connectors.get(name)
        return (
            assigned is not None
            and assigned is instance
            and assigned.failure is None
            and assigned.started
        )

    def assignment_of(self, name: str) -> object | None:
        """A token for connector ``name`` as it runs here now (see :meth:`is_assigned`)."""
        return self._connectors.get(name)

    def connector_config(self, name: str) -> dict[str, str] | None:
        assigned = self._connectors.get(name)
        return None if assigned is None else dict(assigned.config)

    def _connector_failed_later(self, assigned: _AssignedConnector, exc: BaseException) -> None:
        self._in_background(self._connector_failed(assigned, exc))

    def _reconfiguration_asked(self, assigned: _AssignedConnector) -> None:
        if not assigned.gone:
            self.on_task_reconfiguration(assigned.name)

    def _in_background(self, work: Any) -> None:
        task = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _connector_failed(self, assigned: _AssignedConnector, exc: BaseException) -> None:
        """Connector ``assigned`` has failed (it raised, or a call of its is stuck)."""
        if assigned.gone or self._connectors.get(assigned.name) is not assigned:
            return
        log.error("connector %s failed: %s", assigned.name, exc)
        assigned.failure = exc
        await self._publish(
            ConnectorStatus(
                assigned.name, State.FAILED, self.worker_id, self.generation, _trace(exc)
            )
        )

    # -- tasks --------------------------------------------------------------------------

    async def start_task(
        self,
        task_id: ConnectorTaskId,
        config: dict[str, str],
        connector_config: dict[str, str],
        target: TargetState,
        generation: int,
    ) -> bool:
        """Start an execution of ``task_id`` (its connector code on a thread of its own).

        Its status becomes RUNNING (or PAUSED) once its ``start`` returned; FAILED if it
        raised, or did not get there within ``task_start_timeout_ms``.
        """
        self._loop = asyncio.get_running_loop()
        if not self._current(generation, f"task {task_id}"):
            return False
        if task_id in self._tasks:
            log.error(
                "task %s already has an execution on %s; refusing to start a second one",
                task_id,
                self.worker_id,
            )
            return False
        if task_id in self._abandoned:
            # it starts when the old one ends (a stopped source finishing its batch);
            # FAILED, saying why, if that takes longer than a start may
            deferred = self._deferred[task_id] = _DeferredStart(
                generation, dict(config), dict(connector_config), target
            )
            log.info(
                "task %s starts on %s once its previous execution has ended (it is %s)",
                task_id,
                self.worker_id,
                self._abandoned[task_id].control.activity,
            )
            asyncio.get_running_loop().call_later(
                self.task_start_timeout_ms / 1000, self._held_back_too_long, task_id, deferred
            )
            return False
        loop = asyncio.get_running_loop()
        name = f"task-{task_id.connector}-{task_id.task}"
        self.metrics.task_startups.attempts += 1
        control = TaskControl(
            name,
            on_started=lambda: self._task_started(run),
            on_thread_exit=lambda: self._call_soon(self._task_ended, run),
            metrics=self.metrics.task(task_id),
        )
        run = _TaskRun(task_id, generation, target, control, ended=loop.create_future())
        try:
            klass = self.plugins.connector_class(connector_config.get("connector.class", ""))
            task = klass().task_class()()
            execution = self.execution_factory(
                task_id,
                task,
                await asyncio.to_thread(resolve, config),
                await asyncio.to_thread(resolve, connector_config),
            )
        except Exception as exc:
            self.metrics.task_startups.failures += 1
            await self._task_failed(task_id, exc)
            self.metrics.task_gone(task_id)
            return False
        control.metrics.kind = "sink" if isinstance(task, SinkTask) else "source"
        if self.topic_tracking:
            self._track_topics(task_id, task)
        if target is not TargetState.STARTED:
            run.control.pause()
        self._tasks[task_id] = run
        if isinstance(task, SourceTask) and type(task).lag is not SourceTask.lag:
            self._in_background(self._report_lag(run, task.lag))
        # every line the execution logs names the task, as Connect's MDC context does
        context = contextvars.copy_context()
        context.run(logcontext.enter, task_id.connector, task_id.task)
        run.execution = loop.create_task(execution.execute(run.control), name=name, context=context)
        run.deadline = loop.call_later(self.task_start_timeout_ms / 1000, self._start_overdue, run)
        # the execution is over once it has returned and its thread has finished the
        # call in progress (which, for one cancelled in a poll, may be a long time)
        run.execution.add_done_callback(lambda _: run.control.end())
        if target is not TargetState.STARTED:
            # as Connect's paused task: PAUSED at once, whether or not it has started
            await self._publish(
                TaskStatus(task_id, _state_of(target), self.worker_id, self.generation)
            )
        return True

    def _task_started(self, run: _TaskRun) -> None:
        if run.deadline is not None:
            run.deadline.cancel()
        if self._tasks.get(run.id) is not run or run.control.stopping.is_set() or run.failed:
            return
        run.started = True
        self.metrics.task_startups.successes += 1
        log.info("task %s started on %s", run.id, self.worker_id)
        self._in_background(self._publish_started(run))

    async def _report_lag(
        self, run: _TaskRun, measure: Callable[[], Mapping[str, int | float] | None]
    ) -> None:
        """Publish the task's lag with its status whenever it changed, every
        :data:`LAG_REPORT_INTERVAL_S` while the execution lasts (paused too: a backlog
        grows most while nothing reads it)."""
        while self._tasks.get(run.id) is run and not run.control.stopping.is_set():
            await asyncio.sleep(LAG_REPORT_INTERVAL_S)
            if not run.started or run.failed or self._tasks.get(run.id) is not run:
                continue
            try:
                lag = await asyncio.to_thread(measure)
            except Exception as exc:
                log.warning("task %s could not measure its lag: %s", run.id, exc)
                continue
            if lag is None or run.failed or self._tasks.get(run.id) is not run:
                continue
            current = self.statuses.view.task(run.id)
            if current is not None and current.lag == lag and current.worker_id == self.worker_id:
                continue
            state = _state_of(run.target)
            await self._publish(
                TaskStatus(run.id, state, self.worker_id, self.generation, lag=dict(lag))
            )

    async def _publish_started(self, run: _TaskRun) -> None:
        # judged as of the write: a paused task's PAUSED was written by whoever paused it
        if self._tasks.get(run.id) is run and not run.failed and not run.control.paused.is_set():
            await self._publish(TaskStatus(run.id, State.RUNNING, self.worker_id, self.generation))

    def _start_overdue(self, run: _TaskRun) -> None:
        if run.started or run.failed or run.control.stopping.is_set():
            return
        exc = HerderError(
            f"task {run.id} did not start within {self.task_start_timeout_ms} ms "
            f"(task.start.timeout.ms): it was {run.control.activity}"
        )
        run.failed = True
        self.metrics.task_startups.failures += 1
        # the execution is told to stop; the herder stops it for good at the next
        # rebalance or restart, abandoning it if it still has not ended then
        run.control.stop()
        self._in_background(self._task_failed(run.id, exc))

    def _task_ended(self, run: _TaskRun) -> None:
        if run.deadline is not None:
            run.deadline.cancel()
        if run.ended is not None and not run.ended.done():
            run.ended.set_result(None)
        assert run.execution is not None
        outcome = None if run.execution.cancelled() else run.execution.exception()
        if self._abandoned.get(run.id) is run:
            del self._abandoned[run.id]
            log.info("task %s's abandoned execution on %s has ended", run.id, self.worker_id)
            deferred = self._deferred.get(run.id)
            if deferred is not None:
                self._in_background(self._start_deferred(run.id, deferred))
            return
        if run.control.stopping.is_set() or self._tasks.get(run.id) is not run:
            return
        if outcome is not None:
            if not run.started:
                self.metrics.task_startups.failures += 1
            run.failed = True
            self._in_background(self._task_failed(run.id, outcome))
        else:
            log.info("task %s finished on its own", run.id)

    def _held_back_too_long(self, task_id: ConnectorTaskId, deferred: _DeferredStart) -> None:
        if self._deferred.get(task_id) is not deferred or task_id not in self._abandoned:
            return
        message = (
            f"task {task_id}'s previous execution on {self.worker_id} did not stop and has "
            f"not ended (it is {self._abandoned[task_id].control.activity}); the task "
            "starts here when it ends. Restarting the worker ends it at once."
        )
        log.warning("%s", message)
        self._in_background(
            self._publish(
                TaskStatus(task_id, State.FAILED, self.worker_id, self.generation, message)
            )
        )

    async def _start_deferred(self, task_id: ConnectorTaskId, deferred: _DeferredStart) -> None:
        if self._deferred.get(task_id) is not deferred:
            return  # stopped, restarted or revoked meanwhile
        del self._deferred[task_id]
        await self.start_task(
            task_id,
            deferred.config,
            deferred.connector_config,
            deferred.target,
            deferred.generation,
        )

    async def stop_tasks(self, task_ids: list[ConnectorTaskId], *, destroyed: bool = False) -> None:
        """Stop ``task_ids`` in parallel, waiting up to the graceful shutdown timeout.

        An execution that has not ended by then is abandoned: its thread goes on until
        it returns, and a new start of that task here waits for it.
        """
        held_back = [t for t in task_ids if self._deferred.pop(t, None) is not None]
        stopping = [self._tasks.pop(t) for t in task_ids if t in self._tasks]
        if destroyed:
            for task_id in held_back:
                await self._publish(
                    TaskStatus(task_id, State.DESTROYED, self.worker_id, self.generation)
                )
        for run in stopping:
            run.control.stop()
            self.metrics.task_gone(run.id)
        waits = [run.ended for run in stopping if run.ended and not run.ended.done()]
        if waits:
            await asyncio.wait(waits, timeout=self.task_shutdown_timeout_ms / 1000)
        for run in stopping:
            if run.ended is not None and not run.ended.done():
                # left to end by itself: cancelling it would orphan the Spark job of a
                # batch in flight, whose commit its fencing still decides; a new start
                # of this task here waits for it
                self._abandoned[run.id] = run
                log.warning(
                    "task %s did not stop within the graceful timeout of %d ms on %s (it is "
                    "%s); it is left to end by itself, its fencing epoch deciding whether "
                    "what it still commits counts, and starts here again only once it has",
                    run.id,
                    self.task_shutdown_timeout_ms,
                    self.worker_id,
                    run.control.activity,
                )
            if destroyed:
                await self._publish(
                    TaskStatus(run.id, State.DESTROYED, self.worker_id, self.generation)
                )
            log.info("task %s stopped on %s", run.id, self.worker_id)

    async def set_task_target(self, task_id: ConnectorTaskId, target: TargetState) -> None:
        deferred = self._deferred.get(task_id)
        if deferred is not None:
            deferred.target = target
        run = self._tasks.get(task_id)
        if run is None or run.failed:
            return
        run.target = target
        if target is TargetState.STARTED:
            run.control.resume()
        else:
            run.control.pause()
        if run.started or target is not TargetState.STARTED:
            await self._publish(
                TaskStatus(task_id, _state_of(target), self.worker_id, self.generation)
            )

    async def _task_failed(self, task_id: ConnectorTaskId, exc: BaseException) -> None:
        log.error("task %s failed: %s", task_id, exc)
        await self._publish(
            TaskStatus(task_id, State.FAILED, self.worker_id, self.generation, _trace(exc))
        )

    # -- active topics ------------------------------------------------------------------

    def _track_topics(self, task_id: ConnectorTaskId, task: Task) -> None:
        """Watch ``task`` hand over records, recording each topic it uses.

        As in Connect, a topic is recorded whenever the status view does not hold it, so a
        topic forgotten by ``PUT /connectors/{name}/topics/reset`` is recorded again the
        next time a running task uses it. ``recording`` keeps a topic from being written
        again while its first record is on its way.
        """
        view = self.statuses.view
        recording: set[str] = set()

        def used(topics: Collection[str]) -> None:
            new = {
                t for t in topics if t not in recording and view.topic(task_id.connector, t) is None
            }
            if new:
                recording.update(new)
                self._call_soon(self._record_topics, task_id, sorted(new), recording)

        if isinstance(task, SourceTask):
            poll = task.poll

            def tracked_poll() -> object:
                polled = poll()
                if isinstance(polled, SourceBatch):
                    if polled.topic:
                        used([polled.topic])
                elif polled:
                    used({record.topic for record in polled})
                return polled

            task.poll = tracked_poll  # type: ignore[method-assign,assignment]
        elif isinstance(task, SinkTask):
            open_partitions = task.open

            def tracked_open(partitions: Collection[TopicPartition]) -> None:
                open_partitions(partitions)
                used({p.topic for p in partitions})

            task.open = tracked_open  # type: ignore[method-assign]

    def _record_topics(
        self, task_id: ConnectorTaskId, topics: list[str], recording: set[str]
    ) -> None:
        async def record() -> None:
            now = int(time.time() * 1000)
            for topic in topics:
                try:
                    await self.statuses.put_topic(
                        TopicStatus(topic, task_id.connector, task_id.task, now)
                    )
                except Exception:
                    log.exception("could not record topic %s of task %s", topic, task_id)
                finally:
                    recording.discard(topic)

        self._in_background(record())

    async def stop_all(self) -> None:
        """Stop every task and connector (tasks first, in parallel)."""
        self._deferred.clear()
        await self.stop_tasks(list(self._tasks))
        await asyncio.gather(*(self.stop_connector(name) for name in list(self._connectors)))

    async def close(self) -> None:
        """Give up on executions that never ended (the process is stopping), and let go
        of the connector pool and the execution factory's connections."""
        for _ in range(3):
            # an execution cancelled in a stuck poll() unwinds into the task's stop(),
            # queued behind that poll: cancelling it again ends it
            left = [
                run.execution
                for run in [*self._tasks.values(), *self._abandoned.values()]
                if run.execution is not None and not run.execution.done()
            ]
            if not left:
                break
            for execution in left:
                execution.cancel()
            await asyncio.wait(left, timeout=0.2)
        self._calls.shutdown(wait=False, cancel_futures=True)
        # an execution factory with work and connections of its own (the data plane's)
        close = getattr(self.execution_factory, "close", None)
        if callable(close):
            closing = close()
            if inspect.isawaitable(closing):
                await closing


def _quietly(what: str, fn: Callable[[], object]) -> None:
    try:
        fn()
    except Exception:
        log.exception("%s failed", what)


def _is_sink(connector: Connector) -> bool:
    try:
        return issubclass(connector.task_class(), SinkTask)
    except Exception:
        return False


def _state_of(target: TargetState) -> State:
    return {
        TargetState.STARTED: State.RUNNING,
        TargetState.PAUSED: State.PAUSED,
        TargetState.STOPPED: State.STOPPED,
    }[target]
