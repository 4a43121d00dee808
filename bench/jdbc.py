"""PostgreSQL → topic → PostgreSQL on one worker, against plain Spark copying the same table.

    python bench/jdbc.py [--records N] [--runs R] [--warmup-runs W] [--driver-memory 2g]
                         [--batch-rows B] [--tmp-dir D] [--pretty] [--keep-work-dir]
                         [--worker-log-level DEBUG]

A throwaway PostgreSQL server (Debian's ``postgresql`` package, as the tests start one)
holds a table of N rows (default 1,000,000) of a typical shape: a bigint key, two
integers, text, a timestamp, numeric(12,2) and a boolean. Measured in one run, on
127.0.0.1:

* **spark**: plain Spark, in a process of its own with the session settings a herder
  worker uses and PostgreSQL's JDBC driver (Debian's ``libpostgresql-jdbc-java``):
  ``spark.read.jdbc`` of the table split into as many key ranges as Spark has cores,
  then ``write.jdbc`` into an empty table with the same columns and primary key (the
  *copy*); the read alone written as Parquet (the *source*); that Parquet read and
  written into an empty table (the *sink*). ``--warmup-runs`` runs first (default 1),
  then ``--runs`` (default 2); the best counts.
* **herder**: one ensemble server and one worker (``local[*]``). The table is filled
  (in one transaction, then analysed, as Spark's is; ``fill_s`` says how long that
  took, outside the copy), then the clock starts, a JdbcSource (``mode=incrementing``,
  with its default ``batch.max.rows`` unless ``--batch-rows`` sets it) and a JdbcSink
  (``insert.mode=upsert``
  by the key, into an empty table) are created, and the clock runs until the target
  table holds every row (the *copy*: the same work as Spark's, connector and task
  start included; the sink's offsets, committed with its rows, say when: a count of
  the table every 50 ms would take a core's share from the copy). Then the *source*
  alone (the JdbcSource of a fresh table, its sink created PAUSED: until the source's
  committed offset reaches the last row) and the *sink* alone (that sink resumed: until
  its table holds every row). As many warm-up and measured runs as for Spark.

``ratio`` is herder's rows/s over Spark's, for each; the target for the copy is at
least 0.8. Each copy's target table is checked to equal its source. The server runs
with ``fsync=off`` for both (it measures the connectors, not the disk). Figures go to
stdout as one JSON object, progress to stderr; every process started is stopped by PID.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.fixtures.postgres import SUPERUSER, SUPERUSER_PASSWORD, PostgresServer, postgres_bindir

from bench import _procs
from bench.pipeline import Herder, Measured, until

JDBC_JAR = "/usr/share/java/postgresql.jar"
COLUMNS = (
    "id bigint PRIMARY KEY, customer integer, quantity integer, note text,"
    " placed timestamp, amount numeric(12,2), paid boolean"
)
SOURCE = "herder.connectors.jdbc.JdbcSourceConnector"
SINK = "herder.connectors.jdbc.JdbcSinkConnector"


def fill(server: PostgresServer, table: str, records: int) -> None:
    """``records`` rows into ``table``, in one transaction."""
    server.execute(
        f"INSERT INTO {table} SELECT i, i % 10000, i % 97, 'order note ' || md5(i::text),"
        " TIMESTAMP '2024-01-01' + i * INTERVAL '1 second', (i % 1000000) / 100.0, i % 2 = 0"
        f" FROM generate_series(1, {records}) i",
        "bench",
    )


def create(server: PostgresServer, table: str) -> None:
    server.execute(f"DROP TABLE IF EXISTS {table}; CREATE TABLE {table} ({COLUMNS})", "bench")


def count(server: PostgresServer, table: str) -> int:
    return int(server.execute(f"SELECT count(*) FROM {table}", "bench")[0][0])


def sink_reached(server: PostgresServer, name: str) -> int:
    """How many records the JdbcSink ``name`` has written: the offsets it commits in the
    same transaction as the rows (its topic has one partition, from offset 0). Polled
    every 50 ms, this reads one row; a ``count(*)`` of the target would scan up to every
    row written so far each time, on the cores the copy runs on."""
    try:
        rows = server.execute(
            "SELECT coalesce(sum(next_offset), 0) FROM herder_sink_offsets"
            f" WHERE connector = '{name}'",
            "bench",
        )
    except Exception:  # the sink has not created its offsets table yet
        return 0
    return int(rows[0][0])


def equal(server: PostgresServer, a: str, b: str) -> bool:
    differing = server.execute(
        f"SELECT count(*) FROM ((SELECT * FROM {a} EXCEPT SELECT * FROM {b})"
        f" UNION ALL (SELECT * FROM {b} EXCEPT SELECT * FROM {a})) d",
        "bench",
    )
    return differing == [(0,)]


# -- plain Spark ----------------------------------------------------------------------------


def spark_child(port: int, records: int, work: str, warmups: int, runs: int, memory: str) -> None:
    """Runs in a process of its own: plain Spark's copy, source and sink, timed."""
    from herder.dataplane.spark import SparkRuntime, SparkSettings

    settings = SparkSettings.from_properties(
        {"spark.driver.memory": memory, "spark.jars": JDBC_JAR}
    )
    spark = SparkRuntime(settings).session
    server = PostgresServer.attach(port)
    url = f"jdbc:postgresql://127.0.0.1:{port}/bench"
    props = {"user": SUPERUSER, "password": SUPERUSER_PASSWORD, "driver": "org.postgresql.Driver"}
    cores = spark.sparkContext.defaultParallelism

    def read() -> Any:
        return spark.read.jdbc(
            url, "src", column="id", lowerBound=1, upperBound=records + 1,
            numPartitions=cores, properties=props,
        )  # fmt: skip

    results = []
    for run in range(warmups + runs):
        create(server, "spark_dst")
        started = time.monotonic()
        read().write.jdbc(url, "spark_dst", mode="append", properties=props)
        copy = time.monotonic() - started
        ok = count(server, "spark_dst") == records
        parquet = f"{work}/spark-{run}"
        started = time.monotonic()
        read().write.parquet(parquet)
        source = time.monotonic() - started
        create(server, "spark_dst")
        started = time.monotonic()
        spark.read.parquet(parquet).write.jdbc(url, "spark_dst", mode="append", properties=props)
        sink = time.monotonic() - started
        shutil.rmtree(parquet, ignore_errors=True)
        results.append({"copy_s": copy, "source_s": source, "sink_s": sink, "complete": ok})
    print(json.dumps({"warmups": results[:warmups], "runs": results[warmups:]}), flush=True)


