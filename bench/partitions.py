"""A partitioned topic written and read by 1, 2 and 4 tasks, against plain Spark doing the same.

    python bench/partitions.py [--records N] [--files F] [--row-bytes B] [--tasks 1,2,4]
                               [--partitions P] [--batch-files K] [--warmup-runs W]
                               [--runs R]
                               [--driver-memory 1g] [--tmp-dir D] [--pretty]
                               [--keep-work-dir] [--worker-log-level DEBUG]

The input is F JSON-lines files (default 64) holding N rows (default 1,000,000) of
about B bytes (default 100), ``{"id":…,"pad":"…"}``. For each task count T of
``--tasks`` it measures, in one run, on 127.0.0.1 with fresh temporary directories:

* **herder**: one ensemble server and two workers (``herder worker start``, Spark
  ``local[*]`` each) in one group; a topic of P partitions (default 8, made with
  ``herder topics create``); a DirectorySink (text) and a DirectorySource (json, with
  the rows' schema given) with ``tasks.max=T`` each, RUNNING on an input directory that
  does not exist yet, and the sink's group formed (Stable with T members: a member
  that joins once records flow waits for the others' deliveries to end, which would
  time the group's forming rather than the pipeline). The source's tasks share the
  files out by name, each batch of K files (``batch.max.files``, default 4) goes to one
  partition, rotating, and the sink's T group members split the P partitions. The
  prepared directory is renamed into place and the clock runs until the sink's files
  hold every row (their size is the input's: the sink writes each row back as the same
  JSON). The output is then checked: every
  id exactly once.
* **plain Spark** (the anchor), in a process of its own with the workers' session
  settings (``local[*]``): the same partitioned write and read with the same
  parallelism — T threads each read their share of the files in batches of K and
  write each batch as Parquet into one of P partition directories, rotating; then T
  threads each read their P/T partitions and write them as text. (One JVM, where herder
  has two: on a machine of two cores that favours the anchor.)

Each T gets ``--warmup-runs`` untimed runs first (default 2) on both sides, so the
JVMs' hot paths are compiled before the clock runs; on herder's side, after one more
first with tasks on every worker (a run of one task lands on either worker). Then
``--runs`` rounds follow (default 4), each a measured run of every T, and, as in
``bench/pipeline.py``, the best run of each T counts: on a machine of two cores running
three JVMs, one run can move by 15%, and a best of two after one warm-up still left
the task counts' best runs some 10% apart by chance (three runs of 1/2/4 tasks:
1 / 0.952 / 1.004, 1 / 1.105 / 1.131, 1 / 0.907 / 1.004, where a best of four after
two gave 1 / 1.059 / 1.102, 1 / 1.046 / 1.037, 1 / 1.185 / 1.219). Plain Spark's
process lives as long as herder's workers, and the two sides take turns, a run of each,
which side goes first alternating: a machine that slows down or speeds up during the
benchmark weighs on every T and both sides alike. Each run starts once the machine has
settled (under 10% of a core busy). With the defaults a run takes about four minutes.
The JSON has, per T, records/s of both (with every measured run's seconds) and their
ratio, and ``scaling``: records/s at each T over records/s at T=1 (on a machine of two
cores the point is that it does not fall).
Progress goes to stderr; every process started is stopped by PID in ``finally`` blocks.
"""

from __future__ import annotations

import argparse
import functools
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

if __package__ in (None, ""):  # run as a script: make the ``bench`` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx

from bench import _procs
from bench.pipeline import HERDER, output_size, sink_files, start_ensemble, tree_cpu_seconds, until

SCHEMA = "id long, pad string"
WORKERS = 2


# -- input ----------------------------------------------------------------------------------


def write_input(directory: Path, records: int, files: int, row_bytes: int) -> int:
    """``files`` JSON-lines files of ``records`` rows in all; returns their bytes. Rows
    are written as Spark's ``to_json`` writes them, so the sink's output has the same size."""
    directory.mkdir(parents=True)
    pad = "x" * max(1, row_bytes - 30)
    per, extra = divmod(records, files)
    first = 0
    for f in range(files):
        count = per + (1 if f < extra else 0)
        rows = "".join(f'{{"id":{i},"pad":"{pad}"}}\n' for i in range(first, first + count))
        (directory / f"part-{f:05d}.json").write_text(rows)
        first += count
    return sum(p.stat().st_size for p in directory.iterdir())


