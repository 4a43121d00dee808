import pytest

from herder.runtime.core.protocol import Assignment, AssignmentError
from herder.runtime.core.rules import (
    AfterRebalance,
    ReconfigurationSchedule,
    RequestQueue,
    after_rebalance,
)

pytestmark = pytest.mark.unit


def assignment(offset: int, error: int = AssignmentError.NO_ERROR) -> Assignment:
    return Assignment(error=error, leader="w1", leader_url="http://w1", config_offset=offset)


@pytest.mark.parametrize(
    ("assigned", "local", "error", "expected"),
    [
        (5, 5, AssignmentError.NO_ERROR, AfterRebalance.START),
        (7, 5, AssignmentError.NO_ERROR, AfterRebalance.CATCH_UP_THEN_START),
        (5, 7, AssignmentError.NO_ERROR, AfterRebalance.REJOIN),
        (9, 9, AssignmentError.CONFIG_MISMATCH, AfterRebalance.CATCH_UP_AND_REJOIN),
        (9, 2, AssignmentError.CONFIG_MISMATCH, AfterRebalance.CATCH_UP_AND_REJOIN),
    ],
)
def test_after_rebalance(assigned: int, local: int, error: int, expected: AfterRebalance) -> None:
    assert after_rebalance(assignment(assigned, error), local) is expected


def test_requests_run_by_due_time_then_arrival() -> None:
    queue: RequestQueue[str] = RequestQueue()
    queue.push("late", now_ms=0, delay_ms=500)
    queue.push("first", now_ms=0)
    queue.push("second", now_ms=0)
    queue.push("soon", now_ms=0, delay_ms=100)
    assert queue.next_due_ms() == 0
    assert [queue.pop_due(0), queue.pop_due(0), queue.pop_due(0)] == ["first", "second", None]
    assert queue.next_due_ms() == 100
    assert queue.pop_due(99) is None
    assert queue.pop_due(100) == "soon"
    queue.push("after", now_ms=200)
    assert queue.pop_due(1000) == "after"  # due at 200, before "late" at 500
    assert queue.drain() == ["late"] and len(queue) == 0


def test_reconfiguration_backs_off_doubling_to_a_cap() -> None:
    schedule = ReconfigurationSchedule()
    schedule.request("c", now_ms=0)
    assert schedule.due(0) == ["c"]
    delays = []
    now = 0
    for _ in range(12):
        delays.append(schedule.failed("c", now))
        now = schedule.next_due_ms() or 0
        assert schedule.due(now - 1) == [] and schedule.due(now) == ["c"]
    assert delays[:5] == [250, 500, 1000, 2000, 4000]
    assert max(delays) == 60_000 and delays[-1] == 60_000
    # a new request does not cut a scheduled retry short
    schedule.request("c", now_ms=now - 10)
    assert schedule.due(now - 10) == []
    schedule.succeeded("c")
    assert schedule.next_due_ms() is None
