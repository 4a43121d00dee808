"""Connect's REST API on real workers: every endpoint, its errors, and its response shapes.

One ensemble and two workers (group ``rest``) serve most tests; requests go to both
workers in turn, so half of every write is forwarded to the leader. Replies are checked
against Connect's shapes in ``tests/golden/connect``.
"""

from __future__ import annotations

import contextlib
import http.client
import select
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.golden.conformance import assert_conforms
from tests.harness import HERDER, Proc, Processes, free_port, wait_until
from tests.integration.conftest import ServerHandle, make_server

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

SOURCE = "tests.fixtures.rest_connectors.CountingSourceConnector"
SINK = "tests.fixtures.rest_connectors.CountingSinkConnector"
SESSION_MS = 3000


class RestCluster:
    def __init__(self, processes: Processes, root: Path, server: ServerHandle) -> None:
        self.processes = processes
        self.root = root
        self.server = server
        self.workers: dict[str, Proc] = {}
        self.markers = root / "markers"
        self.markers.mkdir(exist_ok=True)

    def start_worker(self, group: str = "rest", **extra: object) -> str:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        props = {
            "group.id": group,
            "bootstrap.servers": self.server.bootstrap,
            "rest.host.name": "127.0.0.1",
            "rest.port": port,
            "session.timeout.ms": SESSION_MS,
            "heartbeat.interval.ms": 300,
            "rebalance.timeout.ms": 10000,
            "worker.unsync.backoff.ms": 1000,
            "task.execution.factory": "tests.fixtures.rest_connectors:PollingExecutions",
            **extra,
        }
        if group != "rest":
            props.update(
                {
                    "config.storage.topic": f"_configs_{group}",
                    "offset.storage.topic": f"_offsets_{group}",
                    "status.storage.topic": f"_status_{group}",
                }
            )
        path = self.root / f"worker-{port}.properties"
        path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        self.workers[url] = self.processes.start(
            [*HERDER, "--log-level", "INFO", "worker", "start", "--config", str(path)],
            name=f"worker-{port}",
            ready=lambda: httpx.get(f"{url}/health", timeout=1).status_code == 200,
        )
        return url

    def urls(self, group_size: int = 2) -> list[str]:
        return list(self.workers)[:group_size]

    def config(self, **extra: str) -> dict[str, str]:
        return {"connector.class": SOURCE, "marker.dir": str(self.markers), **extra}

    def starts(self, name: str) -> int:
        path = self.markers / f"{name}.starts"
        return len(path.read_text().splitlines()) if path.exists() else 0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RestCluster]:
    root = tmp_path_factory.mktemp("rest")
    processes = Processes(root)
    try:
        server = make_server(processes, root, **{"group.min.session.timeout.ms": 1000}).start()
        c = RestCluster(processes, root, server)
        c.start_worker()
        c.start_worker()
        yield c
    finally:
        processes.stop_all()


@pytest.fixture
def logs_on_failure(cluster: RestCluster, request: pytest.FixtureRequest) -> Iterator[RestCluster]:
    yield cluster
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        for proc in cluster.processes.started:
            sys.stderr.write(f"\n----- {proc.name} -----\n{proc.output()[-8000:]}")


def get(url: str) -> httpx.Response:
    return httpx.get(url, timeout=100)


def send(method: str, url: str, body: Any = None) -> httpx.Response:
    return httpx.request(method, url, json=body, timeout=100)


def status(url: str, name: str) -> dict[str, Any]:
    reply = get(f"{url}/connectors/{name}/status")
    assert reply.status_code == 200, reply.text
    body: dict[str, Any] = reply.json()
    return body


def states(url: str, name: str) -> tuple[str, list[str]]:
    st = status(url, name)
    return st["connector"]["state"], [t["state"] for t in st["tasks"]]


def create(url: str, name: str, config: dict[str, str], **extra: Any) -> dict[str, Any]:
    reply = send("POST", f"{url}/connectors", {"name": name, "config": config, **extra})
    assert reply.status_code == 201, reply.text
    # as Connect's: the new connector's URL, whether this worker or the leader created it
    assert reply.headers["location"] == f"{url}/connectors/{name}"
    assert_conforms("connector_info", reply.json())
    body: dict[str, Any] = reply.json()
    return body


