"""What TLS and authentication cost on the ensemble's client port, side by side.

    python bench/ensemble_tls.py [--seconds S] [--in-flight K] [--writes W] [--pretty]

One standalone ensemble server (fsync on, fresh data directory) serves both a plaintext
``clientPort`` (anonymous clients may write: the anchor) and a ``secureClientPort``
(TLS 1.3 with a client certificate required, and SASL PLAIN users). For each port the
benchmark measures, from one client process:

* connection set-up: median and p99 of ``--connects`` fresh connections, each until its
  first answer (TCP; or TCP, TLS handshake, ApiVersions and SaslAuthenticate);
* synchronous write latency: ``--writes`` 100-byte appends one at a time (p50, p99);
* write throughput: ``--in-flight`` appends outstanding for ``--seconds`` seconds;
* the server's CPU seconds per thousand writes over that run.

The certificates are made at run time (``cryptography``, a test dependency). Figures
and the secure/plaintext ratios go to stdout as one JSON object; progress to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the ``bench`` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _procs
from herder.ensemble import apis
from herder.ensemble.client import EnsembleClient
from herder.wire import ApiRegistry, WireClient
from herder.wire.auth import ClientSecurity
from herder.wire.tls import PemStores

RECORD = b"x" * 100


def _pki(directory: Path) -> tuple[Path, Path, Path]:
    from tests.fixtures.pki import authority, issue

    ca = authority(directory, "bench-ca")
    return ca.path, issue(ca, directory, "bench-server"), issue(ca, directory, "bench-client")


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _connects(port: int, security: ClientSecurity | None, count: int) -> dict[str, Any]:
    times = []
    for _ in range(count):
        started = time.perf_counter()
        wire = WireClient("127.0.0.1", port, ApiRegistry(apis.CLIENT_APIS), security=security)
        await wire.request(apis.STATUS, apis.StatusRequest())
        times.append((time.perf_counter() - started) * 1000)
        await wire.close()
    return {
        "p50_ms": round(statistics.median(times), 3),
        "p99_ms": round(_percentile(times, 0.99), 3),
    }


async def _writes(
    port: int, security: ClientSecurity | None, args: argparse.Namespace, pid: int, log: str
) -> dict[str, Any]:
    async with EnsembleClient(f"127.0.0.1:{port}", security=security) as client:
        await client.create_log(log, if_absent=True)
        latencies = []
        for _ in range(args.writes):
            started = time.perf_counter()
            await client.append(log, RECORD)
            latencies.append((time.perf_counter() - started) * 1000)
        done = 0
        stop = time.monotonic() + args.seconds

        async def writer() -> None:
            nonlocal done
            while time.monotonic() < stop:
                await client.append(log, RECORD)
                done += 1

        cpu_before, started = _procs.cpu_seconds(pid), time.monotonic()
        await asyncio.gather(*(writer() for _ in range(args.in_flight)))
        elapsed, cpu = time.monotonic() - started, _procs.cpu_seconds(pid) - cpu_before
    return {
        "sync_write_p50_ms": round(statistics.median(latencies), 3),
        "sync_write_p99_ms": round(_percentile(latencies, 0.99), 3),
        "writes_per_s": round(done / elapsed),
        "server_cpu_s_per_1000_writes": round(cpu / done * 1000, 4) if done else None,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    with (
        tempfile.TemporaryDirectory(prefix="herder-bench-tls-") as tmp,
        _procs.Services(Path(tmp)) as services,
    ):
        root = Path(tmp)
        ca, server_pem, client_pem = _pki(root)
        users = root / "users.properties"
        users.write_text("bench: bench-secret, write\n")
        plain, secure = _procs.free_port(), _procs.free_port()
        config = {
            "dataDir": root / "data",
            "clientPort": plain,
            "clientPortAddress": "127.0.0.1",
            "secureClientPort": secure,
            "ssl.keyStore.location": server_pem,
            "ssl.trustStore.location": ca,
            "ssl.clientAuth": "need",
            "sasl.users.file": users,
            "enforce.auth.schemes": "sasl",
            "anonymous.access": "write",
        }
        path = root / "ensemble.properties"
        path.write_text("".join(f"{k}={v}\n" for k, v in config.items()))
        server = services.start(
            "herder-ensemble",
            [sys.executable, "-m", "herder", "ensemble", "start", "--config", str(path)],
        )
        _procs.wait_until(
            lambda: _procs.port_open(plain) and _procs.port_open(secure),
            timeout=60,
            what="the ensemble server listening",
        )
        tls = ClientSecurity(
            PemStores(
                keystore_location=str(client_pem), truststore_location=str(ca)
            ).client_context(),
            "bench",
            "bench-secret",
        )
        figures: dict[str, Any] = {"benchmark": "ensemble_tls", "settings": vars(args)}
        for name, port, security in (("plaintext", plain, None), ("tls_sasl", secure, tls)):
            _procs.progress(f"{name}: {args.connects} connections, then writes")
            figures[name] = {
                "connect": asyncio.run(_connects(port, security, args.connects)),
                **asyncio.run(_writes(port, security, args, server.pid, f"bench-{name}")),
            }
        base, secured = figures["plaintext"], figures["tls_sasl"]
        figures["ratio_tls_sasl_to_plaintext"] = {
            "connect_p50": round(secured["connect"]["p50_ms"] / base["connect"]["p50_ms"], 2),
            "sync_write_p50": round(secured["sync_write_p50_ms"] / base["sync_write_p50_ms"], 2),
            "writes_per_s": round(secured["writes_per_s"] / base["writes_per_s"], 2),
        }
        figures["machine"] = _procs.machine_info()
        return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--in-flight", type=int, default=64)
    parser.add_argument("--writes", type=int, default=1000)
    parser.add_argument("--connects", type=int, default=200)
    parser.add_argument("--pretty", action="store_true")
    args = parser.parse_args()
    _procs.check_counts(parser, args, positive=("seconds", "in_flight", "writes", "connects"))
    return _procs.run_and_emit(lambda: run(args), pretty=args.pretty)


if __name__ == "__main__":
    sys.exit(main())
