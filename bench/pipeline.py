"""A whole pipeline on one worker against plain Spark doing the same persisting work.

    python bench/pipeline.py [--records N] [--line-bytes B] [--runs R] [--warmup-runs W]
                             [--latency-samples K] [--latency-rate L] [--driver-memory 2g]
                             [--sustained-rate S] [--sustained-seconds T]
                             [--sustained-warmup-seconds U] [--only all|latency]
                             [--worker-property KEY=VALUE ...] [--tmp-dir D] [--pretty]
                             [--consumer-max-records M] [--keep-work-dir]
                             [--worker-log-level DEBUG]
                             [--spark-master spark://HOST:PORT | --spark-remote sc://HOST:PORT]

The benchmark writes N lines of B bytes (default 2,000,000 of 100) and measures, in one
run, on 127.0.0.1 with fresh temporary directories:

* **spark**: plain Spark, in a process of its own with the session settings a herder
  worker uses, persisting the lines the way a pipeline does — ``spark.read.text(in)
  .write.parquet(mid)``, then ``spark.read.parquet(mid).write.text(out)`` —
  ``--warmup-runs`` times to warm up (default 3), then ``--runs`` times (default 5); the
  best run counts. After each job its files are also flushed to disk, as herder flushes
  every file it writes before committing it, and ``spark.durable`` reports that
  variant: the jobs and their fsyncs (``ratio_to_durable_spark`` beside herder's
  figures). Its process lives as long as herder's worker, and the two sides take
  turns, a run of each (warm-ups, then measured runs, which side goes first
  alternating), each run starting once the machine has settled (under 10% of a core
  busy): a machine that slows down or speeds up during the benchmark weighs on both
  alike.
* **herder → DirectorySink (text)**: one ensemble server and one worker (``herder
  worker start``, Spark ``local[*]``); a DirectorySink connector writing text and a
  FileStreamSource connector are created and RUNNING on an input path that does not
  exist yet; then the prepared input is renamed into place and the clock runs until
  the sink's files hold every line (their total size is the input's; renamed into place,
  a file is never seen half written). The output is then checked to be the input, byte
  for byte. As for plain Spark, ``--warmup-runs`` untimed runs of the same size warm the
  worker up first, then ``--runs`` measured runs follow, and the best counts. (A JVM
  compiles the code of its hot paths over several runs of them: measured after one, a
  ratio tells more about how soon each process reached its compiled code than about
  either's speed.)
  ``ratio_to_spark`` is herder's records/s over Spark's, ``ratio_to_durable_spark``
  over the durable variant's; the targets are at least 0.9 and 1.0, and
  ``meets_target`` says whether both are met.
* **herder → FileStreamSink**: the same with a FileStreamSink, reported without a
  target (one file written by one Python process bounds it).
  ``--consumer-max-records`` sets the sinks' ``consumer.max.records`` (records one
  delivery reads; by default the runtime's): a delivery reads whole staged files up to
  it.
* **latency**: a FileStreamSource → DirectorySink (text) pipeline with default
  settings; one line is appended at a time, ``--latency-rate`` lines/s at most
  (default 5), and the time until it is in a sink file is measured, ``--latency-samples``
  times (default 100): p50, p99, max. The sink's directory is watched (inotify; where
  there is none, it is polled every 10 ms), as it is for the runs above.
* **sustained latency**: the same pipeline under load: ``--sustained-rate`` lines/s
  (default 50,000) for ``--sustained-seconds`` (default 20, after
  ``--sustained-warmup-seconds``, default 5, not counted); each line's latency is the
  time from its write to the arrival of the sink file that holds it: p50, p99, max.
  The lines are written, and the sink's files watched, by this process: its CPU is
  the step's own (``load_cpu_s``), not counted in ``other_cpu_pct``.
  ``--sustained-rate 0`` leaves it out.

``--only latency`` runs the two latency steps alone (no plain Spark, no throughput
runs); ``--worker-property KEY=VALUE`` sets a worker config, e.g.
``dataplane.trickle.max.records=0`` to measure with the trickle path off.

Each measured step reports the CPU seconds of the worker's process tree (its Python,
its JVM, Spark's Python workers) and ``other_cpu_pct``: what every other process on
the machine used meanwhile, in % of one core. ``spark.cpu_s`` is the same for plain
Spark's best run: its process tree's, for its jobs, its fsyncs and the removal of its
files. Figures go to stdout as one JSON object,
progress to stderr; every process started is stopped by PID in ``finally`` blocks.
With the defaults a run takes about six minutes on two cores.

``--spark-master`` (a standalone cluster's ``spark://…``) or ``--spark-remote`` (a Spark
Connect server's ``sc://…``) runs both sides' jobs there instead of ``local[*]``, so the
ratio compares them on the same cluster (``spark_on`` in the JSON). The cluster's
executors must see this machine's files (a cluster on this machine, or a shared mount).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import json
import os
import select
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the ``bench`` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx

from bench import _procs
from herder import __version__ as herder_version

#: herder's records/s against plain Spark's jobs, and against the same jobs with their fsyncs
TARGET_RATIO = 0.9
TARGET_RATIO_TO_DURABLE = 1.0
HERDER = [sys.executable, "-m", "herder"]


# -- input ----------------------------------------------------------------------------------


def write_lines(path: Path, count: int, line_bytes: int, prefix: str = "") -> int:
    """``count`` numbered lines of ``line_bytes`` bytes (newline included); returns bytes.

    The file is on disk when this returns: its write-back does not fall into a measured
    run (it costs the machine a few hundred ms of I/O for 200 MB).
    """
    filler_len = max(1, line_bytes - len(prefix) - 12)
    filler = b"x" * filler_len
    head = prefix.encode()
    with open(path, "wb") as f:
        for start in range(0, count, 100_000):
            stop = min(count, start + 100_000)
            f.write(b"".join(head + b"%010d " % i + filler + b"\n" for i in range(start, stop)))
        f.flush()
        os.fsync(f.fileno())
    return path.stat().st_size


def sha256_of(paths: Sequence[Path]) -> str:
    digest = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as f:
            while chunk := f.read(1 << 22):
                digest.update(chunk)
    return digest.hexdigest()


# -- CPU accounting -------------------------------------------------------------------------


def tree_cpu_seconds(root: int) -> float:
    """CPU seconds of ``root`` and every process below it (a worker, its JVM, Spark's Pythons)."""
    children = _procs.children_by_parent()
    total, stack = 0.0, [root]
    while stack:
        pid = stack.pop()
        try:
            total += _procs.cpu_seconds(pid)
        except OSError:
            continue
        stack.extend(children.get(pid, []))
    return total


class Measured:
    """Elapsed time, the worker tree's CPU and everything else's CPU over one step.

    ``load_pid``: a process (this one, alone, not its children) that makes the step's
    load, whose CPU is the step's rather than another process's (``load_cpu_s``)."""

    def __init__(
        self, worker_pid: int | None, server_pid: int | None = None, *, load_pid: int | None = None
    ) -> None:
        self.pids = [p for p in (worker_pid, server_pid) if p is not None]
        self.load_pid = load_pid

    def _load_cpu(self) -> float:
        return _procs.cpu_seconds(self.load_pid) if self.load_pid is not None else 0.0

    def __enter__(self) -> Measured:
        self.machine = _procs.MachineCpu.read()
        self.cpu = [tree_cpu_seconds(p) for p in self.pids]
        self.load_cpu = self._load_cpu()
        self.started = time.monotonic()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.monotonic() - self.started
        busy = _procs.MachineCpu.read().busy_fraction_since(self.machine)
        used = [tree_cpu_seconds(p) - c for p, c in zip(self.pids, self.cpu, strict=True)]
        self.own_cpu = used
        self.load_cpu_s = self._load_cpu() - self.load_cpu
        other = busy * self.seconds * (os.cpu_count() or 1) - sum(used) - self.load_cpu_s
        self.other_cpu_pct = round(max(0.0, 100 * other / self.seconds), 1)


# -- plain Spark ------------------------------------------------------------------------------


def make_durable(folder: str) -> None:
    """Flush what Spark wrote in ``folder`` to disk as herder flushes a batch's files
    before committing them (:meth:`Storage.make_durable`): every file, then every
    directory up to ``folder``'s parent, deepest first."""
    from herder.dataplane.storage import Storage

    parent = os.path.dirname(folder)
    files = [
        os.path.relpath(os.path.join(root, name), parent)
        for root, _, names in os.walk(folder)
        for name in names
    ]
    Storage(parent).make_durable(files)


def spark_settings(args: argparse.Namespace) -> dict[str, str]:
    """The ``spark.*`` settings of both sides: herder's worker and plain Spark run on the
    same master (``--spark-master``) or Spark Connect server (``--spark-remote``)."""
    settings = {"spark.driver.memory": args.driver_memory}
    if args.spark_remote:
        settings["spark.remote"] = args.spark_remote
    else:
        settings["spark.master"] = args.spark_master
    return settings


def spark_baseline_child(input_path: str, work: str, spark: str) -> None:
    """Runs in a process of its own: plain Spark's two persisting jobs, timed, once per
    line read from stdin (one JSON line of figures in answer), until stdin ends."""
    from herder.dataplane.spark import SparkRuntime, SparkSettings

    settings = SparkSettings.from_properties(json.loads(spark))
    # started before the first request: no run times the JVM's start
    session = SparkRuntime(settings).session
    for run, _ in enumerate(sys.stdin):
        mid, out = f"{work}/mid-{run}", f"{work}/out-{run}"
        started = time.monotonic()
        session.read.text(input_path).write.parquet(mid)
        middle = time.monotonic()
        make_durable(mid)
        resumed = time.monotonic()
        session.read.parquet(mid).write.text(out)
        done = time.monotonic()
        make_durable(out)
        synced = time.monotonic()
        jobs = (middle - started) + (done - resumed)
        fsync = (resumed - middle) + (synced - done)
        result = {
            "to_parquet_s": middle - started,
            "to_text_s": done - resumed,
            "seconds": jobs,
            "fsync_s": fsync,
            "durable_seconds": jobs + fsync,
        }
        shutil.rmtree(mid, ignore_errors=True)
        shutil.rmtree(out, ignore_errors=True)
        print(json.dumps(result), flush=True)


class PlainSpark:
    """Plain Spark's side (:func:`spark_baseline_child`), alive in a process of its own
    for the whole benchmark and asked for one run at a time, so its runs interleave
    with herder's."""

    def __init__(self, args: argparse.Namespace, input_path: Path, work: Path) -> None:
        command = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--spark-baseline-child",
            str(input_path),
            str(work),
            json.dumps(spark_settings(args)),
        ]
        self.child = _procs.JsonChild(command, "the plain Spark run", work / "spark.log")
        self.records = args.records
        self.warmups: list[dict[str, Any]] = []
        self.runs: list[dict[str, Any]] = []

    def run(self, *, warmup: bool) -> None:
        _procs.wait_quiet()
        with Measured(self.child.pid) as measured:
            figures = self.child.ask("run", 1800)
        figures["cpu_s"] = measured.own_cpu[0]
        figures["other_cpu_pct"] = measured.other_cpu_pct
        (self.warmups if warmup else self.runs).append(figures)

    def close(self) -> None:
        self.child.close()

    def figures(self) -> dict[str, Any]:
        best = min(self.runs, key=lambda r: r["seconds"])
        durable = min(self.runs, key=lambda r: r["durable_seconds"])
        return {
            "seconds": round(best["seconds"], 3),
            "to_parquet_s": round(best["to_parquet_s"], 3),
            "to_text_s": round(best["to_text_s"], 3),
            "records_per_s": round(self.records / best["seconds"]),
            "runs_s": [round(r["seconds"], 3) for r in self.runs],
            "warmups_s": [round(r["seconds"], 3) for r in self.warmups],
            "cpu_s": round(best["cpu_s"], 2),
            "other_cpu_pct": max(r["other_cpu_pct"] for r in self.runs),
            "durable": {
                "seconds": round(durable["durable_seconds"], 3),
                "fsync_s": round(durable["fsync_s"], 3),
                "records_per_s": round(self.records / durable["durable_seconds"]),
                "runs_s": [round(r["durable_seconds"], 3) for r in self.runs],
                "fsyncs_s": [round(r["fsync_s"], 3) for r in self.runs],
            },
        }


