"""A deterministic simulation of a Connect cluster: N workers' real cores, one clock.

Each simulated worker runs the real :class:`MemberMachine` and :class:`HerderCore`;
the group coordinator is the real :class:`GroupCoordinator`, and the config, status
and fencing logs live in the real ensemble :class:`StateMachine`. What a worker's
shell would do with IO — send a request, read the config log, start a task — the
simulation does on a simulated clock with seeded delays, and it injects faults on
purpose: worker crashes and restarts, pauses (a zombie that comes back), lost,
delayed and reordered messages, slow config reads, and coordinator failovers (every
group unloaded, then loaded into a fresh coordinator from ``_groups``).

Each seed draws the workers' ``connect.protocol``: all eager, all cooperative
(``sessioned``), or a mix of eager, compatible and sessioned, which agrees on eager while
an eager worker is in the group and moves to a cooperative protocol when none is.

After every step :class:`~tests.sim.connect.checker.Checker` checks the invariants;
after the faults stop, every connector and task must be RUNNING within a bound.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from unittest import mock

import msgspec

from herder.coordinator import messages as m
from herder.coordinator.apis import fencing_op
from herder.coordinator.config import CoordinatorConfig
from herder.coordinator.coordinator import CoordinatorStatus, GroupCoordinator
from herder.coordinator.member import Member as CoordinatorMember
from herder.coordinator.records import (
    FENCING_LOG,
    GROUPS_LOG,
    collect_groups,
    decode_fencing_value,
    encode_record,
    fencing_key,
    group_key,
    offset_key,
)
from herder.ensemble.state import StateMachine
from herder.ensemble.txn import Append, CreateLog, Op, TxnHeader, TxnResult, WriteTxn
from herder.errors import CoordinatorNotAvailable, ErrorCode, HerderError, RequestTimedOut
from herder.runtime.core import effects as fx
from herder.runtime.core import herder as herder_core
from herder.runtime.core import member as mm
from herder.runtime.core.config_state import (
    ConfigState,
    RestartRequest,
    TargetState,
    connector_config_record,
    connector_removal_records,
    restart_request_record,
    target_state_record,
    task_config_records,
)
from herder.runtime.core.herder import HerderCore
from herder.runtime.core.protocol import (
    COOPERATIVE_PROTOCOLS,
    ConnectorTaskId,
    ConnectProtocol,
    decode_assignment,
    decode_metadata,
    encode_assignment,
    encode_metadata,
)
from herder.runtime.core.session_key import (
    KeyPolicy,
    SessionKey,
    session_key_record,
    signature_headers,
)
from herder.runtime.core.status import ConnectorStatus, State, StatusView, TaskStatus, status_record
from tests.sim.connect.checker import Checker, Violation
from tests.sim.failures import SimulationFailure

CONFIGS = "_configs"
STATUS = "_status"
GROUP = "connect-sim"
LEADER_FENCE = f"connect-leader-{GROUP}"
CONNECTORS = ("c0", "c1", "c2", "c3")

SESSION_MS = 10_000
REBALANCE_MS = 20_000
HEARTBEAT_MS = 3_000
UNSYNC_BACKOFF_MS = 1_000
#: after the faults stop, everything must run within this much simulated time
LIVENESS_MS = 180_000


@dataclass
class Bugs:
    """Planted bugs, each breaking one rule an invariant stands for."""

    #: the leader gives every task to two workers
    two_owners: bool = False
    #: a revocation is reported finished before the work has stopped
    eager_revocation: bool = False
    #: a worker starts work without reading the config log to the assignment's offset
    no_catch_up: bool = False
    #: config writes go without the leader's fencing check
    unfenced_writes: bool = False
    #: a status of an older generation replaces a newer one
    status_ignores_generation: bool = False
    #: a cooperative worker joins without saying what it holds
    metadata_hides_work: bool = False
    #: a cooperative member dropped from the group rejoins still running its work
    dropped_member_keeps_work: bool = False
    #: followers send their task configs unsigned under sessioned
    unsigned_requests: bool = False
    #: a coordinator that loads a group knows each member only by the protocol the
    #: group chose (Kafka's does), refusing an eager worker of a group being upgraded
    loaded_members_forget_protocols: bool = False


@dataclass
class Report:
    seed: int
    steps: int
    crashes: int = 0
    pauses: int = 0
    failovers: int = 0
    lost: int = 0
    generations: int = 0
    config_writes: int = 0
    fenced_writes: int = 0
    operations: int = 0
    settled_ms: int = 0
    #: the workers' connect.protocol: eager, sessioned or mixed
    mode: str = ""
    #: generations under a cooperative protocol, and assignments in them revoking work
    cooperative_generations: int = 0
    revocations: int = 0
    #: workers that exited because their membership failed for good
    exits: int = 0
    #: session keys written (sessioned)
    session_keys: int = 0


class Ensemble:
    """The replicated logs, as the real state machine applies them (one replica)."""

    def __init__(self) -> None:
        self.sm = StateMachine()
        self._counter = itertools.count(1)
        self.apply(
            [
                CreateLog(name, compacted=True)
                for name in (CONFIGS, STATUS, GROUPS_LOG, FENCING_LOG)
            ],
            0,
        )

    def apply(self, ops: list[Op], now_ms: int) -> TxnResult:
        zxid = (1 << 32) | next(self._counter)
        return self.sm.apply(WriteTxn(TxnHeader(zxid, now_ms), ops))

    def records(self, log: str, start: int = 0) -> list[Any]:
        out: list[Any] = []
        while start < self.sm.end_offset(log):
            batch = self.sm.read(log, start, 10_000)
            if not batch:
                break
            out += batch
            start = batch[-1].offset + 1
        return out

    def fencing_epoch(self, fenced_id: str) -> int | None:
        record = self.sm.get(FENCING_LOG, fencing_key(fenced_id))
        if record is None or record.value is None:
            return None
        return decode_fencing_value(record.value).epoch


class _Store:
    """The coordinator's GroupStore on the simulated ensemble, with write latency."""

    def __init__(self, sim: Simulation, incarnation: int) -> None:
        self.sim = sim
        self.incarnation = incarnation
        #: when the latest write commits: the leader's proposals commit in the order it
        #: made them (Zab's FIFO order), however long each takes
        self._last_commit_at = 0

    def _commit(self, ops: list[Op], callback: Any) -> None:
        def done() -> None:
            if self.sim.coordinator_incarnation != self.incarnation:
                # a deposed leader's proposal: it may or may not have committed
                if self.sim.rng.random() < 0.5:
                    self.sim.ensemble.apply(ops, self.sim.now)
                return
            result = self.sim.ensemble.apply(ops, self.sim.now)
            callback(ErrorCode(result.error_code), result.zxid)
            self.sim.schedule_coordinator_tick()

        at = max(self.sim.now + self.sim.rng.randint(1, 30), self._last_commit_at)
        self._last_commit_at = at
        self.sim.after(at - self.sim.now, done)

    def store_group(self, group_id: str, record: Any, callback: Any) -> None:
        self._commit([Append(GROUPS_LOG, group_key(group_id), encode_record(record))], callback)

    def store_offsets(self, group_id: str, offsets: Any, callback: Any) -> None:
        ops: list[Op] = [
            Append(GROUPS_LOG, offset_key(group_id, tp), None if r is None else encode_record(r))
            for tp, r in offsets.items()
        ]
        self._commit(ops, callback)

    def delete_group(self, group_id: str, partitions: Any, callback: Any) -> None:
        ops: list[Op] = [Append(GROUPS_LOG, group_key(group_id), None)]
        ops += [Append(GROUPS_LOG, offset_key(group_id, tp), None) for tp in partitions]
        self._commit(ops, callback)

    def store_fencing(self, record: Any, callback: Any) -> None:
        key = fencing_key(record.fenced_id)
        self._commit([Append(FENCING_LOG, key, encode_record(record))], callback)


