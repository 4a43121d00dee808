"""What the soak checks and measures, as pure functions of what it recorded.

* :func:`check_appends` — the append workload's attempts against the log as each server
  holds it: every acknowledged write present exactly once and in order on every server,
  an unacknowledged one at most once, nothing that was never written, and every server's
  log the same.
* :func:`check_lines` — a sink's output lines against the lines fed to its pipeline.
* the figures: :func:`recovery_times` (how long after a fault healed the first write
  begun after the heal was acknowledged), :func:`outages` (the longest time without an
  acknowledged write from a fault's start until that write), :func:`sink_recovery_times`
  (how long after a heal every sink had grown again) and :func:`write_availability` (the
  share of one-second intervals in which some write was acknowledged).
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class AppendVerdict:
    acknowledged: int
    #: acknowledged writes missing from some server's log
    lost: list[int] = field(default_factory=list)
    #: numbers present more than once on some server
    duplicated: list[int] = field(default_factory=list)
    #: acknowledged numbers found after a higher acknowledged number
    out_of_order: list[int] = field(default_factory=list)
    #: values in a log that no attempt wrote
    unexpected: list[bytes] = field(default_factory=list)
    #: servers whose log differs from the first server's
    diverged: list[int] = field(default_factory=list)
    indeterminate_committed: int = 0

    @property
    def ok(self) -> bool:
        return not (
            self.lost or self.duplicated or self.out_of_order or self.unexpected or self.diverged
        )

    def problems(self) -> str:
        parts = [
            f"{name} {len(values)} (first {values[:5]})"
            for name, values in (
                ("lost", self.lost),
                ("duplicated", self.duplicated),
                ("out of order", self.out_of_order),
                ("never written", self.unexpected),
                ("diverged servers", self.diverged),
            )
            if values
        ]
        return "; ".join(parts) or "none"


def check_appends(
    attempts: Sequence[Mapping[str, Any]], logs: Mapping[int, Sequence[bytes | None]]
) -> AppendVerdict:
    """``attempts``: the workload's lines; ``logs``: server id → the values of its log."""
    acked = [int(a["n"]) for a in attempts if a["ok"]]
    attempted = {int(a["n"]) for a in attempts}
    verdict = AppendVerdict(acknowledged=len(acked))
    first = min(logs) if logs else None
    lost: set[int] = set()
    duplicated: set[int] = set()
    out_of_order: set[int] = set()
    unexpected: set[bytes] = set()
    acked_set = set(acked)
    for server, values in sorted(logs.items()):
        if first is not None and list(values) != list(logs[first]):
            verdict.diverged.append(server)
        numbers: list[int] = []
        for value in values:
            if value is None or not value.isdigit() or int(value) not in attempted:
                unexpected.add(value or b"")
                continue
            numbers.append(int(value))
        counts = Counter(numbers)
        duplicated |= {n for n, c in counts.items() if c > 1}
        lost |= acked_set - counts.keys()
        highest = -1
        for n in numbers:
            if n not in acked_set:
                continue
            if n < highest:
                out_of_order.add(n)
            highest = max(highest, n)
        if server == first:
            verdict.indeterminate_committed = len(counts.keys() - acked_set)
    verdict.lost = sorted(lost)
    verdict.duplicated = sorted(duplicated)
    verdict.out_of_order = sorted(out_of_order)
    verdict.unexpected = sorted(unexpected)
    return verdict


@dataclass
class LinesVerdict:
    expected: int
    delivered: int
    missing: list[str]
    duplicated: list[str]
    unexpected: list[str]

    @property
    def ok(self) -> bool:
        return not (self.missing or self.duplicated or self.unexpected)

    def problems(self) -> str:
        return (
            f"{self.delivered} lines for {self.expected}: {len(self.missing)} missing "
            f"(first {self.missing[:3]}), {len(self.duplicated)} duplicated "
            f"(first {self.duplicated[:3]}), {len(self.unexpected)} never fed "
            f"(first {self.unexpected[:3]})"
        )


def check_lines(fed: Iterable[str], delivered: Iterable[str]) -> LinesVerdict:
    """Each line fed delivered exactly once (in any order), and nothing else."""
    want, got = Counter(fed), Counter(delivered)
    return LinesVerdict(
        expected=sum(want.values()),
        delivered=sum(got.values()),
        missing=sorted(want.keys() - got.keys()),
        duplicated=sorted(k for k, c in got.items() if c > 1),
        unexpected=sorted(got.keys() - want.keys()),
    )


def recovery_times(
    heals: Sequence[float], attempts: Sequence[Mapping[str, Any]]
) -> list[float | None]:
    """For each heal time: seconds until a write begun at or after it was acknowledged
    (None when none was)."""
    acks = sorted((float(a["start"]), float(a["end"])) for a in attempts if a["ok"])
    out: list[float | None] = []
    for heal in heals:
        after = next((end for start, end in acks if start >= heal), None)
        out.append(None if after is None else round(after - heal, 3))
    return out


def outages(
    faults: Sequence[tuple[float, float]], attempts: Sequence[Mapping[str, Any]]
) -> list[float | None]:
    """For each (start, heal): the longest time without an acknowledgement from the
    fault's start until the first write begun after the heal was acknowledged (None when
    none was)."""
    acks = sorted(float(a["end"]) for a in attempts if a["ok"])
    recovered = recovery_times([heal for _, heal in faults], attempts)
    out: list[float | None] = []
    for (start, heal), took in zip(faults, recovered, strict=True):
        if took is None:
            out.append(None)
            continue
        until = heal + took
        edges = [start, *(t for t in acks if start < t < until), until]
        out.append(round(max(b - a for a, b in itertools.pairwise(edges)), 3))
    return out


def sink_recovery_times(
    heals: Sequence[float], samples: Sequence[tuple[float, int, int]]
) -> list[float | None]:
    """For each heal time: seconds until every sink of ``samples`` (time, count, count…)
    held more than it did at the heal (None when that did not happen)."""
    out: list[float | None] = []
    for heal in heals:
        before = [s for s in samples if s[0] <= heal]
        if not before:
            out.append(None)
            continue
        at_heal = before[-1][1:]
        grown = next(
            (
                s[0]
                for s in samples
                if s[0] > heal and all(n > m for n, m in zip(s[1:], at_heal, strict=True))
            ),
            None,
        )
        out.append(None if grown is None else round(grown - heal, 3))
    return out


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (nearest rank) of ``values``; None for none."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def write_availability(attempts: Sequence[Mapping[str, Any]], start: float, end: float) -> float:
    """The share of whole seconds of [start, end) in which some write was acknowledged."""
    seconds = max(1, int(end - start))
    good = {int(float(a["end"]) - start) for a in attempts if a["ok"]}
    return round(len({s for s in good if 0 <= s < seconds}) / seconds, 4)


def acks_per_second(attempts: Sequence[Mapping[str, Any]], start: float, end: float) -> list[int]:
    """How many writes were acknowledged in each second of [start, end)."""
    counts = [0] * max(1, int(end - start))
    for a in attempts:
        second = int(float(a["end"]) - start)
        if a["ok"] and 0 <= second < len(counts):
            counts[second] += 1
    return counts
