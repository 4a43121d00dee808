"""Persisted records, their keys and codecs, and the messages' wire form."""

from __future__ import annotations

import re

import msgspec
import pytest

from herder.coordinator import CoordinatorConfig
from herder.coordinator.messages import JoinGroupResponse, OffsetFetchRequest
from herder.coordinator.offsets import OffsetAndMetadata, TopicPartition
from herder.coordinator.records import (
    FencingRecord,
    GroupRecord,
    MemberRecord,
    OffsetRecord,
    collect_groups,
    decode_fencing_value,
    decode_groups_value,
    encode_record,
    fencing_key,
    group_key,
    offset_key,
)
from herder.errors import ConfigError, ErrorCode

pytestmark = pytest.mark.unit

GROUP = GroupRecord(
    group_id="connect-sink",
    protocol_type="connect",
    generation_id=3,
    protocol="sessioned",
    leader="w1",
    state_timestamp_ms=99,
    members=[
        MemberRecord(
            member_id="w1",
            session_timeout_ms=10_000,
            rebalance_timeout_ms=60_000,
            metadata=b"meta",
            assignment=b"assigned",
        )
    ],
)
OFFSET = OffsetRecord(
    group_id="connect-sink",
    topic="orders",
    partition=2,
    offset=41,
    metadata="note",
    commit_timestamp_ms=7,
)


def test_group_and_offset_records_decode_to_what_was_encoded() -> None:
    assert decode_groups_value(encode_record(GROUP)) == GROUP
    assert decode_groups_value(encode_record(OFFSET)) == OFFSET
    fencing = FencingRecord(fenced_id="task-0", epoch=5)
    assert decode_fencing_value(encode_record(fencing)) == fencing


def test_a_corrupt_value_is_refused() -> None:
    with pytest.raises(msgspec.DecodeError):
        decode_groups_value(b"\x92\x01")


def test_keys_name_the_record() -> None:
    assert group_key("g") == b"group:g"
    assert offset_key("g", TopicPartition("t", 3)) == b"offset:g:t:3"
    assert fencing_key("task-1") == b"task-1"


def test_collect_replays_overwrites_and_tombstones_as_compaction_would() -> None:
    newer = msgspec.structs.replace(OFFSET, offset=50)
    other = OffsetRecord(
        group_id="admin-only", topic="t", partition=0, offset=1, commit_timestamp_ms=0
    )
    gone = msgspec.structs.replace(OFFSET, partition=9)
    entries: list[tuple[bytes, bytes | None]] = [
        (group_key("connect-sink"), encode_record(GROUP)),
        (offset_key("connect-sink", OFFSET.topic_partition), encode_record(OFFSET)),
        (offset_key("connect-sink", gone.topic_partition), encode_record(gone)),
        (offset_key("admin-only", TopicPartition("t", 0)), encode_record(other)),
        (offset_key("connect-sink", OFFSET.topic_partition), encode_record(newer)),
        (offset_key("connect-sink", gone.topic_partition), None),
        (group_key("deleted"), encode_record(msgspec.structs.replace(GROUP, group_id="deleted"))),
        (group_key("deleted"), None),
    ]
    groups = collect_groups(entries)
    assert sorted(groups) == ["admin-only", "connect-sink"]
    assert groups["connect-sink"].record == GROUP
    assert groups["connect-sink"].offsets == {
        TopicPartition("orders", 2): OffsetAndMetadata(
            offset=50, metadata="note", commit_timestamp_ms=7
        )
    }
    assert groups["admin-only"].record is None


def test_responses_travel_as_plain_integers_and_back() -> None:
    response = JoinGroupResponse(error_code=ErrorCode.MEMBER_ID_REQUIRED, member_id="m-1")
    decoded = msgspec.msgpack.decode(msgspec.msgpack.encode(response), type=JoinGroupResponse)
    assert decoded.error_code == 79 and decoded.member_id == "m-1"
    request = OffsetFetchRequest(group_id="g", partitions=[TopicPartition("t", 1)])
    assert (
        msgspec.msgpack.decode(msgspec.msgpack.encode(request), type=OffsetFetchRequest) == request
    )


def test_config_reads_kafka_names_and_refuses_bad_values() -> None:
    config = CoordinatorConfig.from_properties(
        {"group.max.size": "4", "group.initial.rebalance.delay.ms": "3000", "other": "x"}
    )
    assert config.group_max_size == 4
    assert config.group_initial_rebalance_delay_ms == 3000
    assert config.offsets_retention_ms == 7 * 24 * 3600 * 1000
    with pytest.raises(ConfigError, match=re.escape("group.max.size must be an integer")):
        CoordinatorConfig.from_properties({"group.max.size": "four"})
    with pytest.raises(ConfigError, match=re.escape("group.max.session.timeout.ms")):
        CoordinatorConfig(group_min_session_timeout_ms=10, group_max_session_timeout_ms=5)
    with pytest.raises(ConfigError, match=re.escape("group.max.size must be at least 1")):
        CoordinatorConfig(group_max_size=0)


class _MemberRecordBefore(msgspec.Struct, kw_only=True, frozen=True):
    """A member record as written before static membership: no instance id."""

    member_id: str
    session_timeout_ms: int
    rebalance_timeout_ms: int


class _GroupRecordBefore(msgspec.Struct, kw_only=True, frozen=True, tag="group"):
    group_id: str
    generation_id: int
    state_timestamp_ms: int
    members: list[_MemberRecordBefore] = []


def test_static_members_and_leader_epochs_are_stored_and_older_records_still_read() -> None:
    static = msgspec.structs.replace(
        GROUP, members=[msgspec.structs.replace(GROUP.members[0], group_instance_id="worker-a")]
    )
    assert decode_groups_value(encode_record(static)) == static
    epoch = msgspec.structs.replace(OFFSET, leader_epoch=12)
    decoded_epoch = decode_groups_value(encode_record(epoch))
    assert isinstance(decoded_epoch, OffsetRecord) and decoded_epoch.to_offset().leader_epoch == 12
    old = _GroupRecordBefore(
        group_id="g",
        generation_id=1,
        state_timestamp_ms=0,
        members=[_MemberRecordBefore(member_id="m", session_timeout_ms=1, rebalance_timeout_ms=1)],
    )
    decoded = decode_groups_value(msgspec.msgpack.encode(old))
    assert isinstance(decoded, GroupRecord) and decoded.members[0].group_instance_id is None
    assert OFFSET.to_offset().leader_epoch == -1
