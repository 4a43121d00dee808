"""Refused REST clients, logged once each with their address, however hard they retry.

A client with a wrong password, a plain HTTP client on an HTTPS port or a certificate
nobody signed is refused on every attempt; a client library that retries in a loop would
fill the log with the same line. So a refusal is logged when it is the first of its kind
from that peer host within a window (a minute); the rest are counted, and the next line
logged about that host and kind says how many went unlogged. Peers are keyed by host, not
port: every retry comes from a new port.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Peer", "RefusalLimiter", "RefusalLog", "peer_of"]

log = logging.getLogger(__name__)

#: how long, after a refusal is logged, the same peer host's refusals of that kind are only counted
WINDOW_S = 60.0
#: how many (host, kind) pairs are remembered; the oldest are forgotten first
MAX_PEERS = 4096

Peer = tuple[str, int]


def peer_of(address: object) -> Peer:
    """A socket's peer address as (host, port); ("?", 0) when the transport has none."""
    if isinstance(address, tuple) and len(address) >= 2:
        return str(address[0]), int(address[1])
    return "?", 0


@dataclass
class _Window:
    opened: float
    unlogged: int = 0


class RefusalLimiter:
    """Decides which refusals are logged (pure: the time is given)."""

    def __init__(self, window_s: float = WINDOW_S, max_peers: int = MAX_PEERS) -> None:
        self.window_s = window_s
        self.max_peers = max_peers
        self._windows: OrderedDict[tuple[str, str], _Window] = OrderedDict()

    def admit(self, host: str, kind: str, now: float) -> int | None:
        """None when this refusal is only counted; else it is to be logged, and the
        number is how many of this host and kind went unlogged since the last line."""
        key = (host, kind)
        window = self._windows.get(key)
        if window is not None and now - window.opened < self.window_s:
            window.unlogged += 1
            return None
        unlogged = window.unlogged if window is not None else 0
        self._windows[key] = _Window(opened=now)
        self._windows.move_to_end(key)
        while len(self._windows) > self.max_peers:
            self._windows.popitem(last=False)
        return unlogged


class RefusalLog:
    """Logs refusals through a :class:`RefusalLimiter` on the process's clock."""

    def __init__(
        self,
        limiter: RefusalLimiter | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limiter = limiter or RefusalLimiter()
        self.clock = clock

    def refuse(self, peer: Peer, kind: str, reason: str, level: int = logging.WARNING) -> None:
        """Log ``REST client <peer> <reason>`` (unless a line of the same ``kind``
        about its host was logged within the window)."""
        if not log.isEnabledFor(level):
            return
        unlogged = self.limiter.admit(peer[0], kind, self.clock())
        if unlogged is None:
            return
        more = f" ({unlogged} more such refusals of {peer[0]} were not logged)" if unlogged else ""
        log.log(level, "REST client %s:%s %s%s", peer[0], peer[1], reason, more)
