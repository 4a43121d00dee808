"""Both sides of a benchmark take turns, which goes first alternating."""

from __future__ import annotations

from bench import _procs


def test_the_side_that_goes_first_alternates_and_herders_result_is_returned() -> None:
    order: list[str] = []
    results = [
        _procs.in_turn(i, lambda: order.append("plain"), lambda i=i: order.append("herder") or i)
        for i in range(4)
    ]
    assert order == ["plain", "herder", "herder", "plain"] * 2
    assert results == [0, 1, 2, 3]
