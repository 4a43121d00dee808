"""The transaction log across crashes: what was synced survives, torn tails go, rot stops us."""

from __future__ import annotations

import logging
import os

import pytest

from herder.ensemble.storage import SimulatedFileSystem, Storage
from herder.ensemble.storage.frames import HEADER_SIZE, encode
from herder.errors import CorruptStorage

from .support import (
    DATA,
    FILE_SIZE,
    SkipsLogFsync,
    fill,
    frame_offset,
    log_path,
    open_sim,
    payload,
    zx,
)

pytestmark = pytest.mark.unit


def recovered(storage: Storage) -> list[int]:
    return [t.zxid for t in storage.recovery.transactions]


def test_every_synced_transaction_survives_a_crash_and_unsynced_ones_are_lost() -> None:
    fs = SimulatedFileSystem()
    storage = open_sim(fs, log_file_size=64 * 1024)
    acknowledged = 0
    for counter in range(1, 51):
        storage.append(zx(counter), payload(counter))
        if counter % 7 == 0:
            acknowledged = storage.sync()
    assert acknowledged == zx(49)

    fs.crash()
    after = open_sim(fs, log_file_size=64 * 1024)

    assert recovered(after) == [zx(c) for c in range(1, 50)]
    assert [t.payload for t in after.recovery.transactions] == [payload(c) for c in range(1, 50)]
    assert after.last_zxid == after.durable_zxid == zx(49)


def test_a_log_that_skips_fsync_loses_acknowledged_transactions() -> None:
    """The control case: the crash model really drops what no fsync covered."""
    fs = SimulatedFileSystem()
    storage = open_sim(SkipsLogFsync(fs))
    fill(storage, range(1, 11))
    assert storage.sync() == zx(10)  # "acknowledged", but never fsync'd

    fs.crash()

    assert recovered(open_sim(fs)) == []


def test_appends_after_recovery_continue_the_log() -> None:
    fs = SimulatedFileSystem()
    storage = open_sim(fs)
    fill(storage, range(1, 6))
    storage.sync()
    fs.crash()

    storage = open_sim(fs)
    with pytest.raises(ValueError, match="does not follow"):
        storage.append(zx(5), b"again")
    fill(storage, range(6, 9))
    storage.close()

    assert recovered(open_sim(fs)) == [zx(c) for c in range(1, 9)]


def _damage_after_sync(counters: range, offset: int, data: bytes) -> SimulatedFileSystem:
    fs = SimulatedFileSystem()
    storage = open_sim(fs, log_file_size=64 * 1024)
    fill(storage, counters)
    storage.close()
    fs.overwrite(log_path(counters[0]), offset, data)
    return fs


