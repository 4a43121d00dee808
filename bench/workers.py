"""How the worker runtime scales with the number of tasks it runs.

    python bench/workers.py [--connectors 90] [--tasks 10] [--workers 3]
                            [--protocols eager,sessioned] [--max-delay-ms 5000]
                            [--no-static] [--session-timeout-ms 10000] [--poll-ms 200]
                            [--timeout-s 600] [--sample-s 5] [--failed-grace-s 30]
                            [--tmp-dir D] [--pretty] [--keep-work-dir]

Everything below runs once per ``connect.protocol`` of ``--protocols`` (default: eager,
then sessioned, side by side in one run), each on a cluster of its own; the figures of
each are under ``protocols.<name>``, and ``comparison`` puts the headline figures of all
of them next to each other.

One ensemble server and W worker processes (``herder worker start``) on 127.0.0.1, then
C connectors of T tasks each. The connector is ``bench.idle_connector``'s: its tasks
poll nothing (each poll waits ``--poll-ms`` and returns None), and the workers start no
JVM (``dataplane.spark.warmup=false``), so what is measured is the runtime's own cost
per task. The server keeps its default ``maxClientCnxns``: every worker and every task
connects from 127.0.0.1, and whether the server turned connections away is one of the
figures. Measured, in order:

* **create**: the C ``POST /connectors``, one at a time, round-robin over the workers
  (120 s timeout each): the time from the first to the last answer, the status codes
  (``"timeout"`` for none within 120 s), the bodies of the first few answers that were
  not 2xx, and the min/median/max of one create's latency.
* **all RUNNING**: ``GET /connectors?expand=status`` every 0.5 s until every task of
  every connector created (answered 2xx) is RUNNING; ``all_running_s`` from the first create,
  ``after_last_create_s`` from the last create's answer (null, with the states last
  seen, if it did not happen within ``--timeout-s``, or if a task is FAILED and the
  status has not changed for ``--failed-grace-s``, default 30: a FAILED task waits for
  a user's restart, so waiting longer only burns the time; the same holds for the waits
  below). The first FAILED task's trace is kept.
* **processes**: then, per worker and for the server, threads, RSS, established TCP
  connections to (for the server: on) the ensemble's client port (the process's socket
  inodes matched against ``/proc/net/tcp``), child processes (a JVM would be one), CPU
  seconds so far, and CPU in % of one core over ``--sample-s`` seconds of idling.
* **one more connector**: with every task RUNNING, one more connector is created; how
  many of the tasks already running were stopped meanwhile (the workers' "task ...
  stopped" log lines; goal 0: under ``sessioned`` nothing that runs moves, under
  ``eager`` every task stops) and how long until the new one's tasks run too.
* **rolling restart** (workers are static, ``group.instance.id``, unless ``--no-static``):
  each worker in turn is stopped with SIGTERM and started again with the same config,
  waiting for every task to be RUNNING before the next; the tasks that ended on another
  worker than before (goal 0), the tasks other workers stopped meanwhile, and the
  generations the group went through.
* **kill9**: a worker that is not the group's leader (as the workers' logs name it) is
  killed with SIGKILL; the time until every task is RUNNING on a survivor, and that
  time minus ``session.timeout.ms`` (and, cooperative, ``scheduled.rebalance.max.delay.ms``
  too: the survivors wait that long for the worker to come back).
* **restart**: a new worker with the same properties starts; the time until it prints
  that its REST API is up, until one task is RUNNING on it, and until every task is
  RUNNING again (an eager rebalance restarts them all).

``targets`` says, for each protocol, whether every task ran within 10 s of the last
create (60 s under eager), whether creating one more connector stopped no task, whether
the rolling restart moved none, whether the survivors took over within 5 s beyond the
session timeout (and delay), and whether no create got a 5xx or no answer. Figures go
to stdout as one JSON object, progress to stderr; every process started is stopped by
PID in ``finally`` blocks. Under eager each create rebalances the group and restarts
every task, so with the defaults (900 tasks) the creates alone may take minutes;
``--connectors 3 --tasks 2 --workers 2`` runs in about a minute.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the ``bench`` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx

from bench import _procs
from herder import __version__ as herder_version

HERDER = [sys.executable, "-m", "herder"]
#: workers run here, so that ``bench.idle_connector`` is importable by its dotted name
REPO_ROOT = Path(__file__).resolve().parent.parent
CONNECTOR_CLASS = "bench.idle_connector.IdleSourceConnector"
GROUP_ID = "bench-workers"

READY_LINE = re.compile(r"^worker (\S+) REST API at (\S+)$", re.MULTILINE)
GENERATION_LINE = re.compile(
    r"worker (\S+): generation (\d+), \d+ connectors and \d+ tasks \(leader at (\S+)\)"
)
LOG_LINE = re.compile(r"^\S+ \S+ (WARNING|ERROR|CRITICAL) (.*)$", re.MULTILINE)
REFUSED = "too many connections"

READY_TIMEOUT_S = 120.0
CREATE_TIMEOUT_S = 120.0
STATUS_TIMEOUT_S = 30.0
POLL_INTERVAL_S = 0.5
FAILURES_KEPT = 5
TRACE_CHARS = 1500
TCP_ESTABLISHED = "01"

#: all tasks RUNNING within this long of the last create, by protocol
TARGET_RUNNING_AFTER_LAST_CREATE_S = {"eager": 60, "compatible": 10, "sessioned": 10}
TARGET_KILL9_BEYOND_SESSION_S = 5
TARGET_FAILED_CREATES = 0
TARGET_TASKS_STOPPED_BY_ONE_CREATE = 0
TARGET_TASKS_MOVED_BY_ROLLING_RESTART = 0
STOPPED_LINE = re.compile(r" task (\S+) stopped on (\S+)$", re.MULTILINE)


# -- what the workers report -------------------------------------------------------------


@dataclass(frozen=True)
class Snapshot:
    """One answer of ``GET /connectors?expand=status``, reduced to what is counted."""

    connectors: int
    connector_states: Counter[str]
    #: (state, worker_id) of every task listed
    tasks: list[tuple[str, str]]
    #: connectors listing fewer tasks than ``tasks.max``
    short: int
    #: the trace of the first FAILED task listed
    failed_trace: str | None = field(default=None, compare=False)
    #: "<connector>-<task>" -> the worker id its status names
    owners: dict[str, str] = field(default_factory=dict, compare=False)

    @classmethod
    def parse(cls, body: dict[str, Any], tasks_per_connector: int) -> Snapshot:
        states: Counter[str] = Counter()
        tasks: list[tuple[str, str]] = []
        short = 0
        failed_trace = None
        owners: dict[str, str] = {}
        for name, entry in body.items():
            status = entry.get("status", {})
            states[status.get("connector", {}).get("state", "?")] += 1
            listed = status.get("tasks", [])
            owners.update({f"{name}-{t.get('id')}": t.get("worker_id", "?") for t in listed})
            short += len(listed) < tasks_per_connector
            tasks.extend((t.get("state", "?"), t.get("worker_id", "?")) for t in listed)
            for task in listed:
                if failed_trace is None and task.get("state") == "FAILED":
                    trace = task.get("trace") or ""
                    # a Python traceback ends with what went wrong
                    tail = trace if len(trace) <= TRACE_CHARS else "..." + trace[-TRACE_CHARS:]
                    failed_trace = f"task {name}-{task.get('id')}: {tail}"
        # sorted: workers may list them in different orders, and a wait compares them
        return cls(len(body), states, sorted(tasks), short, failed_trace, owners)

    @property
    def failed(self) -> int:
        return sum(1 for state, _ in self.tasks if state == "FAILED")

    def all_running(self, connectors: int, on: set[str] | None = None) -> bool:
        """Whether all ``connectors`` are listed with all their tasks, every one RUNNING
        (on one of the workers ``on``, if given)."""
        if self.connectors < connectors or self.short:
            return False
        return all(
            state == "RUNNING" and (on is None or worker in on) for state, worker in self.tasks
        )

    def running_on(self, worker_id: str) -> int:
        return sum(1 for state, worker in self.tasks if state == "RUNNING" and worker == worker_id)

    def counts(self, names: dict[str, str]) -> dict[str, Any]:
        """The states seen, for a report of a wait that ran out of time; ``names`` are
        the benchmark's names of the workers by their ids."""
        return {
            "connectors_listed": self.connectors,
            "connector_states": dict(self.connector_states),
            "connectors_short_of_tasks": self.short,
            "tasks_listed": len(self.tasks),
            "task_states": dict(Counter(state for state, _ in self.tasks)),
            "running_tasks_per_worker": self.running_per_worker(names),
            "first_failed_trace": self.failed_trace,
        }

    def running_per_worker(self, names: dict[str, str]) -> dict[str, int]:
        """RUNNING tasks per worker, by ``names[worker_id]`` where there is one."""
        running = Counter(names.get(w, w) for state, w in self.tasks if state == "RUNNING")
        return dict(sorted(running.items()))


