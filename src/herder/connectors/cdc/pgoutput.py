"""PostgreSQL's ``pgoutput`` logical decoding messages (protocol version 1), decoded.

The replication slot hands out one binary message per row of
``pg_logical_slot_peek_binary_changes``: Begin, Relation (a table's columns, sent before
the first change of a table in a session and again after its columns change), Type,
Insert, Update, Delete, Truncate, Origin and Commit. This module turns their bytes into
plain values; it does no IO, so every message layout is testable on its own.

Column values arrive as PostgreSQL's text output (``'t'``, ``'2024-01-01 00:00:03'``);
:mod:`.values` turns them into typed values.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from herder.errors import HerderError

#: Microseconds from the Unix epoch to PostgreSQL's (2000-01-01 00:00:00 UTC).
PG_EPOCH_MICROS = 946_684_800_000_000

#: Marks a column whose TOASTed value did not change and was not sent.
UNCHANGED = object()


class DecodingError(HerderError):
    """A pgoutput message that does not parse: a bug, or a protocol this does not read."""


@dataclass(frozen=True)
class Begin:
    final_lsn: int
    commit_micros: int  # since the Unix epoch
    xid: int


@dataclass(frozen=True)
class Commit:
    lsn: int
    end_lsn: int
    commit_micros: int


@dataclass(frozen=True)
class RelationColumn:
    name: str
    type_oid: int
    typmod: int
    #: part of the replica identity (the primary key, by default)
    key: bool


@dataclass(frozen=True)
class Relation:
    oid: int
    schema: str
    name: str
    #: ``d`` default (primary key), ``n`` nothing, ``f`` full, ``i`` an index
    replica_identity: str
    columns: tuple[RelationColumn, ...]


@dataclass(frozen=True)
class TypeInfo:
    oid: int
    schema: str
    name: str


#: A row's values in column order: text, None for NULL, or :data:`UNCHANGED`.
Tuple = tuple[object, ...]


@dataclass(frozen=True)
class Insert:
    relation: int
    new: Tuple


@dataclass(frozen=True)
class Update:
    relation: int
    new: Tuple
    #: the old row: its key columns (``K``, when the key changed), the whole row
    #: (``O``, with REPLICA IDENTITY FULL), or None
    old: Tuple | None
    old_kind: str | None


@dataclass(frozen=True)
class Delete:
    relation: int
    old: Tuple
    old_kind: str


@dataclass(frozen=True)
class Truncate:
    relations: tuple[int, ...]
    cascade: bool
    restart_identity: bool


@dataclass(frozen=True)
class Origin:
    lsn: int
    name: str


Message = Begin | Commit | Relation | TypeInfo | Insert | Update | Delete | Truncate | Origin


_STRUCTS: dict[str, struct.Struct] = {}


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.at = 0

    def take(self, fmt: str) -> int:
        layout = _STRUCTS.get(fmt)
        if layout is None:
            layout = _STRUCTS[fmt] = struct.Struct(fmt)
        if self.at + layout.size > len(self.data):
            raise DecodingError(f"pgoutput message cut short at byte {self.at}")
        (value,) = layout.unpack_from(self.data, self.at)
        self.at += layout.size
        return int(value)

    def byte(self) -> str:
        if self.at >= len(self.data):
            raise DecodingError(f"pgoutput message cut short at byte {self.at}")
        self.at += 1
        return chr(self.data[self.at - 1])

    def string(self) -> str:
        end = self.data.find(b"\0", self.at)
        if end < 0:
            raise DecodingError("pgoutput string without its terminating NUL")
        text = self.data[self.at : end].decode()
        self.at = end + 1
        return text

    def tuple(self) -> Tuple:
        data = self.data
        values: list[object] = []
        at = self.at
        try:
            (count,) = _COUNT.unpack_from(data, at)
            at += 2
            for _ in range(count):
                kind = data[at]
                at += 1
                if kind == 0x6E:  # n
                    values.append(None)
                elif kind == 0x75:  # u
                    values.append(UNCHANGED)
                elif kind == 0x74:  # t
                    (size,) = _LENGTH.unpack_from(data, at)
                    at += 4
                    if at + size > len(data):
                        raise DecodingError(f"pgoutput value cut short at byte {at}")
                    values.append(data[at : at + size].decode())
                    at += size
                else:
                    raise DecodingError(
                        f"pgoutput column of kind {chr(kind)!r} (binary mode is not used)"
                    )
        except (IndexError, struct.error) as exc:
            raise DecodingError(f"pgoutput tuple cut short at byte {at}") from exc
        self.at = at
        return tuple(values)


_COUNT = struct.Struct("!H")
_LENGTH = struct.Struct("!i")


def decode(data: bytes) -> Message:
    """One pgoutput message."""
    if not data:
        raise DecodingError("empty pgoutput message")
    r = _Reader(data)
    tag = r.byte()
    if tag == "B":
        return Begin(r.take("!Q"), r.take("!q") + PG_EPOCH_MICROS, r.take("!I"))
    if tag == "C":
        r.take("!B")  # flags, unused
        return Commit(r.take("!Q"), r.take("!Q"), r.take("!q") + PG_EPOCH_MICROS)
    if tag == "R":
        oid, schema, name, identity = r.take("!I"), r.string(), r.string(), r.byte()
        columns = []
        for _ in range(r.take("!H")):
            flags = r.take("!B")
            columns.append(
                RelationColumn(r.string(), r.take("!I"), r.take("!i"), key=bool(flags & 1))
            )
        return Relation(oid, schema, name, identity, tuple(columns))
    if tag == "Y":
        return TypeInfo(r.take("!I"), r.string(), r.string())
    if tag == "I":
        relation = r.take("!I")
        if r.byte() != "N":
            raise DecodingError("pgoutput Insert without its new tuple")
        return Insert(relation, r.tuple())
    if tag == "U":
        relation = r.take("!I")
        kind = r.byte()
        old, old_kind = None, None
        if kind in ("K", "O"):
            old, old_kind = r.tuple(), kind
            kind = r.byte()
        if kind != "N":
            raise DecodingError("pgoutput Update without its new tuple")
        return Update(relation, r.tuple(), old, old_kind)
    if tag == "D":
        relation = r.take("!I")
        kind = r.byte()
        if kind not in ("K", "O"):
            raise DecodingError("pgoutput Delete without its old tuple")
        return Delete(relation, r.tuple(), kind)
    if tag == "T":
        count = r.take("!I")
        options = r.take("!B")
        relations = tuple(r.take("!I") for _ in range(count))
        return Truncate(relations, bool(options & 1), bool(options & 2))
    if tag == "O":
        return Origin(r.take("!Q"), r.string())
    raise DecodingError(f"pgoutput message of unknown type {tag!r}")


def parse_lsn(text: str) -> int:
    """``'16/B374D848'`` as the 64-bit position it writes."""
    high, _, low = text.partition("/")
    return (int(high, 16) << 32) | int(low, 16)


def format_lsn(lsn: int) -> str:
    """A 64-bit position as PostgreSQL writes it: ``'16/B374D848'``."""
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"
