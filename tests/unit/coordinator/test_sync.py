"""SyncGroup: the leader's assignment, its storage, and members that never sync."""

from __future__ import annotations

import pytest

from herder.coordinator import GroupRecord, GroupState, collect_groups
from herder.errors import ErrorCode

from .support import REBALANCE_MS, Harness

pytestmark = pytest.mark.unit


def test_the_leaders_sync_completes_waiting_followers_and_fills_missing_members() -> None:
    h = Harness(deferred=True)
    formed = h.form_group("g", 3, sync=False)
    f1, f2 = formed.followers
    waiting = h.sync("g", f1, formed.generation)
    assert not waiting.done
    leader = h.sync("g", formed.leader, formed.generation, {formed.leader: b"L", f1: b"F1"})
    assert not leader.done and h.state() is GroupState.COMPLETING_REBALANCE

    h.store.complete_all()
    assert (leader.value.assignment, waiting.value.assignment) == (b"L", b"F1")
    assert h.state() is GroupState.STABLE
    # the member the leader left out gets an empty assignment, at once now the group is stable
    late = h.sync("g", f2, formed.generation)
    assert late.error == ErrorCode.NONE and late.value.assignment == b""

    record = collect_groups(h.store.groups_log)["g"].record
    assert isinstance(record, GroupRecord)
    assert record.generation_id == formed.generation and record.leader == formed.leader
    assert {m.member_id: m.assignment for m in record.members} == {
        formed.leader: b"L",
        f1: b"F1",
        f2: b"",
    }


def test_a_sync_in_a_stable_group_returns_the_current_assignment() -> None:
    h = Harness()
    formed = h.form_group("g", 2)
    again = h.sync("g", formed.followers[0], formed.generation)
    assert again.value.assignment == f"to-{formed.followers[0]}".encode()


def test_sync_refuses_unknown_groups_and_members() -> None:
    h = Harness()
    formed = h.form_group("g", 1)
    assert h.sync("other", formed.leader, 1).error == ErrorCode.UNKNOWN_MEMBER_ID
    assert h.sync("g", "ghost", formed.generation).error == ErrorCode.UNKNOWN_MEMBER_ID


def test_sync_with_a_wrong_generation_is_illegal() -> None:
    h = Harness()
    formed = h.form_group("g", 2)
    stale = h.sync("g", formed.followers[0], formed.generation - 1)
    assert stale.error == ErrorCode.ILLEGAL_GENERATION
    ahead = h.sync("g", formed.followers[0], formed.generation + 1)
    assert ahead.error == ErrorCode.ILLEGAL_GENERATION


def test_sync_during_preparing_rebalance_must_rejoin() -> None:
    h = Harness()
    formed = h.form_group("g", 2)
    h.join("g", formed.leader)
    reply = h.sync("g", formed.followers[0], formed.generation)
    assert reply.error == ErrorCode.REBALANCE_IN_PROGRESS


