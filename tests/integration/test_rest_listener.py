"""The REST listener on real sockets, in this process: uvicorn behind herder's TLS
handshake, with a short handshake timeout so a silent client is dropped quickly."""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from herder.runtime import rest_listener
from herder.runtime.refusals import RefusalLog
from herder.runtime.rest_listener import RestListener
from tests.fixtures.pki import make_pki

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

Message = MutableMapping[str, Any]


async def _app(
    scope: MutableMapping[str, Any],
    receive: Callable[[], Awaitable[Message]],
    send: Callable[[Message], Awaitable[None]],
) -> None:
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]}
    )
    await send({"type": "http.response.body", "body": b"ok"})


@asynccontextmanager
async def _serving(
    context: ssl.SSLContext | None,
) -> AsyncIterator[tuple[int, RestListener]]:
    listening = socket.create_server(("127.0.0.1", 0))
    config = uvicorn.Config(_app, log_level="warning", lifespan="off", log_config=None)
    config.load()
    listener = RestListener(context, RefusalLog())
    config.http_protocol_class = listener.serve(config.http_protocol_class)
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve(sockets=[listening]))
    try:
        await _poll(lambda: server.started, "the server to start")
        yield listening.getsockname()[1], listener
    finally:
        server.should_exit = True
        listener.abort()
        await asyncio.wait_for(serving, 10)


async def _poll(condition: Callable[[], object], what: str, timeout: float = 10) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


@pytest.fixture
def pem(tmp_path: Path) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """The server's SSL context and a client's that trusts it."""
    pki = make_pki(tmp_path / "pki")
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(str(pki.worker), password="keypass")
    return server, ssl.create_default_context(cafile=str(pki.ca.path))


def test_a_silent_client_is_dropped_after_the_handshake_timeout_and_a_probe_quietly(
    pem: tuple[ssl.SSLContext, ssl.SSLContext],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(rest_listener, "HANDSHAKE_TIMEOUT_S", 0.5)
    caplog.set_level(logging.DEBUG, logger="herder.runtime.refusals")

    async def scenario() -> None:
        async with _serving(pem[0]) as (port, listener):
            _, silent = await asyncio.open_connection("127.0.0.1", port)
            silent_port = silent.get_extra_info("sockname")[1]
            _, probe = await asyncio.open_connection("127.0.0.1", port)
            probe.close()
            await _poll(lambda: not listener.connections, "both connections to be dropped")
            reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=pem[1])
            writer.write(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            assert (await reader.read()).startswith(b"HTTP/1.1 200 ")
            silent.close()
            writer.close()
            lines = [(r.levelname, r.getMessage()) for r in caplog.records]
            assert (
                "WARNING",
                f"REST client 127.0.0.1:{silent_port} refused: no TLS handshake within 0.5 s",
            ) in lines
            assert [level for level, message in lines if "before the TLS" in message] == ["DEBUG"]

    asyncio.run(scenario())


def test_stopping_drops_a_tls_connection_whose_transport_ignores_abort(
    pem: tuple[ssl.SSLContext, ssl.SSLContext],
) -> None:
    def request(port: int) -> ssl.SSLSocket:
        """An idle keep-alive client: it reads its answer, then nothing (so it never
        answers the worker's close_notify)."""
        client = pem[1].wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=10),
                                    server_hostname="127.0.0.1")  # fmt: skip
        client.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = b""
        while not answer.endswith(b"ok"):
            answer += client.recv(4096)
        assert answer.startswith(b"HTTP/1.1 200 ")
        return client

    async def scenario() -> None:
        async with _serving(pem[0]) as (port, listener):
            client = await asyncio.to_thread(request, port)
            (connection,) = listener.connections
            tls = connection.inner.transport  # type: ignore[attr-defined]
            # closed twice, asyncio's TLS transport forgets its connection: abort() on it
            # does nothing, and the connection waits for the client's close_notify
            tls.close()
            tls.close()
            tls.abort()
            assert listener.connections == {connection}
            listener.abort()
            await _poll(lambda: not listener.connections, "the connection to be dropped")
            client.close()

    asyncio.run(scenario())


def test_connections_send_each_write_at_once(pem: tuple[ssl.SSLContext, ssl.SSLContext]) -> None:
    """Nagle's algorithm off, or a kept-alive request's body waits for a delayed ACK."""

    async def scenario() -> None:
        for context in (None, pem[0]):
            async with _serving(context) as (port, listener):
                _, writer = await asyncio.open_connection("127.0.0.1", port)
                await _poll(lambda: listener.connections, "the connection")
                (connection,) = listener.connections
                sock = connection._socket.get_extra_info("socket")  # type: ignore[union-attr]
                assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
                writer.close()

    asyncio.run(scenario())
