"""The leader's side of discovery, establishment and broadcast."""

from __future__ import annotations

import pytest

from herder.ensemble.zab import (
    EpochKind,
    Leading,
    Looking,
    LostLeadership,
    Ready,
    SaveEpoch,
    ServerState,
    Snapshot,
    Touches,
    ZabConfig,
)
from herder.ensemble.zab.messages import (
    Ack,
    AckEpoch,
    Commit,
    FollowerInfo,
    Inform,
    LeaderInfo,
    NewLeader,
    Ping,
    Proposal,
    QuorumPacket,
    Request,
    UpToDate,
)
from herder.errors import NotLeader
from tests.unit.zab.harness import (
    Driver,
    FakeHost,
    config,
    elected_leader,
    kinds,
    sync_learner,
    txns,
    z,
)

pytestmark = pytest.mark.unit


def ready_packets(ready: Ready, sid: int) -> list[QuorumPacket]:
    return [
        e.message for e in ready.messages if e.to == sid and isinstance(e.message, QuorumPacket)
    ]


def established(cfg: ZabConfig | None = None, *, learners: tuple[int, ...] = (2,)) -> Driver:
    """Leader 1 of epoch 2, with ``learners`` synchronised and up to date."""
    leader = elected_leader(cfg or config(), host=FakeHost(snapshot=Snapshot(0, b"s")))
    for sid in learners:
        sync_learner(leader, sid, leader.peer.status.last_zxid, 1)
        leader.step(Ack(session=1000 + sid, seq=2, zxid=z(2, 0)), sid)
    assert leader.peer.status.serving
    return leader


def test_accepted_epoch_is_on_disk_before_leaderinfo_goes_out() -> None:
    leader = elected_leader(config())
    leader.hold_disk = True
    leader.step(FollowerInfo(session=7, seq=0, accepted_epoch=1), 2)
    assert [op for op in leader.disk if isinstance(op, SaveEpoch)] == [
        SaveEpoch(token=1, kind=EpochKind.ACCEPTED, epoch=2)
    ]
    assert leader.to(2) == []
    leader.release_disk()
    assert leader.to(2) == [LeaderInfo(session=7, seq=0, epoch=2)]


def test_the_new_epoch_is_one_past_the_highest_accepted_by_the_quorum() -> None:
    leader = elected_leader(config())
    leader.step(FollowerInfo(session=7, seq=0, accepted_epoch=6), 2)
    assert leader.to(2) == [LeaderInfo(session=7, seq=0, epoch=7)]


def test_a_learner_ahead_of_the_leader_is_refused() -> None:
    leader = elected_leader(config(), log_tail=txns(z(1, 1)))
    got = sync_learner(leader, 2, z(1, 5), 1)
    assert kinds(got) == ["LeaderInfo(2)"]  # no sync: the session is gone
    assert leader.peer.status.phase.name == "DISCOVERY"
    # a learner that is not ahead completes discovery instead
    assert kinds(sync_learner(leader, 3, z(1, 1), 1))[1:] == [
        f"Diff({z(1, 1):#x})",
        f"NewLeader({z(2, 0):#x})",
    ]


def test_a_learner_ahead_of_an_established_leader_is_truncated_at_once() -> None:
    # learner 3 logged z(1, 2)..z(1, 5) that never reached a quorum; the leader was
    # established without them, so they were never committed: TRUNC, not refusal
    leader = elected_leader(config(), log_tail=txns(z(1, 1)))
    sync_learner(leader, 2, z(1, 1), 1)
    leader.step(Ack(session=1002, seq=2, zxid=z(2, 0)), 2)
    assert leader.peer.status.serving
    got = sync_learner(leader, 3, z(1, 5), 1)
    assert kinds(got) == ["LeaderInfo(2)", f"Trunc({z(1, 1):#x})", f"NewLeader({z(2, 0):#x})"]
    ready = leader.step(Ack(session=1003, seq=2, zxid=z(2, 0)), 3)
    assert kinds(ready_packets(ready, 3)) == ["UpToDate"]


