"""Real worker processes with the real data plane, seen through their connectors' eyes.

The tasks of ``RecordingSourceConnector`` log every ``start`` and ``stop`` with the
process and thread that made it, so the tests can check from the outside what ran
where: a task shown RUNNING runs exactly once, on the worker its status names; a task
stuck in ``poll`` does not keep a stopped worker alive. The tasks poll nothing, so no
worker starts a Spark job (nor, with ``dataplane.spark.warmup=false``, a JVM).
"""

from __future__ import annotations

import contextlib
import random
import re
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest
from bench.workers import ensemble_connections

from tests.harness import HERDER, Proc, Processes, free_port, wait_until
from tests.integration.conftest import ServerHandle, make_server

pytestmark = [pytest.mark.integration]

CONNECTOR = "tests.fixtures.connectors.RecordingSourceConnector"
READY_LINE = re.compile(r"^worker (\S+) REST API at (\S+)$", re.MULTILINE)
GRACEFUL_MS = 3000


class Workers:
    def __init__(self, processes: Processes, tmp_path: Path) -> None:
        self.processes = processes
        self.tmp_path = tmp_path
        self.server: ServerHandle = make_server(
            processes, tmp_path, **{"group.min.session.timeout.ms": 1000}
        ).start()
        self.records = tmp_path / "records"
        self.records.mkdir()
        #: worker id -> (process, REST URL)
        self.workers: dict[str, tuple[Proc, str]] = {}
        self.http = httpx.Client(timeout=100)

    def start_worker(self) -> str:
        port = free_port()
        props = {
            "group.id": "lifecycle",
            "bootstrap.servers": self.server.bootstrap,
            "rest.host.name": "127.0.0.1",
            "rest.port": port,
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 500,
            "rebalance.timeout.ms": 20_000,
            "worker.unsync.backoff.ms": 1000,
            # a killed worker's tasks move at once (the delay has tests of its own)
            "scheduled.rebalance.max.delay.ms": 0,
            "task.shutdown.graceful.timeout.ms": GRACEFUL_MS,
            "storage.root": str(self.tmp_path / "topics"),
            "dataplane.spark.warmup": "false",
            "spark.master": "local[1]",
            "spark.driver.memory": "512m",
            "spark.ui.enabled": "false",
        }
        config = self.tmp_path / f"worker-{port}.properties"
        config.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        log_path = self.tmp_path / f"worker-{port}-0.log"
        proc = self.processes.start(
            [*HERDER, "--log-level", "INFO", "worker", "start", "--config", str(config)],
            name=f"worker-{port}",
            ready=lambda: READY_LINE.search(log_path.read_text(errors="replace")),
            timeout=60,
        )
        found = READY_LINE.search(proc.output())
        assert found is not None
        self.workers[found.group(1)] = (proc, found.group(2))
        return found.group(1)

    @property
    def urls(self) -> list[str]:
        return [url for proc, url in self.workers.values() if proc.alive()]

    def create(self, name: str, tasks: int, **extra: str) -> None:
        config = {
            "connector.class": CONNECTOR,
            "tasks.max": str(tasks),
            "topic": "nothing",
            "record.dir": str(self.records),
            **extra,
        }
        reply = self.http.post(
            f"{random.choice(self.urls)}/connectors", json={"name": name, "config": config}
        )
        assert reply.status_code == 201, reply.text

    def status(self, name: str) -> dict[str, Any]:
        reply = self.http.get(f"{random.choice(self.urls)}/connectors/{name}/status")
        assert reply.status_code == 200, reply.text
        body: dict[str, Any] = reply.json()
        return body

    def all_running(self, names: dict[str, int]) -> bool:
        for name, tasks in names.items():
            st = self.status(name)
            if st["connector"]["state"] != "RUNNING" or len(st["tasks"]) != tasks:
                return False
            if any(t["state"] != "RUNNING" for t in st["tasks"]):
                return False
        return True

    def calls(self) -> list[tuple[str, str, int, int]]:
        path = self.records / "calls.log"
        if not path.exists():
            return []
        out = []
        for line in path.read_text().splitlines():
            event, what, pid, thread = line.split()
            out.append((event, what, int(pid), int(thread)))
        return out


@pytest.fixture
def workers(processes: Processes, tmp_path: Path) -> Workers:
    return Workers(processes, tmp_path)


def live_executions(calls: list[tuple[str, str, int, int]]) -> Counter[tuple[str, int]]:
    """(task, pid) -> executions started and not stopped; asserts that no task ever had
    two at once in one process."""
    live: Counter[tuple[str, int]] = Counter()
    for event, what, pid, _ in calls:
        if "-" not in what:
            continue  # a connector (these tests' connector names have no dash), not a task
        if event == "start":
            live[(what, pid)] += 1
            assert live[(what, pid)] == 1, f"task {what} started twice at once in process {pid}"
        elif event == "stop":
            live[(what, pid)] -= 1
    return +live


