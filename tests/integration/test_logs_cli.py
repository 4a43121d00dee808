"""``herder logs`` and ``herder ensemble status`` through a real server process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading

import pytest

from herder.ensemble.sync_client import SyncEnsembleClient
from tests.harness import HERDER, free_port, wait_until
from tests.integration.conftest import ServerHandle

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def herder(
    server: ServerHandle, *args: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*HERDER, *args, "--bootstrap", server.bootstrap],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_create_append_read_describe(ensemble_server: ServerHandle) -> None:
    s = ensemble_server
    assert herder(s, "logs", "create", "events").returncode == 0
    assert "compacted" in herder(s, "logs", "create", "state", "--compacted").stdout
    assert herder(s, "logs", "append", "events", "--value", "hello").stdout.strip() == "0"
    assert herder(s, "logs", "append", "state", "-k", "a", "-v", "1").stdout.strip() == "0"
    assert herder(s, "logs", "append", "state", "-k", "a", "-v", "2").stdout.strip() == "1"
    with SyncEnsembleClient(s.bootstrap) as client:
        client.append("events", b"\xff\xfe binary", key=b"k")
    lines = herder(s, "logs", "read", "events").stdout.splitlines()
    records = [json.loads(line) for line in lines]
    assert [r["offset"] for r in records] == [0, 1]
    assert records[0]["value"] == "hello" and records[0]["key"] is None
    assert records[1]["value"] == {"base64": "//4gYmluYXJ5"} and records[1]["key"] == "k"
    assert {"offset", "key", "value", "zxid", "timestamp"} <= set(records[0])
    state = [json.loads(line) for line in herder(s, "logs", "read", "state").stdout.splitlines()]
    assert [(r["key"], r["value"]) for r in state] == [("a", "2")]
    listed = json.loads(herder(s, "logs", "list", "--json").stdout)
    assert {(entry["name"], entry["compacted"]) for entry in listed} >= {
        ("events", False),
        ("state", True),
    }
    described = json.loads(herder(s, "logs", "describe", "events", "--json").stdout)
    assert described["end_offset"] == 2
    human = herder(s, "logs", "list").stdout
    assert "events" in human and "compacted" in human
    assert herder(s, "logs", "read", "events", "--from", "1", "--max", "1").stdout.count("\n") == 1


def test_status_rows(ensemble_server: ServerHandle) -> None:
    rows = json.loads(herder(ensemble_server, "ensemble", "status", "--json").stdout)
    assert len(rows) == 1
    row = rows[0]
    assert row["server_id"] == 1 and row["role"] == "standalone" and row["epoch"] >= 1
    assert row["committed_zxid"] >= row["epoch"] << 32
    human = herder(ensemble_server, "ensemble", "status").stdout
    assert "standalone" in human and "0x" in human


def test_user_mistakes_are_one_line(ensemble_server: ServerHandle) -> None:
    out = herder(ensemble_server, "logs", "append", "missing", "--value", "x")
    assert out.returncode == 1
    assert out.stderr.strip() == (
        "error: op 0: log 'missing' does not exist; `herder logs list` shows the logs there are"
    )
    both = herder(ensemble_server, "logs", "append", "missing")
    assert both.returncode == 2 and "exactly one of --value and --stdin" in both.stderr
    nobody = subprocess.run(
        [*HERDER, "logs", "list", "--bootstrap", f"127.0.0.1:{free_port()}"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "HERDER_TIMEOUT": "1"},
    )
    assert nobody.returncode == 1 and "Traceback" not in nobody.stderr
    assert "no ensemble server" in nobody.stderr
    assert "start one with `herder ensemble start --config" in nobody.stderr


def test_follow_prints_new_records(ensemble_server: ServerHandle) -> None:
    s = ensemble_server
    herder(s, "logs", "create", "live")
    proc = subprocess.Popen(
        [*HERDER, "logs", "read", "live", "--follow", "--bootstrap", s.bootstrap],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        got: list[str] = []
        reader = threading.Thread(target=lambda: got.extend(iter(proc.stdout.readline, "")))  # type: ignore[union-attr]
        reader.start()
        with SyncEnsembleClient(s.bootstrap) as client:
            for i in range(3):
                client.append("live", b"n%d" % i)
        wait_until(lambda: len(got) >= 3, timeout=30, what="followed records")
        assert [json.loads(line)["value"] for line in got[:3]] == ["n0", "n1", "n2"]
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=10)
        reader.join(timeout=10)


def test_append_stdin_killed_midway_printed_only_acknowledged(
    ensemble_server: ServerHandle,
) -> None:
    s = ensemble_server
    herder(s, "logs", "create", "lines")
    proc = subprocess.Popen(
        [*HERDER, "logs", "append", "lines", "--stdin", "--bootstrap", s.bootstrap],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdin is not None and proc.stdout is not None
    printed: list[str] = []

    def feed() -> None:
        try:
            for i in range(1_000_000):
                proc.stdin.write(f"line-{i}\n")  # type: ignore[union-attr]
        except (BrokenPipeError, ValueError):
            pass

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    while len(printed) < 3000:
        line = proc.stdout.readline()
        assert line, "the appender stopped early"
        printed.append(line)
    proc.kill()
    proc.wait(timeout=10)
    printed += proc.stdout.readlines()
    printed = [p for p in printed if p.endswith("\n")]  # a line cut by the kill is not a claim
    with SyncEnsembleClient(s.bootstrap) as client:
        stored: dict[int, bytes | None] = {}
        position = 0
        while True:
            reply = client.read("lines", position, max_records=5000)
            stored.update((r.offset, r.value) for r in reply.records)
            position = reply.next_offset
            if position >= reply.end_offset:
                break
    for line in printed:
        offset, value = line.rstrip("\n").split("\t")
        assert stored[int(offset)] == value.encode(), f"printed {line!r} but the log disagrees"
    assert len(stored) >= len(printed) >= 3000
