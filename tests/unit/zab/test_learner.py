"""The learner's side: what it persists before answering, and what it applies when."""

from __future__ import annotations

from typing import Any

import pytest

from herder.ensemble.zab import (
    Append,
    DivergedHistory,
    EpochKind,
    Following,
    Looking,
    PersistedState,
    SaveEpoch,
    SaveSnapshot,
    ServerState,
    Snapshot,
    Truncate,
)
from herder.ensemble.zab.messages import (
    Ack,
    AckEpoch,
    Commit,
    Committed,
    Diff,
    FollowerInfo,
    LeaderInfo,
    NewLeader,
    Ping,
    Proposal,
    QuorumPacket,
    Request,
    Snap,
    Trunc,
    UpToDate,
)
from herder.errors import NotLeader
from tests.unit.zab.harness import Driver, FakeHost, config, txns, vote, z

pytestmark = pytest.mark.unit


class FakeLeader:
    """Plays server 1 towards learner 2, numbering its packets in the learner's session."""

    def __init__(self, learner: Driver) -> None:
        self.learner = learner
        info = learner.to(1)[-1]
        assert isinstance(info, FollowerInfo)
        self.info = info
        self.seq = 0

    def send(self, packet: type[QuorumPacket], **fields: Any) -> Any:
        message = packet(session=self.info.session, seq=self.seq, **fields)
        self.seq += 1
        return self.learner.step(message, 1)

    def received(self) -> list[QuorumPacket]:
        return self.learner.to(1)


def following(state: PersistedState | None = None) -> tuple[Driver, FakeLeader]:
    """Learner 2, told by servers 1 (leading) and 3 (following) who leads."""
    from herder.ensemble.zab import Peer

    peer = Peer(2, config(), state or PersistedState(), FakeHost(), rng_seed=2, now_ms=0)
    learner = Driver(peer)
    learner.drain()
    learner.step(vote(1, 0, 1, state=ServerState.LEADING), 1)
    learner.step(vote(1, 0, 1, state=ServerState.FOLLOWING), 3)
    assert peer.status.state is ServerState.FOLLOWING
    return learner, FakeLeader(learner)


def synced(state: PersistedState | None = None) -> tuple[Driver, FakeLeader]:
    learner, leader = following(state)
    leader.send(LeaderInfo, epoch=2)
    leader.send(Diff, zxid=learner.peer.status.last_zxid)
    leader.send(NewLeader, zxid=z(2, 0))
    leader.send(UpToDate)
    assert learner.peer.status.serving
    return learner, leader


def test_ackepoch_waits_for_the_accepted_epoch_to_be_on_disk() -> None:
    learner, leader = following(PersistedState(accepted_epoch=1, current_epoch=1))
    assert learner.to(1)[-1] == FollowerInfo(
        session=leader.info.session, seq=0, accepted_epoch=1, needs_snap=False
    )
    learner.hold_disk = True
    leader.send(LeaderInfo, epoch=5)
    assert SaveEpoch(token=1, kind=EpochKind.ACCEPTED, epoch=5) in learner.disk
    assert not any(isinstance(p, AckEpoch) for p in leader.received())
    learner.release_disk()
    assert leader.received()[-1] == AckEpoch(
        session=leader.info.session, seq=1, current_epoch=1, last_zxid=0
    )


def test_an_epoch_accepted_before_is_acked_at_once_with_minus_one() -> None:
    learner, leader = following(PersistedState(accepted_epoch=5, current_epoch=4))
    learner.hold_disk = True
    leader.send(LeaderInfo, epoch=5)
    ack = leader.received()[-1]
    assert isinstance(ack, AckEpoch) and ack.current_epoch == -1


def test_a_leader_with_an_older_epoch_is_refused_and_asked_again_after_a_wait() -> None:
    learner, leader = following(PersistedState(accepted_epoch=6, current_epoch=4))
    leader.send(LeaderInfo, epoch=5)
    assert not any(isinstance(p, AckEpoch) for p in leader.received())
    # it waits a tick (100 ms) before it looks for a leader again
    assert learner.peer.next_deadline() == 100
    assert not learner.tick(99).events
    ready = learner.tick(100)
    assert any(isinstance(e, Looking) and "older" in e.reason for e in ready.events)
    assert learner.peer.status.state is ServerState.LOOKING


def test_newleader_is_acked_only_once_the_diff_and_current_epoch_are_on_disk() -> None:
    learner, leader = following(PersistedState(accepted_epoch=1, current_epoch=1))
    leader.send(LeaderInfo, epoch=2)
    learner.hold_disk = True
    leader.send(Diff, zxid=z(1, 2))
    for t in txns(z(1, 1), z(1, 2)):
        leader.send(Proposal, txn=t)
        leader.send(Commit, zxid=t.zxid)
    leader.send(NewLeader, zxid=z(2, 0))
    assert not any(isinstance(p, Ack) for p in leader.received())
    assert learner.disk[-3:] == [
        Append(token=2, txns=txns(z(1, 1))),
        Append(token=3, txns=txns(z(1, 2))),
        SaveEpoch(token=4, kind=EpochKind.CURRENT, epoch=2),
    ]
    learner.release_disk()
    assert leader.received()[-1] == Ack(session=leader.info.session, seq=2, zxid=z(2, 0))


