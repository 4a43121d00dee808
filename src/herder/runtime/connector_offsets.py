"""A connector's offsets, read and changed through the REST API (Connect's KIP-875).

Connect's shapes: ``{"offsets": [{"partition": {...}, "offset": {...}}]}``. A source
connector's offsets are its source partitions and offsets in ``_offsets``. A sink
connector's are the positions its consumer group ``connect-<name>`` committed at the
group coordinator, shown as ``{"kafka_topic", "kafka_partition"}`` →
``{"kafka_offset"}``.

Changing them is only for a STOPPED connector (the herder checks); like Kafka's
``alterConsumerGroupOffsets`` a sink's group must also have no members left, so a task
that has not stopped yet cannot commit over the change. Source changes are written after
a new fencing epoch of the connector is taken, so a zombie task of it can commit
nothing afterwards.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from herder.coordinator import apis
from herder.coordinator import messages as m
from herder.coordinator.client import CoordinatorClient
from herder.coordinator.offsets import TopicPartition
from herder.errors import ConfigError, ErrorCode, HerderError
from herder.runtime.stores import OffsetStore

__all__ = [
    "ConnectorOffsets",
    "OffsetChange",
    "parse_offsets_body",
    "sink_group",
]

KAFKA_TOPIC = "kafka_topic"
KAFKA_PARTITION = "kafka_partition"
KAFKA_OFFSET = "kafka_offset"

#: (partition, offset or None to delete) as the user sent them
OffsetChange = tuple[dict[str, Any], dict[str, Any] | None]

_ZOMBIES = (
    "either because its tasks haven't stopped completely yet or the connector was resumed "
    "before the request could be completed. If the connector is in a stopped state, this "
    "operation can be safely retried; if it keeps failing, a worker may still be running "
    "one of its tasks"
)


def sink_group(connector: str) -> str:
    """The consumer group of a sink connector's tasks."""
    return f"connect-{connector}"


def parse_offsets_body(body: Any) -> list[OffsetChange]:
    """The changes in a ``PATCH /connectors/<name>/offsets`` body, or ConfigError (400)."""
    offsets = body.get("offsets") if isinstance(body, dict) else None
    if not isinstance(offsets, list) or not offsets:
        raise ConfigError("The offsets to be modified must not be null or empty")
    changes: list[OffsetChange] = []
    for entry in offsets:
        if not isinstance(entry, dict):
            raise ConfigError(f"Each offset must be an object with a partition, not {entry!r}")
        partition, offset = entry.get("partition"), entry.get("offset")
        if not isinstance(partition, dict):
            raise ConfigError("The partition of each offset must be a non-null JSON object")
        if offset is not None and not isinstance(offset, dict):
            raise ConfigError("The offset of each partition must be a JSON object or null")
        changes.append((partition, offset))
    return changes


def _sink_partition(partition: Mapping[str, Any]) -> TopicPartition:
    topic, index = partition.get(KAFKA_TOPIC), partition.get(KAFKA_PARTITION)
    if topic is None or index is None:
        raise ConfigError(
            f"The partition for a sink connector offset must contain the keys "
            f"'{KAFKA_TOPIC}' and '{KAFKA_PARTITION}'"
        )
    if not isinstance(topic, str) or not topic:
        raise ConfigError(f"Topics must be non-empty strings. Invalid value for topic: {topic!r}")
    return TopicPartition(topic, _number(index, "partition"))


def _sink_offset(offset: Mapping[str, Any] | None) -> int | None:
    if offset is None:
        return None
    if KAFKA_OFFSET not in offset:
        raise ConfigError(
            f"The offset for a sink connector should either be null or contain the key "
            f"'{KAFKA_OFFSET}'"
        )
    return _number(offset[KAFKA_OFFSET], "offset")


#: the largest partition and offset Kafka's types hold (an int and a long)
_LARGEST = {"partition": 2**31 - 1, "offset": 2**63 - 1}


def _number(value: Any, what: str) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError, OverflowError):
        number = -1
    if (
        isinstance(value, bool)
        or not 0 <= number <= _LARGEST[what]
        or (isinstance(value, float) and value != number)
    ):
        raise ConfigError(
            f"Kafka {what}s must be valid non-negative numbers. Invalid value for {what}: {value!r}"
        )
    return number