def test_establishment_needs_a_quorum_of_newleader_acks_and_commits_the_history() -> None:
    leader = elected_leader(config(), log_tail=txns(z(1, 1), z(1, 2)))
    sync_learner(leader, 2, z(1, 2), 1)
    assert not leader.peer.status.serving
    assert leader.committed == []  # the initial history is not committed yet
    ready = leader.step(Ack(session=1002, seq=2, zxid=z(2, 0)), 2)
    assert Leading(2) in ready.events
    assert [t.zxid for t in ready.committed] == [z(1, 1), z(1, 2)]
    assert leader.to(2)[-1] == UpToDate(session=1002, seq=3)


def test_the_leader_counts_its_own_newleader_ack_only_once_its_disk_has_it() -> None:
    leader = elected_leader(config())
    leader.hold_disk = True
    leader.step(FollowerInfo(session=7, seq=0, accepted_epoch=1), 2)
    leader.release_disk()
    leader.hold_disk = True
    leader.step(AckEpoch(session=7, seq=1, current_epoch=1, last_zxid=0), 2)
    leader.step(Ack(session=7, seq=2, zxid=z(2, 0)), 2)
    assert not leader.peer.status.serving  # currentEpoch is not durable yet
    ready = leader.release_disk()
    assert Leading(2) in ready.events


def test_a_proposal_commits_once_a_quorum_has_it_on_disk() -> None:
    leader = established()
    leader.hold_disk = True
    zxid = leader.peer.propose(b"w1")
    assert zxid == z(2, 1)
    leader.drain()
    proposal = leader.to(2)[-1]
    assert isinstance(proposal, Proposal) and proposal.txn.payload == b"w1"
    # the follower's ACK alone is not enough while the leader's own disk lags
    leader.step(Ack(session=1002, seq=3, zxid=zxid), 2)
    assert leader.committed == []
    ready = leader.release_disk()
    assert [t.zxid for t in ready.committed] == [zxid]
    assert leader.to(2)[-1] == Commit(session=1002, seq=proposal.seq + 1, zxid=zxid)


def test_one_ack_covers_every_proposal_up_to_its_zxid() -> None:
    leader = established()
    zxids = [leader.peer.propose(b"w%d" % i) for i in range(3)]
    leader.drain()
    ready = leader.step(Ack(session=1002, seq=3, zxid=zxids[-1]), 2)
    assert [t.zxid for t in ready.committed] == zxids
    commits = [p for p in leader.to(2) if isinstance(p, Commit)]
    assert [c.zxid for c in commits] == [zxids[-1]]


def test_observers_get_informs_and_never_count_towards_a_commit() -> None:
    leader = established(config(3, observers=[4]))
    got = sync_learner(leader, 4, 0, 1, observer=True)
    assert isinstance(got[-1], NewLeader)
    leader.step(Ack(session=1004, seq=2, zxid=z(2, 0)), 4)
    assert isinstance(leader.to(4)[-1], UpToDate)
    leader.hold_disk = True
    zxid = leader.peer.propose(b"w1")
    leader.drain()
    assert not any(isinstance(p, Proposal) for p in leader.to(4))
    leader.step(Ack(session=1004, seq=3, zxid=zxid), 4)  # an observer's ACK counts for nothing
    leader.release_disk()
    assert leader.committed == []
    leader.step(Ack(session=1002, seq=3, zxid=zxid), 2)
    assert [t.zxid for t in leader.committed] == [zxid]
    inform = leader.to(4)[-1]
    assert isinstance(inform, Inform) and inform.txn.zxid == zxid


def test_propose_on_a_leader_not_yet_established_fails() -> None:
    leader = elected_leader(config())
    with pytest.raises(NotLeader):
        leader.peer.propose(b"w")


def test_a_request_from_a_learner_is_proposed() -> None:
    leader = established()
    ready = leader.step(Ping(session=1002, seq=3, zxid=0, touches=[b"s1"]), 2)
    assert ready.touches == [Touches(2, [b"s1"])]
    leader.step(Request(session=1002, seq=4, payload=b"forwarded"), 2)
    assert any(isinstance(p, Proposal) and p.txn.payload == b"forwarded" for p in leader.to(2))


def test_the_leader_pings_every_half_tick() -> None:
    leader = established()
    before = len(leader.to(2))
    for now in range(100, 600, 50):
        leader.tick(now)
    pings = [p for p in leader.to(2)[before:] if isinstance(p, Ping)]
    assert len(pings) == 10


