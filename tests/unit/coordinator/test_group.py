"""The group state machine, protocol vote, leader choice and offsets, without a coordinator."""

from __future__ import annotations

import itertools

import pytest

from herder.coordinator.group import Group, GroupState, IllegalGroupTransition
from herder.coordinator.member import Member
from herder.coordinator.offsets import GroupOffsets, OffsetAndMetadata, TopicPartition
from herder.coordinator.timers import TimerQueue

pytestmark = pytest.mark.unit

E, P, C, S, D = (
    GroupState.EMPTY,
    GroupState.PREPARING_REBALANCE,
    GroupState.COMPLETING_REBALANCE,
    GroupState.STABLE,
    GroupState.DEAD,
)

#: the seed's validPreviousStates, written out independently of the implementation
LEGAL = {(S, P), (C, P), (E, P), (P, C), (C, S), (P, E)} | {(state, D) for state in GroupState}

#: a legal path from Empty to each state
PATH = {E: [], P: [P], C: [P, C], S: [P, C, S], D: [D]}


def group_in(state: GroupState) -> Group:
    group = Group("g", 0)
    for step in PATH[state]:
        group.transition_to(step, 0)
    return group


@pytest.mark.parametrize(("source", "target"), list(itertools.product(GroupState, GroupState)))
def test_only_the_seeds_transitions_are_legal(source: GroupState, target: GroupState) -> None:
    group = group_in(source)
    if (source, target) in LEGAL:
        group.transition_to(target, 5)
        assert group.state is target
        assert group.state_timestamp_ms == 5
    else:
        with pytest.raises(IllegalGroupTransition):
            group.transition_to(target, 5)
        assert group.state is source


def member(member_id: str, *protocols: str, rebalance_ms: int = 1000) -> Member:
    return Member(
        member_id=member_id,
        client_id="client",
        client_host="host",
        session_timeout_ms=100,
        rebalance_timeout_ms=rebalance_ms,
        protocol_type="consumer",
        protocols=[(name, f"{member_id}:{name}".encode()) for name in protocols],
    )


def test_the_protocol_with_most_votes_among_common_ones_wins() -> None:
    group = Group("g", 0)
    group.add(member("a", "range", "sticky", "roundrobin"))
    group.add(member("b", "sticky", "range"))
    group.add(member("c", "roundrobin", "sticky", "range"))
    # roundrobin is c's favourite but b cannot speak it; sticky gets b's and c's votes
    assert group.candidate_protocols() == {"range", "sticky"}
    assert group.select_protocol() == "sticky"


def test_a_tied_vote_goes_to_the_first_members_preference() -> None:
    group = Group("g", 0)
    group.add(member("a", "range", "sticky"))
    group.add(member("b", "sticky", "range"))
    assert group.select_protocol() == "range"


def test_a_group_accepts_members_only_of_its_type_and_with_a_common_protocol() -> None:
    group = Group("g", 0)
    assert not group.supports_protocols("", ["range"])
    assert not group.supports_protocols("consumer", [])
    assert group.supports_protocols("consumer", ["range"])
    group.add(member("a", "range", "sticky"))
    assert group.supports_protocols("consumer", ["sticky"])
    assert not group.supports_protocols("connect", ["range"])
    assert not group.supports_protocols("consumer", ["roundrobin"])


def test_the_first_member_leads_and_a_rejoined_member_takes_over() -> None:
    group = Group("g", 0)
    for member_id in "abc":
        group.add(member(member_id, "range"))
    assert group.leader_id == "a"
    group.park_join(group.get("c"), lambda response: None)
    group.remove("a")
    assert group.leader_id == "c"
    group.remove("c")
    assert group.leader_id == "b"
    group.remove("b")
    assert group.leader_id is None


def test_next_generation_needs_every_member_rejoined_and_picks_a_protocol() -> None:
    group = group_in(P)
    group.add(member("a", "range", rebalance_ms=500))
    group.add(member("b", "range", rebalance_ms=900))
    assert group.rebalance_timeout_ms == 900
    group.park_join(group.get("a"), lambda response: None)
    assert not group.has_all_members_joined
    with pytest.raises(ValueError, match="did not rejoin"):
        group.init_next_generation(0)

    group.park_join(group.get("b"), lambda response: None)
    group.pending_members["x"] = TimerQueue().schedule(0, lambda: None)
    assert not group.has_all_members_joined  # an issued id that may still come back
    del group.pending_members["x"]
    assert group.has_all_members_joined
    group.init_next_generation(7)
    assert (group.state, group.generation_id, group.protocol) == (C, 1, "range")
    assert [m.member_id for m in group.member_metadata()] == ["a", "b"]
    assert group.member_metadata()[1].metadata == b"b:range"


