"""The slot's messages gathered into whole transactions of row changes; text values typed.

:class:`TransactionAssembler` is fed pgoutput messages in the slot's order and gives
back each committed transaction whole, its changes in order, each change bound to the
table's columns as the last Relation message described them (so a change after an
``ALTER TABLE`` carries the new columns). :func:`typed_value` turns PostgreSQL's text
output of a column into the Python value of its Spark type. No IO here.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass, field
from decimal import Decimal
from typing import TYPE_CHECKING

from herder.connectors.cdc.pgoutput import (
    UNCHANGED,
    Begin,
    Commit,
    DecodingError,
    Delete,
    Insert,
    Message,
    Relation,
    Truncate,
    Tuple,
    Update,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from pyspark.sql.types import DataType

#: What Debezium puts in a text column whose unchanged TOASTed value was not sent.
UNAVAILABLE = "__debezium_unavailable_value"


@dataclass(frozen=True)
class Change:
    """One row change: ``op`` is ``c``, ``u``, ``d`` or ``t`` (truncate, no rows)."""

    relation: Relation
    op: str
    before: Tuple | None
    after: Tuple | None
    lsn: int


@dataclass
class Transaction:
    xid: int
    commit_micros: int
    #: the end of the commit record: the slot position once this transaction is done
    end_lsn: int = 0
    changes: list[Change] = field(default_factory=list)


class TransactionAssembler:
    """Whole transactions out of a stream of pgoutput messages."""

    def __init__(self) -> None:
        self.relations: dict[int, Relation] = {}
        self._open: Transaction | None = None

    def feed(self, lsn: int, message: Message) -> Transaction | None:
        """Take one message (at slot position ``lsn``); the transaction it commits, if any."""
        if isinstance(message, Relation):
            self.relations[message.oid] = message
            return None
        if isinstance(message, Begin):
            self._open = Transaction(message.xid, message.commit_micros)
            return None
        txn = self._open
        if isinstance(message, Commit):
            if txn is None:
                raise DecodingError("pgoutput Commit without its Begin")
            txn.end_lsn = message.end_lsn
            self._open = None
            return txn
        if txn is None:
            if isinstance(message, Insert | Update | Delete | Truncate):
                raise DecodingError("pgoutput change outside a transaction")
            return None
        if isinstance(message, Insert):
            txn.changes.append(
                Change(self._relation(message.relation), "c", None, message.new, lsn)
            )
        elif isinstance(message, Update):
            relation = self._relation(message.relation)
            old = message.old
            if old is not None and message.old_kind == "O":
                # REPLICA IDENTITY FULL: unchanged TOASTed values are in the old row
                new = tuple(
                    o if v is UNCHANGED else v for v, o in zip(message.new, old, strict=True)
                )
            else:
                new = message.new
            txn.changes.append(Change(relation, "u", old, new, lsn))
        elif isinstance(message, Delete):
            relation = self._relation(message.relation)
            txn.changes.append(Change(relation, "d", message.old, None, lsn))
        elif isinstance(message, Truncate):
            for oid in message.relations:
                txn.changes.append(Change(self._relation(oid), "t", None, None, lsn))
        return None

    def _relation(self, oid: int) -> Relation:
        relation = self.relations.get(oid)
        if relation is None:
            raise DecodingError(f"pgoutput change of relation {oid} before its Relation message")
        return relation


def key_changed(change: Change, key: tuple[str, ...]) -> bool:
    """Whether an update moved its row to another primary key (``key``'s columns): the
    old row came with it, and its key differs."""
    if change.op != "u" or change.before is None or change.after is None or not key:
        return False
    for column, old, new in zip(change.relation.columns, change.before, change.after, strict=True):
        if column.name in key and old is not UNCHANGED and old != new:
            return True
    return False


# -- text → typed values -----------------------------------------------------------------

_FLOATS = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def typed_value(text: object, dtype: DataType) -> object:
    """PostgreSQL's text output of a value as the Python value of Spark type ``dtype``."""
    return reader_of(dtype)(text)


def reader_of(dtype: DataType) -> Callable[[object], object]:
    """What turns PostgreSQL's text output of a value into the Python value of Spark type
    ``dtype`` (None for NULL): chosen once per column, used for every value."""
    from pyspark.sql import types as T

    parse: Callable[[str], object]
    if isinstance(dtype, T.ByteType | T.ShortType | T.IntegerType | T.LongType):
        parse = _integer
    elif isinstance(dtype, T.FloatType | T.DoubleType):
        parse = _float
    elif isinstance(dtype, T.BooleanType):
        parse = _boolean
    elif isinstance(dtype, T.StringType):
        parse = str
    elif isinstance(dtype, T.BinaryType):
        parse = _bytea
    elif isinstance(dtype, T.DecimalType):
        parse = Decimal
    elif isinstance(dtype, T.DateType):
        parse = dt.date.fromisoformat
    elif isinstance(dtype, T.TimestampNTZType):
        parse = dt.datetime.fromisoformat
    elif isinstance(dtype, T.TimestampType):
        parse = _zoned
    elif isinstance(dtype, T.ArrayType):
        item = reader_of(dtype.elementType)
        parse = lambda text: [item(v) for v in _array_items(text)]  # noqa: E731
    else:
        raise DecodingError(f"no text reading for Spark type {dtype.simpleString()}")
    unchanged = UNAVAILABLE if isinstance(dtype, T.StringType) else None

    def read(text: object) -> object:
        if text is None:
            return None
        if text is UNCHANGED:
            return unchanged
        return parse(text)  # type: ignore[arg-type]

    return read


def _integer(text: str) -> int:
    return int(text)


def _float(text: str) -> float:
    found = _FLOATS.get(text)
    return float(text) if found is None else found


def _boolean(text: str) -> bool:
    return text == "t"


def _bytea(text: str) -> bytes:
    return bytes.fromhex(text[2:])


def _zoned(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text).astimezone(dt.UTC)


def _array_items(text: str) -> list[str | None]:
    """The items of a one-dimensional array's text output: ``{1,NULL,"a,b"}``."""
    if not (text.startswith("{") and text.endswith("}")):
        raise DecodingError(f"not an array's text output: {text[:40]!r}")
    body = text[1:-1]
    items: list[str | None] = []
    at = 0
    while at < len(body):
        if body[at] == '"':
            out, at = [], at + 1
            while body[at] != '"':
                if body[at] == "\\":
                    at += 1
                out.append(body[at])
                at += 1
            items.append("".join(out))
            at += 2  # the closing quote and the comma
        else:
            end = body.find(",", at)
            end = len(body) if end < 0 else end
            word = body[at:end]
            if word.startswith("{"):
                raise DecodingError("arrays of more than one dimension are not supported")
            items.append(None if word == "NULL" else word)
            at = end + 1
    return items
