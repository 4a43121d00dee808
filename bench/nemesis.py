"""The nemesis soak's figures: faults by kind, writes acknowledged, lost and duplicated,
recovery time per fault kind, the share of time writes succeeded — and a timeline PNG.

```
bench/nemesis.py [--seed N] [--seconds S] [--kinds k1,k2] [--png PATH] [--workdir DIR]
                 [--recovery-bound S] [--pretty]
```

Three ensemble servers, three workers and an append workload, each in a network
namespace of its own (root is needed: ``ip netns``, ``nft``, ``tc``, ``mount``), under
the seeded nemesis of ``tests/nemesis`` (the same seed gives the same faults), which
starts once both pipelines deliver. The exit
status is 1 when a check failed (anything lost or duplicated, a pipeline's output not
its input, a connector or task not RUNNING after the heal, a process that died by
itself); the figures are printed all the same.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.nemesis.hosts import unavailable_reason
from tests.nemesis.report import figures, timeline_png
from tests.nemesis.schedule import KINDS, plan
from tests.nemesis.soak import soak

from bench._procs import progress, run_and_report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=30)
    parser.add_argument("--seconds", type=float, default=1200.0)
    parser.add_argument("--kinds", default=",".join(KINDS), help="fault kinds, comma-separated")
    parser.add_argument("--png", type=Path, default=Path("nemesis-timeline.png"))
    parser.add_argument("--workdir", type=Path, help="keep the run's files here")
    parser.add_argument(
        "--recovery-bound",
        type=float,
        default=600.0,
        help="seconds allowed for the warm-up, for everything to run again after the "
        "nemesis and for the sinks to catch up",
    )
    parser.add_argument("--pretty", action="store_true")
    args = parser.parse_args()
    if args.seconds <= 0 or args.recovery_bound <= 0:
        parser.error("--seconds and --recovery-bound must be positive")
    reason = unavailable_reason()
    if reason is not None:
        parser.error(reason)
    kinds = tuple(k for k in args.kinds.split(",") if k)
    try:
        faults = plan(args.seed, args.seconds, kinds=kinds)
    except ValueError as exc:
        parser.error(str(exc))

    def run() -> tuple[dict[str, Any], int]:
        workdir = args.workdir or Path(tempfile.mkdtemp(prefix="herder-nemesis-"))
        workdir.mkdir(parents=True, exist_ok=True)
        try:
            outcome = soak(
                workdir,
                args.seed,
                args.seconds,
                faults,
                progress,
                warm=True,
                recovery_bound=args.recovery_bound,
            )
        finally:
            if args.workdir is None:
                shutil.rmtree(workdir, ignore_errors=True)
        timeline_png(outcome, args.png)
        progress(f"timeline written to {args.png}")
        result = figures(outcome, args.seed)
        result["timeline_png"] = str(args.png)
        return result, 0 if outcome.ok else 1

    return run_and_report(run, pretty=args.pretty)


if __name__ == "__main__":
    sys.exit(main())
