"""Standalone mode: one worker and its own single-server ensemble in one process.

The counterpart of Kafka Connect's ``connect-standalone``: a worker config plus
connector config files, nothing else to run. The ensemble is the ordinary
:class:`~herder.ensemble.server.EnsembleServer` (with the group coordinator), kept in a
data directory so configs, source offsets, sink offsets and topic data survive a
restart; the worker is the ordinary distributed worker, alone in its group, serving the
same REST API. Connectors named in files are created at start-up; one that already
exists keeps running untouched if its config is the same, and is updated if not.

The data directory is ``data.dir`` if set, else a directory next to Connect's
``offset.storage.file.filename``, named after it with ``.d`` appended, so a
``connect-standalone.properties`` copied from a Kafka installation works as it is.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import signal
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from herder.config import parse_properties
from herder.connect import ConnectorType
from herder.coordinator.config import PROPERTY_NAMES as COORDINATOR_PROPERTIES
from herder.coordinator.config import CoordinatorConfig
from herder.coordinator.server import ensemble_server
from herder.ensemble.config import EnsembleConfig
from herder.ensemble.server import EnsembleServer
from herder.errors import ConfigError, HerderError, RebalanceInProgress, RetriableError
from herder.runtime.core.admission import NotLeaderWorker
from herder.runtime.process import ExecutionsFor, WorkerProcess

log = logging.getLogger(__name__)

#: worker properties with this prefix go to the embedded ensemble, under ZooKeeper's names
ENSEMBLE_PREFIX = "ensemble."
DATA_DIR = "data.dir"
OFFSET_FILE = "offset.storage.file.filename"
DEFAULT_GROUP_ID = "connect-standalone"
#: the group coordinator's settings (Kafka's broker names) may be given in the worker config
_COORDINATOR_KEYS = frozenset(COORDINATOR_PROPERTIES.values())
_SERVER_LINE = re.compile(r"^server\.\d+$")


# -- connector files ----------------------------------------------------------------------


@dataclass(frozen=True)
class ConnectorFile:
    """One connector's name and config, as read from a file."""

    name: str
    config: dict[str, str]
    source: str


def _config_value(key: str, value: Any, source: str) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, list) and all(isinstance(v, str | int | float) for v in value):
        return ",".join(str(v) for v in value)
    raise ConfigError(
        f"{source}: the value of {key!r} must be a string, number, boolean or list, "
        f"not {type(value).__name__}"
    )


def config_from_json(value: Any, source: str) -> dict[str, str]:
    """A JSON object as a connector config: every value as the string Connect would see."""
    if not isinstance(value, dict):
        raise ConfigError(f"{source}: a connector config must be a JSON object")
    return {str(k): _config_value(str(k), v, source) for k, v in value.items()}


def parse_connector_text(text: str, source: str) -> tuple[str | None, dict[str, str]]:
    """(name, config) from a connector file's text; the name may be absent.

    JSON (text starting with ``{``) is either Connect's ``{"name": …, "config": {…}}``
    or a flat config map; anything else is Java properties.
    """
    if text.lstrip().startswith("{"):
        try:
            document = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{source}: not valid JSON: {exc}") from None
        if isinstance(document.get("config"), dict):
            config = config_from_json(document["config"], source)
            name = document.get("name", config.get("name"))
            if name is not None and not isinstance(name, str):
                raise ConfigError(f"{source}: name must be a string")
            if "name" in config and name is not None and config["name"] != name:
                raise ConfigError(
                    f"{source}: name {name!r} and config.name {config['name']!r} differ"
                )
            return name, config
        config = config_from_json(document, source)
        return config.get("name"), config
    config = parse_properties(text, source=source)
    return config.get("name"), config


def load_connector_file(path: str | os.PathLike[str]) -> ConnectorFile:
    """Read a connector's config from a properties or JSON file; it must name the connector."""
    source = os.fspath(path)
    try:
        text = Path(source).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read connector config {source}: {exc.strerror}") from None
    name, config = parse_connector_text(text, source)
    if not name:
        raise ConfigError(f"{source}: the connector has no name (set name=…)")
    return ConnectorFile(name, {**config, "name": name}, source)


