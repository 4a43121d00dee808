"""The ensemble's replicated state machine: named logs of keyed records, and sessions.

Every server applies the same committed transactions, in zxid order, to its own
:class:`StateMachine`, and all of them must reach the same state and hand back the same
:class:`~herder.ensemble.txn.TxnResult`. So the machine decides everything from the
transaction alone: it reads no clock (a record's timestamp is its transaction's), draws
no random numbers and never lets hash order show (a closing session's keys are deleted
in sorted order). It does no IO either: the server persists transactions and snapshots
and rebuilds a machine with :meth:`StateMachine.restore` plus replay.

A *plain* log keeps every record. A *compacted* log keeps the latest record of each key;
a record with a ``None`` value (a tombstone) deletes its key but is itself kept for
:data:`TOMBSTONE_RETENTION_MS` of transaction time, so a reader tailing the log sees the
delete. Offsets never change and the end offset only grows.
"""

from __future__ import annotations

import hashlib
import heapq
import re
from bisect import bisect_left
from collections import OrderedDict
from typing import assert_never

import msgspec

from herder.ensemble.txn import (
    Append,
    CheckEndOffset,
    CheckKeyValue,
    CheckKeyVersion,
    CloseSession,
    CreateLog,
    CreateSession,
    DeleteLog,
    ExpireSessions,
    Noop,
    Op,
    Record,
    Txn,
    TxnHeader,
    TxnResult,
    WriteTxn,
    format_zxid,
)
from herder.errors import CorruptStorage, ErrorCode, ProtocolError, UnknownLog

#: results remembered per session, so a retried write gets its first answer
RESULT_WINDOW = 128
#: how long (in transaction time) a compacted log keeps a tombstone for its tailers
TOMBSTONE_RETENTION_MS = 24 * 60 * 60 * 1000
#: ended sessions remembered, so a late write learns "expired" rather than "unknown"
ENDED_SESSIONS_REMEMBERED = 1024

_SNAPSHOT_VERSION = 1
_LOG_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")
_OK = int(ErrorCode.NONE)


class LogInfo(msgspec.Struct, frozen=True):
    """What :meth:`StateMachine.describe` tells about a log.

    ``start_offset`` is the lowest offset a read can still return (a compacted log's
    first retained record); ``records`` is how many records a read from it returns,
    tombstones included; ``size_bytes`` sums their keys, values and headers.
    """

    name: str
    compacted: bool
    start_offset: int
    end_offset: int
    records: int
    size_bytes: int
    created_zxid: int
    last_zxid: int


class SessionInfo(msgspec.Struct, frozen=True):
    """An open session as the replicated state knows it (liveness is the leader's business)."""

    session_id: int
    timeout_ms: int
    created_zxid: int
    last_seq: int
    owned_keys: int


def _frozen(headers: list[tuple[str, bytes]]) -> tuple[tuple[str, bytes], ...]:
    # () is a shared constant: the common headerless record adds nothing for gc to scan
    return tuple(headers) if headers else ()


def _size(rec: Record) -> int:
    size = len(rec.key) if rec.key is not None else 0
    if rec.value is not None:
        size += len(rec.value)
    for name, value in rec.headers:
        size += len(name.encode()) + len(value)
    return size


def _limit(records: list[Record], max_bytes: int | None) -> list[Record]:
    """Cut ``records`` at ``max_bytes``, keeping at least one so a reader always progresses."""
    if max_bytes is None:
        return records
    total = 0
    for i, rec in enumerate(records):
        total += _size(rec)
        if total > max_bytes and i > 0:
            return records[:i]
    return records


