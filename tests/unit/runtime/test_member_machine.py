"""The group member's protocol, driven by hand on an injected clock.

Every branch of :class:`MemberMachine`: a round as follower and as leader, each answer a
JoinGroup, SyncGroup and Heartbeat can get, deadlines, stale answers, revocation before
a rejoin (with heartbeats going on meanwhile), leaving, failing for good, the backoff.
A property test then plays random histories and checks that no JoinGroup goes out while
a revocation is under way and that no two rounds are ever awaited at once.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from herder.coordinator import messages as m
from herder.errors import (
    ConnectionClosed,
    CoordinatorNotAvailable,
    ErrorCode,
    HerderError,
    InvalidSessionTimeout,
    RequestTimedOut,
)
from herder.runtime.core.member import (
    Assign,
    Assigned,
    Effect,
    Failed,
    Generation,
    HeartbeatFailed,
    MemberMachine,
    MemberState,
    Rediscover,
    Revoke,
    SendHeartbeat,
    SendJoin,
    SendLeave,
    SendSync,
)

pytestmark = pytest.mark.unit

GROUP = "g"
SESSION_MS = 10_000
REBALANCE_MS = 20_000
INTERVAL_MS = 3_000
#: how long a JoinGroup or SyncGroup is waited for
ROUND_MS = REBALANCE_MS + 5_000
#: how long a heartbeat is waited for
HEARTBEAT_WAIT_MS = 3 * INTERVAL_MS
BACKOFF_MS = 100
BACKOFF_MAX_MS = 2_000

E = TypeVar("E")


class Metadata:
    """The member's protocols, which may change between joins."""

    def __init__(self) -> None:
        self.value = b"v1"

    def __call__(self) -> list[tuple[str, bytes]]:
        return [("rr", self.value), ("range", b"r")]


def machine(seed: int = 1, *, interval_ms: int = INTERVAL_MS, **kwargs: Any) -> MemberMachine:
    return MemberMachine(
        GROUP,
        protocol_type="test",
        protocols=kwargs.pop("protocols", Metadata()),
        session_timeout_ms=SESSION_MS,
        rebalance_timeout_ms=REBALANCE_MS,
        heartbeat_interval_ms=interval_ms,
        client_id="client-1",
        client_host="host-1",
        retry_backoff_ms=BACKOFF_MS,
        retry_backoff_max_ms=BACKOFF_MAX_MS,
        rng=random.Random(seed),
        **kwargs,
    )


def only(effects: Sequence[Effect], kind: type[E]) -> E:
    """The one effect, which must be of ``kind``."""
    assert len(effects) == 1, effects
    (effect,) = effects
    assert isinstance(effect, kind), effects
    return effect


def kinds(effects: Sequence[Effect]) -> list[type]:
    return [type(effect) for effect in effects]


def joined(
    member_id: str = "m1",
    *,
    generation: int = 1,
    leader: str = "m0",
    members: Sequence[str] = (),
) -> m.JoinGroupResponse:
    return m.JoinGroupResponse(
        generation_id=generation,
        protocol_name="rr",
        leader=leader,
        member_id=member_id,
        members=[m.JoinGroupMember(member_id=mid, metadata=mid.encode()) for mid in members],
    )


def join_error(code: ErrorCode, member_id: str = "") -> m.JoinGroupResponse:
    return m.JoinGroupResponse(error_code=code, member_id=member_id)


def sync_error(code: ErrorCode) -> m.SyncGroupResponse:
    return m.SyncGroupResponse(error_code=code)


def heartbeat_error(code: ErrorCode) -> m.HeartbeatResponse:
    return m.HeartbeatResponse(error_code=code)


def to_stable(mm: MemberMachine, now: int = 0, generation: int = 1) -> Generation:
    """Take a started machine through a round as a follower (member id m1)."""
    join = only(mm.start(now), SendJoin)
    return finish_round(mm, join, now, generation)


def finish_round(mm: MemberMachine, join: SendJoin, now: int, generation: int = 1) -> Generation:
    sync = only(mm.join_answered(join.token, joined(generation=generation), now), SendSync)
    assigned = only(
        mm.sync_answered(sync.token, m.SyncGroupResponse(assignment=b"a"), now), Assigned
    )
    assert mm.state is MemberState.STABLE and mm.generation is assigned.generation
    return assigned.generation


def heartbeat_at(mm: MemberMachine, now: int) -> SendHeartbeat:
    assert mm.next_deadline_ms() == now
    assert mm.tick(now - 1) == []
    return only(mm.tick(now), SendHeartbeat)


# -- a round ------------------------------------------------------------------------------


