"""The worker's backing stores: configs, source offsets and statuses, kept in the ensemble.

Each store follows one compacted log with a :class:`~herder.ensemble.tailer.LogTailer`,
as Connect's KafkaConfigBackingStore, KafkaOffsetBackingStore and KafkaStatusBackingStore
follow their topics, and reads are brought up to date with a linearizable
``read_to_end``. Writes are ensemble transactions; a write may carry extra checks (the
leader's fencing epoch, for config writes) that make it commit only while they hold.
"""

from __future__ import annotations

import asyncio
import json
import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

from herder.ensemble.client import EnsembleClient
from herder.ensemble.tailer import LogTailer
from herder.ensemble.txn import Append, Op, Record
from herder.runtime.core.config_state import (
    ClusterConfigSnapshot,
    ConfigCommand,
    ConfigRecord,
    ConfigState,
)
from herder.runtime.core.status import (
    Status,
    StatusView,
    TopicStatus,
    status_record,
    topic_status_key,
    topic_status_record,
)

log = logging.getLogger(__name__)

DEFAULT_CONFIG_LOG = "_configs"
DEFAULT_OFFSET_LOG = "_offsets"
DEFAULT_STATUS_LOG = "_status"


class _CompactedLogStore(ABC):
    """A compacted log, created if absent, followed from the start."""

    #: whether a write may be applied twice (it says what a key is now, whatever was
    #: written before it): one made under a session that expired is then made again
    #: under the client's next session, rather than lost (see EnsembleClient.transact)
    rewritable: ClassVar[bool] = False

    def __init__(self, client: EnsembleClient, log_name: str) -> None:
        self.client = client
        self.log_name = log_name
        self._tailer = LogTailer(client, log_name, self._on_record)

    async def start(self) -> None:
        await self.client.create_log(self.log_name, compacted=True, if_absent=True)
        await self._tailer.start()
        await self.read_to_end()

    async def stop(self) -> None:
        await self._tailer.stop()

    async def read_to_end(self, timeout: float = 30.0) -> int:
        """Everything committed before this call has been applied to the view."""
        return await self._tailer.read_to_end(timeout)

    async def _write(
        self, records: Sequence[tuple[str, bytes | None]], checks: Sequence[Op] = ()
    ) -> int:
        """Append ``records`` atomically (after ``checks``); return the zxid."""
        ops: list[Op] = [*checks]
        ops += [Append(self.log_name, key.encode(), value) for key, value in records]
        result = await self.client.transact(ops, renew=self.rewritable and not checks)
        return result.zxid

    @abstractmethod
    def _on_record(self, record: Record) -> None:
        """Fold one record of the log into this store's view."""


class ConfigStore(_CompactedLogStore):
    """``_configs``: connector and task configs, target states, and commands.

    Commands (restart requests, cluster logger levels) are handed to ``on_command`` only
    once the store has read the log to its end at start: the ones already in the log
    were carried out when they were written, and replaying them on every start would
    restart connectors or change log levels nobody asked for (Connect ignores them too).
    """

    def __init__(
        self,
        client: EnsembleClient,
        log_name: str = DEFAULT_CONFIG_LOG,
        *,
        on_update: Callable[[ClusterConfigSnapshot], None] | None = None,
        on_command: Callable[[ConfigCommand], None] | None = None,
    ) -> None:
        super().__init__(client, log_name)
        self.state = ConfigState()
        self.on_update = on_update
        self.on_command = on_command
        self._started = False

    async def start(self) -> None:
        await super().start()
        self._started = True

    def snapshot(self) -> ClusterConfigSnapshot:
        return self.state.snapshot()

    def _on_record(self, record: Record) -> None:
        if record.key is None:
            log.warning(
                "%s: ignoring a record without a key at offset %d", self.log_name, record.offset
            )
            return
        command = self.state.apply(record.offset, record.key.decode(), record.value)
        if command is not None and self._started and self.on_command is not None:
            self.on_command(command)
        if self.on_update is not None:
            self.on_update(self.state.snapshot())

    async def write(self, records: Sequence[ConfigRecord], checks: Sequence[Op] = ()) -> int:
        """Write config records atomically, only while ``checks`` hold (the leader's fence)."""
        return await self._write(records, checks)