# -- processes, seen from /proc ----------------------------------------------------------


def _socket_inodes(pid: int) -> set[int]:
    inodes: set[int] = set()
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return inodes
    for name in names:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{name}")
        except OSError:
            continue  # closed meanwhile
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes


def _tcp_sockets() -> dict[int, tuple[int, int, str]]:
    """Every TCP socket of this network namespace: inode → (local port, remote port, state)."""
    sockets = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, remote, state, inode = fields[1], fields[2], fields[3], int(fields[9])
            sockets[inode] = (
                int(local.rsplit(":", 1)[1], 16),
                int(remote.rsplit(":", 1)[1], 16),
                state,
            )
    return sockets


def ensemble_connections(pid: int, port: int, *, serving: bool = False) -> int:
    """Established TCP connections of ``pid`` to the ensemble's client ``port`` (with
    ``serving``: those it accepted on that port)."""
    sockets = _tcp_sockets()
    count = 0
    for inode in _socket_inodes(pid):
        found = sockets.get(inode)
        if found is None:
            continue
        local, remote, state = found
        if state == TCP_ESTABLISHED and (local if serving else remote) == port:
            count += 1
    return count


def process_sample(pid: int, ensemble_port: int, *, serving: bool = False) -> dict[str, Any]:
    """Threads, RSS, ensemble connections, child processes and CPU seconds of ``pid``."""
    rss_kb = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss_kb = int(line.split()[1])
    return {
        "pid": pid,
        "threads": len(os.listdir(f"/proc/{pid}/task")),
        "rss_mb": round(rss_kb / 1024, 1),
        "ensemble_connections": ensemble_connections(pid, ensemble_port, serving=serving),
        "child_processes": len(_procs.children_by_parent().get(pid, [])),
        "cpu_s": round(_procs.cpu_seconds(pid), 2),
    }


