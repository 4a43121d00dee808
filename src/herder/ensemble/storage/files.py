"""The file operations storage needs, behind a protocol so a simulated disk can stand in.

Storage touches the disk only through :class:`FileSystem`. :class:`OsFileSystem` makes the
real system calls; :class:`~herder.ensemble.storage.simfs.SimulatedFileSystem` keeps
files in memory and can crash, losing what was never fsync'd, which is how the tests (and
the Zab simulator) prove that an acknowledged transaction survives a power cut.

The protocol is deliberately small and positional (``pwrite``/``read`` at an offset, no
file position, no buffering): every byte storage writes is written exactly once at a
place it chose, which keeps both implementations simple and the crash model exact.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from typing import Protocol

from herder.files import fsync_path


class FileHandle(Protocol):
    """An open file, read-write, addressed by offset."""

    def pwrite(self, data: bytes, offset: int) -> None:
        """Write all of ``data`` at ``offset``, growing the file if needed."""

    def read(self, offset: int, size: int) -> bytes:
        """Up to ``size`` bytes from ``offset`` (fewer at the end of the file)."""

    def fsync(self) -> None:
        """Make the file's data and size durable (not its directory entry)."""

    def truncate(self, size: int) -> None:
        """Cut the file to ``size`` bytes (or extend it with zeros)."""

    def allocate(self, size: int) -> None:
        """Grow the file to at least ``size`` bytes of zeros, reserving the space."""

    def size(self) -> int: ...

    def close(self) -> None: ...


class FileLock(Protocol):
    """An exclusive lock held on a path until released (or the process dies)."""

    def release(self) -> None: ...


class FileSystem(Protocol):
    """Path operations. Directory changes are durable only after :meth:`fsync_dir`."""

    def open(self, path: str, *, create: bool = False) -> FileHandle:
        """Open ``path`` read-write; with ``create``, make it if missing."""

    def rename(self, src: str, dst: str) -> None:
        """Atomically replace ``dst`` by ``src`` (same directory)."""

    def remove(self, path: str) -> None: ...

    def listdir(self, path: str) -> list[str]: ...

    def exists(self, path: str) -> bool: ...

    def makedirs(self, path: str) -> None:
        """Create ``path`` and its parents if missing."""

    def fsync_dir(self, path: str) -> None:
        """Make creations, renames and removals in directory ``path`` durable."""

    def lock(self, path: str) -> FileLock:
        """Take an exclusive lock on ``path`` without waiting.

        Raises :class:`BlockingIOError` if someone else holds it.
        """


def read_all(fs: FileSystem, path: str) -> bytes:
    """The whole content of ``path``."""
    handle = fs.open(path)
    try:
        return handle.read(0, handle.size())
    finally:
        handle.close()


class _OsFile:
    """A file descriptor used with pread/pwrite, so no shared file position exists."""

    __slots__ = ("_fd",)

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def pwrite(self, data: bytes, offset: int) -> None:
        view = memoryview(data)
        while view:
            written = os.pwrite(self._fd, view, offset)
            view = view[written:]
            offset += written

    def read(self, offset: int, size: int) -> bytes:
        chunks = []
        while size > 0:
            chunk = os.pread(self._fd, size, offset)
            if not chunk:
                break
            chunks.append(chunk)
            offset += len(chunk)
            size -= len(chunk)
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def fsync(self) -> None:
        # fdatasync flushes the data and the metadata needed to read it back (the size)
        # and skips timestamps: ZooKeeper's FileChannel.force(false) does the same, and
        # with preallocated files it saves a journal commit per sync.
        if hasattr(os, "fdatasync"):
            os.fdatasync(self._fd)
        else:  # pragma: no cover - macOS
            os.fsync(self._fd)

    def truncate(self, size: int) -> None:
        os.ftruncate(self._fd, size)

    def allocate(self, size: int) -> None:
        current = self.size()
        if size <= current:
            return
        try:
            # real blocks, not a sparse hole: later fsyncs then need no allocation
            os.posix_fallocate(self._fd, current, size - current)
        except OSError as exc:
            if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                raise
            os.ftruncate(self._fd, size)

    def size(self) -> int:
        return os.fstat(self._fd).st_size

    def close(self) -> None:
        os.close(self._fd)


class _OsLock:
    __slots__ = ("_fd",)

    def __init__(self, fd: int) -> None:
        self._fd: int | None = fd

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


class OsFileSystem:
    """The real disk, through plain ``os`` calls."""

    def open(self, path: str, *, create: bool = False) -> FileHandle:
        flags = os.O_RDWR | (os.O_CREAT if create else 0) | getattr(os, "O_CLOEXEC", 0)
        return _OsFile(os.open(path, flags, 0o644))

    def rename(self, src: str, dst: str) -> None:
        os.replace(src, dst)

    def remove(self, path: str) -> None:
        os.remove(path)

    def listdir(self, path: str) -> list[str]:
        return sorted(os.listdir(path))

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def makedirs(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)

    def fsync_dir(self, path: str) -> None:
        fsync_path(path)

    def lock(self, path: str) -> FileLock:
        """An ``flock`` on ``path``; the kernel drops it when the process dies."""
        fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise
        with contextlib.suppress(OSError):
            # who holds it, for the operator reading the error of a second server
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return _OsLock(fd)
