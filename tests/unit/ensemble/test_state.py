"""The ensemble state machine: logs, checks, idempotency, sessions, determinism, snapshots."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from herder.ensemble.state import (
    RESULT_WINDOW,
    TOMBSTONE_RETENTION_MS,
    LogInfo,
    StateMachine,
)
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
    decode_txn,
    encode_txn,
    format_zxid,
    make_zxid,
    zxid_counter,
    zxid_epoch,
)
from herder.errors import CheckFailed, CorruptStorage, ErrorCode, ProtocolError, UnknownLog
from tests.strategies import for_type

pytestmark = pytest.mark.unit

SESSION = 0x100
OTHER = 0x200
ALL = 10_000


class Leader:
    """Proposes transactions to one StateMachine as a leader would: consecutive zxids,
    the leader's clock in each header, the next sequence number of each session."""

    def __init__(self) -> None:
        self.sm = StateMachine()
        self.counter = 0
        self.now = 1_000_000
        self.seqs: dict[int, int] = {}

    def header(self, session_id: int = 0, seq: int = 0) -> TxnHeader:
        self.counter += 1
        return TxnHeader(make_zxid(1, self.counter), self.now, session_id, seq)

    def write(self, *ops: Op, session: int = SESSION, seq: int | None = None) -> TxnResult:
        if seq is None:
            seq = self.seqs.get(session, 0) + 1
        self.seqs[session] = max(seq, self.seqs.get(session, 0))
        return self.sm.apply(WriteTxn(self.header(session, seq), list(ops)))

    def open(self, session: int = SESSION, timeout_ms: int = 10_000) -> TxnResult:
        return self.sm.apply(CreateSession(self.header(), session, timeout_ms))

    def close(self, session: int = SESSION) -> TxnResult:
        return self.sm.apply(CloseSession(self.header(), session))

    def expire(self, *sessions: int) -> TxnResult:
        return self.sm.apply(ExpireSessions(self.header(), list(sessions)))

    def noop(self) -> TxnResult:
        return self.sm.apply(Noop(self.header()))


def contents(sm: StateMachine, log: str, from_offset: int = 0) -> list[tuple]:
    return [(r.offset, r.key, r.value) for r in sm.read(log, from_offset, ALL)]


def value_of(sm: StateMachine, log: str, key: bytes) -> bytes | None:
    rec = sm.get(log, key)
    return None if rec is None else rec.value


@pytest.fixture
def leader() -> Leader:
    leader = Leader()
    assert leader.open(SESSION).ok
    assert leader.open(OTHER).ok
    assert leader.write(CreateLog("plain"), CreateLog("compact", compacted=True)).ok
    return leader


# --- zxids and the codec ------------------------------------------------------------------


def test_zxid_puts_the_epoch_above_the_counter() -> None:
    zxid = make_zxid(1, 3)
    assert zxid == 0x100000003
    assert (zxid_epoch(zxid), zxid_counter(zxid)) == (1, 3)
    assert format_zxid(zxid) == "0x100000003"
    assert make_zxid(2, 0) > make_zxid(1, 2**32 - 1)
    with pytest.raises(ValueError):
        make_zxid(1, 2**32)


def _header(session_id: int = 0, seq: int = 0) -> TxnHeader:
    return TxnHeader(make_zxid(3, 7), 1_700_000_000_000, session_id, seq)


EVERY_TXN: list[Txn] = [
    WriteTxn(
        _header(SESSION, 9),
        [
            CreateLog("l", compacted=True, if_absent=True),
            DeleteLog("old"),
            Append("l", b"k", b"v", [("trace", b"\x00\xff")], owned=True),
            Append("p", None, None),
            CheckEndOffset("l", 12),
            CheckKeyVersion("l", b"k", make_zxid(2, 1)),
            CheckKeyVersion("l", b"gone", None),
            CheckKeyValue("l", b"epoch", b"\x00\x00\x00\x05"),
            CheckKeyValue("l", b"gone", None),
        ],
    ),
    CreateSession(_header(), SESSION, 30_000),
    CloseSession(_header(), SESSION),
    ExpireSessions(_header(), [SESSION, OTHER]),
    Noop(_header()),
]


@pytest.mark.parametrize("txn", EVERY_TXN, ids=lambda t: type(t).__name__)
def test_every_txn_kind_round_trips(txn: Txn) -> None:
    decoded = decode_txn(encode_txn(txn))
    assert type(decoded) is type(txn)
    assert decoded == txn