def run_spark(args: argparse.Namespace, server: PostgresServer, work: Path) -> dict[str, Any]:
    _procs.progress(f"plain Spark: {args.warmup_runs} + {args.runs} runs")
    command = [
        sys.executable, str(Path(__file__).resolve()), "--spark-child", str(server.port),
        str(args.records), str(work), str(args.warmup_runs), str(args.runs), args.driver_memory,
    ]  # fmt: skip
    figures = _procs.child_json(command, 3600, "the plain Spark run")
    return _best(figures["runs"], args.records) | {
        "complete": all(r["complete"] for r in figures["runs"]),
        "warmups": figures["warmups"],
    }


def _best(runs: list[dict[str, Any]], records: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for step in ("copy", "source", "sink"):
        best = min(r[f"{step}_s"] for r in runs)
        out[step] = {
            "seconds": round(best, 3),
            "records_per_s": round(records / best),
            "runs_s": [round(r[f"{step}_s"], 3) for r in runs],
        }
    return out


# -- herder ---------------------------------------------------------------------------------


def connection(server: PostgresServer) -> dict[str, str]:
    return {
        "connection.url": server.jdbc_url("bench"),
        "connection.user": SUPERUSER,
        "connection.password": SUPERUSER_PASSWORD,
    }


def source_config(server: PostgresServer, table: str, batch_rows: int | None) -> dict[str, str]:
    batch = {} if batch_rows is None else {"batch.max.rows": str(batch_rows)}
    return {
        "connector.class": SOURCE, "mode": "incrementing", "incrementing.column.name": "id",
        "table.whitelist": table, "topic.prefix": "bench-", "poll.interval.ms": "100",
        **batch, **connection(server),
    }  # fmt: skip


def default_batch_rows() -> int:
    """The JdbcSource's own ``batch.max.rows``."""
    from herder.connectors.jdbc.source import BATCH_MAX_ROWS, JdbcSourceConnector

    return int(JdbcSourceConnector().config_def().keys[BATCH_MAX_ROWS].default)


def sink_config(server: PostgresServer, topic: str, table: str) -> dict[str, str]:
    return {
        "connector.class": SINK, "topics": topic, "table.name.format": table,
        "insert.mode": "upsert", "pk.mode": "record_value", "pk.fields": "id",
        **connection(server),
    }  # fmt: skip


def create_connector(herder: Herder, name: str, config: dict[str, str], state: str) -> None:
    reply = herder.http.post(
        f"{herder.url}/connectors",
        json={"name": name, "config": config, "initial_state": state},
    )
    if reply.status_code != 201:
        raise RuntimeError(f"creating {name} failed: {reply.status_code} {reply.text}")


def source_reached(herder: Herder, name: str) -> int:
    reply = herder.http.get(f"{herder.url}/connectors/{name}/offsets")
    offsets = reply.json().get("offsets", []) if reply.status_code == 200 else []
    return max((int(o["offset"].get("incrementing", 0)) for o in offsets), default=0)


def timed(
    herder: Herder, done: Callable[[], bool], names: Sequence[str], start: Callable[[], None]
) -> Measured:
    with Measured(herder.worker.pid, herder.server.pid) as measured:
        start()
        deadline = time.monotonic() + 1800
        checked = time.monotonic()
        while not done():
            if time.monotonic() > deadline:
                raise TimeoutError("a herder run took over 1800 s")
            time.sleep(0.05)
            if time.monotonic() - checked > 1:
                checked = time.monotonic()
                failed(herder, names)
    return measured


def failed(herder: Herder, names: Sequence[str]) -> None:
    herder.worker.check_alive()
    for name in names:
        reply = herder.http.get(f"{herder.url}/connectors/{name}/status")
        for task in reply.json().get("tasks", []) if reply.status_code == 200 else []:
            if task["state"] == "FAILED":
                raise RuntimeError(f"task of {name} failed:\n{task.get('trace')}")


def herder_run(
    herder: Herder, server: PostgresServer, run: int, records: int, batch_rows: int | None
) -> dict[str, Any]:
    """One copy, then one source alone and one sink alone; seconds and checks."""
    copy_src, copy_dst = f"copy_src_{run}", f"copy_dst_{run}"
    create(server, copy_src)
    create(server, copy_dst)
    filling = time.monotonic()
    fill(server, copy_src, records)
    server.execute(f"VACUUM ANALYZE {copy_src}", "bench")
    fill_s = time.monotonic() - filling
    names = [f"copy-source-{run}", f"copy-sink-{run}"]

    def start_copy() -> None:
        sink = sink_config(server, f"bench-{copy_src}", copy_dst)
        create_connector(herder, names[1], sink, "RUNNING")
        source = source_config(server, copy_src, batch_rows)
        create_connector(herder, names[0], source, "RUNNING")

    copy = timed(herder, lambda: sink_reached(server, names[1]) >= records, names, start_copy)
    copied = count(server, copy_dst) == records and equal(server, copy_src, copy_dst)
    for name in names:
        herder.delete(name)

    src, dst = f"alone_src_{run}", f"alone_dst_{run}"
    create(server, src)
    create(server, dst)
    fill(server, src, records)
    sink_name, source_name = f"alone-sink-{run}", f"alone-source-{run}"
    create_connector(herder, sink_name, sink_config(server, f"bench-{src}", dst), "PAUSED")
    source_settings = source_config(server, src, batch_rows)
    source = timed(
        herder, lambda: source_reached(herder, source_name) >= records, [source_name],
        lambda: create_connector(herder, source_name, source_settings, "RUNNING"),
    )  # fmt: skip
    herder.delete(source_name)
    sink = timed(
        herder, lambda: sink_reached(server, sink_name) >= records, [sink_name],
        lambda: herder.http.put(f"{herder.url}/connectors/{sink_name}/resume"),
    )  # fmt: skip
    sunk = count(server, dst) == records and equal(server, src, dst)
    herder.delete(sink_name)
    for table in (copy_src, copy_dst, src, dst):
        server.execute(f"DROP TABLE {table}", "bench")
    return {
        "copy_s": copy.seconds,
        "fill_s": fill_s,
        "source_s": source.seconds,
        "sink_s": sink.seconds,
        "copy_worker_cpu_s": copy.own_cpu[0],
        "copy_other_cpu_pct": copy.other_cpu_pct,
        "complete": copied and sunk,
    }


def run_herder(args: argparse.Namespace, server: PostgresServer, work: Path) -> dict[str, Any]:
    _procs.progress(f"herder: {args.warmup_runs} + {args.runs} runs")
    with _procs.Services(work) as services:
        herder = Herder(services, work, args.driver_memory, args.worker_log_level)

        def healthy() -> bool:
            return herder.http.get(f"{herder.url}/health", timeout=5).status_code == 200

        until(healthy, 180, "the worker in its group", interval=0.5)
        try:
            results = []
            for run in range(args.warmup_runs + args.runs):
                results.append(herder_run(herder, server, run, args.records, args.batch_rows))
                _procs.progress(f"herder run {run}: {json.dumps(results[-1])}")
        finally:
            herder.close()
    measured = results[args.warmup_runs :]
    best = min(measured, key=lambda r: r["copy_s"])
    return _best(measured, args.records) | {
        "complete": all(r["complete"] for r in measured),
        "copy_worker_cpu_s": round(best["copy_worker_cpu_s"], 2),
        "copy_fill_s": round(best["fill_s"], 2),
        "copy_other_cpu_pct": best["copy_other_cpu_pct"],
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    if not os.path.exists(JDBC_JAR):
        raise RuntimeError(f"{JDBC_JAR} is missing: apt-get install libpostgresql-jdbc-java")
    bindir = postgres_bindir()
    if bindir is None:
        raise RuntimeError("PostgreSQL's initdb is missing: apt-get install postgresql")
    work = Path(tempfile.mkdtemp(prefix="herder-bench-jdbc-", dir=args.tmp_dir))
    server = PostgresServer(bindir)
    try:
        server.start()
        server.execute("CREATE DATABASE bench")
        create(server, "src")
        fill(server, "src", args.records)
        server.execute("VACUUM ANALYZE src", "bench")
        spark = run_spark(args, server, work)
        herder = run_herder(args, server, work)
    finally:
        server.stop()
        if args.keep_work_dir:
            _procs.progress(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    figures: dict[str, Any] = {
        "records": args.records,
        "columns": COLUMNS,
        # the JdbcSource's batch.max.rows: how many batches (Spark jobs and commits) it
        # reads the table in
        "batch_max_rows": default_batch_rows() if args.batch_rows is None else args.batch_rows,
        "spark": spark,
        "herder": herder,
    }
    for step in ("copy", "source", "sink"):
        figures[f"{step}_ratio"] = round(
            herder[step]["records_per_s"] / spark[step]["records_per_s"], 3
        )
    figures["target_copy_ratio"] = 0.8
    return figures


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--warmup-runs", type=int, default=1)
    parser.add_argument("--driver-memory", default="2g")
    parser.add_argument("--tmp-dir", default=None)
    parser.add_argument("--pretty", action="store_true")
    parser.add_argument(
        "--batch-rows", type=int, default=None, help="the JdbcSource's batch.max.rows"
    )
    parser.add_argument("--keep-work-dir", action="store_true")
    parser.add_argument("--worker-log-level", default="INFO")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["--spark-child"]:
        spark_child(int(argv[1]), int(argv[2]), argv[3], int(argv[4]), int(argv[5]), argv[6])
        return 0
    args = parse_args(argv)
    return _procs.run_and_emit(lambda: run(args), pretty=args.pretty)


if __name__ == "__main__":
    sys.exit(main())
