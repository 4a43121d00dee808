"""Fast leader election (ZooKeeper's ``FastLeaderElection``), event by event.

Each peer keeps a logical clock, the *election epoch*, and a vote. Votes are ordered by
the backed leader's current epoch, then its last zxid, then its server id, so the
winner holds the most recent history among those who voted for it. Notifications are
idempotent statements of a vote; losing, repeating or reordering them only slows the
election down, and safety never rests on it: a leader still has to pass discovery,
where a learner ahead of it is refused.

A LOOKING peer adopts any better vote it hears and rebroadcasts it. When a quorum backs
its vote it waits ``finalize_wait_ms`` for a better one; if none comes, the vote is
final. A notification from a FOLLOWING or LEADING peer reveals an established leader,
which the peer joins once a quorum agrees on it and the leader itself says it leads.
Observers, and participants whose log is corrupt, vote for nobody and are never
counted; they learn the outcome from the voters' replies. Only voters reply to
notifications, and only to LOOKING ones, so that no two servers can keep answering
each other.
"""

from __future__ import annotations

import logging
from typing import NamedTuple

from herder.ensemble.zab.messages import Notification, ServerState
from herder.ensemble.zab.node import Node
from herder.ensemble.zab.zxid import NO_ZXID, hex_zxid

log = logging.getLogger(__name__)

#: the leader a vote names when it backs nobody
NO_LEADER = -1


class Vote(NamedTuple):
    leader: int
    zxid: int
    peer_epoch: int
    election_epoch: int
    state: ServerState = ServerState.LOOKING

    def beats(self, other: Vote) -> bool:
        """ZooKeeper's ``totalOrderPredicate``: peer epoch, then zxid, then server id."""
        return (self.peer_epoch, self.zxid, self.leader) > (
            other.peer_epoch,
            other.zxid,
            other.leader,
        )

    def agrees_with(self, other: Vote) -> bool:
        """ZooKeeper's ``Vote.equals``: settled votes only need the same leader and epoch."""
        if self.state is ServerState.LOOKING or other.state is ServerState.LOOKING:
            return (
                self.leader == other.leader
                and self.zxid == other.zxid
                and self.election_epoch == other.election_epoch
                and self.peer_epoch == other.peer_epoch
            )
        return self.leader == other.leader and self.peer_epoch == other.peer_epoch


def vote_of(n: Notification) -> Vote:
    return Vote(n.leader, n.zxid, n.peer_epoch, n.election_epoch, n.state)


