"""Serving or not: inactive, loading, loaded groups, and unloading with parked requests."""

from __future__ import annotations

from random import Random
from typing import Any

import pytest

from herder.coordinator import CoordinatorStatus, GroupCoordinator, GroupState, collect_groups
from herder.coordinator.messages import (
    DeleteGroupsRequest,
    DescribeGroupsRequest,
    HeartbeatRequest,
    InitFencingRequest,
    JoinGroupProtocol,
    JoinGroupRequest,
    LeaveGroupRequest,
    ListGroupsRequest,
    OffsetCommitPartition,
    OffsetCommitRequest,
    OffsetFetchRequest,
    SyncGroupRequest,
)
from herder.errors import ErrorCode

from .support import REBALANCE_MS, SESSION_MS, FakeStore, Harness, Reply, loaded_copy

pytestmark = pytest.mark.unit


def requests(group_id: str) -> dict[str, Any]:
    return {
        "join": JoinGroupRequest(
            group_id=group_id,
            session_timeout_ms=SESSION_MS,
            rebalance_timeout_ms=SESSION_MS,
            protocol_type="consumer",
            protocols=[JoinGroupProtocol(name="range")],
        ),
        "sync": SyncGroupRequest(group_id=group_id, generation_id=1, member_id="m"),
        "heartbeat": HeartbeatRequest(group_id=group_id, generation_id=1, member_id="m"),
        "leave": LeaveGroupRequest(group_id=group_id, member_ids=["m"]),
        "commit": OffsetCommitRequest(
            group_id=group_id,
            offsets=[OffsetCommitPartition(topic="t", partition=0, offset=1)],
        ),
        "fetch": OffsetFetchRequest(group_id=group_id),
        "describe": DescribeGroupsRequest(group_ids=[group_id]),
        "delete": DeleteGroupsRequest(group_ids=[group_id]),
        "list": ListGroupsRequest(),
        "fence": InitFencingRequest(fenced_id="task-0"),
    }


def send(coordinator: GroupCoordinator, request: Any) -> ErrorCode:
    reply: Reply[Any] = Reply()
    coordinator.handle(request, 0, reply)
    return reply.error


NAMES = list(requests("g"))


@pytest.mark.parametrize("name", NAMES)
def test_an_inactive_coordinator_answers_not_coordinator(name: str) -> None:
    coordinator = GroupCoordinator(FakeStore(), random=Random(0))
    assert coordinator.status is CoordinatorStatus.INACTIVE
    assert send(coordinator, requests("g")[name]) == ErrorCode.NOT_COORDINATOR


LOADING_ANSWERS = {
    # the member's group is on its way: the seed answers heartbeats blindly
    "heartbeat": ErrorCode.NONE,
    # the rebalance in flight was lost with the old coordinator: rejoin, no rediscovery
    "sync": ErrorCode.REBALANCE_IN_PROGRESS,
}


@pytest.mark.parametrize("name", NAMES)
def test_a_loading_coordinator_asks_to_retry(name: str) -> None:
    coordinator = GroupCoordinator(FakeStore(), random=Random(0))
    coordinator.begin_loading(0)
    expected = LOADING_ANSWERS.get(name, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS)
    assert send(coordinator, requests("g")[name]) == expected


MEMBERSHIP_REQUESTS = ["join", "sync", "heartbeat", "leave"]


@pytest.mark.parametrize("name", MEMBERSHIP_REQUESTS)
def test_an_empty_group_id_is_invalid_for_membership_requests(name: str) -> None:
    h = Harness()
    assert send(h.coordinator, requests("")[name]) == ErrorCode.INVALID_GROUP_ID


@pytest.mark.parametrize("name", ["commit", "fetch", "describe"])
def test_an_empty_group_id_is_served_for_offsets_and_describe(name: str) -> None:
    h = Harness()
    assert send(h.coordinator, requests("")[name]) == ErrorCode.NONE