def assert_error(reply: httpx.Response, code: int, *words: str) -> None:
    assert reply.status_code == code, reply.text
    assert_conforms("error_message", reply.json())
    assert reply.json()["error_code"] == code
    for word in words:
        assert word in reply.json()["message"], reply.json()["message"]


def test_an_idle_keep_alive_connection_stays_open_as_long_as_clients_keep_it(
    logs_on_failure: RestCluster,
) -> None:
    """A client may reuse an idle connection for 5 s (httpx's default): the worker must
    not be closing it then, or the request sent on it is lost without an answer."""
    url = logs_on_failure.urls()[0]
    connection = http.client.HTTPConnection("127.0.0.1", int(url.rsplit(":", 1)[1]), timeout=10)
    try:
        connection.request("GET", "/")
        first = connection.getresponse()
        assert first.status == 200
        first.read()
        sock = connection.sock
        assert sock is not None
        # the connection closes (reads as EOF) if the worker drops it while it is idle
        readable, _, _ = select.select([sock], [], [], 6.0)
        assert not readable or sock.recv(1, socket.MSG_PEEK) != b"", (
            "the worker closed an idle connection within 6 s"
        )
        connection.request("GET", "/")  # on the same connection
        assert connection.getresponse().status == 200
        assert connection.sock is sock
    finally:
        connection.close()


def test_server_info_plugins_and_validation(logs_on_failure: RestCluster) -> None:
    c = logs_on_failure
    a, b = c.urls()
    assert_conforms("server_info", get(f"{a}/").json())
    connectors = get(f"{a}/connector-plugins").json()
    assert_conforms("plugin_infos", connectors)
    assert {p["type"] for p in connectors} <= {"source", "sink"}
    assert "herder.connectors.file.FileStreamSourceConnector" in {p["class"] for p in connectors}
    everything = get(f"{b}/connector-plugins?connectorsOnly=false").json()
    assert_conforms("plugin_infos", everything)
    assert everything[: len(connectors)] == connectors
    assert {p["type"] for p in everything} == {"source", "sink", "transformation", "predicate"}
    installed = {p["class"]: p["type"] for p in everything}
    assert installed["org.apache.kafka.connect.transforms.Cast$Value"] == "transformation"
    assert installed["org.apache.kafka.connect.transforms.predicates.HasHeaderKey"] == "predicate"

    keys = get(f"{a}/connector-plugins/{SOURCE}/config").json()
    assert_conforms("config_key_infos", keys)
    assert [k["name"] for k in keys][:2] == ["marker.dir", "fail.tasks"]
    assert get(f"{a}/connector-plugins/FileStreamSource/config").status_code == 200
    assert_error(get(f"{b}/connector-plugins/NoSuchThing/config"), 404, "NoSuchThing")

    validate = f"{a}/connector-plugins/CountingSourceConnector/config/validate"
    good = send("PUT", validate, c.config(name="v")).json()
    assert_conforms("config_infos", good)
    assert good["error_count"] == 0 and good["name"] == SOURCE
    assert good["groups"][:1] == ["Common"] and "Markers" in good["groups"]
    bad = send("PUT", validate, {"connector.class": SOURCE, "tasks.max": "0", "name": "v"})
    assert bad.status_code == 200
    assert_conforms("config_infos", bad.json())
    errors = {
        cfg["value"]["name"]: cfg["value"]["errors"]
        for cfg in bad.json()["configs"]
        if cfg["value"]["errors"]
    }
    assert bad.json()["error_count"] == 2 and set(errors) == {"tasks.max", "marker.dir"}
    sink = send(
        "PUT",
        f"{b}/connector-plugins/{SINK}/config/validate",
        {**c.config(name="s"), "connector.class": SINK},
    ).json()
    assert [x["value"]["name"] for x in sink["configs"] if x["value"]["errors"]] == ["topics"]
    assert_error(send("PUT", validate, {**c.config(), "connector.class": SINK}), 400, "match")
    assert_error(send("PUT", validate, {"tasks.max": "1"}), 400, "no connector type")


