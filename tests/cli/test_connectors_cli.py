"""``herder connectors …`` against a real worker's REST API.

The worker is a real ``herder standalone`` process (its own ensemble inside) running
marker connectors, which move no data. Most commands run in this process through
``herder.cli.main.main`` — the same entry point as the ``herder`` script, so errors
come out exactly as a user sees them — and a few run as the real ``herder`` command.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from herder.cli.main import main
from herder.connect import SourceTask
from tests.fixtures.connectors import MarkerSourceConnector, MarkerSourceTask
from tests.harness import HERDER, Processes, free_port, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

MARKER = "tests.fixtures.connectors.MarkerSourceConnector"
#: what a 404 for a connector ends with: where to see what there is
NOT_FOUND_ADVICE = (
    "; GET /connectors lists the connectors, GET /connectors/<name>/tasks their tasks (HTTP 404)"
)
FAILING = "tests.cli.test_connectors_cli.HalfFailingSourceConnector"
READY_LINE = re.compile(r"^standalone worker \S+ REST API at (\S+);", re.M)


class HalfFailingSourceTask(MarkerSourceTask):
    """Task 0 fails as it starts; the others run."""

    def start(self, config: dict[str, str]) -> None:
        if config.get("index") == "0":
            raise RuntimeError("task 0 fails on purpose")
        super().start(config)


class HalfFailingSourceConnector(MarkerSourceConnector):
    def task_class(self) -> type[SourceTask]:
        return HalfFailingSourceTask


@dataclass
class Result:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


class Cli:
    """``herder connectors …`` against one worker."""

    def __init__(self, url: str, tmp_path: Path) -> None:
        self.url = url
        self.tmp_path = tmp_path

    def __call__(self, *args: str) -> Result:
        out, err = io.StringIO(), io.StringIO()
        code = 0
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main(["connectors", *args, "--url", self.url])
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
        return Result(code, out.getvalue(), err.getvalue())

    def ok(self, *args: str) -> Result:
        result = self(*args)
        assert result.code == 0, f"herder connectors {' '.join(args)}: {result.err}{result.out}"
        return result

    def status(self, name: str) -> dict[str, Any]:
        return httpx.get(f"{self.url}/connectors/{name}/status", timeout=10).json()

    def states(self, name: str) -> tuple[str, list[str]]:
        st = self.status(name)
        return st["connector"]["state"], [t["state"] for t in st["tasks"]]

    def wait_states(self, name: str, connector: str, tasks: list[str]) -> None:
        wait_until(
            lambda: self.states(name) == (connector, tasks),
            timeout=60,
            what=f"{name}: {connector} with tasks {tasks}",
        )

    def marker_config(self, tasks: int = 1) -> list[str]:
        markers = self.tmp_path / "markers"
        markers.mkdir(exist_ok=True)
        return [
            "-c",
            f"connector.class={MARKER}",
            "-c",
            f"tasks.max={tasks}",
            "-c",
            f"marker.dir={markers}",
        ]


@pytest.fixture
def cli(processes: Processes, tmp_path: Path) -> Iterator[Cli]:
    worker = tmp_path / "worker.properties"
    worker.write_text(
        "".join(
            f"{k}={v}\n"
            for k, v in {
                "data.dir": tmp_path / "data",
                "rest.host.name": "127.0.0.1",
                "rest.port": free_port(),
                "session.timeout.ms": 3000,
                "heartbeat.interval.ms": 300,
                "task.execution.factory": "tests.fixtures.connectors:MarkerExecutions",
            }.items()
        )
    )
    log_path = tmp_path / "standalone-0.log"
    processes.start(
        [*HERDER, "--log-level", "INFO", "standalone", str(worker)],
        name="standalone",
        ready=lambda: READY_LINE.search(log_path.read_text(errors="replace")),
    )
    found = READY_LINE.search(log_path.read_text())
    assert found is not None
    yield Cli(found.group(1), tmp_path)


def run_herder(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    import os

    return subprocess.run(
        [*HERDER, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


# -- create, list, get, status, delete -------------------------------------------------------


def test_create_list_get_status_and_delete(cli: Cli, tmp_path: Path) -> None:
    props = tmp_path / "alpha.properties"
    props.write_text(f"name=alpha\nconnector.class={MARKER}\ntasks.max=1\n")
    # from a properties file, with -c winning over it
    created = cli.ok("create", "-f", str(props), "-c", "tasks.max=2", "-c", "marker.dir=")
    assert created.out.strip() == "created connector alpha (source)"
    # Connect's JSON form, named on the command line, as JSON for scripts
    beta = tmp_path / "beta.json"
    beta.write_text(json.dumps({"config": {"connector.class": MARKER, "tasks.max": "1"}}))
    info = cli.ok("create", "beta", "-f", str(beta), "--json").json()
    assert info["name"] == "beta" and info["type"] == "source"
    assert info["config"]["connector.class"] == MARKER
    cli.wait_states("alpha", "RUNNING", ["RUNNING", "RUNNING"])
    cli.wait_states("beta", "RUNNING", ["RUNNING"])

    table = cli.ok("list").out
    alpha_row = next(line for line in table.splitlines() if " alpha " in line)
    assert "source" in alpha_row and "RUNNING" in alpha_row and "2/2 running" in alpha_row
    assert cli.ok("list", "--json").json() == ["alpha", "beta"]
    expanded = cli.ok("list", "--json", "--expand", "status").json()
    assert expanded["alpha"]["status"]["connector"]["state"] == "RUNNING"
    assert "info" not in expanded["alpha"]
    both = cli.ok("list", "--json", "--expand", "status", "--expand", "info").json()
    assert both["beta"]["info"]["config"]["tasks.max"] == "1"

    got = cli.ok("get", "alpha")
    assert "connector: alpha" in got.out and "tasks: 0, 1" in got.out
    assert re.search(r"tasks\.max\s+.\s+2", got.out)
    assert cli.ok("get", "alpha", "--json").json()["config"]["tasks.max"] == "2"

    status = cli.ok("status", "alpha")
    worker = cli.url.removeprefix("http://")  # the worker's id is its host:port
    assert f"connector alpha (source): RUNNING on {worker}" in status.out
    assert len(re.findall(rf"RUNNING\s+.\s+{re.escape(worker)}", status.out)) == 2
    assert [t["id"] for t in cli.ok("status", "alpha", "--json").json()["tasks"]] == [0, 1]

    assert cli.ok("delete", "beta").out.strip() == "deleted connector beta"
    assert cli.ok("list", "--json").json() == ["alpha"]
    gone = cli("get", "beta")
    assert gone.code == 1 and gone.out == ""
    assert gone.err.strip() == f"error: Connector beta not found{NOT_FOUND_ADVICE}"


def test_refusals_are_one_line_with_a_non_zero_exit(cli: Cli) -> None:
    cli.ok("create", "dup", *cli.marker_config())
    duplicate = cli("create", "dup", *cli.marker_config())
    assert duplicate.code == 1
    assert duplicate.err.strip() == (
        "error: Connector dup already exists; choose another name, or change its config with "
        "PUT /connectors/<name>/config (HTTP 409)"
    )
    invalid = cli("create", "bad", "-c", f"connector.class={MARKER}", "-c", "tasks.max=0")
    assert invalid.code == 1 and len(invalid.err.strip().splitlines()) == 1
    assert "tasks.max" in invalid.err and "(HTTP 400)" in invalid.err
    no_name = cli("create", "-c", f"connector.class={MARKER}")
    assert no_name.code == 2 and "NAME" in no_name.err
    bad_pair = cli("create", "x", "-c", "no-equals-sign")
    assert bad_pair.code == 2 and "KEY=VALUE" in bad_pair.err
    assert cli("delete", "nope").err.strip() == f"error: Connector nope not found{NOT_FOUND_ADVICE}"

    # the real command: HERDER_URL picks the worker, and no traceback anywhere
    listed = run_herder("connectors", "list", "--json", env={"HERDER_URL": cli.url})
    assert listed.returncode == 0 and json.loads(listed.stdout) == ["dup"]
    missing = run_herder("connectors", "status", "nope", "--url", cli.url)
    assert missing.returncode == 1 and "Traceback" not in missing.stderr
    assert missing.stderr.strip() == (
        f"error: No status found for connector nope{NOT_FOUND_ADVICE}"
    )
    unreachable = run_herder("connectors", "list", "--url", f"http://127.0.0.1:{free_port()}")
    assert unreachable.returncode == 1 and "Traceback" not in unreachable.stderr
    assert unreachable.stderr.startswith("error: cannot reach a worker at http://127.0.0.1:")
    assert "herder worker start" in unreachable.stderr and "--url" in unreachable.stderr


# -- update -------------------------------------------------------------------------------------


def test_update_replaces_and_patches_the_config(cli: Cli, tmp_path: Path) -> None:
    cli.ok("create", "gamma", *cli.marker_config(), "-c", "extra=1")
    cli.wait_states("gamma", "RUNNING", ["RUNNING"])
    config_url = f"{cli.url}/connectors/gamma/config"

    # PUT: the whole config is replaced ("extra" goes), and tasks follow tasks.max
    replaced = cli.ok("update", "gamma", *cli.marker_config(tasks=2))
    assert replaced.out.strip() == "updated connector gamma"
    config = httpx.get(config_url, timeout=10).json()
    assert config["tasks.max"] == "2" and "extra" not in config
    cli.wait_states("gamma", "RUNNING", ["RUNNING", "RUNNING"])

    # from a JSON file, as JSON
    new = tmp_path / "gamma.json"
    new.write_text(json.dumps({"connector.class": MARKER, "tasks.max": "1", "a": "b"}))
    info = cli.ok("update", "gamma", "-f", str(new), "--json").json()
    assert info["config"]["a"] == "b" and info["config"]["name"] == "gamma"
    mismatch = tmp_path / "other.properties"
    mismatch.write_text(f"name=other\nconnector.class={MARKER}\n")
    assert cli("update", "gamma", "-f", str(mismatch)).code == 2

    # PATCH: only the given keys change; --unset removes one
    cli.ok("update", "gamma", "--patch", "-c", "tasks.max=3", "-c", "added=yes")
    config = httpx.get(config_url, timeout=10).json()
    assert config["tasks.max"] == "3" and config["added"] == "yes" and config["a"] == "b"
    cli.ok("update", "gamma", "--unset", "a", "-c", "added=again")
    config = httpx.get(config_url, timeout=10).json()
    assert "a" not in config and config["added"] == "again" and config["tasks.max"] == "3"
    cli.wait_states("gamma", "RUNNING", ["RUNNING"] * 3)
    assert cli("update", "nope", "--patch", "-c", "x=y").err.strip().endswith("(HTTP 404)")

    # PUT of a connector that does not exist creates it, as in Connect
    created = cli.ok("update", "delta", *cli.marker_config())
    assert created.out.strip() == "created connector delta"


# -- pause, resume, stop, restart ---------------------------------------------------------------


def test_pause_resume_and_stop(cli: Cli) -> None:
    cli.ok("create", "eps", *cli.marker_config(tasks=2))
    cli.wait_states("eps", "RUNNING", ["RUNNING", "RUNNING"])
    assert cli.ok("pause", "eps").out.strip() == "pause requested for connector eps"
    cli.wait_states("eps", "PAUSED", ["PAUSED", "PAUSED"])
    assert cli.ok("resume", "eps", "--json").json() == {
        "name": "eps",
        "result": "resume requested",
    }
    cli.wait_states("eps", "RUNNING", ["RUNNING", "RUNNING"])
    assert cli.ok("stop", "eps").out.strip() == "stop requested for connector eps"
    # a stopped connector has no tasks (Connect's STOPPED state)
    cli.wait_states("eps", "STOPPED", [])
    cli.ok("resume", "eps")
    cli.wait_states("eps", "RUNNING", ["RUNNING", "RUNNING"])
    for verb in ("pause", "resume", "stop"):
        refused = cli(verb, "nope")
        assert refused.code == 1 and refused.err.strip().endswith("(HTTP 404)")


def test_restart_connector_tasks_and_only_failed(cli: Cli, tmp_path: Path) -> None:
    markers = tmp_path / "markers"
    markers.mkdir()
    config = [
        "-c",
        f"connector.class={FAILING}",
        "-c",
        "tasks.max=2",
        "-c",
        f"marker.dir={markers}",
    ]
    cli.ok("create", "zeta", *config)
    cli.wait_states("zeta", "RUNNING", ["FAILED", "RUNNING"])
    assert "task 0 fails on purpose" in cli.ok("status", "zeta").out

    # only the connector: 204
    assert cli.ok("restart", "zeta").out.strip() == "restarted connector zeta"
    # connector and failed tasks only: 202 with what restarts marked RESTARTING
    body = cli.ok("restart", "zeta", "--include-tasks", "--only-failed", "--json").json()
    assert body["name"] == "zeta" and body["connector"]["state"] == "RUNNING"
    assert [t["state"] for t in body["tasks"]] == ["RESTARTING", "RUNNING"]
    cli.wait_states("zeta", "RUNNING", ["FAILED", "RUNNING"])
    # everything, shown as a table
    everything = cli.ok("restart", "zeta", "--include-tasks")
    assert "restarting connector zeta:" in everything.out
    assert everything.out.count("RESTARTING") == 3
    cli.wait_states("zeta", "RUNNING", ["FAILED", "RUNNING"])

    # one task
    running_marker = markers / "zeta-1"
    wait_until(running_marker.exists, timeout=30, what="task 1 running")
    assert cli.ok("restart", "zeta", "1").out.strip() == "restarted task 1 of connector zeta"
    assert cli.ok("restart", "zeta", "0", "--json").json() == {
        "name": "zeta",
        "result": "restarted",
    }
    cli.wait_states("zeta", "RUNNING", ["FAILED", "RUNNING"])
    assert cli("restart", "zeta", "1", "--include-tasks").code == 2
    assert cli("restart", "zeta", "9").err.strip().endswith("(HTTP 404)")
    assert cli("restart", "nope").err.strip().endswith("(HTTP 404)")


# -- offsets ------------------------------------------------------------------------------------


def test_offsets_get_alter_and_reset(cli: Cli, tmp_path: Path) -> None:
    cli.ok("create", "eta", *cli.marker_config())
    cli.wait_states("eta", "RUNNING", ["RUNNING"])
    assert cli.ok("offsets", "get", "eta", "--json").json() == {"offsets": []}
    partition, offset = '{"filename": "/data/a.txt"}', '{"position": 42}'
    running = cli("offsets", "alter", "eta", "--partition", partition, "--offset", offset)
    assert running.code == 1 and "(HTTP 400)" in running.err
    assert len(running.err.strip().splitlines()) == 1

    cli.ok("stop", "eta")
    cli.wait_states("eta", "STOPPED", [])
    altered = cli.ok("offsets", "alter", "eta", "--partition", partition, "--offset", offset)
    assert "altered" in altered.out
    assert cli.ok("offsets", "get", "eta", "--json").json() == {
        "offsets": [{"partition": {"filename": "/data/a.txt"}, "offset": {"position": 42}}]
    }
    shown = cli.ok("offsets", "get", "eta").out
    assert '{"filename": "/data/a.txt"}' in shown and '{"position": 42}' in shown

    # from a file, in Connect's request shape: a second partition, the first one changed
    many = tmp_path / "offsets.json"
    many.write_text(
        json.dumps(
            {
                "offsets": [
                    {"partition": {"filename": "/data/a.txt"}, "offset": {"position": 7}},
                    {"partition": {"filename": "/data/b.txt"}, "offset": {"position": 1}},
                ]
            }
        )
    )
    cli.ok("offsets", "alter", "eta", "-f", str(many), "--json")
    listed = cli.ok("offsets", "get", "eta", "--json").json()["offsets"]
    assert sorted((o["partition"]["filename"], o["offset"]["position"]) for o in listed) == [
        ("/data/a.txt", 7),
        ("/data/b.txt", 1),
    ]
    reset = cli.ok("offsets", "reset", "eta")
    assert "reset" in reset.out
    assert cli.ok("offsets", "get", "eta", "--json").json() == {"offsets": []}
    assert cli("offsets", "alter", "eta").code == 2
    assert cli("offsets", "get", "nope").err.strip().endswith("(HTTP 404)")


# -- plugins, validate --------------------------------------------------------------------------


def test_plugins_and_validate(cli: Cli, tmp_path: Path) -> None:
    listed = cli.ok("plugins", "--json").json()
    classes = {p["class"] for p in listed}
    assert "herder.connectors.file.FileStreamSourceConnector" in classes
    assert {p["type"] for p in listed} <= {"source", "sink"}
    table = cli.ok("plugins").out
    assert "herder.connectors.file.FileStreamSinkConnector" in table and "sink" in table
    keys = cli.ok("plugins", "FileStreamSource", "--json").json()
    assert {"file", "topic"} <= {k["name"] for k in keys}
    assert "topic" in cli.ok("plugins", "FileStreamSource").out

    good = tmp_path / "source.properties"
    good.write_text("name=src\nconnector.class=FileStreamSource\ntopic=lines\nfile=/tmp/x\n")
    valid = cli.ok("validate", "-f", str(good))
    assert valid.out.strip().endswith("the config is valid")
    assert cli.ok("validate", "-f", str(good), "--json").json()["error_count"] == 0

    # the topic is missing: exit 1, the key and its error in the table
    invalid = cli("validate", "FileStreamSource", "-c", "name=src", "-c", "file=/tmp/x")
    assert invalid.code == 1
    row = next(line for line in invalid.out.splitlines() if re.search(r"\btopic\b", line))
    assert "topic" in row and len(row.split("│")[3].strip()) > 0
    assert invalid.err.strip().startswith("error: the config has 1 error(s)")
    result = cli("validate", "FileStreamSource", "-c", "name=src", "--json")
    assert result.code == 1 and result.json()["error_count"] >= 1
    assert cli("validate", "-c", "name=x").code == 2
