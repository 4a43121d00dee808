"""Incremental cooperative rebalancing (KIP-415) and signed internal requests (KIP-507)
in real worker processes, under ``connect.protocol=sessioned``, the default: creating a
connector moves nothing that already runs; a departed worker's work waits for it, shown
UNASSIGNED, for ``scheduled.rebalance.max.delay.ms``; internal requests that are not
signed with the session key are refused.

Under the eager protocol every rebalance stops every task of every worker; the same
scenario with eager workers restarts the first connector's tasks, which is what makes
the cooperative result mean something.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from tests.harness import Processes, wait_until
from tests.integration.conftest import make_server
from tests.integration.test_static_workers import CONNECTOR, Workers

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def _running(url: str, name: str, tasks: int) -> dict[int, str] | None:
    status = httpx.get(f"{url}/connectors/{name}/status", timeout=10).json()
    states = {t["id"]: t["state"] for t in status.get("tasks", [])}
    if status.get("connector", {}).get("state") != "RUNNING" or len(states) != tasks:
        return None
    if any(state != "RUNNING" for state in states.values()):
        return None
    return {t["id"]: t["worker_id"] for t in status["tasks"]}


@pytest.mark.parametrize("protocol", ["sessioned", "eager"])
def test_creating_a_connector_leaves_the_running_tasks_alone_only_when_cooperative(
    processes: Processes, tmp_path: Path, protocol: str
) -> None:
    server = make_server(processes, tmp_path).start()
    workers = Workers(
        processes,
        tmp_path,
        server,
        extra={"connect.protocol": protocol, "scheduled.rebalance.max.delay.ms": 0},
    )
    urls = [workers.start(None) for _ in range(2)]
    first = {
        "connector.class": CONNECTOR,
        "tasks.max": "4",
        "marker.dir": str(workers.markers),
    }
    body = {"name": "one", "config": first}
    created = httpx.post(f"{urls[0]}/connectors", json=body, timeout=60)
    assert created.status_code == 201, created.text
    wait_until(lambda: _running(urls[0], "one", 4), timeout=90, what="connector one RUNNING")
    wait_until(lambda: len(workers.markers_by_task()) == 4, timeout=30, what="4 markers")
    before = workers.markers_by_task()

    second = {**first, "tasks.max": "2"}
    created = httpx.post(
        f"{urls[1]}/connectors", json={"name": "two", "config": second}, timeout=60
    )
    assert created.status_code == 201, created.text
    wait_until(lambda: _running(urls[0], "two", 2), timeout=90, what="connector two RUNNING")
    wait_until(lambda: len(workers.markers_by_task()) == 6, timeout=30, what="6 markers")
    after = {name: mark for name, mark in workers.markers_by_task().items() if name in before}
    # a task started again rewrites its marker: under sessioned none of one's did
    if protocol == "sessioned":
        assert after == before
    else:
        assert after != before


def _states(url: str, name: str) -> dict[int, tuple[str, str]]:
    status = httpx.get(f"{url}/connectors/{name}/status", timeout=10).json()
    return {t["id"]: (t["state"], t["worker_id"]) for t in status.get("tasks", [])}


def _two_workers_running(
    processes: Processes, tmp_path: Path, delay_ms: int
) -> tuple[Workers, list[str], dict[int, str]]:
    """Two sessioned workers (the default protocol) running connector ``one``'s 4 tasks."""
    server = make_server(processes, tmp_path, **{"group.min.session.timeout.ms": 1000}).start()
    workers = Workers(
        processes,
        tmp_path,
        server,
        extra={"scheduled.rebalance.max.delay.ms": delay_ms, "session.timeout.ms": 2_000},
    )
    urls = [workers.start(None) for _ in range(2)]
    config = {"connector.class": CONNECTOR, "tasks.max": "4", "marker.dir": str(workers.markers)}
    created = httpx.post(
        f"{urls[0]}/connectors", json={"name": "one", "config": config}, timeout=60
    )
    assert created.status_code == 201, created.text
    owners = wait_until(lambda: _running(urls[0], "one", 4), timeout=90, what="one RUNNING")
    assert isinstance(owners, dict)
    return workers, urls, owners


