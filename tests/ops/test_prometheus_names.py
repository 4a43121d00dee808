"""The one rule from Connect's metric groups and names to Prometheus names, and the text."""

from __future__ import annotations

import pytest

from herder.runtime.core.protocol import ConnectorTaskId
from herder.runtime.rest.prometheus import prometheus_name, render
from herder.runtime.task_metrics import TaskMetrics, WorkerMetrics
from tests.ops.metrics_text import parse, value

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("group", "name", "expected"),
    [
        (
            "source-task-metrics",
            "source-record-poll-total",
            "kafka_connect_source_task_source_record_poll_total",
        ),
        (
            "sink-task-metrics",
            "put-batch-avg-time-ms",
            "kafka_connect_sink_task_put_batch_avg_time_ms",
        ),
        ("connect-worker-metrics", "connector-count", "kafka_connect_worker_connector_count"),
        (
            "connect-worker-rebalance-metrics",
            "rebalance-avg-time-ms",
            "kafka_connect_worker_rebalance_rebalance_avg_time_ms",
        ),
        (
            "connector-task-metrics",
            "offset-commit-failure-percentage",
            "kafka_connect_connector_task_offset_commit_failure_percentage",
        ),
        (
            "task-error-metrics",
            "deadletterqueue-produce-requests",
            "kafka_connect_task_error_deadletterqueue_produce_requests",
        ),
        ("connector-metrics", "status", "kafka_connect_connector_status"),
        ("herder", "sink-task-lag-records", "herder_sink_task_lag_records"),
    ],
)
def test_one_rule_maps_every_group(group: str, name: str, expected: str) -> None:
    assert prometheus_name(group, name) == expected


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_source_tasks_counts_rates_and_averages_render() -> None:
    clock = Clock()
    worker = WorkerMetrics(clock)
    worker.connector("in", "FileStreamSourceConnector", "source")
    worker.connector_status("in", "running")
    task = worker.task(ConnectorTaskId("in", 0), "source")
    task.set_status("running")
    task.source_polled(300, 0.2)
    clock.now += 1
    task.source_committed(300, 0.05)
    task.source_polled(100, 0.4)
    task.source_committed(100, 0.15)
    samples = parse(render(worker.samples({"in": {"running": 1}}), process=False).decode())
    labels = {"connector": "in", "task": "0"}
    assert value(samples, "kafka_connect_source_task_source_record_poll_total", **labels) == 400
    assert value(samples, "kafka_connect_source_task_source_record_write_total", **labels) == 400
    # 400 records in the last 30 s window
    assert value(
        samples, "kafka_connect_source_task_source_record_write_rate", **labels
    ) == pytest.approx(400 / 30)
    assert value(
        samples, "kafka_connect_source_task_poll_batch_avg_time_ms", **labels
    ) == pytest.approx(300)
    assert value(samples, "kafka_connect_connector_task_batch_size_max", **labels) == 300
    assert value(
        samples, "kafka_connect_connector_task_offset_commit_avg_time_ms", **labels
    ) == pytest.approx(100)
    assert (
        value(samples, "kafka_connect_connector_task_offset_commit_failure_percentage", **labels)
        == 0
    )
    assert value(samples, "kafka_connect_connector_task_status", status="running", **labels) == 1
    assert value(samples, "kafka_connect_connector_status", connector="in", status="running") == 1
    assert value(samples, "kafka_connect_worker_task_count") == 1
    assert value(samples, "kafka_connect_worker_connector_running_task_count", connector="in") == 1
    # out of the window, the rate falls to 0 while the total stays
    clock.now += 31
    samples = parse(render(worker.samples(), process=False).decode())
    assert value(samples, "kafka_connect_source_task_source_record_write_rate", **labels) == 0
    assert value(samples, "kafka_connect_source_task_source_record_write_total", **labels) == 400
    # running the whole time since it was set running (1 s of 32 s before that unassigned)
    assert value(samples, "kafka_connect_connector_task_running_ratio", **labels) == pytest.approx(
        1.0
    )


def test_errors_and_lag_of_a_sink_task() -> None:
    task = TaskMetrics(ConnectorTaskId("out", 2), "sink")
    task.sink_read(10)
    task.record_errors_seen(3, skipped=True, logged=False, dead_letters=True)
    task.sink_put(7, 0.01)
    task.sink_lag(5, 1.5)
    samples = parse(render(task.samples(), process=False).decode())
    labels = {"connector": "out", "task": "2"}
    assert value(samples, "kafka_connect_task_error_total_record_errors", **labels) == 3
    assert value(samples, "kafka_connect_task_error_total_records_skipped", **labels) == 3
    assert (
        value(samples, "kafka_connect_task_error_deadletterqueue_produce_requests", **labels) == 1
    )
    assert value(samples, "kafka_connect_sink_task_sink_record_send_total", **labels) == 7
    assert value(samples, "herder_sink_task_lag_records", **labels) == 5
    assert value(samples, "herder_sink_task_lag_seconds", **labels) == 1.5
    # nothing averaged yet: left out rather than NaN
    assert (
        value(samples, "kafka_connect_connector_task_offset_commit_avg_time_ms", **labels) is None
    )


def test_spark_jobs_are_counted_once_each_by_their_job_group() -> None:
    task = TaskMetrics(ConnectorTaskId("in", 0), "source")
    task.spark.add(0.5, [7, 8])
    task.spark.add(0.25, [7, 8, 9])  # job 9 is new
    task.spark.add(0.25, [9])  # Spark forgot 7 and 8: nothing new
    task.spark.add(0.5)  # no job tracker (Spark Connect): one submission, one job
    samples = parse(render(task.samples(), process=False).decode())
    labels = {"connector": "in", "task": "0"}
    assert value(samples, "herder_task_spark_jobs_total", **labels) == 4
    assert value(samples, "herder_task_spark_job_seconds_total", **labels) == 1.5
