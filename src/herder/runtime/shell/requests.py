"""The herder's requests: what the REST API asks of a worker, queued on its loop.

Every request that writes configs is admitted by the core (only the leader of a
stable generation writes, and each write checks the leader's fencing epoch, so a
deposed leader's late write commits nothing) and runs on the herder loop, in order of
arrival. Connector code a request needs (validating a config) runs before the request
joins the queue, on the connector pool with its deadline.
"""

from __future__ import annotations

import asyncio
import logging
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

from herder.connect import ConnectorType
from herder.coordinator.apis import fencing_op
from herder.coordinator.client import CoordinatorClient
from herder.ensemble.txn import Op
from herder.errors import CheckFailed, ConfigError, HerderError
from herder.runtime.connector_offsets import ConnectorOffsets, OffsetChange
from herder.runtime.core import effects as fx
from herder.runtime.core.admission import AlreadyExists, ConfigChanged, NotFound
from herder.runtime.core.config_state import (
    ClusterLoggerLevel,
    ConfigRecord,
    RestartRequest,
    TargetState,
    connector_config_record,
    connector_removal_records,
    logger_level_record,
    restart_request_record,
    target_state_record,
    task_config_records,
)
from herder.runtime.core.herder import HerderCore
from herder.runtime.core.protocol import ConnectorTaskId
from herder.runtime.core.restart import RestartPlan
from herder.runtime.loggers import parse_level
from herder.runtime.plugins import Plugins
from herder.runtime.stores import ConfigStore, StatusStore
from herder.runtime.validation import ConfigInfos
from herder.runtime.worker import Worker
from herder.runtime.worker_config import WorkerConfig

log = logging.getLogger(__name__)

T = TypeVar("T")

_ALTERED = "altered"
_RESET = "reset"


def _offsets_message(change: str) -> dict[str, str]:
    # herder's connectors keep no offsets of their own outside the runtime's, but a
    # connector may; Connect words it the same way for connectors that do not say
    return {
        "message": f"The Connect framework-managed offsets for this connector have been "
        f"{change} successfully. However, if this connector manages offsets externally, they "
        f"will need to be manually {change} in the system that the connector uses."
    }