@dataclass
class _Running:
    """One execution of a connector or task on a worker."""

    worker: int
    generation: int


@dataclass
class SimWorker:
    """One worker: its cores and what its shell would hold."""

    index: int
    incarnation: int
    member: mm.MemberMachine
    core: HerderCore
    configs: ConfigState = field(default_factory=ConfigState)
    statuses: StatusView = field(default_factory=StatusView)
    config_position: int = 0
    status_position: int = 0
    started: bool = False
    paused: bool = False
    crashed: bool = False
    busy: bool = False
    pending: list[fx.Effect] = field(default_factory=list)
    #: the generation work may start in (the worker's own guard), None once revoked
    begun: int | None = None
    connectors: set[str] = field(default_factory=set)
    tasks: set[ConnectorTaskId] = field(default_factory=set)
    deferred: list[Callable[[], None]] = field(default_factory=list)
    timer_due: int | None = None

    @property
    def url(self) -> str:
        return f"http://worker-{self.index}:8083"

    @property
    def worker_id(self) -> str:
        return f"worker-{self.index}:8083"

    @property
    def alive(self) -> bool:
        return not self.crashed


class Simulation:
    def __init__(
        self,
        seed: int,
        *,
        steps: int = 1500,
        workers: int | None = None,
        bugs: Bugs | None = None,
    ) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.steps = steps
        self.bugs = bugs or Bugs()
        self.now = 0
        self._queue: list[tuple[int, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self.ensemble = Ensemble()
        self.report = Report(seed, 0)
        self.checker = Checker(self)
        self.trace: list[str] = []
        self.coordinator_incarnation = 0
        self.coordinator: GroupCoordinator | None = None
        self._coordinator_due: int | None = None
        self._start_coordinator()
        self.loss = self.rng.choice([0.0, 0.02, 0.08])
        self.max_delay = self.rng.choice([5, 50, 400])
        self.slow_reads = self.rng.random() < 0.5
        self.faults = True
        count = workers or self.rng.randint(1, 4)
        self.mode = self.rng.choice(["eager", "sessioned", "mixed"])
        #: each worker's connect.protocol (a restarted worker keeps its config)
        self.protocols = [
            ConnectProtocol(self.mode)
            if self.mode != "mixed"
            else self.rng.choice(list(ConnectProtocol))
            for _ in range(count)
        ]
        self.max_delay_ms = self.rng.choice([0, 3_000, 20_000])
        #: inter.worker.key.ttl.ms: short enough that keys rotate during a run
        self.key_ttl_ms = self.rng.choice([0, 5_000, 30_000])
        self.report.mode = self.mode
        self.workers = [self._new_worker(i, 0) for i in range(count)]
        #: (connector or task) -> its executions now
        self.running: dict[str | ConnectorTaskId, list[_Running]] = {}

    # -- the event queue --------------------------------------------------------------

    def after(self, delay_ms: int, fn: Callable[[], None]) -> None:
        heapq.heappush(self._queue, (self.now + max(0, delay_ms), next(self._seq), fn))

    def for_worker(self, w: SimWorker, delay_ms: int, fn: Callable[[], None]) -> None:
        """An event of worker ``w``'s incarnation: dropped if it crashed, held while paused."""
        incarnation = w.incarnation

        def run() -> None:
            if w.incarnation != incarnation or w.crashed:
                return
            if w.paused:
                w.deferred.append(run)
                return
            fn()

        self.after(delay_ms, run)

    def log(self, line: str) -> None:
        self.trace.append(f"{self.now:>8} {line}")

    # -- the coordinator --------------------------------------------------------------

    def _start_coordinator(self) -> None:
        self.coordinator_incarnation += 1
        core = GroupCoordinator(
            _Store(self, self.coordinator_incarnation),
            random=random.Random(self.rng.random()),
            config=CoordinatorConfig(group_initial_rebalance_delay_ms=self.rng.choice([0, 300])),
        )
        core.begin_loading(self.now)
        groups = collect_groups((r.key or b"", r.value) for r in self.ensemble.records(GROUPS_LOG))
        for group_id, stored in groups.items():
            core.load_group(group_id, stored.record, stored.offsets, self.now)
        for record in self.ensemble.records(FENCING_LOG):
            if record.value is not None:
                fenced = decode_fencing_value(record.value)
                core.load_fencing(fenced.fenced_id, fenced.epoch, record.zxid)
        core.finish_loading(self.now)
        self.coordinator = core
        self._coordinator_due = None
        self.schedule_coordinator_tick()

    def failover(self) -> None:
        """The ensemble leader moves: every group is unloaded, then loaded elsewhere."""
        self.report.failovers += 1
        self.log("coordinator failover")
        if self.coordinator is not None:
            self.coordinator.unload_all()
        self.coordinator = None
        self.coordinator_incarnation += 1
        self.after(self.rng.randint(100, 3000), self._start_coordinator)

    def schedule_coordinator_tick(self) -> None:
        core = self.coordinator
        if core is None:
            return
        due = core.next_deadline()
        if due is None or (self._coordinator_due is not None and self._coordinator_due <= due):
            return
        self._coordinator_due = due
        incarnation = self.coordinator_incarnation

        def fire() -> None:
            if self.coordinator_incarnation != incarnation or self.coordinator is None:
                return
            self._coordinator_due = None
            self.coordinator.tick(self.now)
            self.schedule_coordinator_tick()

        self.after(due - self.now, fire)

    def _delay(self) -> int:
        return self.rng.randint(1, self.max_delay)

    def _lost(self) -> bool:
        if self.faults and self.rng.random() < self.loss:
            self.report.lost += 1
            return True
        return False

    def request(
        self,
        w: SimWorker,
        request: Any,
        on_answer: Callable[[Any], None],
        on_failure: Callable[[HerderError], None],
        *,
        timeout_ms: int | None = None,
    ) -> None:
        """Send ``request`` from ``w`` to the coordinator over the simulated network.

        A lost request or answer is noticed by the sender's own timeout: the member
        machine's deadlines, or ``timeout_ms`` for the herder's requests.
        """
        if timeout_ms is not None:
            answered = [False]
            inner = on_answer

            def on_answer(response: Any) -> None:
                if not answered[0]:
                    answered[0] = True
                    inner(response)

            def expire() -> None:
                if not answered[0]:
                    answered[0] = True
                    on_failure(RequestTimedOut("no answer from the coordinator"))

            self.for_worker(w, timeout_ms, expire)
        if self._lost():
            return

        def deliver() -> None:
            core = self.coordinator
            if core is None or core.status is not CoordinatorStatus.ACTIVE:
                self.for_worker(
                    w, self._delay(), lambda: on_failure(CoordinatorNotAvailable("no coordinator"))
                )
                return

            def respond(response: Any) -> None:
                if self._lost():
                    return
                self.for_worker(w, self._delay(), lambda: on_answer(response))

            core.handle(request, self.now, respond)
            self.schedule_coordinator_tick()

        self.after(self._delay(), deliver)

    # -- workers ----------------------------------------------------------------------

    def _new_worker(self, index: int, incarnation: int) -> SimWorker:
        rng = random.Random(self.rng.random())
        holder: list[SimWorker] = []

        def protocols() -> list[tuple[str, bytes]]:
            offered = holder[0].core.protocols()
            if self.bugs.metadata_hides_work:
                hidden = [
                    msgspec.structs.replace(decode_metadata(md), connectors=(), tasks=())
                    for _, md in offered
                ]
                offered = [
                    (n, encode_metadata(md)) for (n, _), md in zip(offered, hidden, strict=True)
                ]
            return offered

        member = mm.MemberMachine(
            GROUP,
            protocol_type="connect",
            protocols=protocols,
            session_timeout_ms=SESSION_MS,
            rebalance_timeout_ms=REBALANCE_MS,
            heartbeat_interval_ms=HEARTBEAT_MS,
            client_id=f"worker-{index}",
            client_host="sim",
            rng=rng,
            cooperative_protocols=COOPERATIVE_PROTOCOLS,
        )
        statuses = StatusView()
        core = HerderCore(
            f"worker-{index}:8083",
            f"http://worker-{index}:8083",
            statuses=statuses,
            unsync_backoff_ms=UNSYNC_BACKOFF_MS,
            protocol=self.protocols[index],
            max_delay_ms=self.max_delay_ms,
            key_policy=KeyPolicy(ttl_ms=self.key_ttl_ms),
        )
        self._plant(core)
        w = SimWorker(index, incarnation, member, core, statuses=statuses)
        holder.append(w)
        self.for_worker(w, self.rng.randint(0, 500), lambda: self._start_worker(w))
        return w

    def _plant(self, core: HerderCore) -> None:
        if self.bugs.two_owners:
            assign = core.assign

            def doubled(leader_id: str, members: Any, *args: Any) -> Any:
                result = assign(leader_id, members, *args)
                ids = sorted(result)
                if len(ids) > 1:
                    first, second = result[ids[0]], result[ids[1]]
                    tasks = tuple(sorted({*second.tasks, *first.tasks}))
                    result[ids[1]] = msgspec.structs.replace(second, tasks=tasks)
                return result

            core.assign = doubled  # type: ignore[method-assign]

    def _start_worker(self, w: SimWorker) -> None:
        # a worker reads the config log to its end before it joins (ConfigStore.start)
        self._read_configs(w)
        self._read_statuses(w)
        w.started = True
        self.log(f"worker {w.index} starts")
        self._member(w, w.member.start(self.now))
        self._follow(w)

    def _member(self, w: SimWorker, effects: list[Any]) -> None:
        """Carry out the group member's effects (its shell)."""
        for effect in effects:
            match effect:
                case mm.SendJoin(token=token, request=request):
                    self.request(
                        w,
                        request,
                        lambda r, t=token: self._member(w, w.member.join_answered(t, r, self.now)),
                        lambda e, t=token: self._member(w, w.member.request_failed(t, e, self.now)),
                    )
                case mm.SendSync(token=token, request=request):
                    self.request(
                        w,
                        request,
                        lambda r, t=token: self._member(w, w.member.sync_answered(t, r, self.now)),
                        lambda e, t=token: self._member(w, w.member.request_failed(t, e, self.now)),
                    )
                case mm.SendHeartbeat(token=token, request=request):
                    self.request(
                        w,
                        request,
                        lambda r, t=token: self._member(
                            w, w.member.heartbeat_answered(t, r, self.now)
                        ),
                        lambda e, t=token: self._member(w, w.member.request_failed(t, e, self.now)),
                    )
                case mm.SendLeave(request=request):
                    self.request(w, request, lambda r: None, lambda e: None)
                case mm.Assign(
                    token=token, leader_id=leader_id, protocol=protocol, members=members
                ):
                    decoded = {k: decode_metadata(v) for k, v in members.items()}
                    result = w.core.assign(leader_id, decoded, protocol, self.now)
                    encoded = {k: encode_assignment(a) for k, a in result.items()}
                    self._member(w, w.member.assignment_made(token, encoded, self.now))
                case mm.Revoke():
                    w.begun = None
                    w.core.revoking()
                    if self.bugs.eager_revocation:
                        self._member(w, w.member.revoked(self.now))
                case mm.Assigned(generation=generation, assignment=data):
                    assignment = decode_assignment(data)
                    self.checker.generation(w, generation, assignment)
                    w.core.assigned(generation, assignment)
                case mm.Failed(error=error):
                    w.core.member_failed(error)
                    self.for_worker(w, 0, lambda: self._exit(w, error))
                case mm.Rediscover() | mm.HeartbeatFailed():
                    pass
        self._pump(w)
        self._arm(w)

    def _arm(self, w: SimWorker) -> None:
        """Wake worker ``w`` at its member's or herder's next deadline."""
        # the herder's own deadlines wait while its loop is busy: it ticks when it is done
        herder_due = None if w.busy else w.core.next_due_ms()
        dues = [d for d in (w.member.next_deadline_ms(), herder_due) if d is not None]
        if not dues:
            return
        due = max(min(dues), self.now)
        if w.timer_due is not None and w.timer_due <= due:
            return
        w.timer_due = due

        def fire() -> None:
            w.timer_due = None
            self._member(w, w.member.tick(self.now))

        self.for_worker(w, due - self.now, fire)

    # -- the config and status logs ---------------------------------------------------

    def _read_configs(self, w: SimWorker) -> None:
        for record in self.ensemble.records(CONFIGS, w.config_position):
            w.config_position = record.offset + 1
            command = w.configs.apply(record.offset, record.key.decode(), record.value)
            if isinstance(command, RestartRequest) and w.started:
                w.core.restart_recorded(command)
        w.core.configs_read(w.configs.snapshot())

    def _read_statuses(self, w: SimWorker) -> None:
        for record in self.ensemble.records(STATUS, w.status_position):
            w.status_position = record.offset + 1
            w.statuses.apply(record.key.decode(), record.value)

    def _follow(self, w: SimWorker) -> None:
        """The worker's log tailers: read what is new, now and then (slowly, at times)."""
        self._read_configs(w)
        self._read_statuses(w)
        self._pump(w)
        slow = self.faults and self.slow_reads and self.rng.random() < 0.2
        self.for_worker(
            w,
            self.rng.randint(2000, 8000) if slow else self.rng.randint(20, 300),
            lambda: self._follow(w),
        )

    def publish(self, w: SimWorker, instance: str | ConnectorTaskId, state: State) -> None:
        """The worker's StatusStore.put: skipped if its view holds a newer generation."""
        generation = w.begun if w.begun is not None else -1
        self._publish_as(w, instance, state, w.worker_id, generation)

    def _publish_as(
        self,
        w: SimWorker,
        instance: str | ConnectorTaskId,
        state: State,
        worker_id: str,
        generation: int,
    ) -> None:
        status: ConnectorStatus | TaskStatus
        if isinstance(instance, str):
            status = ConnectorStatus(instance, state, worker_id, generation)
        else:
            status = TaskStatus(instance, state, worker_id, generation)
        if state is not State.DESTROYED and not w.statuses.supersedes(status):
            return
        key, value = status_record(status)
        self.ensemble.apply([Append(STATUS, key.encode(), value)], self.now)
        w.statuses.apply(key, value)

    # -- the herder's shell -----------------------------------------------------------

    def _pump(self, w: SimWorker) -> None:
        """The herder loop: carry out the core's effects one at a time."""
        if w.busy or not w.started or w.crashed:
            return
        w.core.tick(self.now)
        while True:
            w.pending.extend(w.core.ready())
            if not w.pending:
                break
            effect = w.pending.pop(0)
            if self._do(w, effect):
                w.busy = True
                return
        self._arm(w)

    def _later(self, w: SimWorker, delay_ms: int, fn: Callable[[], None]) -> None:
        """``fn`` after ``delay_ms`` (connector code beside the herder loop), then a step."""

        def run() -> None:
            fn()
            self._pump(w)

        self.for_worker(w, delay_ms, run)

    def _done(self, w: SimWorker, fn: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            w.busy = False
            fn()
            self._pump(w)

        return run

    def _do(self, w: SimWorker, effect: fx.Effect) -> bool:
        """Carry out one effect; True if the loop now waits for it to complete."""
        self.log(f"worker {w.index}: {_describe(effect)}")
        core = w.core
        match effect:
            case fx.StopAll():
                self.for_worker(
                    w, self.rng.randint(1, 500), self._done(w, lambda: self._stop_all(w))
                )
                return True
            case fx.FinishRevocation():
                if not self.bugs.eager_revocation:
                    self._member(w, w.member.revoked(self.now))
            case fx.ReadToEnd(at_least=at_least):

                def caught_up() -> None:
                    ok = not (self.faults and self.rng.random() < 0.1)
                    if ok:
                        self._read_configs(w)
                    core.caught_up(ok and w.configs.snapshot().offset >= at_least)

                self.for_worker(w, self.rng.randint(1, 200), self._done(w, caught_up))
                return True
            case fx.LeaveAndBackOff(backoff_ms=backoff_ms):
                self._member(w, w.member.leave(self.now))
                self.for_worker(w, backoff_ms, self._done(w, core.backed_off))
                return True
            case fx.Rejoin():
                self._member(w, w.member.request_rejoin(self.now))
            case fx.TakeLeaderEpoch(generation=generation):
                return self._take_epoch(w, generation)
            case fx.BeginGeneration(generation=generation):
                w.begun = generation.generation_id
            case fx.StartConnector():
                self._start(w, effect.name, effect.generation.generation_id, effect.target)
                instance = effect.instance
                started = effect.name in w.connectors
                self._later(
                    w,
                    self.rng.randint(1, 300),
                    lambda: core.connector_started(effect.name, instance, started, self.now),
                )
            case fx.StartTask():
                self._start(w, effect.task_id, effect.generation.generation_id, effect.target)
            case fx.StopConnector(name=name, destroyed=destroyed):
                self._stop(w, name, destroyed)
            case fx.StopTasks(task_ids=task_ids, destroyed=destroyed):
                for task_id in task_ids:
                    self._stop(w, task_id, destroyed)
            case fx.Destroy(name=name):
                for task_id in [t for t in w.tasks if t.connector == name]:
                    self._stop(w, task_id, True)
                self._stop(w, name, True)
            case fx.SetConnectorTarget(name=name, instance=instance, target=target):
                if name in w.connectors:
                    self.publish(w, name, _state_of(target))
                self._later(
                    w,
                    self.rng.randint(1, 100),
                    lambda: core.connector_retargeted(name, instance, target, self.now),
                )
            case fx.SetTaskTarget(task_id=task_id, target=target):
                if task_id in w.tasks:
                    self.publish(w, task_id, _state_of(target))
            case fx.PublishRestarting(instance=instance):
                self.publish(w, instance, State.RESTARTING)
            case fx.GenerateTaskConfigs(ticket=ticket):
                configs = [
                    {"task": str(i), "version": ticket.config.get("version", "")}
                    for i in range(ticket.max_tasks)
                ]
                self._later(
                    w,
                    self.rng.randint(1, 300),
                    lambda: core.task_configs_generated(ticket, configs, self.now),
                )
            case fx.WriteTaskConfigs(ticket=ticket, configs=configs):
                if not core.still_current(ticket):
                    core.task_configs_done(ticket, self.now)
                    return False
                return self._write_task_configs(w, ticket, list(configs))
            case fx.ForwardTaskConfigs(ticket=ticket, configs=configs, leader_url=url):
                self._forward(w, ticket, list(configs), url)
            case fx.PublishUnassigned(work=work, generation=generation):
                for what, worker_id in work:
                    self._publish_as(w, what, State.UNASSIGNED, worker_id, generation.generation_id)
            case fx.DistributeSessionKey(created_ms=created_ms):
                self.for_worker(
                    w, self.rng.randint(1, 100), self._done(w, lambda: self._new_key(w, created_ms))
                )
                return True
        return False

    def _new_key(self, w: SimWorker, created_ms: int) -> None:
        policy = w.core.key_policy
        key = SessionKey(self.rng.randbytes(policy.key_bytes), policy.key_algorithm, created_ms)
        try:
            ok = self.write_configs(w, [session_key_record(key)])
        except HerderError:
            ok = False
        if ok:
            self.report.session_keys += 1
        w.core.session_key_written(ok, self.now)

    def _take_epoch(self, w: SimWorker, generation: Any) -> bool:
        def answered(response: Any) -> None:
            if response.error_code != ErrorCode.NONE:
                w.core.leader_epoch_failed(generation, HerderError(str(response.error_code)))
            else:
                w.core.leader_epoch_taken(generation, response.epoch)

        self.request(
            w,
            m.InitFencingRequest(fenced_id=LEADER_FENCE),
            lambda r: self._finish(w, lambda: answered(r)),
            lambda e: self._finish(w, lambda: w.core.leader_epoch_failed(generation, e)),
            timeout_ms=5_000,
        )
        return True

    def _finish(self, w: SimWorker, fn: Callable[[], None]) -> None:
        w.busy = False
        fn()
        self._pump(w)

    def _stop_all(self, w: SimWorker) -> None:
        for name in list(w.connectors):
            self._stop(w, name, False)
        for task_id in list(w.tasks):
            self._stop(w, task_id, False)
        w.core.work_stopped()

    def _start(
        self, w: SimWorker, what: str | ConnectorTaskId, generation: int, target: TargetState
    ) -> None:
        if w.begun != generation:
            return  # the worker's own guard: not the generation it runs now
        self.checker.starting(w, what, generation)
        executions = self.running.setdefault(what, [])
        executions[:] = [e for e in executions if e.worker != w.index]
        executions.append(_Running(w.index, generation))
        (w.connectors if isinstance(what, str) else w.tasks).add(what)  # type: ignore[arg-type]
        self.publish(w, what, _state_of(target))

    def _stop(self, w: SimWorker, what: str | ConnectorTaskId, destroyed: bool) -> None:
        if isinstance(what, str):
            w.connectors.discard(what)
        else:
            w.tasks.discard(what)
        executions = self.running.get(what, [])
        executions[:] = [e for e in executions if e.worker != w.index]
        if destroyed:
            self.publish(w, what, State.DESTROYED)
        else:
            self.publish(w, what, State.UNASSIGNED)

    # -- config writes ----------------------------------------------------------------

    def write_configs(self, w: SimWorker, records: list[tuple[str, bytes | None]]) -> bool:
        """A leader's config write, with the check that it still holds its epoch."""
        epoch = w.core.leader_fence_epoch()
        checks: list[Op] = [] if self.bugs.unfenced_writes else [fencing_op(LEADER_FENCE, epoch)]
        ops = [*checks, *(Append(CONFIGS, k.encode(), v) for k, v in records)]
        result = self.ensemble.apply(ops, self.now)
        if result.error_code != ErrorCode.NONE:
            self.report.fenced_writes += 1
            w.core.write_refused()
            return False
        self.report.config_writes += 1
        self.checker.config_written(w, epoch)
        return True

    def _write_task_configs(
        self, w: SimWorker, ticket: fx.Ticket, configs: list[dict[str, str]]
    ) -> bool:
        def fenced(response: Any) -> None:
            if response.error_code != ErrorCode.NONE:
                w.core.task_configs_failed(ticket, HerderError("fencing"), self.now)
                return
            try:
                w.core.require_leader()
                if ticket.name not in w.configs.snapshot():
                    w.core.task_configs_done(ticket, self.now)
                    return
                ok = self.write_configs(w, task_config_records(ticket.name, configs))
            except HerderError as exc:
                w.core.task_configs_failed(ticket, exc, self.now)
                return
            if ok:
                w.core.task_configs_done(ticket, self.now)
            else:
                w.core.task_configs_failed(ticket, HerderError("fenced"), self.now)

        self.request(
            w,
            m.InitFencingRequest(fenced_id=f"connector-{ticket.name}"),
            lambda r: self._finish(w, lambda: fenced(r)),
            lambda e: self._finish(w, lambda: w.core.task_configs_failed(ticket, e, self.now)),
            timeout_ms=5_000,
        )
        return True

    def _forward(
        self, w: SimWorker, ticket: fx.Ticket, configs: list[dict[str, str]], url: str | None
    ) -> None:
        """A follower's task configs, sent to the leader's REST API (an HTTP request: it
        ends with an answer or, after its timeout, an error, whatever the leader does)."""
        answered = False

        def reply(error: str | None) -> None:
            nonlocal answered
            if answered:
                return
            answered = True
            if error is None:
                w.core.task_configs_done(ticket, self.now)
            else:
                w.core.task_configs_failed(ticket, HerderError(error), self.now)
            self._pump(w)

        if not w.core.still_current(ticket):
            w.core.task_configs_done(ticket, self.now)
            return
        body = json.dumps(configs).encode()
        signed = w.core.signs_requests and not self.bugs.unsigned_requests
        headers = (
            signature_headers(
                w.core.snapshot.session_key, w.core.key_policy.signature_algorithm, body
            )
            if signed
            else {}
        )
        self.for_worker(w, 30_000, lambda: reply("the leader did not answer"))
        leader = next((x for x in self.workers if x.url == url and x.alive), None)
        if leader is None or self._lost():
            return

        def answer(error: str | None) -> None:
            if not self._lost():
                self.for_worker(w, self._delay(), lambda: reply(error))

        def fenced(response: Any) -> None:
            try:
                if response.error_code != ErrorCode.NONE:
                    raise HerderError("fencing refused")
                written = self.write_configs(leader, task_config_records(ticket.name, configs))
            except HerderError as exc:
                answer(str(exc))
                return
            answer(None if written else "the leader's write was fenced")

        def at_leader() -> None:
            try:
                leader.core.check_internal_request(headers, body)
                leader.core.require_leader()
                if ticket.name not in leader.configs.snapshot():
                    raise HerderError("unknown connector")
            except HerderError as exc:
                answer(str(exc))
                return
            self.request(
                leader,
                m.InitFencingRequest(fenced_id=f"connector-{ticket.name}"),
                fenced,
                lambda e: answer(str(e)),
                timeout_ms=5_000,
            )

        self.for_worker(leader, self._delay(), at_leader)

    # -- the operator -----------------------------------------------------------------

    def _operate(self) -> None:
        """An operator's request, to a worker that believes it leads. A request to a
        paused worker waits in its queue and is served when it resumes, while it may
        still believe it leads: its write must then be fenced."""
        leaders = [w for w in self.workers if w.alive and w.started and w.core.is_leader]
        if leaders:
            w = self.rng.choice(leaders)
            self.for_worker(w, 0, lambda: self._serve(w))

    def _operate_until_served(self) -> None:
        """An operator's request that, like one to the REST API, waits for a leader."""
        leaders = [w for w in self.workers if w.alive and w.started and w.core.is_leader]
        if not leaders:
            self.after(250, self._operate_until_served)
            return
        w = self.rng.choice(leaders)
        self.for_worker(w, 0, lambda: self._serve(w))

    def _serve(self, w: SimWorker) -> None:
        snapshot = w.configs.snapshot()
        name = self.rng.choice(CONNECTORS)
        exists = name in snapshot
        roll = self.rng.random()
        records: list[tuple[str, bytes | None]]
        if not exists or roll < 0.25:
            config = {
                "name": name,
                "connector.class": "Sim",
                "tasks.max": str(self.rng.randint(1, 3)),
                "version": str(self.rng.randint(0, 1_000_000)),
            }
            records = [connector_config_record(name, config)]
        elif roll < 0.4:
            records = connector_removal_records(name, snapshot.task_count(name))
        elif roll < 0.6:
            state = self.rng.choice([TargetState.PAUSED, TargetState.STARTED])
            records = [target_state_record(name, state)]
        else:
            request = RestartRequest(name, self.rng.random() < 0.5, self.rng.random() < 0.5)
            records = [restart_request_record(request)]
        try:
            if self.write_configs(w, records):
                self.report.operations += 1
                self.log(f"operator via worker {w.index}: {[k for k, _ in records]}")
        except HerderError:
            pass
        self._read_configs(w)
        self._pump(w)

    # -- faults -----------------------------------------------------------------------

    def _fault(self) -> None:
        roll = self.rng.random()
        live = [w for w in self.workers if w.alive]
        if roll < 0.3 and live:
            w = self.rng.choice(live)
            self._crash(w)
        elif roll < 0.55 and live:
            # a paused leader is the zombie that matters most: half the pauses pick it
            leaders = [x for x in live if x.core.is_leader]
            w = self.rng.choice(leaders if leaders and self.rng.random() < 0.5 else live)
            if not w.paused:
                self._pause(w, self.rng.choice([2_000, 8_000, 15_000, 30_000]))
        elif roll < 0.7:
            self.failover()

    def _exit(self, w: SimWorker, error: HerderError) -> None:
        """A worker whose membership failed for good: nothing the simulator draws may
        cause that (all workers share one valid config), so it is a violation. (One way
        it happened: a coordinator that loaded a group knew each member only by the
        protocol the group chose, and refused a worker offering only eager in the middle
        of an upgrade with INCONSISTENT_GROUP_PROTOCOL.)"""
        self.report.exits += 1
        raise Violation(f"worker {w.index} left its group for good: {error}")

    def _crash(self, w: SimWorker, *, counted: bool = True) -> None:
        if counted:
            self.report.crashes += 1
            self.log(f"worker {w.index} crashes")
        w.crashed = True
        for what in list(w.connectors) + list(w.tasks):
            executions = self.running.get(what, [])
            executions[:] = [e for e in executions if e.worker != w.index]

        def restart() -> None:
            self.workers[w.index] = self._new_worker(w.index, w.incarnation + 1)

        self.after(self.rng.randint(500, 15_000), restart)

    def _pause(self, w: SimWorker, ms: int) -> None:
        self.report.pauses += 1
        self.log(f"worker {w.index} pauses for {ms} ms")
        w.paused = True

        def resume() -> None:
            if w.crashed:
                return
            w.paused = False
            deferred, w.deferred = w.deferred, []
            self.log(f"worker {w.index} resumes ({len(deferred)} events held)")
            for fn in deferred:
                self.after(0, fn)

        self.after(ms, resume)

    # -- running ----------------------------------------------------------------------

    def _step(self) -> bool:
        if not self._queue:
            return False
        at, _, fn = heapq.heappop(self._queue)
        self.now = max(self.now, at)
        fn()
        self.report.steps += 1
        return True

    def run(self) -> Report:
        with contextlib.ExitStack() as patches:
            if self.bugs.no_catch_up:
                patches.enter_context(
                    mock.patch.object(
                        herder_core, "after_rebalance", lambda *_: herder_core.AfterRebalance.START
                    )
                )
            if self.bugs.dropped_member_keeps_work:
                never = property(lambda _: False, lambda *_: None)
                patches.enter_context(
                    mock.patch.object(mm.MemberMachine, "_generation_lost", never, create=True)
                )
            if self.bugs.loaded_members_forget_protocols:
                from_record = CoordinatorMember.from_record.__func__  # type: ignore[attr-defined]

                def forgetful(cls: Any, record: Any, protocol_type: str, protocol: str) -> Any:
                    record = msgspec.structs.replace(record, protocols=[])
                    return from_record(cls, record, protocol_type, protocol)

                patches.enter_context(
                    mock.patch.object(CoordinatorMember, "from_record", classmethod(forgetful))
                )
            if self.bugs.status_ignores_generation:
                patches.enter_context(
                    mock.patch.object(StatusView, "supersedes", lambda self, status: True)
                )
            return self._run_checked()

    def _run_checked(self) -> Report:
        try:
            self._run()
        except Violation as v:
            raise SimulationFailure(
                f"seed {self.seed}: {v} (replay: python -m tests.sim.connect --seed {self.seed})"
                + "\n"
                + "\n".join(self.trace[-40:]),
                v,
            ) from None
        return self.report

    def _run(self) -> None:
        # the workload: operator requests and faults, spread over the run
        for _ in range(self.steps // 60):
            self.after(self.rng.randint(0, self.steps * 40), self._operate)
        for _ in range(self.steps // 300):
            self.after(self.rng.randint(5_000, self.steps * 40), self._fault)
        fault_end = self.steps * 40 + 1
        while self._queue and self._queue[0][0] < fault_end:
            self._step()
            self.checker.check()
        self.faults = False
        for w in self.workers:
            if w.paused:
                w.paused = False
                for fn in w.deferred:
                    self.after(0, fn)
                w.deferred = []
        self.log("faults stop")
        # a burst of requests right after (connectors created in quick succession, each
        # while the group still rebalances for the one before), then nothing more
        for _ in range(self.rng.randint(2, 5)):
            self.after(self.rng.randint(0, 3_000), self._operate_until_served)
        settle_by = self.now + LIVENESS_MS
        while self.now < settle_by:
            if not self._step():
                break
            self.checker.check()
            if self.checker.settled():
                self.report.settled_ms = self.now - fault_end
                return
        raise Violation(
            f"not settled {LIVENESS_MS} ms after the faults stopped: {self.checker.unsettled()}"
        )


def _describe(effect: fx.Effect) -> str:
    fields = []
    for name, value in vars(effect).items():
        if name in ("generation",):
            value = getattr(value, "generation_id", value)
        elif name == "ticket":
            value = f"{value.name}#{value.instance}"
        elif isinstance(value, dict):
            value = value.get("version", "{..}")
        fields.append(f"{name}={value}")
    return f"{type(effect).__name__}({', '.join(fields)})"


def _state_of(target: TargetState | None) -> State:
    return State.PAUSED if target is TargetState.PAUSED else State.RUNNING
