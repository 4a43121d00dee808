"""The in-memory view of ``_configs``: commits, inconsistent task sets, deletes, diffs."""

from __future__ import annotations

import json

import pytest

from herder.runtime.core.config_state import (
    ClusterConfigSnapshot,
    ConfigDiff,
    ConfigRecord,
    ConfigState,
    RestartRequest,
    TargetState,
    connector_config_record,
    connector_removal_record,
    restart_request_record,
    target_state_record,
    task_commit_record,
    task_config_record,
    task_config_records,
)
from herder.runtime.core.protocol import ConnectorTaskId

pytestmark = pytest.mark.unit

T = ConnectorTaskId
CONFIG = {"connector.class": "FileStreamSource", "file": "/tmp/in", "topic": "lines"}


def view(snapshot: ClusterConfigSnapshot) -> dict[str, object]:
    """Everything a snapshot shows, for comparing whole snapshots."""
    return {
        name: (
            snapshot.connector_config(name),
            snapshot.target_state(name),
            snapshot.task_configs(name),
            name in snapshot.inconsistent,
        )
        for name in snapshot.connectors
    }


def task(n: int) -> dict[str, str]:
    return {"file": f"/tmp/in.{n}", "topic": "lines"}


class Log:
    """A config log being written and read, offsets given out in order."""

    def __init__(self) -> None:
        self.state = ConfigState()
        self.offset = 0

    def append(self, *records: ConfigRecord) -> list[RestartRequest]:
        requests = []
        for key, value in records:
            request = self.state.apply(self.offset, key, value)
            self.offset += 1
            if request is not None:
                requests.append(request)
        return requests

    def snapshot(self) -> ClusterConfigSnapshot:
        return self.state.snapshot()


def test_records_use_connects_keys_and_json_bodies() -> None:
    assert connector_config_record("c", {"a": "1"}) == ("connector-c", b'{"properties":{"a":"1"}}')
    assert connector_removal_record("c") == ("connector-c", None)
    assert task_config_record(T("c", 2), {"a": "1"}) == ("task-c-2", b'{"properties":{"a":"1"}}')
    assert task_commit_record("c", 3) == ("commit-c", b'{"tasks":3}')
    assert target_state_record("c", TargetState.PAUSED) == ("target-state-c", b'{"state":"PAUSED"}')
    key, value = restart_request_record(RestartRequest("c", include_tasks=True))
    assert key == "restart-connector-c"
    assert value is not None
    assert json.loads(value) == {"include-tasks": True, "only-failed": False}
    assert [k for k, _ in task_config_records("c", [task(0), task(1)])] == [
        "task-c-0",
        "task-c-1",
        "commit-c",
    ]


def test_a_new_connector_is_started_and_has_no_tasks_yet() -> None:
    log = Log()
    log.append(connector_config_record("my-conn", CONFIG))
    snapshot = log.snapshot()
    assert snapshot.connectors == {"my-conn"}
    assert "my-conn" in snapshot
    assert snapshot.connector_config("my-conn") == CONFIG
    assert snapshot.target_state("my-conn") is TargetState.STARTED
    assert snapshot.tasks("my-conn") == []
    assert snapshot.offset == 1


def test_task_configs_are_invisible_until_their_commit() -> None:
    log = Log()
    log.append(connector_config_record("c", CONFIG), *task_config_records("c", [task(0)]))
    log.append(task_config_record(T("c", 0), task(10)), task_config_record(T("c", 1), task(11)))
    staged = log.snapshot()
    assert staged.task_configs("c") == [task(0)]
    assert staged.tasks("c") == [T("c", 0)]

    log.append(task_commit_record("c", 2))
    committed = log.snapshot()
    assert committed.task_configs("c") == [task(10), task(11)]
    assert committed.tasks("c") == [T("c", 0), T("c", 1)]
    assert committed.task_count("c") == 2
    assert committed.task_config(T("c", 1)) == task(11)
    assert committed.task_config(T("c", 2)) is None
    assert committed.inconsistent == frozenset()


