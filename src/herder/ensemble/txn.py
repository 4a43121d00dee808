"""Transactions: the only way the ensemble's state changes.

A transaction travels from a client to the leader, from the leader to every follower in
a PROPOSAL, and into each server's transaction log; then every server applies it to its
:class:`~herder.ensemble.state.StateMachine`. Because the same bytes are decoded and
applied everywhere, everything a transaction's outcome depends on — its zxid, its
timestamp, its session — is written *in* the transaction rather than read from the
applying server.

The shapes are ``msgspec`` structs encoded as MessagePack arrays in tagged unions: the
first element is a small integer tag and field names are never written, so a typical
append costs a few bytes of framing over its key and value. Tags and field order are
part of the stored format: never renumber or reorder, only add new kinds (or new fields
with defaults, at the end).
"""

from __future__ import annotations

from typing import TypeAlias

import msgspec

from herder.errors import ErrorCode, error_from_code

# --- zxids -------------------------------------------------------------------------------

_COUNTER_BITS = 32
_COUNTER_MASK = (1 << _COUNTER_BITS) - 1


def make_zxid(epoch: int, counter: int) -> int:
    """The zxid of the ``counter``-th transaction a leader of ``epoch`` proposes.

    As in ZooKeeper, the epoch sits in the high 32 bits so that every transaction of a
    newer leader orders after every transaction of an older one.
    """
    if not 0 <= epoch <= _COUNTER_MASK or not 0 <= counter <= _COUNTER_MASK:
        raise ValueError(f"epoch {epoch} and counter {counter} must each fit in 32 bits")
    return epoch << _COUNTER_BITS | counter


def zxid_epoch(zxid: int) -> int:
    """The epoch of the leader that proposed ``zxid``."""
    return zxid >> _COUNTER_BITS


def zxid_counter(zxid: int) -> int:
    """The position of ``zxid`` within its epoch."""
    return zxid & _COUNTER_MASK


def format_zxid(zxid: int) -> str:
    """``zxid`` as ZooKeeper prints it (``0x100000003``), for logs and messages."""
    return f"{zxid:#x}"


# --- operations of a write transaction --------------------------------------------------


class _Op(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """Base of the operations a :class:`WriteTxn` carries (not itself an operation)."""


class CreateLog(_Op, tag=1, frozen=True):
    """Create a log. With ``if_absent`` an existing log of the same kind is not an error."""

    name: str
    compacted: bool = False
    if_absent: bool = False


class DeleteLog(_Op, tag=2, frozen=True):
    """Delete a log and every record in it."""

    name: str


class Append(_Op, tag=3, frozen=True):
    """Append one record to a log.

    In a compacted log the record replaces the key's previous one and a ``None`` value
    deletes the key. ``owned`` ties the record to the writing session: when the session
    closes or expires the key is deleted (ZooKeeper's ephemeral nodes); only compacted
    logs have keys to own.
    """

    log: str
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]] = []
    owned: bool = False


class CheckEndOffset(_Op, tag=4, frozen=True):
    """Go on only if the log's end offset (the offset the next record gets) is ``end_offset``."""

    log: str
    end_offset: int


class CheckKeyVersion(_Op, tag=5, frozen=True):
    """Go on only if ``key`` was last written at ``zxid`` (``None``: absent or deleted).

    ZooKeeper's version check: a read-modify-write that lost a race is refused.
    """

    log: str
    key: bytes
    zxid: int | None


class CheckKeyValue(_Op, tag=6, frozen=True):
    """Go on only if ``key``'s current value is ``value`` (``None``: absent or deleted).

    Fencing uses this: a writer checks that the epoch it holds is still the stored one.
    """

    log: str
    key: bytes
    value: bytes | None


Op: TypeAlias = CreateLog | DeleteLog | Append | CheckEndOffset | CheckKeyVersion | CheckKeyValue


# --- transactions ------------------------------------------------------------------------


class TxnHeader(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """What every transaction carries: where it sits, when, and on whose behalf.

    ``timestamp_ms`` is the leader's clock when it proposed the transaction; it becomes
    the timestamp of every record the transaction writes. ``(session_id, seq)`` makes a
    client's write idempotent; transactions the leader proposes on its own leave them 0.
    ``origin`` lets the server a write arrived at recognise it when it commits.
    """

    zxid: int
    timestamp_ms: int
    session_id: int = 0
    seq: int = 0
    #: on a replicated ensemble, the server and request it came from (to answer it)
    origin: int = 0


class _Txn(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """Base of the transaction kinds (not itself a transaction)."""

    header: TxnHeader


class WriteTxn(_Txn, tag=1, frozen=True):
    """A client's write: ``ops`` all take effect at ``header.zxid``, or none does."""

    ops: list[Op]


class CreateSession(_Txn, tag=2, frozen=True):
    """Open a session; its id was chosen by the leader's :class:`SessionIdAllocator`."""

    session_id: int
    timeout_ms: int


class CloseSession(_Txn, tag=3, frozen=True):
    """A client closes its session; the keys it owns are deleted."""

    session_id: int


class ExpireSessions(_Txn, tag=4, frozen=True):
    """The leader's session tracker saw these sessions go silent; their keys are deleted."""

    session_ids: list[int]


class Noop(_Txn, tag=5, frozen=True):
    """A new leader's first transaction, committing its epoch before any client write."""


Txn: TypeAlias = WriteTxn | CreateSession | CloseSession | ExpireSessions | Noop

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Txn)


def encode_txn(txn: Txn) -> bytes:
    """``txn`` as the bytes that go into a PROPOSAL and the transaction log."""
    return _encoder.encode(txn)


def decode_txn(data: bytes) -> Txn:
    """The transaction ``data`` holds; raises ``msgspec.DecodeError`` if it holds none."""
    return _decoder.decode(data)


# --- what applying a transaction gives back ---------------------------------------------


class TxnResult(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """The outcome of one transaction, the same on every server.

    ``zxid`` is the transaction that decided it: for a retried write, the first attempt's.
    ``failed_op`` is the index of the operation that refused a write, or -1. On success
    ``offsets`` has one entry per operation of a :class:`WriteTxn`: the offset its record
    got for an :class:`Append`, -1 for any other operation; it is empty otherwise.
    """

    zxid: int
    error_code: int
    message: str = ""
    failed_op: int = -1
    offsets: list[int] = []

    @property
    def ok(self) -> bool:
        return self.error_code == ErrorCode.NONE

    def raise_for_error(self) -> None:
        """Raise the :class:`~herder.errors.HerderError` this result stands for, if any."""
        if self.error_code != ErrorCode.NONE:
            raise error_from_code(self.error_code, self.message)


class Record(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """One record of a log, as readers see it.

    ``zxid`` is the transaction that wrote it (a key's *version*); ``owner_session`` is
    the session whose end deletes it, or 0. A record with ``value is None`` in a
    compacted log is a tombstone: the key was deleted at ``zxid``.
    """

    offset: int
    key: bytes | None
    value: bytes | None
    #: a tuple, so a stored record holds no container the garbage collector must track
    headers: tuple[tuple[str, bytes], ...]
    timestamp_ms: int
    zxid: int
    owner_session: int = 0