def test_create_with_initial_states_and_errors(logs_on_failure: RestCluster) -> None:
    c = logs_on_failure
    a, b = c.urls()
    # as in Connect, a connector created PAUSED or STOPPED does not start, so it has no
    # task configs until it is resumed
    create(b, "init-paused", c.config(**{"tasks.max": "2"}), initial_state="PAUSED")
    create(a, "init-stopped", c.config(), initial_state="STOPPED")
    create(b, "init-running", c.config(**{"tasks.max": "2"}), initial_state="running")
    wait_until(lambda: states(a, "init-paused") == ("PAUSED", []), 30)
    wait_until(lambda: states(b, "init-stopped") == ("STOPPED", []), 30)
    wait_until(lambda: states(a, "init-running") == ("RUNNING", ["RUNNING", "RUNNING"]), 30)
    assert c.starts("init-paused") == 0 and c.starts("init-stopped") == 0
    # as in Connect, a worker's id is the host:port of its REST API
    running = status(b, "init-running")
    ids = {running["connector"]["worker_id"], *(t["worker_id"] for t in running["tasks"])}
    assert ids <= {u.removeprefix("http://") for u in (a, b)} and len(ids) == 2
    assert get(f"{a}/connectors/init-stopped/tasks").json() == []

    body = {"name": "init-bad", "config": c.config(), "initial_state": "SLEEPING"}
    assert_error(send("POST", f"{a}/connectors", body), 400, "initial_state")
    dup = {"name": "init-paused", "config": c.config()}
    assert_error(send("POST", f"{b}/connectors", dup), 409, "already exists", "another name")
    invalid = {"name": "init-invalid", "config": {"connector.class": SOURCE, "tasks.max": "0"}}
    assert_error(send("POST", f"{b}/connectors", invalid), 400, "tasks.max", "marker.dir")
    unknown = {"name": "init-unknown", "config": {"connector.class": "NoSuchConnector"}}
    assert_error(send("POST", f"{a}/connectors", unknown), 400, "NoSuchConnector")
    mismatch = {"name": "init-x", "config": c.config(name="init-y")}
    assert_error(send("POST", f"{a}/connectors", mismatch), 400, "doesn't match")
    assert "init-invalid" not in get(f"{a}/connectors").json()

    for path in ("", "/config", "/status", "/tasks", "/tasks/0/status", "/offsets"):
        # Connect's message, then what to do next
        assert_error(get(f"{a}/connectors/nope{path}"), 404, "nope", "GET /connectors lists")
    info = get(f"{b}/connectors/init-running").json()
    assert_conforms("connector_info", info)
    assert info["type"] == "source" and len(info["tasks"]) == 2
    assert_conforms("connector_config", get(f"{a}/connectors/init-running/config").json())
    assert_conforms("connector_state_info", status(a, "init-running"))
    assert_conforms("task_state", get(f"{a}/connectors/init-running/tasks/1/status").json())
    assert_conforms("task_infos", get(f"{b}/connectors/init-running/tasks").json())
    assert send("PUT", f"{a}/connectors/init-paused/resume").status_code == 202
    wait_until(lambda: states(b, "init-paused") == ("RUNNING", ["RUNNING", "RUNNING"]), 30)
    assert_conforms("connector_names", get(f"{b}/connectors").json())
    expanded = get(f"{a}/connectors?expand=status&expand=info").json()
    assert_conforms("connectors_expanded", expanded)
    assert expanded["init-stopped"]["status"]["connector"]["state"] == "STOPPED"


def test_patch_and_put_config(logs_on_failure: RestCluster) -> None:
    c = logs_on_failure
    a, b = c.urls()
    create(a, "patchy", c.config(custom="1"))
    reply = send("PATCH", f"{b}/connectors/patchy/config", {"custom": None, "topic": "other"})
    assert reply.status_code == 200, reply.text
    assert_conforms("connector_info", reply.json())
    config = get(f"{a}/connectors/patchy/config").json()
    assert "custom" not in config and config["topic"] == "other" and config["name"] == "patchy"
    assert_error(send("PATCH", f"{a}/connectors/nope/config", {"a": "b"}), 404)
    assert_error(
        send("PATCH", f"{b}/connectors/patchy/config", {"tasks.max": "x"}), 400, "tasks.max"
    )
    assert_error(send("PATCH", f"{a}/connectors/patchy/config", {"name": "other"}), 400, "match")
    updated = send("PUT", f"{a}/connectors/patchy/config", c.config(**{"tasks.max": "2"}))
    assert updated.status_code == 200 and len(updated.json()["config"]) == 4
    created = send("PUT", f"{b}/connectors/put-new/config", c.config())
    assert created.status_code == 201, created.text
    assert created.headers["location"] == f"{b}/connectors/put-new"
    assert "location" not in updated.headers
    assert_conforms("connector_info", created.json())


