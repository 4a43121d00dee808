"""A simulated TCP network between :class:`~tests.sim.real.loop.SimLoop` s.

The real :class:`~herder.ensemble.quorum.QuorumNetwork` runs on it unchanged: it
listens (``create_server``), dials (``create_connection``), writes frames and reads
them back through asyncio streams. The network keeps TCP's promises and breaks them
the way TCP does:

* bytes arrive in order, each write after a random delay, never duplicated;
* a closed connection reaches the other end (end of stream) after the same delay;
* a dial to a server that is down, or not listening, is refused; a dial across a
  partition hangs until the dialler's own timeout;
* a partition (one way or both) stalls a connection that crosses it: nothing more is
  delivered on it, either way, until the partition heals; then either TCP's
  retransmissions get through (everything held arrives, in order, late) or they had
  given up (both ends see the connection reset), as the seed decides;
* a process that dies vanishes with its connections: the others see them end.

Everything happens through callbacks scheduled on the receiving server's loop at a
simulated time, so the simulation's one clock orders all of it.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tests.sim.real.loop import SimClock, SimLoop

#: gap between two deliveries on one connection, so that a later write is never first
_FIFO_S = 1e-6


class _End(asyncio.Transport):
    """One end of a simulated connection: what the owning loop's protocol writes to."""

    def __init__(self, conn: _Conn, loop: SimLoop, name: tuple[str, int]) -> None:
        super().__init__({"peername": name, "sockname": name})
        self.conn = conn
        self.loop = loop
        self.protocol: asyncio.BaseProtocol | None = None
        self.closing = False
        self.other: _End | None = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not self.closing and not self.loop.dead:
            self.conn.carry(self, bytes(data), fin=False)

    def writelines(self, list_of_data: Any) -> None:
        for data in list_of_data:
            self.write(data)

    def close(self) -> None:
        if self.closing or self.loop.dead:
            return
        self.closing = True
        self.conn.carry(self, b"", fin=True)
        self._lost(None)

    def abort(self) -> None:
        self.close()

    def is_closing(self) -> bool:
        return self.closing

    def can_write_eof(self) -> bool:
        return False

    def get_write_buffer_size(self) -> int:
        return 0

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        return None

    def is_reading(self) -> bool:
        return not self.closing

    def pause_reading(self) -> None:
        return None

    def resume_reading(self) -> None:
        return None

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self.protocol = protocol

    def get_protocol(self) -> asyncio.BaseProtocol:
        assert self.protocol is not None
        return self.protocol

    # -- what the network does to this end ----------------------------------------

    def _lost(self, exc: Exception | None) -> None:
        protocol = self.protocol
        if protocol is not None and not self.loop.dead:
            self.loop.call_soon(protocol.connection_lost, exc)

    def receive(self, data: bytes, fin: bool) -> None:
        if self.closing or self.loop.dead:
            return
        if fin:
            self.closing = True
            self._lost(None)
            return
        protocol = self.protocol
        assert isinstance(protocol, asyncio.Protocol)
        protocol.data_received(data)

    def reset(self) -> None:
        if not self.closing:
            self.closing = True
            self._lost(ConnectionResetError("connection reset (simulated)"))


class _Conn:
    """A connection: two ends, and whether a partition has killed it."""

    def __init__(self, net: SimNet, client: SimLoop, server: SimLoop, port: int) -> None:
        self.net = net
        #: stalled by a partition: what was written since waits here, in order
        self.held: list[tuple[_End, bytes, bool]] | None = None
        self.a = _End(self, client, (f"s{server.host}", port))
        self.b = _End(self, server, (f"s{client.host}", 0))
        self.a.other, self.b.other = self.b, self.a
        self._last: dict[int, float] = {}

    def carry(self, end: _End, data: bytes, *, fin: bool) -> None:
        other = end.other
        assert other is not None
        net = self.net
        if self.held is None and net.is_cut(end.loop.host, other.loop.host):
            self.held = []
        if self.held is not None:
            self.held.append((end, data, fin))
            return
        at = net.clock.now + net.rng.randint(*net.delay_ms) / 1000
        at = max(at, self._last.get(id(end), 0.0) + _FIFO_S)
        self._last[id(end)] = at
        other.loop.call_at(at, other.receive, data, fin)

    def ends(self) -> tuple[_End, _End]:
        return self.a, self.b