@pytest.mark.timeout(120)
def test_sigterm_stops_a_worker_whose_tasks_never_return_from_poll(workers: Workers) -> None:
    worker_id = workers.start_worker()
    proc, _ = workers.workers[worker_id]
    workers.create("stuck", 2, **{"poll.block": "true"})
    wait_until(lambda: workers.all_running({"stuck": 2}), 60, what="both stuck tasks RUNNING")
    wait_until(
        lambda: sum(event == "blocks" for event, *_ in workers.calls()) == 2,
        30,
        what="both tasks inside a poll() that never returns",
    )
    began = time.monotonic()
    proc.signal(signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.popen.wait(GRACEFUL_MS / 1000 + 10)
    took = time.monotonic() - began
    assert not proc.alive(), f"the worker was still alive {took:.1f} s after SIGTERM"
    output = proc.output()
    assert "did not stop within the graceful timeout" in output
    assert "Traceback" not in output, output[-4000:]


@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    "operations",
    [pytest.param(60, id="a-minute"), pytest.param(300, id="five-minutes", marks=pytest.mark.slow)],
)
def test_connector_churn_on_three_workers_runs_each_task_once(
    workers: Workers, operations: int
) -> None:
    for _ in range(3):
        workers.start_worker()
    rng = random.Random(20261126 + operations)
    live: dict[str, int] = {}
    created = 0
    deadline = time.monotonic() + 2 * operations
    for _ in range(operations):  # bounded in count and in time
        if time.monotonic() > deadline:
            break
        action = rng.random()
        if len(live) < 3 or (action < 0.5 and len(live) < 8):
            name = f"churn{created}"
            created += 1
            live[name] = rng.randint(1, 4)
            workers.create(name, live[name])
        elif action < 0.8:
            name = rng.choice(sorted(live))
            del live[name]
            reply = workers.http.delete(f"{rng.choice(workers.urls)}/connectors/{name}")
            assert reply.status_code == 204, reply.text
        else:
            name = rng.choice(sorted(live))
            reply = workers.http.post(
                f"{rng.choice(workers.urls)}/connectors/{name}/restart?includeTasks=true"
            )
            assert reply.status_code in (202, 204), reply.text
        time.sleep(rng.uniform(0.2, 1.5))
    wait_until(lambda: workers.all_running(live), 90, what="every connector's tasks RUNNING")
    pids = {worker_id: proc.pid for worker_id, (proc, _) in workers.workers.items()}

    def settled() -> bool:
        running = live_executions(workers.calls())
        for name in live:
            for task in workers.status(name)["tasks"]:
                where = [pid for (what, pid) in running if what == f"{name}-{task['id']}"]
                if where != [pids[task["worker_id"]]]:
                    return False
        # a deleted connector's tasks have stopped everywhere
        return all(what.rsplit("-", 1)[0] in live for what, _ in running)

    wait_until(settled, 30, what="exactly one execution of every RUNNING task, where shown")
    assert created >= 10
    for proc, _ in workers.workers.values():
        assert "Traceback" not in proc.output(), proc.output()[-6000:]


@pytest.mark.timeout(300)
def test_a_worker_with_a_hundred_tasks_keeps_its_connections_and_answers_at_once(
    workers: Workers,
) -> None:
    worker_id = workers.start_worker()
    proc, url = workers.workers[worker_id]
    sink = "tests.fixtures.rest_connectors.CountingSinkConnector"

    def create_sink(name: str, tasks: int) -> None:
        config = {
            "connector.class": sink,
            "tasks.max": str(tasks),
            "topics": f"{name}-in",
            "marker.dir": str(workers.records),
        }
        reply = workers.http.post(f"{url}/connectors", json={"name": name, "config": config})
        assert reply.status_code == 201, reply.text

    workers.create("few", 2)
    create_sink("few-sink", 1)
    expected = {"few": 2, "few-sink": 1}
    wait_until(lambda: workers.all_running(expected), 60, what="the first tasks RUNNING")
    port = workers.server.port
    few = ensemble_connections(proc.pid, port)
    for i in range(8):
        workers.create(f"many{i}", 10, **{"poll.ms": "200"})
        expected[f"many{i}"] = 10
    for i in range(4):
        create_sink(f"many-sink{i}", 5)  # each sink task is a group member of its own
        expected[f"many-sink{i}"] = 5
    wait_until(lambda: workers.all_running(expected), 120, what="103 tasks RUNNING")
    many = ensemble_connections(proc.pid, port)
    assert 0 < many <= few, f"{few} connections with 3 tasks, {many} with 103"
    assert "too many connections" not in workers.server.proc.output()  # type: ignore[union-attr]

    # with them all running, the worker answers at once, creates and reconfigures
    quick = httpx.Client(timeout=1.0)
    assert quick.get(f"{url}/connectors").status_code == 200
    assert quick.get(f"{url}/connectors/many0/status").status_code == 200
    workers.create("one-more", 2)
    reply = workers.http.put(
        f"{url}/connectors/many1/config",
        json={
            "connector.class": CONNECTOR,
            "tasks.max": "4",
            "topic": "nothing",
            "record.dir": str(workers.records),
        },
    )
    assert reply.status_code == 200, reply.text
    expected.update({"one-more": 2, "many1": 4})
    wait_until(lambda: workers.all_running(expected), 60, what="the changes carried out")
    quick.close()


@pytest.mark.timeout(600)
def test_two_hundred_tasks_on_three_workers_survive_a_kill9(workers: Workers) -> None:
    for _ in range(3):
        workers.start_worker()
    connectors = {f"wide{i}": 10 for i in range(20)}
    for name, tasks in connectors.items():
        workers.create(name, tasks, **{"poll.ms": "200"})
    wait_until(lambda: workers.all_running(connectors), 180, what="200 tasks RUNNING")
    victim_id = next(iter(workers.workers))
    victim, _ = workers.workers.pop(victim_id)
    victim.kill9()
    survivors = set(workers.workers)

    def moved() -> bool:
        for name in connectors:
            st = workers.status(name)
            if st["connector"]["worker_id"] not in survivors:
                return False
            if any(t["state"] != "RUNNING" or t["worker_id"] not in survivors for t in st["tasks"]):
                return False
        return True

    wait_until(moved, 120, what="every task RUNNING on the two survivors")
    for proc, _ in workers.workers.values():
        assert "Traceback" not in proc.output(), proc.output()[-6000:]
