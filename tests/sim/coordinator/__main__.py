"""Run or replay coordinator simulator seeds: ``python -m tests.sim.coordinator --seed 42``."""

from __future__ import annotations

import argparse
import logging
import sys
import time

from tests.sim.coordinator.bugs import BUGS, planted
from tests.sim.coordinator.checker import INVARIANTS
from tests.sim.coordinator.world import PROFILES, SimulationFailure, World


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
    failed = 0
    started = time.perf_counter()
    for seed in range(args.seed, args.seed + args.seeds):
        world = World(
            seed,
            steps=args.steps,
            profile=args.profile,
            invariants=args.only or INVARIANTS,
            trace=args.trace,
        )
        try:
            with planted(args.bug):
                report = world.run()
        except SimulationFailure as failure:
            failed += 1
            print(failure, file=sys.stderr)
            continue
        finally:
            if args.trace:
                print("\n".join(world.trace_lines))
        if args.seeds == 1 or args.trace:
            print(report)
    elapsed = time.perf_counter() - started
    print(f"{args.seeds - failed}/{args.seeds} seeds passed in {elapsed:.1f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
