"""Benchmark herder's ensemble against Apache ZooKeeper 3.8, side by side in one run.

    python bench/ensemble.py [--servers N] [--seconds S] [--in-flight K] [--skip-zookeeper]

For each system the benchmark starts its own server (or ensemble of ``--servers``
servers) on 127.0.0.1 with fresh data directories and fsync on, then measures:

* synchronous write latency: one client, one 100-byte write at a time (median, p99);
* write throughput: client processes, each keeping ``--in-flight`` 100-byte writes
  outstanding, added one at a time until the server, not the clients, is the limit —
  its CPU reaches 90% of one core (herder's server is one Python event loop), or one
  more client process raises writes/s by less than 10% — or ``--max-clients`` is
  reached (then the clients were the limit);
* read throughput, with the client-process count that wrote fastest;
* the server's CPU seconds per thousand writes, from ``/proc/<pid>/stat`` (summed over
  every server of an ensemble).

With several servers it also measures failover — the leader killed with SIGKILL under
write load, seconds until a write is acknowledged under the new leader, over
``--failover-runs`` runs (the killed server restarted and rejoined after each) — and
catch-up: a follower stopped, ``--catchup-writes`` writes made, the follower restarted,
seconds until it has applied the leader's last zxid, and which sync (DIFF, TRUNC, SNAP)
it used.

herder writes are ``append`` to one log and reads are ``read(log, random offset,
max_records=1)``. ZooKeeper writes are asynchronous ``create`` of sequential znodes under
one parent (the closest thing it has to an append), reads are asynchronous ``get`` of
random znodes among those, and asynchronous ``set`` is measured for orientation; all go
through kazoo, with the same client-process counts as herder and the same number in
flight. The figures and the herder/ZooKeeper ratios are printed as one JSON object on
stdout; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import logging
import math
import multiprocessing
import multiprocessing.context
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the ``bench`` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _procs
from herder import __version__ as herder_version
from herder.ensemble.client import EnsembleClient, server_status
from herder.ensemble.state import RESULT_WINDOW
from herder.ensemble.txn import Append
from herder.errors import HerderError

HERDER_LOG = "bench"
ZK_PARENT = "/herder-bench/writes"
#: sequential children are named prefix + a 10-digit counter starting at 0
ZK_CHILD_PREFIX = "w-"
ZK_JAR = Path("/usr/share/java/zookeeper.jar")
ZK_STANDALONE_MAIN = "org.apache.zookeeper.server.ZooKeeperServerMain"
ZK_QUORUM_MAIN = "org.apache.zookeeper.server.quorum.QuorumPeerMain"
#: an slf4j binding, so a replicated server logs how it synchronised with its leader
ZK_LOG_BINDING = Path("/usr/share/java/slf4j-simple.jar")
#: the heap ZooKeeper's own zkServer.sh gives a server by default
ZK_JVM_OPTIONS = ("-Xmx1000m",)
TICK_TIME_MS = 2000

READY_TIMEOUT_S = 60.0
SERVER_CPU_LIMIT = 0.90
MIN_GAIN = 0.10
#: other processes' CPU (in % of one core) above which a run is flagged as not representative
OTHER_CPU_WARNING_PCT = 25.0

#: writes each failover client keeps in flight to its server
FAILOVER_IN_FLIGHT = 32
#: load that runs before the leader is killed
FAILOVER_LOAD_S = 1.0
FAILOVER_TIMEOUT_S = 60.0
#: both systems' failover clients reconnect this often (herder's backoff, kazoo's retry),
#: so the figure is the servers' failover, not a client library's backoff policy
FAILOVER_RETRY_MS = 50
FAILOVER_RETRY_MAX_MS = 100
FAILED_WRITE_PAUSE_S = 0.01
#: how often a catching-up server's zxid is polled
CATCHUP_POLL_S = 0.02


class UnsupportedSetup(Exception):
    """The benchmark cannot run as asked; the message says why and what to do."""


# -- the ensemble under test ------------------------------------------------------------


@dataclass(frozen=True)
class ServerSlot:
    """One server of an ensemble: its id and the ports it listens on (all 127.0.0.1)."""

    server_id: int
    client_port: int
    quorum_port: int
    election_port: int


def check_servers(servers: int) -> None:
    """Refuse an ensemble size that cannot show what the benchmark measures."""
    if servers < 1:
        raise UnsupportedSetup(f"--servers {servers}: an ensemble needs at least one server")
    if servers == 2:
        raise UnsupportedSetup(
            "--servers 2: an ensemble of two loses its quorum with either server, so there is "
            "no failover or catch-up to measure; use 1 (standalone) or 3 or more"
        )


def plan_ensemble(servers: int) -> list[ServerSlot]:
    """Ids and free ports on 127.0.0.1 for ``servers`` servers."""
    check_servers(servers)
    return [
        ServerSlot(i, _procs.free_port(), _procs.free_port(), _procs.free_port())
        for i in range(1, servers + 1)
    ]


def bootstrap(slots: Sequence[ServerSlot]) -> str:
    """The client connect string for ``slots``: ``127.0.0.1:p1,127.0.0.1:p2,…``."""
    return ",".join(f"127.0.0.1:{s.client_port}" for s in slots)


def herder_properties(slot: ServerSlot, slots: Sequence[ServerSlot], data_dir: Path) -> str:
    """The ``herder ensemble start`` config of ``slot`` (fsync is always on)."""
    lines = [
        f"dataDir={data_dir}",
        f"clientPort={slot.client_port}",
        "clientPortAddress=127.0.0.1",
        f"tickTime={TICK_TIME_MS}",
    ]
    if len(slots) > 1:
        lines.append(f"server.id={slot.server_id}")
        lines += [
            f"server.{s.server_id}=127.0.0.1:{s.quorum_port}:{s.election_port}"
            f";127.0.0.1:{s.client_port}"
            for s in slots
        ]
    return "\n".join(lines) + "\n"


def zookeeper_cfg(slot: ServerSlot, slots: Sequence[ServerSlot], data_dir: Path) -> str:
    """The ``zoo.cfg`` of ``slot``: fsync forced, admin server off, 127.0.0.1 only."""
    lines = [
        f"dataDir={data_dir}",
        f"clientPort={slot.client_port}",
        "clientPortAddress=127.0.0.1",
        f"tickTime={TICK_TIME_MS}",
        "forceSync=yes",
        "admin.enableServer=false",
    ]
    if len(slots) > 1:
        # srvr (the leader, the zxid) is the only four-letter word the benchmark uses
        lines += ["initLimit=10", "syncLimit=5", "4lw.commands.whitelist=srvr"]
        lines += [
            f"server.{s.server_id}=127.0.0.1:{s.quorum_port}:{s.election_port}" for s in slots
        ]
    return "\n".join(lines) + "\n"


# -- client processes -------------------------------------------------------------------


@dataclass(frozen=True)
class LoadJob:
    """What one client process does: keep ``in_flight`` operations outstanding."""

    system: str
    op: str
    address: str
    in_flight: int
    record_bytes: int
    worker: int
    seed: int


@dataclass(frozen=True)
class LatencyJob:
    """One client, one write at a time: ``warmup`` untimed writes, then ``writes`` timed."""

    system: str
    address: str
    record_bytes: int
    warmup: int
    writes: int
    seed: int


@dataclass(frozen=True)
class FailoverJob:
    """Writes through one client per server, each pinned to it, while the leader is killed.

    It reports when a write was first acknowledged in an epoch after ``old_epoch``: that
    is the first write through the survivors, under the new leader.
    """

    system: str
    addresses: tuple[str, ...]
    old_epoch: int
    in_flight: int
    record_bytes: int
    seed: int
    timeout: float
    worker: int = 0


@dataclass(frozen=True)
class CountJob:
    """Make exactly ``writes`` writes, ``in_flight`` outstanding; report how long it took."""

    system: str
    address: str
    writes: int
    in_flight: int
    record_bytes: int
    worker: int
    seed: int


Job = LoadJob | LatencyJob | FailoverJob | CountJob


def record_value(record_bytes: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(record_bytes)


def client_process(job: Job, window: _procs.Window | None, results: Any) -> None:
    """A spawned client process: run ``job`` and put its outcome on ``results``."""
    # Ctrl-C is the benchmark's to handle: it stops the client processes it started.
    # (Started under children_ignore_sigint, so this only restates it.)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # kazoo logs every refused reconnect while a server is down, which failover runs expect
    logging.getLogger("kazoo").setLevel(logging.CRITICAL)
    worker = 0 if isinstance(job, LatencyJob) else job.worker

    def ready() -> None:
        results.put(("ready", worker, None))

    try:
        if isinstance(job, LatencyJob):
            if job.system == "herder":
                outcome = asyncio.run(_herder_latency(job))
            else:
                outcome = _zookeeper_latency(job)
        elif isinstance(job, FailoverJob):
            if job.system == "herder":
                outcome = asyncio.run(_herder_failover(job, ready))
            else:
                outcome = _zookeeper_failover(job, ready)
        elif isinstance(job, CountJob):
            if job.system == "herder":
                outcome = asyncio.run(_herder_count(job, ready))
            else:
                outcome = _zookeeper_count(job, ready)
        else:
            assert window is not None
            if job.system == "herder":
                outcome = asyncio.run(_herder_load(job, window, ready))
            else:
                outcome = _zookeeper_load(job, window, ready)
    except BaseException as exc:
        results.put(("failed", worker, f"{type(exc).__name__}: {exc}"))
        return
    results.put(("done", worker, outcome))


async def _herder_latency(job: LatencyJob) -> dict[str, Any]:
    value = record_value(job.record_bytes, job.seed)
    async with EnsembleClient(job.address, name="bench-latency") as client:
        for _ in range(job.warmup):
            await client.append(HERDER_LOG, value)
        samples = []
        for _ in range(job.writes):
            began = time.perf_counter_ns()
            await client.append(HERDER_LOG, value)
            samples.append(time.perf_counter_ns() - began)
    return _procs.latency_summary_ms(samples)


async def _herder_load(
    job: LoadJob, window: _procs.Window, ready: Callable[[], None]
) -> dict[str, Any]:
    # One session may have RESULT_WINDOW writes in flight, so a process that wants more
    # opens several sessions and spreads its in-flight slots over them.
    sessions = max(1, math.ceil(job.in_flight / RESULT_WINDOW))
    rng = random.Random(job.seed)
    value = record_value(job.record_bytes, job.seed)
    clients: list[EnsembleClient] = []
    try:
        for i in range(sessions):
            client = EnsembleClient(job.address, name=f"bench-{job.worker}-{i}")
            clients.append(client)
            await client.start()
        if job.op == "read":
            end = (await clients[0].end_offsets([HERDER_LOG]))[HERDER_LOG]
            if end == 0:
                raise RuntimeError(f"log {HERDER_LOG!r} is empty: nothing to read")

            def operation(client: EnsembleClient) -> Awaitable[Any]:
                return client.read(HERDER_LOG, rng.randrange(end), max_records=1)
        else:

            def operation(client: EnsembleClient) -> Awaitable[Any]:
                return client.append(HERDER_LOG, value)

        ready()
        start, stop = await asyncio.to_thread(window.wait)
        tally = _procs.Tally()

        async def slot(client: EnsembleClient) -> None:
            while time.monotonic() < stop:
                try:
                    await operation(client)
                except HerderError as exc:
                    tally.failed(exc)
                else:
                    tally.completed(start, stop)

        await asyncio.gather(*(slot(clients[i % sessions]) for i in range(job.in_flight)))
        return tally.report()
    finally:
        for client in clients:
            await client.close()


async def _herder_failover(job: FailoverJob, ready: Callable[[], None]) -> dict[str, Any]:
    value = record_value(job.record_bytes, job.seed)
    write = [Append(HERDER_LOG, None, value)]
    clients: list[EnsembleClient] = []
    first_ack: dict[str, float] = {}
    acked = 0
    new_epoch = asyncio.Event()
    try:
        for address in job.addresses:
            client = EnsembleClient(
                address,
                name=f"bench-failover-{address}",
                retry_backoff_ms=FAILOVER_RETRY_MS,
                retry_backoff_max_ms=FAILOVER_RETRY_MAX_MS,
            )
            clients.append(client)
            await client.start()

        async def slot(client: EnsembleClient, address: str) -> None:
            nonlocal acked
            while not new_epoch.is_set():
                try:
                    result = await client.transact(write)
                except HerderError:
                    await asyncio.sleep(FAILED_WRITE_PAUSE_S)
                    continue
                acked += 1
                if result.zxid >> 32 > job.old_epoch:
                    first_ack.setdefault(address, time.monotonic())
                    new_epoch.set()

        tasks = [
            asyncio.create_task(slot(client, address))
            for client, address in zip(clients, job.addresses, strict=True)
            for _ in range(job.in_flight)
        ]
        ready()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(new_epoch.wait(), job.timeout)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        for client in clients:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(client.close(), 5.0)
    return _failover_outcome(first_ack, acked)


def _failover_outcome(first_ack: dict[str, float], acked: int) -> dict[str, Any]:
    first = min(first_ack.values(), default=None)
    return {
        "first_new_epoch_ack_at": first,
        "through": min(first_ack, key=first_ack.__getitem__) if first_ack else None,
        "writes_acked": acked,
    }


async def _herder_count(job: CountJob, ready: Callable[[], None]) -> dict[str, Any]:
    sessions = max(1, math.ceil(job.in_flight / RESULT_WINDOW))
    value = record_value(job.record_bytes, job.seed)
    clients: list[EnsembleClient] = []
    remaining = job.writes
    try:
        for i in range(sessions):
            client = EnsembleClient(job.address, name=f"bench-count-{job.worker}-{i}")
            clients.append(client)
            await client.start()
        ready()
        began = time.monotonic()

        async def slot(client: EnsembleClient) -> None:
            nonlocal remaining
            while remaining > 0:
                remaining -= 1
                await client.append(HERDER_LOG, value)

        await asyncio.gather(*(slot(clients[i % sessions]) for i in range(job.in_flight)))
        return {"writes": job.writes, "seconds": time.monotonic() - began}
    finally:
        for client in clients:
            await client.close()


def _kazoo(address: str, **options: Any) -> Any:
    from kazoo.client import KazooClient

    zk = KazooClient(hosts=address, timeout=30.0, **options)
    zk.start(timeout=15)
    return zk


def _zookeeper_failover(job: FailoverJob, ready: Callable[[], None]) -> dict[str, Any]:
    value = record_value(job.record_bytes, job.seed)
    path = f"{ZK_PARENT}/{ZK_CHILD_PREFIX}"
    # The same reconnect pace as herder's failover clients, so both measure the servers.
    retry = {
        "max_tries": -1,
        "delay": FAILOVER_RETRY_MS / 1000,
        "backoff": 2,
        "max_delay": FAILOVER_RETRY_MAX_MS / 1000,
    }
    clients = []
    first_ack: dict[str, float] = {}
    acked = 0
    lock = threading.Lock()
    new_epoch = threading.Event()
    try:
        for address in job.addresses:
            clients.append((address, _kazoo(address, connection_retry=retry)))
        slots = [threading.Semaphore(job.in_flight) for _ in clients]
        failures = [0] * len(clients)

        def on_done(i: int, address: str) -> Callable[[Any], None]:
            def done(result: Any) -> None:
                nonlocal acked
                if result.exception is None:
                    _, stat = result.value
                    with lock:
                        acked += 1
                        if stat.czxid >> 32 > job.old_epoch:
                            first_ack.setdefault(address, time.monotonic())
                            new_epoch.set()
                else:
                    failures[i] += 1
                slots[i].release()

            return done

        callbacks = [on_done(i, address) for i, (address, _) in enumerate(clients)]
        ready()
        deadline = time.monotonic() + job.timeout
        seen_failures = [0] * len(clients)
        paused_until = [0.0] * len(clients)
        while not new_epoch.is_set() and time.monotonic() < deadline:
            now = time.monotonic()
            issued = False
            for i, (_, zk) in enumerate(clients):
                if failures[i] != seen_failures[i]:
                    # a refused write comes back at once: do not spin on a server that is down
                    seen_failures[i] = failures[i]
                    paused_until[i] = now + FAILED_WRITE_PAUSE_S
                if now >= paused_until[i] and slots[i].acquire(blocking=False):
                    zk.create_async(path, value, sequence=True, include_data=True).rawlink(
                        callbacks[i]
                    )
                    issued = True
            if not issued:
                time.sleep(0.001)
        with lock:
            return _failover_outcome(dict(first_ack), acked)
    finally:
        for _, zk in clients:
            with contextlib.suppress(Exception):
                zk.stop()
                zk.close()


def _zookeeper_count(job: CountJob, ready: Callable[[], None]) -> dict[str, Any]:
    value = record_value(job.record_bytes, job.seed)
    path = f"{ZK_PARENT}/{ZK_CHILD_PREFIX}"
    zk = _kazoo(job.address)
    try:
        slots = threading.Semaphore(job.in_flight)
        errors: list[BaseException] = []

        def done(result: Any) -> None:
            if result.exception is not None:
                errors.append(result.exception)
            slots.release()

        ready()
        began = time.monotonic()
        for _ in range(job.writes):
            slots.acquire()
            zk.create_async(path, value, sequence=True).rawlink(done)
        for _ in range(job.in_flight):
            if not slots.acquire(timeout=60):
                raise TimeoutError("writes still unanswered after 60s")
        if errors:
            raise RuntimeError(f"{len(errors)} of {job.writes} writes failed: {errors[0]!r}")
        return {"writes": job.writes, "seconds": time.monotonic() - began}
    finally:
        zk.stop()
        zk.close()


def _zookeeper_latency(job: LatencyJob) -> dict[str, Any]:
    value = record_value(job.record_bytes, job.seed)
    path = f"{ZK_PARENT}/{ZK_CHILD_PREFIX}"
    zk = _kazoo(job.address)
    try:
        for _ in range(job.warmup):
            zk.create(path, value, sequence=True)
        samples = []
        for _ in range(job.writes):
            began = time.perf_counter_ns()
            zk.create(path, value, sequence=True)
            samples.append(time.perf_counter_ns() - began)
    finally:
        zk.stop()
        zk.close()
    return _procs.latency_summary_ms(samples)


def _zookeeper_load(
    job: LoadJob, window: _procs.Window, ready: Callable[[], None]
) -> dict[str, Any]:
    rng = random.Random(job.seed)
    value = record_value(job.record_bytes, job.seed)
    zk = _kazoo(job.address)
    try:
        children = zk.get(ZK_PARENT)[1].numChildren

        def child() -> str:
            return f"{ZK_PARENT}/{ZK_CHILD_PREFIX}{rng.randrange(children):010d}"

        if job.op == "create":
            path = f"{ZK_PARENT}/{ZK_CHILD_PREFIX}"

            def operation() -> Any:
                return zk.create_async(path, value, sequence=True)
        elif job.op == "set":

            def operation() -> Any:
                return zk.set_async(child(), value)
        else:

            def operation() -> Any:
                return zk.get_async(child())

        if job.op != "create" and children == 0:
            raise RuntimeError(f"{ZK_PARENT} has no children to {job.op}")
        ready()
        start, stop = window.wait()
        tally = _procs.Tally()
        # kazoo's asynchronous calls never push back, so a semaphore bounds what is out.
        slots = threading.Semaphore(job.in_flight)

        def done(result: Any) -> None:
            exc = result.exception
            if exc is None:
                tally.completed(start, stop)
            else:
                tally.failed(exc)
            slots.release()

        while time.monotonic() < stop:
            if slots.acquire(timeout=0.1):
                operation().rawlink(done)
        # Let what is in flight finish before the session closes under it.
        drain_until = time.monotonic() + 30
        for _ in range(job.in_flight):
            if not slots.acquire(timeout=max(0.0, drain_until - time.monotonic())):
                break
        return tally.report()
    finally:
        zk.stop()
        zk.close()


# -- measurements -----------------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    """The knobs every measurement shares."""

    seconds: float
    warmup_seconds: float
    server_warmup_seconds: float
    in_flight: int
    record_bytes: int
    max_clients: int
    sync_writes: int
    sync_warmup: int


@dataclass(frozen=True)
class Resilience:
    """What an ensemble of several servers is also put through."""

    #: times the leader is killed under load (0: none)
    failover_runs: int
    #: writes a stopped follower misses before it is restarted (0: no catch-up run)
    catchup_writes: int


def warm_up_server(
    system: str, op: str, address: str, server_pids: Sequence[int], settings: Settings
) -> None:
    """Unmeasured write load first, so a JVM has compiled its hot paths before figures count."""
    if settings.server_warmup_seconds > 0:
        _procs.progress(f"{system}: {settings.server_warmup_seconds:g}s of unmeasured writes")
        warm = replace(settings, seconds=settings.server_warmup_seconds, warmup_seconds=0.0)
        measure_load(system, op, address, 1, server_pids, warm)


def start_client(
    ctx: multiprocessing.context.SpawnContext,
    job: Any,
    window: _procs.Window | None,
    results: Any,
    name: str,
) -> multiprocessing.process.BaseProcess:
    """One client process running ``job``: a daemon that ignores Ctrl-C (we stop it)."""
    proc = ctx.Process(target=client_process, args=(job, window, results), name=name)
    proc.daemon = True
    with _procs.children_ignore_sigint():
        proc.start()
    return proc


def measure_latency(system: str, address: str, settings: Settings) -> dict[str, Any]:
    """Synchronous writes from one client process: p50/p99 in milliseconds."""
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    job = LatencyJob(
        system, address, settings.record_bytes, settings.sync_warmup, settings.sync_writes, 1
    )
    procs = []
    finished = False
    try:
        procs.append(start_client(ctx, job, None, results, f"{system}-latency"))
        outcome = _procs.collect(results, procs, "done", READY_TIMEOUT_S + settings.sync_writes)[0]
        finished = True
    finally:
        # after a failure or Ctrl-C, stop it at once rather than wait for it
        _procs.stop_processes(procs, grace=10 if finished else 0)
    return dict(outcome)


def measure_load(
    system: str,
    op: str,
    address: str,
    clients: int,
    server_pids: Sequence[int],
    settings: Settings,
) -> dict[str, Any]:
    """``clients`` processes doing ``op`` for ``settings.seconds`` after a warm-up."""
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    window = _procs.Window(ctx, timeout=READY_TIMEOUT_S * 2)
    procs = []
    finished = False
    try:
        for worker in range(clients):
            job = LoadJob(
                system, op, address, settings.in_flight, settings.record_bytes, worker, 100 + worker
            )
            procs.append(start_client(ctx, job, window, results, f"{system}-{op}-{worker}"))
        _procs.collect(results, procs, "ready", READY_TIMEOUT_S)
        start = time.monotonic() + settings.warmup_seconds
        stop = start + settings.seconds
        window.open(start, stop)
        time.sleep(max(0.0, start - time.monotonic()))
        before = _cpu_reading(server_pids, procs)
        time.sleep(max(0.0, stop - time.monotonic()))
        after = _cpu_reading(server_pids, procs)
        outcomes = _procs.collect(results, procs, "done", settings.seconds + READY_TIMEOUT_S)
        finished = True
    finally:
        _procs.stop_processes(procs, grace=10 if finished else 0)
    return _load_figures(op, clients, settings.seconds, outcomes, before, after)


@dataclass(frozen=True)
class CpuReading:
    #: CPU seconds of each server process, in the order of the ensemble
    servers: list[float]
    clients: list[float]
    machine: _procs.MachineCpu
    at: float


def _cpu_reading(
    server_pids: Sequence[int], procs: Sequence[multiprocessing.process.BaseProcess]
) -> CpuReading:
    return CpuReading(
        servers=[_procs.cpu_seconds(pid) for pid in server_pids],
        clients=[_procs.cpu_seconds(p.pid) for p in procs if p.pid is not None],
        machine=_procs.MachineCpu.read(),
        at=time.monotonic(),
    )


def _load_figures(
    op: str,
    clients: int,
    seconds: float,
    outcomes: dict[int, dict[str, Any]],
    before: CpuReading,
    after: CpuReading,
) -> dict[str, Any]:
    elapsed = after.at - before.at
    ops = sum(o["ops"] for o in outcomes.values())
    errors = sum(o["errors"] for o in outcomes.values())
    each_server = [a - b for a, b in zip(after.servers, before.servers, strict=True)]
    server_cpu = sum(each_server)
    client_cpu = [a - b for a, b in zip(after.clients, before.clients, strict=True)]
    machine_busy = after.machine.busy_fraction_since(before.machine)
    # What neither the server nor its clients used: other work on a shared machine.
    other_cpu = machine_busy * elapsed * (os.cpu_count() or 1) - server_cpu - sum(client_cpu)
    figures: dict[str, Any] = {
        "op": op,
        "clients": clients,
        "ops_per_s": round(ops / seconds),
        "server_cpu_pct": round(100 * server_cpu / elapsed, 1),
        "server_cpu_s_per_1000_ops": round(1000 * server_cpu / ops, 4) if ops else None,
        "client_cpu_pct": [round(100 * c / elapsed, 1) for c in client_cpu],
        "other_cpu_pct": round(max(0.0, 100 * other_cpu / elapsed), 1),
        "machine_cpu_pct": round(100 * machine_busy, 1),
        "errors": errors,
    }
    if len(each_server) > 1:
        # the sum is the ensemble's cost; the busiest server (the leader) is its limit
        figures["server_cpu_pct_each"] = [round(100 * c / elapsed, 1) for c in each_server]
    first_error = next((o["first_error"] for o in outcomes.values() if o["first_error"]), "")
    if first_error:
        figures["first_error"] = first_error
    return figures


@dataclass(frozen=True)
class Verdict:
    """Whether to add another client process, and if not, what limited throughput."""

    stop: bool
    limit: str = ""
    reason: str = ""


def judge(steps: Sequence[dict[str, Any]], max_clients: int, ceiling: str) -> Verdict:
    """Decide after the latest step whether the server or the clients were the limit.

    ``ceiling`` says why no more than ``max_clients`` client processes were tried.
    """
    last = steps[-1]
    busy = ""
    if last["machine_cpu_pct"] >= 100 * SERVER_CPU_LIMIT:
        busy = (
            f"; the machine's {os.cpu_count()} cores were {last['machine_cpu_pct']:.0f}% busy "
            f"({last['other_cpu_pct']:.0f}% of a core by other processes), so the clients "
            "competed with the server for CPU"
        )
    # In an ensemble the busiest server (the leader) is the one that limits.
    busiest = max(last.get("server_cpu_pct_each", [last["server_cpu_pct"]]))
    server = "busiest server" if "server_cpu_pct_each" in last else "server"
    if busiest >= 100 * SERVER_CPU_LIMIT:
        return Verdict(
            True,
            "server",
            f"{server} CPU {busiest:.0f}% of one core with {last['clients']} "
            f"client process(es){busy}",
        )
    if len(steps) > 1:
        prev = steps[-2]
        gain = last["ops_per_s"] / prev["ops_per_s"] - 1 if prev["ops_per_s"] else 0.0
        if gain < MIN_GAIN:
            return Verdict(
                True,
                "server",
                f"going from {prev['clients']} to {last['clients']} client processes changed "
                f"writes/s by {100 * gain:+.0f}% (less than {100 * MIN_GAIN:.0f}%){busy}",
            )
    if last["clients"] >= max_clients:
        return Verdict(
            True,
            "clients",
            f"the {server} used {busiest:.0f}% of one core with "
            f"{last['clients']} client process(es), writes/s had not stopped rising, and "
            f"{ceiling}{busy}",
        )
    return Verdict(False)


def write_scaling(
    system: str,
    op: str,
    address: str,
    server_pids: Sequence[int],
    settings: Settings,
    counts: Sequence[int] | None,
) -> dict[str, Any]:
    """Writes with 1, 2, … client processes until :func:`judge` stops the search.

    With ``counts`` (the anchor, measured like the system it is compared with) exactly
    those client-process counts are run, and the verdict is the first one :func:`judge`
    would have stopped at.
    """
    steps: list[dict[str, Any]] = []
    verdict = Verdict(False)
    if counts is None:
        max_clients = settings.max_clients
        ceiling = f"--max-clients {max_clients} ended the search"
    else:
        max_clients = counts[-1]
        ceiling = f"it is measured with the compared system's counts, up to {max_clients}"
    for clients in counts or range(1, settings.max_clients + 1):
        step = measure_load(system, op, address, clients, server_pids, settings)
        steps.append(step)
        _procs.progress(
            f"{system} {op}: {clients} client process(es): {step['ops_per_s']:,} writes/s, "
            f"server CPU {step.get('server_cpu_pct_each', step['server_cpu_pct'])}%, "
            f"client CPU {step['client_cpu_pct']}%, "
            f"other processes' CPU {step['other_cpu_pct']}%"
        )
        if not verdict.stop:
            verdict = judge(steps, max_clients, ceiling)
            if verdict.stop and counts is None:
                break
    best = max(steps, key=lambda s: s["ops_per_s"])
    return {"steps": steps, "limit": verdict.limit, "limit_reason": verdict.reason, "best": best}


# -- replicated ensembles: who leads, failover, catch-up --------------------------------


@dataclass(frozen=True)
class ServerView:
    """What one running server says about itself."""

    server_id: int
    #: "leader", "follower", or anything else (looking, not serving, …)
    role: str
    #: whether it serves clients in step with a leader
    serving: bool
    epoch: int
    #: the last zxid it applied
    applied_zxid: int
    #: the followers connected to it, if it leads and says so
    learners: tuple[int, ...] | None = None
    #: the leader it follows, if it says so
    leader: int = -1
    last_sync: str = ""


class Ensemble:
    """The servers of one system under test: start, kill, restart them, ask who leads."""

    system = ""

    def __init__(
        self,
        services: _procs.Services,
        slots: Sequence[ServerSlot],
        command: Callable[[ServerSlot], list[str]],
    ) -> None:
        self.services = services
        self.slots = {s.server_id: s for s in slots}
        self.command = command
        self.running: dict[int, _procs.Service] = {}

    def start(self, server_id: int) -> _procs.Service:
        slot = self.slots[server_id]
        service = self.services.start(f"{self.system}-{server_id}", self.command(slot))
        self.running[server_id] = service
        return service

    def kill(self, server_id: int) -> None:
        self.running.pop(server_id).kill()

    def stop(self, server_id: int) -> _procs.Service:
        service = self.running.pop(server_id)
        service.stop()
        return service

    def pids(self) -> list[int]:
        return [self.running[i].pid for i in sorted(self.running)]

    def address(self, server_id: int) -> str:
        return f"127.0.0.1:{self.slots[server_id].client_port}"

    def addresses(self) -> tuple[str, ...]:
        return tuple(self.address(i) for i in sorted(self.running))

    def view(self, server_id: int) -> ServerView | None:
        """The server's own account, or None if it does not answer."""
        raise NotImplementedError

    def sync_kind(self, server_id: int, log_offset: int) -> str:
        """How the server last synchronised with a leader ("DIFF", "TRUNC", "SNAP")."""
        raise NotImplementedError

    def settled(self) -> ServerView | None:
        """The leader, if every running server is serving in step with it; else None."""
        views = {}
        for server_id, service in self.running.items():
            service.check_alive()
            view = self.view(server_id)
            if view is None or not view.serving:
                return None
            views[server_id] = view
        leaders = [v for v in views.values() if v.role == "leader"]
        if len(leaders) != 1:
            return None
        leader = leaders[0]
        followers = [i for i in views if i != leader.server_id]
        for i in followers:
            if views[i].role != "follower" or views[i].leader not in (-1, leader.server_id):
                return None
        if leader.learners is not None and not set(followers) <= set(leader.learners):
            return None
        return leader

    def wait_settled(self, timeout: float = READY_TIMEOUT_S) -> ServerView:
        leader = _procs.wait_until(
            self.settled, timeout=timeout, what=f"{self.system}'s servers settling on a leader"
        )
        assert isinstance(leader, ServerView)
        return leader


