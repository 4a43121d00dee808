"""The REST API's views of connectors and tasks, and how an error becomes a status code."""

from __future__ import annotations

import asyncio
import importlib
import json

import pytest

from herder.connectors.file import FileStreamSinkConnector, FileStreamSourceConnector
from herder.errors import (
    ConfigError,
    ErrorCode,
    HerderError,
    RebalanceInProgress,
    ServerStopping,
    error_from_code,
    with_advice,
)
from herder.runtime.core.admission import (
    AlreadyExists,
    ConfigChanged,
    NotFound,
    NotLeaderWorker,
    NotOwner,
    WrongWorker,
)
from herder.runtime.core.config_state import (
    ClusterConfigSnapshot,
    ConfigState,
    connector_config_record,
    task_config_records,
)
from herder.runtime.core.protocol import ConnectorTaskId as T
from herder.runtime.core.status import ConnectorStatus, State, StatusView, TaskStatus, status_record
from herder.runtime.loggers import UnknownLevel
from herder.runtime.plugins import Plugins, UnknownPlugin
from herder.runtime.rest import views
from herder.runtime.rest.errors import Conflict, Forbidden, herder_error
from tests.golden.conformance import assert_conforms

pytestmark = pytest.mark.unit

PLUGINS = Plugins([FileStreamSourceConnector, FileStreamSinkConnector])
SOURCE = {"connector.class": "FileStreamSource", "file": "/tmp/in", "topic": "t", "name": "src"}
SINK = {"connector.class": "FileStreamSink", "file": "/tmp/out", "topics": "t", "name": "snk"}


def snapshot() -> ClusterConfigSnapshot:
    state = ConfigState()
    records = [
        connector_config_record("src", SOURCE),
        *task_config_records("src", [{"file": "/tmp/in", "n": "0"}, {"file": "/tmp/in", "n": "1"}]),
        connector_config_record("snk", SINK),
        connector_config_record("odd", {"connector.class": "no.such.Connector", "name": "odd"}),
    ]
    for offset, (key, value) in enumerate(records):
        state.apply(offset, key, value)
    return state.snapshot()


def statuses() -> StatusView:
    view = StatusView()
    for status in (
        ConnectorStatus("src", State.RUNNING, "127.0.0.1:8083", 3),
        TaskStatus(T("src", 0), State.RUNNING, "127.0.0.1:8083", 3),
        TaskStatus(T("src", 1), State.FAILED, "127.0.0.1:8084", 3, "Traceback: boom"),
    ):
        view.apply(*status_record(status))
    return view


def test_views_show_connects_entities() -> None:
    snap, view = snapshot(), statuses()
    assert views.connector_names(snap) == ["odd", "snk", "src"]
    info = views.connector_info(snap, PLUGINS, "src")
    assert_conforms("connector_info", info)
    assert info["tasks"] == [{"connector": "src", "task": 0}, {"connector": "src", "task": 1}]
    assert info["type"] == "source" and info["config"] == SOURCE
    assert views.connector_info(snap, PLUGINS, "snk")["type"] == "sink"
    assert views.connector_info(snap, PLUGINS, "odd")["type"] == "unknown"

    status = views.connector_status(snap, view, PLUGINS, "src")
    assert_conforms("connector_state_info", status)
    assert status["connector"] == {"state": "RUNNING", "worker_id": "127.0.0.1:8083"}
    assert status["tasks"][1] == {
        "id": 1,
        "state": "FAILED",
        "worker_id": "127.0.0.1:8084",
        "trace": "Traceback: boom",
    }
    # a connector no worker has reported on yet
    assert views.connector_status(snap, view, PLUGINS, "snk")["connector"] == {
        "state": "UNASSIGNED",
        "worker_id": "",
    }
    task = views.task_status(snap, view, "src", 0)
    assert_conforms("task_state", task)
    configs = views.task_configs(snap, "src")
    assert_conforms("task_infos", configs)
    assert configs[1] == {
        "id": {"connector": "src", "task": 1},
        "config": {"file": "/tmp/in", "n": "1"},
    }
    assert views.task_configs(snap, "snk") == []


