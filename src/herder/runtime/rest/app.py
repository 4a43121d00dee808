"""The app factory: one FastAPI app per worker, its routers, and its error handlers."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError

from herder import __version__
from herder.errors import HerderError
from herder.runtime.herder import DistributedHerder
from herder.runtime.rest.admin_loggers import admin_loggers_routes
from herder.runtime.rest.connector_plugins import connector_plugins_routes
from herder.runtime.rest.connectors import connectors_routes
from herder.runtime.rest.errors import bad_request_body, herder_error
from herder.runtime.rest.internal import internal_routes
from herder.runtime.rest.offsets import offsets_routes
from herder.runtime.rest.root import root_routes
from herder.runtime.rest.routing import RequestRouter
from herder.runtime.rest.tasks import tasks_routes

__all__ = ["build_app"]


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
    return app