def test_a_follower_joins_syncs_and_heartbeats() -> None:
    mm = machine()
    assert mm.state is MemberState.UNJOINED and mm.next_deadline_ms() is None
    join = only(mm.start(1_000), SendJoin)
    assert join.request == m.JoinGroupRequest(
        group_id=GROUP,
        member_id="",
        client_id="client-1",
        client_host="host-1",
        session_timeout_ms=SESSION_MS,
        rebalance_timeout_ms=REBALANCE_MS,
        protocol_type="test",
        protocols=[
            m.JoinGroupProtocol(name="rr", metadata=b"v1"),
            m.JoinGroupProtocol(name="range", metadata=b"r"),
        ],
    )
    assert mm.state is MemberState.JOINING and mm.next_deadline_ms() == 1_000 + ROUND_MS
    assert mm.start(1_000) == []  # once

    sync = only(mm.join_answered(join.token, joined(generation=4), 1_200), SendSync)
    # KIP-559: the protocol type and name the JoinGroup answered go back with the sync
    assert sync.request == m.SyncGroupRequest(
        group_id=GROUP,
        generation_id=4,
        member_id="m1",
        assignments=[],
        protocol_type="test",
        protocol_name="rr",
    )
    assert mm.state is MemberState.SYNCING and mm.member_id == "m1"
    assert mm.generation is None

    assigned = only(
        mm.sync_answered(sync.token, m.SyncGroupResponse(assignment=b"a"), 1_300), Assigned
    )
    assert assigned == Assigned(Generation(4, "m1", "m0", "rr", ()), b"a")
    assert mm.generation == assigned.generation and not mm.generation.is_leader
    assert mm.state is MemberState.STABLE

    beat = heartbeat_at(mm, 1_300 + INTERVAL_MS)
    assert beat.request == m.HeartbeatRequest(group_id=GROUP, generation_id=4, member_id="m1")
    assert mm.next_deadline_ms() == 1_300 + INTERVAL_MS + HEARTBEAT_WAIT_MS
    assert mm.heartbeat_answered(beat.token, m.HeartbeatResponse(), 4_400) == []
    # the next one an interval after the answer
    heartbeat_at(mm, 4_400 + INTERVAL_MS)


def test_the_leader_runs_the_assignor_between_join_and_sync() -> None:
    mm = machine()
    join = only(mm.start(0), SendJoin)
    answer = joined("m1", leader="m1", members=["m2", "m1"], generation=2)
    assign = only(mm.join_answered(join.token, answer, 10), Assign)
    assert (assign.leader_id, assign.protocol) == ("m1", "rr")
    assert assign.members == {"m2": b"m2", "m1": b"m1"}
    assert mm.state is MemberState.SYNCING
    # the assignor runs in the member's own process: no deadline for it
    assert mm.next_deadline_ms() is None
    assert mm.tick(10**9) == []
    assert mm.assignment_made(assign.token + 1, {"m1": b"x"}, 20) == []  # stale

    sync = only(mm.assignment_made(assign.token, {"m1": b"one", "m2": b"two"}, 20), SendSync)
    assert sync.request.generation_id == 2 and sync.request.member_id == "m1"
    assert sync.request.assignments == [
        m.SyncGroupAssignment(member_id="m1", assignment=b"one"),
        m.SyncGroupAssignment(member_id="m2", assignment=b"two"),
    ]
    assert mm.assignment_made(assign.token, {}, 21) == []  # answered already
    assigned = only(
        mm.sync_answered(sync.token, m.SyncGroupResponse(assignment=b"one"), 30), Assigned
    )
    assert assigned.generation == Generation(2, "m1", "m1", "rr", ("m1", "m2"))
    assert assigned.generation.is_leader and assigned.assignment == b"one"


# -- JoinGroup answers -------------------------------------------------------------------


def test_member_id_required_rejoins_at_once_with_the_given_id() -> None:
    mm = machine()
    join = only(mm.start(0), SendJoin)
    again = only(
        mm.join_answered(join.token, join_error(ErrorCode.MEMBER_ID_REQUIRED, "m9"), 5), SendJoin
    )
    assert again.request.member_id == "m9" and mm.member_id == "m9"
    assert again.token != join.token and mm.state is MemberState.JOINING


@pytest.mark.parametrize("code", [ErrorCode.REBALANCE_IN_PROGRESS, ErrorCode.ILLEGAL_GENERATION])
def test_a_join_refused_for_the_round_rejoins_at_once_keeping_the_id(code: ErrorCode) -> None:
    mm = machine()
    join = only(mm.start(0), SendJoin)
    join = only(
        mm.join_answered(join.token, join_error(ErrorCode.MEMBER_ID_REQUIRED, "m9"), 0), SendJoin
    )
    again = only(mm.join_answered(join.token, join_error(code), 5), SendJoin)
    assert again.request.member_id == "m9"


def test_unknown_member_id_on_join_forgets_the_id_and_rejoins_at_once() -> None:
    mm = machine()
    join = only(mm.start(0), SendJoin)
    join = only(
        mm.join_answered(join.token, join_error(ErrorCode.MEMBER_ID_REQUIRED, "m9"), 0), SendJoin
    )
    again = only(mm.join_answered(join.token, join_error(ErrorCode.UNKNOWN_MEMBER_ID), 5), SendJoin)
    assert again.request.member_id == "" and mm.member_id == ""


