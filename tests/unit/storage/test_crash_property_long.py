"""The crash property over many more histories, for ``make sim`` (HERDER_SIM_SEEDS)."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test

from .test_crash_property import CrashingStorage

pytestmark = [pytest.mark.sim, pytest.mark.timeout(3600)]


def test_many_random_histories_with_crashes() -> None:
    seeds = os.environ.get("HERDER_SIM_SEEDS")
    if not seeds:
        pytest.skip("set HERDER_SIM_SEEDS (make sim) for the long run")
    run_state_machine_as_test(
        CrashingStorage,
        settings=settings(
            max_examples=int(seeds),
            stateful_step_count=60,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            database=None,
        ),
    )