# -- settings -------------------------------------------------------------------------------


def standalone_data_dir(props: Mapping[str, str]) -> Path:
    """Where the embedded ensemble and the topics live (see the module docstring)."""
    if props.get(DATA_DIR):
        return Path(props[DATA_DIR]).expanduser()
    if props.get(OFFSET_FILE):
        offsets = Path(props[OFFSET_FILE]).expanduser()
        return offsets.with_name(offsets.name + ".d")
    raise ConfigError(
        f"standalone mode needs a place for its data: set {DATA_DIR} (a directory) "
        f"or {OFFSET_FILE} in the worker config"
    )


@dataclass(frozen=True)
class StandaloneSettings:
    data_dir: Path
    ensemble: dict[str, str]
    coordinator: CoordinatorConfig
    #: the worker's properties, less ``bootstrap.servers`` (the ensemble's address, once bound)
    worker: dict[str, str]


def standalone_settings(props: Mapping[str, str]) -> StandaloneSettings:
    """Split one standalone worker config into the ensemble's, coordinator's and worker's."""
    data_dir = standalone_data_dir(props)
    ensemble = {
        "dataDir": str(data_dir / "ensemble"),
        "clientPort": "0",
        "clientPortAddress": "127.0.0.1",
    }
    ensemble.update(
        {k[len(ENSEMBLE_PREFIX) :]: v for k, v in props.items() if k.startswith(ENSEMBLE_PREFIX)}
    )
    for key in ensemble:
        if _SERVER_LINE.match(key):
            raise ConfigError(
                f"{ENSEMBLE_PREFIX}{key}: the embedded ensemble is a single server; "
                "run a distributed worker against a separate ensemble instead"
            )
    # the worker is this coordinator's only client: let it use short session timeouts
    coordinator_props = {"group.min.session.timeout.ms": "1000"}
    coordinator_props.update({k: v for k, v in props.items() if k in _COORDINATOR_KEYS})
    worker = {
        "group.id": DEFAULT_GROUP_ID,
        "storage.root": str(data_dir / "topics"),
        **{k: v for k, v in props.items() if not k.startswith(ENSEMBLE_PREFIX)},
    }
    if "bootstrap.servers" in worker:
        log.info(
            "standalone mode ignores bootstrap.servers=%s: the worker uses its embedded ensemble",
            worker.pop("bootstrap.servers"),
        )
    return StandaloneSettings(
        data_dir=data_dir,
        ensemble=ensemble,
        coordinator=CoordinatorConfig.from_properties(coordinator_props),
        worker=worker,
    )


# -- the process ------------------------------------------------------------------------------