class HerderEnsemble(Ensemble):
    system = "herder"

    def view(self, server_id: int) -> ServerView | None:
        try:
            status = asyncio.run(server_status(self.address(server_id), timeout=1.0))
        except (HerderError, OSError):
            return None
        return ServerView(
            server_id=status.server_id,
            role=status.role,
            serving=status.phase == "BROADCAST" and status.role in ("leader", "follower"),
            epoch=status.epoch,
            applied_zxid=status.committed_zxid,
            learners=tuple(status.learners) if status.role == "leader" else None,
            leader=status.leader,
            last_sync=status.last_sync,
        )

    def sync_kind(self, server_id: int, log_offset: int) -> str:
        view = self.view(server_id)
        return view.last_sync if view is not None else ""


#: what ZooKeeper 3.8's Learner logs for each kind of sync with its leader
ZK_SYNC_LINES = (
    ("DIFF", "Getting a diff from the leader"),
    ("SNAP", "Getting a snapshot from leader"),
    ("TRUNC", "Truncating log to get in sync with the leader"),
)


class ZooKeeperEnsemble(Ensemble):
    system = "zookeeper"

    def view(self, server_id: int) -> ServerView | None:
        try:
            srvr = _four_letter_word(self.slots[server_id].client_port, b"srvr")
        except OSError:
            return None
        fields = dict(
            line.split(": ", 1) for line in srvr.splitlines() if ": " in line
        )  # "This ZooKeeper instance is not currently serving requests" has none
        mode = fields.get("Mode", "")
        if "Zxid" not in fields:
            return ServerView(server_id, mode or "looking", False, 0, 0)
        zxid = int(fields["Zxid"], 16)
        return ServerView(server_id, mode, mode in ("leader", "follower"), zxid >> 32, zxid)

    def sync_kind(self, server_id: int, log_offset: int) -> str:
        text = self.running[server_id].log_since(log_offset)
        found = [(text.find(line), kind) for kind, line in ZK_SYNC_LINES if line in text]
        return min(found)[1] if found else ""


