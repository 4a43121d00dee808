"""A simulated asyncio event loop: virtual time, no sockets, no threads.

Each simulated server gets one :class:`SimLoop`, as a real server process has one
loop. The loops share one :class:`SimClock`; the simulation (not the loops) decides
which loop runs next and moves the clock to that loop's next event, so the servers'
code runs exactly as it does on a real loop (tasks, futures, ``call_later``,
``wait_for``), one deterministic interleaving per seed.

What a real loop does in threads, :meth:`SimLoop.run_in_executor` does on the loop
after a simulated disk delay drawn from the simulation's random generator: the group
committer's fsyncs and the storage maintenance it runs "in a thread" take simulated
time, and everything appended meanwhile waits for the next one, as on a real disk.

Sockets are :mod:`tests.sim.real.net`'s: ``create_connection`` and ``create_server``
are answered by the simulated network this loop is attached to.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import random
from asyncio import events
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tests.sim.real.net import SimNet


class SimClock:
    """The one simulated time every loop reads, in seconds (as ``loop.time()``)."""

    def __init__(self) -> None:
        self.now = 0.0

    def ms(self) -> int:
        return int(self.now * 1000)


class _NoSelector:
    """The loop never waits for IO: the simulation moves time and delivers bytes."""

    def select(self, timeout: float | None) -> list[Any]:
        return []

    def close(self) -> None:
        return None


class SimLoop(asyncio.BaseEventLoop):
    """One simulated server's event loop. See the module docstring."""

    def __init__(
        self,
        host: int,
        clock: SimClock,
        net: SimNet,
        rng: random.Random,
        disk_ms: tuple[int, int],
    ) -> None:
        super().__init__()
        self.host = host
        self._clock = clock
        self._net = net
        self._rng = rng
        self._disk_ms = disk_ms
        self._selector = _NoSelector()
        #: set when the process this loop belongs to died: nothing of it runs again
        self.dead = False
        #: exceptions no task handled (a real loop only logs them): the simulation fails
        self.unhandled: list[dict[str, Any]] = []
        self.set_exception_handler(SimLoop._on_unhandled)

    def time(self) -> float:
        return self._clock.now

    def _process_events(self, event_list: list[Any]) -> None:
        return None

    def _write_to_self(self) -> None:
        return None

    def _on_unhandled(self, context: dict[str, Any]) -> None:
        if not self.dead:
            self.unhandled.append(context)

    # -- what the simulation drives -----------------------------------------------------

    def next_event(self) -> float | None:
        """When this loop next has something to run (None: it waits for the network)."""
        if self._ready:
            return self._clock.now
        scheduled = self._scheduled
        # drop cancelled timers from the head, as the loop's own iteration does
        while scheduled and scheduled[0].cancelled():
            heapq.heappop(scheduled)._scheduled = False  # type: ignore[attr-defined]
            self._timer_cancelled_count -= 1  # type: ignore[attr-defined]
        return scheduled[0].when() if scheduled else None

    def run_once(self) -> None:
        """Run what is due now, as one iteration of a real loop would."""
        previous = events._get_running_loop()
        events._set_running_loop(self)
        try:
            self._run_once()
        finally:
            events._set_running_loop(previous)

    def call_in(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Call ``fn`` as code running on this loop (for the simulation's own inputs)."""
        previous = events._get_running_loop()
        events._set_running_loop(self)
        try:
            return fn(*args)
        finally:
            events._set_running_loop(previous)

    def discard(self) -> None:
        """The run is over: drop whatever is still pending, quietly.

        Coroutines that never ran are closed (a real process's exit would not warn that
        they were never awaited); nothing of this loop runs again.
        """
        self.dead = True
        for task in asyncio.all_tasks(self):
            with contextlib.suppress(Exception):
                task.get_coro().close()
        self._ready.clear()
        self._scheduled.clear()

    # -- threads and sockets, simulated ----------------------------------------------

    def run_in_executor(self, executor: Any, func: Callable[..., Any], *args: Any) -> Any:
        """Run ``func`` on this loop after a simulated disk delay (it would take a thread)."""
        future = self.create_future()

        def run() -> None:
            if future.cancelled():
                return
            try:
                result = func(*args)
            except BaseException as exc:  # handed to the awaiting task, as a thread would
                future.set_exception(exc)
            else:
                future.set_result(result)

        self.call_later(self._rng.randint(*self._disk_ms) / 1000, run)
        return future

    async def create_connection(  # type: ignore[override]
        self, protocol_factory: Callable[[], asyncio.BaseProtocol], host: str, port: int, **_: Any
    ) -> tuple[asyncio.Transport, asyncio.BaseProtocol]:
        return await self._net.connect(self, protocol_factory, host, port)

    async def create_server(  # type: ignore[override]
        self, protocol_factory: Callable[[], asyncio.BaseProtocol], host: str, port: int, **_: Any
    ) -> Any:
        return self._net.listen(self, protocol_factory, host, port)