class StandaloneWorker:
    """An embedded ensemble and one worker, started and stopped together."""

    def __init__(
        self,
        props: Mapping[str, str],
        connectors: Sequence[ConnectorFile],
        executions: ExecutionsFor,
    ) -> None:
        self.settings = standalone_settings(props)
        self.executions = executions
        names = [c.name for c in connectors]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ConfigError(f"connector {duplicates[0]!r} is defined by more than one file")
        self.connectors = list(connectors)
        self.ensemble: EnsembleServer | None = None
        self.worker: WorkerProcess | None = None
        self.bootstrap = ""

    @property
    def url(self) -> str:
        return self.worker.url if self.worker is not None else ""

    async def start(self) -> None:
        """Start both, then create or update the connectors from the files."""
        settings = self.settings
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        self.ensemble = ensemble_server(
            EnsembleConfig.from_properties(settings.ensemble), settings.coordinator
        )
        try:
            await self.ensemble.start()
            host = settings.ensemble["clientPortAddress"]
            if host in ("0.0.0.0", "::", ""):
                host = "127.0.0.1"
            self.bootstrap = f"{host}:{self.ensemble.port}"
            worker = WorkerProcess(
                {**settings.worker, "bootstrap.servers": self.bootstrap}, self.executions
            )
            try:
                await worker.start()
            except BaseException:
                # whatever of it did start (the REST listener) must not outlive the failure
                with contextlib.suppress(Exception):
                    await worker.stop()
                raise
            self.worker = worker
            await self._lead_the_group()
            await self._apply_connector_files()
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        if self.worker is not None:
            await self.worker.stop()
            self.worker = None
        if self.ensemble is not None:
            await self.ensemble.stop()
            self.ensemble = None

    def _join_deadline(self) -> float:
        assert self.worker is not None
        config = self.worker.herder.config
        return time.monotonic() + (config.session_timeout_ms + config.rebalance_timeout_ms) / 1e3

    async def _lead_the_group(self) -> None:
        """Wait until the worker leads its group of one: only then does it run anything.

        After an unclean stop the previous process's member is still in the group
        until its session expires, so this can take up to ``session.timeout.ms``.
        """
        assert self.worker is not None
        herder = self.worker.herder
        deadline = self._join_deadline()
        while not herder.is_leader:
            if herder.failure is not None:
                raise herder.failure
            if time.monotonic() >= deadline:
                raise HerderError(
                    f"worker {herder.worker_id} did not join its group "
                    f"{herder.config.group_id} in time; see the log above for why"
                )
            await asyncio.sleep(0.05)

    async def _apply_connector_files(self) -> None:
        assert self.worker is not None
        herder = self.worker.herder
        deadline = self._join_deadline()
        # Each new connector makes the worker rebalance, stopping what it started. Sinks
        # first: their tasks start no Spark job until there are records, so stopping them
        # is cheap, while a source task stopped during its first batch wastes that batch.
        ordered = sorted(
            self.connectors,
            key=lambda c: (
                herder.plugins.type_of(c.config.get("connector.class", ""))
                is not ConnectorType.SINK
            ),
        )
        for connector in ordered:

            async def existing(name: str = connector.name) -> dict[str, str] | None:
                await herder.configs.read_to_end()
                return herder.configs.snapshot().connector_config(name)

            while True:
                try:
                    current = await herder.submit(existing)
                    if current == connector.config:
                        log.info(
                            "connector %s from %s exists with the same config; kept",
                            connector.name,
                            connector.source,
                        )
                    else:
                        await herder.put_connector_config(
                            connector.name, connector.config, allow_replace=True
                        )
                        log.info(
                            "connector %s from %s %s",
                            connector.name,
                            connector.source,
                            "created" if current is None else "updated",
                        )
                    break
                except (NotLeaderWorker, RebalanceInProgress, RetriableError) as exc:
                    if time.monotonic() >= deadline:
                        raise HerderError(
                            f"could not create connector {connector.name}: the worker lost "
                            f"the lead of its group and did not get it back in time ({exc})"
                        ) from None
                    await asyncio.sleep(0.2)
                except ConfigError as exc:
                    raise ConfigError(f"{connector.source}: {exc}") from None


async def run_standalone(
    props: Mapping[str, str], connector_paths: Sequence[str], executions: ExecutionsFor
) -> None:
    """Run a standalone worker until SIGTERM or SIGINT."""
    connectors = [load_connector_file(path) for path in connector_paths]
    standalone = StandaloneWorker(props, connectors, executions)
    await standalone.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    assert standalone.worker is not None
    names = ", ".join(c.name for c in connectors) or "none"
    print(
        f"standalone worker {standalone.worker.herder.worker_id} REST API at {standalone.url}"
        f"; ensemble at {standalone.bootstrap}; data in {standalone.settings.data_dir}"
        f"; connectors from files: {names}",
        flush=True,
    )
    worker = standalone.worker
    try:
        waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(worker.failed.wait())]
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for wait in waits:
            wait.cancel()
        if worker.herder.failure is not None:
            raise HerderError(
                f"standalone worker {worker.herder.worker_id} stopped: {worker.herder.failure}"
            )
        log.info("standalone worker stopping on signal")
    finally:
        await standalone.stop()