class SimListener:
    """What ``create_server`` returns: enough of :class:`asyncio.Server` to close it."""

    def __init__(self, net: SimNet, key: tuple[str, int]) -> None:
        self._net = net
        self._key = key

    def close(self) -> None:
        self._net.listeners.pop(self._key, None)

    async def wait_closed(self) -> None:
        return None


class SimNet:
    """The links between the simulated servers. See the module docstring."""

    def __init__(self, clock: SimClock, rng: random.Random, delay_ms: tuple[int, int]) -> None:
        self.clock = clock
        self.rng = rng
        self.delay_ms = delay_ms
        self.listeners: dict[tuple[str, int], tuple[SimLoop, Callable[[], Any]]] = {}
        #: (a, b): what a sends to b is lost
        self.cut: set[tuple[int, int]] = set()
        self.conns: list[_Conn] = []
        self.resets = 0

    def is_cut(self, a: int, b: int) -> bool:
        return (a, b) in self.cut

    def listen(
        self, loop: SimLoop, factory: Callable[[], Any], host: str, port: int
    ) -> SimListener:
        key = (host, port)
        self.listeners[key] = (loop, factory)
        return SimListener(self, key)

    async def connect(
        self, loop: SimLoop, factory: Callable[[], Any], host: str, port: int
    ) -> tuple[asyncio.Transport, Any]:
        me = loop.host
        await asyncio.sleep(self.rng.randint(*self.delay_ms) / 1000)
        target = self.listeners.get((host, port))
        if target is not None and (
            self.is_cut(me, target[0].host) or self.is_cut(target[0].host, me)
        ):
            await loop.create_future()  # the SYN (or its answer) is lost: the dialler times out
        if target is None or target[0].dead:
            raise ConnectionRefusedError(f"{host}:{port}: connection refused (simulated)")
        server_loop, server_factory = target
        conn = _Conn(self, loop, server_loop, port)
        self.conns.append(conn)
        server_protocol = server_factory()
        conn.b.set_protocol(server_protocol)
        server_loop.call_soon(server_protocol.connection_made, conn.b)
        protocol = factory()
        conn.a.set_protocol(protocol)
        protocol.connection_made(conn.a)
        return conn.a, protocol

    # -- faults ------------------------------------------------------------------------

    def _prune(self) -> None:
        self.conns = [c for c in self.conns if not (c.a.closing and c.b.closing)]

    def crashed(self, host: int) -> None:
        """``host``'s process died: its listeners go, its connections end."""
        for key, (loop, _) in list(self.listeners.items()):
            if loop.host == host:
                del self.listeners[key]
        for conn in self.conns:
            for end in conn.ends():
                if end.loop.host == host:
                    end.closing = True
                    other = end.other
                    assert other is not None
                    if conn.held is not None or self.is_cut(host, other.loop.host):
                        conn.held = conn.held or []
                        conn.held.append((end, b"", True))
                    elif not other.closing:
                        at = self.clock.now + self.rng.randint(*self.delay_ms) / 1000
                        other.loop.call_at(at, other.reset)
        self._prune()

    def heal(self) -> None:
        """The partition is over: each stalled connection resumes or is reset."""
        self.cut.clear()
        for conn in self.conns:
            held, conn.held = conn.held, None
            if held is None:
                continue
            if self.rng.random() < 0.5:
                for end in conn.ends():
                    end.reset()
                continue
            for end, data, fin in held:
                # what a process wrote before it died was in its kernel's buffers
                conn.carry(end, data, fin=fin)
        self._prune()

    def reset_one(self) -> bool:
        """A connection reset out of the blue (a middlebox, a NIC): both ends see it."""
        live = [c for c in self.conns if not (c.a.closing or c.b.closing)]
        if not live:
            return False
        conn = self.rng.choice(live)
        conn.held = None
        for end in conn.ends():
            end.reset()
        self.resets += 1
        self._prune()
        return True
