"""An in-memory file system that can crash like a real disk, deterministically.

The model is the pessimistic one POSIX allows:

* a file's bytes reach the disk only through ``fsync`` on it; a crash reverts the file to
  its content at the last ``fsync``;
* creating, renaming and removing a name reaches the disk only through ``fsync_dir`` on
  its directory; a crash reverts the directory to its last synced listing. A name and its
  data are separate: a file renamed into place whose data was never fsync'd comes back
  empty (the classic lost-rename-without-fsync bug), and a file fsync'd but whose
  directory was not is gone;
* with ``tear=True``, some of the unsynced work reaches the disk anyway, as when power
  fails halfway through a write: each file keeps a random prefix of its unsynced bytes
  (a torn write) and each directory a random prefix of its unsynced operations (journaled
  file systems commit metadata in order).

Randomness comes only from the ``random.Random`` passed to :meth:`crash`, so a seed
replays one history exactly. Locks and open handles die with the "process": handles
opened before a crash raise ``EBADF``, as a new process would never see them.

Files are stored sparsely: preallocated zeros past the last write cost no memory, so the
default 64 MiB log files are affordable in simulation.
"""

from __future__ import annotations

import errno
import os
import random
from dataclasses import dataclass, field

from herder.ensemble.storage.files import FileHandle, FileLock


@dataclass(eq=False)
class _Inode:
    """One file. ``data`` is the written prefix; past it, up to ``size``, are zeros."""

    data: bytearray = field(default_factory=bytearray)
    size: int = 0
    durable: bytearray = field(default_factory=bytearray)
    durable_size: int = 0
    #: lowest offset changed since the last fsync (None: nothing to sync)
    dirty_from: int | None = None

    def touch(self, offset: int) -> None:
        self.dirty_from = offset if self.dirty_from is None else min(self.dirty_from, offset)

    def sync(self) -> None:
        if self.dirty_from is not None:
            start = min(self.dirty_from, len(self.durable))
            del self.durable[start:]
            self.durable += self.data[start:]
            self.dirty_from = None
        self.durable_size = self.size

    def crash(self, rng: random.Random | None) -> None:
        """Revert to the durable content, keeping a random prefix of the rest if ``rng``."""
        lo = self.dirty_from
        if lo is not None and rng is not None:
            hi = max(len(self.data), len(self.durable))
            cut = rng.randint(lo, hi)
            if cut == hi:  # the whole write made it, size included
                self.sync()
                return
            torn = self.data[lo:cut]
            if len(self.durable) < lo:
                self.durable.extend(bytes(lo - len(self.durable)))
            self.durable[lo : lo + len(torn)] = torn
            self.durable_size = max(self.durable_size, len(self.durable))
        self.data = bytearray(self.durable)
        self.size = self.durable_size
        self.dirty_from = None


@dataclass(eq=False)
class _Directory:
    names: dict[str, _Inode] = field(default_factory=dict)
    durable_names: dict[str, _Inode] = field(default_factory=dict)
    #: (old name or None, new name or None, inode) per unsynced link/rename/unlink
    journal: list[tuple[str | None, str | None, _Inode | None]] = field(default_factory=list)

    def sync(self, upto: int | None = None) -> None:
        ops = self.journal if upto is None else self.journal[:upto]
        for old, new, inode in ops:
            if old is not None:
                self.durable_names.pop(old, None)
            if new is not None and inode is not None:
                self.durable_names[new] = inode
        self.journal.clear()


class _SimHandle:
    __slots__ = ("_fs", "_generation", "_inode", "_open", "_path")

    def __init__(self, fs: SimulatedFileSystem, path: str, inode: _Inode) -> None:
        self._fs = fs
        self._path = path
        self._inode = inode
        self._generation = fs.generation
        self._open = True

    def _live(self) -> _Inode:
        if not self._open or self._generation != self._fs.generation:
            raise OSError(errno.EBADF, "file handle closed or from before a simulated crash")
        return self._inode

    def pwrite(self, data: bytes, offset: int) -> None:
        inode = self._live()
        end = offset + len(data)
        inode.touch(min(offset, len(inode.data)))
        if len(inode.data) < offset:
            inode.data.extend(bytes(offset - len(inode.data)))
        inode.data[offset:end] = data
        inode.size = max(inode.size, end)
        self._fs.bytes_written += len(data)

    def read(self, offset: int, size: int) -> bytes:
        inode = self._live()
        end = min(offset + size, inode.size)
        if end <= offset:
            return b""
        chunk = bytes(inode.data[offset:end])
        return chunk + bytes(end - offset - len(chunk))

    def fsync(self) -> None:
        self._live().sync()
        self._fs.fsyncs += 1

    def truncate(self, size: int) -> None:
        inode = self._live()
        if size < len(inode.data):
            del inode.data[size:]
            inode.touch(size)
        inode.size = size

    def allocate(self, size: int) -> None:
        inode = self._live()
        inode.size = max(inode.size, size)

    def size(self) -> int:
        return self._live().size

    def close(self) -> None:
        self._open = False


class _SimLock:
    __slots__ = ("_fs", "_generation", "_path")

    def __init__(self, fs: SimulatedFileSystem, path: str) -> None:
        self._fs = fs
        self._path = path
        self._generation = fs.generation

    def release(self) -> None:
        if self._generation == self._fs.generation:
            self._fs.locks.discard(self._path)


