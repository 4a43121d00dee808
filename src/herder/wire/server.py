"""An asyncio server for the wire protocol: many connections, many requests in flight.

Each request runs as its own task, so a slow handler never holds up the requests behind
it on the same connection and responses go out in the order handlers finish (the
correlation id pairs them up). A connection that breaks the protocol at the frame level
(a frame over the limit, bytes that are not an envelope) is closed with a logged reason;
a well-framed request the server cannot serve (unknown api, unsupported version, a body
of the wrong shape) is answered with an error and the connection carries on. Neither
touches any other connection.

A server may listen on several ports: plaintext ones, and TLS ones (which may take
plaintext too) through a :class:`~herder.wire.listener.TlsListener`. With an
:class:`~herder.wire.auth.AccessPolicy`, each connection has a principal (anonymous, a
verified client certificate's, or a user's after SaslAuthenticate) and every request is
authorised against its role before its handler runs; a refusal is an error answer, logged
once per peer and reason, and the connection carries on.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import socket
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from herder.errors import (
    AuthenticationFailed,
    ErrorCode,
    HerderError,
    NotAuthorized,
    ProtocolError,
    UnknownApi,
    UnsupportedVersion,
)
from herder.wire.auth import (
    ANONYMOUS,
    SASL_AUTHENTICATE,
    AccessPolicy,
    Principal,
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
)
from herder.wire.envelope import (
    API_VERSIONS,
    Api,
    ApiRegistry,
    ApiVersionsRequest,
    ApiVersionsResponse,
    decode_request_envelope,
    encode_response,
)
from herder.wire.framing import DEFAULT_MAX_FRAME_BYTES, FrameDecoder, encode_frame
from herder.wire.listener import RefusalLog, TlsListener
from herder.wire.tls import TLS_RECORD_HANDSHAKE, peer_common_name

log = logging.getLogger(__name__)

Handler = Callable[[Any, "RequestContext"], Awaitable[msgspec.Struct]]

_connection_ids = itertools.count(1)


@dataclass(slots=True)
class RequestContext:
    """What a handler knows about the request besides its body."""

    connection: Connection
    api: Api[Any, Any]
    version: int
    correlation_id: int


@dataclass(eq=False)
class Connection:
    """One client connection; handlers may keep per-connection state in ``attrs``."""

    id: int
    peer: str
    attrs: dict[str, Any] = field(default_factory=dict)
    #: who the client proved to be (anonymous until it does)
    principal: Principal = ANONYMOUS
    #: whether it came over TLS
    tls: bool = False
    closed: bool = False
    _close_callbacks: list[Callable[[Connection], None]] = field(default_factory=list)
    _transport: asyncio.Transport | None = None

    def on_close(self, callback: Callable[[Connection], None]) -> None:
        """Run ``callback`` once when the connection ends (at once if it already has)."""
        if self.closed:
            callback(self)
        else:
            self._close_callbacks.append(callback)

    def close(self, reason: str = "") -> None:
        if self._transport is not None and not self._transport.is_closing():
            if reason:
                log.info("closing connection %s from %s: %s", self.id, self.peer, reason)
            self._transport.close()


class _ServerProtocol(asyncio.Protocol):
    def __init__(self, server: WireServer) -> None:
        self._server = server
        self._decoder = FrameDecoder(server.max_frame_bytes)
        self._transport: asyncio.Transport | None = None
        self._conn: Connection | None = None
        self._in_flight = 0
        self._reading_paused = False
        self._writing_paused = False
        self._tasks: set[asyncio.Task[None]] = set()
        self._first_data = True

    # -- asyncio.Protocol -------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        peername = transport.get_extra_info("peername")
        peer = f"{peername[0]}:{peername[1]}" if peername else "?"
        self._conn = Connection(next(_connection_ids), peer, _transport=transport)
        self._conn.tls = transport.get_extra_info("ssl_object") is not None
        self._conn.principal = self._server._initial_principal(transport)
        refusal = self._server._admit(self._conn)
        if refusal is not None:
            log.warning("refusing connection from %s: %s", peer, refusal)
            # said to the client too (correlation id 0 answers no request), so it can
            # tell its user which limit refused it and how to raise it
            transport.write(
                encode_frame(encode_response(0, None, ErrorCode.TOO_MANY_CONNECTIONS, refusal))
            )
            transport.close()
            return

    def connection_lost(self, exc: Exception | None) -> None:
        conn = self._conn
        if conn is None or conn.closed:
            return
        conn.closed = True
        self._server._forget(conn)
        for task in self._tasks:
            task.cancel()
        for callback in conn._close_callbacks:
            try:
                callback(conn)
            except Exception:
                log.exception("close callback of connection %s failed", conn.id)
        conn._close_callbacks.clear()

    def pause_writing(self) -> None:
        self._writing_paused = True
        self._update_reading()

    def resume_writing(self) -> None:
        self._writing_paused = False
        self._update_reading()

    def data_received(self, data: bytes) -> None:
        conn = self._conn
        if conn is None or conn.closed:
            return
        if self._first_data:
            self._first_data = False
            if not conn.tls and data[:1] == bytes([TLS_RECORD_HANDSHAKE]):
                self._server.refusals.refused(
                    "connection",
                    conn.peer,
                    "a TLS handshake on a plaintext port (connect to the secure port, or "
                    "without TLS)",
                )
                # a frame where a TLS record should be: the client's TLS fails at once
                # with a wrong-version error instead of waiting for a handshake
                self._send(
                    encode_response(
                        0, None, ErrorCode.INVALID_REQUEST, "this port takes plaintext only"
                    )
                )
                self._transport_close()
                return
        try:
            frames = self._decoder.feed(data)
        except HerderError as exc:
            conn.close(str(exc))
            return
        for frame in frames:
            try:
                envelope = decode_request_envelope(frame)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                conn.close(f"malformed request envelope: {exc}")
                return
            self._dispatch(envelope.api, envelope.version, envelope.correlation_id, envelope.body)

    def _transport_close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    # -- requests ---------------------------------------------------------------------
    def _dispatch(self, api_key: int, version: int, correlation_id: int, raw: Any) -> None:
        assert self._conn is not None
        server = self._server
        try:
            api = server.registry.get(api_key)
            if not api.supports(version):
                raise UnsupportedVersion(
                    f"{api.name} version {version} is not supported "
                    f"(this server speaks {api.min_version}..{api.max_version})"
                )
            handler = server._handlers.get(api_key)
            if handler is None:
                raise UnknownApi(f"{api.name} is not served here")
            server._authorize(self._conn, api)
            try:
                body = server.registry.decode_request(api_key, raw)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                raise ProtocolError(f"malformed {api.name} request: {exc}") from None
        except HerderError as exc:
            self._send(encode_response(correlation_id, None, exc.code, exc.message))
            return
        ctx = RequestContext(self._conn, api, version, correlation_id)
        self._in_flight += 1
        self._update_reading()
        task = asyncio.get_running_loop().create_task(self._run(handler, body, ctx))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, handler: Handler, body: Any, ctx: RequestContext) -> None:
        try:
            response = await handler(body, ctx)
        except HerderError as exc:
            frame = encode_response(ctx.correlation_id, None, exc.code, exc.message)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("%s handler failed on connection %s", ctx.api.name, ctx.connection.id)
            frame = encode_response(
                ctx.correlation_id,
                None,
                ErrorCode.UNKNOWN_SERVER_ERROR,
                f"internal error while serving {ctx.api.name}; see the server log",
            )
        else:
            frame = encode_response(ctx.correlation_id, response)
        finally:
            self._in_flight -= 1
        self._send(frame)
        self._update_reading()

    def _send(self, payload: bytes) -> None:
        transport = self._transport
        if transport is not None and not transport.is_closing():
            transport.write(encode_frame(payload))

    def _update_reading(self) -> None:
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        should_pause = self._writing_paused or self._in_flight >= self._server.max_in_flight
        if should_pause and not self._reading_paused:
            transport.pause_reading()
            self._reading_paused = True
        elif not should_pause and self._reading_paused:
            transport.resume_reading()
            self._reading_paused = False


class WireServer:
    """Serves the APIs in ``registry`` with the handlers given to :meth:`route`."""

    def __init__(
        self,
        registry: ApiRegistry,
        *,
        name: str = "herder",
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        max_in_flight: int = 4096,
        max_connections: int = 0,
        max_connections_per_host: int = 0,
        access: AccessPolicy | None = None,
    ) -> None:
        self.registry = registry
        self.name = name
        self.max_frame_bytes = max_frame_bytes
        self.max_in_flight = max_in_flight
        self.max_connections = max_connections
        self.max_connections_per_host = max_connections_per_host
        self.access = access
        self.connections: dict[int, Connection] = {}
        self._handlers: dict[int, Handler] = {API_VERSIONS.key: self._api_versions}
        if access is not None:
            self.registry.add(SASL_AUTHENTICATE)
            self._handlers[SASL_AUTHENTICATE.key] = self._authenticate
        #: refused connections and requests, each peer and reason logged once
        self.refusals = RefusalLog(log)
        self._servers: list[asyncio.Server] = []
        self._listeners: list[TlsListener] = []
        self._ports: list[int] = []

    def route(self, api: Api[Any, Any], handler: Handler) -> None:
        if api.key not in self.registry:
            self.registry.add(api)
        self._handlers[api.key] = handler

    async def start(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        tls: ssl.SSLContext | None = None,
        plaintext_too: bool = False,
    ) -> int:
        """Listen on ``host:port`` (0 picks a free port); return the bound port.

        With ``tls`` the port takes TLS connections, and plaintext ones as well if
        ``plaintext_too``. A server may listen on several ports; :attr:`port` is the first.
        """
        loop = asyncio.get_running_loop()
        if tls is None:
            server = await loop.create_server(lambda: _ServerProtocol(self), host, port)
            self._servers.append(server)
            bound = int(server.sockets[0].getsockname()[1])
        else:

            async def accept_tls(sock: socket.socket, peer: str) -> None:
                await listener.accept_tls(sock, peer, lambda: _ServerProtocol(self))

            listener = TlsListener(
                tls,
                on_tls=accept_tls,
                on_plain=self._accept_plain if plaintext_too else None,
                refuse_plain=self._tls_only,
                refusals=self.refusals,
                what="connection",
            )
            bound = await listener.start(host, port)
            self._listeners.append(listener)
        self._ports.append(bound)
        return bound

    @property
    def port(self) -> int:
        assert self._ports, "server not started"
        return self._ports[0]

    async def stop(self) -> None:
        servers, self._servers = self._servers, []
        listeners, self._listeners = self._listeners, []
        for server in servers:
            server.close()
        for listener in listeners:
            await listener.stop()
        for conn in list(self.connections.values()):
            conn.close()
        for server in servers:
            await server.wait_closed()

    async def _accept_plain(self, sock: socket.socket, peer: str) -> None:
        await asyncio.get_running_loop().connect_accepted_socket(
            lambda: _ServerProtocol(self), sock
        )

    def _tls_only(self, peer: str) -> bytes:
        return encode_frame(
            encode_response(
                0,
                None,
                ErrorCode.TLS_REQUIRED,
                f"server {self.name} takes TLS only on this port",
            )
        )

    # -- who may do what ----------------------------------------------------------------

    def _initial_principal(self, transport: asyncio.BaseTransport) -> Principal:
        if self.access is None:
            return ANONYMOUS
        common_name = peer_common_name(transport.get_extra_info("ssl_object"))
        return self.access.certificate(common_name) or self.access.anonymous()

    def _authorize(self, conn: Connection, api: Api[Any, Any]) -> None:
        if self.access is None or api.key in (API_VERSIONS.key, SASL_AUTHENTICATE.key):
            return
        try:
            self.access.authorize(conn.principal, api)
        except (AuthenticationFailed, NotAuthorized) as exc:
            self.refusals.refused("a request", conn.peer, exc.message)
            raise

    async def _authenticate(
        self, body: SaslAuthenticateRequest, ctx: RequestContext
    ) -> SaslAuthenticateResponse:
        assert self.access is not None
        conn = ctx.connection
        try:
            principal = self.access.authenticate(body)
        except AuthenticationFailed as exc:
            self.refusals.refused("authentication", conn.peer, exc.message)
            # the answer goes out first (this task writes it before the loop runs this)
            asyncio.get_running_loop().call_soon(conn.close)
            raise
        conn.principal = principal
        log.info("connection %s from %s authenticated as %s", conn.id, conn.peer, principal)
        return SaslAuthenticateResponse(principal=principal.name, role=principal.role or "")

    def _admit(self, conn: Connection) -> str | None:
        """Take ``conn`` in, or say why not (a connection limit)."""
        if self.max_connections and len(self.connections) >= self.max_connections:
            return (
                f"too many connections: server {self.name} takes at most "
                f"{self.max_connections} in all"
            )
        if self.max_connections_per_host:
            host = conn.peer.rpartition(":")[0]
            same = sum(1 for c in self.connections.values() if c.peer.rpartition(":")[0] == host)
            if same >= self.max_connections_per_host:
                return (
                    f"too many connections: server {self.name} takes at most "
                    f"{self.max_connections_per_host} from {host} (maxClientCnxns); raise "
                    "maxClientCnxns in its config (0: no limit) or open fewer connections "
                    "from that host"
                )
        self.connections[conn.id] = conn
        return None

    def _forget(self, conn: Connection) -> None:
        self.connections.pop(conn.id, None)

    async def _api_versions(self, body: ApiVersionsRequest, ctx: RequestContext) -> Any:
        served = [r for r in self.registry.ranges() if r.api in self._handlers]
        return ApiVersionsResponse(apis=served, server_name=self.name)
