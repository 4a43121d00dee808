"""The learning role: following (or observing) a leader, from connection to broadcast.

ZooKeeper's ``Learner.syncWithLeader``, ``Follower.followLeader`` and
``Observer.observeLeader`` as one state machine:

1. send FOLLOWERINFO/OBSERVERINFO with the accepted epoch, opening a new session;
2. on LEADERINFO, accept the new epoch: write ``acceptedEpoch`` and, once it is on
   disk, answer ACKEPOCH with the current epoch and last zxid (an epoch older than the
   accepted one is refused: back to election, after a wait that grows while the same
   leader keeps refusing);
3. take the DIFF/TRUNC/SNAP and the committed txns that follow (in batches) into the
   log, then the proposals not yet committed;
4. on NEWLEADER write ``currentEpoch``; ACK only once it and everything the sync
   brought are on disk;
5. on UPTODATE hand out the synchronised history as committed and start serving;
6. in broadcast, log each PROPOSAL and ACK it once durable, apply COMMITs (observers:
   INFORMs), answer PINGs with the clients' session touches, forward client writes as
   REQUESTs.

A learner that hears nothing from its leader for ``init_limit`` ticks while it
synchronises, or ``sync_limit`` ticks after, goes back to election.
"""

from __future__ import annotations

import enum
import logging
from typing import Any, cast