@given(for_type(Txn))
def test_any_txn_round_trips(txn: Txn) -> None:
    assert decode_txn(encode_txn(txn)) == txn


@given(for_type(TxnResult), for_type(Record))
def test_results_and_records_round_trip(result: TxnResult, record: Record) -> None:
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(result), type=TxnResult) == result
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(record), type=Record) == record


def test_decode_refuses_garbage() -> None:
    with pytest.raises(msgspec.DecodeError):
        decode_txn(b"\x93\x63\x01\x02")


# --- logs ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["", "a/b", "x" * 250, ".", "..", "naïve", "sp ace"])
def test_create_log_refuses_bad_names(leader: Leader, name: str) -> None:
    result = leader.write(CreateLog(name))
    assert (result.error_code, result.failed_op) == (ErrorCode.INVALID_REQUEST, 0)
    assert "not a valid log name" in result.message
    assert [info.name for info in leader.sm.logs()] == ["compact", "plain"]


def test_create_log_accepts_the_documented_alphabet(leader: Leader) -> None:
    assert leader.write(CreateLog("x" * 249), CreateLog("_a.B-9")).ok
    assert {"x" * 249, "_a.B-9"} <= {info.name for info in leader.sm.logs()}


def test_create_existing_log(leader: Leader) -> None:
    leader.write(Append("plain", None, b"r"))
    result = leader.write(CreateLog("plain"))
    assert result.error_code == ErrorCode.LOG_ALREADY_EXISTS
    assert leader.write(CreateLog("plain", if_absent=True)).ok
    assert contents(leader.sm, "plain") == [(0, None, b"r")]  # if_absent left it alone
    # if_absent forgives only an existing log of the same kind
    result = leader.write(CreateLog("plain", compacted=True, if_absent=True))
    assert result.error_code == ErrorCode.LOG_ALREADY_EXISTS
    assert "plain log 'plain' already exists" in result.message


def test_plain_log_keeps_every_record(leader: Leader) -> None:
    leader.now = 5_555
    first = leader.write(Append("plain", b"k", b"1", [("h", b"x")]), Append("plain", b"k", b"2"))
    second = leader.write(Append("plain", b"k", None))
    assert first.offsets == [0, 1]
    assert second.offsets == [2]
    records = leader.sm.read("plain", 0, ALL)
    assert [(r.offset, r.key, r.value) for r in records] == [
        (0, b"k", b"1"),
        (1, b"k", b"2"),
        (2, b"k", None),
    ]
    assert records[0].headers == (("h", b"x"),)
    assert {r.timestamp_ms for r in records} == {5_555}  # the header's clock, not the host's
    assert [r.zxid for r in records] == [first.zxid, first.zxid, second.zxid]
    info = leader.sm.describe("plain")
    assert (info.start_offset, info.end_offset, info.records) == (0, 3, 3)
    assert info.size_bytes == len(b"k1h") + len(b"x") + len(b"k2") + len(b"k")
    assert info.last_zxid == second.zxid


def test_read_limits(leader: Leader) -> None:
    leader.write(*(Append("plain", None, b"x" * 10) for _ in range(5)))
    sm = leader.sm
    assert [r.offset for r in sm.read("plain", 1, 2)] == [1, 2]
    assert [r.offset for r in sm.read("plain", 3, ALL, max_bytes=25)] == [3, 4]
    assert [r.offset for r in sm.read("plain", 0, ALL, max_bytes=1)] == [0]  # always progress
    assert sm.read("plain", 5, ALL) == []
    assert sm.end_offset("plain") == 5
    for bad in [(-1, 1, None), (0, 0, None), (0, 1, 0)]:
        with pytest.raises(ProtocolError):
            sm.read("plain", *bad)


def test_compacted_log_keeps_the_latest_record_per_key(leader: Leader) -> None:
    for key, value in [(b"a", b"1"), (b"b", b"2"), (b"a", b"3"), (b"c", b"4"), (b"b", None)]:
        assert leader.write(Append("compact", key, value)).ok
    sm = leader.sm
    # offsets never change; the delete is itself a record, so tailers see it
    assert contents(sm, "compact") == [(2, b"a", b"3"), (3, b"c", b"4"), (4, b"b", None)]
    assert contents(sm, "compact", from_offset=3) == [(3, b"c", b"4"), (4, b"b", None)]
    assert value_of(sm, "compact", b"a") == b"3"
    assert sm.get("compact", b"b") is None
    assert sm.key_version("compact", b"b") is None
    assert sm.get("compact", b"never") is None
    info = sm.describe("compact")
    assert (info.start_offset, info.end_offset, info.records) == (2, 5, 3)
    assert sm.end_offset("compact") == 5


