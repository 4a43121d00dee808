"""Connector and task status, as workers publish it to the compacted ``_status`` log.

Each worker writes the state of what it runs; everyone reads the log to answer
``GET /connectors/<name>/status``. During a rebalance the old owner of a task may still
be reporting it stopped (UNASSIGNED) after the new owner reported it RUNNING, so the
group *generation* each status was written in decides: a status from an older
generation never replaces one from a newer generation, whatever order the log has them
in. Deletion is the exception, because deleting a connector must remove its status no
matter who wrote it last.

Records, as in Kafka Connect: key ``status-connector-<name>`` or
``status-task-<name>-<n>``, value ``{"state", "trace", "worker_id", "generation"}`` as
JSON (a task's may add ``"lag"``, the figures its source reports of how far behind it
is); a DESTROYED status is written as a null value (tombstone).

The same log tracks each connector's *active topics* (``GET /connectors/<name>/topics``):
key ``status-topic-<topic>:connector-<name>``, value
``{"topic": {"name", "connector", "task", "discoverTimestamp"}}``, written the first time
one of the connector's tasks uses the topic and tombstoned when the user resets them or
deletes the connector. Generations play no part there: a topic once used stays used.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from herder.runtime.core.protocol import ConnectorTaskId

__all__ = [
    "ConnectorStatus",
    "State",
    "Status",
    "StatusView",
    "TaskStatus",
    "TopicStatus",
    "decode_status",
    "status_record",
    "topic_status_record",
]

log = logging.getLogger(__name__)

_CONNECTOR = "status-connector-"
_TASK = "status-task-"
_TOPIC = "status-topic-"
_TOPIC_CONNECTOR = ":connector-"


class State(StrEnum):
    """Where a connector or task is, as the REST API reports it."""

    UNASSIGNED = "UNASSIGNED"
    RUNNING = "RUNNING"
    PAUSED = "PAUSED"
    STOPPED = "STOPPED"
    FAILED = "FAILED"
    RESTARTING = "RESTARTING"
    #: the connector was deleted; written as a tombstone, so it is never read back
    DESTROYED = "DESTROYED"


@dataclass(frozen=True, slots=True)
class ConnectorStatus:
    """A connector's state as reported by the worker running it, in ``generation``."""

    id: str
    state: State
    worker_id: str
    generation: int
    #: the stack trace of the failure, for FAILED
    trace: str | None = None

    @property
    def key(self) -> str:
        """The ``_status`` key this status is published under."""
        return f"{_CONNECTOR}{self.id}"


@dataclass(frozen=True, slots=True)
class TaskStatus:
    """A task's state as reported by the worker running it, in ``generation``."""

    id: ConnectorTaskId
    state: State
    worker_id: str
    generation: int
    trace: str | None = None
    #: how far the source system is ahead of what the task committed, as the task
    #: measured it (``SourceTask.lag``); None for tasks that cannot say
    lag: Mapping[str, int | float] | None = field(default=None, hash=False)

    @property
    def key(self) -> str:
        """The ``_status`` key this status is published under."""
        return f"{_TASK}{self.id.connector}-{self.id.task}"


Status = ConnectorStatus | TaskStatus


@dataclass(frozen=True, slots=True)
class TopicStatus:
    """A topic one of ``connector``'s tasks used, first seen by ``task`` at ``discovered_ms``."""

    topic: str
    connector: str
    task: int
    discovered_ms: int

    @property
    def key(self) -> str:
        return topic_status_key(self.topic, self.connector)


def topic_status_key(topic: str, connector: str) -> str:
    """The ``_status`` key of ``connector``'s use of ``topic``."""
    return f"{_TOPIC}{topic}{_TOPIC_CONNECTOR}{connector}"


def topic_status_record(status: TopicStatus) -> tuple[str, bytes]:
    """The ``_status`` record that says ``status.connector`` uses ``status.topic``."""
    value = {
        "topic": {
            "name": status.topic,
            "connector": status.connector,
            "task": f"{status.connector}-{status.task}",
            "discoverTimestamp": status.discovered_ms,
        }
    }
    return status.key, json.dumps(value, separators=(",", ":")).encode()


def _decode_topic_status(key: str, value: bytes) -> TopicStatus:
    body: Any = json.loads(value)["topic"]
    topic, connector, task = body["name"], body["connector"], body["task"]
    if key != topic_status_key(topic, connector):
        raise ValueError(f"topic status {key!r} names {topic!r} of {connector!r}")
    index = task.rpartition("-")[2]
    discovered = body.get("discoverTimestamp", 0)
    if not index.isdigit() or not isinstance(discovered, int):
        raise ValueError(f"malformed task {task!r} or timestamp {discovered!r}")
    return TopicStatus(topic, connector, int(index), discovered)


def status_record(status: Status) -> tuple[str, bytes | None]:
    """The ``_status`` record (key, value) that publishes ``status``."""
    if status.state is State.DESTROYED:
        return status.key, None
    value: dict[str, object] = {
        "state": status.state.value,
        "trace": status.trace,
        "worker_id": status.worker_id,
        "generation": status.generation,
    }
    if isinstance(status, TaskStatus) and status.lag is not None:
        value["lag"] = dict(status.lag)
    return status.key, json.dumps(value, separators=(",", ":")).encode()


