"""Connector and task status: the ``_status`` record format and the generation rule."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from herder.runtime.core.protocol import ConnectorTaskId
from herder.runtime.core.status import (
    ConnectorStatus,
    State,
    Status,
    StatusView,
    TaskStatus,
    decode_status,
    status_record,
)

pytestmark = pytest.mark.unit

T = ConnectorTaskId


def publish(view: StatusView, status: Status) -> bool:
    return view.apply(*status_record(status))


def test_records_use_connects_keys_and_fields() -> None:
    key, value = status_record(ConnectorStatus("my-conn", State.FAILED, "w1:8083", 7, "Boom"))
    assert key == "status-connector-my-conn"
    assert value is not None
    assert json.loads(value) == {
        "state": "FAILED",
        "trace": "Boom",
        "worker_id": "w1:8083",
        "generation": 7,
    }
    assert status_record(TaskStatus(T("my-conn", 3), State.RUNNING, "w1", 1))[0] == (
        "status-task-my-conn-3"
    )


statuses = st.one_of(
    st.builds(
        ConnectorStatus,
        st.text(min_size=1),
        st.sampled_from([s for s in State if s is not State.DESTROYED]),
        st.text(),
        st.integers(min_value=-1, max_value=2**31),
        st.none() | st.text(),
    ),
    st.builds(
        TaskStatus,
        st.builds(T, st.text(min_size=1), st.integers(min_value=0, max_value=10_000)),
        st.sampled_from([s for s in State if s is not State.DESTROYED]),
        st.text(),
        st.integers(min_value=-1, max_value=2**31),
        st.none() | st.text(),
        st.none()
        | st.dictionaries(
            st.sampled_from(["bytes", "seconds"]),
            st.integers(min_value=0, max_value=2**62) | st.floats(0, 1e9),
        ),
    ),
)


@given(statuses)
def test_statuses_round_trip(status: Status) -> None:
    key, value = status_record(status)
    assert value is not None
    assert decode_status(key, value) == status


def test_a_tasks_lag_is_in_its_record_only_when_it_has_one() -> None:
    task = T("cdc", 0)
    _, value = status_record(
        TaskStatus(task, State.PAUSED, "w1", 2, lag={"bytes": 4096, "seconds": 1.5})
    )
    assert value is not None
    assert json.loads(value)["lag"] == {"bytes": 4096, "seconds": 1.5}
    plain = status_record(TaskStatus(task, State.RUNNING, "w1", 2))[1]
    assert plain is not None and "lag" not in json.loads(plain)


def test_a_destroyed_status_is_written_as_a_tombstone() -> None:
    assert status_record(ConnectorStatus("c", State.DESTROYED, "w1", 3)) == (
        "status-connector-c",
        None,
    )


def test_a_newer_generation_replaces_an_older_one_and_never_the_reverse() -> None:
    view = StatusView()
    new_owner = TaskStatus(T("c", 0), State.RUNNING, "w2", 5)
    old_owner = TaskStatus(T("c", 0), State.UNASSIGNED, "w1", 4)
    assert publish(view, TaskStatus(T("c", 0), State.RUNNING, "w1", 4))
    assert publish(view, new_owner)
    # the previous owner reports it stopped the task after the new owner started it
    assert not publish(view, old_owner)
    assert view.task(T("c", 0)) == new_owner
    assert not view.supersedes(old_owner)


def test_the_same_generation_replaces() -> None:
    view = StatusView()
    publish(view, ConnectorStatus("c", State.RUNNING, "w1", 2))
    failed = ConnectorStatus("c", State.FAILED, "w1", 2, "Traceback ...")
    assert publish(view, failed)
    assert view.connector("c") == failed


def test_tombstones_delete_whatever_generation_wrote_last() -> None:
    view = StatusView()
    publish(view, ConnectorStatus("c", State.RUNNING, "w1", 9))
    publish(view, TaskStatus(T("c", 0), State.RUNNING, "w1", 9))
    assert publish(view, ConnectorStatus("c", State.DESTROYED, "w2", 1))
    assert view.apply("status-task-c-0", None)
    assert view.connector("c") is None
    assert view.task(T("c", 0)) is None
    assert view.connectors() == []
    assert not view.apply("status-task-c-0", None)

    # once deleted, any generation may report again: a new connector of the same name
    assert publish(view, ConnectorStatus("c", State.RUNNING, "w1", 1))


def test_a_destroyed_value_read_from_the_log_deletes_too() -> None:
    view = StatusView()
    publish(view, ConnectorStatus("c", State.RUNNING, "w1", 9))
    body = {"state": "DESTROYED", "trace": None, "worker_id": "w1", "generation": 1}
    assert view.apply("status-connector-c", json.dumps(body).encode())
    assert view.connector("c") is None


def test_tasks_are_listed_per_connector_in_order() -> None:
    view = StatusView()
    for task in (T("c", 10), T("c", 2), T("c-1", 0), T("d", 0)):
        publish(view, TaskStatus(task, State.RUNNING, "w1", 1))
    assert [s.id for s in view.tasks("c")] == [T("c", 2), T("c", 10)]
    assert [s.id for s in view.tasks("c-1")] == [T("c-1", 0)]


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("status-connector-c", b"{oops"),
        ("status-connector-c", b'{"state": "DANCING", "worker_id": "w", "generation": 1}'),
        ("status-connector-c", b'{"state": "RUNNING", "worker_id": "w", "generation": "1"}'),
        ("status-connector-c", b'{"state": "RUNNING", "generation": 1}'),
        ("status-task-c", b'{"state": "RUNNING", "worker_id": "w", "generation": 1}'),
        ("status-topic-t:connector-c", b'{"topic": {}}'),
        (
            "status-task-c-0",
            b'{"state": "RUNNING", "worker_id": "w", "generation": 1, "lag": {"bytes": "9"}}',
        ),
    ],
)
def test_malformed_records_are_skipped(key: str, value: bytes) -> None:
    view = StatusView()
    running = ConnectorStatus("c", State.RUNNING, "w1", 1)
    publish(view, running)
    assert not view.apply(key, value)
    assert view.connector("c") == running
    assert view.tasks("c") == []
