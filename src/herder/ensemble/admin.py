"""An ensemble server's admin HTTP port: ZooKeeper's ``mntr`` and Prometheus metrics.

ZooKeeper serves its four-letter words over HTTP on ``admin.serverPort``
(``/commands/mntr``, ``/commands/ruok`` …) and, with the Prometheus metrics provider,
``/metrics`` on ``metricsProvider.httpPort``. An ensemble server does the same under
those names; each port, when configured, answers all three paths:

* ``GET /commands/mntr``: a JSON object of ZooKeeper's ``mntr`` keys that apply here
  (``zk_server_state``, ``zk_avg_latency``, ``zk_max_latency``, ``zk_min_latency``,
  ``zk_packets_received``, ``zk_packets_sent``, ``zk_num_alive_connections``,
  ``zk_outstanding_requests``, ``zk_fsync_threshold_exceed_count``,
  ``zk_global_sessions``, ``zk_uptime``, ``zk_quorum_size``, ``zk_open_file_descriptor_count``
  and, on the leader, ``zk_learners``, ``zk_followers``, ``zk_synced_followers``,
  ``zk_synced_observers``, ``zk_pending_syncs``, ``zk_last_proposal_size``,
  ``zk_min_proposal_size``, ``zk_max_proposal_size``), plus herder's own
  (``herder_epoch``, ``herder_last_zxid``, ``herder_logs``, ``herder_last_sync``);
* ``GET /metrics``: the same numbers in Prometheus's text format, under the same names;
  ``zk_server_state`` (text) is ``zk_server_state{state="leader"} 1``; services hosted
  by the server add theirs (the group coordinator its groups by state and rebalance
  times), then the process's ``process_*``;
* ``GET /commands/ruok``: ``{"error": null}`` while the server runs, as ZooKeeper's.

Latencies are of client requests the server answers itself, from arrival to answer, in
milliseconds, over the server's life; long polls (a read or a wait with ``wait_ms``)
are left out, as they wait on purpose. The HTTP server is a few lines of asyncio: GET
only, one request per connection.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from prometheus_client import CollectorRegistry, PlatformCollector, ProcessCollector
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from herder import __version__
from herder.ensemble.config import EnsembleConfig
from herder.ensemble.replica import ZabReplica
from herder.ensemble.state import StateMachine
from herder.errors import HerderError
from herder.wire import WireServer

__all__ = ["AdminServer", "MetricSample", "MetricsSource", "RequestStats", "mntr"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class MetricSample:
    """One number for ``/metrics``: its Prometheus name, labels and help text."""

    name: str
    value: float
    labels: tuple[tuple[str, str], ...] = ()
    documentation: str = ""


@runtime_checkable
class MetricsSource(Protocol):
    """A hosted service with metrics of its own (the group coordinator)."""

    def metric_samples(self) -> list[MetricSample]: ...


class EnsembleServer(Protocol):
    """What the admin port reads of its server (:class:`~herder.ensemble.server.EnsembleServer`)."""

    config: EnsembleConfig
    role: str
    epoch: int
    started_at: float
    request_stats: RequestStats
    wire: WireServer
    replica: ZabReplica | None
    services: list[Any]

    @property
    def pipeline(self) -> Any: ...

    @property
    def state(self) -> StateMachine: ...

    @property
    def fsync_threshold_exceeded(self) -> int: ...


class RequestStats:
    """Client requests answered: how many, and how long they took (ms)."""

    def __init__(self) -> None:
        self.received = 0
        self.sent = 0
        self.count = 0
        self.total_ms = 0.0
        self.min_ms: float | None = None
        self.max_ms = 0.0
        #: ``sync`` requests waiting for their no-op to come back through the leader
        self.pending_syncs = 0

    def timed(self, handler: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
        """``handler``, counted and timed (a long poll counted but not timed)."""

        async def run(req: Any, ctx: Any) -> Any:
            self.received += 1
            began = time.monotonic()
            try:
                return await handler(req, ctx)
            finally:
                self.sent += 1
                if not getattr(req, "wait_ms", 0):
                    took = (time.monotonic() - began) * 1000
                    self.count += 1
                    self.total_ms += took
                    self.min_ms = took if self.min_ms is None else min(self.min_ms, took)
                    self.max_ms = max(self.max_ms, took)

        return run

    @property
    def avg_ms(self) -> float:
        return self.total_ms / self.count if self.count else 0.0


def _open_fds() -> int | None:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return None


def mntr(server: EnsembleServer) -> dict[str, int | float | str]:
    """ZooKeeper's ``mntr`` of ``server`` (see the module docstring)."""
    stats = server.request_stats
    cfg = server.config
    out: dict[str, int | float | str] = {
        "zk_version": f"herder-{__version__}",
        "zk_server_state": server.role,
        "zk_avg_latency": round(stats.avg_ms, 3),
        "zk_max_latency": round(stats.max_ms, 3),
        "zk_min_latency": round(stats.min_ms or 0.0, 3),
        "zk_packets_received": stats.received,
        "zk_packets_sent": stats.sent,
        "zk_num_alive_connections": len(server.wire.connections),
        "zk_outstanding_requests": server.pipeline.outstanding if server.pipeline else 0,
        "zk_global_sessions": len(server.state.sessions()),
        "zk_uptime": int((time.monotonic() - server.started_at) * 1000),
        "zk_quorum_size": sum(1 for p in cfg.peers.values() if not p.observer) or 1,
        "zk_fsync_threshold_exceed_count": server.fsync_threshold_exceeded,
        "herder_epoch": server.epoch,
        "herder_last_zxid": server.state.last_zxid,
        "herder_logs": len(server.state.logs()),
    }
    fds = _open_fds()
    if fds is not None:
        out["zk_open_file_descriptor_count"] = fds
    replica = server.replica
    if replica is not None:
        out["herder_last_sync"] = replica.last_sync or "none"
        leader = replica.peer.leading
        if leader is not None and replica.leading:
            counts = leader.learner_counts()
            out["zk_learners"] = counts["learners"]
            out["zk_followers"] = counts["followers"]
            out["zk_synced_followers"] = counts["synced_followers"]
            out["zk_synced_observers"] = counts["synced_observers"]
            out["zk_pending_syncs"] = stats.pending_syncs
            last, smallest, largest = leader.proposal_sizes or (0, 0, 0)
            out["zk_last_proposal_size"] = last
            out["zk_min_proposal_size"] = smallest
            out["zk_max_proposal_size"] = largest
    elif server.role == "standalone":
        out["zk_pending_syncs"] = stats.pending_syncs
    return out


