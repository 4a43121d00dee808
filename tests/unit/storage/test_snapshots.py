"""Snapshots, purge, TRUNC and SNAP: what recovery starts from, and what may be deleted."""

from __future__ import annotations

import logging
import os
import random

import pytest

from herder.ensemble.storage import SimulatedFileSystem, SnapshotPolicy, SnapshotSyncRequired
from herder.ensemble.storage.snapshots import decode_snapshot, encode_snapshot

from .support import DATA, PowerCut, WrappedFileSystem, fill, log_path, open_sim, payload, zx

pytestmark = pytest.mark.unit


def snapshot_path(zxid: int) -> str:
    return os.path.join(DATA, f"snapshot.{zxid:x}")


def names(fs: SimulatedFileSystem, prefix: str) -> list[str]:
    return [n for n in fs.listdir(DATA) if n.startswith(prefix) and not n.endswith(".tmp")]


def test_a_fresh_directory_starts_empty_from_the_genesis_snapshot() -> None:
    fs = SimulatedFileSystem()
    storage = open_sim(fs)
    assert storage.recovery.snapshot is None
    assert storage.recovery.transactions == []
    assert names(fs, "snapshot.") == ["snapshot.0"]


def test_recovery_loads_the_snapshot_and_replays_only_the_suffix() -> None:
    fs = SimulatedFileSystem()
    storage = open_sim(fs)
    fill(storage, range(1, 31))
    storage.write_snapshot(zx(20), b"state@20")
    fill(storage, range(31, 36))
    storage.close()

    reopened = open_sim(fs)

    assert reopened.recovery.snapshot == (zx(20), b"state@20")
    assert [t.zxid for t in reopened.recovery.transactions] == [zx(c) for c in range(21, 36)]
    assert reopened.recovery.transactions[0].payload == payload(21)


def test_a_snapshot_covers_logged_transactions_and_never_goes_back() -> None:
    storage = open_sim(SimulatedFileSystem())
    fill(storage, range(1, 4))
    with pytest.raises(ValueError, match="install_snapshot"):
        storage.write_snapshot(zx(9), b"ahead of the log")
    storage.write_snapshot(zx(3), b"state@3")
    with pytest.raises(ValueError, match="older than the snapshot"):
        storage.write_snapshot(zx(2), b"going back")


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda data: data[: len(data) // 2], id="truncated"),
        pytest.param(lambda data: data[:30] + b"\xff" + data[31:], id="bit-rot"),
        pytest.param(lambda data: b"", id="empty"),
    ],
)
def test_a_damaged_snapshot_falls_back_to_the_previous_one(
    damage: object, caplog: pytest.LogCaptureFixture
) -> None:
    fs = SimulatedFileSystem()
    storage = open_sim(fs)
    fill(storage, range(1, 21))
    storage.write_snapshot(zx(10), b"state@10")
    storage.write_snapshot(zx(20), b"state@20")
    storage.close()
    good = fs.file_bytes(snapshot_path(zx(20)))
    handle = fs.open(snapshot_path(zx(20)))
    handle.truncate(0)
    handle.pwrite(damage(good), 0)  # type: ignore[operator]
    handle.fsync()

    with caplog.at_level(logging.WARNING):
        reopened = open_sim(fs)

    assert reopened.recovery.snapshot == (zx(10), b"state@10")
    assert [t.zxid for t in reopened.recovery.transactions] == [zx(c) for c in range(11, 21)]
    assert any("damaged snapshot" in r.getMessage() for r in caplog.records)


def test_a_snapshot_renamed_without_its_data_synced_would_be_caught() -> None:
    """The simulated disk loses data renamed into place without fsync; the CRC notices."""
    fs = SimulatedFileSystem()
    open_sim(fs).close()
    header, trailer = encode_snapshot(zx(5), b"state")
    handle = fs.open(snapshot_path(zx(5)) + ".tmp", create=True)
    handle.pwrite(header + b"state" + trailer, 0)  # no fsync before the rename
    fs.rename(snapshot_path(zx(5)) + ".tmp", snapshot_path(zx(5)))
    fs.fsync_dir(DATA)
    fs.crash()

    with pytest.raises(ValueError, match="only 0 bytes"):
        decode_snapshot(fs.file_bytes(snapshot_path(zx(5))), zx(5))
    assert open_sim(fs).recovery.snapshot is None