def test_compacted_reads_stay_in_offset_order_under_heavy_overwrites(leader: Leader) -> None:
    keys = [b"x", b"y", b"z"]
    for i in range(600):
        leader.write(Append("compact", keys[i % 3], b"%d" % i))
    sm = leader.sm
    assert contents(sm, "compact") == [
        (597, b"x", b"597"),
        (598, b"y", b"598"),
        (599, b"z", b"599"),
    ]
    assert contents(sm, "compact", 598) == [(598, b"y", b"598"), (599, b"z", b"599")]
    assert [r.offset for r in sm.read("compact", 0, 2)] == [597, 598]
    assert sm.describe("compact").size_bytes == 3 * (1 + 3)


def test_compacted_appends_need_a_key(leader: Leader) -> None:
    result = leader.write(Append("compact", None, b"v"))
    assert (result.error_code, result.failed_op) == (ErrorCode.INVALID_REQUEST, 0)


def test_key_lookups_are_for_compacted_logs_only(leader: Leader) -> None:
    result = leader.write(CheckKeyVersion("plain", b"k", None))
    assert result.error_code == ErrorCode.INVALID_REQUEST
    with pytest.raises(ProtocolError):
        leader.sm.get("plain", b"k")


def test_unknown_log(leader: Leader) -> None:
    result = leader.write(Append("compact", b"k", b"v"), Append("nope", b"k", b"v"))
    assert (result.error_code, result.failed_op) == (ErrorCode.UNKNOWN_LOG, 1)
    assert "'nope' does not exist" in result.message
    assert leader.sm.end_offset("compact") == 0
    for query in (leader.sm.describe, leader.sm.end_offset):
        with pytest.raises(UnknownLog):
            query("nope")
    with pytest.raises(UnknownLog):
        leader.sm.read("nope", 0, 1)


def test_delete_log_then_recreate_starts_afresh(leader: Leader) -> None:
    leader.write(Append("compact", b"k", b"v", owned=True))
    assert leader.write(DeleteLog("compact")).ok
    with pytest.raises(UnknownLog):
        leader.sm.read("compact", 0, 1)
    assert leader.write(DeleteLog("compact")).error_code == ErrorCode.UNKNOWN_LOG
    assert leader.write(CreateLog("compact", compacted=True)).ok
    assert leader.sm.end_offset("compact") == 0
    assert leader.sm.sessions()[SESSION].owned_keys == 0
    assert leader.close().ok  # owns nothing any more: no tombstone in the new log
    assert contents(leader.sm, "compact") == []


# --- checks ----------------------------------------------------------------------------


def test_check_end_offset(leader: Leader) -> None:
    leader.write(Append("plain", None, b"0"))
    assert leader.write(CheckEndOffset("plain", 1), Append("plain", None, b"1")).offsets == [-1, 1]
    result = leader.write(
        Append("plain", None, b"x"), CheckEndOffset("plain", 2), Append("plain", None, b"y")
    )
    assert (result.error_code, result.failed_op) == (ErrorCode.CHECK_FAILED, 1)
    assert result.message == (
        "op 1: CheckEndOffset(log='plain', end_offset=2) failed: the end offset of 'plain' is 3"
    )
    assert result.offsets == []
    assert contents(leader.sm, "plain") == [(0, None, b"0"), (1, None, b"1")]
    with pytest.raises(CheckFailed, match="end offset"):
        result.raise_for_error()


def test_check_key_version(leader: Leader) -> None:
    assert leader.write(CheckKeyVersion("compact", b"k", None), Append("compact", b"k", b"1")).ok
    version = leader.sm.key_version("compact", b"k")
    assert version == leader.sm.last_zxid
    assert leader.write(CheckKeyVersion("compact", b"k", version), Append("compact", b"k", b"2")).ok
    # the read-modify-write that read version 1 lost the race
    stale = leader.write(CheckKeyVersion("compact", b"k", version), Append("compact", b"k", b"3"))
    assert (stale.error_code, stale.failed_op) == (ErrorCode.CHECK_FAILED, 0)
    assert format_zxid(leader.sm.key_version("compact", b"k") or 0) in stale.message
    assert value_of(leader.sm, "compact", b"k") == b"2"
    absent = leader.write(CheckKeyVersion("compact", b"k", None))
    assert absent.error_code == ErrorCode.CHECK_FAILED
    leader.write(Append("compact", b"k", None))
    assert leader.write(CheckKeyVersion("compact", b"k", None)).ok  # deleted counts as absent


