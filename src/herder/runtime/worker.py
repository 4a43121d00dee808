"""The connectors and tasks running on one worker, and their statuses.

The herder decides *what* runs here; the :class:`Worker` makes it so: it instantiates
plugins, starts and stops them on a bounded thread pool (connector code may block),
steers them to their target state, and publishes every transition to ``_status``
with the worker's generation, so a status written by a worker that has since lost
the work can never overwrite its new owner's.

How a task moves data is not the worker's business: a :class:`TaskExecution`, made by
the data plane, runs in a thread until it is told to stop. The worker does watch what a
task hands over, to record the connector's *active topics* in ``_status`` as Connect
does: the topic of every record or batch a source task's ``poll`` returns, and the
topics of the partitions a sink task is ``open``-ed for.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import traceback
from collections.abc import Callable, Collection
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol

from herder.connect import (
    Connector,
    ConnectorContext,
    SinkTask,
    SourceBatch,
    SourceTask,
    Task,
    TopicPartition,
)
from herder.runtime.config_state import TargetState
from herder.runtime.plugins import Plugins
from herder.runtime.protocol import ConnectorTaskId
from herder.runtime.status import ConnectorStatus, State, TaskStatus, TopicStatus
from herder.runtime.stores import StatusStore

log = logging.getLogger(__name__)


class TaskExecution(Protocol):
    """Moves a started task's data until ``stopping`` is set (runs in its own thread).

    While ``paused`` is set it must not poll or put; raising marks the task FAILED.
    """

    def run(self, stopping: threading.Event, paused: threading.Event) -> None: ...


#: builds the execution for (task id, the started task, its config, its connector's config)
ExecutionFactory = Callable[[ConnectorTaskId, Task, dict[str, str], dict[str, str]], TaskExecution]


class _Context(ConnectorContext):
    def __init__(self, worker: Worker, name: str) -> None:
        self._worker = worker
        self._name = name

    def request_task_reconfiguration(self) -> None:
        self._worker._call_soon(self._worker.on_task_reconfiguration, self._name)

    def raise_error(self, error: BaseException) -> None:
        self._worker._call_soon(self._worker._connector_failed_later, self._name, error)


@dataclass
class _RunningConnector:
    name: str
    instance: Connector
    config: dict[str, str]
    target: TargetState


@dataclass
class _RunningTask:
    id: ConnectorTaskId
    instance: Task
    stopping: threading.Event = field(default_factory=threading.Event)
    paused: threading.Event = field(default_factory=threading.Event)
    done: asyncio.Future[None] | None = None


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
        threads: int = 16,
        task_shutdown_timeout_ms: int = 5_000,
        topic_tracking: bool = True,
    ) -> None:
        self.worker_id = worker_id
        self.plugins = plugins
        self.statuses = statuses
        self.execution_factory = execution_factory
        self.task_shutdown_timeout_ms = task_shutdown_timeout_ms
        self.topic_tracking = topic_tracking
        self.generation = -1
        #: called (on the loop) when a connector asks for its tasks to be reconfigured
        self.on_task_reconfiguration: Callable[[str], None] = lambda name: None
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="herder-work")
        self._connectors: dict[str, _RunningConnector] = {}
        self._tasks: dict[ConnectorTaskId, _RunningTask] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._background: set[asyncio.Future[None]] = set()

    @property
    def connectors(self) -> set[str]:
        return set(self._connectors)

    @property
    def tasks(self) -> set[ConnectorTaskId]:
        return set(self._tasks)

    def _call_soon(self, fn: Callable[..., object], *args: object) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(fn, *args)

    async def _in_thread(self, fn: Callable[..., object], *args: object) -> object:
        self._loop = asyncio.get_running_loop()
        return await self._loop.run_in_executor(self._pool, fn, *args)

    async def _publish(self, status: ConnectorStatus | TaskStatus) -> None:
        try:
            await self.statuses.put(status)
        except Exception:
            log.exception("could not publish status %s", status)

    # -- connectors -------------------------------------------------------------------

    async def start_connector(self, name: str, config: dict[str, str], target: TargetState) -> bool:
        """Instantiate and (unless PAUSED/STOPPED) start connector ``name``."""
        self._loop = asyncio.get_running_loop()
        try:
            klass = self.plugins.connector_class(config.get("connector.class", ""))
            instance = klass()
            instance.initialize(_Context(self, name))
            if target is TargetState.STARTED:
                await self._in_thread(instance.start, dict(config))
        except Exception as exc:
            log.error("connector %s failed to start: %s", name, exc)
            await self._publish(
                ConnectorStatus(name, State.FAILED, self.worker_id, self.generation, _trace(exc))
            )
            return False
        self._connectors[name] = _RunningConnector(name, instance, dict(config), target)
        await self._publish(
            ConnectorStatus(name, _state_of(target), self.worker_id, self.generation)
        )
        log.info("connector %s started on %s (%s)", name, self.worker_id, target.value)
        return True

    async def stop_connector(self, name: str, *, destroyed: bool = False) -> None:
        running = self._connectors.pop(name, None)
        if running is None:
            return
        if running.target is TargetState.STARTED:
            try:
                await self._in_thread(running.instance.stop)
            except Exception:
                log.exception("connector %s failed while stopping", name)
        if destroyed:
            await self._publish(
                ConnectorStatus(name, State.DESTROYED, self.worker_id, self.generation)
            )
        log.info("connector %s stopped on %s", name, self.worker_id)

    async def publish_restarting(self, instance: str | ConnectorTaskId) -> None:
        """Tell everyone ``instance`` (a connector name or a task) is about to restart."""
        status: ConnectorStatus | TaskStatus
        if isinstance(instance, str):
            status = ConnectorStatus(instance, State.RESTARTING, self.worker_id, self.generation)
        else:
            status = TaskStatus(instance, State.RESTARTING, self.worker_id, self.generation)
        await self._publish(status)

    async def set_connector_target(self, name: str, target: TargetState) -> None:
        running = self._connectors.get(name)
        if running is None or running.target is target:
            return
        try:
            if target is TargetState.STARTED:
                await self._in_thread(running.instance.start, dict(running.config))
            elif running.target is TargetState.STARTED:
                await self._in_thread(running.instance.stop)
        except Exception as exc:
            await self._connector_failed(name, exc)
            return
        running.target = target
        await self._publish(
            ConnectorStatus(name, _state_of(target), self.worker_id, self.generation)
        )

    async def task_configs(self, name: str, max_tasks: int) -> list[dict[str, str]]:
        """The task configs connector ``name`` (running here) wants now."""
        running = self._connectors[name]
        configs = await self._in_thread(running.instance.task_configs, max_tasks)
        assert isinstance(configs, list)
        return [{str(k): str(v) for k, v in c.items()} for c in configs[:max_tasks]]

    def connector_config(self, name: str) -> dict[str, str] | None:
        running = self._connectors.get(name)
        return None if running is None else dict(running.config)

    def _connector_failed_later(self, name: str, exc: BaseException) -> None:
        task = asyncio.ensure_future(self._connector_failed(name, exc))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _connector_failed(self, name: str, exc: BaseException) -> None:
        log.error("connector %s failed: %s", name, exc)
        await self._publish(
            ConnectorStatus(name, State.FAILED, self.worker_id, self.generation, _trace(exc))
        )

    # -- tasks --------------------------------------------------------------------------

    async def start_task(
        self,
        task_id: ConnectorTaskId,
        config: dict[str, str],
        connector_config: dict[str, str],
        target: TargetState,
    ) -> bool:
        self._loop = asyncio.get_running_loop()
        try:
            klass = self.plugins.connector_class(connector_config.get("connector.class", ""))
            task = klass().task_class()()
            execution = self.execution_factory(task_id, task, dict(config), dict(connector_config))
        except Exception as exc:
            await self._task_failed(task_id, exc)
            return False
        if self.topic_tracking:
            self._track_topics(task_id, task)
        running = _RunningTask(task_id, task)
        if target is not TargetState.STARTED:
            running.paused.set()
        self._tasks[task_id] = running
        running.done = asyncio.ensure_future(self._run_task(running, execution))
        await self._publish(TaskStatus(task_id, _state_of(target), self.worker_id, self.generation))
        return True

    async def _run_task(self, running: _RunningTask, execution: TaskExecution) -> None:
        task_id = running.id
        try:
            await self._in_thread(execution.run, running.stopping, running.paused)
        except Exception as exc:
            if not running.stopping.is_set():
                await self._task_failed(task_id, exc)
        else:
            if not running.stopping.is_set():
                log.info("task %s finished on its own", task_id)

    async def stop_tasks(self, task_ids: list[ConnectorTaskId], *, destroyed: bool = False) -> None:
        """Stop ``task_ids`` in parallel, waiting up to the graceful shutdown timeout."""
        stopping = [self._tasks.pop(t) for t in task_ids if t in self._tasks]
        for running in stopping:
            running.stopping.set()
            running.paused.clear()
        waits = [r.done for r in stopping if r.done is not None]
        if waits:
            _, pending = await asyncio.wait(waits, timeout=self.task_shutdown_timeout_ms / 1000)
            for running in stopping:
                if running.done in pending:
                    log.error("task %s did not stop within the graceful timeout", running.id)
        for running in stopping:
            if destroyed:
                await self._publish(
                    TaskStatus(running.id, State.DESTROYED, self.worker_id, self.generation)
                )
            log.info("task %s stopped on %s", running.id, self.worker_id)

    async def set_task_target(self, task_id: ConnectorTaskId, target: TargetState) -> None:
        running = self._tasks.get(task_id)
        if running is None:
            return
        if target is TargetState.STARTED:
            running.paused.clear()
        else:
            running.paused.set()
        await self._publish(TaskStatus(task_id, _state_of(target), self.worker_id, self.generation))

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

        task = asyncio.ensure_future(record())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def stop_all(self) -> None:
        await self.stop_tasks(list(self._tasks))
        for name in list(self._connectors):
            await self.stop_connector(name)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        # an execution factory with work of its own (the data plane's retention passes)
        close = getattr(self.execution_factory, "close", None)
        if callable(close):
            close()


def _state_of(target: TargetState) -> State:
    return {
        TargetState.STARTED: State.RUNNING,
        TargetState.PAUSED: State.PAUSED,
        TargetState.STOPPED: State.STOPPED,
    }[target]
