"""Fast leader election, and whole ensembles from election to commits."""

from __future__ import annotations

import logging

import pytest

from herder.ensemble.zab import Leading, PersistedState, ServerState
from herder.ensemble.zab.election import Vote
from herder.ensemble.zab.messages import ServerState as S
from tests.unit.zab.harness import MiniCluster, config, txns, z

pytestmark = pytest.mark.unit


def state(epoch: int, *zxids: int, needs_snap: bool = False) -> PersistedState:
    return PersistedState(
        accepted_epoch=epoch, current_epoch=epoch, log_tail=txns(*zxids), needs_snap=needs_snap
    )


def test_votes_are_ordered_by_peer_epoch_then_zxid_then_server_id() -> None:
    assert Vote(1, z(1, 9), 2, 1).beats(Vote(3, z(1, 1), 1, 1))  # epoch first
    assert Vote(1, z(1, 9), 2, 1).beats(Vote(3, z(1, 8), 2, 1))  # then zxid
    assert Vote(3, z(1, 9), 2, 1).beats(Vote(1, z(1, 9), 2, 1))  # then id
    # a settled vote agrees with another on the leader and its epoch alone
    assert Vote(1, 5, 2, 7, S.FOLLOWING).agrees_with(Vote(1, 9, 2, 3, S.LEADING))
    assert not Vote(1, 5, 2, 7).agrees_with(Vote(1, 9, 2, 7))


def test_the_server_with_the_most_recent_history_is_elected() -> None:
    cluster = MiniCluster(
        config(3),
        {
            1: state(1, z(1, 1)),
            2: state(1, z(1, 1), z(1, 2), z(1, 3)),
            3: state(1, z(1, 1), z(1, 2)),
        },
    )
    cluster.advance(300)
    assert cluster.leader() == 2
    assert {sid: cluster.peer(sid).status.state for sid in (1, 3)} == {
        1: ServerState.FOLLOWING,
        3: ServerState.FOLLOWING,
    }
    # establishing the leader committed its whole history everywhere
    assert all(len(cluster.applied[sid]) == 3 for sid in (1, 2, 3))


def test_a_newer_epoch_beats_a_longer_log() -> None:
    cluster = MiniCluster(
        config(3), {1: state(3, z(2, 1)), 2: state(2, z(2, 1), z(2, 2), z(2, 3)), 3: state(2)}
    )
    cluster.advance(300)
    assert cluster.leader() == 1


def test_equal_histories_elect_the_highest_server_id() -> None:
    cluster = MiniCluster(config(5))
    cluster.advance(300)
    assert cluster.leader() == 5
    assert any(isinstance(e, Leading) for e in cluster.drivers[5].events)


def test_an_observer_never_leads_and_ends_up_observing() -> None:
    # server 4 has the highest id, which would win any tie, were it a voter
    cluster = MiniCluster(config(3, observers=[4]))
    cluster.advance(300)
    assert cluster.leader() == 3
    assert cluster.peer(4).status.state is ServerState.OBSERVING
    assert cluster.peer(4).status.serving


def test_a_restarted_server_joins_the_established_leader_and_catches_up() -> None:
    cluster = MiniCluster(config(3))
    cluster.advance(300)
    leader = cluster.leader()
    assert leader is not None
    for i in range(3):
        cluster.peer(leader).propose(b"w%d" % i)
    cluster.settle()
    follower = next(sid for sid in (1, 2, 3) if sid != leader)
    before = cluster.peer(follower).status
    logged = list(cluster.applied[follower])
    cluster.crash(follower)
    cluster.peer(leader).propose(b"while it was down")
    cluster.settle()
    cluster.start(
        follower,
        PersistedState(
            accepted_epoch=before.accepted_epoch,
            current_epoch=before.current_epoch,
            log_tail=logged,
        ),
    )
    cluster.advance(300)
    assert cluster.leader() == leader
    assert cluster.peer(follower).status.serving
    assert [t.payload for t in cluster.applied[follower]] == [
        b"w0",
        b"w1",
        b"w2",
        b"while it was down",
    ]


def test_a_new_leader_keeps_every_committed_write() -> None:
    cluster = MiniCluster(config(3))
    cluster.advance(300)
    old = cluster.leader()
    assert old is not None
    written = [cluster.peer(old).propose(b"w%d" % i) for i in range(5)]
    cluster.settle()
    cluster.crash(old)
    cluster.advance(2000)
    new = cluster.leader()
    assert new is not None and new != old
    assert [t.zxid for t in cluster.applied[new]][:5] == written
    zxid = cluster.peer(new).propose(b"after")
    cluster.settle()
    assert zxid >> 32 > written[0] >> 32  # a new epoch
    assert all(cluster.applied[sid][-1].payload == b"after" for sid in (1, 2, 3) if sid != old)


def test_no_leader_without_a_quorum_of_healthy_voters() -> None:
    # server 1's log is corrupt and server 3 is down: 2 alone must not lead, and 1's
    # shortened history must not help it
    cfg = config(3)
    cluster = MiniCluster(cfg, {1: state(1, needs_snap=True), 2: state(1), 3: state(1)})
    cluster.crash(3)
    cluster.advance(3000)
    assert cluster.leader() is None
    cluster.start(3, state(1))
    cluster.advance(3000)
    assert cluster.leader() in (2, 3)
    assert cluster.peer(1).status.serving and not cluster.peer(1).status.needs_snap


def test_a_single_server_ensemble_leads_and_commits_alone() -> None:
    cluster = MiniCluster(config(1))
    cluster.advance(200)
    assert cluster.leader() == 1
    zxid = cluster.peer(1).propose(b"solo")
    cluster.settle()
    assert [t.zxid for t in cluster.applied[1]] == [zxid]


def test_a_server_whose_accepted_epoch_is_past_the_leaders_backs_off_and_warns_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from herder.ensemble.zab.messages import FollowerInfo

    cluster = MiniCluster(config(3))
    cluster.crash(3)
    cluster.advance(3000)
    leader = cluster.leader()
    assert leader in (1, 2)
    epoch = cluster.peer(leader).status.epoch
    # server 3 accepted a later epoch from a leader that never got established
    caplog.set_level(logging.INFO, logger="herder.ensemble.zab")
    cluster.start(3, PersistedState(accepted_epoch=epoch + 5, current_epoch=epoch - 1))
    cluster.advance(20_000)
    infos = [e for e in cluster.drivers[3].sent if isinstance(e.message, FollowerInfo)]
    # the wait doubles from a tick (100 ms) up to initLimit (1 s): about 20 in 20 s,
    # where retrying at once loops as fast as messages travel
    assert 5 <= len(infos) <= 25
    refused = [r for r in caplog.records if "cannot follow" in r.getMessage()]
    assert [r.levelno for r in refused if r.levelno >= logging.INFO] == [logging.WARNING]
    loud = [r for r in caplog.records if r.levelno >= logging.INFO and "server 3" in r.getMessage()]
    assert len(loud) <= 6
    # once the leader goes, the next election counts server 3's epoch and takes it in
    cluster.crash(leader)
    cluster.advance(5000)
    new_leader = cluster.leader()
    assert new_leader is not None
    assert cluster.peer(new_leader).status.epoch > epoch + 5
    assert cluster.peer(3).status.serving
