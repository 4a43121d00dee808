"""``herder verifiable member`` processes against a real ensemble server.

Each member prints its events as JSON lines with wall-clock timestamps; the tests read
them from the members' output and judge the group from them alone, as Kafka's system
tests judge the verifiable consumer.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.harness import HERDER, Proc, Processes, wait_until
from tests.integration.conftest import ServerHandle, make_server

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

RESOURCES = ["a", "b", "c", "d", "e", "f", "g"]
GROUP = "verifiable-group"
HEARTBEAT_MS = 300
#: how much earlier than the session timeout a crashed member may be noticed: its last
#: heartbeat came up to one interval before the kill, and clocks are read in two processes
EXPIRY_SLACK_S = 0.5


@pytest.fixture
def server(processes: Processes, tmp_path: Path) -> Iterator[ServerHandle]:
    yield make_server(processes, tmp_path, **{"group.min.session.timeout.ms": 1000}).start()


def start_member(
    processes: Processes,
    server: ServerHandle,
    *,
    session_ms: int,
    heartbeat_ms: int = HEARTBEAT_MS,
    resources: Sequence[str] = RESOURCES,
) -> Proc:
    return processes.start(
        [
            *HERDER,
            "verifiable",
            "member",
            "--group",
            GROUP,
            "--protocol",
            "round-robin",
            "--resources",
            ",".join(resources),
            "--session-timeout-ms",
            str(session_ms),
            "--heartbeat-interval-ms",
            str(heartbeat_ms),
            "--rebalance-timeout-ms",
            "10000",
            "--bootstrap",
            server.bootstrap,
        ],
        name="member",
    )


def events(proc: Proc) -> list[dict[str, Any]]:
    """The member's events so far (its stderr shares the file; a torn last line waits)."""
    found = []
    for line in proc.output().splitlines():
        if not line.startswith("{"):
            continue
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and "event" in event:
            found.append(event)
    return found


def same_generation(procs: Sequence[Proc], newer_than: int = 0) -> list[dict[str, Any]] | None:
    """Each member's latest ``joined`` if all hold the same generation > ``newer_than``."""
    latest = []
    for proc in procs:
        seen = events(proc)
        if not seen or seen[-1]["event"] != "joined":
            return None
        latest.append(seen[-1])
    generations = {event["generation"] for event in latest}
    if len(generations) != 1 or generations.pop() <= newer_than:
        return None
    return latest


def assert_one_generation(joined: Sequence[dict[str, Any]]) -> None:
    """One leader, known to all, among the members; assignments disjoint and covering."""
    member_ids = [event["member_id"] for event in joined]
    assert len(set(member_ids)) == len(member_ids)
    assert len({event["leader"] for event in joined}) == 1
    assert joined[0]["leader"] in member_ids
    assert sum(event["is_leader"] for event in joined) == 1
    assigned = [resource for event in joined for resource in event["assignment"]]
    assert sorted(assigned) == sorted(RESOURCES), f"not disjoint and covering: {joined}"
    sizes = sorted(len(event["assignment"]) for event in joined)
    assert sizes[-1] - sizes[0] <= 1, f"round-robin is balanced: {joined}"


def form_group(
    processes: Processes, server: ServerHandle, count: int, session_ms: int
) -> tuple[list[Proc], list[dict[str, Any]]]:
    procs = [start_member(processes, server, session_ms=session_ms) for _ in range(count)]
    joined = wait_until(lambda: same_generation(procs), timeout=45, what="one generation")
    assert isinstance(joined, list)
    assert_one_generation(joined)
    return procs, joined


def test_three_members_form_one_generation(processes: Processes, server: ServerHandle) -> None:
    procs, joined = form_group(processes, server, 3, session_ms=3000)
    generation = joined[0]["generation"]
    for proc, event in zip(procs, joined, strict=True):
        history = events(proc)
        assert history[0]["event"] == "started" and history[0]["group"] == GROUP
        # every earlier assignment was given up before this one was taken
        assignments = [e for e in history if e["event"] in ("joined", "revoked")]
        assert [e["event"] for e in assignments] == ["joined", "revoked"] * (
            len(assignments) // 2
        ) + ["joined"]
        assert event["generation"] == generation and event["protocol"] == "round-robin"


def test_sigterm_leaves_and_the_others_rebalance_at_once(
    processes: Processes, server: ServerHandle
) -> None:
    session_ms = 8000
    procs, joined = form_group(processes, server, 3, session_ms=session_ms)
    generation = joined[0]["generation"]
    leaving, survivors = procs[2], procs[:2]
    started = time.time()
    leaving.signal(signal.SIGTERM)
    assert leaving.popen.wait(timeout=15) == 0
    tail = [e["event"] for e in events(leaving)][-2:]
    assert tail == ["revoked", "left"]
    assert events(leaving)[-1]["member_id"] == joined[2]["member_id"]

    rejoined = wait_until(
        lambda: same_generation(survivors, newer_than=generation),
        timeout=session_ms / 1000,
        what="the survivors' next generation",
    )
    assert isinstance(rejoined, list)
    assert_one_generation(rejoined)
    elapsed = max(event["timestamp"] for event in rejoined) / 1000 - started
    assert elapsed < 3.0, f"a leave must not wait for the session timeout ({elapsed:.2f}s)"
    # the survivors learnt of the rebalance from a heartbeat answer, and said so
    for proc in survivors:
        errors = [e["error"] for e in events(proc) if e["event"] == "heartbeat_error"]
        assert "REBALANCE_IN_PROGRESS" in errors


def test_kill9_is_noticed_only_after_the_session_timeout(
    processes: Processes, server: ServerHandle
) -> None:
    session_ms = 3000
    procs, joined = form_group(processes, server, 3, session_ms=session_ms)
    generation = joined[0]["generation"]
    crashed, survivors = procs[2], procs[:2]
    started = time.time()
    crashed.kill9()

    rejoined = wait_until(
        lambda: same_generation(survivors, newer_than=generation),
        timeout=session_ms / 1000 + 15,
        what="the survivors' next generation",
    )
    assert isinstance(rejoined, list)
    assert_one_generation(rejoined)
    assert crashed.popen.returncode == -signal.SIGKILL
    assert "left" not in [e["event"] for e in events(crashed)]
    for proc in survivors:
        revoked = [e for e in events(proc) if e["event"] == "revoked"][-1]
        noticed = revoked["timestamp"] / 1000 - started
        assert noticed >= session_ms / 1000 - EXPIRY_SLACK_S, (
            f"the crash was acted on after {noticed:.2f}s, before the session timed out"
        )
    elapsed = min(event["timestamp"] for event in rejoined) / 1000 - started
    assert elapsed >= session_ms / 1000 - EXPIRY_SLACK_S


def test_bad_settings_are_one_line(processes: Processes, server: ServerHandle) -> None:
    too_short = start_member(processes, server, session_ms=500, heartbeat_ms=100)
    assert too_short.popen.wait(timeout=30) == 1
    assert events(too_short)[-1]["error"] == "INVALID_SESSION_TIMEOUT"
    errors = [line for line in too_short.output().splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "INVALID_SESSION_TIMEOUT" in errors[0]

    usage = subprocess.run(
        [
            *HERDER,
            *("verifiable", "member", "--group", GROUP, "--protocol", "p", "--resources", "a"),
            *("--session-timeout-ms", "1000", "--heartbeat-interval-ms", "1000"),
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert usage.returncode == 2
    assert "must be below --session-timeout-ms" in usage.stderr
    assert "Traceback" not in usage.stderr