def test_a_batch_of_the_sync_stream_is_logged_as_one_append_and_applied_at_uptodate() -> None:
    learner, leader = following(PersistedState(accepted_epoch=1, current_epoch=1))
    leader.send(LeaderInfo, epoch=2)
    learner.hold_disk = True
    leader.send(Diff, zxid=z(1, 3))
    leader.send(Committed, txns=txns(z(1, 1), z(1, 2), z(1, 3)))
    leader.send(NewLeader, zxid=z(2, 0))
    assert learner.disk[-2:] == [
        Append(token=4, txns=txns(z(1, 1), z(1, 2), z(1, 3))),
        SaveEpoch(token=5, kind=EpochKind.CURRENT, epoch=2),
    ]
    assert learner.committed == []
    learner.release_disk()
    ready = leader.send(UpToDate)
    assert [t.zxid for t in ready.committed] == [z(1, 1), z(1, 2), z(1, 3)]


def test_a_batch_out_of_order_sends_the_learner_back_to_election() -> None:
    _learner, leader = following(
        PersistedState(accepted_epoch=1, current_epoch=1, log_tail=txns(z(1, 1), z(1, 2)))
    )
    leader.send(LeaderInfo, epoch=2)
    leader.send(Diff, zxid=z(1, 3))
    ready = leader.send(Committed, txns=txns(z(1, 2), z(1, 3)))
    assert any(isinstance(e, Looking) and "does not follow" in e.reason for e in ready.events)


def test_nothing_is_applied_before_uptodate_and_everything_synced_is_after() -> None:
    # the learner logged (1,1) before it restarted; whether it committed, only the
    # new leader can say
    learner, leader = following(
        PersistedState(accepted_epoch=1, current_epoch=1, log_tail=txns(z(1, 1)))
    )
    leader.send(LeaderInfo, epoch=2)
    leader.send(Diff, zxid=z(1, 2))
    leader.send(Proposal, txn=txns(z(1, 2))[0])
    leader.send(Commit, zxid=z(1, 2))
    leader.send(NewLeader, zxid=z(2, 0))
    assert learner.committed == []
    ready = leader.send(UpToDate)
    assert [t.zxid for t in ready.committed] == [z(1, 1), z(1, 2)]
    assert Following(leader=1, epoch=2, observer=False) in ready.events


def test_trunc_drops_the_txns_the_leader_never_had() -> None:
    learner, leader = following(
        PersistedState(accepted_epoch=1, current_epoch=1, log_tail=txns(z(1, 1), z(1, 2)))
    )
    leader.send(LeaderInfo, epoch=2)
    leader.send(Trunc, zxid=z(1, 1))
    assert Truncate(token=2, zxid=z(1, 1)) in learner.disk
    assert learner.peer.status.last_zxid == z(1, 1)
    leader.send(NewLeader, zxid=z(2, 0))
    ready = leader.send(UpToDate)
    assert [t.zxid for t in ready.committed] == [z(1, 1)]


def test_a_trunc_below_what_was_applied_is_refused_loudly() -> None:
    learner, _leader = synced(
        PersistedState(accepted_epoch=1, current_epoch=1, log_tail=txns(z(1, 1), z(1, 2)))
    )
    # a later session of the same learner, after a restart of its leader
    learner.step(vote(1, 0, 1, state=ServerState.LEADING, election_epoch=9), 1)
    learner.tick(10_000)
    learner.step(vote(1, 0, 1, state=ServerState.LEADING, election_epoch=9), 1)
    learner.step(vote(1, 0, 1, state=ServerState.FOLLOWING, election_epoch=9), 3)
    again = FakeLeader(learner)
    again.send(LeaderInfo, epoch=3)
    with pytest.raises(DivergedHistory):
        again.send(Trunc, zxid=z(1, 1))


def test_a_snap_and_what_follows_it_are_written_as_one_operation_at_newleader() -> None:
    learner, leader = following(
        PersistedState(accepted_epoch=1, current_epoch=1, log_tail=txns(z(1, 1), z(1, 7)))
    )
    leader.send(LeaderInfo, epoch=2)
    before = len(learner.disk)
    leader.send(Snap, zxid=z(1, 5), data=b"state@5")
    leader.send(Proposal, txn=txns(z(1, 6))[0])
    leader.send(Commit, zxid=z(1, 6))
    assert learner.disk[before:] == []  # a crash now must find the old log intact
    assert learner.peer.status.last_zxid == z(1, 7)
    leader.send(NewLeader, zxid=z(2, 0))
    assert learner.disk[before:] == [
        SaveSnapshot(token=2, snapshot=Snapshot(z(1, 5), b"state@5"), txns=txns(z(1, 6))),
        SaveEpoch(token=3, kind=EpochKind.CURRENT, epoch=2),
    ]
    assert learner.snapshots == [Snapshot(z(1, 5), b"state@5")]
    ready = leader.send(UpToDate)
    assert [t.zxid for t in ready.committed] == [z(1, 6)]