@pytest.mark.parametrize(
    "failure",
    [
        join_error(ErrorCode.NOT_COORDINATOR),
        join_error(ErrorCode.COORDINATOR_NOT_AVAILABLE),
        join_error(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS),
        ConnectionClosed("lost"),
        CoordinatorNotAvailable("no coordinator reachable"),
    ],
)
def test_coordinator_trouble_on_join_rediscovers_and_retries_after_a_backoff(
    failure: m.JoinGroupResponse | HerderError,
) -> None:
    mm = machine()
    join = only(mm.start(0), SendJoin)
    join = only(
        mm.join_answered(join.token, join_error(ErrorCode.MEMBER_ID_REQUIRED, "m9"), 0), SendJoin
    )
    if isinstance(failure, HerderError):
        effects = mm.request_failed(join.token, failure, 1_000)
    else:
        effects = mm.join_answered(join.token, failure, 1_000)
    only(effects, Rediscover)
    assert mm.state is MemberState.UNJOINED and mm.failure is None
    retry_at = mm.next_deadline_ms()
    assert retry_at is not None and 1_080 <= retry_at <= 1_120
    assert mm.tick(retry_at - 1) == []
    again = only(mm.tick(retry_at), SendJoin)
    assert again.request.member_id == "m9"


@pytest.mark.parametrize(
    "code",
    [
        ErrorCode.INVALID_SESSION_TIMEOUT,
        ErrorCode.INCONSISTENT_GROUP_PROTOCOL,
        ErrorCode.INVALID_GROUP_ID,
        ErrorCode.GROUP_MAX_SIZE_REACHED,
        ErrorCode.UNKNOWN_SERVER_ERROR,
    ],
)
def test_any_other_join_error_is_fatal(code: ErrorCode) -> None:
    mm = machine()
    join = only(mm.start(0), SendJoin)
    failed = only(mm.join_answered(join.token, join_error(code), 5), Failed)
    assert failed.error.code == code and code.name in str(failed.error)
    assert mm.state is MemberState.FAILED and mm.failure is failed.error
    assert_terminal(mm)


def test_a_non_retriable_error_in_place_of_an_answer_is_fatal() -> None:
    mm = machine()
    join = only(mm.start(0), SendJoin)
    error = InvalidSessionTimeout("session timeout 1200 ms is not above a leader change")
    assert only(mm.request_failed(join.token, error, 5), Failed).error is error
    assert mm.failure is error
    assert_terminal(mm)


def assert_terminal(mm: MemberMachine) -> None:
    """Nothing comes out of a machine that failed or closed, whatever it is fed."""
    assert mm.next_deadline_ms() is None
    for now in (10, 10**6, 10**9):
        assert mm.tick(now) == []
    assert mm.start(10) == []
    assert mm.request_rejoin(10) == []
    assert mm.revoked(10) == []
    assert mm.leave(10) == []
    assert mm.close(10) == []
    for token in range(10):
        assert mm.join_answered(token, joined(), 10) == []
        assert mm.sync_answered(token, m.SyncGroupResponse(), 10) == []
        assert mm.heartbeat_answered(token, m.HeartbeatResponse(), 10) == []
        assert mm.assignment_made(token, {}, 10) == []
        assert mm.request_failed(token, ConnectionClosed("x"), 10) == []


# -- SyncGroup answers -------------------------------------------------------------------


def syncing(mm: MemberMachine) -> SendSync:
    join = only(mm.start(0), SendJoin)
    return only(mm.join_answered(join.token, joined("m1"), 0), SendSync)


def test_unknown_member_id_on_sync_forgets_the_id_and_rejoins_at_once() -> None:
    mm = machine()
    sync = syncing(mm)
    again = only(mm.sync_answered(sync.token, sync_error(ErrorCode.UNKNOWN_MEMBER_ID), 5), SendJoin)
    assert again.request.member_id == "" and mm.generation is None


@pytest.mark.parametrize("code", [ErrorCode.REBALANCE_IN_PROGRESS, ErrorCode.ILLEGAL_GENERATION])
def test_a_sync_refused_for_the_round_rejoins_at_once_keeping_the_id(code: ErrorCode) -> None:
    mm = machine()
    sync = syncing(mm)
    again = only(mm.sync_answered(sync.token, sync_error(code), 5), SendJoin)
    assert again.request.member_id == "m1"


@pytest.mark.parametrize(
    "code",
    [
        ErrorCode.NOT_COORDINATOR,
        ErrorCode.COORDINATOR_NOT_AVAILABLE,
        ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
    ],
)
def test_coordinator_trouble_on_sync_rediscovers_and_rejoins_after_a_backoff(
    code: ErrorCode,
) -> None:
    mm = machine()
    sync = syncing(mm)
    only(mm.sync_answered(sync.token, sync_error(code), 500), Rediscover)
    retry_at = mm.next_deadline_ms()
    assert retry_at is not None and 580 <= retry_at <= 620
    assert only(mm.tick(retry_at), SendJoin).request.member_id == "m1"


@pytest.mark.parametrize(
    "code", [ErrorCode.INCONSISTENT_GROUP_PROTOCOL, ErrorCode.MEMBER_ID_REQUIRED]
)
def test_any_other_sync_error_is_fatal(code: ErrorCode) -> None:
    mm = machine()
    sync = syncing(mm)
    assert only(mm.sync_answered(sync.token, sync_error(code), 5), Failed).error.code == code
    assert_terminal(mm)


