"""A worker process: REST API, distributed herder, and a clean stop on SIGTERM."""

from __future__ import annotations

import asyncio
import importlib
import logging
import signal
import socket
from collections.abc import Callable, Mapping
from typing import Any

import uvicorn

from herder.errors import ConfigError, HerderError
from herder.runtime.basic_auth import BasicAuthFilter
from herder.runtime.plugins import Plugins
from herder.runtime.refusals import RefusalLog
from herder.runtime.rest import build_app
from herder.runtime.rest_listener import RestListener
from herder.runtime.shell.herder import DistributedHerder
from herder.runtime.worker import ExecutionFactory
from herder.runtime.worker_config import WorkerConfig

log = logging.getLogger(__name__)

#: how long a stopping worker lets open REST connections finish before dropping them
STOP_GRACE_S = 2.0
#: Seconds an idle keep-alive connection to the REST API stays open: Connect's (Jetty's
#: idle timeout). uvicorn's own 5 s equals the time HTTP clients such as httpx keep an idle
#: connection for reuse, so a request sent on one just then met a connection the server was
#: closing, and failed with no answer ("Server disconnected without sending a response").
REST_KEEP_ALIVE_S = 30

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


def _listen(host: str, port: int) -> socket.socket:
    """The REST API's listening socket, bound before anything else starts: its port is
    part of the worker's id (``host:port``), so it must be known first."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family, backlog=2048)
    except OSError as exc:
        raise ConfigError(
            f"the REST API cannot listen on {host}:{port}: {exc.strerror or exc}; stop what "
            "uses that port or choose another with rest.port (or listeners)"
        ) from None


class WorkerProcess:
    """Everything one ``herder worker start`` runs."""

    def __init__(self, props: Mapping[str, Any], executions: ExecutionsFor) -> None:
        self.config = WorkerConfig.from_properties(props)
        self.plugins = Plugins.discover()
        self.executions = load_execution_factory(props, self.config, executions)
        self._herder: DistributedHerder | None = None
        #: set once the worker's group refused it for good: the process must stop
        self.failed = asyncio.Event()
        self._server: uvicorn.Server | None = None
        self._serving: asyncio.Task[None] | None = None
        self._listener: RestListener | None = None
        self.url = ""

    @property
    def herder(self) -> DistributedHerder:
        if self._herder is None:
            raise HerderError("the worker has not started: call start() first")
        return self._herder

    async def start(self) -> None:
        listener = _listen(self.config.rest_host, self.config.rest_port)
        port = listener.getsockname()[1]
        self.url = self.config.advertised_url(port)
        self._herder = DistributedHerder(
            self.config,
            self.plugins,
            self.executions,
            worker_id=self.config.advertised_address(port),
            on_failed=lambda _: self.failed.set(),
        )
        refusals = RefusalLog()
        app: Any = build_app(self._herder)
        if self.config.users is not None:
            app = BasicAuthFilter(app, self.config.users, refusals)
        # log_config=None: uvicorn's lines go through the worker's own handler and format
        uv_config = uvicorn.Config(
            app,
            log_level="warning",
            lifespan="off",
            log_config=None,
            timeout_keep_alive=REST_KEEP_ALIVE_S,
        )
        uv_config.load()
        tls = None
        if self.config.tls is not None:
            tls = self.config.tls.server_context()
        # the listener runs the TLS handshake itself (see rest_listener), so uvicorn's
        # server gets no SSL context
        self._listener = RestListener(tls, refusals)
        uv_config.http_protocol_class = self._listener.serve(uv_config.http_protocol_class)
        self._server = uvicorn.Server(uv_config)
        self._serving = asyncio.create_task(self._server.serve(sockets=[listener]))
        while not self._server.started:
            if self._serving.done():
                self._serving.result()
                raise ConfigError(f"the REST API could not listen on port {port}")
            await asyncio.sleep(0.02)
        await self._herder.start(self.url)

    async def stop(self) -> None:
        if self._herder is not None:
            await self._herder.stop()
        if self._server is not None:
            self._server.should_exit = True
        if self._serving is not None:
            done, _ = await asyncio.wait({self._serving}, timeout=STOP_GRACE_S)
            if not done and self._listener is not None:
                # closing a TLS connection waits for the client's close_notify, which an
                # idle keep-alive client never sends: drop what is left
                self._listener.abort()
            await self._serving


async def run_worker(props: Mapping[str, Any], executions: ExecutionsFor) -> None:
    """Run a worker until SIGTERM or SIGINT, or until its group refuses it for good
    (then it stops, raising the cause: the process exits non-zero with it, as Connect's
    worker exits when its herder thread dies)."""
    process = WorkerProcess(props, executions)
    await process.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"worker {process.herder.worker_id} REST API at {process.url}", flush=True)
    waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(process.failed.wait())]
    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    for wait in waits:
        wait.cancel()
    failure = process.herder.failure
    log.info("worker stopping %s", "on signal" if failure is None else "after a fatal error")
    await process.stop()
    if failure is not None:
        raise HerderError(f"worker {process.herder.worker_id} stopped: {failure}")
