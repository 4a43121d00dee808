"""The eager round-robin assignor, on the layouts of Connect's WorkerCoordinatorTest and more."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from herder.runtime.core.assignor import EagerAssignor
from herder.runtime.core.config_state import (
    ClusterConfigSnapshot,
    ConfigRecord,
    ConfigState,
    TargetState,
    connector_config_record,
    target_state_record,
    task_commit_record,
    task_config_record,
    task_config_records,
)
from herder.runtime.core.protocol import (
    Assignment,
    AssignmentError,
    ConnectorTaskId,
    WorkerMetadata,
)

pytestmark = pytest.mark.unit

T = ConnectorTaskId


def snapshot_of(records: list[ConfigRecord]) -> ClusterConfigSnapshot:
    state = ConfigState()
    for offset, (key, value) in enumerate(records):
        state.apply(offset, key, value)
    return state.snapshot()


def connector(name: str, tasks: int) -> list[ConfigRecord]:
    config = {"connector.class": "FileStreamSource", "name": name}
    return [connector_config_record(name, config), *task_config_records(name, [config] * tasks)]


def members(offset: int, *ids: str) -> dict[str, WorkerMetadata]:
    return {m: WorkerMetadata(config_offset=offset, url=f"http://{m}:8083") for m in ids}


def assigned(
    leader: str, offset: int, connectors: list[str], tasks: list[ConnectorTaskId]
) -> Assignment:
    return Assignment(
        leader=leader,
        leader_url=f"http://{leader}:8083",
        config_offset=offset,
        connectors=tuple(connectors),
        tasks=tuple(tasks),
    )


def test_one_connector_with_two_tasks_on_two_workers() -> None:
    snapshot = snapshot_of(connector("connector1", 2))
    result = EagerAssignor().assign(
        "leader", members(snapshot.offset, "member", "leader"), snapshot
    )
    # connectors are dealt first: connector1 to "leader"; then its tasks carry on the walk
    assert result == {
        "leader": assigned("leader", snapshot.offset, ["connector1"], [T("connector1", 1)]),
        "member": assigned("leader", snapshot.offset, [], [T("connector1", 0)]),
    }


def test_three_single_task_connectors_on_two_workers() -> None:
    snapshot = snapshot_of(connector("c3", 1) + connector("c1", 1) + connector("c2", 1))
    result = EagerAssignor().assign("w2", members(snapshot.offset, "w2", "w1"), snapshot)
    assert result == {
        "w1": assigned("w2", snapshot.offset, ["c1", "c3"], [T("c2", 0)]),
        "w2": assigned("w2", snapshot.offset, ["c2"], [T("c1", 0), T("c3", 0)]),
    }


def test_two_connectors_with_three_tasks_on_two_workers() -> None:
    snapshot = snapshot_of(connector("connector1", 2) + connector("connector2", 1))
    result = EagerAssignor().assign(
        "leader", members(snapshot.offset, "leader", "member"), snapshot
    )
    assert result["leader"].connectors == ("connector1",)
    assert result["leader"].tasks == (T("connector1", 0), T("connector2", 0))
    assert result["member"].connectors == ("connector2",)
    assert result["member"].tasks == (T("connector1", 1),)


def test_a_leader_behind_a_member_assigns_nothing_and_reports_config_mismatch() -> None:
    snapshot = snapshot_of(connector("c1", 2))
    workers = members(snapshot.offset, "leader", "member")
    workers["member"] = WorkerMetadata(config_offset=snapshot.offset + 4, url="http://member:8083")
    result = EagerAssignor().assign("leader", workers, snapshot)
    mismatch = Assignment(
        error=AssignmentError.CONFIG_MISMATCH,
        leader="leader",
        leader_url="http://leader:8083",
        config_offset=snapshot.offset + 4,
    )
    assert result == {"leader": mismatch, "member": mismatch}
    assert all(a.failed for a in result.values())


def test_members_behind_the_leader_still_get_work_at_the_leaders_offset() -> None:
    snapshot = snapshot_of(connector("c1", 1))
    workers = members(snapshot.offset, "leader") | members(-1, "member")
    result = EagerAssignor().assign("leader", workers, snapshot)
    assert not any(a.failed for a in result.values())
    assert {a.config_offset for a in result.values()} == {snapshot.offset}


def test_a_stopped_connector_is_assigned_but_its_tasks_are_not() -> None:
    snapshot = snapshot_of(
        connector("a", 2) + connector("b", 2) + [target_state_record("a", TargetState.STOPPED)]
    )
    result = EagerAssignor().assign("w1", members(snapshot.offset, "w1", "w2"), snapshot)
    assert result["w1"].connectors == ("a",)
    assert result["w2"].connectors == ("b",)
    every_task = [t for a in result.values() for t in a.tasks]
    assert sorted(every_task) == [T("b", 0), T("b", 1)]


def test_a_paused_connector_keeps_its_tasks_where_a_started_one_would() -> None:
    started = snapshot_of(connector("a", 3))
    paused = snapshot_of([*connector("a", 3), target_state_record("a", TargetState.PAUSED)])
    group = members(started.offset, "w1", "w2")
    as_paused = EagerAssignor().assign("w1", group, paused)
    as_started = EagerAssignor().assign("w1", group, started)
    assert as_paused["w2"].tasks == (T("a", 0), T("a", 2))
    assert {m: (a.connectors, a.tasks) for m, a in as_paused.items()} == {
        m: (a.connectors, a.tasks) for m, a in as_started.items()
    }


def test_a_connector_with_an_inconsistent_task_set_is_assigned_without_tasks() -> None:
    config = {"name": "bad"}
    snapshot = snapshot_of(
        [
            connector_config_record("bad", config),
            task_config_record(T("bad", 0), config),
            task_commit_record("bad", 2),
            *connector("good", 1),
        ]
    )
    assert snapshot.inconsistent == {"bad"}
    result = EagerAssignor().assign("w1", members(snapshot.offset, "w1", "w2"), snapshot)
    assert result["w1"].connectors == ("bad",)
    assert result["w2"].connectors == ("good",)
    assert [t for a in result.values() for t in a.tasks] == [T("good", 0)]


def test_an_idle_member_gets_an_empty_assignment() -> None:
    snapshot = snapshot_of(connector("only", 0))
    result = EagerAssignor().assign("w1", members(snapshot.offset, "w1", "w2", "w3"), snapshot)
    assert result["w3"] == assigned("w1", snapshot.offset, [], [])


def test_the_leader_must_be_a_member() -> None:
    with pytest.raises(ValueError, match="leader"):
        EagerAssignor().assign("ghost", members(-1, "w1"), ClusterConfigSnapshot.EMPTY)


layouts = st.tuples(
    st.sets(st.text("abcdefgh", min_size=1, max_size=3), min_size=1, max_size=6),
    st.dictionaries(
        st.text("xyz-", min_size=1, max_size=4), st.integers(0, 5), min_size=0, max_size=8
    ),
)


@given(layouts)
def test_every_unit_is_dealt_once_and_the_load_differs_by_at_most_one(
    layout: tuple[set[str], dict[str, int]],
) -> None:
    worker_ids, task_counts = layout
    records = [r for name, n in sorted(task_counts.items()) for r in connector(name, n)]
    snapshot = snapshot_of(records)
    result = EagerAssignor().assign(
        min(worker_ids), members(snapshot.offset, *worker_ids), snapshot
    )

    assert result.keys() == worker_ids
    dealt_connectors = Counter(c for a in result.values() for c in a.connectors)
    dealt_tasks = Counter(t for a in result.values() for t in a.tasks)
    assert dealt_connectors == Counter(task_counts.keys())
    assert dealt_tasks == Counter(T(name, i) for name, n in task_counts.items() for i in range(n))
    loads = [len(a.connectors) + len(a.tasks) for a in result.values()]
    assert max(loads) - min(loads) <= 1
    # the same inputs always give the same answer
    assert (
        EagerAssignor().assign(
            min(worker_ids), members(snapshot.offset, *sorted(worker_ids, reverse=True)), snapshot
        )
        == result
    )


def test_work_still_held_from_a_cooperative_generation_is_revoked_before_any_is_dealt() -> None:
    snapshot = snapshot_of(connector("a", 2))
    workers = members(snapshot.offset, "w1", "w2")
    workers["w2"] = WorkerMetadata(
        version=2, config_offset=snapshot.offset, url="http://w2:8083", tasks=(T("a", 1),)
    )
    result = EagerAssignor().assign("w1", workers, snapshot)
    assert all(a.connectors == a.tasks == () for a in result.values())
    assert result["w2"].revoked_tasks == (T("a", 1),)
    assert result["w1"].revoked_tasks == ()
