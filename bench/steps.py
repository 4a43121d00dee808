"""The data plane's two steps in one warm JVM, beside plain Spark's two jobs, alternating.

    python bench/steps.py [--records N] [--line-bytes B] [--rounds R] [--warmup W]
                          [--driver-memory 2g] [--tmp-dir D] [--pretty]

``bench/pipeline.py`` measures a whole pipeline on a worker, whose figures carry
everything a running worker adds (noticing the file, the worker's other threads, a JVM
that has run other kinds of jobs) and vary from run to run by more than a change to one
step is worth. This benchmark takes the two steps alone, in one process and one
SparkSession, against one ensemble server, so that their costs can be compared with
plain Spark's at the same warmth:

* **herder**: lines of a file staged as a batch by :class:`SegmentWriter` (Spark's text
  reader, as FileStreamSource gives a whole file) and committed; then read back in offset
  order (``Topics.read_ranged``) and written by ``DirectorySinkTask.put`` as text, given
  the read's offset ranges as a sink task is — a file per staged file, fsynced, as a
  sink task does before its offsets are committed.
* **spark**: ``spark.read.text(in).write.parquet(mid)``, then
  ``spark.read.parquet(mid).write.text(out)``.

Each round runs both, one after the other, in alternating order; ``--warmup`` rounds
(default 3) are not counted. Reported per side, as medians over the ``--rounds``
(default 8): seconds for each step and in all, and the CPU seconds of this process and
its JVM. ``ratio`` is Spark's seconds over herder's (herder's share of plain Spark's
speed, as ``bench/pipeline.py`` reports it). Every herder round's output is checked to
equal the input.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the ``bench`` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _procs
from bench.pipeline import (
    add_input_options,
    check_line_bytes,
    sha256_of,
    start_ensemble,
    write_lines,
)
from herder import __version__ as herder_version
from herder.connect import OffsetRange, SinkTaskContext, TopicPartition


class Clock:
    """Elapsed seconds and the CPU seconds of this process and its JVM."""

    def __init__(self, pids: Sequence[int]) -> None:
        self.pids = pids

    def read(self) -> tuple[float, float]:
        return time.monotonic(), sum(_procs.cpu_seconds(p) for p in self.pids)


class PutContext(SinkTaskContext):
    """What a sink task's put sees of the runtime: the offset ranges of its DataFrame."""

    def __init__(self, ranges: Sequence[OffsetRange] | None) -> None:
        self.ranges = ranges

    @property
    def configs(self) -> Mapping[str, str]:
        return {}

    def assignment(self) -> frozenset[TopicPartition]:
        return frozenset(r.topic_partition for r in self.ranges or ())

    def offset(self, partition: TopicPartition, offset: int) -> None: ...

    def committed(self, partition: TopicPartition) -> tuple[int, str] | None:
        return None

    def pause(self, *partitions: TopicPartition) -> None: ...

    def resume(self, *partitions: TopicPartition) -> None: ...

    def paused(self) -> frozenset[TopicPartition]:
        return frozenset()

    def request_commit(self) -> None: ...

    def offset_ranges(self) -> Sequence[OffsetRange] | None:
        return self.ranges


def median_of(rounds: list[dict[str, float]]) -> dict[str, float]:
    return {k: round(statistics.median(r[k] for r in rounds), 3) for k in rounds[0]}


