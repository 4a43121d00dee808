"""Synchronisation, one test per case of ZooKeeper's ``syncFollower``.

Each test elects server 1 with a given history, connects learner 2 with a given last
zxid and checks the packets the learner receives, from LEADERINFO to NEWLEADER.
"""

from __future__ import annotations

import pytest

from herder.ensemble.zab import Snapshot
from herder.ensemble.zab.messages import Committed, Snap, Txn
from herder.ensemble.zab.sync import SyncKind, plan_sync
from tests.unit.zab.harness import FakeHost, config, elected_leader, kinds, sync_learner, txns, z

pytestmark = pytest.mark.unit


def pairs(*zxids: int) -> list[str]:
    """The sync stream's committed txns (each a PROPOSAL and its COMMIT in ZooKeeper)."""
    return [f"Committed({x:#x})" for x in zxids]


def test_learner_inside_the_committed_log_gets_a_diff_of_what_it_lacks() -> None:
    leader = elected_leader(config(), log_tail=txns(*(z(1, i) for i in range(1, 6))))
    got = sync_learner(leader, 2, z(1, 3), 1)
    assert kinds(got) == [
        "LeaderInfo(2)",
        f"Diff({z(1, 5):#x})",
        *pairs(z(1, 4), z(1, 5)),
        f"NewLeader({z(2, 0):#x})",
    ]


def test_learner_at_the_leaders_last_zxid_gets_an_empty_diff() -> None:
    leader = elected_leader(config(), log_tail=txns(z(1, 1), z(1, 2)))
    got = sync_learner(leader, 2, z(1, 2), 1)
    assert kinds(got) == ["LeaderInfo(2)", f"Diff({z(1, 2):#x})", f"NewLeader({z(2, 0):#x})"]


def test_learner_past_the_end_of_the_committed_log_is_truncated() -> None:
    # the leader saw epoch 2 begin without proposals; the learner kept two txns of
    # epoch 1 that never made it to the leader (so it is not "ahead": its epoch is older)
    leader = elected_leader(config(), log_tail=txns(z(1, 1), z(1, 2)), epoch=2)
    got = sync_learner(leader, 2, z(1, 4), 1)
    assert kinds(got) == ["LeaderInfo(3)", f"Trunc({z(1, 2):#x})", f"NewLeader({z(3, 0):#x})"]


def test_learner_with_a_txn_the_leader_lacks_is_truncated_then_diffed() -> None:
    # the learner's last txn (1,3) is missing from the leader, whose next txn (1,4) is
    # of the same epoch: cut back to (1,2), then send what follows
    leader = elected_leader(config(), log_tail=txns(z(1, 1), z(1, 2), z(1, 4), z(1, 5)), epoch=2)
    got = sync_learner(leader, 2, z(1, 3), 1)
    assert kinds(got) == [
        "LeaderInfo(3)",
        f"Trunc({z(1, 2):#x})",
        *pairs(z(1, 4), z(1, 5)),
        f"NewLeader({z(3, 0):#x})",
    ]


def test_a_trunc_never_crosses_an_epoch_so_the_learner_gets_a_snap() -> None:
    snapshot = Snapshot(z(2, 2), b"leader state")
    leader = elected_leader(
        config(),
        log_tail=txns(z(1, 1), z(1, 2), z(2, 1), z(2, 2)),
        epoch=2,
        host=FakeHost(txns(z(1, 1), z(1, 2), z(2, 1), z(2, 2)), snapshot=snapshot),
    )
    got = sync_learner(leader, 2, z(1, 3), 1)
    assert kinds(got) == ["LeaderInfo(3)", f"Snap({z(2, 2):#x})", f"NewLeader({z(3, 0):#x})"]
    assert isinstance(got[1], Snap) and got[1].data == b"leader state"


def test_learner_at_a_new_epoch_zxid_gets_a_diff_from_that_epoch_on() -> None:
    # (2, 0) names the start of epoch 2, which no txn has: no TRUNC is possible or needed
    log = txns(z(1, 1), z(1, 2), z(2, 1), z(2, 2), z(3, 1))
    leader = elected_leader(config(), log_tail=log, epoch=3)
    got = sync_learner(leader, 2, z(2, 0), 2)
    assert kinds(got) == [
        "LeaderInfo(4)",
        f"Diff({z(3, 1):#x})",
        *pairs(z(2, 1), z(2, 2), z(3, 1)),
        f"NewLeader({z(4, 0):#x})",
    ]


def test_learner_past_the_end_at_a_new_epoch_zxid_is_not_truncated() -> None:
    snapshot = Snapshot(z(1, 2), b"s")
    leader = elected_leader(
        config(), log_tail=txns(z(1, 1), z(1, 2)), epoch=5, host=FakeHost(snapshot=snapshot)
    )
    got = sync_learner(leader, 2, z(4, 0), 4)
    assert kinds(got) == ["LeaderInfo(6)", f"Snap({z(1, 2):#x})", f"NewLeader({z(6, 0):#x})"]


