"""The coordinator's clock, timers and outbox, shared by its request handlers.

Every call into the coordinator is one *step*: the clock moves to the caller's
``now_ms`` (never backwards), every timer due by then fires, the call does its work,
and only then are its effects carried out, in order: responses handed to the callers'
``respond`` callbacks and writes handed to the store. Deferring them means a callback
always sees the coordinator in a consistent state, even one that calls straight back
in (a test client rejoining on MEMBER_ID_REQUIRED, a store that completes at once).
"""

from __future__ import annotations

import uuid
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from random import Random
from typing import TypeVar

from herder.coordinator.config import CoordinatorConfig
from herder.coordinator.store import GroupStore, StoreCallback
from herder.coordinator.timers import Timer, TimerQueue
from herder.errors import ErrorCode

R = TypeVar("R")


class CoordinatorContext:
    def __init__(self, config: CoordinatorConfig, store: GroupStore, random: Random) -> None:
        self.config = config
        self.store = store
        self.random = random
        self.timers = TimerQueue()
        self.now_ms = 0
        self._outbox: deque[Callable[[], None]] = deque()
        self._depth = 0

    @contextmanager
    def step(self, now_ms: int | None = None) -> Iterator[None]:
        """Run one event: advance to ``now_ms`` (if given), do the work, deliver effects.

        Steps nest (a store completing synchronously runs a step inside the step that
        wrote); effects are delivered when the outermost one ends.
        """
        self._depth += 1
        try:
            if now_ms is not None:
                self.now_ms = max(self.now_ms, now_ms)
                self.timers.run_due(self.now_ms)
            yield
        finally:
            self._depth -= 1
        if self._depth == 0:
            while self._outbox:
                self._outbox.popleft()()

    def reply(self, respond: Callable[[R], None], response: R) -> None:
        """Answer a request once the current step is complete."""
        self._outbox.append(lambda: respond(response))

    def write(self, effect: Callable[[], None]) -> None:
        """Hand a write to the store once the current step is complete."""
        self._outbox.append(effect)

    def completion(self, on_complete: Callable[[ErrorCode, int | None], None]) -> StoreCallback:
        """A store callback that runs ``on_complete`` as a step of its own.

        A store that completes a write twice has a bug that would answer a request
        twice; it is refused loudly.
        """
        completed = False

        def callback(error: ErrorCode, zxid: int | None = None) -> None:
            nonlocal completed
            if completed:
                raise RuntimeError("the group store completed one write twice")
            completed = True
            with self.step():
                on_complete(ErrorCode(error), zxid)

        return callback

    def schedule(self, delay_ms: int, action: Callable[[], None]) -> Timer:
        return self.timers.schedule(self.now_ms + max(delay_ms, 0), action)

    def new_member_id(self, client_id: str) -> str:
        """``<client id>-<uuid4>``, the uuid drawn from the injected random source."""
        suffix = uuid.UUID(int=self.random.getrandbits(128), version=4)
        return f"{client_id}-{suffix}"
