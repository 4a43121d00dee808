"""Everything the distributed herder decides, as a pure state machine.

As in Kafka Connect's DistributedHerder, the herder steers one worker to the group's
assignment: it handles a completed rebalance (catching up with the config log first,
or refusing to start work it cannot trust), reacts to config changes (rebalance for
new, removed or re-tasked connectors; restart in place for a changed connector
config; pause/resume/stop in place for a target state), carries out recorded restart
requests, regenerates task configs when a connector asks (retrying with backoff), and
admits requests (writes only on the leader, and only under the leader's fencing
epoch; nothing while a rebalance is under way).

:class:`HerderCore` does no IO and reads no clock. It is fed events — an assignment,
a revocation, the config log advanced, a restart recorded, a reconfiguration asked
for, the completion of an effect it asked for, the time — and queues effects
(:mod:`herder.runtime.core.effects`) that its shell drains with :meth:`ready` and
carries out in order. Work of a revoked generation never starts: a revocation drops
the generation's queued starts from the outbox before the shell can see them, and
every later step checks the generation it works for is still the member's.

**Cooperative protocols** (``connect.protocol=compatible|sessioned``, KIP-415). In a
generation of one of them the worker keeps running its work across rebalances and joins
saying what it holds. An assignment stops only what it revokes, then lets the member
rejoin (``FinishRevocation``) and, if it revoked anything, asks for the follow-up round
in which the leader hands that work on; whatever else it lists that is not running here
yet starts once the worker has caught up, and what runs already goes on, brought up to
date with any config change it missed. An assignment with a ``delay`` (the leader holds
a departed worker's work back) makes the worker rejoin when the delay has passed.

**Signed internal requests** (``sessioned``, KIP-507). The leader of a ``sessioned``
generation distributes a session key through the config log when there is none, when
it has outlived ``inter.worker.key.ttl.ms``, or when it was made under another algorithm
(:class:`~herder.runtime.core.session_key.KeyPolicy`); while the group speaks
``sessioned``, internal requests are signed with it and checked against it
(:meth:`HerderCore.check_internal_request`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum

import msgspec

from herder.errors import HerderError
from herder.runtime.core.admission import NotFound, NotLeaderWorker, NotOwner
from herder.runtime.core.assignor import EagerAssignor
from herder.runtime.core.config_state import (
    ClusterConfigSnapshot,
    ConfigDiff,
    RestartRequest,
    TargetState,
)
from herder.runtime.core.cooperative import DEFAULT_MAX_DELAY_MS, CooperativeAssignor, Memory
from herder.runtime.core.effects import (
    BeginGeneration,
    Destroy,
    DistributeSessionKey,
    Effect,
    FinishRevocation,
    ForwardTaskConfigs,
    GenerateTaskConfigs,
    LeaveAndBackOff,
    PublishRestarting,
    PublishUnassigned,
    ReadToEnd,
    Rejoin,
    SetConnectorTarget,
    SetTaskTarget,
    StartConnector,
    StartTask,
    StopAll,
    StopConnector,
    StopTasks,
    TakeLeaderEpoch,
    Ticket,
    WriteTaskConfigs,
)
from herder.runtime.core.member import Generation
from herder.runtime.core.protocol import (
    COOPERATIVE_PROTOCOLS,
    Assignment,
    ConnectorTaskId,
    ConnectProtocol,
    WorkerMetadata,
    encode_metadata,
)
from herder.runtime.core.restart import RestartPlan, more_impactful
from herder.runtime.core.rules import AfterRebalance, ReconfigurationSchedule, after_rebalance
from herder.runtime.core.session_key import KeyPolicy, check_signature
from herder.runtime.core.status import StatusView

log = logging.getLogger(__name__)


class _Phase(Enum):
    #: the leader could not catch up: read to the end, then rejoin
    CATCH_UP_THEN_REJOIN = "catch-up-then-rejoin"
    #: read the config log to the assignment's offset before starting
    CATCH_UP = "catch-up"
    #: the leader takes its fencing epoch before starting
    TAKING_EPOCH = "taking-epoch"


@dataclass
class _Handling:
    """A completed rebalance whose work has not started yet."""

    generation: Generation
    assignment: Assignment
    phase: _Phase


class HerderCore:
    """The decisions of one worker's herder."""

    def __init__(
        self,
        worker_id: str,
        url: str,
        *,
        statuses: StatusView,
        unsync_backoff_ms: int,
        protocol: ConnectProtocol = ConnectProtocol.EAGER,
        max_delay_ms: int = DEFAULT_MAX_DELAY_MS,
        key_policy: KeyPolicy | None = None,
    ) -> None:
        self.worker_id = worker_id
        #: the newest protocol this worker offers (``connect.protocol``)
        self.protocol = protocol
        #: the protocol of the group's latest generation (before any: this worker's own),
        #: which decides whether internal requests are signed, as Connect's
        #: ``currentProtocolVersion`` does
        self.group_protocol: str = protocol.value
        #: ``inter.worker.key.*`` and the signature algorithms
        self.key_policy = key_policy or KeyPolicy()
        #: leader: the creation time of the session key being written (or written and not
        #: yet read back), and when to try again after a write failed
        self._key_writing_ms: int | None = None
        self._key_retry_at_ms: int | None = None
        #: the wall clock less ``now_ms``, as of the last tick
        self._wall_skew_ms = 0
        #: ``scheduled.rebalance.max.delay.ms``: how long a leader holds lost work back
        self.max_delay_ms = max_delay_ms
        self.url = url
        self.statuses = statuses
        self.unsync_backoff_ms = unsync_backoff_ms
        #: the latest config snapshot read from the log
        self.snapshot = ClusterConfigSnapshot.EMPTY
        #: the snapshot the running work follows
        self.applied = ClusterConfigSnapshot.EMPTY
        #: the generation the member holds now: set on assignment, None once revoked
        self.member_generation: Generation | None = None
        #: the generation and assignment whose work was started
        self.generation: Generation | None = None
        self.assignment: Assignment | None = None
        #: (generation id, epoch) of the leader's fencing epoch
        self.leader_epoch: tuple[int, int] | None = None
        #: a fatal error that ended this worker's membership
        self.failure: HerderError | None = None
        self.reconfigure = ReconfigurationSchedule()
        self._outbox: list[Effect] = []
        self._handling: _Handling | None = None
        self._config_dirty = False
        self._restarts: dict[str, RestartRequest] = {}
        #: connectors restarted for a new config: their task configs are written even
        #: if they come out equal, so their tasks restart with it (KAFKA-9228)
        self._reconfigured: set[str] = set()
        #: connectors this worker has asked to start, by instance number; an instance
        #: that started with target STARTED is in ``_running``
        self._instances: dict[str, int] = {}
        self._running: set[str] = set()
        self._next_instance = 0
        #: leader only: the REST URL of the worker each connector and task was given to
        self.owners: dict[str | ConnectorTaskId, str] = {}
        #: tasks this worker has asked to start and not to stop since
        self._tasks: set[ConnectorTaskId] = set()
        #: cooperative: the latest assignment received, whose work this worker holds
        self.held: Assignment | None = None
        #: cooperative leader: what it remembers of its previous round
        self._memory = Memory()
        #: cooperative: an assignment's delay, to be counted from the next tick, and the
        #: time it then runs out, when the worker rejoins to have lost work reassigned
        self._rejoin_in_ms: int | None = None
        self._rejoin_at_ms: int | None = None

    # -- the outbox ---------------------------------------------------------------------

    def ready(self) -> list[Effect]:
        """The effects queued since the last call, in the order they must be carried out."""
        effects, self._outbox = self._outbox, []
        return effects

    def take(self) -> Effect | None:
        """The next effect to carry out, leaving the rest queued (where a revocation
        can still drop the starts among them)."""
        return self._outbox.pop(0) if self._outbox else None

    def take_task_starts(self) -> list[StartTask]:
        """The task starts queued next, in a row (to be carried out together)."""
        starts: list[StartTask] = []
        while self._outbox and isinstance(self._outbox[0], StartTask):
            starts.append(self._outbox.pop(0))  # type: ignore[arg-type]
        return starts

    def _emit(self, *effects: Effect) -> None:
        self._outbox.extend(effects)

    # -- membership ---------------------------------------------------------------------

    def metadata(self, protocol: ConnectProtocol = ConnectProtocol.EAGER) -> WorkerMetadata:
        """What this worker tells the group when it joins under ``protocol``: where it
        has read the config log to, and the work it holds (only ever after a cooperative
        generation; an eager leader must know of it too, to have it stopped first)."""
        held = self.held
        return WorkerMetadata(
            version=protocol.version,
            config_offset=self.snapshot.offset,
            url=self.url,
            connectors=held.connectors if held is not None else (),
            tasks=held.tasks if held is not None else (),
        )

    def protocols(self) -> list[tuple[str, bytes]]:
        """The (protocol, metadata) pairs of a JoinGroup, most preferred first."""
        return [(p.value, encode_metadata(self.metadata(p))) for p in self.protocol.offered()]

    def assign(
        self,
        leader_id: str,
        members: Mapping[str, WorkerMetadata],
        protocol: str = ConnectProtocol.EAGER,
        now_ms: int = 0,
    ) -> dict[str, Assignment]:
        """Leader: the assignment of every member under the ``protocol`` the group chose,
        from this worker's config snapshot (and, cooperative, its memory of the last
        round and the time, which decides when lost work is handed out)."""
        if protocol in COOPERATIVE_PROTOCOLS:
            assignor = CooperativeAssignor(self.max_delay_ms, ConnectProtocol(protocol).version)
            result, self._memory = assignor.assign(
                leader_id, dict(members), self.snapshot, self._memory, now_ms
            )
        else:
            self._memory = Memory()
            result = EagerAssignor().assign(leader_id, dict(members), self.snapshot)
        owners: dict[str | ConnectorTaskId, str] = {}
        for member, assignment in result.items():
            for name in assignment.connectors:
                owners[name] = members[member].url
            for task_id in assignment.tasks:
                owners[task_id] = members[member].url
        self.owners = owners
        return result

    def revoking(self) -> None:
        """Eager protocol: everything stops before the member rejoins.

        From this moment no work of the revoked generation may start, whatever step
        of handling its assignment the herder is in.
        """
        revoked = self.member_generation
        self.member_generation = None
        self._handling = None
        self.held = None
        self._rejoin_in_ms = self._rejoin_at_ms = None
        self._running.clear()
        self._outbox = [e for e in self._outbox if not _starts_work(e)]
        log.debug("worker %s: revoking generation %s", self.worker_id, revoked)
        self._emit(StopAll())

    def work_stopped(self) -> None:
        """The revocation's StopAll is done."""
        self.assignment = None
        self.generation = None
        self._reconfigured.clear()
        self._instances.clear()
        self._running.clear()
        self._tasks.clear()
        self._emit(FinishRevocation())

    def assigned(self, generation: Generation, assignment: Assignment) -> None:
        """A rebalance completed with ``assignment`` for this worker."""
        self.member_generation = generation
        self.group_protocol = generation.protocol
        if not generation.is_leader:
            self._memory = Memory()
        cooperative = generation.protocol in COOPERATIVE_PROTOCOLS
        revoked = self._revoke(assignment)
        if cooperative:
            if not assignment.failed:
                self.held = assignment
                self._rejoin_in_ms = assignment.delay or None
                self._rejoin_at_ms = None
            # the member waits for this before it joins again, so its next metadata
            # never claims what is on its way out
            self._emit(FinishRevocation())
        else:
            self.held = None
        if revoked:
            # the follow-up round hands the revoked work on
            self._emit(Rejoin())
        decision = after_rebalance(assignment, self.snapshot.offset)
        if decision is AfterRebalance.CATCH_UP_AND_REJOIN:
            log.warning(
                "worker %s: assignment failed (config mismatch); catching up", self.worker_id
            )
            self._handling = _Handling(generation, assignment, _Phase.CATCH_UP_THEN_REJOIN)
            self._emit(ReadToEnd(-1))
        elif decision is AfterRebalance.CATCH_UP_THEN_START:
            self._handling = _Handling(generation, assignment, _Phase.CATCH_UP)
            self._emit(ReadToEnd(assignment.config_offset))
        else:
            self._proceed(generation, assignment, decision)

    def _revoke(self, assignment: Assignment) -> bool:
        """Stop what ``assignment`` revokes that runs here (or is about to start);
        whether it revoked anything at all."""
        connectors = set(assignment.revoked_connectors)
        tasks = set(assignment.revoked_tasks)
        if not connectors and not tasks:
            return False
        log.info(
            "worker %s: revoked connectors %s and tasks %s",
            self.worker_id,
            sorted(connectors),
            [str(t) for t in sorted(tasks)],
        )
        self._outbox = [
            e
            for e in self._outbox
            if not (
                (isinstance(e, StartConnector) and e.name in connectors)
                or (isinstance(e, StartTask) and e.task_id in tasks)
            )
        ]
        running = self.assignment
        if running is not None:
            # config changes and restarts act on the running assignment until the new
            # one starts: the revoked work is no longer part of it
            self.assignment = without(running, connectors, tasks)
        for name in sorted(connectors & self._instances.keys()):
            self._stop_connector(name)
        stopping = tuple(sorted(tasks & self._tasks))
        if stopping:
            self._stop_tasks(stopping)
        return True

    def _stop_tasks(
        self, task_ids: tuple[ConnectorTaskId, ...], *, destroyed: bool = False
    ) -> None:
        self._tasks.difference_update(task_ids)
        self._emit(StopTasks(task_ids, destroyed))

    def caught_up(self, ok: bool) -> None:
        """The ReadToEnd asked for finished (``ok``: the log was read to its end)."""
        handling = self._handling
        if handling is None:
            return  # its generation was revoked meanwhile
        if handling.phase is _Phase.CATCH_UP_THEN_REJOIN:
            self._handling = None
            self._emit(Rejoin() if ok else LeaveAndBackOff(self.unsync_backoff_ms))
            return
        if handling.phase is not _Phase.CATCH_UP:
            return
        if not ok or self.snapshot.offset < handling.assignment.config_offset:
            log.warning(
                "worker %s: could not read the config log to offset %d; leaving the group for "
                "worker.unsync.backoff.ms=%d before rejoining",
                self.worker_id,
                handling.assignment.config_offset,
                self.unsync_backoff_ms,
            )
            self._handling = None
            self._emit(LeaveAndBackOff(self.unsync_backoff_ms))
            return
        decision = after_rebalance(handling.assignment, self.snapshot.offset)
        self._proceed(handling.generation, handling.assignment, decision)

    def backed_off(self) -> None:
        """The LeaveAndBackOff is over: join again."""
        self._emit(Rejoin())

    def _proceed(
        self, generation: Generation, assignment: Assignment, decision: AfterRebalance
    ) -> None:
        self._handling = None
        if decision is AfterRebalance.REJOIN:
            log.info("worker %s: configs moved on since the assignment; rejoining", self.worker_id)
            self._emit(Rejoin())
            return
        if generation.is_leader and not self._holds_epoch_for(generation):
            self._handling = _Handling(generation, assignment, _Phase.TAKING_EPOCH)
            self._emit(TakeLeaderEpoch(generation))
            return
        self._start(generation, assignment)

    def _holds_epoch_for(self, generation: Generation) -> bool:
        return self.leader_epoch is not None and self.leader_epoch[0] == generation.generation_id

    def leader_epoch_taken(self, generation: Generation, epoch: int) -> None:
        handling = self._handling
        if handling is None or handling.generation is not generation:
            return
        self.leader_epoch = (generation.generation_id, epoch)
        log.info(
            "worker %s leads generation %d with fencing epoch %d",
            self.worker_id,
            generation.generation_id,
            epoch,
        )
        # configs read while the epoch was taken may be ones the assignment did not
        # account for (a connector created meanwhile): then rejoin rather than start
        decision = after_rebalance(handling.assignment, self.snapshot.offset)
        self._proceed(generation, handling.assignment, decision)

    def leader_epoch_failed(self, generation: Generation, error: Exception) -> None:
        handling = self._handling
        if handling is None or handling.generation is not generation:
            return
        # a leader without its epoch could write no config: let another try
        log.warning(
            "worker %s: could not take the leader's fencing epoch (%s); rejoining",
            self.worker_id,
            error,
        )
        self._handling = None
        self._emit(Rejoin())

    def _start(self, generation: Generation, assignment: Assignment) -> None:
        self._handling = None
        if self.member_generation is not generation:
            log.info(
                "worker %s: generation %d was revoked before its work started; dropping it",
                self.worker_id,
                generation.generation_id,
            )
            return
        self.generation = generation
        self.assignment = assignment
        snapshot = self.snapshot
        self._emit(BeginGeneration(generation))
        if generation.is_leader and self._memory.lost:
            self._emit(PublishUnassigned(self._held_back(), generation))
        # work kept from an earlier generation catches up with the configs it missed
        if self._instances or self._tasks:
            self._apply_config_change(rejoin=False)
        self.applied = snapshot
        for name in assignment.connectors:
            config = snapshot.connector_config(name)
            if config is not None and name not in self._instances:
                self._start_connector(name, config, snapshot)
        for task_id in assignment.tasks:
            if task_id not in self._tasks:
                self._start_task(task_id, snapshot)
        log.info(
            "worker %s: generation %d, %d connectors and %d tasks (leader at %s)",
            self.worker_id,
            generation.generation_id,
            len(assignment.connectors),
            len(assignment.tasks),
            assignment.leader_url,
        )

    def _held_back(self) -> tuple[tuple[str | ConnectorTaskId, str], ...]:
        """The lost work this leader holds back, each with the id of the worker it
        waits for (its advertised host:port, from its URL)."""
        work: list[tuple[str | ConnectorTaskId, str]] = []
        for url, held in sorted(self._memory.lost.items()):
            worker_id = url.split("://", 1)[-1]
            work.extend((name, worker_id) for name in sorted(held.connectors))
            work.extend((task_id, worker_id) for task_id in sorted(held.tasks))
        return tuple(work)

    def _start_connector(
        self, name: str, config: dict[str, str], snapshot: ClusterConfigSnapshot
    ) -> None:
        assert self.generation is not None
        self._next_instance += 1
        self._instances[name] = self._next_instance
        self._running.discard(name)
        target = snapshot.target_state(name) or TargetState.STARTED
        self._emit(StartConnector(name, self._next_instance, config, target, self.generation))

    def _start_task(self, task_id: ConnectorTaskId, snapshot: ClusterConfigSnapshot) -> None:
        assert self.generation is not None
        task_config = snapshot.task_config(task_id)
        connector_config = snapshot.connector_config(task_id.connector)
        if task_config is None or connector_config is None:
            return
        target = snapshot.target_state(task_id.connector) or TargetState.STARTED
        self._tasks.add(task_id)
        self._emit(StartTask(task_id, task_config, connector_config, target, self.generation))

    def _stop_connector(self, name: str, *, destroyed: bool = False) -> None:
        self._instances.pop(name, None)
        self._running.discard(name)
        self._emit(StopConnector(name, destroyed))

    def connector_started(self, name: str, instance: int, ok: bool, now_ms: int) -> None:
        """StartConnector finished; a connector running STARTED generates its task configs."""
        if self._instances.get(name) != instance or not ok:
            return
        target = self.applied.target_state(name) or TargetState.STARTED
        if target is TargetState.STARTED:
            self._running.add(name)
            self.request_reconfiguration(name, now_ms)

    def connector_retargeted(
        self, name: str, instance: int, target: TargetState, now_ms: int
    ) -> None:
        if self._instances.get(name) != instance:
            return
        if target is TargetState.STARTED:
            self._running.add(name)
            self.request_reconfiguration(name, now_ms)
        else:
            self._running.discard(name)

    # -- the config log and commands ----------------------------------------------------

    def configs_read(self, snapshot: ClusterConfigSnapshot) -> None:
        """The config log advanced to ``snapshot``."""
        self.snapshot = snapshot
        self._config_dirty = True

    def restart_recorded(self, request: RestartRequest) -> None:
        pending = self._restarts.get(request.connector)
        self._restarts[request.connector] = (
            request if pending is None else more_impactful(pending, request)
        )

    def request_reconfiguration(self, name: str, now_ms: int) -> None:
        """Connector ``name`` asked for its task configs to be generated again."""
        self.reconfigure.request(name, now_ms)

    # -- the herder's step ----------------------------------------------------------------

    def tick(self, now_ms: int, wall_ms: int | None = None) -> None:
        """Do what is due: apply config changes, restarts, task reconfigurations, a new
        session key. ``wall_ms`` is the wall clock (session keys carry it, for every
        worker to read); ``now_ms`` the clock everything else is timed by, which may be
        a monotonic one."""
        self._wall_skew_ms = 0 if wall_ms is None else wall_ms - now_ms
        if self._config_dirty and self.assignment is not None:
            self._config_dirty = False
            self._apply_config_change()
        if self._restarts and self.assignment is not None:
            restarts, self._restarts = self._restarts, {}
            for request in restarts.values():
                self._carry_out_restart(request)
        for name in self.reconfigure.due(now_ms):
            self._begin_reconfiguration(name)
        if self._rejoin_in_ms is not None:
            self._rejoin_at_ms = now_ms + self._rejoin_in_ms
            self._rejoin_in_ms = None
        if self._rejoin_at_ms is not None and now_ms >= self._rejoin_at_ms:
            log.info(
                "worker %s: the leader's delay for lost work has passed; rejoining", self.worker_id
            )
            self._rejoin_at_ms = None
            self._emit(Rejoin())
        self._distribute_session_key_if_due(now_ms)

    def next_due_ms(self) -> int | None:
        due = [
            d
            for d in (self.reconfigure.next_due_ms(), self._rejoin_at_ms, self._key_due_ms())
            if d is not None
        ]
        return min(due, default=None)

    # -- session keys (sessioned) ---------------------------------------------------------

    @property
    def signs_requests(self) -> bool:
        """Whether internal requests are signed and checked: the group speaks sessioned."""
        return self.group_protocol == ConnectProtocol.SESSIONED

    def _distributes_keys(self) -> bool:
        generation = self.generation
        return (
            self.is_leader
            and generation is not None
            and generation.protocol == ConnectProtocol.SESSIONED
            and self._holds_epoch_for(generation)
        )

    def _key_due_ms(self) -> int | None:
        if not self._distributes_keys() or self._key_writing_ms is not None:
            return None
        if self._key_retry_at_ms is not None:
            return self._key_retry_at_ms
        key = self.snapshot.session_key
        expires = None if key is None else self.key_policy.expires_ms(key)
        return None if expires is None else expires - self._wall_skew_ms

    def _distribute_session_key_if_due(self, now_ms: int) -> None:
        wall_ms = now_ms + self._wall_skew_ms
        key = self.snapshot.session_key
        writing = self._key_writing_ms
        if writing is not None and key is not None and key.created_ms >= writing:
            self._key_writing_ms = None  # the key written has been read back
        if not self._distributes_keys() or self._key_writing_ms is not None:
            return
        if self._key_retry_at_ms is not None:
            if now_ms < self._key_retry_at_ms:
                return
            self._key_retry_at_ms = None
        if not self.key_policy.needs_new_key(key, wall_ms):
            return
        assert self.generation is not None
        self._key_writing_ms = wall_ms
        log.debug("worker %s: distributing a new session key", self.worker_id)
        self._emit(DistributeSessionKey(self.generation, wall_ms))

    def session_key_written(self, ok: bool, now_ms: int, retry_ms: int = 1_000) -> None:
        """The DistributeSessionKey asked for is done; if it failed, try again after
        ``retry_ms`` (a fenced write has made the worker rejoin meanwhile)."""
        if not ok:
            self._key_writing_ms = None
            self._key_retry_at_ms = now_ms + retry_ms

    def check_internal_request(self, headers: Mapping[str, str], body: bytes) -> None:
        """Refuse an internal request that is not signed with the current session key,
        while the group speaks ``sessioned``; anything goes under the other protocols."""
        if self.signs_requests:
            check_signature(
                headers, body, self.snapshot.session_key, self.key_policy.verification_algorithms
            )

    def _apply_config_change(self, *, rejoin: bool = True) -> None:
        """Bring the work running here up to the config log. ``rejoin``: rebalance if
        connectors came, went or changed their task sets (not when the assignment about
        to start already accounts for that)."""
        new = self.snapshot
        diff = ConfigDiff.between(self.applied, new)
        assignment = self.assignment
        assert assignment is not None
        if diff.empty:
            self.applied = new
            return
        if diff.needs_rebalance and self._cooperative:
            # the work keeps running through the rebalance: what changed must not run on
            # as it was
            for name in sorted(diff.removed):
                self._forget(name)
                self._emit(Destroy(name))
            retasked = sorted(t for t in self._tasks if t.connector in diff.task_configs_changed)
            if retasked:
                self._stop_tasks(tuple(retasked))
                for task_id in retasked:
                    if task_id in assignment.tasks:
                        self._start_task(task_id, new)
            if rejoin:
                log.info(
                    "worker %s: connectors added %s, removed %s, re-tasked %s: rebalancing",
                    self.worker_id,
                    sorted(diff.added),
                    sorted(diff.removed),
                    sorted(diff.task_configs_changed),
                )
                self._emit(Rejoin())
        elif diff.needs_rebalance:
            log.info(
                "worker %s: connectors added %s, removed %s, re-tasked %s: rebalancing",
                self.worker_id,
                sorted(diff.added),
                sorted(diff.removed),
                sorted(diff.task_configs_changed),
            )
            for name in sorted(diff.removed):
                self._forget(name)
                self._emit(Destroy(name))
            self._emit(Rejoin())
            return
        mine = set(assignment.connectors)
        for name in sorted(diff.connector_configs_changed & mine):
            config = new.connector_config(name)
            self._stop_connector(name)
            if config is not None:
                self._reconfigured.add(name)
                self._start_connector(name, config, new)
        for name in sorted(diff.target_states_changed):
            target = new.target_state(name) or TargetState.STARTED
            if name in mine and name in self._instances:
                if target is not TargetState.STARTED:
                    self._running.discard(name)
                self._emit(SetConnectorTarget(name, self._instances[name], target))
            for task_id in sorted(self._tasks):
                if task_id.connector == name:
                    self._emit(SetTaskTarget(task_id, target))
        self.applied = new

    def _forget(self, name: str) -> None:
        """Connector ``name`` and its tasks no longer run here (a Destroy follows)."""
        self._instances.pop(name, None)
        self._running.discard(name)
        self._tasks.difference_update([t for t in self._tasks if t.connector == name])

    @property
    def _cooperative(self) -> bool:
        generation = self.generation
        return generation is not None and generation.protocol in COOPERATIVE_PROTOCOLS

    def restart_plan(self, request: RestartRequest) -> RestartPlan:
        tasks = self.snapshot.tasks(request.connector)
        view = self.statuses
        statuses = {t: s for t in tasks if (s := view.task(t)) is not None}
        return RestartPlan.build(request, view.connector(request.connector), tasks, statuses)

    def _carry_out_restart(self, request: RestartRequest) -> None:
        """Restart what of ``request``'s plan runs on this worker."""
        assignment = self.assignment
        snapshot = self.snapshot
        config = snapshot.connector_config(request.connector)
        if assignment is None or config is None:
            return
        plan = self.restart_plan(request)
        tasks = tuple(t for t in plan.tasks if t in assignment.tasks)
        restart_connector = plan.restart_connector and request.connector in assignment.connectors
        if not tasks and not restart_connector:
            return
        log.info(
            "connector %s: restarting%s%s as requested",
            request.connector,
            " the connector" if restart_connector else "",
            f" tasks {[t.task for t in tasks]}" if tasks else "",
        )
        if restart_connector:
            self._emit(PublishRestarting(request.connector))
        for task_id in tasks:
            self._emit(PublishRestarting(task_id))
        if tasks:
            self._stop_tasks(tasks)
        if restart_connector:
            self._stop_connector(request.connector)
            self._start_connector(request.connector, config, snapshot)
        for task_id in tasks:
            self._start_task(task_id, snapshot)

    # -- requests that restart in place (REST) ------------------------------------------

    def restart_connector(self, name: str) -> list[Effect]:
        """``POST /connectors/<name>/restart`` on the worker it runs on: the effects that
        restart it, for the request to carry out and wait on; raises when it is not here."""
        assignment = self.require_stable()
        config = self.snapshot.connector_config(name)
        if config is None:
            raise NotFound(f"Unknown connector: {name}")
        if name not in assignment.connectors:
            if self.is_leader:
                raise NotOwner(f"Connector {name}", self.owner_url(name))
            raise NotLeaderWorker(self.leader_url)
        self._stop_connector(name)
        self._start_connector(name, config, self.snapshot)
        return self.ready()

    def restart_task(self, task_id: ConnectorTaskId) -> list[Effect]:
        assignment = self.require_stable()
        if task_id.connector not in self.snapshot:
            raise NotFound(f"Unknown connector: {task_id.connector}")
        if self.snapshot.task_config(task_id) is None:
            raise NotFound(f"Unknown task: {task_id}")
        if task_id not in assignment.tasks:
            if self.is_leader:
                raise NotOwner(f"Task {task_id}", self.owner_url(task_id))
            raise NotLeaderWorker(self.leader_url)
        self._stop_tasks((task_id,))
        self._start_task(task_id, self.snapshot)
        return self.ready()

    def owner_url(self, what: str | ConnectorTaskId) -> str | None:
        """Leader: the REST URL of the worker that runs ``what``. From the assignment this
        leader computed; failing that (a static leader that restarted got its assignment
        back without computing one), from the worker id its status names, which is that
        worker's advertised host:port."""
        url = self.owners.get(what)
        if url is not None:
            return url
        view = self.statuses
        status = view.connector(what) if isinstance(what, str) else view.task(what)
        if status is None or not status.worker_id or status.worker_id == self.worker_id:
            return None
        scheme = self.url.split("://", 1)[0] if "://" in self.url else "http"
        return f"{scheme}://{status.worker_id}"

    # -- task configs ---------------------------------------------------------------------

    def _begin_reconfiguration(self, name: str) -> None:
        config = self.snapshot.connector_config(name)
        stopped = self.snapshot.target_state(name) is TargetState.STOPPED
        if name not in self._running or config is None or stopped:
            self.reconfigure.succeeded(name)
            self._reconfigured.discard(name)
            return
        self.reconfigure.begin(name)
        ticket = Ticket(
            name,
            self.member_generation,
            self._instances[name],
            config,
            int(config.get("tasks.max", "1") or 1),
        )
        self._emit(GenerateTaskConfigs(ticket))

    def still_current(self, ticket: Ticket) -> bool:
        """Whether task configs generated for ``ticket`` may still be published: the
        same generation, the same connector instance, the same connector config."""
        return (
            ticket.generation is not None
            and self.member_generation is ticket.generation
            and self._instances.get(ticket.name) == ticket.instance
            and self.snapshot.connector_config(ticket.name) == ticket.config
        )

    def task_configs_generated(
        self, ticket: Ticket, configs: list[dict[str, str]], now_ms: int
    ) -> None:
        name = ticket.name
        snapshot = self.snapshot
        if not self.still_current(ticket):
            self.reconfigure.succeeded(name)
            self._again_if_kept(ticket, now_ms)
            return
        if (
            configs != snapshot.task_configs(name)
            or name in snapshot.inconsistent
            or name in self._reconfigured
        ):
            if self.is_leader:
                self._emit(WriteTaskConfigs(ticket, tuple(configs)))
            else:
                self._emit(ForwardTaskConfigs(ticket, tuple(configs), self.leader_url))
            return
        self.reconfigure.succeeded(name)

    def task_configs_failed(
        self, ticket: Ticket, error: Exception, now_ms: int, *, retry: bool = True
    ) -> None:
        """Generating or publishing ``ticket``'s task configs failed; retried with backoff
        unless ``retry`` is false (a connector stuck past its deadline stays FAILED)."""
        if not retry:
            self.reconfigure.succeeded(ticket.name)
            return
        delay = self.reconfigure.failed(ticket.name, now_ms)
        log.warning(
            "connector %s: task reconfiguration failed (%s); retrying in %d ms",
            ticket.name,
            error,
            delay,
        )

    def task_configs_done(self, ticket: Ticket, now_ms: int | None = None) -> None:
        """The task set was written (or forwarded), or no longer needed to be."""
        self._reconfigured.discard(ticket.name)
        self.reconfigure.succeeded(ticket.name)
        if now_ms is not None and not self.still_current(ticket):
            self._again_if_kept(ticket, now_ms)

    def _again_if_kept(self, ticket: Ticket, now_ms: int) -> None:
        """A ticket outlived only by its generation: the connector instance it was for
        runs on here (kept through a cooperative rebalance), so ask it again."""
        if (
            self._instances.get(ticket.name) == ticket.instance
            and ticket.name in self._running
            and self.snapshot.connector_config(ticket.name) == ticket.config
        ):
            self.request_reconfiguration(ticket.name, now_ms)

    # -- leadership and request admission -----------------------------------------------

    @property
    def is_leader(self) -> bool:
        gen = self.generation
        return gen is not None and gen.is_leader and self.assignment is not None

    @property
    def leader_url(self) -> str | None:
        return self.assignment.leader_url if self.assignment is not None else None

    def require_leader(self) -> None:
        """Admit a request that writes configs: only the leader of a stable generation."""
        self._require_member()
        if not self.is_leader:
            raise NotLeaderWorker(self.leader_url)

    def require_stable(self) -> Assignment:
        """Admit a request that needs this worker's assignment."""
        self._require_member()
        if self.assignment is None:
            raise NotLeaderWorker(None)
        return self.assignment

    def _require_member(self) -> None:
        if self.failure is not None:
            raise NotLeaderWorker(None, cause=self.failure)

    def leader_fence_epoch(self) -> int:
        """The epoch every config write of this leader checks (raises if it holds none)."""
        self.require_leader()
        if self.leader_epoch is None:
            raise NotLeaderWorker(None)
        return self.leader_epoch[1]

    def write_refused(self) -> NotLeaderWorker:
        """A config write was fenced: a newer leader took over. Rejoin; the error to raise."""
        log.error(
            "worker %s: a newer leader took over; this one's write was fenced", self.worker_id
        )
        self.leader_epoch = None
        self._emit(Rejoin())
        return NotLeaderWorker(None)

    def member_failed(self, error: HerderError) -> None:
        """The group member failed for good (say its JoinGroup was refused with
        INVALID_SESSION_TIMEOUT): no request can be served from now on."""
        self.failure = error
        self.member_generation = None
        self._handling = None


def without(
    assignment: Assignment, connectors: set[str], tasks: set[ConnectorTaskId]
) -> Assignment:
    """``assignment`` less the given connectors and tasks."""
    return msgspec.structs.replace(
        assignment,
        connectors=tuple(c for c in assignment.connectors if c not in connectors),
        tasks=tuple(t for t in assignment.tasks if t not in tasks),
    )


def _starts_work(effect: Effect) -> bool:
    return isinstance(effect, (BeginGeneration, StartConnector, StartTask))
