"""What a restart request restarts, decided from the statuses (Connect's RestartPlan).

``POST /connectors/<name>/restart?includeTasks=&onlyFailed=`` restarts the connector
unless ``onlyFailed`` is set and it is not FAILED, and its tasks only with
``includeTasks``, again skipping those not FAILED under ``onlyFailed``. The leader
records the request in ``_configs`` and answers with the connector's state, the
instances it will restart shown RESTARTING; each worker then builds the same plan from
the statuses it reads and restarts what of it runs there. Pure: no IO.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from herder.runtime.core.config_state import RestartRequest
from herder.runtime.core.protocol import ConnectorTaskId
from herder.runtime.core.status import ConnectorStatus, State, TaskStatus

__all__ = ["RestartPlan", "more_impactful"]


@dataclass(frozen=True)
class RestartPlan:
    """The instances one restart request restarts."""

    request: RestartRequest
    restart_connector: bool
    tasks: tuple[ConnectorTaskId, ...]

    @classmethod
    def build(
        cls,
        request: RestartRequest,
        connector: ConnectorStatus | None,
        task_ids: Sequence[ConnectorTaskId],
        task_statuses: dict[ConnectorTaskId, TaskStatus],
    ) -> RestartPlan:
        """The plan for ``request``, given the connector's and its tasks' current statuses."""

        def wanted(state: State | None) -> bool:
            return not request.only_failed or state is State.FAILED

        restart_connector = wanted(connector.state if connector else None)
        tasks: tuple[ConnectorTaskId, ...] = ()
        if request.include_tasks:
            tasks = tuple(
                t
                for t in task_ids
                if wanted(task_statuses[t].state if t in task_statuses else None)
            )
        return cls(request, restart_connector, tasks)

    @property
    def empty(self) -> bool:
        return not self.restart_connector and not self.tasks

    def state_info(self, status: dict[str, Any]) -> dict[str, Any]:
        """Connect's ConnectorStateInfo ``status`` with the restarted instances RESTARTING."""
        restarting = State.RESTARTING.value
        connector = dict(status["connector"])
        if self.restart_connector:
            connector["state"] = restarting
            connector.pop("trace", None)
        ids = {t.task for t in self.tasks}
        tasks = []
        for task in status["tasks"]:
            task = dict(task)
            if task["id"] in ids:
                task["state"] = restarting
                task.pop("trace", None)
            tasks.append(task)
        return {**status, "connector": connector, "tasks": tasks}


def more_impactful(a: RestartRequest, b: RestartRequest) -> RestartRequest:
    """Of two pending requests for one connector, the one that restarts more.

    Restarting tasks beats not restarting them, and restarting everything beats
    restarting only what failed; a tie keeps the later one (``b``).
    """

    def impact(r: RestartRequest) -> tuple[bool, bool]:
        return (r.include_tasks, not r.only_failed)

    return a if impact(a) > impact(b) else b