class ConnectorOffsets:
    """Reads and changes connectors' offsets for the herder."""

    def __init__(self, store: OffsetStore, coordinator: CoordinatorClient) -> None:
        self.store = store
        self.coordinator = coordinator

    # -- source ---------------------------------------------------------------------

    async def source_offsets(self, connector: str) -> list[dict[str, Any]]:
        await self.store.read_to_end()
        found = self.store.for_connector(connector)
        found.sort(key=lambda item: json.dumps(item[0], sort_keys=True))
        return [{"partition": p, "offset": o} for p, o in found]

    async def alter_source(self, connector: str, changes: Sequence[OffsetChange]) -> None:
        await self._fence(connector)
        await self.store.put(connector, list(changes))

    async def reset_source(self, connector: str) -> None:
        await self._fence(connector)
        await self.store.read_to_end()
        partitions = [(p, None) for p, _ in self.store.for_connector(connector)]
        if partitions:
            await self.store.put(connector, partitions)

    async def _fence(self, connector: str) -> None:
        # the connector's epoch is checked by every commit of its source tasks
        await self.coordinator.init_fencing(f"connector-{connector}")

    # -- sink -----------------------------------------------------------------------

    async def _committed(self, connector: str) -> dict[TopicPartition, int]:
        reply = await self.coordinator.request(
            apis.OFFSET_FETCH, m.OffsetFetchRequest(group_id=sink_group(connector))
        )
        if reply.error_code != ErrorCode.NONE:
            code = ErrorCode(reply.error_code)
            raise HerderError(f"could not fetch the offsets of group {sink_group(connector)}: "
                              f"{code.name}")  # fmt: skip
        return {
            TopicPartition(o.topic, o.partition): o.offset
            for o in reply.offsets
            if o.offset != m.NO_OFFSET
        }

    async def sink_offsets(self, connector: str) -> list[dict[str, Any]]:
        committed = await self._committed(connector)
        return [
            {
                "partition": {KAFKA_TOPIC: tp.topic, KAFKA_PARTITION: tp.partition},
                "offset": {KAFKA_OFFSET: offset},
            }
            for tp, offset in sorted(committed.items())
        ]

    async def alter_sink(self, connector: str, changes: Sequence[OffsetChange]) -> None:
        wanted = {_sink_partition(p): _sink_offset(o) for p, o in changes}
        commits = {tp: o for tp, o in wanted.items() if o is not None}
        deletes = {tp for tp, o in wanted.items() if o is None}
        if deletes:
            # The coordinator deletes offsets a group at a time: keep what is not being
            # deleted, drop the group (refused while it has members), commit the rest.
            kept = await self._committed(connector)
            commits = {**{tp: o for tp, o in kept.items() if tp not in deletes}, **commits}
            await self._delete_group(connector, "alter")
        if commits:
            await self._commit(connector, commits)

    async def reset_sink(self, connector: str) -> None:
        await self._delete_group(connector, "reset")

    async def _commit(self, connector: str, offsets: Mapping[TopicPartition, int]) -> None:
        group = sink_group(connector)
        reply = await self.coordinator.request(
            apis.OFFSET_COMMIT,
            m.OffsetCommitRequest(
                group_id=group,
                generation_id=m.NO_GENERATION,
                member_id=m.NO_MEMBER_ID,
                offsets=[
                    m.OffsetCommitPartition(topic=tp.topic, partition=tp.partition, offset=o)
                    for tp, o in sorted(offsets.items())
                ],
            ),
        )
        code = ErrorCode(reply.error_code)
        if code in (ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.REBALANCE_IN_PROGRESS):
            raise HerderError(
                f"Failed to alter consumer group offsets for connector {connector} {_ZOMBIES}"
            )
        if code != ErrorCode.NONE:
            raise HerderError(f"Failed to alter the offsets of group {group}: {code.name}")

    async def _delete_group(self, connector: str, action: str) -> None:
        group = sink_group(connector)
        reply = await self.coordinator.request(
            apis.DELETE_GROUPS, m.DeleteGroupsRequest(group_ids=[group])
        )
        codes = [ErrorCode(r.error_code) for r in reply.results] or [ErrorCode(reply.error_code)]
        for code in codes:
            if code == ErrorCode.NON_EMPTY_GROUP:
                raise HerderError(
                    f"Failed to {action} consumer group offsets for connector {connector} "
                    f"{_ZOMBIES}"
                )
            if code not in (ErrorCode.NONE, ErrorCode.GROUP_ID_NOT_FOUND):
                raise HerderError(f"Failed to {action} the offsets of group {group}: {code.name}")
