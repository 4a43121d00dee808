"""Three real worker processes on a one-server ensemble: the distributed herder."""

from __future__ import annotations

import collections
from pathlib import Path

import httpx
import pytest

from tests.harness import HERDER, Proc, Processes, free_port, wait_until
from tests.integration.conftest import ServerHandle, make_server

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

CONNECTOR = "tests.fixtures.connectors.MarkerSourceConnector"
SESSION_MS = 3000


class Cluster:
    def __init__(self, processes: Processes, tmp_path: Path, server: ServerHandle) -> None:
        self.processes = processes
        self.tmp_path = tmp_path
        self.server = server
        self.workers: dict[str, Proc] = {}
        self.markers = tmp_path / "markers"
        self.markers.mkdir()

    def start_worker(self) -> str:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        props = {
            "group.id": "workers",
            "bootstrap.servers": self.server.bootstrap,
            "rest.host.name": "127.0.0.1",
            "rest.port": port,
            "session.timeout.ms": SESSION_MS,
            "heartbeat.interval.ms": 300,
            "rebalance.timeout.ms": 10000,
            "worker.unsync.backoff.ms": 1000,
            # a departed worker's tasks move at once (the delay has tests of its own)
            "scheduled.rebalance.max.delay.ms": 0,
            "task.execution.factory": "tests.fixtures.connectors:MarkerExecutions",
        }
        path = self.tmp_path / f"worker-{port}.properties"
        path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        self.workers[url] = self.processes.start(
            [*HERDER, "--log-level", "INFO", "worker", "start", "--config", str(path)],
            name=f"worker-{port}",
            ready=lambda: httpx.get(f"{url}/health", timeout=1).status_code == 200,
        )
        return url

    def status(self, url: str, name: str) -> dict:  # type: ignore[type-arg]
        return httpx.get(f"{url}/connectors/{name}/status", timeout=10).json()

    def running_markers(self) -> dict[str, str]:
        return {p.name: p.read_text() for p in self.markers.iterdir()}


@pytest.fixture
def cluster(processes: Processes, tmp_path: Path) -> Cluster:
    server = make_server(processes, tmp_path, **{"group.min.session.timeout.ms": 1000}).start()
    c = Cluster(processes, tmp_path, server)
    for _ in range(3):
        c.start_worker()
    return c


def connector_config(c: Cluster, tasks: int = 2) -> dict[str, str]:
    return {"connector.class": CONNECTOR, "tasks.max": str(tasks), "marker.dir": str(c.markers)}


def all_running(c: Cluster, url: str, names: list[str], tasks: int) -> bool:
    for name in names:
        st = c.status(url, name)
        if st.get("connector", {}).get("state") != "RUNNING":
            return False
        if len(st["tasks"]) != tasks or any(t["state"] != "RUNNING" for t in st["tasks"]):
            return False
    return True


def test_connectors_spread_fail_over_pause_and_delete(cluster: Cluster) -> None:
    c = cluster
    urls = list(c.workers)
    names = [f"c{i}" for i in range(3)]
    for i, name in enumerate(names):
        # sent to each worker in turn: two of the three are not the leader and forward
        reply = httpx.post(
            f"{urls[i]}/connectors",
            json={"name": name, "config": connector_config(c)},
            timeout=60,
        )
        assert reply.status_code == 201, reply.text
        assert reply.json()["name"] == name
    dup = httpx.post(
        f"{urls[0]}/connectors", json={"name": "c0", "config": connector_config(c)}, timeout=60
    )
    assert dup.status_code == 409
    bad = httpx.post(
        f"{urls[1]}/connectors", json={"name": "bad", "config": {"tasks.max": "0"}}, timeout=60
    )
    assert bad.status_code == 400 and "connector.class" in bad.json()["message"]
    wait_until(lambda: all_running(c, urls[0], names, 2), timeout=60, what="all connectors RUNNING")
    assert sorted(httpx.get(f"{urls[2]}/connectors", timeout=10).json()) == names
    expanded = httpx.get(f"{urls[2]}/connectors?expand=status&expand=info", timeout=10).json()
    assert set(expanded) == set(names)
    assert expanded["c0"]["info"]["type"] == "source" and "connector" in expanded["c0"]["status"]
    tasks = httpx.get(f"{urls[1]}/connectors/c0/tasks", timeout=10).json()
    assert [t["id"] for t in tasks] == [
        {"connector": "c0", "task": 0},
        {"connector": "c0", "task": 1},
    ]
    assert httpx.get(f"{urls[0]}/connectors/c0/tasks/1/status", timeout=10).json()["id"] == 1
    assert httpx.get(f"{urls[0]}/connectors/c0/tasks/7/status", timeout=10).status_code == 404
    wrong_shape = httpx.post(f"{urls[0]}/connectors", json={"config": []}, timeout=10)
    assert wrong_shape.status_code == 400 and wrong_shape.json()["error_code"] == 400
    assert "paths" in httpx.get(f"{urls[0]}/openapi.json", timeout=10).json()
    # round-robin: 3 connectors and 6 tasks over 3 workers -> each worker has 1 + 2
    load: collections.Counter[str] = collections.Counter()
    for name in names:
        st = c.status(urls[0], name)
        load[st["connector"]["worker_id"]] += 1
        for t in st["tasks"]:
            load[t["worker_id"]] += 1
    assert sorted(load.values()) == [3, 3, 3], load
    wait_until(lambda: len(c.running_markers()) == 6, timeout=30, what="six task markers")

    # kill -9 one worker: its work moves to the survivors
    victim_url = urls[1]
    victim = c.workers.pop(victim_url)
    victim.kill9()
    dead_pid = str(victim.pid)
    survivors = list(c.workers)

    def moved() -> bool:
        if not all_running(c, survivors[0], names, 2):
            return False
        markers = c.running_markers()
        return len(markers) == 6 and dead_pid not in markers.values()

    # the session timeout, then a rebalance, then tasks restart
    wait_until(moved, timeout=SESSION_MS / 1000 + 20, what="work moved off the dead worker")
    alive_ids = set()
    for name in names:
        st = c.status(survivors[0], name)
        alive_ids.add(st["connector"]["worker_id"])
        alive_ids.update(t["worker_id"] for t in st["tasks"])
    assert len(alive_ids) == 2, f"no stale RUNNING from the dead worker: {alive_ids}"

    # pause and resume
    assert httpx.put(f"{survivors[1]}/connectors/c0/pause", timeout=60).status_code == 202
    wait_until(
        lambda: (
            c.status(survivors[0], "c0")["connector"]["state"] == "PAUSED"
            and all(t["state"] == "PAUSED" for t in c.status(survivors[0], "c0")["tasks"])
        ),
        timeout=30,
        what="c0 paused",
    )
    assert httpx.put(f"{survivors[0]}/connectors/c0/resume", timeout=60).status_code == 202
    wait_until(lambda: all_running(c, survivors[1], ["c0"], 2), timeout=30, what="c0 resumed")

    # delete: its tasks stop everywhere
    assert httpx.delete(f"{survivors[1]}/connectors/c1", timeout=60).status_code == 204
    wait_until(
        lambda: not any(m.startswith("c1-") for m in c.running_markers()),
        timeout=30,
        what="c1's tasks stopped",
    )
    assert httpx.get(f"{survivors[0]}/connectors/c1/status", timeout=10).status_code == 404
    assert sorted(httpx.get(f"{survivors[0]}/connectors", timeout=10).json()) == ["c0", "c2"]
    gone = httpx.delete(f"{survivors[0]}/connectors/nope", timeout=60)
    assert gone.status_code == 404 and gone.json()["error_code"] == 404
