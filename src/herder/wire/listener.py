"""A listening port that takes TLS, and plaintext too if it is told to.

asyncio's own TLS servers do the handshake before the application hears of a
connection and report a failed one nowhere (at debug level, with a traceback, at
best): an operator could not see who was refused and why. Here each accepted socket is
looked at first: its first byte tells a TLS handshake (``0x16``) from a plaintext
frame. A TLS connection is then wrapped with ``connect_accepted_socket``, whose failure
comes back to us and is logged once, with the peer's address and the reason; a
plaintext one is handed over as it is where the port takes both (ZooKeeper's
``client.portUnification``), and refused with a frame saying why where it does not.

Refusals are logged once per peer host and reason: a server that keeps retrying with a
certificate nobody trusts does not fill the log.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from collections.abc import Awaitable, Callable
from typing import TypeVar

from herder.wire.tls import TLS_RECORD_HANDSHAKE

__all__ = ["HANDSHAKE_TIMEOUT_S", "RefusalLog", "TlsListener", "describe_tls_failure"]

log = logging.getLogger(__name__)

HANDSHAKE_TIMEOUT_S = 10.0
#: how long a refused plaintext client has to read the refusal before we close
_LINGER_S = 1.0

P = TypeVar("P", bound=asyncio.BaseProtocol)


class RefusalLog:
    """Logs each (peer host, reason) once at WARNING, then at DEBUG."""

    MAX_REMEMBERED = 1024

    def __init__(self, logger: logging.Logger) -> None:
        self._log = logger
        self._seen: set[tuple[str, str]] = set()

    def refused(self, what: str, peer: str, reason: str) -> None:
        key = (peer.rpartition(":")[0] or peer, reason)
        first = key not in self._seen
        if first:
            if len(self._seen) >= self.MAX_REMEMBERED:
                self._seen.clear()
            self._seen.add(key)
        self._log.log(
            logging.WARNING if first else logging.DEBUG,
            "refusing %s from %s: %s%s",
            what,
            peer,
            reason,
            "" if first else " (again)",
        )


def describe_tls_failure(exc: BaseException) -> str:
    """One line on why a TLS handshake failed, in the words an operator needs."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return (
            f"its certificate failed verification ({exc.verify_message}): it is not signed "
            "by a CA of the truststore, or it has expired"
        )
    if isinstance(exc, ssl.SSLError):
        reason = exc.reason or str(exc)
        if reason in ("WRONG_VERSION_NUMBER", "HTTP_REQUEST", "UNKNOWN_PROTOCOL"):
            return f"not a TLS handshake ({reason})"
        if reason == "PEER_DID_NOT_RETURN_A_CERTIFICATE":
            return "it presented no certificate, and this port requires one"
        if "UNKNOWN_CA" in reason or "BAD_CERTIFICATE" in reason:
            return f"it does not trust our certificate ({reason})"
        return f"TLS handshake failed ({reason})"
    if isinstance(exc, TimeoutError):
        return "TLS handshake timed out"
    if isinstance(exc, ConnectionError | EOFError):
        return (
            "it closed the connection during the TLS handshake (it may not trust our certificate)"
        )
    return f"connection failed during the TLS handshake ({exc})"


