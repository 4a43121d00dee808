"""``/metrics`` of a real worker after a real pipeline moved N records.

One ensemble server, one worker (a JVM, local[1]). FileStreamSource → topic → two
FileStreamSinks, one of which puts every value through a transform that needs JSON and
tolerates the one line that is not, sending it to a dead letter topic. Once the sinks
have every record: the source's polled and written totals, each sink's read total and
the plain sink's sent total are N, the lag is 0, and the topic's end offset is N; the
tolerant sink counts one record error, one skipped record and one DLQ request.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.e2e.test_pipeline import Cluster, count_lines, sink_config, source_config
from tests.harness import Processes, wait_until
from tests.ops.metrics_text import parse, value

pytestmark = [pytest.mark.integration, pytest.mark.spark]

N = 1_000
BAD_LINE = 500


@pytest.fixture
def cluster(processes: Processes, tmp_path: Path) -> Cluster:
    c = Cluster(processes, tmp_path)
    yield c
    c.http.close()


def running(cluster: Cluster, name: str) -> None:
    def task_running() -> bool:
        return [t["state"] for t in cluster.status(name).get("tasks", [])] == ["RUNNING"]

    wait_until(task_running, timeout=60, what=f"{name}'s task RUNNING")


def scrape(url: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    reply = httpx.get(f"{url}/metrics", timeout=30)
    assert reply.status_code == 200
    assert reply.headers["content-type"].startswith("text/plain")
    return parse(reply.text)


@pytest.mark.timeout(300)
def test_metrics_count_what_a_pipeline_moved(cluster: Cluster, tmp_path: Path) -> None:
    worker = cluster.start_worker()
    source_file = tmp_path / "in.txt"
    lines = [b"%d\n" % i if i != BAD_LINE else b"not json\n" for i in range(N)]
    source_file.write_bytes(b"".join(lines))
    out, tolerant_out = tmp_path / "out.txt", tmp_path / "tolerant.txt"
    # the source last: each new connector rebalances (eager) and restarts every task,
    # and a task's metrics start from zero with each start, as Connect's do; each one
    # once the one before runs, so no creation lands in the middle of a rebalance
    cluster.create("out", sink_config(out, "lines"))
    running(cluster, "out")
    cluster.create(
        "tolerant",
        {
            **sink_config(tolerant_out, "lines"),
            "transforms": "hoist",
            "transforms.hoist.type": "org.apache.kafka.connect.transforms.HoistField$Value",
            "transforms.hoist.field": "v",
            "errors.tolerance": "all",
            "errors.deadletterqueue.topic.name": "dead",
        },
    )
    running(cluster, "tolerant")
    cluster.create("in", source_config(source_file, "lines"))
    wait_until(lambda: count_lines(out) == N, timeout=180, what="all lines at the sink")
    wait_until(lambda: count_lines(tolerant_out) == N - 1, timeout=60, what="the good lines")

    def settled() -> object:
        m = scrape(worker.url)
        out_lag = value(m, "herder_sink_task_lag_records", connector="out", task="0")
        tolerant_lag = value(m, "herder_sink_task_lag_records", connector="tolerant", task="0")
        return m if out_lag == 0 and tolerant_lag == 0 else None

    m = wait_until(settled, timeout=30, what="both sinks' lag at 0")
    assert isinstance(m, dict)
    source = {"connector": "in", "task": "0"}
    assert value(m, "kafka_connect_source_task_source_record_poll_total", **source) == N
    assert value(m, "kafka_connect_source_task_source_record_write_total", **source) == N
    assert value(m, "kafka_connect_source_task_source_record_active_count", **source) == 0
    assert (value(m, "kafka_connect_source_task_poll_batch_avg_time_ms", **source) or 0) > 0
    assert value(m, "kafka_connect_connector_task_status", status="running", **source) == 1
    plain = {"connector": "out", "task": "0"}
    assert value(m, "kafka_connect_sink_task_sink_record_read_total", **plain) == N
    assert value(m, "kafka_connect_sink_task_sink_record_send_total", **plain) == N
    assert value(m, "kafka_connect_sink_task_partition_count", **plain) == 1
    assert value(m, "herder_sink_task_lag_seconds", **plain) == 0
    assert (value(m, "kafka_connect_sink_task_put_batch_avg_time_ms", **plain) or 0) > 0
    assert value(m, "kafka_connect_connector_task_offset_commit_failure_percentage", **plain) == 0
    tolerant = {"connector": "tolerant", "task": "0"}
    assert value(m, "kafka_connect_sink_task_sink_record_read_total", **tolerant) == N
    assert value(m, "kafka_connect_sink_task_sink_record_send_total", **tolerant) == N - 1
    assert value(m, "kafka_connect_task_error_total_record_errors", **tolerant) == 1
    assert value(m, "kafka_connect_task_error_total_records_skipped", **tolerant) == 1
    assert value(m, "kafka_connect_task_error_deadletterqueue_produce_requests", **tolerant) == 1
    assert value(m, "kafka_connect_task_error_total_record_errors", **plain) == 0
    assert value(m, "herder_topic_end_offset", topic="lines", partition="0") == N
    assert value(m, "herder_topic_end_offset", topic="dead", partition="0") == 1
    # these few lines take the trickle path (no Spark job) where they can; the sink
    # with a transform runs its transform as Spark expressions
    assert (value(m, "herder_task_spark_jobs_total", **tolerant) or 0) >= 1
    assert (value(m, "herder_task_spark_job_seconds_total", **tolerant) or 0) > 0
    # the worker's own groups
    assert value(m, "kafka_connect_worker_connector_count") == 3
    assert value(m, "kafka_connect_worker_task_count") == 3
    # every rebalance (eager) restarts the connectors: at least one start each
    assert (value(m, "kafka_connect_worker_connector_startup_success_total") or 0) >= 3
    assert value(m, "kafka_connect_worker_connector_startup_failure_total") == 0
    assert value(m, "kafka_connect_worker_connector_running_task_count", connector="in") == 1
    assert value(m, "kafka_connect_connector_status", connector="out", status="running") == 1
    assert (
        value(m, "kafka_connect_connector_connector_type", connector="out", connector_type="sink")
        == 1
    )
    assert value(m, "kafka_connect_worker_rebalance_completed_rebalances_total") >= 1  # type: ignore[operator]
    assert value(m, "kafka_connect_worker_rebalance_rebalancing") == 0
    assert value(m, "process_resident_memory_bytes") is not None