def test_stop_empties_task_configs_and_resume_restores_them(logs_on_failure: RestCluster) -> None:
    c = logs_on_failure
    a, b = c.urls()
    create(a, "stoppy", c.config(**{"tasks.max": "2"}))
    wait_until(lambda: states(b, "stoppy") == ("RUNNING", ["RUNNING", "RUNNING"]), 30)
    reply = send("PUT", f"{b}/connectors/stoppy/stop")
    assert reply.status_code == 204 and reply.content == b""
    wait_until(lambda: states(a, "stoppy") == ("STOPPED", []), 30, what="stoppy STOPPED")
    assert get(f"{b}/connectors/stoppy/tasks").json() == []
    assert get(f"{a}/connectors/stoppy").json()["tasks"] == []
    assert send("PUT", f"{a}/connectors/stoppy/resume").status_code == 202
    wait_until(lambda: states(b, "stoppy") == ("RUNNING", ["RUNNING", "RUNNING"]), 30)
    assert_error(send("PUT", f"{a}/connectors/nope/stop"), 404)
    assert_error(send("PUT", f"{b}/connectors/nope/pause"), 404)


def test_a_source_tasks_lag_shows_in_its_status_running_and_paused(
    logs_on_failure: RestCluster,
) -> None:
    c = logs_on_failure
    a, b = c.urls()
    create(a, "laggy", c.config(**{"report.lag": "true"}))
    seen: list[int] = []

    def lag_moves(url: str, state: str) -> bool:
        task = status(url, "laggy")["tasks"][0]
        if task["state"] == state and "lag" in task:
            seen.append(task["lag"]["polls"])
        return len(set(seen)) >= 2

    wait_until(lambda: lag_moves(b, "RUNNING"), 60, what="laggy's lag measured twice")
    assert send("PUT", f"{a}/connectors/laggy/pause").status_code == 202
    seen.clear()

    def paused_with_lag() -> bool:
        task = status(a, "laggy")["tasks"][0]
        return task["state"] == "PAUSED" and "lag" in task

    wait_until(paused_with_lag, 60, what="laggy PAUSED, its lag still reported")
    # a herder extension of Connect's TaskState: one more key, optional
    assert_conforms("connector_state_info", status(a, "laggy"))
    assert_conforms("task_state", get(f"{b}/connectors/laggy/tasks/0/status").json())
    assert send("PUT", f"{b}/connectors/laggy/resume").status_code == 202
    wait_until(lambda: lag_moves(a, "RUNNING"), 60, what="laggy's lag moving again")
    assert send("DELETE", f"{a}/connectors/laggy").status_code == 204
    # a task that reports no lag has none in its status
    create(a, "quiet", c.config())
    wait_until(lambda: states(b, "quiet") == ("RUNNING", ["RUNNING"]), 30)
    assert "lag" not in status(b, "quiet")["tasks"][0]
    assert send("DELETE", f"{a}/connectors/quiet").status_code == 204


