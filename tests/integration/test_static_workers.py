"""Static workers (``group.instance.id``, KIP-345) on a one-server ensemble.

A static worker stopped with SIGTERM and started again within its session timeout takes
its place back: it runs the same tasks as before, the group's generation stays, and no
other worker rebalances or so much as restarts a task. The same scenario with dynamic
workers rebalances every worker, which is what makes the first result mean something.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.harness import HERDER, Proc, Processes, free_port, wait_until
from tests.integration.conftest import ServerHandle, make_server

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

CONNECTOR = "tests.fixtures.connectors.MarkerSourceConnector"
NAME = "markers"
TASKS = 6
#: long enough for a worker process to stop and start again on a busy machine
SESSION_MS = 20_000
METRICS = {
    "completed-rebalances-total",
    "rebalancing",
    "epoch",
    "leader-name",
    "rebalance-avg-time-ms",
    "rebalance-max-time-ms",
    "time-since-last-rebalance-ms",
}


class Workers:
    def __init__(
        self,
        processes: Processes,
        tmp_path: Path,
        server: ServerHandle,
        extra: dict[str, Any] | None = None,
    ) -> None:
        #: worker properties beyond the ones every worker here gets
        self.extra = extra or {}
        self.processes = processes
        self.tmp_path = tmp_path
        self.server = server
        self.procs: dict[str, Proc] = {}
        self.markers = tmp_path / "markers"
        self.markers.mkdir()

    def start(self, instance_id: str | None) -> str:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        props: dict[str, Any] = {
            "group.id": "workers",
            "bootstrap.servers": self.server.bootstrap,
            "rest.host.name": "127.0.0.1",
            "rest.port": port,
            "session.timeout.ms": SESSION_MS,
            "heartbeat.interval.ms": 500,
            "rebalance.timeout.ms": 20_000,
            "task.execution.factory": "tests.fixtures.connectors:MarkerExecutions",
        }
        props.update(self.extra)
        if instance_id is not None:
            props["group.instance.id"] = instance_id
        path = self.tmp_path / f"worker-{port}.properties"
        path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        self.procs[url] = self.processes.start(
            [*HERDER, "--log-level", "INFO", "worker", "start", "--config", str(path)],
            name=f"worker-{port}",
            ready=lambda: httpx.get(f"{url}/health", timeout=1).status_code == 200,
        )
        return url

    def restart(self, url: str) -> None:
        """SIGTERM the worker at ``url`` and start it again with the same config."""
        old = self.procs[url]
        assert old.stop() == 0, old.output()
        self.procs[url] = self.processes.start(
            old.args,
            name=old.name,
            ready=lambda: httpx.get(f"{url}/health", timeout=1).status_code == 200,
        )

    def metrics(self, url: str) -> dict[str, Any]:
        reply = httpx.get(f"{url}/admin/metrics/rebalance", timeout=10)
        assert reply.status_code == 200, reply.text
        return reply.json()  # type: ignore[no-any-return]

    def owners(self, url: str) -> dict[int, tuple[str, str]] | None:
        """task -> (worker id, state), or None until the connector and all tasks run."""
        status = httpx.get(f"{url}/connectors/{NAME}/status", timeout=10).json()
        tasks = status.get("tasks", [])
        if status.get("connector", {}).get("state") != "RUNNING" or len(tasks) != TASKS:
            return None
        return {t["id"]: (t["worker_id"], t["state"]) for t in tasks}

    def markers_by_task(self) -> dict[str, tuple[str, int]]:
        """task -> (pid, mtime) of its marker: a task started again rewrites it."""
        return {p.name: (p.read_text(), p.stat().st_mtime_ns) for p in self.markers.iterdir()}


class StatusWatch:
    """Polls the connector's task statuses in a thread, keeping every change it sees to
    the tasks it was told to watch."""

    def __init__(self, url: str, watched: dict[int, tuple[str, str]]) -> None:
        self.url = url
        self.watched = watched
        self.seen: list[tuple[int, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> StatusWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        with httpx.Client(timeout=5) as client:
            while not self._stop.wait(0.05):
                try:
                    status = client.get(f"{self.url}/connectors/{NAME}/status").json()
                except httpx.HTTPError:
                    continue
                by_id = {t["id"]: t for t in status.get("tasks", [])}
                for task, expected in self.watched.items():
                    entry = by_id.get(task)
                    now = None if entry is None else (entry["worker_id"], entry["state"])
                    if now != expected:
                        self.seen.append((task, now))


@pytest.mark.parametrize(
    ("static", "leads", "protocol"),
    [
        (True, False, "sessioned"),
        (True, True, "sessioned"),
        (False, False, "sessioned"),
        (False, False, "eager"),
    ],
    ids=["static-follower", "static-leader", "dynamic-follower", "dynamic-follower-eager"],
)
def test_a_restarted_worker_keeps_its_work_only_when_static(
    processes: Processes, tmp_path: Path, static: bool, leads: bool, protocol: str
) -> None:
    server = make_server(processes, tmp_path, **{"group.min.session.timeout.ms": 1000}).start()
    workers = Workers(processes, tmp_path, server, extra={"connect.protocol": protocol})
    urls = [workers.start(f"worker-{i}" if static else None) for i in range(3)]
    config = {"connector.class": CONNECTOR, "tasks.max": str(TASKS)}
    config["marker.dir"] = str(workers.markers)
    created = httpx.post(f"{urls[0]}/connectors", json={"name": NAME, "config": config}, timeout=60)
    assert created.status_code == 201, created.text
    before = wait_until(
        lambda: (
            (o := workers.owners(urls[0])) is not None
            and all(state == "RUNNING" for _, state in o.values())
            and len(workers.markers_by_task()) == TASKS
            and o
        ),
        timeout=90,
        what="all tasks RUNNING",
    )
    assert isinstance(before, dict)
    assert len({worker for worker, _ in before.values()}) == 3, before
    metrics = {url: workers.metrics(url) for url in urls}
    for m in metrics.values():
        assert set(m) == METRICS
        assert m["rebalancing"] == 0 and m["completed-rebalances-total"] >= 1
    generation = metrics[urls[0]]["epoch"]
    assert {m["epoch"] for m in metrics.values()} == {generation}, metrics
    # the leader, or a worker that does not lead
    leader = metrics[urls[0]]["leader-name"]
    victim = next(url for url in urls if (url == leader) == leads)
    victim_id = victim.removeprefix("http://")
    others = [url for url in urls if url != victim]
    others_tasks = {t: owner for t, owner in before.items() if owner[0] != victim_id}
    victim_tasks = {t for t, owner in before.items() if owner[0] == victim_id}
    assert victim_tasks and others_tasks
    markers = workers.markers_by_task()

    with StatusWatch(others[0], others_tasks) as watch:
        workers.restart(victim)
        after = wait_until(
            lambda: (
                (o := workers.owners(others[0])) is not None
                and all(state == "RUNNING" for _, state in o.values())
                and len(workers.markers_by_task()) == TASKS
                and workers.metrics(victim)["rebalancing"] == 0
                and all(workers.metrics(url)["rebalancing"] == 0 for url in others)
                and o
            ),
            timeout=90,
            what="all tasks RUNNING again after the restart",
        )
    assert isinstance(after, dict)
    after_metrics = {url: workers.metrics(url) for url in urls}
    restarted_pid = str(workers.procs[victim].pid)
    now_markers = workers.markers_by_task()
    other_markers = {name for name in markers if int(name.rsplit("-", 1)[1]) in others_tasks}

    if static:
        # the restarted worker runs what it ran before, in its new process
        assert after == before
        for name in markers.keys() - other_markers:
            assert now_markers[name][0] == restarted_pid
        # no one else noticed: no rebalance, no task stopped or restarted, same generation
        for url in others:
            assert (
                after_metrics[url]["completed-rebalances-total"]
                == metrics[url]["completed-rebalances-total"]
            ), (url, metrics[url], after_metrics[url])
        assert {m["epoch"] for m in after_metrics.values()} == {generation}, after_metrics
        assert watch.seen == [], watch.seen
        assert {n: now_markers[n] for n in other_markers} == {n: markers[n] for n in other_markers}
        assert "is a static member of group workers with group.instance.id" in (
            workers.procs[victim].output()
        )
    else:
        # every worker rebalanced into a new generation
        for url in others:
            assert (
                after_metrics[url]["completed-rebalances-total"]
                > metrics[url]["completed-rebalances-total"]
            ), (url, metrics[url], after_metrics[url])
        assert all(m["epoch"] > generation for m in after_metrics.values()), after_metrics
        if protocol == "eager":
            # and the others' tasks were stopped and started again
            assert watch.seen, "the other workers' tasks were stopped and started again"
            assert any(now_markers.get(n) != markers[n] for n in other_markers)
        else:
            # cooperative: the others' tasks ran on, and the worker, back within
            # scheduled.rebalance.max.delay.ms, got its own tasks back
            assert watch.seen == [], watch.seen
            assert {n: now_markers[n] for n in other_markers} == {
                n: markers[n] for n in other_markers
            }
            assert after == before
