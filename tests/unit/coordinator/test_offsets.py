"""OffsetCommit, OffsetFetch and offset retention."""

from __future__ import annotations

import pytest

from herder.coordinator import CoordinatorConfig, GroupState, collect_groups
from herder.errors import ErrorCode

from .support import SESSION_MS, Harness

pytestmark = pytest.mark.unit

MINUTE = 60_000


def test_a_member_of_the_current_generation_commits_and_fetches() -> None:
    h = Harness()
    formed = h.form_group("g", 1)
    reply = h.commit(
        "g",
        {("t", 0): (10, "ckpt-a"), ("t", 1): 20},
        member_id=formed.leader,
        generation=formed.generation,
    )
    assert reply.error == ErrorCode.NONE
    assert [(p.topic, p.partition, p.error_code) for p in reply.value.partitions] == [
        ("t", 0, ErrorCode.NONE),
        ("t", 1, ErrorCode.NONE),
    ]
    fetched = h.fetch("g").value.offsets
    assert [(o.partition, o.offset, o.metadata) for o in fetched] == [
        (0, 10, "ckpt-a"),
        (1, 20, ""),
    ]
    stored = collect_groups(h.store.groups_log)["g"].offsets
    assert {tp.partition: o.offset for tp, o in stored.items()} == {0: 10, 1: 20}


def test_commits_from_a_stale_generation_are_illegal() -> None:
    h = Harness()
    formed = h.form_group("g", 1)
    reply = h.commit("g", {("t", 0): 5}, member_id=formed.leader, generation=formed.generation - 1)
    assert reply.error == ErrorCode.ILLEGAL_GENERATION
    assert reply.value.partitions[0].error_code == ErrorCode.ILLEGAL_GENERATION
    assert h.fetched("g") == {}


def test_commits_while_completing_a_rebalance_are_refused() -> None:
    h = Harness()
    formed = h.form_group("g", 1, sync=False)
    reply = h.commit("g", {("t", 0): 5}, member_id=formed.leader, generation=formed.generation)
    assert reply.error == ErrorCode.REBALANCE_IN_PROGRESS


def test_the_current_generation_may_commit_while_a_rebalance_is_prepared() -> None:
    h = Harness()
    formed = h.form_group("g", 2)
    h.join("g", formed.leader)
    follower = formed.followers[0]
    reply = h.commit("g", {("t", 0): 5}, member_id=follower, generation=formed.generation)
    assert reply.error == ErrorCode.NONE
    assert h.fetched("g") == {("t", 0): 5}


def test_commits_from_unknown_members_are_refused() -> None:
    h = Harness()
    formed = h.form_group("g", 1)
    reply = h.commit("g", {("t", 0): 5}, member_id="ghost", generation=formed.generation)
    assert reply.error == ErrorCode.UNKNOWN_MEMBER_ID
    # an admin commit (generation -1) is only for groups without members
    assert h.commit("g", {("t", 0): 5}).error == ErrorCode.UNKNOWN_MEMBER_ID


def test_admin_commits_with_generation_minus_one_need_no_members() -> None:
    h = Harness()
    assert h.commit("tool-group", {("t", 3): 7}).error == ErrorCode.NONE
    group = h.coordinator.group("tool-group")
    assert group is not None and group.state is GroupState.EMPTY
    assert h.fetched("tool-group") == {("t", 3): 7}


def test_a_generation_commit_for_an_unknown_group_is_illegal() -> None:
    h = Harness()
    reply = h.commit("nowhere", {("t", 0): 1}, member_id="m", generation=3)
    assert reply.error == ErrorCode.ILLEGAL_GENERATION
    assert h.coordinator.group("nowhere") is None


def test_oversized_metadata_is_refused_per_partition() -> None:
    h = Harness(CoordinatorConfig(offset_metadata_max_bytes=8))
    reply = h.commit("g", {("t", 0): (1, "x" * 9), ("t", 1): (2, "x" * 8)})
    codes = [p.error_code for p in reply.value.partitions]
    assert codes == [ErrorCode.OFFSET_METADATA_TOO_LARGE, ErrorCode.NONE]
    assert reply.error == ErrorCode.OFFSET_METADATA_TOO_LARGE
    assert h.fetched("g") == {("t", 1): 2}


def test_a_commit_is_visible_only_once_stored() -> None:
    h = Harness(deferred=True)
    reply = h.commit("g", {("t", 0): 1})
    assert not reply.done and h.fetched("g") == {}
    h.store.complete_all()
    assert reply.error == ErrorCode.NONE and h.fetched("g") == {("t", 0): 1}


