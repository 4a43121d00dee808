"""Each invariant's check catches the bug it stands against, within a few seeds."""

from __future__ import annotations

import pytest

from tests.sim.connect.cluster import Bugs, Simulation, SimulationFailure

pytestmark = pytest.mark.sim


@pytest.mark.parametrize(
    ("bug", "caught_by", "seeds"),
    [
        ("two_owners", "in generation", 40),
        ("eager_revocation", "revocation had not finished", 40),
        ("no_catch_up", "behind its assignment's config offset", 40),
        ("unfenced_writes", "under leader epoch", 40),
        ("status_ignores_generation", "the newest written is", 40),
        ("metadata_hides_work", "its revocation had not finished", 40),
        ("dropped_member_keeps_work", "at once, all members of the group", 40),
        ("unsigned_requests", "has no task set yet", 40),
        # it takes a mixed group whose eager worker is away when the coordinator fails
        # over and comes back after: rarer than the rest
        ("loaded_members_forget_protocols", "INCONSISTENT_GROUP_PROTOCOL", 200),
    ],
)
def test_a_planted_bug_is_caught(bug: str, caught_by: str, seeds: int) -> None:
    failures = []
    for seed in range(seeds):
        try:
            Simulation(seed, bugs=Bugs(**{bug: True})).run()
        except SimulationFailure as e:
            failures.append(str(e))
            if caught_by in str(e):
                return
    pytest.fail(
        f"{bug} went unnoticed by its invariant in {seeds} seeds; other failures: "
        f"{[f.splitlines()[0] for f in failures[:3]]}"
    )
