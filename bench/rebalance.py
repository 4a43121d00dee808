"""How fast the group coordinator forms a group, re-forms it after a crash, and how a
rolling restart of static members compares with one of dynamic members.

    python bench/rebalance.py [--members 10,100,500] [--client-processes 2]
                              [--session-timeout-ms 6000] [--heartbeat-interval-ms 1000]
                              [--rolling-members 5] [--rolling-session-timeout-ms 10000]
                              [--only-rolling]

The benchmark starts its own ensemble server (127.0.0.1, a free port, a temporary
``dataDir``, ``group.initial.rebalance.delay.ms=0``, and ``maxClientCnxns=0`` because
every member is a connection from 127.0.0.1) and, for each group size N:

* **join**: N real :class:`~herder.coordinator.client.GroupMember` clients over the
  wire — one in a process of its own (the victim below), the other N - 1 as asyncio
  tasks shared among ``--client-processes`` processes (multiprocessing, spawn) — all
  start at one instant; measured is the time from that instant until every member
  holds an assignment in one generation that has them all (the leader assigns N
  resources round-robin, so the assignments must be disjoint and cover them all), and
  the group stays so for ``--settle`` seconds. Members that already hold a generation
  learn of the next rebalance from a heartbeat, so every extra generation costs up to
  one ``--heartbeat-interval-ms``; ``generation`` says how many there were.
* **crash**: the victim's process is killed with SIGKILL; measured is the time until
  the N - 1 survivors hold the next generation, again disjoint and covering, and that
  time minus the session timeout (``beyond_session_timeout_s``): what is left is expiry
  lateness, the survivors' wait for their next heartbeat, and the rebalance. The
  coordinator's session clock started at the victim's last heartbeat, up to one
  heartbeat interval before the kill, so ``first_revocation_after_s`` (when the first
  survivor gave its assignment up) may be a little under the session timeout.

* **rolling restart** (``--rolling-members`` M, 0 skips it): M real ``herder
  verifiable member`` processes (each a process of its own, the leader assigning 2M
  resources round-robin) form a group; then each in turn gets SIGTERM and, once it has
  exited, a new process is started in its place, and the next restart waits until the
  group has settled again (every process holding an assignment in one generation,
  disjoint and covering, for ``--settle`` seconds). Done once with static members
  (``--instance-id member-<i>``: a stopped process does not leave, its successor takes
  its place over) and once with dynamic ones (a stopped process leaves, its successor
  joins as a new member), with a session timeout of ``--rolling-session-timeout-ms``.
  ``rebalances`` is how many generations the coordinator went through (goal for static
  members: 0), ``revocations`` how many times a process gave its assignment up because
  of a rebalance (not its own stop), ``seconds`` the whole rolling restart, and
  ``per_restart_s`` and ``member_out_s`` (from a process's SIGTERM until its successor
  holds an assignment) the min/median/max of each restart; ``static_vs_dynamic`` puts
  the two side by side.

Timestamps are ``time.monotonic()`` taken in the client processes when ``on_assigned``
and ``on_revoked`` run (one clock for every process on Linux). Each phase also reports
the CPU seconds of the server and of the client processes, and ``other_cpu_pct``: the
CPU everything else on the machine used meanwhile, in % of one core (well above zero
means the figures competed with something else). Figures go to stdout as one JSON
object, progress to stderr. Every process started is stopped by PID in ``finally``
blocks; with the defaults a run takes under a minute on two cores.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import multiprocessing.context
import os
import queue
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the ``bench`` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _procs
from herder import __version__ as herder_version
from herder.coordinator import apis
from herder.coordinator import messages as m
from herder.coordinator.client import CoordinatorClient
from herder.errors import HerderError
from herder.runtime.core.member import Generation
from herder.runtime.shell.member import GroupMember

READY_TIMEOUT_S = 60.0
PROTOCOL_TYPE = "bench"
PROTOCOL = "round-robin"


@dataclass(frozen=True)
class Timing:
    """The group settings every member of a run uses."""

    session_timeout_ms: int
    heartbeat_interval_ms: int
    rebalance_timeout_ms: int


@dataclass(frozen=True)
class ClientJob:
    """Members ``first`` … ``first + count - 1`` of ``group_id``, run by one process."""

    worker: int
    bootstrap: str
    group_id: str
    first: int
    count: int
    resources: int
    timing: Timing


# -- the client processes ---------------------------------------------------------------


def resource_names(count: int) -> list[str]:
    return [f"r{i}" for i in range(count)]


def round_robin(resources: int, member_ids: Sequence[str]) -> dict[str, bytes]:
    """Resource i to the i-th member by id, cycling: disjoint and covering."""
    members = sorted(member_ids)
    given: dict[str, list[str]] = {member_id: [] for member_id in members}
    for i, name in enumerate(resource_names(resources)):
        given[members[i % len(members)]].append(name)
    return {member_id: json.dumps(names).encode() for member_id, names in given.items()}


def client_process(job: ClientJob, go: Any, results: Any) -> None:
    """A spawned process running ``job.count`` members until SIGTERM (or SIGKILL).

    Stopping is a signal, not a shared event: setting a multiprocessing Event waits for
    every process waiting on it to wake, and a SIGKILLed one never does.
    """
    # Ctrl-C is the benchmark's to handle: it stops the client processes it started.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        asyncio.run(_run_members(job, go, results))
    except BaseException as exc:
        results.put(("failed", job.worker, f"{type(exc).__name__}: {exc}", None, 0.0))
        return
    results.put(("done", job.worker, None, None, 0.0))


async def _run_members(job: ClientJob, go: Any, results: Any) -> None:
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)

    def member(index: int) -> GroupMember:
        async def assigned(generation: Generation, data: bytes) -> None:
            now = time.monotonic()
            results.put(("assigned", index, generation.generation_id, json.loads(data), now))

        async def revoked() -> None:
            results.put(("revoked", index, None, None, time.monotonic()))

        return GroupMember(
            job.bootstrap,
            job.group_id,
            protocol_type=PROTOCOL_TYPE,
            protocols=lambda: [(PROTOCOL, b"")],
            assign=lambda _leader, _protocol, members: round_robin(job.resources, list(members)),
            on_assigned=assigned,
            on_revoked=revoked,
            session_timeout_ms=job.timing.session_timeout_ms,
            rebalance_timeout_ms=job.timing.rebalance_timeout_ms,
            heartbeat_interval_ms=job.timing.heartbeat_interval_ms,
            client_id=f"bench-{job.worker}",
        )

    members = [member(job.first + i) for i in range(job.count)]
    results.put(("ready", job.worker, None, None, 0.0))
    if not await asyncio.to_thread(go.wait, READY_TIMEOUT_S * 2):
        raise TimeoutError("the benchmark never said go")
    for mbr in members:
        await mbr.start()
    while not stop.is_set():
        failed = next((mbr.failure for mbr in members if mbr.failure is not None), None)
        if failed is not None:
            raise failed
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.5)
    await asyncio.gather(*(mbr.close(leave=True) for mbr in members))


# -- following the group from the parent ------------------------------------------------


@dataclass
class Held:
    generation: int
    resources: list[str]
    at: float


class GroupView:
    """What each member last reported; says when a set of members settled in one generation."""

    def __init__(self, queues: Sequence[Any], resources: int) -> None:
        self.queues = list(queues)
        self.resources = sorted(resource_names(resources))
        self.held: dict[int, Held | None] = {}
        self.revocations: list[tuple[int, float]] = []
        self.procs: list[multiprocessing.process.BaseProcess] = []
        self.ready = 0

    def drain(self, wait: float) -> None:
        """Take the reports that arrived, waiting up to ``wait`` s if there are none."""
        for number, results in enumerate(self.queues):
            try:
                while True:
                    # only the last queue is waited on: the others were just looked at
                    last = number == len(self.queues) - 1
                    report = results.get(timeout=wait) if last else results.get_nowait()
                    wait = 0
                    self._take(*report)
            except queue.Empty:
                pass
        dead = [p for p in self.procs if p.exitcode not in (None, 0, -signal.SIGKILL)]
        if dead:
            raise RuntimeError(f"client process {dead[0].name} died with status {dead[0].exitcode}")

    def _take(self, kind: str, index: int, generation: Any, payload: Any, at: float) -> None:
        if kind == "assigned":
            self.held[index] = Held(generation, payload, at)
        elif kind == "revoked":
            self.held[index] = None
            self.revocations.append((index, at))
        elif kind == "ready":
            self.ready += 1
        elif kind == "failed":
            raise RuntimeError(f"client process {index} failed: {generation}")

    def settled(self, members: Sequence[int], newer_than: int) -> tuple[int, float] | None:
        """(generation, when its last member got its assignment) once ``members`` all hold
        one generation newer than ``newer_than`` with disjoint, covering assignments."""
        held = [self.held.get(i) for i in members]
        if any(h is None for h in held):
            return None
        generations = {h.generation for h in held if h}
        if len(generations) != 1 or (generation := generations.pop()) <= newer_than:
            return None
        if sorted(r for h in held if h for r in h.resources) != self.resources:
            return None
        return generation, max(h.at for h in held if h)

    def wait_settled(
        self, members: Sequence[int], newer_than: int, settle: float, timeout: float, what: str
    ) -> tuple[int, float]:
        """Wait until ``members`` settle and stay settled for ``settle`` s."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.drain(0.05)
            found = self.settled(members, newer_than)
            if found is None:
                continue
            quiet_until = time.monotonic() + settle
            while (left := quiet_until - time.monotonic()) > 0:
                self.drain(min(0.05, left))
                if self.settled(members, newer_than) != found:
                    break
            else:
                return found
        have = sum(1 for i in members if self.held.get(i))
        raise TimeoutError(f"{what}: not settled after {timeout:.0f}s ({have} holding assignments)")