def test_the_group_with_the_empty_id_keeps_offsets_across_a_reload_and_can_be_deleted() -> None:
    h = Harness()
    assert h.delete("").value.results[0].error_code == ErrorCode.GROUP_ID_NOT_FOUND
    assert h.commit("", {("t", 0): 7}).error == ErrorCode.NONE
    assert h.fetched("") == {("t", 0): 7}
    assert h.describe("").value.groups[0].state == "Empty"
    coordinator, _ = loaded_copy(h, h.now)
    fetch: Reply[Any] = Reply()
    coordinator.fetch_offsets(OffsetFetchRequest(group_id=""), h.now, fetch)
    assert [(o.topic, o.partition, o.offset) for o in fetch.value.offsets] == [("t", 0, 7)]
    assert h.delete("").error == ErrorCode.NONE
    assert h.fetched("") == {} and h.coordinator.group("") is None


def test_a_loaded_group_is_stable_with_its_members_assignments_and_offsets() -> None:
    h = Harness()
    formed = h.form_group("g", 2)
    h.commit("g", {("t", 0): 9}, member_id=formed.leader, generation=formed.generation)
    h.commit("admin", {("t", 1): 3})

    later = h.now + 50_000
    coordinator, _ = loaded_copy(h, later)
    group = coordinator.group("g")
    assert group is not None and group.state is GroupState.STABLE
    assert (group.generation_id, group.leader_id, group.member_ids) == (
        formed.generation,
        formed.leader,
        formed.members,
    )
    admin = coordinator.group("admin")
    assert admin is not None and admin.state is GroupState.EMPTY

    sync: Reply[Any] = Reply()
    request = SyncGroupRequest(
        group_id="g", generation_id=formed.generation, member_id=formed.followers[0]
    )
    coordinator.sync_group(request, later, sync)
    assert sync.value.assignment == f"to-{formed.followers[0]}".encode()
    fetch: Reply[Any] = Reply()
    coordinator.fetch_offsets(OffsetFetchRequest(group_id="g"), later, fetch)
    assert [(o.partition, o.offset) for o in fetch.value.offsets] == [(0, 9)]


def test_loaded_members_get_a_fresh_session_from_the_load() -> None:
    h = Harness()
    formed = h.form_group("g", 2)
    loaded_at = h.now + 3 * SESSION_MS  # long after their last heartbeat to the old leader
    coordinator, _ = loaded_copy(h, loaded_at)
    alive = formed.leader
    heartbeat: Reply[Any] = Reply()
    beat = HeartbeatRequest(group_id="g", generation_id=formed.generation, member_id=alive)
    coordinator.heartbeat(beat, loaded_at + SESSION_MS - 1, heartbeat)
    assert heartbeat.error == ErrorCode.NONE
    coordinator.tick(loaded_at + SESSION_MS)
    group = coordinator.group("g")
    assert group is not None and group.member_ids == [alive]
    assert group.state is GroupState.PREPARING_REBALANCE


def test_unloading_answers_parked_joins_and_syncs_with_not_coordinator() -> None:
    h = Harness(deferred=True)
    joining = h.form_group("joining", 2)
    syncing = h.form_group("syncing", 2, sync=False)
    parked_join = h.join("joining", joining.leader)
    parked_sync = h.sync("syncing", syncing.followers[0], syncing.generation)
    leader_sync = h.sync("syncing", syncing.leader, syncing.generation, {})
    groups = [h.coordinator.group("joining"), h.coordinator.group("syncing")]

    h.coordinator.unload_all()
    assert parked_join.error == ErrorCode.NOT_COORDINATOR
    assert parked_sync.error == ErrorCode.NOT_COORDINATOR
    assert leader_sync.error == ErrorCode.NOT_COORDINATOR
    assert all(g is not None and g.state is GroupState.DEAD for g in groups)
    assert h.coordinator.status is CoordinatorStatus.INACTIVE
    assert h.coordinator.next_deadline() is None

    # the leader's write lands after the unload: nobody is answered twice
    h.store.complete_all()
    assert len(leader_sync.responses) == 1 and len(parked_sync.responses) == 1
    h.advance(10 * SESSION_MS)
    assert h.heartbeat("joining", joining.leader, joining.generation).error == (
        ErrorCode.NOT_COORDINATOR
    )


def test_unloading_one_group_leaves_the_others_served() -> None:
    h = Harness()
    gone = h.form_group("gone", 2)
    kept = h.form_group("kept", 1)
    parked = h.join("gone", gone.leader)
    h.coordinator.unload_group("gone")
    assert parked.error == ErrorCode.NOT_COORDINATOR
    assert h.coordinator.group("gone") is None
    assert h.heartbeat("kept", kept.leader, kept.generation).error == ErrorCode.NONE