def check_output(directory: Path, records: int) -> bool:
    """Whether the sink's files hold every id below ``records`` exactly once."""
    seen = bytearray(records)
    lines = 0
    for path in sink_files(directory):
        with open(path, "rb") as f:
            for line in f:
                lines += 1
                i = int(line[6 : line.index(b",")])
                if not 0 <= i < records or seen[i]:
                    return False
                seen[i] = 1
    return lines == records


# -- plain Spark ------------------------------------------------------------------------------


def shares(items: Sequence[Any], count: int) -> list[list[Any]]:
    """``items`` dealt out to ``count`` takers, contiguous and as even as can be."""
    per, extra = divmod(len(items), count)
    out, start = [], 0
    for i in range(count):
        n = per + (1 if i < extra else 0)
        out.append(list(items[start : start + n]))
        start += n
    return out


def anchor_child(spec: str) -> None:
    """Runs in a process of its own: the partitioned write and read with T threads, timed,
    once per line ``T`` read from stdin (one JSON line of figures in answer), until
    stdin ends."""
    from pyspark.sql import functions as F

    from herder.dataplane.spark import SparkRuntime, SparkSettings

    params = json.loads(spec)
    session = SparkRuntime(SparkSettings.from_properties(params["spark"])).session
    inputs = sorted(str(p) for p in Path(params["input"]).iterdir())
    partitions, batch = params["partitions"], params["batch_files"]

    def in_threads(work: list[list[Any]], job: Any) -> None:
        threads = [threading.Thread(target=job, args=(i, w)) for i, w in enumerate(work)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    for run, line in enumerate(sys.stdin):
        tasks = int(line)
        root = Path(params["work"]) / f"anchor-{run}"

        def write(task: int, files: list[str], root: Path = root, tasks: int = tasks) -> None:
            for n, start in enumerate(range(0, len(files), batch)):
                rows = session.read.schema(SCHEMA).json(files[start : start + batch])
                value = F.to_json(F.struct(*[F.col(c) for c in rows.columns]))
                p = (task + n * tasks) % partitions
                target = root / "topic" / f"partition={p}" / f"{task}-{n}"
                rows.select(value.alias("value")).write.parquet(str(target))

        def read(task: int, mine: list[int], root: Path = root) -> None:
            dirs = [str(root / "topic" / f"partition={p}") for p in mine]
            dirs = [d for d in dirs if os.path.isdir(d)]
            if dirs:
                paths = [f"{d}/*" for d in dirs]
                session.read.parquet(*paths).write.text(str(root / "out" / str(task)))

        started = time.monotonic()
        in_threads(shares(inputs, tasks), write)
        written = time.monotonic()
        in_threads(shares(list(range(partitions)), tasks), read)
        done = time.monotonic()
        shutil.rmtree(root, ignore_errors=True)
        print(json.dumps({"write_s": written - started, "read_s": done - written}), flush=True)


class Anchor:
    """Plain Spark's side (:func:`anchor_child`), alive in a process of its own for the
    whole benchmark and asked for one run at a time, so its runs interleave with
    herder's."""

    def __init__(self, args: argparse.Namespace, input_dir: Path, work: Path) -> None:
        spec = {
            "spark": {"spark.master": "local[*]", "spark.driver.memory": args.driver_memory},
            "input": str(input_dir),
            "work": str(work),
            "partitions": args.partitions,
            "batch_files": args.batch_files,
        }
        command = [
            sys.executable, str(Path(__file__).resolve()), "--anchor-child", json.dumps(spec)
        ]  # fmt: skip
        self.child = _procs.JsonChild(command, "the plain Spark run", work / "anchor.log")
        self.records = args.records
        self.runs: dict[int, list[dict[str, float]]] = {}

    def run(self, tasks: int, *, warmup: bool) -> None:
        _procs.wait_quiet()
        figures = self.child.ask(str(tasks), 3600)
        if not warmup:
            self.runs.setdefault(tasks, []).append(figures)

    def close(self) -> None:
        self.child.close()

    def figures(self, tasks: int) -> dict[str, Any]:
        runs = self.runs[tasks]
        run = min(runs, key=lambda r: r["write_s"] + r["read_s"])
        seconds = run["write_s"] + run["read_s"]
        return {
            "seconds": round(seconds, 3),
            "write_s": round(run["write_s"], 3),
            "read_s": round(run["read_s"], 3),
            "records_per_s": round(self.records / seconds),
            "runs_s": [round(r["write_s"] + r["read_s"], 3) for r in runs],
        }


# -- herder ---------------------------------------------------------------------------------


class Cluster:
    """One ensemble server and two workers in one group, and their REST APIs."""

    def __init__(
        self, services: _procs.Services, work: Path, driver_memory: str, log_level: str = "INFO"
    ) -> None:
        self.server, client_port = start_ensemble(services, work)
        self.bootstrap = f"127.0.0.1:{client_port}"
        self.workers: list[_procs.Service] = []
        self.urls: list[str] = []
        for n in range(WORKERS):
            rest_port = _procs.free_port()
            config = work / f"worker-{n}.properties"
            props = {
                "group.id": "bench-partitions",
                "bootstrap.servers": self.bootstrap,
                "rest.host.name": "127.0.0.1",
                "rest.port": rest_port,
                "storage.root": str(work / "topics"),
                "spark.master": "local[*]",
                "spark.driver.memory": driver_memory,
            }
            config.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
            with _procs.children_ignore_sigint():
                self.workers.append(
                    services.start(
                        f"worker-{n}",
                        [
                            *HERDER,
                            "--log-level",
                            log_level,
                            "worker",
                            "start",
                            "--config",
                            str(config),
                        ],
                    )
                )
            self.urls.append(f"http://127.0.0.1:{rest_port}")
        self.http = httpx.Client(timeout=60)
        until(self.answering, 180, "the workers' REST APIs", interval=0.5)

    def answering(self) -> bool:
        for worker, url in zip(self.workers, self.urls, strict=True):
            worker.check_alive()
            try:
                if self.http.get(f"{url}/connectors", timeout=2).status_code != 200:
                    return False
            except httpx.HTTPError:
                return False
        return True

    def create_topic(self, name: str, partitions: int) -> None:
        command = [*HERDER, "topics", "create", name, "--partitions", str(partitions)]
        # its output would mix with the figures on stdout
        subprocess.run(
            [*command, "--bootstrap", self.bootstrap], check=True, timeout=120, capture_output=True
        )

    def create(self, name: str, config: dict[str, str]) -> None:
        reply = self.http.post(f"{self.urls[0]}/connectors", json={"name": name, "config": config})
        if reply.status_code != 201:
            raise RuntimeError(f"creating {name} failed: {reply.status_code} {reply.text}")

    def delete(self, name: str) -> None:
        self.http.delete(f"{self.urls[0]}/connectors/{name}")

    def running(self, name: str, tasks: int) -> bool:
        """Whether ``name`` has ``tasks`` tasks, all RUNNING (raises if one failed)."""
        for worker in self.workers:
            worker.check_alive()
        reply = self.http.get(f"{self.urls[0]}/connectors/{name}/status")
        found = reply.json().get("tasks", []) if reply.status_code == 200 else []
        failed = [t for t in found if t["state"] == "FAILED"]
        if failed:
            raise RuntimeError(f"task of {name} failed:\n{failed[0].get('trace')}")
        return len(found) == tasks and all(t["state"] == "RUNNING" for t in found)

    def group_formed(self, sink: str, members: int) -> bool:
        """Whether the sink's consumer group (``connect-<sink>``) is Stable with
        ``members`` members: every sink task has its partitions."""
        command = [*HERDER, "groups", "describe", f"connect-{sink}", "--json"]
        found = subprocess.run(
            [*command, "--bootstrap", self.bootstrap], timeout=120, capture_output=True, text=True
        )
        if found.returncode != 0:
            return False
        group = json.loads(found.stdout)
        return group.get("state") == "Stable" and len(group.get("members", [])) == members

    def cpu_seconds(self) -> float:
        return sum(tree_cpu_seconds(w.pid) for w in self.workers)


def run_herder(
    cluster: Cluster, args: argparse.Namespace, name: str, tasks: int, prepared: Path, work: Path
) -> dict[str, Any]:
    """DirectorySource → topic of P partitions → DirectorySink, ``tasks`` tasks each side."""
    source, output = work / f"{name}-in", work / f"{name}-out"
    cluster.create_topic(name, args.partitions)
    cluster.create(
        f"{name}-sink",
        {"connector.class": "DirectorySink", "directory": str(output), "format": "text",
         "topics": name, "tasks.max": str(tasks)},
    )  # fmt: skip
    cluster.create(
        f"{name}-source",
        {"connector.class": "DirectorySource", "directory": str(source), "format": "json",
         "schema": SCHEMA, "topic": name, "tasks.max": str(tasks),
         "batch.max.files": str(args.batch_files), "poll.interval.ms": "100"},
    )  # fmt: skip
    until(
        lambda: cluster.running(f"{name}-sink", tasks) and cluster.running(f"{name}-source", tasks),
        300,
        f"{name}'s tasks RUNNING",
    )
    # A sink task's member joins the group after its task is RUNNING; a member joining
    # once records flow waits for the others to finish their deliveries and rejoin,
    # which would time the group's forming, not the pipeline's throughput.
    until(lambda: cluster.group_formed(f"{name}-sink", tasks), 300, f"{name}-sink's group formed")
    _procs.wait_quiet()  # the tasks started, the previous step's work is done
    size = sum(p.stat().st_size for p in prepared.iterdir())
    cpu = cluster.cpu_seconds()
    started = time.monotonic()
    os.rename(prepared, source)
    deadline = started + 3600
    checked = started
    while output_size(output) < size:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{args.records} rows through {tasks} tasks took over 3600 s")
        time.sleep(0.05)
        if time.monotonic() - checked > 2:  # not too often: it costs the workers CPU
            checked = time.monotonic()
            cluster.running(f"{name}-source", tasks)
    seconds = time.monotonic() - started
    used = cluster.cpu_seconds() - cpu
    exactly_once = check_output(output, args.records)
    cluster.delete(f"{name}-source")
    cluster.delete(f"{name}-sink")
    shutil.rmtree(source, ignore_errors=True)
    shutil.rmtree(output, ignore_errors=True)
    return {
        "seconds": round(seconds, 3),
        "records_per_s": round(args.records / seconds),
        "exactly_once": exactly_once,
        "workers_cpu_s": round(used, 2),
    }


# -- the run ----------------------------------------------------------------------------------


def measure(
    args: argparse.Namespace, anchor: Anchor, cluster: Cluster, work: Path
) -> dict[int, list[dict[str, Any]]]:
    """Both sides' runs, a run of each in turn: warm-ups per task count, then
    ``--runs`` rounds of a measured run per task count, so that a machine that slows
    down or speeds up during the benchmark weighs on every task count and both sides
    alike. Herder's measured runs, by task count."""

    def herder_run(name: str, tasks: int) -> dict[str, Any]:
        prepared = work / f"{name}.prepared"
        write_input(prepared, args.records, args.files, args.row_bytes)
        return run_herder(cluster, args, name, tasks, prepared, work)

    if args.warmup_runs:
        # a run that puts tasks on every worker: the per-T warm-ups below would
        # otherwise warm only the worker that one task landed on, and its measured run
        # might land on the other, cold one
        spread = max(WORKERS, *args.tasks)
        _procs.progress(f"herder: {spread} tasks each side, warming every worker")
        herder_run("warm", spread)
    for tasks in args.tasks:
        for run_index in range(args.warmup_runs):
            _procs.progress(f"{tasks} tasks each side, warm-up: plain Spark, then herder")
            anchor.run(tasks, warmup=True)
            herder_run(f"w{tasks}r{run_index}", tasks)
    measured: dict[int, list[dict[str, Any]]] = {}
    for run_index in range(args.runs):
        for tasks in args.tasks:
            _procs.progress(f"round {run_index + 1} of {args.runs}, {tasks} tasks each side")
            plain = functools.partial(anchor.run, tasks, warmup=False)
            herder = functools.partial(herder_run, f"p{tasks}r{run_index}", tasks)
            result = _procs.in_turn(run_index, plain, herder)
            measured.setdefault(tasks, []).append(result)
            _procs.progress(f"herder, {tasks} tasks: {result['records_per_s']:,} rows/s")
    return measured


def run(args: argparse.Namespace) -> tuple[dict[str, Any], int]:
    work = Path(tempfile.mkdtemp(prefix="herder-bench-partitions-", dir=args.tmp_dir))
    figures: dict[str, Any] = {
        "benchmark": "partitions",
        "records": args.records,
        "files": args.files,
        "row_bytes": args.row_bytes,
        "partitions": args.partitions,
        "batch_files": args.batch_files,
        "workers": WORKERS,
        "warmup_runs": args.warmup_runs,
        "runs": args.runs,
        "machine": _procs.machine_info(),
    }
    status = 0
    try:
        anchor_input = work / "anchor-input"
        figures["input_bytes"] = write_input(anchor_input, args.records, args.files, args.row_bytes)
        anchor = Anchor(args, anchor_input, work)
        results: dict[str, Any] = {}
        try:
            with _procs.Services(work) as services:
                cluster = Cluster(services, work, args.driver_memory, args.worker_log_level)
                try:
                    measured = measure(args, anchor, cluster, work)
                finally:
                    cluster.http.close()
        finally:
            anchor.close()
        for tasks in args.tasks:
            # the best run counts; every run's output must hold each row once
            runs = measured[tasks]
            result = {
                **max(runs, key=lambda r: r["records_per_s"]),
                "runs_s": [r["seconds"] for r in runs],
                "exactly_once": all(r["exactly_once"] for r in runs),
            }
            spark = anchor.figures(tasks)
            results[str(tasks)] = {
                "herder": result,
                "spark": spark,
                "ratio_to_spark": _procs.ratio(result["records_per_s"], spark["records_per_s"]),
            }
            if not result["exactly_once"]:
                status = 1
        figures["tasks"] = results
        base = results[str(args.tasks[0])]
        figures["scaling"] = {
            side: {
                t: _procs.ratio(r[side]["records_per_s"], base[side]["records_per_s"])
                for t, r in results.items()
            }
            for side in ("herder", "spark")
        }
    finally:
        if args.keep_work_dir:
            _procs.progress(f"kept {work} (the workers' logs in worker-N.log)")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return figures, status


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--files", type=int, default=64)
    parser.add_argument("--row-bytes", type=int, default=100)
    parser.add_argument("--tasks", default="1,2,4", help="task counts to measure, e.g. 1,2,4")
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--batch-files", type=int, default=4)
    parser.add_argument("--warmup-runs", type=int, default=2)
    parser.add_argument("--runs", type=int, default=4, help="measured runs per T; the best counts")
    parser.add_argument("--driver-memory", default="1g")
    parser.add_argument("--tmp-dir", default=None)
    parser.add_argument("--pretty", action="store_true")
    parser.add_argument("--keep-work-dir", action="store_true")
    parser.add_argument(
        "--worker-log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR")
    )
    args = parser.parse_args(argv)
    try:
        args.tasks = [int(t) for t in args.tasks.split(",")]
    except ValueError:
        parser.error(f"--tasks must be whole numbers separated by commas, not {args.tasks!r}")
    if any(t < 1 for t in args.tasks):
        parser.error("--tasks must all be positive")
    _procs.check_counts(
        parser,
        args,
        positive=("records", "files", "partitions", "batch_files", "runs"),
        non_negative=("warmup_runs",),
    )
    if args.records < args.files:
        parser.error("--records must be at least --files")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["--anchor-child"]:
        anchor_child(argv[1])
        return 0
    args = parse_args(argv)
    return _procs.run_and_report(lambda: run(args), pretty=args.pretty)


if __name__ == "__main__":
    sys.exit(main())