def test_connector_names_with_dashes_keep_their_tasks_apart() -> None:
    log = Log()
    log.append(connector_config_record("a", CONFIG), connector_config_record("a-1", CONFIG))
    log.append(*task_config_records("a-1", [task(0)]), *task_config_records("a", [task(5)] * 2))
    snapshot = log.snapshot()
    assert snapshot.task_configs("a-1") == [task(0)]
    assert snapshot.task_configs("a") == [task(5), task(5)]


def test_a_commit_with_a_different_task_count_makes_the_connector_inconsistent() -> None:
    log = Log()
    log.append(connector_config_record("c", CONFIG), *task_config_records("c", [task(0)]))
    # a leader died after writing one of two task configs; its successor commits 2
    log.append(task_config_record(T("c", 0), task(20)), task_commit_record("c", 2))
    broken = log.snapshot()
    assert broken.inconsistent == {"c"}
    assert broken.tasks("c") == []
    assert broken.task_configs("c") == []
    assert broken.task_count("c") == 0
    assert broken.task_config(T("c", 0)) is None
    assert broken.connector_config("c") == CONFIG

    # staged configs do not outlive a commit: the half-set above cannot be completed later
    log.append(task_config_record(T("c", 1), task(21)), task_commit_record("c", 2))
    assert log.snapshot().inconsistent == {"c"}

    log.append(*task_config_records("c", [task(30), task(31)]))
    fixed = log.snapshot()
    assert fixed.inconsistent == frozenset()
    assert fixed.task_configs("c") == [task(30), task(31)]


def test_task_configs_past_the_committed_count_are_tolerated_as_compaction_leftovers() -> None:
    log = Log()
    log.append(connector_config_record("c", CONFIG))
    log.append(task_config_record(T("c", 2), task(2)), *task_config_records("c", [task(0)]))
    snapshot = log.snapshot()
    assert snapshot.inconsistent == frozenset()
    assert snapshot.task_configs("c") == [task(0)]


def test_scaling_down_and_to_zero_tasks() -> None:
    log = Log()
    log.append(connector_config_record("c", CONFIG), *task_config_records("c", [task(0), task(1)]))
    log.append(*task_config_records("c", [task(0)]))
    assert log.snapshot().tasks("c") == [T("c", 0)]
    log.append(*task_config_records("c", []))
    assert log.snapshot().tasks("c") == []
    assert log.snapshot().inconsistent == frozenset()


def test_deleting_a_connector_forgets_its_tasks_and_target_state() -> None:
    log = Log()
    log.append(connector_config_record("c", CONFIG), *task_config_records("c", [task(0)]))
    log.append(target_state_record("c", TargetState.PAUSED), task_config_record(T("c", 1), task(1)))
    log.append(connector_removal_record("c"))
    gone = log.snapshot()
    assert gone.connectors == frozenset()
    assert "c" not in gone
    assert gone.connector_config("c") is None
    assert gone.target_state("c") is None
    assert gone.tasks("c") == []

    log.append(connector_config_record("c", CONFIG), task_commit_record("c", 0))
    recreated = log.snapshot()
    assert recreated.target_state("c") is TargetState.STARTED
    assert recreated.tasks("c") == []
    assert recreated.inconsistent == frozenset()


def test_target_states() -> None:
    log = Log()
    log.append(connector_config_record("c", CONFIG))
    for state in (TargetState.PAUSED, TargetState.STOPPED, TargetState.STARTED):
        log.append(target_state_record("c", state))
        assert log.snapshot().target_state("c") is state
    log.append(target_state_record("c", TargetState.STOPPED), ("target-state-c", None))
    assert log.snapshot().target_state("c") is TargetState.STARTED


def test_a_target_state_written_before_the_connector_applies_when_it_appears() -> None:
    log = Log()
    log.append(target_state_record("c", TargetState.STOPPED))
    assert log.snapshot().target_state("c") is None
    log.append(connector_config_record("c", CONFIG))
    assert log.snapshot().target_state("c") is TargetState.STOPPED


def test_restart_requests_are_returned_not_kept() -> None:
    log = Log()
    log.append(connector_config_record("c", CONFIG))
    request = RestartRequest("c", include_tasks=True, only_failed=True)
    before = log.snapshot()
    assert log.append(restart_request_record(request)) == [request]
    assert view(log.snapshot()) == view(before)
    assert log.snapshot().offset == 2