# -- one group size ---------------------------------------------------------------------


def split(total: int, parts: int) -> list[int]:
    """``total`` as ``parts`` counts differing by at most one (no zero counts)."""
    parts = max(1, min(parts, total))
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def measure_group(bootstrap: str, size: int, server_pid: int, settings: Settings) -> dict[str, Any]:
    ctx = multiprocessing.get_context("spawn")
    # the victim reports on a queue of its own: killed while writing to a shared one, it
    # could leave that queue's lock held and silence everyone else
    victim_results, results = ctx.Queue(), ctx.Queue()
    go = ctx.Event()
    group_id = f"bench-{size}"
    view = GroupView([victim_results, results], resources=size)
    timing = settings.timing
    # member 0 is the victim, alone in its process; the others share the rest
    jobs = [ClientJob(0, bootstrap, group_id, 0, 1, size, timing)]
    first = 1
    for worker, count in enumerate(split(size - 1, settings.client_processes), start=1):
        if count:
            jobs.append(ClientJob(worker, bootstrap, group_id, first, count, size, timing))
            first += count
    try:
        for job in jobs:
            reports = victim_results if job.worker == 0 else results
            proc = ctx.Process(
                target=client_process, args=(job, go, reports), name=f"clients-{job.worker}"
            )
            proc.daemon = True
            proc.start()
            view.procs.append(proc)
        _wait_ready(view, len(jobs))
        client_pids = [p.pid for p in view.procs if p.pid is not None]
        meter = CpuMeter(server_pid, client_pids)
        started = time.monotonic()
        go.set()
        everyone = list(range(size))
        generation, stable_at = view.wait_settled(
            everyone, 0, settings.settle_s, settings.phase_timeout_s, f"{size} members joining"
        )
        join = {
            "seconds_to_stable": round(stable_at - started, 3),
            "generation": generation,
            "cpu": meter.read(),
        }
        _procs.progress(f"{size} members: stable in generation {generation} after {join}")

        victim = view.procs[0]
        survivors = everyone[1:]
        view.revocations.clear()
        assert victim.pid is not None
        meter = CpuMeter(server_pid, client_pids[1:])
        os.kill(victim.pid, signal.SIGKILL)
        killed_at = time.monotonic()
        victim.join(timeout=10)
        session_s = timing.session_timeout_ms / 1000
        after, rebalanced_at = view.wait_settled(
            survivors,
            generation,
            settings.settle_s,
            session_s + settings.phase_timeout_s,
            f"{size - 1} survivors after a kill -9",
        )
        noticed = min((at for _, at in view.revocations), default=rebalanced_at)
        to_new = rebalanced_at - killed_at
        crash = {
            "session_timeout_ms": timing.session_timeout_ms,
            "seconds_to_new_generation": round(to_new, 3),
            "beyond_session_timeout_s": round(to_new - session_s, 3),
            "first_revocation_after_s": round(noticed - killed_at, 3),
            "rebalance_s": round(rebalanced_at - noticed, 3),
            "generation_before": generation,
            "generation_after": after,
            "cpu": meter.read(),
        }
        _procs.progress(f"{size} members: after kill -9 {crash}")
        return {"members": size, "client_processes": len(jobs) - 1, "join": join, "crash": crash}
    finally:
        go.set()  # a process still waiting for it must get to its SIGTERM handler
        _stop_clients(view)
        asyncio.run(_wait_empty(bootstrap, group_id))


