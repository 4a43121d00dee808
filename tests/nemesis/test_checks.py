"""The soak's checks catch what they exist for: a lost, duplicated, reordered or foreign
write, a diverged server, a sink's missing or doubled line; and its figures add up."""

from __future__ import annotations

from typing import Any

import pytest

from tests.nemesis.checks import (
    acks_per_second,
    check_appends,
    check_lines,
    outages,
    percentile,
    recovery_times,
    sink_recovery_times,
    write_availability,
)

pytestmark = [pytest.mark.unit, pytest.mark.timeout(10)]


def attempt(n: int, ok: bool, start: float = 0.0, end: float = 0.0) -> dict[str, Any]:
    return {"n": n, "ok": ok, "start": start, "end": end}


ATTEMPTS = [attempt(0, True), attempt(1, False), attempt(2, True), attempt(3, True)]


def values(*numbers: int) -> list[bytes | None]:
    return [str(n).encode() for n in numbers]


def test_a_clean_history_passes_with_an_indeterminate_write_committed_or_not() -> None:
    verdict = check_appends(ATTEMPTS, {1: values(0, 1, 2, 3), 2: values(0, 1, 2, 3)})
    assert verdict.ok, verdict.problems()
    assert verdict.acknowledged == 3
    assert verdict.indeterminate_committed == 1
    assert check_appends(ATTEMPTS, {1: values(0, 2, 3), 2: values(0, 2, 3)}).ok


def test_a_lost_acknowledged_write_is_caught() -> None:
    verdict = check_appends(ATTEMPTS, {1: values(0, 2), 2: values(0, 2)})
    assert verdict.lost == [3]
    assert not verdict.ok


def test_a_duplicate_even_of_an_unacknowledged_write_is_caught() -> None:
    assert check_appends(ATTEMPTS, {1: values(0, 1, 1, 2, 3)}).duplicated == [1]
    assert check_appends(ATTEMPTS, {1: values(0, 2, 3, 2)}).duplicated == [2]


def test_acknowledged_writes_out_of_order_are_caught() -> None:
    assert check_appends(ATTEMPTS, {1: values(0, 3, 2)}).out_of_order == [2]


def test_a_value_nobody_wrote_and_a_diverged_server_are_caught() -> None:
    verdict = check_appends(ATTEMPTS, {1: values(0, 2, 3), 2: [*values(0, 2, 3), b"9"]})
    assert verdict.unexpected == [b"9"]
    assert verdict.diverged == [2]
    assert "diverged servers 1" in verdict.problems()


def test_sink_lines_exactly_once() -> None:
    assert check_lines(["a", "b", "c"], ["c", "a", "b"]).ok
    verdict = check_lines(["a", "b", "c"], ["a", "a", "c", "z"])
    assert (verdict.missing, verdict.duplicated, verdict.unexpected) == (["b"], ["a"], ["z"])
    assert "1 missing" in verdict.problems()


def test_recovery_is_measured_from_the_heal_to_the_first_write_begun_after_it() -> None:
    attempts = [
        attempt(0, True, 0.0, 0.1),
        attempt(1, False, 5.0, 13.0),  # the fault: failed
        attempt(2, True, 9.5, 10.5),  # begun before the heal at 10: does not count
        attempt(3, True, 10.6, 12.0),
    ]
    assert recovery_times([10.0, 20.0], attempts) == [2.0, None]


def test_availability_counts_seconds_with_an_acknowledged_write() -> None:
    attempts = [attempt(0, True, 0, 0.5), attempt(1, True, 0, 0.7), attempt(2, True, 0, 3.2)]
    assert write_availability(attempts, 0.0, 4.0) == 0.5
    assert acks_per_second(attempts, 0.0, 4.0) == [2, 0, 0, 1]


def test_percentile_is_nearest_rank() -> None:
    assert percentile([], 50) is None
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile([float(i) for i in range(1, 101)], 99) == 99.0


def test_an_outage_is_the_longest_silence_from_the_fault_to_the_recovery() -> None:
    attempts = [
        attempt(0, True, 0.0, 1.0),
        attempt(1, True, 1.0, 2.0),  # the fault strikes at 1.5
        attempt(2, True, 2.0, 6.0),  # 4 s of silence
        attempt(3, True, 6.0, 7.0),
        attempt(4, True, 10.5, 11.0),  # healed at 10: recovered at 11
    ]
    assert outages([(1.5, 10.0)], attempts) == [4.0]
    assert outages([(20.0, 30.0)], attempts) == [None]


def test_sinks_recover_when_every_one_has_grown_past_its_count_at_the_heal() -> None:
    samples = [(0.0, 1, 1), (1.0, 5, 1), (2.0, 6, 1), (3.0, 7, 4)]
    assert sink_recovery_times([1.5, 3.5], samples) == [1.5, None]
