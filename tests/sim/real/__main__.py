"""Run or replay seeds of the real-host simulator: ``python -m tests.sim.real --seed 42``."""

from __future__ import annotations

import argparse
import logging
import sys
from collections import Counter

from herder.ensemble.zab import Faults
from tests.sim.failures import run_seeds
from tests.sim.real.cluster import PROFILES, RealReport, RealSimulation


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.sim.real", description=__doc__)
    parser.add_argument("--seed", type=int, default=0, help="the first seed")
    parser.add_argument("--seeds", type=int, default=1, help="how many seeds from --seed")
    parser.add_argument("--steps", type=int, default=4000)
    parser.add_argument(
        "--bug",
        choices=list(Faults.__dataclass_fields__),
        action="append",
        default=[],
        help="plant one of the test-only bugs",
    )
    parser.add_argument("--profile", choices=sorted(PROFILES), help="default: drawn by the seed")
    parser.add_argument("--trace", action="store_true", help="log what the servers decide")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO if args.trace else logging.CRITICAL + 1)
    faults = Faults(**{name: True for name in args.bug})
    reports: list[RealReport] = []

    def run(seed: int) -> RealReport:
        report = RealSimulation(seed, steps=args.steps, faults=faults, profile=args.profile).run()
        reports.append(report)
        return report

    status = run_seeds(args.seed, args.seeds, run, show=args.trace)
    print(tally(reports))
    return status


def tally(reports: list[RealReport]) -> str:
    """What the passing seeds covered: writes acknowledged, faults injected, syncs."""
    totals: Counter[str] = Counter()
    for report in reports:
        totals["acknowledged writes"] += report.acknowledged_writes
        totals["crashes"] += report.crashes
        totals["partitions"] += report.partitions
        totals["connection resets"] += report.resets
        totals["snapshots"] += report.snapshots
        totals.update({f"{kind} syncs": n for kind, n in report.syncs.items()})
        totals["simulated ms"] += report.sim_ms
    return ", ".join(f"{name}: {n}" for name, n in sorted(totals.items()))


if __name__ == "__main__":
    sys.exit(main())
