"""The simulated world around one coordinator core: clock, network, store, failovers, faults.

Everything happens on one simulated clock that jumps from event to event; the core's
own timers are events too (it is ticked at its ``next_deadline``). Requests travel to
whichever coordinator is current when they arrive (none between a failover and the
next load: they are answered NOT_COORDINATOR, as a server that does not lead would);
answers travel back. Either may be delayed (now and then long enough to overtake later
ones) or lost.

The store is one log, as the ensemble's is: writes complete in the order they were
made, after a delay, or fail. At a failover the writes in flight are split as a new
leader's log would split them: a prefix landed (it is loaded, and its callbacks say so
to the old core), the rest is lost.

After ``steps`` steps the faults stop and every member still running must end up in
one Stable generation within ``LIVENESS_MS`` of simulated time. All randomness comes
from one ``random.Random(seed)``: a seed replays exactly.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections import Counter, deque
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from herder.coordinator import (
    CoordinatorConfig,
    CoordinatorStatus,
    GroupCoordinator,
    GroupState,
    GroupStore,
    StoreCallback,
    TopicPartition,
    collect_groups,
)
from herder.coordinator.messages import (
    HeartbeatRequest,
    HeartbeatResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    LeaveGroupResponse,
    OffsetCommitRequest,
    OffsetCommitResponse,
    SyncGroupRequest,
    SyncGroupResponse,
)
from herder.coordinator.records import (
    FencingRecord,
    GroupRecord,
    OffsetRecord,
    encode_record,
    group_key,
    offset_key,
)
from herder.errors import ErrorCode
from tests.sim.coordinator.checker import INVARIANTS, Checker
from tests.sim.coordinator.clients import GROUP, Client, Phase, Process, Timing
from tests.sim.failures import LivenessFailure, SimulationFailure

#: every member still running must be in one Stable generation this soon after faults stop
LIVENESS_MS = 600_000
UNLIMITED = 2**31 - 1


@dataclass(frozen=True)
class Profile:
    """How hostile the world is; times in simulated milliseconds."""

    drop: float = 0.01
    delay_ms: tuple[int, int] = (1, 20)
    #: chance of a long delay, which lets the message overtake later ones
    spike: float = 0.01
    spike_ms: tuple[int, int] = (200, 4_000)
    store_ms: tuple[int, int] = (1, 30)
    store_error: float = 0.02
    fault_every_ms: int = 2_500
    #: relative weights of the faults
    faults: tuple[tuple[str, int], ...] = (
        ("crash", 3),
        ("stop", 2),
        ("start", 6),
        ("bounce", 5),
        ("zombie", 2),
        ("metadata", 2),
        ("failover", 2),
        ("nothing", 3),
    )


PROFILES = {
    "default": Profile(),
    "lossy": Profile(drop=0.05, spike=0.05, store_error=0.05),
    "failovers": Profile(
        faults=(
            ("crash", 2),
            ("start", 4),
            ("bounce", 4),
            ("zombie", 1),
            ("failover", 6),
            ("nothing", 2),
        )
    ),
    "churn": Profile(fault_every_ms=800),
}


@dataclass
class Report:
    seed: int
    profile: str
    static: int
    dynamic: int
    steps: int = 0
    sim_ms: int = 0
    failovers: int = 0
    capacity_changes: int = 0
    generations: int = 0
    #: static members that rejoined without a member id and got their place back with
    #: no new generation
    takeovers: int = 0
    commits_accepted: int = 0
    answers: Counter[str] = field(default_factory=Counter)
    liveness_ms: int = 0


@dataclass
class _Write:
    entries: list[tuple[bytes, bytes | None]]
    callback: StoreCallback
    due_ms: int
    error: ErrorCode


class SimStore(GroupStore):
    """The ``_groups`` log of the ensemble: writes complete in order, or fail."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.log: list[tuple[bytes, bytes | None]] = []
        self.pending: deque[_Write] = deque()
        self.offset_writes = 0
        self.zxid = 0

    def store_group(self, group_id: str, record: GroupRecord, callback: StoreCallback) -> None:
        self._write([(group_key(group_id), encode_record(record))], callback)

    def store_offsets(
        self,
        group_id: str,
        offsets: Mapping[TopicPartition, OffsetRecord | None],
        callback: StoreCallback,
    ) -> None:
        self.offset_writes += 1
        entries = [
            (offset_key(group_id, tp), None if rec is None else encode_record(rec))
            for tp, rec in offsets.items()
        ]
        self._write(entries, callback)

    def delete_group(
        self, group_id: str, partitions: Sequence[TopicPartition], callback: StoreCallback
    ) -> None:
        entries: list[tuple[bytes, bytes | None]] = [(group_key(group_id), None)]
        entries += [(offset_key(group_id, tp), None) for tp in partitions]
        self._write(entries, callback)

    def store_fencing(self, record: FencingRecord, callback: StoreCallback) -> None:
        raise AssertionError("the simulated members take no fencing epochs")

    def _write(self, entries: list[tuple[bytes, bytes | None]], callback: StoreCallback) -> None:
        world = self.world
        previous = self.pending[-1].due_ms if self.pending else world.now
        due = max(previous, world.now + world.rng.randint(*world.profile.store_ms))
        error = ErrorCode.NONE
        if not world.calm and world.rng.random() < world.profile.store_error:
            error = world.rng.choice((ErrorCode.NOT_LEADER, ErrorCode.REQUEST_TIMED_OUT))
        write = _Write(entries, callback, due, error)
        self.pending.append(write)
        world.schedule_at(due, self._complete_due)

    def _complete_due(self) -> None:
        while self.pending and self.pending[0].due_ms <= self.world.now:
            write = self.pending.popleft()
            if write.error == ErrorCode.NONE:
                self.log.extend(write.entries)
                self.zxid += 1
                write.callback(ErrorCode.NONE, self.zxid)
            else:
                write.callback(write.error)

    def split_at_failover(self) -> list[Callable[[], None]]:
        """A prefix of the writes in flight is in the new leader's log, the rest is lost.

        What landed is appended now (the new coordinator loads it); the callbacks, to
        be run a little later on the old core, are returned.
        """
        writes, self.pending = list(self.pending), deque()
        landed = self.world.rng.randint(0, len(writes))
        completions = []
        for index, write in enumerate(writes):
            ok = index < landed and write.error == ErrorCode.NONE
            if ok:
                self.log.extend(write.entries)
            completions.append(lambda w=write, ok=ok: self._finish(w, ok))
        return completions

    def _finish(self, write: _Write, ok: bool) -> None:
        if ok:
            self.zxid += 1
            write.callback(ErrorCode.NONE, self.zxid)
        else:
            write.callback(ErrorCode.NOT_LEADER)


