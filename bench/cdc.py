"""PostgresCdcSource on a worker: its snapshot against plain Spark's parallel read, and
its stream to a JdbcSink, end to end.

    python bench/cdc.py [--rows N] [--chunk-rows C] [--split-rows S] [--runs R]
                        [--warmup-runs W] [--stream-seconds T] [--stream-rate X]
                        [--driver-memory 2g] [--tmp-dir D] [--pretty] [--keep-work-dir]
                        [--worker-log-level DEBUG] [--worker-property KEY=VALUE ...]

A throwaway PostgreSQL server with ``wal_level=logical`` (Debian's ``postgresql``
package, started as the tests start one, ``fsync=off``: it measures the connectors, not
the disk) holds a table of N rows (default 2,000,000) of ``jdbc.py``'s shape: a bigint
key, two integers, text, a timestamp, numeric(12,2), a boolean. Measured in one run, on
127.0.0.1:

* **spark** (the anchor): plain Spark, in a process of its own with the session
  settings a herder worker uses and PostgreSQL's JDBC driver (Debian's
  ``libpostgresql-jdbc-java``): ``spark.read.jdbc`` of the table split by the key into
  as many ranges as the snapshot reads pieces (chunks of C rows, default 500,000, each
  read in pieces of S, default 125,000), written as Parquet. ``--warmup-runs`` first
  (default 1), then ``--runs`` (default 2); the best counts. (A JVM compiles its hot
  paths over its first runs: a ratio against a cold anchor flatters.)
* **snapshot**: one ensemble server and one worker (``local[*]``). A PostgresCdcSource
  connector is created over REST (``snapshot.mode=initial``, ``snapshot.chunk.rows`` C,
  ``snapshot.split.rows`` S, a fresh slot, publication, topic prefix and name per run),
  and the clock runs from its creation until its committed source offset (``GET
  /connectors/<name>/offsets``) names no table left to snapshot: every chunk written
  into the topic through the runtime's write path and committed with its offset. Then
  the topic's record count is read (``herder topics describe``): nothing writes to the
  table meanwhile, so its records are the snapshot's ``r`` events, and ``complete``
  says each run had exactly N. The connector is deleted, which drops its slot
  (``slot.drop.on.stop=true``; ``slots_dropped`` says it did). As many warm-up and
  measured runs as for Spark, in the same worker; the best counts.
  ``snapshot_ratio`` is its rows/s over Spark's; the issue's target is 0.7. Each side
  also reports the CPU seconds its processes took (``cpu_s``: plain Spark's process and
  its JVM; the worker's process tree and the ensemble server; PostgreSQL's on neither),
  which other processes on the machine sway less than seconds: ``snapshot_cpu_ratio``
  is Spark's over herder's.
* **stream**: on the same worker, a PostgresCdcSource on a table ``orders`` (1,000
  rows, snapshotted first) → ``transforms=unwrap`` (ExtractNewRecordState) → JdbcSink
  (``insert.mode=upsert``, ``pk.mode=record_key``) into ``orders_target``, created
  beforehand with the same columns and ``arrived timestamptz DEFAULT clock_timestamp()``,
  which the sink does not name: a row inserted gets the time it arrived. Once the
  target holds the first rows, a writer runs pgbench-like transactions for T seconds
  (default 20) at X transactions/s (default 500; 0: as fast as one connection goes):
  each updates an old row and inserts a new one whose ``placed`` is
  ``clock_timestamp()`` as its last statement, just before its commit. Then the clock
  runs until the target holds every inserted row, and the target is checked to equal
  the source. ``events_per_s``: the change events (two per transaction) over the time
  from the load's start to that end; ``lag_p50_ms``/``lag_p99_ms``: ``arrived -
  placed`` of the inserted rows, both from PostgreSQL's clock (commit in the source →
  row written in the target by the sink's transaction, which commits a moment later);
  ``cpu_s``: what the worker's process tree and the ensemble server took meanwhile.

``--worker-property KEY=VALUE`` sets a worker config (e.g. a ``spark.*`` setting) for
the herder side; the JSON names them (``worker_properties``).

Figures go to stdout as one JSON object (with the commit measured and the machine's load
before and after), progress to stderr; every process started is stopped by PID.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
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

from bench import _procs
from bench.jdbc import COLUMNS, JDBC_JAR, count, create, create_connector, fill, timed
from bench.pipeline import HERDER, Herder, Measured, tree_cpu_seconds, until

SOURCE = "herder.connectors.cdc.PostgresCdcSourceConnector"
SINK = "herder.connectors.jdbc.JdbcSinkConnector"
UNWRAP = "herder.connectors.cdc.unwrap.ExtractNewRecordState"
DB = "bench"
ORDERS_COLUMNS = (
    "id bigint PRIMARY KEY, customer integer, quantity integer, note text,"
    " placed timestamptz, amount numeric(12,2), paid boolean"
)
ORDERS_FIELDS = "id, customer, quantity, note, placed, amount, paid"
#: rows ``orders`` holds before the load: the rows its transactions update
ORDERS_ROWS = 1000
TARGET_RATIO = 0.7


def snapshot_pieces(rows: int, chunk_rows: int, split_rows: int) -> int:
    """How many pieces a snapshot of ``rows`` consecutive keys reads: each chunk of
    ``chunk_rows`` (the last one smaller) cut into pieces of about ``split_rows``."""
    pieces = 0
    for start in range(0, rows, chunk_rows):
        pieces += -(-min(chunk_rows, rows - start) // split_rows)
    return max(1, pieces)


# -- plain Spark ----------------------------------------------------------------------------


def spark_child(port: int, rows: int, pieces: int, work: str, runs: str, memory: str) -> None:
    """Runs in a process of its own: plain Spark's parallel read into Parquet, timed."""
    from herder.dataplane.spark import SparkRuntime, SparkSettings

    warmups, measured = (int(n) for n in runs.split(","))
    settings = SparkSettings.from_properties(
        {"spark.driver.memory": memory, "spark.jars": JDBC_JAR}
    )
    spark = SparkRuntime(settings).session
    url = f"jdbc:postgresql://127.0.0.1:{port}/{DB}"
    props = {"user": SUPERUSER, "password": SUPERUSER_PASSWORD, "driver": "org.postgresql.Driver"}
    results = []
    for run in range(warmups + measured):
        out = f"{work}/spark-{run}"
        cpu = tree_cpu_seconds(os.getpid())
        started = time.monotonic()
        spark.read.jdbc(
            url, "src", column="id", lowerBound=1, upperBound=rows + 1,
            numPartitions=pieces, properties=props,
        ).write.parquet(out)  # fmt: skip
        seconds = time.monotonic() - started
        cpu = tree_cpu_seconds(os.getpid()) - cpu
        written = spark.read.parquet(out).count()
        shutil.rmtree(out, ignore_errors=True)
        results.append({"seconds": seconds, "cpu_s": cpu, "complete": written == rows})
    print(json.dumps({"warmups": results[:warmups], "runs": results[warmups:]}), flush=True)