def offset_key(connector: str, partition: Mapping[str, Any]) -> bytes:
    """Connect's offset key: ``[connector, partition]`` as canonical JSON."""
    return json.dumps([connector, partition], sort_keys=True, separators=(",", ":")).encode()


class OffsetStore(_CompactedLogStore):
    """``_offsets``: each connector's source offsets, by source partition."""

    def __init__(self, client: EnsembleClient, log_name: str = DEFAULT_OFFSET_LOG) -> None:
        super().__init__(client, log_name)
        self._offsets: dict[bytes, dict[str, Any] | None] = {}

    def _on_record(self, record: Record) -> None:
        if record.key is None:
            return
        if record.value is None:
            self._offsets.pop(record.key, None)
            return
        try:
            self._offsets[record.key] = json.loads(record.value)
        except ValueError:
            log.warning("%s: malformed offset at %d ignored", self.log_name, record.offset)

    def get(self, connector: str, partition: Mapping[str, Any]) -> dict[str, Any] | None:
        return self._offsets.get(offset_key(connector, partition))

    def for_connector(self, connector: str) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        """Every (partition, offset) stored for ``connector``."""
        out = []
        for key, value in self._offsets.items():
            owner, partition = json.loads(key)
            if owner == connector and value is not None:
                out.append((partition, value))
        return out

    def records(self, connector: str, offsets: Sequence[tuple[Mapping[str, Any], Any]]) -> list[Op]:
        """Append ops storing ``offsets`` (pairs of partition, offset; None deletes)."""
        return [
            Append(
                self.log_name,
                offset_key(connector, partition),
                None if offset is None else json.dumps(offset, sort_keys=True).encode(),
            )
            for partition, offset in offsets
        ]

    async def put(
        self,
        connector: str,
        offsets: Sequence[tuple[Mapping[str, Any], Any]],
        checks: Sequence[Op] = (),
    ) -> int:
        result = await self.client.transact([*checks, *self.records(connector, offsets)])
        return result.zxid


class StatusStore(_CompactedLogStore):
    """``_status``: connector and task states; an older generation never wins."""

    # a state written twice is the same state: a task's FAILED must not be lost to an
    # expired session, or the cluster goes on showing it RUNNING
    rewritable = True

    def __init__(self, client: EnsembleClient, log_name: str = DEFAULT_STATUS_LOG) -> None:
        super().__init__(client, log_name)
        self.view = StatusView()
        self._lock = asyncio.Lock()

    def _on_record(self, record: Record) -> None:
        if record.key is not None:
            self.view.apply(record.key.decode(), record.value)

    async def put(self, status: Status) -> None:
        """Publish ``status`` unless a newer generation's status is already known."""
        if not self.view.supersedes(status):
            log.debug("not publishing %s: a newer generation wrote it", status)
            return
        key, value = status_record(status)
        await self._write([(key, value)])
        self.view.apply(key, value)

    async def put_all(self, statuses: Sequence[Status]) -> None:
        """Publish ``statuses`` in one write, less those a newer generation's status
        already stands for."""
        records = [status_record(s) for s in statuses if self.view.supersedes(s)]
        if not records:
            return
        await self._write(records)
        for key, value in records:
            self.view.apply(key, value)

    async def put_topic(self, status: TopicStatus) -> None:
        """Record that ``status.connector`` uses ``status.topic`` (once is enough)."""
        if self.view.topic(status.connector, status.topic) is not None:
            return
        key, value = topic_status_record(status)
        await self._write([(key, value)])
        self.view.apply(key, value)

    async def delete_topics(self, connector: str) -> list[str]:
        """Forget every active topic of ``connector``; returns the topics forgotten."""
        await self.read_to_end()
        topics = [t.topic for t in self.view.topics(connector)]
        if topics:
            records = [(topic_status_key(t, connector), None) for t in topics]
            await self._write(records)
            for key, _ in records:
                self.view.apply(key, None)
        return topics
