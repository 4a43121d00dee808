"""The transaction log: framed records in preallocated files, acknowledged only once synced.

Files are named ``log.<hex zxid>`` after their first record, as ZooKeeper names them, and
preallocated (64 MiB by default) so that an fsync only flushes data, never a changed
file size; the zeros after the last record mark the end of the data.

``append`` only encodes the record into memory; ``sync`` writes everything appended
since the previous sync with one ``pwrite`` per file and makes it durable with one fsync.
That is group commit: however many records arrived while the previous fsync ran, the next
fsync covers them all, and the cost per record stays a few microseconds of Python.

Only the last file can ever hold unsynced bytes: before the log rolls to a new file it
syncs the old one. Recovery relies on that to tell a torn tail (never acknowledged, safe
to drop) from damage to acknowledged records (refuse to start).
"""

from __future__ import annotations

import bisect
import logging
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass

from herder.ensemble.storage.files import FileHandle, FileSystem, read_all
from herder.ensemble.storage.frames import Txn, bytes_after, encode, scan, zxid_of
from herder.ensemble.zab.config import Faults
from herder.errors import CorruptStorage

log = logging.getLogger(__name__)

DEFAULT_FILE_SIZE = 64 * 1024 * 1024
LOG_PREFIX = "log."

RECOVER = "recover it with a full SNAP from the leader (or restore the directory from a backup)"
REFUSE = f"acknowledged transactions are damaged, so the server refuses to start; {RECOVER}"


def parse_zxid_name(name: str, prefix: str) -> int | None:
    """The zxid in a ``<prefix><hex zxid>`` file name, None for any other name."""
    if not name.startswith(prefix):
        return None
    try:
        return int(name[len(prefix) :], 16)
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class LogFile:
    start: int  # zxid of the first record, the file's name
    path: str


