"""The incremental cooperative assignor: only what must move is revoked, then reassigned."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from herder.runtime.core.config_state import (
    ClusterConfigSnapshot,
    ConfigRecord,
    TargetState,
    target_state_record,
)
from herder.runtime.core.cooperative import CooperativeAssignor, Memory
from herder.runtime.core.protocol import (
    CONNECT_PROTOCOL_V2,
    Assignment,
    AssignmentError,
    ConnectorTaskId,
    WorkerMetadata,
    decode_assignment,
    decode_metadata,
    encode_assignment,
    encode_metadata,
)
from tests.unit.runtime.test_assignor import connector, snapshot_of

pytestmark = pytest.mark.unit

T = ConnectorTaskId


def worker(
    offset: int, member: str, connectors: tuple[str, ...] = (), tasks: tuple[T, ...] = ()
) -> WorkerMetadata:
    url = f"http://{member.split('#')[0]}:8083"
    return WorkerMetadata(
        version=1, config_offset=offset, url=url, connectors=connectors, tasks=tasks
    )


def holding(offset: int, result: dict[str, Assignment]) -> dict[str, WorkerMetadata]:
    """Every member rejoins holding what it was told to hold."""
    return {m: worker(offset, m, a.connectors, a.tasks) for m, a in result.items()}


def test_new_work_is_spread_at_once() -> None:
    snapshot = snapshot_of(connector("a", 2) + connector("b", 2))
    group = {m: worker(snapshot.offset, m) for m in ("w1", "w2")}
    result, _ = CooperativeAssignor().assign("w1", group, snapshot, Memory(), 0)
    assert result["w1"].connectors == ("a",)
    assert result["w2"].connectors == ("b",)
    assert len(result["w1"].tasks) == len(result["w2"].tasks) == 2
    assert not any(a.revoked_tasks or a.revoked_connectors or a.delay for a in result.values())


def test_a_joining_worker_takes_work_in_two_rounds_and_nothing_else_moves() -> None:
    snapshot = snapshot_of(connector("a", 4) + connector("b", 2))
    assignor = CooperativeAssignor()
    first, memory = assignor.assign(
        "w1", {m: worker(snapshot.offset, m) for m in ("w1", "w2")}, snapshot, Memory(), 0
    )
    group = holding(snapshot.offset, first) | {"w3": worker(snapshot.offset, "w3")}
    revoking, memory = assignor.assign("w1", group, snapshot, memory, 10)
    assert revoking["w3"].connectors == revoking["w3"].tasks == ()
    moved = [t for a in revoking.values() for t in a.revoked_tasks]
    assert len(moved) == 2
    for m in ("w1", "w2"):
        assert set(revoking[m].tasks) == set(first[m].tasks) - set(revoking[m].revoked_tasks)
    follow_up, _ = assignor.assign("w1", holding(snapshot.offset, revoking), snapshot, memory, 20)
    assert sorted(follow_up["w3"].tasks) == sorted(moved)
    assert [len(a.tasks) for a in follow_up.values()] == [2, 2, 2]
    assert not any(a.revoked_tasks for a in follow_up.values())


def test_a_departed_workers_work_waits_for_it_and_goes_back_when_it_returns() -> None:
    snapshot = snapshot_of(connector("a", 4))
    assignor = CooperativeAssignor(max_delay_ms=60_000)
    first, memory = assignor.assign(
        "w1", {m: worker(snapshot.offset, m) for m in ("w1", "w2")}, snapshot, Memory(), 0
    )
    w2_work = first["w2"].tasks
    assert w2_work
    without, memory = assignor.assign(
        "w1", {"w1": holding(snapshot.offset, first)["w1"]}, snapshot, memory, 1_000
    )
    assert without["w1"].tasks == first["w1"].tasks
    assert without["w1"].delay == 60_000
    # the same worker comes back (a new member id, the same URL) before the delay ends
    back = {"w1": holding(snapshot.offset, without)["w1"], "w2#2": worker(snapshot.offset, "w2#2")}
    returned, memory = assignor.assign("w1", back, snapshot, memory, 30_000)
    assert returned["w2#2"].tasks == w2_work
    assert returned["w2#2"].delay == 0
    assert memory.lost == {}


def test_lost_work_is_reassigned_when_the_delay_runs_out() -> None:
    snapshot = snapshot_of(connector("a", 4))
    assignor = CooperativeAssignor(max_delay_ms=60_000)
    first, memory = assignor.assign(
        "w1", {m: worker(snapshot.offset, m) for m in ("w1", "w2")}, snapshot, Memory(), 0
    )
    alone = {"w1": holding(snapshot.offset, first)["w1"]}
    waiting, memory = assignor.assign("w1", alone, snapshot, memory, 1_000)
    again, memory = assignor.assign(
        "w1", holding(snapshot.offset, waiting), snapshot, memory, 40_000
    )
    assert again["w1"].delay == 21_000
    assert len(again["w1"].tasks) == 2
    late, memory = assignor.assign("w1", holding(snapshot.offset, again), snapshot, memory, 61_000)
    assert len(late["w1"].tasks) == 4
    assert late["w1"].delay == 0
    assert memory.lost_until_ms is None


def test_no_delay_reassigns_lost_work_at_once() -> None:
    snapshot = snapshot_of(connector("a", 4))
    assignor = CooperativeAssignor(max_delay_ms=0)
    first, memory = assignor.assign(
        "w1", {m: worker(snapshot.offset, m) for m in ("w1", "w2")}, snapshot, Memory(), 0
    )
    alone, _ = assignor.assign(
        "w1", {"w1": holding(snapshot.offset, first)["w1"]}, snapshot, memory, 1
    )
    assert len(alone["w1"].tasks) == 4


def test_deleted_stopped_and_doubly_held_work_is_revoked() -> None:
    snapshot = snapshot_of(
        connector("a", 2) + connector("b", 1) + [target_state_record("b", TargetState.STOPPED)]
    )
    group = {
        "w1": worker(snapshot.offset, "w1", ("a", "gone"), (T("a", 0), T("b", 0))),
        "w2": worker(snapshot.offset, "w2", ("b",), (T("a", 0), T("gone", 0))),
    }
    result, _ = CooperativeAssignor().assign("w1", group, snapshot, Memory(), 0)
    assert result["w1"].revoked_connectors == ("gone",)
    assert result["w1"].revoked_tasks == (T("a", 0), T("b", 0))
    assert result["w2"].revoked_tasks == (T("a", 0), T("gone", 0))
    # the task held twice goes to nobody until both have given it up
    assert T("a", 0) not in result["w1"].tasks + result["w2"].tasks
    assert sorted(result["w1"].tasks + result["w2"].tasks) == [T("a", 1)]


def test_a_leader_behind_a_member_reports_config_mismatch_and_remembers_nothing_new() -> None:
    snapshot = snapshot_of(connector("a", 1))
    group = {
        "w1": worker(snapshot.offset, "w1"),
        "w2": worker(snapshot.offset + 3, "w2"),
    }
    memory = Memory()
    result, after = CooperativeAssignor().assign("w1", group, snapshot, memory, 0)
    assert all(a.failed and a.error == AssignmentError.CONFIG_MISMATCH for a in result.values())
    assert after is memory


def test_the_new_fields_survive_the_wire_and_an_eager_decoder_ignores_them() -> None:
    metadata = worker(5, "w1", ("a",), (T("a", 0),))
    assert decode_metadata(encode_metadata(metadata)) == metadata
    assignment = Assignment(
        version=CONNECT_PROTOCOL_V2,
        leader="w1",
        leader_url="http://w1:8083",
        config_offset=5,
        tasks=(T("a", 1),),
        revoked_tasks=(T("a", 0),),
        delay=300,
    )
    assert decode_assignment(encode_assignment(assignment)) == assignment
    eager = decode_metadata(encode_metadata(WorkerMetadata(config_offset=1, url="u")))
    assert eager.connectors == eager.tasks == ()


# -- properties -------------------------------------------------------------------------

layouts = st.lists(st.integers(min_value=0, max_value=5), min_size=1, max_size=6)


def test_revoking_rounds_in_a_row_are_backed_off() -> None:
    """KAFKA-12495: workers joining one after another do not make every round revoke."""
    snapshot = snapshot_of(connector("a", 12))
    assignor = CooperativeAssignor(max_delay_ms=300_000)
    alone, memory = assignor.assign("w1", {"w1": worker(snapshot.offset, "w1")}, snapshot,
                                    Memory(), 0)  # fmt: skip
    assert len(alone["w1"].tasks) == 12
    group = holding(snapshot.offset, alone) | {"w2": worker(snapshot.offset, "w2")}
    first, memory = assignor.assign("w1", group, snapshot, memory, 10)
    assert len(first["w1"].revoked_tasks) == 6 and memory.revoked_in_previous
    # before the follow-up round w3 joins too: this round would revoke again
    group = holding(snapshot.offset, first) | {"w3": worker(snapshot.offset, "w3")}
    second, memory = assignor.assign("w1", group, snapshot, memory, 20)
    assert not any(a.revoked_tasks for a in second.values())
    assert all(a.delay == 40 for a in second.values())
    # the unheld work still goes out, to those with room
    assert sorted(len(a.tasks) for a in second.values()) == [3, 3, 6]
    # after the backoff the group rejoins, and the load is balanced
    third, memory = assignor.assign("w1", holding(snapshot.offset, second), snapshot, memory, 60)
    assert sum(len(a.revoked_tasks) for a in third.values()) == 2
    fourth, memory = assignor.assign("w1", holding(snapshot.offset, third), snapshot, memory, 70)
    assert sorted(len(a.tasks) for a in fourth.values()) == [4, 4, 4]
    assert not memory.revoked_in_previous and memory.successive_revoking == 0


def test_no_backoff_when_the_scheduled_delay_is_zero() -> None:
    snapshot = snapshot_of(connector("a", 12))
    assignor = CooperativeAssignor(max_delay_ms=0)
    alone, memory = assignor.assign("w1", {"w1": worker(snapshot.offset, "w1")}, snapshot,
                                    Memory(), 0)  # fmt: skip
    group = holding(snapshot.offset, alone) | {"w2": worker(snapshot.offset, "w2")}
    first, memory = assignor.assign("w1", group, snapshot, memory, 10)
    group = holding(snapshot.offset, first) | {"w3": worker(snapshot.offset, "w3")}
    second, memory = assignor.assign("w1", group, snapshot, memory, 20)
    assert sum(len(a.revoked_tasks) for a in second.values()) > 0
    assert all(a.delay == 0 for a in second.values())


@st.composite
def clusters(draw: st.DrawFn) -> tuple[ClusterConfigSnapshot, dict[str, WorkerMetadata]]:
    """A config and members holding arbitrary (overlapping, stale) work."""
    counts = draw(layouts)
    records: list[ConfigRecord] = []
    for i, n in enumerate(counts):
        records += connector(f"c{i}", n)
    snapshot = snapshot_of(records)
    candidates_c = [f"c{i}" for i in range(len(counts) + 1)]
    candidates_t = [T(f"c{i}", j) for i in range(len(counts) + 1) for j in range(6)]
    ids = draw(st.lists(st.sampled_from([f"w{i}" for i in range(6)]), min_size=1, unique=True))
    group = {
        m: worker(
            snapshot.offset,
            m,
            tuple(draw(st.lists(st.sampled_from(candidates_c), max_size=3, unique=True))),
            tuple(draw(st.lists(st.sampled_from(candidates_t), max_size=6, unique=True))),
        )
        for m in ids
    }
    return snapshot, group


def _configured(snapshot: ClusterConfigSnapshot) -> tuple[set[str], set[T]]:
    return set(snapshot.connectors), {t for c in snapshot.connectors for t in snapshot.tasks(c)}


def _check_no_double_assignment(result: dict[str, Assignment]) -> None:
    tasks = Counter(t for a in result.values() for t in a.tasks)
    connectors = Counter(c for a in result.values() for c in a.connectors)
    assert all(n == 1 for n in tasks.values()), tasks
    assert all(n == 1 for n in connectors.values()), connectors


@settings(max_examples=300, deadline=None)
@given(clusters(), st.integers(min_value=0, max_value=10_000))
def test_work_is_never_given_twice_nor_while_another_member_holds_it(
    cluster: tuple[ClusterConfigSnapshot, dict[str, WorkerMetadata]], delay: int
) -> None:
    snapshot, group = cluster
    leader = sorted(group)[0]
    result, _ = CooperativeAssignor(max_delay_ms=delay).assign(leader, group, snapshot, Memory(), 0)
    _check_no_double_assignment(result)
    for member, assignment in result.items():
        held = set(group[member].tasks) | set(group[member].connectors)
        kept = held - set(assignment.revoked_tasks) - set(assignment.revoked_connectors)
        assert kept <= set(assignment.tasks) | set(assignment.connectors)
        new = (set(assignment.tasks) | set(assignment.connectors)) - held
        for other, metadata in group.items():
            if other != member:
                assert not new & (set(metadata.tasks) | set(metadata.connectors))


@settings(max_examples=300, deadline=None)
@given(clusters())
def test_after_the_follow_up_round_everything_runs_balanced_within_one(
    cluster: tuple[ClusterConfigSnapshot, dict[str, WorkerMetadata]],
) -> None:
    snapshot, group = cluster
    leader = sorted(group)[0]
    assignor = CooperativeAssignor()
    first, memory = assignor.assign(leader, group, snapshot, Memory(), 0)
    follow_up, memory = assignor.assign(
        leader, holding(snapshot.offset, first), snapshot, memory, 10
    )
    _check_no_double_assignment(follow_up)
    connectors, tasks = _configured(snapshot)
    assert {c for a in follow_up.values() for c in a.connectors} == connectors
    assert {t for a in follow_up.values() for t in a.tasks} == tasks
    for counts in (
        [len(a.connectors) for a in follow_up.values()],
        [len(a.tasks) for a in follow_up.values()],
    ):
        assert max(counts) - min(counts) <= 1
    assert not any(a.revoked_connectors or a.revoked_tasks for a in follow_up.values())
    # and it stays put
    settled, _ = assignor.assign(leader, holding(snapshot.offset, follow_up), snapshot, memory, 20)
    assert {m: (a.connectors, a.tasks) for m, a in settled.items()} == {
        m: (a.connectors, a.tasks) for m, a in follow_up.items()
    }


@settings(max_examples=200, deadline=None)
@given(clusters(), st.data())
def test_a_departed_members_work_waits_for_the_delay_then_runs_everywhere_balanced(
    cluster: tuple[ClusterConfigSnapshot, dict[str, WorkerMetadata]], data: st.DataObject
) -> None:
    snapshot, group = cluster
    if len(group) < 2:
        return
    assignor = CooperativeAssignor(max_delay_ms=1_000)
    leader = sorted(group)[0]
    first, memory = assignor.assign(leader, group, snapshot, Memory(), 0)
    settled, memory = assignor.assign(leader, holding(snapshot.offset, first), snapshot, memory, 1)
    gone = data.draw(st.sampled_from([m for m in sorted(group) if m != leader]))
    rest = {m: md for m, md in holding(snapshot.offset, settled).items() if m != gone}
    waiting, memory = assignor.assign(leader, rest, snapshot, memory, 10)
    _check_no_double_assignment(waiting)
    held_back = set(settled[gone].tasks) | set(settled[gone].connectors)
    given = {w for a in waiting.values() for w in (*a.tasks, *a.connectors)}
    assert not held_back & given
    assert all(a.delay == (1_000 if held_back else 0) for a in waiting.values())
    # the delay runs out: the lost work goes out, and one more round balances it
    late, memory = assignor.assign(
        leader, holding(snapshot.offset, waiting), snapshot, memory, 1_010
    )
    _check_no_double_assignment(late)
    again, _ = assignor.assign(leader, holding(snapshot.offset, late), snapshot, memory, 1_020)
    connectors, tasks = _configured(snapshot)
    assert {c for a in again.values() for c in a.connectors} == connectors
    assert {t for a in again.values() for t in a.tasks} == tasks
    for counts in (
        [len(a.connectors) for a in again.values()],
        [len(a.tasks) for a in again.values()],
    ):
        assert max(counts) - min(counts) <= 1
