"""Record framing: round trips, and a torn tail told apart from damage before good records."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from herder.ensemble.storage.frames import bytes_after, encode, scan

pytestmark = pytest.mark.unit

payloads = st.lists(st.binary(max_size=64), min_size=2, max_size=12)


def _log(records: list[bytes]) -> tuple[bytes, list[int]]:
    """The records framed with zxids 1, 2, …, and each frame's start offset."""
    data, starts = b"", []
    for zxid, body in enumerate(records, start=1):
        starts.append(len(data))
        data += encode(zxid, body)
    return data, starts


@given(payloads, st.integers(0, 100))
def test_records_round_trip_up_to_the_preallocated_zeros(records: list[bytes], pad: int) -> None:
    data, _ = _log(records)
    result = scan(data + bytes(pad), 0)
    assert [t.payload for t in result.txns] == records
    assert [t.zxid for t in result.txns] == list(range(1, len(records) + 1))
    assert (result.end, result.last_zxid, result.damage) == (len(data), len(records), None)


@given(payloads, st.data())
def test_a_cut_inside_the_last_record_is_a_torn_tail(
    records: list[bytes], data: st.DataObject
) -> None:
    log, starts = _log(records)
    cut = data.draw(st.integers(starts[-1] + 1, len(log) - 1))
    result = scan(log[:cut] + bytes(50), 0)
    # (a cut within the length's leading zero bytes leaves nothing to see at all)
    assert result.damage is None or not result.damage.followed_by_valid
    if not any(log[cut:]):
        # the bytes lost were zeros, which the preallocated tail supplies again: the
        # record is whole and correctly kept
        assert (result.end, len(result.txns)) == (len(log), len(records))
    else:
        assert (result.end, len(result.txns)) == (starts[-1], len(records) - 1)


@given(payloads, st.data())
def test_any_flipped_byte_before_the_last_record_is_damage_to_synced_data(
    records: list[bytes], data: st.DataObject
) -> None:
    log, starts = _log(records)
    where = data.draw(st.integers(0, starts[-1] - 1))
    flip = data.draw(st.integers(1, 255))
    damaged = bytearray(log)
    damaged[where] ^= flip
    result = scan(bytes(damaged) + bytes(20), 0)
    assert result.damage is not None and result.damage.followed_by_valid
    assert result.damage.offset <= where


def test_scanning_until_a_zxid_ignores_what_follows() -> None:
    log, starts = _log([b"a", b"b", b"c"])
    half_written = log[: starts[2] + 5]
    result = scan(half_written, 0, until=2)
    assert [t.zxid for t in result.txns] == [1, 2]
    assert (result.end, result.damage) == (starts[2], None)


@given(payloads, st.integers(0, 13), st.integers(0, 13), st.integers(0, 100))
def test_bytes_after_a_zxid_counts_the_frames_a_scan_returns_after_it(
    records: list[bytes], zxid: int, until: int, pad: int
) -> None:
    data, _ = _log(records)
    expected = sum(
        len(encode(t.zxid, t.payload)) for t in scan(data, 0).txns if zxid < t.zxid <= until
    )
    assert bytes_after(data + bytes(pad), zxid, until) == expected
