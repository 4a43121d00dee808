"""Zab, ZooKeeper's atomic broadcast, as a pure state machine.

The shape is etcd's ``raft`` package: a :class:`Peer` does no IO, reads no clock and
starts no thread. The host (the real server in ``herder.ensemble``, or the simulator in
``tests/sim``) feeds it inputs and carries out the effects it returns.

Inputs
    ``Peer(my_id, config, PersistedState, host_log, rng_seed=…, now_ms=…)`` starts a
    peer from its epoch files and the txns logged after its snapshot. Then:
    ``step(message, from_id, now_ms)`` for every message received;
    ``tick(now_ms)`` whenever ``next_deadline()`` has passed;
    ``disk_done(token, now_ms)`` once disk op ``token`` (and all before it) is durable;
    ``propose(payload, now_ms) -> zxid`` on the established leader (``NotLeader``
    elsewhere); ``forward(payload, now_ms)`` anywhere synchronised (a learner sends it
    as a REQUEST);
    ``add_touches(touches)`` for the client-session touches a learner's PING carries.

Outputs
    ``ready() -> Ready``: messages to send (:class:`Envelope`), disk ops to issue in
    order (:class:`Append`, :class:`Truncate`, :class:`SaveEpoch`, :class:`SaveSnapshot`,
    each with a token), a :class:`Snapshot` to restore the state machine from, txns
    committed (apply in order), role events (:class:`Looking`, :class:`Leading`,
    :class:`LostLeadership` — emitted the moment a leader steps down —,
    :class:`Following`) and the session :class:`Touches` learners sent the leader.
    ``next_deadline()`` and ``status`` complete the picture.

What the host provides beyond inputs is a small :class:`HostLog`: its own on-disk log
(for synchronising a learner from it), its snapshot's size, and the state machine's
state when a learner needs a SNAP. Txns and snapshots are opaque bytes throughout.

Modules follow the protocol's phases: :mod:`.election` (fast leader election),
:mod:`.leader` (discovery, synchronisation and broadcast from the leader's side, one
session per learner), :mod:`.sync` (the per-learner choice of DIFF, TRUNC or SNAP),
:mod:`.learner` (the same phases from a follower's or observer's side), with
:mod:`.messages`, :mod:`.effects`, :mod:`.history` (the in-memory log) and
:mod:`.node` (what the roles share) beneath them.

Where this differs from ZooKeeper, and why:

* Quorum packets carry a session id and sequence number (see :mod:`.messages`), so the
  protocol survives any network, not only TCP.
* A learner's ACK(zxid) acknowledges every proposal up to ``zxid`` and a COMMIT(zxid)
  commits every proposal up to it: a learner logs proposals in order, so one ACK per
  fsync says what ZooKeeper's one ACK per proposal says, with fewer packets.
* Nothing is applied before it is committed. ZooKeeper loads every logged txn into its
  data tree at start-up and applies DIFF commits during synchronisation, undoing them
  with a reload after a TRUNC; here a peer hands out its synchronised history as
  committed only at UPTODATE (the leader: when a quorum has ACKed NEWLEADER).
* A SNAP carries the snapshot in the packet, taken at the leader's last applied zxid;
  the txns the leader has logged but not yet applied follow it as PROPOSAL/COMMIT pairs.
  The learner writes the snapshot and those txns as one disk operation at NEWLEADER
  (:class:`SaveSnapshot`), so that a sync cut short never leaves it with a history
  shorter than the one it had acknowledged.
* A server whose own log is corrupt neither votes (its notifications say so) nor counts
  in the epoch-acknowledgement quorum; it asks for a SNAP in FOLLOWERINFO/ACKEPOCH.
* In an election only voters answer, and only LOOKING notifications (ZooKeeper answers
  any notification from a non-voter), so that no two servers can answer each other
  forever.
* A learner refused by its leader (too many syncs, ahead of the leader during
  discovery) learns it by timing out rather than by a closed socket; a learner repeats
  FOLLOWERINFO every tick until LEADERINFO comes, as ZooKeeper retries its connection to
  a leader that has not finished its own election yet.
* A learner that refuses its leader's epoch (older than one it accepted) waits before
  the next election, a tick at first and doubling up to ``initLimit``, and says so once:
  only an election that counts its accepted epoch can take it back in, and retrying at
  once loops as fast as the network (ZooKeeper retries at once).
* A sync stream's committed txns travel in batches (:class:`~.messages.Committed`,
  about 1 MiB each) rather than as one PROPOSAL and one COMMIT per txn.
"""

from herder.ensemble.zab.config import Faults, Role, ZabConfig
from herder.ensemble.zab.effects import (
    Append,
    DiskOp,
    Envelope,
    EpochKind,
    Event,
    Following,
    Leading,
    Looking,
    LostLeadership,
    Ready,
    SaveEpoch,
    SaveSnapshot,
    Snapshot,
    Touches,
    Truncate,
)
from herder.ensemble.zab.history import DivergedHistory
from herder.ensemble.zab.host import HostLog, PersistedState
from herder.ensemble.zab.leader import ZabPhase
from herder.ensemble.zab.messages import Message, ServerState, Txn, decode, encode
from herder.ensemble.zab.peer import Peer, PeerStatus
from herder.ensemble.zab.zxid import Epoch, Zxid, epoch_of, hex_zxid, make_zxid

__all__ = [
    "Append",
    "DiskOp",
    "DivergedHistory",
    "Envelope",
    "Epoch",
    "EpochKind",
    "Event",
    "Faults",
    "Following",
    "HostLog",
    "Leading",
    "Looking",
    "LostLeadership",
    "Message",
    "Peer",
    "PeerStatus",
    "PersistedState",
    "Ready",
    "Role",
    "SaveEpoch",
    "SaveSnapshot",
    "ServerState",
    "Snapshot",
    "Touches",
    "Truncate",
    "Txn",
    "ZabConfig",
    "ZabPhase",
    "Zxid",
    "decode",
    "encode",
    "epoch_of",
    "hex_zxid",
    "make_zxid",
]