def test_check_key_value_fences_a_stale_epoch(leader: Leader) -> None:
    leader.write(Append("compact", b"task-0", b"\x05"))
    commit = Append("plain", None, b"offsets")
    assert leader.write(CheckKeyValue("compact", b"task-0", b"\x05"), commit).ok
    leader.write(Append("compact", b"task-0", b"\x06"))  # a new incarnation took over
    zombie = leader.write(CheckKeyValue("compact", b"task-0", b"\x05"), commit)
    assert (zombie.error_code, zombie.failed_op) == (ErrorCode.CHECK_FAILED, 0)
    assert "value is b'\\x06'" in zombie.message
    assert leader.sm.end_offset("plain") == 1
    assert leader.write(CheckKeyValue("compact", b"unset", None)).ok
    assert not leader.write(CheckKeyValue("compact", b"unset", b"\x01")).ok


def test_checks_see_the_earlier_ops_of_their_transaction(leader: Leader) -> None:
    this_zxid = make_zxid(1, leader.counter + 1)
    result = leader.write(
        CreateLog("fresh", compacted=True),
        Append("fresh", b"k", b"v"),
        CheckEndOffset("fresh", 1),
        CheckKeyValue("fresh", b"k", b"v"),
        CheckKeyVersion("fresh", b"k", this_zxid),
        Append("compact", b"j", b"1"),
        Append("compact", b"j", None),
        CheckKeyVersion("compact", b"j", None),
    )
    assert result.ok, result.message
    assert result.zxid == this_zxid
    result = leader.write(DeleteLog("fresh"), CheckEndOffset("fresh", 0))
    assert (result.error_code, result.failed_op) == (ErrorCode.UNKNOWN_LOG, 1)
    assert result.message == "op 1: log 'fresh' does not exist"
    assert leader.sm.end_offset("fresh") == 1


def test_a_refused_transaction_applies_nothing(leader: Leader) -> None:
    before = leader.sm.logs()
    result = leader.write(
        CreateLog("new"),
        DeleteLog("plain"),
        Append("compact", b"k", b"v", owned=True),
        CheckEndOffset("compact", 99),
    )
    assert (result.error_code, result.failed_op) == (ErrorCode.CHECK_FAILED, 3)
    assert leader.sm.logs() == before
    assert leader.sm.sessions()[SESSION].owned_keys == 0
    assert leader.sm.last_zxid == result.zxid  # but it was applied, as a refusal


def test_offsets_report_one_entry_per_op(leader: Leader) -> None:
    result = leader.write(
        Append("plain", None, b"a"),
        CheckEndOffset("plain", 1),
        Append("compact", b"k", b"b"),
        Append("plain", None, b"c"),
    )
    assert result.offsets == [0, -1, 0, 1]


def test_zxids_must_increase() -> None:
    sm = StateMachine()
    sm.apply(Noop(TxnHeader(make_zxid(1, 5), 0)))
    with pytest.raises(ValueError, match="0x100000005 applied after 0x100000005"):
        sm.apply(Noop(TxnHeader(make_zxid(1, 5), 0)))
    assert sm.apply(Noop(TxnHeader(make_zxid(2, 0), 0))).ok
    assert sm.last_zxid == make_zxid(2, 0)


# --- idempotency -----------------------------------------------------------------------


def test_a_retried_write_applies_once_and_gets_its_first_result(leader: Leader) -> None:
    first = leader.write(Append("plain", None, b"once"), seq=7)
    retry = leader.write(Append("plain", None, b"once"), seq=7)
    assert retry == first
    assert retry.zxid != leader.sm.last_zxid  # the retry's own zxid was consumed, nothing more
    assert contents(leader.sm, "plain") == [(0, None, b"once")]


def test_a_retried_failed_write_gets_its_failure_again(leader: Leader) -> None:
    ops = (CheckEndOffset("plain", 1), Append("plain", None, b"x"))
    first = leader.write(*ops, seq=3)
    assert first.error_code == ErrorCode.CHECK_FAILED
    leader.write(Append("plain", None, b"y"), session=OTHER)  # now the check would pass
    assert leader.write(*ops, seq=3) == first
    assert contents(leader.sm, "plain") == [(0, None, b"y")]


