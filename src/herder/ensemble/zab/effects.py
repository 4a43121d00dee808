"""What a peer asks its host to do: the contents of a :class:`Ready` batch.

A host drains ``peer.ready()`` after feeding it an input and carries the batch out:

1. issue ``disk`` operations in order. They may complete asynchronously (group commit),
   but *in order*: a host reports ``peer.disk_done(token)`` only once that operation and
   every earlier one are durable. In particular the log is fsync'd before an epoch file
   that was issued after it is renamed into place. The host's view of its own log (what
   :class:`~herder.ensemble.zab.host.HostLog` reads) reflects an operation as soon as it
   is issued;
2. send ``messages`` (none of them depends on a disk operation of the same batch: the
   peer holds those back until the matching ``disk_done``);
3. restore the state machine from ``snapshot`` if there is one, then apply
   ``committed`` in order;
4. react to ``events`` (role changes) and to session ``touches`` learners reported.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TypeAlias

from herder.ensemble.zab.messages import Message, Txn


class EpochKind(enum.Enum):
    """The two epoch files, under ZooKeeper's file names."""

    ACCEPTED = "acceptedEpoch"
    CURRENT = "currentEpoch"


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A state machine's state after applying every txn up to ``zxid``; opaque bytes."""

    zxid: int
    data: bytes


@dataclass(slots=True)
class Append:
    """Append ``txns`` to the log (consecutive appends of one batch are merged)."""

    token: int
    txns: list[Txn]


@dataclass(frozen=True, slots=True)
class Truncate:
    """Drop every logged txn after ``zxid`` (TRUNC from a leader)."""

    token: int
    zxid: int


@dataclass(frozen=True, slots=True)
class SaveEpoch:
    """Write an epoch file: temp file, fsync, rename."""

    token: int
    kind: EpochKind
    epoch: int


@dataclass(frozen=True, slots=True)
class SaveSnapshot:
    """Replace the whole log, atomically, by a SNAP's snapshot and the txns after it.

    A learner gathers the snapshot and every txn its leader streams after it, and only
    at NEWLEADER asks for them to be written, as one operation: a crash must find either
    the old log or the complete new history, never the snapshot with half the txns that
    follow it, which could be shorter than the old log and forget acknowledged txns.
    It replaces the log corrupt or not, which is how a server that found its own log
    corrupt becomes whole again.
    """

    token: int
    snapshot: Snapshot
    txns: list[Txn]


DiskOp: TypeAlias = Append | Truncate | SaveEpoch | SaveSnapshot


@dataclass(frozen=True, slots=True)
class Envelope:
    """A message for server ``to``."""

    to: int
    message: Message


@dataclass(frozen=True, slots=True)
class Looking:
    """The peer started a leader election (at start, or having left its last role)."""

    reason: str


@dataclass(frozen=True, slots=True)
class Leading:
    """A quorum acknowledged this peer as leader of ``epoch``: it may take writes."""

    epoch: int


@dataclass(frozen=True, slots=True)
class LostLeadership:
    """Emitted the moment an established leader steps down (quorum lost, …).

    Whatever runs on the leader (the group coordinator) must stop acting as such at once.
    """

    epoch: int
    reason: str


@dataclass(frozen=True, slots=True)
class Following:
    """The peer is synchronised with ``leader`` in ``epoch`` and applies its commits."""

    leader: int
    epoch: int
    observer: bool


Event: TypeAlias = Looking | Leading | LostLeadership | Following


@dataclass(frozen=True, slots=True)
class Touches:
    """Client-session touches a learner reported in a PING (opaque to Zab)."""

    learner: int
    touches: list[bytes]


@dataclass(slots=True)
class Ready:
    """One batch of effects; see the module docstring for the order to carry them out."""

    messages: list[Envelope] = field(default_factory=list)
    disk: list[DiskOp] = field(default_factory=list)
    snapshot: Snapshot | None = None
    committed: list[Txn] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    touches: list[Touches] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(
            self.messages
            or self.disk
            or self.snapshot is not None
            or self.committed
            or self.events
            or self.touches
        )