class CpuMeter:
    """CPU used over one phase by the server, by the client processes, and by anything
    else on the machine (``other_cpu_pct``, in % of one core: well above zero means the
    figures competed with something else)."""

    def __init__(self, server_pid: int, client_pids: Sequence[int]) -> None:
        self.server_pid = server_pid
        self.client_pids = list(client_pids)
        self.started = time.monotonic()
        self.machine = _procs.MachineCpu.read()
        self.before = self._cpu()

    def _cpu(self) -> dict[int, float]:
        used = {}
        for pid in [self.server_pid, *self.client_pids]:
            with contextlib.suppress(OSError):
                used[pid] = _procs.cpu_seconds(pid)
        return used

    def read(self) -> dict[str, float]:
        after, wall = self._cpu(), time.monotonic() - self.started
        spent = {pid: after[pid] - self.before[pid] for pid in after if pid in self.before}
        server = spent.get(self.server_pid, 0.0)
        clients = sum(spent.values()) - server
        busy = _procs.MachineCpu.read().busy_fraction_since(self.machine)
        other = busy * (os.cpu_count() or 1) * wall - server - clients
        return {
            "server_cpu_s": round(server, 2),
            "clients_cpu_s": round(clients, 2),
            "other_cpu_pct": round(max(0.0, other) / wall * 100) if wall > 0 else 0,
        }