def test_restarts_are_carried_out_by_the_owning_workers(logs_on_failure: RestCluster) -> None:
    c = logs_on_failure
    a, b = c.urls()
    create(a, "flaky", c.config(**{"tasks.max": "2", "fail.tasks": "1"}))
    wait_until(lambda: states(b, "flaky") == ("RUNNING", ["RUNNING", "FAILED"]), 30)
    base = {n: c.starts(n) for n in ("flaky", "flaky-0", "flaky-1")}

    def counts() -> dict[str, int]:
        return {n: c.starts(n) - base[n] for n in base}

    plain = send("POST", f"{b}/connectors/flaky/restart")
    assert plain.status_code == 204 and plain.content == b""
    assert counts() == {"flaky": 1, "flaky-0": 0, "flaky-1": 0}  # done when answered

    failed = send("POST", f"{a}/connectors/flaky/restart?includeTasks=true&onlyFailed=true")
    assert failed.status_code == 202, failed.text
    assert_conforms("connector_state_info", failed.json())
    assert failed.json()["connector"]["state"] == "RUNNING"
    assert [t["state"] for t in failed.json()["tasks"]] == ["RUNNING", "RESTARTING"]
    wait_until(lambda: counts() == {"flaky": 1, "flaky-0": 0, "flaky-1": 1}, 30)
    wait_until(lambda: states(a, "flaky") == ("RUNNING", ["RUNNING", "FAILED"]), 30)

    everything = send("POST", f"{b}/connectors/flaky/restart?includeTasks=true")
    assert everything.status_code == 202
    assert states_of(everything.json()) == ("RESTARTING", ["RESTARTING", "RESTARTING"])
    wait_until(lambda: counts() == {"flaky": 2, "flaky-0": 1, "flaky-1": 2}, 30)

    only_failed = send("POST", f"{a}/connectors/flaky/restart?onlyFailed=true")
    assert only_failed.status_code == 202
    wait_until(lambda: states(a, "flaky") == ("RUNNING", ["RUNNING", "FAILED"]), 30)
    for url in (a, b):  # one of them does not run task 0: it forwards
        assert send("POST", f"{url}/connectors/flaky/tasks/0/restart").status_code == 204
    # as in Connect, the answer comes once the new execution is under way: its start()
    # runs on the task's own thread, maybe a moment later
    wait_until(lambda: counts() == {"flaky": 2, "flaky-0": 3, "flaky-1": 2}, 30)

    assert_error(send("POST", f"{a}/connectors/nope/restart"), 404)
    assert_error(send("POST", f"{b}/connectors/nope/restart?includeTasks=true"), 404)
    assert_error(send("POST", f"{a}/connectors/flaky/tasks/7/restart"), 404)
    assert_error(send("POST", f"{b}/connectors/nope/tasks/0/restart"), 404)


def test_stopping_a_failed_connector_stops_it_at_once(logs_on_failure: RestCluster) -> None:
    c = logs_on_failure
    a, b = c.urls()
    create(a, "broken", c.config(**{"fail.connector": "true"}))
    wait_until(lambda: states(b, "broken") == ("FAILED", []), 30, what="broken FAILED")
    assert send("PUT", f"{b}/connectors/broken/stop").status_code == 204
    wait_until(lambda: states(a, "broken") == ("STOPPED", []), 10, what="broken STOPPED")


def test_a_plain_restart_answers_after_the_start_with_its_failure(
    logs_on_failure: RestCluster,
) -> None:
    c = logs_on_failure
    a, b = c.urls()
    create(a, "unstartable", c.config(**{"fail.connector": "true"}))
    wait_until(lambda: states(b, "unstartable")[0] == "FAILED", 30, what="unstartable FAILED")
    before = c.starts("unstartable")
    for url in (a, b):  # one of them runs it; the other forwards
        assert_error(
            send("POST", f"{url}/connectors/unstartable/restart"),
            500,
            "unstartable",
            "configured to fail",
        )
    assert c.starts("unstartable") == before + 2


def test_a_connector_config_change_restarts_tasks_whose_configs_stay_equal(
    logs_on_failure: RestCluster,
) -> None:
    c = logs_on_failure
    a, b = c.urls()
    create(a, "steady", c.config(**{"tasks.max": "2"}))
    wait_until(lambda: states(b, "steady") == ("RUNNING", ["RUNNING", "RUNNING"]), 30)
    tasks_before = get(f"{a}/connectors/steady/tasks").json()
    base = {n: c.starts(n) for n in ("steady", "steady-0", "steady-1")}
    # a setting of the connector alone: its task configs come out the same
    reply = send(
        "PUT",
        f"{b}/connectors/steady/config",
        c.config(**{"tasks.max": "2", "start.delay.ms": "1"}),
    )
    assert reply.status_code == 200, reply.text
    wait_until(
        lambda: all(c.starts(n) > base[n] for n in base),
        30,
        what="the connector and both its tasks restarted",
    )
    assert get(f"{a}/connectors/steady/tasks").json() == tasks_before
    wait_until(lambda: states(a, "steady") == ("RUNNING", ["RUNNING", "RUNNING"]), 30)


