"""TLS listeners and authentication at the wire level, in one process on real sockets:
one port taking both TLS and plaintext (port unification), a TLS-only port refusing
plaintext in words the client reads, principals from passwords and certificates, and
refused connections that leave nothing behind."""

from __future__ import annotations

import asyncio
import ssl

import pytest

from herder.errors import AuthenticationFailed, NotAuthorized, TlsHandshakeFailed, TlsRequired
from herder.wire import ApiRegistry, RequestContext, WireClient, WireServer
from herder.wire.auth import AccessPolicy, ClientSecurity, Users
from herder.wire.envelope import Api
from herder.wire.tls import PemStores
from tests.fixtures.pki import Pki
from tests.wire.apis import ECHO, EchoRequest, EchoResponse

pytestmark = pytest.mark.unit

#: the echo API, declared as a write
ECHO_WRITE: Api[EchoRequest, EchoResponse] = Api(
    ECHO.key + 1, "EchoWrite", EchoRequest, EchoResponse, writes=True
)


async def whoami(body: EchoRequest, ctx: RequestContext) -> EchoResponse:
    return EchoResponse(payload=ctx.connection.principal.name.encode())


def server_tls(pki: Pki, verify: ssl.VerifyMode = ssl.CERT_OPTIONAL) -> ssl.SSLContext:
    return PemStores(
        keystore_location=str(pki.issue("wire-server")), truststore_location=str(pki.ca.path)
    ).server_context(verify)


def client_tls(pki: Pki, cert: bool = False) -> ssl.SSLContext:
    return PemStores(
        keystore_location=str(pki.client) if cert else None, truststore_location=str(pki.ca.path)
    ).client_context()


async def ask(port: int, security: ClientSecurity | None, api: Api = ECHO) -> bytes:  # type: ignore[type-arg]
    client = WireClient("127.0.0.1", port, ApiRegistry([ECHO, ECHO_WRITE]), security=security)
    try:
        reply = await client.request(api, EchoRequest(payload=b""))
        return bytes(reply.payload)
    finally:
        await client.close()


async def test_one_port_takes_tls_and_plaintext(pki: Pki) -> None:
    server = WireServer(ApiRegistry())
    server.route(ECHO, whoami)
    port = await server.start("127.0.0.1", 0, tls=server_tls(pki), plaintext_too=True)
    only_tls = await server.start("127.0.0.1", 0, tls=server_tls(pki))
    try:
        assert await ask(port, None) == b"anonymous"
        assert await ask(port, ClientSecurity(client_tls(pki))) == b"anonymous"
        assert await ask(only_tls, ClientSecurity(client_tls(pki))) == b"anonymous"
        with pytest.raises(TlsRequired, match="TLS only"):
            await ask(only_tls, None)
        with pytest.raises(TlsHandshakeFailed, match="verification"):
            await ask(port, ClientSecurity(client_tls(pki).__class__(ssl.PROTOCOL_TLS_CLIENT)))
        await asyncio.sleep(0)
        assert not server.connections  # every refused or finished connection is gone
    finally:
        await server.stop()


async def test_principals_from_passwords_and_certificates(pki: Pki) -> None:
    users = Users.parse("w: pw, write\nr: pr, read\n", "users")
    policy = AccessPolicy(
        enforce=True,
        schemes=frozenset({"sasl", "x509"}),
        users=users,
        x509_writers=frozenset({"client"}),
        anonymous_access="none",
    )
    server = WireServer(ApiRegistry(), access=policy)
    server.route(ECHO, whoami)
    server.route(ECHO_WRITE, whoami)
    port = await server.start("127.0.0.1", 0, tls=server_tls(pki))
    try:
        assert await ask(port, ClientSecurity(client_tls(pki), "w", "pw"), ECHO_WRITE) == b"w"
        assert await ask(port, ClientSecurity(client_tls(pki, cert=True)), ECHO_WRITE) == b"client"
        # a password replaces the certificate's principal
        reader = ClientSecurity(client_tls(pki, cert=True), "r", "pr")
        assert await ask(port, reader) == b"r"
        with pytest.raises(NotAuthorized, match="may only read"):
            await ask(port, reader, ECHO_WRITE)
        with pytest.raises(AuthenticationFailed, match="requires authentication"):
            await ask(port, ClientSecurity(client_tls(pki)))
        with pytest.raises(AuthenticationFailed, match="wrong user or password"):
            await ask(port, ClientSecurity(client_tls(pki), "w", "nope"))
    finally:
        await server.stop()


async def test_a_server_without_users_says_so(pki: Pki) -> None:
    server = WireServer(ApiRegistry())
    server.route(ECHO, whoami)
    port = await server.start("127.0.0.1", 0)
    try:
        with pytest.raises(AuthenticationFailed, match="authenticates no users"):
            await ask(port, ClientSecurity(None, "w", "pw"))
    finally:
        await server.stop()


def test_each_refusal_is_logged_once_per_host_and_reason(caplog: pytest.LogCaptureFixture) -> None:
    import logging

    from herder.wire.listener import RefusalLog

    refusals = RefusalLog(logging.getLogger("test.refusals"))
    with caplog.at_level(logging.DEBUG, logger="test.refusals"):
        for port in (1000, 1001, 1002):
            refusals.refused("connection", f"10.0.0.1:{port}", "bad certificate")
        refusals.refused("connection", "10.0.0.2:1000", "bad certificate")
        refusals.refused("connection", "10.0.0.1:1003", "wrong password")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        "refusing connection from 10.0.0.1:1000: bad certificate",
        "refusing connection from 10.0.0.2:1000: bad certificate",
        "refusing connection from 10.0.0.1:1003: wrong password",
    ]
    assert sum(r.levelno == logging.DEBUG for r in caplog.records) == 2
