"""One heap of timers on an injected clock, with lazy cancellation."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from herder.coordinator.timers import TimerQueue

pytestmark = pytest.mark.unit


def test_timers_fire_in_deadline_order_and_ties_in_scheduling_order() -> None:
    queue = TimerQueue()
    fired: list[str] = []
    queue.schedule(30, lambda: fired.append("c"))
    queue.schedule(10, lambda: fired.append("a1"))
    queue.schedule(10, lambda: fired.append("a2"))
    queue.schedule(20, lambda: fired.append("b"))

    assert queue.run_due(9) == 0
    assert queue.run_due(20) == 3
    assert fired == ["a1", "a2", "b"]
    assert queue.next_deadline() == 30


def test_a_cancelled_timer_never_fires() -> None:
    queue = TimerQueue()
    fired: list[int] = []
    timer = queue.schedule(10, lambda: fired.append(1))
    queue.schedule(20, lambda: fired.append(2))
    timer.cancel()

    assert len(queue) == 1
    assert queue.next_deadline() == 20
    queue.run_due(100)
    assert fired == [2]
    assert not timer.pending and timer.cancelled and not timer.fired


def test_cancelling_a_fired_timer_changes_nothing() -> None:
    queue = TimerQueue()
    timer = queue.schedule(10, lambda: None)
    queue.run_due(10)
    timer.cancel()
    assert timer.fired and not timer.cancelled
    assert len(queue) == 0


def test_a_timer_scheduled_by_an_action_for_now_fires_in_the_same_run() -> None:
    queue = TimerQueue()
    fired: list[str] = []

    def schedule_another() -> None:
        queue.schedule(5, lambda: fired.append("late"))

    queue.schedule(10, schedule_another)
    queue.run_due(10)
    assert fired == ["late"]


def test_clear_drops_every_timer() -> None:
    queue = TimerQueue()
    fired: list[int] = []
    timer = queue.schedule(1, lambda: fired.append(1))
    queue.clear()
    queue.run_due(10)
    assert fired == [] and len(queue) == 0 and timer.cancelled
    assert queue.next_deadline() is None


def test_ten_thousand_members_rearming_their_sessions_keep_the_heap_small() -> None:
    """Heartbeats cancel and re-arm constantly: cancelled entries must not pile up."""
    queue = TimerQueue()
    expired: list[int] = []

    def expire(member: int) -> Callable[[], None]:
        return lambda: expired.append(member)

    timers = [queue.schedule(10_000, expire(i)) for i in range(10_000)]
    for round_ in range(1, 6):
        for i, timer in enumerate(timers):
            timer.cancel()
            timers[i] = queue.schedule(10_000 + round_ * 1000, expire(i))
        assert len(queue) == 10_000
        assert queue.heap_size <= 2 * 10_000 + 1

    queue.run_due(14_999)
    assert expired == []
    queue.run_due(15_000)
    assert sorted(expired) == list(range(10_000))
