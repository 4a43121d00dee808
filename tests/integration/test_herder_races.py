"""The herder's races with its group membership, played out step by step.

A real :class:`DistributedHerder` runs in the test's event loop against a real ensemble
server, but its group member is scripted: the test plays the coordinator, handing out
generations and revoking them exactly where a race can happen, and holds the config
log's read to the end open when it needs a worker to be catching up. A recording
execution factory counts the executions of every task, so each test can assert that a
task id never has two at once and that no work of a revoked generation ever starts.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest

from herder.connect import Task
from herder.ensemble.client import EnsembleClient
from herder.runtime.core.config_state import (
    TargetState,
    connector_config_record,
    task_config_records,
)
from herder.runtime.core.member import Generation
from herder.runtime.core.protocol import (
    Assignment,
    AssignmentError,
    ConnectorTaskId,
    encode_assignment,
)
from herder.runtime.core.status import State
from herder.runtime.plugins import Plugins
from herder.runtime.shell.herder import DistributedHerder
from herder.runtime.stores import ConfigStore
from herder.runtime.worker import ExecutionFactory, TaskControl, Worker
from herder.runtime.worker_config import WorkerConfig
from tests.integration.conftest import ServerHandle

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

CONNECTOR = "tests.fixtures.connectors.MarkerSourceConnector"
T0 = ConnectorTaskId("c", 0)
T1 = ConnectorTaskId("c", 1)


class ScriptedMember:
    """Stands in for the worker's GroupMember; the test plays the group coordinator."""

    def __init__(self, *_: Any, on_assigned: Any, on_revoked: Any, **__: Any) -> None:
        self.on_assigned = on_assigned
        self.on_revoked = on_revoked
        #: what the herder asked of its membership, in order, with the time it asked
        self.calls: list[tuple[str, float]] = []
        self.rejoined = asyncio.Event()

    async def start(self) -> ScriptedMember:
        return self

    def request_rejoin(self) -> None:
        self.calls.append(("rejoin", time.monotonic()))
        self.rejoined.set()

    async def leave_group(self) -> None:
        self.calls.append(("leave", time.monotonic()))

    async def close(self, *, leave: bool = True) -> None:
        self.calls.append(("close", time.monotonic()))

    async def assign(
        self, generation_id: int, assignment: Assignment, *, leader: bool = False
    ) -> Generation:
        generation = Generation(
            generation_id, "me", "me" if leader else "other", "eager", ("me", "other")
        )
        await self.on_assigned(generation, encode_assignment(assignment))
        return generation

    def revoke(self) -> asyncio.Task[None]:
        """Revoke the current generation, as the member does before it rejoins."""
        return asyncio.ensure_future(self.on_revoked())


class Executions(ExecutionFactory):
    """A ``task.execution.factory`` that counts each task's live executions.

    An execution runs until told to stop, unless it is ``stubborn``: then it ignores
    that until the test sets ``release`` (a ``poll`` stuck on a dead network read).
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.live: Counter[ConnectorTaskId] = Counter()
        self.most_live: Counter[ConnectorTaskId] = Counter()
        self.started: list[ConnectorTaskId] = []
        self.stubborn = False
        self.never_starts = False
        self.release = threading.Event()

    def __call__(
        self, task_id: ConnectorTaskId, task: Task, config: dict[str, str], connector: Any
    ) -> Execution:
        return Execution(self, task_id, self.stubborn, self.never_starts)


class Execution:
    def __init__(
        self, owner: Executions, task_id: ConnectorTaskId, stubborn: bool, never_starts: bool
    ) -> None:
        self.owner = owner
        self.task_id = task_id
        self.stubborn = stubborn
        self.never_starts = never_starts

    async def execute(self, control: TaskControl) -> None:
        owner = self.owner
        with owner.lock:
            owner.live[self.task_id] += 1
            owner.most_live[self.task_id] = max(
                owner.most_live[self.task_id], owner.live[self.task_id]
            )
            owner.started.append(self.task_id)
        try:
            if self.never_starts:
                control.doing("waiting on an ensemble request that never answers")
                await asyncio.to_thread(owner.release.wait)
                return
            await control.call(lambda: None)  # the task's start()
            control.started()
            if self.stubborn:
                await control.call(owner.release.wait)  # a poll() that does not return
            else:
                while not await control.sleep(60):
                    pass
        finally:
            # as a real execution ends: its task's stop(), on its thread, after whatever
            # call of the task's is still running there
            await control.call(self.stopped)

    def stopped(self) -> None:
        with self.owner.lock:
            self.owner.live[self.task_id] -= 1


class HeldReads:
    """Wraps a config store's read to the end so the test decides when it finishes."""

    def __init__(self, store: ConfigStore) -> None:
        self.real = store.read_to_end
        self.gate = asyncio.Event()
        self.waiting = asyncio.Event()
        self.fail = False
        store.read_to_end = self.read  # type: ignore[method-assign]

    async def read(self, timeout: float = 30.0) -> int:
        self.waiting.set()
        await self.gate.wait()
        if self.fail:
            raise TimeoutError("held by the test")
        return await self.real(timeout)


