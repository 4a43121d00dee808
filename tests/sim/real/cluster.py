"""A deterministic simulation of an ensemble of real servers: one seed, one history.

Where :mod:`tests.sim.cluster` drives bare Zab cores, this one runs what a real server
runs around its core — :class:`~herder.ensemble.replica.ZabReplica`, the real
:class:`~herder.ensemble.storage.store.Storage` with its log files, snapshots, epoch
files and group commit, the real :class:`~herder.ensemble.quorum.QuorumNetwork` — on
simulated loops, disks and links (:mod:`.loop`, :mod:`.net`,
:class:`~herder.ensemble.storage.simfs.SimulatedFileSystem`). A bug in that host code
(acknowledging before an fsync, a rename without a directory sync, a recovery that
keeps a torn record) shows here as it would on a real machine, but replays exactly.

Clients write through :meth:`ZabReplica.submit`, as the client port does; a write is
*acknowledged* when ``submit`` returns. Faults: crashes (power cuts that tear the
unsynced tail; some just after a server wrote a new epoch), partitions (both ways or
one way), connection resets. After ``steps``
steps the faults stop; a leader must then commit a new write and every server must
apply exactly the committed history, each acknowledged write once, within
``LIVENESS_S`` of simulated time each. :class:`~tests.sim.checker.Checker` checks
safety as it goes.
"""

from __future__ import annotations

import gc
import heapq
import random
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

from herder.ensemble.config import EnsembleConfig
from herder.ensemble.txn import Append, CreateLog, WriteTxn
from herder.ensemble.zab import Faults, Role, ServerState, ZabConfig
from herder.errors import HerderError
from tests.sim.checker import Checker, SafetyViolation
from tests.sim.failures import LivenessFailure, SimulationFailure
from tests.sim.real.host import DATA_DIR, WRITES_LOG, RealHost
from tests.sim.real.loop import SimClock
from tests.sim.real.net import SimNet

#: a leader must commit a new write, then all must converge, each within this (seconds)
LIVENESS_S = 60.0
#: every seed must commit at least this many writes (the liveness write included)
MIN_COMMITS = 3
#: a run that takes more steps than this after the faults stopped is stuck
MAX_CALM_STEPS = 400_000

CLIENT, FAULT, RESTART, HEAL, CRASH = range(5)
_KINDS = ("client", "fault", "restart", "heal", "crash")


@dataclass(frozen=True)
class RealProfile:
    """How hostile the world is; times in simulated milliseconds."""

    delay_ms: tuple[int, int] = (1, 4)
    disk_ms: tuple[int, int] = (1, 8)
    fault_every_ms: int = 600
    write_every_ms: int = 15
    downtime_ms: tuple[int, int] = (20, 1500)
    partition_ms: tuple[int, int] = (50, 2000)
    #: chance that a server crashes just after it wrote a new epoch to disk (FoundationDB's
    #: BUGGIFY): where a missing fsync of an epoch file, or an epoch acted on before it
    #: was written, would show. Each election writes two epochs per participant, so
    #: much more than this and elections with five servers rarely finish at all
    crash_after_epoch: float = 0.02


PROFILES = {
    "default": RealProfile(),
    "crashy": RealProfile(fault_every_ms=300, downtime_ms=(5, 400), crash_after_epoch=0.05),
    "partitioned": RealProfile(fault_every_ms=300, partition_ms=(20, 800)),
    "slowdisk": RealProfile(disk_ms=(5, 60)),
}


@dataclass
class RealReport:
    seed: int
    servers: dict[int, Role]
    profile: str
    steps: int = 0
    sim_ms: int = 0
    writes: int = 0
    rejected_writes: int = 0
    acknowledged_writes: int = 0
    commits: int = 0
    crashes: int = 0
    #: crashes scheduled for a moment after a server wrote an epoch
    epoch_crashes: int = 0
    partitions: int = 0
    resets: int = 0
    liveness_ms: int = 0
    convergence_ms: int = 0
    #: how learners were synchronised (DIFF, TRUNC, SNAP), over every incarnation
    syncs: Counter[str] = field(default_factory=Counter)
    snapshots: int = 0