def test_sequence_numbers_may_skip_but_never_go_back(leader: Leader) -> None:
    assert leader.write(Append("plain", None, b"a"), seq=2).ok  # 1 made the logs
    assert leader.write(Append("plain", None, b"b"), seq=10).ok
    result = leader.write(Append("plain", None, b"c"), seq=5)
    assert result.error_code == ErrorCode.INVALID_REQUEST
    assert "not above its last one (10)" in result.message
    assert leader.write(Append("plain", None, b"d"), session=OTHER, seq=0).error_code == (
        ErrorCode.INVALID_REQUEST
    )
    assert leader.sm.end_offset("plain") == 2


def test_a_sequence_number_older_than_the_window_is_refused(leader: Leader) -> None:
    last = RESULT_WINDOW + 2
    results = {
        seq: leader.write(Append("plain", None, b"%d" % seq), session=OTHER, seq=seq)
        for seq in range(1, last + 1)
    }
    oldest_remembered = last - RESULT_WINDOW + 1
    too_old = leader.write(Append("plain", None, b"1"), session=OTHER, seq=oldest_remembered - 1)
    assert too_old.error_code == ErrorCode.INVALID_REQUEST
    assert "older than the last 128 results" in too_old.message
    again = leader.write(Append("plain", None, b"x"), session=OTHER, seq=oldest_remembered)
    assert again == results[oldest_remembered]
    assert leader.sm.end_offset("plain") == last


# --- sessions --------------------------------------------------------------------------


def test_writes_need_an_open_session(leader: Leader) -> None:
    unknown = leader.write(Append("plain", None, b"x"), session=0x999)
    assert unknown.error_code == ErrorCode.UNKNOWN_SESSION
    assert "does not exist" in unknown.message
    leader.expire(SESSION)
    expired = leader.write(Append("plain", None, b"x"), session=SESSION)
    assert expired.error_code == ErrorCode.SESSION_EXPIRED
    leader.close(OTHER)
    closed = leader.write(Append("plain", None, b"x"), session=OTHER)
    assert (closed.error_code, "was closed" in closed.message) == (ErrorCode.UNKNOWN_SESSION, True)
    assert leader.sm.end_offset("plain") == 0
    assert leader.sm.sessions() == {}


def test_session_creation_is_validated(leader: Leader) -> None:
    assert leader.open(SESSION).error_code == ErrorCode.INVALID_REQUEST
    assert leader.open(0).error_code == ErrorCode.INVALID_REQUEST
    assert leader.open(0x300, timeout_ms=0).error_code == ErrorCode.INVALID_SESSION_TIMEOUT
    info = leader.sm.sessions()[SESSION]
    assert (info.session_id, info.timeout_ms, info.last_seq) == (SESSION, 10_000, 1)


def test_close_is_idempotent_but_not_for_unknown_sessions(leader: Leader) -> None:
    assert leader.close(SESSION).ok
    assert leader.close(SESSION).ok
    assert leader.close(0x999).error_code == ErrorCode.UNKNOWN_SESSION
    leader.expire(OTHER)
    assert leader.close(OTHER).error_code == ErrorCode.SESSION_EXPIRED


@pytest.mark.parametrize("end", ["close", "expire"])
def test_ending_a_session_deletes_its_keys_with_tombstones(leader: Leader, end: str) -> None:
    leader.write(
        Append("compact", b"b-owned", b"1", owned=True),
        Append("compact", b"a-owned", b"2", owned=True),
        Append("compact", b"shared", b"3"),
    )
    leader.write(Append("compact", b"theirs", b"4", owned=True), session=OTHER)
    leader.write(Append("compact", b"a-owned", b"5", owned=True))
    tail = leader.sm.end_offset("compact")
    assert leader.sm.sessions()[SESSION].owned_keys == 2
    leader.now += 1
    result = leader.close(SESSION) if end == "close" else leader.expire(0x999, SESSION)
    assert result.ok
    tombstones = leader.sm.read("compact", tail, ALL)
    assert [(r.offset, r.key, r.value) for r in tombstones] == [
        (tail, b"a-owned", None),  # in key order, whatever order they were written in
        (tail + 1, b"b-owned", None),
    ]
    assert {(r.zxid, r.timestamp_ms) for r in tombstones} == {(result.zxid, leader.now)}
    assert leader.sm.get("compact", b"a-owned") is None
    assert leader.sm.get("compact", b"shared") is not None
    assert leader.sm.get("compact", b"theirs") is not None
    assert SESSION not in leader.sm.sessions()
    assert leader.sm.describe("compact").last_zxid == result.zxid


