"""JoinGroup: member ids, validation, rebalances and the delayed join."""

from __future__ import annotations

import pytest

from herder.coordinator import CoordinatorConfig, GroupState, collect_groups
from herder.coordinator.messages import JoinGroupResponse
from herder.errors import ErrorCode

from .support import REBALANCE_MS, SESSION_MS, Harness, Reply

pytestmark = pytest.mark.unit


def test_a_first_join_gets_member_id_required_with_a_fresh_id() -> None:
    h = Harness()
    reply = h.join("g", client_id="worker")
    assert reply.error == ErrorCode.MEMBER_ID_REQUIRED
    member_id = reply.value.member_id
    assert member_id.startswith("worker-") and len(member_id) == len("worker-") + 36
    assert reply.value.generation_id == -1
    group = h.coordinator.group("g")
    assert group is not None and group.state is GroupState.EMPTY
    assert member_id in group.pending_members and not group.has(member_id)


def test_member_ids_come_from_the_injected_random_source() -> None:
    first = Harness(seed=7).new_member_id("g")
    assert Harness(seed=7).new_member_id("g") == first
    assert Harness(seed=8).new_member_id("g") != first


def test_rejoining_with_the_id_joins_and_the_sole_member_leads() -> None:
    h = Harness()
    member_id = h.new_member_id("g")
    reply = h.join("g", member_id)
    response = reply.value
    assert response.error_code == ErrorCode.NONE
    assert (response.generation_id, response.leader, response.protocol_name) == (
        1,
        member_id,
        "range",
    )
    assert [(m.member_id, m.metadata) for m in response.members] == [(member_id, b"range-meta")]
    assert h.state("g") is GroupState.COMPLETING_REBALANCE


def test_an_unused_member_id_expires_at_its_session_timeout() -> None:
    h = Harness()
    member_id = h.new_member_id("g", session_ms=8_000)
    h.advance(7_999)
    assert member_id in h.group("g").pending_members
    h.advance(1)
    assert h.join("g", member_id).error == ErrorCode.UNKNOWN_MEMBER_ID


@pytest.mark.parametrize("session_ms", [5_999, 1_800_001])
def test_session_timeouts_outside_the_bounds_are_refused(session_ms: int) -> None:
    h = Harness()
    assert h.join("g", session_ms=session_ms).error == ErrorCode.INVALID_SESSION_TIMEOUT
    assert h.coordinator.group("g") is None


def test_an_unknown_member_id_is_refused_for_a_missing_and_an_existing_group() -> None:
    h = Harness()
    assert h.join("nowhere", "ghost").error == ErrorCode.UNKNOWN_MEMBER_ID
    assert h.coordinator.group("nowhere") is None
    h.form_group("g", 1)
    assert h.join("g", "ghost").error == ErrorCode.UNKNOWN_MEMBER_ID


def test_an_empty_group_id_is_invalid() -> None:
    assert Harness().join("").error == ErrorCode.INVALID_GROUP_ID


@pytest.mark.parametrize(
    ("protocol_type", "protocols"),
    [("connect", (("range", b""),)), ("consumer", (("roundrobin", b""),))],
    ids=["other-type", "no-common-protocol"],
)
def test_inconsistent_protocol_type_or_protocols_are_refused(
    protocol_type: str, protocols: tuple[tuple[str, bytes], ...]
) -> None:
    h = Harness()
    formed = h.form_group("g", 1)
    newcomer = h.join("g", protocol_type=protocol_type, protocols=protocols)
    assert newcomer.error == ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    rejoin = h.join("g", formed.leader, protocol_type=protocol_type, protocols=protocols)
    assert rejoin.error == ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    assert h.state("g") is GroupState.STABLE


def test_a_first_member_without_protocols_is_refused_and_leaves_no_group() -> None:
    h = Harness()
    assert h.join("g", protocols=()).error == ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    assert h.coordinator.group("g") is None
    assert h.list_groups().value.groups == []


def test_five_members_with_group_max_size_four() -> None:
    h = Harness(CoordinatorConfig(group_max_size=4))
    ids = [h.new_member_id("g", client_id=f"c{i}") for i in range(4)]
    fifth = h.join("g", client_id="c4")
    assert fifth.error == ErrorCode.GROUP_MAX_SIZE_REACHED
    assert fifth.value.member_id == ""
    replies = [h.join("g", member_id) for member_id in ids]
    assert [r.error for r in replies] == [ErrorCode.NONE] * 4
    assert h.join("g", client_id="c4").error == ErrorCode.GROUP_MAX_SIZE_REACHED
    assert len(h.group("g").members) == 4