_TEXT = {"zk_version", "zk_server_state", "herder_last_sync"}
_COUNTERS = {"zk_packets_received", "zk_packets_sent", "zk_fsync_threshold_exceed_count"}


class _Once(Collector):
    def __init__(self, metrics: list[Metric]) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        yield from self._metrics


def _families(values: dict[str, int | float | str], more: Iterable[MetricSample]) -> list[Metric]:
    metrics: list[Metric] = []
    for name, value in values.items():
        if name in _TEXT:
            label = name.removeprefix("zk_").removeprefix("herder_")
            family = GaugeMetricFamily(name, f"mntr {name}", labels=[label.split("_")[-1]])
            family.add_metric([str(value)], 1.0)
        elif name in _COUNTERS:
            # a counter's samples end in _total in Prometheus's format; mntr's name stays
            # the family's, so a query by the mntr name finds it
            family = GaugeMetricFamily(name, f"mntr {name} (a count since start)")
            family.add_metric([], float(value))
        else:
            family = GaugeMetricFamily(name, f"mntr {name}")
            family.add_metric([], float(value))
        metrics.append(family)
    grouped: dict[str, Metric] = {}
    for sample in more:
        known = grouped.get(sample.name)
        if known is None:
            labels = [k for k, _ in sample.labels]
            if sample.name.endswith("_total"):
                known = CounterMetricFamily(sample.name, sample.documentation, labels=labels)
            else:
                known = GaugeMetricFamily(sample.name, sample.documentation, labels=labels)
            grouped[sample.name] = known
        suffix = "_total" if isinstance(known, CounterMetricFamily) else ""
        known.add_sample(known.name + suffix, dict(sample.labels), sample.value)
    return metrics + list(grouped.values())


