"""``herder status`` on a running cluster, the coordinator's metrics, and what workers log.

Three ensemble servers and two workers (neither starts Spark: the connectors have
nothing to move, so none is needed), a source and a sink connector. ``herder status``
shows the three servers with one leader, both workers with their URLs and task counts,
and every connector and task RUNNING on a worker, the sink's lag 0; ``--json`` says the
same for scripts and ``--watch`` redraws. One worker logs ``log.format=json``: its lines
about a task carry ``connector`` and ``task``; the other's text lines name the task as
Connect's MDC does, ``[connector|task-0]``.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.harness import HERDER, Processes, free_port, wait_until
from tests.integration.conftest import make_ensemble
from tests.integration.test_replication import leader_of
from tests.ops.metrics_text import parse, value

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

READY_LINE = re.compile(r"^worker (\S+) REST API at (\S+)$", re.MULTILINE)


def start_worker(processes: Processes, tmp_path: Path, bootstrap: str, **extra: str) -> Any:
    port = free_port()
    props = {
        "group.id": "status-test",
        "bootstrap.servers": bootstrap,
        "rest.host.name": "127.0.0.1",
        "rest.port": str(port),
        "session.timeout.ms": "6000",
        "heartbeat.interval.ms": "500",
        "storage.root": str(tmp_path / "topics"),
        "dataplane.spark.warmup": "false",
        "task.shutdown.graceful.timeout.ms": "1000",
        **extra,
    }
    config = tmp_path / f"worker-{port}.properties"
    config.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
    name = f"worker-{port}"
    log = tmp_path / f"{name}-0.log"
    proc = processes.start(
        [*HERDER, "--log-level", "INFO", "worker", "start", "--config", str(config)],
        name=name,
        ready=lambda: READY_LINE.search(log.read_text(errors="replace")),
        timeout=60,
    )
    found = READY_LINE.search(proc.output())
    assert found is not None
    return proc, found.group(1), found.group(2)


def herder(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*HERDER, *args], capture_output=True, text=True, timeout=60, check=False)


def status_json(url: str) -> dict[str, Any]:
    out = herder("status", "--url", url, "--json")
    assert out.returncode == 0, out.stderr
    doc: dict[str, Any] = json.loads(out.stdout)
    return doc


def test_status_shows_the_cluster_on_one_screen(processes: Processes, tmp_path: Path) -> None:
    ensemble = make_ensemble(processes, tmp_path, 3)
    admin = {}
    for sid, server in ensemble.servers.items():
        admin[sid] = free_port()
        with open(server.config_path, "a") as f:
            f.write(f"admin.serverPort={admin[sid]}\nadmin.serverAddress=127.0.0.1\n")
    ensemble.start()
    leader = leader_of(ensemble)
    proc_a, id_a, url_a = start_worker(processes, tmp_path, ensemble.bootstrap)
    proc_b, id_b, url_b = start_worker(
        processes, tmp_path, ensemble.bootstrap, **{"log.format": "json"}
    )
    source_file = tmp_path / "in.txt"
    source_file.write_text("")
    for body in (
        {
            "name": "idle-in",
            "config": {
                "connector.class": "FileStreamSource",
                "file": str(source_file),
                "topic": "idle",
            },
        },
        {
            "name": "idle-out",
            "config": {
                "connector.class": "FileStreamSink",
                "file": str(tmp_path / "out.txt"),
                "topics": "idle",
            },
        },
    ):
        reply = httpx.post(f"{url_a}/connectors", json=body, timeout=60)
        assert reply.status_code == 201, reply.text
        name = body["name"]

        def task_running(name: str = name) -> bool:
            status = httpx.get(f"{url_a}/connectors/{name}/status", timeout=10).json()
            return [t["state"] for t in status.get("tasks", [])] == ["RUNNING"]

        # the next connector once this one runs: no creation in the middle of a rebalance
        wait_until(task_running, timeout=60, what=f"{name}'s task RUNNING")

    def settled() -> dict[str, Any] | None:
        doc = status_json(url_a)
        tasks = [t for c in doc["connectors"] for t in c["tasks"]]
        running = all(c["state"] == "RUNNING" for c in doc["connectors"]) and all(
            t["state"] == "RUNNING" for t in tasks
        )
        sink = next(c for c in doc["connectors"] if c["name"] == "idle-out")
        lag_known = bool(sink["tasks"]) and sink["tasks"][0]["lag_records"] == 0
        return doc if len(tasks) == 2 and running and lag_known else None

    doc = wait_until(settled, timeout=120, what="both connectors and their tasks RUNNING")
    assert isinstance(doc, dict)
    servers = doc["ensemble"]
    assert sorted(s["server_id"] for s in servers) == [1, 2, 3]
    assert [s["server_id"] for s in servers if s["role"] == "leader"] == [leader]
    assert all(s["leader"] == leader for s in servers)
    workers = {w["id"]: w for w in doc["workers"]}
    assert set(workers) == {id_a, id_b}
    assert {w["url"] for w in workers.values()} == {url_a, url_b}
    assert sum(w["leader"] for w in workers.values()) == 1
    assert sum(len(w["tasks"]) for w in workers.values()) == 2
    for connector in doc["connectors"]:
        assert connector["worker_id"] in workers
        for task in connector["tasks"]:
            assert task["worker_id"] in workers
    assert doc["group"]["state"] == "Stable"
    assert doc["group"]["rebalance_reason"]
    rebalances = doc["group"]["rebalances"]
    assert rebalances and all(r["reason"] and r["took_ms"] >= 0 for r in rebalances)
    assert rebalances[-1]["generation"] == doc["group"]["generation"]
    assert any("joined" in r["reason"] for r in rebalances)

    # the coordinator (on the ensemble's leader) counts the groups by state and times
    # their rebalances: the worker group and the sink connector's group are Stable
    reply = httpx.get(f"http://127.0.0.1:{admin[leader]}/metrics", timeout=10)
    m = parse(reply.text)
    assert (value(m, "herder_coordinator_groups", state="Stable") or 0) >= 2
    assert value(m, "herder_coordinator_group_members", group="status-test") == 2
    assert (value(m, "herder_coordinator_group_rebalances_total", group="status-test") or 0) >= 1
    last = value(m, "herder_coordinator_group_last_rebalance_time_ms", group="status-test")
    assert last is not None and 0 <= last < 60_000
    assert value(m, "herder_coordinator_group_members", group="connect-idle-out") == 1
    follower = next(sid for sid in admin if sid != leader)
    follower_metrics = parse(httpx.get(f"http://127.0.0.1:{admin[follower]}/metrics").text)
    assert value(follower_metrics, "herder_coordinator_groups", state="Stable") is None

    # the screen for people: every server, worker and connector on it
    out = herder("status", "--url", url_b)
    assert out.returncode == 0, out.stderr
    screen = out.stdout
    for expected in (
        "Ensemble",
        "leader",
        "follower",
        id_a,
        id_b,
        "idle-in",
        "idle-out-0",
        "RUNNING",
    ):
        assert expected in screen, (expected, screen)

    # --watch redraws until stopped
    watch = subprocess.Popen(
        [*HERDER, "status", "--url", url_a, "--watch", "--interval", "0.3"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        seen: list[str] = []

        def redrawn() -> bool:
            assert watch.stdout is not None
            line = watch.stdout.readline()
            seen.append(line)
            return sum("Connectors and tasks" in s for s in seen) >= 2

        wait_until(redrawn, timeout=30, interval=0, what="two screens from --watch")
    finally:
        watch.kill()
        watch.wait(timeout=10)

    # a worker that is not reachable: one clear line, exit 1
    out = herder("status", "--url", f"http://127.0.0.1:{free_port()}")
    assert out.returncode == 1
    assert out.stderr.startswith("error: cannot reach a worker")

    # logs: the text worker names the task as Connect's MDC does; the JSON one in fields
    text_lines = proc_a.output() + proc_b.output()
    assert re.search(r"\[idle-(in|out)\|task-0\] ", text_lines), text_lines[-3000:]
    json_lines = []
    for line in proc_b.output().splitlines():
        if line.startswith("{"):
            json_lines.append(json.loads(line))
    assert json_lines, proc_b.output()[-2000:]
    assert all({"ts", "level", "logger", "message"} <= set(entry) for entry in json_lines)
    about_tasks = [e for e in json_lines if "task" in e]
    # worker b runs at least one of the two tasks, or says nothing about tasks at all
    runs_tasks = workers[id_b]["tasks"]
    if runs_tasks:
        assert about_tasks, json_lines[-20:]
        assert {e["connector"] for e in about_tasks} <= {"idle-in", "idle-out"}
