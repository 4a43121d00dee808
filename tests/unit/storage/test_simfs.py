"""The simulated disk loses exactly what POSIX lets a power cut lose, reproducibly."""

from __future__ import annotations

import errno
import random

import pytest

from herder.ensemble.storage import SimulatedFileSystem

pytestmark = pytest.mark.unit


def _fs_with_file(content: bytes = b"synced") -> SimulatedFileSystem:
    fs = SimulatedFileSystem()
    fs.makedirs("/d")
    handle = fs.open("/d/f", create=True)
    handle.pwrite(content, 0)
    handle.fsync()
    fs.fsync_dir("/d")
    return fs


def test_unsynced_bytes_are_lost_and_synced_ones_kept() -> None:
    fs = _fs_with_file()
    handle = fs.open("/d/f")
    handle.pwrite(b"+unsynced", 6)
    assert fs.file_bytes("/d/f") == b"synced+unsynced"

    fs.crash()

    assert fs.file_bytes("/d/f") == b"synced"


def test_a_file_whose_directory_was_not_synced_disappears() -> None:
    fs = _fs_with_file()
    handle = fs.open("/d/new", create=True)
    handle.pwrite(b"data", 0)
    handle.fsync()  # the data is durable, the name is not

    fs.crash()

    assert not fs.exists("/d/new")
    assert fs.listdir("/d") == ["f"]


def test_a_rename_needs_a_directory_sync_and_carries_only_synced_data() -> None:
    fs = _fs_with_file()
    handle = fs.open("/d/tmp", create=True)
    handle.pwrite(b"never synced", 0)
    fs.rename("/d/tmp", "/d/f")
    fs.crash()
    assert fs.file_bytes("/d/f") == b"synced"  # the rename was lost with its directory

    handle = fs.open("/d/tmp", create=True)
    handle.pwrite(b"never synced", 0)
    fs.rename("/d/tmp", "/d/f")
    fs.fsync_dir("/d")
    fs.crash()
    assert fs.file_bytes("/d/f") == b""  # renamed into place, but its data never reached disk


def test_removals_come_back_unless_the_directory_is_synced() -> None:
    fs = _fs_with_file()
    fs.remove("/d/f")
    fs.crash()
    assert fs.file_bytes("/d/f") == b"synced"
    fs.remove("/d/f")
    fs.fsync_dir("/d")
    fs.crash()
    assert not fs.exists("/d/f")


def test_a_torn_crash_keeps_a_prefix_of_the_unsynced_bytes_reproducibly() -> None:
    outcomes = set()
    for seed in range(40):
        fs = _fs_with_file(b"A" * 10)
        fs.open("/d/f").pwrite(b"B" * 20, 10)
        fs.crash(random.Random(seed), tear=True)
        content = fs.file_bytes("/d/f")
        kept = len(content) - 10
        assert content == b"A" * 10 + b"B" * kept
        outcomes.add(kept)

        replay = _fs_with_file(b"A" * 10)
        replay.open("/d/f").pwrite(b"B" * 20, 10)
        replay.crash(random.Random(seed), tear=True)
        assert replay.file_bytes("/d/f") == content
    assert {0, 20} <= outcomes and len(outcomes) > 5


def test_a_torn_crash_needs_a_seeded_rng() -> None:
    with pytest.raises(ValueError, match="seeded rng"):
        SimulatedFileSystem().crash(tear=True)


def test_handles_and_locks_die_with_the_crash() -> None:
    fs = _fs_with_file()
    handle = fs.open("/d/f")
    fs.lock("/d/.lock")
    with pytest.raises(BlockingIOError):
        fs.lock("/d/.lock")

    fs.crash()

    with pytest.raises(OSError) as caught:
        handle.pwrite(b"x", 0)
    assert caught.value.errno == errno.EBADF
    fs.lock("/d/.lock").release()


def test_preallocation_is_sparse_zeros_and_survives_its_fsync() -> None:
    fs = _fs_with_file()
    handle = fs.open("/d/f")
    handle.allocate(64 * 1024 * 1024)
    handle.fsync()
    fs.crash()
    handle = fs.open("/d/f")
    assert handle.size() == 64 * 1024 * 1024
    assert handle.read(0, 10) == b"synced\0\0\0\0"
    assert handle.read(1 << 20, 4) == b"\0\0\0\0"
    assert fs.durable_bytes("/d/f")[:6] == b"synced"