@pytest.mark.parametrize(
    "record",
    [
        ("connector-c", b"{not json"),
        ("connector-c", b'{"properties": {"tasks.max": 1}}'),
        ("connector-c", b"[1, 2]"),
        ("task-c-x", b'{"properties": {}}'),
        ("task-", b'{"properties": {}}'),
        ("commit-c", b'{"tasks": "two"}'),
        ("commit-c", b'{"tasks": -1}'),
        ("target-state-c", b'{"state": "SLEEPING"}'),
        ("restart-connector-c", b"null"),
        ("session-key", b'{"key": "abc"}'),
    ],
)
def test_malformed_or_foreign_records_are_skipped_but_consumed(record: ConfigRecord) -> None:
    log = Log()
    log.append(connector_config_record("c", CONFIG), *task_config_records("c", [task(0)]))
    before = log.snapshot()
    log.append(record)
    after = log.snapshot()
    assert after.offset == before.offset + 1
    assert view(after) == view(before) == {"c": (CONFIG, TargetState.STARTED, [task(0)], False)}


def test_offsets_only_move_forward() -> None:
    state = ConfigState()
    assert state.snapshot() == ClusterConfigSnapshot.EMPTY
    assert ClusterConfigSnapshot.EMPTY.offset == -1
    state.apply(4, *connector_config_record("c", CONFIG))
    assert state.offset == state.snapshot().offset == 5
    with pytest.raises(ValueError, match="behind"):
        state.apply(3, *connector_config_record("d", CONFIG))


def test_snapshots_do_not_change_after_they_are_taken() -> None:
    log = Log()
    log.append(connector_config_record("c", CONFIG), *task_config_records("c", [task(0)]))
    snapshot = log.snapshot()
    log.append(connector_config_record("c", {"changed": "yes"}), connector_removal_record("c"))
    snapshot.connector_config("c")["file"] = "mutated"  # type: ignore[index]
    snapshot.task_configs("c")[0]["file"] = "mutated"
    assert snapshot.connector_config("c") == CONFIG
    assert snapshot.task_configs("c") == [task(0)]


def diff(before: Log, *records: ConfigRecord) -> ConfigDiff:
    old = before.snapshot()
    before.append(*records)
    return ConfigDiff.between(old, before.snapshot())


@pytest.fixture
def running() -> Log:
    log = Log()
    log.append(connector_config_record("a", CONFIG), *task_config_records("a", [task(0)]))
    log.append(connector_config_record("b", CONFIG), *task_config_records("b", [task(1)]))
    return log


def test_diff_of_nothing_is_empty(running: Log) -> None:
    result = diff(running, ("session-key", b"{}"))
    assert result == ConfigDiff()
    assert result.empty
    assert not result.needs_rebalance


def test_diff_added_and_removed_connectors_rebalance(running: Log) -> None:
    result = diff(running, connector_config_record("c", CONFIG), connector_removal_record("a"))
    assert result == ConfigDiff(added=frozenset({"c"}), removed=frozenset({"a"}))
    assert result.needs_rebalance


def test_diff_connector_config_change_restarts_in_place(running: Log) -> None:
    result = diff(running, connector_config_record("a", CONFIG | {"file": "/tmp/other"}))
    assert result == ConfigDiff(connector_configs_changed=frozenset({"a"}))
    assert not result.needs_rebalance
    assert not result.empty


def test_diff_task_config_change_rebalances(running: Log) -> None:
    result = diff(running, *task_config_records("b", [task(1), task(2)]))
    assert result == ConfigDiff(task_configs_changed=frozenset({"b"}))
    assert result.needs_rebalance


def test_diff_rewriting_identical_task_configs_is_a_new_task_set(running: Log) -> None:
    # the leader writes an equal task set after a connector config change so that the
    # tasks restart with the new connector config (Connect's KAFKA-9228): workers must see it
    result = diff(running, *task_config_records("b", [task(1)]))
    assert result == ConfigDiff(task_configs_changed=frozenset({"b"}))
    assert result.needs_rebalance


