"""The leading role: discovery, synchronisation and broadcast, seen from the leader.

One :class:`LearnerSession` per connected learner plays the part of ZooKeeper's
``LearnerHandler``; :class:`Leader` is ``Leader.lead`` and ``LearnerMaster``.

* **Discovery.** The leader counts FOLLOWERINFO/OBSERVERINFO. Once a quorum of
  participants (itself included) has connected, the new epoch is one more than the
  highest epoch any of them accepted; the leader writes it to ``acceptedEpoch`` and
  only then sends LEADERINFO. ACKEPOCHs from a quorum, none of them from a learner with
  a more recent history than the leader's, end discovery; the leader then writes
  ``currentEpoch``.
* **Synchronisation.** Each learner that acked the epoch gets a plan from
  :func:`~herder.ensemble.zab.sync.plan_sync`, the proposals still outstanding, then
  NEWLEADER. When a quorum (the leader once its own ``currentEpoch`` and log are on
  disk) has ACKed NEWLEADER, the leader is established: its initial history is
  committed and every synchronised learner gets UPTODATE.
* **Broadcast.** A proposal commits, in zxid order, once a quorum of participants has
  it on disk; followers get COMMIT, observers INFORM with the txn. Every half tick the
  leader pings its learners; a learner silent for ``sync_limit`` ticks is dropped, and so
  is a follower that answers pings but has left a proposal unacknowledged that long (a
  stuck disk); a leader left without a quorum of live followers steps down at once.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

from herder.ensemble.zab.effects import EpochKind, Leading, Touches
from herder.ensemble.zab.messages import (
    Ack,
    AckEpoch,
    Commit,
    Committed,
    Diff,
    Inform,
    LeaderInfo,
    LearnerInfo,
    Message,
    NewLeader,
    ObserverInfo,
    Ping,
    Proposal,
    QuorumPacket,
    Request,
    Snap,
    Trunc,
    Txn,
    UpToDate,
)
from herder.ensemble.zab.node import Node, StepDown
from herder.ensemble.zab.sync import SyncKind, SyncThrottle, TxnLogReader, plan_sync
from herder.ensemble.zab.zxid import COUNTER_MASK, hex_zxid, make_zxid

log = logging.getLogger(__name__)

#: a sync stream's committed txns go out in packets of about this many bytes
SYNC_BATCH_BYTES = 1 << 20


class ZabPhase(enum.IntEnum):
    """ZooKeeper's ``ZabState``."""

    ELECTION = 0
    DISCOVERY = 1
    SYNCHRONIZATION = 2
    BROADCAST = 3


class SessionPhase(enum.IntEnum):
    CONNECTED = 0  # FOLLOWERINFO/OBSERVERINFO received
    EPOCH_ACKED = 1  # ACKEPOCH received, waiting for the end of discovery
    SYNCING = 2  # sync packets and NEWLEADER sent
    SYNCED = 3  # NEWLEADER acked, waiting for the leader to be established
    UP_TO_DATE = 4  # UPTODATE sent: in broadcast


@dataclass(eq=False, slots=True)
class LearnerSession:
    sid: int
    session: int
    observer: bool
    needs_snap: bool
    last_heard: int
    phase: SessionPhase = SessionPhase.CONNECTED
    out_seq: int = 0
    in_seq: int = 1  # the learner's info packet was seq 0
    leaderinfo_sent: bool = False
    peer_zxid: int = -1  # where the learner's log ended when it acked the epoch
    acked: int = -1  # once synchronised: every proposal up to here is on its disk
    throttle: SyncThrottle | None = None
    #: ZooKeeper's SyncLimitCheck, once NEWLEADER is acked: the oldest proposal sent and
    #: not yet acked, and the newest one sent after it, each as (zxid, sent at)
    oldest_unacked: tuple[int, int] | None = None
    newest_unacked: tuple[int, int] | None = None

    def proposed(self, zxid: int, now: int) -> None:
        if self.oldest_unacked is None:
            self.oldest_unacked = (zxid, now)
        else:
            self.newest_unacked = (zxid, now)

    def on_ack(self, zxid: int) -> None:
        """One ACK covers every proposal up to ``zxid``; what it leaves was sent no
        earlier than the newest proposal's time, which errs on the lenient side."""
        newest = self.newest_unacked
        if newest is not None and zxid >= newest[0]:
            self.oldest_unacked = self.newest_unacked = None
        elif self.oldest_unacked is not None and zxid >= self.oldest_unacked[0]:
            self.oldest_unacked, self.newest_unacked = newest, None

    def end_sync(self) -> None:
        if self.throttle is not None:
            self.throttle.end()
            self.throttle = None