def _four_letter_word(port: int, word: bytes, timeout: float = 1.0) -> str:
    """Send ZooKeeper a four-letter word on its client port; its answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as conn:
        conn.sendall(word)
        chunks = []
        while chunk := conn.recv(4096):
            chunks.append(chunk)
    return b"".join(chunks).decode(errors="replace")


def measure_failover(ensemble: Ensemble, runs: int, settings: Settings) -> dict[str, Any]:
    """Kill -9 the leader under write load, ``runs`` times; seconds to the first new write.

    Each run writes through one client per server (each pinned to its server), kills the
    leader after :data:`FAILOVER_LOAD_S` of load, and times from the kill to the first
    write acknowledged in a later epoch. The killed server is restarted and the run ends
    once it has rejoined (every server serving, one leader).
    """
    system = ensemble.system
    records = []
    for run in range(1, runs + 1):
        leader = ensemble.wait_settled(READY_TIMEOUT_S * 2)
        job = FailoverJob(
            system,
            ensemble.addresses(),
            leader.epoch,
            FAILOVER_IN_FLIGHT,
            settings.record_bytes,
            1000 + run,
            FAILOVER_TIMEOUT_S,
        )
        ctx = multiprocessing.get_context("spawn")
        results = ctx.Queue()
        procs = []
        try:
            procs.append(start_client(ctx, job, None, results, f"{system}-failover-{run}"))
            _procs.collect(results, procs, "ready", READY_TIMEOUT_S)
            time.sleep(FAILOVER_LOAD_S)
            killed_at = time.monotonic()
            ensemble.kill(leader.server_id)
            outcome = _procs.collect(results, procs, "done", FAILOVER_TIMEOUT_S + 30)[0]
        finally:
            _procs.stop_processes(procs, grace=5)
        first = outcome["first_new_epoch_ack_at"]
        if first is None:
            raise RuntimeError(
                f"{system}: no write succeeded within {FAILOVER_TIMEOUT_S:.0f}s of killing "
                f"leader {leader.server_id} (run {run})"
            )
        new_leader = ensemble.wait_settled(READY_TIMEOUT_S)
        restarted_at = time.monotonic()
        ensemble.start(leader.server_id)
        ensemble.wait_settled(READY_TIMEOUT_S * 2)
        record = {
            "run": run,
            "killed_leader": leader.server_id,
            "old_epoch": leader.epoch,
            "new_leader": new_leader.server_id,
            "new_epoch": new_leader.epoch,
            "seconds": round(first - killed_at, 3),
            "first_write_through": outcome["through"],
            "writes_acked": outcome["writes_acked"],
            "killed_server_rejoined_s": round(time.monotonic() - restarted_at, 3),
        }
        records.append(record)
        _procs.progress(
            f"{system} failover {run}/{runs}: leader {leader.server_id} killed, first write "
            f"in the new epoch after {record['seconds']:.3f}s (new leader "
            f"{new_leader.server_id}); restarted server rejoined in "
            f"{record['killed_server_rejoined_s']:.1f}s"
        )
    return {
        "seconds": _procs.spread([r["seconds"] for r in records]),
        "runs": records,
        "load": f"one client per server, each pinned to it, {FAILOVER_IN_FLIGHT} writes in "
        f"flight, reconnecting every {FAILOVER_RETRY_MS}-{FAILOVER_RETRY_MAX_MS} ms",
    }


def measure_catchup(
    ensemble: Ensemble, writes: int, clients: int, settings: Settings
) -> dict[str, Any]:
    """Stop a follower, make ``writes`` writes, restart it: seconds until it has them all."""
    system = ensemble.system
    leader = ensemble.wait_settled(READY_TIMEOUT_S * 2)
    follower = max(i for i in ensemble.running if i != leader.server_id)
    stopped = ensemble.stop(follower)
    _procs.progress(f"{system} catch-up: follower {follower} stopped; {writes:,} writes")
    made = make_writes(system, ensemble.addresses(), writes, clients, settings)
    target = ensemble.view(leader.server_id)
    if target is None or target.role != "leader":
        raise RuntimeError(f"{system}: leader {leader.server_id} stopped leading during the writes")
    # the restarted server appends to the same log: its sync is logged after this offset
    log_offset = stopped.log_size()
    restarted_at = time.monotonic()
    ensemble.start(follower)
    answered_at: list[float] = []

    def caught_up() -> bool:
        view = ensemble.view(follower)
        if view is None:
            return False
        if not answered_at:
            answered_at.append(time.monotonic())
        return view.serving and view.applied_zxid >= target.applied_zxid

    _procs.wait_until(
        caught_up,
        timeout=READY_TIMEOUT_S * 3,
        what=f"{system}'s follower {follower} catching up",
        interval=CATCHUP_POLL_S,
    )
    seconds = time.monotonic() - restarted_at
    sync = ensemble.sync_kind(follower, log_offset)
    _procs.progress(
        f"{system} catch-up: follower {follower} has the leader's zxid "
        f"{target.applied_zxid:#x} {seconds:.3f}s after its restart (sync: {sync or 'unknown'})"
    )
    return {
        "seconds": round(seconds, 3),
        # how much of that was the process starting (an interpreter, a JVM) until it answered
        "process_answering_after_s": round(answered_at[0] - restarted_at, 3),
        "sync": sync,
        "follower": follower,
        "leader": leader.server_id,
        "writes_missed": writes,
        "leader_zxid": hex(target.applied_zxid),
        "writes_per_s_meanwhile": made["writes_per_s"],
    }


def make_writes(
    system: str, addresses: Sequence[str], writes: int, clients: int, settings: Settings
) -> dict[str, Any]:
    """``writes`` writes from ``clients`` processes through ``addresses``."""
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    share, extra = divmod(writes, clients)
    procs = []
    finished = False
    try:
        for worker in range(clients):
            job = CountJob(
                system,
                ",".join(addresses),
                share + (1 if worker < extra else 0),
                settings.in_flight,
                settings.record_bytes,
                worker,
                200 + worker,
            )
            procs.append(start_client(ctx, job, None, results, f"{system}-count-{worker}"))
        _procs.collect(results, procs, "ready", READY_TIMEOUT_S)
        began = time.monotonic()
        _procs.collect(results, procs, "done", READY_TIMEOUT_S + writes / 50)
        elapsed = time.monotonic() - began
        finished = True
    finally:
        _procs.stop_processes(procs, grace=10 if finished else 0)
    return {"writes": writes, "seconds": round(elapsed, 2), "writes_per_s": round(writes / elapsed)}


def measure_resilience(
    ensemble: Ensemble, resilience: Resilience, clients: int, settings: Settings
) -> dict[str, Any]:
    """Failover, then catch-up (each skipped when set to 0)."""
    figures: dict[str, Any] = {}
    if resilience.failover_runs:
        figures["failover"] = measure_failover(ensemble, resilience.failover_runs, settings)
    if resilience.catchup_writes:
        figures["catchup"] = measure_catchup(ensemble, resilience.catchup_writes, clients, settings)
    return figures


# -- the two systems --------------------------------------------------------------------


def sync_write_latency(
    system: str, ensemble: Ensemble, leader: ServerView | None, settings: Settings
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The synchronous-write latency figures, and in an ensemble how they were taken.

    In an ensemble the headline is through a follower (the path most clients take, the
    write forwarded to the leader); the run connected to the leader is reported beside it.
    """
    if leader is None:
        return measure_latency(system, ",".join(ensemble.addresses()), settings), {}
    follower = min(i for i in ensemble.running if i != leader.server_id)
    through_follower = measure_latency(system, ensemble.address(follower), settings)
    through_leader = measure_latency(system, ensemble.address(leader.server_id), settings)
    return through_follower, {
        "sync_write_latency_through": f"follower {follower} (leader {leader.server_id})",
        "sync_write_latency_via_leader": through_leader,
    }