# -- herder ---------------------------------------------------------------------------------


def until(condition: Callable[[], bool], timeout: float, what: str, interval: float = 0.1) -> None:
    """Poll ``condition`` until it is true; its exceptions (a failed task) end the wait."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not happen within {timeout:.0f}s")
        time.sleep(interval)


def start_ensemble(services: _procs.Services, work: Path) -> tuple[_procs.Service, int]:
    """One ensemble server on 127.0.0.1 with its data under ``work``, answering; and its
    client port."""
    client_port = _procs.free_port()
    data = work / "ensemble"
    data.mkdir()
    config = work / "ensemble.properties"
    config.write_text(f"dataDir={data}\nclientPort={client_port}\nclientPortAddress=127.0.0.1\n")
    with _procs.children_ignore_sigint():
        server = services.start("ensemble", [*HERDER, "ensemble", "start", "--config", str(config)])
    _procs.wait_until(lambda: _procs.port_open(client_port), timeout=60, what="the ensemble server")
    return server, client_port


def add_input_options(parser: argparse.ArgumentParser) -> None:
    """The options every data-plane benchmark has: its input, Spark's heap, where it works."""
    parser.add_argument("--records", type=int, default=2_000_000)
    parser.add_argument("--line-bytes", type=int, default=100)
    parser.add_argument("--driver-memory", default="2g")
    parser.add_argument("--tmp-dir", default=None)
    parser.add_argument("--pretty", action="store_true")


