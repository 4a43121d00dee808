"""What a worker's REST listener costs: herder's listener against uvicorn serving alone.

A worker serves its REST API through :class:`herder.runtime.rest_listener.RestListener`,
which runs the TLS handshake itself (so a refused client can be logged with its address),
names the peer while uvicorn parses its bytes, and turns Nagle's algorithm off on each
connection. The anchor is uvicorn on its own, given the same SSL context (asyncio's
handshake) or none. Both serve the same trivial ASGI app from a child process, on a
listening socket made as the worker makes its own (``socket.create_server``), so what
differs is the listener alone.

For each of the four servers (herder or uvicorn, HTTP or HTTPS), one client in this
process measures for ``--seconds``:

* ``keepalive_rps``: GETs over one kept-alive connection;
* ``new_connection_rps``: GETs each on a new connection (a TLS handshake each, on HTTPS);
* ``server_cpu_ms_per_request``: the server's CPU over both, per request.

``ratio`` is herder's figure over uvicorn's. Run from the repository root:

    .venv/bin/python bench/rest_listener.py [--seconds 5] [--pretty]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import ipaddress
import socket
import ssl
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from pathlib import Path
from typing import Any

import httpx

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _procs

Message = MutableMapping[str, Any]


async def _app(
    scope: MutableMapping[str, Any],
    receive: Callable[[], Awaitable[Message]],
    send: Callable[[Message], Awaitable[None]],
) -> None:
    body = b'{"version":"bench"}'
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def serve(listener: str, port: int, pem: str | None) -> None:
    """The child process: serve ``_app`` on ``port`` until SIGTERM."""
    import uvicorn

    from herder.runtime.refusals import RefusalLog
    from herder.runtime.rest_listener import RestListener

    context = None
    if pem is not None:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(pem)
    sock = socket.create_server(("127.0.0.1", port), backlog=2048)
    config = uvicorn.Config(_app, log_level="warning", lifespan="off", log_config=None)
    config.load()
    if listener == "herder":
        config.http_protocol_class = RestListener(context, RefusalLog()).serve(
            config.http_protocol_class
        )
    else:
        config.ssl = context
    asyncio.run(uvicorn.Server(config).serve(sockets=[sock]))


def _certificate(directory: Path) -> Path:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    path = directory / "server.pem"
    path.write_bytes(
        cert.public_bytes(serialization.Encoding.PEM)
        + key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return path


def _rate(seconds: float, request: Callable[[], httpx.Response]) -> tuple[float, int]:
    count = 0
    began = time.monotonic()
    deadline = began + seconds
    while time.monotonic() < deadline:
        reply = request()
        if reply.status_code != 200:
            raise RuntimeError(f"the server answered {reply.status_code}")
        count += 1
    return count / (time.monotonic() - began), count


def measure(
    services: _procs.Services, listener: str, scheme: str, pem: Path, seconds: float
) -> dict[str, Any]:
    port = _procs.free_port()
    args = [sys.executable, __file__, "--serve", listener, "--port", str(port)]
    if scheme == "https":
        args += ["--pem", str(pem)]
    server = services.start(f"{listener}-{scheme}", args)
    _procs.wait_until(lambda: _procs.port_open(port), timeout=30, what=f"{server.name} listening")
    url = f"{scheme}://127.0.0.1:{port}/"
    verify: ssl.SSLContext | bool = ssl.create_default_context(cafile=str(pem))
    # the client's own Nagle delay would stall each kept-alive request ~40 ms
    nodelay = [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]
    transport = httpx.HTTPTransport(verify=verify, socket_options=nodelay)
    with httpx.Client(transport=transport) as client:
        client.get(url)  # warm up
        cpu_before = _procs.cpu_seconds(server.pid)
        keepalive, kept = _rate(seconds, lambda: client.get(url))
    limits = httpx.Limits(max_keepalive_connections=0)
    with httpx.Client(verify=verify, limits=limits) as client:
        fresh, new = _rate(seconds, lambda: client.get(url, headers={"connection": "close"}))
        cpu = _procs.cpu_seconds(server.pid) - cpu_before
    server.stop()
    services.started.remove(server)
    _procs.progress(f"{server.name}: {keepalive:.0f} req/s kept alive, {fresh:.0f} new")
    return {
        "keepalive_rps": round(keepalive),
        "new_connection_rps": round(fresh),
        "server_cpu_ms_per_request": round(1000 * cpu / (kept + new), 3),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    figures: dict[str, Any] = {"benchmark": "rest_listener", "seconds": args.seconds}
    with tempfile.TemporaryDirectory(prefix="herder-bench-") as work:
        directory = Path(work)
        pem = _certificate(directory)
        with _procs.Services(directory) as services:
            for scheme in ("http", "https"):
                results = {
                    listener: measure(services, listener, scheme, pem, args.seconds)
                    for listener in ("herder", "uvicorn")
                }
                figures[scheme] = {
                    **results,
                    "ratio": {
                        key: round(value / results["uvicorn"][key], 3)
                        for key, value in results["herder"].items()
                        if results["uvicorn"][key]
                    },
                }
    figures["machine"] = _procs.machine_info()
    return figures


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="per figure")
    parser.add_argument("--pretty", action="store_true")
    parser.add_argument("--serve", choices=["herder", "uvicorn"], help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--pem", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.serve is not None:
        serve(args.serve, args.port, args.pem)
        return 0
    return _procs.run_and_emit(lambda: run(args), pretty=args.pretty)


if __name__ == "__main__":
    sys.exit(main())
