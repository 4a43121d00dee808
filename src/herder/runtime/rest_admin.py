"""The REST API's plugin, validation and logger endpoints (Connect's ConnectorPluginsResource
and LoggingResource)."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter, Body, Query, Request
from fastapi.responses import JSONResponse, Response

from herder.errors import ConfigError
from herder.runtime.core.admission import NotFound
from herder.runtime.loggers import parse_level
from herder.runtime.plugins import class_name
from herder.runtime.rest_routing import RequestRouter
from herder.runtime.shell.herder import DistributedHerder
from herder.runtime.validation import key_info

log = logging.getLogger(__name__)

WORKER_SCOPE = "worker"
CLUSTER_SCOPE = "cluster"


def _normalized(plugin: str) -> str:
    """A plugin name without its package and ``Connector`` suffix, for comparing aliases."""
    simple = plugin.rpartition(".")[2]
    return simple.removesuffix("Connector").lower()


def admin_routes(herder: DistributedHerder, router: RequestRouter) -> APIRouter:
    api = APIRouter()
    plugins = herder.plugins

    @api.get("/connector-plugins")
    async def list_plugins(
        connectors_only: bool = Query(default=True, alias="connectorsOnly"),
    ) -> list[dict[str, str]]:
        return plugins.all_plugins(connectors_only=connectors_only)

    @api.get("/connector-plugins/{plugin}/config")
    async def plugin_config(plugin: str) -> list[dict[str, Any]]:
        definition = plugins.plugin_config(plugin)
        return [key_info(key) for key in definition.keys.values()]

    @api.put("/connector-plugins/{plugin}/config/validate")
    async def validate(plugin: str, body: dict[str, str]) -> dict[str, Any]:
        included = body.get("connector.class")
        if included is None:
            raise ConfigError(f"Connector config {body} contains no connector type")
        if not _normalized(class_name_of(included)).endswith(_normalized(plugin)):
            raise ConfigError(
                f"Included connector type {included} does not match request type {plugin}"
            )
        return (await herder.validate_config(body)).to_json()

    def class_name_of(name: str) -> str:
        try:
            return class_name(plugins.connector_class(name))
        except ConfigError:
            return name

    @api.get("/admin/loggers")
    async def list_loggers() -> dict[str, Any]:
        return herder.loggers.all_levels()

    @api.get("/admin/loggers/{name}")
    async def get_logger(name: str) -> Response:
        level = herder.loggers.level(name)
        if level is None:
            raise NotFound(f"Logger {name} not found.")
        return JSONResponse(level)

    @api.put("/admin/loggers/{name}", response_model=None)
    async def set_logger(
        name: str,
        request: Request,
        body: Any = Body(None),  # noqa: B008 - FastAPI's idiom
        scope: str = Query(default=WORKER_SCOPE),
    ) -> Response:
        level = body.get("level") if isinstance(body, dict) else None
        if not isinstance(level, str):
            raise ConfigError("Desired 'level' parameter was not specified in request.")
        parse_level(level)
        if scope.lower() == CLUSTER_SCOPE:
            result = await router.route(
                request, lambda: herder.set_cluster_logger_level(name, level)
            )
            return result if isinstance(result, Response) else Response(status_code=204)
        if scope.lower() != WORKER_SCOPE:
            log.warning("invalid logger scope %r; using %s", scope, WORKER_SCOPE)
        return JSONResponse(herder.loggers.set_level(name, level))

    return api