def test_a_gap_in_the_leaders_packets_sends_the_learner_back_to_election() -> None:
    _learner, leader = following()
    leader.seq = 1  # LEADERINFO (seq 0) was lost
    ready = leader.send(Diff, zxid=0)
    assert any(isinstance(e, Looking) and "lost packets" in e.reason for e in ready.events)


def test_duplicates_and_other_sessions_are_ignored() -> None:
    learner, leader = following()
    leader.send(LeaderInfo, epoch=2)
    acks = len(leader.received())
    learner.step(LeaderInfo(session=leader.info.session, seq=0, epoch=2), 1)
    learner.step(LeaderInfo(session=leader.info.session + 1, seq=1, epoch=3), 1)
    assert len(leader.received()) == acks
    assert learner.peer.status.state is ServerState.FOLLOWING


def test_in_broadcast_a_proposal_is_acked_once_durable_and_applied_on_commit() -> None:
    learner, leader = synced()
    learner.hold_disk = True
    t = txns(z(2, 1))[0]
    leader.send(Proposal, txn=t)
    assert not any(isinstance(p, Ack) and p.zxid == t.zxid for p in leader.received())
    learner.release_disk()
    assert leader.received()[-1] == Ack(session=leader.info.session, seq=3, zxid=t.zxid)
    ready = leader.send(Commit, zxid=t.zxid)
    assert ready.committed == [t]


def test_pings_carry_the_clients_session_touches_back() -> None:
    learner, leader = synced()
    learner.peer.add_touches([b"session-7"])
    leader.send(Ping, zxid=0)
    reply = leader.received()[-1]
    assert isinstance(reply, Ping) and reply.touches == [b"session-7"]
    leader.send(Ping, zxid=0)
    again = leader.received()[-1]
    assert isinstance(again, Ping) and again.touches == []  # touches are sent once


def test_client_writes_are_forwarded_only_once_synchronised() -> None:
    learner, leader = following()
    with pytest.raises(NotLeader):
        learner.peer.forward(b"w")
    with pytest.raises(NotLeader):
        learner.peer.propose(b"w")
    leader.send(LeaderInfo, epoch=2)
    leader.send(Diff, zxid=0)
    leader.send(NewLeader, zxid=z(2, 0))
    leader.send(UpToDate)
    learner.peer.forward(b"w")
    learner.drain()
    request = leader.received()[-1]
    assert isinstance(request, Request) and request.payload == b"w"


def test_a_learner_repeats_its_info_until_the_leader_answers() -> None:
    learner, leader = following()
    learner.tick(100)
    learner.tick(200)
    assert leader.received()[-2:] == [leader.info, leader.info]
    leader.send(LeaderInfo, epoch=2)
    sent = len(leader.received())
    learner.tick(300)
    assert len(leader.received()) == sent


def test_a_silent_leader_is_abandoned_after_sync_limit() -> None:
    learner, _leader = synced()
    assert learner.tick(400).events == []
    ready = learner.tick(500)
    assert any(isinstance(e, Looking) and "silent" in e.reason for e in ready.events)


def test_a_server_with_a_corrupt_log_asks_for_a_snap_and_does_not_vote() -> None:
    from herder.ensemble.zab import Peer
    from herder.ensemble.zab.messages import Notification

    peer = Peer(
        2,
        config(),
        PersistedState(accepted_epoch=3, current_epoch=3, log_tail=txns(z(3, 1)), needs_snap=True),
        FakeHost(),
        rng_seed=2,
        now_ms=0,
    )
    learner = Driver(peer)
    learner.drain()
    own = [e.message for e in learner.sent if isinstance(e.message, Notification)]
    assert own and all(n.leader == -1 and not n.voter for n in own)
    learner.step(vote(1, 0, 1, state=ServerState.LEADING), 1)
    learner.step(vote(1, 0, 1, state=ServerState.FOLLOWING), 3)
    info = learner.to(1)[-1]
    assert isinstance(info, FollowerInfo) and info.needs_snap
    leader = FakeLeader(learner)
    leader.send(LeaderInfo, epoch=4)
    ack = leader.received()[-1]
    assert isinstance(ack, AckEpoch) and ack.needs_snap
    leader.send(Snap, zxid=z(3, 1), data=b"s")
    leader.send(NewLeader, zxid=z(4, 0))
    assert not peer.status.needs_snap  # the snapshot replaced the corrupt log


def test_a_learner_whose_leader_connection_closes_looks_for_a_leader_at_once() -> None:
    learner, _ = synced()
    learner.peer.disconnected(3, learner.now)  # not its leader: nothing happens
    assert learner.peer.status.serving
    learner.peer.disconnected(1, learner.now)
    events = learner.drain().events
    assert isinstance(events[-1], Looking) and "connection to leader 1 closed" in events[-1].reason
    assert learner.peer.status.state is ServerState.LOOKING