def test_overwriting_an_owned_key_takes_it_from_its_owner(leader: Leader) -> None:
    leader.write(Append("compact", b"k", b"mine", owned=True))
    leader.write(Append("compact", b"k", b"yours"), session=OTHER)
    leader.write(Append("compact", b"j", b"mine", owned=True))
    leader.write(Append("compact", b"j", None, owned=True))  # a delete is never owned
    assert leader.sm.sessions()[SESSION].owned_keys == 0
    end = leader.sm.end_offset("compact")
    leader.close(SESSION)
    assert leader.sm.end_offset("compact") == end
    assert value_of(leader.sm, "compact", b"k") == b"yours"


def test_plain_log_records_cannot_be_owned(leader: Leader) -> None:
    result = leader.write(Append("plain", b"k", b"v", owned=True))
    assert (result.error_code, result.failed_op) == (ErrorCode.INVALID_REQUEST, 0)
    assert "cannot own" in result.message
    assert leader.sm.end_offset("plain") == 0


def test_tombstones_are_kept_for_the_retention_then_dropped(leader: Leader) -> None:
    leader.write(Append("compact", b"gone", b"1"), Append("compact", b"back", b"1"))
    leader.write(Append("compact", b"gone", None), Append("compact", b"back", None))
    deleted_at = leader.now
    leader.now = deleted_at + 10
    leader.write(Append("compact", b"back", b"2"))  # written again: its tombstone is history
    leader.now = deleted_at + TOMBSTONE_RETENTION_MS - 1
    leader.noop()
    assert contents(leader.sm, "compact") == [(2, b"gone", None), (4, b"back", b"2")]
    leader.now = deleted_at + TOMBSTONE_RETENTION_MS
    leader.noop()
    assert contents(leader.sm, "compact") == [(4, b"back", b"2")]
    info = leader.sm.describe("compact")
    assert (info.start_offset, info.end_offset, info.records) == (4, 5, 1)


def test_logs_and_describe(leader: Leader) -> None:
    created = leader.sm.last_zxid
    leader.write(Append("compact", b"k", b"vv"))
    assert leader.sm.logs() == [
        LogInfo("compact", True, 0, 1, 1, 3, created, leader.sm.last_zxid),
        LogInfo("plain", False, 0, 0, 0, 0, created, created),
    ]


# --- determinism and snapshots -------------------------------------------------------

LOGS = ["a", "b", "c"]
KEYS = [b"k0", b"k1", b"k2"]
VALUES = [None, b"v0", b"v1"]
SESSIONS = [1, 2, 3]

_names = st.sampled_from(LOGS)
_keys = st.sampled_from(KEYS)
_values = st.sampled_from(VALUES)
_append = st.builds(
    Append,
    _names,
    st.sampled_from([None, *KEYS, *KEYS]),
    _values,
    st.sampled_from([[], [("h", b"x")]]),
    st.booleans(),
)
_ops = st.one_of(
    *[_append] * 8,
    st.builds(CreateLog, _names, st.booleans(), st.booleans()),
    st.builds(DeleteLog, _names),
    st.builds(CheckEndOffset, _names, st.integers(0, 6)),
    st.builds(
        CheckKeyVersion,
        _names,
        _keys,
        st.one_of(st.none(), st.integers(1, 40).map(lambda c: make_zxid(1, c))),
    ),
    st.builds(CheckKeyValue, _names, _keys, _values),
)


