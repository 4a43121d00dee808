"""An existing Kafka Connect client, unchanged, against herder: ``kafka-connect-py``.

The client (``kafka_connect.KafkaConnect``, pinned in the ``test`` extra) speaks Kafka
Connect's REST API through ``requests``; here it manages connectors on a real
distributed worker (an ensemble server and a worker process) through create, list with
expand, status, pause, resume, restart with flags, stop, tasks and delete.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from kafka_connect import KafkaConnect
from requests.exceptions import HTTPError

from tests.harness import HERDER, Processes, free_port, wait_until
from tests.integration.conftest import make_server

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

MARKER = "tests.fixtures.connectors.MarkerSourceConnector"


@pytest.fixture
def worker_url(processes: Processes, tmp_path: Path) -> str:
    server = make_server(processes, tmp_path, **{"group.min.session.timeout.ms": 1000}).start()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    props = {
        "group.id": "kcp",
        "bootstrap.servers": server.bootstrap,
        "rest.host.name": "127.0.0.1",
        "rest.port": port,
        "session.timeout.ms": 3000,
        "heartbeat.interval.ms": 300,
        "task.execution.factory": "tests.fixtures.connectors:MarkerExecutions",
    }
    path = tmp_path / "worker.properties"
    path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
    processes.start(
        [*HERDER, "--log-level", "INFO", "worker", "start", "--config", str(path)],
        name="worker",
        ready=lambda: httpx.get(f"{url}/health", timeout=1).status_code == 200,
    )
    return url


def states(kc: KafkaConnect, name: str) -> tuple[str, list[str]]:
    status: dict[str, Any] = kc.get_connector_status(name)
    return status["connector"]["state"], [t["state"] for t in status["tasks"]]


def wait_states(kc: KafkaConnect, name: str, connector: str, tasks: list[str]) -> None:
    wait_until(
        lambda: states(kc, name) == (connector, tasks),
        timeout=60,
        what=f"{name}: {connector} with tasks {tasks}",
    )


def test_kafka_connect_py_manages_connectors(worker_url: str, tmp_path: Path) -> None:
    kc = KafkaConnect(url=worker_url)
    assert "version" in kc.get_cluster_info()
    markers = tmp_path / "markers"
    markers.mkdir()
    config = {"connector.class": MARKER, "tasks.max": "2", "marker.dir": str(markers)}

    # create
    created = kc.create_connector({"name": "kcp-a", "config": config})
    assert created["name"] == "kcp-a" and created["type"] == "source"
    assert created["config"]["tasks.max"] == "2"
    kc.create_connector({"name": "kcp-b", "config": {**config, "tasks.max": "1"}})
    with pytest.raises(HTTPError) as duplicate:
        kc.create_connector({"name": "kcp-a", "config": config})
    assert duplicate.value.response.status_code == 409
    wait_states(kc, "kcp-a", "RUNNING", ["RUNNING", "RUNNING"])
    wait_states(kc, "kcp-b", "RUNNING", ["RUNNING"])

    # list, with expand, with the client's own filters on top
    assert sorted(kc.list_connectors()) == ["kcp-a", "kcp-b"]
    by_status = kc.list_connectors(expand="status")
    assert set(by_status) == {"kcp-a", "kcp-b"}
    assert by_status["kcp-a"]["status"]["connector"]["state"] == "RUNNING"
    assert [t["id"] for t in by_status["kcp-a"]["status"]["tasks"]] == [0, 1]
    by_info = kc.list_connectors(expand="info")
    assert by_info["kcp-b"]["info"]["config"]["tasks.max"] == "1"
    assert by_info["kcp-b"]["info"]["tasks"] == [{"connector": "kcp-b", "task": 0}]
    assert kc.list_connectors(expand="status", pattern="kcp-a") == {"kcp-a": by_status["kcp-a"]}

    # get, config, status, tasks
    assert kc.get_connector("kcp-a")["tasks"] == [
        {"connector": "kcp-a", "task": 0},
        {"connector": "kcp-a", "task": 1},
    ]
    assert kc.get_connector_config("kcp-a") == {**config, "name": "kcp-a"}
    status = kc.get_connector_status("kcp-a")
    assert status["name"] == "kcp-a" and status["type"] == "source"
    # as Connect's: the worker's advertised host:port
    assert status["connector"]["worker_id"] == worker_url.removeprefix("http://")
    tasks = kc.list_connector_tasks("kcp-a")
    assert [t["id"] for t in tasks] == [
        {"connector": "kcp-a", "task": 0},
        {"connector": "kcp-a", "task": 1},
    ]
    assert all(t["config"]["marker.dir"] == str(markers) for t in tasks)
    task_status = kc.get_connector_task_status("kcp-a", 1)
    assert task_status["id"] == 1 and task_status["state"] == "RUNNING"

    # pause and resume
    assert kc.pause_connector("kcp-a") is None
    wait_states(kc, "kcp-a", "PAUSED", ["PAUSED", "PAUSED"])
    assert kc.list_connectors(state="paused") == ["kcp-a"]
    assert kc.resume_connector("kcp-a") is None
    wait_states(kc, "kcp-a", "RUNNING", ["RUNNING", "RUNNING"])

    # restart: the connector only (204, no body), then with the flags (202, a status body)
    assert kc.restart_connector("kcp-a") is None
    wait_states(kc, "kcp-a", "RUNNING", ["RUNNING", "RUNNING"])
    everything = kc.restart_connector("kcp-a", include_tasks=True, only_failed=False)
    assert everything["name"] == "kcp-a"
    assert everything["connector"]["state"] == "RESTARTING"
    assert [t["state"] for t in everything["tasks"]] == ["RESTARTING", "RESTARTING"]
    wait_states(kc, "kcp-a", "RUNNING", ["RUNNING", "RUNNING"])
    # nothing has failed, so nothing restarts
    failed_only = kc.restart_connector("kcp-a", include_tasks=True, only_failed=True)
    assert failed_only["connector"]["state"] == "RUNNING"
    assert [t["state"] for t in failed_only["tasks"]] == ["RUNNING", "RUNNING"]
    assert kc.restart_connector_task("kcp-a", 0) is None
    wait_states(kc, "kcp-a", "RUNNING", ["RUNNING", "RUNNING"])
    with pytest.raises(HTTPError):
        kc.restart_connector("nope", include_tasks=True)

    # update through the client, then stop
    updated = kc.update_connector("kcp-b", {**config, "tasks.max": "3"})
    assert updated["config"]["tasks.max"] == "3"
    wait_states(kc, "kcp-b", "RUNNING", ["RUNNING"] * 3)
    assert kc.stop_connector("kcp-b") is None
    wait_states(kc, "kcp-b", "STOPPED", [])
    assert kc.list_connectors(state="stopped") == ["kcp-b"]

    # delete
    assert kc.delete_connector("kcp-a") is None
    assert kc.list_connectors() == ["kcp-b"]
    with pytest.raises(HTTPError) as gone:
        kc.get_connector("kcp-a")
    assert gone.value.response.status_code == 404
    kc.delete_connector("kcp-b")
    assert kc.list_connectors() == []
    wait_until(lambda: not list(markers.iterdir()), timeout=30, what="every task stopped")