def test_learner_before_the_committed_log_is_synced_from_the_txn_log() -> None:
    # the leader holds (1,6)..(1,10) in memory (its snapshot is at (1,5)); its disk
    # still has the log from (1,1)
    on_disk = txns(*(z(1, i) for i in range(1, 11)))
    host = FakeHost(on_disk, snapshot=Snapshot(z(1, 5), b"s"), size=10_000)
    leader = elected_leader(config(), log_tail=on_disk[5:], applied_zxid=z(1, 5), host=host)
    got = sync_learner(leader, 2, z(1, 3), 1)
    assert kinds(got) == [
        "LeaderInfo(2)",
        f"Diff({z(1, 10):#x})",
        *pairs(*(z(1, i) for i in range(4, 11))),
        f"NewLeader({z(2, 0):#x})",
    ]
    # the on-disk read is capped at snapshotSizeFactor x the snapshot's size
    assert host.reads == [(z(1, 3), 3300)]


def test_txn_log_sync_falls_back_to_snap_when_it_would_exceed_the_size_limit() -> None:
    on_disk = txns(*(z(1, i) for i in range(1, 11)))
    host = FakeHost(on_disk, snapshot=Snapshot(z(1, 5), b"s"), size=30)  # limit 9 bytes
    leader = elected_leader(config(), log_tail=on_disk[5:], applied_zxid=z(1, 5), host=host)
    got = sync_learner(leader, 2, z(1, 3), 1)
    assert kinds(got)[1] == f"Snap({z(1, 5):#x})"
    # the snapshot is followed by what the leader logged after it
    assert kinds(got)[2:] == [*pairs(*(z(1, i) for i in range(6, 11))), f"NewLeader({z(2, 0):#x})"]


def test_a_gap_between_the_txn_log_and_the_committed_log_means_snap() -> None:
    # the disk log ends at (1,4) but memory starts at (1,7): (1,5) and (1,6) are nowhere
    host = FakeHost(txns(z(1, 1), z(1, 2), z(1, 3), z(1, 4)), snapshot=Snapshot(z(1, 6), b"s"))
    leader = elected_leader(
        config(), log_tail=txns(z(1, 7), z(1, 8)), applied_zxid=z(1, 6), host=host
    )
    got = sync_learner(leader, 2, z(1, 2), 1)
    assert kinds(got) == [
        "LeaderInfo(2)",
        f"Snap({z(1, 6):#x})",
        *pairs(z(1, 7), z(1, 8)),
        f"NewLeader({z(2, 0):#x})",
    ]


def test_a_learner_that_asks_for_a_snapshot_gets_one_even_when_a_diff_would_do() -> None:
    leader = elected_leader(
        config(), log_tail=txns(z(1, 1), z(1, 2)), host=FakeHost(snapshot=Snapshot(0, b"s0"))
    )
    got = sync_learner(leader, 2, z(1, 2), 1, needs_snap=True)
    # a corrupt log vouches for nothing: its ACKEPOCH does not end discovery...
    assert kinds(got) == ["LeaderInfo(2)"]
    sync_learner(leader, 3, z(1, 2), 1)
    # ...a healthy learner's does, and then the corrupt one is sent everything
    assert kinds(leader.to(2)[1:]) == [
        "Snap(0x0)",
        *pairs(z(1, 1), z(1, 2)),
        f"NewLeader({z(2, 0):#x})",
    ]


def test_force_snap_sync_sends_snapshots_to_everyone() -> None:
    leader = elected_leader(config(force_snap_sync=True), log_tail=txns(z(1, 1)))
    got = sync_learner(leader, 2, z(1, 1), 1)
    assert kinds(got)[1] == "Snap(0x0)"


def test_with_txn_log_sync_off_a_learner_before_the_log_gets_a_snap() -> None:
    host = FakeHost(txns(z(1, 1), z(1, 2), z(1, 3)), snapshot=Snapshot(z(1, 2), b"s"))
    leader = elected_leader(
        config(snapshot_size_factor=-1), log_tail=txns(z(1, 3)), applied_zxid=z(1, 2), host=host
    )
    got = sync_learner(leader, 2, z(1, 1), 1)
    assert kinds(got)[1] == f"Snap({z(1, 2):#x})"
    assert host.reads == []


@pytest.mark.parametrize(
    ("peer", "expected"),
    [
        (z(1, 5), (SyncKind.DIFF, z(1, 5), [])),
        (z(1, 2), (SyncKind.DIFF, z(1, 5), [z(1, 3), z(1, 4), z(1, 5)])),
        (z(1, 9), (SyncKind.TRUNC, z(1, 5), [])),
        (z(0, 0), (SyncKind.SNAP, -1, [])),
    ],
)
def test_plan_sync_on_its_own(peer: int, expected: tuple[SyncKind, int, list[int]]) -> None:
    log = txns(*(z(1, i) for i in range(1, 6)))
    plan = plan_sync(peer, log, z(1, 5))
    assert (plan.kind, plan.zxid, [t.zxid for t in plan.txns]) == expected


def test_a_long_sync_stream_goes_out_in_batches_of_about_a_mebibyte() -> None:
    big = [Txn(z(1, i), bytes(300_000)) for i in range(1, 11)]  # 3 MB in all
    leader = elected_leader(config(), log_tail=big)
    got = sync_learner(leader, 2, 0, 1)
    batches = [p for p in got if isinstance(p, Committed)]
    assert [len(b.txns) for b in batches] == [4, 4, 2]
    assert [t for b in batches for t in b.txns] == big