def run_spark(args: argparse.Namespace, server: PostgresServer, work: Path) -> dict[str, Any]:
    pieces = snapshot_pieces(args.rows, args.chunk_rows, args.split_rows)
    _procs.progress(f"plain Spark: {pieces} key ranges, {args.warmup_runs} + {args.runs} runs")
    command = [
        sys.executable, str(Path(__file__).resolve()), "--spark-child", str(server.port),
        str(args.rows), str(pieces), str(work), f"{args.warmup_runs},{args.runs}",
        args.driver_memory,
    ]  # fmt: skip
    figures = _procs.child_json(command, 3600, "the plain Spark run")
    for run in figures["warmups"] + figures["runs"]:
        _procs.progress(f"plain Spark run: {json.dumps(run)}")
    return _best(figures["runs"], args.rows) | {
        "warmups_s": [round(r["seconds"], 3) for r in figures["warmups"]],
        "complete": all(r["complete"] for r in figures["warmups"] + figures["runs"]),
    }


def _best(runs: list[dict[str, Any]], rows: int) -> dict[str, Any]:
    """The best run's figures, every run's seconds, and the least CPU a run took."""
    best = min(r["seconds"] for r in runs)
    return {
        "seconds": round(best, 3),
        "rows_per_s": round(rows / best),
        "runs_s": [round(r["seconds"], 3) for r in runs],
        "cpu_s": round(min(r["cpu_s"] for r in runs), 2),
        "runs_cpu_s": [round(r["cpu_s"], 2) for r in runs],
    }


# -- herder: the snapshot -------------------------------------------------------------------


def capture_config(server: PostgresServer, table: str, run: str, **extra: str) -> dict[str, str]:
    """A PostgresCdcSource of ``public.<table>`` with a slot, publication and topic
    prefix of its own (``run`` names them), which drops its slot when deleted."""
    return {
        "connector.class": SOURCE, "database.hostname": "127.0.0.1",
        "database.port": str(server.port), "database.user": SUPERUSER,
        "database.password": SUPERUSER_PASSWORD, "database.dbname": DB,
        "topic.prefix": run, "table.include.list": rf"public\.{table}",
        "publication.name": f"{run}_pub", "publication.autocreate.mode": "filtered",
        "slot.name": f"{run}_slot", "slot.drop.on.stop": "true", **extra,
    }  # fmt: skip


