"""Snapshot files: a state machine's serialised state as of one zxid.

A snapshot is written to ``snapshot.<hex zxid>.tmp``, fsync'd, renamed into place and
its directory fsync'd, so a crash leaves either no snapshot or a complete one under its
final name. The file still carries a header and a CRC32C trailer, because disks rot and
half-copied directories happen: a snapshot that fails its check is skipped in favour of
an older one (the log is kept long enough to replay from there).

Layout: ``magic "HSNP" | version u16 | flags u16 | zxid u64 | length u64 | payload |
crc32c u32`` over everything before it, big-endian.

The one flag, ``INSTALLED``, marks a snapshot received from a leader (Zab's SNAP): the
history before it is not this server's any more, so nothing older may ever be combined
with what follows it, even if the server crashed before deleting the old files.
"""

from __future__ import annotations

import logging
import os
import struct
from typing import NamedTuple

import google_crc32c

from herder.ensemble.storage.files import FileSystem, read_all
from herder.ensemble.storage.txnlog import parse_zxid_name

log = logging.getLogger(__name__)

SNAPSHOT_PREFIX = "snapshot."
TEMPORARY_SUFFIX = ".tmp"
_MAGIC = b"HSNP"
_VERSION = 1
_HEADER = struct.Struct(">4sHHQQ")
_TRAILER = struct.Struct(">I")
#: flag: a leader's snapshot that replaced this server's whole history
INSTALLED = 1


class Snapshot(NamedTuple):
    """State as of ``zxid`` (every transaction up to it applied), opaque to storage."""

    zxid: int
    payload: bytes


def encode_snapshot(zxid: int, payload: bytes, flags: int = 0) -> tuple[bytes, bytes]:
    """The header and trailer that go around ``payload`` (no copy of the payload)."""
    header = _HEADER.pack(_MAGIC, _VERSION, flags, zxid, len(payload))
    crc = google_crc32c.extend(google_crc32c.value(header), payload)
    return header, _TRAILER.pack(crc)


def decode_snapshot(data: bytes, zxid: int) -> tuple[Snapshot, int]:
    """The snapshot in ``data`` and its flags; ValueError saying what is wrong if invalid."""
    if len(data) < _HEADER.size + _TRAILER.size:
        raise ValueError(f"only {len(data)} bytes")
    magic, version, flags, stored_zxid, length = _HEADER.unpack_from(data)
    if magic != _MAGIC:
        raise ValueError(f"not a snapshot (magic {magic!r})")
    if version != _VERSION:
        raise ValueError(f"unknown snapshot format version {version}")
    if stored_zxid != zxid:
        raise ValueError(f"holds zxid {stored_zxid:#x}, not the {zxid:#x} of its name")
    end = _HEADER.size + length
    if end + _TRAILER.size != len(data):
        raise ValueError(f"{len(data)} bytes where the header promises {end + _TRAILER.size}")
    (crc,) = _TRAILER.unpack_from(data, end)
    if google_crc32c.value(data[:end]) != crc:
        raise ValueError("checksum mismatch")
    return Snapshot(zxid, data[_HEADER.size : end]), flags


class SnapshotStore:
    """The snapshots in one directory. Remembers which ones it has checked."""

    def __init__(self, fs: FileSystem, directory: str) -> None:
        self._fs = fs
        self.directory = directory
        self._valid: dict[int, bool] = {}
        self._installed: set[int] = set()
        self.bytes_written = 0

    def path(self, zxid: int) -> str:
        return os.path.join(self.directory, f"{SNAPSHOT_PREFIX}{zxid:x}")

    def zxids(self) -> list[int]:
        """The zxids of the snapshot files present, valid or not, oldest first."""
        found = (
            parse_zxid_name(name, SNAPSHOT_PREFIX) for name in self._fs.listdir(self.directory)
        )
        return sorted(z for z in found if z is not None)

    def remove_temporaries(self) -> None:
        """Delete half-written snapshots left by a crash."""
        for name in self._fs.listdir(self.directory):
            if name.startswith(SNAPSHOT_PREFIX) and name.endswith(TEMPORARY_SUFFIX):
                self._fs.remove(os.path.join(self.directory, name))

    def load(self, zxid: int) -> Snapshot | None:
        """The snapshot at ``zxid``, or None (with a warning) if its file is damaged."""
        try:
            snapshot, flags = decode_snapshot(read_all(self._fs, self.path(zxid)), zxid)
        except ValueError as exc:
            log.warning("%s: skipping a damaged snapshot: %s", self.path(zxid), exc)
            self._valid[zxid] = False
            return None
        self._valid[zxid] = True
        if flags & INSTALLED:
            self._installed.add(zxid)
        return snapshot

    def newest_valid(self, at_most: int | None = None) -> Snapshot | None:
        """The newest snapshot that passes its check (at or below ``at_most``)."""
        for zxid in reversed(self.zxids()):
            if (at_most is None or zxid <= at_most) and self._valid.get(zxid, True):
                snapshot = self.load(zxid)
                if snapshot is not None:
                    return snapshot
        return None

    def valid_zxids(self) -> list[int]:
        """Zxids of the snapshots that pass their check, oldest first."""
        return [z for z in self.zxids() if self.is_valid(z)]

    def is_installed(self, zxid: int) -> bool:
        """Whether the (loaded or written) snapshot at ``zxid`` came from a leader."""
        return zxid in self._installed

    def is_valid(self, zxid: int) -> bool:
        if zxid not in self._valid:
            self.load(zxid)
        return self._valid[zxid]

    def write(self, zxid: int, payload: bytes, *, installed: bool = False) -> None:
        """Write the snapshot durably under its final name (temp file, fsync, rename)."""
        final = self.path(zxid)
        temporary = final + TEMPORARY_SUFFIX
        header, trailer = encode_snapshot(zxid, payload, INSTALLED if installed else 0)
        handle = self._fs.open(temporary, create=True)
        try:
            handle.truncate(0)
            handle.pwrite(header, 0)
            handle.pwrite(payload, len(header))
            handle.pwrite(trailer, len(header) + len(payload))
            handle.fsync()
        finally:
            handle.close()
        self._fs.rename(temporary, final)
        self._fs.fsync_dir(self.directory)
        self._valid[zxid] = True
        if installed:
            self._installed.add(zxid)
        self.bytes_written += len(header) + len(payload) + len(trailer)

    def remove(self, zxid: int) -> str:
        """Delete one snapshot (durable only after the caller's ``fsync_dir``)."""
        path = self.path(zxid)
        self._fs.remove(path)
        self._valid.pop(zxid, None)
        self._installed.discard(zxid)
        return path
