"""Pure pieces behind the REST API: restart plans, logger levels, topic statuses, shapes."""

from __future__ import annotations

import json
import logging

import pytest

from herder.runtime.core.config_state import (
    ClusterLoggerLevel,
    ConfigState,
    RestartRequest,
    logger_level_record,
)
from herder.runtime.core.protocol import ConnectorTaskId as T
from herder.runtime.core.restart import RestartPlan, more_impactful
from herder.runtime.core.status import (
    ConnectorStatus,
    State,
    StatusView,
    TaskStatus,
    TopicStatus,
    topic_status_record,
)
from herder.runtime.loggers import Loggers, UnknownLevel
from tests.golden.conformance import golden, names, problems

pytestmark = pytest.mark.unit

TASKS = [T("c", 0), T("c", 1), T("c", 2)]


def plan(include_tasks: bool, only_failed: bool, connector: State) -> RestartPlan:
    statuses = {
        T("c", 0): TaskStatus(T("c", 0), State.RUNNING, "w", 1),
        T("c", 1): TaskStatus(T("c", 1), State.FAILED, "w", 1),
    }
    return RestartPlan.build(
        RestartRequest("c", include_tasks=include_tasks, only_failed=only_failed),
        ConnectorStatus("c", connector, "w", 1),
        TASKS,
        statuses,
    )


def test_restart_plans_follow_connects_flags() -> None:
    assert plan(False, False, State.RUNNING).restart_connector
    assert plan(False, False, State.RUNNING).tasks == ()
    everything = plan(True, False, State.RUNNING)
    assert everything.restart_connector and everything.tasks == tuple(TASKS)
    failed = plan(True, True, State.RUNNING)
    assert not failed.restart_connector and failed.tasks == (T("c", 1),)
    assert plan(True, True, State.FAILED).restart_connector
    assert plan(False, True, State.RUNNING).empty


def test_restart_plan_marks_restarted_instances_restarting() -> None:
    status = {
        "name": "c",
        "connector": {"state": "RUNNING", "worker_id": "w"},
        "tasks": [
            {"id": 0, "state": "RUNNING", "worker_id": "w"},
            {"id": 1, "state": "FAILED", "worker_id": "w", "trace": "boom"},
        ],
        "type": "source",
    }
    info = plan(True, True, State.RUNNING).state_info(status)
    assert info["connector"]["state"] == "RUNNING"
    assert [t["state"] for t in info["tasks"]] == ["RUNNING", "RESTARTING"]
    assert "trace" not in info["tasks"][1]
    assert status["tasks"][1]["state"] == "FAILED"  # the input is left alone


def test_the_more_impactful_pending_restart_wins() -> None:
    small = RestartRequest("c", include_tasks=False, only_failed=True)
    big = RestartRequest("c", include_tasks=True, only_failed=False)
    assert more_impactful(small, big) is big
    assert more_impactful(big, small) is big


def test_logger_levels_use_connects_names_and_cover_descendants() -> None:
    now = [1000.0]
    loggers = Loggers(clock=lambda: now[0])
    child = logging.getLogger("herder.test.rest.child")
    try:
        affected = loggers.set_level("herder.test.rest", "warn")
        assert affected == ["herder.test.rest", "herder.test.rest.child"]
        assert child.level == logging.WARNING
        assert loggers.level("herder.test.rest.child") == {
            "level": "WARN",
            "last_modified": 1_000_000,
        }
        assert loggers.level("herder.test.nothing.here") is None
        assert "herder.test.rest" in loggers.all_levels()
        with pytest.raises(UnknownLevel):
            loggers.set_level("herder.test.rest", "LOUD")
    finally:
        child.setLevel(logging.NOTSET)
        logging.getLogger("herder.test.rest").setLevel(logging.NOTSET)


def test_cluster_logger_level_records_are_commands() -> None:
    state = ConfigState()
    key, value = logger_level_record(ClusterLoggerLevel("herder.x", "DEBUG"))
    assert key == "logger-cluster-herder.x"
    assert state.apply(0, key, value) == ClusterLoggerLevel("herder.x", "DEBUG")
    assert state.snapshot().connectors == frozenset()


def test_topic_statuses_use_connects_records_and_ignore_generations() -> None:
    view = StatusView()
    key, value = topic_status_record(TopicStatus("orders", "c", 1, 42))
    assert key == "status-topic-orders:connector-c"
    assert json.loads(value) == {
        "topic": {"name": "orders", "connector": "c", "task": "c-1", "discoverTimestamp": 42}
    }
    assert view.apply(key, value)
    assert [t.topic for t in view.topics("c")] == ["orders"]
    assert view.topics("other") == []
    assert view.connectors() == []  # not mistaken for a connector's or a task's status
    assert view.apply(key, None) and view.topics("c") == []
    assert not view.apply("status-topic-x:connector-c", b"{bad json")


@pytest.mark.parametrize("name", names())
def test_golden_shapes_are_well_formed(name: str) -> None:
    document = golden(name)
    assert document["entity"] and document["endpoints"] and document["shape"]


def test_shape_checker_finds_what_differs() -> None:
    shape = golden("connector_state_info")["shape"]
    good = {
        "name": "c",
        "connector": {"state": "RUNNING", "worker_id": "w"},
        "tasks": [{"id": 0, "state": "FAILED", "worker_id": "w", "trace": "t"}],
        "type": "sink",
    }
    assert problems(shape, good) == []
    bad = {**good, "tasks": [{"id": "0", "state": "RUNNING", "worker_id": "w"}], "extra": 1}
    found = problems(shape, bad)
    assert "$: unexpected key 'extra'" in found
    assert any("$.tasks[0].id" in p for p in found)
    assert problems(shape, {k: v for k, v in good.items() if k != "type"}) == [
        "$: missing key 'type'"
    ]
    assert problems("integer|null", True) != []
