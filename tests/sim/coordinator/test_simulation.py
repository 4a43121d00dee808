"""The coordinator simulator in the default suite: ``HERDER_SIM_SEEDS`` seeds (200 by default).

``make sim SEEDS=N`` runs more. Each seed is one test, so a failure names its seed; the
failure message says how to replay it.
"""

from __future__ import annotations

import os
from collections import Counter

import pytest

from tests.sim.coordinator.world import World

pytestmark = pytest.mark.sim

SEEDS = int(os.environ.get("HERDER_SIM_SEEDS", "200"))
STEPS = 1500


@pytest.mark.parametrize("seed", range(SEEDS))
def test_seed(seed: int) -> None:
    report = World(seed, steps=STEPS).run()
    assert report.steps >= STEPS


def test_a_seed_replays_exactly() -> None:
    first, second = World(11, trace=True), World(11, trace=True)
    assert first.run() == second.run()
    assert first.trace_lines == second.trace_lines
    assert first.checker.assignments == second.checker.assignments


def test_the_simulator_reaches_every_corner_it_is_meant_to() -> None:
    """A simulator that never fails over, fences or refuses a member proves nothing."""
    totals: Counter[str] = Counter()
    profiles = set()
    for seed in range(30):
        report = World(seed).run()
        profiles.add(report.profile)
        totals.update(report.answers)
        totals["static"] += report.static
        totals["dynamic"] += report.dynamic
        totals["failovers"] += report.failovers
        totals["capacity changes"] += report.capacity_changes
        totals["takeovers"] += report.takeovers
        totals["generations"] += report.generations
        totals["commits accepted"] += report.commits_accepted
    assert len(profiles) == 4
    for key in (
        "static",
        "dynamic",
        "failovers",
        "capacity changes",
        "takeovers",
        "join MEMBER_ID_REQUIRED",
        "join GROUP_MAX_SIZE_REACHED",
        "heartbeat FENCED_INSTANCE_ID",
        "commit ILLEGAL_GENERATION",
        "sync REBALANCE_IN_PROGRESS",
        "join NOT_COORDINATOR",
        "join COORDINATOR_LOAD_IN_PROGRESS",
        "leave NONE",
    ):
        assert totals[key] > 0, key
    assert totals["generations"] > 300
    assert totals["commits accepted"] > 1000