def test_a_leader_stays_while_its_followers_answer_pings() -> None:
    leader = established()
    seq = 3
    for now in range(50, 2000, 50):
        leader.tick(now)
        leader.step(Ping(session=1002, seq=seq, zxid=0), 2)
        seq += 1
    assert leader.peer.status.serving


def test_a_leader_without_a_quorum_steps_down_at_once_and_says_so() -> None:
    leader = established()
    events = []
    for now in range(50, 2000, 50):
        events += leader.tick(now).events
        if events:
            break
    # learner 2 was last heard at 50: dropped once silent for more than syncLimit (5
    # ticks), at the next full tick, and the quorum with it
    assert leader.now == 650
    lost, looking = events
    assert isinstance(lost, LostLeadership) and lost.epoch == 2 and "quorum" in lost.reason
    assert isinstance(looking, Looking)
    assert leader.peer.status.state is ServerState.LOOKING
    with pytest.raises(NotLeader):
        leader.peer.propose(b"late")


def test_observers_beyond_the_snap_throttle_are_turned_away_but_followers_are_not() -> None:
    cfg = config(3, observers=[4, 5], max_concurrent_snap_syncs=1)
    leader = established(cfg, learners=(2,))
    first = sync_learner(leader, 4, 0, 0, needs_snap=True, observer=True)
    second = sync_learner(leader, 5, 0, 0, needs_snap=True, observer=True)
    assert kinds(first)[1] == "Snap(0x0)" and isinstance(first[-1], NewLeader)
    assert kinds(second) == ["LeaderInfo(2)"]  # throttled: the session was dropped
    third = sync_learner(leader, 3, 0, 1, needs_snap=True)
    assert kinds(third)[1] == "Snap(0x0)"  # followers are exempt
    # a sync ends with its NEWLEADER ACK, which frees its place
    leader.step(Ack(session=1004, seq=2, zxid=z(2, 0)), 4)
    leader.step(Ack(session=1003, seq=2, zxid=z(2, 0)), 3)
    again = sync_learner(leader, 5, 0, 0, needs_snap=True, observer=True, session=2005)
    assert kinds(again)[1] == "Snap(0x0)"


def test_a_leader_whose_zxid_counter_runs_out_steps_down_for_a_new_epoch() -> None:
    leader = elected_leader(config(), log_tail=txns(z(1, 0xFFFF_FFFE)))
    sync_learner(leader, 2, z(1, 0xFFFF_FFFE), 1)
    leader.step(Ack(session=1002, seq=2, zxid=z(2, 0)), 2)
    assert leader.peer.status.serving
    leader.peer.node.history.last = z(2, 0xFFFF_FFFF)  # as if 2**32 - 1 writes went by
    with pytest.raises(NotLeader, match="exhausted"):
        leader.peer.propose(b"one too many")
    ready = leader.drain()
    assert isinstance(ready.events[0], LostLeadership)


def test_a_closed_learner_connection_drops_it_and_without_a_quorum_the_leader_steps_down() -> None:
    leader = established(config(3), learners=(2, 3))
    leader.peer.disconnected(2, leader.now)
    assert not leader.drain().events
    assert leader.peer.status.serving  # 1 and 3 are a quorum of 3
    leader.peer.disconnected(7, leader.now)  # not a learner of ours: nothing happens
    leader.peer.disconnected(3, leader.now)
    lost, looking = leader.drain().events
    assert isinstance(lost, LostLeadership) and "quorum" in lost.reason
    assert isinstance(looking, Looking)
    assert leader.peer.status.state is ServerState.LOOKING


