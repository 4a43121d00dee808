"""Static membership (KIP-345), as Kafka's GroupCoordinator has it today.

A member with a ``group.instance.id`` joins without a MEMBER_ID_REQUIRED round; when
its process restarts it rejoins with the instance id and no member id, takes its
member over under a new member id, and (in a Stable group whose protocol it does not
change) gets its assignment back without a rebalance. The old member id is fenced
from then on.
"""

from __future__ import annotations

from typing import Any

import pytest

from herder.coordinator import CoordinatorConfig, GroupState
from herder.coordinator.messages import JoinGroupResponse
from herder.coordinator.records import GroupRecord, decode_groups_value
from herder.errors import ErrorCode

from .support import REBALANCE_MS, SESSION_MS, FormedGroup, Harness, Reply, loaded_copy

pytestmark = pytest.mark.unit

DELAY_MS = 100
INSTANCES = ["alpha", "beta", "gamma"]
LONG_SESSION_MS = 60_000


def static_harness(**config: int) -> Harness:
    return Harness(CoordinatorConfig(group_initial_rebalance_delay_ms=DELAY_MS, **config))


def formed_static(h: Harness, instances: list[str] = INSTANCES) -> FormedGroup:
    return h.form_static_group("g", instances)


def restart(h: Harness, instance: str, **kwargs: Any) -> Reply[JoinGroupResponse]:
    """What a restarted process sends: its instance id, no member id."""
    return h.join("g", client_id=instance, instance_id=instance, **kwargs)


def last_group_record(h: Harness) -> GroupRecord:
    records = [decode_groups_value(v) for _, v in h.store.groups_log if v is not None]
    return [r for r in records if isinstance(r, GroupRecord)][-1]


def test_a_static_member_joins_without_a_member_id_round_trip() -> None:
    h = Harness()
    reply = h.join("g", client_id="c", instance_id="alpha")
    assert reply.error == ErrorCode.NONE
    assert reply.value.member_id.startswith("alpha-")
    assert reply.value.leader == reply.value.member_id
    assert [(m.member_id, m.group_instance_id) for m in reply.value.members] == [
        (reply.value.member_id, "alpha")
    ]
    assert h.group().pending_members == {}


def test_a_restarted_static_follower_gets_its_assignment_back_without_a_rebalance() -> None:
    h = static_harness()
    formed = formed_static(h)
    old = formed.members[1]
    writes = h.store.writes
    rejoin = restart(h, "beta")
    response = rejoin.value
    assert response.error_code == ErrorCode.NONE
    new = response.member_id
    assert new != old and new.startswith("beta-")
    assert response.generation_id == formed.generation
    assert (response.leader, response.members, response.skip_assignment) == (
        formed.leader,
        [],
        False,
    )
    assert (response.protocol_type, response.protocol_name) == ("consumer", "range")
    # the group did not rebalance: same generation, still Stable; the new id is stored
    assert h.state() is GroupState.STABLE and h.group().generation_id == formed.generation
    assert h.store.writes == writes + 1
    stored = last_group_record(h)
    assert [(m.member_id, m.group_instance_id) for m in stored.members] == [
        (formed.members[0], "alpha"),
        (new, "beta"),
        (formed.members[2], "gamma"),
    ]
    sync = h.sync("g", new, formed.generation, instance_id="beta")
    assert sync.error == ErrorCode.NONE and sync.value.assignment == f"to-{old}".encode()
    # the others were never asked to rejoin
    for member in (formed.members[0], formed.members[2]):
        assert h.heartbeat("g", member, formed.generation).error == ErrorCode.NONE


def test_the_old_member_id_of_a_restarted_static_member_is_fenced_on_every_api() -> None:
    h = static_harness()
    formed = formed_static(h)
    old = formed.members[1]
    new = restart(h, "beta").value.member_id
    gen = formed.generation
    fenced = ErrorCode.FENCED_INSTANCE_ID
    assert h.heartbeat("g", old, gen, instance_id="beta").error == fenced
    assert h.sync("g", old, gen, instance_id="beta").error == fenced
    assert h.join("g", old, instance_id="beta").error == fenced
    commit = h.commit("g", {("t", 0): 1}, member_id=old, generation=gen, instance_id="beta")
    assert commit.error == fenced
    leave = h.leave_members("g", (old, "beta"))
    assert leave.error == ErrorCode.NONE and leave.value.member_error(old, "beta") == fenced
    # the old id without its instance id is simply not a member any more
    assert h.heartbeat("g", old, gen).error == ErrorCode.UNKNOWN_MEMBER_ID
    # and none of that moved the group or the new member
    assert h.state() is GroupState.STABLE and h.group().has(new)
    assert h.heartbeat("g", new, gen, instance_id="beta").error == ErrorCode.NONE