def test_a_generation_without_members_is_empty() -> None:
    group = group_in(P)
    group.generation_id = 4
    group.init_next_generation(3)
    assert (group.state, group.generation_id, group.protocol) == (E, 5, None)


def test_a_stored_group_comes_back_stable_with_its_assignments() -> None:
    group = group_in(P)
    group.add(member("a", "range", "sticky"))
    group.add(member("b", "sticky", "range"))
    for m in group.members:
        group.park_join(m, lambda response: None)
    group.init_next_generation(0)
    record = group.to_record({"a": b"A", "b": b"B"}, 42)

    loaded = Group.from_record(record)
    assert loaded.state is S
    assert (loaded.generation_id, loaded.leader_id, loaded.protocol) == (1, "a", "range")
    assert [(m.member_id, m.assignment) for m in loaded.members] == [("a", b"A"), ("b", b"B")]
    # a loaded member keeps the names of all it offered, its metadata only for the chosen
    assert loaded.get("b").protocols == [("sticky", b""), ("range", b"b:range")]
    assert loaded.describe().members[1].metadata == b"b:range"


def test_a_stored_group_admits_a_new_member_speaking_its_protocol() -> None:
    group = group_in(P)
    group.add(member("a", "range"))
    group.park_join(group.get("a"), lambda response: None)
    group.init_next_generation(0)
    loaded = Group.from_record(group.to_record({"a": b"A"}, 42))
    assert loaded.candidate_protocols() == {"range"}
    assert loaded.supports_protocols("consumer", ["sticky", "range"])
    assert not loaded.supports_protocols("consumer", ["sticky"])
    loaded.add(member("b", "range"))
    assert loaded.select_protocol() == "range"
    loaded.remove("a")
    assert loaded.candidate_protocols() == {"range"}


def test_describe_shows_metadata_and_assignments_only_when_stable() -> None:
    group = group_in(P)
    group.add(member("a", "range"))
    group.park_join(group.get("a"), lambda response: None)
    group.init_next_generation(0)
    described = group.describe()
    assert described.state == "CompletingRebalance"
    assert described.protocol == ""
    assert described.members[0].metadata == b""


TP = TopicPartition("t", 0)


def offset(value: int, at: int = 0) -> OffsetAndMetadata:
    return OffsetAndMetadata(offset=value, metadata=f"m{value}", commit_timestamp_ms=at)


def test_a_pending_commit_is_invisible_until_stored() -> None:
    offsets = GroupOffsets()
    offsets.prepare_commit({TP: offset(5)})
    assert offsets.get(TP) is None and offsets.has_offsets
    offsets.complete_commit(TP, offset(5))
    assert offsets.get(TP) == offset(5)


def test_a_failed_commit_keeps_the_previous_offset() -> None:
    offsets = GroupOffsets()
    offsets.load({TP: offset(3)})
    offsets.prepare_commit({TP: offset(5)})
    offsets.fail_commit(TP, offset(5))
    assert offsets.get(TP) == offset(3)
    assert offsets.partitions() == [TP]


def test_an_earlier_write_completing_does_not_hide_a_later_pending_one() -> None:
    offsets = GroupOffsets()
    offsets.prepare_commit({TP: offset(5)})
    offsets.prepare_commit({TP: offset(6)})
    offsets.complete_commit(TP, offset(5))
    assert offsets.get(TP) == offset(5)
    # the later commit is still pending, so retention cannot drop the partition
    assert offsets.expire(10**12, 1, None) == []
    offsets.complete_commit(TP, offset(6))
    assert offsets.get(TP) == offset(6)


def test_retention_counts_from_the_later_of_commit_and_becoming_empty() -> None:
    offsets = GroupOffsets()
    other = TopicPartition("t", 1)
    offsets.load({TP: offset(1, at=100), other: offset(2, at=500)})
    assert offsets.expire(now_ms=1099, retention_ms=1000, empty_since_ms=50) == []
    assert offsets.expire(now_ms=1100, retention_ms=1000, empty_since_ms=50) == [TP]
    assert offsets.expire(now_ms=1500, retention_ms=1000, empty_since_ms=800) == []
    assert offsets.expire(now_ms=1800, retention_ms=1000, empty_since_ms=800) == [other]