class HerderRequests(ABC):
    """The requests of :class:`~herder.runtime.shell.herder.DistributedHerder`, which
    provides the stores, the core and the loop they run on."""

    config: WorkerConfig
    plugins: Plugins
    core: HerderCore
    worker: Worker
    configs: ConfigStore
    statuses: StatusStore
    coordinator: CoordinatorClient
    connector_offsets: ConnectorOffsets
    _connector_starts: dict[str, asyncio.Task[bool]]

    @abstractmethod
    async def submit(self, action: Callable[[], Awaitable[T]], delay_s: float = 0.0) -> T:
        """Run ``action`` on the herder loop, after ``delay_s``, in order of arrival."""

    @abstractmethod
    async def _carry_out(self, effects: list[fx.Effect] | None = None) -> None:
        """Carry out ``effects`` and whatever the core queues after them."""

    # -- config writes ----------------------------------------------------------------

    @property
    def _leader_fence_id(self) -> str:
        return f"connect-leader-{self.config.group_id}"

    async def _write_configs(self, records: list[tuple[str, bytes | None]]) -> None:
        checks: list[Op] = [fencing_op(self._leader_fence_id, self.core.leader_fence_epoch())]
        try:
            await self.configs.write(records, checks)
        except CheckFailed:
            raise self.core.write_refused() from None

    async def write_task_configs(self, name: str, configs: list[dict[str, str]]) -> None:
        """Leader only: fence the connector's old tasks, then write its new task set."""
        self.core.require_leader()
        if name not in self.configs.snapshot():
            # a deleted connector's task set would come back with a connector of its name
            raise NotFound(f"Connector {name} not found")
        await self.coordinator.init_fencing(f"connector-{name}")
        await self._write_configs(task_config_records(name, configs))
        log.info("connector %s: wrote %d task configs", name, len(configs))

    # -- connector configs ------------------------------------------------------------

    async def put_connector_config(
        self,
        name: str,
        config: dict[str, str],
        *,
        allow_replace: bool,
        initial_state: TargetState | None = None,
    ) -> bool:
        """Create or update a connector (leader only); whether it was created.

        A new connector's ``initial_state`` is written before its config in the same
        transaction, so it never runs, even briefly, in a state it was not created in.
        """

        # connector code, with its deadline, before the herder loop takes the request
        await self.validate_connector_config(config)

        async def action() -> bool:
            self.core.require_leader()
            await self.configs.read_to_end()
            exists = name in self.configs.snapshot()
            if exists and not allow_replace:
                raise AlreadyExists(f"Connector {name} already exists")
            records: list[ConfigRecord] = []
            if initial_state is not None and not exists:
                records.append(target_state_record(name, initial_state))
            records.append(connector_config_record(name, config))
            await self._write_configs(records)
            await self.configs.read_to_end()
            return not exists

        return await self.submit(action)

    async def patch_connector_config(self, name: str, patch: dict[str, str | None]) -> None:
        """Merge ``patch`` into the connector's config (None removes a key); leader only."""

        def merge(current: dict[str, str]) -> dict[str, str]:
            merged = {**current, **{k: v for k, v in patch.items() if v is not None}}
            for key, value in patch.items():
                if value is None:
                    merged.pop(key, None)
            merged["name"] = name
            return merged

        async def current() -> dict[str, str]:
            self.core.require_leader()
            await self.configs.read_to_end()
            config = self.configs.snapshot().connector_config(name)
            if config is None:
                raise NotFound(f"Connector {name} not found")
            return config

        base = await self.submit(current)
        # connector code, with its deadline, outside the herder loop; the write then
        # goes through only if the config is still the one merged with
        await self.validate_connector_config(merge(base))

        async def action() -> None:
            if await current() != base:
                raise ConfigChanged(
                    f"Connector {name}'s config changed while the patch was validated; "
                    "send the patch again"
                )
            await self._write_configs([connector_config_record(name, merge(base))])
            await self.configs.read_to_end()

        await self.submit(action)

    async def validate_config(self, config: dict[str, str]) -> ConfigInfos:
        """Connect's validation of a connector config (``.../config/validate``): the
        connector's own code, on the connector pool with its deadline."""
        return await self.worker.call_connector(
            config.get("name") or config.get("connector.class", "?"),
            "validate()",
            ConfigInfos.validate,
            self.plugins,
            config,
        )

    async def validate_connector_config(self, config: dict[str, str]) -> None:
        """Refuse a config with one error naming each bad key (REST 400)."""
        class_name = config.get("connector.class", "")
        if not class_name:
            problems = [
                'connector.class: Missing required configuration "connector.class" which has '
                "no default value."
            ]
        else:
            problems = (await self.validate_config(config)).errors()
        if not problems:
            # what only the data plane can judge: transforms as configured together,
            # predicates they name, converters, errors.*
            problems = self.worker.execution_factory.validate_config(config)
        if problems:
            raise ConfigError(
                "Connector configuration is invalid and contains the following "
                f"{len(problems)} error(s):\n" + "\n".join(problems) + "\nYou can also find "
                "the above list of errors at the endpoint "
                "`/connector-plugins/{connectorType}/config/validate`"
            )

    async def delete_connector(self, name: str) -> None:
        async def action() -> None:
            self.core.require_leader()
            await self.configs.read_to_end()
            if name not in self.configs.snapshot():
                raise NotFound(f"Connector {name} not found")
            task_count = self.configs.snapshot().task_count(name)
            await self._write_configs(connector_removal_records(name, task_count))
            await self.configs.read_to_end()
            # a deleted connector's active topics go with it, as in Connect
            await self.statuses.delete_topics(name)

        await self.submit(action)

    async def set_target_state(self, name: str, state: TargetState) -> None:
        async def action() -> None:
            self.core.require_leader()
            await self.configs.read_to_end()
            if name not in self.configs.snapshot():
                raise NotFound(f"Connector {name} not found")
            await self._write_configs([target_state_record(name, state)])

        await self.submit(action)

    async def stop_connector(self, name: str) -> None:
        """STOPPED: the connector shuts down and its task set is emptied (leader only).

        The empty task set and the target state go in one transaction, after the
        connector's old tasks are fenced, so no task of it runs or commits afterwards.
        """

        async def action() -> None:
            self.core.require_leader()
            await self.configs.read_to_end()
            if name not in self.configs.snapshot():
                raise NotFound(f"Connector {name} not found")
            await self.coordinator.init_fencing(f"connector-{name}")
            records = [
                *task_config_records(name, []),
                target_state_record(name, TargetState.STOPPED),
            ]
            await self._write_configs(records)
            await self.configs.read_to_end()
            log.info("connector %s: stopped, task configs emptied", name)

        await self.submit(action)

    def check_internal_request(self, headers: Mapping[str, str], body: bytes) -> None:
        """Refuse an internal request not signed with the session key while the group
        speaks ``sessioned`` (400, 403 or 503 in Connect's words)."""
        self.core.check_internal_request(headers, body)

    async def put_task_configs(self, name: str, configs: list[dict[str, str]]) -> None:
        async def action() -> None:
            self.core.require_leader()
            if name not in self.configs.snapshot():
                raise NotFound(f"Connector {name} not found")
            await self.write_task_configs(name, configs)

        await self.submit(action)

    # -- restarts -------------------------------------------------------------------

    async def restart_connector(self, name: str) -> None:
        """Restart connector ``name`` where it runs (answered by its worker)."""

        async def action() -> asyncio.Task[bool]:
            await self._carry_out(self.core.restart_connector(name))
            return self._connector_starts[name]

        # answered once the start is over, which the herder loop does not wait for
        started = await (await self.submit(action))
        failure = self.worker.connector_failure(name)
        if not started and failure is not None:
            # Connect answers a failed restart with 500 and the cause
            raise HerderError(f"Failed to start connector: {name}: {failure}")
        log.info("connector %s restarted at the user's request", name)

    async def restart_task(self, task_id: ConnectorTaskId) -> None:
        """Restart one task where it runs (answered by its worker)."""

        async def action() -> None:
            await self._carry_out(self.core.restart_task(task_id))
            log.info("task %s restarted at the user's request", task_id)

        await self.submit(action)

    async def restart_connector_and_tasks(self, request: RestartRequest) -> RestartPlan:
        """Record ``request`` in ``_configs`` (leader only); returns what it restarts."""

        async def action() -> RestartPlan:
            self.core.require_leader()
            await self.configs.read_to_end()
            if request.connector not in self.configs.snapshot():
                raise NotFound(f"Unknown connector: {request.connector}")
            await self._write_configs([restart_request_record(request)])
            # the plan is made from every status written so far, not this worker's view
            # of them, which may lag another worker's latest writes
            await self.statuses.read_to_end()
            return self.core.restart_plan(request)

        return await self.submit(action)

    # -- offsets ----------------------------------------------------------------------

    def _connector_kind(self, name: str) -> ConnectorType:
        config = self.configs.snapshot().connector_config(name)
        if config is None:
            raise NotFound(f"Connector {name} not found")
        return self.plugins.type_of(config.get("connector.class", ""))

    async def connector_offsets_of(self, name: str) -> dict[str, Any]:
        """``GET /connectors/<name>/offsets``: the connector's committed offsets."""
        await self.configs.read_to_end()
        if self._connector_kind(name) is ConnectorType.SINK:
            return {"offsets": await self.connector_offsets.sink_offsets(name)}
        return {"offsets": await self.connector_offsets.source_offsets(name)}

    async def modify_connector_offsets(
        self, name: str, changes: list[OffsetChange] | None
    ) -> dict[str, str]:
        """Alter (``changes``) or reset (None) a STOPPED connector's offsets; leader only."""

        async def action() -> dict[str, str]:
            self.core.require_leader()
            await self.configs.read_to_end()
            snapshot = self.configs.snapshot()
            kind = self._connector_kind(name)
            if snapshot.target_state(name) is not TargetState.STOPPED or snapshot.task_count(name):
                raise ConfigError(
                    "Connectors must be in the STOPPED state before their offsets can be "
                    "modified. This can be done for the specified connector by issuing a 'PUT' "
                    f"request to the '/connectors/{name}/stop' endpoint"
                )
            offsets = self.connector_offsets
            if kind is ConnectorType.SINK:
                await (
                    offsets.reset_sink(name)
                    if changes is None
                    else offsets.alter_sink(name, changes)
                )
            else:
                await (
                    offsets.reset_source(name)
                    if changes is None
                    else offsets.alter_source(name, changes)
                )
            change = _RESET if changes is None else _ALTERED
            log.info("connector %s: offsets %s", name, change)
            return _offsets_message(change)

        return await self.submit(action)

    # -- active topics and loggers ------------------------------------------------------

    def active_topics(self, name: str) -> list[str]:
        return [t.topic for t in self.statuses.view.topics(name)]

    async def reset_active_topics(self, name: str) -> None:
        forgotten = await self.statuses.delete_topics(name)
        log.info("connector %s: active topics %s reset", name, forgotten)

    async def set_cluster_logger_level(self, namespace: str, level: str) -> None:
        """Have every worker set ``namespace`` to ``level``, through ``_configs``."""
        parse_level(level)

        async def action() -> None:
            self.core.require_leader()
            await self._write_configs(
                [logger_level_record(ClusterLoggerLevel(namespace, level.upper()))]
            )

        await self.submit(action)
