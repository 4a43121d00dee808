"""Pipelines on a real Spark cluster and on a real Spark Connect server.

The worker's jobs run on a standalone cluster (a Master and two Workers of one core,
started from the scripts inside the pyspark wheel), or in the session of a Spark Connect
server; everything else is as in the other end-to-end tests: real ensemble and worker
processes on 127.0.0.1, real files. Each kind gets file → topic → directory (a backlog
read by byte ranges on the executors) and directory → topic → file, and, under
``make soak``, the exactly-once kill -9 test.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.test_pipeline import (
    Cluster,
    finish,
    numbers_pipeline,
    wait_for_lines,
    wait_for_owner,
)
from tests.fixtures.spark_cluster import ConnectServer, StandaloneCluster, wait_for_executors
from tests.harness import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.spark]

LINES = 60_000


@pytest.fixture(scope="module")
def standalone() -> Iterator[StandaloneCluster]:
    cluster = StandaloneCluster(workers=2, cores=1, memory="1g")
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def connect_server() -> Iterator[ConnectServer]:
    pytest.importorskip("grpc", reason="Spark Connect's client: pip install -e '.[connect]'")
    server = ConnectServer()
    try:
        yield server
    finally:
        server.stop()


def on_standalone(cluster: StandaloneCluster) -> dict[str, str]:
    """A worker's Spark settings for the cluster: one executor of one core each, so two
    workers' applications run side by side."""
    return {
        "spark.master": cluster.master_url,
        "spark.cores.max": "1",
        "spark.executor.memory": "512m",
        "spark.driver.memory": "512m",
        "spark.driver.host": "127.0.0.1",
        "spark.sql.shuffle.partitions": "2",
    }


def on_connect(server: ConnectServer) -> dict[str, str]:
    return {"spark.remote": server.url, "spark.sql.shuffle.partitions": "2"}


def failures(cluster: Cluster, names: list[str]) -> list[str]:
    return [
        f"{name}: {task.get('trace')}"
        for name in names
        for task in cluster.status(name).get("tasks", [])
        if task["state"] == "FAILED"
    ]


def text_of(line: str) -> str:
    """The ``text`` field of a row as FileStreamSink wrote it: JSON, with or without
    JsonConverter's schema envelope."""
    value = json.loads(line)
    return str(value.get("payload", value)["text"])


def both_directions(cluster: Cluster, tmp_path: Path) -> None:
    """file → topic → directory and directory → topic → file, each line once."""
    lines_in, lines_out = tmp_path / "lines.txt", tmp_path / "lines-out"
    with open(lines_in, "w") as f:
        for i in range(LINES):
            f.write(f"line {i:09d} " + "x" * (i % 50) + "\n")
    texts_in, texts_out = tmp_path / "texts", tmp_path / "texts-out.txt"
    texts_in.mkdir()
    expected_texts = []
    for index in range(3):
        rows = [f"file {index} row {i:05d}" for i in range(2_000)]
        hidden = texts_in / f".part-{index}.json"  # hidden until complete
        hidden.write_text("".join(json.dumps({"text": r}) + "\n" for r in rows))
        hidden.rename(texts_in / f"part-{index}.json")
        expected_texts += rows
    cluster.create(
        "lines-out",
        {"connector.class": "DirectorySink", "directory": str(lines_out), "format": "text",
         "topics": "lines"},
    )  # fmt: skip
    cluster.create(
        "lines-in",
        {"connector.class": "FileStreamSource", "file": str(lines_in), "topic": "lines",
         "parallel.min.bytes": "100000", "parallel.split.bytes": "1000000"},
    )  # fmt: skip
    cluster.create(
        "texts-out",
        {"connector.class": "FileStreamSink", "file": str(texts_out), "topics": "texts"},
    )  # fmt: skip
    cluster.create(
        "texts-in",
        {"connector.class": "DirectorySource", "directory": str(texts_in), "format": "json",
         "topic": "texts", "poll.interval.ms": "200"},
    )  # fmt: skip
    names = ["lines-in", "lines-out", "texts-in", "texts-out"]
    expected_lines = lines_in.read_bytes()

    def arrived() -> bool:
        failed = failures(cluster, names)
        assert not failed, failed[0]
        files = sorted(p for p in lines_out.iterdir() if p.is_file()) if lines_out.exists() else []
        done = sum(p.stat().st_size for p in files) >= len(expected_lines)
        return done and texts_out.exists() and texts_out.read_text().count("\n") >= 6_000

    wait_until(arrived, timeout=420, interval=0.5, what="both pipelines' output")
    files = sorted(p for p in lines_out.iterdir() if p.is_file())
    assert b"".join(p.read_bytes() for p in files) == expected_lines
    assert sorted(text_of(line) for line in texts_out.read_text().splitlines()) == sorted(
        expected_texts
    )
    for topic, count in (("lines", LINES), ("texts", 6_000)):
        described = cluster.describe_topic(topic)
        assert sum(p["end_offset"] for p in described["partition_details"]) == count


@pytest.mark.timeout(900)
def test_pipelines_run_on_a_standalone_cluster(
    standalone: StandaloneCluster, cluster: Cluster, tmp_path: Path
) -> None:
    cluster.start_worker(spark=on_standalone(standalone))
    both_directions(cluster, tmp_path)
    app = wait_for_executors(standalone, "herder")
    assert app["cores"] == 1, app
    # the jobs ran in executors the cluster's Workers launched
    assert standalone.executor_dirs(), "no executor was launched on the cluster"


@pytest.mark.timeout(900)
def test_pipelines_run_on_spark_connect(
    connect_server: ConnectServer, cluster: Cluster, tmp_path: Path
) -> None:
    cluster.start_worker(spark=on_connect(connect_server))
    both_directions(cluster, tmp_path)
    assert "Session not found" not in connect_server.log()


def kill9_exactly_once(cluster: Cluster, tmp_path: Path, spark: dict[str, str]) -> None:
    cluster.start_worker(spark=spark)
    cluster.start_worker(spark=spark)
    output, writer = numbers_pipeline(cluster, tmp_path)
    try:
        wait_for_lines(output, 2_000)
        victim = wait_for_owner(cluster, "numbers-source")
        cluster.kill9(victim)
        cluster.start_worker(spark=spark)
        wait_for_owner(cluster, "numbers-source")
        wait_for_owner(cluster, "numbers-sink")
        wait_for_lines(output, output.read_bytes().count(b"\n") + 2_000)
    finally:
        total = writer.stop()
    finish(cluster, output, total)


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_kill9_exactly_once_on_a_standalone_cluster(
    standalone: StandaloneCluster, cluster: Cluster, tmp_path: Path
) -> None:
    kill9_exactly_once(cluster, tmp_path, on_standalone(standalone))


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_kill9_exactly_once_on_spark_connect(
    connect_server: ConnectServer, cluster: Cluster, tmp_path: Path
) -> None:
    kill9_exactly_once(cluster, tmp_path, on_connect(connect_server))
