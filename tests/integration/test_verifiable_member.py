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
    instance_id: str | None = None,
) -> Proc:
    static = ["--instance-id", instance_id] if instance_id is not None else []
    return processes.start(
        [
            *HERDER,
            "verifiable",
            "member",
            *static,
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
        name=f"member-{instance_id}" if instance_id else "member",
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


def describe_members(server: ServerHandle) -> dict[str, str | None]:
    """member id -> group instance id, as ``herder groups describe --json`` shows them."""
    done = subprocess.run(
        [*HERDER, "groups", "describe", GROUP, "--json", "--bootstrap", server.bootstrap],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    described = json.loads(done.stdout)
    return {m["member_id"]: m["group_instance_id"] for m in described["members"]}


def test_a_static_member_restarted_within_its_session_keeps_its_place_without_a_rebalance(
    processes: Processes, server: ServerHandle
) -> None:
    session_ms = 20_000
    procs = [
        start_member(processes, server, session_ms=session_ms, instance_id=name)
        for name in ("alpha", "beta", "gamma")
    ]
    joined = wait_until(lambda: same_generation(procs), timeout=45, what="one generation")
    assert isinstance(joined, list)
    assert_one_generation(joined)
    assert [event["instance_id"] for event in joined] == ["alpha", "beta", "gamma"]
    generation = joined[0]["generation"]
    assert sorted(describe_members(server).values()) == ["alpha", "beta", "gamma"]

    # the group may have formed over more than one generation: what counts is what the
    # others hear from the restart on
    seen = {proc: len(events(proc)) for proc in (procs[0], procs[2])}
    old = procs[1]
    old.signal(signal.SIGTERM)
    assert old.popen.wait(timeout=15) == 0
    assert [e["event"] for e in events(old)][-2:] == ["revoked", "stopped"]

    restarted = start_member(processes, server, session_ms=session_ms, instance_id="beta")
    back = wait_until(
        lambda: [e for e in events(restarted) if e["event"] == "joined"],
        timeout=30,
        what="the restarted member's assignment",
    )
    assert isinstance(back, list)
    # the same generation and the same assignment, under a new member id
    assert back[0]["generation"] == generation
    assert back[0]["assignment"] == joined[1]["assignment"]
    assert back[0]["member_id"] != joined[1]["member_id"]
    members = describe_members(server)
    assert members[back[0]["member_id"]] == "beta" and joined[1]["member_id"] not in members
    # nobody else was asked to rebalance
    for proc, before in ((procs[0], joined[0]), (procs[2], joined[2])):
        history = events(proc)[seen[proc] :]
        assert "revoked" not in [e["event"] for e in history], history
        assert events(proc)[-1] == before


def test_a_second_process_with_the_same_instance_id_fences_the_first(
    processes: Processes, server: ServerHandle
) -> None:
    first = start_member(processes, server, session_ms=10_000, instance_id="only")
    wait_until(lambda: same_generation([first]), timeout=30, what="the first process joined")
    second = start_member(processes, server, session_ms=10_000, instance_id="only")
    wait_until(lambda: same_generation([second]), timeout=30, what="the second process joined")
    assert first.popen.wait(timeout=15) == 1
    assert events(first)[-1]["error"] == "FENCED_INSTANCE_ID"
    assert list(describe_members(server).values()) == ["only"]
