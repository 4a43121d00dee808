"""``/connectors/{name}/offsets``: list, alter and reset a connector's offsets (KIP-875)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Body, Request
from fastapi.responses import Response

from herder.runtime.connector_offsets import parse_offsets_body
from herder.runtime.rest.routing import RequestRouter, reply
from herder.runtime.shell.herder import DistributedHerder

__all__ = ["offsets_routes"]


def offsets_routes(herder: DistributedHerder, router: RequestRouter) -> APIRouter:
    api = APIRouter(tags=["offsets"])

    @api.get("/connectors/{name}/offsets")
    async def get_offsets(name: str) -> dict[str, Any]:
        return await router.within_timeout(herder.connector_offsets_of(name))

    @api.patch("/connectors/{name}/offsets", response_model=None)
    async def alter_offsets(name: str, request: Request, body: Any = Body(None)) -> Response:  # noqa: B008
        changes = parse_offsets_body(body)
        result = await router.route(request, lambda: herder.modify_connector_offsets(name, changes))
        return reply(result, 200)

    @api.delete("/connectors/{name}/offsets", response_model=None)
    async def reset_offsets(name: str, request: Request) -> Response:
        result = await router.route(request, lambda: herder.modify_connector_offsets(name, None))
        return reply(result, 200)

    return api
