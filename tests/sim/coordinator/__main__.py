"""Run or replay coordinator simulator seeds: ``python -m tests.sim.coordinator --seed 42``."""

from __future__ import annotations

import argparse
import logging
import sys

from tests.sim.coordinator.bugs import BUGS, planted
from tests.sim.coordinator.checker import INVARIANTS
from tests.sim.coordinator.world import PROFILES, World
from tests.sim.failures import run_seeds


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.sim.coordinator", description=__doc__)
    parser.add_argument("--seed", type=int, default=0, help="the first seed")
    parser.add_argument("--seeds", type=int, default=1, help="how many seeds from --seed")
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--profile", choices=sorted(PROFILES), help="default: drawn by the seed")
    parser.add_argument(
        "--bug", choices=sorted(BUGS), help="plant one of the simulator's bugs in the core"
    )
    parser.add_argument(
        "--only",
        choices=sorted(INVARIANTS),
        action="append",
        help="check only this invariant (repeatable; default: all of them)",
    )
    parser.add_argument(
        "--trace", action="store_true", help="print every message and the core's log"
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO if args.trace else logging.ERROR, format="%(message)s")

    def run(seed: int) -> object:
        world = World(
            seed,
            steps=args.steps,
            profile=args.profile,
            invariants=args.only or INVARIANTS,
            trace=args.trace,
        )
        try:
            with planted(args.bug):
                return world.run()
        finally:
            if args.trace:
                print("\n".join(world.trace_lines))

    return run_seeds(args.seed, args.seeds, run, show=args.trace)


if __name__ == "__main__":
    sys.exit(main())
