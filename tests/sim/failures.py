"""How a simulator run fails, for every simulator under ``tests/sim``."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable


class SimulationFailure(AssertionError):
    """A seed failed; the message says how, where, and how to replay it."""

    def __init__(self, message: str, cause: BaseException) -> None:
        super().__init__(message)
        self.cause = cause


class LivenessFailure(AssertionError):
    """Once the faults stopped, the system did not settle within its bound."""


def run_seeds(first: int, count: int, run: Callable[[int], object], *, show: bool) -> int:
    """Each simulator's command line: ``run`` every seed from ``first``, printing each
    failure (to stderr) and, with ``show`` or for a single seed, each report; then the
    tally. The exit status: 1 if any seed failed."""
    failed = 0
    started = time.perf_counter()
    for seed in range(first, first + count):
        try:
            report = run(seed)
        except SimulationFailure as failure:
            failed += 1
            print(failure, file=sys.stderr)
            continue
        if count == 1 or show:
            print(report)
    elapsed = time.perf_counter() - started
    print(f"{count - failed}/{count} seeds passed in {elapsed:.1f} s")
    return 1 if failed else 0
