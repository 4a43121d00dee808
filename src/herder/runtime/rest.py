"""The worker's REST API: Kafka Connect's paths, bodies and status codes.

Existing Connect clients work unchanged. Changes to connectors belong to the group's
leader, restarts to the worker running the connector or task; any other worker forwards
them there (see :mod:`.rest_routing`). Errors are Connect's ``{"error_code",
"message"}``. The plugin, validation and logger endpoints are in :mod:`.rest_admin`.
"""

from __future__ import annotations

from typing import Any

from fastapi import Body, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field

from herder import __version__
from herder.errors import ConfigError, HerderError
from herder.runtime.config_state import RestartRequest, TargetState
from herder.runtime.connector_offsets import parse_offsets_body
from herder.runtime.protocol import ConnectorTaskId
from herder.runtime.rest_admin import admin_routes
from herder.runtime.rest_routing import Forbidden, RequestRouter, error_response, status_of
from herder.runtime.shell.herder import DistributedHerder

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
            f"URL ({name})"
        )
    return {**config, "name": name}


def _passed(result: Any, status: int, body: bool = True) -> Response:
    """``result`` as a response of ``status``, unless it is a forwarded reply already."""
    if isinstance(result, Response):
        return result
    if not body:
        return Response(status_code=status)
    return JSONResponse(status_code=status, content=result)