def idle_cpu_pct(pids: dict[str, int], seconds: float) -> dict[str, float]:
    """CPU of each process in % of one core over ``seconds`` of doing nothing asked of it."""
    before = {name: _procs.cpu_seconds(pid) for name, pid in pids.items()}
    began = time.monotonic()
    time.sleep(seconds)
    wall = time.monotonic() - began
    return {
        name: round((_procs.cpu_seconds(pid) - before[name]) / wall * 100, 1)
        for name, pid in pids.items()
    }


def log_summary(service: _procs.Service) -> dict[str, Any]:
    """How many WARNING and ERROR lines a process logged, and its first few errors."""
    text = service.log_since(0)
    levels: Counter[str] = Counter()
    errors: list[str] = []
    for match in LOG_LINE.finditer(text):
        level = "warnings" if match.group(1) == "WARNING" else "errors"
        levels[level] += 1
        if level == "errors" and len(errors) < 3:
            errors.append(match.group(2)[:300])
    return {"warnings": levels["warnings"], "errors": levels["errors"], "first_errors": errors}


# -- the cluster -------------------------------------------------------------------------


@dataclass(frozen=True)
class Wait:
    """How a wait for a status ended: when the condition was seen (None if never), the
    last status seen, and why the wait gave up."""

    at: float | None
    last: Snapshot | None
    gave_up: str | None = None

    def report(self, names: dict[str, str]) -> dict[str, Any]:
        """Why it gave up and the states last seen (for a wait that did)."""
        return {
            "gave_up": self.gave_up,
            "last_seen": self.last.counts(names) if self.last is not None else None,
        }


@dataclass
class Worker:
    name: str
    service: _procs.Service
    worker_id: str
    url: str
    command: list[str] = field(default_factory=list)


def _properties(values: dict[str, object]) -> str:
    return "".join(f"{key}={value}\n" for key, value in values.items())