def test_an_assignor_that_raises_fails_the_member() -> None:
    mm = machine()
    join = only(mm.start(0), SendJoin)
    assign = only(
        mm.join_answered(join.token, joined("m1", leader="m1", members=["m1"]), 0), Assign
    )
    error = HerderError("assignor: KeyError('x')")
    assert only(mm.request_failed(assign.token, error, 1), Failed).error is error


# -- Heartbeat answers -------------------------------------------------------------------


def test_rebalance_in_progress_on_heartbeat_revokes_and_heartbeats_go_on_until_the_join() -> None:
    mm = machine()
    generation = to_stable(mm, 0)
    beat = heartbeat_at(mm, INTERVAL_MS)
    effects = mm.heartbeat_answered(
        beat.token, heartbeat_error(ErrorCode.REBALANCE_IN_PROGRESS), 3_100
    )
    assert effects == [HeartbeatFailed("REBALANCE_IN_PROGRESS"), Revoke(generation)]
    assert mm.state is MemberState.REVOKING and mm.generation is None
    # a revocation slower than the session: the heartbeats keep it alive
    beat = heartbeat_at(mm, 3_100 + INTERVAL_MS)
    assert beat.request.generation_id == generation.generation_id
    effects = mm.heartbeat_answered(
        beat.token, heartbeat_error(ErrorCode.REBALANCE_IN_PROGRESS), 6_200
    )
    assert effects == [HeartbeatFailed("REBALANCE_IN_PROGRESS")]  # no second Revoke
    beat = heartbeat_at(mm, 6_200 + INTERVAL_MS)
    # the work has stopped: the join goes out and the heartbeats end with it
    join = only(mm.revoked(9_300), SendJoin)
    assert join.request.member_id == "m1" and mm.state is MemberState.JOINING
    assert mm.heartbeat_answered(beat.token, m.HeartbeatResponse(), 9_400) == []
    assert mm.next_deadline_ms() == 9_300 + ROUND_MS
    assert mm.revoked(9_500) == []


@pytest.mark.parametrize(
    ("code", "rejoins_as"),
    [
        (ErrorCode.ILLEGAL_GENERATION, "m1"),
        (ErrorCode.FENCED, "m1"),
        (ErrorCode.UNKNOWN_MEMBER_ID, ""),
    ],
)
def test_a_heartbeat_refused_for_the_generation_revokes_and_stops_the_heartbeats(
    code: ErrorCode, rejoins_as: str
) -> None:
    mm = machine()
    generation = to_stable(mm, 0)
    beat = heartbeat_at(mm, INTERVAL_MS)
    effects = mm.heartbeat_answered(beat.token, heartbeat_error(code), 3_100)
    assert effects == [HeartbeatFailed(code.name), Revoke(generation)]
    assert mm.member_id == rejoins_as
    assert mm.next_deadline_ms() is None  # no heartbeats for a generation that is over
    assert mm.tick(100_000) == []
    assert only(mm.revoked(100_000), SendJoin).request.member_id == rejoins_as


@pytest.mark.parametrize(
    "failure",
    [
        heartbeat_error(ErrorCode.NOT_COORDINATOR),
        heartbeat_error(ErrorCode.COORDINATOR_NOT_AVAILABLE),
        heartbeat_error(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS),
        ConnectionClosed("lost"),
    ],
)
def test_coordinator_trouble_on_heartbeat_rediscovers_and_heartbeats_go_on(
    failure: m.HeartbeatResponse | HerderError,
) -> None:
    mm = machine()
    generation = to_stable(mm, 0)
    beat = heartbeat_at(mm, INTERVAL_MS)
    if isinstance(failure, HerderError):
        effects = mm.request_failed(beat.token, failure, 3_100)
        name = failure.code.name
    else:
        effects = mm.heartbeat_answered(beat.token, failure, 3_100)
        name = ErrorCode(failure.error_code).name
    assert effects == [HeartbeatFailed(name), Rediscover()]
    assert mm.state is MemberState.STABLE and mm.generation is generation
    heartbeat_at(mm, 3_100 + INTERVAL_MS)


def test_any_other_heartbeat_error_is_fatal() -> None:
    mm = machine()
    to_stable(mm, 0)
    beat = heartbeat_at(mm, INTERVAL_MS)
    effects = mm.heartbeat_answered(beat.token, heartbeat_error(ErrorCode.INVALID_GROUP_ID), 3_100)
    assert kinds(effects) == [HeartbeatFailed, Failed]
    assert_terminal(mm)


# -- deadlines and stale answers ---------------------------------------------------------


def test_a_join_without_an_answer_times_out_as_a_retriable_failure() -> None:
    mm = machine()
    join = only(mm.start(0), SendJoin)
    assert mm.tick(ROUND_MS - 1) == []
    only(mm.tick(ROUND_MS), Rediscover)
    assert mm.state is MemberState.UNJOINED
    # the answer that finally comes is for a request given up on
    assert mm.join_answered(join.token, joined(), ROUND_MS + 1) == []
    retry_at = mm.next_deadline_ms()
    assert retry_at is not None
    assert only(mm.tick(retry_at), SendJoin).token != join.token


def test_a_sync_without_an_answer_times_out_as_a_retriable_failure() -> None:
    mm = machine()
    sync = syncing(mm)
    assert mm.next_deadline_ms() == ROUND_MS
    only(mm.tick(ROUND_MS), Rediscover)
    assert mm.sync_answered(sync.token, m.SyncGroupResponse(), ROUND_MS) == []


