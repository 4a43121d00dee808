"""A server's durable storage: transaction log, snapshots, epochs, behind one lock.

:meth:`Storage.open` locks the data directory, loads the newest valid snapshot and the
transactions logged after it, and leaves the log ready for appends. A fresh directory
gets a *genesis* snapshot at zxid 0 (empty payload): as ZooKeeper's initial
``snapshot.0``, it says "the log here starts at the very beginning". Without it a
directory whose snapshots were all lost could not be told from one whose log was always
complete, and replaying a purged log from an empty state would silently build the wrong
state.

Thread-safety: ``append`` from one thread, ``sync`` from any (a
:class:`~herder.ensemble.storage.committer.GroupCommitter` runs it in a worker thread);
the maintenance calls (``write_snapshot``, ``install_snapshot``, ``truncate_to``,
``purge``) may overlap appends and syncs but not each other.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from types import TracebackType

from herder.ensemble.storage.epochs import Epochs
from herder.ensemble.storage.files import FileLock, FileSystem, OsFileSystem, read_all
from herder.ensemble.storage.frames import Txn
from herder.ensemble.storage.snapshots import Snapshot, SnapshotStore
from herder.ensemble.storage.txnlog import (
    DEFAULT_FILE_SIZE,
    LOG_PREFIX,
    RECOVER,
    TxnLog,
    parse_zxid_name,
)
from herder.ensemble.zab.config import Faults
from herder.errors import CorruptStorage, HerderError, StorageLocked

log = logging.getLogger(__name__)

LOCK_FILE = ".lock"
#: ZooKeeper's floor for autopurge.snapRetainCount
MIN_SNAP_RETAIN_COUNT = 3


class SnapshotSyncRequired(HerderError):
    """This server cannot rebuild the requested state locally; it needs a full SNAP."""


@dataclass(frozen=True, slots=True)
class Recovery:
    """What :meth:`Storage.open` found: apply ``snapshot``, then ``transactions``."""

    #: None means "start from the empty state" (only the genesis snapshot was there)
    snapshot: Snapshot | None
    transactions: list[Txn]


@dataclass(frozen=True, slots=True)
class StorageStats:
    durable_zxid: int
    last_zxid: int
    fsyncs: int
    log_bytes_written: int
    snapshot_bytes_written: int
    log_files: int
    snapshots: int


class Storage:
    """One server's log, snapshots and epochs. Build it with :meth:`open`."""

    def __init__(
        self,
        fs: FileSystem,
        data_dir: str,
        log_dir: str,
        locks: list[FileLock],
        snapshots: SnapshotStore,
        txnlog: TxnLog,
        recovery: Recovery,
        epochs: Epochs,
        snap_retain_count: int,
    ) -> None:
        self._fs = fs
        self.data_dir = data_dir
        self.log_dir = log_dir
        self._locks = locks
        self._snapshots = snapshots
        self._log = txnlog
        self.recovery = recovery
        self.epochs = epochs
        self._retain = max(snap_retain_count, MIN_SNAP_RETAIN_COUNT)

    @classmethod
    def open(
        cls,
        data_dir: str,
        log_dir: str | None = None,
        *,
        fs: FileSystem | None = None,
        log_file_size: int = DEFAULT_FILE_SIZE,
        snap_retain_count: int = MIN_SNAP_RETAIN_COUNT,
        faults: Faults | None = None,
    ) -> Storage:
        """Lock ``data_dir`` (and ``log_dir``, ZooKeeper's dataLogDir) and recover.

        Raises :class:`StorageLocked` if another server holds the directory and
        :class:`CorruptStorage` if acknowledged data is damaged. ``faults`` plants a
        test-only bug for the simulator to catch; a real server never passes it.
        """
        fs = fs or OsFileSystem()
        log_dir = log_dir or data_dir
        locks: list[FileLock] = []
        try:
            for directory in dict.fromkeys([data_dir, log_dir]):
                fs.makedirs(directory)
                locks.append(_lock(fs, directory))
            epochs = Epochs(fs, data_dir)
            snapshots = SnapshotStore(fs, data_dir)
            snapshots.remove_temporaries()
            snapshot = _newest_snapshot(fs, snapshots, data_dir, log_dir)
            if snapshots.is_installed(snapshot.zxid):
                _forget_history_before(fs, snapshots, log_dir, snapshot.zxid)
            txnlog, transactions = TxnLog.recover(
                fs, log_dir, after_zxid=snapshot.zxid, file_size=log_file_size, faults=faults
            )
            start = None if snapshot.zxid == 0 else snapshot
            recovery = Recovery(start, transactions)
            return cls(
                fs, data_dir, log_dir, locks, snapshots, txnlog, recovery, epochs, snap_retain_count
            )
        except BaseException:
            for lock in locks:
                lock.release()
            raise

    # -- the log --------------------------------------------------------------------

    @property
    def last_zxid(self) -> int:
        """The highest zxid appended or covered by the snapshot, durable or not."""
        return self._log.last_zxid

    @property
    def durable_zxid(self) -> int:
        return self._log.durable_zxid

    def append(self, zxid: int, payload: bytes) -> None:
        """Buffer a transaction; don't acknowledge it before :meth:`sync` covers it."""
        self._log.append(zxid, payload)

    def sync(self) -> int:
        """Make every appended transaction durable; return the highest durable zxid."""
        return self._log.sync()

    def transactions_after(self, zxid: int) -> Iterator[Txn]:
        """Durable transactions above ``zxid`` read back from disk (for a DIFF)."""
        return self._log.transactions_after(zxid)

    def log_bytes_after(self, zxid: int) -> int:
        """How many bytes the durable records above ``zxid`` take in the log."""
        return self._log.bytes_after(zxid)

    def transactions_from(self, zxid: int) -> Iterator[Txn]:
        """Durable transactions from the log file holding ``zxid`` on: the last one at or
        before ``zxid`` among them (a DIFF's start), and everything after. Nothing if the
        log begins after ``zxid``."""
        starts = [f.start for f in self._log.files]
        i = bisect.bisect_right(starts, zxid) - 1
        if i < 0:
            return iter(())
        return self._log.transactions_after(starts[i] - 1)

    @property
    def first_logged_zxid(self) -> int | None:
        """The zxid of the oldest record still in the log (older ones were purged)."""
        files = self._log.files
        return files[0].start if files else None

    # -- snapshots ------------------------------------------------------------------

    def write_snapshot(self, zxid: int, payload: bytes) -> None:
        """Persist the state as of ``zxid`` (already logged), roll the log and purge.

        The log is synced first: should this snapshot ever be unreadable, recovery falls
        back to an older one and must find every transaction up to ``zxid`` in the log.
        Snapshots only move forward: the log before the oldest kept one may be purged, so
        an older state could not be rebuilt from it.
        """
        if not 0 < zxid <= self._log.last_zxid:
            raise ValueError(
                f"snapshot zxid {zxid:#x} is not a logged transaction (last is "
                f"{self._log.last_zxid:#x}); a leader's snapshot goes to install_snapshot"
            )
        newest = max(self._snapshots.zxids(), default=0)
        if zxid < newest:
            raise ValueError(f"snapshot zxid {zxid:#x} is older than the snapshot {newest:#x}")
        self._log.sync()
        self._snapshots.write(zxid, payload)
        self._log.roll()
        self.purge()

    def install_snapshot(self, zxid: int, payload: bytes) -> None:
        """Replace this server's history by a leader's snapshot (Zab's SNAP).

        Every step leaves a recoverable directory: the log above ``zxid`` goes first (so
        the new snapshot is never followed by transactions of another history), then the
        snapshot is written, flagged as installed, then the rest of the log and the older
        snapshots go. If a crash interrupts that last step, :meth:`open` sees the flag and
        finishes it, so no later fallback or TRUNC mixes the two histories.
        """
        if zxid <= 0:
            raise ValueError(f"snapshot zxid {zxid:#x} must be positive")
        self._remove_snapshots([z for z in self._snapshots.zxids() if z > zxid])
        self._log.truncate_to(zxid, floor=zxid)
        self._snapshots.write(zxid, payload, installed=True)
        self._log.reset(floor=zxid)
        self._remove_snapshots([z for z in self._snapshots.zxids() if z != zxid])

    def truncate_to(self, zxid: int) -> None:
        """Forget every transaction above ``zxid`` (Zab's TRUNC), log and snapshots.

        Returns with what is left synced. Raises :class:`SnapshotSyncRequired`, changing
        nothing, when no valid snapshot at or below ``zxid`` remains to rebuild from.
        """
        if zxid >= self._log.last_zxid:
            self._log.sync()
            return
        base = self._snapshots.newest_valid(at_most=zxid)
        if base is None:
            raise SnapshotSyncRequired(
                f"{self.data_dir}: cannot truncate to zxid {zxid:#x}: no valid snapshot at "
                "or before it remains and the log no longer reaches back; a full SNAP "
                "from the leader is needed"
            )
        # snapshots first: one left above zxid would resurrect what the log forgets
        self._remove_snapshots([z for z in self._snapshots.zxids() if z > zxid])
        self._log.truncate_to(zxid, floor=base.zxid)

    def purge(self) -> list[str]:
        """Keep the newest valid snapshots (``snapRetainCount``, at least 3) and the log
        files needed to replay from the oldest of them; delete the rest.

        Returns the deleted paths.
        """
        valid = self._snapshots.valid_zxids()
        if len(valid) <= self._retain:
            return []
        oldest_kept = valid[-self._retain]
        removed = [self._snapshots.remove(z) for z in self._snapshots.zxids() if z < oldest_kept]
        for file in self._log.detach_before(oldest_kept):
            self._fs.remove(file.path)
            removed.append(file.path)
        for directory in dict.fromkeys([self.data_dir, self.log_dir]):
            self._fs.fsync_dir(directory)
        if removed:
            log.info("%s: purged %d old snapshot and log files", self.data_dir, len(removed))
        return removed

    def _remove_snapshots(self, zxids: list[int]) -> None:
        for zxid in sorted(zxids, reverse=True):
            self._snapshots.remove(zxid)
            self._fs.fsync_dir(self.data_dir)

    # -- the rest -------------------------------------------------------------------

    def stats(self) -> StorageStats:
        return StorageStats(
            durable_zxid=self._log.durable_zxid,
            last_zxid=self._log.last_zxid,
            fsyncs=self._log.fsyncs,
            log_bytes_written=self._log.bytes_written,
            snapshot_bytes_written=self._snapshots.bytes_written,
            log_files=len(self._log.files),
            snapshots=len(self._snapshots.zxids()),
        )

    def close(self) -> None:
        """Sync what was appended, then release the files and the directory lock."""
        try:
            if self._locks:
                self._log.sync()
        finally:
            self._log.close()
            while self._locks:
                with contextlib.suppress(OSError):
                    self._locks.pop().release()

    def __enter__(self) -> Storage:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _lock(fs: FileSystem, directory: str) -> FileLock:
    path = os.path.join(directory, LOCK_FILE)
    try:
        return fs.lock(path)
    except BlockingIOError:
        holder = "another herder server"
        with contextlib.suppress(OSError, UnicodeDecodeError):
            pid = read_all(fs, path).decode().strip()
            if pid.isdigit():
                holder += f" (pid {pid})"
        raise StorageLocked(
            f"{directory} is in use by {holder}, which holds {path}; give each server its "
            "own dataDir, or stop the other one"
        ) from None