class SimulatedFileSystem:
    """In-memory :class:`~herder.ensemble.storage.files.FileSystem` with :meth:`crash`."""

    def __init__(self) -> None:
        self._dirs: dict[str, _Directory] = {"/": _Directory()}
        self.locks: set[str] = set()
        #: bumped by every crash; handles and locks of an older generation are dead
        self.generation = 0
        self.fsyncs = 0
        self.bytes_written = 0

    def _split(self, path: str) -> tuple[_Directory, str]:
        path = os.path.normpath(os.path.join("/", path))
        parent, name = os.path.split(path)
        directory = self._dirs.get(parent)
        if directory is None or not name:
            raise FileNotFoundError(errno.ENOENT, "no such directory", parent)
        return directory, name

    def _inode(self, path: str) -> tuple[_Directory, str, _Inode]:
        directory, name = self._split(path)
        inode = directory.names.get(name)
        if inode is None:
            raise FileNotFoundError(errno.ENOENT, "no such file", path)
        return directory, name, inode

    def open(self, path: str, *, create: bool = False) -> FileHandle:
        directory, name = self._split(path)
        inode = directory.names.get(name)
        if inode is None:
            if not create:
                raise FileNotFoundError(errno.ENOENT, "no such file", path)
            inode = directory.names[name] = _Inode()
            directory.journal.append((None, name, inode))
        return _SimHandle(self, path, inode)

    def rename(self, src: str, dst: str) -> None:
        directory, old, inode = self._inode(src)
        target, new = self._split(dst)
        if target is not directory:
            raise OSError(errno.EXDEV, "simulated renames stay within one directory", dst)
        del directory.names[old]
        directory.names[new] = inode
        directory.journal.append((old, new, inode))

    def remove(self, path: str) -> None:
        directory, name, _ = self._inode(path)
        del directory.names[name]
        directory.journal.append((name, None, None))

    def listdir(self, path: str) -> list[str]:
        path = os.path.normpath(os.path.join("/", path))
        directory = self._dirs.get(path)
        if directory is None:
            raise FileNotFoundError(errno.ENOENT, "no such directory", path)
        prefix = path.rstrip("/") + "/"
        subdirs = {d[len(prefix) :].split("/")[0] for d in self._dirs if d.startswith(prefix)}
        return sorted(set(directory.names) | subdirs)

    def exists(self, path: str) -> bool:
        path = os.path.normpath(os.path.join("/", path))
        if path in self._dirs:
            return True
        directory, name = self._split(path)
        return name in directory.names

    def makedirs(self, path: str) -> None:
        """Create directories; unlike files, they are durable at once (not modelled)."""
        path = os.path.normpath(os.path.join("/", path))
        while path not in self._dirs:
            self._dirs[path] = _Directory()
            path = os.path.dirname(path)

    def fsync_dir(self, path: str) -> None:
        path = os.path.normpath(os.path.join("/", path))
        directory = self._dirs.get(path)
        if directory is None:
            raise FileNotFoundError(errno.ENOENT, "no such directory", path)
        directory.sync()
        self.fsyncs += 1

    def lock(self, path: str) -> FileLock:
        path = os.path.normpath(os.path.join("/", path))
        if path in self.locks:
            raise BlockingIOError(errno.EWOULDBLOCK, "locked by another holder", path)
        self.open(path, create=True).close()
        self.locks.add(path)
        return _SimLock(self, path)

    def crash(self, rng: random.Random | None = None, tear: bool = False) -> None:
        """Power failure: lose every unsynced byte and name, then "restart".

        With ``tear`` (which needs ``rng``), keep a random prefix of each file's unsynced
        bytes and of each directory's unsynced operations instead of none of them.
        """
        if tear and rng is None:
            raise ValueError("a torn crash needs a seeded rng to stay reproducible")
        torn = rng if tear else None
        for directory in self._dirs.values():
            if torn is not None:
                directory.sync(torn.randint(0, len(directory.journal)))
            directory.journal.clear()
            directory.names = dict(directory.durable_names)
        seen: set[int] = set()
        for path in sorted(self._dirs):
            directory = self._dirs[path]
            for name in sorted(directory.names):
                inode = directory.names[name]
                if id(inode) not in seen:
                    seen.add(id(inode))
                    inode.crash(torn)
        self.locks.clear()
        self.generation += 1

    def durable_bytes(self, path: str) -> bytes:
        """What ``path`` would hold after a crash without tearing (its last fsync'd data)."""
        inode = self._inode(path)[2]
        return bytes(inode.durable).ljust(inode.durable_size, b"\0")

    def file_bytes(self, path: str) -> bytes:
        """The current content of ``path`` (for tests that damage or inspect files)."""
        return _SimHandle(self, path, self._inode(path)[2]).read(0, 1 << 62)

    def overwrite(self, path: str, offset: int, data: bytes) -> None:
        """Change bytes durably behind storage's back, as disk rot would."""
        inode = self._inode(path)[2]
        handle = _SimHandle(self, path, inode)
        handle.pwrite(data, offset)
        inode.sync()