class Harness:
    def __init__(self, server: ServerHandle, **props: object) -> None:
        self.server = server
        self.executions = Executions()
        self.config = WorkerConfig.from_properties(
            {
                "group.id": "races",
                "bootstrap.servers": server.bootstrap,
                "task.shutdown.graceful.timeout.ms": 300,
                "worker.sync.timeout.ms": 500,
                "worker.unsync.backoff.ms": 400,
                **props,
            }
        )
        self.herder = DistributedHerder(
            self.config,
            Plugins.discover(),
            self.executions,
            worker_id="w1",
            member_factory=ScriptedMember,
        )
        self.writer = EnsembleClient(server.bootstrap, name="test-writer")
        self.store = ConfigStore(self.writer, self.config.config_log)
        #: the config log's end once connector c is written
        self.offset = -1

    @property
    def member(self) -> ScriptedMember:
        member = self.herder.member
        assert isinstance(member, ScriptedMember)
        return member

    @property
    def worker(self) -> Worker:
        return self.herder.worker

    async def write_connector(self, name: str = "c", tasks: int = 2) -> int:
        """Write a connector and its task set straight to ``_configs``; the log's end."""
        config = {"connector.class": CONNECTOR, "tasks.max": str(tasks)}
        records = [connector_config_record(name, config)]
        records += task_config_records(name, [{"index": str(i)} for i in range(tasks)])
        await self.store.write(records)
        await self.store.read_to_end()
        return self.store.snapshot().offset

    async def touch_configs(self) -> None:
        """One more record in ``_configs`` (a connector nobody is assigned)."""
        await self.store.write([connector_config_record("other", {"connector.class": CONNECTOR})])

    def assignment(self, offset: int, *tasks: ConnectorTaskId, **kw: Any) -> Assignment:
        return Assignment(
            leader="other",
            leader_url="http://127.0.0.1:1",
            config_offset=offset,
            connectors=kw.pop("connectors", ()),
            tasks=tasks,
            **kw,
        )

    def state(self, task_id: ConnectorTaskId) -> State | None:
        status = self.herder.statuses.view.task(task_id)
        return None if status is None else status.state

    def trace(self, task_id: ConnectorTaskId) -> str:
        status = self.herder.statuses.view.task(task_id)
        return (status.trace or "") if status else ""


async def until(condition: Callable[[], object], timeout: float = 10.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or condition}")
        await asyncio.sleep(0.02)


@asynccontextmanager
async def running(server: ServerHandle, **props: object) -> AsyncIterator[Harness]:
    h = Harness(server, **props)
    await h.writer.start()
    await h.store.start()
    try:
        await h.herder.start("http://127.0.0.1:1")
        # connector c with tasks 0 and 1, read by the herder: what assignments name
        h.offset = await h.write_connector()
        await h.herder.configs.read_to_end()
        yield h
    finally:
        h.executions.release.set()
        await h.herder.stop()
        await h.store.stop()
        await h.writer.close()


