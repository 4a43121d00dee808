"""A deterministic simulation of a Zab ensemble: one seed, one history.

Every server runs the real :class:`~herder.ensemble.zab.Peer` over a simulated network
(delay, loss, duplication, reordering, partitions), a simulated disk
(:mod:`tests.sim.disk`) and one simulated clock that jumps from event to event. Client
writes arrive at random servers; servers crash, restart, and now and then find their
log corrupt. :class:`~tests.sim.checker.Checker` checks safety after every step.

A client model goes with the writes: a write is *acknowledged* once the server it was
given to applies it (as a real server answers its client), and every write, acknowledged
or not, must be committed at most once (:class:`~tests.sim.checker.Checker` catches a
second commit of the same write at once).

After ``steps`` steps the faults stop: the network heals, every server comes back, and a
leader must be established and commit a new write within ``LIVENESS_MS`` of simulated
time. Then every server must *converge* within ``LIVENESS_MS`` more: apply exactly the
history committed, every acknowledged write once in it. The one server excused is one
that accepted a later epoch than the final leader's (from a leader that never got
established): Zab forbids it to follow an older epoch, so it waits for the next
election, which a calm ensemble never holds.

All randomness comes from one ``random.Random(seed)``, so a failing seed replays
exactly (``python -m tests.sim --seed N``).
"""

from __future__ import annotations

import heapq
import random
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

from herder.ensemble.zab import (
    Append,
    Faults,
    Leading,
    Ready,
    Role,
    ServerState,
    Snapshot,
    Txn,
    ZabConfig,
    ZabPhase,
)
from herder.ensemble.zab.messages import (
    Ack,
    AckEpoch,
    Diff,
    LeaderInfo,
    Message,
    NewLeader,
    Snap,
    Trunc,
)
from herder.errors import NotLeader
from tests.sim.checker import Checker, SafetyViolation
from tests.sim.disk import HostSnapshot
from tests.sim.failures import LivenessFailure, SimulationFailure
from tests.sim.host import NEVER, SimServer, encode_state
from tests.sim.profiles import DRAWN, PROFILES

DELIVER, TIMER, FLUSH, CLIENT, FAULT, RESTART, HEAL, CRASH = range(8)
KINDS = ("deliver", "timer", "flush", "client", "fault", "restart", "heal", "crash")

#: a leader must commit a new write within this much simulated time once faults stop
LIVENESS_MS = 60_000
#: every seed must commit at least this many writes (the liveness write included)
MIN_COMMITS = 3

#: packets after which a server may crash on purpose (FoundationDB's BUGGIFY): the
#: moments where a missing fsync would show
_CRITICAL = (LeaderInfo, AckEpoch, NewLeader)


def _is_critical(message: Message) -> bool:
    if isinstance(message, Ack):
        return message.zxid & 0xFFFF_FFFF == 0  # the ACK of NEWLEADER
    return isinstance(message, _CRITICAL)


_SYNC_KINDS = {Snap: "snap", Diff: "diff", Trunc: "trunc"}


@dataclass
class Report:
    seed: int
    servers: dict[int, Role]
    steps: int = 0
    sim_ms: int = 0
    commits: int = 0
    writes: int = 0
    rejected_writes: int = 0
    crashes: int = 0
    corruptions: int = 0
    partitions: int = 0
    disconnects: int = 0
    leaders: int = 0
    syncs: Counter[str] = field(default_factory=Counter)
    liveness_ms: int = 0
    acknowledged_writes: int = 0
    convergence_ms: int = 0


