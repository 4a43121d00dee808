"""The worker's REST API: Kafka Connect's paths, bodies and status codes.

Existing Connect clients work unchanged. Writes (create, update, delete, pause,
resume, task configs) belong to the group's leader: a worker that is not the leader
forwards them to the leader's URL; while no leader is known (a rebalance), it waits
briefly and retries before answering 409. Errors are ``{"error_code", "message"}``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import httpx
from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field

from herder import __version__
from herder.errors import ConfigError, HerderError, RebalanceInProgress
from herder.runtime.config_state import TargetState
from herder.runtime.herder import AlreadyExists, DistributedHerder, NotFound, NotLeaderWorker

log = logging.getLogger(__name__)

T = TypeVar("T")

FORWARDED_HEADER = "x-herder-forwarded"
#: how long a write waits for a leader to be known before answering 409
LEADER_WAIT_S = 10.0


class CreateConnectorRequest(BaseModel):
    name: str = Field(min_length=1)
    config: dict[str, str] = Field(default_factory=dict)
    initial_state: str | None = None


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse(status_code=status, content={"error_code": status, "message": message})


def _status_of(exc: HerderError) -> int:
    if isinstance(exc, NotFound):
        return 404
    if isinstance(exc, AlreadyExists):
        return 409
    if isinstance(exc, ConfigError):
        return 400
    if isinstance(exc, (NotLeaderWorker, RebalanceInProgress)):
        return 409
    return 500


def build_app(herder: DistributedHerder) -> FastAPI:
    app = FastAPI(
        title="herder worker REST API",
        version=__version__,
        description="Kafka Connect's REST API, served by a herder worker.",
    )
    http = httpx.AsyncClient(timeout=90)

    @app.exception_handler(HerderError)
    async def herder_error(request: Request, exc: HerderError) -> JSONResponse:
        return _error(_status_of(exc), str(exc))

    @app.exception_handler(RequestValidationError)
    async def bad_body(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'] if p != 'body') or 'body'}: {e['msg']}"
            for e in exc.errors()
        )
        return _error(400, f"Invalid request body: {problems}")

    async def as_leader(request: Request, action: Callable[[], Awaitable[T]]) -> T | Response:
        """Run a leader-only ``action`` here, or forward the request to the leader."""
        deadline = time.monotonic() + LEADER_WAIT_S
        while True:
            try:
                return await action()
            except NotLeaderWorker as exc:
                if exc.leader_url and exc.leader_url != herder.url:
                    if request.headers.get(FORWARDED_HEADER):
                        raise
                    return await forward(request, exc.leader_url)
                if time.monotonic() >= deadline:
                    raise
                await asyncio.sleep(0.25)

    async def forward(request: Request, leader_url: str) -> Response:
        body = await request.body()
        url = f"{leader_url}{request.url.path}"
        if request.url.query:
            url += f"?{request.url.query}"
        log.debug(
            "forwarding %s %s to the leader at %s", request.method, request.url.path, leader_url
        )
        try:
            reply = await http.request(
                request.method,
                url,
                content=body,
                headers={"content-type": "application/json", FORWARDED_HEADER: herder.url},
            )
        except httpx.HTTPError as exc:
            return _error(
                409, f"could not forward the request to the leader at {leader_url}: {exc}"
            )
        return Response(
            content=reply.content,
            status_code=reply.status_code,
            media_type=reply.headers.get("content-type"),
        )

    @app.get("/")
    async def root() -> dict[str, Any]:
        return {"version": __version__, "commit": "", "kafka_cluster_id": herder.config.group_id}

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
            if "status" in expand:
                entry["status"] = herder.connector_status(name)
            if "info" in expand:
                entry["info"] = herder.connector_info(name)
            out[name] = entry
        return out

    @app.post("/connectors", status_code=201, response_model=None)
    async def create_connector(body: CreateConnectorRequest, request: Request) -> Any:
        config = {**body.config, "name": body.name}
        if body.config.get("name", body.name) != body.name:
            return _error(
                400, "Connector name configuration (config.name) must match the name given"
            )
        state = None
        if body.initial_state is not None:
            try:
                state = TargetState(body.initial_state.upper())
            except ValueError:
                return _error(
                    400,
                    f"Invalid initial_state {body.initial_state!r}: use RUNNING, PAUSED or STOPPED",
                )

        async def action() -> Any:
            _, info = await herder.put_connector_config(body.name, config, allow_replace=False)
            if state is not None and state is not TargetState.STARTED:
                await herder.set_target_state(body.name, state)
            return info

        result = await as_leader(request, action)
        return (
            result
            if isinstance(result, Response)
            else JSONResponse(status_code=201, content=result)
        )

    @app.get("/connectors/{name}")
    async def get_connector(name: str) -> dict[str, Any]:
        return herder.connector_info(name)

    @app.get("/connectors/{name}/config")
    async def get_connector_config(name: str) -> dict[str, str]:
        info = herder.connector_info(name)
        config: dict[str, str] = info["config"]
        return config

    @app.put("/connectors/{name}/config", response_model=None)
    async def put_connector_config(name: str, config: dict[str, str], request: Request) -> Any:
        if config.get("name", name) != name:
            return _error(
                400, "Connector name configuration (name) must match the connector name in the URL"
            )
        full = {**config, "name": name}

        async def action() -> Any:
            created, info = await herder.put_connector_config(name, full, allow_replace=True)
            return JSONResponse(status_code=201 if created else 200, content=info)

        return await as_leader(request, action)

    @app.get("/connectors/{name}/status")
    async def get_connector_status(name: str) -> dict[str, Any]:
        return herder.connector_status(name)

    @app.get("/connectors/{name}/tasks")
    async def get_task_configs(name: str) -> list[dict[str, Any]]:
        return herder.task_configs(name)

    @app.post("/connectors/{name}/tasks", status_code=204, response_model=None)
    async def put_task_configs(name: str, configs: list[dict[str, str]], request: Request) -> Any:
        result = await as_leader(request, lambda: herder.put_task_configs(name, configs))
        return result if isinstance(result, Response) else Response(status_code=204)

    @app.get("/connectors/{name}/tasks/{task}/status")
    async def get_task_status(name: str, task: int) -> dict[str, Any]:
        return herder.task_status(name, task)

    @app.delete("/connectors/{name}", status_code=204, response_model=None)
    async def delete_connector(name: str, request: Request) -> Any:
        result = await as_leader(request, lambda: herder.delete_connector(name))
        return result if isinstance(result, Response) else Response(status_code=204)

    async def target(name: str, state: TargetState, request: Request) -> Any:
        result = await as_leader(request, lambda: herder.set_target_state(name, state))
        return result if isinstance(result, Response) else Response(status_code=202)

    @app.put("/connectors/{name}/pause", status_code=202, response_model=None)
    async def pause(name: str, request: Request) -> Any:
        return await target(name, TargetState.PAUSED, request)

    @app.put("/connectors/{name}/resume", status_code=202, response_model=None)
    async def resume(name: str, request: Request) -> Any:
        return await target(name, TargetState.STARTED, request)

    @app.on_event("shutdown")
    async def close_http() -> None:
        await http.aclose()

    return app