def run_herder(
    slots: Sequence[ServerSlot], work_dir: Path, settings: Settings, resilience: Resilience
) -> dict[str, Any]:
    """Start herder's ensemble, measure it, stop it."""
    address = bootstrap(slots)
    replicated = len(slots) > 1

    def command(slot: ServerSlot) -> list[str]:
        data_dir = work_dir / f"herder-{slot.server_id}"
        data_dir.mkdir(exist_ok=True)
        config = work_dir / f"herder-{slot.server_id}.properties"
        config.write_text(herder_properties(slot, slots, data_dir))
        return [sys.executable, "-m", "herder", "ensemble", "start", "--config", str(config)]

    with _procs.Services(work_dir) as services:
        ensemble = HerderEnsemble(services, slots, command)
        for slot in slots:
            ensemble.start(slot.server_id)
        server = ensemble.running[slots[0].server_id]
        leader = None
        if replicated:
            leader = ensemble.wait_settled()
        else:

            def answers() -> bool:
                server.check_alive()
                if not _procs.port_open(slots[0].client_port):
                    return False
                return bool(asyncio.run(server_status(address.split(",")[0], timeout=1.0)))

            _procs.wait_until(answers, timeout=READY_TIMEOUT_S, what="herder's server answering")
        asyncio.run(_create_log(address))
        pids = ensemble.pids()
        _procs.progress(f"herder up on {address} (pids {', '.join(map(str, pids))})")

        warm_up_server("herder", "append", address, pids, settings)
        disk = _procs.fdatasync_latency_ms(work_dir)
        latency, latency_extra = sync_write_latency("herder", ensemble, leader, settings)
        _procs.progress(f"herder synchronous append: {latency} (disk fdatasync: {disk})")
        scaling = write_scaling("herder", "append", address, pids, settings, None)
        clients = scaling["best"]["clients"]
        reads = measure_load("herder", "read", address, clients, pids, settings)
        _procs.progress(f"herder read: {clients} client process(es): {reads['ops_per_s']:,}/s")
        for service in ensemble.running.values():
            service.check_alive()
        total_cpu = sum(_procs.cpu_seconds(pid) for pid in pids)
        extra = measure_resilience(ensemble, resilience, clients, settings) if replicated else {}
    best = scaling["best"]
    return {
        "version": herder_version,
        "server_cmd": server.args,
        "sync_write_latency": latency,
        **latency_extra,
        "disk_fdatasync_before_latency_run": disk,
        "writes_per_s": best["ops_per_s"],
        "reads_per_s": reads["ops_per_s"],
        "sync_write_p50_ms": latency["p50_ms"],
        "sync_write_p99_ms": latency["p99_ms"],
        "server_cpu_s_per_1000_writes": best["server_cpu_s_per_1000_ops"],
        "write_clients": best["clients"],
        "read_clients": reads["clients"],
        "limit": scaling["limit"],
        "limit_reason": scaling["limit_reason"],
        "write_steps": scaling["steps"],
        "reads": reads,
        "server_cpu_s_total": round(total_cpu, 2),
        **extra,
    }