@pytest.mark.parametrize(
    ("store_error", "committer_sees"),
    [
        (ErrorCode.NOT_LEADER, ErrorCode.NOT_COORDINATOR),
        (ErrorCode.UNKNOWN_LOG, ErrorCode.COORDINATOR_NOT_AVAILABLE),
        (ErrorCode.FRAME_TOO_LARGE, ErrorCode.INVALID_COMMIT_OFFSET_SIZE),
        (ErrorCode.REQUEST_TIMED_OUT, ErrorCode.REQUEST_TIMED_OUT),
    ],
)
def test_a_failed_write_keeps_the_previous_offset(
    store_error: ErrorCode, committer_sees: ErrorCode
) -> None:
    h = Harness(deferred=True)
    h.commit("g", {("t", 0): 1})
    h.store.complete_all()
    reply = h.commit("g", {("t", 0): 2, ("t", 1): 3})
    h.store.complete_next(store_error)
    assert [p.error_code for p in reply.value.partitions] == [committer_sees] * 2
    assert h.fetched("g") == {("t", 0): 1}


def test_fetch_reports_missing_partitions_and_groups_as_no_offset() -> None:
    h = Harness()
    h.commit("g", {("t", 0): 4})
    offsets = h.fetch("g", [("t", 0), ("t", 9)]).value.offsets
    assert [(o.partition, o.offset, o.error_code) for o in offsets] == [
        (0, 4, ErrorCode.NONE),
        (9, -1, ErrorCode.NONE),
    ]
    assert [o.offset for o in h.fetch("nowhere", [("t", 0)]).value.offsets] == [-1]
    assert h.fetch("nowhere").value.offsets == []


def test_offsets_of_an_empty_group_expire_after_the_retention() -> None:
    config = CoordinatorConfig(
        offsets_retention_minutes=10, offsets_retention_check_interval_ms=MINUTE
    )
    h = Harness(config)
    h.commit("g", {("t", 0): 1})
    h.advance(5 * MINUTE)
    h.commit("g", {("t", 1): 2})
    h.advance(5 * MINUTE)
    assert h.fetched("g") == {("t", 1): 2}
    h.advance(5 * MINUTE)
    assert h.fetched("g") == {}
    # nothing left: the group itself is gone, from memory and from the log
    assert h.coordinator.group("g") is None
    assert collect_groups(h.store.groups_log) == {}


def test_offsets_of_a_group_with_members_never_expire() -> None:
    config = CoordinatorConfig(
        offsets_retention_minutes=1, offsets_retention_check_interval_ms=MINUTE
    )
    h = Harness(config)
    formed = h.form_group("g", 1)
    h.commit("g", {("t", 0): 1}, member_id=formed.leader, generation=formed.generation)
    for _ in range(5 * MINUTE // (SESSION_MS // 2)):
        h.advance(SESSION_MS // 2)
        assert h.heartbeat("g", formed.leader, formed.generation).error == ErrorCode.NONE
    assert h.fetched("g") == {("t", 0): 1}

    # once the group empties, retention counts from that moment
    h.leave("g", formed.leader)
    h.advance(MINUTE - 1)
    assert h.fetched("g") == {("t", 0): 1}
    h.advance(MINUTE)
    assert h.fetched("g") == {}


def test_a_committed_leader_epoch_is_stored_and_fetched() -> None:
    h = Harness()
    formed = h.form_group("g", 1)
    h.commit("g", {("t", 0): 10}, member_id=formed.leader, generation=1, leader_epoch=4)
    h.commit("g", {("t", 1): 20}, member_id=formed.leader, generation=1)
    epochs = {(o.topic, o.partition): o.leader_epoch for o in h.fetch("g").value.offsets}
    assert epochs == {("t", 0): 4, ("t", 1): -1}
    reloaded = collect_groups(h.store.groups_log)["g"].offsets
    assert {tp.partition: o.leader_epoch for tp, o in reloaded.items()} == {0: 4, 1: -1}


def test_a_static_members_commit_names_its_instance() -> None:
    h = Harness()
    joined = h.join("g", instance_id="alpha").value
    member = joined.member_id
    h.sync("g", member, joined.generation_id, {member: b""})
    ok = h.commit("g", {("t", 0): 1}, member_id=member, generation=1, instance_id="alpha")
    assert ok.error == ErrorCode.NONE
    other = h.commit("g", {("t", 0): 2}, member_id=member, generation=1, instance_id="beta")
    assert other.error == ErrorCode.UNKNOWN_MEMBER_ID