def test_views_of_what_is_not_there_are_not_found() -> None:
    snap, view = snapshot(), statuses()
    for call in (
        lambda: views.connector_info(snap, PLUGINS, "nope"),
        lambda: views.connector_status(snap, view, PLUGINS, "nope"),
        lambda: views.task_configs(snap, "nope"),
        lambda: views.task_status(snap, view, "src", 7),
        lambda: views.task_status(snap, view, "nope", 0),
    ):
        with pytest.raises(NotFound, match=r"nope|src-7"):
            call()


STATUSES: list[tuple[type[HerderError], int]] = [
    (HerderError, 500),
    (ConfigError, 400),
    (NotFound, 404),
    (UnknownPlugin, 404),
    (UnknownLevel, 404),
    (Forbidden, 403),
    (AlreadyExists, 409),
    (ConfigChanged, 409),
    (Conflict, 409),
    (RebalanceInProgress, 409),
    (ServerStopping, 503),
]


@pytest.mark.parametrize(("error", "status"), STATUSES, ids=[e.__name__ for e, _ in STATUSES])
def test_an_error_answers_the_status_its_class_declares(
    error: type[HerderError], status: int
) -> None:
    assert error.http_status == status
    response = asyncio.run(herder_error(None, error("what went wrong")))  # type: ignore[arg-type]
    assert response.status_code == status
    body = json.loads(bytes(response.body))
    assert body["error_code"] == status and body["message"].startswith("what went wrong")
    # what to do next, where the class can say
    assert body["message"] == with_advice(error("what went wrong"))


def test_the_rest_layer_reads_the_status_from_the_class_alone() -> None:
    class Teapot(HerderError):
        code = ErrorCode.NOT_SUPPORTED
        http_status = 418

    response = asyncio.run(herder_error(None, Teapot("short and stout")))  # type: ignore[arg-type]
    assert response.status_code == 418


def test_the_errors_a_worker_can_meet_declare_a_code_and_a_status() -> None:
    for module in ("herder.runtime.rest.app", "herder.runtime.standalone"):
        importlib.import_module(module)
    found: list[type[HerderError]] = []
    pending = [HerderError]
    while pending:
        klass = pending.pop()
        found.append(klass)
        pending.extend(klass.__subclasses__())
    assert {WrongWorker, NotLeaderWorker, NotOwner, NotFound, Conflict} <= set(found)
    for klass in found:
        assert isinstance(klass.code, ErrorCode), klass
        assert 400 <= klass.http_status < 600, klass
    for wrong in (NotLeaderWorker("http://w:8083"), NotOwner("Task c-0", None)):
        assert isinstance(wrong, WrongWorker) and wrong.http_status == 409
    assert NotLeaderWorker(None).code is ErrorCode.NOT_LEADER
    assert NotOwner("Task c-0", None).code is ErrorCode.WRONG_WORKER
    # herder's own codes come back as their classes from a peer
    assert type(error_from_code(ErrorCode.NOT_FOUND, "gone")) is NotFound
    assert type(error_from_code(ErrorCode.ALREADY_EXISTS, "dup")) is AlreadyExists


def test_a_message_ends_with_what_to_do_next_once() -> None:
    missing = NotFound("Connector nope not found")
    assert with_advice(missing) == (
        "Connector nope not found; GET /connectors lists the connectors, "
        "GET /connectors/<name>/tasks their tasks"
    )
    assert with_advice(NotFound(with_advice(missing))) == with_advice(missing)  # not twice
    assert with_advice(UnknownLevel("invalid log level 'LOUD'.")).endswith(
        "'LOUD'; use one of TRACE, DEBUG, INFO, WARN, ERROR, FATAL or OFF"
    )
    assert with_advice(HerderError("no advice of its own")) == "no advice of its own"
    assert "GET /connector-plugins" in with_advice(UnknownPlugin("Unknown plugin x."))