def _wait_ready(view: GroupView, count: int) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while view.ready < count:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{count - view.ready} client process(es) never got ready")
        view.drain(0.1)


def _stop_clients(view: GroupView, timeout: float = 15.0) -> None:
    """SIGTERM the client processes, wait for their members to leave and the processes
    to exit, reading their last reports meanwhile (a process does not exit before what it
    queued is read); SIGKILL what is left."""
    for p in view.procs:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + timeout
    while any(p.is_alive() for p in view.procs) and time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            view.drain(0.1)
    for p in view.procs:
        if p.is_alive():
            p.kill()
        p.join(timeout=5)


async def _wait_empty(bootstrap: str, group_id: str, timeout: float = 30.0) -> None:
    """Let the coordinator forget the last group before the next one is measured."""
    admin = CoordinatorClient(bootstrap)
    try:
        async with asyncio.timeout(timeout):
            while True:
                reply = await admin.request(
                    apis.DESCRIBE_GROUPS, m.DescribeGroupsRequest(group_ids=[group_id])
                )
                if reply.groups and reply.groups[0].state in ("Empty", "Dead"):
                    return
                await asyncio.sleep(0.2)
    except (TimeoutError, HerderError) as exc:
        _procs.progress(f"group {group_id} did not empty ({exc}); carrying on")
    finally:
        await admin.close()


# -- a rolling restart of real member processes ------------------------------------------


def _member_events(service: _procs.Service) -> list[dict[str, Any]]:
    """The JSON event lines a ``herder verifiable member`` printed so far."""
    found = []
    for line in service.log_since(0).splitlines():
        if line.startswith("{"):
            with contextlib.suppress(ValueError):
                event = json.loads(line)
                if isinstance(event, dict) and "event" in event:
                    found.append(event)
    return found