def check_line_bytes(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.line_bytes < 16:
        parser.error("--line-bytes must be at least 16")


class Herder:
    """One ensemble server and one worker, and the worker's REST API."""

    def __init__(
        self,
        services: _procs.Services,
        work: Path,
        driver_memory: str,
        log_level: str = "INFO",
        spark: Mapping[str, str] | None = None,
        extra: Sequence[str] = (),
    ) -> None:
        self.server, client_port = start_ensemble(services, work)
        #: the ensemble's client address, for ``herder topics`` and the like
        self.bootstrap = f"127.0.0.1:{client_port}"
        rest_port = _procs.free_port()
        worker_config = work / "worker.properties"
        props = {
            "group.id": "bench",
            "bootstrap.servers": f"127.0.0.1:{client_port}",
            "rest.host.name": "127.0.0.1",
            "rest.port": rest_port,
            "storage.root": str(work / "topics"),
            "spark.master": "local[*]",
            "spark.driver.memory": driver_memory,
        }
        if spark is not None:
            props = {k: v for k, v in props.items() if not k.startswith("spark.")}
            # a cluster given by address runs on this machine's files (as the plain Spark
            # side does): the operator vouches that its executors see them
            props.update({**spark, "storage.root.shared": "true"})
        props.update(dict(item.split("=", 1) for item in extra))
        worker_config.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        command = [*HERDER, "--log-level", log_level, "worker", "start"]
        with _procs.children_ignore_sigint():
            self.worker = services.start("worker", [*command, "--config", str(worker_config)])
        self.url = f"http://127.0.0.1:{rest_port}"
        self.http = httpx.Client(timeout=60)

        def answering() -> bool:
            self.worker.check_alive()
            try:
                # /health answers 200 once the worker has joined its group and can take
                # connectors
                return self.http.get(f"{self.url}/health", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        until(answering, 180, "the worker's REST API", interval=0.5)

    def create(self, name: str, config: dict[str, str]) -> None:
        reply = self.http.post(f"{self.url}/connectors", json={"name": name, "config": config})
        if reply.status_code != 201:
            raise RuntimeError(f"creating {name} failed: {reply.status_code} {reply.text}")

    def delete(self, name: str) -> None:
        self.http.delete(f"{self.url}/connectors/{name}")

    def running(self, *names: str) -> bool:
        self.worker.check_alive()
        for name in names:
            reply = self.http.get(f"{self.url}/connectors/{name}/status")
            tasks = reply.json().get("tasks", []) if reply.status_code == 200 else []
            failed = [t for t in tasks if t["state"] == "FAILED"]
            if failed:
                raise RuntimeError(f"task of {name} failed:\n{failed[0].get('trace')}")
            if not tasks or any(t["state"] != "RUNNING" for t in tasks):
                return False
        return True

    def close(self) -> None:
        self.http.close()


def sink_files(directory: Path) -> list[Path]:
    if not directory.exists():
        return []
    return sorted(
        p for p in directory.iterdir() if p.is_file() and not p.name.startswith((".", "_"))
    )


def output_size(path: Path) -> int:
    if path.is_dir():
        return sum(p.stat().st_size for p in sink_files(path))
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def run_pipeline(
    herder: Herder,
    name: str,
    prepared: Path,
    work: Path,
    sink: str,
    records: int,
    consumer_max_records: int | None = None,
) -> dict[str, Any]:
    """FileStreamSource → topic → ``sink``, timed from the input's arrival to its last line out."""
    input_path = work / f"{name}.txt"
    if sink == "DirectorySink":
        output = work / f"{name}-out"
        sink_config = {"directory": str(output), "format": "text"}
    else:
        output = work / f"{name}-out.txt"
        sink_config = {"file": str(output)}
    if consumer_max_records:
        sink_config["consumer.max.records"] = str(consumer_max_records)
    herder.create(f"{name}-sink", {"connector.class": sink, "topics": name, **sink_config})
    herder.create(
        f"{name}-source",
        {"connector.class": "FileStreamSource", "file": str(input_path), "topic": name},
    )
    until(lambda: herder.running(f"{name}-source", f"{name}-sink"), 180, f"{name} RUNNING")
    _procs.wait_quiet()  # the tasks started, the previous step's work is done
    size = prepared.stat().st_size
    changes = Changes(output if output.is_dir() else output.parent)
    try:
        with Measured(herder.worker.pid, herder.server.pid) as measured:
            os.rename(prepared, input_path)
            deadline = checked = time.monotonic()
            deadline += 1800
            while output_size(output) < size:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{records} lines through {sink} took over 1800 s")
                changes.wait(1.0)
                if time.monotonic() - checked > 1:  # not too often: it costs the worker CPU
                    checked = time.monotonic()
                    herder.running(f"{name}-source", f"{name}-sink")  # raises if one failed
    finally:
        changes.close()
    files = sink_files(output) if output.is_dir() else [output]
    equal = sha256_of(files) == sha256_of([input_path])
    herder.delete(f"{name}-source")
    herder.delete(f"{name}-sink")
    return {
        "seconds": round(measured.seconds, 3),
        "records_per_s": round(records / measured.seconds),
        "output_equals_input": equal,
        "output_files": len(files),
        "worker_cpu_s": round(measured.own_cpu[0], 2),
        "ensemble_cpu_s": round(measured.own_cpu[1], 2),
        "other_cpu_pct": measured.other_cpu_pct,
    }


def run_latency(herder: Herder, work: Path, samples: int, rate: float) -> dict[str, Any]:
    """One line at a time into a running FileStreamSource → DirectorySink (text)."""
    input_path, output = work / "latency.txt", work / "latency-out"
    input_path.touch()
    herder.create(
        "latency-sink",
        {"connector.class": "DirectorySink", "topics": "latency", "directory": str(output),
         "format": "text"},
    )  # fmt: skip
    herder.create(
        "latency-source",
        {"connector.class": "FileStreamSource", "file": str(input_path), "topic": "latency"},
    )  # fmt: skip
    until(lambda: herder.running("latency-source", "latency-sink"), 180, "latency RUNNING")
    seen: set[str] = set()
    arrived: set[bytes] = set()

    def read_new() -> None:
        for path in sink_files(output):
            if path.name not in seen:
                seen.add(path.name)
                arrived.update(path.read_bytes().splitlines())

    timings: list[int] = []
    changes = Changes(output)
    with (
        contextlib.closing(changes),
        Measured(herder.worker.pid, herder.server.pid) as measured,
        open(input_path, "ab") as f,
    ):
        for k in range(samples + 1):
            line = b"latency %06d" % k
            next_at = time.monotonic() + 1 / rate
            f.write(line + b"\n")
            f.flush()
            written = time.monotonic_ns()
            # the first line waits for the worker's first Spark jobs, which a loaded
            # machine can take minutes over
            wait = 60 if k else 300
            deadline = time.monotonic() + wait
            while line not in arrived:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"line {k} did not reach the sink within {wait} s")
                changes.wait(0.05)
                read_new()
            if k:  # the first line also waits for the pipeline's first Spark jobs
                timings.append(time.monotonic_ns() - written)
            time.sleep(max(0.0, next_at - time.monotonic()))
    herder.delete("latency-source")
    herder.delete("latency-sink")
    return {
        **_procs.latency_summary_ms(sorted(timings)),
        "rate_lines_per_s": rate,
        "other_cpu_pct": measured.other_cpu_pct,
    }


def run_sustained_latency(
    herder: Herder, work: Path, rate: int, seconds: float, warmup: float, line_bytes: int
) -> dict[str, Any]:
    """Lines appended at ``rate`` lines/s for ``warmup`` + ``seconds`` seconds into a
    running FileStreamSource → DirectorySink (text); each line's latency is the time from
    its write to the arrival of the sink file that holds it.

    A thread appends the lines every 10 ms, as many as are due, and notes when each run
    of them was written; the sink's files (renamed into place whole) are seen as they
    arrive, and only their first and last lines are read (lines are numbered), so
    watching costs the machine little. Lines of the first ``warmup`` seconds are not
    counted: they include the pipeline's first Spark jobs.
    """
    import threading

    import numpy as np

    input_path, output = work / "sustained.txt", work / "sustained-out"
    input_path.touch()
    herder.create(
        "sustained-sink",
        {"connector.class": "DirectorySink", "topics": "sustained", "directory": str(output),
         "format": "text"},
    )  # fmt: skip
    herder.create(
        "sustained-source",
        {"connector.class": "FileStreamSource", "file": str(input_path), "topic": "sustained"},
    )  # fmt: skip
    until(lambda: herder.running("sustained-source", "sustained-sink"), 180, "sustained RUNNING")
    total = int(rate * (seconds + warmup))
    written_ns = np.zeros(total, dtype=np.int64)
    arrived_ns = np.zeros(total, dtype=np.int64)
    filler = b"x" * max(1, line_bytes - 12)
    writer_done = threading.Event()
    started_at = [0]

    def append() -> None:
        with open(input_path, "ab") as f:
            began = time.monotonic()
            started_at[0] = time.monotonic_ns()
            done = 0
            while done < total:
                due = min(total, int((time.monotonic() - began) * rate) + 1)
                if due > done:
                    f.write(b"".join(b"%010d " % i + filler + b"\n" for i in range(done, due)))
                    f.flush()
                    written_ns[done:due] = time.monotonic_ns()
                    done = due
                time.sleep(0.01)
        writer_done.set()

    seen: set[str] = set()
    line_len = len(filler) + 12

    def read_new() -> None:
        now = time.monotonic_ns()
        for path in sink_files(output):
            if path.name in seen:
                continue
            seen.add(path.name)
            with open(path, "rb") as f:
                first = f.read(10)
                f.seek(max(0, path.stat().st_size - line_len))
                last = f.read(10)
            if first and last:
                arrived_ns[int(first) : int(last) + 1] = now

    thread = threading.Thread(target=append, name="sustained-writer", daemon=True)
    changes = Changes(output)
    # this process writes the lines and watches the sink: the step's load, not another's
    measured = Measured(herder.worker.pid, herder.server.pid, load_pid=os.getpid())
    with contextlib.closing(changes), measured:
        thread.start()
        deadline = checked = time.monotonic()
        deadline += seconds + warmup + 120
        while not (writer_done.is_set() and arrived_ns[-1]):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{total} lines at {rate}/s did not all reach the sink")
            changes.wait(0.05)
            read_new()
            if time.monotonic() - checked > 2:  # not too often: it costs the worker CPU
                checked = time.monotonic()
                herder.running("sustained-source", "sustained-sink")  # raises if one failed
        thread.join()
    achieved = total / ((written_ns[-1] - started_at[0]) / 1e9)
    counted = slice(int(rate * warmup), total)
    latencies = np.sort(arrived_ns[counted] - written_ns[counted])
    herder.delete("sustained-source")
    herder.delete("sustained-sink")
    return {
        **_procs.latency_summary_ms(latencies.tolist()),
        "rate_lines_per_s": rate,
        "achieved_lines_per_s": round(achieved),
        "seconds_measured": seconds,
        "sink_files": len(seen),
        "worker_cpu_s": round(measured.own_cpu[0], 2),
        "load_cpu_s": round(measured.load_cpu_s, 2),
        "other_cpu_pct": measured.other_cpu_pct,
    }


def measure_latencies(
    args: argparse.Namespace, herder: Herder, work: Path, figures: dict[str, Any]
) -> None:
    """A line's latency at a trickle (``latency_ms``), then under a sustained load
    (``sustained_latency_ms``)."""
    _procs.progress(f"latency: {args.latency_samples} lines, {args.latency_rate} lines/s at most")
    figures["latency_ms"] = run_latency(herder, work, args.latency_samples, args.latency_rate)
    _procs.progress(f"latency: {figures['latency_ms']}")
    if not args.sustained_rate:
        return
    _procs.progress(
        f"sustained latency: {args.sustained_rate:,} lines/s for {args.sustained_seconds} s"
    )
    figures["sustained_latency_ms"] = run_sustained_latency(
        herder,
        work,
        args.sustained_rate,
        args.sustained_seconds,
        args.sustained_warmup_seconds,
        args.line_bytes,
    )
    _procs.progress(f"sustained latency: {figures['sustained_latency_ms']}")


class Changes:
    """Waits for something to change in a directory: Linux's inotify where there is one,
    so that waiting for a sink's output costs no CPU while nothing happens (a poll every
    few ms takes a share of a core from the worker being measured); else a short sleep.
    """

    #: inotify(7): a file created, written, closed after writing, or moved in
    _EVENTS = 0x100 | 0x2 | 0x8 | 0x80

    def __init__(self, directory: Path) -> None:
        self.fd: int | None = None
        if not sys.platform.startswith("linux"):
            return
        import ctypes

        try:
            libc = ctypes.CDLL(None, use_errno=True)
            fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        except (OSError, AttributeError):
            return
        if fd < 0:
            return
        if libc.inotify_add_watch(fd, os.fsencode(directory), self._EVENTS) < 0:
            os.close(fd)
            return
        self.fd = fd

    def wait(self, timeout: float) -> None:
        """Until something changes, or ``timeout`` seconds."""
        if self.fd is None:
            time.sleep(min(timeout, 0.01))
            return
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if ready:
            with contextlib.suppress(BlockingIOError):
                while os.read(self.fd, 1 << 16):
                    pass

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


# -- the run ----------------------------------------------------------------------------------


@contextlib.contextmanager
def herder_running(args: argparse.Namespace, work: Path) -> Iterator[Herder]:
    """One ensemble server and one worker with the benchmark's settings, stopped after."""
    with _procs.Services(work) as services:
        herder = Herder(
            services, work, args.driver_memory, args.worker_log_level,
            spark_settings(args), args.worker_property,
        )  # fmt: skip
        try:
            yield herder
        finally:
            herder.close()


def run(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="herder-bench-pipeline-", dir=args.tmp_dir))
    figures: dict[str, Any] = {
        "benchmark": "pipeline",
        "herder_version": herder_version,
        "records": args.records,
        "warmup_runs": args.warmup_runs,
        "line_bytes": args.line_bytes,
        "sink_consumer_max_records": args.consumer_max_records or "runtime default",
        "machine": _procs.machine_info(),
        "spark_on": args.spark_remote or args.spark_master,
    }
    try:
        if args.only == "latency":
            with herder_running(args, work) as herder:
                measure_latencies(args, herder, work, figures)
            warn_if_shared(figures)
            return figures
        baseline_input = work / "spark-input.txt"
        size = write_lines(baseline_input, args.records, args.line_bytes)
        figures["input_bytes"] = size
        plain = PlainSpark(args, baseline_input, work)
        try:
            with herder_running(args, work) as herder:
                measure_throughput(args, plain, herder, work, figures)
                plain.close()
                measure_latencies(args, herder, work, figures)
        finally:
            plain.close()
        warn_if_shared(figures)
    finally:
        if args.keep_work_dir:
            _procs.progress(f"kept {work} (inputs, outputs, worker.log)")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return figures