@st.composite
def histories(draw: st.DrawFn, max_size: int = 30) -> list[Txn]:
    """Random transactions, as a leader could propose them, over a few logs and sessions.

    Sessions and logs exist at the start, so that most writes get as far as their ops;
    at the end every session expires.
    """
    now = 1_000
    txns: list[Txn] = [
        CreateSession(TxnHeader(make_zxid(1, i + 1), now), session, 5_000)
        for i, session in enumerate(SESSIONS)
    ]
    creates = [CreateLog(name, compacted=draw(st.booleans())) for name in LOGS]
    txns.append(WriteTxn(TxnHeader(make_zxid(1, len(txns) + 1), now, SESSIONS[0], 1), creates))
    epoch, counter = 1, len(txns)
    seqs = dict.fromkeys(SESSIONS, 0)
    seqs[SESSIONS[0]] = 1
    for _ in range(draw(st.integers(0, max_size))):
        if draw(st.integers(0, 19)) == 0:
            epoch, counter = epoch + 1, 0
        counter += 1
        now += draw(st.sampled_from([0, 1, 1_000, TOMBSTONE_RETENTION_MS]))
        session = draw(st.sampled_from(SESSIONS))
        kind = draw(st.sampled_from(["write"] * 16 + ["open", "open", "close", "expire", "noop"]))
        if kind == "write":
            seq = draw(st.one_of(st.none(), st.none(), st.integers(0, 6)))
            seq = seqs[session] + 1 if seq is None else seq
            seqs[session] = max(seqs[session], seq)
            ops = draw(st.lists(_ops, min_size=1, max_size=3))
            txns.append(WriteTxn(TxnHeader(make_zxid(epoch, counter), now, session, seq), ops))
            continue
        header = TxnHeader(make_zxid(epoch, counter), now)
        if kind == "open":
            txns.append(CreateSession(header, session, draw(st.sampled_from([0, 5_000]))))
        elif kind == "close":
            txns.append(CloseSession(header, session))
        elif kind == "expire":
            txns.append(
                ExpireSessions(header, draw(st.lists(st.sampled_from(SESSIONS), max_size=2)))
            )
        else:
            txns.append(Noop(header))
    # end every session, so that every owned key gets its tombstone
    txns.append(ExpireSessions(TxnHeader(make_zxid(epoch, counter + 1), now), SESSIONS))
    return txns


# histories are costly to draw; no deadline, so a busy CI machine cannot make them flaky
history_settings = settings(max_examples=75, deadline=None)


def _everything(sm: StateMachine) -> dict[str, tuple[LogInfo, list[Record]]]:
    return {info.name: (info, sm.read(info.name, 0, ALL)) for info in sm.logs()}


@history_settings
@given(histories())
def test_replicas_fed_the_same_transactions_agree(history: list[Txn]) -> None:
    a, b = StateMachine(), StateMachine()
    results_a = [a.apply(txn) for txn in history]
    results_b = [b.apply(decode_txn(encode_txn(txn))) for txn in history]
    assert results_a == results_b
    assert a.digest() == b.digest()
    assert a == b


@history_settings
@given(histories(), st.data())
def test_snapshot_restores_an_equal_machine_that_stays_equal(
    history: list[Txn], data: st.DataObject
) -> None:
    cut = data.draw(st.integers(0, len(history)))
    original = StateMachine()
    for txn in history[:cut]:
        original.apply(txn)
    restored = StateMachine.restore(original.snapshot())
    assert restored == original
    assert restored.last_zxid == original.last_zxid
    assert restored.sessions() == original.sessions()
    assert _everything(restored) == _everything(original)
    for txn in history[cut:]:
        assert restored.apply(txn) == original.apply(txn)
    assert restored == original
    assert restored.sessions() == original.sessions()
    assert _everything(restored) == _everything(original)


@history_settings
@given(histories())
def test_a_refused_write_is_a_noop_and_a_committed_one_reports_its_offsets(
    history: list[Txn],
) -> None:
    sm = StateMachine()
    for txn in history:
        if not isinstance(txn, WriteTxn):
            sm.apply(txn)
            continue
        # what the state would be had this transaction done nothing but pass the time
        idle = StateMachine.restore(sm.snapshot())
        idle.apply(Noop(txn.header))
        result = sm.apply(txn)
        if result.zxid != txn.header.zxid:  # the first answer, replayed to a retry
            assert _everything(sm) == _everything(idle)
        elif not result.ok:
            assert _everything(sm) == _everything(idle)
            assert result.offsets == []
            assert -1 <= result.failed_op < len(txn.ops)
        else:
            assert [off >= 0 for off in result.offsets] == [
                isinstance(op, Append) for op in txn.ops
            ]
            if any(isinstance(op, DeleteLog) for op in txn.ops):
                continue  # a log deleted (and maybe made again) after its appends
            for op, offset in zip(txn.ops, result.offsets, strict=True):
                if isinstance(op, Append):
                    found = sm.read(op.log, offset, 1)
                    if found and found[0].offset == offset:  # not overwritten since
                        assert (found[0].key, found[0].value) == (op.key, op.value)


def test_restore_refuses_what_is_not_a_snapshot() -> None:
    with pytest.raises(CorruptStorage, match="does not decode"):
        StateMachine.restore(b"\x01\x02")
    other_version = msgspec.msgpack.encode([99, 0, [], [], []])
    with pytest.raises(CorruptStorage, match="format 99"):
        StateMachine.restore(other_version)