def committed_offset(herder: Herder, name: str) -> dict[str, Any] | None:
    """The connector's committed source offset, None before its first commit."""
    reply = herder.http.get(f"{herder.url}/connectors/{name}/offsets")
    offsets = reply.json().get("offsets", []) if reply.status_code == 200 else []
    return offsets[0]["offset"] if offsets else None


def snapshot_finished(herder: Herder, name: str) -> bool:
    """Whether the committed offset says the snapshot is over: no table left to read."""
    offset = committed_offset(herder, name)
    return offset is not None and not offset.get("snapshot_tables")


def topic_records(herder: Herder, topic: str) -> int:
    """Records in ``topic``, from its partitions' offsets (``herder topics describe``)."""
    command = [*HERDER, "topics", "describe", topic, "--bootstrap", herder.bootstrap, "--json"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"herder topics describe {topic} failed: {done.stderr.strip()}")
    parts = json.loads(done.stdout)["partition_details"]
    return sum(int(p["end_offset"]) - int(p["start_offset"]) for p in parts)


def drop_capture(herder: Herder, server: PostgresServer, name: str, run: str) -> bool:
    """Delete a capture connector; whether that dropped its slot within a minute (if not,
    the slot is dropped here, so it holds no WAL back for the runs that follow)."""
    herder.delete(name)
    slot = f"{run}_slot"
    gone_sql = f"SELECT count(*) = 0 FROM pg_replication_slots WHERE slot_name = '{slot}'"
    try:
        until(lambda: bool(server.execute(gone_sql, DB)[0][0]), 60, f"slot {slot} dropped")
        dropped = True
    except TimeoutError:
        _procs.progress(f"slot {slot} outlived its connector {name}: dropping it")
        server.execute(f"SELECT pg_drop_replication_slot('{slot}')", DB)
        dropped = False
    server.execute(f"DROP PUBLICATION IF EXISTS {run}_pub", DB)
    return dropped


def snapshot_run(
    herder: Herder, server: PostgresServer, args: argparse.Namespace, run: int
) -> dict[str, Any]:
    """One snapshot of ``src`` by a new connector, timed from its creation to its last
    chunk committed; its topic's record count, and whether its slot went with it."""
    name, prefix = f"snapshot-{run}", f"snap{run}"
    config = capture_config(
        server, "src", prefix, **{"snapshot.mode": "initial",
        "snapshot.chunk.rows": str(args.chunk_rows), "snapshot.split.rows": str(args.split_rows)},
    )  # fmt: skip
    measured = timed(
        herder, lambda: snapshot_finished(herder, name), [name],
        lambda: create_connector(herder, name, config, "RUNNING"),
    )  # fmt: skip
    events = topic_records(herder, f"{prefix}.public.src")
    dropped = drop_capture(herder, server, name, prefix)
    return {
        "seconds": measured.seconds,
        "events": events,
        "complete": events == args.rows,
        "slot_dropped": dropped,
        "cpu_s": sum(measured.own_cpu),
        "other_cpu_pct": measured.other_cpu_pct,
    }


def run_snapshots(
    herder: Herder, server: PostgresServer, args: argparse.Namespace
) -> dict[str, Any]:
    _procs.progress(f"herder snapshot: {args.warmup_runs} + {args.runs} runs")
    results = []
    for run in range(args.warmup_runs + args.runs):
        results.append(snapshot_run(herder, server, args, run))
        _procs.progress(f"herder snapshot run {run}: {json.dumps(results[-1])}")
    measured = results[args.warmup_runs :]
    best = min(measured, key=lambda r: r["seconds"])
    return _best(measured, args.rows) | {
        "warmups_s": [round(r["seconds"], 3) for r in results[: args.warmup_runs]],
        "events": [r["events"] for r in results],
        "complete": all(r["complete"] for r in results),
        "slots_dropped": all(r["slot_dropped"] for r in results),
        "other_cpu_pct": best["other_cpu_pct"],
    }


# -- herder: the stream, end to end ---------------------------------------------------------