def prometheus_text(server: EnsembleServer) -> bytes:
    """``/metrics`` of ``server``."""
    more: list[MetricSample] = []
    for service in server.services:
        if isinstance(service, MetricsSource):
            try:
                more += service.metric_samples()
            except Exception:
                log.exception("a hosted service's metrics failed; left out")
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Once(_families(mntr(server), more)))
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    return generate_latest(registry)


class AdminServer:
    """The HTTP listener of one admin or metrics port of ``server``."""

    def __init__(self, server: EnsembleServer, host: str, port: int, what: str) -> None:
        self.server = server
        self.host = host
        self.port = port
        self.what = what
        self._listener: asyncio.Server | None = None

    async def start(self) -> int:
        try:
            self._listener = await asyncio.start_server(self._serve, self.host, self.port)
        except OSError as exc:
            raise HerderError(
                f"cannot serve the {self.what} on {self.host}:{self.port}: {exc.strerror}; "
                "choose another port or stop what uses it"
            ) from None
        self.port = self._listener.sockets[0].getsockname()[1]
        log.info(
            "server %d serving its %s on http://%s:%d (/metrics, /commands/mntr)",
            self.server.config.server_id,
            self.what,
            self.host,
            self.port,
        )
        return self.port

    async def stop(self) -> None:
        if self._listener is not None:
            self._listener.close()
            await self._listener.wait_closed()

    def answer(self, path: str) -> tuple[int, str, bytes]:
        """(status, content type, body) for ``GET path``."""
        path = path.split("?", 1)[0].rstrip("/") or "/"
        if path == "/metrics":
            return 200, CONTENT_TYPE_LATEST, prometheus_text(self.server)
        if path in ("/commands/mntr", "/commands/monitor"):
            body = {**mntr(self.server), "command": "monitor", "error": None}
            return 200, "application/json", json.dumps(body).encode()
        if path == "/commands/ruok":
            return 200, "application/json", b'{"command": "ruok", "error": null}'
        if path in ("/", "/commands"):
            index = {"commands": ["mntr", "ruok"], "metrics": "/metrics", "error": None}
            return 200, "application/json", json.dumps(index).encode()
        error = {"error": f"no such path {path}: try /metrics or /commands/mntr"}
        return 404, "application/json", json.dumps(error).encode()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(10):
                request = await reader.readuntil(b"\r\n\r\n")
            method, _, rest = request.decode("latin-1").partition(" ")
            path = rest.split(" ", 1)[0]
            if method not in ("GET", "HEAD"):
                status, kind, body = 405, "text/plain", b"GET only\n"
            else:
                status, kind, body = self.answer(path)
            reason = {200: "OK", 404: "Not Found", 405: "Method Not Allowed"}[status]
            head = (
                f"HTTP/1.1 {status} {reason}\r\nContent-Type: {kind}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            )
            writer.write(head.encode() + (body if method == "GET" else b""))
            await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError, UnicodeError) as exc:
            # a client that sent no request in time, hung up, or sent no HTTP: its own
            # affair, and nothing to answer
            log.debug(
                "admin HTTP request from %s dropped: %r", writer.get_extra_info("peername"), exc
            )
        except Exception:
            log.exception("admin HTTP request failed")
        finally:
            writer.close()
