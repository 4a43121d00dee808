"""Pipelines on a real Spark cluster and on a real Spark Connect server.

The worker's jobs run on a standalone cluster (a Master and two Workers of one core,
started from the scripts inside the pyspark wheel), or in the session of a Spark Connect
server; everything else is as in the other end-to-end tests: real ensemble and worker
processes on 127.0.0.1, real files. Each kind gets file → topic → directory (a backlog
read by byte ranges on the executors), directory → topic → file, and the exactly-once
kill -9 test; over Spark Connect, a table read by key ranges and a CDC snapshot too.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from tests.connectors.cdc import cdc_config
from tests.connectors.jdbc import credentials
from tests.e2e.test_pipeline import (
    Cluster,
    finish,
    numbers_pipeline,
    wait_for_lines,
    wait_for_owner,
)
from tests.fixtures.postgres import (
    PostgresServer,
    database,
    logical_database,
    logical_postgres,
    postgres,
)
from tests.fixtures.spark_cluster import ConnectServer, StandaloneCluster, wait_for_executors
from tests.harness import wait_until

__all__ = ["database", "logical_database", "logical_postgres", "postgres"]

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


def worker_logs(cluster: Cluster) -> Callable[[], str]:
    return lambda: "".join(worker.proc.output() for worker in cluster.workers)


def both_directions(cluster: Cluster, tmp_path: Path, logs: Callable[[], str]) -> None:
    """file → topic → directory and directory → topic → file, each line once; ``logs``
    gives what the workers logged."""
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
         "parallel.min.bytes": "100000", "parallel.split.bytes": "500000",
         # batches of a quarter of the file: read by byte ranges (a Python Data Source)
         # rather than whole by Spark's text reader
         "parallel.max.bytes": "1200000", "parallel.whole.max.bytes": "1200000"},
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
    assert re.search(r"lines\.txt: reading bytes \d+ to \d+ in \d+ ranges", logs()), (
        "the backlog was not read by byte ranges on the executors"
    )
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
    both_directions(cluster, tmp_path, worker_logs(cluster))
    app = wait_for_executors(standalone, "herder")
    assert app["cores"] == 1, app
    # the jobs ran in executors the cluster's Workers launched
    assert standalone.executor_dirs(), "no executor was launched on the cluster"


@pytest.mark.timeout(900)
def test_pipelines_run_on_spark_connect(
    connect_server: ConnectServer, cluster: Cluster, tmp_path: Path
) -> None:
    cluster.start_worker(spark=on_connect(connect_server))
    both_directions(cluster, tmp_path, worker_logs(cluster))
    assert "Session not found" not in connect_server.log()


TABLE_ROWS = 20_000


@pytest.mark.timeout(900)
def test_a_table_is_read_in_parallel_over_spark_connect(
    connect_server: ConnectServer,
    cluster: Cluster,
    postgres: PostgresServer,
    database: str,
    tmp_path: Path,
) -> None:
    """JdbcSource's key-range reads are a Python Data Source that runs in the Connect
    server's session; the rows come out typed and each once."""
    db = database.rsplit("/", 1)[1]
    postgres.execute(
        "CREATE TABLE items (id bigint PRIMARY KEY, name text, amount numeric(12,2));"
        f" INSERT INTO items SELECT i, 'item ' || i, i / 100.0"
        f" FROM generate_series(1, {TABLE_ROWS}) AS i",
        db,
    )
    cluster.start_worker(spark=on_connect(connect_server))
    outbox = tmp_path / "items"
    typed = {"value.converter.schemas.enable": "true"}
    cluster.create(
        "items-out",
        {"connector.class": "DirectorySink", "directory": str(outbox), "format": "parquet",
         "topics": "pg-items", **typed},
    )  # fmt: skip
    cluster.create(
        "items-in",
        {"connector.class": "JdbcSource", "mode": "incrementing",
         "incrementing.column.name": "id", "table.whitelist": "items", "topic.prefix": "pg-",
         "poll.interval.ms": "200", "parallel.min.rows": "1000", "parallel.split.rows": "5000",
         **credentials(database)},
    )  # fmt: skip

    def rows_out() -> list[dict[str, object]] | None:
        failed = failures(cluster, ["items-in", "items-out"])
        assert not failed, failed[0]
        files = sorted(outbox.glob("*.parquet")) if outbox.exists() else []
        rows = [r for f in files for r in pq.read_table(f).to_pylist()]
        return rows if len(rows) >= TABLE_ROWS else None

    rows: Any = wait_until(rows_out, timeout=420, interval=0.5, what="the table's rows")
    assert sorted(r["id"] for r in rows) == list(range(1, TABLE_ROWS + 1))
    first = min(rows, key=lambda r: r["id"])
    assert first["name"] == "item 1"
    assert first["amount"] == Decimal("0.01")
    # read by key ranges (the Python Data Source), not in one piece
    pieces = re.findall(
        r"\((?:at most )?\d+ rows in (\d+) pieces\)", cluster.workers[0].proc.output()
    )
    assert pieces and max(int(p) for p in pieces) > 1, pieces


SNAPSHOT_ROWS = 2_500


@pytest.mark.timeout(900)
def test_a_cdc_snapshot_is_read_in_chunks_over_spark_connect(
    connect_server: ConnectServer,
    cluster: Cluster,
    logical_postgres: PostgresServer,
    logical_database: str,
    tmp_path: Path,
) -> None:
    """PostgresCdcSource's snapshot chunks (key-range reads held with localCheckpoint)
    run in the Connect server's session; every row comes out once, as a read event."""
    db = logical_database.rsplit("/", 1)[1]
    logical_postgres.execute(
        "CREATE TABLE stock (id integer PRIMARY KEY, item text);"
        f" INSERT INTO stock SELECT i, 'item ' || i FROM generate_series(1, {SNAPSHOT_ROWS}) i",
        db,
    )
    cluster.start_worker(spark=on_connect(connect_server))
    out = tmp_path / "stock.jsonl"
    cluster.create(
        "stock-out",
        {"connector.class": "FileStreamSink", "file": str(out), "topics": "pg.public.stock"},
    )  # fmt: skip
    cluster.create(
        "stock-in",
        {"connector.class": "PostgresCdcSource",
         **cdc_config(logical_postgres, logical_database, snapshot_chunk_rows="1000",
                      snapshot_split_rows="400")},
    )  # fmt: skip

    def reads() -> list[int] | None:
        failed = failures(cluster, ["stock-in", "stock-out"])
        assert not failed, failed[0]
        lines = out.read_text().splitlines() if out.exists() else []
        events = [json.loads(line) for line in lines if line.strip()]
        values = [e.get("payload", e) for e in events]
        ids = [v["after"]["id"] for v in values if v and v.get("op") == "r"]
        return ids if len(ids) >= SNAPSHOT_ROWS else None

    ids: Any = wait_until(reads, timeout=420, interval=0.5, what="the snapshot's rows")
    assert sorted(ids) == list(range(1, SNAPSHOT_ROWS + 1))


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


@pytest.mark.timeout(1200)
def test_kill9_exactly_once_on_a_standalone_cluster(
    standalone: StandaloneCluster, cluster: Cluster, tmp_path: Path
) -> None:
    kill9_exactly_once(cluster, tmp_path, on_standalone(standalone))


@pytest.mark.timeout(1200)
def test_kill9_exactly_once_on_spark_connect(
    connect_server: ConnectServer, cluster: Cluster, tmp_path: Path
) -> None:
    kill9_exactly_once(cluster, tmp_path, on_connect(connect_server))
