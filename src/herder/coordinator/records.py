"""What the coordinator persists, and under which keys of which ensemble logs.

Two compacted logs hold the coordinator's state, so a new ensemble leader can rebuild
it (Kafka's ``__consumer_offsets`` split in two):

* ``_groups``: ``group:<group>`` → :class:`GroupRecord` (membership of the current
  generation with assignments) and ``offset:<group>:<topic>:<partition>`` →
  :class:`OffsetRecord`. A null value (tombstone) deletes the key.
* ``_fencing``: ``<fenced id>`` → :class:`FencingRecord`, one key per fenced id.

Values are MessagePack and say what they are (group and offset records are tagged,
and every record repeats its own identity), so a reader never parses a key: a group
id may contain ``:`` and the key would be ambiguous.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import msgspec

from herder.coordinator.offsets import OffsetAndMetadata, TopicPartition

GROUPS_LOG = "_groups"
FENCING_LOG = "_fencing"
GROUP_KEY_PREFIX = "group:"
OFFSET_KEY_PREFIX = "offset:"


class MemberRecord(msgspec.Struct, kw_only=True, frozen=True):
    """A member as of its group's last completed SyncGroup."""

    member_id: str
    client_id: str = ""
    client_host: str = ""
    session_timeout_ms: int
    rebalance_timeout_ms: int
    #: the member's metadata for the group's protocol (the one it rejoins with)
    metadata: bytes = b""
    assignment: bytes = b""
    #: a static member's instance id: a new coordinator must know whom it belongs to
    group_instance_id: str | None = None
    #: the names of every protocol the member offered, most preferred first (empty in
    #: records written before they were kept: only the group's protocol is known)
    protocols: list[str] = []


class GroupRecord(msgspec.Struct, kw_only=True, frozen=True, tag="group"):
    """A group's current generation (the seed's GroupMetadata value)."""

    group_id: str
    protocol_type: str = ""
    generation_id: int
    protocol: str = ""
    leader: str = ""
    #: when the group entered the state this record describes (Empty or Stable)
    state_timestamp_ms: int
    members: list[MemberRecord] = []


class OffsetRecord(msgspec.Struct, kw_only=True, frozen=True, tag="offset"):
    group_id: str
    topic: str
    partition: int
    offset: int
    metadata: str = ""
    commit_timestamp_ms: int
    leader_epoch: int = -1

    @property
    def topic_partition(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)

    def to_offset(self) -> OffsetAndMetadata:
        return OffsetAndMetadata(
            offset=self.offset,
            metadata=self.metadata,
            commit_timestamp_ms=self.commit_timestamp_ms,
            leader_epoch=self.leader_epoch,
        )

    @classmethod
    def of(
        cls, group_id: str, partition: TopicPartition, offset: OffsetAndMetadata
    ) -> OffsetRecord:
        return cls(
            group_id=group_id,
            topic=partition.topic,
            partition=partition.partition,
            offset=offset.offset,
            metadata=offset.metadata,
            commit_timestamp_ms=offset.commit_timestamp_ms,
            leader_epoch=offset.leader_epoch,
        )


class FencingRecord(msgspec.Struct, kw_only=True, frozen=True):
    fenced_id: str
    epoch: int


def group_key(group_id: str) -> bytes:
    return f"{GROUP_KEY_PREFIX}{group_id}".encode()


def offset_key(group_id: str, partition: TopicPartition) -> bytes:
    return f"{OFFSET_KEY_PREFIX}{group_id}:{partition.topic}:{partition.partition}".encode()


def fencing_key(fenced_id: str) -> bytes:
    return fenced_id.encode()


_encoder = msgspec.msgpack.Encoder()
_groups_decoder = msgspec.msgpack.Decoder(GroupRecord | OffsetRecord)
_fencing_decoder = msgspec.msgpack.Decoder(FencingRecord)


def encode_record(record: GroupRecord | OffsetRecord | FencingRecord) -> bytes:
    return _encoder.encode(record)


def decode_groups_value(data: bytes) -> GroupRecord | OffsetRecord:
    """Decode a value of the ``_groups`` log (raises ``msgspec.DecodeError`` if corrupt)."""
    return _groups_decoder.decode(data)


def decode_fencing_value(data: bytes) -> FencingRecord:
    return _fencing_decoder.decode(data)


@dataclass
class StoredGroup:
    """Everything ``_groups`` holds about one group: the arguments of ``load_group``."""

    group_id: str
    record: GroupRecord | None = None
    offsets: dict[TopicPartition, OffsetAndMetadata] = field(default_factory=dict)


def collect_groups(entries: Iterable[tuple[bytes, bytes | None]]) -> dict[str, StoredGroup]:
    """Replay ``(key, value)`` pairs of ``_groups`` in log order into per-group state.

    A later value replaces an earlier one under the same key and a null value deletes
    it, as compaction would, so the result is the same whether the log has been
    compacted yet or not.
    """
    latest: dict[bytes, GroupRecord | OffsetRecord] = {}
    for key, value in entries:
        if value is None:
            latest.pop(key, None)
        else:
            latest[key] = decode_groups_value(value)
    groups: dict[str, StoredGroup] = {}
    for record in latest.values():
        stored = groups.setdefault(record.group_id, StoredGroup(record.group_id))
        if isinstance(record, GroupRecord):
            stored.record = record
        else:
            stored.offsets[record.topic_partition] = record.to_offset()
    return groups
