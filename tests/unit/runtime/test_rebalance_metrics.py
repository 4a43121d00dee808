import pytest

from herder.runtime.core.rebalance_metrics import RebalanceMetrics

pytestmark = pytest.mark.unit

NAMES = {
    "completed-rebalances-total",
    "rebalancing",
    "epoch",
    "leader-name",
    "rebalance-avg-time-ms",
    "rebalance-max-time-ms",
    "time-since-last-rebalance-ms",
}


def test_before_any_rebalance_nothing_is_known() -> None:
    snapshot = RebalanceMetrics().snapshot(now_ms=1_000)
    assert set(snapshot) == NAMES
    assert snapshot["completed-rebalances-total"] == 0
    assert snapshot["rebalancing"] == 0
    assert snapshot["epoch"] is None
    assert snapshot["leader-name"] is None
    assert snapshot["rebalance-avg-time-ms"] is None
    assert snapshot["rebalance-max-time-ms"] is None
    assert snapshot["time-since-last-rebalance-ms"] is None


def test_a_rebalance_is_under_way_from_its_start_to_its_completion() -> None:
    metrics = RebalanceMetrics()
    metrics.started(100)
    during = metrics.snapshot(150)
    assert during["rebalancing"] == 1
    assert during["completed-rebalances-total"] == 0
    metrics.completed(400, generation=3, leader="http://w1:8083")
    after = metrics.snapshot(1_000)
    assert after["rebalancing"] == 0
    assert after["completed-rebalances-total"] == 1
    assert after["epoch"] == 3
    assert after["leader-name"] == "http://w1:8083"
    assert after["rebalance-avg-time-ms"] == 300
    assert after["rebalance-max-time-ms"] == 300
    assert after["time-since-last-rebalance-ms"] == 600


def test_average_and_maximum_cover_every_completed_rebalance() -> None:
    metrics = RebalanceMetrics()
    for start, end, generation in [(0, 100, 1), (1_000, 1_500, 2), (2_000, 2_300, 3)]:
        metrics.started(start)
        metrics.completed(end, generation=generation, leader="http://w2:8083")
    snapshot = metrics.snapshot(3_000)
    assert snapshot["completed-rebalances-total"] == 3
    assert snapshot["rebalance-avg-time-ms"] == pytest.approx(300)
    assert snapshot["rebalance-max-time-ms"] == 500
    assert snapshot["epoch"] == 3
    assert snapshot["time-since-last-rebalance-ms"] == 700


def test_a_second_start_during_a_rebalance_is_the_same_rebalance() -> None:
    metrics = RebalanceMetrics()
    metrics.started(0)
    metrics.started(200)  # e.g. the member rejoined before the assignment's work started
    metrics.completed(500, generation=7, leader="http://w1:8083")
    snapshot = metrics.snapshot(500)
    assert snapshot["completed-rebalances-total"] == 1
    assert snapshot["rebalance-max-time-ms"] == 500


def test_a_generation_begun_without_a_start_updates_epoch_and_leader_but_counts_nothing() -> None:
    metrics = RebalanceMetrics()
    metrics.completed(50, generation=4, leader="http://w3:8083")
    snapshot = metrics.snapshot(60)
    assert snapshot["completed-rebalances-total"] == 0
    assert snapshot["epoch"] == 4
    assert snapshot["leader-name"] == "http://w3:8083"
    assert snapshot["time-since-last-rebalance-ms"] is None