def test_a_restarted_static_leader_leads_but_keeps_the_assignment() -> None:
    h = static_harness()
    formed = formed_static(h)
    response = restart(h, "alpha").value
    new = response.member_id
    assert response.leader == new == h.group().leader_id
    assert response.skip_assignment
    assert [m.group_instance_id for m in response.members] == INSTANCES
    # an assignment it sends anyway does not replace the one that stands
    sync = h.sync("g", new, formed.generation, {new: b"other"})
    assert sync.value.assignment == f"to-{formed.members[0]}".encode()
    assert h.state() is GroupState.STABLE


def test_new_metadata_under_the_same_protocol_is_stored_without_a_rebalance() -> None:
    h = static_harness()
    formed = formed_static(h)
    new = restart(h, "gamma", protocols=(("range", b"moved"),)).value.member_id
    assert h.state() is GroupState.STABLE and h.group().generation_id == formed.generation
    assert h.group().get(new).metadata("range") == b"moved"
    assert last_group_record(h).members[2].metadata == b"moved"


def test_a_restart_that_changes_the_groups_protocol_rebalances() -> None:
    h = static_harness()
    both = (("range", b""), ("roundrobin", b""))
    formed = h.form_static_group("g", ["alpha", "beta"], protocols=both)
    assert h.group().protocol == "range"
    # alpha (first in the group) now prefers roundrobin: the vote would change the protocol
    rejoin = restart(h, "alpha", protocols=(("roundrobin", b""), ("range", b"")))
    assert not rejoin.done
    assert h.state() is GroupState.PREPARING_REBALANCE
    assert h.heartbeat("g", formed.members[1], formed.generation).error == (
        ErrorCode.REBALANCE_IN_PROGRESS
    )
    h.join("g", formed.members[1], instance_id="beta", protocols=both)
    assert rejoin.value.generation_id == formed.generation + 1
    assert rejoin.value.protocol_name == "roundrobin"


def test_a_restart_during_completing_rebalance_starts_another_and_fences_the_old_sync() -> None:
    h = static_harness()
    formed = formed_static(h, ["alpha", "beta"])
    # the leader rejoins: a new generation, and beta waits in SyncGroup for it
    leader_join = h.join("g", formed.leader, instance_id="alpha")
    beta_join = h.join("g", formed.members[1], instance_id="beta")
    gen = beta_join.value.generation_id
    assert leader_join.done and h.state() is GroupState.COMPLETING_REBALANCE
    parked_sync = h.sync("g", formed.members[1], gen, instance_id="beta")
    assert not parked_sync.done
    rejoin = restart(h, "beta")
    assert parked_sync.error == ErrorCode.FENCED_INSTANCE_ID
    assert h.state() is GroupState.PREPARING_REBALANCE and not rejoin.done
    h.join("g", formed.leader, instance_id="alpha")
    assert rejoin.value.generation_id == gen + 1


def test_a_restart_during_preparing_rebalance_fences_the_old_join_and_takes_part() -> None:
    h = static_harness()
    formed = formed_static(h, ["alpha", "beta"])
    old_join = h.join("g", formed.members[1], instance_id="beta", protocols=(("range", b"x"),))
    assert h.state() is GroupState.PREPARING_REBALANCE and not old_join.done
    rejoin = restart(h, "beta")
    assert old_join.error == ErrorCode.FENCED_INSTANCE_ID
    assert old_join.value.member_id == formed.members[1]
    assert not rejoin.done
    h.join("g", formed.leader, instance_id="alpha")
    assert rejoin.error == ErrorCode.NONE
    assert rejoin.value.generation_id == formed.generation + 1
    assert sorted(h.group().member_ids) == sorted([formed.leader, rejoin.value.member_id])


