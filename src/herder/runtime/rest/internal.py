"""What workers ask of each other over REST (Connect's InternalConnectResource): a
worker running a connector hands the task configs it generated to the leader.

While the group speaks ``sessioned`` such a request must be signed with the session key
(KIP-507, :mod:`herder.runtime.core.session_key`); each worker it passes through checks
the signature before acting on it or forwarding it, as Connect's do."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from herder.runtime.rest.routing import RequestRouter, reply
from herder.runtime.shell.herder import DistributedHerder

__all__ = ["internal_routes"]


def internal_routes(herder: DistributedHerder, router: RequestRouter) -> APIRouter:
    api = APIRouter(tags=["internal"])

    @api.post("/connectors/{name}/tasks", status_code=204, response_model=None)
    async def put_task_configs(
        name: str, configs: list[dict[str, str]], request: Request
    ) -> Response:
        """Internal: a worker running the connector hands its task configs to the leader.
        Signed with the session key (``X-Connect-Authorization``) under ``sessioned``."""
        herder.check_internal_request(dict(request.headers), await request.body())
        result = await router.route(request, lambda: herder.put_task_configs(name, configs))
        return reply(result, 204, body=False)

    return api
