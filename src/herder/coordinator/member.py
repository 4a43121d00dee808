"""One member of a group: who it is, what it speaks, and what it is waiting for."""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from herder.coordinator.messages import (
    JoinGroupProtocol,
    JoinGroupResponse,
    SyncGroupResponse,
)
from herder.coordinator.records import MemberRecord
from herder.coordinator.timers import Timer

JoinCallback = Callable[[JoinGroupResponse], None]
SyncCallback = Callable[[SyncGroupResponse], None]

#: a protocol a member supports: its name and the member's metadata for it
SupportedProtocol = tuple[str, bytes]


def protocols_of(request_protocols: Sequence[JoinGroupProtocol]) -> list[SupportedProtocol]:
    return [(protocol.name, protocol.metadata) for protocol in request_protocols]


@dataclass(eq=False, kw_only=True, slots=True)
class Member:
    """A member of a group (the seed's MemberMetadata).

    ``awaiting_join`` and ``awaiting_sync`` hold the callbacks of a JoinGroup parked
    until the rebalance completes and of a SyncGroup parked until the leader's
    assignment is stored. A member with either is alive by definition: its session
    timer does not expire it while the coordinator owes it an answer. Its group parks
    and unparks the JoinGroup (``Group.park_join``), since it counts who is waiting.

    The exception is a *new* member (``is_new``: it has not been in a generation
    yet). Its timer is the new-member join timeout, and it is dropped when that runs
    out even with its JoinGroup parked: it cannot heartbeat, and a client that gave up
    waiting would otherwise stay a member for the whole rebalance.

    A static member (``group_instance_id`` set) keeps its place across restarts: a new
    process with the same instance id takes the member over under a new member id.
    """

    member_id: str
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    #: in the member's order of preference
    protocols: list[SupportedProtocol]
    assignment: bytes = b""
    group_instance_id: str | None = None
    is_new: bool = False
    awaiting_join: JoinCallback | None = None
    awaiting_sync: SyncCallback | None = None
    #: expires the member unless it shows signs of life before the deadline
    session_timer: Timer | None = None

    @property
    def protocol_names(self) -> list[str]:
        return [name for name, _ in self.protocols]

    @property
    def is_static(self) -> bool:
        return self.group_instance_id is not None

    @property
    def is_awaiting_join(self) -> bool:
        return self.awaiting_join is not None

    @property
    def is_awaiting_sync(self) -> bool:
        return self.awaiting_sync is not None

    def metadata(self, protocol: str) -> bytes:
        """The member's metadata for ``protocol`` (which it must support)."""
        for name, metadata in self.protocols:
            if name == protocol:
                return metadata
        raise ValueError(f"member {self.member_id} does not support protocol {protocol!r}")

    def matches(self, protocols: Sequence[SupportedProtocol]) -> bool:
        """Whether a rejoin brings exactly what the member joined with (order included)."""
        return list(protocols) == self.protocols

    def vote(self, candidates: Collection[str]) -> str:
        """The member's most preferred protocol among those every member supports."""
        for name, _ in self.protocols:
            if name in candidates:
                return name
        raise ValueError(f"member {self.member_id} supports none of {sorted(candidates)}")

    def to_record(self, protocol: str, assignment: bytes) -> MemberRecord:
        return MemberRecord(
            member_id=self.member_id,
            client_id=self.client_id,
            client_host=self.client_host,
            session_timeout_ms=self.session_timeout_ms,
            rebalance_timeout_ms=self.rebalance_timeout_ms,
            metadata=self.metadata(protocol),
            assignment=assignment,
            group_instance_id=self.group_instance_id,
            protocols=[name for name, _ in self.protocols],
        )

    @classmethod
    def from_record(cls, record: MemberRecord, protocol_type: str, protocol: str) -> Member:
        """A member read back from the store. It offered every protocol the record
        names (so a member that joins offering only an older one of them is not
        refused with INCONSISTENT_GROUP_PROTOCOL while the group is being upgraded), but
        its metadata is known only for the group's protocol, the one it was stored
        under: the others' is empty until it rejoins, which it must do to take part in
        any later generation."""
        return cls(
            member_id=record.member_id,
            client_id=record.client_id,
            client_host=record.client_host,
            session_timeout_ms=record.session_timeout_ms,
            rebalance_timeout_ms=record.rebalance_timeout_ms,
            protocol_type=protocol_type,
            protocols=[
                (name, record.metadata if name == protocol else b"")
                for name in record.protocols or [protocol]
            ],
            assignment=record.assignment,
            group_instance_id=record.group_instance_id,
        )