def test_diff_unrelated_records_leave_task_sets_alone(running: Log) -> None:
    assert diff(running, target_state_record("a", TargetState.STARTED)).empty


def test_diff_a_connector_turning_inconsistent_rebalances(running: Log) -> None:
    result = diff(running, task_commit_record("a", 1))
    assert result.task_configs_changed == {"a"}


def test_diff_target_state_change_is_handled_in_place(running: Log) -> None:
    result = diff(running, target_state_record("b", TargetState.PAUSED))
    assert result == ConfigDiff(target_states_changed=frozenset({"b"}))
    assert not result.needs_rebalance


def test_a_worker_reading_the_compacted_log_agrees_with_one_that_followed_it() -> None:
    """Delete a PAUSED connector of two tasks and create it again: a worker that reads
    the log from the start after compaction must see what the live ones see."""
    from herder.ensemble.state import StateMachine
    from herder.ensemble.txn import Append, CreateLog, TxnHeader, WriteTxn
    from herder.runtime.core.config_state import connector_removal_records

    sm = StateMachine()
    zxids = iter(range(1, 100))
    live = ConfigState()

    def write(*records: tuple[str, bytes | None]) -> None:
        start = sm.end_offset("_configs")
        ops = [Append("_configs", key.encode(), value) for key, value in records]
        sm.apply(WriteTxn(TxnHeader((1 << 32) | next(zxids), 0), ops))
        for offset, (key, value) in enumerate(records, start):
            live.apply(offset, key, value)

    sm.apply(WriteTxn(TxnHeader((1 << 32) | next(zxids), 0), [CreateLog("_configs", True)]))
    write(connector_config_record("c", CONFIG), *task_config_records("c", [task(0), task(1)]))
    write(target_state_record("c", TargetState.PAUSED))
    write(*connector_removal_records("c", 2))
    write(connector_config_record("c", {**CONFIG, "again": "yes"}))

    fresh = ConfigState()
    for record in sm.read("_configs", 0, 1000):
        fresh.apply(record.offset, record.key.decode(), record.value)
    assert view(fresh.snapshot()) == view(live.snapshot())
    assert fresh.snapshot().target_state("c") is TargetState.STARTED
    assert fresh.snapshot().tasks("c") == []


def test_a_worker_behind_a_deletion_forgets_the_task_set_when_compaction_took_its_record() -> None:
    """A worker that had read up to before a connector's deletion reads on after the
    connector was created again: compaction has replaced the deletion's first record
    with the new config, so only the task and commit tombstones tell it the old tasks
    are gone."""
    from herder.ensemble.state import StateMachine
    from herder.ensemble.txn import Append, CreateLog, TxnHeader, WriteTxn
    from herder.runtime.core.config_state import connector_removal_records

    sm = StateMachine()
    zxids = iter(range(1, 100))
    live, behind = ConfigState(), ConfigState()

    def write(*records: tuple[str, bytes | None]) -> None:
        start = sm.end_offset("_configs")
        ops = [Append("_configs", key.encode(), value) for key, value in records]
        sm.apply(WriteTxn(TxnHeader((1 << 32) | next(zxids), 0), ops))
        for offset, (key, value) in enumerate(records, start):
            live.apply(offset, key, value)

    def read(state: ConfigState, start: int) -> int:
        for record in sm.read("_configs", start, 1000):
            state.apply(record.offset, record.key.decode(), record.value)
            start = record.offset + 1
        return start

    sm.apply(WriteTxn(TxnHeader((1 << 32) | next(zxids), 0), [CreateLog("_configs", True)]))
    write(connector_config_record("c", CONFIG), *task_config_records("c", [task(0), task(1)]))
    position = read(behind, 0)
    assert behind.snapshot().tasks("c") == [T("c", 0), T("c", 1)]
    write(*connector_removal_records("c", 2))
    write(connector_config_record("c", {**CONFIG, "again": "yes"}))
    read(behind, position)
    assert view(behind.snapshot()) == view(live.snapshot())
    assert behind.snapshot().tasks("c") == []
