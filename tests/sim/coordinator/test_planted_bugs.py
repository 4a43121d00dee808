"""The coordinator simulator catches the bugs it exists to catch.

Each test plants one bug in the core (``bugs.BUGS``) and checks only the invariant
meant to catch it, so the test shows that this check, on its own, finds the bug
within a few seeds.
"""

from __future__ import annotations

import pytest

from tests.sim.coordinator.bugs import planted
from tests.sim.coordinator.checker import SafetyViolation
from tests.sim.coordinator.world import SimulationFailure, World

pytestmark = pytest.mark.sim


def first_violation(bug: str, invariant: str, seeds: int) -> SimulationFailure | None:
    with planted(bug):
        for seed in range(seeds):
            try:
                World(seed, invariants={invariant}).run()
            except SimulationFailure as failure:
                if isinstance(failure.cause, SafetyViolation):
                    return failure
    return None


@pytest.mark.parametrize(
    ("bug", "invariant", "message"),
    [
        ("commit_any_generation", "stale_commits", "accepted while the group is at generation"),
        ("no_fencing", "fencing", "was taken over by a later process"),
        ("takeover_keeps_old_leader", "agreement", "but it is not a member"),
        ("takeover_loses_assignment", "agreement", "in the same generation"),
        ("no_capacity_rebalance_on_load", "capacity", "over group.max.size"),
    ],
)
def test_a_planted_bug_is_caught_by_its_invariant(bug: str, invariant: str, message: str) -> None:
    found = first_violation(bug, invariant, seeds=10)
    assert found is not None, f"{bug} went unnoticed by the {invariant} check"
    assert message in str(found.cause)


def test_the_core_is_unpatched_after_a_planted_bug() -> None:
    from herder.coordinator.group import Group

    before = Group.replace_static_member
    with planted("takeover_loses_assignment"):
        assert Group.replace_static_member is not before
    assert Group.replace_static_member is before
