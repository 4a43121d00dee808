"""The worker group protocol: what workers tell the leader, and what the leader tells them back.

Workers join the group ``group.id`` at the coordinator with one *protocol*, ``eager``
(Kafka Connect's ``connect.protocol=eager``): on every rebalance each worker stops all of
its work, joins with its :class:`WorkerMetadata`, and the leader hands each member an
:class:`Assignment`. The coordinator only relays these as opaque bytes, so the encoding
here is the whole contract between workers of different versions.

Both messages are MessagePack maps whose first key is ``version``. A newer worker may
only *add* fields: an older one decodes the fields it knows and ignores the rest, which is
how a rolling upgrade keeps a mixed group working (Connect's
``checkVersionCompatibility`` does the same: anything at or above v0 parses as v0).
"""

from __future__ import annotations

from enum import IntEnum, StrEnum
from typing import Final, TypeVar

import msgspec

from herder.errors import ConfigError, NotSupported, ProtocolError, UnsupportedVersion

__all__ = [
    "CONNECT_PROTOCOL_CONFIG",
    "CONNECT_PROTOCOL_V0",
    "Assignment",
    "AssignmentError",
    "ConnectProtocol",
    "ConnectorTaskId",
    "WorkerMetadata",
    "decode_assignment",
    "decode_metadata",
    "encode_assignment",
    "encode_metadata",
    "parse_connect_protocol",
]

CONNECT_PROTOCOL_CONFIG: Final = "connect.protocol"
#: The only version written so far; decoding accepts any version at or above it.
CONNECT_PROTOCOL_V0: Final = 0


class ConnectProtocol(StrEnum):
    """Rebalance protocols a worker can offer when it joins; the name goes to the coordinator."""

    #: stop everything, rejoin, start what the new assignment says (Connect before KIP-415)
    EAGER = "eager"


# Connect's later protocols, named so a user who copies a modern worker config learns at
# once that they are absent rather than reading "invalid value".
_UNSUPPORTED_PROTOCOLS: Final = {
    "compatible": "incremental cooperative rebalancing (KIP-415)",
    "sessioned": "incremental cooperative rebalancing with session keys (KIP-507)",
}


def parse_connect_protocol(value: str) -> ConnectProtocol:
    """The protocol named by the worker's ``connect.protocol`` setting.

    Raises NotSupported for Connect's cooperative protocols, which herder does not
    implement, and ConfigError for anything else that is not a protocol name.
    """
    name = value.strip().lower()
    if name in {p.value for p in ConnectProtocol}:
        return ConnectProtocol(name)
    if name in _UNSUPPORTED_PROTOCOLS:
        raise NotSupported(
            f"{CONNECT_PROTOCOL_CONFIG}={name} ({_UNSUPPORTED_PROTOCOLS[name]}) is not "
            f"supported; set {CONNECT_PROTOCOL_CONFIG}=eager"
        )
    valid = ", ".join(p.value for p in ConnectProtocol)
    raise ConfigError(
        f"Invalid value {value!r} for configuration {CONNECT_PROTOCOL_CONFIG}: "
        f"must be one of {valid}"
    )


class ConnectorTaskId(msgspec.Struct, frozen=True, order=True, array_like=True):
    """One task of a connector: the connector's name and the task's index from 0.

    Ordered by (connector, task) so assignments and listings come out in a stable order;
    ``str()`` gives Connect's ``name-0`` form used in logs and thread names.
    """

    connector: str
    task: int

    def __str__(self) -> str:
        return f"{self.connector}-{self.task}"


class AssignmentError(IntEnum):
    """Why the leader could not hand out work this generation."""

    NO_ERROR = 0
    #: The leader could not read the config log as far as some member already had, so
    #: any assignment it made could be based on stale configs. Every member reads the
    #: config log to the end and rejoins.
    CONFIG_MISMATCH = 1


class WorkerMetadata(msgspec.Struct, frozen=True, kw_only=True):
    """What a worker says about itself when it joins: how far it has read the config log
    (so the leader can tell whether it is behind) and where its REST API answers (so
    others can forward requests to it when it leads)."""

    version: int = CONNECT_PROTOCOL_V0
    config_offset: int
    url: str


class Assignment(msgspec.Struct, frozen=True, kw_only=True):
    """The leader's answer to one member for one generation.

    ``config_offset`` is the config log position the assignment was computed from: a
    member that has read less must catch up before starting anything. ``error`` is an
    int rather than :class:`AssignmentError` so that a code added by a newer leader still
    decodes (and counts as :attr:`failed`) on an older worker.
    """

    version: int = CONNECT_PROTOCOL_V0
    error: int = AssignmentError.NO_ERROR
    leader: str
    leader_url: str
    config_offset: int
    connectors: tuple[str, ...] = ()
    tasks: tuple[ConnectorTaskId, ...] = ()

    @property
    def failed(self) -> bool:
        """Whether the member must not start work from this assignment."""
        return self.error != AssignmentError.NO_ERROR


_encoder: Final = msgspec.msgpack.Encoder()
_metadata_decoder: Final = msgspec.msgpack.Decoder(WorkerMetadata)
_assignment_decoder: Final = msgspec.msgpack.Decoder(Assignment)


def encode_metadata(metadata: WorkerMetadata) -> bytes:
    """The bytes a worker sends as its protocol metadata in JoinGroup."""
    return _encoder.encode(metadata)


def decode_metadata(data: bytes) -> WorkerMetadata:
    """A member's metadata as the leader receives it; ProtocolError if it is not one."""
    return _decode(_metadata_decoder, data, "worker metadata")


def encode_assignment(assignment: Assignment) -> bytes:
    """The bytes the leader sends for one member in SyncGroup."""
    return _encoder.encode(assignment)


def decode_assignment(data: bytes) -> Assignment:
    """A member's assignment as it arrives in SyncGroup; ProtocolError if it is not one."""
    return _decode(_assignment_decoder, data, "assignment")


_Message = TypeVar("_Message", WorkerMetadata, Assignment)


def _decode(decoder: msgspec.msgpack.Decoder[_Message], data: bytes, what: str) -> _Message:
    try:
        message = decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise ProtocolError(f"malformed {what} in the worker group protocol: {exc}") from exc
    if message.version < CONNECT_PROTOCOL_V0:
        raise UnsupportedVersion(
            f"unsupported {what} version {message.version} in the worker group protocol"
        )
    return message