def test_an_unloaded_group_is_not_served_until_it_is_loaded_again() -> None:
    h = Harness()
    gone = h.form_group("gone", 1)
    h.commit("gone", {("t", 0): 5}, member_id=gone.leader, generation=gone.generation)
    h.coordinator.unload_group("gone")
    for name, request in requests("gone").items():
        if name not in ("list", "fence"):
            assert send(h.coordinator, request) == ErrorCode.NOT_COORDINATOR, name
    assert h.join("gone").error == ErrorCode.NOT_COORDINATOR
    assert h.coordinator.group("gone") is None
    assert "gone" not in [g.group_id for g in h.list_groups().value.groups]
    # leadership lost and won back: the group is loaded, and served, again
    h.coordinator.unload_all()
    h.coordinator.begin_loading(h.now)
    for stored in collect_groups(h.store.groups_log).values():
        h.coordinator.load_group(stored.group_id, stored.record, stored.offsets, h.now)
    h.coordinator.finish_loading(h.now)
    assert h.heartbeat("gone", gone.leader, gone.generation).error == ErrorCode.NONE
    assert h.fetched("gone") == {("t", 0): 5}


def test_loading_a_group_twice_is_refused_and_keeps_the_first_copy_timed() -> None:
    h = Harness()
    formed = h.form_group("g", 1)
    stored = collect_groups(h.store.groups_log)["g"]
    coordinator = GroupCoordinator(FakeStore(), random=Random(1))
    coordinator.begin_loading(h.now)
    coordinator.load_group("g", stored.record, stored.offsets, h.now)
    first = coordinator.group("g")
    with pytest.raises(ValueError, match="group g is already loaded"):
        coordinator.load_group("g", stored.record, stored.offsets, h.now + 1)
    coordinator.finish_loading(h.now)
    assert coordinator.group("g") is first and first is not None
    assert first.member_ids == [formed.leader]
    coordinator.tick(h.now + SESSION_MS)
    # the one copy's session timer expired its silent member
    assert first.member_ids == [] and first.state is GroupState.EMPTY


def test_a_coordinator_can_serve_again_after_losing_leadership() -> None:
    h = Harness()
    formed = h.form_group("g", 1)
    h.coordinator.unload_all()
    h.coordinator.begin_loading(h.now)
    for stored in collect_groups(h.store.groups_log).values():
        h.coordinator.load_group(stored.group_id, stored.record, stored.offsets, h.now)
    h.coordinator.finish_loading(h.now)
    assert h.heartbeat("g", formed.leader, formed.generation).error == ErrorCode.NONE


def test_loading_is_only_possible_while_loading() -> None:
    h = Harness()
    with pytest.raises(RuntimeError, match="cannot load group"):
        h.coordinator.load_group("g", None, {}, h.now)
    with pytest.raises(RuntimeError, match="cannot begin loading"):
        h.coordinator.begin_loading(h.now)
    with pytest.raises(RuntimeError, match="cannot finish loading"):
        h.coordinator.finish_loading(h.now)


def test_list_groups_while_loading_shows_the_groups_loaded_so_far() -> None:
    coordinator = GroupCoordinator(FakeStore(), random=Random(0))
    coordinator.begin_loading(0)
    coordinator.load_group("early", None, {}, 0)
    reply: Reply[Any] = Reply()
    coordinator.list_groups(ListGroupsRequest(), 0, reply)
    assert reply.error == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
    assert [g.group_id for g in reply.value.groups] == ["early"]


def test_the_next_deadline_is_the_earliest_session() -> None:
    h = Harness()
    assert (
        h.coordinator.next_deadline()
        == h.now + h.coordinator.config.offsets_retention_check_interval_ms
    )
    h.form_group("g", 1)
    assert h.coordinator.next_deadline() == h.now + SESSION_MS