def no_tick_failed(caplog: pytest.LogCaptureFixture) -> None:
    failures = [r for r in caplog.records if "tick failed" in r.getMessage()]
    assert not failures, failures[0].getMessage()


async def test_revocation_while_catching_up_starts_nothing(
    ensemble_server: ServerHandle, caplog: pytest.LogCaptureFixture
) -> None:
    async with running(ensemble_server) as h:
        offset = h.offset
        held = HeldReads(h.herder.configs)
        # made from one more config record than this worker has read: it must catch up
        await h.member.assign(1, h.assignment(offset + 1, T0, T1, connectors=("c",)))
        await asyncio.wait_for(held.waiting.wait(), 5)
        revocation = h.member.revoke()
        await h.touch_configs()
        held.gate.set()
        # a start that went ahead would have run before the revocation stopped it
        await asyncio.wait_for(revocation, 10)
        assert h.executions.started == [], "work of a revoked generation started"
        assert h.worker.tasks == set() and h.worker.connectors == set()
        assert h.herder.assignment is None
    no_tick_failed(caplog)


async def test_revocation_before_the_tick_drops_the_parked_assignment(
    ensemble_server: ServerHandle, caplog: pytest.LogCaptureFixture
) -> None:
    async with running(ensemble_server) as h:
        offset = h.offset
        # keep the herder loop busy (as with a REST request) while the member is assigned
        # and then revoked: the assignment is parked for a tick that comes too late
        entered, busy = asyncio.Event(), asyncio.Event()

        async def serve() -> None:
            entered.set()
            await busy.wait()

        serving = asyncio.ensure_future(h.herder.submit(serve))
        await asyncio.wait_for(entered.wait(), 5)
        await h.member.assign(1, h.assignment(offset, T0, T1, connectors=("c",)))
        revocation = h.member.revoke()
        await asyncio.sleep(0)  # one turn: the revocation marks the generation revoked
        busy.set()
        await asyncio.wait_for(asyncio.gather(serving, revocation), 10)
        assert h.executions.started == [], "work of a revoked generation started"
        assert h.herder.assignment is None
    no_tick_failed(caplog)


async def test_the_next_generation_assigning_the_same_task_runs_it_once(
    ensemble_server: ServerHandle, caplog: pytest.LogCaptureFixture
) -> None:
    async with running(ensemble_server) as h:
        offset = h.offset
        for generation in (1, 2, 3):
            await h.member.assign(generation, h.assignment(offset, T0, T1))
            await until(lambda: h.state(T0) == h.state(T1) == State.RUNNING, what="RUNNING")
            await until(lambda n=2 * generation: len(h.executions.started) == n)
            await asyncio.wait_for(h.member.revoke(), 10)
        assert h.executions.most_live == {T0: 1, T1: 1}
        assert h.executions.started.count(T0) == 3
    no_tick_failed(caplog)


async def test_an_abandoned_execution_holds_back_the_next_start_of_its_task(
    ensemble_server: ServerHandle, caplog: pytest.LogCaptureFixture
) -> None:
    async with running(ensemble_server, **{"task.start.timeout.ms": 1000}) as h:
        offset = h.offset
        h.executions.stubborn = True
        await h.member.assign(1, h.assignment(offset, T0))
        await until(lambda: h.state(T0) == State.RUNNING, what="T0 RUNNING")
        # its poll never returns: the revocation gives up on it after the graceful timeout
        await asyncio.wait_for(h.member.revoke(), 10)
        assert h.worker.abandoned == {T0}
        h.executions.stubborn = False
        await h.member.assign(2, h.assignment(offset, T0))
        # held back: after task.start.timeout.ms it is FAILED, saying why
        await until(lambda: h.state(T0) == State.FAILED, what="T0 FAILED while held back")
        assert "has not ended" in h.trace(T0)
        assert h.executions.started == [T0]
        h.executions.release.set()  # the stuck poll returns at last
        await until(lambda: h.executions.started == [T0, T0], what="the held-back start")
        await until(lambda: h.state(T0) == State.RUNNING, what="T0 RUNNING again")
        assert h.executions.most_live[T0] == 1
        assert h.worker.abandoned == set()
    no_tick_failed(caplog)


