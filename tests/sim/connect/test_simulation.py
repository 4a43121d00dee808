"""The connect simulator in the default suite: ``HERDER_SIM_SEEDS`` seeds (200 by default).

``make sim SEEDS=N`` runs more. Each seed is one test, so a failure names its seed and
says how to replay it.
"""

from __future__ import annotations

import os
from collections import Counter

import pytest

from tests.sim.connect.cluster import Simulation

pytestmark = pytest.mark.sim

SEEDS = int(os.environ.get("HERDER_SIM_SEEDS", "200"))


@pytest.mark.parametrize("seed", range(SEEDS))
def test_seed(seed: int) -> None:
    report = Simulation(seed).run()
    assert report.generations > 0


def test_a_seed_replays_exactly() -> None:
    first, second = Simulation(11), Simulation(11)
    assert first.run() == second.run()
    assert first.trace == second.trace
    assert first.checker.history == second.checker.history


def test_the_simulator_reaches_every_corner_it_is_meant_to() -> None:
    """A simulator that never pauses a worker or fails a coordinator over proves little."""
    totals: Counter[str] = Counter()
    for seed in range(30):
        report = Simulation(seed).run()
        for key in (
            "crashes",
            "pauses",
            "failovers",
            "lost",
            "fenced_writes",
            "operations",
            "config_writes",
            "generations",
            "cooperative_generations",
            "revocations",
        ):
            totals[key] += getattr(report, key)
        totals[f"mode {report.mode}"] += 1
    for key in ("crashes", "pauses", "failovers", "lost", "fenced_writes", "revocations"):
        assert totals[key] > 0, key
    for mode in ("eager", "sessioned", "mixed"):
        assert totals[f"mode {mode}"] > 0, mode
    assert totals["cooperative_generations"] > 50
    assert totals["operations"] > 100
    assert totals["generations"] > 100
