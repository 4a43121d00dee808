"""The app factory: one FastAPI app per worker, its routers, and its error handlers."""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError

from herder import __version__
from herder.errors import ConfigError, HerderError
from herder.runtime.basic_auth import OPEN_PATHS
from herder.runtime.rest.admin_loggers import admin_loggers_routes
from herder.runtime.rest.admin_metrics import admin_metrics_routes
from herder.runtime.rest.cluster import cluster_routes
from herder.runtime.rest.connector_plugins import connector_plugins_routes
from herder.runtime.rest.connectors import connectors_routes
from herder.runtime.rest.console import console_routes
from herder.runtime.rest.errors import bad_request_body, herder_error
from herder.runtime.rest.internal import internal_routes
from herder.runtime.rest.offsets import offsets_routes
from herder.runtime.rest.prometheus import metrics_routes
from herder.runtime.rest.responses import JsonReply
from herder.runtime.rest.root import root_routes
from herder.runtime.rest.routing import RequestRouter
from herder.runtime.rest.tasks import tasks_routes
from herder.runtime.shell.herder import DistributedHerder

__all__ = ["build_app"]


class _NotJson(ValueError):
    """A token Python's JSON reader takes but JSON has not (NaN, Infinity, 1e999)."""


def _finite(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):
        raise _NotJson(text)
    return number


def _not_json(text: str) -> Any:
    raise _NotJson(text)


def _has_lone_surrogate(value: Any) -> bool:
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return True
        return False
    if isinstance(value, dict):
        return any(_has_lone_surrogate(k) or _has_lone_surrogate(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_lone_surrogate(v) for v in value)
    return False


async def refuse_what_json_cannot_carry(request: Request) -> None:
    """Refuse a body Python reads as JSON but JSON does not allow, before a route takes it.

    ``NaN``, ``Infinity`` and numbers beyond a double are no JSON numbers; half of a
    UTF-16 surrogate pair (``"\\ud800"``) is no character. Stored, such values could
    never be shown again, or would come back as something else (``null``)."""
    body = await request.body()
    if not body:
        return
    try:
        parsed = json.loads(body, parse_constant=_not_json, parse_float=_finite)
    except _NotJson as exc:
        raise ConfigError(
            f"Invalid request: {exc} is no JSON number; send finite numbers only"
        ) from None
    except ValueError:
        return  # the route refuses a body that is not JSON, saying so
    if _has_lone_surrogate(parsed):
        raise ConfigError(
            "Invalid request: the body holds a lone UTF-16 surrogate escape (\\ud800 to "
            "\\udfff), which is no character; send text as valid Unicode"
        )


def build_app(herder: DistributedHerder) -> FastAPI:
    """The REST API of the worker ``herder`` steers."""
    router = RequestRouter(herder)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        await router.close()

    app = FastAPI(
        title="herder worker REST API",
        version=__version__,
        description="Kafka Connect's REST API, served by a herder worker.",
        lifespan=lifespan,
        default_response_class=JsonReply,
        dependencies=[Depends(refuse_what_json_cannot_carry)],
    )
    app.add_exception_handler(HerderError, herder_error)
    app.add_exception_handler(RequestValidationError, bad_request_body)
    app.include_router(root_routes(herder))
    app.include_router(connectors_routes(herder, router))
    app.include_router(tasks_routes(herder, router))
    app.include_router(internal_routes(herder, router))
    app.include_router(offsets_routes(herder, router))
    app.include_router(connector_plugins_routes(herder))
    app.include_router(admin_loggers_routes(herder, router))
    app.include_router(admin_metrics_routes(herder))
    app.include_router(metrics_routes(herder))
    app.include_router(cluster_routes(herder, router.http))
    app.include_router(console_routes())
    if herder.config.users is not None:
        _document_basic_auth(app)
    return app


def _document_basic_auth(app: FastAPI) -> None:
    """Say in the OpenAPI document that every operation but the open ones needs HTTP
    Basic credentials (the worker's BasicAuthFilter asks for them), so clients made from
    it send them and the ``/docs`` page offers to."""
    document = app.openapi()
    schemes = document.setdefault("components", {}).setdefault("securitySchemes", {})
    schemes["basic"] = {
        "type": "http",
        "scheme": "basic",
        "description": "a user of the worker's rest.basic.auth.credentials.file; the read "
        "role may GET and HEAD, the admin role everything",
    }
    document["security"] = [{"basic": []}]
    for path in OPEN_PATHS:
        for operation in document["paths"].get(path, {}).values():
            operation["security"] = []