def test_a_leader_that_never_syncs_sends_the_followers_back_to_rejoin() -> None:
    h = Harness()
    formed = h.form_group("g", 3, sync=False)
    waiting = [h.sync("g", f, formed.generation) for f in formed.followers]
    for _ in range(REBALANCE_MS // 5_000 - 1):
        h.advance(5_000)
        for f in formed.followers:
            assert h.heartbeat("g", f, formed.generation).done
        h.heartbeat("g", formed.leader, formed.generation)  # alive, but never syncs
    assert not any(reply.done for reply in waiting)
    h.advance(5_000)
    assert [reply.error for reply in waiting] == [ErrorCode.REBALANCE_IN_PROGRESS] * 2
    assert h.state() is GroupState.PREPARING_REBALANCE
    assert not h.group("g").has(formed.leader)
    rejoins = [h.join("g", f) for f in formed.followers]
    assert rejoins[0].value.generation_id == formed.generation + 1
    assert rejoins[0].value.leader in formed.followers
    assert h.sync("g", formed.leader, formed.generation).error == ErrorCode.UNKNOWN_MEMBER_ID


def test_a_follower_that_never_syncs_is_removed_from_the_stable_group() -> None:
    h = Harness()
    formed = h.form_group("g", 2, sync=False)
    lazy = formed.followers[0]
    assert h.sync("g", formed.leader, formed.generation, {}).error == ErrorCode.NONE
    assert h.state() is GroupState.STABLE
    for _ in range(REBALANCE_MS // 5_000 - 1):
        h.advance(5_000)
        for m in formed.members:  # both heartbeat: only the missing sync counts against it
            assert h.heartbeat("g", m, formed.generation).error == ErrorCode.NONE
    h.advance(4_999)
    assert h.group("g").has(lazy)
    h.advance(1)
    assert not h.group("g").has(lazy)
    assert h.state() is GroupState.PREPARING_REBALANCE
    assert h.heartbeat("g", lazy, formed.generation).error == ErrorCode.UNKNOWN_MEMBER_ID


def test_once_everyone_synced_nobody_is_removed_for_it() -> None:
    h = Harness()
    formed = h.form_group("g", 2)
    for _ in range(2 * REBALANCE_MS // 5_000):
        h.advance(5_000)
        for m in formed.members:
            assert h.heartbeat("g", m, formed.generation).error == ErrorCode.NONE
    assert h.state() is GroupState.STABLE


@pytest.mark.parametrize(
    ("store_error", "members_see"),
    [
        (ErrorCode.NOT_LEADER, ErrorCode.NOT_COORDINATOR),
        (ErrorCode.UNKNOWN_LOG, ErrorCode.COORDINATOR_NOT_AVAILABLE),
        (ErrorCode.REQUEST_TIMED_OUT, ErrorCode.REBALANCE_IN_PROGRESS),
        (ErrorCode.FRAME_TOO_LARGE, ErrorCode.UNKNOWN_SERVER_ERROR),
    ],
)
def test_a_store_error_during_the_leaders_sync_sends_the_group_back_to_rebalancing(
    store_error: ErrorCode, members_see: ErrorCode
) -> None:
    h = Harness(deferred=True)
    formed = h.form_group("g", 2, sync=False)
    follower = h.sync("g", formed.followers[0], formed.generation)
    leader = h.sync("g", formed.leader, formed.generation, {formed.leader: b"x"})
    h.store.complete_next(store_error)
    assert leader.error == members_see and follower.error == members_see
    assert leader.value.assignment == b""
    assert h.state() is GroupState.PREPARING_REBALANCE
    assert h.store.groups_log == []
    rejoined = [h.join("g", m) for m in formed.members]
    assert rejoined[0].value.generation_id == formed.generation + 1


def test_a_store_that_answers_at_once_makes_the_group_stable_within_the_call() -> None:
    h = Harness(deferred=False)
    formed = h.form_group("g", 1, sync=False)
    reply = h.sync("g", formed.leader, formed.generation, {formed.leader: b"a"})
    assert reply.value.assignment == b"a"
    assert h.state() is GroupState.STABLE


def test_a_write_completing_after_the_group_moved_on_changes_nothing() -> None:
    h = Harness(deferred=True)
    formed = h.form_group("g", 2, sync=False)
    leader = h.sync("g", formed.leader, formed.generation, {})
    h.join("g", formed.followers[0], protocols=(("range", b"changed"),))
    assert leader.error == ErrorCode.REBALANCE_IN_PROGRESS
    h.store.complete_all()
    assert h.state() is GroupState.PREPARING_REBALANCE
    assert len(leader.responses) == 1


def test_a_superseded_sync_is_answered_rebalance_in_progress() -> None:
    h = Harness(deferred=True)
    formed = h.form_group("g", 2, sync=False)
    first = h.sync("g", formed.followers[0], formed.generation)
    second = h.sync("g", formed.followers[0], formed.generation)
    assert first.error == ErrorCode.REBALANCE_IN_PROGRESS and not second.done
    h.sync("g", formed.leader, formed.generation, {formed.followers[0]: b"f"})
    h.store.complete_all()
    assert second.value.assignment == b"f"


def test_sync_checks_and_returns_the_protocol_type_and_name() -> None:
    """KIP-559: a member says which protocol it synced for; a mismatch is refused."""
    h = Harness()
    formed = h.form_group("g", 2, sync=False)
    join = h.join("g", formed.followers[0])
    assert (join.value.protocol_type, join.value.protocol_name) == ("consumer", "range")
    gen, leader, follower = formed.generation, formed.leader, formed.followers[0]
    wrong_type = h.sync("g", follower, gen, protocol_type="connect")
    wrong_name = h.sync("g", follower, gen, protocol_type="consumer", protocol_name="sticky")
    assert wrong_type.error == wrong_name.error == ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    parked = h.sync("g", follower, gen, protocol_type="consumer", protocol_name="range")
    h.sync("g", leader, gen, {leader: b"a", follower: b"b"})
    for reply in (parked, h.sync("g", leader, gen)):
        assert reply.error == ErrorCode.NONE
        assert (reply.value.protocol_type, reply.value.protocol_name) == ("consumer", "range")
    # older members say nothing about it and are served as before
    assert h.sync("g", follower, gen).value.assignment == b"b"