async def _create_log(address: str) -> None:
    async with EnsembleClient(address, name="bench-setup") as client:
        await client.create_log(HERDER_LOG, if_absent=True)


def zookeeper_command(cfg: Path, *, replicated: bool = False) -> list[str]:
    """How to start ZooKeeper from Debian's jars, or why it cannot be.

    A replicated server runs ``QuorumPeerMain`` and logs through slf4j-simple (INFO, to
    its output), so the benchmark can read how a restarted follower synchronised.
    """
    java = shutil.which("java")
    if not ZK_JAR.exists():
        raise UnsupportedSetup(
            f"Apache ZooKeeper is not installed ({ZK_JAR} is missing); "
            "install Debian's package with: apt-get install zookeeper"
        )
    if importlib.util.find_spec("kazoo") is None:
        raise UnsupportedSetup("kazoo is not installed: .venv/bin/pip install kazoo")
    if java is None:
        raise UnsupportedSetup(
            "java is not on PATH; ZooKeeper needs a JRE (apt-get install default-jre)"
        )
    # The jar's manifest Class-Path names its dependencies in /usr/share/java.
    if not replicated:
        return [java, *ZK_JVM_OPTIONS, "-cp", str(ZK_JAR), ZK_STANDALONE_MAIN, str(cfg)]
    classpath = ":".join(str(p) for p in (ZK_JAR, ZK_LOG_BINDING) if p.exists())
    return [java, *ZK_JVM_OPTIONS, "-cp", classpath, ZK_QUORUM_MAIN, str(cfg)]


