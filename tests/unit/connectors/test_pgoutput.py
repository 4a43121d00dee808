"""pgoutput's messages as PostgreSQL lays them out (protocol version 1), decoded; whole
transactions assembled from them; and PostgreSQL's text output of values typed."""

from __future__ import annotations

import datetime as dt
import struct
from decimal import Decimal

import pytest
from pyspark.sql import types as T

from herder.connectors.cdc.changes import (
    UNAVAILABLE,
    TransactionAssembler,
    key_changed,
    typed_value,
)
from herder.connectors.cdc.pgoutput import (
    PG_EPOCH_MICROS,
    UNCHANGED,
    Begin,
    Commit,
    DecodingError,
    Delete,
    Insert,
    Relation,
    Truncate,
    Update,
    decode,
    format_lsn,
    parse_lsn,
)

pytestmark = pytest.mark.unit


def text(s: str) -> bytes:
    return s.encode() + b"\0"


def tuple_data(*values: str | object | None) -> bytes:
    out = struct.pack("!H", len(values))
    for v in values:
        if v is None:
            out += b"n"
        elif v is UNCHANGED:
            out += b"u"
        else:
            data = str(v).encode()
            out += b"t" + struct.pack("!i", len(data)) + data
    return out


RELATION = (
    b"R" + struct.pack("!I", 16384) + text("public") + text("t") + b"d" + struct.pack("!H", 2)
    + b"\x01" + text("id") + struct.pack("!Ii", 23, -1)
    + b"\x00" + text("note") + struct.pack("!Ii", 25, -1)
)  # fmt: skip


def test_each_message_decodes() -> None:
    begin = decode(b"B" + struct.pack("!QqI", 0x16B6C50, 1_000_000, 727))
    assert begin == Begin(0x16B6C50, 1_000_000 + PG_EPOCH_MICROS, 727)
    commit = decode(b"C\0" + struct.pack("!QQq", 10, 20, 5))
    assert commit == Commit(10, 20, 5 + PG_EPOCH_MICROS)
    relation = decode(RELATION)
    assert isinstance(relation, Relation)
    assert (relation.schema, relation.name, relation.replica_identity) == ("public", "t", "d")
    assert [(c.name, c.type_oid, c.key) for c in relation.columns] == [
        ("id", 23, True),
        ("note", 25, False),
    ]
    insert = decode(b"I" + struct.pack("!I", 16384) + b"N" + tuple_data("1", None))
    assert insert == Insert(16384, ("1", None))
    update = decode(
        b"U" + struct.pack("!I", 16384) + b"K" + tuple_data("1", None)
        + b"N" + tuple_data("2", UNCHANGED)
    )  # fmt: skip
    assert update == Update(16384, ("2", UNCHANGED), ("1", None), "K")
    assert decode(b"D" + struct.pack("!I", 1) + b"O" + tuple_data("1", "x")) == Delete(
        1, ("1", "x"), "O"
    )
    assert decode(b"T" + struct.pack("!IB", 2, 3) + struct.pack("!II", 5, 6)) == Truncate(
        (5, 6), True, True
    )
    for bad in (b"", b"Z", b"I" + struct.pack("!I", 1) + b"N" + b"\x00"):
        with pytest.raises(DecodingError):
            decode(bad)


def test_transactions_come_whole_with_the_relation_they_were_made_under() -> None:
    assembler = TransactionAssembler()
    assert assembler.feed(1, decode(b"B" + struct.pack("!QqI", 30, 0, 9))) is None
    assert assembler.feed(1, decode(RELATION)) is None
    feed = [
        b"I" + struct.pack("!I", 16384) + b"N" + tuple_data("1", "a"),
        b"U" + struct.pack("!I", 16384) + b"K" + tuple_data("1", None)
        + b"N" + tuple_data("2", "a"),
        b"U" + struct.pack("!I", 16384) + b"N" + tuple_data("2", "b"),
    ]  # fmt: skip
    for lsn, message in enumerate(feed, start=2):
        assert assembler.feed(lsn, decode(message)) is None
    txn = assembler.feed(9, decode(b"C\0" + struct.pack("!QQq", 30, 40, 0)))
    assert txn is not None and txn.xid == 9 and txn.end_lsn == 40
    assert [(c.op, c.before, c.after, c.lsn) for c in txn.changes] == [
        ("c", None, ("1", "a"), 2),
        ("u", ("1", None), ("2", "a"), 3),
        ("u", None, ("2", "b"), 4),
    ]
    assert [key_changed(c, ("id",)) for c in txn.changes] == [False, True, False]
    assembler.feed(1, decode(b"B" + struct.pack("!QqI", 50, 0, 10)))
    with pytest.raises(DecodingError, match="before its Relation"):
        assembler.feed(2, decode(b"I" + struct.pack("!I", 999) + b"N" + tuple_data("1")))


def test_text_values_become_their_spark_types() -> None:
    assert typed_value("42", T.LongType()) == 42
    assert typed_value("NaN", T.DoubleType()) != typed_value("NaN", T.DoubleType())
    assert typed_value("-Infinity", T.FloatType()) == float("-inf")
    assert typed_value("t", T.BooleanType()) is True
    assert typed_value("\\x00ff", T.BinaryType()) == b"\x00\xff"
    assert typed_value("12.50", T.DecimalType(12, 2)) == Decimal("12.50")
    assert typed_value("2024-02-29", T.DateType()) == dt.date(2024, 2, 29)
    assert typed_value("2024-02-29 01:02:03.5", T.TimestampNTZType()) == dt.datetime(
        2024, 2, 29, 1, 2, 3, 500000
    )
    assert typed_value("2024-02-29 01:02:03+02", T.TimestampType()) == dt.datetime(
        2024, 2, 28, 23, 2, 3, tzinfo=dt.UTC
    )
    assert typed_value('{1,NULL,"a,\\"b"}', T.ArrayType(T.StringType())) == ["1", None, 'a,"b']
    assert typed_value("{}", T.ArrayType(T.IntegerType())) == []
    assert typed_value(UNCHANGED, T.StringType()) == UNAVAILABLE
    assert typed_value(UNCHANGED, T.IntegerType()) is None
    with pytest.raises(DecodingError, match="more than one dimension"):
        typed_value("{{1},{2}}", T.ArrayType(T.ArrayType(T.IntegerType())))


def test_lsn_text_round_trips() -> None:
    assert parse_lsn("16/B374D848") == 0x16B374D848
    assert format_lsn(0x16B374D848) == "16/B374D848"
    assert parse_lsn(format_lsn(0)) == 0
