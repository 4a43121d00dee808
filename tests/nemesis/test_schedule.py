"""The nemesis's plan is a function of its seed, and every fault in it is well formed."""

from __future__ import annotations

import itertools

import pytest

from tests.nemesis.schedule import KINDS, SERVERS, WORKERS, plan

pytestmark = [pytest.mark.unit, pytest.mark.timeout(10)]


def test_the_same_seed_gives_the_same_faults() -> None:
    assert plan(7, 1200) == plan(7, 1200)
    assert plan(7, 1200) != plan(8, 1200)


def test_faults_come_one_at_a_time_and_end_before_the_run() -> None:
    faults = plan(3, 600)
    assert faults
    for before, after in itertools.pairwise(faults):
        assert after.at >= before.heal_at
    assert faults[-1].heal_at <= 600


def test_kinds_come_in_rounds_and_aim_at_real_targets() -> None:
    faults = plan(30, 1200)
    rounds = len(faults) // len(KINDS)
    assert rounds >= 2
    for r in range(rounds):
        assert {f.kind for f in faults[r * len(KINDS) : (r + 1) * len(KINDS)]} == set(KINDS)
    for fault in faults:
        assert set(fault.servers) <= set(SERVERS)
        assert set(fault.workers) <= set(WORKERS)
        if fault.kind in ("kill-worker", "pause-worker", "cut-workers", "split-servers"):
            assert fault.workers
        if fault.kind == "disk-full":
            assert fault.servers == (3,)
        if fault.kind == "lossy-link":
            assert 0 < fault.percent < 100


def test_only_the_kinds_asked_for() -> None:
    faults = plan(5, 600, kinds=("pause-server", "one-way"))
    assert {f.kind for f in faults} <= {"pause-server", "one-way"}
    with pytest.raises(ValueError, match="unknown fault kinds"):
        plan(5, 600, kinds=("meteor",))