def run_zookeeper(
    slots: Sequence[ServerSlot],
    work_dir: Path,
    settings: Settings,
    counts: Sequence[int],
    read_clients: int,
    resilience: Resilience,
) -> dict[str, Any]:
    """Start ZooKeeper, measure it with the same client-process counts, stop it."""
    address = bootstrap(slots)
    replicated = len(slots) > 1

    def command(slot: ServerSlot) -> list[str]:
        data_dir = work_dir / f"zookeeper-{slot.server_id}"
        data_dir.mkdir(exist_ok=True)
        if replicated:
            (data_dir / "myid").write_text(f"{slot.server_id}\n")
        cfg = work_dir / f"zoo-{slot.server_id}.cfg"
        cfg.write_text(zookeeper_cfg(slot, slots, data_dir))
        return zookeeper_command(cfg, replicated=replicated)

    with _procs.Services(work_dir) as services:
        ensemble = ZooKeeperEnsemble(services, slots, command)
        for slot in slots:
            ensemble.start(slot.server_id)
        server = ensemble.running[slots[0].server_id]
        leader = ensemble.wait_settled() if replicated else None

        def answers() -> bool:
            server.check_alive()
            if not _procs.port_open(slots[0].client_port):
                return False
            zk = _kazoo_probe(address)
            try:
                zk.ensure_path(ZK_PARENT)
            finally:
                zk.stop()
                zk.close()
            return True

        _procs.wait_until(answers, timeout=READY_TIMEOUT_S, what="ZooKeeper answering")
        version = _zookeeper_version(address)
        pids = ensemble.pids()
        _procs.progress(f"ZooKeeper {version} up on {address} (pids {', '.join(map(str, pids))})")

        warm_up_server("zookeeper", "create", address, pids, settings)
        disk = _procs.fdatasync_latency_ms(work_dir)
        latency, latency_extra = sync_write_latency("zookeeper", ensemble, leader, settings)
        _procs.progress(f"ZooKeeper synchronous create: {latency} (disk fdatasync: {disk})")
        scaling = write_scaling("zookeeper", "create", address, pids, settings, counts)
        sets = measure_load("zookeeper", "set", address, read_clients, pids, settings)
        _procs.progress(
            f"ZooKeeper set: {read_clients} client process(es): {sets['ops_per_s']:,}/s"
        )
        reads = measure_load("zookeeper", "get", address, read_clients, pids, settings)
        _procs.progress(
            f"ZooKeeper get: {read_clients} client process(es): {reads['ops_per_s']:,}/s"
        )
        for service in ensemble.running.values():
            service.check_alive()
        total_cpu = sum(_procs.cpu_seconds(pid) for pid in pids)
        extra = (
            measure_resilience(ensemble, resilience, read_clients, settings) if replicated else {}
        )
    best = scaling["best"]
    return {
        "version": version,
        "debian_package": _debian_version("zookeeper"),
        "client": f"kazoo {_kazoo_version()}",
        "java": _java_version(server.args[0]),
        "server_cmd": server.args,
        "sync_write_latency": latency,
        **latency_extra,
        "disk_fdatasync_before_latency_run": disk,
        "writes_per_s": best["ops_per_s"],
        "reads_per_s": reads["ops_per_s"],
        "sets_per_s": sets["ops_per_s"],
        "sync_write_p50_ms": latency["p50_ms"],
        "sync_write_p99_ms": latency["p99_ms"],
        "server_cpu_s_per_1000_writes": best["server_cpu_s_per_1000_ops"],
        "write_clients": best["clients"],
        "read_clients": reads["clients"],
        "limit": scaling["limit"],
        "limit_reason": scaling["limit_reason"],
        "write_steps": scaling["steps"],
        "sets": sets,
        "reads": reads,
        "server_cpu_s_total": round(total_cpu, 2),
        **extra,
    }