def decode_status(key: str, value: bytes) -> Status:
    """The status a (non-tombstone) ``_status`` record carries.

    Raises ValueError if the key or the value is not a status.
    """
    body: Any = json.loads(value)
    if not isinstance(body, dict):
        raise ValueError("expected a JSON object")
    state = State(body["state"])
    worker_id, generation, trace = body["worker_id"], body["generation"], body.get("trace")
    if not isinstance(worker_id, str) or not isinstance(trace, str | None):
        raise ValueError("worker_id and trace must be strings")
    if not isinstance(generation, int) or isinstance(generation, bool):
        raise ValueError(f"generation must be an integer, not {generation!r}")
    if key.startswith(_CONNECTOR):
        return ConnectorStatus(key.removeprefix(_CONNECTOR), state, worker_id, generation, trace)
    lag = body.get("lag")
    if lag is not None and not (
        isinstance(lag, dict)
        and all(isinstance(v, int | float) and not isinstance(v, bool) for v in lag.values())
    ):
        raise ValueError(f"lag must be an object of numbers, not {lag!r}")
    return TaskStatus(_task_id(key), state, worker_id, generation, trace, lag)


def _task_id(key: str) -> ConnectorTaskId:
    if not key.startswith(_TASK):
        raise ValueError(f"not a status key: {key!r}")
    name, sep, index = key.removeprefix(_TASK).rpartition("-")
    if not sep or not name or not (index.isascii() and index.isdigit()):
        raise ValueError(f"expected {_TASK}<connector>-<index>, not {key!r}")
    return ConnectorTaskId(name, int(index))


class StatusView:
    """The latest status of every connector and task, read from ``_status`` in order."""

    def __init__(self) -> None:
        self._connectors: dict[str, ConnectorStatus] = {}
        self._tasks: dict[ConnectorTaskId, TaskStatus] = {}
        self._topics: dict[str, TopicStatus] = {}

    def apply(self, key: str, value: bytes | None) -> bool:
        """Apply one ``_status`` record; returns whether the view changed.

        A tombstone (or a DESTROYED status) deletes the key. Any other status replaces
        the current one unless that was written in a newer generation. Records that are
        not statuses are logged and skipped: they are in the log and cannot be undone.
        """
        if key.startswith(_TOPIC):
            return self._apply_topic(key, value)
        if value is None:
            return self._delete(key)
        try:
            status = decode_status(key, value)
        except (ValueError, KeyError) as exc:
            log.error("Skipping malformed status record %r: %s", key, exc)
            return False
        if status.state is State.DESTROYED:
            return self._delete(key)
        if not self.supersedes(status):
            log.debug(
                "Ignoring status %s of %s from generation %d: a newer generation reported it",
                status.state,
                status.id,
                status.generation,
            )
            return False
        if isinstance(status, ConnectorStatus):
            self._connectors[status.id] = status
        else:
            self._tasks[status.id] = status
        return True

    def supersedes(self, status: Status) -> bool:
        """Whether ``status`` may replace what the view holds for its connector or task.

        Writers ask this too before publishing, so a worker that fell behind a rebalance
        does not even try to overwrite the new owner's report.
        """
        current = self.get(status)
        return current is None or current.generation <= status.generation

    def get(self, status: Status) -> Status | None:
        """The status the view holds for the same connector or task as ``status``."""
        if isinstance(status, ConnectorStatus):
            return self._connectors.get(status.id)
        return self._tasks.get(status.id)

    def connector(self, name: str) -> ConnectorStatus | None:
        """The latest status of connector ``name``, None if it has none."""
        return self._connectors.get(name)

    def task(self, task: ConnectorTaskId) -> TaskStatus | None:
        """The latest status of ``task``, None if it has none."""
        return self._tasks.get(task)

    def tasks(self, name: str) -> list[TaskStatus]:
        """Every known task status of connector ``name``, in task order."""
        return sorted(
            (s for t, s in self._tasks.items() if t.connector == name), key=lambda s: s.id
        )

    def connectors(self) -> list[str]:
        """Names of connectors with a status, sorted."""
        return sorted(self._connectors)

    def topics(self, connector: str) -> list[TopicStatus]:
        """The active topics of ``connector``, by topic name."""
        found = (t for t in self._topics.values() if t.connector == connector)
        return sorted(found, key=lambda t: t.topic)

    def topic(self, connector: str, topic: str) -> TopicStatus | None:
        return self._topics.get(topic_status_key(topic, connector))

    def _apply_topic(self, key: str, value: bytes | None) -> bool:
        if value is None:
            return self._topics.pop(key, None) is not None
        try:
            status = _decode_topic_status(key, value)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            log.error("Skipping malformed topic status record %r: %s", key, exc)
            return False
        changed = self._topics.get(key) != status
        self._topics[key] = status
        return changed

    def _delete(self, key: str) -> bool:
        if key.startswith(_CONNECTOR):
            return self._connectors.pop(key.removeprefix(_CONNECTOR), None) is not None
        try:
            task = _task_id(key)
        except ValueError as exc:
            log.error("Skipping tombstone with a malformed status key: %s", exc)
            return False
        return self._tasks.pop(task, None) is not None