def test_the_join_waits_for_every_known_member_and_only_the_leader_sees_members() -> None:
    h = Harness()
    formed = h.form_group("g", 3)
    leader, *followers = formed.members
    assert formed.leader == leader

    # the leader rejoining forces a rebalance; it completes once all have rejoined
    leader_join = h.join("g", leader)
    assert not leader_join.done
    assert h.state("g") is GroupState.PREPARING_REBALANCE
    first = h.join("g", followers[0])
    assert not first.done
    second = h.join("g", followers[1])
    assert leader_join.done and first.done and second.done
    assert {r.value.generation_id for r in (leader_join, first, second)} == {2}
    assert len(leader_join.value.members) == 3
    assert first.value.members == [] and second.value.members == []
    assert first.value.leader == leader


def test_an_unchanged_follower_rejoining_a_stable_group_does_not_rebalance() -> None:
    h = Harness()
    formed = h.form_group("g", 2)
    reply = h.join("g", formed.followers[0])
    assert reply.error == ErrorCode.NONE
    assert (reply.value.generation_id, reply.value.members) == (formed.generation, [])
    assert h.state("g") is GroupState.STABLE


def test_a_follower_with_new_metadata_forces_a_rebalance() -> None:
    h = Harness()
    formed = h.form_group("g", 2)
    reply = h.join("g", formed.followers[0], protocols=(("range", b"new"),))
    assert not reply.done
    assert h.state("g") is GroupState.PREPARING_REBALANCE


def test_a_member_resending_its_join_while_awaiting_sync_gets_the_same_answer() -> None:
    h = Harness()
    formed = h.form_group("g", 2, sync=False)
    again = h.join("g", formed.leader)
    assert again.value.generation_id == formed.generation
    assert len(again.value.members) == 2
    assert h.state("g") is GroupState.COMPLETING_REBALANCE


def test_a_superseded_join_is_answered_rebalance_in_progress() -> None:
    h = Harness()
    formed = h.form_group("g", 2)
    first = h.join("g", formed.leader)
    second = h.join("g", formed.leader)
    assert first.error == ErrorCode.REBALANCE_IN_PROGRESS
    assert not second.done
    h.join("g", formed.followers[0])
    assert second.error == ErrorCode.NONE and len(first.responses) == 1


def test_members_that_do_not_rejoin_within_the_rebalance_timeout_are_removed() -> None:
    h = Harness()
    formed = h.form_group("g", 3, session_ms=60_000, rebalance_ms=20_000)
    silent = formed.followers[1]
    leader_join = h.join("g", formed.leader, session_ms=60_000, rebalance_ms=20_000)
    follower_join = h.join("g", formed.followers[0], session_ms=60_000, rebalance_ms=20_000)
    h.advance(10_000)
    assert h.heartbeat("g", silent, formed.generation).error == ErrorCode.REBALANCE_IN_PROGRESS
    h.advance(9_999)
    assert not leader_join.done
    h.advance(1)
    assert leader_join.value.generation_id == formed.generation + 1
    assert {m.member_id for m in leader_join.value.members} == set(formed.members) - {silent}
    assert follower_join.error == ErrorCode.NONE
    assert h.heartbeat("g", silent, formed.generation).error == ErrorCode.UNKNOWN_MEMBER_ID


def test_the_leader_not_rejoining_hands_leadership_to_one_that_did() -> None:
    h = Harness()
    formed = h.form_group("g", 2, session_ms=60_000)
    follower = formed.followers[0]
    reply = h.join("g", follower, protocols=(("range", b"changed"),), session_ms=60_000)
    h.advance(REBALANCE_MS)
    assert reply.value.leader == follower
    assert [m.member_id for m in reply.value.members] == [follower]


def test_a_new_member_of_a_stable_group_triggers_a_rebalance() -> None:
    h = Harness()
    formed = h.form_group("g", 2)
    newcomer = h.new_member_id("g", client_id="late")
    assert h.state("g") is GroupState.STABLE
    join = h.join("g", newcomer, client_id="late")
    assert h.state("g") is GroupState.PREPARING_REBALANCE
    rejoins = [h.join("g", m) for m in formed.members]
    assert join.value.generation_id == formed.generation + 1
    assert all(r.error == ErrorCode.NONE for r in rejoins)


def test_a_join_while_awaiting_sync_sends_the_waiting_syncs_back_to_rejoin() -> None:
    h = Harness()
    formed = h.form_group("g", 2, sync=False)
    waiting = h.sync("g", formed.followers[0], formed.generation)
    assert not waiting.done
    h.join("g", h.new_member_id("g", client_id="late"), client_id="late")
    assert waiting.error == ErrorCode.REBALANCE_IN_PROGRESS
    assert waiting.value.assignment == b""


