"""The distributed herder's decisions, as pure functions and structures on an injected clock.

Kept apart from the IO of :mod:`herder.runtime.shell.herder` so the rules can be read in one
place and tested without a worker: what to do after a rebalance, in which order queued
requests run, and how task reconfiguration backs off.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field
from enum import Enum
from typing import Generic, TypeVar

from herder.runtime.core.protocol import Assignment

T = TypeVar("T")

RECONFIGURE_BACKOFF_MS = 250
RECONFIGURE_BACKOFF_MAX_MS = 60_000


class AfterRebalance(Enum):
    """What a worker does with the assignment a rebalance gave it (seeds 001/002)."""

    #: the leader could not catch up (CONFIG_MISMATCH): read to the end, then rejoin
    CATCH_UP_AND_REJOIN = "catch-up-and-rejoin"
    #: the assignment was made from configs this worker has not read yet: read first
    CATCH_UP_THEN_START = "catch-up-then-start"
    #: this worker has read configs the assignment did not account for: rejoin
    REJOIN = "rejoin"
    #: start the assigned connectors and tasks
    START = "start"


def after_rebalance(assignment: Assignment, local_config_offset: int) -> AfterRebalance:
    if assignment.failed:
        return AfterRebalance.CATCH_UP_AND_REJOIN
    if assignment.config_offset > local_config_offset:
        return AfterRebalance.CATCH_UP_THEN_START
    if local_config_offset > assignment.config_offset:
        return AfterRebalance.REJOIN
    return AfterRebalance.START


@dataclass(order=True)
class _Entry(Generic[T]):
    due_ms: int
    seq: int
    item: T = field(compare=False)


class RequestQueue(Generic[T]):
    """Requests ordered by due time, then arrival (Connect's herder request queue)."""

    def __init__(self) -> None:
        self._heap: list[_Entry[T]] = []
        self._seq = itertools.count()

    def push(self, item: T, now_ms: int, delay_ms: int = 0) -> None:
        heapq.heappush(self._heap, _Entry(now_ms + delay_ms, next(self._seq), item))

    def pop_due(self, now_ms: int) -> T | None:
        """The next request due by ``now_ms``, or None."""
        if self._heap and self._heap[0].due_ms <= now_ms:
            return heapq.heappop(self._heap).item
        return None

    def next_due_ms(self) -> int | None:
        return self._heap[0].due_ms if self._heap else None

    def drain(self) -> list[T]:
        """Every queued request, in order (for failing them all on shutdown)."""
        items = [heapq.heappop(self._heap).item for _ in range(len(self._heap))]
        return items

    def __len__(self) -> int:
        return len(self._heap)


class ReconfigurationSchedule:
    """When each connector's task configs are next (re)generated, with doubling backoff.

    A generation in progress (:meth:`begin` until :meth:`succeeded` or :meth:`failed`)
    is not due again meanwhile; a request that arrives during it (the connector asked
    again, its config changed) makes it due again at once when it succeeds.
    """

    def __init__(
        self, initial_ms: int = RECONFIGURE_BACKOFF_MS, maximum_ms: int = RECONFIGURE_BACKOFF_MAX_MS
    ) -> None:
        self.initial_ms = initial_ms
        self.maximum_ms = maximum_ms
        self._due: dict[str, tuple[int, int]] = {}
        self._running: set[str] = set()
        self._again: set[str] = set()

    def request(self, name: str, now_ms: int) -> None:
        """Regenerate ``name``'s task configs now (unless a retry is already scheduled)."""
        if name in self._running:
            self._again.add(name)
        self._due.setdefault(name, (now_ms, self.initial_ms))

    def due(self, now_ms: int) -> list[str]:
        return sorted(
            name
            for name, (at, _) in self._due.items()
            if at <= now_ms and name not in self._running
        )

    def begin(self, name: str) -> None:
        """A generation of ``name``'s task configs is under way."""
        self._running.add(name)

    def succeeded(self, name: str) -> None:
        self._running.discard(name)
        if name in self._again:
            self._again.discard(name)
            at, _ = self._due.get(name, (0, self.initial_ms))
            self._due[name] = (at, self.initial_ms)
            return
        self._due.pop(name, None)

    def failed(self, name: str, now_ms: int) -> int:
        """Schedule a retry; return the delay chosen (250 ms, doubling, capped at 60 s)."""
        self._running.discard(name)
        self._again.discard(name)
        _, backoff = self._due.get(name, (now_ms, self.initial_ms))
        self._due[name] = (now_ms + backoff, min(backoff * 2, self.maximum_ms))
        return backoff

    def next_due_ms(self) -> int | None:
        return min(
            (at for name, (at, _) in self._due.items() if name not in self._running), default=None
        )
