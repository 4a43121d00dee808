"""Helpers for the storage tests: zxids, payloads, and file systems that misbehave."""

from __future__ import annotations

import os
import threading
import time

from herder.ensemble.storage import FileHandle, FileLock, FileSystem, SimulatedFileSystem, Storage
from herder.ensemble.storage.frames import HEADER_SIZE, encode, scan

DATA = "/srv/herder/data"
#: small log files, so a few dozen records already span several of them
FILE_SIZE = 512


def zx(counter: int, epoch: int = 1) -> int:
    return epoch << 32 | counter


def payload(counter: int) -> bytes:
    return f"txn-{counter:04d}".encode() * 3


def open_sim(fs: FileSystem, **kwargs: object) -> Storage:
    kwargs.setdefault("log_file_size", FILE_SIZE)
    return Storage.open(DATA, fs=fs, **kwargs)  # type: ignore[arg-type]


def fill(storage: Storage, counters: range, epoch: int = 1) -> None:
    for counter in counters:
        storage.append(zx(counter, epoch), payload(counter))


def frame_offset(counters: range, target: int) -> int:
    """Offset of record ``target`` in a file whose records are ``counters``, in order."""
    return sum(len(encode(zx(c), payload(c))) for c in counters if c < target)


PAYLOAD_OFFSET = HEADER_SIZE


def log_path(counter: int, epoch: int = 1) -> str:
    return os.path.join(DATA, f"log.{zx(counter, epoch):x}")


class _Handle:
    """Delegates to a real handle, telling its file system before every change."""

    def __init__(self, inner: FileHandle, fs: WrappedFileSystem, path: str) -> None:
        self._inner = inner
        self._fs = fs
        self._path = path

    def pwrite(self, data: bytes, offset: int) -> None:
        self._fs.before_change()
        self._inner.pwrite(data, offset)

    def read(self, offset: int, size: int) -> bytes:
        return self._inner.read(offset, size)

    def fsync(self) -> None:
        self._fs.before_change()
        self._fs.on_fsync(self._inner, self._path)

    def truncate(self, size: int) -> None:
        self._fs.before_change()
        self._inner.truncate(size)

    def allocate(self, size: int) -> None:
        self._fs.before_change()
        self._inner.allocate(size)

    def size(self) -> int:
        return self._inner.size()

    def close(self) -> None:
        self._inner.close()


class WrappedFileSystem:
    """A simulated file system with hooks before each change and around each fsync."""

    def __init__(self, inner: SimulatedFileSystem) -> None:
        self.inner = inner

    def before_change(self) -> None:
        """Called before every operation that changes the disk."""

    def on_fsync(self, handle: FileHandle, path: str) -> None:
        handle.fsync()

    def open(self, path: str, *, create: bool = False) -> FileHandle:
        if create and not self.inner.exists(path):
            self.before_change()
        return _Handle(self.inner.open(path, create=create), self, path)

    def rename(self, src: str, dst: str) -> None:
        self.before_change()
        self.inner.rename(src, dst)

    def remove(self, path: str) -> None:
        self.before_change()
        self.inner.remove(path)

    def listdir(self, path: str) -> list[str]:
        return self.inner.listdir(path)

    def exists(self, path: str) -> bool:
        return self.inner.exists(path)

    def makedirs(self, path: str) -> None:
        self.inner.makedirs(path)

    def fsync_dir(self, path: str) -> None:
        self.before_change()
        self.inner.fsync_dir(path)

    def lock(self, path: str) -> FileLock:
        return self.inner.lock(path)


class PowerCut(Exception):
    """The power went out in the middle of an operation."""


class CutsPower(WrappedFileSystem):
    """Fails with :class:`PowerCut` before the change after ``budget`` more changes."""

    budget: int | None = None

    def before_change(self) -> None:
        if self.budget is not None:
            if self.budget == 0:
                raise PowerCut
            self.budget -= 1


class SkipsLogFsync(WrappedFileSystem):
    """The bug the durability tests must catch: log records "synced" without fsync."""

    def on_fsync(self, handle: FileHandle, path: str) -> None:
        if not os.path.basename(path).startswith("log."):
            handle.fsync()


class SlowFsync(WrappedFileSystem):
    """fsync takes a while, as on a real disk, and records which thread ran it."""

    def __init__(self, inner: SimulatedFileSystem, seconds: float) -> None:
        super().__init__(inner)
        self.seconds = seconds
        self.threads: set[int] = set()
        self.fail_with: OSError | None = None
        #: the highest zxid found in fsync'd log bytes: the disk's own view of durability
        self.durable_on_disk = 0
        self._lock = threading.Lock()

    def on_fsync(self, handle: FileHandle, path: str) -> None:
        with self._lock:
            self.threads.add(threading.get_ident())
        time.sleep(self.seconds)  # the simulated disk's latency, not a wait for a condition
        if self.fail_with is not None:
            raise self.fail_with
        handle.fsync()
        if os.path.basename(path).startswith("log."):
            last = scan(self.inner.durable_bytes(path), 0).last_zxid
            self.durable_on_disk = max(self.durable_on_disk, last)
