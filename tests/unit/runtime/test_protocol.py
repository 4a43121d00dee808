"""The worker group protocol: encodings that survive round trips, upgrades and garbage."""

from __future__ import annotations

import contextlib

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from herder.errors import ConfigError, ProtocolError, UnsupportedVersion
from herder.runtime.core.protocol import (
    Assignment,
    AssignmentError,
    ConnectorTaskId,
    ConnectProtocol,
    WorkerMetadata,
    decode_assignment,
    decode_metadata,
    encode_assignment,
    encode_metadata,
    parse_connect_protocol,
)
from tests.strategies import for_type

pytestmark = pytest.mark.unit

versions = st.integers(min_value=0, max_value=2**15)


@given(for_type(WorkerMetadata).filter(lambda m: m.version >= 0))
def test_metadata_round_trips(metadata: WorkerMetadata) -> None:
    assert decode_metadata(encode_metadata(metadata)) == metadata


@given(for_type(Assignment).filter(lambda a: a.version >= 0))
def test_assignment_round_trips(assignment: Assignment) -> None:
    assert decode_assignment(encode_assignment(assignment)) == assignment


class _AssignmentV7(msgspec.Struct, kw_only=True):
    """What a future worker might send: the v0 fields plus new ones, in a new version."""

    version: int
    error: int
    leader: str
    leader_url: str
    config_offset: int
    connectors: list[str]
    tasks: list[tuple[str, int]]
    revoked: list[str]
    delay_ms: int


@given(versions)
def test_a_newer_assignment_keeps_the_fields_this_version_knows(version: int) -> None:
    future = _AssignmentV7(
        version=version,
        error=0,
        leader="w1",
        leader_url="http://w1:8083",
        config_offset=12,
        connectors=["c1"],
        tasks=[("c1", 0), ("c2", 3)],
        revoked=["c9"],
        delay_ms=5000,
    )
    decoded = decode_assignment(msgspec.msgpack.encode(future))
    assert decoded == Assignment(
        version=version,
        leader="w1",
        leader_url="http://w1:8083",
        config_offset=12,
        connectors=("c1",),
        tasks=(ConnectorTaskId("c1", 0), ConnectorTaskId("c2", 3)),
    )
    assert not decoded.failed


def test_a_newer_metadata_keeps_the_fields_this_version_knows() -> None:
    future = {"version": 3, "config_offset": 7, "url": "http://w2:8083", "session_key": "k"}
    assert decode_metadata(msgspec.msgpack.encode(future)) == WorkerMetadata(
        version=3, config_offset=7, url="http://w2:8083"
    )


def test_the_version_is_the_first_field_on_the_wire() -> None:
    encoded = encode_metadata(WorkerMetadata(config_offset=1, url="u"))
    assert next(iter(msgspec.msgpack.decode(encoded))) == "version"


def test_an_unknown_error_code_from_a_newer_leader_still_fails_the_assignment() -> None:
    raw = msgspec.msgpack.encode(
        {"version": 1, "error": 9, "leader": "w1", "leader_url": "u", "config_offset": 3}
    )
    assignment = decode_assignment(raw)
    assert assignment.failed
    assert assignment.error == 9


def test_config_mismatch_is_a_failed_assignment() -> None:
    mismatch = Assignment(
        error=AssignmentError.CONFIG_MISMATCH, leader="w1", leader_url="u", config_offset=4
    )
    assert decode_assignment(encode_assignment(mismatch)).failed


@pytest.mark.parametrize(
    "garbage",
    [
        b"",
        b"\xc1",
        b"not msgpack at all",
        msgspec.msgpack.encode([0, 1, "url"]),
        msgspec.msgpack.encode({"version": 0, "url": "u"}),
        msgspec.msgpack.encode({"version": "zero", "config_offset": 1, "url": "u"}),
        msgspec.msgpack.encode({"version": 0, "config_offset": 1, "url": "u"}) + b"\x00",
    ],
)
def test_garbage_is_a_protocol_error(garbage: bytes) -> None:
    with pytest.raises(ProtocolError, match="malformed worker metadata"):
        decode_metadata(garbage)
    with pytest.raises(ProtocolError, match="malformed assignment"):
        decode_assignment(garbage)


@given(st.binary(max_size=64))
def test_random_bytes_never_escape_as_anything_but_a_protocol_error(data: bytes) -> None:
    for decode in (decode_metadata, decode_assignment):
        with contextlib.suppress(ProtocolError):
            decode(data)


def test_a_negative_version_is_unsupported() -> None:
    raw = encode_metadata(WorkerMetadata(version=-1, config_offset=0, url="u"))
    with pytest.raises(UnsupportedVersion, match="version -1"):
        decode_metadata(raw)


def test_connector_task_ids_order_hash_and_print_like_connect() -> None:
    ids = [ConnectorTaskId("b", 0), ConnectorTaskId("a", 10), ConnectorTaskId("a", 2)]
    assert sorted(ids) == [
        ConnectorTaskId("a", 2),
        ConnectorTaskId("a", 10),
        ConnectorTaskId("b", 0),
    ]
    assert {ConnectorTaskId("a", 2): 1}[ConnectorTaskId("a", 2)] == 1
    assert str(ConnectorTaskId("my-conn", 3)) == "my-conn-3"


def test_connect_protocol_setting() -> None:
    assert parse_connect_protocol(" Eager ") is ConnectProtocol.EAGER
    assert ConnectProtocol.EAGER == "eager"
    assert parse_connect_protocol("sessioned") is ConnectProtocol.SESSIONED
    assert [p.value for p in ConnectProtocol.COMPATIBLE.offered()] == ["compatible", "eager"]
    assert [p.version for p in ConnectProtocol.SESSIONED.offered()] == [2, 1, 0]
    assert not ConnectProtocol.EAGER.cooperative and ConnectProtocol.SESSIONED.cooperative
    with pytest.raises(ConfigError, match="must be one of eager, compatible, sessioned"):
        parse_connect_protocol("roundrobin")
