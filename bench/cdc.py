"""PostgresCdcSource's snapshot against Spark's plain parallel read, and its stream.

    python bench/cdc.py [--rows N] [--chunk-rows C] [--split-rows S] [--stream-seconds T]
                        [--driver-memory 2g] [--pretty]

A throwaway PostgreSQL server with ``wal_level=logical`` (Debian's ``postgresql``
package, started as the tests start one, ``fsync=off``) holds a table of N rows
(default 2,000,000): a bigint key, two integers, text, a timestamp, numeric(12,2), a
boolean. In one process, one SparkSession (``local[*]``), measured in the same run:

* **spark**: Spark's own JDBC reader (Debian's ``libpostgresql-jdbc-java``) reading the
  table split by key into as many ranges as the snapshot's pieces, written as Parquet;
* **snapshot**: a PostgresCdcSource task (``snapshot.mode=initial``, chunks of C rows
  read in pieces of S) polled by hand as the runtime polls it, each batch (typed change
  events: topic, key, value) written as Parquet and its offset committed, until the
  snapshot is done. ``ratio`` is its rows/s over Spark's;
* **stream**: a writer runs pgbench-like transactions (an update and an insert each)
  for T seconds (default 20) while the task streams, then the task drains the rest; each
  batch is written as Parquet and committed. Events/s (from the load's start to the
  drained end), and the lag from each transaction's commit in PostgreSQL to its batch
  committed (p50, p99, ms): the source side of an end-to-end lag, without a sink.

Figures go to stdout as one JSON object, progress to stderr; the server is stopped by
PID.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.fixtures.postgres import (
    LOGICAL_SETTINGS,
    SUPERUSER,
    SUPERUSER_PASSWORD,
    PostgresServer,
    postgres_bindir,
)

from herder.connect import OffsetReader, SourceBatch, SourceTaskContext
from herder.connectors.cdc import PostgresCdcSourceTask

JDBC_JAR = "/usr/share/java/postgresql.jar"
COLUMNS = (
    "id bigint PRIMARY KEY, customer integer, quantity integer, note text,"
    " placed timestamp, amount numeric(12,2), paid boolean"
)


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


class _Offsets(OffsetReader):
    def __init__(self) -> None:
        self.committed: dict[str, Any] = {}

    def offsets(self, partitions: Any) -> list[Any]:
        return [self.committed.get(json.dumps(p, sort_keys=True)) for p in partitions]


class _Context(SourceTaskContext):
    def __init__(self, offsets: _Offsets) -> None:
        self._offsets = offsets

    @property
    def configs(self) -> dict[str, str]:
        return {}

    @property
    def offset_reader(self) -> OffsetReader:
        return self._offsets


def _write(batch: SourceBatch, offsets: _Offsets, out: Path, task: PostgresCdcSourceTask) -> int:
    """Write a batch as the runtime stages one, commit its offset; its record count."""
    data = batch.data.cache()
    try:
        count = data.count()
        data.write.mode("append").parquet(str(out))
    finally:
        data.unpersist()
    for partition, offset in batch.offsets:
        offsets.committed[json.dumps(partition, sort_keys=True)] = offset
    task.commit()
    return count


def plain_spark(spark: Any, server: PostgresServer, rows: int, pieces: int, out: Path) -> float:
    began = time.monotonic()
    df = spark.read.jdbc(
        f"jdbc:postgresql://127.0.0.1:{server.port}/postgres",
        "bench",
        column="id",
        lowerBound=1,
        upperBound=rows + 1,
        numPartitions=pieces,
        properties={"user": SUPERUSER, "password": SUPERUSER_PASSWORD,
                    "driver": "org.postgresql.Driver"},
    )  # fmt: skip
    df.write.mode("overwrite").parquet(str(out))
    return rows / (time.monotonic() - began)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--chunk-rows", type=int, default=500_000)
    parser.add_argument("--split-rows", type=int, default=125_000)
    parser.add_argument("--stream-seconds", type=float, default=20.0)
    parser.add_argument("--driver-memory", default="2g")
    parser.add_argument("--pretty", action="store_true")
    args = parser.parse_args()
    bindir = postgres_bindir()
    if bindir is None:
        raise SystemExit("PostgreSQL's initdb was not found: install Debian's postgresql")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from herder.dataplane.spark import spark_runtime, stop_spark

    server = PostgresServer(bindir, LOGICAL_SETTINGS).start()
    work = Path(tempfile.mkdtemp(prefix="herder-bench-cdc-"))
    try:
        say(f"filling a table of {args.rows} rows")
        server.execute(f"CREATE TABLE bench ({COLUMNS})")
        server.execute(
            "INSERT INTO bench SELECT i, i % 1000, i % 7, 'note ' || i, TIMESTAMP"
            " '2024-01-01' + i * INTERVAL '1 second', i / 100.0, i % 2 = 0"
            f" FROM generate_series(1, {args.rows}) i; ANALYZE bench"
        )
        conf = {"spark.master": "local[*]", "spark.driver.memory": args.driver_memory,
                "spark.ui.enabled": "false"}  # fmt: skip
        if Path(JDBC_JAR).exists():
            conf["spark.jars"] = JDBC_JAR
        runtime = spark_runtime(conf)
        runtime.start()
        spark = runtime.session
        pieces = max(1, -(-args.chunk_rows // args.split_rows))
        results: dict[str, Any] = {"rows": args.rows, "chunk_rows": args.chunk_rows,
                                   "pieces_per_chunk": pieces}  # fmt: skip
        if Path(JDBC_JAR).exists():
            say("plain Spark: JDBC read by key ranges, written as Parquet")
            total_pieces = max(1, -(-args.rows // args.split_rows))
            spark_rate = plain_spark(spark, server, args.rows, total_pieces, work / "spark")
            results["spark_rows_per_s"] = round(spark_rate)
        offsets = _Offsets()
        task = PostgresCdcSourceTask()
        task.initialize(_Context(offsets))
        task.start(
            {"database.hostname": "127.0.0.1", "database.port": str(server.port),
             "database.user": SUPERUSER, "database.password": SUPERUSER_PASSWORD,
             "database.dbname": "postgres", "topic.prefix": "bench", "slot.name": "bench",
             "snapshot.chunk.rows": str(args.chunk_rows),
             "snapshot.split.rows": str(args.split_rows), "poll.interval.ms": "20"}
        )  # fmt: skip
        try:
            say("herder: the snapshot")
            began = time.monotonic()
            read = 0
            while task.snapshot is not None:
                batch = task.poll()
                if batch is not None:
                    read += _write(batch, offsets, work / "snapshot", task)
            rate = read / (time.monotonic() - began)
            results["snapshot_rows_per_s"] = round(rate)
            if "spark_rows_per_s" in results:
                results["snapshot_ratio"] = round(rate / results["spark_rows_per_s"], 3)
            results.update(stream(server, task, offsets, work, args.stream_seconds))
        finally:
            task.stop()
        stop_spark()
    finally:
        server.stop()
    print(json.dumps(results, indent=2 if args.pretty else None))


def stream(
    server: PostgresServer, task: PostgresCdcSourceTask, offsets: _Offsets, work: Path,
    seconds: float,
) -> dict[str, Any]:  # fmt: skip
    import psycopg

    say(f"herder: streaming under {seconds} s of pgbench-like writes")
    stop = threading.Event()
    done = [0]

    def load() -> None:
        with psycopg.connect(server.dsn(), autocommit=True) as conn:
            next_id = 10_000_000
            while not stop.is_set():
                next_id += 1
                with conn.transaction():
                    conn.execute(
                        "UPDATE bench SET quantity = quantity + 1 WHERE id = %s",
                        (next_id % 1000 + 1,),
                    )
                    conn.execute(
                        "INSERT INTO bench VALUES (%s, 1, 1, 'x', now()::timestamp, 1.5, true)",
                        (next_id,),
                    )
                done[0] += 1

    writer = threading.Thread(target=load, name="bench-load", daemon=True)
    writer.start()
    lags: list[float] = []
    events = 0
    began = time.monotonic()
    end = began + seconds
    batches = 0
    idle = 0
    try:
        # the load runs for ``seconds``; then the stream drains what is left
        while idle < 3 and time.monotonic() < end + 20 * seconds:
            if time.monotonic() >= end:
                stop.set()
            batch = task.poll()
            if batch is None:
                idle = idle + 1 if stop.is_set() else 0
                continue
            idle = 0
            out = work / f"stream-{batches}"
            events += _write(batch, offsets, out, task)
            committed_ms = time.time() * 1000
            batches += 1
            lags += [committed_ms - t for t in commit_times(out)]
    finally:
        stop.set()
        writer.join(timeout=30)
    elapsed = time.monotonic() - began
    lags.sort()
    return {
        "stream_transactions": done[0],
        "stream_events": events,
        "stream_events_per_s": round(events / elapsed),
        "stream_batches": batches,
        "lag_p50_ms": round(lags[len(lags) // 2]) if lags else None,
        "lag_p99_ms": round(lags[int(len(lags) * 0.99)]) if lags else None,
    }


def commit_times(out: Path) -> list[float]:
    """The commit time (ms) in PostgreSQL of each change event written to ``out``."""
    from pyspark.sql import functions as F

    from herder.dataplane.spark import spark_runtime

    df = spark_runtime().session.read.parquet(str(out))
    ts = F.get_json_object(F.col("value").cast("string"), "$.payload.source.ts_ms")
    return [float(r[0]) for r in df.select(ts).where(ts.isNotNull()).collect()]


if __name__ == "__main__":
    main()