def states_of(info: dict[str, Any]) -> tuple[str, list[str]]:
    return info["connector"]["state"], [t["state"] for t in info["tasks"]]


def test_source_and_sink_offsets(logs_on_failure: RestCluster) -> None:
    c = logs_on_failure
    a, b = c.urls()
    create(a, "src-off", c.config())
    wait_until(lambda: states(b, "src-off") == ("RUNNING", ["RUNNING"]), 30)
    offsets = get(f"{b}/connectors/src-off/offsets").json()
    assert_conforms("connector_offsets", offsets)
    change = {"offsets": [{"partition": {"file": "a"}, "offset": {"position": 5}}]}
    assert_error(send("PATCH", f"{a}/connectors/src-off/offsets", change), 400, "STOPPED")
    assert_error(send("DELETE", f"{b}/connectors/src-off/offsets"), 400, "STOPPED")
    assert send("PUT", f"{a}/connectors/src-off/stop").status_code == 204
    wait_until(lambda: states(b, "src-off") == ("STOPPED", []), 30)

    altered = send("PATCH", f"{b}/connectors/src-off/offsets", change)
    assert altered.status_code == 200, altered.text
    assert_conforms("message", altered.json())
    assert "altered successfully" in altered.json()["message"]
    more = {"offsets": [{"partition": {"file": "b"}, "offset": {"position": 9}}]}
    assert send("PATCH", f"{a}/connectors/src-off/offsets", more).status_code == 200
    listed = get(f"{a}/connectors/src-off/offsets").json()
    assert_conforms("connector_offsets", listed)
    assert listed["offsets"] == [
        {"partition": {"file": "a"}, "offset": {"position": 5}},
        {"partition": {"file": "b"}, "offset": {"position": 9}},
    ]
    gone = {"offsets": [{"partition": {"file": "a"}, "offset": None}]}
    assert send("PATCH", f"{b}/connectors/src-off/offsets", gone).status_code == 200
    assert get(f"{b}/connectors/src-off/offsets").json()["offsets"] == more["offsets"]
    reset = send("DELETE", f"{a}/connectors/src-off/offsets")
    assert reset.status_code == 200 and "reset successfully" in reset.json()["message"]
    assert get(f"{b}/connectors/src-off/offsets").json() == {"offsets": []}
    assert_error(send("PATCH", f"{a}/connectors/src-off/offsets", {"offsets": []}), 400, "empty")
    assert_error(send("PATCH", f"{a}/connectors/nope/offsets", change), 404)
    assert_error(send("DELETE", f"{a}/connectors/nope/offsets"), 404)

    create(
        b, "sink-off", {**c.config(topics="t1"), "connector.class": SINK}, initial_state="STOPPED"
    )
    wait_until(lambda: states(a, "sink-off") == ("STOPPED", []), 30)

    def sink(partition: int, offset: int | None) -> dict[str, Any]:
        return {
            "partition": {"kafka_topic": "t1", "kafka_partition": partition},
            "offset": None if offset is None else {"kafka_offset": offset},
        }

    body = {"offsets": [sink(0, 10), sink(1, 20)]}
    assert send("PATCH", f"{a}/connectors/sink-off/offsets", body).status_code == 200
    listed = get(f"{b}/connectors/sink-off/offsets").json()
    assert_conforms("connector_offsets", listed)
    assert listed["offsets"] == [sink(0, 10), sink(1, 20)]
    assert (
        send(
            "PATCH", f"{b}/connectors/sink-off/offsets", {"offsets": [sink(0, None), sink(2, 3)]}
        ).status_code
        == 200
    )
    assert get(f"{a}/connectors/sink-off/offsets").json()["offsets"] == [sink(1, 20), sink(2, 3)]
    no_topic = {"offsets": [{"partition": {"kafka_partition": 0}, "offset": {"kafka_offset": 1}}]}
    assert_error(send("PATCH", f"{a}/connectors/sink-off/offsets", no_topic), 400, "kafka_topic")
    negative = {"offsets": [sink(0, -4)]}
    assert_error(send("PATCH", f"{b}/connectors/sink-off/offsets", negative), 400, "offset")
    assert send("DELETE", f"{b}/connectors/sink-off/offsets").status_code == 200
    assert get(f"{a}/connectors/sink-off/offsets").json() == {"offsets": []}