class RollingGroup:
    """M ``herder verifiable member`` processes of one group, restarted one at a time."""

    def __init__(
        self, services: _procs.Services, bootstrap: str, static: bool, settings: Settings
    ) -> None:
        self.services = services
        self.bootstrap = bootstrap
        self.static = static
        self.settings = settings
        self.kind = "static" if static else "dynamic"
        self.group_id = f"rolling-{self.kind}"
        self.resources = [f"r{i}" for i in range(2 * settings.rolling_members)]
        self.current: list[_procs.Service] = []
        #: when each process was told to stop, in epoch milliseconds, as its events count
        self.stopped_at: dict[str, int] = {}
        self.every: list[_procs.Service] = []
        self._started = 0

    def start(self, index: int) -> _procs.Service:
        settings = self.settings
        static = ["--instance-id", f"member-{index}"] if self.static else []
        self._started += 1
        service = self.services.start(
            f"{self.group_id}-{index}-{self._started}",
            [
                sys.executable,
                *("-m", "herder", "verifiable", "member", *static),
                *("--group", self.group_id, "--protocol", PROTOCOL),
                *("--protocol-type", PROTOCOL_TYPE, "--resources", ",".join(self.resources)),
                *("--client-id", f"rolling-{index}"),
                *("--session-timeout-ms", str(settings.rolling_session_timeout_ms)),
                *("--rebalance-timeout-ms", str(settings.rebalance_timeout_ms)),
                *("--heartbeat-interval-ms", str(settings.heartbeat_interval_ms)),
                *("--bootstrap", self.bootstrap),
            ],
        )
        self.every.append(service)
        return service

    def settled(self) -> tuple[int, float] | None:
        """(generation, when its last process took its assignment, epoch s) once every
        current process holds an assignment of one generation, disjoint and covering."""
        latest = []
        for service in self.current:
            service.check_alive()
            events = _member_events(service)
            if not events or events[-1]["event"] != "joined":
                return None
            latest.append(events[-1])
        if len({event["generation"] for event in latest}) != 1:
            return None
        if sorted(r for event in latest for r in event["assignment"]) != sorted(self.resources):
            return None
        return latest[0]["generation"], max(event["timestamp"] for event in latest) / 1000

    def wait_settled(self, what: str) -> tuple[int, float]:
        settings = self.settings
        deadline = time.monotonic() + settings.phase_timeout_s
        while time.monotonic() < deadline:
            found = self.settled()
            if found is None:
                time.sleep(0.05)
                continue
            quiet_until = time.monotonic() + settings.settle_s
            while time.monotonic() < quiet_until and self.settled() == found:
                time.sleep(0.05)
            if self.settled() == found:
                return found
        raise TimeoutError(f"{self.kind} {what}: not settled after {settings.phase_timeout_s:.0f}s")

    def stop(self, service: _procs.Service) -> int | None:
        # the events' timestamps are whole milliseconds: so is the moment of the stop
        self.stopped_at.setdefault(service.name, int(time.time() * 1000))
        return service.stop()

    def revocations(self, since_ms: int) -> int:
        """Assignments given up from ``since_ms`` (epoch ms) on because of a rebalance,
        not because the process itself was stopped."""
        count = 0
        for service in self.every:
            stopped = self.stopped_at.get(service.name, 2**63)
            count += sum(
                1
                for event in _member_events(service)
                if event["event"] == "revoked" and since_ms <= event["timestamp"] < stopped
            )
        return count

    def stop_all(self) -> None:
        for service in self.current:
            self.stop(service)


async def _generation(bootstrap: str, group_id: str) -> int:
    admin = CoordinatorClient(bootstrap)
    try:
        reply = await admin.request(
            apis.DESCRIBE_GROUPS, m.DescribeGroupsRequest(group_ids=[group_id])
        )
        return reply.groups[0].generation_id
    finally:
        await admin.close()


def measure_rolling_restart(
    services: _procs.Services, bootstrap: str, server_pid: int, static: bool, settings: Settings
) -> dict[str, Any]:
    """Restart every member of a settled group in turn; count rebalances and time it."""
    group = RollingGroup(services, bootstrap, static, settings)
    size = settings.rolling_members
    try:
        group.current = [group.start(i) for i in range(size)]
        group.wait_settled("group forming")
        before = asyncio.run(_generation(bootstrap, group.group_id))
        server_cpu = _procs.cpu_seconds(server_pid)
        started = time.time()
        per_restart, member_out = [], []
        for index in range(size):
            old = group.current[index]
            stop_sent = time.time()
            status = group.stop(old)
            if status != 0:
                raise RuntimeError(f"{old.name} exited with status {status}:\n{old.log_tail()}")
            new = group.current[index] = group.start(index)
            _, settled_at = group.wait_settled(f"restart of member {index}")
            joined = [e for e in _member_events(new) if e["event"] == "joined"]
            member_out.append(joined[0]["timestamp"] / 1000 - stop_sent)
            per_restart.append(settled_at - stop_sent)
            _procs.progress(
                f"rolling restart ({group.kind}): member {index} back after {per_restart[-1]:.2f}s"
            )
        after = asyncio.run(_generation(bootstrap, group.group_id))
        figures = {
            "members": size,
            "rebalances": after - before,
            "generation_before": before,
            "generation_after": after,
            "revocations": group.revocations(since_ms=int(started * 1000)),
            "seconds": round(settled_at - started, 3),
            "per_restart_s": _procs.spread(per_restart),
            "member_out_s": _procs.spread(member_out),
            "server_cpu_s": round(_procs.cpu_seconds(server_pid) - server_cpu, 2),
        }
        _procs.progress(f"rolling restart ({group.kind}): {figures}")
        return figures
    finally:
        group.stop_all()