async def test_a_held_back_start_of_a_revoked_generation_is_dropped(
    ensemble_server: ServerHandle,
) -> None:
    async with running(ensemble_server, **{"task.start.timeout.ms": 1000}) as h:
        offset = h.offset
        h.executions.stubborn = True
        await h.member.assign(1, h.assignment(offset, T0))
        await until(lambda: h.state(T0) == State.RUNNING, what="T0 RUNNING")
        await asyncio.wait_for(h.member.revoke(), 10)
        h.executions.stubborn = False
        await h.member.assign(2, h.assignment(offset, T0))
        await until(lambda: h.state(T0) == State.FAILED, what="T0 held back")
        await asyncio.wait_for(h.member.revoke(), 10)  # generation 2 is over too
        assert h.worker.held_back == set(), "generation 2's start outlived its revocation"
        h.executions.release.set()
        await until(lambda: h.worker.abandoned == set(), what="the abandoned one to end")
        assert h.worker.tasks == set()
        assert h.executions.started == [T0], "generation 2's start ran after its revocation"


async def test_a_second_start_of_a_running_task_is_refused(
    ensemble_server: ServerHandle, caplog: pytest.LogCaptureFixture
) -> None:
    async with running(ensemble_server) as h:
        offset = h.offset
        await h.member.assign(1, h.assignment(offset, T0))
        await until(lambda: h.state(T0) == State.RUNNING, what="T0 RUNNING")
        config = h.herder.configs.snapshot()
        again = await h.worker.start_task(
            T0,
            config.task_config(T0) or {},
            config.connector_config("c") or {},
            TargetState.STARTED,
            h.worker.generation,
        )
        assert again is False
        assert h.executions.started == [T0]
        assert any("refusing to start a second one" in r.getMessage() for r in caplog.records)


async def test_a_task_that_cannot_start_in_time_is_failed_with_the_cause(
    ensemble_server: ServerHandle,
) -> None:
    async with running(ensemble_server, **{"task.start.timeout.ms": 500}) as h:
        offset = h.offset
        h.executions.never_starts = True
        await h.member.assign(1, h.assignment(offset, T0))
        await until(lambda: h.executions.started == [T0], what="the execution to begin")
        assert h.state(T0) is not State.RUNNING, "RUNNING before its start() returned"
        await until(lambda: h.state(T0) == State.FAILED, what="T0 FAILED")
        assert "did not start within 500 ms" in h.trace(T0)
        assert "waiting on an ensemble request" in h.trace(T0)


@pytest.mark.parametrize("why", ["config-mismatch", "behind"])
async def test_a_worker_that_cannot_catch_up_leaves_the_group_before_backing_off(
    ensemble_server: ServerHandle, why: str
) -> None:
    async with running(ensemble_server) as h:
        offset = h.offset
        held = HeldReads(h.herder.configs)
        held.fail = True
        held.gate.set()
        h.member.calls.clear()
        if why == "config-mismatch":
            assignment = h.assignment(offset, error=AssignmentError.CONFIG_MISMATCH)
        else:
            assignment = h.assignment(offset + 5, T0)
        await h.member.assign(1, assignment, leader=True)
        await asyncio.wait_for(h.member.rejoined.wait(), 10)
        calls = [c for c, _ in h.member.calls]
        assert calls[:2] == ["leave", "rejoin"], calls
        (left, rejoined) = (at for _, at in h.member.calls[:2])
        assert rejoined - left >= 0.4 * 0.9, "rejoined before worker.unsync.backoff.ms"
        assert h.executions.started == []


async def test_config_changes_with_no_assignment_do_not_break_the_loop(
    ensemble_server: ServerHandle, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    async with running(ensemble_server) as h:
        offset = h.offset
        for generation in range(1, 6):
            await h.member.assign(generation, h.assignment(offset, T0, connectors=("c",)))
            revocation = h.member.revoke()
            await h.touch_configs()  # a config change lands while the work is revoked
            await asyncio.wait_for(revocation, 10)
            offset += 1
        assert h.executions.most_live[T0] <= 1
    no_tick_failed(caplog)
