"""Run or replay simulator seeds: ``python -m tests.sim --seed 42 --trace``."""

from __future__ import annotations

import argparse
import logging
import sys
import time

from herder.ensemble.zab import Faults
from tests.sim.cluster import PROFILES, Simulation, SimulationFailure


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.sim", description=__doc__)
    parser.add_argument("--seed", type=int, default=0, help="the first seed")
    parser.add_argument("--seeds", type=int, default=1, help="how many seeds from --seed")
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument(
        "--bug",
        choices=[f for f in Faults.__dataclass_fields__],
        action="append",
        default=[],
        help="plant one of the core's test-only bugs",
    )
    parser.add_argument("--profile", choices=sorted(PROFILES), help="default: drawn by the seed")
    parser.add_argument("--trace", action="store_true", help="log every peer's decisions")
    args = parser.parse_args()
    # the peers log what they decide: everything with --trace, else only errors
    logging.basicConfig(level=logging.INFO if args.trace else logging.ERROR, format="%(message)s")
    faults = Faults(**{name: True for name in args.bug})
    failed = 0
    started = time.perf_counter()
    for seed in range(args.seed, args.seed + args.seeds):
        try:
            report = Simulation(seed, steps=args.steps, faults=faults, profile=args.profile).run()
        except SimulationFailure as e:
            failed += 1
            print(e, file=sys.stderr)
            continue
        if args.seeds == 1 or args.trace:
            print(report)
    elapsed = time.perf_counter() - started
    print(f"{args.seeds - failed}/{args.seeds} seeds passed in {elapsed:.1f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