def rolling_restarts(
    services: _procs.Services, bootstrap: str, server_pid: int, settings: Settings
) -> tuple[dict[str, Any], int]:
    """The same rolling restart of static members, then of dynamic ones, side by side."""
    figures: dict[str, Any] = {
        "members": settings.rolling_members,
        "session_timeout_ms": settings.rolling_session_timeout_ms,
    }
    status = 0
    for static in (True, False):
        kind = "static" if static else "dynamic"
        try:
            figures[kind] = measure_rolling_restart(
                services, bootstrap, server_pid, static, settings
            )
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            _procs.progress(f"rolling restart of {kind} members failed: {error}")
            figures[kind] = {"error": error}
            status = 1
    static_figures, dynamic_figures = figures["static"], figures["dynamic"]
    if "error" not in static_figures and "error" not in dynamic_figures:
        figures["static_vs_dynamic"] = {
            "rebalances": [static_figures["rebalances"], dynamic_figures["rebalances"]],
            "revocations": [static_figures["revocations"], dynamic_figures["revocations"]],
            "seconds": [static_figures["seconds"], dynamic_figures["seconds"]],
            "seconds_ratio": _procs.ratio(static_figures["seconds"], dynamic_figures["seconds"]),
        }
    return figures, status


# -- the server -------------------------------------------------------------------------


def server_properties(data_dir: Path, port: int, settings: Settings) -> str:
    props = {
        "dataDir": data_dir,
        "clientPort": port,
        "clientPortAddress": "127.0.0.1",
        "tickTime": settings.tick_time_ms,
        "group.initial.rebalance.delay.ms": 0,
        "group.min.session.timeout.ms": 1000,
        # every member is a connection from 127.0.0.1; ZooKeeper's per-address limit
        # of 60 would turn the big groups away
        "maxClientCnxns": 0,
    }
    return "".join(f"{key}={value}\n" for key, value in props.items())


async def _coordinator_answers(bootstrap: str) -> bool:
    admin = CoordinatorClient(bootstrap)
    try:
        reply = await admin.request(apis.LIST_GROUPS, m.ListGroupsRequest())
        return reply.error_code == 0
    finally:
        await admin.close()


@dataclass(frozen=True)
class Settings:
    members: tuple[int, ...]
    client_processes: int
    session_timeout_ms: int
    heartbeat_interval_ms: int
    rebalance_timeout_ms: int
    settle_s: float
    phase_timeout_s: float
    tick_time_ms: int
    rolling_members: int = 5
    rolling_session_timeout_ms: int = 10_000

    @property
    def timing(self) -> Timing:
        return Timing(
            self.session_timeout_ms, self.heartbeat_interval_ms, self.rebalance_timeout_ms
        )