def test_a_failed_store_undoes_the_replacement() -> None:
    h = static_harness()
    formed = formed_static(h)
    h.store.deferred = True
    old = formed.members[1]
    rejoin = restart(h, "beta")
    assert not rejoin.done
    # while the write is in flight the old id is already fenced
    assert h.heartbeat("g", old, formed.generation, instance_id="beta").error == (
        ErrorCode.FENCED_INSTANCE_ID
    )
    h.store.complete_next(ErrorCode.NOT_LEADER)
    assert rejoin.error == ErrorCode.NOT_COORDINATOR
    assert rejoin.value.member_id == "" and rejoin.value.leader == formed.leader
    # the log still names the old id, and so does the group again
    assert h.group().static_member_id("beta") == old
    assert h.heartbeat("g", old, formed.generation, instance_id="beta").error == ErrorCode.NONE
    assert h.state() is GroupState.STABLE


def test_a_rebalance_during_the_store_answers_the_restart_with_the_new_generation() -> None:
    h = static_harness()
    formed = formed_static(h, ["alpha", "beta"])
    h.store.deferred = True
    rejoin = restart(h, "beta")
    # the leader rejoins before the write lands: beta counts as rejoined
    leader = h.join("g", formed.leader, instance_id="alpha")
    assert leader.done and rejoin.done
    assert rejoin.value.generation_id == formed.generation + 1
    h.store.complete_all()
    assert len(rejoin.responses) == 1


def test_a_second_restart_fences_the_first_while_its_store_is_in_flight() -> None:
    h = static_harness()
    formed = formed_static(h)
    h.store.deferred = True
    first = restart(h, "beta")
    second = restart(h, "beta")
    assert first.error == ErrorCode.FENCED_INSTANCE_ID
    h.store.complete_all()
    assert len(first.responses) == 1
    assert second.error == ErrorCode.NONE and second.value.generation_id == formed.generation
    assert h.group().static_member_id("beta") == second.value.member_id


def test_static_members_that_do_not_rejoin_stay_while_dynamic_ones_are_removed() -> None:
    h = static_harness()
    # a session longer than the rebalance timeout: a restart may take that long
    statics = h.form_static_group("g", ["alpha", "beta"], session_ms=LONG_SESSION_MS)
    # a dynamic member joins: everyone must rejoin; only the dynamic newcomer and alpha do
    dynamic = h.new_member_id("g", client_id="dyn")
    dyn_join = h.join("g", dynamic, client_id="dyn")
    alpha = h.join("g", statics.members[0], instance_id="alpha", session_ms=LONG_SESSION_MS)
    h.advance(REBALANCE_MS)
    assert dyn_join.error == ErrorCode.NONE and alpha.error == ErrorCode.NONE
    group = h.group()
    # beta did not rejoin but is kept (it may be restarting); it does not lead
    assert sorted(group.member_ids) == sorted([*statics.members, dynamic])
    assert group.leader_id in (statics.members[0], dynamic)
    leader_view = alpha.value.members or dyn_join.value.members
    assert sorted(m.member_id for m in leader_view) == sorted(group.member_ids)
    # the restart comes in now: a rebalance is under way, so it takes part in the next
    assert restart(h, "beta", session_ms=LONG_SESSION_MS).done is False
    assert h.state() is GroupState.PREPARING_REBALANCE


def test_dynamic_members_that_do_not_rejoin_are_removed_as_before() -> None:
    h = Harness()
    formed = h.form_group("g", 2)
    h.join("g", formed.leader)
    h.advance(REBALANCE_MS)
    assert h.group().member_ids == [formed.leader]


def test_when_no_static_member_rejoins_the_rebalance_waits_for_them() -> None:
    h = static_harness()
    formed = h.form_static_group("g", ["alpha", "beta"], session_ms=LONG_SESSION_MS)
    leader_join = h.join("g", formed.leader, instance_id="alpha", session_ms=LONG_SESSION_MS)
    h.leave_members("g", (formed.leader, "alpha"))
    assert leader_join.error == ErrorCode.UNKNOWN_MEMBER_ID
    # beta never rejoins: no generation without anyone, the join is scheduled again
    h.advance(REBALANCE_MS)
    assert h.state() is GroupState.PREPARING_REBALANCE
    assert h.group().member_ids == [formed.members[1]]
    # until its session runs out; then the group is empty
    h.advance(LONG_SESSION_MS - REBALANCE_MS)
    assert h.state() is GroupState.EMPTY