def test_each_wait_of_a_new_leader_gets_its_own_init_limit() -> None:
    # initLimit is 10 ticks of 100 ms. The quorum connects late, the epoch is acked late
    # and the sync is slow (a large SNAP): each wait is under initLimit, all three are not
    leader = elected_leader(config())  # elected at 50 ms
    for now in range(100, 1000, 50):
        leader.tick(now)
    leader.step(FollowerInfo(session=7, seq=0, accepted_epoch=1), 2)  # at 950
    for now in range(1000, 1900, 50):
        leader.tick(now)
    leader.step(AckEpoch(session=7, seq=1, current_epoch=1, last_zxid=0), 2)  # at 1850
    assert isinstance(leader.to(2)[-1], NewLeader)
    for now in range(1900, 2800, 50):
        leader.tick(now)
        leader.step(Ping(session=7, seq=2 + (now - 1900) // 50, zxid=0), 2)
    assert leader.peer.status.state is ServerState.LEADING
    ready = leader.step(Ack(session=7, seq=20, zxid=z(2, 0)), 2)
    assert Leading(2) in ready.events


def test_a_new_leader_still_gives_up_after_init_limit_without_newleader_acks() -> None:
    leader = elected_leader(config())
    leader.step(FollowerInfo(session=7, seq=0, accepted_epoch=1), 2)
    leader.tick(500)
    leader.step(AckEpoch(session=7, seq=1, current_epoch=1, last_zxid=0), 2)  # at 500
    leader.tick(1450)
    assert leader.peer.status.state is ServerState.LEADING
    ready = leader.tick(1500)
    assert isinstance(ready.events[0], Looking)
    assert "NEWLEADER" in ready.events[0].reason


def test_a_follower_that_answers_pings_but_never_acks_a_proposal_is_dropped() -> None:
    # follower 2's disk is stuck: it answers every ping but ACKs nothing; follower 3
    # ACKs. syncLimit is 5 ticks of 100 ms
    leader = established(config(3), learners=(2, 3))
    seqs = {2: 3, 3: 3}
    start = leader.now
    zxid = leader.peer.propose(b"w1")
    leader.drain()
    leader.step(Ack(session=1003, seq=seqs[3], zxid=zxid), 3)
    seqs[3] += 1
    dropped_at = None
    for now in range(start + 50, start + 1500, 50):
        leader.tick(now)
        for sid in (2, 3):
            leader.step(Ping(session=1000 + sid, seq=seqs[sid], zxid=0), sid)
            seqs[sid] += 1
        leading = leader.peer.leading
        if dropped_at is None and leading is not None and 2 not in leading.sessions:
            dropped_at = now
    assert dropped_at is not None and dropped_at - start <= 600
    assert leader.peer.status.serving  # 1 and 3 are still a quorum
    assert leader.peer.leading is not None and 3 in leader.peer.leading.sessions


def test_a_leader_whose_followers_never_ack_steps_down_after_sync_limit() -> None:
    leader = established(config(3), learners=(2, 3))
    seqs = {2: 3, 3: 3}
    start = leader.now
    leader.peer.propose(b"w1")
    leader.drain()
    events = []
    for now in range(start + 50, start + 1500, 50):
        events += leader.tick(now).events
        if events:
            break
        for sid in (2, 3):
            leader.step(Ping(session=1000 + sid, seq=seqs[sid], zxid=0), sid)
            seqs[sid] += 1
    assert leader.now - start <= 600
    assert isinstance(events[0], LostLeadership) and "quorum" in events[0].reason


def test_a_follower_that_acks_within_sync_limit_stays() -> None:
    leader = established(config(3), learners=(2,))
    seq = 3
    for now in range(leader.now + 50, leader.now + 3000, 50):
        zxid = leader.peer.propose(b"w%d" % now)
        leader.tick(now)
        leader.step(Ping(session=1002, seq=seq, zxid=0), 2)
        leader.step(Ack(session=1002, seq=seq + 1, zxid=zxid - 1), 2)  # one behind
        seq += 2
    assert leader.peer.status.serving
    assert leader.peer.leading is not None and 2 in leader.peer.leading.sessions


def test_a_proposal_is_timed_from_when_the_host_says_it_went_out() -> None:
    leader = established(config(3), learners=(2, 3))
    start = leader.now  # the last input; the host proposes 350 ms later
    leader.peer.propose(b"w1", now_ms=start + 350)
    leader.drain()
    seq = 3
    dropped_at = None
    for now in range(start + 400, start + 1100, 50):
        leader.tick(now)
        leader.step(Ping(session=1002, seq=seq, zxid=0), 2)
        leader.step(Ping(session=1003, seq=seq, zxid=0), 3)
        seq += 1
        if dropped_at is None and leader.peer.status.state is not ServerState.LEADING:
            dropped_at = now
    # syncLimit (500 ms) after it went out, not after the last input before it
    assert dropped_at is not None and dropped_at >= start + 350 + 500
