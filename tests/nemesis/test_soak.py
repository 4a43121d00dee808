"""The nemesis soak: nothing acknowledged is lost or duplicated, both pipelines deliver
their input exactly once, and everything is RUNNING again once the faults stop.

The short run (a minute and a quarter of faults, the kinds that strike hardest) is in
the default suite; ``make soak`` runs twenty minutes of every kind. The seed comes from
``HERDER_NEMESIS_SEED`` (the same seed gives the same faults) and the long run's length
from ``HERDER_SOAK_SECONDS``; the figures are printed as one JSON line.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from tests.nemesis.hosts import unavailable_reason
from tests.nemesis.report import figures
from tests.nemesis.schedule import Fault, plan
from tests.nemesis.soak import soak

pytestmark = [pytest.mark.integration, pytest.mark.spark]

REASON = unavailable_reason()
if REASON is not None:
    pytestmark.append(pytest.mark.skip(reason=f"the nemesis needs its own hosts: {REASON}"))

SHORT_KINDS = (
    "isolate-leader",
    "kill-server",
    "kill-worker",
    "pause-server",
    "split-servers",
    "cut-workers",
    "disk-full",
)


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def run_and_check(
    tmp_path: Path,
    seed: int,
    seconds: float,
    faults: list[Fault],
    *,
    warm: bool,
    recovery_bound: float,
) -> None:
    assert faults, "the plan has no fault in it"
    outcome = soak(tmp_path, seed, seconds, faults, log, warm=warm, recovery_bound=recovery_bound)
    print(json.dumps(figures(outcome, seed)))
    assert len(outcome.injected) == len(faults)
    assert outcome.appends.acknowledged > 0
    assert not outcome.problems, "\n".join(outcome.problems)


@pytest.mark.timeout(900)
def test_a_short_nemesis_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    seed = int(os.environ.get("HERDER_NEMESIS_SEED", "30"))
    seconds = 75.0
    faults = plan(seed, seconds, kinds=SHORT_KINDS, gap=(3.0, 6.0), duration=(4.0, 8.0))
    run_and_check(tmp_path, seed, seconds, faults, warm=False, recovery_bound=300.0)


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_twenty_minutes_of_nemesis_lose_and_duplicate_nothing(tmp_path: Path) -> None:
    seed = int(os.environ.get("HERDER_NEMESIS_SEED", "30"))
    seconds = float(os.environ.get("HERDER_SOAK_SECONDS", "1200"))
    faults = plan(seed, seconds)
    run_and_check(tmp_path, seed, seconds, faults, warm=True, recovery_bound=600.0)
