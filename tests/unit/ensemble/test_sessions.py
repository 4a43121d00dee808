"""The leader's session tracker and session id allocator."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from herder.ensemble.sessions import SessionIdAllocator, SessionTracker

pytestmark = pytest.mark.unit

TICK = 100


def test_a_session_expires_at_the_tick_after_its_timeout() -> None:
    tracker = SessionTracker(tick_ms=TICK)
    tracker.add(1, timeout_ms=1_000, now_ms=5_050)
    assert tracker.deadline(1) == 6_100  # 6_050 rounded up to the next tick
    assert tracker.next_deadline() == 6_100
    assert tracker.expired(6_099) == []
    assert tracker.expired(6_100) == [1]
    assert 1 not in tracker
    assert tracker.expired(10_000) == []  # reported once, then forgotten
    assert tracker.next_deadline() is None


def test_touch_moves_the_deadline_forward_only() -> None:
    tracker = SessionTracker(tick_ms=TICK)
    tracker.add(1, timeout_ms=1_000, now_ms=0)
    assert tracker.touch(1, now_ms=900)
    assert tracker.deadline(1) == 2_000
    assert tracker.touch(1, now_ms=100)  # a late relayed touch does not shorten it
    assert tracker.deadline(1) == 2_000
    assert tracker.expired(1_999) == []
    assert tracker.expired(2_000) == [1]
    assert not tracker.touch(1, now_ms=2_000)
    assert not tracker.touch(42, now_ms=0)


def test_sessions_in_one_tick_expire_together_in_id_order() -> None:
    tracker = SessionTracker(tick_ms=TICK)
    for session_id, now in [(3, 10), (1, 20), (2, 99), (4, 100)]:
        tracker.add(session_id, timeout_ms=500, now_ms=now)
    assert tracker.next_deadline() == 600
    assert tracker.expired(650) == [1, 2, 3]
    assert tracker.next_deadline() == 700
    assert len(tracker) == 1


def test_removed_sessions_never_expire() -> None:
    tracker = SessionTracker(tick_ms=TICK)
    tracker.add(1, timeout_ms=300, now_ms=0)
    tracker.add(2, timeout_ms=900, now_ms=0)
    tracker.remove(1)
    tracker.remove(99)
    assert tracker.next_deadline() == 1_000  # the emptied earlier bucket is skipped
    assert tracker.expired(5_000) == [2]


def test_adding_again_resets_the_session() -> None:
    tracker = SessionTracker(tick_ms=TICK)
    tracker.add(1, timeout_ms=300, now_ms=0)
    tracker.add(1, timeout_ms=5_000, now_ms=0)
    assert tracker.expired(4_000) == []
    assert tracker.expired(5_100) == [1]


def test_invalid_arguments() -> None:
    with pytest.raises(ValueError):
        SessionTracker(tick_ms=0)
    with pytest.raises(ValueError):
        SessionTracker().add(1, timeout_ms=0, now_ms=0)


_events = st.lists(
    st.tuples(
        st.sampled_from(["add", "touch", "remove", "expire"]),
        st.integers(1, 5),
        st.integers(0, 700),  # time advances by this much before the event
        st.sampled_from([150, 400, 1_000]),
    ),
    max_size=60,
)


@settings(deadline=None)
@given(_events)
def test_tracker_matches_a_plain_dict_of_deadlines(events: list[tuple[str, int, int, int]]) -> None:
    tracker = SessionTracker(tick_ms=TICK)
    timeouts: dict[int, int] = {}
    deadlines: dict[int, int] = {}
    now = 0
    for kind, session_id, step, timeout in events:
        now += step
        if kind == "add":
            tracker.add(session_id, timeout, now)
            timeouts[session_id] = timeout
            deadlines[session_id] = ((now + timeout) // TICK + 1) * TICK
        elif kind == "touch":
            assert tracker.touch(session_id, now) == (session_id in deadlines)
            if session_id in deadlines:
                later = ((now + timeouts[session_id]) // TICK + 1) * TICK
                deadlines[session_id] = max(deadlines[session_id], later)
        elif kind == "remove":
            tracker.remove(session_id)
            deadlines.pop(session_id, None)
        else:
            due = sorted(s for s, deadline in deadlines.items() if deadline <= now)
            assert tracker.expired(now) == due
            for s in due:
                del deadlines[s]
        assert tracker.next_deadline() == min(deadlines.values(), default=None)
        assert len(tracker) == len(deadlines)
        for s in range(1, 6):
            assert tracker.deadline(s) == deadlines.get(s)


def test_allocated_ids_carry_the_server_id_and_count_up() -> None:
    allocator = SessionIdAllocator(server_id=3, now_ms=1_700_000_000_000)
    first, second = allocator.allocate(), allocator.allocate()
    assert second == first + 1
    assert first >> 56 == 3
    assert first & 0xFFFF == 0  # the counter starts above the time bits
    assert (first >> 16) & ((1 << 40) - 1) == 1_700_000_000_000 & ((1 << 40) - 1)


def test_ids_do_not_collide_across_servers_or_restarts() -> None:
    one = SessionIdAllocator(server_id=1, now_ms=1_000)
    two = SessionIdAllocator(server_id=2, now_ms=1_000)
    ids_one = {one.allocate() for _ in range(1_000)}
    ids_two = {two.allocate() for _ in range(1_000)}
    assert not ids_one & ids_two
    restarted = SessionIdAllocator(server_id=1, now_ms=1_001)
    assert restarted.allocate() > max(ids_one)


def test_allocator_never_hands_out_zero_and_checks_its_server_id() -> None:
    assert SessionIdAllocator(server_id=0, now_ms=0).allocate() == 1
    with pytest.raises(ValueError):
        SessionIdAllocator(server_id=256, now_ms=0)
    with pytest.raises(ValueError):
        SessionIdAllocator(server_id=-1, now_ms=0)