class Load:
    """pgbench-like transactions on a thread of their own, each an UPDATE of an old row
    of ``orders`` and an INSERT of a new one stamped with ``clock_timestamp()`` last,
    so the stamp is the transaction's commit time but for the COMMIT's round trip."""

    FIRST_ID = 1_000_001

    def __init__(self, server: PostgresServer, seconds: float, rate: float) -> None:
        self.server, self.seconds, self.rate = server, seconds, rate
        self.transactions = 0
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="bench-load", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def join(self) -> None:
        self.thread.join()
        if self.error is not None:
            raise RuntimeError(f"the write load failed: {self.error}") from self.error

    def _run(self) -> None:
        import psycopg

        try:
            with psycopg.connect(self.server.dsn(DB), autocommit=True) as conn:
                began = time.monotonic()
                while (now := time.monotonic()) < began + self.seconds:
                    if self.rate > 0:
                        # a steady rate: the n-th transaction starts at n / rate, or at
                        # once if the load is behind
                        due = began + self.transactions / self.rate
                        if due > now:
                            time.sleep(due - now)
                    n = self.transactions
                    with conn.transaction():
                        conn.execute(
                            "UPDATE orders SET quantity = quantity + 1 WHERE id = %s",
                            (n % ORDERS_ROWS + 1,),
                        )
                        conn.execute(
                            "INSERT INTO orders VALUES (%s, %s, 1, 'order ' || %s,"
                            " clock_timestamp(), 12.50, true)",
                            (self.FIRST_ID + n, n % 10_000, n),
                        )
                    self.transactions += 1
        except BaseException as exc:  # reported by join(), in the benchmark's thread
            self.error = exc


def prepare_orders(server: PostgresServer) -> None:
    server.execute(
        f"DROP TABLE IF EXISTS orders, orders_target; CREATE TABLE orders ({ORDERS_COLUMNS});"
        f" CREATE TABLE orders_target ({ORDERS_COLUMNS},"
        " arrived timestamptz DEFAULT clock_timestamp());"
        f" INSERT INTO orders SELECT i, i % 10000, 1, 'order ' || i, now(), 12.50, true"
        f" FROM generate_series(1, {ORDERS_ROWS}) i",
        DB,
    )


def replica_config(server: PostgresServer, topic: str) -> dict[str, str]:
    """JdbcSink upserting ``topic``'s rows (unwrapped) into ``orders_target`` by key."""
    return {
        "connector.class": SINK, "topics": topic, "table.name.format": "orders_target",
        "connection.url": server.jdbc_url(DB), "connection.user": SUPERUSER,
        "connection.password": SUPERUSER_PASSWORD, "insert.mode": "upsert",
        "pk.mode": "record_key", "auto.create": "false", "auto.evolve": "false",
        "transforms": "unwrap", "transforms.unwrap.type": UNWRAP,
    }  # fmt: skip


def orders_equal(server: PostgresServer) -> bool:
    differing = server.execute(
        f"SELECT count(*) FROM ((SELECT {ORDERS_FIELDS} FROM orders EXCEPT SELECT"
        f" {ORDERS_FIELDS} FROM orders_target) UNION ALL (SELECT {ORDERS_FIELDS} FROM"
        f" orders_target EXCEPT SELECT {ORDERS_FIELDS} FROM orders)) d",
        DB,
    )
    return differing == [(0,)]


def run_stream(herder: Herder, server: PostgresServer, args: argparse.Namespace) -> dict[str, Any]:
    """CDC → unwrap → JdbcSink under a steady write load: events/s and the lag of each
    inserted row from its commit in ``orders`` to its arrival in ``orders_target``."""
    prepare_orders(server)
    prefix, names = "stream", ["stream-capture", "stream-replica"]
    topic = f"{prefix}.public.orders"
    create_connector(herder, names[1], replica_config(server, topic), "RUNNING")
    create_connector(herder, names[0], capture_config(server, "orders", prefix), "RUNNING")
    try:
        _procs.progress("stream: the pipeline catching up with the first rows")
        until(lambda: herder.running(*names) and count(server, "orders_target") >= ORDERS_ROWS,
              600, "the first rows of orders in orders_target", interval=0.5)  # fmt: skip
        rate = f"{args.stream_rate:g}/s" if args.stream_rate > 0 else "as fast as they go"
        _procs.progress(f"stream: transactions for {args.stream_seconds:g} s, {rate}")
        load = Load(server, args.stream_seconds, args.stream_rate)
        inserted = f"SELECT count(*) FROM orders_target WHERE id >= {Load.FIRST_ID}"

        def drained() -> bool:
            if load.thread.is_alive():
                return False
            load.join()
            return int(str(server.execute(inserted, DB)[0][0])) >= load.transactions

        measured: Measured = timed(herder, drained, names, load.start)
        load_s = args.stream_seconds
        complete = orders_equal(server)
        lags = [
            float(str(r[0]))
            for r in server.execute(
                "SELECT extract(epoch FROM arrived - placed) * 1000 FROM orders_target"
                f" WHERE id >= {Load.FIRST_ID} ORDER BY 1",
                DB,
            )
        ]
    finally:
        herder.delete(names[1])
        dropped = drop_capture(herder, server, names[0], prefix)
    events = 2 * load.transactions
    return {
        "transactions": load.transactions,
        "offered_events_per_s": round(events / load_s),
        "events": events,
        "seconds": round(measured.seconds, 3),
        "drain_s": round(measured.seconds - load_s, 3),
        "events_per_s": round(events / measured.seconds),
        "lag_p50_ms": round(_procs.percentile(lags, 50), 1) if lags else None,
        "lag_p99_ms": round(_procs.percentile(lags, 99), 1) if lags else None,
        "lag_max_ms": round(lags[-1], 1) if lags else None,
        "complete": complete and len(lags) == load.transactions,
        "slot_dropped": dropped,
        "cpu_s": round(sum(measured.own_cpu), 2),
        "other_cpu_pct": measured.other_cpu_pct,
    }