def test_a_departed_workers_tasks_wait_unassigned_for_the_scheduled_delay_then_run_elsewhere(
    processes: Processes, tmp_path: Path
) -> None:
    delay_ms = 5_000
    workers, urls, owners = _two_workers_running(processes, tmp_path, delay_ms)
    survivor, victim = urls[0], urls[1]
    victim_id = victim.removeprefix("http://")
    victim_tasks = {t for t, worker in owners.items() if worker == victim_id}
    assert victim_tasks, owners

    killed_at = time.monotonic()
    workers.procs[victim].kill9()
    # once the group notices, the leader holds the victim's tasks back: UNASSIGNED,
    # still naming the worker they wait for
    wait_until(
        lambda: all(
            _states(survivor, "one").get(t) == ("UNASSIGNED", victim_id) for t in victim_tasks
        ),
        timeout=30,
        what="the victim's tasks UNASSIGNED",
    )
    unassigned_at = time.monotonic()
    moved = wait_until(
        lambda: (
            (o := _running(survivor, "one", 4)) is not None
            and all(o[t] == survivor.removeprefix("http://") for t in victim_tasks)
            and o
        ),
        timeout=60,
        what="the victim's tasks RUNNING on the survivor",
    )
    # held back for the scheduled delay (counted from the rebalance that noticed the
    # departure, itself after the session timeout), not reassigned at once
    assert time.monotonic() - killed_at >= delay_ms / 1000, moved
    assert time.monotonic() - unassigned_at >= (delay_ms - 1_500) / 1000, moved


def test_a_worker_back_within_the_delay_gets_its_own_work_back_and_nothing_else_moves(
    processes: Processes, tmp_path: Path
) -> None:
    workers, urls, owners = _two_workers_running(processes, tmp_path, 60_000)
    survivor, victim = urls[0], urls[1]
    victim_id = victim.removeprefix("http://")
    survivor_tasks = {f"one-{t}" for t, worker in owners.items() if worker != victim_id}
    wait_until(lambda: len(workers.markers_by_task()) == 4, timeout=30, what="4 markers")
    before = workers.markers_by_task()

    old = workers.procs[victim]
    old.kill9()
    wait_until(
        lambda: any(state == "UNASSIGNED" for state, _ in _states(survivor, "one").values()),
        timeout=30,
        what="the victim's tasks UNASSIGNED",
    )
    workers.procs[victim] = processes.start(
        old.args,
        name=old.name,
        ready=lambda: httpx.get(f"{victim}/health", timeout=1).status_code == 200,
    )
    # well within the 60 s delay, the same tasks run on the same worker again
    back = wait_until(lambda: _running(survivor, "one", 4), timeout=45, what="one RUNNING again")
    assert back == owners
    after = workers.markers_by_task()
    # the survivor's tasks never stopped: their markers were not written again
    assert {t: after[t] for t in survivor_tasks} == {t: before[t] for t in survivor_tasks}


def test_unsigned_or_badly_signed_internal_requests_are_refused_under_sessioned(
    processes: Processes, tmp_path: Path
) -> None:
    _, urls, owners = _two_workers_running(processes, tmp_path, 0)
    forged = [{"marker.dir": "/tmp/elsewhere", "task.id": "0"}]
    for url in urls:  # the leader, and a worker that would forward it
        unsigned = httpx.post(f"{url}/connectors/one/tasks", json=forged, timeout=30)
        assert unsigned.status_code == 400, unsigned.text
        assert "Internal request missing required signature" in unsigned.json()["message"]
        badly_signed = httpx.post(
            f"{url}/connectors/one/tasks",
            json=forged,
            headers={
                "X-Connect-Authorization": "bm90IGEgc2lnbmF0dXJl",
                "X-Connect-Request-Signature-Algorithm": "HmacSHA256",
            },
            timeout=30,
        )
        assert badly_signed.status_code == 403, badly_signed.text
        assert badly_signed.json()["message"].startswith(
            "Internal request contained invalid signature."
        )
    tasks = httpx.get(f"{urls[0]}/connectors/one/tasks", timeout=10).json()
    assert len(tasks) == 4
    assert all(t["config"].get("marker.dir") != "/tmp/elsewhere" for t in tasks)
    # the workers' own signed requests went through: the connector got its tasks
    assert _running(urls[0], "one", 4) == owners
