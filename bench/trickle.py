"""Where the trickle path pays: a batch of SourceRecords staged and delivered by Spark,
and by the worker with pyarrow, at several sizes, in one warm process.

    python bench/trickle.py [--sizes 1,100,1000,10000,50000,100000] [--line-bytes B]
                            [--rounds R] [--warmup W] [--driver-memory 2g] [--tmp-dir D]
                            [--pretty]

For each size N, each round stages N lines (SourceRecords of ``--line-bytes`` bytes, as a
FileStreamSource polls them) with :class:`SegmentWriter`, commits them, reads them back
and has a DirectorySink (text) write them, fsynced, as a sink task does: once with the
trickle path off (Spark stages and reads: ``spark``), once with it on and its limits
above N (pyarrow: ``trickle``), alternating which goes first. ``--warmup`` rounds
(default 2) are not counted; reported are the medians over ``--rounds`` (default 5) of
``stage_s`` (stage and commit) and ``deliver_s`` (read and put), per size and path, and
``speedup``: Spark's total over the trickle path's. The trickle path's record limit
(``dataplane.trickle.max.records``) is chosen where the speedup stays well above 1.
Every output is checked against the lines staged.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the ``bench`` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _procs
from bench.pipeline import start_ensemble
from bench.steps import PutContext
from herder import __version__ as herder_version


async def measure(args: argparse.Namespace, work: Path, bootstrap: str) -> dict[str, Any]:
    from herder.connect import SourceRecord, TopicPartition
    from herder.connectors.directory import DirectorySinkTask
    from herder.dataplane import SegmentWriter, SparkRuntime, Storage, Topics
    from herder.dataplane.spark import SparkSettings
    from herder.dataplane.trickle import OFF, TrickleLimits, read_slices
    from herder.ensemble.client import EnsembleClient

    spark = SparkRuntime(SparkSettings.from_properties({"spark.driver.memory": args.driver_memory}))
    spark.start()
    storage = Storage(str(work / "topics"))
    filler = b"x" * max(1, args.line_bytes - 12)
    on = TrickleLimits(max_records=1 << 40, max_bytes=1 << 40)
    results: dict[str, Any] = {}
    async with EnsembleClient(bootstrap, session_timeout_ms=60_000) as client:
        topics = Topics(client, storage, spark=spark)
        for size in args.sizes:
            topic = f"n{size}"
            await topics.create(topic, 1)
            tp = TopicPartition(topic, 0)
            lines = [b"%010d " % i + filler for i in range(size)]
            records = [SourceRecord({}, {}, topic, line) for line in lines]
            expected = b"".join(line + b"\n" for line in lines)
            writers = {
                "spark": SegmentWriter(topics, spark, f"{topic}-spark", 1, trickle=OFF),
                "trickle": SegmentWriter(topics, spark, f"{topic}-trickle", 1, trickle=on),
            }
            rounds: dict[str, list[dict[str, float]]] = {name: [] for name in writers}
            for n in range(args.warmup + args.rounds):
                order = list(writers) if n % 2 == 0 else list(reversed(writers))
                for name in order:
                    out = work / f"{topic}-{name}-{n}"
                    began = time.monotonic()
                    segment = (await topics.commit(await writers[name].stage(records))).segments[tp]
                    staged = time.monotonic()
                    wanted = {0: (segment.base_offset, segment.end_offset)}
                    task = DirectorySinkTask()
                    if name == "trickle":
                        slices = await topics.plan_read(topic, wanted)
                        table = await asyncio.to_thread(
                            read_slices, storage, topic, slices, on.max_bytes
                        )
                        task.initialize(PutContext(None))
                        task.start({"directory": str(out), "format": "text", "topics": topic})
                        task.bases = {tp: segment.base_offset}
                        await asyncio.to_thread(task.put_arrow, table)
                    else:
                        df, ranges = await topics.read_ranged(topic, wanted, ordered=True)
                        task.initialize(PutContext(ranges))
                        task.start({"directory": str(out), "format": "text", "topics": topic})
                        task.bases = {tp: segment.base_offset}
                        await asyncio.to_thread(task.put, df)
                    done = time.monotonic()
                    task.stop()
                    got = b"".join(p.read_bytes() for p in sorted(out.iterdir()) if p.is_file())
                    if got != expected:
                        raise RuntimeError(f"{name}: the sink's output of {size} lines differs")
                    shutil.rmtree(out, ignore_errors=True)
                    if n >= args.warmup:
                        rounds[name].append({"stage_s": staged - began, "deliver_s": done - staged})
            medians = {
                name: {
                    key: round(statistics.median(r[key] for r in runs), 4)
                    for key in ("stage_s", "deliver_s")
                }
                for name, runs in rounds.items()
            }
            totals = {name: m["stage_s"] + m["deliver_s"] for name, m in medians.items()}
            results[str(size)] = {
                **medians,
                "speedup": _procs.ratio(totals["spark"], totals["trickle"]),
            }
            _procs.progress(f"{size:,} records: {results[str(size)]}")
            await topics.delete(topic)
    spark.stop()
    return results


def run(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="herder-bench-trickle-", dir=args.tmp_dir))
    figures: dict[str, Any] = {
        "benchmark": "trickle",
        "herder_version": herder_version,
        "line_bytes": args.line_bytes,
        "rounds": args.rounds,
        "warmup_rounds": args.warmup,
        "machine": _procs.machine_info(),
    }
    try:
        with _procs.Services(work) as services:
            _, port = start_ensemble(services, work)
            figures["sizes"] = asyncio.run(measure(args, work, f"127.0.0.1:{port}"))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return figures


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--sizes",
        type=lambda text: [int(s) for s in text.split(",")],
        default=[1, 100, 1_000, 10_000, 50_000, 100_000],
    )
    parser.add_argument("--line-bytes", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--driver-memory", default="2g")
    parser.add_argument("--tmp-dir", default=None)
    parser.add_argument("--pretty", action="store_true")
    args = parser.parse_args(argv)
    _procs.check_counts(parser, args, positive=("rounds", "line_bytes"), non_negative=("warmup",))
    if any(size < 1 for size in args.sizes):
        parser.error("--sizes must all be positive")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    return _procs.run_and_emit(lambda: run(args), pretty=args.pretty)


if __name__ == "__main__":
    sys.exit(main())