_RESPONSES: dict[type, type] = {
    JoinGroupRequest: JoinGroupResponse,
    SyncGroupRequest: SyncGroupResponse,
    HeartbeatRequest: HeartbeatResponse,
    LeaveGroupRequest: LeaveGroupResponse,
    OffsetCommitRequest: OffsetCommitResponse,
}


def _refusal(request: Any, error: ErrorCode) -> Any:
    """What a server that is not the coordinator answers."""
    return _RESPONSES[type(request)](error_code=error)


class World:
    def __init__(
        self,
        seed: int,
        *,
        steps: int = 1500,
        profile: str | None = None,
        invariants: Collection[str] = INVARIANTS,
        trace: bool = False,
    ) -> None:
        self.seed = seed
        self.steps = steps
        self.rng = rng = random.Random(seed)
        self.profile_name = profile or rng.choice(sorted(PROFILES))
        self.profile = PROFILES[self.profile_name]
        self.tracing = trace
        self.trace_lines: list[str] = []
        self.now = 0
        self.calm = False
        self._queue: list[tuple[int, int, Callable[[], None]]] = []
        self._sequence = itertools.count()
        self._ids = itertools.count(1)
        self.store = SimStore(self)
        self.checker = Checker(invariants)
        self.clients = self._draw_clients()
        self.processes: list[Process] = []
        self.config = CoordinatorConfig(
            group_min_session_timeout_ms=1_000,
            group_max_size=self._draw_capacity(),
            group_initial_rebalance_delay_ms=rng.choice((0, 0, 500, 3_000)),
            # above every heartbeat interval: members learn of a rebalance by heartbeat,
            # and a newcomer that expires before they rejoin would never get in
            group_new_member_join_timeout_ms=rng.choice((45_000, 300_000)),
        )
        self.coordinator: GroupCoordinator | None = None
        self.incarnation = 0
        #: request id -> (process, kind, request, the group's generation when it arrived)
        self._requests: dict[int, tuple[Process, str, Any]] = {}
        self._handled_at: dict[int, int] = {}
        self.report = Report(
            seed,
            self.profile_name,
            static=sum(c.is_static for c in self.clients),
            dynamic=sum(not c.is_static for c in self.clients),
        )
        self._generations_seen: set[tuple[int, int]] = set()

    # -- the draw --------------------------------------------------------------------

    def _draw_clients(self) -> list[Client]:
        rng = self.rng
        session = rng.choice((6_000, 10_000, 30_000))
        rebalance = rng.choice((10_000, 30_000, 60_000))
        timing = Timing(
            session_timeout_ms=session,
            rebalance_timeout_ms=rebalance,
            heartbeat_interval_ms=session // 3,
            commit_interval_ms=rng.choice((1_000, 5_000)),
        )
        count = rng.randint(3, 6)
        share = rng.choice((0.0, 0.5, 0.5, 1.0))
        return [
            Client(f"c{i}", f"instance-{i}" if rng.random() < share else None, timing)
            for i in range(count)
        ]

    def _draw_capacity(self) -> int:
        count = len(self.clients)
        return self.rng.choice((UNLIMITED, UNLIMITED, count, count - 1, max(1, count - 2)))

    # -- events ----------------------------------------------------------------------

    def schedule(self, delay_ms: int, action: Callable[[], None]) -> None:
        self.schedule_at(self.now + max(delay_ms, 0), action)

    def schedule_at(self, at_ms: int, action: Callable[[], None]) -> None:
        heapq.heappush(self._queue, (max(at_ms, self.now), next(self._sequence), action))

    def trace(self, line: str) -> None:
        if self.tracing:
            self.trace_lines.append(f"{self.now:>9} {line}")

    def _delay(self) -> int | None:
        """How long a message takes, or None if it is lost."""
        profile, rng = self.profile, self.rng
        if not self.calm and rng.random() < profile.drop:
            return None
        if not self.calm and rng.random() < profile.spike:
            return rng.randint(*profile.spike_ms)
        return rng.randint(*profile.delay_ms)

    # -- the network -----------------------------------------------------------------

    def send(self, process: Process, kind: str, request: Any, *, timeout_ms: int) -> int:
        request_id = next(self._ids)
        self._requests[request_id] = (process, kind, request)
        delay = self._delay()
        if delay is None:
            self.trace(f"{process!r} {kind} #{request_id} lost")
        else:
            self.schedule(delay, lambda: self._deliver(request_id))

        def timed_out() -> None:
            if process.alive and process.awaiting == request_id:
                self.trace(f"{process!r} {kind} #{request_id} timed out")
                process.on_timeout(kind)

        self.schedule(timeout_ms, timed_out)
        return request_id

    def _deliver(self, request_id: int) -> None:
        process, kind, request = self._requests[request_id]
        coordinator = self.coordinator
        respond = self._responder(request_id, coordinator)
        if coordinator is None:
            respond(_refusal(request, ErrorCode.NOT_COORDINATOR))
            return
        group = coordinator.group(GROUP)
        self._handled_at[request_id] = group.generation_id if group else -1
        writes = self.store.offset_writes
        self.trace(f"{process!r} -> {kind} #{request_id} {request}")
        coordinator.handle(request, self.now, respond)
        if kind == "commit" and self.store.offset_writes > writes:
            self.report.commits_accepted += 1
            self.checker.on_commit_accepted(request, coordinator)

    def _responder(
        self, request_id: int, coordinator: GroupCoordinator | None
    ) -> Callable[[Any], None]:
        incarnation = self.incarnation

        def respond(response: Any) -> None:
            process, kind, request = self._requests[request_id]
            current = coordinator is not None and coordinator is self.coordinator
            # a loading coordinator answers heartbeats blindly: that judges nothing
            judged = coordinator is not None and coordinator.status is CoordinatorStatus.ACTIVE
            self.checker.on_answer(request_id, request, response, incarnation, current, judged)
            code = ErrorCode(response.error_code)
            self.report.answers[f"{kind} {code.name}"] += 1
            self._count(request_id, request, response, code)
            delay = self._delay()
            self.trace(f"{process!r} <- {kind} #{request_id} {code.name}")
            if delay is not None:
                self.schedule(
                    delay, lambda: process.on_response(kind, request_id, request, response)
                )

        return respond

    def _count(self, request_id: int, request: Any, response: Any, code: ErrorCode) -> None:
        if not isinstance(request, JoinGroupRequest) or code != ErrorCode.NONE:
            return
        self._generations_seen.add((self.incarnation, response.generation_id))
        self.report.generations = len(self._generations_seen)
        restarted = request.group_instance_id is not None and not request.member_id
        if restarted and response.generation_id == self._handled_at.get(request_id):
            self.report.takeovers += 1

    # -- the coordinator's lifecycle ---------------------------------------------------

    def _elect(self) -> None:
        """A new ensemble leader: a fresh coordinator loads every group from the log."""
        if self.rng.random() < 0.4:
            capacity = self._draw_capacity()
            if capacity != self.config.group_max_size:
                self.report.capacity_changes += 1
                self.config = replace(self.config, group_max_size=capacity)
        self.incarnation += 1
        coordinator = GroupCoordinator(
            self.store,
            random=random.Random(self.seed * 1_000 + self.incarnation),
            config=self.config,
        )
        coordinator.begin_loading(self.now)
        for stored in collect_groups(self.store.log).values():
            coordinator.load_group(stored.group_id, stored.record, stored.offsets, self.now)
        self.coordinator = coordinator
        self.trace(
            f"coordinator {self.incarnation} loading (group.max.size {self.config.group_max_size})"
        )

        def finish() -> None:
            if self.coordinator is coordinator:
                coordinator.finish_loading(self.now)
                self.trace(f"coordinator {self.incarnation} active")

        self.schedule(self.rng.randint(0, 300), finish)

    def _failover(self) -> None:
        old = self.coordinator
        if old is None or old.status is not CoordinatorStatus.ACTIVE:
            return
        self.report.failovers += 1
        self.trace(f"coordinator {self.incarnation} loses leadership")
        old.unload_all()
        self.coordinator = None
        for completion in self.store.split_at_failover():
            self.schedule(self.rng.randint(0, 50), completion)
        self.schedule(self.rng.randint(50, 3_000), self._elect)

    # -- faults ----------------------------------------------------------------------

    def _start(self, client: Client) -> Process:
        process = Process(self, client, len(self.processes))
        self.processes.append(process)
        self.trace(f"start {process!r}")
        process.start()
        return process

    def _running(self, client: Client) -> list[Process]:
        return [p for p in self.processes if p.client is client and p.alive]

    def _fault(self) -> None:
        if self.calm:
            return
        rng = self.rng
        names, weights = zip(*self.profile.faults, strict=True)
        fault = rng.choices(names, weights)[0]
        alive = [p for p in self.processes if p.alive]
        statics = [c for c in self.clients if c.is_static and self._running(c)]
        stopped = [c for c in self.clients if not self._running(c)]
        if fault == "crash" and alive:
            victim = rng.choice(alive)
            self.trace(f"crash {victim!r}")
            victim.die()
        elif fault == "stop" and alive:
            victim = rng.choice(alive)
            leave = not victim.client.is_static or rng.random() < 0.2
            self.trace(f"stop {victim!r} (leave: {leave})")
            victim.stop(leave=leave)
        elif fault == "start" and stopped:
            self._start(rng.choice(stopped))
        elif fault == "bounce" and statics:
            # a rolling restart: the process stops without leaving, a new one starts
            client = rng.choice(statics)
            for process in self._running(client):
                self.trace(f"bounce {process!r}")
                process.die()
            self.schedule(
                rng.randint(100, client.timing.session_timeout_ms // 2), lambda: self._start(client)
            )
        elif fault == "zombie" and statics:
            # a second process with the same instance id, the first one still running
            self._start(rng.choice(statics))
        elif fault == "metadata" and alive:
            rng.choice(alive).change_metadata()
        elif fault == "failover":
            self._failover()
        self.schedule(rng.randint(1, 2 * self.profile.fault_every_ms), self._fault)

    # -- running ---------------------------------------------------------------------

    def run(self) -> Report:
        try:
            self._run()
        except Exception as exc:  # a violation, a liveness failure, or the core crashing
            tail = "\n".join(self.trace_lines[-40:])
            raise SimulationFailure(
                f"seed {self.seed} ({self.profile_name}) failed at step {self.report.steps}, "
                f"t={self.now} ms: {type(exc).__name__}: {exc}\n"
                f"  replay: python -m tests.sim.coordinator --seed {self.seed} --trace"
                + (f"\n{tail}" if tail else ""),
                exc,
            ) from exc
        return self.report

    def _run(self) -> None:
        self._elect()
        for client in self.clients:
            self.schedule(self.rng.randint(0, 2_000), lambda c=client: self._start(c))
        self.schedule(self.profile.fault_every_ms, self._fault)
        while self.report.steps < self.steps:
            if not self._step():
                break
        self._calm_down()

    def _calm_down(self) -> None:
        """Faults stop: the network heals, a coordinator serves; the group must settle."""
        self.calm = True
        if self.coordinator is None:
            self._elect()
        started = self.now
        deadline = started + LIVENESS_MS
        while not self._settled():
            if self.now > deadline or not self._step():
                raise LivenessFailure(self._unsettled(deadline - started))
        self.report.liveness_ms = self.now - started
        self.report.sim_ms = self.now

    def _step(self) -> bool:
        due = self.coordinator.next_deadline() if self.coordinator is not None else None
        if due is not None and (not self._queue or due <= self._queue[0][0]):
            self.now = max(self.now, due)
            assert self.coordinator is not None
            self.coordinator.tick(self.now)
        elif self._queue:
            at, _, action = heapq.heappop(self._queue)
            self.now = max(self.now, at)
            action()
        else:
            return False
        self.report.steps += 1
        self.checker.after_step(self.coordinator, self.incarnation)
        return True

    def _settled(self) -> bool:
        coordinator = self.coordinator
        if coordinator is None or coordinator.status is not CoordinatorStatus.ACTIVE:
            return False
        group = coordinator.group(GROUP)
        running = [p for p in self.processes if p.alive]
        if not running:
            return group is None or not group.members
        if group is None or group.state is not GroupState.STABLE:
            return False
        return sorted(group.member_ids) == sorted(p.member_id for p in running) and all(
            p.phase is Phase.STABLE and p.generation == group.generation_id for p in running
        )

    def _unsettled(self, waited: int) -> str:
        group = self.coordinator.group(GROUP) if self.coordinator else None
        running = [p for p in self.processes if p.alive]
        return (
            f"not settled {waited} ms after the faults stopped: group {group!r}, running {running}"
        )


def run_seeds(seeds: Iterable[int], **kwargs: Any) -> list[Report]:
    return [World(seed, **kwargs).run() for seed in seeds]