@pytest.mark.parametrize(
    "tail",
    [
        pytest.param(encode(zx(11), payload(11))[: HEADER_SIZE + 5], id="incomplete-frame"),
        pytest.param(encode(zx(11), payload(11))[:-1] + b"?", id="bad-checksum"),
        pytest.param(encode(zx(11), payload(11))[:10], id="partial-header"),
    ],
)
def test_a_torn_last_record_is_dropped_with_a_warning_and_appends_continue(
    tail: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    counters = range(1, 11)
    fs = _damage_after_sync(counters, frame_offset(counters, 11), tail)

    with caplog.at_level(logging.WARNING):
        storage = open_sim(fs, log_file_size=64 * 1024)
    assert recovered(storage) == [zx(c) for c in counters]
    assert any("torn record" in r.getMessage() for r in caplog.records)

    storage.append(zx(11), b"rewritten")
    storage.append(zx(12), b"next")
    storage.close()
    again = open_sim(fs, log_file_size=64 * 1024)
    assert recovered(again)[-2:] == [zx(11), zx(12)]
    assert again.recovery.transactions[-2].payload == b"rewritten"


@pytest.mark.parametrize(
    ("where", "data"),
    [
        pytest.param(HEADER_SIZE + 2, b"#", id="payload-byte-flipped"),
        pytest.param(0, b"\0\0\0\0", id="length-zeroed"),
        pytest.param(0, b"\x00\x7f", id="length-garbled"),
        pytest.param(4, b"\xff", id="checksum-flipped"),
    ],
)
def test_a_damaged_record_followed_by_good_ones_refuses_to_start(where: int, data: bytes) -> None:
    counters = range(1, 11)
    offset = frame_offset(counters, 5)
    fs = _damage_after_sync(counters, offset + where, data)

    with pytest.raises(CorruptStorage) as caught:
        open_sim(fs, log_file_size=64 * 1024)

    message = str(caught.value)
    assert log_path(1) in message
    assert f"offset {offset}" in message
    assert "acknowledged transactions are damaged" in message
    assert "refuses to start" in message
    assert "SNAP" in message


def test_a_zxid_that_does_not_increase_is_corruption() -> None:
    fs = SimulatedFileSystem()
    open_sim(fs).close()
    records = encode(zx(1), b"a") + encode(zx(3), b"b") + encode(zx(2), b"c")
    handle = fs.open(log_path(1), create=True)
    handle.pwrite(records, 0)
    handle.fsync()
    fs.fsync_dir(DATA)

    with pytest.raises(CorruptStorage, match=r"zxid 0x100000002 does not follow 0x100000003"):
        open_sim(fs)


def test_a_file_whose_name_disagrees_with_its_first_record_is_corruption() -> None:
    fs = SimulatedFileSystem()
    open_sim(fs).close()
    handle = fs.open(log_path(7), create=True)
    handle.pwrite(encode(zx(1), b"a"), 0)
    handle.fsync()
    fs.fsync_dir(DATA)

    with pytest.raises(CorruptStorage, match="first record has zxid 0x100000001"):
        open_sim(fs)


def test_records_roll_over_preallocated_files_named_by_their_first_zxid() -> None:
    fs = SimulatedFileSystem()
    storage = open_sim(fs)
    for start in range(1, 101, 10):
        fill(storage, range(start, start + 10))
        storage.sync()
    storage.append(zx(101), b"x" * (3 * FILE_SIZE))  # larger than a file: gets its own
    storage.append(zx(102), b"small")
    storage.close()

    names = sorted(n for n in fs.listdir(DATA) if n.startswith("log."))
    assert len(names) > 5
    first_zxids = []
    for name in names:
        path = os.path.join(DATA, name)
        assert fs.open(path).size() >= FILE_SIZE  # preallocated
        first_zxids.append(int(name[4:], 16))
    reopened = open_sim(fs)
    zxids = recovered(reopened)
    assert zxids == [zx(c) for c in range(1, 103)]
    assert set(first_zxids) <= set(zxids)
    assert zx(102) in first_zxids  # the oversized record filled its file alone
    assert reopened.recovery.transactions[100].payload == b"x" * (3 * FILE_SIZE)


def test_a_batch_within_one_file_costs_one_fsync() -> None:
    fs = SimulatedFileSystem()
    storage = open_sim(fs, log_file_size=1 << 20)
    storage.append(zx(1), b"first")
    storage.sync()  # creates the file
    before = storage.stats()

    fill(storage, range(2, 202))
    assert storage.sync() == zx(201)

    after = storage.stats()
    assert after.fsyncs == before.fsyncs + 1
    assert after.log_bytes_written - before.log_bytes_written == sum(
        len(encode(zx(c), payload(c))) for c in range(2, 202)
    )
    assert after.durable_zxid == zx(201)


def test_an_empty_file_left_by_a_crash_while_rolling_is_removed() -> None:
    fs = SimulatedFileSystem()
    storage = open_sim(fs)
    fill(storage, range(1, 4))
    storage.sync()
    empty = fs.open(log_path(4), create=True)
    empty.allocate(FILE_SIZE)
    empty.fsync()
    fs.fsync_dir(DATA)
    fs.crash()

    storage = open_sim(fs)
    assert not fs.exists(log_path(4))
    fill(storage, range(4, 6))
    storage.close()
    assert recovered(open_sim(fs)) == [zx(c) for c in range(1, 6)]


def test_transactions_after_reads_durable_records_back_across_files() -> None:
    fs = SimulatedFileSystem()
    storage = open_sim(fs)
    fill(storage, range(1, 41))
    storage.sync()
    fill(storage, range(41, 45))  # appended, not durable: not served

    served = [t.zxid for t in storage.transactions_after(zx(17))]

    assert served == [zx(c) for c in range(18, 41)]
    assert storage.first_logged_zxid == zx(1)


def test_transactions_from_starts_in_the_file_holding_the_zxid() -> None:
    fs = SimulatedFileSystem()
    storage = open_sim(fs)
    fill(storage, range(1, 41))
    storage.sync()
    files = sorted(int(n.split(".")[1], 16) for n in fs.listdir(DATA) if n.startswith("log."))
    assert len(files) > 2, "the log should span several files"
    second = files[1]
    # a zxid inside the second file: reading starts at that file, not at the first
    served = [t.zxid for t in storage.transactions_from(second + 2)]
    assert served == [z for z in (zx(c) for c in range(1, 41)) if z >= second]
    assert next(t.zxid for t in storage.transactions_from(zx(40))) <= zx(40)
    # a zxid before the log begins: nothing
    assert list(storage.transactions_from(zx(0))) == []
