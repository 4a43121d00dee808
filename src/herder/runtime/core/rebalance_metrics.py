"""A worker's rebalance metrics, as Connect's ``connect-worker-rebalance-metrics`` group.

The herder shell tells :class:`RebalanceMetrics` when a rebalance starts (its member
revokes its work, eager, or sends a JoinGroup, under any protocol) and when it completes
(the work of an assignment starts), with the time; the metrics read no clock of their
own. Connect counts a cooperative rebalance only when it revokes something; here every
round this worker takes part in counts, so ``rebalancing`` is 1 during a follow-up round
too. A rebalance
that starts while one is under way (a member that rejoins before its assignment's work
started) is the same rebalance, so it is counted and timed once.

Unlike Connect's windowed averages, the average and maximum are over every rebalance the
worker completed. A figure with nothing to say yet is ``None`` (``null`` in JSON), where
Connect's JMX gives NaN or infinity.
"""

from __future__ import annotations

from collections import deque
from typing import Any

__all__ = ["RebalanceMetrics"]

#: completed rebalances remembered for :meth:`RebalanceMetrics.timeline`
TIMELINE_LENGTH = 50


class RebalanceMetrics:
    """Counts and times one worker's rebalances."""

    def __init__(self) -> None:
        self.completed_total = 0
        self.rebalancing = False
        #: the generation of the last completed rebalance (Connect's ``epoch``)
        self.epoch: int | None = None
        #: the leader's URL of the last completed rebalance (Connect's ``leader-name``)
        self.leader: str | None = None
        self._started_at_ms: int | None = None
        self._completed_at_ms: int | None = None
        self._total_time_ms = 0
        self._max_time_ms: int | None = None
        #: (started, completed, generation, leader) of the latest completed rebalances
        self._timeline: deque[tuple[int, int, int, str]] = deque(maxlen=TIMELINE_LENGTH)

    def started(self, now_ms: int) -> None:
        """A rebalance began (a no-op while one is already under way)."""
        if self.rebalancing:
            return
        self.rebalancing = True
        self._started_at_ms = now_ms

    def completed(self, now_ms: int, generation: int, leader: str) -> None:
        """The work of ``generation``'s assignment started: its rebalance is over."""
        self.epoch = generation
        self.leader = leader
        if not self.rebalancing or self._started_at_ms is None:
            return  # a generation begun without a rebalance of this worker's
        took = max(0, now_ms - self._started_at_ms)
        self._timeline.append((self._started_at_ms, now_ms, generation, leader))
        self.rebalancing = False
        self._started_at_ms = None
        self._completed_at_ms = now_ms
        self.completed_total += 1
        self._total_time_ms += took
        self._max_time_ms = took if self._max_time_ms is None else max(self._max_time_ms, took)

    def timeline(self, now_ms: int) -> list[dict[str, Any]]:
        """The latest completed rebalances, oldest first: how long ago each began, how long
        it took, and the generation and leader it ended with."""
        return [
            {"ago-ms": now_ms - began, "took-ms": ended - began, "epoch": gen, "leader-name": lead}
            for began, ended, gen, lead in self._timeline
        ]

    def snapshot(self, now_ms: int) -> dict[str, Any]:
        """The metrics under Connect's names, as of ``now_ms``."""
        total = self.completed_total
        since = None if self._completed_at_ms is None else now_ms - self._completed_at_ms
        return {
            "completed-rebalances-total": total,
            "rebalancing": 1 if self.rebalancing else 0,
            "epoch": self.epoch,
            "leader-name": self.leader,
            "rebalance-avg-time-ms": self._total_time_ms / total if total else None,
            "rebalance-max-time-ms": self._max_time_ms,
            "time-since-last-rebalance-ms": since,
        }
