"""``/admin/loggers``: read and set log levels, on this worker or on every worker of the
group (Connect's LoggingResource, KIP-976)."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter, Body, Query, Request
from fastapi.responses import Response

from herder.errors import ConfigError
from herder.runtime.core.admission import NotFound
from herder.runtime.loggers import parse_level
from herder.runtime.rest.responses import JsonReply
from herder.runtime.rest.routing import RequestRouter, reply
from herder.runtime.shell.herder import DistributedHerder

__all__ = ["admin_loggers_routes"]

log = logging.getLogger(__name__)

WORKER_SCOPE = "worker"
CLUSTER_SCOPE = "cluster"


class UnknownLogger(NotFound):
    advice = "GET /admin/loggers lists the loggers there are"


def admin_loggers_routes(herder: DistributedHerder, router: RequestRouter) -> APIRouter:
    api = APIRouter(tags=["admin/loggers"])

    @api.get("/admin/loggers")
    async def list_loggers() -> dict[str, Any]:
        return herder.loggers.all_levels()

    @api.get("/admin/loggers/{name}")
    async def get_logger(name: str) -> Response:
        level = herder.loggers.level(name)
        if level is None:
            raise UnknownLogger(f"Logger {name} not found.")
        return JsonReply(level)

    @api.put("/admin/loggers/{name}", response_model=None)
    async def set_logger(
        name: str,
        request: Request,
        body: Any = Body(None),  # noqa: B008 - FastAPI's idiom
        scope: str = Query(default=WORKER_SCOPE),
    ) -> Response:
        level = body.get("level") if isinstance(body, dict) else None
        if not isinstance(level, str):
            raise ConfigError(
                "Desired 'level' parameter was not specified in request; send a body like "
                '{"level": "DEBUG"}'
            )
        parse_level(level)
        if scope.lower() == CLUSTER_SCOPE:
            result = await router.route(
                request, lambda: herder.set_cluster_logger_level(name, level)
            )
            return reply(result, 204, body=False)
        if scope.lower() != WORKER_SCOPE:
            log.warning("invalid logger scope %r; using %s", scope, WORKER_SCOPE)
        return JsonReply(herder.loggers.set_level(name, level))

    return api