class Leader:
    def __init__(self, node: Node, now: int) -> None:
        self.node = node
        config = node.config
        self.phase = ZabPhase.DISCOVERY
        self.sessions: dict[int, LearnerSession] = {}
        self.connected_voters = {node.id}
        self.max_accepted = node.accepted_epoch
        self.epoch = -1  # chosen at the end of the first half of discovery
        self._accepted_token: int | None = None
        self._epoch_ready = False
        # what the leader brings into the new epoch: (currentEpoch, last zxid)
        self.summary = (node.current_epoch, node.history.last)
        self.initial_zxid = node.history.last
        self.epoch_acks = {node.id}
        self.newleader_acks: set[int] = set()
        self._current_token: int | None = None
        # ZooKeeper gives each of the leader's three waits (a quorum connected, a quorum
        # acked the epoch, a quorum acked NEWLEADER) initLimit ticks of its own, so a
        # slow but healthy sync (a large SNAP) does not cost the leadership
        self.init_window = config.init_limit * config.tick_ms
        self.establish_by = now + self.init_window
        self.waiting_for = "a quorum of learners to connect"
        self.now = now
        self.half_tick = max(1, config.tick_ms // 2)
        self.next_ping = now + self.half_tick
        self._pings = 0
        #: sizes of the proposals of this leadership: last, smallest, largest (bytes)
        self.proposal_sizes: tuple[int, int, int] | None = None
        self.snap_throttle = SyncThrottle(config.max_concurrent_snap_syncs)
        self.diff_throttle = SyncThrottle(config.max_concurrent_diff_syncs)
        log.info("server %d: LEADING, discovering a quorum", node.id)
        self._maybe_choose_epoch()

    @property
    def established(self) -> bool:
        return self.phase is ZabPhase.BROADCAST

    def next_deadline(self) -> int:
        if self.established:
            return self.next_ping
        return min(self.next_ping, self.establish_by)

    # -- sending ----------------------------------------------------------------------

    def _send(self, s: LearnerSession, packet: type[QuorumPacket], **fields: Any) -> None:
        self.node.send(s.sid, cast(Message, packet(session=s.session, seq=s.out_seq, **fields)))
        s.out_seq += 1

    def _drop(self, s: LearnerSession, reason: str) -> None:
        log.warning("server %d: dropping learner %d: %s", self.node.id, s.sid, reason)
        if self.sessions.get(s.sid) is s:
            del self.sessions[s.sid]
        s.end_sync()

    # -- inputs ---------------------------------------------------------------------

    def receive(self, sender: int, packet: QuorumPacket, now: int) -> None:
        self.now = now
        if isinstance(packet, LearnerInfo) and packet.seq == 0:
            self._connect(sender, packet, now)
            return
        s = self.sessions.get(sender)
        if s is None or packet.session != s.session or packet.seq < s.in_seq:
            return  # another session's packet, or a duplicate
        if packet.seq > s.in_seq:
            self._drop(s, "packets lost")
            return
        s.in_seq += 1
        s.last_heard = now
        if isinstance(packet, Ack):
            self._on_ack(s, packet)
        elif isinstance(packet, Ping):
            if packet.touches:
                self.node.outbox.touches.append(Touches(s.sid, packet.touches))
        elif isinstance(packet, Request):
            if self.established and s.phase is SessionPhase.UP_TO_DATE:
                self.propose(packet.payload)
                if self.node.config.faults.propose_requests_twice:
                    self.propose(packet.payload)
        elif isinstance(packet, AckEpoch) and s.phase is SessionPhase.CONNECTED:
            self._on_ack_epoch(s, packet)
        else:
            self._drop(s, f"unexpected {type(packet).__name__} in phase {s.phase.name}")

    def _connect(self, sid: int, info: LearnerInfo, now: int) -> None:
        node = self.node
        if sid not in node.config.servers or sid == node.id:
            return
        current = self.sessions.get(sid)
        if current is not None:
            if current.session == info.session:
                return  # a duplicate of the info that opened it
            self._drop(current, "it reconnected")
        observer = isinstance(info, ObserverInfo) or not node.config.is_participant(sid)
        s = LearnerSession(sid, info.session, observer, info.needs_snap, now)
        self.sessions[sid] = s
        if self.epoch < 0:
            self.max_accepted = max(self.max_accepted, info.accepted_epoch)
            if not observer:
                self.connected_voters.add(sid)
            self._maybe_choose_epoch()
        elif self._epoch_ready:
            self._send_leaderinfo(s)

    def _maybe_choose_epoch(self) -> None:
        node = self.node
        if self.epoch >= 0 or not node.config.is_quorum(self.connected_voters):
            return
        self.epoch = self.max_accepted + 1
        log.info("server %d: proposing epoch %d", node.id, self.epoch)
        if node.config.faults.skip_accepted_epoch_persist:
            node.accepted_epoch = self.epoch
            self._on_epoch_ready()
        else:
            self._accepted_token = node.save_epoch(EpochKind.ACCEPTED, self.epoch)

    def _on_epoch_ready(self) -> None:
        self._epoch_ready = True
        self._wait_for("a quorum to acknowledge the epoch")
        for s in list(self.sessions.values()):
            self._send_leaderinfo(s)
        self._maybe_end_discovery()

    def _wait_for(self, what: str) -> None:
        self.waiting_for = what
        self.establish_by = self.now + self.init_window

    def _send_leaderinfo(self, s: LearnerSession) -> None:
        if not s.leaderinfo_sent:
            s.leaderinfo_sent = True
            self._send(s, LeaderInfo, epoch=self.epoch)

    def _on_ack_epoch(self, s: LearnerSession, ack: AckEpoch) -> None:
        if not s.leaderinfo_sent:
            self._drop(s, "ACKEPOCH before LEADERINFO")
            return
        s.needs_snap = s.needs_snap or ack.needs_snap
        s.phase = SessionPhase.EPOCH_ACKED
        s.peer_zxid = ack.last_zxid
        # a learner that had already accepted this epoch (-1) made its promise in an
        # earlier session, and one with a corrupt log has no history to vouch for.
        # Once discovery is over, a quorum has vouched that nothing past the leader's
        # history was committed: a learner ahead of it holds only uncommitted txns and
        # is synchronised (TRUNC) like any other, as ZooKeeper's syncFollower does.
        if ack.current_epoch >= 0 and not s.needs_snap and self.phase is ZabPhase.DISCOVERY:
            if (ack.current_epoch, ack.last_zxid) > self.summary:
                self._drop(
                    s,
                    f"it is ahead of the leader (epoch {ack.current_epoch}, zxid "
                    f"{hex_zxid(ack.last_zxid)} > epoch {self.summary[0]}, zxid "
                    f"{hex_zxid(self.summary[1])})",
                )
                return
            if not s.observer:
                self.epoch_acks.add(s.sid)
        if self.phase is ZabPhase.DISCOVERY:
            self._maybe_end_discovery()
        else:
            self._synchronise(s)

    def _maybe_end_discovery(self) -> None:
        node = self.node
        if (
            self.phase is not ZabPhase.DISCOVERY
            or not self._epoch_ready
            or not node.config.is_quorum(self.epoch_acks)
        ):
            return
        self.phase = ZabPhase.SYNCHRONIZATION
        self._wait_for("a quorum to acknowledge NEWLEADER")
        self._current_token = node.save_epoch(EpochKind.CURRENT, self.epoch)
        for s in list(self.sessions.values()):
            if s.phase is SessionPhase.EPOCH_ACKED:
                self._synchronise(s)

    def disk_done(self, now: int) -> None:
        self.now = now
        node = self.node
        if self._accepted_token is not None and node.is_durable(self._accepted_token):
            self._accepted_token = None
            self._on_epoch_ready()
        self._maybe_establish()
        self._try_commit()

    # -- synchronisation --------------------------------------------------------------

    def _sync_point(self) -> int:
        """Where the leader's committed history ends, its initial history included."""
        history = self.node.history
        return history.committed if self.established else self.initial_zxid

    def _synchronise(self, s: LearnerSession) -> None:
        node = self.node
        config = node.config
        history = node.history
        sync_point = self._sync_point()
        plan = plan_sync(
            s.peer_zxid,
            history.upto(sync_point),
            sync_point,
            force_snap=s.needs_snap or config.force_snap_sync,
            txn_log=self._txn_log_reader(),
        )
        throttle = self.snap_throttle if plan.kind is SyncKind.SNAP else self.diff_throttle
        if not throttle.begin(exempt=not s.observer):
            self._drop(s, f"too many concurrent {plan.kind.value} syncs")
            return
        s.throttle = throttle
        log.info(
            "server %d: syncing learner %d (zxid %s) by %s",
            node.id,
            s.sid,
            hex_zxid(s.peer_zxid),
            plan.kind.value,
        )
        pairs: Sequence[Txn]
        if plan.kind is SyncKind.SNAP:
            snapshot = node.host.snapshot_for_sync()
            in_memory = len(history) > 0 and history.first <= snapshot.zxid
            if snapshot.zxid < history.committed and not in_memory:
                raise ValueError(
                    f"the host's snapshot ({hex_zxid(snapshot.zxid)}) lags the txns it was "
                    f"told to apply ({hex_zxid(history.committed)}) by more than the "
                    "in-memory log holds: a host applies committed txns before its next input"
                )
            self._send(s, Snap, zxid=snapshot.zxid, data=snapshot.data)
            pairs = [t for t in history.upto(sync_point) if t.zxid > snapshot.zxid]
        else:
            self._send(s, Diff if plan.kind is SyncKind.DIFF else Trunc, zxid=plan.zxid)
            pairs = plan.txns
        self._send_committed(s, pairs)
        if not s.observer:
            for txn in history.after(sync_point):
                self._send(s, Proposal, txn=txn)
        self._send(s, NewLeader, zxid=make_zxid(self.epoch, 0))
        s.phase = SessionPhase.SYNCING

    def _send_committed(self, s: LearnerSession, txns: Sequence[Txn]) -> None:
        batch: list[Txn] = []
        size = 0
        for txn in txns:
            batch.append(txn)
            size += 16 + len(txn.payload)
            if size >= SYNC_BATCH_BYTES:
                self._send(s, Committed, txns=batch)
                batch, size = [], 0
        if batch:
            self._send(s, Committed, txns=batch)

    def _txn_log_reader(self) -> TxnLogReader | None:
        factor = self.node.config.snapshot_size_factor
        if factor < 0:
            return None
        host = self.node.host
        # with no snapshot yet there is nothing to weigh the log against, and ZooKeeper
        # puts no limit on it either
        limit = int(factor * host.snapshot_size()) or None
        return lambda start: host.read_log(start, limit)

    def _on_ack(self, s: LearnerSession, ack: Ack) -> None:
        if s.phase is SessionPhase.SYNCING:
            if ack.zxid != make_zxid(self.epoch, 0):
                self._drop(s, f"ACK {hex_zxid(ack.zxid)} while NEWLEADER is unanswered")
                return
            s.phase = SessionPhase.SYNCED
            s.end_sync()
            if not s.observer:
                self.newleader_acks.add(s.sid)
            if self.established:
                self._send_uptodate(s)
            else:
                self._maybe_establish()
        elif s.phase >= SessionPhase.SYNCED:
            if not s.observer and ack.zxid > s.acked:
                s.acked = ack.zxid
                s.on_ack(ack.zxid)
                self._try_commit()
        else:
            self._drop(s, f"ACK in phase {s.phase.name}")

    def _send_uptodate(self, s: LearnerSession) -> None:
        s.phase = SessionPhase.UP_TO_DATE
        self._send(s, UpToDate)

    def _maybe_establish(self) -> None:
        node = self.node
        if self.phase is not ZabPhase.SYNCHRONIZATION or self._current_token is None:
            return
        if not node.is_durable(self._current_token):
            return
        if not node.config.is_quorum(self.newleader_acks | {node.id}):
            return
        self.phase = ZabPhase.BROADCAST
        log.info("server %d: established as leader of epoch %d", node.id, self.epoch)
        node.emit(Leading(self.epoch))
        node.commit(self.initial_zxid)
        for s in self.sessions.values():
            if s.phase is SessionPhase.SYNCED:
                self._send_uptodate(s)

    def learner_counts(self) -> dict[str, int]:
        """ZooKeeper's ``mntr`` counts of this leader's learners: connected, and in
        broadcast (``synced``), followers and observers apart."""
        sessions = list(self.sessions.values())
        synced = [s for s in sessions if s.phase is SessionPhase.UP_TO_DATE]
        return {
            "learners": len(sessions),
            "followers": sum(1 for s in sessions if not s.observer),
            "synced_followers": sum(1 for s in synced if not s.observer),
            "synced_observers": sum(1 for s in synced if s.observer),
        }

    # -- broadcast -------------------------------------------------------------------

    def propose(self, payload: bytes) -> int:
        node = self.node
        last = node.history.last
        counter = last & COUNTER_MASK if last >> 32 == self.epoch else 0
        if counter == COUNTER_MASK:
            # ZooKeeper's answer to a rolled-over counter: a new epoch, by a new election
            raise StepDown(f"zxid counter exhausted in epoch {self.epoch}")
        txn = Txn(make_zxid(self.epoch, counter + 1), payload)
        size = len(payload)
        sizes = self.proposal_sizes
        self.proposal_sizes = (
            (size, size, size)
            if sizes is None
            else (size, min(sizes[1], size), max(sizes[2], size))
        )
        node.log_append(txn)
        now = self.now
        for s in self.sessions.values():
            if not s.observer and s.phase >= SessionPhase.SYNCING:
                self._send(s, Proposal, txn=txn)
                if s.phase >= SessionPhase.SYNCED:
                    s.proposed(txn.zxid, now)
        return txn.zxid

    def _try_commit(self) -> None:
        node = self.node
        history = node.history
        if not self.established or history.committed >= history.last:
            return
        acks = [node.durable_zxid]
        acks.extend(
            s.acked
            for s in self.sessions.values()
            if not s.observer and s.phase >= SessionPhase.SYNCED
        )
        if node.config.faults.commit_on_one_ack:
            target = max(acks)
        else:
            quorum = node.config.quorum_size
            if len(acks) < quorum:
                return
            acks.sort(reverse=True)
            target = acks[quorum - 1]
        if target <= history.committed:
            return
        newly = node.commit(target)
        if not newly:
            return
        upto = newly[-1].zxid
        for s in self.sessions.values():
            if s.phase < SessionPhase.SYNCING:
                continue
            if s.observer:
                for txn in newly:
                    self._send(s, Inform, txn=txn)
            else:
                self._send(s, Commit, zxid=upto)

    # -- time ---------------------------------------------------------------------------

    def tick(self, now: int) -> None:
        self.now = now
        config = self.node.config
        if not self.established and now >= self.establish_by:
            raise StepDown(
                f"waited initLimit ({config.init_limit} ticks) for {self.waiting_for}"
                f" in {self.phase.name}"
            )
        if now < self.next_ping:
            return
        self.next_ping = now + self.half_tick
        self._pings += 1
        last = self.node.history.last
        for s in self.sessions.values():
            if s.phase >= SessionPhase.SYNCING:
                self._send(s, Ping, zxid=last)
        if self._pings % 2 == 0:
            self._check_learners(now)

    def disconnected(self, sid: int) -> None:
        """The connection to learner ``sid`` closed: drop it; keep leading only on a quorum."""
        s = self.sessions.get(sid)
        if s is None:
            return
        self._drop(s, "its connection closed")
        if self.established:
            self._require_quorum()

    def _require_quorum(self) -> None:
        alive = {s.sid for s in self.sessions.values() if not s.observer}
        alive.add(self.node.id)
        if not self.node.config.is_quorum(alive):
            raise StepDown(f"lost its quorum: only {sorted(alive)} heard from within syncLimit")

    def _check_learners(self, now: int) -> None:
        node = self.node
        config = node.config
        sync_window = config.sync_limit * config.tick_ms
        init_window = (config.init_limit + config.sync_limit) * config.tick_ms
        for s in list(self.sessions.values()):
            window = sync_window if s.phase >= SessionPhase.SYNCED else init_window
            if now - s.last_heard > window:
                self._drop(s, f"silent for {now - s.last_heard} ms")
            elif s.oldest_unacked is not None and now - s.oldest_unacked[1] >= sync_window:
                # it answers pings, but its disk does not keep up (or is stuck)
                zxid, sent = s.oldest_unacked
                self._drop(
                    s,
                    f"proposal {hex_zxid(zxid)} unacknowledged for {now - sent} ms"
                    f" (syncLimit is {config.sync_limit} ticks)",
                )
        if self.established:
            self._require_quorum()
