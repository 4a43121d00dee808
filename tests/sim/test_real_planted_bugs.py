"""The real-host simulator catches the bugs it exists to catch.

The first two are planted in code that only this simulator runs: a
:class:`~herder.ensemble.replica.ZabReplica` that tells its peer a log append is durable
before the group commit's fsync has covered it, and a transaction log that starts a new
file without syncing its directory (the file, and the acknowledged records in it, can
vanish in a crash). The core simulator (``tests/sim``) drives bare Zab peers over a toy
disk, so both pass there unseen. The others are the core's planted bugs, caught again
through the real write path (a client's ``submit``, the real log, the real network).
"""

from __future__ import annotations

import pytest

from herder.ensemble.zab import Faults
from tests.sim.checker import SafetyViolation
from tests.sim.cluster import Simulation
from tests.sim.failures import SimulationFailure
from tests.sim.real.cluster import RealSimulation

pytestmark = pytest.mark.sim


def first_violation(faults: Faults, seeds: int) -> SimulationFailure | None:
    for seed in range(seeds):
        try:
            RealSimulation(seed, faults=faults).run()
        except SimulationFailure as failure:
            if isinstance(failure.cause, SafetyViolation):
                return failure
    return None


def test_acking_appends_before_their_fsync_is_caught_only_by_the_real_host() -> None:
    faults = Faults(host_acks_before_fsync=True)
    for seed in range(3):
        # the core simulator never runs the host's disk loop: nothing to see there
        Simulation(seed, faults=faults).run()
    found = first_violation(faults, seeds=3)
    assert found is not None
    assert "not committed" in str(found.cause)


def test_a_log_file_whose_name_was_never_synced_is_caught_only_by_the_real_host() -> None:
    faults = Faults(storage_skips_log_dir_fsync=True)
    for seed in range(3):
        Simulation(seed, faults=faults).run()
    found = first_violation(faults, seeds=5)
    assert found is not None
    assert "durable before it crashed" in str(found.cause)


def test_committing_on_one_ack_is_caught_through_the_real_host() -> None:
    found = first_violation(Faults(commit_on_one_ack=True), seeds=3)
    assert found is not None
    assert "not committed" in str(found.cause)


def test_committing_a_client_write_twice_is_caught_through_the_real_host() -> None:
    found = first_violation(Faults(propose_requests_twice=True), seeds=3)
    assert found is not None
    assert "committed twice" in str(found.cause)
