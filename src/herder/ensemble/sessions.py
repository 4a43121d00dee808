"""The leader's view of session liveness, and how it names new sessions.

Whether a session is alive is decided in one place only — the leader's
:class:`SessionTracker` — and announced to everyone as an ``ExpireSessions``
transaction, so replicas never judge liveness by their own clocks. Both classes here
are pure: the caller passes the time in.
"""

from __future__ import annotations

import heapq


class SessionTracker:
    """Deadlines of the open sessions, in buckets of ``tick_ms`` as ZooKeeper's ExpiryQueue.

    A deadline is rounded up to the next tick boundary, so sessions expire together once
    per tick, and a touch that lands in the same tick as the session's current deadline
    (the common case for a chatty client) changes nothing. A session therefore lives at
    least its timeout and at most one tick longer after its last touch.
    """

    def __init__(self, tick_ms: int = 2000) -> None:
        if tick_ms <= 0:
            raise ValueError(f"tick_ms must be positive, got {tick_ms}")
        self._tick = tick_ms
        self._timeouts: dict[int, int] = {}
        self._deadlines: dict[int, int] = {}
        # deadline -> sessions due then; a bucket may be empty until its time is reached
        self._buckets: dict[int, set[int]] = {}
        self._times: list[int] = []  # heap of the bucket deadlines

    def _deadline_after(self, now_ms: int, timeout_ms: int) -> int:
        return ((now_ms + timeout_ms) // self._tick + 1) * self._tick

    def _place(self, session_id: int, deadline: int) -> None:
        bucket = self._buckets.get(deadline)
        if bucket is None:
            bucket = self._buckets[deadline] = set()
            heapq.heappush(self._times, deadline)
        bucket.add(session_id)
        self._deadlines[session_id] = deadline

    def add(self, session_id: int, timeout_ms: int, now_ms: int) -> None:
        """Track ``session_id`` (again, if already tracked) as touched at ``now_ms``."""
        if timeout_ms <= 0:
            raise ValueError(f"timeout_ms must be positive, got {timeout_ms}")
        self.remove(session_id)
        self._timeouts[session_id] = timeout_ms
        self._place(session_id, self._deadline_after(now_ms, timeout_ms))

    def touch(self, session_id: int, now_ms: int) -> bool:
        """Note that ``session_id`` was heard from; ``False`` if it is not tracked.

        A deadline only moves forward: touches relayed late by a learner's PING must not
        shorten a session that the leader heard from more recently.
        """
        current = self._deadlines.get(session_id)
        if current is None:
            return False
        deadline = self._deadline_after(now_ms, self._timeouts[session_id])
        if deadline > current:
            self._buckets[current].discard(session_id)
            self._place(session_id, deadline)
        return True

    def remove(self, session_id: int) -> None:
        """Stop tracking ``session_id`` (closed by its client); unknown ids are ignored."""
        deadline = self._deadlines.pop(session_id, None)
        if deadline is not None:
            self._buckets[deadline].discard(session_id)
            del self._timeouts[session_id]

    def expired(self, now_ms: int) -> list[int]:
        """Sessions whose deadline is at or before ``now_ms``, in id order.

        Each is returned once and no longer tracked: the caller proposes one
        ``ExpireSessions`` for them, and a new leader rebuilds its tracker from the state.
        """
        due: list[int] = []
        times = self._times
        while times and times[0] <= now_ms:
            due.extend(self._buckets.pop(heapq.heappop(times)))
        for session_id in due:
            del self._deadlines[session_id]
            del self._timeouts[session_id]
        due.sort()
        return due

    def next_deadline(self) -> int | None:
        """When :meth:`expired` will next have something to return (``None``: never)."""
        times = self._times
        while times and not self._buckets[times[0]]:
            del self._buckets[heapq.heappop(times)]
        return times[0] if times else None

    def deadline(self, session_id: int) -> int | None:
        """When ``session_id`` expires unless touched (``None`` if not tracked)."""
        return self._deadlines.get(session_id)

    def __contains__(self, session_id: object) -> bool:
        return session_id in self._deadlines

    def __len__(self) -> int:
        return len(self._deadlines)


class SessionIdAllocator:
    """Session ids as ZooKeeper makes them: unique across servers and across restarts.

    The top byte is the server id, so two servers never collide; the next 40 bits start
    from the clock in milliseconds, so a restarted server starts past the ids it gave
    out before (unless it handed out more than 65536 per millisecond); the rest counts.
    """

    def __init__(self, server_id: int, now_ms: int) -> None:
        if not 0 <= server_id <= 255:
            raise ValueError(f"server id {server_id} does not fit in a byte (0..255)")
        if now_ms < 0:
            raise ValueError(f"now_ms must not be negative, got {now_ms}")
        time_part = (now_ms & ((1 << 40) - 1)) << 16
        # 0 means "no session" to the state machine, so never hand it out
        self._next = max((server_id << 56) | time_part, 1)

    def allocate(self) -> int:
        """A session id never returned before by this allocator."""
        session_id = self._next
        self._next += 1
        return session_id
