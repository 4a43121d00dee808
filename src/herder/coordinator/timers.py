"""Delayed operations on an injected clock: one heap for every timer of the coordinator.

Kafka keeps its delayed joins and heartbeats in purgatories backed by a timing wheel
and a reaper thread. A pure core has no thread, so every delayed operation here is a
:class:`Timer` in one :class:`TimerQueue`, and the owner fires the due ones whenever
it is told the time. Ten thousand members with a session timeout each cost ten
thousand heap entries, not ten thousand tasks.

Cancellation is lazy: a cancelled timer stays in the heap, marked, and is dropped when
it reaches the top. A heartbeat cancels and re-arms its member's timer every few
seconds, so the heap is compacted whenever cancelled entries outnumber live ones;
that keeps its size within a small factor of the number of live timers.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable

#: below this many entries the heap is never compacted: rebuilding costs more than it saves
_COMPACT_THRESHOLD = 1024


class Timer:
    """A pending call of ``action`` at ``deadline_ms``; cancel it to drop the call."""

    __slots__ = ("_queue", "action", "cancelled", "deadline_ms", "fired")

    def __init__(self, queue: TimerQueue, deadline_ms: int, action: Callable[[], None]) -> None:
        self._queue = queue
        self.deadline_ms = deadline_ms
        self.action = action
        self.cancelled = False
        self.fired = False

    @property
    def pending(self) -> bool:
        """Whether the timer will still fire (neither fired nor cancelled)."""
        return not (self.cancelled or self.fired)

    def cancel(self) -> None:
        """Drop the call; cancelling a fired or cancelled timer does nothing."""
        if self.pending:
            self.cancelled = True
            self._queue._on_cancel()

    def __repr__(self) -> str:
        state = "cancelled" if self.cancelled else "fired" if self.fired else "pending"
        return f"Timer(deadline_ms={self.deadline_ms}, {state})"


class TimerQueue:
    """Timers ordered by deadline, ties broken by scheduling order (so runs replay exactly)."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, Timer]] = []
        self._sequence = itertools.count()
        self._cancelled = 0

    def __len__(self) -> int:
        """The number of timers that will still fire."""
        return len(self._heap) - self._cancelled

    @property
    def heap_size(self) -> int:
        """Entries held, cancelled ones included (for tests of the compaction)."""
        return len(self._heap)

    def schedule(self, deadline_ms: int, action: Callable[[], None]) -> Timer:
        """Arrange for ``action()`` to run once the clock reaches ``deadline_ms``."""
        timer = Timer(self, deadline_ms, action)
        heapq.heappush(self._heap, (deadline_ms, next(self._sequence), timer))
        return timer

    def next_deadline(self) -> int | None:
        """When the earliest live timer is due, or None when nothing is pending.

        An asyncio shell sleeps until this moment (or the next request) before it calls
        the owner's ``tick``.
        """
        self._drop_cancelled_top()
        return self._heap[0][0] if self._heap else None

    def run_due(self, now_ms: int) -> int:
        """Fire every timer due at ``now_ms``, earliest first; return how many fired.

        Timers that an action schedules at or before ``now_ms`` fire in the same call,
        so the outcome does not depend on how often the owner is ticked.
        """
        fired = 0
        while True:
            self._drop_cancelled_top()
            if not self._heap or self._heap[0][0] > now_ms:
                return fired
            _, _, timer = heapq.heappop(self._heap)
            timer.fired = True
            fired += 1
            timer.action()

    def clear(self) -> None:
        """Cancel every timer (the coordinator lost its groups)."""
        for _, _, timer in self._heap:
            if timer.pending:
                timer.cancelled = True
        self._heap.clear()
        self._cancelled = 0

    def _drop_cancelled_top(self) -> None:
        while self._heap and self._heap[0][2].cancelled:
            heapq.heappop(self._heap)
            self._cancelled -= 1

    def _on_cancel(self) -> None:
        self._cancelled += 1
        if len(self._heap) > _COMPACT_THRESHOLD and self._cancelled * 2 > len(self._heap):
            self._heap = [entry for entry in self._heap if not entry[2].cancelled]
            heapq.heapify(self._heap)
            self._cancelled = 0
