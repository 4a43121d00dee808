"""The REST API's connections: TLS handshakes and malformed requests, each refused client
named in the log by its address.

Given an SSL context, uvicorn leaves the TLS handshake to asyncio, which drops a failed
handshake without a word unless the event loop runs in debug mode: a plain HTTP client on
the HTTPS port, a client certificate no trusted CA signed, an expired one, all vanish.
On a plain listener, uvicorn logs "Invalid HTTP request received." without saying from
whom. So a worker serves uvicorn's protocol through :class:`RestConnection`, which

* on an HTTPS listener runs the handshake itself (``loop.start_tls``) and only then hands
  the connection to uvicorn, logging a failed handshake with the peer's address and what
  went wrong in words an operator can act on;
* on a plain listener refuses a client that opens with a TLS handshake, saying so;
* names the peer in the warnings uvicorn logs while it parses that connection's bytes.

Each line goes through :class:`~herder.runtime.refusals.RefusalLog`: once per peer host
and kind of refusal a minute, without a traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any, ClassVar

from herder.runtime.refusals import Peer, RefusalLog, peer_of

__all__ = ["HANDSHAKE_TIMEOUT_S", "RestConnection", "RestListener", "handshake_refusal"]

#: how long a client may take over its TLS handshake before the worker drops it
HANDSHAKE_TIMEOUT_S = 30.0
#: the first byte of a TLS record carrying a handshake (a ClientHello opens with one)
_TLS_HANDSHAKE = 0x16
#: the logger uvicorn warns of malformed requests on
_UVICORN = "uvicorn.error"

#: the listener and peer whose bytes uvicorn is parsing right now, to name in its warnings
_parsing: ContextVar[tuple[RestListener, Peer] | None] = ContextVar("rest_peer", default=None)

_CLOSED = (ssl.SSLEOFError, ssl.SSLZeroReturnError, ConnectionResetError, BrokenPipeError)


def handshake_refusal(exc: BaseException) -> tuple[str, str, int]:
    """Why a client's TLS handshake failed: (kind, reason, log level)."""
    if isinstance(exc, ConnectionAbortedError):
        return (
            "tls-timeout",
            f"refused: no TLS handshake within {HANDSHAKE_TIMEOUT_S:g} s",
            logging.WARNING,
        )
    if isinstance(exc, _CLOSED):
        # a TCP probe (a load balancer's, a port scan) connects and goes: not worth a warning
        return "tls-closed", "closed the connection before the TLS handshake ended", logging.DEBUG
    if isinstance(exc, ssl.SSLCertVerificationError):
        return (
            f"tls-certificate-{exc.verify_code}",
            f"refused: its client certificate failed verification ({exc.verify_message}); "
            "it must be valid now and signed by a CA of ssl.truststore.location",
            logging.WARNING,
        )
    reason = str(getattr(exc, "reason", None) or exc)
    if reason == "HTTP_REQUEST":
        text = "it sent plain HTTP to this HTTPS listener; use https://"
    elif reason == "PEER_DID_NOT_RETURN_A_CERTIFICATE":
        text = (
            "it presented no client certificate, which ssl.client.authentication=required demands"
        )
    elif reason.startswith(("TLSV1_ALERT_", "SSLV3_ALERT_")):
        alert = reason.partition("_ALERT_")[2].lower().replace("_", " ")
        text = (
            f"the client ended the handshake with the alert '{alert}' (an 'unknown ca' or "
            "'bad certificate' alert: it does not trust this worker's certificate)"
        )
    elif reason in ("WRONG_VERSION_NUMBER", "UNKNOWN_PROTOCOL", "RECORD_LAYER_FAILURE"):
        text = "it sent bytes that open no TLS handshake"
    else:
        text = f"the TLS handshake failed ({reason})"
    return "tls-" + reason.lower(), f"refused: {text}", logging.WARNING


def _send_at_once(transport: asyncio.Transport) -> None:
    """Turn Nagle's algorithm off for a connection. asyncio does so only on sockets whose
    protocol number says TCP, which those of ``socket.create_server`` (the worker's
    listening socket) do not carry; and uvicorn writes a response's head and body apart,
    so the body would wait for the client's delayed ACK: ~40 ms a kept-alive request."""
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class _NamePeer(logging.Filter):
    """Turns uvicorn's warnings about the connection being parsed into refusals that name
    its peer (and are rate-limited as every refusal is)."""

    def filter(self, record: logging.LogRecord) -> bool:
        parsing = _parsing.get()
        if parsing is None or record.levelno < logging.WARNING or record.exc_info:
            return True
        listener, peer = parsing
        message = record.getMessage()
        listener.refusals.refuse(peer, "http:" + message, f"sent a bad request: {message}")
        return False


_NAME_PEER = _NamePeer()


