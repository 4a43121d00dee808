"""The simulator catches the bugs it exists to catch.

Each test turns on one of the core's deliberate bugs (``Faults``) and expects a safety
violation within a few seeds; the assertion lists what every seed tried found.
"""

from __future__ import annotations

import pytest

from herder.ensemble.zab import Faults
from tests.sim.checker import SafetyViolation
from tests.sim.cluster import Simulation, SimulationFailure
from tests.sim.failures import LivenessFailure

pytestmark = pytest.mark.sim


def first_violation(
    faults: Faults, profile: str, seeds: int, kind: type[AssertionError] = SafetyViolation
) -> SimulationFailure | None:
    for seed in range(seeds):
        try:
            Simulation(seed, faults=faults, profile=profile).run()
        except SimulationFailure as failure:
            if isinstance(failure.cause, kind):
                return failure
    return None


def test_committing_on_one_ack_is_caught() -> None:
    found = first_violation(Faults(commit_on_one_ack=True), "default", seeds=5)
    assert found is not None
    assert "not committed" in str(found.cause)


def test_acking_newleader_before_the_sync_is_on_disk_is_caught() -> None:
    found = first_violation(Faults(ack_newleader_before_disk=True), "default", seeds=40)
    assert found is not None


def test_not_persisting_the_accepted_epoch_is_caught() -> None:
    # crashes right after ACKEPOCH/LEADERINFO are what make the missing fsync show
    found = first_violation(Faults(skip_accepted_epoch_persist=True), "hunting", seeds=40)
    assert found is not None
    assert "two leaders for epoch" in str(found.cause) or "applied" in str(found.cause)


def test_committing_a_client_write_twice_is_caught() -> None:
    # every prefix and quorum check passes: only the client model sees the duplicate
    found = first_violation(Faults(propose_requests_twice=True), "default", seeds=5)
    assert found is not None
    assert "committed twice" in str(found.cause)


def test_a_follower_that_stops_applying_commits_is_caught_once_faults_stop() -> None:
    # it applies a prefix of the history, so no safety check can fault it; it never
    # converges, which the check after the faults catches
    found = first_violation(
        Faults(follower_ignores_commits=True), "default", seeds=5, kind=LivenessFailure
    )
    assert found is not None
    assert "not converged" in str(found.cause)
