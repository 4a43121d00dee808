"""What the REST API shows of connectors and tasks: Connect's entities, as JSON.

Each view is a function of what it shows (the config snapshot, the status view, the
plugins), not of a herder, so any worker answers a read from its own copy of the logs
and the views can be tested without one. The shapes are Connect's REST entities
(``ConnectorInfo``, ``ConnectorStateInfo``, ``TaskInfo``); ``tests/golden/connect``
holds them.
"""

from __future__ import annotations

from typing import Any

from herder.runtime.core.admission import NotFound
from herder.runtime.core.config_state import ClusterConfigSnapshot
from herder.runtime.core.protocol import ConnectorTaskId
from herder.runtime.core.status import State, StatusView
from herder.runtime.plugins import Plugins

__all__ = [
    "connector_info",
    "connector_names",
    "connector_status",
    "connector_type",
    "task_configs",
    "task_status",
]


def connector_names(snapshot: ClusterConfigSnapshot) -> list[str]:
    return sorted(snapshot.connectors)


def connector_type(plugins: Plugins, config: dict[str, str]) -> str:
    """``source``, ``sink`` or ``unknown`` (a class this worker does not have)."""
    return plugins.type_of(config.get("connector.class", "")).value


def connector_info(snapshot: ClusterConfigSnapshot, plugins: Plugins, name: str) -> dict[str, Any]:
    """Connect's ``ConnectorInfo``: name, config, task ids and type."""
    config = snapshot.connector_config(name)
    if config is None:
        raise NotFound(f"Connector {name} not found")
    return {
        "name": name,
        "config": config,
        "tasks": [{"connector": t.connector, "task": t.task} for t in snapshot.tasks(name)],
        "type": connector_type(plugins, config),
    }


def connector_status(
    snapshot: ClusterConfigSnapshot, statuses: StatusView, plugins: Plugins, name: str
) -> dict[str, Any]:
    """Connect's ``ConnectorStateInfo``: the connector's and each task's state and worker."""
    config = snapshot.connector_config(name)
    if config is None:
        raise NotFound(f"No status found for connector {name}")
    status = statuses.connector(name)
    return {
        "name": name,
        "connector": {
            "state": status.state.value if status else State.UNASSIGNED.value,
            "worker_id": status.worker_id if status else "",
            **({"trace": status.trace} if status and status.trace else {}),
        },
        "tasks": [_task_state(statuses, task_id) for task_id in snapshot.tasks(name)],
        "type": connector_type(plugins, config),
    }


def task_status(
    snapshot: ClusterConfigSnapshot, statuses: StatusView, name: str, task: int
) -> dict[str, Any]:
    """Connect's ``TaskState`` of task ``task`` of connector ``name``."""
    task_id = ConnectorTaskId(name, task)
    if name not in snapshot or task_id not in snapshot.tasks(name):
        raise NotFound(f"No status found for task {name}-{task}")
    return _task_state(statuses, task_id)


def task_configs(snapshot: ClusterConfigSnapshot, name: str) -> list[dict[str, Any]]:
    """Connect's ``TaskInfo`` list: each task's id and config."""
    if name not in snapshot:
        raise NotFound(f"Connector {name} not found")
    return [
        {"id": {"connector": t.connector, "task": t.task}, "config": snapshot.task_config(t)}
        for t in snapshot.tasks(name)
    ]


def _task_state(statuses: StatusView, task_id: ConnectorTaskId) -> dict[str, Any]:
    status = statuses.task(task_id)
    return {
        "id": task_id.task,
        "state": status.state.value if status else State.UNASSIGNED.value,
        "worker_id": status.worker_id if status else "",
        **({"trace": status.trace} if status and status.trace else {}),
        **({"lag": dict(status.lag)} if status and status.lag is not None else {}),
    }