@dataclass
class Cluster:
    """One ensemble server and the workers of one group, and a client of their REST API."""

    args: argparse.Namespace
    services: _procs.Services
    work: Path
    http: httpx.Client
    #: the workers' connect.protocol
    protocol: str = "sessioned"
    ensemble_port: int = 0
    server: _procs.Service | None = None
    workers: list[Worker] = field(default_factory=list)
    #: connectors whose create was answered with a 2xx: the waits wait for their tasks
    created: int = 0
    #: the benchmark's name of every worker started, by worker id
    names: dict[str, str] = field(default_factory=dict)
    started_workers: int = 0
    _next_status: int = 0

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.ensemble_port}"

    def ensemble_properties(self) -> dict[str, object]:
        return {
            "dataDir": self.work / "ensemble",
            "clientPort": self.ensemble_port,
            "clientPortAddress": "127.0.0.1",
            "tickTime": 200,
            "group.min.session.timeout.ms": 1000,
        }

    def worker_properties(self, rest_port: int) -> dict[str, object]:
        session_ms = self.args.session_timeout_ms
        return {
            "group.id": GROUP_ID,
            "bootstrap.servers": self.bootstrap,
            "rest.host.name": "127.0.0.1",
            "rest.port": rest_port,
            "session.timeout.ms": session_ms,
            "heartbeat.interval.ms": min(session_ms // 3, 3000),
            "rebalance.timeout.ms": 60_000,
            "storage.root": self.work / "topics",
            "dataplane.spark.warmup": "false",
            "spark.master": "local[1]",
            "spark.ui.enabled": "false",
            "connect.protocol": self.protocol,
            "scheduled.rebalance.max.delay.ms": self.args.max_delay_ms,
        }

    def start_server(self) -> None:
        self.ensemble_port = _procs.free_port()
        (self.work / "ensemble").mkdir()
        config = self.work / "ensemble.properties"
        config.write_text(_properties(self.ensemble_properties()))
        with _procs.children_ignore_sigint():
            self.server = self.services.start(
                "ensemble", [*HERDER, "ensemble", "start", "--config", str(config)]
            )
        server = self.server

        def listening() -> bool:
            server.check_alive()
            return _procs.port_open(self.ensemble_port)

        _procs.wait_until(listening, timeout=READY_TIMEOUT_S, what="the ensemble server")
        _procs.progress(f"ensemble server on {self.bootstrap} (pid {server.pid})")

    def start_worker(self) -> Worker:
        """Start one more worker and wait until it says its REST API is up."""
        self.started_workers += 1
        name = f"worker-{self.started_workers}"
        config = self.work / f"{name}.properties"
        properties = self.worker_properties(_procs.free_port())
        if self.args.static:
            properties["group.instance.id"] = name
        config.write_text(_properties(properties))
        command = [*HERDER, "--log-level", "INFO", "worker", "start", "--config", str(config)]
        with _procs.children_ignore_sigint():
            service = self.services.start(name, command, cwd=REPO_ROOT)

        def ready() -> re.Match[str] | None:
            service.check_alive()
            return READY_LINE.search(service.log_since(0))

        found = _procs.wait_until(ready, timeout=READY_TIMEOUT_S, what=f"{name}'s REST API")
        assert isinstance(found, re.Match)
        worker = Worker(name, service, found.group(1), found.group(2), command)
        self.workers.append(worker)
        self.names[worker.worker_id] = name
        _procs.progress(f"{name}: worker {worker.worker_id} at {worker.url} (pid {service.pid})")
        return worker

    def restart_in_place(self, worker: Worker) -> None:
        """SIGTERM ``worker`` and start it again with the same config (same port, same
        ``group.instance.id``); wait until it says its REST API is up."""
        worker.service.stop()
        offset = worker.service.log_size()
        with _procs.children_ignore_sigint():
            service = self.services.start(worker.name, worker.command, cwd=REPO_ROOT)

        def ready() -> re.Match[str] | None:
            service.check_alive()
            return READY_LINE.search(service.log_since(offset))

        _procs.wait_until(ready, timeout=READY_TIMEOUT_S, what=f"{worker.name}'s REST API")
        worker.service = service

    def log_offsets(self) -> dict[str, int]:
        return {w.name: w.service.log_size() for w in self.workers}

    def tasks_stopped_since(
        self, offsets: dict[str, int], *, besides: str | None = None
    ) -> dict[str, int]:
        """Tasks each worker (but ``besides``) logged as stopped since ``offsets``."""
        return {
            w.name: len(STOPPED_LINE.findall(w.service.log_since(offsets.get(w.name, 0))))
            for w in self.workers
            if w.name != besides
        }

    def latest_generation(self) -> tuple[dict[str, int], str | None]:
        """Each worker's latest generation, and the leader the newest one names."""
        generations: dict[str, int] = {}
        newest, leader = -1, None
        for worker in self.workers:
            for match in GENERATION_LINE.finditer(worker.service.log_since(0)):
                generation = int(match.group(2))
                generations[worker.name] = generation
                if generation >= newest:
                    newest, leader = generation, match.group(3)
        return generations, leader

    def wait_group_formed(self) -> int:
        """Wait until every worker holds one generation (which then has them all)."""

        def formed() -> int | None:
            self.check_alive()
            generations, _ = self.latest_generation()
            held = set(generations.values())
            if len(generations) == len(self.workers) and len(held) == 1:
                return held.pop()
            return None

        found = _procs.wait_until(formed, timeout=READY_TIMEOUT_S, what="the worker group forming")
        assert isinstance(found, int)
        return found

    def check_alive(self) -> None:
        if self.server is not None:
            self.server.check_alive()
        for worker in self.workers:
            worker.service.check_alive()

    def status(self) -> Snapshot | None:
        """The cluster's status as some worker reports it (each asked in turn), or None
        if the one asked did not answer."""
        worker = self.workers[self._next_status % len(self.workers)]
        self._next_status += 1
        try:
            reply = self.http.get(
                f"{worker.url}/connectors",
                params={"expand": "status"},
                timeout=STATUS_TIMEOUT_S,
            )
        except httpx.HTTPError:
            return None
        if reply.status_code != 200:
            return None
        return Snapshot.parse(reply.json(), self.args.tasks)

    def wait_for(self, condition: Callable[[Snapshot], bool], deadline: float) -> Wait:
        """Poll the status every 0.5 s until ``condition`` holds, ``deadline`` passes, or
        some task is FAILED and nothing has changed for ``--failed-grace-s``.

        A FAILED task stays so until a user restarts it or a rebalance moves it, so a
        status with one that stands still is as far as the wait will get.
        """
        last = None
        unchanged_since = time.monotonic()
        while True:
            self.check_alive()
            snapshot = self.status()
            seen = time.monotonic()
            if snapshot is not None:
                if snapshot != last:
                    unchanged_since = seen
                last = snapshot
                if condition(snapshot):
                    return Wait(seen, snapshot)
                if snapshot.failed and seen - unchanged_since >= self.args.failed_grace_s:
                    return Wait(
                        None,
                        snapshot,
                        f"{snapshot.failed} tasks FAILED and the status unchanged for "
                        f"{self.args.failed_grace_s:g}s",
                    )
            if seen >= deadline:
                return Wait(None, last, f"not within --timeout-s ({self.args.timeout_s:g}s)")
            time.sleep(min(POLL_INTERVAL_S, max(0.0, deadline - seen)))


# -- the phases --------------------------------------------------------------------------


def create_connectors(cluster: Cluster) -> tuple[float, float, dict[str, Any]]:
    """POST every connector, round-robin over the workers, one at a time; (first sent,
    last answered, figures)."""
    args = cluster.args
    statuses: Counter[str] = Counter()
    refusals: list[dict[str, Any]] = []
    latencies = []
    every = max(1, args.connectors // 10)
    first = time.monotonic()
    for i in range(args.connectors):
        worker = cluster.workers[i % len(cluster.workers)]
        name = f"idle-{i:04d}"
        config = {
            "connector.class": CONNECTOR_CLASS,
            "tasks.max": str(args.tasks),
            "poll.ms": str(args.poll_ms),
        }
        began = time.monotonic()
        try:
            reply = cluster.http.post(
                f"{worker.url}/connectors",
                json={"name": name, "config": config},
                timeout=CREATE_TIMEOUT_S,
            )
        except httpx.TimeoutException:
            status, body = "timeout", ""
        except httpx.HTTPError as exc:
            status, body = "error", f"{type(exc).__name__}: {exc}"
        else:
            status, body = str(reply.status_code), reply.text
        latencies.append(time.monotonic() - began)
        statuses[status] += 1
        cluster.created += status.startswith("2")
        if not status.startswith("2") and len(refusals) < FAILURES_KEPT:
            refusals.append(
                {"connector": name, "worker": worker.name, "status": status, "body": body[:500]}
            )
        if (i + 1) % every == 0:
            _procs.progress(f"created {i + 1}/{args.connectors} connectors: {dict(statuses)}")
    last = time.monotonic()
    return (
        first,
        last,
        {
            "seconds": round(last - first, 3),
            "statuses": dict(statuses),
            "created": cluster.created,
            "failures": refusals,
            "latency_s": _procs.spread(latencies),
        },
    )


def failed_creates(statuses: dict[str, int]) -> int:
    """Creates answered with a 5xx, or not answered at all."""
    return sum(n for status, n in statuses.items() if not status.isdigit() or int(status) >= 500)


def sample_processes(cluster: Cluster, seconds: float) -> dict[str, Any]:
    assert cluster.server is not None
    port = cluster.ensemble_port
    workers = {w.name: process_sample(w.service.pid, port) for w in cluster.workers}
    server = process_sample(cluster.server.pid, port, serving=True)
    pids = {w.name: w.service.pid for w in cluster.workers}
    pids["server"] = cluster.server.pid
    _procs.progress(f"sampling CPU for {seconds:g}s while the tasks idle")
    idle = idle_cpu_pct(pids, seconds)
    for name, sample in workers.items():
        sample["idle_cpu_pct"] = idle[name]
    server["idle_cpu_pct"] = idle["server"]
    return {"workers": workers, "server": server}


def kill_one(cluster: Cluster, session_timeout_ms: int, timeout_s: float) -> dict[str, Any]:
    """SIGKILL a worker that does not lead the group; time the survivors' takeover."""
    _, leader_url = cluster.latest_generation()
    followers = [w for w in cluster.workers if w.url != leader_url]
    victim = (followers or cluster.workers)[-1]
    survivors = [w for w in cluster.workers if w is not victim]
    on = {w.worker_id for w in survivors}
    _procs.progress(f"kill -9 {victim.name} ({victim.worker_id}; leader at {leader_url})")
    killed_at = time.monotonic()
    victim.service.kill()
    cluster.workers = survivors
    waited = cluster.wait_for(lambda s: s.all_running(cluster.created, on), killed_at + timeout_s)
    figures: dict[str, Any] = {
        "victim": victim.name,
        "victim_was_leader": victim.url == leader_url,
        "session_timeout_ms": session_timeout_ms,
        "seconds": None,
        "beyond_session_timeout_s": None,
    }
    # a cooperative leader holds the departed worker's work back this long
    delay_ms = 0 if cluster.protocol == "eager" else cluster.args.max_delay_ms
    figures["scheduled_delay_ms"] = delay_ms
    if waited.at is None:
        figures.update(waited.report(cluster.names))
    else:
        seconds = waited.at - killed_at
        figures["seconds"] = round(seconds, 3)
        figures["beyond_session_timeout_s"] = round(
            seconds - (session_timeout_ms + delay_ms) / 1000, 3
        )
        figures["running_tasks_per_worker"] = _running_per_worker(cluster, waited)
    return figures


def restart_one(cluster: Cluster, timeout_s: float) -> dict[str, Any]:
    """Start a new worker; time its first RUNNING task and every task RUNNING again."""
    started_at = time.monotonic()
    worker = cluster.start_worker()
    ready_at = time.monotonic()
    deadline = started_at + timeout_s
    figures: dict[str, Any] = {
        "worker": worker.name,
        "rest_api_up_s": round(ready_at - started_at, 3),
        "first_task_running_s": None,
        "all_running_again_s": None,
    }
    waited = cluster.wait_for(lambda s: s.running_on(worker.worker_id) > 0, deadline)
    if waited.at is None:
        figures.update(waited.report(cluster.names))
        return figures
    figures["first_task_running_s"] = round(waited.at - started_at, 3)
    on = {w.worker_id for w in cluster.workers}
    waited = cluster.wait_for(lambda s: s.all_running(cluster.created, on), deadline)
    if waited.at is None:
        figures.update(waited.report(cluster.names))
    else:
        figures["all_running_again_s"] = round(waited.at - started_at, 3)
        figures["running_tasks_per_worker"] = _running_per_worker(cluster, waited)
    return figures


def one_more_connector(cluster: Cluster, timeout_s: float) -> dict[str, Any]:
    """Create one more connector on the loaded cluster: how many running tasks stopped,
    and how long until its tasks run too."""
    args = cluster.args
    running_before = cluster.created * args.tasks
    offsets = cluster.log_offsets()
    worker = cluster.workers[-1]
    config = {"connector.class": CONNECTOR_CLASS, "tasks.max": str(args.tasks)}
    config["poll.ms"] = str(args.poll_ms)
    sent = time.monotonic()
    reply = cluster.http.post(
        f"{worker.url}/connectors",
        json={"name": "one-more", "config": config},
        timeout=CREATE_TIMEOUT_S,
    )
    answered = time.monotonic()
    figures: dict[str, Any] = {
        "status": reply.status_code,
        "create_s": round(answered - sent, 3),
        "running_tasks_before": running_before,
        "tasks_stopped": None,
        "all_running_s": None,
    }
    if reply.status_code // 100 != 2:
        figures["body"] = reply.text[:500]
        return figures
    cluster.created += 1
    waited = cluster.wait_for(lambda s: s.all_running(cluster.created), sent + timeout_s)
    if waited.at is None:
        figures.update(waited.report(cluster.names))
    else:
        figures["all_running_s"] = round(waited.at - sent, 3)
    stopped = cluster.tasks_stopped_since(offsets)
    figures["tasks_stopped"] = sum(stopped.values())
    figures["tasks_stopped_per_worker"] = stopped
    return figures


def rolling_restart(cluster: Cluster, timeout_s: float) -> dict[str, Any]:
    """Restart every worker in turn (SIGTERM, start again with the same config), each
    once every task is RUNNING again; which tasks ended elsewhere, what others stopped."""
    settled = cluster.wait_for(
        lambda s: s.all_running(cluster.created), time.monotonic() + timeout_s
    )
    if settled.at is None:
        return {"skipped": "the tasks were not all RUNNING"} | settled.report(cluster.names)
    before = settled.last
    generations_before, _ = cluster.latest_generation()
    began = time.monotonic()
    per_worker = []
    others_stopped = 0
    for worker in list(cluster.workers):
        offsets = cluster.log_offsets()
        started = time.monotonic()
        cluster.restart_in_place(worker)
        waited = cluster.wait_for(
            lambda s: s.all_running(cluster.created), time.monotonic() + timeout_s
        )
        stopped = cluster.tasks_stopped_since(offsets, besides=worker.name)
        others_stopped += sum(stopped.values())
        entry: dict[str, Any] = {
            "worker": worker.name,
            "all_running_again_s": None if waited.at is None else round(waited.at - started, 3),
            "tasks_other_workers_stopped": sum(stopped.values()),
        }
        per_worker.append(entry)
        _procs.progress(f"rolling restart: {entry}")
        if waited.at is None:
            entry.update(waited.report(cluster.names))
            break
    after = cluster.status()
    generations_after, _ = cluster.latest_generation()
    moved = None
    if before is not None and after is not None:
        moved = sum(1 for task, owner in before.owners.items() if after.owners.get(task) != owner)
    return {
        "static": cluster.args.static,
        "seconds": round(time.monotonic() - began, 3),
        "tasks_moved": moved,
        "tasks_other_workers_stopped": others_stopped,
        "generations_before": generations_before,
        "generations_after": generations_after,
        "workers": per_worker,
    }


def _running_per_worker(cluster: Cluster, waited: Wait) -> dict[str, int]:
    assert waited.last is not None
    return waited.last.running_per_worker(cluster.names)


# -- the run -----------------------------------------------------------------------------


def _target(target: float, measured: float | None) -> dict[str, Any]:
    return {
        "target": target,
        "measured": measured,
        "met": measured is not None and measured <= target,
    }


def targets(protocol: str, figures: dict[str, Any]) -> dict[str, Any]:
    statuses = (figures.get("create") or {}).get("statuses")
    return {
        "all_running_within_s_of_last_create": _target(
            TARGET_RUNNING_AFTER_LAST_CREATE_S[protocol], figures.get("after_last_create_s")
        ),
        "tasks_stopped_by_one_more_connector": _target(
            TARGET_TASKS_STOPPED_BY_ONE_CREATE,
            (figures.get("one_more_connector") or {}).get("tasks_stopped"),
        ),
        "tasks_moved_by_rolling_restart": _target(
            TARGET_TASKS_MOVED_BY_ROLLING_RESTART,
            (figures.get("rolling_restart") or {}).get("tasks_moved"),
        ),
        "kill9_within_s_of_session_timeout_and_delay": _target(
            TARGET_KILL9_BEYOND_SESSION_S,
            (figures.get("kill9") or {}).get("beyond_session_timeout_s"),
        ),
        "creates_5xx_or_timeout": _target(
            TARGET_FAILED_CREATES, None if statuses is None else failed_creates(statuses)
        ),
    }


def measure(cluster: Cluster, figures: dict[str, Any]) -> None:
    args = cluster.args
    cluster.start_server()
    began = time.monotonic()
    for _ in range(args.workers):
        cluster.start_worker()
    generation = cluster.wait_group_formed()
    figures["group_formed_s"] = round(time.monotonic() - began, 3)
    _procs.progress(f"{args.workers} workers in generation {generation}")

    _procs.progress(f"creating {args.connectors} connectors of {args.tasks} tasks each")
    first, last, figures["create"] = create_connectors(cluster)
    total = cluster.created * args.tasks
    _procs.progress(f"creates took {figures['create']['seconds']}s; waiting for {total} RUNNING")
    waited = cluster.wait_for(lambda s: s.all_running(cluster.created), last + args.timeout_s)
    if waited.at is None:
        figures["all_running_s"] = figures["after_last_create_s"] = None
        figures["not_running"] = waited.report(cluster.names)
        states = waited.last.counts(cluster.names)["task_states"] if waited.last else None
        _procs.progress(f"not all RUNNING ({waited.gave_up}): {states}")
    else:
        figures["all_running_s"] = round(waited.at - first, 3)
        figures["after_last_create_s"] = round(waited.at - last, 3)
        figures["running_tasks_per_worker"] = _running_per_worker(cluster, waited)
        _procs.progress(
            f"all {total} tasks RUNNING {figures['after_last_create_s']}s after the last create"
        )
    figures["processes"] = sample_processes(cluster, args.sample_s)
    figures["processes"]["sampled_when"] = (
        "all RUNNING" if waited.at is not None else "after giving up on all RUNNING"
    )
    if waited.at is None:
        skipped = {"skipped": "the tasks were never all RUNNING"}
        for phase in ("one_more_connector", "rolling_restart", "kill9", "restart"):
            figures[phase] = skipped
        return
    figures["one_more_connector"] = one_more_connector(cluster, args.timeout_s)
    _procs.progress(f"one more connector: {figures['one_more_connector']}")
    figures["rolling_restart"] = rolling_restart(cluster, args.timeout_s)
    _procs.progress(
        f"rolling restart: {figures['rolling_restart']['tasks_moved']} tasks moved, "
        f"{figures['rolling_restart']['tasks_other_workers_stopped']} stopped elsewhere"
    )
    figures["kill9"] = kill_one(cluster, args.session_timeout_ms, args.timeout_s)
    _procs.progress(f"kill -9: {figures['kill9']}")
    figures["restart"] = restart_one(cluster, args.timeout_s)
    _procs.progress(f"restart: {figures['restart']}")


def run_protocol(args: argparse.Namespace, protocol: str) -> tuple[dict[str, Any], int]:
    """Every phase on a cluster of its own whose workers speak ``protocol``."""
    figures: dict[str, Any] = {}
    status = 0
    _procs.progress(f"-- connect.protocol={protocol}")
    work = Path(tempfile.mkdtemp(prefix=f"herder-bench-workers-{protocol}-", dir=args.tmp_dir))
    try:
        with _procs.Services(work) as services, httpx.Client() as http:
            cluster = Cluster(args, services, work, http, protocol)
            try:
                measure(cluster, figures)
            except Exception as exc:
                figures["error"] = f"{type(exc).__name__}: {exc}"
                _procs.progress(f"failed: {figures['error']}")
                status = 1
            figures["config"] = {
                "ensemble": {
                    **{
                        k: v
                        for k, v in cluster.ensemble_properties().items()
                        if k not in ("dataDir", "clientPort")
                    },
                    "maxClientCnxns": "not set: the server's default",
                },
                "worker": {
                    k: v
                    for k, v in cluster.worker_properties(0).items()
                    if k not in ("rest.port", "storage.root", "bootstrap.servers")
                },
            }
            if cluster.server is not None:
                server_log = cluster.server.log_since(0)
                refused = server_log.count(REFUSED)
                figures["server"] = {
                    "refused_any_connection": refused > 0,
                    "refused_connections": refused,
                    "cpu_s_total": round(_procs.cpu_seconds(cluster.server.pid), 2)
                    if cluster.server.alive()
                    else None,
                }
            figures["logs"] = {s.name: log_summary(s) for s in services.started}
            figures["targets"] = targets(protocol, figures)
    finally:
        if args.keep_work_dir:
            _procs.progress(f"logs and data kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return figures, status


#: the figures ``comparison`` puts side by side: (name, path into a protocol's figures)
COMPARED = (
    ("after_last_create_s", ("after_last_create_s",)),
    ("create_seconds", ("create", "seconds")),
    ("one_more_connector_tasks_stopped", ("one_more_connector", "tasks_stopped")),
    ("one_more_connector_all_running_s", ("one_more_connector", "all_running_s")),
    ("rolling_restart_tasks_moved", ("rolling_restart", "tasks_moved")),
    ("rolling_restart_seconds", ("rolling_restart", "seconds")),
    ("kill9_seconds", ("kill9", "seconds")),
    ("restart_all_running_again_s", ("restart", "all_running_again_s")),
)


def _dig(figures: dict[str, Any], path: tuple[str, ...]) -> Any:
    value: Any = figures
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    return value


def run(args: argparse.Namespace) -> tuple[dict[str, Any], int]:
    figures: dict[str, Any] = {
        "benchmark": "workers",
        "herder_version": herder_version,
        "machine": _procs.machine_info(),
        "parameters": {
            "connectors": args.connectors,
            "tasks_per_connector": args.tasks,
            "tasks": args.connectors * args.tasks,
            "workers": args.workers,
            "protocols": args.protocols,
            "scheduled_rebalance_max_delay_ms": args.max_delay_ms,
            "static_workers": args.static,
            "session_timeout_ms": args.session_timeout_ms,
            "poll_ms": args.poll_ms,
            "timeout_s": args.timeout_s,
            "sample_s": args.sample_s,
            "failed_grace_s": args.failed_grace_s,
            "connector_class": CONNECTOR_CLASS,
        },
        "protocols": {},
    }
    status = 0
    for protocol in args.protocols:
        figures["protocols"][protocol], failed = run_protocol(args, protocol)
        status |= failed
    figures["comparison"] = {
        name: {p: _dig(figures["protocols"][p], path) for p in args.protocols}
        for name, path in COMPARED
    }
    figures["targets"] = {p: figures["protocols"][p]["targets"] for p in args.protocols}
    return figures, status


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="bench/workers.py",
        description="How the worker runtime scales with the number of tasks: creates, all "
        "tasks RUNNING, per-process costs, kill -9 and restart of a worker. JSON on stdout.",
    )
    parser.add_argument("--connectors", type=int, default=90)
    parser.add_argument("--tasks", type=int, default=10, help="tasks.max of each connector")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument(
        "--protocols",
        default="eager,sessioned",
        help="the connect.protocol values to measure, one cluster each, in order",
    )
    parser.add_argument(
        "--max-delay-ms",
        type=int,
        default=5_000,
        help="scheduled.rebalance.max.delay.ms of the workers (cooperative protocols)",
    )
    parser.add_argument(
        "--no-static",
        dest="static",
        action="store_false",
        help="dynamic workers (no group.instance.id) in the rolling restart",
    )
    parser.add_argument("--session-timeout-ms", type=int, default=10_000)
    parser.add_argument("--poll-ms", type=int, default=200, help="how long each poll waits")
    parser.add_argument(
        "--timeout-s", type=float, default=600.0, help="give up on one wait after this long"
    )
    parser.add_argument(
        "--sample-s", type=float, default=5.0, help="seconds of idling to measure CPU over"
    )
    parser.add_argument(
        "--failed-grace-s",
        type=float,
        default=30.0,
        help="give up on a wait once a task is FAILED and the status stood still this long",
    )
    parser.add_argument("--tmp-dir", default=None, help="where the data and logs go")
    parser.add_argument("--pretty", action="store_true", help="indent the JSON")
    parser.add_argument(
        "--keep-work-dir", action="store_true", help="keep the logs and data directories"
    )
    args = parser.parse_args(argv)
    _procs.check_counts(
        parser,
        args,
        positive=("connectors", "tasks", "timeout_s", "sample_s", "failed_grace_s"),
        non_negative=("poll_ms",),
    )
    args.protocols = [p.strip() for p in args.protocols.split(",") if p.strip()]
    unknown = set(args.protocols) - set(TARGET_RUNNING_AFTER_LAST_CREATE_S)
    if unknown or not args.protocols:
        parser.error(f"--protocols takes eager, compatible and sessioned, not {sorted(unknown)}")
    if args.max_delay_ms < 0:
        parser.error("--max-delay-ms must be at least 0")
    if args.workers < 2:
        parser.error("--workers must be at least 2 (one is killed)")
    if args.session_timeout_ms < 1000:
        parser.error("--session-timeout-ms must be at least 1000 (the server's minimum)")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    return _procs.run_and_report(lambda: run(args), pretty=args.pretty)


if __name__ == "__main__":
    sys.exit(main())