class Simulation:
    def __init__(
        self,
        seed: int,
        *,
        steps: int = 2000,
        faults: Faults | None = None,
        profile: str | None = None,
    ) -> None:
        self.seed = seed
        self.steps = steps
        self.rng = rng = random.Random(seed)
        participants = rng.choice((3, 5))
        observers = rng.choice((0, 1))
        servers = {sid: Role.PARTICIPANT for sid in range(1, participants + 1)}
        for sid in range(participants + 1, participants + observers + 1):
            servers[sid] = Role.OBSERVER
        factor = rng.choice((0.33, 0.33, 0.05, 2.0, -1.0))
        self.config = ZabConfig(
            servers=servers,
            tick_ms=100,
            init_limit=10,
            sync_limit=5,
            # a short committed log, so that syncs from the on-disk log and by SNAP happen
            commit_log_count=rng.randint(3, 40),
            snapshot_size_factor=factor,
            finalize_wait_ms=40,
            max_notification_interval_ms=800,
            max_concurrent_snap_syncs=rng.choice((1, 10)),
            max_concurrent_diff_syncs=rng.choice((1, 100)),
            faults=faults or Faults(),
        )
        self.profile_name = profile or rng.choice(DRAWN)
        self.profile = PROFILES[self.profile_name]
        self.checker = Checker(self.config)
        self.report = Report(seed, servers)
        self.servers = {sid: SimServer(sid, self) for sid in servers}
        self.heap: list[tuple[int, int, int, int, Any, int]] = []
        self.now = 0
        self._seq = 0
        self.cut: set[tuple[int, int]] = set()
        self.links: dict[tuple[int, int], int] = {}
        self._partition = 0
        self.faulting = True
        self.writes = 0
        self.trace: deque[tuple[int, int, int, Any]] = deque(maxlen=300)
        self.live_payload: bytes | None = None
        self.live_leader: tuple[int, int, int] | None = None
        self.live_done = False
        #: client writes: the server (and incarnation) each was given to, and those that
        #: server has applied, which is when a real server answers its client
        self.submitted: dict[bytes, tuple[int, int]] = {}
        self.acknowledged: set[bytes] = set()

    # -- the event queue ----------------------------------------------------------------

    def _push(self, at: int, kind: int, sid: int = 0, data: Any = None, inc: int = 0) -> None:
        self._seq += 1
        heapq.heappush(self.heap, (at, self._seq, kind, sid, data, inc))

    def run(self) -> Report:
        try:
            return self._run()
        except Exception as e:
            raise SimulationFailure(self._failure(e), e) from e

    def _failure(self, e: BaseException) -> str:
        lines = [
            f"seed {self.seed} failed at {self.now} ms (step {self.report.steps}): "
            f"{type(e).__name__}: {e}",
            f"servers: {self.report.servers}, profile: {self.profile_name}",
            f"replay: python -m tests.sim --seed {self.seed} --steps {self.steps} "
            f"--profile {self.profile_name} --trace",
            "last events:",
        ]
        lines.extend(
            f"  {t:>7} {KINDS[k]:<8} s{sid} {data!r:.160}" for t, k, sid, data in self.trace
        )
        return "\n".join(lines)

    def _run(self) -> Report:
        for server in self.servers.values():
            server.start(0, corrupt=False)
            self._drain(server)
        self._push(self._exp(self.profile.fault_every_ms), FAULT)
        self._push(self._exp(self.profile.write_every_ms), CLIENT)
        report = self.report
        for _ in range(self.steps):
            self._step()
        report.sim_ms = self.now
        self._stop_faults()
        start = self.now
        deadline = start + LIVENESS_MS
        while not self.live_done:
            if self.now > deadline or report.steps > self.steps + 500_000:
                raise LivenessFailure(f"no write committed {LIVENESS_MS} ms after faults stopped")
            self._propose_liveness_write()
            self._step()
        report.liveness_ms = self.now - start
        assert self.live_leader is not None
        if self.servers[self.live_leader[0]].applied != self.checker.history:
            # every write ever applied anywhere must be in the state of today's leader
            raise SafetyViolation("the last leader's state lacks acknowledged writes")
        self._converge(self.now)
        report.convergence_ms = self.now - start - report.liveness_ms
        self._check_acknowledged()
        report.commits = len(self.checker.history)
        if report.commits < MIN_COMMITS:
            raise LivenessFailure(f"only {report.commits} writes committed")
        return report

    def _lagging(self) -> list[str]:
        """The servers that have not applied the committed history, and where they are."""
        assert self.live_leader is not None
        epoch = self.live_leader[2]
        history = self.checker.history
        out = []
        for server in self.servers.values():
            if server.applied == history:
                continue
            peer = server.peer
            if peer is not None and peer.status.accepted_epoch > epoch:
                continue  # promised a later epoch: it may not follow this one (see above)
            out.append(f"server {server.sid} ({len(server.applied)} of {len(history)} txns)")
        return out

    def _converge(self, start: int) -> None:
        """Step on until every server has applied exactly the committed history."""
        deadline = start + LIVENESS_MS
        while self._lagging():
            if self.now > deadline:
                raise LivenessFailure(
                    f"not converged {LIVENESS_MS} ms after the last write committed: "
                    + ", ".join(self._lagging())
                )
            self._step()

    def _check_acknowledged(self) -> None:
        """Every acknowledged write is in the final history (once: see the checker)."""
        committed = {txn.payload for txn in self.checker.history}
        lost = sorted(self.acknowledged - committed)
        if lost:
            raise SafetyViolation(f"acknowledged writes missing from the history: {lost[:5]}")
        self.report.acknowledged_writes = len(self.acknowledged)

    def _exp(self, mean: int) -> int:
        return self.now + 1 + int(self.rng.expovariate(1 / mean))

    def _step(self) -> None:
        at, _, kind, sid, data, inc = heapq.heappop(self.heap)
        self.now = at
        self.report.steps += 1
        self.trace.append((at, kind, sid, data))
        if kind == DELIVER:
            server = self.servers[sid]
            if server.peer is not None:
                server.peer.step(data[1], data[0], at)
                self._drain(server)
        elif kind == TIMER:
            server = self.servers[sid]
            if server.peer is not None and inc == server.incarnation and at == server.timer_at:
                server.timer_at = NEVER
                server.peer.tick(at)
                self._drain(server)
        elif kind == FLUSH:
            server = self.servers[sid]
            if server.peer is not None and inc == server.incarnation:
                token, appended = server.disk.complete(data)
                self.checker.on_durable(sid, appended)
                if token:
                    server.peer.disk_done(token, at)
                    self._drain(server)
        elif kind == CLIENT:
            if self.faulting:
                self._client_write()
                self._push(self._exp(self.profile.write_every_ms), CLIENT)
        elif kind == FAULT:
            if self.faulting:
                self._fault()
                self._push(self._exp(self.profile.fault_every_ms), FAULT)
        elif kind == CRASH:
            server = self.servers[sid]
            if server.peer is not None and inc == server.incarnation and self.faulting:
                self._crash(server)
        elif kind == RESTART:
            server = self.servers[sid]
            if server.peer is None and inc == server.incarnation:
                self._restart(server)
        elif kind == HEAL and data == self._partition:
            self.cut.clear()

    # -- the peers' effects -------------------------------------------------------------

    def _drain(self, server: SimServer) -> None:
        peer = server.peer
        assert peer is not None
        ready: Ready = peer.ready()
        sid = server.sid
        now = self.now
        rng = self.rng
        profile = self.profile
        if ready.disk:
            disk = server.disk
            checker = self.checker
            last = 0
            for op in ready.disk:
                if type(op) is Append:
                    checker.on_log_append(sid, disk.view.last_zxid, op.txns)
                last = disk.issue(op)
            self._push(now + rng.randint(*profile.disk_ms), FLUSH, sid, last, server.incarnation)
        for envelope in ready.messages:
            message = envelope.message
            kind = _SYNC_KINDS.get(type(message))
            if kind is not None:
                self.report.syncs[kind] += 1
            self._send(sid, envelope.to, message)
            if (
                self.faulting
                and _is_critical(message)
                and rng.random() < profile.crash_after_critical
            ):
                self._push(now + rng.randint(0, 3), CRASH, sid, None, server.incarnation)
        if ready.snapshot is not None:
            server.restore(ready.snapshot)
        if ready.committed:
            self._apply(server, ready.committed)
        if ready.events or ready.disk:
            status = peer.status
            if status.state is ServerState.LEADING and status.phase >= ZabPhase.SYNCHRONIZATION:
                self.checker.on_leading(status.epoch, sid, server.incarnation)
            for event in ready.events:
                if isinstance(event, Leading):
                    self.report.leaders += 1
        deadline = peer.next_deadline()
        if deadline < server.timer_at:
            server.timer_at = max(deadline, now)
            self._push(server.timer_at, TIMER, sid, None, server.incarnation)

    def _apply(self, server: SimServer, txns: list[Txn]) -> None:
        checker = self.checker
        sid = server.sid
        applied = server.applied
        submitted = self.submitted
        for txn in txns:
            checker.on_apply(sid, txn)
            applied.append(txn)
            if submitted.get(txn.payload) == (sid, server.incarnation):
                self.acknowledged.add(txn.payload)
            if txn.payload == self.live_payload and self.live_leader is not None:
                self.live_done = self.live_done or self.live_leader[0] == sid
        server.since_snapshot += len(txns)
        if server.since_snapshot >= server.snapshot_every:
            server.since_snapshot = 0
            snapshot = Snapshot(applied[-1].zxid, encode_state(applied))
            last = server.disk.issue(HostSnapshot(snapshot))
            self._push(
                self.now + self.rng.randint(*self.profile.disk_ms),
                FLUSH,
                sid,
                last,
                server.incarnation,
            )

    def _send(self, src: int, dst: int, message: Message) -> None:
        if (src, dst) in self.cut:
            return
        rng = self.rng
        profile = self.profile
        if profile.drop and rng.random() < profile.drop:
            return
        at = self.now + rng.randint(*profile.delay_ms)
        if profile.spike and rng.random() < profile.spike:
            # overtaken by whatever is sent next on the link
            at += rng.randint(0, profile.spike_ms)
        else:
            # links are FIFO, as TCP connections are
            link = (src, dst)
            at = max(at, self.links.get(link, 0))
            self.links[link] = at
        self._push(at, DELIVER, dst, (src, message))
        if profile.duplicate and rng.random() < profile.duplicate:
            again = at + rng.randint(0, profile.spike_ms)
            self._push(again, DELIVER, dst, (src, message))

    # -- the world ----------------------------------------------------------------------

    def _client_write(self) -> None:
        """A client with the whole connect string: it tries servers until one takes it."""
        live = [s for s in self.servers.values() if s.peer is not None]
        self.rng.shuffle(live)
        self.writes += 1
        self.report.writes += 1
        payload = b"w%d" % self.writes
        for server in live:
            assert server.peer is not None
            try:
                server.peer.forward(payload, self.now)
            except NotLeader:
                continue
            self.submitted[payload] = (server.sid, server.incarnation)
            self._drain(server)
            return
        self.report.rejected_writes += 1

    def _fault(self) -> None:
        rng = self.rng
        profile = self.profile
        choice = rng.random()
        live = [s for s in self.servers.values() if s.peer is not None]
        if choice < 0.5 and live:
            self._crash(rng.choice(live))
        elif choice < 0.8 and not self.cut:
            ids = sorted(self.servers)
            rng.shuffle(ids)
            side = set(ids[: rng.randint(1, len(ids) - 1)])
            self.cut = {(a, b) for a in ids for b in ids if (a in side) != (b in side)}
            self._cut_for(rng.randint(*profile.partition_ms))
        elif choice < 0.9:
            a, b = rng.sample(sorted(self.servers), 2)
            self.cut.add((a, b))  # one way only: a hears b, b never hears a
            self._cut_for(rng.randint(*profile.partition_ms))
        elif live:
            # a connection reset: the server hears its link to another one closed
            server = rng.choice(live)
            other = rng.choice([sid for sid in self.servers if sid != server.sid])
            self._disconnect(server, other)

    def _disconnect(self, server: SimServer, other: int) -> None:
        assert server.peer is not None
        self.report.disconnects += 1
        server.peer.disconnected(other, self.now)
        self._drain(server)

    def _cut_for(self, duration: int) -> None:
        self._partition += 1
        self.report.partitions += 1
        self._push(self.now + duration, HEAL, 0, self._partition)

    def _crash(self, server: SimServer) -> None:
        server.crash()
        self.report.crashes += 1
        # a process that dies closes its connections: most servers hear of it at once
        for other in self.servers.values():
            if other.peer is not None and self.rng.random() < 0.5:
                self._disconnect(other, server.sid)
        self._push(
            self.now + self.rng.randint(*self.profile.downtime_ms),
            RESTART,
            server.sid,
            None,
            server.incarnation,
        )

    def _restart(self, server: SimServer) -> None:
        # corrupt at most one server at a time, so that a healthy quorum remains
        healthy = not any(s.disk.durable.needs_snap for s in self.servers.values())
        corrupt = self.faulting and healthy and self.rng.random() < self.profile.corruption
        server.start(self.now, corrupt)
        self._drain(server)

    def _stop_faults(self) -> None:
        self.faulting = False
        self.profile = self.profile.calm()
        self.cut.clear()
        self._partition += 1
        for server in self.servers.values():
            if server.peer is None:
                self._restart(server)

    def _propose_liveness_write(self) -> None:
        """Give the established leader a write, again if the last one's leader fell."""
        if self.live_leader is not None:
            sid, incarnation, epoch = self.live_leader
            server = self.servers[sid]
            if server.peer is not None and server.incarnation == incarnation:
                status = server.peer.status
                if status.serving and status.epoch == epoch:
                    return
        for server in self.servers.values():
            peer = server.peer
            if peer is None:
                continue
            status = peer.status
            if status.state is ServerState.LEADING and status.serving:
                self.live_payload = b"live-%d" % self.report.steps
                self.live_leader = (server.sid, server.incarnation, status.epoch)
                peer.propose(self.live_payload, self.now)
                self._drain(server)
                return