@pytest.mark.parametrize(("interval", "wait"), [(3_000, 9_000), (300, 3_000)])
def test_a_heartbeat_without_an_answer_times_out_after_three_intervals_at_least_a_second(
    interval: int, wait: int
) -> None:
    mm = machine(interval_ms=interval)
    to_stable(mm, 0)
    beat = heartbeat_at(mm, interval)
    assert mm.next_deadline_ms() == interval + wait
    assert mm.tick(interval + wait - 1) == []
    assert mm.tick(interval + wait) == [HeartbeatFailed("REQUEST_TIMED_OUT"), Rediscover()]
    assert mm.heartbeat_answered(beat.token, m.HeartbeatResponse(), interval + wait) == []
    heartbeat_at(mm, 2 * interval + wait)


def test_answers_with_stale_or_foreign_tokens_are_ignored() -> None:
    mm = machine()
    join = only(mm.start(0), SendJoin)
    for wrong in (join.token - 1, join.token + 1):
        assert mm.join_answered(wrong, joined(), 1) == []
        assert mm.request_failed(wrong, ConnectionClosed("x"), 1) == []
    # right token, wrong kind of answer
    assert mm.sync_answered(join.token, m.SyncGroupResponse(), 1) == []
    assert mm.heartbeat_answered(join.token, m.HeartbeatResponse(), 1) == []
    assert mm.state is MemberState.JOINING
    sync = only(mm.join_answered(join.token, joined(), 2), SendSync)
    assert mm.join_answered(join.token, joined(), 3) == []  # answered twice
    assert mm.sync_answered(join.token, m.SyncGroupResponse(), 3) == []
    only(mm.sync_answered(sync.token, m.SyncGroupResponse(), 4), Assigned)
    assert mm.sync_answered(sync.token, m.SyncGroupResponse(), 5) == []


# -- rejoining ---------------------------------------------------------------------------


def test_request_rejoin_revokes_first_and_joins_with_fresh_metadata() -> None:
    metadata = Metadata()
    mm = machine(protocols=metadata)
    generation = to_stable(mm, 0)
    metadata.value = b"v2"
    assert mm.request_rejoin(100) == [Revoke(generation)]
    assert mm.state is MemberState.REVOKING and mm.generation is None
    assert mm.request_rejoin(200) == []  # one revocation, one join
    beat = heartbeat_at(mm, INTERVAL_MS)
    assert mm.heartbeat_answered(beat.token, m.HeartbeatResponse(), INTERVAL_MS) == []
    join = only(mm.revoked(4_000), SendJoin)
    assert join.request.protocols[0].metadata == b"v2" and join.request.member_id == "m1"


def test_request_rejoin_during_a_round_rejoins_once_it_is_done() -> None:
    mm = machine()
    join = only(mm.start(0), SendJoin)
    assert mm.request_rejoin(1) == []
    sync = only(mm.join_answered(join.token, joined(), 2), SendSync)
    effects = mm.sync_answered(sync.token, m.SyncGroupResponse(assignment=b"a"), 3)
    assert kinds(effects) == [Assigned, Revoke]
    assert effects[1] == Revoke(effects[0].generation)  # type: ignore[union-attr]
    only(mm.revoked(4), SendJoin)


def test_a_new_round_after_a_successful_one_starts_from_the_shortest_backoff() -> None:
    mm = machine(seed=7)
    join = only(mm.start(0), SendJoin)
    now = 0
    for _ in range(4):  # back off up to ~1.6 s
        only(mm.request_failed(join.token, ConnectionClosed("x"), now), Rediscover)
        now = mm.next_deadline_ms() or 0
        join = only(mm.tick(now), SendJoin)
    finish_round(mm, join, now)
    only(mm.request_rejoin(now), Revoke)
    join = only(mm.revoked(now), SendJoin)
    only(mm.request_failed(join.token, ConnectionClosed("x"), now), Rediscover)
    delay = (mm.next_deadline_ms() or 0) - now
    assert 80 <= delay <= 120


# -- backoff -----------------------------------------------------------------------------


def backoffs(seed: int, failures: int) -> list[int]:
    mm = machine(seed)
    join = only(mm.start(0), SendJoin)
    now, delays = 0, []
    for _ in range(failures):
        only(
            mm.join_answered(join.token, join_error(ErrorCode.COORDINATOR_NOT_AVAILABLE), now),
            Rediscover,
        )
        retry_at = mm.next_deadline_ms()
        assert retry_at is not None
        delays.append(retry_at - now)
        assert mm.tick(retry_at - 1) == []
        now = retry_at
        join = only(mm.tick(now), SendJoin)
    return delays


def test_the_backoff_doubles_with_jitter_up_to_its_cap_and_depends_only_on_the_seed() -> None:
    delays = backoffs(seed=3, failures=10)
    for attempt, delay in enumerate(delays):
        term = min(BACKOFF_MS * 2**attempt, BACKOFF_MAX_MS)
        assert 0.8 * term <= delay <= min(1.2 * term, BACKOFF_MAX_MS), (attempt, delays)
    assert max(delays) <= BACKOFF_MAX_MS and min(delays[5:]) >= 0.8 * BACKOFF_MAX_MS
    assert backoffs(seed=3, failures=10) == delays
    assert backoffs(seed=4, failures=10) != delays