def test_the_initial_rebalance_delay_waits_for_more_members() -> None:
    h = Harness(CoordinatorConfig(group_initial_rebalance_delay_ms=3_000))
    first_id = h.new_member_id("g", client_id="a")
    first = h.join("g", first_id, client_id="a")
    h.advance(2_000)
    assert not first.done
    second = h.join("g", h.new_member_id("g", client_id="b"), client_id="b")
    h.advance(1_000)  # a member arrived during the delay: it is extended once more
    assert not first.done
    h.advance(3_000)
    assert first.value.generation_id == 1 and len(first.value.members) == 2
    assert second.value.generation_id == 1


def test_the_initial_rebalance_delay_applies_to_every_empty_group_as_in_kafka() -> None:
    h = Harness(CoordinatorConfig(group_initial_rebalance_delay_ms=3_000))
    first = h.join("g", h.new_member_id("g", client_id="a"), client_id="a")
    h.advance(3_000)
    member = first.value.member_id
    assert first.value.generation_id == 1
    h.leave("g", member)
    assert h.state() is GroupState.EMPTY and h.group().generation_id == 2
    again = h.join("g", h.new_member_id("g", client_id="b"), client_id="b")
    h.advance(2_999)
    assert not again.done
    h.advance(1)
    assert again.value.generation_id == 3


def test_without_an_initial_delay_the_first_member_forms_a_generation_alone() -> None:
    h = Harness()
    reply = h.join("g", h.new_member_id("g"))
    assert reply.value.generation_id == 1


def test_a_rebalance_waits_for_issued_ids_until_they_expire() -> None:
    h = Harness()
    a = h.new_member_id("g", client_id="a")
    h.new_member_id("g", client_id="b", session_ms=7_000)
    join = h.join("g", a, client_id="a")
    assert not join.done
    h.advance(7_000)
    assert join.value.generation_id == 1 and len(join.value.members) == 1