def measure_throughput(
    args: argparse.Namespace,
    plain: PlainSpark,
    herder: Herder,
    work: Path,
    figures: dict[str, Any],
) -> None:
    """Plain Spark's runs and herder's DirectorySink runs, one of each in turn (warm-ups,
    then measured runs; the best of each side counts), then herder's FileStreamSink run."""

    def herder_run(name: str, sink: str, *, warmup: bool = False) -> dict[str, Any]:
        prepared = work / f"{name}.prepared"
        write_lines(prepared, args.records, args.line_bytes)
        _procs.progress(f"herder: {args.records:,} lines → {sink}")
        result = run_pipeline(
            herder, name, prepared, work, sink, args.records, args.consumer_max_records
        )
        _procs.progress(f"herder → {sink}: {result['records_per_s']:,} lines/s")
        if warmup or not args.keep_work_dir:  # checked: no need for the disk it takes
            (work / f"{name}.txt").unlink()
            shutil.rmtree(work / f"{name}-out", ignore_errors=True)
            (work / f"{name}-out.txt").unlink(missing_ok=True)
        return result

    # As long as measured runs: Spark's big jobs compile and JIT their code over several
    # runs, in either process.
    warmups = []
    for i in range(args.warmup_runs):
        _procs.progress(f"warm-up {i + 1} of {args.warmup_runs}: plain Spark, then herder")
        plain.run(warmup=True)
        warmups.append(herder_run(f"warmup{i}", "DirectorySink", warmup=True)["seconds"])
    runs = []
    for i in range(args.runs):
        _procs.progress(f"run {i + 1} of {args.runs}")
        herder_turn = functools.partial(herder_run, f"directory{i}", "DirectorySink")
        runs.append(_procs.in_turn(i, functools.partial(plain.run, warmup=False), herder_turn))
        _procs.progress(f"plain Spark: {args.records / plain.runs[-1]['seconds']:,.0f} lines/s")
    spark = figures["spark"] = plain.figures()
    directory = {
        **min(runs, key=lambda r: r["seconds"]),
        "runs_s": [r["seconds"] for r in runs],
        "warmups_s": warmups,
    }
    figures["herder_directory_sink"] = {
        **directory,
        "ratio_to_spark": _procs.ratio(directory["records_per_s"], spark["records_per_s"]),
        "ratio_to_durable_spark": _procs.ratio(
            directory["records_per_s"], spark["durable"]["records_per_s"]
        ),
        "target_ratio": TARGET_RATIO,
        "target_ratio_to_durable_spark": TARGET_RATIO_TO_DURABLE,
        "meets_target": directory["records_per_s"] >= TARGET_RATIO * spark["records_per_s"]
        and directory["records_per_s"]
        >= TARGET_RATIO_TO_DURABLE * spark["durable"]["records_per_s"],
    }
    file = herder_run("file", "FileStreamSink")
    figures["herder_file_sink"] = {
        **file,
        "ratio_to_spark": _procs.ratio(file["records_per_s"], spark["records_per_s"]),
    }