class TxnLog:
    """Append, sync, roll and truncate the log in one directory.

    ``append`` must be called from one thread at a time; ``sync``, ``roll`` and
    ``truncate_to`` may run in another thread (they serialise on an internal lock).
    """

    def __init__(
        self,
        fs: FileSystem,
        directory: str,
        file_size: int,
        files: list[LogFile],
        faults: Faults | None = None,
    ):
        self._fs = fs
        self._faults = faults or Faults()
        self._dir = directory
        self._file_size = file_size
        self._files = files
        self._current: FileHandle | None = None
        self._position = 0
        self._roll_next = False
        self._pending: list[bytes] = []
        self._pending_size = 0
        self._pending_lock = threading.Lock()
        self._io_lock = threading.Lock()
        self._last_zxid = 0
        self._durable_zxid = 0
        self.fsyncs = 0
        self.bytes_written = 0

    # -- recovery -------------------------------------------------------------------

    @classmethod
    def recover(
        cls,
        fs: FileSystem,
        directory: str,
        *,
        after_zxid: int,
        file_size: int,
        faults: Faults | None = None,
    ) -> tuple[TxnLog, list[Txn]]:
        """Open the log and return it with the transactions after ``after_zxid``.

        Reads the file holding ``after_zxid`` and every later one. A torn tail of the last
        file is cut off with a warning; any other damage raises :class:`CorruptStorage`.
        ``faults`` plants a test-only bug (see :class:`~herder.ensemble.zab.Faults`).
        """
        files = cls._list(fs, directory)
        starts = [f.start for f in files]
        first = max(bisect.bisect_right(starts, after_zxid) - 1, 0)
        txnlog = cls(fs, directory, file_size, files, faults)
        replay: list[Txn] = []
        prev = 0
        for index in range(first, len(files)):
            is_last = index == len(files) - 1
            prev, txns = txnlog._recover_file(files[index], prev, is_last=is_last)
            replay.extend(t for t in txns if t.zxid > after_zxid)
        txnlog._last_zxid = txnlog._durable_zxid = max(prev, after_zxid)
        return txnlog, replay

    @staticmethod
    def _list(fs: FileSystem, directory: str) -> list[LogFile]:
        found = []
        for name in fs.listdir(directory):
            start = parse_zxid_name(name, LOG_PREFIX)
            if start is not None:
                found.append(LogFile(start, os.path.join(directory, name)))
        return sorted(found, key=lambda f: f.start)

    def _recover_file(self, file: LogFile, prev: int, *, is_last: bool) -> tuple[int, list[Txn]]:
        data = read_all(self._fs, file.path)
        result = scan(data, prev)
        damage = result.damage
        if damage is not None:
            if damage.followed_by_valid or not is_last:
                raise CorruptStorage(
                    f"{file.path}: {damage.reason} at offset {damage.offset}, followed by "
                    f"valid records: {REFUSE}"
                )
            log.warning(
                "%s: dropping a torn record at offset %d (%s) after zxid %#x: it was never "
                "synced, so never acknowledged",
                file.path,
                damage.offset,
                damage.reason,
                result.last_zxid,
            )
        if result.txns and result.txns[0].zxid != file.start:
            raise CorruptStorage(
                f"{file.path}: first record has zxid {result.txns[0].zxid:#x}, not the "
                f"{file.start:#x} its name promises: {REFUSE}"
            )
        if not result.txns:
            if not is_last:
                raise CorruptStorage(
                    f"{file.path}: no records, yet later log files exist: {REFUSE}"
                )
            # a file created just before a crash; its name must be free for reuse
            self._fs.remove(file.path)
            self._fs.fsync_dir(self._dir)
            self._files.remove(file)
            return result.last_zxid, []
        if is_last:
            handle = self._fs.open(file.path)
            if damage is not None:
                handle.truncate(result.end)
            handle.allocate(self._file_size)
            handle.fsync()
            self.fsyncs += 1
            self._current, self._position = handle, result.end
        return result.last_zxid, result.txns

    # -- appending ------------------------------------------------------------------

    @property
    def last_zxid(self) -> int:
        """The highest zxid appended (or recovered), durable or not."""
        return self._last_zxid

    @property
    def durable_zxid(self) -> int:
        """The highest zxid covered by a completed fsync."""
        return self._durable_zxid

    @property
    def files(self) -> list[LogFile]:
        return list(self._files)

    def append(self, zxid: int, payload: bytes) -> None:
        """Buffer a record; it is durable only once a later :meth:`sync` returns."""
        if zxid <= self._last_zxid:
            raise ValueError(f"zxid {zxid:#x} does not follow {self._last_zxid:#x}")
        frame = encode(zxid, payload)
        with self._pending_lock:
            self._pending.append(frame)
            self._pending_size += len(frame)
        self._last_zxid = zxid

    def sync(self) -> int:
        """Write and fsync everything appended so far; return the highest durable zxid."""
        with self._io_lock:
            return self._sync_locked()

    def _sync_locked(self) -> int:
        with self._pending_lock:
            batch, size = self._pending, self._pending_size
            self._pending, self._pending_size = [], 0
        if not batch:
            return self._durable_zxid
        fits = self._position + size <= self._file_size
        if self._current is not None and not self._roll_next and fits:
            self._write(b"".join(batch))
        else:
            self._write_rolling(batch)
        self._durable_zxid = zxid_of(batch[-1])
        return self._durable_zxid

    def _write_rolling(self, batch: list[bytes]) -> None:
        chunk: list[bytes] = []
        chunk_size = 0
        for frame in batch:
            end = self._position + chunk_size + len(frame)
            full = end > self._file_size and self._position + chunk_size > 0
            if self._current is None or self._roll_next or full:
                if chunk:
                    self._write(b"".join(chunk))
                    chunk, chunk_size = [], 0
                self._start_file(zxid_of(frame))
            chunk.append(frame)
            chunk_size += len(frame)
        self._write(b"".join(chunk))

    def _write(self, data: bytes) -> None:
        assert self._current is not None
        self._current.pwrite(data, self._position)
        self._current.fsync()
        self._position += len(data)
        self.bytes_written += len(data)
        self.fsyncs += 1

    def _start_file(self, zxid: int) -> None:
        path = os.path.join(self._dir, f"{LOG_PREFIX}{zxid:x}")
        handle = self._fs.open(path, create=True)
        handle.truncate(0)
        handle.allocate(self._file_size)
        handle.fsync()
        # the name must be durable before any record in the file is acknowledged
        if not self._faults.storage_skips_log_dir_fsync:
            self._fs.fsync_dir(self._dir)
        self.fsyncs += 2
        if self._current is not None:
            self._current.close()
        self._files.append(LogFile(zxid, path))
        self._current, self._position, self._roll_next = handle, 0, False

    def roll(self) -> None:
        """Start a new file at the next record, so older files can be purged whole."""
        with self._io_lock:
            self._roll_next = self._position > 0

    # -- truncation and reading ----------------------------------------------------

    def truncate_to(self, zxid: int, floor: int) -> None:
        """Remove every record above ``zxid``; ``floor`` is the newest snapshot's zxid.

        Whole files go newest first, each removal made durable before the next, so a
        crash at any point leaves a prefix of the log, never a log with a hole.
        """
        with self._io_lock:
            self._sync_locked()
            while self._files and self._files[-1].start > zxid:
                doomed = self._files.pop()
                if self._current is not None:
                    self._current.close()
                    self._current = None
                self._fs.remove(doomed.path)
                self._fs.fsync_dir(self._dir)
                self.fsyncs += 1
            last = 0
            if self._files:
                kept = self._files[-1]
                result = scan(read_all(self._fs, kept.path), 0, until=zxid)
                if result.damage is not None:
                    raise CorruptStorage(
                        f"{kept.path}: {result.damage.reason} at offset {result.damage.offset}"
                    )
                handle = self._current or self._fs.open(kept.path)
                handle.truncate(result.end)
                handle.allocate(self._file_size)
                handle.fsync()
                self.fsyncs += 1
                self._current, self._position, self._roll_next = handle, result.end, False
                last = result.last_zxid
            self._last_zxid = self._durable_zxid = max(last, min(floor, zxid))

    def reset(self, floor: int) -> None:
        """Delete the whole log; the next record (above ``floor``) starts a new file."""
        with self._io_lock:
            self._sync_locked()
            if self._current is not None:
                self._current.close()
                self._current = None
            for file in self._files:
                self._fs.remove(file.path)
            self._files.clear()
            self._fs.fsync_dir(self._dir)
            self.fsyncs += 1
            self._last_zxid = self._durable_zxid = floor

    def detach_before(self, zxid: int) -> list[LogFile]:
        """Forget the files not needed to replay from ``zxid`` on; the caller deletes them.

        The file holding ``zxid`` and all later ones stay.
        """
        with self._io_lock:
            starts = [f.start for f in self._files]
            keep_from = max(bisect.bisect_right(starts, zxid) - 1, 0)
            doomed, self._files = self._files[:keep_from], self._files[keep_from:]
            return doomed

    def bytes_after(self, zxid: int) -> int:
        """The framed bytes of the durable records above ``zxid`` (see ``frames.bytes_after``)."""
        with self._io_lock:
            files, durable = list(self._files), self._durable_zxid
        starts = [f.start for f in files]
        total = 0
        for file in files[max(bisect.bisect_right(starts, zxid + 1) - 1, 0) :]:
            total += bytes_after(read_all(self._fs, file.path), zxid, durable)
        return total

    def transactions_after(self, zxid: int) -> Iterator[Txn]:
        """The durable transactions above ``zxid``, read back from the files.

        For a leader's DIFF. Records older than the first file are gone (see
        ``files[0].start``); a purge or truncation while iterating may end it early.
        """
        with self._io_lock:
            files, durable = list(self._files), self._durable_zxid
        starts = [f.start for f in files]
        prev = 0
        for file in files[max(bisect.bisect_right(starts, zxid + 1) - 1, 0) :]:
            if prev >= durable:
                return
            result = scan(read_all(self._fs, file.path), prev, until=durable)
            if result.damage is not None:
                raise CorruptStorage(
                    f"{file.path}: {result.damage.reason} at offset {result.damage.offset}"
                )
            yield from (t for t in result.txns if t.zxid > zxid)
            prev = result.last_zxid

    def close(self) -> None:
        with self._io_lock:
            if self._current is not None:
                self._current.close()
                self._current = None
