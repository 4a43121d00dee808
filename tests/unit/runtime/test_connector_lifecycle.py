"""A connector's lifecycle calls on one worker never overlap, and a call that ends
after the connector has moved on changes nothing but what it must (stop the instance).

Each test holds a connector's ``start()`` or ``stop()`` open on its thread while the
worker is asked for something else (pause, resume, a restart, a revocation), then lets
it go and checks the instance, the calls made and the statuses published.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from herder.connect import SourceConnector, SourceTask
from herder.runtime.core.config_state import TargetState
from herder.runtime.core.status import State
from herder.runtime.plugins import Plugins
from herder.runtime.worker import Worker

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]

CONFIG = {"connector.class": "Held", "name": "c"}


class Held(SourceConnector):
    """Records its calls; ``start``/``stop`` wait for the test while ``hold_*`` is set."""

    calls: list[tuple[str, int]] = []
    hold_start = threading.Event()
    hold_stop = threading.Event()
    release = threading.Event()
    fail_first_start = False

    def start(self, config: dict[str, str]) -> None:
        Held.calls.append(("start", id(self)))
        if Held.hold_start.is_set():
            Held.release.wait(10)
        if Held.fail_first_start and sum(c == "start" for c, _ in Held.calls) == 1:
            raise RuntimeError("the first instance failed late")

    def stop(self) -> None:
        Held.calls.append(("stop", id(self)))
        if Held.hold_stop.is_set():
            Held.release.wait(10)

    def task_class(self) -> type[SourceTask]:
        return SourceTask

    def task_configs(self, max_tasks: int) -> list[dict[str, str]]:
        return []

    def version(self) -> str:
        return "1"


class Statuses:
    def __init__(self) -> None:
        self.states: list[State] = []

    async def put(self, status: Any) -> None:
        self.states.append(status.state)


@pytest.fixture(autouse=True)
def fresh() -> None:
    Held.calls = []
    for event in (Held.hold_start, Held.hold_stop, Held.release):
        event.clear()
    Held.fail_first_start = False


def worker(statuses: Statuses) -> Worker:
    w = Worker("w1", Plugins([Held]), statuses, lambda *a: None, task_shutdown_timeout_ms=500)  # type: ignore[arg-type]
    w.assigned(1)
    return w


async def until_called(n: int) -> None:
    while len(Held.calls) < n:
        await asyncio.sleep(0.01)


async def test_a_pause_during_start_leaves_it_paused() -> None:
    statuses = Statuses()
    w = worker(statuses)
    Held.hold_start.set()
    starting = asyncio.ensure_future(w.start_connector("c", CONFIG, TargetState.STARTED, 1))
    await until_called(1)
    pausing = asyncio.ensure_future(w.set_connector_target("c", TargetState.PAUSED))
    await asyncio.sleep(0)  # one turn: the call reaches the connector (its lock)
    Held.release.set()
    await asyncio.gather(starting, pausing)
    assert [c for c, _ in Held.calls] == ["start", "stop"]
    assert statuses.states[-1] is State.PAUSED
    assert w.connectors == {"c"} and not w.is_assigned("c", w.assignment_of("c"))
    await w.close()


async def test_a_resume_during_a_pauses_stop_leaves_it_running() -> None:
    statuses = Statuses()
    w = worker(statuses)
    await w.start_connector("c", CONFIG, TargetState.STARTED, 1)
    Held.hold_stop.set()
    pausing = asyncio.ensure_future(w.set_connector_target("c", TargetState.PAUSED))
    await until_called(2)
    resuming = asyncio.ensure_future(w.set_connector_target("c", TargetState.STARTED))
    await asyncio.sleep(0)  # one turn: the call reaches the connector (its lock)
    Held.release.set()
    await asyncio.gather(pausing, resuming)
    assert [c for c, _ in Held.calls] == ["start", "stop", "start"]
    assert statuses.states[-1] is State.RUNNING
    assert w.is_assigned("c", w.assignment_of("c"))
    await w.close()


async def test_a_superseded_starts_late_failure_is_nobodys_news() -> None:
    statuses = Statuses()
    w = worker(statuses)
    Held.hold_start.set()
    Held.fail_first_start = True
    first = asyncio.ensure_future(w.start_connector("c", CONFIG, TargetState.STARTED, 1))
    await until_called(1)
    await w.stop_connector("c")  # a restart gives up on the first start after 500 ms
    Held.hold_start.clear()
    assert await w.start_connector("c", CONFIG, TargetState.STARTED, 1)
    Held.release.set()
    assert await first is False
    assert w.connector_failure("c") is None
    assert State.FAILED not in statuses.states and statuses.states[-1] is State.RUNNING
    await w.close()


async def test_a_revocation_during_a_resumes_start_stops_the_instance_once_it_returns() -> None:
    statuses = Statuses()
    w = worker(statuses)
    await w.start_connector("c", CONFIG, TargetState.PAUSED, 1)
    Held.hold_start.set()
    resuming = asyncio.ensure_future(w.set_connector_target("c", TargetState.STARTED))
    await until_called(1)
    w.revoked()
    await w.stop_all()  # gives up on the start after the graceful timeout
    assert w.connectors == set()
    Held.release.set()
    await resuming
    await until_called(2)
    (_, started), (stop, stopped) = Held.calls
    assert stop == "stop" and stopped == started, "the instance that started is stopped"
    assert statuses.states == [State.PAUSED], "nothing published after the revocation"
    await w.close()
