"""A worker process: REST API, distributed herder, and a clean stop on SIGTERM."""

from __future__ import annotations

import asyncio
import importlib
import logging
import signal
from collections.abc import Callable, Mapping
from typing import Any

import uvicorn

from herder.errors import ConfigError
from herder.runtime.plugins import Plugins
from herder.runtime.rest import build_app
from herder.runtime.shell.herder import DistributedHerder
from herder.runtime.worker import ExecutionFactory
from herder.runtime.worker_config import WorkerConfig

log = logging.getLogger(__name__)

#: how a worker's tasks move data: the data plane's factory, given by the layer that
#: starts the worker (the runtime sits below the data plane and cannot name it)
ExecutionsFor = Callable[[WorkerConfig], ExecutionFactory]


def load_execution_factory(
    props: Mapping[str, Any], config: WorkerConfig, executions: ExecutionsFor
) -> ExecutionFactory:
    """``executions`` for this worker, unless ``task.execution.factory`` names another
    (``module:attribute``, a test's)."""
    path = props.get("task.execution.factory")
    if path is None:
        return executions(config)
    module_name, _, attr = str(path).partition(":")
    try:
        factory_class = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"task.execution.factory {path!r} cannot be loaded: {exc}") from None
    factory: ExecutionFactory = factory_class(config)
    return factory


class WorkerProcess:
    """Everything one ``herder worker start`` runs."""

    def __init__(self, props: Mapping[str, Any], executions: ExecutionsFor) -> None:
        self.config = WorkerConfig.from_properties(props)
        self.herder = DistributedHerder(
            self.config, Plugins.discover(), load_execution_factory(props, self.config, executions)
        )
        self._server: uvicorn.Server | None = None
        self._serving: asyncio.Task[None] | None = None
        self.url = ""

    async def start(self) -> None:
        app = build_app(self.herder)
        uv_config = uvicorn.Config(
            app,
            host=self.config.rest_host,
            port=self.config.rest_port,
            log_level="warning",
            lifespan="off",
        )
        self._server = uvicorn.Server(uv_config)
        self._serving = asyncio.create_task(self._server.serve())
        while not self._server.started:
            if self._serving.done():
                self._serving.result()
                raise ConfigError(f"the REST API could not listen on port {self.config.rest_port}")
            await asyncio.sleep(0.02)
        port = self._server.servers[0].sockets[0].getsockname()[1]
        self.url = self.config.advertised_url(port)
        await self.herder.start(self.url)

    async def stop(self) -> None:
        await self.herder.stop()
        if self._server is not None:
            self._server.should_exit = True
        if self._serving is not None:
            await self._serving


async def run_worker(props: Mapping[str, Any], executions: ExecutionsFor) -> None:
    process = WorkerProcess(props, executions)
    await process.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"worker {process.herder.worker_id} REST API at {process.url}", flush=True)
    await stop.wait()
    log.info("worker stopping on signal")
    await process.stop()