# -- leaving and closing -----------------------------------------------------------------


def test_leave_revokes_leaves_at_once_and_stays_out_until_asked_back() -> None:
    mm = machine()
    generation = to_stable(mm, 0)
    beat = heartbeat_at(mm, INTERVAL_MS)
    effects = mm.leave(3_100)
    assert effects == [
        Revoke(generation),
        SendLeave(m.LeaveGroupRequest(group_id=GROUP, member_ids=["m1"])),
    ]
    assert mm.state is MemberState.LEFT
    assert mm.generation is None and mm.member_id == ""
    assert mm.next_deadline_ms() is None and mm.tick(10**6) == []
    assert mm.heartbeat_answered(beat.token, m.HeartbeatResponse(), 3_200) == []
    assert mm.leave(3_300) == []
    assert mm.revoked(3_400) == []  # the revocation ended while out: nothing to send
    join = only(mm.request_rejoin(10**6), SendJoin)
    assert join.request.member_id == ""
    finish_round(mm, join, 10**6, generation=2)


def test_a_member_asked_back_before_its_revocation_ended_joins_only_after_it() -> None:
    mm = machine()
    to_stable(mm, 0)
    assert kinds(mm.leave(100)) == [Revoke, SendLeave]
    assert mm.request_rejoin(200) == []
    assert mm.state is MemberState.REVOKING and mm.next_deadline_ms() is None
    only(mm.revoked(300), SendJoin)


def test_leaving_before_an_id_was_given_sends_nothing_and_ignores_the_late_answer() -> None:
    mm = machine()
    join = only(mm.start(0), SendJoin)
    assert mm.leave(5) == []
    assert mm.state is MemberState.LEFT
    assert mm.join_answered(join.token, joined(), 6) == []


def test_a_member_that_leaves_before_it_starts_joins_when_asked() -> None:
    mm = machine()
    assert mm.leave(0) == []
    assert mm.start(1) == []
    only(mm.request_rejoin(2), SendJoin)


def test_close_leaves_unless_told_not_to_and_then_nothing_more() -> None:
    mm = machine()
    to_stable(mm, 0)
    assert mm.close(5) == [SendLeave(m.LeaveGroupRequest(group_id=GROUP, member_ids=["m1"]))]
    assert mm.state is MemberState.CLOSED
    assert_terminal(mm)

    mm = machine()
    to_stable(mm, 0)
    assert mm.close(5, leave=False) == []
    assert_terminal(mm)


# -- random histories ----------------------------------------------------------------------

#: answer codes, the common ones more than once
CODES = [ErrorCode.NONE] * 6 + [
    ErrorCode.MEMBER_ID_REQUIRED,
    ErrorCode.UNKNOWN_MEMBER_ID,
    ErrorCode.REBALANCE_IN_PROGRESS,
    ErrorCode.REBALANCE_IN_PROGRESS,
    ErrorCode.ILLEGAL_GENERATION,
    ErrorCode.FENCED,
    ErrorCode.NOT_COORDINATOR,
    ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
    ErrorCode.INVALID_SESSION_TIMEOUT,
]
FAILURES: list[HerderError] = [
    ConnectionClosed("lost"),
    CoordinatorNotAvailable("none"),
    RequestTimedOut("slow"),
    InvalidSessionTimeout("too short"),
]
ACTIONS = [
    "time",
    "time",
    "answer",
    "answer",
    "answer",
    "fail",
    "stale",
    "revoked",
    "revoked",
    "rejoin",
    "leave",
    "close",
]