# -- the whole run --------------------------------------------------------------------------


def run(args: argparse.Namespace) -> dict[str, Any]:
    if not os.path.exists(JDBC_JAR):
        raise RuntimeError(f"{JDBC_JAR} is missing: apt-get install libpostgresql-jdbc-java")
    bindir = postgres_bindir()
    if bindir is None:
        raise RuntimeError("PostgreSQL's initdb is missing: apt-get install postgresql")
    work = Path(tempfile.mkdtemp(prefix="herder-bench-cdc-", dir=args.tmp_dir))
    server = PostgresServer(bindir, LOGICAL_SETTINGS)
    try:
        server.start()
        server.execute(f"CREATE DATABASE {DB}")
        _procs.progress(f"filling a table of {args.rows} rows")
        create(server, "src")
        fill(server, "src", args.rows)
        server.execute("VACUUM ANALYZE src", DB)
        spark = run_spark(args, server, work)
        with _procs.Services(work) as services:
            herder = Herder(
                services, work, args.driver_memory, args.worker_log_level,
                extra=args.worker_property,
            )  # fmt: skip
            try:
                snapshot = run_snapshots(herder, server, args)
                stream = run_stream(herder, server, args)
            finally:
                herder.close()
    finally:
        server.stop()
        if args.keep_work_dir:
            _procs.progress(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return {
        "rows": args.rows,
        "columns": COLUMNS,
        "chunk_rows": args.chunk_rows,
        "split_rows": args.split_rows,
        "snapshot_pieces": snapshot_pieces(args.rows, args.chunk_rows, args.split_rows),
        "worker_properties": args.worker_property,
        "spark": spark,
        "snapshot": snapshot,
        "snapshot_ratio": _procs.ratio(snapshot["rows_per_s"], spark["rows_per_s"]),
        # CPU seconds are less at the mercy of other processes than seconds are
        "snapshot_cpu_ratio": _procs.ratio(spark["cpu_s"], snapshot["cpu_s"]),
        "target_snapshot_ratio": TARGET_RATIO,
        "stream": {"seconds_of_load": args.stream_seconds, "rate": args.stream_rate} | stream,
    }


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--chunk-rows", type=int, default=500_000)
    parser.add_argument("--split-rows", type=int, default=125_000)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--warmup-runs", type=int, default=1)
    parser.add_argument("--stream-seconds", type=float, default=20.0)
    parser.add_argument("--stream-rate", type=float, default=500.0)
    parser.add_argument("--driver-memory", default="2g")
    parser.add_argument("--tmp-dir", default=None)
    parser.add_argument("--pretty", action="store_true")
    parser.add_argument("--keep-work-dir", action="store_true")
    parser.add_argument("--worker-log-level", default="INFO")
    parser.add_argument("--worker-property", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args(argv)
    for item in args.worker_property:
        if "=" not in item:
            parser.error(f"--worker-property {item!r} is not KEY=VALUE")
    _procs.check_counts(
        parser, args, positive=("rows", "chunk_rows", "split_rows", "runs", "stream_seconds"),
        non_negative=("warmup_runs", "stream_rate"),
    )  # fmt: skip
    return args


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["--spark-child"]:
        spark_child(int(argv[1]), int(argv[2]), int(argv[3]), argv[4], argv[5], argv[6])
        return 0
    args = parse_args(argv)
    return _procs.run_and_emit(lambda: run(args), pretty=args.pretty)


if __name__ == "__main__":
    sys.exit(main())
