"""An asyncio client for one wire-protocol server.

Requests are pipelined: each gets a correlation id and a future, and responses resolve
their futures in whatever order the server sends them. On connecting, the client asks
the server which API versions it speaks (ApiVersions) and uses, per API, the highest
version both sides know; a request for an API the server does not speak fails at once
with UNSUPPORTED_VERSION instead of reaching the server. A lost connection fails every
request in flight with CONNECTION_CLOSED; the next request reconnects.

With a :class:`~herder.wire.auth.ClientSecurity` the connection is TLS (the server's
certificate checked against the client's truststore and its host name) and, if it names
a user, authenticated with SaslAuthenticate right after ApiVersions: a request is never
sent before the server knows who sends it.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import ssl
from typing import Any, TypeVar

import msgspec

from herder.errors import (
    AuthenticationFailed,
    ConnectionClosed,
    HerderError,
    NetworkError,
    RequestTimedOut,
    TlsHandshakeFailed,
    UnsupportedVersion,
    error_from_code,
)
from herder.wire.auth import (
    SASL_AUTHENTICATE,
    ClientSecurity,
    SaslAuthenticateRequest,
    plain_auth_bytes,
)
from herder.wire.envelope import (
    API_VERSIONS,
    Api,
    ApiRegistry,
    ApiVersionsRequest,
    decode_response_envelope,
    encode_request,
)
from herder.wire.framing import DEFAULT_MAX_FRAME_BYTES, FrameDecoder, encode_frame
from herder.wire.listener import describe_tls_failure

log = logging.getLogger(__name__)

Resp = TypeVar("Resp", bound=msgspec.Struct)


class _ClientProtocol(asyncio.Protocol):
    def __init__(self, client: WireClient) -> None:
        self._client = client
        self._decoder = FrameDecoder(client.max_frame_bytes)
        self.transport: asyncio.Transport | None = None
        self.lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.lost.done():
            self.lost.set_result(None)
        self._client._connection_lost(self, exc)

    def data_received(self, data: bytes) -> None:
        try:
            frames = self._decoder.feed(data)
            for frame in frames:
                self._client._response(decode_response_envelope(frame))
        except (HerderError, msgspec.DecodeError, msgspec.ValidationError) as exc:
            log.warning("closing connection to %s: %s", self._client.address, exc)
            assert self.transport is not None
            self.transport.close()


class WireClient:
    """A pipelined connection to one server at ``host:port``."""

    def __init__(
        self,
        host: str,
        port: int,
        registry: ApiRegistry,
        *,
        name: str = "herder-client",
        connect_timeout: float = 5.0,
        request_timeout: float = 30.0,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        security: ClientSecurity | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.registry = registry
        self.name = name
        self.connect_timeout = connect_timeout
        self.request_timeout = request_timeout
        self.max_frame_bytes = max_frame_bytes
        self.security = security or ClientSecurity()
        if self.security.authenticates:
            registry.add(SASL_AUTHENTICATE)
        #: the principal the server took us for, once authenticated
        self.principal = ""
        self.server_name = ""
        self.versions: dict[int, int] = {}
        self._protocol: _ClientProtocol | None = None
        self._pending: dict[int, tuple[int, asyncio.Future[Any]]] = {}
        self._correlation = itertools.count(1)
        self._negotiated = False
        #: why the server refused this connection, if it said so
        self._refusal: HerderError | None = None
        self._connect_lock = asyncio.Lock()
        self._closed = False

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def connected(self) -> bool:
        """Connected, with the versions negotiated (a connection still negotiating is
        not: a request sent meanwhile would find none of its APIs)."""
        return self._transport_open and self._negotiated

    @property
    def _transport_open(self) -> bool:
        p = self._protocol
        return p is not None and p.transport is not None and not p.transport.is_closing()

    async def connect(self) -> None:
        """Connect and negotiate versions, unless already connected."""
        async with self._connect_lock:
            if self.connected:
                return
            self._negotiated = False
            self._closed = False
            loop = asyncio.get_running_loop()
            tls = self.security.ssl_context
            try:
                async with asyncio.timeout(self.connect_timeout):
                    _, protocol = await loop.create_connection(
                        lambda: _ClientProtocol(self),
                        self.host,
                        self.port,
                        ssl=tls,
                        server_hostname=self.host if tls is not None else None,
                    )
            except ssl.SSLError as exc:
                raise TlsHandshakeFailed(self._tls_failure(exc)) from None
            except (OSError, TimeoutError) as exc:
                raise NetworkError(f"cannot connect to {self.address}: {exc}") from None
            self._protocol = protocol
            self.versions = {API_VERSIONS.key: 0}
            try:
                reply = await self._send(
                    API_VERSIONS, 0, ApiVersionsRequest(client_name=self.name), None
                )
            except BaseException:
                self._drop()
                raise
            self.server_name = reply.server_name
            versions: dict[int, int] = {}
            for theirs in reply.apis:
                if theirs.api not in self.registry:
                    continue
                ours = self.registry.get(theirs.api)
                top = min(ours.max_version, theirs.max_version)
                if top >= max(ours.min_version, theirs.min_version):
                    versions[theirs.api] = top
            self.versions = versions
            try:
                await self._authenticate()
            except BaseException:
                self._drop()
                raise
            self._negotiated = True

    async def _authenticate(self) -> None:
        security = self.security
        if security.user is None:
            return
        if SASL_AUTHENTICATE.key not in self.versions:
            raise AuthenticationFailed(
                f"{self.address} authenticates no users (it has no enforce.auth.* settings): "
                "connect without a user and password"
            )
        reply = await self._send(
            SASL_AUTHENTICATE,
            0,
            SaslAuthenticateRequest(
                auth_bytes=plain_auth_bytes(security.user, security.password or "")
            ),
            None,
        )
        self.principal = reply.principal

    async def request(
        self,
        api: Api[Any, Resp],
        body: msgspec.Struct,
        *,
        timeout: float | None = None,
        version: int | None = None,
    ) -> Resp:
        """Send ``body`` as ``api`` and wait for the matching response body.

        Raises the :class:`HerderError` the server answered with, :class:`RequestTimedOut`
        after ``timeout`` seconds, or :class:`ConnectionClosed` if the connection drops.
        """
        if not self.connected:
            if self._closed:
                # close() was called: whoever still holds this client must not bring
                # back a connection its owner let go (connect() opens one on purpose)
                raise ConnectionClosed(f"the connection to {self.address} was closed")
            await self.connect()
        negotiated = self.versions.get(api.key)
        if negotiated is None:
            raise UnsupportedVersion(f"{self.address} does not serve {api.name}")
        if version is not None:
            if version > negotiated or not api.supports(version):
                raise UnsupportedVersion(
                    f"{api.name} version {version} is not supported by {self.address}"
                )
            negotiated = version
        result: Resp = await self._send(api, negotiated, body, timeout)
        return result

    async def send_raw(self, api_key: int, version: int, body: msgspec.Struct) -> Any:
        """Send without version checks: for tests of how servers treat bad requests."""
        if not self.connected:
            await self.connect()
        fake = Api(api_key, f"api-{api_key}", type(body), msgspec.Struct)
        return await self._send(fake, version, body, None)

    async def _send(
        self, api: Api[Any, Any], version: int, body: msgspec.Struct, timeout: float | None
    ) -> Any:
        protocol = self._protocol
        if protocol is None or protocol.transport is None or protocol.transport.is_closing():
            raise ConnectionClosed(f"not connected to {self.address}")
        cid = next(self._correlation)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[cid] = (api.key, future)
        protocol.transport.write(encode_frame(encode_request(api.key, version, cid, body)))
        try:
            # not asyncio.wait_for: before Python 3.12 it returns the answer, and drops the
            # cancellation, when both arrive in the same turn of the loop, and a task
            # stopped that way (a log tailer told to stop) goes on forever
            async with asyncio.timeout(timeout or self.request_timeout):
                return await future
        except TimeoutError:
            raise RequestTimedOut(
                f"{api.name} to {self.address} got no answer in {timeout or self.request_timeout}s"
            ) from None
        finally:
            self._pending.pop(cid, None)

    def _response(self, envelope: Any) -> None:
        if envelope.correlation_id == 0 and envelope.error_code:
            # the server's word before it closes on us (it refused the connection)
            self._refusal = error_from_code(
                envelope.error_code, f"{self.address}: {envelope.error_message}"
            )
            return
        entry = self._pending.pop(envelope.correlation_id, None)
        if entry is None:
            return  # its request timed out and was forgotten
        api_key, future = entry
        if future.done():
            return
        if envelope.error_code:
            future.set_exception(error_from_code(envelope.error_code, envelope.error_message))
            return
        try:
            future.set_result(self.registry.decode_response(api_key, envelope.body))
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            future.set_exception(HerderError(f"malformed response from {self.address}: {exc}"))

    def _connection_lost(self, protocol: _ClientProtocol, exc: Exception | None) -> None:
        if protocol is not self._protocol:
            return
        self._protocol = None
        pending, self._pending = self._pending, {}
        refusal, self._refusal = self._refusal, None
        if refusal is None and isinstance(exc, ssl.SSLError):
            # TLS 1.3: a server that refuses our certificate says so after our handshake
            # finished, on the first read
            refusal = TlsHandshakeFailed(self._tls_failure(exc))
        elif refusal is None and self.security.ssl_context is not None and not self._negotiated:
            # a TLS 1.3 server that refuses our certificate closes without a word, right
            # after the handshake; retriable still, as a server stopping then would be
            refusal = NetworkError(
                f"{self.address} closed the connection right after the TLS handshake: it "
                "may have refused our certificate (signed by a CA it does not trust, or "
                "expired) or required one; check --cert/--key (ensemble.ssl.keystore.location)"
            )
        for _, future in pending.values():
            if not future.done():
                future.set_exception(
                    refusal or ConnectionClosed(f"connection to {self.address} was lost")
                )

    def _tls_failure(self, exc: ssl.SSLError) -> str:
        if isinstance(exc, ssl.SSLCertVerificationError):
            return (
                f"TLS to {self.address}: the server's certificate failed verification "
                f"({exc.verify_message})"
            )
        reason = describe_tls_failure(exc)
        if "not a TLS handshake" in reason:
            return f"TLS to {self.address}: the server does not speak TLS on that port"
        return f"TLS to {self.address} failed: {exc.reason or exc}"

    def _drop(self) -> None:
        if self._protocol is not None and self._protocol.transport is not None:
            self._protocol.transport.close()

    async def close(self) -> None:
        self._closed = True
        protocol = self._protocol
        if protocol is not None and protocol.transport is not None:
            protocol.transport.close()
            await asyncio.shield(protocol.lost)

    async def __aenter__(self) -> WireClient:
        await self.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
