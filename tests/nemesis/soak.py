"""The nemesis soak: a whole herder cluster on hosts of its own, under a seeded nemesis.

Three ensemble servers and three workers, each in its own network namespace with its own
address and data directory (server 3's on a small filesystem the nemesis can fill); the
append workload in a namespace of its own. Two pipelines run throughout, fed by the
test process: numbered lines → FileStreamSource → topic ``eo`` → DirectorySink (text),
exactly once and in order; JSON-lines files → DirectorySource → topic ``rows`` →
FileStreamSink, exactly once. The nemesis injects the faults of
:func:`tests.nemesis.schedule.plan` one at a time, healing each after its duration.

At the end (:meth:`Soak.finish`) every fault is healed, the feeds stop, and the checks of
:mod:`tests.nemesis.checks` run: appends, sinks, every connector and task RUNNING within
:attr:`Soak.recovery_bound` seconds, and no process dead but by the nemesis's hand.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import signal
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from herder.ensemble import apis
from herder.ensemble.client import server_status
from herder.ensemble.sync_client import SyncEnsembleClient
from herder.errors import HerderError
from tests.e2e.test_pipeline import LineWriter
from tests.harness import HERDER, Proc, Processes, wait_until
from tests.nemesis import checks
from tests.nemesis.hosts import Host, Network, SmallDisk
from tests.nemesis.schedule import SERVERS, WORKERS, Fault

CLIENT_PORT, QUORUM_PORT, ELECTION_PORT, REST_PORT = 2181, 2888, 3888, 8083
APPEND_LOG = "nemesis-appends"
#: the ensemble's roles in a status answer that mean "in the quorum"
_SERVING = ("leader", "follower")
CONNECTORS = ("eo-in", "eo-out", "dir-in", "dir-out")
ROWS_PER_FILE = 20
#: how long a server whose disk was full may take to serve again once it has room
DISK_RECOVERY_S = 30.0


# -- starting herder on hosts (shared with the other tests that run on hosts) ---------------


def ensemble_properties(sid: int, data: Path, servers: Mapping[int, Host]) -> dict[str, object]:
    """Server ``sid``'s config in the ensemble of ``servers``, each on its host's address
    (one server alone runs standalone)."""
    lines = {
        f"server.{s}": f"{host.address}:{QUORUM_PORT}:{ELECTION_PORT};{host.address}:{CLIENT_PORT}"
        for s, host in servers.items()
    }
    return {
        "server.id": sid,
        "dataDir": str(data),
        "clientPort": CLIENT_PORT,
        "clientPortAddress": servers[sid].address,
        "tickTime": 200,
        "initLimit": 25,
        "syncLimit": 10,
        "maxSessionTimeout": 60_000,
        "group.min.session.timeout.ms": 1000,
        **lines,
    }


def worker_properties(host: Host, bootstrap: str, storage: Path) -> dict[str, object]:
    """A worker's config on ``host`` (its REST API on the host's address), without its
    ``spark.*`` settings."""
    return {
        "group.id": "nemesis",
        "bootstrap.servers": bootstrap,
        "rest.host.name": host.address,
        "rest.port": REST_PORT,
        "session.timeout.ms": 10_000,
        "heartbeat.interval.ms": 1000,
        "rebalance.timeout.ms": 30_000,
        "worker.unsync.backoff.ms": 1000,
        "scheduled.rebalance.max.delay.ms": 0,
        "task.shutdown.graceful.timeout.ms": 3000,
        "storage.root": str(storage),
    }


def write_properties(path: Path, props: Mapping[str, object]) -> Path:
    path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
    return path


def herder_start(kind: str, config: Path) -> list[str]:
    """``herder <kind> start`` (``ensemble`` or ``worker``) from ``config``."""
    return [*HERDER, "--log-level", "INFO", kind, "start", "--config", str(config)]


def start_in(
    processes: Processes,
    host: Host,
    args: list[str],
    *,
    name: str,
    env: Mapping[str, str] | None = None,
    ready: Callable[[], object] | None = None,
    timeout: float = 60.0,
) -> Proc:
    """``args`` started inside ``host``, importing herder and the tests from this checkout."""
    repo = Path(__file__).resolve().parents[2]
    return processes.start(
        host.command(args),
        name=name,
        env={"PYTHONPATH": f"{repo / 'src'}:{repo}", **(env or {})},
        ready=ready,
        timeout=timeout,
    )


def rest_url(host: Host) -> str:
    return f"http://{host.address}:{REST_PORT}"


def rest_ready(http: httpx.Client, host: Host) -> bool:
    """Whether the worker on ``host`` answers REST requests (it has joined its group)."""
    return http.get(f"{rest_url(host)}/connectors", timeout=3).status_code == 200


@dataclass
class Injected:
    """A fault as it happened: wall-clock times and what it struck."""

    fault: Fault
    start: float
    heal: float = 0.0
    servers: tuple[int, ...] = ()


@dataclass
class Outcome:
    """What :meth:`Soak.finish` found: every check's verdict and the figures."""

    appends: checks.AppendVerdict
    eo_lines: checks.LinesVerdict
    eo_in_order: bool
    dir_rows: checks.LinesVerdict
    running_after_s: float | None
    unexpected_deaths: list[str]
    injected: list[Injected]
    attempts: list[dict[str, Any]]
    samples: list[tuple[float, int, int]]
    start: float
    end: float
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