# The same history must give the same state under every hash seed: a closing session's
# keys live in a set, whose order for str and bytes changes with PYTHONHASHSEED.
_REPLAY = """
import sys
from herder.ensemble.state import StateMachine
from herder.ensemble.txn import decode_txn
sm = StateMachine()
for line in sys.stdin.read().split():
    sm.apply(decode_txn(bytes.fromhex(line)))
print(sm.digest())
"""


def test_replicas_agree_whatever_their_hash_seed() -> None:
    def header(counter: int, seq: int = 0) -> TxnHeader:
        return TxnHeader(make_zxid(1, counter), 1_000, SESSION if seq else 0, seq)

    history: list[Txn] = [
        CreateSession(header(1), SESSION, 10_000),
        WriteTxn(header(2, 1), [CreateLog(f"log{i}", compacted=True) for i in range(5)]),
        WriteTxn(
            header(3, 2),
            [Append(f"log{i % 5}", b"key%d" % i, b"v", owned=True) for i in range(40)],
        ),
        CloseSession(header(4), SESSION),
    ]
    here = StateMachine()
    for txn in history:
        assert here.apply(txn).ok
    stdin = "\n".join(encode_txn(txn).hex() for txn in history)
    root = Path(__file__).resolve().parents[3]
    digests = set()
    for seed in ("0", "1", "2"):
        out = subprocess.run(
            [sys.executable, "-c", _REPLAY],
            input=stdin,
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONHASHSEED": seed},
            cwd=root,
            timeout=60,
            check=True,
        )
        digests.add(out.stdout.strip())
    assert digests == {here.digest()}


# --- a compacted log against a dict ----------------------------------------------------


class CompactedLogModel(RuleBasedStateMachine):
    """A compacted log must read like a dict of latest records (tombstones expire)."""

    def __init__(self) -> None:
        super().__init__()
        self.leader = Leader()
        self.leader.open(SESSION)
        self.leader.write(CreateLog("m", compacted=True))
        # key -> (offset, value, zxid, timestamp) of its latest record
        self.model: dict[bytes, tuple[int, bytes | None, int, int]] = {}
        self.end = 0

    def _expire_tombstones(self) -> None:
        cutoff = self.leader.now - TOMBSTONE_RETENTION_MS
        for key, (_, value, _, ts) in list(self.model.items()):
            if value is None and ts <= cutoff:
                del self.model[key]

    @rule(
        key=st.sampled_from([b"a", b"b", b"c", b"d", b"e"]),
        value=st.one_of(st.none(), st.binary(max_size=6)),
    )
    def write(self, key: bytes, value: bytes | None) -> None:
        result = self.leader.write(Append("m", key, value))
        assert result.offsets == [self.end]
        self._expire_tombstones()
        self.model[key] = (self.end, value, result.zxid, self.leader.now)
        self.end += 1

    @rule(ms=st.sampled_from([1, 1_000, TOMBSTONE_RETENTION_MS // 2, TOMBSTONE_RETENTION_MS]))
    def wait(self, ms: int) -> None:
        self.leader.now += ms
        self.leader.noop()
        self._expire_tombstones()

    @rule(from_offset=st.integers(0, 80), page=st.integers(1, 4))
    def paged_read(self, from_offset: int, page: int) -> None:
        expected = [row for row in self._expected() if row[0] >= from_offset]
        got: list[tuple] = []
        while batch := self.leader.sm.read("m", from_offset, page):
            assert len(batch) <= page
            got.extend((r.offset, r.key, r.value) for r in batch)
            from_offset = batch[-1].offset + 1
        assert got == expected

    def _expected(self) -> list[tuple]:
        return sorted((offset, key, value) for key, (offset, value, _, _) in self.model.items())

    @invariant()
    def reads_like_the_model(self) -> None:
        sm = self.leader.sm
        expected = self._expected()
        assert contents(sm, "m") == expected
        for key, (_, value, zxid, _) in self.model.items():
            assert sm.key_version("m", key) == (zxid if value is not None else None)
            found = sm.get("m", key)
            assert (found.value if found else None) == value
        info = sm.describe("m")
        assert info.end_offset == self.end
        assert info.records == len(expected)
        assert info.start_offset == (expected[0][0] if expected else self.end)


CompactedLogModel.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=80,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_compacted_log_matches_a_dict_model = CompactedLogModel.TestCase
