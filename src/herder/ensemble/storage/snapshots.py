"""Snapshot files: a state machine's serialised state as of one zxid.

A snapshot is written to ``snapshot.<hex zxid>.tmp``, fsync'd, renamed into place and
its directory fsync'd, so a crash leaves either no snapshot or a complete one under its
final name. The file still carries a header and a CRC32C trailer, because disks rot and
half-copied directories happen: a snapshot that fails its check is skipped in favour of
an older one (the log is kept long enough to replay from there).

Layout: ``magic "HSNP" | version u16 | flags u16 | zxid u64 | length u64 | payload |
crc32c u32`` over everything before it, big-endian.
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


class Snapshot(NamedTuple):
    """State as of ``zxid`` (every transaction up to it applied), opaque to storage."""

    zxid: int
    payload: bytes


def encode_snapshot(zxid: int, payload: bytes) -> tuple[bytes, bytes]:
    """The header and trailer that go around ``payload`` (no copy of the payload)."""
    header = _HEADER.pack(_MAGIC, _VERSION, 0, zxid, len(payload))
    crc = google_crc32c.extend(google_crc32c.value(header), payload)
    return header, _TRAILER.pack(crc)


def decode_snapshot(data: bytes, zxid: int) -> Snapshot:
    """The snapshot in ``data``; ValueError saying what is wrong if it is not valid."""
    if len(data) < _HEADER.size + _TRAILER.size:
        raise ValueError(f"only {len(data)} bytes")
    magic, version, _flags, stored_zxid, length = _HEADER.unpack_from(data)
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
    return Snapshot(zxid, data[_HEADER.size : end])


class SnapshotStore:
    """The snapshots in one directory. Remembers which ones it has checked."""

    def __init__(self, fs: FileSystem, directory: str) -> None:
        self._fs = fs
        self._dir = directory
        self._valid: dict[int, bool] = {}
        self.bytes_written = 0

    def path(self, zxid: int) -> str:
        return os.path.join(self._dir, f"{SNAPSHOT_PREFIX}{zxid:x}")

    def zxids(self) -> list[int]:
        """The zxids of the snapshot files present, valid or not, oldest first."""
        found = (parse_zxid_name(name, SNAPSHOT_PREFIX) for name in self._fs.listdir(self._dir))
        return sorted(z for z in found if z is not None)

    def remove_temporaries(self) -> None:
        """Delete half-written snapshots left by a crash."""
        for name in self._fs.listdir(self._dir):
            if name.startswith(SNAPSHOT_PREFIX) and name.endswith(TEMPORARY_SUFFIX):
                self._fs.remove(os.path.join(self._dir, name))

    def load(self, zxid: int) -> Snapshot | None:
        """The snapshot at ``zxid``, or None (with a warning) if its file is damaged."""
        try:
            snapshot = decode_snapshot(read_all(self._fs, self.path(zxid)), zxid)
        except ValueError as exc:
            log.warning("%s: skipping a damaged snapshot: %s", self.path(zxid), exc)
            self._valid[zxid] = False
            return None
        self._valid[zxid] = True
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

    def is_valid(self, zxid: int) -> bool:
        if zxid not in self._valid:
            self.load(zxid)
        return self._valid[zxid]

    def write(self, zxid: int, payload: bytes) -> None:
        """Write the snapshot durably under its final name (temp file, fsync, rename)."""
        final = self.path(zxid)
        temporary = final + TEMPORARY_SUFFIX
        header, trailer = encode_snapshot(zxid, payload)
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
        self._fs.fsync_dir(self._dir)
        self._valid[zxid] = True
        self.bytes_written += len(header) + len(payload) + len(trailer)

    def remove(self, zxid: int) -> str:
        """Delete one snapshot (durable only after the caller's ``fsync_dir``)."""
        path = self.path(zxid)
        self._fs.remove(path)
        self._valid.pop(zxid, None)
        return path
