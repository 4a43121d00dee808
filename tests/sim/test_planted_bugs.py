"""The simulator catches the bugs it exists to catch.

Each test turns on one of the core's deliberate bugs (``Faults``) and expects a safety
violation within a few seeds; the assertion lists what every seed tried found.
"""

from __future__ import annotations

import pytest

from herder.ensemble.zab import Faults
from tests.sim.checker import SafetyViolation
from tests.sim.cluster import Simulation, SimulationFailure

pytestmark = pytest.mark.sim


def first_violation(faults: Faults, profile: str, seeds: int) -> SimulationFailure | None:
    for seed in range(seeds):
        try:
            Simulation(seed, faults=faults, profile=profile).run()
        except SimulationFailure as failure:
            if isinstance(failure.cause, SafetyViolation):
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