def build_app(herder: DistributedHerder) -> FastAPI:
    app = FastAPI(
        title="herder worker REST API",
        version=__version__,
        description="Kafka Connect's REST API, served by a herder worker.",
    )
    router = RequestRouter(herder)
    config = herder.config

    @app.exception_handler(HerderError)
    async def herder_error(request: Request, exc: HerderError) -> JSONResponse:
        return error_response(status_of(exc), str(exc))

    @app.exception_handler(RequestValidationError)
    async def bad_body(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'] if p != 'body') or 'body'}: {e['msg']}"
            for e in exc.errors()
        )
        return error_response(400, f"Invalid request body: {problems}")

    @app.get("/")
    async def root() -> dict[str, Any]:
        return {"version": __version__, "commit": "", "kafka_cluster_id": config.group_id}

    @app.get("/health")
    async def health() -> Response:
        if herder.generation is None:
            return JSONResponse(
                status_code=503,
                content={"status": "starting", "message": "Worker is still joining its group."},
            )
        return JSONResponse(
            {
                "status": "healthy",
                "message": "Worker has completed startup and is ready to handle requests.",
            }
        )

    # -- connectors -------------------------------------------------------------------

    @app.get("/connectors", response_model=None)
    async def list_connectors(
        expand: list[str] = Query(default=[]),  # noqa: B008 - FastAPI's idiom
    ) -> list[str] | dict[str, Any]:
        names = herder.connector_names()
        if not expand:
            return names
        out: dict[str, Any] = {}
        for name in names:
            entry: dict[str, Any] = {}
            try:
                if "status" in expand:
                    entry["status"] = herder.connector_status(name)
                if "info" in expand:
                    entry["info"] = herder.connector_info(name)
            except HerderError:
                continue  # deleted while we looked
            out[name] = entry
        return out

    @app.post("/connectors", status_code=201, response_model=None)
    async def create_connector(body: CreateConnectorRequest, request: Request) -> Response:
        name = body.name.strip()
        connector_config = _with_name(name, body.config)
        state = None
        if body.initial_state is not None:
            state = INITIAL_STATES.get(body.initial_state.strip().upper())
            if state is None:
                raise ConfigError(
                    f"Invalid initial_state {body.initial_state!r}: use RUNNING, PAUSED or STOPPED"
                )

        async def action() -> dict[str, Any]:
            _, info = await herder.put_connector_config(
                name, connector_config, allow_replace=False, initial_state=state
            )
            return info

        return _passed(await router.route(request, action), 201)

    @app.get("/connectors/{name}")
    async def get_connector(name: str) -> dict[str, Any]:
        return herder.connector_info(name)

    @app.get("/connectors/{name}/config")
    async def get_connector_config(name: str) -> dict[str, str]:
        connector_config: dict[str, str] = herder.connector_info(name)["config"]
        return connector_config

    @app.put("/connectors/{name}/config", response_model=None)
    async def put_connector_config(name: str, body: dict[str, str], request: Request) -> Response:
        full = _with_name(name, body)

        async def action() -> Response:
            created, info = await herder.put_connector_config(name, full, allow_replace=True)
            return JSONResponse(status_code=201 if created else 200, content=info)

        return _passed(await router.route(request, action), 200)

    @app.patch("/connectors/{name}/config", response_model=None)
    async def patch_connector_config(
        name: str, body: dict[str, str | None], request: Request
    ) -> Response:
        if body.get("name", name) != name:
            raise ConfigError(
                f"Connector name configuration ({body['name']}) doesn't match connector name "
                f"in the URL ({name})"
            )
        result = await router.route(request, lambda: herder.patch_connector_config(name, body))
        return _passed(result, 200)

    @app.get("/connectors/{name}/status")
    async def get_connector_status(name: str) -> dict[str, Any]:
        return herder.connector_status(name)

    @app.get("/connectors/{name}/tasks")
    async def get_task_configs(name: str) -> list[dict[str, Any]]:
        return herder.task_configs(name)

    @app.post("/connectors/{name}/tasks", status_code=204, response_model=None)
    async def put_task_configs(
        name: str, configs: list[dict[str, str]], request: Request
    ) -> Response:
        """Internal: a worker running the connector hands its task configs to the leader."""
        result = await router.route(request, lambda: herder.put_task_configs(name, configs))
        return _passed(result, 204, body=False)

    @app.get("/connectors/{name}/tasks/{task}/status")
    async def get_task_status(name: str, task: int) -> dict[str, Any]:
        return herder.task_status(name, task)

    @app.post("/connectors/{name}/tasks/{task}/restart", status_code=204, response_model=None)
    async def restart_task(name: str, task: int, request: Request) -> Response:
        task_id = ConnectorTaskId(name, task)
        result = await router.route(request, lambda: herder.restart_task(task_id))
        return _passed(result, 204, body=False)

    @app.post("/connectors/{name}/restart", response_model=None)
    async def restart_connector(
        name: str,
        request: Request,
        include_tasks: bool = Query(default=False, alias="includeTasks"),
        only_failed: bool = Query(default=False, alias="onlyFailed"),
    ) -> Response:
        if not include_tasks and not only_failed:
            # Connect's original restart: the connector alone, done by the time we answer
            restarted = await router.route(request, lambda: herder.restart_connector(name))
            return _passed(restarted, 204, body=False)
        restart = RestartRequest(name, include_tasks=include_tasks, only_failed=only_failed)
        state = await router.route(request, lambda: herder.restart_connector_and_tasks(restart))
        return _passed(state, 202)

    @app.delete("/connectors/{name}", status_code=204, response_model=None)
    async def delete_connector(name: str, request: Request) -> Response:
        result = await router.route(request, lambda: herder.delete_connector(name))
        return _passed(result, 204, body=False)

    async def target(name: str, state: TargetState, request: Request) -> Response:
        result = await router.route(request, lambda: herder.set_target_state(name, state))
        return _passed(result, 202, body=False)

    @app.put("/connectors/{name}/pause", status_code=202, response_model=None)
    async def pause(name: str, request: Request) -> Response:
        return await target(name, TargetState.PAUSED, request)

    @app.put("/connectors/{name}/resume", status_code=202, response_model=None)
    async def resume(name: str, request: Request) -> Response:
        return await target(name, TargetState.STARTED, request)

    @app.put("/connectors/{name}/stop", status_code=202, response_model=None)
    async def stop(name: str, request: Request) -> Response:
        result = await router.route(request, lambda: herder.stop_connector(name))
        return _passed(result, 202, body=False)

    # -- offsets and active topics ------------------------------------------------------

    @app.get("/connectors/{name}/offsets")
    async def get_offsets(name: str) -> dict[str, Any]:
        return await router.within_timeout(herder.connector_offsets_of(name))

    @app.patch("/connectors/{name}/offsets", response_model=None)
    async def alter_offsets(name: str, request: Request, body: Any = Body(None)) -> Response:  # noqa: B008
        changes = parse_offsets_body(body)
        result = await router.route(request, lambda: herder.modify_connector_offsets(name, changes))
        return _passed(result, 200)

    @app.delete("/connectors/{name}/offsets", response_model=None)
    async def reset_offsets(name: str, request: Request) -> Response:
        result = await router.route(request, lambda: herder.modify_connector_offsets(name, None))
        return _passed(result, 200)

    def _require_topic_tracking(reset: bool = False) -> None:
        if not config.topic_tracking:
            raise Forbidden("Topic tracking is disabled.")
        if reset and not config.topic_tracking_allow_reset:
            raise Forbidden("Topic tracking reset is disabled.")

    @app.get("/connectors/{name}/topics")
    async def active_topics(name: str) -> dict[str, Any]:
        _require_topic_tracking()
        return {name: {"topics": herder.active_topics(name)}}

    @app.put("/connectors/{name}/topics/reset", status_code=202, response_model=None)
    async def reset_active_topics(name: str) -> Response:
        _require_topic_tracking(reset=True)
        await router.within_timeout(herder.reset_active_topics(name))
        return Response(status_code=202)

    app.include_router(admin_routes(herder, router))

    @app.on_event("shutdown")
    async def close_http() -> None:
        await router.close()

    return app