class DirectoryFeeder(threading.Thread):
    """Writes a JSON-lines file of ``ROWS_PER_FILE`` numbered rows every ``tick`` s,
    under a hidden name renamed when complete, until stopped."""

    def __init__(self, directory: Path, tick: float = 1.0) -> None:
        super().__init__(name="directory-feeder", daemon=True)
        self.directory = directory
        self.tick = tick
        self.rows = 0
        self._done = threading.Event()

    def run(self) -> None:
        index = 0
        while not self._done.wait(self.tick):
            first = self.rows
            body = "".join(
                json.dumps({"id": i, "tag": f"row-{i}"}) + "\n"
                for i in range(first, first + ROWS_PER_FILE)
            )
            temp = self.directory / f".part-{index:06d}.json"
            temp.write_text(body)
            temp.rename(self.directory / f"part-{index:06d}.json")
            self.rows += ROWS_PER_FILE
            index += 1

    def stop(self) -> int:
        self._done.set()
        self.join(timeout=10)
        return self.rows


class Soak:
    """The cluster, its workloads and the nemesis; :meth:`close` stops and removes all."""

    def __init__(self, workdir: Path, *, recovery_bound: float = 300.0) -> None:
        self.workdir = workdir
        self.recovery_bound = recovery_bound
        self.processes = Processes(workdir)
        self.network = Network()
        self.disk: SmallDisk | None = None
        self.http = httpx.Client(timeout=10)
        self.procs: dict[str, Proc] = {}
        #: roles the nemesis killed and has not restarted yet
        self.down: set[str] = set()
        #: the server whose disk is full now
        self.disk_struck: set[str] = set()
        #: what went wrong on the way that the end's checks would not see
        self.findings: list[str] = []
        self.unexpected_deaths: list[str] = []
        self.injected: list[Injected] = []
        self.samples: list[tuple[float, int, int]] = []
        self.hosts: dict[str, Host] = {}
        self.eo_writer: LineWriter | None = None
        self.feeder: DirectoryFeeder | None = None
        self.stop_file = workdir / "appends.stop"
        self.appends_path = workdir / "appends.jsonl"

    # -- the cluster --------------------------------------------------------------------

    def server_host(self, sid: int) -> Host:
        return self.hosts[f"s{sid}"]

    def worker_host(self, wid: int) -> Host:
        return self.hosts[f"w{wid}"]

    @property
    def bootstrap(self) -> str:
        return ",".join(f"{self.server_host(s).address}:{CLIENT_PORT}" for s in SERVERS)

    def start(self) -> None:
        for sid in SERVERS:
            self.hosts[f"s{sid}"] = self.network.add_host(f"s{sid}")
        for wid in WORKERS:
            self.hosts[f"w{wid}"] = self.network.add_host(f"w{wid}")
        self.hosts["load"] = self.network.add_host("ld")
        self.disk = SmallDisk(self.workdir / "server3", size_mb=256)
        servers = {sid: self.server_host(sid) for sid in SERVERS}
        for sid in SERVERS:
            data = self.workdir / f"server{sid}"
            data.mkdir(exist_ok=True)
            config = {
                **ensemble_properties(sid, data, servers),
                # small log preallocations and frequent snapshots: the disk is written
                # to all the time, so a full one is noticed within seconds
                "preAllocSize": 16,
                "snapCount": 1000,
            }
            write_properties(self.workdir / f"server{sid}.properties", config)
            self._launch(f"s{sid}")
        wait_until(self.leader, timeout=120, interval=0.5, what="an ensemble leader")
        for wid in WORKERS:
            self._write_worker_config(wid)
            self._launch(f"w{wid}")
        for wid in WORKERS:
            wait_until(
                functools.partial(self._worker_ready, wid),
                timeout=240,
                interval=0.5,
                what=f"worker {wid} to join its group",
            )
        self._launch("load")
        self._start_pipelines()

    def _write_worker_config(self, wid: int) -> None:
        props = {
            **worker_properties(self.worker_host(wid), self.bootstrap, self.workdir / "topics"),
            "spark.master": "local[1]",
            "spark.driver.memory": "512m",
            "spark.ui.enabled": "false",
            "spark.sql.shuffle.partitions": "1",
        }
        write_properties(self.workdir / f"worker{wid}.properties", props)

    def _command(self, role: str) -> list[str]:
        if role.startswith("s"):
            return herder_start("ensemble", self.workdir / f"server{role[1:]}.properties")
        if role.startswith("w"):
            return herder_start("worker", self.workdir / f"worker{role[1:]}.properties")
        return [
            HERDER[0],
            "-m",
            "tests.nemesis.workload",
            "--bootstrap",
            self.bootstrap,
            "--log",
            APPEND_LOG,
            "--out",
            str(self.appends_path),
            "--stop-file",
            str(self.stop_file),
        ]

    def _launch(self, role: str) -> None:
        self.procs[role] = start_in(
            self.processes,
            self.hosts[role],
            self._command(role),
            name=role,
            env={"SPARK_LOCAL_IP": "127.0.0.1"},
        )
        self.down.discard(role)

    def _worker_ready(self, wid: int) -> bool:
        return rest_ready(self.http, self.worker_host(wid))

    def _rest(self, wid: int) -> str:
        return rest_url(self.worker_host(wid))

    def leader(self) -> int | None:
        """The server every live server agrees leads, or None."""
        seen = {}
        for sid in SERVERS:
            with contextlib.suppress(HerderError, OSError, TimeoutError):
                address = f"{self.server_host(sid).address}:{CLIENT_PORT}"
                seen[sid] = asyncio.run(server_status(address, timeout=1.0))
        leaders = [sid for sid, st in seen.items() if st.role == "leader"]
        if len(leaders) != 1:
            return None
        followers = [st for st in seen.values() if st.role == "follower"]
        if any(st.leader != leaders[0] for st in followers):
            return None
        return leaders[0]

    # -- workloads ----------------------------------------------------------------------

    def _start_pipelines(self) -> None:
        eo_in, dir_in = self.workdir / "eo-in.txt", self.workdir / "dir-in"
        eo_in.touch()
        dir_in.mkdir()
        self.create(
            "eo-out",
            {
                "connector.class": "DirectorySink",
                "format": "text",
                "directory": str(self.workdir / "eo-out"),
                "topics": "eo",
            },
        )
        self.create(
            "eo-in", {"connector.class": "FileStreamSource", "file": str(eo_in), "topic": "eo"}
        )
        self.create(
            "dir-out",
            {
                "connector.class": "FileStreamSink",
                "topics": "rows",
                "file": str(self.workdir / "dir-out.txt"),
            },
        )
        self.create(
            "dir-in",
            {
                "connector.class": "DirectorySource",
                "format": "json",
                "directory": str(dir_in),
                "topic": "rows",
                "poll.interval.ms": "500",
            },
        )
        self.eo_writer = LineWriter(eo_in, per_tick=10, tick=0.1)
        self.eo_writer.start()
        self.feeder = DirectoryFeeder(dir_in)
        self.feeder.start()

    def create(self, name: str, config: dict[str, str]) -> None:
        def created() -> bool:
            for wid in WORKERS:
                with contextlib.suppress(httpx.HTTPError):
                    reply = self.http.post(
                        f"{self._rest(wid)}/connectors", json={"name": name, "config": config}
                    )
                    if reply.status_code in (201, 409):
                        return True
            return False

        wait_until(created, timeout=120, interval=1.0, what=f"connector {name} created")

    def _eo_output(self) -> bytes:
        directory = self.workdir / "eo-out"
        if not directory.exists():
            return b""
        files = sorted(p for p in directory.iterdir() if p.is_file())
        return b"".join(p.read_bytes() for p in files)

    def _dir_output(self) -> list[str]:
        path = self.workdir / "dir-out.txt"
        return path.read_text().splitlines() if path.exists() else []

    def flowing(self) -> bool:
        """Whether both sinks have delivered something."""
        return bool(self._eo_output()) and bool(self._dir_output())

    def sample(self) -> None:
        """Record how much each sink holds now, and any process that died by itself."""
        eo = self._eo_output().count(b"\n")
        rows = len(self._dir_output())
        self.samples.append((time.time(), eo, rows))
        for role, proc in self.procs.items():
            if role in self.disk_struck and not proc.alive():
                # a server may stop when its disk fails (ZooKeeper's do): the nemesis's
                # doing, and it is started again when the disk has room
                self.down.add(role)
            if role not in self.down and not proc.alive():
                tail = "\n".join(proc.output().splitlines()[-15:])
                self.unexpected_deaths.append(
                    f"{role} (pid {proc.pid}) exited with {proc.popen.returncode}:\n{tail}"
                )
                self.down.add(role)  # reported once

    # -- the nemesis --------------------------------------------------------------------

    def run(self, faults: list[Fault], seconds: float, *, log: Callable[[str], None]) -> None:
        """Inject ``faults`` (times relative to now) and heal each; return after ``seconds``."""
        began = time.monotonic()
        pending = list(faults)
        active: tuple[Fault, Injected] | None = None
        while time.monotonic() - began < seconds:
            now = time.monotonic() - began
            if active is not None and now >= active[0].heal_at:
                self.heal(*active)
                log(f"healed {active[0].kind} after {active[0].duration}s")
                active = None
            if active is None and pending and now >= pending[0].at:
                fault = pending.pop(0)
                active = (fault, self.inject(fault))
                log(f"{fault.kind} servers={active[1].servers} workers={fault.workers}")
            self.sample()
            time.sleep(0.5)  # the nemesis's tick: faults start and heal on it
        if active is not None:
            self.heal(*active)

    def inject(self, fault: Fault) -> Injected:
        servers = fault.servers
        kind = fault.kind
        if kind == "isolate-leader":
            leader = self.leader()
            servers = (leader,) if leader is not None else (SERVERS[0],)
        done = Injected(fault, time.time(), servers=servers)
        self.injected.append(done)
        every = list(self.hosts.values())
        if kind == "kill-server" or kind == "kill-worker":
            for role in self._roles(servers, fault.workers):
                self.down.add(role)
                self.procs[role].kill9()
        elif kind in ("pause-server", "pause-worker"):
            for role in self._roles(servers, fault.workers):
                self.procs[role].signal(signal.SIGSTOP)
        elif kind == "isolate-leader":
            host = self.server_host(servers[0])
            others = [h for h in every if h is not host]
            host.drop_to(others)
            for other in others:
                other.drop_to([host])
        elif kind == "split-servers":
            minority = [self.server_host(servers[0]), self.worker_host(fault.workers[0])]
            majority = [h for h in every if h not in minority and h.name != "ld"]
            for host in minority:
                host.drop_to(majority)
            for host in majority:
                host.drop_to(minority)
        elif kind == "cut-workers":
            cut = [self.worker_host(w) for w in fault.workers]
            ensemble = [self.server_host(s) for s in SERVERS]
            for host in cut:
                host.drop_to(ensemble)
            for host in ensemble:
                host.drop_to(cut)
        elif kind == "one-way":
            host = self.server_host(servers[0])
            host.drop_to([self.server_host(s) for s in SERVERS if s != servers[0]])
        elif kind == "lossy-link":
            self.server_host(servers[0]).lose(fault.percent)
        elif kind == "slow-link":
            self.server_host(servers[0]).slow(rate_kbit=256, latency_ms=300)
        elif kind == "disk-full":
            assert self.disk is not None
            self.disk_struck.update(self._roles(servers, ()))
            self.disk.fill()
        return done

    def heal(self, fault: Fault, done: Injected) -> None:
        kind = fault.kind
        healed_at = time.time()
        if kind in ("kill-server", "kill-worker"):
            for role in self._roles(done.servers, fault.workers):
                self._launch(role)
        elif kind in ("pause-server", "pause-worker"):
            for role in self._roles(done.servers, fault.workers):
                self.procs[role].signal(signal.SIGCONT)
        elif kind == "disk-full":
            assert self.disk is not None
            self.disk.free()
            self.sample()  # a server that stopped on the full disk is seen as down
            for sid in done.servers:
                self._after_disk_full(sid)
            self.disk_struck.clear()
        else:
            self.network.heal()
        done.heal = healed_at

    def _status(self, sid: int) -> apis.StatusResponse | None:
        address = f"{self.server_host(sid).address}:{CLIENT_PORT}"
        with contextlib.suppress(HerderError, OSError, TimeoutError):
            return asyncio.run(server_status(address, timeout=1.0))
        return None

    def _caught_up(self, sid: int, zxid: int) -> bool:
        """Whether server ``sid`` serves and has logged everything up to ``zxid``."""
        status = self._status(sid)
        return status is not None and status.role in _SERVING and status.last_zxid >= zxid

    def _after_disk_full(self, sid: int) -> None:
        """Start the server again if it stopped on its full disk; if it is alive but
        still out of the ensemble once its disk has room, that is a finding — and then
        it is restarted, as an operator would, so the rest of the soak has three."""
        role = f"s{sid}"
        if not self.procs[role].alive():
            self._launch(role)
            return
        # what the others have logged now: a server that takes part again logs it too
        others = [self._status(other) for other in SERVERS if other != sid]
        zxid = max((st.last_zxid for st in others if st is not None), default=0)
        try:
            wait_until(
                lambda: self._caught_up(sid, zxid),
                timeout=DISK_RECOVERY_S,
                interval=0.5,
                what=f"server {sid} serving again",
            )
        except AssertionError:
            self.findings.append(
                f"server {sid} was alive but out of the ensemble {DISK_RECOVERY_S:.0f}s after "
                "its full disk had room again; restarted"
            )
            self.down.add(role)
            self.procs[role].kill9()
            self._launch(role)

    @staticmethod
    def _roles(servers: tuple[int, ...], workers: tuple[int, ...]) -> list[str]:
        return [f"s{s}" for s in servers] + [f"w{w}" for w in workers]

    # -- the end ------------------------------------------------------------------------

    def all_running(self) -> bool:
        """Whether every worker reports every connector and its task RUNNING (each
        worker answers from its own view of the status log, so a worker whose view
        stopped moving is caught too)."""
        for wid in WORKERS:
            for name in CONNECTORS:
                status = self.http.get(f"{self._rest(wid)}/connectors/{name}/status").json()
                tasks = status.get("tasks", [])
                states = [status["connector"]["state"], *(t["state"] for t in tasks)]
                if not tasks or any(state != "RUNNING" for state in states):
                    return False
        return True

    def read_log(self, sid: int) -> list[bytes | None]:
        values: list[bytes | None] = []
        address = f"{self.server_host(sid).address}:{CLIENT_PORT}"
        with SyncEnsembleClient(address, give_up_after=30.0) as client:
            client.sync()
            position = 0
            while True:
                batch = client.read(APPEND_LOG, position, max_records=5000)
                if not batch.records:
                    return values
                values += [r.value for r in batch.records]
                position = batch.next_offset

    def attempts(self) -> list[dict[str, Any]]:
        if not self.appends_path.exists():
            return []
        return [json.loads(line) for line in self.appends_path.read_text().splitlines()]

    def finish(self, started: float, *, log: Callable[[str], None]) -> Outcome:
        """Heal everything, stop the feeds, wait for the sinks and run every check."""
        self.network.heal()
        if self.disk is not None:
            self.disk.free()
        for role, proc in list(self.procs.items()):
            proc.signal(signal.SIGCONT)
            if role != "load" and not proc.alive():  # killed last, or died by itself
                self._launch(role)
        ended = time.time()
        problems: list[str] = []
        healed = time.monotonic()
        running_after: float | None = None
        try:
            wait_until(
                self.all_running,
                timeout=self.recovery_bound,
                interval=1.0,
                what="every connector and task RUNNING",
            )
            running_after = round(time.monotonic() - healed, 1)
        except AssertionError as exc:
            problems.append(str(exc))
        if running_after is not None:
            log(f"every connector and task RUNNING after {running_after}s")
        assert self.eo_writer is not None and self.feeder is not None
        eo_total = self.eo_writer.stop()
        rows_total = self.feeder.stop()
        eo_expected = b"".join(b"%09d\n" % i for i in range(eo_total))
        dir_expected = [
            _canonical(json.dumps({"id": i, "tag": f"row-{i}"})) for i in range(rows_total)
        ]

        eo_last = eo_expected.rsplit(b"\n", 2)[-2] + b"\n" if eo_expected else b""
        dir_wanted = set(dir_expected)

        def delivered() -> bool:
            # every fed line there, not only as many bytes: a sink that wrote some lines
            # twice must not cut the wait short and have its tail counted as lost
            self.sample()
            eo = self._eo_output()
            return (
                len(eo) >= len(eo_expected)
                and eo_last in eo
                and dir_wanted <= {_canonical(line) for line in self._dir_output()}
            )

        with contextlib.suppress(AssertionError):
            wait_until(
                delivered,
                timeout=self.recovery_bound,
                interval=1.0,
                what="every fed line at its sink",
            )
        self.stop_file.touch()
        load = self.procs["load"]
        with contextlib.suppress(AssertionError):
            wait_until(lambda: not load.alive(), timeout=60, what="the append workload to end")
        self.down.add("load")
        attempts = self.attempts()
        logs = {}
        for sid in SERVERS:
            try:
                logs[sid] = self.read_log(sid)
            except HerderError as exc:
                problems.append(f"server {sid}'s log could not be read: {exc}")
        appends = checks.check_appends(attempts, logs)
        eo_out = self._eo_output()
        eo_lines = checks.check_lines(
            eo_expected.decode().splitlines(), eo_out.decode(errors="replace").splitlines()
        )
        dir_rows = checks.check_lines(
            dir_expected, [_canonical(line) for line in self._dir_output()]
        )
        if not appends.ok:
            problems.append(f"appends: {appends.problems()}")
        if not eo_lines.ok:
            problems.append(f"file → DirectorySink: {eo_lines.problems()}")
        elif eo_out != eo_expected:
            problems.append("file → DirectorySink: every line once, but not in order")
        if not dir_rows.ok:
            problems.append(f"DirectorySource → file: {dir_rows.problems()}")
        problems += self.findings
        if self.unexpected_deaths:
            problems += [f"died by itself: {d}" for d in self.unexpected_deaths]
        return Outcome(
            appends=appends,
            eo_lines=eo_lines,
            eo_in_order=eo_out == eo_expected,
            dir_rows=dir_rows,
            running_after_s=running_after,
            unexpected_deaths=list(self.unexpected_deaths),
            injected=list(self.injected),
            attempts=attempts,
            samples=list(self.samples),
            start=started,
            end=ended,
            problems=problems,
        )

    def close(self) -> None:
        """Stop every process by pid, then remove the filesystem and the network."""
        with contextlib.suppress(Exception):
            self.stop_file.touch()
        for writer in (self.eo_writer, self.feeder):
            if writer is not None:
                writer.stop()
        try:
            self.processes.stop_all()
        finally:
            self.http.close()
            if self.disk is not None:
                self.disk.close()
            self.network.close()


def _canonical(line: str) -> str:
    """A JSON line in one spelling (the sink may space it differently), or as it is."""
    try:
        return json.dumps(json.loads(line), separators=(",", ":"), sort_keys=True)
    except ValueError:
        return line


def soak(
    workdir: Path,
    seed: int,
    seconds: float,
    faults: list[Fault],
    log: Callable[[str], None],
    *,
    warm: bool = False,
    recovery_bound: float = 300.0,
) -> Outcome:
    """Build the cluster, run the nemesis for ``seconds``, check, and tear it all down.

    With ``warm``, the nemesis starts only once both pipelines have delivered something
    (every worker's Spark up and running), so that what the figures say about the sinks'
    recovery is about the faults and not about the cluster's first minutes.
    """
    cluster = Soak(workdir, recovery_bound=recovery_bound)
    try:
        cluster.start()
        if warm:
            wait_until(
                cluster.flowing,
                timeout=recovery_bound,
                interval=1.0,
                what="both pipelines delivering",
            )
        log(f"cluster up; leader {cluster.leader()}; nemesis for {seconds:.0f}s, seed {seed}")
        started = time.time()
        cluster.run(faults, seconds, log=log)
        return cluster.finish(started, log=log)
    finally:
        cluster.close()