def _kazoo_probe(address: str) -> Any:
    """A connected kazoo client, quiet about the refusals of a server still starting."""
    from kazoo.client import KazooClient

    logging.getLogger("kazoo").setLevel(logging.CRITICAL)
    zk = KazooClient(hosts=address, timeout=10.0)
    try:
        zk.start(timeout=1.0)
    except Exception:
        zk.close()
        raise
    return zk


def _zookeeper_version(address: str) -> str:
    """The server's version from the ``srvr`` four-letter word (allowed by default)."""
    zk = _kazoo_probe(address)
    try:
        first = zk.command(b"srvr").splitlines()[0]
    except Exception:
        return "unknown"
    finally:
        zk.stop()
        zk.close()
    # "Zookeeper version: 3.8.0-${mvngit.commit.id}, built on …" in Debian's build
    found = re.search(r"version: ([0-9][0-9.]*)", first)
    return found.group(1) if found else first


def _debian_version(package: str) -> str | None:
    try:
        done = subprocess.run(
            ["dpkg-query", "-W", "-f=${Version}", package],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def _java_version(java: str) -> str:
    try:
        done = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    lines = (done.stderr or done.stdout).splitlines()
    return lines[0].strip() if lines else "unknown"


def _kazoo_version() -> str:
    from importlib.metadata import version

    return version("kazoo")


# -- the run ----------------------------------------------------------------------------


def comparison(herder: dict[str, Any], zookeeper: dict[str, Any]) -> dict[str, Any]:
    """herder/ZooKeeper ratios, and whether herder meets the target."""
    if "error" in herder or "error" in zookeeper:
        return {}
    ratios = {
        key: _procs.ratio(herder[key], zookeeper[key])
        for key in (
            "writes_per_s",
            "reads_per_s",
            "sync_write_p50_ms",
            "sync_write_p99_ms",
            "server_cpu_s_per_1000_writes",
        )
    }
    target = {
        "writes_at_least_zookeeper": (ratios["writes_per_s"] or 0) >= 1,
        "reads_at_least_zookeeper": (ratios["reads_per_s"] or 0) >= 1,
        "sync_latency_no_worse": (ratios["sync_write_p50_ms"] or math.inf) <= 1
        and (ratios["sync_write_p99_ms"] or math.inf) <= 1,
    }
    for kind, key in (("failover", "failover_no_slower"), ("catchup", "catchup_no_slower")):
        if kind in herder and kind in zookeeper:
            ratios[f"{kind}_s"] = _procs.ratio(
                _median_seconds(herder[kind]), _median_seconds(zookeeper[kind])
            )
            target[key] = (ratios[f"{kind}_s"] or math.inf) <= 1
    target["met"] = all(target.values())
    return {
        "ratios": ratios,
        "ratios_note": "herder / ZooKeeper: above 1 is better for throughput, below 1 for "
        "latency, CPU per write, failover (medians) and catch-up",
        "target": target,
    }


def _median_seconds(figures: dict[str, Any]) -> float:
    seconds = figures["seconds"]
    return float(seconds["median"] if isinstance(seconds, dict) else seconds)


def run(args: argparse.Namespace) -> tuple[dict[str, Any], int]:
    """Run every measurement; return the figures and the exit status."""
    settings = Settings(
        seconds=args.seconds,
        warmup_seconds=args.warmup,
        server_warmup_seconds=args.server_warmup,
        in_flight=args.in_flight,
        record_bytes=args.record_bytes,
        max_clients=args.max_clients,
        sync_writes=args.sync_writes,
        sync_warmup=args.sync_warmup,
    )
    resilience = Resilience(args.failover_runs, args.catchup_writes)
    figures: dict[str, Any] = {
        "benchmark": "ensemble",
        "machine": _procs.machine_info(),
        "config": {"servers": args.servers, "fsync": True, **asdict(settings)},
    }
    if args.servers > 1:
        figures["config"].update(asdict(resilience))
    status = 0
    with tempfile.TemporaryDirectory(prefix="herder-bench-ensemble-", dir=args.tmp_dir) as tmp:
        work_dir = Path(tmp)
        figures["config"]["data_dir_parent"] = str(work_dir.parent)
        _procs.progress(f"herder: {args.servers} server(s), data in {work_dir}")
        try:
            herder = run_herder(plan_ensemble(args.servers), work_dir, settings, resilience)
        except Exception as exc:
            herder = {"error": f"{type(exc).__name__}: {exc}"}
            status = 1
            _procs.progress(f"herder failed: {herder['error']}")
        figures["herder"] = herder
        if args.skip_zookeeper:
            figures["zookeeper"] = {"skipped": "--skip-zookeeper"}
        elif "error" in herder:
            figures["zookeeper"] = {"skipped": "herder failed, so there is nothing to compare"}
        else:
            counts = [s["clients"] for s in herder["write_steps"]]
            try:
                zookeeper = run_zookeeper(
                    plan_ensemble(args.servers),
                    work_dir,
                    settings,
                    counts,
                    herder["read_clients"],
                    resilience,
                )
            except UnsupportedSetup as exc:
                zookeeper = {"error": str(exc)}
                _procs.progress(f"ZooKeeper not measured: {exc}")
            except Exception as exc:
                zookeeper = {"error": f"{type(exc).__name__}: {exc}"}
                _procs.progress(f"ZooKeeper not measured: {zookeeper['error']}")
            figures["zookeeper"] = zookeeper
            figures.update(comparison(herder, zookeeper))
    noise = contention_warning(figures)
    if noise:
        figures["warning"] = noise
        _procs.progress(noise)
    return figures, status


def contention_warning(figures: dict[str, Any]) -> str:
    """A warning if other processes used much CPU while something was being measured."""
    steps = [
        step
        for system in ("herder", "zookeeper")
        for key in ("write_steps", "reads", "sets")
        for step in _as_list(figures.get(system, {}).get(key))
    ]
    worst = max((s["other_cpu_pct"] for s in steps), default=0.0)
    if worst < OTHER_CPU_WARNING_PCT:
        return ""
    return (
        f"other processes used up to {worst:.0f}% of a core during the measurements "
        "(see other_cpu_pct): the machine was shared, so these figures are not representative"
    )


def _as_list(value: Any) -> list[dict[str, Any]]:
    if isinstance(value, list):
        return value
    return [value] if isinstance(value, dict) else []


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="bench/ensemble.py",
        description="herder's ensemble against Apache ZooKeeper 3.8: writes/s, reads/s, "
        "synchronous write latency, server CPU per write; with several servers also "
        "failover and a follower's catch-up. JSON on stdout.",
    )
    parser.add_argument(
        "--servers", type=int, default=1, help="ensemble size: 1 or 3 or more (default 1)"
    )
    parser.add_argument(
        "--seconds", type=float, default=10.0, help="length of each measurement (default 10)"
    )
    parser.add_argument(
        "--warmup", type=float, default=2.0, help="unmeasured load before each (default 2)"
    )
    parser.add_argument(
        "--server-warmup",
        type=float,
        default=5.0,
        help="unmeasured write load when a server starts, e.g. for the JVM's JIT (default 5)",
    )
    parser.add_argument(
        "--in-flight", type=int, default=500, help="operations outstanding per client process"
    )
    parser.add_argument("--record-bytes", type=int, default=100, help="bytes per record")
    parser.add_argument(
        "--max-clients", type=int, default=4, help="most client processes to try (default 4)"
    )
    parser.add_argument("--sync-writes", type=int, default=2000, help="timed synchronous writes")
    parser.add_argument("--sync-warmup", type=int, default=200, help="untimed ones before them")
    parser.add_argument(
        "--failover-runs",
        type=int,
        default=5,
        help="with several servers: times the leader is killed under load (default 5)",
    )
    parser.add_argument(
        "--catchup-writes",
        type=int,
        default=50_000,
        help="with several servers: writes a stopped follower misses (default 50000)",
    )
    parser.add_argument("--skip-zookeeper", action="store_true", help="measure herder alone")
    parser.add_argument("--tmp-dir", default=None, help="where the data directories go")
    parser.add_argument("--pretty", action="store_true", help="indent the JSON")
    args = parser.parse_args(argv)
    for name in ("seconds", "in_flight", "record_bytes", "max_clients", "sync_writes"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} must be positive")
    if min(args.warmup, args.server_warmup, args.sync_warmup) < 0:
        parser.error("--warmup, --server-warmup and --sync-warmup must not be negative")
    if min(args.failover_runs, args.catchup_writes) < 0:
        parser.error("--failover-runs and --catchup-writes must not be negative")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        check_servers(args.servers)
    except UnsupportedSetup as exc:
        print(exc, file=sys.stderr)
        return 2
    return _procs.run_and_report(lambda: run(args), pretty=args.pretty)


if __name__ == "__main__":
    sys.exit(main())