def test_a_static_member_that_goes_silent_expires_by_its_session() -> None:
    h = static_harness()
    formed = formed_static(h, ["alpha", "beta"])
    for _ in range(4):
        h.advance(SESSION_MS // 3)
        h.heartbeat("g", formed.leader, formed.generation)
    assert h.state() is GroupState.PREPARING_REBALANCE
    assert h.group().static_member_id("beta") is None
    assert restart(h, "beta").done is False  # a newcomer again, in the next rebalance


def test_leaving_by_instance_id_and_by_member_id() -> None:
    h = static_harness()
    formed = formed_static(h)
    alpha, _, gamma = formed.members
    reply = h.leave_members("g", ("", "beta"), ("", "nobody"), ("wrong", "gamma"), (alpha, "alpha"))
    assert reply.error == ErrorCode.NONE
    assert [
        (m.member_id, m.group_instance_id, ErrorCode(m.error_code)) for m in reply.value.members
    ] == [
        ("", "beta", ErrorCode.NONE),
        ("", "nobody", ErrorCode.UNKNOWN_MEMBER_ID),
        ("wrong", "gamma", ErrorCode.FENCED_INSTANCE_ID),
        (alpha, "alpha", ErrorCode.NONE),
    ]
    assert h.group().member_ids == [gamma]
    # by member id alone, as a client that does not know it is static would: removed too
    assert h.leave("g", gamma).value.member_error(gamma) == ErrorCode.NONE
    assert h.group().member_ids == [] and h.state() is GroupState.EMPTY


def test_static_members_survive_a_coordinator_failover() -> None:
    h = static_harness()
    formed = formed_static(h)
    assert [m.group_instance_id for m in last_group_record(h).members] == INSTANCES
    coordinator, store = loaded_copy(h, h.now)
    group = coordinator.group("g")
    assert group is not None and group.state is GroupState.STABLE
    assert group.static_member_id("beta") == formed.members[1]
    h.coordinator, h.store = coordinator, store  # the new leader's coordinator from now on
    rejoin = restart(h, "beta")
    assert rejoin.error == ErrorCode.NONE
    assert rejoin.value.generation_id == formed.generation
    assert h.state() is GroupState.STABLE


def test_describe_shows_instance_ids() -> None:
    h = static_harness()
    formed_static(h, ["alpha", "beta"])
    h.join("g", client_id="dyn")  # only a pending id: not a member
    described = h.describe("g").value.groups[0]
    assert [m.group_instance_id for m in described.members] == ["alpha", "beta"]


def test_a_full_group_lets_a_static_member_take_its_own_place_back() -> None:
    h = static_harness(group_max_size=2)
    formed = formed_static(h, ["alpha", "beta"])
    assert h.join("g", client_id="third").error == ErrorCode.GROUP_MAX_SIZE_REACHED
    assert restart(h, "gamma").error == ErrorCode.GROUP_MAX_SIZE_REACHED
    rejoin = restart(h, "beta")
    assert rejoin.error == ErrorCode.NONE
    assert rejoin.value.generation_id == formed.generation


def test_an_id_handed_out_to_a_dynamic_join_cannot_be_used_as_a_static_one() -> None:
    h = Harness()
    member_id = h.new_member_id("g")
    assert h.join("g", member_id, instance_id="alpha").error == ErrorCode.UNKNOWN_MEMBER_ID
    assert member_id not in h.group().pending_members


def test_an_unload_during_the_replacement_store_answers_the_restart_once() -> None:
    h = static_harness()
    formed_static(h)
    h.store.deferred = True
    rejoin = restart(h, "beta")
    h.coordinator.unload_group("g")
    assert rejoin.error == ErrorCode.NOT_COORDINATOR
    h.store.complete_all()
    assert len(rejoin.responses) == 1
