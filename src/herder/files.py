"""Durability on real files: an fsync by path, and a hint to start writing back.

Below every layer: the ensemble's storage syncs its directories with :func:`fsync_path`,
and the data plane and the file connectors make their outputs durable with it before
their offsets commit, starting the write-back early (:func:`start_writeback`) so that
fsync has little left to wait for. Nothing here knows what the files hold.
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["WriteBehind", "fsync_path", "holds_byte", "start_writeback"]


def write_all(fd: int, data: bytes | memoryview, offset: int | None = None) -> None:
    """Write all of ``data`` to ``fd``, at ``offset`` if given (else where the file
    stands): a write may take less than it is given, and the rest must follow it, not
    leave a gap (a full disk raises on the next write)."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view) if offset is None else os.pwrite(fd, view, offset)
        view = view[written:]
        if offset is not None:
            offset += written


def fsync_path(path: str) -> None:
    """Flush a file's data, or a directory's entries, to disk (by path: read-only opens
    serve both)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


#: sync_file_range(2)'s flag: start writing the range's dirty pages, do not wait.
_SYNC_FILE_RANGE_WRITE = 2


@functools.cache
def _c_library() -> ctypes.CDLL | None:
    """The process's C library, whose functions ctypes calls without the GIL; None where
    there is none to load."""
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


def _c_function(name: str, argtypes: list[Any], restype: Any) -> Any:
    """The C library's function ``name``, typed; None where it has none."""
    library = _c_library()
    call = getattr(library, name, None) if library is not None else None
    if call is None:
        return None
    call.argtypes = argtypes
    call.restype = restype
    return call


@functools.cache
def _sync_file_range() -> Callable[[int, int, int, int], int] | None:
    """Linux's ``sync_file_range`` from the C library (Python's ``os`` has no binding)."""
    if not sys.platform.startswith("linux"):
        return None
    return _c_function(
        "sync_file_range",
        [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint],
        ctypes.c_int,
    )


def start_writeback(fd: int, offset: int = 0, length: int = 0) -> bool:
    """Have the kernel start writing the dirty pages of ``length`` bytes of file ``fd``
    from ``offset`` (to its end if 0) to disk, without waiting for them; whether it was
    asked.

    A hint, not durability, which only fsync gives: a writer that starts the write-back of
    what it has written while it writes more finds less left to wait for in its fsync
    (as RocksDB's ``bytes_per_sync`` does). Where the system has no such call, or refuses
    it for this file, nothing happens.
    """
    call = _sync_file_range()
    return call is not None and call(fd, offset, length, _SYNC_FILE_RANGE_WRITE) == 0


@functools.cache
def _memchr() -> Callable[[int, int, int], int | None] | None:
    """The C library's ``memchr`` (called without the GIL); None where it has none."""
    return _c_function("memchr", [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t], ctypes.c_void_p)


def holds_byte(path: str, byte: int, chunk_bytes: int = 4 << 20) -> bool:
    """Whether the file at ``path`` holds ``byte`` anywhere: read in chunks, each
    searched by the C library's memchr (200 MB in the page cache: 15-25 ms), without the
    GIL throughout, so a caller may search a file while it waits for something else
    (such as Spark's JVM); by Python's find where there is no memchr. Read rather than
    mapped: a file cut short meanwhile is read short, where a mapping of it would fault."""
    memchr = _memchr()
    buffer = bytearray(chunk_bytes)
    chunk = (ctypes.c_char * chunk_bytes).from_buffer(buffer) if memchr is not None else None
    try:
        with open(path, "rb", buffering=0) as f:
            while read := f.readinto(buffer):
                if memchr is None or chunk is None:
                    found = buffer.find(byte, 0, read) >= 0
                else:
                    found = memchr(ctypes.addressof(chunk), byte, read) is not None
                if found:
                    return True
        return False
    finally:
        del chunk  # the buffer is released only once nothing points into it


class WriteBehind:
    """While a job (Spark's) writes files under ``folder``, have the kernel start writing
    their pages to disk every ``interval`` seconds, so that the fsync before a commit
    waits only for what was written last, not for all of it after the job.

    Spark's writers never flush to disk; the kernel would otherwise hold a job's output
    in memory until the fsync, and write it all then. ``wanted`` says which files (by
    name) are worth it: a part that will be copied into another is not.

    What the fsync still waits for is what was written since the last pass: at most
    ``interval`` of the job's writing. A DirectorySink's text write of 2,000,000 lines
    (200 MB) took 0.354 s with passes every 10 ms, 0.360 s every 20 ms and 0.391 s every
    50 ms, flushed included (medians of 18, in turns, in one process). A pass that finds
    nothing new to write back costs some 0.06 ms; the rest of a pass's cost is the
    write-back itself, which the fsync would otherwise start.
    """

    def __init__(self, folder: str, wanted: Callable[[str], bool], interval: float = 0.01) -> None:
        self.folder = folder
        self.wanted = wanted
        self.interval = interval
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="herder-write-behind", daemon=True)

    def __enter__(self) -> WriteBehind:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._done.wait(self.interval):
            for folder, _, names in os.walk(self.folder):
                for name in names:
                    if not self.wanted(name):
                        continue
                    try:  # the job's committer may have moved it meanwhile: next time
                        fd = os.open(os.path.join(folder, name), os.O_RDONLY)
                    except OSError:
                        continue
                    try:
                        start_writeback(fd)
                    finally:
                        os.close(fd)