def test_a_half_written_temporary_snapshot_is_cleaned_up() -> None:
    fs = SimulatedFileSystem()
    open_sim(fs).close()
    handle = fs.open(snapshot_path(zx(3)) + ".tmp", create=True)
    handle.pwrite(b"HSNP partial", 0)
    handle.fsync()
    fs.fsync_dir(DATA)

    open_sim(fs)

    assert not fs.exists(snapshot_path(zx(3)) + ".tmp")


def test_purge_keeps_the_newest_snapshots_and_the_logs_to_replay_from_the_oldest() -> None:
    fs = SimulatedFileSystem()
    storage = open_sim(fs)
    for ten in range(1, 6):
        fill(storage, range(ten * 10 - 9, ten * 10 + 1))
        storage.write_snapshot(zx(ten * 10), f"state@{ten * 10}".encode())
    fill(storage, range(51, 56))
    storage.close()

    assert names(fs, "snapshot.") == [f"snapshot.{zx(c):x}" for c in (30, 40, 50)]
    oldest_log = min(int(n[4:], 16) for n in names(fs, "log."))
    assert oldest_log <= zx(30) < oldest_log + 10  # the file holding zxid 30 stays
    assert not fs.exists(log_path(1))

    # with the two newest snapshots unreadable, the log still replays from the oldest
    for zxid in (zx(40), zx(50)):
        fs.overwrite(snapshot_path(zxid), 0, b"rot!")
    reopened = open_sim(fs)
    assert reopened.recovery.snapshot == (zx(30), b"state@30")
    assert [t.zxid for t in reopened.recovery.transactions] == [zx(c) for c in range(31, 56)]


@pytest.mark.parametrize(("retain", "kept"), [(1, 3), (5, 5)])
def test_purge_retains_at_least_three_snapshots(retain: int, kept: int) -> None:
    fs = SimulatedFileSystem()
    storage = open_sim(fs, snap_retain_count=retain)
    for counter in range(1, 9):
        fill(storage, range(counter, counter + 1))
        storage.write_snapshot(zx(counter), b"s")
    assert len(names(fs, "snapshot.")) == kept
    assert storage.stats().snapshots == kept


def test_truncate_to_removes_later_transactions_across_files_and_snapshots() -> None:
    fs = SimulatedFileSystem()
    storage = open_sim(fs)
    fill(storage, range(1, 61))
    storage.write_snapshot(zx(20), b"state@20")
    storage.write_snapshot(zx(50), b"state@50")
    files_before = len(names(fs, "log."))

    storage.truncate_to(zx(35))

    assert storage.last_zxid == storage.durable_zxid == zx(35)
    assert not fs.exists(snapshot_path(zx(50)))
    assert len(names(fs, "log.")) < files_before
    assert all(int(n[4:], 16) <= zx(35) for n in names(fs, "log."))
    storage.append(zx(1, epoch=2), b"new epoch")
    storage.sync()
    fs.crash()  # what truncate_to removed must not come back

    reopened = open_sim(fs)
    assert reopened.recovery.snapshot == (zx(20), b"state@20")
    zxids = [t.zxid for t in reopened.recovery.transactions]
    assert zxids == [zx(c) for c in range(21, 36)] + [zx(1, epoch=2)]


def test_truncate_to_drops_unsynced_appends_above_the_point() -> None:
    fs = SimulatedFileSystem()
    storage = open_sim(fs)
    fill(storage, range(1, 11))
    storage.sync()
    fill(storage, range(11, 14))

    storage.truncate_to(zx(11))
    storage.close()

    assert [t.zxid for t in open_sim(fs).recovery.transactions] == [zx(c) for c in range(1, 12)]


