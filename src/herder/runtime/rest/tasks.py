"""``/connectors/{name}/tasks``: a connector's task configs, each task's status, and
restarting one task (Connect's ConnectorsResource, its task half)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from herder.runtime.core.protocol import ConnectorTaskId
from herder.runtime.rest import views
from herder.runtime.rest.routing import RequestRouter, reply
from herder.runtime.shell.herder import DistributedHerder

__all__ = ["tasks_routes"]


def tasks_routes(herder: DistributedHerder, router: RequestRouter) -> APIRouter:
    api = APIRouter(tags=["tasks"])

    @api.get("/connectors/{name}/tasks")
    async def get_task_configs(name: str) -> list[dict[str, Any]]:
        return views.task_configs(herder.configs.snapshot(), name)

    @api.get("/connectors/{name}/tasks/{task}/status")
    async def get_task_status(name: str, task: int) -> dict[str, Any]:
        return views.task_status(herder.configs.snapshot(), herder.statuses.view, name, task)

    @api.post("/connectors/{name}/tasks/{task}/restart", status_code=204, response_model=None)
    async def restart_task(name: str, task: int, request: Request) -> Response:
        task_id = ConnectorTaskId(name, task)
        result = await router.route(request, lambda: herder.restart_task(task_id))
        return reply(result, 204, body=False)

    return api
