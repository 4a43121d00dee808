"""One Zab server as a pure state machine: inputs in, a :class:`Ready` batch out."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from herder.ensemble.zab.config import ZabConfig
from herder.ensemble.zab.effects import Looking, LostLeadership, Ready
from herder.ensemble.zab.election import Election, Vote
from herder.ensemble.zab.host import HostLog, PersistedState
from herder.ensemble.zab.leader import Leader, ZabPhase
from herder.ensemble.zab.learner import Learner, LearnerPhase
from herder.ensemble.zab.messages import Message, Notification, QuorumPacket, ServerState
from herder.ensemble.zab.node import Node, StepDown
from herder.errors import NotLeader

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PeerStatus:
    """A snapshot of where a peer stands, for ``herder ensemble status`` and for tests."""

    id: int
    state: ServerState
    phase: ZabPhase
    #: the leader this peer follows or is (None while LOOKING)
    leader: int | None
    #: the epoch being led or followed (-1 while LOOKING or before it is known)
    epoch: int
    #: leader: established; learner: synchronised (UPTODATE received)
    serving: bool
    election_epoch: int
    accepted_epoch: int
    current_epoch: int
    last_zxid: int
    committed_zxid: int
    needs_snap: bool


class Peer:
    """A Zab server: fast leader election, discovery, synchronisation and broadcast.

    Inputs are :meth:`step` (a message from another server), :meth:`tick` (time
    passed), :meth:`disk_done` (the host's disk caught up), :meth:`propose` and
    :meth:`forward` (client writes) and :meth:`add_touches`. Every input that takes
    ``now_ms`` must get a clock that never goes backwards. Effects accumulate until
    the host calls :meth:`ready`; :meth:`next_deadline` says when to call :meth:`tick`.
    """

    def __init__(
        self,
        my_id: int,
        config: ZabConfig,
        state: PersistedState,
        host: HostLog,
        *,
        rng_seed: int,
        now_ms: int,
    ) -> None:
        self.node = Node(my_id, config, state, host, rng_seed)
        self.election_epoch = 0
        self.vote: Vote
        self.state = ServerState.LOOKING
        #: the election under way repeats one already reported (see StepDown.quiet)
        self._quiet = False
        #: the latest time an input brought, for inputs that bring none (propose)
        self._now = now_ms
        self._role: Election | Leader | Learner
        self._look(now_ms, "starting")

    @property
    def id(self) -> int:
        return self.node.id

    # -- inputs ---------------------------------------------------------------------

    def step(self, message: Message, from_id: int, now_ms: int) -> None:
        """Take one message ``from_id`` sent."""
        self._now = now_ms
        role = self._role
        try:
            if isinstance(message, Notification):
                if isinstance(role, Election):
                    self._settle(role.receive(from_id, message, now_ms), now_ms)
                elif message.state is ServerState.LOOKING and self.node.can_vote:
                    self._answer(from_id)
            elif isinstance(message, QuorumPacket) and not isinstance(role, Election):
                role.receive(from_id, message, now_ms)
        except StepDown as stop:
            self._look(now_ms, str(stop), quiet=stop.quiet)

    def tick(self, now_ms: int) -> None:
        """Let time pass: resend votes, ping, time out silent servers."""
        self._now = now_ms
        role = self._role
        try:
            if isinstance(role, Election):
                self._settle(role.tick(now_ms), now_ms)
            else:
                role.tick(now_ms)
        except StepDown as stop:
            self._look(now_ms, str(stop), quiet=stop.quiet)

    def disk_done(self, token: int, now_ms: int) -> None:
        """Disk op ``token`` and every one issued before it are durable."""
        self._now = now_ms
        self.node.disk_done(token)
        role = self._role
        try:
            if not isinstance(role, Election):
                role.disk_done(now_ms)
        except StepDown as stop:
            self._look(now_ms, str(stop))

    def disconnected(self, server_id: int, now_ms: int) -> None:
        """The host's connection to ``server_id`` closed (a TCP transport's news).

        A learner whose leader's connection closed goes back to election at once, and a
        leader drops that learner's session (stepping down if it no longer hears a
        quorum), as ZooKeeper does when a socket closes; without this input both only
        notice after ``syncLimit`` ticks of silence. Either move is always safe.
        """
        self._now = now_ms
        role = self._role
        try:
            if isinstance(role, Learner) and role.leader == server_id:
                raise StepDown(f"connection to leader {server_id} closed")
            if isinstance(role, Leader):
                role.disconnected(server_id)
        except StepDown as stop:
            self._look(now_ms, str(stop))

    def propose(self, payload: bytes, now_ms: int | None = None) -> int:
        """Propose a client write; returns its zxid. Only an established leader can.

        ``now_ms`` (else the time of the last input) is when the proposal goes out: a
        follower that leaves it unacknowledged for ``syncLimit`` is dropped.
        """
        if now_ms is not None:
            self._now = max(self._now, now_ms)
        role = self._role
        if not (isinstance(role, Leader) and role.established):
            raise NotLeader(f"server {self.id} is not an established leader")
        role.now = max(role.now, self._now)
        try:
            return role.propose(payload)
        except StepDown as stop:
            self._look(self._now, str(stop))
            raise NotLeader(f"server {self.id} stepped down: {stop}") from None

    def forward(self, payload: bytes, now_ms: int | None = None) -> None:
        """Get a client write proposed: directly on the leader, by REQUEST on a learner."""
        role = self._role
        if isinstance(role, Learner) and role.synced:
            role.forward(payload)
        elif isinstance(role, Leader) and role.established:
            self.propose(payload, now_ms)
        else:
            raise NotLeader(f"server {self.id} has no established leader to forward to")

    def add_touches(self, touches: list[bytes]) -> None:
        """Client-session touches for the leader, sent with the next PING reply."""
        self.node.touches.extend(touches)

    # -- outputs ----------------------------------------------------------------------

    def ready(self) -> Ready:
        """Hand out (and forget) every effect accumulated since the last call."""
        return self.node.take_ready()

    def has_ready(self) -> bool:
        return bool(self.node.outbox)

    def next_deadline(self) -> int:
        """The time at which :meth:`tick` has something to do."""
        return self._role.next_deadline()

    @property
    def leading(self) -> Leader | None:
        """The leading role while this peer leads (for its metrics), else None."""
        return self._role if isinstance(self._role, Leader) else None

    @property
    def status(self) -> PeerStatus:
        node = self.node
        role = self._role
        leader: int | None = None
        epoch = -1
        serving = False
        if isinstance(role, Leader):
            phase = role.phase
            leader, epoch, serving = node.id, role.epoch, role.established
        elif isinstance(role, Learner):
            leader, epoch, serving = role.leader, role.epoch, role.synced
            phase = (
                ZabPhase.BROADCAST
                if role.synced
                else ZabPhase.DISCOVERY
                if role.phase < LearnerPhase.EPOCH_ACKED
                else ZabPhase.SYNCHRONIZATION
            )
        else:
            phase = ZabPhase.ELECTION
        return PeerStatus(
            id=node.id,
            state=self.state,
            phase=phase,
            leader=leader,
            epoch=epoch,
            serving=serving,
            election_epoch=self.election_epoch,
            accepted_epoch=node.accepted_epoch,
            current_epoch=node.current_epoch,
            last_zxid=node.history.last,
            committed_zxid=node.history.committed,
            needs_snap=node.needs_snap,
        )

    # -- roles ------------------------------------------------------------------------

    def _answer(self, to: int) -> None:
        """A LOOKING server asked: tell it whom this settled peer backs."""
        v = self.vote
        self.node.send(
            to,
            Notification(
                leader=v.leader,
                zxid=v.zxid,
                peer_epoch=v.peer_epoch,
                election_epoch=v.election_epoch,
                state=self.state,
                voter=self.node.can_vote,
            ),
        )

    def _look(self, now: int, reason: str, *, quiet: bool = False) -> None:
        role = getattr(self, "_role", None)
        if isinstance(role, Leader) and role.established:
            log.warning("server %d: no longer leader of epoch %d: %s", self.id, role.epoch, reason)
            self.node.emit(LostLeadership(role.epoch, reason))
        elif role is not None:
            log.log(
                logging.DEBUG if quiet else logging.INFO,
                "server %d: back to election: %s",
                self.id,
                reason,
            )
        self.state = ServerState.LOOKING
        self.election_epoch += 1
        self._quiet = quiet
        election = Election(self.node, self.election_epoch, now, quiet=quiet)
        self._role = election
        self.vote = election.proposal
        self.node.emit(Looking(reason))
        self._settle(election.tick(now), now)

    def _settle(self, vote: Vote | None, now: int) -> None:
        """The election came to ``vote`` (if not None): take up the role it gives."""
        if vote is None:
            return
        node = self.node
        self.vote = vote
        self.election_epoch = vote.election_epoch
        if vote.leader != node.id:
            self.state = ServerState.FOLLOWING if node.is_participant else ServerState.OBSERVING
            self._role = Learner(node, vote.leader, now, quiet=self._quiet)
        elif node.can_vote:
            self.state = ServerState.LEADING
            node.refusal = None
            self._role = Leader(node, now)
        else:
            # stale votes may still name a server whose log turned out corrupt
            self._look(now, "elected, but this server's log is corrupt")