async def measure(args: argparse.Namespace, work: Path, bootstrap: str) -> dict[str, Any]:
    from herder.connectors.directory import DirectorySinkTask
    from herder.dataplane import SegmentWriter, SparkRuntime, Storage, Topics
    from herder.dataplane.datasource import whole_file_lines_dataframe
    from herder.dataplane.spark import SparkSettings
    from herder.ensemble.client import EnsembleClient

    spark = SparkRuntime(SparkSettings.from_properties({"spark.driver.memory": args.driver_memory}))
    spark.start()
    session = spark.session
    jvm = session._jvm
    if jvm is None:
        raise RuntimeError("bench/steps.py needs a classic SparkSession (not Spark Connect)")
    jvm_pid = int(jvm.java.lang.ProcessHandle.current().pid())
    clock = Clock([os.getpid(), jvm_pid])
    source = work / "input.txt"
    write_lines(source, args.records, args.line_bytes)
    expected = sha256_of([source])
    storage = Storage(str(work / "topics"))

    async with EnsembleClient(bootstrap, session_timeout_ms=60_000) as client:
        topics = Topics(client, storage, spark=spark)
        await topics.create("steps", 1)
        writer = SegmentWriter(topics, spark, "steps-0", 1)

        async def herder(round_dir: Path) -> dict[str, float]:
            began, cpu0 = clock.read()
            lines = await spark.run(lambda: whole_file_lines_dataframe(session, str(source)))
            if lines is None:
                raise RuntimeError(f"Spark's text reader cannot be given {source} as it is")
            staged = await writer.stage(lines, "steps")
            tp = TopicPartition("steps", 0)
            segment = (await topics.commit(staged)).segments[tp]
            staged_at, _ = clock.read()
            wanted = {0: (segment.base_offset, segment.end_offset)}
            df, ranges = await topics.read_ranged("steps", wanted, ordered=True)
            task = DirectorySinkTask()
            task.initialize(PutContext(ranges))
            task.start({"directory": str(round_dir), "format": "text", "topics": "steps"})
            task.bases = {tp: segment.base_offset}
            await asyncio.to_thread(task.put, df)
            task.stop()
            done, cpu1 = clock.read()
            outputs = sorted(p for p in round_dir.iterdir() if p.is_file())
            if sha256_of(outputs) != expected:
                raise RuntimeError(f"herder's output in {round_dir} is not the input")
            return {
                "stage_s": staged_at - began,
                "deliver_s": done - staged_at,
                "seconds": done - began,
                "cpu_s": cpu1 - cpu0,
            }

        def plain(round_dir: Path) -> dict[str, float]:
            began, cpu0 = clock.read()
            session.read.text(str(source)).write.parquet(str(round_dir / "mid"))
            middle, _ = clock.read()
            session.read.parquet(str(round_dir / "mid")).write.text(str(round_dir / "out"))
            done, cpu1 = clock.read()
            return {
                "stage_s": middle - began,
                "deliver_s": done - middle,
                "seconds": done - began,
                "cpu_s": cpu1 - cpu0,
            }

        async def run_plain(round_dir: Path) -> dict[str, float]:
            return await asyncio.to_thread(plain, round_dir)

        sides: dict[str, Callable[[Path], Any]] = {"herder": herder, "spark": run_plain}
        figures: dict[str, list[dict[str, float]]] = {name: [] for name in sides}
        for n in range(args.warmup + args.rounds):
            order = list(sides) if n % 2 == 0 else list(reversed(sides))
            for name in order:
                round_dir = work / f"{name}-{n}"
                got = await sides[name](round_dir)
                shutil.rmtree(round_dir, ignore_errors=True)
                if n >= args.warmup:
                    figures[name].append(got)
            _procs.progress(
                f"round {n + 1} of {args.warmup + args.rounds}"
                + (" (warm-up)" if n < args.warmup else "")
            )
        await topics.delete("steps")
    spark.stop()
    herder_median, spark_median = median_of(figures["herder"]), median_of(figures["spark"])
    return {
        "herder": {**herder_median, "runs_s": [round(r["seconds"], 3) for r in figures["herder"]]},
        "spark": {**spark_median, "runs_s": [round(r["seconds"], 3) for r in figures["spark"]]},
        "ratio": _procs.ratio(spark_median["seconds"], herder_median["seconds"]),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="herder-bench-steps-", dir=args.tmp_dir))
    figures: dict[str, Any] = {
        "benchmark": "steps",
        "herder_version": herder_version,
        "records": args.records,
        "line_bytes": args.line_bytes,
        "rounds": args.rounds,
        "warmup_rounds": args.warmup,
        "machine": _procs.machine_info(),
    }
    try:
        with _procs.Services(work) as services:
            _, port = start_ensemble(services, work)
            figures.update(asyncio.run(measure(args, work, f"127.0.0.1:{port}")))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return figures


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_input_options(parser)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args(argv)
    _procs.check_counts(parser, args, positive=("records", "rounds"), non_negative=("warmup",))
    check_line_bytes(parser, args)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    return _procs.run_and_emit(lambda: run(args), pretty=args.pretty)


if __name__ == "__main__":
    sys.exit(main())
