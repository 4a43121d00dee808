"""Everything Zab peers say to each other, as msgspec structs.

Two families travel between servers:

* election :class:`Notification` s, which are idempotent statements of "this is my
  vote", so any network may lose, repeat or reorder them;
* quorum packets (ZooKeeper's ``QuorumPacket`` types), exchanged by a learner and its
  leader over one *session*. ZooKeeper relies on TCP to deliver these exactly once and
  in order; here every quorum packet carries the learner-chosen ``session`` and a
  per-direction ``seq``, so a receiver drops a duplicate or a packet of another session
  and treats a gap as the broken connection it would be. Over TCP the check never
  fires; under the simulator's network it is what keeps the protocol honest.

Every struct is ``kw_only`` and tagged, so a network shell sends any :data:`Message`
with :func:`encode` and gets it back with :func:`decode` unchanged.
"""

from __future__ import annotations

import enum
from typing import TypeAlias

import msgspec


class ServerState(enum.IntEnum):
    """A server's place in the ensemble, as its notifications announce it."""

    LOOKING = 0
    FOLLOWING = 1
    LEADING = 2
    OBSERVING = 3


class Txn(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """One transaction: its zxid and the host's opaque payload."""

    zxid: int
    payload: bytes


class Notification(msgspec.Struct, tag="notification", kw_only=True, frozen=True, gc=False):
    """A fast-leader-election vote: "I, in ``state``, back ``leader``".

    ``peer_epoch`` is the backed leader's current epoch and ``zxid`` its last logged
    zxid; votes are ordered by (peer_epoch, zxid, leader). ``voter`` is false for a
    server whose vote must not count: an observer, or a participant that found its own
    log corrupt and must be re-synced by SNAP before it may vote again.
    """

    leader: int
    zxid: int
    peer_epoch: int
    election_epoch: int
    state: ServerState
    voter: bool = True


class QuorumPacket(msgspec.Struct, kw_only=True, frozen=True, gc=False):
    """Fields every leader/learner packet carries (see the module docstring)."""

    session: int
    seq: int


class LearnerInfo(QuorumPacket, kw_only=True, frozen=True, gc=False):
    """The first packet of a session: who is connecting and what epoch it accepted."""

    accepted_epoch: int
    #: the learner's own log is corrupt: it must be synchronised by SNAP
    needs_snap: bool = False


class FollowerInfo(LearnerInfo, tag="followerinfo", kw_only=True, frozen=True, gc=False):
    """A voting learner introducing itself to the leader."""


class ObserverInfo(LearnerInfo, tag="observerinfo", kw_only=True, frozen=True, gc=False):
    """A non-voting learner introducing itself to the leader."""


class LeaderInfo(QuorumPacket, tag="leaderinfo", kw_only=True, frozen=True, gc=False):
    """The epoch the leader proposes: one more than any accepted by the quorum it heard."""

    epoch: int


class AckEpoch(QuorumPacket, tag="ackepoch", kw_only=True, frozen=True, gc=False):
    """The learner accepted the new epoch; ``current_epoch`` is -1 if it already had."""

    current_epoch: int
    last_zxid: int
    needs_snap: bool = False


class Diff(QuorumPacket, tag="diff", kw_only=True, frozen=True, gc=False):
    """Keep your log; the PROPOSAL/COMMIT pairs that follow bring you to ``zxid``."""

    zxid: int


class Trunc(QuorumPacket, tag="trunc", kw_only=True, frozen=True, gc=False):
    """Drop every txn after ``zxid`` from your log, then take the pairs that follow."""

    zxid: int


class Snap(QuorumPacket, tag="snap", kw_only=True, frozen=True, gc=False):
    """Replace your state and log with the leader's state at ``zxid``."""

    zxid: int
    data: bytes


class Proposal(QuorumPacket, tag="proposal", kw_only=True, frozen=True, gc=False):
    txn: Txn


class Commit(QuorumPacket, tag="commit", kw_only=True, frozen=True, gc=False):
    """Every proposal up to and including ``zxid`` is committed."""

    zxid: int


class Committed(QuorumPacket, tag="committed", kw_only=True, frozen=True, gc=False):
    """Part of a sync stream: ``txns``, in order, each as a PROPOSAL and its COMMIT.

    ZooKeeper sends a learner that is behind one PROPOSAL and one COMMIT per missing
    txn; a batch says the same in one packet, to be logged with one disk operation.
    """

    txns: list[Txn]


class NewLeader(QuorumPacket, tag="newleader", kw_only=True, frozen=True, gc=False):
    """The end of synchronisation; ``zxid`` is the new epoch's first zxid."""

    zxid: int


class Ack(QuorumPacket, tag="ack", kw_only=True, frozen=True, gc=False):
    """From a learner: NEWLEADER's zxid, or "every proposal up to ``zxid`` is on my disk"."""

    zxid: int


class UpToDate(QuorumPacket, tag="uptodate", kw_only=True, frozen=True, gc=False):
    """A quorum is synchronised: the learner may apply its history and serve clients."""


class Inform(QuorumPacket, tag="inform", kw_only=True, frozen=True, gc=False):
    """A committed txn, sent to observers (which never see proposals)."""

    txn: Txn


class Ping(QuorumPacket, tag="ping", kw_only=True, frozen=True, gc=False):
    """Liveness, both ways; a learner's reply carries its clients' session touches."""

    zxid: int
    touches: list[bytes] = msgspec.field(default_factory=list)


class Request(QuorumPacket, tag="request", kw_only=True, frozen=True, gc=False):
    """A client write a learner received, for the leader to propose."""

    payload: bytes


Message: TypeAlias = (
    Notification
    | FollowerInfo
    | ObserverInfo
    | LeaderInfo
    | AckEpoch
    | Diff
    | Trunc
    | Snap
    | Proposal
    | Commit
    | Committed
    | NewLeader
    | Ack
    | UpToDate
    | Inform
    | Ping
    | Request
)

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Message)


def encode(message: Message) -> bytes:
    return _encoder.encode(message)


def decode(data: bytes) -> Message:
    """The message in ``data``; raises ``msgspec.DecodeError`` / ``ValidationError``."""
    return _decoder.decode(data)