class RestListener:
    """One REST listening socket's way of serving connections (TLS or not)."""

    def __init__(self, tls: ssl.SSLContext | None, refusals: RefusalLog) -> None:
        self.tls = tls
        self.refusals = refusals
        self._handshakes: set[asyncio.Task[None]] = set()
        #: the connections open now (in their handshake or served)
        self.connections: set[RestConnection] = set()

    def serve(self, inner: type[asyncio.Protocol]) -> type[asyncio.Protocol]:
        """A protocol class for uvicorn that serves ``inner`` (uvicorn's own) through
        this listener."""
        uvicorn_log = logging.getLogger(_UVICORN)
        if _NAME_PEER not in uvicorn_log.filters:
            uvicorn_log.addFilter(_NAME_PEER)
        return type("RestConnection", (RestConnection,), {"listener": self, "inner_class": inner})

    def handshake(self, connection: RestConnection, transport: asyncio.Transport) -> None:
        task = asyncio.get_running_loop().create_task(self._handshake(connection, transport))
        self._handshakes.add(task)
        task.add_done_callback(self._handshakes.discard)

    async def _handshake(self, connection: RestConnection, transport: asyncio.Transport) -> None:
        assert self.tls is not None
        loop = asyncio.get_running_loop()
        try:
            secured = await loop.start_tls(
                transport,
                connection,
                self.tls,
                server_side=True,
                ssl_handshake_timeout=HANDSHAKE_TIMEOUT_S,
            )
        except asyncio.CancelledError:
            self.connections.discard(connection)
            raise
        except OSError as exc:  # ssl.SSLError among them; start_tls closed the transport
            self.connections.discard(connection)
            kind, reason, level = handshake_refusal(exc)
            self.refusals.refuse(connection.peer, kind, reason, level)
            return
        assert secured is not None  # asyncio gives the TLS transport, or raises
        connection.secured(secured)

    def abort(self) -> None:
        """Drop every connection at once, those still in their handshake too (the worker
        is stopping and its grace period is over)."""
        for task in list(self._handshakes):
            task.cancel()
        for connection in list(self.connections):
            connection.abort()


class RestConnection(asyncio.Protocol):
    """A REST connection: uvicorn's protocol behind the TLS handshake and the peer's name."""

    listener: ClassVar[RestListener]
    inner_class: ClassVar[type[asyncio.Protocol]]

    def __init__(self, **uvicorn_args: Any) -> None:
        self.inner = self.inner_class(**uvicorn_args)
        self.peer: Peer = ("?", 0)
        #: the connection's socket, under TLS if any
        self._socket: asyncio.Transport | None = None
        self._handed_over = False
        self._opened = False
        # what the TLS layer delivered before the handshake's end reached uvicorn
        self._early: list[bytes] = []
        self._early_eof = False
        self._lost = False

    @contextlib.contextmanager
    def _naming(self) -> Iterator[None]:
        token = _parsing.set((self.listener, self.peer))
        try:
            yield
        finally:
            _parsing.reset(token)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._socket = transport
        _send_at_once(transport)
        self.listener.connections.add(self)
        self.peer = peer_of(transport.get_extra_info("peername"))
        if self.listener.tls is None:
            self._hand_over(transport)
            return
        transport.pause_reading()
        self.listener.handshake(self, transport)

    def secured(self, transport: asyncio.Transport) -> None:
        """The handshake succeeded: uvicorn serves the connection from here on (unless the
        client has gone already)."""
        if self._lost:
            return
        self._hand_over(transport)
        early, self._early = self._early, []
        for data in early:
            self.data_received(data)
        if self._early_eof:
            self.eof_received()

    def _hand_over(self, transport: asyncio.Transport) -> None:
        self._handed_over = True
        with self._naming():
            self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if not self._handed_over:
            self._early.append(data)
            return
        if not self._opened:
            self._opened = True
            if self.listener.tls is None and data[:1] == bytes([_TLS_HANDSHAKE]):
                self.listener.refusals.refuse(
                    self.peer,
                    "tls-on-plain",
                    "refused: it opened a TLS handshake on this plain HTTP listener; use "
                    "http://, or serve HTTPS with listeners=https://…",
                )
                assert self._socket is not None
                self._socket.close()
                return
        with self._naming():
            self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        if not self._handed_over:
            self._early_eof = True
            return None
        with self._naming():
            return self.inner.eof_received()

    def abort(self) -> None:
        # the socket's transport, not TLS's: asyncio's TLS transport, once close() was
        # called on it twice, forgets its connection and ignores abort()
        if self._socket is not None:
            self._socket.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        self.listener.connections.discard(self)
        if self._handed_over:
            with self._naming():
                self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        if self._handed_over:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self._handed_over:
            self.inner.resume_writing()