@dataclass
class History:
    """The world around one machine: what it sent and the test has not answered yet."""

    mm: MemberMachine
    now: int = 0
    #: join, assignor and sync tokens awaited: kind, sent at
    rounds: dict[int, tuple[str, int]] = field(default_factory=dict)
    heartbeats: dict[int, int] = field(default_factory=dict)
    #: tokens the machine no longer awaits (answered, timed out, abandoned)
    retired: set[int] = field(default_factory=set)
    #: revocations opened and not yet reported done
    revoking: int = 0

    def feed(self, effects: list[Effect]) -> None:
        for effect in effects:
            if isinstance(effect, SendJoin):
                assert not self.revoking, "a JoinGroup went out while a revocation was under way"
                assert not self.rounds, f"a JoinGroup went out while {self.rounds} was awaited"
                self.retire_heartbeats()
                self.rounds[effect.token] = ("join", self.now)
            elif isinstance(effect, (SendSync, Assign)):
                assert not self.rounds, f"a second round step while {self.rounds} was awaited"
                kind = "sync" if isinstance(effect, SendSync) else "assign"
                self.rounds[effect.token] = (kind, self.now)
            elif isinstance(effect, SendHeartbeat):
                assert not self.rounds and not self.heartbeats
                self.heartbeats[effect.token] = self.now
            elif isinstance(effect, Revoke):
                if not self.mm.cooperative_protocols:
                    assert not self.revoking, "a second Revoke before the first was done"
                self.revoking += 1
            elif isinstance(effect, Assigned) and self.mm.cooperative_protocols:
                self.revoking += 1
            elif isinstance(effect, Failed):
                assert effect is effects[-1], "nothing after Failed"
                self.abandon()
        deadline = self.mm.next_deadline_ms()
        assert deadline is None or deadline > self.now, "a deadline tick would not clear"

    def retire_heartbeats(self) -> None:
        self.retired.update(self.heartbeats)
        self.heartbeats.clear()

    def abandon(self) -> None:
        self.retired.update(self.rounds)
        self.rounds.clear()
        self.retire_heartbeats()

    def answered(self, token: int) -> None:
        self.rounds.pop(token, None)
        self.heartbeats.pop(token, None)
        self.retired.add(token)

    def expire(self) -> None:
        for token, (kind, sent) in list(self.rounds.items()):
            if kind != "assign" and self.now >= sent + ROUND_MS:
                self.answered(token)
        for token, sent in list(self.heartbeats.items()):
            if self.now >= sent + HEARTBEAT_WAIT_MS:
                self.answered(token)

    def step(self, action: str, pick: int, amount: int) -> None:
        mm = self.mm
        awaited = [*self.rounds, *self.heartbeats]
        if action == "time":
            self.now += amount
            self.expire()
            self.feed(mm.tick(self.now))
        elif action in ("answer", "fail") and awaited:
            token = awaited[pick % len(awaited)]
            kind = self.rounds.get(token, ("heartbeat", 0))[0]
            self.answered(token)
            if action == "fail":
                self.feed(mm.request_failed(token, FAILURES[pick % len(FAILURES)], self.now))
            elif kind == "assign":
                self.feed(mm.assignment_made(token, {mm.member_id: b"a"}, self.now))
            else:
                self.feed(self.answer(kind, token, CODES[pick % len(CODES)], pick))
        elif action == "stale" and self.retired:
            token = sorted(self.retired)[pick % len(self.retired)]
            assert mm.join_answered(token, joined(), self.now) == []
            assert mm.sync_answered(token, m.SyncGroupResponse(), self.now) == []
            assert mm.heartbeat_answered(token, m.HeartbeatResponse(), self.now) == []
            assert mm.assignment_made(token, {}, self.now) == []
            assert mm.request_failed(token, ConnectionClosed("x"), self.now) == []
        elif action == "revoked":
            self.revoking = max(self.revoking - 1, 0)
            self.feed(mm.revoked(self.now))
        elif action == "rejoin":
            self.feed(mm.request_rejoin(self.now))
        elif action == "leave":
            effects = mm.leave(self.now)
            self.abandon()
            self.feed(effects)
        elif action == "close" and pick % 4 == 0:
            effects = mm.close(self.now, leave=pick % 8 == 0)
            self.abandon()
            self.feed(effects)

    def answer(self, kind: str, token: int, code: ErrorCode, pick: int) -> list[Effect]:
        mm = self.mm
        if kind == "join":
            if code == ErrorCode.NONE:
                member_id = mm.member_id or f"m{pick % 3}"
                leader = member_id if pick % 2 else "other"
                members = [member_id, "other"] if leader == member_id else []
                response = joined(member_id, leader=leader, members=members)
                return mm.join_answered(token, response, self.now)
            return mm.join_answered(token, join_error(code, f"m{pick % 3}"), self.now)
        if kind == "sync":
            return mm.sync_answered(token, sync_error(code), self.now)
        return mm.heartbeat_answered(token, heartbeat_error(code), self.now)


@settings(max_examples=400, deadline=None)
@given(
    seed=st.integers(0, 2**32),
    steps=st.lists(
        st.tuples(st.sampled_from(ACTIONS), st.integers(0, 10**6), st.integers(0, 12_000)),
        max_size=80,
    ),
)
@pytest.mark.parametrize("cooperative", [False, True])
def test_random_histories_never_join_while_revoking_nor_await_two_rounds(
    cooperative: bool, seed: int, steps: list[tuple[str, int, int]]
) -> None:
    history = History(machine(seed, cooperative_protocols={"rr"} if cooperative else ()))
    history.feed(history.mm.start(0))
    for action, pick, amount in steps:
        history.step(action, pick, amount)
        if history.mm.state in (MemberState.FAILED, MemberState.CLOSED):
            assert_terminal(history.mm)
            return


def test_a_static_member_names_its_instance_on_every_request_and_does_not_leave_on_close() -> None:
    mm = machine(group_instance_id="worker-a")
    join = only(mm.start(0), SendJoin)
    assert join.request.group_instance_id == "worker-a"
    sync = only(mm.join_answered(join.token, joined("worker-a-1", leader="m0"), 10), SendSync)
    assert sync.request.group_instance_id == "worker-a"
    assigned = mm.sync_answered(sync.token, m.SyncGroupResponse(assignment=b"a"), 20)
    assert [type(e) for e in assigned] == [Assigned]
    heartbeat = only(mm.tick(20 + INTERVAL_MS), SendHeartbeat)
    assert heartbeat.request.group_instance_id == "worker-a"
    # its place waits for a restart within the session timeout (KIP-345)
    assert mm.close(30 + INTERVAL_MS) == []


