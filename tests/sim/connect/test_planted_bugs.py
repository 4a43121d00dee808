"""Each invariant's check catches the bug it stands against, within a few seeds."""

from __future__ import annotations

import pytest

from tests.sim.connect.cluster import Bugs, Simulation, SimulationFailure

pytestmark = pytest.mark.sim


@pytest.mark.parametrize(
    ("bug", "caught_by"),
    [
        ("two_owners", "in generation"),
        ("eager_revocation", "revocation had not finished"),
        ("no_catch_up", "behind its assignment's config offset"),
        ("unfenced_writes", "under leader epoch"),
        ("status_ignores_generation", "the newest written is"),
        ("metadata_hides_work", "its revocation had not finished"),
        ("dropped_member_keeps_work", "at once, all members of the group"),
        ("unsigned_requests", "has no task set yet"),
        ("loaded_members_forget_protocols", "INCONSISTENT_GROUP_PROTOCOL"),
    ],
)
def test_a_planted_bug_is_caught(bug: str, caught_by: str) -> None:
    failures = []
    for seed in range(40):
        try:
            Simulation(seed, bugs=Bugs(**{bug: True})).run()
        except SimulationFailure as e:
            failures.append(str(e))
            if caught_by in str(e):
                return
    pytest.fail(
        f"{bug} went unnoticed by its invariant in 40 seeds; other failures: "
        f"{[f.splitlines()[0] for f in failures[:3]]}"
    )
