"""Run or replay connect simulation seeds: ``python -m tests.sim.connect --seed 42 --trace``."""

from __future__ import annotations

import argparse
import logging
import sys

from tests.sim.connect.cluster import Bugs, Simulation
from tests.sim.failures import run_seeds


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

    def run(seed: int) -> object:
        sim = Simulation(seed, steps=args.steps, bugs=bugs)
        report = sim.run()
        if args.trace:
            print("\n".join(sim.trace))
        return report

    return run_seeds(args.seed, args.seeds, run, show=args.trace)


if __name__ == "__main__":
    sys.exit(main())
