"""Run or replay simulator seeds: ``python -m tests.sim --seed 42 --trace``."""

from __future__ import annotations

import argparse
import logging
import sys

from herder.ensemble.zab import Faults
from herder.ensemble.zab.config import HOST_FAULTS
from tests.sim.cluster import PROFILES, Simulation
from tests.sim.failures import run_seeds


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.sim", description=__doc__)
    parser.add_argument("--seed", type=int, default=0, help="the first seed")
    parser.add_argument("--seeds", type=int, default=1, help="how many seeds from --seed")
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument(
        "--bug",
        choices=[f for f in Faults.__dataclass_fields__ if f not in HOST_FAULTS],
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
    return run_seeds(
        args.seed,
        args.seeds,
        lambda seed: Simulation(seed, steps=args.steps, faults=faults, profile=args.profile).run(),
        show=args.trace,
    )


if __name__ == "__main__":
    sys.exit(main())
