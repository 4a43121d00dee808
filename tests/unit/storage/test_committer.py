"""Group commit on asyncio: few fsyncs for many appends, each awaited append on disk."""

from __future__ import annotations

import asyncio
import errno
import itertools
import threading

import pytest

from herder.ensemble.storage import GroupCommitter, SimulatedFileSystem

from .support import SlowFsync, open_sim, zx

pytestmark = pytest.mark.unit


async def test_concurrent_appends_share_fsyncs_and_each_is_durable_when_awaited() -> None:
    fs = SlowFsync(SimulatedFileSystem(), seconds=0.002)
    storage = open_sim(fs, log_file_size=1 << 20)
    committer = GroupCommitter(storage)
    counters = itertools.count(1)
    checked = []

    async def writer() -> None:
        for _ in range(5):
            zxid = zx(next(counters))  # taken and appended with no await between: in order
            result = await committer.append(zxid, b"payload %d" % zxid)
            # the disk itself, not just the log's bookkeeping, holds the record now
            assert fs.durable_on_disk >= zxid
            assert result >= zxid
            checked.append(zxid)
            await asyncio.sleep(0)

    fsyncs_before = storage.stats().fsyncs
    fs.threads.clear()  # opening synced on this thread; from here on only the committer does
    await asyncio.gather(*(writer() for _ in range(100)))

    appends = len(checked)
    assert appends == 500
    assert committer.syncs < appends / 10
    assert storage.stats().fsyncs - fsyncs_before < appends / 10
    assert storage.durable_zxid == zx(500)
    assert threading.get_ident() not in fs.threads  # never on the event loop's thread


async def test_a_lone_append_is_synced_at_once() -> None:
    storage = open_sim(SimulatedFileSystem())
    committer = GroupCommitter(storage)
    assert await committer.append(zx(1), b"alone") == zx(1)
    assert committer.syncs == 1
    assert await committer.durable(zx(1)) == zx(1)  # already durable: resolves at once
    assert committer.syncs == 1


async def test_durable_waits_for_a_later_append() -> None:
    storage = open_sim(SimulatedFileSystem())
    committer = GroupCommitter(storage)
    waiting = committer.durable(zx(2))
    await committer.append(zx(1), b"one")
    assert not waiting.done()
    committer.append(zx(2), b"two")
    assert await waiting >= zx(2)


async def test_a_sync_made_elsewhere_also_releases_waiters() -> None:
    storage = open_sim(SimulatedFileSystem())
    committer = GroupCommitter(storage)
    waiting = committer.append(zx(1), b"one")
    storage.sync()  # e.g. a snapshot being written syncs the log first

    assert await asyncio.wait_for(waiting, timeout=10) == zx(1)
    assert committer.syncs == 0


async def test_flush_covers_appends_nobody_awaited() -> None:
    fs = SimulatedFileSystem()
    storage = open_sim(fs)
    committer = GroupCommitter(storage)
    for counter in range(1, 21):
        committer.append(zx(counter), b"fire and forget")
    assert await committer.flush() == zx(20)
    fs.crash()
    assert len(open_sim(fs).recovery.transactions) == 20


async def test_cancelling_one_wait_leaves_the_others() -> None:
    fs = SlowFsync(SimulatedFileSystem(), seconds=0.01)
    committer = GroupCommitter(open_sim(fs))
    first = committer.append(zx(1), b"one")
    second = committer.append(zx(2), b"two")
    first.cancel()
    assert await second == zx(2)
    await committer.close()


async def test_a_failed_fsync_fails_every_waiter_and_every_later_append() -> None:
    fs = SlowFsync(SimulatedFileSystem(), seconds=0)
    storage = open_sim(fs)
    committer = GroupCommitter(storage)
    fs.fail_with = OSError(errno.EIO, "disk on fire")
    waits = [committer.append(zx(c), b"doomed") for c in range(1, 4)]

    results = await asyncio.gather(*waits, return_exceptions=True)

    assert all(isinstance(r, OSError) and r.errno == errno.EIO for r in results)
    with pytest.raises(OSError, match="disk on fire"):
        committer.append(zx(4), b"refused")
    with pytest.raises(OSError, match="disk on fire"):
        await committer.durable(zx(1))