def test_active_topics_are_recorded_and_reset(logs_on_failure: RestCluster) -> None:
    c = logs_on_failure
    a, b = c.urls()
    create(a, "topical", c.config(topic="events-x"))
    create(b, "topical-sink", {**c.config(topics="a,b"), "connector.class": SINK})

    def topics(url: str, name: str) -> list[str]:
        reply = get(f"{url}/connectors/{name}/topics")
        assert reply.status_code == 200, reply.text
        assert_conforms("active_topics", reply.json())
        found: list[str] = reply.json()[name]["topics"]
        return found

    wait_until(lambda: topics(b, "topical") == ["events-x"], 30, what="source topic recorded")
    wait_until(lambda: topics(a, "topical-sink") == ["a", "b"], 30, what="sink topics recorded")
    assert topics(a, "nope") == []
    # as in Connect, a running task records a forgotten topic again as it goes on using it
    reset = send("PUT", f"{b}/connectors/topical/topics/reset")
    assert reset.status_code == 202 and reset.content == b""
    wait_until(lambda: topics(a, "topical") == ["events-x"], 30, what="source topic recorded again")
    # Once the connector is stopped, nothing records it again. STOPPED with no tasks is
    # shown before every worker has stopped its task (as in Connect), and a last poll may
    # still record the topic: reset until the reset sticks.
    assert send("PUT", f"{a}/connectors/topical/stop").status_code == 204
    wait_until(lambda: states(b, "topical") == ("STOPPED", []), 30, what="topical STOPPED")

    def reset_sticks() -> bool:
        reset = send("PUT", f"{b}/connectors/topical/topics/reset")
        assert reset.status_code == 202 and reset.content == b""
        return topics(b, "topical") == []

    wait_until(reset_sticks, 30, what="reset of a stopped connector's topics")
    wait_until(lambda: topics(a, "topical") == [], 10)
    assert send("DELETE", f"{a}/connectors/topical-sink").status_code == 204
    wait_until(lambda: topics(b, "topical-sink") == [], 10, what="topics gone with the connector")


def test_logger_levels_for_one_worker_and_for_the_cluster(logs_on_failure: RestCluster) -> None:
    c = logs_on_failure
    a, b = c.urls()
    levels = get(f"{a}/admin/loggers").json()
    assert_conforms("logger_levels", levels)
    assert "root" in levels
    affected = send("PUT", f"{a}/admin/loggers/herder.runtime", {"level": "DEBUG"})
    assert affected.status_code == 200, affected.text
    assert_conforms("affected_loggers", affected.json())
    assert "herder.runtime" in affected.json() and "herder.runtime.shell.herder" in affected.json()
    one = get(f"{a}/admin/loggers/herder.runtime.shell.herder").json()
    assert_conforms("logger_level", one)
    assert one["level"] == "DEBUG" and isinstance(one["last_modified"], int)
    assert get(f"{b}/admin/loggers/herder.runtime.shell.herder").json()["level"] != "DEBUG"

    cluster = send("PUT", f"{a}/admin/loggers/herder.ensemble?scope=cluster", {"level": "WARN"})
    assert cluster.status_code == 204, cluster.text
    for url in (a, b):
        wait_until(
            lambda url=url: get(f"{url}/admin/loggers/herder.ensemble").json()["level"] == "WARN",
            15,
            what=f"cluster-wide level applied on {url}",
        )
    assert_error(send("PUT", f"{a}/admin/loggers/herder", {"level": "LOUD"}), 404, "LOUD")
    assert_error(send("PUT", f"{b}/admin/loggers/herder", {}), 400, "level")
    assert_error(get(f"{a}/admin/loggers/no.such.logger"), 404, "no.such.logger")


def test_task_configs_handed_to_the_leader_unsigned_under_compatible(
    logs_on_failure: RestCluster,
) -> None:
    """Connect's internal endpoint as it is without signed requests (``eager`` and
    ``compatible``); under ``sessioned`` the same requests are refused
    (test_cooperative_workers)."""
    c = logs_on_failure
    a, b = (c.start_worker(group="unsigned", **{"connect.protocol": "compatible"}) for _ in "ab")
    create(a, "handed", c.config(), initial_state="STOPPED")
    for url in (a, b):  # one of them is not the leader and forwards
        reply = send("POST", f"{url}/connectors/handed/tasks", [{"x": url}])
        assert reply.status_code == 204, reply.text
        wait_until(
            lambda url=url: (
                get(f"{b}/connectors/handed/tasks").json()
                == [{"id": {"connector": "handed", "task": 0}, "config": {"x": url}}]
            ),
            15,
        )
    assert_error(send("POST", f"{a}/connectors/nope/tasks", [{}]), 404)