class _PlainLog:
    """A log that keeps every record: the record at offset n is ``records[n]``."""

    __slots__ = ("created_zxid", "last_zxid", "name", "records", "size_bytes")
    compacted = False

    def __init__(self, name: str, created_zxid: int) -> None:
        self.name = name
        self.created_zxid = created_zxid
        self.last_zxid = created_zxid
        self.records: list[Record] = []
        self.size_bytes = 0

    @property
    def end_offset(self) -> int:
        return len(self.records)

    @property
    def start_offset(self) -> int:
        return 0

    def append(self, rec: Record) -> None:
        self.records.append(rec)
        self.size_bytes += _size(rec)

    def read(self, from_offset: int, max_records: int, max_bytes: int | None) -> list[Record]:
        return _limit(self.records[from_offset : from_offset + max_records], max_bytes)

    def retained(self) -> list[Record]:
        return self.records


class _CompactedLog:
    """A log that keeps only the latest record of each key.

    ``latest`` answers key lookups and ``by_offset`` holds the same records by offset
    (in offset order, since offsets only grow). ``offsets`` lists offsets in order so a
    read from any offset starts with a bisect instead of a scan. A superseded record
    leaves its offset behind in ``offsets`` — removing it from the middle of a list would
    cost O(n) per write — reads skip such offsets, and the list is rebuilt once they
    outnumber the live ones, so reads stay proportional to what they return.
    """

    __slots__ = (
        "by_offset",
        "created_zxid",
        "end_offset",
        "last_zxid",
        "latest",
        "name",
        "offsets",
        "size_bytes",
        "stale",
    )
    compacted = True

    def __init__(self, name: str, created_zxid: int) -> None:
        self.name = name
        self.created_zxid = created_zxid
        self.last_zxid = created_zxid
        self.end_offset = 0
        self.size_bytes = 0
        self.latest: dict[bytes, Record] = {}
        self.by_offset: dict[int, Record] = {}
        self.offsets: list[int] = []
        self.stale = 0

    @property
    def start_offset(self) -> int:
        return next(iter(self.by_offset), self.end_offset)

    def put(self, key: bytes, rec: Record) -> Record | None:
        """Make ``rec`` the latest record of ``key``; returns the record it replaces."""
        prev = self.latest.get(key)
        if prev is not None:
            self._drop(prev)
        self.latest[key] = rec
        self.by_offset[rec.offset] = rec
        self.offsets.append(rec.offset)
        self.end_offset = rec.offset + 1
        self.size_bytes += _size(rec)
        return prev

    def discard_tombstone(self, key: bytes, offset: int, zxid: int) -> None:
        """Forget the tombstone of ``key`` written at (offset, zxid), if it is still the latest."""
        rec = self.latest.get(key)
        if rec is not None and rec.value is None and rec.offset == offset and rec.zxid == zxid:
            del self.latest[key]
            self._drop(rec)

    def _drop(self, rec: Record) -> None:
        del self.by_offset[rec.offset]
        self.size_bytes -= _size(rec)
        self.stale += 1
        if self.stale > 64 and self.stale > len(self.by_offset):
            self.offsets = list(self.by_offset)
            self.stale = 0

    def read(self, from_offset: int, max_records: int, max_bytes: int | None) -> list[Record]:
        offsets, by_offset = self.offsets, self.by_offset
        out: list[Record] = []
        i, n = bisect_left(offsets, from_offset), len(offsets)
        while i < n and len(out) < max_records:
            rec = by_offset.get(offsets[i])
            i += 1
            if rec is not None:
                out.append(rec)
        return _limit(out, max_bytes)

    def retained(self) -> list[Record]:
        return list(self.by_offset.values())


_Log = _PlainLog | _CompactedLog


class _Session:
    """An open session: its idempotency window and the compacted keys it owns."""

    __slots__ = ("created_zxid", "last_seq", "owned", "results", "session_id", "timeout_ms")

    def __init__(self, session_id: int, timeout_ms: int, created_zxid: int) -> None:
        self.session_id = session_id
        self.timeout_ms = timeout_ms
        self.created_zxid = created_zxid
        self.last_seq = 0
        self.results: OrderedDict[int, TxnResult] = OrderedDict()
        self.owned: set[tuple[str, bytes]] = set()