def test_an_offsets_only_group_expires_by_its_commit_times_after_a_reload() -> None:
    h = Harness()
    h.commit("admin", {("t", 0): 1})
    retention = h.coordinator.config.offsets_retention_ms
    coordinator, _ = loaded_copy(h, h.now + retention // 2)
    coordinator.tick(h.now + retention + coordinator.config.offsets_retention_check_interval_ms)
    assert coordinator.group("admin") is None


def test_a_store_completing_one_write_twice_is_refused_loudly() -> None:
    h = Harness(deferred=True)
    reply = h.commit("g", {("t", 0): 1})
    write = h.store.pending.popleft()
    write.callback(ErrorCode.NONE, 1)
    with pytest.raises(RuntimeError, match="completed one write twice"):
        write.callback(ErrorCode.NONE, 2)
    assert len(reply.responses) == 1


@pytest.mark.parametrize("name", MEMBERSHIP_REQUESTS)
def test_the_group_id_is_checked_before_the_coordinators_state(name: str) -> None:
    """Kafka's ``validateGroupStatus`` order: an invalid group id is the caller's mistake,
    whether or not this coordinator could serve it."""
    inactive = GroupCoordinator(FakeStore(), random=Random(0))
    assert send(inactive, requests("")[name]) == ErrorCode.INVALID_GROUP_ID
    loading = GroupCoordinator(FakeStore(), random=Random(0))
    loading.begin_loading(0)
    assert send(loading, requests("")[name]) == ErrorCode.INVALID_GROUP_ID


def test_unloading_a_group_leaves_nothing_of_it_answering_or_timed() -> None:
    h = Harness(deferred=True)
    retention_check = h.coordinator.next_deadline()
    formed = h.form_group("g", 2, sync=False)
    h.sync("g", formed.leader, formed.generation, {m: b"x" for m in formed.members})
    h.store.complete_all()
    # every kind of timer the group can hold: sessions, a pending id, a rebalance, a
    # pending sync deadline, a new member's join timeout, a parked join and a parked sync
    pending_id = h.new_member_id("g", client_id="late")
    parked_join = h.join("g", pending_id, client_id="late")
    static = h.join("g", instance_id="static")
    assert h.state() is GroupState.PREPARING_REBALANCE
    assert h.coordinator.next_deadline() != retention_check
    writes = h.store.writes
    h.coordinator.unload_group("g")
    assert parked_join.error == ErrorCode.NOT_COORDINATOR
    assert static.error == ErrorCode.NOT_COORDINATOR
    # the only timer left is the coordinator's own retention check
    assert h.coordinator.next_deadline() == retention_check
    for name, request in requests("g").items():
        if name not in ("list", "fence"):
            assert send(h.coordinator, request) == ErrorCode.NOT_COORDINATOR, name
    assert h.heartbeat("g", formed.leader, formed.generation).error == ErrorCode.NOT_COORDINATOR
    assert h.join("g", pending_id).error == ErrorCode.NOT_COORDINATOR
    # time running on sees no session of it expire and no rebalance of it complete
    h.advance(REBALANCE_MS * 10)
    assert h.store.writes == writes and not h.store.pending
    assert h.coordinator.group("g") is None and h.list_groups().value.groups == []


def test_a_loaded_group_still_admits_a_member_offering_only_an_older_protocol() -> None:
    """A group in the middle of an upgrade (its members offer new and old protocols and
    chose the new) fails over: a worker that offers only the old protocol may join."""
    h = Harness()
    both = [("sessioned", b"v2"), ("eager", b"v0")]
    formed = h.form_group("g", 2, protocol_type="connect", protocols=both)
    assert h.group("g").protocol == "sessioned"
    later = h.now + 1_000
    coordinator, _ = loaded_copy(h, later)
    joined: Reply[Any] = Reply()
    coordinator.join_group(
        JoinGroupRequest(
            group_id="g",
            member_id="",
            client_id="old",
            client_host="/127.0.0.1",
            session_timeout_ms=SESSION_MS,
            rebalance_timeout_ms=SESSION_MS,
            protocol_type="connect",
            protocols=[JoinGroupProtocol(name="eager", metadata=b"v0")],
        ),
        later,
        joined,
    )
    assert joined.error == ErrorCode.MEMBER_ID_REQUIRED, joined.value
    group = coordinator.group("g")
    assert group is not None and set(group.member_ids) == set(formed.members)
