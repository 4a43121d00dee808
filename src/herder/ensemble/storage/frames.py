"""Transaction-log records: their framing, and the scan that tells a torn tail from rot.

A record is framed as::

    length u32 | crc32c u32 | zxid u64 | payload
    `length` counts zxid + payload, the crc covers zxid + payload (big-endian)

``length`` is never zero (it includes the 8-byte zxid), so in a preallocated file the
first zero length marks the end of the data.

A bad frame can mean two very different things. If nothing valid follows it, it is the
last write before a crash, never fsync'd and so never acknowledged: dropping it is safe
(a *torn* tail). If a valid frame follows it, the damage hit data that was synced and
possibly acknowledged: that is corruption, and silently dropping it would lose committed
transactions. :func:`scan` reports which of the two it found; the caller decides.
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

import google_crc32c

HEADER = struct.Struct(">IIQ")
#: bytes before the payload: length, crc, zxid
HEADER_SIZE = HEADER.size
_ZXID = struct.Struct(">Q")
_ZXID_SIZE = _ZXID.size
#: the bytes a frame's length does not count
_LENGTH_AND_CRC = HEADER_SIZE - _ZXID_SIZE


class Txn(NamedTuple):
    """One logged transaction; storage never looks inside ``payload``."""

    zxid: int
    payload: bytes


def encode(zxid: int, payload: bytes) -> bytes:
    """The framed record for ``(zxid, payload)``."""
    crc = google_crc32c.value(_ZXID.pack(zxid) + payload)
    return HEADER.pack(_ZXID_SIZE + len(payload), crc, zxid) + payload


def zxid_of(frame: bytes) -> int:
    """The zxid in an encoded frame (without decoding the rest)."""
    return HEADER.unpack_from(frame)[2]


@dataclass(frozen=True, slots=True)
class Damage:
    """A bad spot in a log file."""

    offset: int
    reason: str
    #: False when nothing valid follows: a torn, never-acknowledged tail
    followed_by_valid: bool


@dataclass(slots=True)
class Scan:
    txns: list[Txn]
    #: offset just past the last good record: where the next record goes
    end: int
    last_zxid: int
    damage: Damage | None = None


def _check(data: bytes, pos: int) -> tuple[int, int, str | None]:
    """``(zxid, end, problem)`` for the frame at ``pos``; ``problem`` None if it is intact."""
    length, crc, zxid = HEADER.unpack_from(data, pos)
    end = pos + _LENGTH_AND_CRC + length
    if length < _ZXID_SIZE:
        return zxid, end, f"impossible record length {length}"
    if end > len(data):
        return zxid, end, "incomplete record"
    if google_crc32c.value(data[pos + _LENGTH_AND_CRC : end]) != crc:
        return zxid, end, "checksum mismatch"
    return zxid, end, None


def _valid_frame_after(data: bytes, damaged: int, claimed_end: int, after_zxid: int) -> bool:
    """Whether an intact frame with a zxid above ``after_zxid`` starts past ``damaged``.

    A stray match needs a plausible length, a larger zxid *and* a matching CRC32C, so a
    false positive is practically impossible. The damaged frame's own claimed end is
    tried first, which finds the next record at once when only a payload byte rotted;
    the byte-by-byte search after it only runs on a damaged file.
    """
    limit = len(data.rstrip(b"\0")) - HEADER_SIZE
    candidates: Iterable[int] = range(damaged + 1, limit + 1)
    if damaged < claimed_end <= limit:
        candidates = itertools.chain([claimed_end], candidates)
    for pos in candidates:
        length, _, zxid = HEADER.unpack_from(data, pos)
        plausible = _ZXID_SIZE <= length <= len(data) - pos - _LENGTH_AND_CRC
        if plausible and zxid > after_zxid and _check(data, pos)[2] is None:
            return True
    return False


def bytes_after(data: bytes, zxid: int, until: int) -> int:
    """The framed bytes of the records above ``zxid`` (and at most ``until``) in ``data``.

    Headers only: no checksum is checked and no payload copied, so a leader can weigh
    a DIFF from its log against a SNAP for the price of a walk over the headers rather
    than of reading the records back. A bad length ends the walk (the read that follows
    a DIFF decision checks every record).
    """
    pos, size, total = 0, len(data), 0
    unpack = HEADER.unpack_from
    while pos + HEADER_SIZE <= size:
        length, _, record_zxid = unpack(data, pos)
        end = pos + _LENGTH_AND_CRC + length
        if length < _ZXID_SIZE or end > size or record_zxid > until:
            break
        if record_zxid > zxid:
            total += end - pos
        pos = end
    return total


def scan(data: bytes, after_zxid: int, *, until: int | None = None) -> Scan:
    """Decode the records in ``data`` (one log file's content).

    ``after_zxid`` is the zxid before the first record (records must increase from it).
    With ``until``, stop after the record with that zxid or before a larger one, without
    judging the bytes beyond: they may be being written right now. Any bad frame before
    ``until`` is then damage to synced data.
    """
    txns: list[Txn] = []
    pos, last, size = 0, after_zxid, len(data)
    problem: str | None = None
    out_of_order = False
    claimed_end = pos
    # _check, inlined with its names bound locally: a server reads its whole log through
    # this loop when it starts, before it can rejoin its ensemble
    unpack, crc32c, keep = HEADER.unpack_from, google_crc32c.value, txns.append
    while pos + HEADER_SIZE <= size and (until is None or last < until):
        length, crc, zxid = unpack(data, pos)
        if length == 0:
            break
        claimed_end = pos + _LENGTH_AND_CRC + length
        if length < _ZXID_SIZE:
            problem = f"impossible record length {length}"
        elif claimed_end > size:
            problem = "incomplete record"
        elif crc32c(data[pos + _LENGTH_AND_CRC : claimed_end]) != crc:
            problem = "checksum mismatch"
        elif zxid <= last:
            problem, out_of_order = f"zxid {zxid:#x} does not follow {last:#x}", True
        if problem is not None or (until is not None and zxid > until):
            break
        keep(Txn(zxid, data[pos + HEADER_SIZE : claimed_end]))
        last, pos = zxid, claimed_end
    if until is not None:
        damage = None if problem is None else Damage(pos, problem, followed_by_valid=True)
        return Scan(txns, pos, last, damage)
    if problem is None:
        if data.count(0, pos) == size - pos:
            return Scan(txns, pos, last)
        problem = "unexpected bytes after the last record"
    # an intact frame whose zxid goes backwards is no torn write: something wrote it
    followed = out_of_order or _valid_frame_after(data, pos, claimed_end, last)
    return Scan(txns, pos, last, Damage(pos, problem, followed))
