"""The simulator in the default suite: ``HERDER_SIM_SEEDS`` seeds (200 by default).

``make sim SEEDS=N`` runs more. Each seed is one test, so a failure names its seed; the
failure message says how to replay it.
"""

from __future__ import annotations

import os
from collections import Counter

import pytest

from tests.sim.cluster import Simulation

pytestmark = pytest.mark.sim

SEEDS = int(os.environ.get("HERDER_SIM_SEEDS", "200"))
STEPS = 2000


@pytest.mark.parametrize("seed", range(SEEDS))
def test_seed(seed: int) -> None:
    report = Simulation(seed, steps=STEPS).run()
    assert report.steps >= STEPS


def test_a_seed_replays_exactly() -> None:
    first, second = Simulation(7), Simulation(7)
    a, b = first.run(), second.run()
    assert a == b
    assert first.checker.history == second.checker.history
    assert list(first.trace) == list(second.trace)


def test_the_simulator_reaches_every_corner_it_is_meant_to() -> None:
    """A simulator that never crashes a leader or sends a SNAP would prove nothing."""
    totals: Counter[str] = Counter()
    topologies = set()
    for seed in range(30):
        report = Simulation(seed).run()
        topologies.add(tuple(sorted(report.servers.values(), key=lambda r: r.value)))
        totals.update(report.syncs)
        totals["leaders"] += report.leaders
        totals["crashes"] += report.crashes
        totals["corruptions"] += report.corruptions
        totals["partitions"] += report.partitions
        totals["disconnects"] += report.disconnects
        totals["commits"] += report.commits
    assert len(topologies) == 4  # 3 and 5 participants, with and without an observer
    for key in ("diff", "snap", "trunc", "crashes", "corruptions", "partitions", "disconnects"):
        assert totals[key] > 0, key
    assert totals["leaders"] > 60
    assert totals["commits"] > 1000