def test_a_static_member_told_to_leave_for_good_leaves_by_its_instance_id() -> None:
    mm = machine(group_instance_id="worker-a")
    join = only(mm.start(0), SendJoin)
    sync = only(mm.join_answered(join.token, joined("worker-a-1", leader="m0"), 10), SendSync)
    mm.sync_answered(sync.token, m.SyncGroupResponse(assignment=b"a"), 20)
    leave = only(mm.close(30, leave=True), SendLeave)
    assert leave.request.leaving() == [
        m.LeavingMember(member_id="worker-a-1", group_instance_id="worker-a")
    ]


def test_a_restarted_static_leader_told_to_skip_the_assignment_does_not_assign() -> None:
    mm = machine(group_instance_id="worker-a")
    join = only(mm.start(0), SendJoin)
    answer = joined("worker-a-2", leader="worker-a-2", members=["worker-a-2", "m9"])
    answer = msgspec.structs.replace(answer, skip_assignment=True)
    sync = only(mm.join_answered(join.token, answer, 10), SendSync)
    assert sync.request.assignments == []


# -- cooperative mode (KIP-415) --------------------------------------------------------------


def test_a_cooperative_member_keeps_its_work_across_a_rebalance() -> None:
    mm = machine(cooperative_protocols={"rr"})
    generation = to_stable(mm, 0)
    assert mm.revoked(0) == []  # the first assignment revoked nothing
    beat = heartbeat_at(mm, INTERVAL_MS)
    effects = mm.heartbeat_answered(
        beat.token, heartbeat_error(ErrorCode.REBALANCE_IN_PROGRESS), 3_100
    )
    join = only(effects[1:], SendJoin)
    assert effects[0] == HeartbeatFailed("REBALANCE_IN_PROGRESS")
    assert mm.generation is generation  # still held while the group rebalances
    assert finish_round(mm, join, 3_200, generation=2).generation_id == 2


def test_a_cooperative_member_joins_only_after_what_its_assignment_revoked_has_stopped() -> None:
    mm = machine(cooperative_protocols={"rr"})
    to_stable(mm, 0)
    # the holder is stopping the revoked work; a rebalance starts meanwhile
    beat = heartbeat_at(mm, INTERVAL_MS)
    effects = mm.heartbeat_answered(
        beat.token, heartbeat_error(ErrorCode.REBALANCE_IN_PROGRESS), 3_100
    )
    assert effects == [HeartbeatFailed("REBALANCE_IN_PROGRESS")]
    assert mm.state is MemberState.REVOKING
    heartbeat_at(mm, 3_100 + INTERVAL_MS)  # the session is kept alive meanwhile
    join = only(mm.revoked(6_300), SendJoin)
    assert join.request.member_id == "m1"


def test_a_cooperative_member_rejoins_when_asked_after_a_revocation() -> None:
    mm = machine(cooperative_protocols={"rr"})
    to_stable(mm, 0)
    assert mm.request_rejoin(10) == []  # the revoked work has not stopped yet
    only(mm.revoked(20), SendJoin)


@pytest.mark.parametrize(
    "code", [ErrorCode.ILLEGAL_GENERATION, ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.FENCED]
)
def test_a_cooperative_member_whose_generation_went_on_without_it_gives_everything_up(
    code: ErrorCode,
) -> None:
    mm = machine(cooperative_protocols={"rr"})
    generation = to_stable(mm, 0)
    mm.revoked(0)
    beat = heartbeat_at(mm, INTERVAL_MS)
    effects = mm.heartbeat_answered(beat.token, heartbeat_error(code), 3_100)
    assert effects == [HeartbeatFailed(code.name), Revoke(generation)]
    assert mm.generation is None
    only(mm.revoked(3_200), SendJoin)


def test_a_cooperative_member_forgotten_by_the_coordinator_gives_everything_up() -> None:
    mm = machine(cooperative_protocols={"rr"})
    generation = to_stable(mm, 0)
    mm.revoked(0)
    beat = heartbeat_at(mm, INTERVAL_MS)
    effects = mm.heartbeat_answered(
        beat.token, heartbeat_error(ErrorCode.REBALANCE_IN_PROGRESS), 3_100
    )
    join = only(effects[1:], SendJoin)
    effects = mm.join_answered(join.token, join_error(ErrorCode.UNKNOWN_MEMBER_ID), 3_200)
    assert effects == [Revoke(generation)]
    assert only(mm.revoked(3_300), SendJoin).request.member_id == ""


def test_a_cooperative_member_that_leaves_gives_everything_up() -> None:
    mm = machine(cooperative_protocols={"rr"})
    generation = to_stable(mm, 0)
    mm.revoked(0)
    effects = mm.leave(100)
    assert kinds(effects) == [Revoke, SendLeave]
    assert effects[0] == Revoke(generation)


def test_a_generation_of_an_eager_protocol_revokes_before_the_join_as_ever() -> None:
    mm = machine(cooperative_protocols={"sessioned"})  # the group chose "rr"
    generation = to_stable(mm, 0)
    assert mm.revoked(0) == []  # no revocation opened by an eager assignment
    assert mm.request_rejoin(10) == [Revoke(generation)]
    only(mm.revoked(20), SendJoin)