def leader_of(c: RestCluster, urls: list[str]) -> str:
    """The worker whose log says it leads the latest generation."""

    def latest(url: str) -> int:
        lines = [ln for ln in c.workers[url].output().splitlines() if "leads generation" in ln]
        return int(lines[-1].split("leads generation")[1].split()[0]) if lines else -1

    return max(urls, key=latest)


def test_write_to_a_non_leader_during_a_rebalance_succeeds(logs_on_failure: RestCluster) -> None:
    c = logs_on_failure
    urls = [c.start_worker(group="failover") for _ in range(3)]
    create(urls[0], "before", c.config())  # the group has settled and has a leader
    leader = leader_of(c, urls)
    others = [u for u in urls if u != leader]
    c.workers[leader].kill9()
    # the survivors still name the dead leader until the group notices (a session
    # timeout) and rebalances: the write must wait that out rather than answer 409
    reply = send("POST", f"{others[0]}/connectors", {"name": "during", "config": c.config()})
    assert reply.status_code == 201, reply.text
    assert sorted(get(f"{others[1]}/connectors").json()) == ["before", "during"]
    with contextlib.suppress(httpx.HTTPError):
        wait_until(lambda: states(others[1], "during")[0] == "RUNNING", 30)


def test_a_request_that_cannot_finish_answers_500_naming_the_work(
    logs_on_failure: RestCluster,
) -> None:
    c = logs_on_failure
    url = c.start_worker(
        group="slow", **{"rest.request.timeout.ms": 2000, "connect.protocol": "eager"}
    )
    # a task whose poll() takes 6 s takes as long to stop, and every eager rebalance
    # stops it
    create(url, "sluggish", c.config(**{"poll.delay.ms": "6000"}))
    wait_until(lambda: c.starts("sluggish-0") >= 1, 20, what="the slow task to start")

    def timed_out(attempt: list[int] = [0]) -> httpx.Response | None:  # noqa: B006
        attempt[0] += 1
        name = f"waiting{attempt[0]}"
        reply = send("POST", f"{url}/connectors", {"name": name, "config": c.config()})
        return reply if reply.status_code == 500 else None

    reply = wait_until(timed_out, 60, interval=0.2, what="a request to time out")
    assert isinstance(reply, httpx.Response)
    assert_error(reply, 500, "Request timed out", "stopping the work of a revoked generation")


def test_connector_code_that_hangs_holds_up_no_other_connector(
    logs_on_failure: RestCluster,
) -> None:
    c = logs_on_failure
    url = c.start_worker(group="hangs", **{"connector.call.timeout.ms": 3000})
    hang = {"start.delay.ms": "600000"}
    create(url, "hangs-in-start", c.config(**hang))
    create(url, "hangs-in-task-configs", c.config(**{"task.configs.delay.ms": "600000"}))
    # meanwhile the worker goes on creating, running and reconfiguring other connectors
    create(url, "carries-on", c.config(**{"tasks.max": "2"}))
    wait_until(lambda: states(url, "carries-on") == ("RUNNING", ["RUNNING", "RUNNING"]), 20)
    reply = send("PUT", f"{url}/connectors/carries-on/config", c.config(**{"tasks.max": "3"}))
    assert reply.status_code == 200, reply.text
    wait_until(lambda: states(url, "carries-on") == ("RUNNING", ["RUNNING"] * 3), 20)
    # and the stuck calls show in their connectors' statuses
    for name, call in (("hangs-in-start", "start()"), ("hangs-in-task-configs", "task_configs()")):
        wait_until(lambda n=name: states(url, n)[0] == "FAILED", 20, what=f"{name} FAILED")
        trace = status(url, name)["connector"]["trace"]
        assert f"{call} of connector {name} did not return within 3000 ms" in trace, trace