def run(settings: Settings, tmp_dir: str | None) -> tuple[dict[str, Any], int]:
    figures: dict[str, Any] = {
        "benchmark": "rebalance",
        "cpu_count": os.cpu_count(),
        "machine": _procs.machine_info(),
        "herder_version": herder_version,
        "config": {
            **asdict(settings),
            "group.initial.rebalance.delay.ms": 0,
            "group.min.session.timeout.ms": 1000,
            "maxClientCnxns": 0,
        },
        "results": [],
    }
    status = 0
    with tempfile.TemporaryDirectory(prefix="herder-bench-", dir=tmp_dir) as tmp:
        work_dir = Path(tmp)
        port = _procs.free_port()
        bootstrap = f"127.0.0.1:{port}"
        data_dir = work_dir / "data"
        data_dir.mkdir()
        config = work_dir / "ensemble.properties"
        config.write_text(server_properties(data_dir, port, settings))
        with _procs.Services(work_dir) as services:
            server = services.start(
                "ensemble",
                [sys.executable, "-m", "herder", "ensemble", "start", "--config", str(config)],
            )

            def answers() -> bool:
                server.check_alive()
                return _procs.port_open(port) and asyncio.run(_coordinator_answers(bootstrap))

            _procs.wait_until(answers, timeout=READY_TIMEOUT_S, what="the coordinator answering")
            _procs.progress(f"ensemble server up on {bootstrap} (pid {server.pid})")
            figures["server_cmd"] = server.args
            for size in settings.members:
                try:
                    figures["results"].append(measure_group(bootstrap, size, server.pid, settings))
                except Exception as exc:
                    error = f"{type(exc).__name__}: {exc}"
                    _procs.progress(f"{size} members failed: {error}")
                    figures["results"].append({"members": size, "error": error})
                    status = 1
                server.check_alive()
            if settings.rolling_members:
                rolling, failed = rolling_restarts(services, bootstrap, server.pid, settings)
                figures["rolling_restart"] = rolling
                status = status or failed
                server.check_alive()
            figures["server_cpu_s_total"] = round(_procs.cpu_seconds(server.pid), 2)
    return figures, status


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="bench/rebalance.py",
        description="Group formation and crash recovery times of herder's group coordinator "
        "with N real members. JSON on stdout.",
    )
    parser.add_argument(
        "--members", default="10,100,500", help="group sizes, comma-separated (default 10,100,500)"
    )
    parser.add_argument(
        "--client-processes",
        type=int,
        default=2,
        help="processes sharing the members, besides the victim's (default 2)",
    )
    parser.add_argument("--session-timeout-ms", type=int, default=6000)
    parser.add_argument("--heartbeat-interval-ms", type=int, default=1000)
    parser.add_argument("--rebalance-timeout-ms", type=int, default=60_000)
    parser.add_argument(
        "--settle", type=float, default=1.0, help="seconds a group must stay settled (default 1)"
    )
    parser.add_argument(
        "--phase-timeout",
        type=float,
        default=90.0,
        help="give up on one phase after this many seconds (default 90)",
    )
    parser.add_argument("--tick-time-ms", type=int, default=2000, help="the server's tickTime")
    parser.add_argument(
        "--rolling-members",
        type=int,
        default=5,
        help="member processes restarted one by one, static then dynamic (default 5; 0 skips)",
    )
    parser.add_argument(
        "--rolling-session-timeout-ms",
        type=int,
        default=10_000,
        help="the rolling restart's session timeout: above a process's start-up time",
    )
    parser.add_argument(
        "--only-rolling", action="store_true", help="skip the join and crash measurements"
    )
    parser.add_argument("--tmp-dir", default=None, help="where the data directory goes")
    parser.add_argument("--pretty", action="store_true", help="indent the JSON")
    args = parser.parse_args(argv)
    try:
        args.member_counts = tuple(int(n) for n in args.members.split(",") if n.strip())
    except ValueError:
        parser.error("--members takes integers, e.g. 10,100,500")
    if args.only_rolling:
        args.member_counts = ()
    elif not args.member_counts or min(args.member_counts) < 2:
        parser.error("--members: every group needs at least 2 members (one is killed)")
    if args.rolling_members < 0 or (args.only_rolling and not args.rolling_members):
        parser.error("--rolling-members must be positive (or 0 without --only-rolling)")
    if args.rolling_session_timeout_ms <= args.heartbeat_interval_ms:
        parser.error("--rolling-session-timeout-ms must be above --heartbeat-interval-ms")
    if args.client_processes < 1:
        parser.error("--client-processes must be at least 1")
    if not 0 < args.heartbeat_interval_ms < args.session_timeout_ms:
        parser.error("--heartbeat-interval-ms must be positive and below --session-timeout-ms")
    if args.session_timeout_ms < 1000:
        parser.error("--session-timeout-ms must be at least 1000 (the server's minimum)")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    settings = Settings(
        members=args.member_counts,
        client_processes=args.client_processes,
        session_timeout_ms=args.session_timeout_ms,
        heartbeat_interval_ms=args.heartbeat_interval_ms,
        rebalance_timeout_ms=args.rebalance_timeout_ms,
        settle_s=args.settle,
        phase_timeout_s=args.phase_timeout,
        tick_time_ms=args.tick_time_ms,
        rolling_members=args.rolling_members,
        rolling_session_timeout_ms=args.rolling_session_timeout_ms,
    )
    return _procs.run_and_report(lambda: run(settings, args.tmp_dir), pretty=args.pretty)


if __name__ == "__main__":
    sys.exit(main())
