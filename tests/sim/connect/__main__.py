"""Run or replay connect simulation seeds: ``python -m tests.sim.connect --seed 42 --trace``."""

from __future__ import annotations

import argparse
import logging
import sys
import time

from tests.sim.connect.cluster import Bugs, Simulation, SimulationFailure


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.sim.connect", description=__doc__)
    parser.add_argument("--seed", type=int, default=0, help="the first seed")
    parser.add_argument("--seeds", type=int, default=1, help="how many seeds from --seed")
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument(
        "--bug",
        choices=list(Bugs.__dataclass_fields__),
        action="append",
        default=[],
        help="plant one of the simulator's bugs",
    )
    parser.add_argument("--trace", action="store_true", help="print the run's trace")
    args = parser.parse_args()
    # the cores log what they decide: everything with --trace, else only errors
    logging.basicConfig(level=logging.INFO if args.trace else logging.ERROR, format="%(message)s")
    bugs = Bugs(**{name: True for name in args.bug})
    failed = 0
    started = time.perf_counter()
    for seed in range(args.seed, args.seed + args.seeds):
        sim = Simulation(seed, steps=args.steps, bugs=bugs)
        try:
            report = sim.run()
        except SimulationFailure as e:
            failed += 1
            print(e, file=sys.stderr)
            continue
        if args.trace:
            print("\n".join(sim.trace))
        if args.seeds == 1 or args.trace:
            print(report)
    elapsed = time.perf_counter() - started
    print(f"{args.seeds - failed}/{args.seeds} seeds passed in {elapsed:.1f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