def warn_if_shared(figures: dict[str, Any]) -> None:
    """A warning in ``figures`` if other processes took a share of the machine while
    either side was measured."""
    measured = (
        "spark",
        "herder_directory_sink",
        "herder_file_sink",
        "latency_ms",
        "sustained_latency_ms",
    )
    worst = max((figures[k]["other_cpu_pct"] for k in measured if k in figures), default=0.0)
    if worst > 25:
        figures["warning"] = (
            f"other processes used up to {worst:.0f}% of a core while a side was measured:"
            " the machine was shared, so these figures are not representative"
        )


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_input_options(parser)
    parser.add_argument("--runs", "--spark-runs", dest="runs", type=int, default=5)
    parser.add_argument("--warmup-runs", type=int, default=3)
    parser.add_argument("--latency-samples", type=int, default=100)
    parser.add_argument("--latency-rate", type=float, default=5.0)
    parser.add_argument("--sustained-rate", type=int, default=50_000)
    parser.add_argument("--sustained-seconds", type=float, default=20.0)
    parser.add_argument("--sustained-warmup-seconds", type=float, default=5.0)
    parser.add_argument("--only", choices=["all", "latency"], default="all")
    parser.add_argument(
        "--worker-property",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a worker config setting (repeatable), e.g. dataplane.trickle.max.records=0",
    )
    parser.add_argument("--consumer-max-records", type=int, default=None)
    parser.add_argument("--keep-work-dir", action="store_true")
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--spark-master",
        default="local[*]",
        help="where both sides run their jobs: local[*] (default) or a cluster's master, "
        "e.g. spark://127.0.0.1:7077, whose executors see this machine's files",
    )
    where.add_argument(
        "--spark-remote", default=None, help="a Spark Connect server for both sides: sc://host:port"
    )
    parser.add_argument(
        "--worker-log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"]
    )
    args = parser.parse_args(argv)
    _procs.check_counts(
        parser,
        args,
        positive=("records", "runs", "latency_samples", "latency_rate"),
        non_negative=("warmup_runs",),
    )
    check_line_bytes(parser, args)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["--spark-baseline-child"]:
        spark_baseline_child(argv[1], argv[2], argv[3])
        return 0
    args = parse_args(argv)
    return _procs.run_and_emit(lambda: run(args), pretty=args.pretty)


if __name__ == "__main__":
    sys.exit(main())