def _newest_snapshot(
    fs: FileSystem, snapshots: SnapshotStore, data_dir: str, log_dir: str
) -> Snapshot:
    """The snapshot to start from, writing the genesis snapshot in a fresh directory."""
    if not snapshots.zxids():
        has_log = any(name.startswith(LOG_PREFIX) for name in fs.listdir(log_dir))
        if has_log:
            raise CorruptStorage(
                f"{data_dir}: the log in {log_dir} has no snapshot to start from, so it "
                f"cannot be replayed, so the server refuses to start; {RECOVER}"
            )
        snapshots.write(0, b"")
    snapshot = snapshots.newest_valid()
    if snapshot is None:
        raise CorruptStorage(
            f"{data_dir}: every snapshot is damaged, so the server refuses to start; {RECOVER}"
        )
    return snapshot


def _forget_history_before(
    fs: FileSystem, snapshots: SnapshotStore, log_dir: str, installed: int
) -> None:
    """Finish an interrupted install: delete the replaced history's snapshots and log.

    Log files starting at or before the installed zxid can only hold that history: after
    an install, new records go to a new file, and this runs before any append.
    """
    stale_logs = [
        name
        for name in fs.listdir(log_dir)
        if (start := parse_zxid_name(name, LOG_PREFIX)) is not None and start <= installed
    ]
    stale_snapshots = [z for z in snapshots.zxids() if z < installed]
    if not stale_logs and not stale_snapshots:
        return
    log.warning(
        "%s: finishing the install of snapshot %#x interrupted by a crash: removing %d log "
        "files and %d snapshots of the replaced history",
        log_dir,
        installed,
        len(stale_logs),
        len(stale_snapshots),
    )
    for name in stale_logs:
        fs.remove(os.path.join(log_dir, name))
    for zxid in stale_snapshots:
        snapshots.remove(zxid)
    for directory in dict.fromkeys([log_dir, snapshots.directory]):
        fs.fsync_dir(directory)