def test_truncate_below_every_remaining_snapshot_needs_a_full_snap() -> None:
    fs = SimulatedFileSystem()
    storage = open_sim(fs)
    for counter in range(10, 60, 10):
        fill(storage, range(counter - 9, counter + 1))
        storage.write_snapshot(zx(counter), b"s")  # purge drops genesis and older logs
    listing = fs.listdir(DATA)

    with pytest.raises(SnapshotSyncRequired, match="full SNAP"):
        storage.truncate_to(zx(15))

    assert fs.listdir(DATA) == listing
    assert storage.last_zxid == zx(50)


def test_truncate_before_the_first_snapshot_replays_from_genesis() -> None:
    fs = SimulatedFileSystem()
    storage = open_sim(fs)
    fill(storage, range(1, 21))
    storage.write_snapshot(zx(15), b"state@15")

    storage.truncate_to(zx(5))
    storage.close()

    reopened = open_sim(fs)
    assert reopened.recovery.snapshot is None
    assert [t.zxid for t in reopened.recovery.transactions] == [zx(c) for c in range(1, 6)]


def test_install_snapshot_replaces_the_whole_history() -> None:
    fs = SimulatedFileSystem()
    storage = open_sim(fs)
    fill(storage, range(1, 41))
    storage.write_snapshot(zx(30), b"mine@30")

    storage.install_snapshot(zx(7, epoch=2), b"leader@2:7")
    storage.append(zx(8, epoch=2), b"after")
    storage.close()

    assert names(fs, "snapshot.") == [f"snapshot.{zx(7, epoch=2):x}"]
    reopened = open_sim(fs)
    assert reopened.recovery.snapshot == (zx(7, epoch=2), b"leader@2:7")
    assert [t.zxid for t in reopened.recovery.transactions] == [zx(8, epoch=2)]


class _CutsPowerOnLogRemoval(WrappedFileSystem):
    armed = False

    def remove(self, path: str) -> None:
        if self.armed and os.path.basename(path).startswith("log."):
            raise PowerCut
        super().remove(path)


def test_an_install_interrupted_by_a_crash_is_finished_on_restart(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fs = SimulatedFileSystem()
    disk = _CutsPowerOnLogRemoval(fs)
    storage = open_sim(disk)
    fill(storage, range(1, 21))
    storage.write_snapshot(zx(10), b"mine@10")
    disk.armed = True
    with pytest.raises(PowerCut):  # the leader's snapshot is written, the old log still there
        storage.install_snapshot(zx(3, epoch=2), b"leader@2:3")
    fs.crash()

    with caplog.at_level(logging.WARNING):
        reopened = open_sim(fs)

    assert "finishing the install" in caplog.text
    assert reopened.recovery.snapshot == (zx(3, epoch=2), b"leader@2:3")
    assert reopened.recovery.transactions == []
    assert names(fs, "log.") == []
    assert names(fs, "snapshot.") == [f"snapshot.{zx(3, epoch=2):x}"]
    with pytest.raises(SnapshotSyncRequired):  # the old history is gone for good
        reopened.truncate_to(zx(15))


def test_snapshot_policy_staggers_snapshots_like_zookeeper() -> None:
    intervals = []
    policy = SnapshotPolicy(100, random.Random(7))
    count = 0
    for _ in range(5000):
        count += 1
        if policy.record_txn():
            intervals.append(count)
            count = 0
    assert all(50 < n <= 100 for n in intervals)
    assert len(set(intervals)) > 5  # randomised, not every 100

    assert _decisions(100, 7, 500) == _decisions(100, 7, 500)  # the seed replays
    assert _decisions(100, 7, 500) != _decisions(100, 8, 500)
    with pytest.raises(ValueError):
        SnapshotPolicy(1, random.Random(0))


def _decisions(snap_count: int, seed: int, n: int) -> list[bool]:
    policy = SnapshotPolicy(snap_count, random.Random(seed))
    return [policy.record_txn() for _ in range(n)]
