"""Heartbeat, session expiry and LeaveGroup."""

from __future__ import annotations

import msgspec
import pytest

from herder.coordinator import GroupState
from herder.coordinator.messages import LeaveGroupResponse
from herder.errors import ErrorCode

from .support import SESSION_MS, Harness

pytestmark = pytest.mark.unit


def test_heartbeats_keep_a_member_alive_past_its_session_timeout() -> None:
    h = Harness()
    formed = h.form_group("g", 1)
    for _ in range(10):
        h.advance(SESSION_MS - 1)
        assert h.heartbeat("g", formed.leader, formed.generation).error == ErrorCode.NONE
    assert h.state() is GroupState.STABLE


def test_a_silent_member_expires_and_the_group_rebalances_without_it() -> None:
    h = Harness()
    formed = h.form_group("g", 2)
    survivor, silent = formed.members
    for _ in range(2):
        h.advance(SESSION_MS // 2)
        h.heartbeat("g", survivor, formed.generation)
    assert h.state() is GroupState.PREPARING_REBALANCE
    assert h.heartbeat("g", silent, formed.generation).error == ErrorCode.UNKNOWN_MEMBER_ID
    assert h.heartbeat("g", survivor, formed.generation).error == ErrorCode.REBALANCE_IN_PROGRESS
    rejoin = h.join("g", survivor)
    assert rejoin.value.generation_id == formed.generation + 1
    assert [m.member_id for m in rejoin.value.members] == [survivor]


def test_the_last_member_expiring_leaves_an_empty_group_stored() -> None:
    h = Harness()
    formed = h.form_group("g", 1)
    h.advance(SESSION_MS)
    group = h.coordinator.group("g")
    assert group is not None and group.state is GroupState.EMPTY
    assert group.generation_id == formed.generation + 1
    assert h.heartbeat("g", formed.leader, formed.generation).error == ErrorCode.UNKNOWN_MEMBER_ID


def test_session_expiry_during_a_rebalance_completes_it_early() -> None:
    h = Harness()
    formed = h.form_group("g", 3)
    leader_join = h.join("g", formed.leader)
    h.join("g", formed.followers[0])
    # the third member neither rejoins nor heartbeats: its session ends long before the
    # rebalance timeout, and the rebalance completes then
    h.advance(SESSION_MS - 1)
    assert not leader_join.done
    h.advance(1)
    assert leader_join.value.generation_id == formed.generation + 1
    assert {m.member_id for m in leader_join.value.members} == set(formed.members[:2])


def test_heartbeats_during_preparing_rebalance_extend_the_session() -> None:
    h = Harness()
    formed = h.form_group("g", 2)
    h.join("g", formed.leader)
    follower = formed.followers[0]
    for _ in range(3):
        h.advance(SESSION_MS - 1)
        reply = h.heartbeat("g", follower, formed.generation)
        assert reply.error == ErrorCode.REBALANCE_IN_PROGRESS
    assert h.group("g").has(follower)


def test_heartbeat_while_completing_rebalance_is_fine_and_keeps_alive() -> None:
    h = Harness()
    formed = h.form_group("g", 2, sync=False)
    follower = formed.followers[0]
    for _ in range(2):
        h.advance(SESSION_MS - 1)
        h.heartbeat("g", formed.leader, formed.generation)
        assert h.heartbeat("g", follower, formed.generation).error == ErrorCode.NONE
    assert h.state() is GroupState.COMPLETING_REBALANCE
    assert h.group("g").has(follower)


def test_heartbeat_while_completing_rebalance_checks_member_and_generation() -> None:
    h = Harness()
    formed = h.form_group("g", 2, sync=False)
    stale = formed.followers[0]
    assert h.heartbeat("g", "ghost", formed.generation).error == ErrorCode.UNKNOWN_MEMBER_ID
    for _ in range(2):
        h.advance(SESSION_MS // 2 - 1)
        h.heartbeat("g", formed.leader, formed.generation)
        assert h.heartbeat("g", stale, formed.generation - 1).error == (
            ErrorCode.ILLEGAL_GENERATION
        )
    # a heartbeat for another generation is no sign of life: the session ends on time
    assert h.group("g").has(stale)
    h.advance(2)
    assert not h.group("g").has(stale)
    assert h.state() is GroupState.PREPARING_REBALANCE


def test_heartbeat_with_a_wrong_generation_is_illegal() -> None:
    h = Harness()
    formed = h.form_group("g", 1)
    assert h.heartbeat("g", formed.leader, formed.generation + 1).error == (
        ErrorCode.ILLEGAL_GENERATION
    )
    rejoin = h.join("g", formed.leader)  # the leader alone: the rebalance completes
    next_generation = rejoin.value.generation_id
    assert h.sync("g", formed.leader, next_generation, {}).error == ErrorCode.NONE
    assert h.heartbeat("g", formed.leader, formed.generation).error == (
        ErrorCode.ILLEGAL_GENERATION
    )
    assert h.heartbeat("g", formed.leader, next_generation).error == ErrorCode.NONE


def test_heartbeats_from_strangers_are_refused() -> None:
    h = Harness()
    assert h.heartbeat("nowhere", "m", 0).error == ErrorCode.UNKNOWN_MEMBER_ID
    h.new_member_id("g")  # an Empty group with a pending id
    assert h.heartbeat("g", "m", 0).error == ErrorCode.UNKNOWN_MEMBER_ID
    formed = h.form_group("s", 1)
    assert h.heartbeat("s", "m", formed.generation).error == ErrorCode.UNKNOWN_MEMBER_ID


def test_a_commit_counts_as_a_sign_of_life() -> None:
    h = Harness()
    formed = h.form_group("g", 1)
    for _ in range(3):
        h.advance(SESSION_MS - 1)
        reply = h.commit("g", {("t", 0): 1}, member_id=formed.leader, generation=formed.generation)
        assert reply.error == ErrorCode.NONE
    assert h.state() is GroupState.STABLE


def test_a_leaving_member_is_removed_and_the_group_rebalances() -> None:
    h = Harness()
    formed = h.form_group("g", 2)
    leaving = formed.followers[0]
    reply = h.leave("g", leaving)
    assert reply.error == ErrorCode.NONE
    assert [(m.member_id, m.error_code) for m in reply.value.members] == [(leaving, ErrorCode.NONE)]
    assert h.state() is GroupState.PREPARING_REBALANCE
    assert h.sync("g", leaving, formed.generation).error == ErrorCode.UNKNOWN_MEMBER_ID
    assert h.join("g", formed.leader).value.generation_id == formed.generation + 1


def test_a_member_leaving_while_awaiting_its_join_gets_an_answer() -> None:
    h = Harness()
    formed = h.form_group("g", 2)
    parked = h.join("g", formed.leader)
    h.leave("g", formed.leader)
    assert parked.error == ErrorCode.UNKNOWN_MEMBER_ID
    # the follower is the only one left and still has to rejoin
    assert h.join("g", formed.followers[0]).value.leader == formed.followers[0]


def test_leaving_during_a_rebalance_completes_it_when_the_rest_have_joined() -> None:
    h = Harness()
    formed = h.form_group("g", 2)
    parked = h.join("g", formed.leader)
    h.leave("g", formed.followers[0])
    assert parked.value.generation_id == formed.generation + 1


def test_leave_refuses_strangers_one_by_one_and_lets_the_others_leave() -> None:
    h = Harness()
    formed = h.form_group("g", 2)
    reply = h.leave("g", "ghost", formed.leader)
    assert reply.error == ErrorCode.NONE
    assert [(m.member_id, m.error_code) for m in reply.value.members] == [
        ("ghost", ErrorCode.UNKNOWN_MEMBER_ID),
        (formed.leader, ErrorCode.NONE),
    ]
    assert reply.value.member_error("ghost") == ErrorCode.UNKNOWN_MEMBER_ID
    assert reply.value.member_error(formed.leader) == ErrorCode.NONE
    assert h.group("g").member_ids == formed.followers
    nowhere = h.leave("nowhere", "m")
    assert nowhere.error == ErrorCode.NONE
    assert nowhere.value.members[0].error_code == ErrorCode.UNKNOWN_MEMBER_ID


def test_leave_reports_a_request_that_failed_as_a_whole_at_the_top() -> None:
    h = Harness()
    invalid = h.leave("", "m").value
    assert invalid.error_code == ErrorCode.INVALID_GROUP_ID
    assert invalid.member_error("m") == ErrorCode.INVALID_GROUP_ID
    h.coordinator.unload_all()
    refused = h.leave("g", "m").value
    assert refused.error_code == ErrorCode.NOT_COORDINATOR


def test_a_leave_response_without_member_results_still_decodes() -> None:
    old = msgspec.msgpack.encode({"error_code": int(ErrorCode.NOT_COORDINATOR)})
    response = msgspec.msgpack.decode(old, type=LeaveGroupResponse)
    assert response.members == []
    assert response.member_error("m") == ErrorCode.NOT_COORDINATOR


def test_a_pending_member_may_leave_before_it_joins() -> None:
    h = Harness()
    a = h.new_member_id("g", client_id="a")
    b = h.new_member_id("g", client_id="b")
    join = h.join("g", a, client_id="a")
    assert not join.done
    assert h.leave("g", b).error == ErrorCode.NONE
    assert join.value.generation_id == 1
    assert h.join("g", b).error == ErrorCode.UNKNOWN_MEMBER_ID