def test_a_rebalance_timeout_beyond_the_session_keeps_a_rejoined_member() -> None:
    h = Harness()
    formed = h.form_group("g", 2, session_ms=SESSION_MS, rebalance_ms=REBALANCE_MS)
    leader_join = h.join("g", formed.leader)
    # the follower heartbeats but never rejoins; the leader awaits its join for longer
    # than its session timeout without heartbeating, and is not expired for that
    for _ in range(5):
        h.advance(SESSION_MS // 2)
        assert h.heartbeat("g", formed.followers[0], formed.generation).done
    assert not leader_join.done
    h.advance(REBALANCE_MS - 5 * (SESSION_MS // 2))
    assert leader_join.value.generation_id == formed.generation + 1
    assert [m.member_id for m in leader_join.value.members] == [formed.leader]


def test_a_client_may_rejoin_from_inside_its_response_callback() -> None:
    """Responses are delivered after the state change, so calling back in is safe."""
    h = Harness()
    answers: list[JoinGroupResponse] = []

    def rejoin(response: JoinGroupResponse) -> None:
        answers.append(response)
        if response.error_code == ErrorCode.MEMBER_ID_REQUIRED:
            h.join("g", response.member_id, reply=Reply(rejoin))

    h.join("g", reply=Reply(rejoin))
    assert [ErrorCode(a.error_code) for a in answers] == [
        ErrorCode.MEMBER_ID_REQUIRED,
        ErrorCode.NONE,
    ]
    assert answers[1].leader == answers[0].member_id


def test_an_unknown_request_type_is_a_programming_error() -> None:
    with pytest.raises(TypeError, match="not a group coordinator request"):
        Harness().coordinator.handle(object(), 0, lambda response: None)  # type: ignore[arg-type]


def test_a_member_changing_its_protocols_changes_what_the_group_accepts() -> None:
    h = Harness()
    both = (("range", b"r"), ("sticky", b"s"))
    formed = h.form_group("g", 2, protocols=both)
    follower = h.join("g", formed.followers[0], protocols=(("sticky", b"s2"),))
    leader = h.join("g", formed.leader, protocols=both)
    assert follower.value.protocol_name == "sticky" and leader.value.protocol_name == "sticky"
    assert h.join("g", protocols=(("range", b""),)).error == ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    assert h.join("g", protocols=(("sticky", b""),)).error == ErrorCode.MEMBER_ID_REQUIRED


def test_ten_thousand_members_share_one_timer_queue() -> None:
    """Every member has a session deadline, and they all live in one heap."""
    h = Harness()
    formed = h.form_group("big", 10_000, session_ms=60_000)
    assert len(h.group("big").members) == 10_000
    assert h.state("big") is GroupState.STABLE
    # a session timer per member, and the offset expiry
    assert len(h.coordinator._ctx.timers) == 10_000 + 1
    h.advance(59_999)
    assert len(h.group("big").members) == 10_000
    h.advance(1)
    assert h.state("big") is GroupState.EMPTY
    assert h.group("big").generation_id == formed.generation + 1


# -- the new-member join timeout (KIP-394) ---------------------------------------------


def test_a_new_member_waiting_in_a_long_rebalance_is_dropped_at_the_new_member_timeout() -> None:
    h = Harness(CoordinatorConfig(group_new_member_join_timeout_ms=60_000))
    long_rebalance = 600_000
    formed = h.form_group("g", 1, rebalance_ms=long_rebalance)
    newcomer_id = h.new_member_id("g", client_id="new", rebalance_ms=long_rebalance)
    newcomer = h.join("g", newcomer_id, client_id="new", rebalance_ms=long_rebalance)
    assert h.state("g") is GroupState.PREPARING_REBALANCE
    # the old member keeps its session with heartbeats but does not rejoin yet
    for _ in range(6):
        h.advance(SESSION_MS - 1)
        h.heartbeat("g", formed.leader, formed.generation)
    assert not newcomer.done
    h.advance(60_000 - 6 * (SESSION_MS - 1))
    assert newcomer.error == ErrorCode.UNKNOWN_MEMBER_ID
    assert not h.group("g").has(newcomer_id)
    rejoin = h.join("g", formed.leader, rebalance_ms=long_rebalance)
    assert rejoin.error == ErrorCode.NONE
    assert [m.member_id for m in rejoin.value.members] == [formed.leader]


def test_a_member_already_in_a_generation_waits_out_the_rebalance_whatever_its_session() -> None:
    h = Harness(CoordinatorConfig(group_new_member_join_timeout_ms=60_000))
    long_rebalance = 600_000
    formed = h.form_group("g", 2, rebalance_ms=long_rebalance)
    parked = h.join("g", formed.leader, rebalance_ms=long_rebalance)
    # its join is parked far beyond its session; the follower heartbeats, never rejoins
    waited = 0
    while waited + SESSION_MS < long_rebalance:
        h.advance(SESSION_MS - 1)
        waited += SESSION_MS - 1
        h.heartbeat("g", formed.followers[0], formed.generation)
    assert not parked.done and h.group("g").has(formed.leader)
    h.advance(long_rebalance - waited)
    assert parked.error == ErrorCode.NONE
    assert [m.member_id for m in parked.value.members] == [formed.leader]


def test_a_new_member_that_makes_it_into_a_generation_has_a_session_from_then_on() -> None:
    h = Harness(CoordinatorConfig(group_new_member_join_timeout_ms=60_000))
    formed = h.form_group("g", 1)
    assert not h.group("g").get(formed.leader).is_new
    h.advance(SESSION_MS - 1)
    assert h.heartbeat("g", formed.leader, formed.generation).error == ErrorCode.NONE
    h.advance(SESSION_MS)
    assert not h.group("g").has(formed.leader)


def test_the_new_member_timeout_is_a_coordinator_setting() -> None:
    config = CoordinatorConfig.from_properties({"group.new.member.join.timeout.ms": "1234"})
    assert config.group_new_member_join_timeout_ms == 1234
    assert CoordinatorConfig().group_new_member_join_timeout_ms == 300_000


# -- group.max.size on rejoins ----------------------------------------------------------


def test_a_rebalance_over_capacity_refuses_and_removes_the_last_joiners() -> None:
    h = Harness(CoordinatorConfig(group_max_size=3))
    formed = h.form_group("g", 3)
    stored = collect_groups(h.store.groups_log)["g"]
    # a coordinator whose limit went down to two loads the group of three
    smaller = Harness(CoordinatorConfig(group_max_size=2))
    smaller.coordinator.unload_all()
    smaller.coordinator.begin_loading(smaller.now)
    smaller.coordinator.load_group("g", stored.record, stored.offsets, smaller.now)
    smaller.coordinator.finish_loading(smaller.now)
    assert smaller.state("g") is GroupState.PREPARING_REBALANCE
    first, second, third = formed.members
    assert smaller.heartbeat("g", third, formed.generation).error == (
        ErrorCode.REBALANCE_IN_PROGRESS
    )
    replies = [smaller.join("g", member) for member in (third, first, second)]
    assert replies[2].error == ErrorCode.GROUP_MAX_SIZE_REACHED
    assert replies[2].value.member_id == ""
    assert replies[0].error == replies[1].error == ErrorCode.NONE
    assert sorted(m.member_id for m in (replies[0].value.members or replies[1].value.members)) == (
        sorted([third, first])
    )
    assert not smaller.group("g").has(second)
    assert smaller.heartbeat("g", second, formed.generation).error == ErrorCode.UNKNOWN_MEMBER_ID


def test_a_full_stable_group_takes_back_its_own_members_but_no_one_else() -> None:
    h = Harness(CoordinatorConfig(group_max_size=2))
    formed = h.form_group("g", 2)
    follower = formed.followers[0]
    assert h.join("g", follower).error == ErrorCode.NONE
    assert h.join("g", client_id="third").error == ErrorCode.GROUP_MAX_SIZE_REACHED
    assert h.state("g") is GroupState.STABLE
