"""ListGroups, DescribeGroups and DeleteGroups."""

from __future__ import annotations

import pytest

from herder.coordinator import collect_groups
from herder.coordinator.messages import ListGroupsRequest, ListGroupsResponse
from herder.errors import ErrorCode

from .support import Harness, Reply

pytestmark = pytest.mark.unit


def test_list_groups_shows_every_group_with_its_state_and_type() -> None:
    h = Harness()
    h.form_group("b-stable", 1)
    h.form_group("a-syncing", 1, sync=False)
    h.commit("c-offsets-only", {("t", 0): 1})
    listed = h.list_groups().value
    assert listed.error_code == ErrorCode.NONE
    assert [(g.group_id, g.state, g.protocol_type) for g in listed.groups] == [
        ("a-syncing", "CompletingRebalance", "consumer"),
        ("b-stable", "Stable", "consumer"),
        ("c-offsets-only", "Empty", ""),
    ]


def test_describe_a_stable_group_shows_members_with_metadata_and_assignments() -> None:
    h = Harness()
    formed = h.form_group("g", 2)
    described = h.describe("g").value.groups[0]
    assert (described.error_code, described.state, described.protocol) == (
        ErrorCode.NONE,
        "Stable",
        "range",
    )
    assert [(m.member_id, m.client_id, m.metadata, m.assignment) for m in described.members] == [
        (m, f"c{i}", b"range-meta", f"to-{m}".encode()) for i, m in enumerate(formed.members)
    ]


def test_describe_a_rebalancing_group_hides_metadata() -> None:
    h = Harness()
    formed = h.form_group("g", 2)
    h.join("g", formed.leader)
    described = h.describe("g").value.groups[0]
    assert described.state == "PreparingRebalance" and described.protocol == ""
    assert all(m.metadata == b"" and m.assignment == b"" for m in described.members)


def test_describe_an_unknown_group_as_dead_even_with_the_empty_id() -> None:
    h = Harness()
    reply = h.describe("nowhere", "")
    for described in reply.value.groups:
        assert (described.error_code, described.state, described.members) == (
            ErrorCode.NONE,
            "Dead",
            [],
        )
    assert reply.error == ErrorCode.NONE


def test_delete_groups_removes_empty_groups_with_their_offsets() -> None:
    h = Harness()
    h.commit("old", {("t", 0): 1, ("t", 1): 2})
    h.form_group("busy", 1)
    reply = h.delete("old", "busy", "nowhere", "")
    assert [(r.group_id, r.error_code) for r in reply.value.results] == [
        ("old", ErrorCode.NONE),
        ("busy", ErrorCode.NON_EMPTY_GROUP),
        ("nowhere", ErrorCode.GROUP_ID_NOT_FOUND),
        ("", ErrorCode.GROUP_ID_NOT_FOUND),
    ]
    assert reply.error == ErrorCode.NON_EMPTY_GROUP
    assert h.coordinator.group("old") is None and h.fetched("old") == {}
    assert sorted(collect_groups(h.store.groups_log)) == ["busy"]
    assert h.delete("old").value.results[0].error_code == ErrorCode.GROUP_ID_NOT_FOUND


def test_a_group_emptied_by_its_last_member_leaving_can_be_deleted() -> None:
    h = Harness()
    formed = h.form_group("g", 1)
    assert h.delete("g").value.results[0].error_code == ErrorCode.NON_EMPTY_GROUP
    h.leave("g", formed.leader)
    assert h.delete("g").error == ErrorCode.NONE
    assert h.join("g", formed.leader).error == ErrorCode.UNKNOWN_MEMBER_ID


def test_delete_answers_once_the_deletions_are_stored_and_reports_store_errors() -> None:
    h = Harness(deferred=True)
    h.commit("a", {("t", 0): 1})
    h.commit("b", {("t", 0): 1})
    h.store.complete_all()
    reply = h.delete("a", "b")
    assert not reply.done
    h.store.complete_next()
    assert not reply.done
    h.store.complete_next(ErrorCode.NOT_LEADER)
    assert [r.error_code for r in reply.value.results] == [
        ErrorCode.NONE,
        ErrorCode.NOT_COORDINATOR,
    ]


def test_list_groups_filters_by_state_in_any_case() -> None:
    """KIP-518: ListGroups with a states filter; no filter lists every group."""
    h = Harness()
    h.form_group("stable", 1)
    h.form_group("completing", 1, sync=False)
    h.commit("empty", {("t", 0): 1})

    def listed(*states: str) -> list[str]:
        reply: Reply[ListGroupsResponse] = Reply()
        h.coordinator.handle(ListGroupsRequest(states_filter=list(states)), h.now, reply)
        return [g.group_id for g in reply.value.groups]

    assert listed() == ["completing", "empty", "stable"]
    assert listed("stable") == ["stable"]
    assert listed("EMPTY", "CompletingRebalance") == ["completing", "empty"]
    assert listed("Dead") == []