class Election:
    """One run of ``lookForLeader``; :meth:`receive` and :meth:`tick` return the final vote."""

    def __init__(self, node: Node, election_epoch: int, now: int, *, quiet: bool = False) -> None:
        self.node = node
        self.clock = election_epoch
        self.proposal = self._own_vote()
        self.received: dict[int, Vote] = {}
        self.out_of_election: dict[int, Vote] = {}
        self.interval = node.config.finalize_wait_ms
        self.resend_at = now + self.interval
        self.finalize_at: int | None = None
        log.log(
            logging.DEBUG if quiet else logging.INFO,
            "server %d: LOOKING, election epoch %d, voting for %d (zxid %s)",
            node.id,
            self.clock,
            self.proposal.leader,
            hex_zxid(self.proposal.zxid),
        )
        self._broadcast(now)

    def _own_vote(self) -> Vote:
        node = self.node
        if node.can_vote:
            return Vote(node.id, node.history.last, node.current_epoch, self.clock)
        return Vote(NO_LEADER, NO_ZXID, NO_ZXID, self.clock)

    def notification(self) -> Notification:
        p = self.proposal
        return Notification(
            leader=p.leader,
            zxid=p.zxid,
            peer_epoch=p.peer_epoch,
            election_epoch=self.clock,
            state=ServerState.LOOKING,
            voter=self.node.can_vote,
        )

    def next_deadline(self) -> int:
        return self.finalize_at if self.finalize_at is not None else self.resend_at

    def _broadcast(self, now: int) -> None:
        node = self.node
        n = self.notification()
        for sid in node.config.voters:
            if sid != node.id:
                node.send(sid, n)
        if node.can_vote:
            # ZooKeeper's own notification comes back through a loopback queue; recording
            # it directly is the same thing without the round trip
            self._record(node.id, self.proposal._replace(election_epoch=self.clock), now)

    def _adopt(self, vote: Vote) -> None:
        self.proposal = Vote(vote.leader, vote.zxid, vote.peer_epoch, self.clock)

    def _beats_proposal(self, n: Notification) -> bool:
        return self.node.config.is_participant(n.leader) and vote_of(n).beats(self.proposal)

    def _quorum_agrees(self, votes: dict[int, Vote], target: Vote) -> bool:
        backers = {sid for sid, v in votes.items() if v.agrees_with(target)}
        return self.node.config.is_quorum(backers)

    def _record(self, sid: int, vote: Vote, now: int) -> None:
        self.received[sid] = vote
        if self.finalize_at is None and self._quorum_agrees(self.received, self.proposal):
            self.finalize_at = now + self.node.config.finalize_wait_ms

    def receive(self, sender: int, n: Notification, now: int) -> Vote | None:
        node = self.node
        # Only voters answer, and only a question (a LOOKING notification): an answer
        # to an answer, or from a server whose vote nobody counts, could bounce forever.
        if not (node.config.is_participant(sender) and n.voter):
            if n.state is ServerState.LOOKING and node.can_vote:
                node.send(sender, self.notification())
            return None
        if n.state is ServerState.LOOKING and n.election_epoch < self.clock and node.can_vote:
            # a voter still in an older round: tell it where we are
            node.send(sender, self.notification())
        self.resend_at = now + self.interval
        if self.finalize_at is not None:
            if not self._beats_proposal(n):
                return None  # ZooKeeper drops what it polls during the finalize wait
            self.finalize_at = None
        if not node.config.is_participant(n.leader):
            return None
        if n.state is ServerState.LOOKING:
            self._on_looking(sender, n, now)
            return None
        if n.state is ServerState.OBSERVING:
            return None
        return self._on_settled(sender, n)

    def _on_looking(self, sender: int, n: Notification, now: int) -> None:
        if n.election_epoch > self.clock:
            self.clock = n.election_epoch
            self.received.clear()
            own = self._own_vote()
            self._adopt(vote_of(n) if vote_of(n).beats(own) else own)
            self._broadcast(now)
        elif n.election_epoch < self.clock:
            return
        elif self._beats_proposal(n):
            self._adopt(vote_of(n))
            self._broadcast(now)
        self._record(sender, Vote(n.leader, n.zxid, n.peer_epoch, n.election_epoch), now)

    def _on_settled(self, sender: int, n: Notification) -> Vote | None:
        """A FOLLOWING or LEADING peer answered: maybe there is a leader to join."""
        vote = vote_of(n)
        if n.election_epoch == self.clock:
            self.received[sender] = vote
            if self._quorum_agrees(self.received, vote) and self._leader_confirmed(
                self.received, vote
            ):
                return self._final(vote)
        self.out_of_election[sender] = vote
        if self._quorum_agrees(self.out_of_election, vote) and self._leader_confirmed(
            self.out_of_election, vote
        ):
            self.clock = n.election_epoch
            return self._final(vote)
        return None

    def _leader_confirmed(self, votes: dict[int, Vote], vote: Vote) -> bool:
        """ZooKeeper's ``checkLeader``: never join a leader that has not said it leads."""
        if vote.leader == self.node.id:
            return self.clock == vote.election_epoch
        said = votes.get(vote.leader)
        return said is not None and said.state is ServerState.LEADING

    def _final(self, vote: Vote) -> Vote:
        return Vote(vote.leader, vote.zxid, vote.peer_epoch, vote.election_epoch)

    def tick(self, now: int) -> Vote | None:
        if self.finalize_at is not None:
            if now >= self.finalize_at:
                return self._final(self.proposal)
            return None
        if now >= self.resend_at:
            # nothing heard for a whole interval: say it again, and back off
            self._broadcast(now)
            self.interval = min(2 * self.interval, self.node.config.max_notification_interval_ms)
            self.resend_at = now + self.interval
        return None