class _Staged:
    """A log as the operations checked so far in one transaction would leave it.

    Operations run in order and each sees the effects of the earlier ones (create a log,
    then append to it), yet nothing may change unless all of them pass; so a transaction
    is first checked against this small overlay, and only then applied.
    """

    __slots__ = ("compacted", "end_offset", "fresh", "keys")

    def __init__(self, compacted: bool, end_offset: int, fresh: bool) -> None:
        self.compacted = compacted
        self.end_offset = end_offset
        self.fresh = fresh  # created by this transaction: nothing to look up underneath
        self.keys: dict[bytes, bytes | None] = {}


class _Refusal(Exception):
    """Why an operation refuses its transaction (internal: becomes a TxnResult)."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class _LogImage(msgspec.Struct, array_like=True, gc=False):
    name: str
    compacted: bool
    created_zxid: int
    last_zxid: int
    end_offset: int
    records: list[Record]


class _SessionImage(msgspec.Struct, array_like=True, gc=False):
    session_id: int
    timeout_ms: int
    created_zxid: int
    last_seq: int
    results: list[tuple[int, TxnResult]]


class _Image(msgspec.Struct, array_like=True, gc=False):
    version: int
    last_zxid: int
    logs: list[_LogImage]
    sessions: list[_SessionImage]
    ended: list[tuple[int, bool]]


_image_encoder = msgspec.msgpack.Encoder()
_image_decoder = msgspec.msgpack.Decoder(_Image)


def _refused(zxid: int, code: ErrorCode, message: str, failed_op: int = -1) -> TxnResult:
    return TxnResult(zxid, int(code), message, failed_op)


def _show(data: bytes | None) -> str:
    if data is None:
        return "absent"
    text = repr(data)
    return text if len(text) <= 80 else text[:77] + "..."


def _show_version(zxid: int | None) -> str:
    return "absent" if zxid is None else format_zxid(zxid)


class StateMachine:
    """Named logs and sessions, changed only by applying committed transactions in order."""

    def __init__(self) -> None:
        self._last_zxid = 0
        self._logs: dict[str, _Log] = {}
        self._sessions: dict[int, _Session] = {}
        # session id -> whether it expired (else it was closed), oldest first
        self._ended: OrderedDict[int, bool] = OrderedDict()
        # (timestamp, zxid, log, offset, key) of tombstones, earliest first
        self._tombstones: list[tuple[int, int, str, int, bytes]] = []

    @property
    def last_zxid(self) -> int:
        """The zxid of the last transaction applied (0 before the first)."""
        return self._last_zxid

    # --- applying transactions ----------------------------------------------------------

    def apply(self, txn: Txn) -> TxnResult:
        """Apply the next committed transaction and return its outcome.

        A refused transaction changes nothing it asked for but still counts as applied: it
        advances :attr:`last_zxid`, its result is remembered for retries, and its
        timestamp moves transaction time on (expiring old tombstones) like any other's.
        A zxid not above the last one is a bug in the caller and raises ``ValueError``.
        """
        header = txn.header
        zxid = header.zxid
        if zxid <= self._last_zxid:
            raise ValueError(
                f"transaction {format_zxid(zxid)} applied after {format_zxid(self._last_zxid)}:"
                " zxids must increase"
            )
        self._last_zxid = zxid
        cutoff = header.timestamp_ms - TOMBSTONE_RETENTION_MS
        if self._tombstones and self._tombstones[0][0] <= cutoff:
            self._purge_tombstones(cutoff)
        if isinstance(txn, WriteTxn):
            return self._apply_write(txn)
        if isinstance(txn, CreateSession):
            return self._create_session(txn)
        if isinstance(txn, CloseSession):
            return self._close_session(txn)
        if isinstance(txn, ExpireSessions):
            for session_id in txn.session_ids:
                session = self._sessions.get(session_id)
                if session is not None:
                    self._end_session(session, header, expired=True)
            return TxnResult(zxid, _OK)
        if isinstance(txn, Noop):
            return TxnResult(zxid, _OK)
        assert_never(txn)

    def _apply_write(self, txn: WriteTxn) -> TxnResult:
        header = txn.header
        if header.session_id == 0:
            # the leader's own writes (hosted services): no session, no retries to dedupe
            return self._transact(txn)
        session = self._sessions.get(header.session_id)
        if session is None:
            return self._session_not_open(header.zxid, header.session_id)
        seq = header.seq
        if seq <= session.last_seq:
            return self._replay(session, seq, header.zxid)
        result = self._transact(txn)
        results = session.results
        results[seq] = result
        session.last_seq = seq
        if len(results) > RESULT_WINDOW:
            results.popitem(last=False)
        return result

    def _replay(self, session: _Session, seq: int, zxid: int) -> TxnResult:
        """The answer to a write whose sequence number its session has already used."""
        prior = session.results.get(seq)
        if prior is not None:
            return prior
        who = f"session {session.session_id:#x}"
        oldest = next(iter(session.results), None)
        if oldest is not None and seq < oldest:
            return _refused(
                zxid,
                ErrorCode.INVALID_REQUEST,
                f"sequence number {seq} of {who} is older than the last {RESULT_WINDOW}"
                " results it remembers, so whether it committed is unknown; read the log",
            )
        return _refused(
            zxid,
            ErrorCode.INVALID_REQUEST,
            f"sequence number {seq} of {who} is not above its last one ({session.last_seq});"
            " sequence numbers start at 1 and must increase",
        )

    def _transact(self, txn: WriteTxn) -> TxnResult:
        header = txn.header
        zxid, timestamp, session_id = header.zxid, header.timestamp_ms, header.session_id
        staged: dict[str, _Staged | None] = {}
        for index, op in enumerate(txn.ops):
            try:
                self._check(op, staged, zxid)
            except _Refusal as refusal:
                return _refused(zxid, refusal.code, f"op {index}: {refusal.message}", index)
        logs = self._logs
        offsets: list[int] = []
        for op in txn.ops:
            if isinstance(op, Append):
                log = logs[op.log]
                offset = log.end_offset
                if isinstance(log, _CompactedLog):
                    key = op.key
                    assert key is not None  # _check refused it otherwise
                    owner = session_id if op.owned and op.value is not None else 0
                    rec = Record(offset, key, op.value, _frozen(op.headers), timestamp, zxid, owner)
                    self._put(log, key, rec)
                else:
                    log.append(
                        Record(offset, op.key, op.value, _frozen(op.headers), timestamp, zxid)
                    )
                log.last_zxid = zxid
                offsets.append(offset)
                continue
            offsets.append(-1)
            if isinstance(op, CreateLog):
                if op.name not in logs:
                    logs[op.name] = (_CompactedLog if op.compacted else _PlainLog)(op.name, zxid)
            elif isinstance(op, DeleteLog):
                self._delete_log(op.name)
        return TxnResult(zxid, _OK, offsets=offsets)

    def _stage(self, name: str, staged: dict[str, _Staged | None]) -> _Staged:
        if name in staged:
            found = staged[name]
        else:
            log = self._logs.get(name)
            found = None if log is None else _Staged(log.compacted, log.end_offset, fresh=False)
            staged[name] = found
        if found is None:
            raise _Refusal(ErrorCode.UNKNOWN_LOG, f"log {name!r} does not exist")
        return found

    def _check(self, op: Op, staged: dict[str, _Staged | None], zxid: int) -> None:
        """Refuse ``op`` if it cannot apply after the ones before it; else stage its effect."""
        if isinstance(op, Append):
            log = self._stage(op.log, staged)
            if log.compacted:
                if op.key is None:
                    raise _Refusal(
                        ErrorCode.INVALID_REQUEST, f"compacted log {op.log!r} needs a key"
                    )
                log.keys[op.key] = op.value
            elif op.owned:
                raise _Refusal(
                    ErrorCode.INVALID_REQUEST,
                    f"log {op.log!r} is not compacted, so a session cannot own its records",
                )
            log.end_offset += 1
        elif isinstance(op, CheckEndOffset):
            log = self._stage(op.log, staged)
            if log.end_offset != op.end_offset:
                raise _Refusal(
                    ErrorCode.CHECK_FAILED,
                    f"{op!r} failed: the end offset of {op.log!r} is {log.end_offset}",
                )
        elif isinstance(op, CheckKeyVersion | CheckKeyValue):
            log = self._stage(op.log, staged)
            if not log.compacted:
                raise _Refusal(
                    ErrorCode.INVALID_REQUEST,
                    f"log {op.log!r} is not compacted, so its keys have no version or value",
                )
            value, version = self._staged_key(op.log, log, op.key, zxid)
            if isinstance(op, CheckKeyVersion) and version != op.zxid:
                raise _Refusal(
                    ErrorCode.CHECK_FAILED,
                    f"{op!r} failed: the key's version is {_show_version(version)}",
                )
            if isinstance(op, CheckKeyValue) and value != op.value:
                raise _Refusal(
                    ErrorCode.CHECK_FAILED, f"{op!r} failed: the key's value is {_show(value)}"
                )
        elif isinstance(op, CreateLog):
            name = op.name
            if not _LOG_NAME.fullmatch(name) or name in (".", ".."):
                raise _Refusal(
                    ErrorCode.INVALID_REQUEST,
                    f"{name!r} is not a valid log name: use 1 to 249 of A-Z a-z 0-9 . _ -"
                    " (and not '.' or '..')",
                )
            try:
                existing = self._stage(name, staged)
            except _Refusal:
                staged[name] = _Staged(op.compacted, 0, fresh=True)
                return
            if op.if_absent and existing.compacted == op.compacted:
                return
            kind = "compacted" if existing.compacted else "plain"
            raise _Refusal(ErrorCode.LOG_ALREADY_EXISTS, f"{kind} log {name!r} already exists")
        elif isinstance(op, DeleteLog):
            self._stage(op.name, staged)
            staged[op.name] = None
        else:
            assert_never(op)

    def _staged_key(
        self, name: str, log: _Staged, key: bytes, zxid: int
    ) -> tuple[bytes | None, int | None]:
        """(value, version) of ``key`` as the transaction so far leaves it."""
        if key in log.keys:
            value = log.keys[key]
            return value, (zxid if value is not None else None)
        if log.fresh:
            return None, None
        base = self._logs[name]
        assert isinstance(base, _CompactedLog)  # a staged compacted log that is not fresh
        rec = base.latest.get(key)
        if rec is None or rec.value is None:
            return None, None
        return rec.value, rec.zxid

    def _put(self, log: _CompactedLog, key: bytes, rec: Record) -> None:
        """Write ``rec`` to a compacted log, moving ownership and noting tombstones."""
        prev = log.put(key, rec)
        if prev is not None and prev.owner_session:
            owner = self._sessions.get(prev.owner_session)
            if owner is not None:
                owner.owned.discard((log.name, key))
        if rec.owner_session:
            self._sessions[rec.owner_session].owned.add((log.name, key))
        elif rec.value is None:
            heapq.heappush(
                self._tombstones, (rec.timestamp_ms, rec.zxid, log.name, rec.offset, key)
            )

    def _delete_log(self, name: str) -> None:
        log = self._logs.pop(name)
        if isinstance(log, _CompactedLog):
            for key, rec in log.latest.items():
                owner = self._sessions.get(rec.owner_session) if rec.owner_session else None
                if owner is not None:
                    owner.owned.discard((name, key))

    def _purge_tombstones(self, cutoff: int) -> None:
        """Forget tombstones written at or before ``cutoff`` (transaction time)."""
        heap = self._tombstones
        while heap and heap[0][0] <= cutoff:
            _, zxid, name, offset, key = heapq.heappop(heap)
            log = self._logs.get(name)
            if isinstance(log, _CompactedLog):
                log.discard_tombstone(key, offset, zxid)

    # --- sessions ------------------------------------------------------------------------

    def _create_session(self, txn: CreateSession) -> TxnResult:
        zxid, session_id = txn.header.zxid, txn.session_id
        if session_id <= 0:
            return _refused(
                zxid, ErrorCode.INVALID_REQUEST, f"session id {session_id} is not positive"
            )
        if session_id in self._sessions:
            return _refused(
                zxid, ErrorCode.INVALID_REQUEST, f"session {session_id:#x} already exists"
            )
        if txn.timeout_ms <= 0:
            return _refused(
                zxid,
                ErrorCode.INVALID_SESSION_TIMEOUT,
                f"session timeout {txn.timeout_ms} ms is not positive",
            )
        self._ended.pop(session_id, None)
        self._sessions[session_id] = _Session(session_id, txn.timeout_ms, zxid)
        return TxnResult(zxid, _OK)

    def _close_session(self, txn: CloseSession) -> TxnResult:
        session = self._sessions.get(txn.session_id)
        if session is not None:
            self._end_session(session, txn.header, expired=False)
            return TxnResult(txn.header.zxid, _OK)
        if self._ended.get(txn.session_id) is False:  # a retried close
            return TxnResult(txn.header.zxid, _OK)
        return self._session_not_open(txn.header.zxid, txn.session_id)

    def _session_not_open(self, zxid: int, session_id: int) -> TxnResult:
        expired = self._ended.get(session_id)
        who = f"session {session_id:#x}"
        if expired:
            return _refused(zxid, ErrorCode.SESSION_EXPIRED, f"{who} expired; open a new one")
        if expired is False:
            return _refused(zxid, ErrorCode.UNKNOWN_SESSION, f"{who} was closed; open a new one")
        return _refused(zxid, ErrorCode.UNKNOWN_SESSION, f"{who} does not exist; open one first")

    def _end_session(self, session: _Session, header: TxnHeader, expired: bool) -> None:
        """Forget ``session`` and delete the keys it owns, with tombstones tailers can see."""
        del self._sessions[session.session_id]
        for name, key in sorted(session.owned):
            log = self._logs[name]
            assert isinstance(log, _CompactedLog)  # only compacted records are owned
            self._put(
                log, key, Record(log.end_offset, key, None, (), header.timestamp_ms, header.zxid)
            )
            log.last_zxid = header.zxid
        self._ended[session.session_id] = expired
        if len(self._ended) > ENDED_SESSIONS_REMEMBERED:
            self._ended.popitem(last=False)

    # --- queries -------------------------------------------------------------------------

    def _log(self, name: str) -> _Log:
        log = self._logs.get(name)
        if log is None:
            raise UnknownLog(f"log {name!r} does not exist")
        return log

    def _compacted(self, name: str) -> _CompactedLog:
        log = self._log(name)
        if not isinstance(log, _CompactedLog):
            raise ProtocolError(f"log {name!r} is not compacted, so it has no key lookups")
        return log

    def logs(self) -> list[LogInfo]:
        """Every log, by name."""
        return [self._info(self._logs[name]) for name in sorted(self._logs)]

    def describe(self, name: str) -> LogInfo:
        return self._info(self._log(name))

    @staticmethod
    def _info(log: _Log) -> LogInfo:
        count = len(log.records) if isinstance(log, _PlainLog) else len(log.by_offset)
        return LogInfo(
            log.name,
            log.compacted,
            log.start_offset,
            log.end_offset,
            count,
            log.size_bytes,
            log.created_zxid,
            log.last_zxid,
        )

    def read(
        self, name: str, from_offset: int, max_records: int, max_bytes: int | None = None
    ) -> list[Record]:
        """Records at or after ``from_offset``, in offset order.

        A compacted log returns only the latest record of each key (tombstones included,
        so tailers see deletes). ``max_bytes`` caps the total size, but at least one record
        is returned whenever there is one, so a reader always makes progress.
        """
        if from_offset < 0 or max_records < 1 or (max_bytes is not None and max_bytes < 1):
            raise ProtocolError(
                f"read of {name!r} needs from_offset >= 0 and positive limits, got"
                f" from_offset={from_offset} max_records={max_records} max_bytes={max_bytes}"
            )
        return self._log(name).read(from_offset, max_records, max_bytes)

    def end_offset(self, name: str) -> int:
        """The offset the next record of ``name`` will get."""
        return self._log(name).end_offset

    def get(self, log: str, key: bytes) -> Record | None:
        """The live record of ``key`` in a compacted log (``None`` if absent or deleted)."""
        rec = self._compacted(log).latest.get(key)
        return rec if rec is not None and rec.value is not None else None

    def key_version(self, log: str, key: bytes) -> int | None:
        """The zxid that last wrote ``key`` (``None`` if absent or deleted)."""
        rec = self.get(log, key)
        return None if rec is None else rec.zxid

    def sessions(self) -> dict[int, SessionInfo]:
        """Every open session, by id."""
        return {
            sid: SessionInfo(s.session_id, s.timeout_ms, s.created_zxid, s.last_seq, len(s.owned))
            for sid, s in sorted(self._sessions.items())
        }

    # --- snapshots -----------------------------------------------------------------------

    def snapshot(self) -> bytes:
        """The whole state, canonically encoded: equal states give equal bytes."""
        image = _Image(
            _SNAPSHOT_VERSION,
            self._last_zxid,
            [
                _LogImage(
                    name,
                    log.compacted,
                    log.created_zxid,
                    log.last_zxid,
                    log.end_offset,
                    log.retained(),
                )
                for name, log in sorted(self._logs.items())
            ],
            [
                _SessionImage(
                    s.session_id,
                    s.timeout_ms,
                    s.created_zxid,
                    s.last_seq,
                    list(s.results.items()),
                )
                for _, s in sorted(self._sessions.items())
            ],
            list(self._ended.items()),
        )
        return _image_encoder.encode(image)

    @classmethod
    def restore(cls, data: bytes) -> StateMachine:
        """The machine :meth:`snapshot` took ``data`` from."""
        try:
            image = _image_decoder.decode(data)
        except msgspec.DecodeError as e:
            raise CorruptStorage(f"snapshot does not decode: {e}") from e
        if image.version != _SNAPSHOT_VERSION:
            raise CorruptStorage(
                f"snapshot format {image.version} is not {_SNAPSHOT_VERSION}, the one this"
                " herder reads"
            )
        machine = cls()
        machine._last_zxid = image.last_zxid
        machine._ended = OrderedDict(image.ended)
        for s in image.sessions:
            session = _Session(s.session_id, s.timeout_ms, s.created_zxid)
            session.last_seq = s.last_seq
            session.results = OrderedDict(s.results)
            machine._sessions[s.session_id] = session
        for li in image.logs:
            log: _Log
            if li.compacted:
                log = _CompactedLog(li.name, li.created_zxid)
                for rec in li.records:
                    if rec.key is None or (
                        rec.owner_session and rec.owner_session not in machine._sessions
                    ):
                        raise CorruptStorage(f"snapshot has an impossible record in {li.name!r}")
                    machine._put(log, rec.key, rec)
                log.end_offset = li.end_offset
            else:
                log = _PlainLog(li.name, li.created_zxid)
                for rec in li.records:
                    log.append(rec)
            log.last_zxid = li.last_zxid
            machine._logs[li.name] = log
        return machine

    def digest(self) -> str:
        """A hash of the whole state, for comparing replicas."""
        return hashlib.sha256(self.snapshot()).hexdigest()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, StateMachine):
            return NotImplemented
        return self.snapshot() == other.snapshot()
