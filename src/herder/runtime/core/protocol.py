"""The worker group protocol: what workers tell the leader, and what the leader tells them back.

Workers join the group ``group.id`` at the coordinator offering the *protocols* of
:class:`ConnectProtocol` their ``connect.protocol`` allows, and the coordinator picks the
one all members offer. Under ``eager`` each worker stops all of its work before it joins;
under ``compatible`` and ``sessioned`` (KIP-415) it keeps its work and says so in its
:class:`WorkerMetadata`, and the :class:`Assignment` names what it must give up. Either
way the leader hands each member an :class:`Assignment`. The coordinator only relays
these as opaque bytes, so the encoding here is the whole contract between workers of
different versions.

Both messages are MessagePack maps whose first key is ``version``. A newer worker may
only *add* fields: an older one decodes the fields it knows and ignores the rest, which is
how a rolling upgrade keeps a mixed group working (Connect's
``checkVersionCompatibility`` does the same: anything at or above v0 parses as v0).
"""

from __future__ import annotations

from enum import IntEnum, StrEnum
from typing import Final, TypeVar

import msgspec

from herder.errors import ConfigError, ProtocolError, UnsupportedVersion

__all__ = [
    "CONNECT_PROTOCOL_CONFIG",
    "CONNECT_PROTOCOL_V0",
    "CONNECT_PROTOCOL_V1",
    "CONNECT_PROTOCOL_V2",
    "COOPERATIVE_PROTOCOLS",
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
#: The eager protocol's messages; decoding accepts any version at or above it.
CONNECT_PROTOCOL_V0: Final = 0
#: Incremental cooperative rebalancing (KIP-415, ``compatible``): the metadata also says
#: what the worker holds, the assignment also what it must give up and for how long lost
#: work is held back.
CONNECT_PROTOCOL_V1: Final = 1
#: The same messages under ``sessioned`` (KIP-507: internal requests signed with the
#: leader's session key).
CONNECT_PROTOCOL_V2: Final = 2


class ConnectProtocol(StrEnum):
    """Rebalance protocols a worker can offer when it joins; the name goes to the coordinator."""

    #: stop everything, rejoin, start what the new assignment says (Connect before KIP-415)
    EAGER = "eager"
    #: incremental cooperative rebalancing (KIP-415): only what must move stops
    COMPATIBLE = "compatible"
    #: the same, with internal requests signed by the leader's session key (KIP-507)
    SESSIONED = "sessioned"

    @property
    def cooperative(self) -> bool:
        return self is not ConnectProtocol.EAGER

    @property
    def version(self) -> int:
        """The version of the messages this protocol sends (Connect's numbering)."""
        return _VERSIONS[self]

    def offered(self) -> tuple[ConnectProtocol, ...]:
        """What a worker set to this protocol offers when it joins, most preferred first:
        a newer protocol also offers the older ones, so a group of mixed settings agrees on
        the newest that all of its workers speak (Connect's ConnectProtocolCompatibility)."""
        order = (ConnectProtocol.SESSIONED, ConnectProtocol.COMPATIBLE, ConnectProtocol.EAGER)
        return order[order.index(self) :]


_VERSIONS: Final = {
    ConnectProtocol.EAGER: CONNECT_PROTOCOL_V0,
    ConnectProtocol.COMPATIBLE: CONNECT_PROTOCOL_V1,
    ConnectProtocol.SESSIONED: CONNECT_PROTOCOL_V2,
}

#: the protocol names under which a worker keeps its work across rebalances
COOPERATIVE_PROTOCOLS: Final = frozenset(p.value for p in ConnectProtocol if p.cooperative)


def parse_connect_protocol(value: str) -> ConnectProtocol:
    """The protocol named by the worker's ``connect.protocol`` setting; ConfigError for
    anything that is not a protocol name."""
    name = value.strip().lower()
    if name in {p.value for p in ConnectProtocol}:
        return ConnectProtocol(name)
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
    others can forward requests to it when it leads).

    Under the cooperative protocols (version 1 and up) ``connectors`` and ``tasks`` are
    the work the worker holds as it joins, which the leader leaves where it is unless it
    must move; an eager worker holds nothing when it joins and leaves them empty.
    """

    version: int = CONNECT_PROTOCOL_V0
    config_offset: int
    url: str
    connectors: tuple[str, ...] = ()
    tasks: tuple[ConnectorTaskId, ...] = ()


class Assignment(msgspec.Struct, frozen=True, kw_only=True):
    """The leader's answer to one member for one generation.

    ``config_offset`` is the config log position the assignment was computed from: a
    member that has read less must catch up before starting anything. ``error`` is an
    int rather than :class:`AssignmentError` so that a code added by a newer leader still
    decodes (and counts as :attr:`failed`) on an older worker.

    Under the cooperative protocols ``connectors`` and ``tasks`` are everything the member
    holds after this round: what it kept plus what it is given. (Connect sends only the
    additions and has the member add what it kept; the whole says the same and spares the
    member a merge that could drift.) ``revoked_connectors`` and ``revoked_tasks`` are
    what it must stop, after which it rejoins so the leader can hand them on; ``delay``
    (ms) is how long the work of a departed worker is held back for its return, after
    which the members rejoin to have it reassigned.
    """

    version: int = CONNECT_PROTOCOL_V0
    error: int = AssignmentError.NO_ERROR
    leader: str
    leader_url: str
    config_offset: int
    connectors: tuple[str, ...] = ()
    tasks: tuple[ConnectorTaskId, ...] = ()
    revoked_connectors: tuple[str, ...] = ()
    revoked_tasks: tuple[ConnectorTaskId, ...] = ()
    delay: int = 0

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
