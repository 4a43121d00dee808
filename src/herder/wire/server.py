"""An asyncio server for the wire protocol: many connections, many requests in flight.

Each request runs as its own task, so a slow handler never holds up the requests behind
it on the same connection and responses go out in the order handlers finish (the
correlation id pairs them up). A connection that breaks the protocol at the frame level
(a frame over the limit, bytes that are not an envelope) is closed with a logged reason;
a well-framed request the server cannot serve (unknown api, unsupported version, a body
of the wrong shape) is answered with an error and the connection carries on. Neither
touches any other connection.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from herder.errors import (
    ErrorCode,
    HerderError,
    ProtocolError,
    UnknownApi,
    UnsupportedVersion,
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

    # -- asyncio.Protocol -------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        peername = transport.get_extra_info("peername")
        peer = f"{peername[0]}:{peername[1]}" if peername else "?"
        self._conn = Connection(next(_connection_ids), peer, _transport=transport)
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
    ) -> None:
        self.registry = registry
        self.name = name
        self.max_frame_bytes = max_frame_bytes
        self.max_in_flight = max_in_flight
        self.max_connections = max_connections
        self.max_connections_per_host = max_connections_per_host
        self.connections: dict[int, Connection] = {}
        self._handlers: dict[int, Handler] = {API_VERSIONS.key: self._api_versions}
        self._server: asyncio.Server | None = None

    def route(self, api: Api[Any, Any], handler: Handler) -> None:
        if api.key not in self.registry:
            self.registry.add(api)
        self._handlers[api.key] = handler

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        """Listen on ``host:port`` (0 picks a free port); return the bound port."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _ServerProtocol(self), host, port)
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def port(self) -> int:
        assert self._server is not None, "server not started"
        return int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        if self._server is None:
            return
        self._server.close()
        for conn in list(self.connections.values()):
            conn.close()
        await self._server.wait_closed()
        self._server = None

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
