"""``/connectors``: create, read, reconfigure, pause, resume, stop, restart and delete
connectors, and their active topics (Connect's ConnectorsResource)."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response
from pydantic import BaseModel, Field

from herder.errors import ConfigError, HerderError
from herder.runtime.core.config_state import RestartRequest, TargetState
from herder.runtime.rest import views
from herder.runtime.rest.errors import Forbidden
from herder.runtime.rest.responses import JsonReply
from herder.runtime.rest.routing import RequestRouter, reply
from herder.runtime.shell.herder import DistributedHerder

__all__ = ["connectors_routes"]

#: Connect's names for the states a connector can be created in
INITIAL_STATES = {
    "RUNNING": TargetState.STARTED,
    "PAUSED": TargetState.PAUSED,
    "STOPPED": TargetState.STOPPED,
}


class CreateConnectorRequest(BaseModel):
    name: str = Field(min_length=1)
    config: dict[str, str] = Field(default_factory=dict)
    initial_state: str | None = None


def _with_name(name: str, config: dict[str, str]) -> dict[str, str]:
    included = config.get("name")
    if included is not None and included != name:
        raise ConfigError(
            f"Connector name configuration ({included}) doesn't match connector name in the "
            f"URL ({name}); leave 'name' out of the config or make the two the same"
        )
    return {**config, "name": name}


def _initial_state(requested: str | None) -> TargetState | None:
    if requested is None:
        return None
    state = INITIAL_STATES.get(requested.strip().upper())
    if state is None:
        raise ConfigError(f"Invalid initial_state {requested!r}: use RUNNING, PAUSED or STOPPED")
    return state


def _created(response: Response, request: Request, name: str) -> Response:
    """A 201 names the new connector in ``Location``, as Connect's does (absolute, as
    JAX-RS makes it), also when the leader, not this worker, created it."""
    if response.status_code == 201:
        base = str(request.base_url).rstrip("/")
        response.headers["location"] = f"{base}/connectors/{quote(name, safe='')}"
    return response


def connectors_routes(herder: DistributedHerder, router: RequestRouter) -> APIRouter:
    api = APIRouter(tags=["connectors"])
    config = herder.config

    def info(name: str) -> dict[str, Any]:
        return views.connector_info(herder.configs.snapshot(), herder.plugins, name)

    def status_of(name: str) -> dict[str, Any]:
        snapshot = herder.configs.snapshot()
        return views.connector_status(snapshot, herder.statuses.view, herder.plugins, name)

    @api.get("/connectors", response_model=None)
    async def list_connectors(
        expand: list[str] = Query(default=[]),  # noqa: B008 - FastAPI's idiom
    ) -> list[str] | dict[str, Any]:
        names = views.connector_names(herder.configs.snapshot())
        if not expand:
            return names
        out: dict[str, Any] = {}
        for name in names:
            entry: dict[str, Any] = {}
            try:
                if "status" in expand:
                    entry["status"] = status_of(name)
                if "info" in expand:
                    entry["info"] = info(name)
            except HerderError:
                continue  # deleted while we looked
            out[name] = entry
        return out

    @api.post("/connectors", status_code=201, response_model=None)
    async def create_connector(body: CreateConnectorRequest, request: Request) -> Response:
        name = body.name.strip()
        if not name:
            raise ConfigError("Connector name must not be empty; give the connector a name")
        connector_config = _with_name(name, body.config)
        state = _initial_state(body.initial_state)

        async def action() -> bool:
            return await herder.put_connector_config(
                name, connector_config, allow_replace=False, initial_state=state
            )

        result = await router.route(request, action)
        if isinstance(result, Response):
            return _created(result, request, name)
        return _created(JsonReply(status_code=201, content=info(name)), request, name)

    @api.get("/connectors/{name}")
    async def get_connector(name: str) -> dict[str, Any]:
        return info(name)

    @api.get("/connectors/{name}/config")
    async def get_connector_config(name: str) -> dict[str, str]:
        connector_config: dict[str, str] = info(name)["config"]
        return connector_config

    @api.put("/connectors/{name}/config", response_model=None)
    async def put_connector_config(name: str, body: dict[str, str], request: Request) -> Response:
        full = _with_name(name, body)
        result = await router.route(
            request, lambda: herder.put_connector_config(name, full, allow_replace=True)
        )
        if isinstance(result, Response):
            return _created(result, request, name)
        return _created(
            JsonReply(status_code=201 if result else 200, content=info(name)), request, name
        )

    @api.patch("/connectors/{name}/config", response_model=None)
    async def patch_connector_config(
        name: str, body: dict[str, str | None], request: Request
    ) -> Response:
        if body.get("name", name) != name:
            raise ConfigError(
                f"Connector name configuration ({body['name']}) doesn't match connector name "
                f"in the URL ({name}); leave 'name' out of the patch"
            )
        result = await router.route(request, lambda: herder.patch_connector_config(name, body))
        return reply(result if isinstance(result, Response) else info(name), 200)

    @api.get("/connectors/{name}/status")
    async def get_connector_status(name: str) -> dict[str, Any]:
        return status_of(name)

    @api.post("/connectors/{name}/restart", response_model=None)
    async def restart_connector(
        name: str,
        request: Request,
        include_tasks: bool = Query(default=False, alias="includeTasks"),
        only_failed: bool = Query(default=False, alias="onlyFailed"),
    ) -> Response:
        if not include_tasks and not only_failed:
            # Connect's original restart: the connector alone, done by the time we answer
            restarted = await router.route(request, lambda: herder.restart_connector(name))
            return reply(restarted, 204, body=False)
        restart = RestartRequest(name, include_tasks=include_tasks, only_failed=only_failed)
        plan = await router.route(request, lambda: herder.restart_connector_and_tasks(restart))
        if isinstance(plan, Response):
            return plan
        return reply(plan.state_info(status_of(name)), 202)

    @api.delete("/connectors/{name}", status_code=204, response_model=None)
    async def delete_connector(name: str, request: Request) -> Response:
        result = await router.route(request, lambda: herder.delete_connector(name))
        return reply(result, 204, body=False)

    async def target(name: str, state: TargetState, request: Request) -> Response:
        result = await router.route(request, lambda: herder.set_target_state(name, state))
        return reply(result, 202, body=False)

    @api.put(
        "/connectors/{name}/pause", status_code=202, response_model=None, response_class=Response
    )
    async def pause(name: str, request: Request) -> Response:
        return await target(name, TargetState.PAUSED, request)

    @api.put(
        "/connectors/{name}/resume", status_code=202, response_model=None, response_class=Response
    )
    async def resume(name: str, request: Request) -> Response:
        return await target(name, TargetState.STARTED, request)

    @api.put("/connectors/{name}/stop", status_code=204, response_model=None)
    async def stop(name: str, request: Request) -> Response:
        result = await router.route(request, lambda: herder.stop_connector(name))
        return reply(result, 204, body=False)

    # -- active topics ------------------------------------------------------------------

    def _require_topic_tracking(reset: bool = False) -> None:
        if not config.topic_tracking:
            raise Forbidden(
                "Topic tracking is disabled. Set topic.tracking.enable=true in the worker "
                "config to use it"
            )
        if reset and not config.topic_tracking_allow_reset:
            raise Forbidden(
                "Topic tracking reset is disabled. Set topic.tracking.allow.reset=true in "
                "the worker config to use it"
            )

    @api.get("/connectors/{name}/topics")
    async def active_topics(name: str) -> dict[str, Any]:
        _require_topic_tracking()
        return {name: {"topics": herder.active_topics(name)}}

    @api.put(
        "/connectors/{name}/topics/reset",
        status_code=202,
        response_model=None,
        response_class=Response,
    )
    async def reset_active_topics(name: str) -> Response:
        _require_topic_tracking(reset=True)
        await router.within_timeout(herder.reset_active_topics(name))
        return Response(status_code=202)

    return api