class RealSimulation:
    """See the module docstring."""

    def __init__(
        self,
        seed: int,
        *,
        steps: int = 4000,
        faults: Faults | None = None,
        profile: str | None = None,
    ) -> None:
        self.seed = seed
        self.steps = steps
        self.rng = rng = random.Random(seed)
        participants = rng.choice((3, 3, 5))
        observers = rng.choice((0, 0, 1))
        roles = {sid: Role.PARTICIPANT for sid in range(1, participants + 1)}
        for sid in range(participants + 1, participants + observers + 1):
            roles[sid] = Role.OBSERVER
        self.zab = ZabConfig(
            servers=roles,
            tick_ms=100,
            init_limit=10,
            sync_limit=5,
            commit_log_count=rng.randint(3, 40),
            snapshot_size_factor=rng.choice((0.33, 0.05, 2.0, -1.0)),
            finalize_wait_ms=40,
            max_notification_interval_ms=800,
            max_concurrent_snap_syncs=rng.choice((1, 10)),
            faults=faults or Faults(),
        )
        self.profile_name = profile or rng.choice(sorted(PROFILES))
        self.profile = PROFILES[self.profile_name]
        self.clock = SimClock()
        self.net = SimNet(self.clock, rng, self.profile.delay_ms)
        self.checker = Checker(self.zab)
        self.report = RealReport(seed, roles, self.profile_name)
        servers = {
            f"server.{sid}": f"127.0.0.1:{2000 + sid}:{3000 + sid}"
            + (":observer" if role is Role.OBSERVER else "")
            for sid, role in roles.items()
        }
        self.hosts = {
            sid: RealHost(
                sid,
                self,
                EnsembleConfig.from_properties(
                    {"dataDir": DATA_DIR, "server.id": str(sid), **servers}
                ),
            )
            for sid in roles
        }
        self.heap: list[tuple[float, int, int, int, int]] = []
        self._seq = 0
        self.faulting = True
        self._partition = 0
        self.trace: deque[tuple[int, str, int]] = deque(maxlen=200)
        self.acknowledged: set[bytes] = set()
        #: what the checker found inside a server's callback (which the server swallows)
        self.violations: list[SafetyViolation] = []
        #: the write that shows liveness: (value, leader, its incarnation, its epoch)
        self.live: tuple[bytes, int, int, int] | None = None
        self.live_failed = False
        self.live_done = False

    # -- running --------------------------------------------------------------------

    def run(self) -> RealReport:
        # cyclic garbage is collected at the end, not at an allocation count that
        # differs between two runs of one seed (a collected stream would close its link)
        enabled = gc.isenabled()
        gc.disable()
        try:
            return self._run()
        except Exception as e:
            raise SimulationFailure(self._failure(e), e) from e
        finally:
            for host in self.hosts.values():
                host.discard()
            if enabled:
                gc.enable()

    def _failure(self, e: BaseException) -> str:
        lines = [
            f"seed {self.seed} failed at {self.clock.ms()} ms (step {self.report.steps}): "
            f"{type(e).__name__}: {e}",
            f"servers: {self.report.servers}, profile: {self.profile_name}",
            f"replay: python -m tests.sim.real --seed {self.seed} --steps {self.steps} "
            f"--profile {self.profile_name} --trace",
            "last steps:",
        ]
        lines.extend(f"  {t:>7} {what:<8} s{sid}" for t, what, sid in self.trace)
        return "\n".join(lines)

    def _run(self) -> RealReport:
        for host in self.hosts.values():
            host.start()
        self._push(self._exp(self.profile.fault_every_ms), FAULT)
        self._push(self._exp(self.profile.write_every_ms), CLIENT)
        report = self.report
        while report.steps < self.steps:
            self._step()
        report.sim_ms = self.clock.ms()
        self._stop_faults()
        start = self.clock.now
        calm = report.steps
        while not self.live_done:
            if self.clock.now > start + LIVENESS_S or report.steps > calm + MAX_CALM_STEPS:
                raise LivenessFailure(f"no write committed {LIVENESS_S} s after faults stopped")
            self._propose_liveness_write()
            self._step()
        report.liveness_ms = int((self.clock.now - start) * 1000)
        self._converge()
        report.convergence_ms = int((self.clock.now - start) * 1000) - report.liveness_ms
        committed = {txn.payload for txn in self.checker.history}
        lost = sorted(self.acknowledged - committed)
        if lost:
            raise SafetyViolation(f"acknowledged writes missing from the history: {lost[:5]}")
        report.acknowledged_writes = len(self.acknowledged)
        report.commits = len(self.checker.history)
        report.resets = self.net.resets
        for host in self.hosts.values():
            host.tally(report)
        if report.commits < MIN_COMMITS:
            raise LivenessFailure(f"only {report.commits} writes committed")
        return report

    def _push(self, at: float, kind: int, sid: int = 0, data: int = 0) -> None:
        self._seq += 1
        heapq.heappush(self.heap, (at, self._seq, kind, sid, data))

    def _exp(self, mean_ms: int) -> float:
        return self.clock.now + (1 + int(self.rng.expovariate(1 / mean_ms))) / 1000

    def _step(self) -> None:
        """Run the earliest thing due: a server's loop iteration or a world event."""
        best: tuple[float, int] | None = None
        for sid, host in self.hosts.items():
            loop = host.loop
            if loop is None:
                continue
            at = loop.next_event()
            if at is not None and (best is None or at < best[0]):
                best = (at, sid)
        self.report.steps += 1
        if self.heap and (best is None or self.heap[0][0] <= best[0]):
            at, _, kind, sid, data = heapq.heappop(self.heap)
            self.clock.now = max(self.clock.now, at)
            self.trace.append((self.clock.ms(), _KINDS[kind], sid))
            self._world(kind, sid, data)
            return
        if best is None:
            raise LivenessFailure("nothing left to run: every server waits and no event is due")
        at, sid = best
        self.clock.now = max(self.clock.now, at)
        host = self.hosts[sid]
        assert host.loop is not None
        self.trace.append((self.clock.ms(), "run", sid))
        host.loop.run_once()
        self._after(host)

    def _after(self, host: RealHost) -> None:
        loop = host.loop
        assert loop is not None
        if self.violations:
            raise self.violations[0]
        if loop.unhandled:
            context = loop.unhandled[0]
            exc = context.get("exception")
            raise SafetyViolation(
                f"server {host.sid}: unhandled on its loop: {context.get('message')}: {exc!r}"
            ) from exc
        if host.fatal is not None:
            raise SafetyViolation(f"server {host.sid} stopped: {host.fatal}")
        host.after_step()

    # -- the world ------------------------------------------------------------------

    def _world(self, kind: int, sid: int, data: int) -> None:
        if kind == CLIENT:
            if self.faulting:
                self._client_write()
                self._push(self._exp(self.profile.write_every_ms), CLIENT)
        elif kind == FAULT:
            if self.faulting:
                self._fault()
                self._push(self._exp(self.profile.fault_every_ms), FAULT)
        elif kind == RESTART:
            host = self.hosts[sid]
            if not host.up and host.incarnation == data:
                host.start()
        elif kind == HEAL and data == self._partition:
            self.net.heal()
        elif kind == CRASH:
            host = self.hosts[sid]
            if host.up and host.incarnation == data and self.faulting:
                self._crash(host)

    def _client_write(self) -> None:
        """A client with the whole connect string: it writes to a server that serves."""
        self.report.writes += 1
        value = b"w%d" % self.report.writes
        serving = [h for h in self.hosts.values() if h.replica is not None and h.replica.serving]
        if not serving:
            self.report.rejected_writes += 1
            return
        self._submit(self.rng.choice(serving), value)

    def _submit(self, host: RealHost, value: bytes) -> None:
        replica, loop = host.replica, host.loop
        assert replica is not None and loop is not None

        def build(header: Any) -> WriteTxn:
            return WriteTxn(
                header, [CreateLog(WRITES_LOG, if_absent=True), Append(WRITES_LOG, None, value)]
            )

        async def write() -> None:
            try:
                await replica.submit(build)
            except HerderError:
                self.report.rejected_writes += 1
                if self.live is not None and self.live[0] == value:
                    self.live_failed = True
                return
            self.acknowledged.add(value)
            if self.live is not None and self.live[0] == value:
                self.live_done = True

        loop.call_in(loop.create_task, write())

    def _fault(self) -> None:
        rng = self.rng
        profile = self.profile
        choice = rng.random()
        up = [h for h in self.hosts.values() if h.up]
        if choice < 0.5 and up:
            self._crash(rng.choice(up))
        elif choice < 0.8 and not self.net.cut:
            ids = sorted(self.hosts)
            rng.shuffle(ids)
            side = set(ids[: rng.randint(1, len(ids) - 1)])
            self.net.cut = {(a, b) for a in ids for b in ids if (a in side) != (b in side)}
            self._cut_for(rng.randint(*profile.partition_ms))
        elif choice < 0.9 and not self.net.cut:
            a, b = rng.sample(sorted(self.hosts), 2)
            self.net.cut = {(a, b)}  # one way only: b never hears a
            self._cut_for(rng.randint(*profile.partition_ms))
        else:
            self.net.reset_one()

    def _cut_for(self, duration_ms: int) -> None:
        self._partition += 1
        self.report.partitions += 1
        self._push(self.clock.now + duration_ms / 1000, HEAL, 0, self._partition)

    def on_new_epoch(self, host: RealHost) -> None:
        """``host`` has just written an epoch: maybe crash it a moment later."""
        if self.faulting and self.rng.random() < self.profile.crash_after_epoch:
            at = self.clock.now + self.rng.randint(0, 3) / 1000
            self._push(at, CRASH, host.sid, host.incarnation)
            self.report.epoch_crashes += 1

    def _crash(self, host: RealHost) -> None:
        host.crash()
        self.report.crashes += 1
        self._push(
            self.clock.now + self.rng.randint(*self.profile.downtime_ms) / 1000,
            RESTART,
            host.sid,
            host.incarnation,
        )

    def _stop_faults(self) -> None:
        self.faulting = False
        self._partition += 1
        self.net.heal()
        for host in self.hosts.values():
            if not host.up:
                host.start()

    def _propose_liveness_write(self) -> None:
        """Give the established leader a write, again if the last one's leader fell."""
        if self.live is not None:
            _, sid, incarnation, epoch = self.live
            host = self.hosts[sid]
            replica = host.replica
            if (
                replica is not None
                and host.incarnation == incarnation
                and replica.leading
                and replica.epoch == epoch
                and not self.live_failed
            ):
                return
        for host in self.hosts.values():
            replica = host.replica
            if replica is None or not replica.leading or not replica.serving:
                continue
            if replica.status.state is not ServerState.LEADING:
                continue
            value = b"live-%d" % self.report.steps
            self.live = (value, host.sid, host.incarnation, replica.epoch)
            self.live_failed = False
            self._submit(host, value)
            return

    def _lagging(self) -> list[str]:
        assert self.live is not None
        leader = self.hosts[self.live[1]]
        assert leader.replica is not None
        epoch = leader.replica.epoch
        history = self.checker.history
        out = []
        for host in self.hosts.values():
            if host.applied == history:
                continue
            replica = host.replica
            if replica is not None and replica.status.accepted_epoch > epoch:
                continue  # promised a later epoch: it may not follow this one
            out.append(f"server {host.sid} ({len(host.applied)} of {len(history)} txns)")
        return out

    def _converge(self) -> None:
        deadline = self.clock.now + LIVENESS_S
        while self._lagging():
            if self.clock.now > deadline:
                raise LivenessFailure(
                    f"not converged {LIVENESS_S} s after the last write committed: "
                    + ", ".join(self._lagging())
                )
            self._step()