from herder.ensemble.zab.effects import EpochKind, Following, Snapshot
from herder.ensemble.zab.messages import (
    Ack,
    AckEpoch,
    Commit,
    Committed,
    Diff,
    FollowerInfo,
    Inform,
    LeaderInfo,
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
from herder.ensemble.zab.node import Node, Refusal, StepDown
from herder.ensemble.zab.zxid import epoch_of, hex_zxid, make_zxid

log = logging.getLogger(__name__)


class LearnerPhase(enum.IntEnum):
    CONNECTING = 0  # info sent, waiting for LEADERINFO
    EPOCH_ACKED = 1  # waiting for DIFF/TRUNC/SNAP
    SYNCING = 2  # taking the sync stream, until NEWLEADER is acked
    SYNCED = 3  # NEWLEADER acked, waiting for UPTODATE
    BROADCAST = 4


class Learner:
    def __init__(self, node: Node, leader: int, now: int, *, quiet: bool = False) -> None:
        self.node = node
        self.leader = leader
        self.observer = not node.is_participant
        self.session = node.rng.getrandbits(62)
        self.in_seq = 0
        self.phase = LearnerPhase.CONNECTING
        self.last_heard = now
        self.epoch = -1
        self.commit_target = -1
        self._ackepoch: tuple[int, int] | None = None  # (token, current epoch to report)
        self._newleader_token: int | None = None
        self._snapshot: Snapshot | None = None
        self._snapshot_txns: list[Txn] = []
        self.acked = -1
        #: refused by this leader: when to go back to election (see _refused)
        self._give_up_at: int | None = None
        self.now = now
        info = ObserverInfo if self.observer else FollowerInfo
        role = "observing" if self.observer else "following"
        log.log(
            logging.DEBUG if quiet else logging.INFO,
            "server %d: %s leader %d",
            node.id,
            role,
            leader,
        )
        self._info = info(
            session=self.session,
            seq=0,
            accepted_epoch=node.accepted_epoch,
            needs_snap=node.needs_snap,
        )
        self.out_seq = 1
        node.send(leader, self._info)
        # The leader may not have finished its own election yet and then drops the
        # info, as ZooKeeper's refuses the connection: say it again every tick until
        # LEADERINFO comes (the leader ignores a repeat of a session it knows).
        self._resend_at = now + node.config.tick_ms

    @property
    def synced(self) -> bool:
        return self.phase is LearnerPhase.BROADCAST

    def next_deadline(self) -> int:
        if self._give_up_at is not None:
            return self._give_up_at
        config = self.node.config
        limit = config.sync_limit if self.synced else config.init_limit
        timeout = self.last_heard + limit * config.tick_ms
        if self.phase is LearnerPhase.CONNECTING:
            return min(timeout, self._resend_at)
        return timeout

    def _send(self, packet: type[QuorumPacket], **fields: Any) -> None:
        message = packet(session=self.session, seq=self.out_seq, **fields)
        self.node.send(self.leader, cast(Message, message))
        self.out_seq += 1

    # -- inputs ---------------------------------------------------------------------

    def receive(self, sender: int, packet: QuorumPacket, now: int) -> None:
        self.now = now
        if self._give_up_at is not None:
            return  # this session was abandoned when the leader's epoch was refused
        if sender != self.leader or packet.session != self.session or packet.seq < self.in_seq:
            return
        if packet.seq > self.in_seq:
            raise StepDown(f"lost packets from leader {self.leader}")
        self.in_seq += 1
        self.last_heard = now
        handler = _HANDLERS.get(type(packet))
        if handler is None:
            raise StepDown(f"leader {self.leader} sent {type(packet).__name__}, not a leader's")
        handler(self, packet)

    def _expect(self, packet: QuorumPacket, *phases: LearnerPhase) -> None:
        if self.phase not in phases:
            raise StepDown(
                f"leader {self.leader} sent {type(packet).__name__} in phase {self.phase.name}"
            )

    def _on_leaderinfo(self, packet: LeaderInfo) -> None:
        self._expect(packet, LearnerPhase.CONNECTING)
        node = self.node
        epoch = packet.epoch
        if epoch < node.accepted_epoch:
            self._refused(epoch)
            return
        self.epoch = epoch
        self.phase = LearnerPhase.EPOCH_ACKED
        if epoch == node.accepted_epoch:
            # accepted in an earlier session; ZooKeeper says so with -1
            self._send_ackepoch(-1)
        elif node.config.faults.skip_accepted_epoch_persist:
            node.accepted_epoch = epoch
            self._send_ackepoch(node.current_epoch)
        else:
            current = node.current_epoch
            self._ackepoch = (node.save_epoch(EpochKind.ACCEPTED, epoch), current)

    def _refused(self, epoch: int) -> None:
        """The leader's epoch is older than one this server accepted: it cannot follow.

        Only the next election (which counts this server's accepted epoch) can take it
        back in. Going back to election at once would find the same leader and be
        refused again, in a loop as fast as the network: wait instead, doubling the
        wait (up to initLimit) while the same leader keeps refusing, and say so once.
        A closed connection to the leader still ends the wait at once.
        """
        node = self.node
        config = node.config
        refusal = node.refusal
        if refusal is not None and (refusal.leader, refusal.epoch) == (self.leader, epoch):
            refusal.count += 1
            level = logging.DEBUG
        else:
            refusal = node.refusal = Refusal(self.leader, epoch)
            level = logging.WARNING
        cap = config.init_limit * config.tick_ms
        wait = min(config.tick_ms << min(refusal.count - 1, 30), cap)
        log.log(
            level,
            "server %d: leader %d leads epoch %d, older than the epoch %d this server"
            " accepted; it cannot follow before the next election, and asks again every"
            " %d ms at most (refused %d time(s))",
            node.id,
            self.leader,
            epoch,
            node.accepted_epoch,
            cap,
            refusal.count,
        )
        self._give_up_at = self.now + wait

    def _send_ackepoch(self, current_epoch: int) -> None:
        node = self.node
        self._send(
            AckEpoch,
            current_epoch=current_epoch,
            last_zxid=node.history.last,
            needs_snap=node.needs_snap,
        )

    def _on_diff(self, packet: Diff) -> None:
        self._expect(packet, LearnerPhase.EPOCH_ACKED)
        self.phase = LearnerPhase.SYNCING
        self.commit_target = packet.zxid

    def _on_trunc(self, packet: Trunc) -> None:
        self._expect(packet, LearnerPhase.EPOCH_ACKED)
        self.phase = LearnerPhase.SYNCING
        log.info("server %d: truncating the log to %s", self.node.id, hex_zxid(packet.zxid))
        self.node.log_truncate(packet.zxid)
        self.commit_target = packet.zxid

    def _on_snap(self, packet: Snap) -> None:
        self._expect(packet, LearnerPhase.EPOCH_ACKED)
        self.phase = LearnerPhase.SYNCING
        log.info("server %d: receiving a snapshot at %s", self.node.id, hex_zxid(packet.zxid))
        # held back until NEWLEADER, with what follows it (see SaveSnapshot)
        self._snapshot = Snapshot(packet.zxid, packet.data)
        self.commit_target = packet.zxid

    def _take(self, txn: Txn) -> None:
        """Log a txn of the sync stream or of the broadcast."""
        snapshot_txns = self._snapshot_txns
        if self._snapshot is None:
            last = self.node.history.last
        else:
            last = snapshot_txns[-1].zxid if snapshot_txns else self._snapshot.zxid
        if txn.zxid <= last:
            raise StepDown(f"txn {hex_zxid(txn.zxid)} does not follow {hex_zxid(last)}")
        if self._snapshot is None:
            self.node.log_append(txn)
        else:
            snapshot_txns.append(txn)

    def _on_proposal(self, packet: Proposal) -> None:
        self._expect(packet, LearnerPhase.SYNCING, LearnerPhase.SYNCED, LearnerPhase.BROADCAST)
        if self.observer and self.phase is not LearnerPhase.SYNCING:
            # observers take proposals only as part of the sync stream, INFORMs after
            raise StepDown(f"leader {self.leader} sent a PROPOSAL to an observer")
        self._take(packet.txn)

    def _commit(self, zxid: int) -> None:
        if self.phase is not LearnerPhase.BROADCAST:
            # the sync stream's COMMITs are only final once a quorum has the history
            self.commit_target = max(self.commit_target, zxid)
            return
        if zxid > self.node.history.last:
            raise StepDown(f"COMMIT {hex_zxid(zxid)} for a txn never proposed to us")
        if self.node.config.faults.follower_ignores_commits and not self.observer:
            return
        self.node.commit(zxid)

    def _on_commit(self, packet: Commit) -> None:
        self._expect(packet, LearnerPhase.SYNCING, LearnerPhase.SYNCED, LearnerPhase.BROADCAST)
        self._commit(packet.zxid)

    def _on_committed(self, packet: Committed) -> None:
        self._expect(packet, LearnerPhase.SYNCING)
        take = self._take
        for txn in packet.txns:
            take(txn)
        if packet.txns:
            self._commit(packet.txns[-1].zxid)

    def _on_inform(self, packet: Inform) -> None:
        self._expect(packet, LearnerPhase.SYNCING, LearnerPhase.SYNCED, LearnerPhase.BROADCAST)
        self._take(packet.txn)
        self._commit(packet.txn.zxid)

    def _on_newleader(self, packet: NewLeader) -> None:
        self._expect(packet, LearnerPhase.SYNCING)
        node = self.node
        if epoch_of(packet.zxid) != self.epoch:
            raise StepDown(f"NEWLEADER {hex_zxid(packet.zxid)} is not of epoch {self.epoch}")
        if self._snapshot is not None:
            node.install_snapshot(self._snapshot, self._snapshot_txns)
            self._snapshot = None
            self._snapshot_txns = []
        token = node.save_epoch(EpochKind.CURRENT, self.epoch)
        if node.config.faults.ack_newleader_before_disk:
            self._ack_newleader()
        else:
            self._newleader_token = token

    def _ack_newleader(self) -> None:
        self._newleader_token = None
        self.phase = LearnerPhase.SYNCED
        self._send(Ack, zxid=make_zxid(self.epoch, 0))
        self._ack_durable()

    def _on_uptodate(self, packet: UpToDate) -> None:
        self._expect(packet, LearnerPhase.SYNCED)
        node = self.node
        self.phase = LearnerPhase.BROADCAST
        node.refusal = None
        node.commit(min(self.commit_target, node.history.last))
        log.info("server %d: up to date with leader %d, epoch %d", node.id, self.leader, self.epoch)
        node.emit(Following(self.leader, self.epoch, self.observer))

    def _on_ping(self, packet: Ping) -> None:
        node = self.node
        touches, node.touches = node.touches, []
        self._send(Ping, zxid=node.history.last, touches=touches)

    def disk_done(self, now: int) -> None:
        node = self.node
        if self._ackepoch is not None and node.is_durable(self._ackepoch[0]):
            current = self._ackepoch[1]
            self._ackepoch = None
            self._send_ackepoch(current)
        if self._newleader_token is not None and node.is_durable(self._newleader_token):
            self._ack_newleader()
        elif self.phase >= LearnerPhase.SYNCED:
            self._ack_durable()

    def _ack_durable(self) -> None:
        """ACK every proposal of this epoch now on disk (one ACK covers a whole fsync)."""
        durable = self.node.durable_zxid
        if not self.observer and durable > self.acked and epoch_of(durable) == self.epoch:
            self.acked = durable
            self._send(Ack, zxid=durable)

    def forward(self, payload: bytes) -> None:
        self._send(Request, payload=payload)

    def tick(self, now: int) -> None:
        self.now = now
        if self._give_up_at is not None:
            if now >= self._give_up_at:
                raise StepDown(
                    f"leader {self.leader}'s epoch is older than the accepted"
                    f" {self.node.accepted_epoch}",
                    quiet=self.node.refusal is not None and self.node.refusal.count > 1,
                )
            return
        config = self.node.config
        limit = config.sync_limit if self.synced else config.init_limit
        if now >= self.last_heard + limit * config.tick_ms:
            raise StepDown(f"leader {self.leader} silent for {now - self.last_heard} ms")
        if self.phase is LearnerPhase.CONNECTING and now >= self._resend_at:
            self.node.send(self.leader, cast(Message, self._info))
            self._resend_at = now + config.tick_ms


_HANDLERS: dict[type, Any] = {
    LeaderInfo: Learner._on_leaderinfo,
    Diff: Learner._on_diff,
    Trunc: Learner._on_trunc,
    Snap: Learner._on_snap,
    Proposal: Learner._on_proposal,
    Commit: Learner._on_commit,
    Committed: Learner._on_committed,
    Inform: Learner._on_inform,
    NewLeader: Learner._on_newleader,
    UpToDate: Learner._on_uptodate,
    Ping: Learner._on_ping,
}