class TlsListener:
    """Accepts on ``host:port`` and hands each connection to ``on_tls`` or ``on_plain``."""

    def __init__(
        self,
        context: ssl.SSLContext,
        *,
        on_tls: Callable[[socket.socket, str], Awaitable[None]],
        on_plain: Callable[[socket.socket, str], Awaitable[None]] | None,
        refuse_plain: Callable[[str], bytes],
        refusals: RefusalLog,
        what: str,
    ) -> None:
        self.context = context
        self._on_tls = on_tls
        self._on_plain = on_plain
        self._refuse_plain = refuse_plain
        self._refusals = refusals
        self._what = what
        self._sock: socket.socket | None = None
        self._accepting: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self, host: str, port: int) -> int:
        sock = socket.create_server((host, port), reuse_port=False, backlog=128)
        sock.setblocking(False)
        self._sock = sock
        self._accepting = asyncio.get_running_loop().create_task(self._accept())
        return int(sock.getsockname()[1])

    @property
    def port(self) -> int:
        assert self._sock is not None, "listener not started"
        return int(self._sock.getsockname()[1])

    async def stop(self) -> None:
        if self._accepting is not None:
            self._accepting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._accepting
            self._accepting = None
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _accept(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._sock is not None
        while True:
            try:
                sock, address = await loop.sock_accept(self._sock)
            except OSError as exc:
                # out of file descriptors and the like: keep serving those we have
                log.warning("accepting %s failed: %s", self._what, exc)
                await asyncio.sleep(0.1)
                continue
            # asyncio sets TCP_NODELAY only on sockets whose proto says TCP, which those
            # of socket.create_server do not: without it every small answer after the
            # handshake waits for a delayed ACK (tens of milliseconds)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            peer = f"{address[0]}:{address[1]}"
            task = loop.create_task(self._sort(sock, peer))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _sort(self, sock: socket.socket, peer: str) -> None:
        try:
            async with asyncio.timeout(HANDSHAKE_TIMEOUT_S):
                first = await _peek(sock)
        except (TimeoutError, OSError):
            sock.close()
            return
        if not first:
            sock.close()  # connected and went away: a port probe
            return
        if first[0] == TLS_RECORD_HANDSHAKE:
            await self._on_tls(sock, peer)
        elif self._on_plain is not None:
            await self._on_plain(sock, peer)
        else:
            self._refusals.refused(
                self._what, peer, "a plaintext client on a port that takes TLS only"
            )
            await _refuse(sock, self._refuse_plain(peer))

    async def accept_tls(
        self, sock: socket.socket, peer: str, protocol_factory: Callable[[], P]
    ) -> tuple[asyncio.Transport, P] | None:
        """Wrap ``sock`` in TLS; on failure log it once and close it."""
        loop = asyncio.get_running_loop()
        try:
            transport, protocol = await loop.connect_accepted_socket(
                protocol_factory,
                sock,
                ssl=self.context,
                ssl_handshake_timeout=HANDSHAKE_TIMEOUT_S,
            )
        except (OSError, TimeoutError, EOFError) as exc:
            self._refusals.refused(self._what, peer, describe_tls_failure(exc))
            sock.close()
            return None
        return transport, protocol


async def _peek(sock: socket.socket) -> bytes:
    loop = asyncio.get_running_loop()
    while True:
        try:
            return sock.recv(1, socket.MSG_PEEK)
        except BlockingIOError:
            readable: asyncio.Future[None] = loop.create_future()
            loop.add_reader(sock.fileno(), _wake, readable)
            try:
                await readable
            finally:
                loop.remove_reader(sock.fileno())


def _wake(readable: asyncio.Future[None]) -> None:
    if not readable.done():
        readable.set_result(None)


async def _refuse(sock: socket.socket, message: bytes) -> None:
    """Say why in plaintext, then close without resetting the connection, so the client
    reads the reason rather than a reset."""
    loop = asyncio.get_running_loop()
    # the client may be gone, or never read: either way the connection just closes
    try:
        with contextlib.suppress(OSError, TimeoutError):
            with contextlib.suppress(BlockingIOError):
                sock.recv(1 << 16)  # what the client sent first: unread data would reset
            await loop.sock_sendall(sock, message)
            sock.shutdown(socket.SHUT_WR)
            async with asyncio.timeout(_LINGER_S):
                # until the client closes its side, reading (and dropping) what it sends
                received = await loop.sock_recv(sock, 1 << 16)
                while received:
                    received = await loop.sock_recv(sock, 1 << 16)
    finally:
        sock.close()
