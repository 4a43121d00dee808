"""The distributed herder: one per worker, steering it to the group's assignment.

As in Kafka Connect's DistributedHerder, a single loop does everything that changes
what this worker runs: it handles a completed rebalance (catching up with the config
log first, or refusing to start work it cannot trust), reacts to config changes
(rebalance for new, removed or re-tasked connectors; restart in place for a changed
connector config; pause/resume/stop in place for a target state), regenerates task
configs when a connector asks (retrying with backoff), and runs queued requests from
the REST API in order of due time, then arrival.

Only the group's leader writes to ``_configs``, and each write carries the check that
it still holds the leader fencing epoch it took when it became leader, so a deposed
leader's late write commits nothing. Before a connector's new task set is written the
connector's own fencing epoch is bumped, fencing its old tasks (KIP-618).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import httpx

from herder.connect import ConnectorType
from herder.coordinator.apis import fencing_op
from herder.coordinator.client import (
    CoordinatorClient,
    CoordinatorConnections,
    Generation,
    GroupMember,
)
from herder.ensemble.client import EnsembleClient
from herder.ensemble.txn import Op
from herder.errors import (
    CheckFailed,
    ConfigError,
    ErrorCode,
    HerderError,
    RebalanceInProgress,
    ServerStopping,
)
from herder.runtime.assignor import EagerAssignor
from herder.runtime.config_state import (
    ClusterConfigSnapshot,
    ClusterLoggerLevel,
    ConfigCommand,
    ConfigDiff,
    ConfigRecord,
    RestartRequest,
    TargetState,
    connector_config_record,
    connector_removal_record,
    logger_level_record,
    restart_request_record,
    target_state_record,
    task_config_records,
)
from herder.runtime.connector_offsets import ConnectorOffsets, OffsetChange
from herder.runtime.group_failure import out_of_group
from herder.runtime.loggers import Loggers, parse_level
from herder.runtime.plugins import Plugins
from herder.runtime.protocol import (
    Assignment,
    ConnectorTaskId,
    WorkerMetadata,
    decode_assignment,
    decode_metadata,
    encode_assignment,
    encode_metadata,
)
from herder.runtime.restart import RestartPlan, more_impactful
from herder.runtime.rules import (
    AfterRebalance,
    ReconfigurationSchedule,
    RequestQueue,
    after_rebalance,
)
from herder.runtime.stores import ConfigStore, OffsetStore, StatusStore
from herder.runtime.threads import SharedExecutor, blocking_calls
from herder.runtime.validation import ConfigInfos
from herder.runtime.worker import ConnectorCallTimeout, ExecutionFactory, Worker
from herder.runtime.worker_config import WorkerConfig

log = logging.getLogger(__name__)

T = TypeVar("T")


class WrongWorker(HerderError):
    """The request belongs to another worker, at ``target_url`` (None: not known yet)."""

    code = ErrorCode.WRONG_WORKER
    http_status = 409

    def __init__(self, message: str, target_url: str | None) -> None:
        super().__init__(message)
        self.target_url = target_url


class NotLeaderWorker(WrongWorker):
    """This worker is not the group's leader; the request belongs at ``leader_url``."""

    code = ErrorCode.NOT_LEADER

    def __init__(self, leader_url: str | None) -> None:
        super().__init__(
            f"this worker is not the leader; send the request to the leader at {leader_url}"
            if leader_url
            else "no leader is known yet (a rebalance is under way); try again shortly",
            leader_url,
        )
        self.leader_url = leader_url


class NotOwner(WrongWorker):
    """The leader's answer for work that runs elsewhere: it belongs at ``owner_url``."""

    def __init__(self, what: str, owner_url: str | None) -> None:
        super().__init__(
            f"{what} is not assigned to this worker"
            + (
                f"; send the request to {owner_url}, where it runs"
                if owner_url
                else " nor, yet, to any other; try again once the rebalance is over"
            ),
            owner_url,
        )


class NotFound(HerderError):
    """The connector or task does not exist."""

    code = ErrorCode.NOT_FOUND
    http_status = 404
    advice = "GET /connectors lists the connectors, GET /connectors/<name>/tasks their tasks"


class AlreadyExists(HerderError):
    """A connector of that name already exists."""

    code = ErrorCode.ALREADY_EXISTS
    http_status = 409
    advice = "choose another name, or change its config with PUT /connectors/<name>/config"


class ConfigChanged(HerderError):
    """The connector's config changed under a request that depended on it."""

    code = ErrorCode.CONFIG_CHANGED
    http_status = 409


_Request = tuple[Callable[[], Awaitable[Any]], "asyncio.Future[Any]"]

_ALTERED = "altered"
_RESET = "reset"


def _offsets_message(change: str) -> dict[str, str]:
    # herder's connectors keep no offsets of their own outside the runtime's, but a
    # connector may; Connect words it the same way for connectors that do not say
    return {
        "message": f"The Connect framework-managed offsets for this connector have been "
        f"{change} successfully. However, if this connector manages offsets externally, they "
        f"will need to be manually {change} in the system that the connector uses."
    }


def _now_ms() -> int:
    return int(time.monotonic() * 1000)


class DistributedHerder:
    """Membership, assignment and work of one worker."""

    def __init__(
        self,
        config: WorkerConfig,
        plugins: Plugins,
        execution_factory: ExecutionFactory,
        *,
        worker_id: str,
        member_factory: Callable[..., GroupMember] = GroupMember,
        on_failed: Callable[[HerderError], None] | None = None,
    ) -> None:
        self.config = config
        self.plugins = plugins
        #: the advertised host:port of its REST API, as Connect's worker id
        self.worker_id = worker_id
        self.url = ""
        self.client = EnsembleClient(
            config.bootstrap,
            name=self.worker_id,
            session_timeout_ms=max(config.session_timeout_ms, 6_000),
        )
        self.configs = ConfigStore(
            self.client,
            config.config_log,
            on_update=self._config_updated,
            on_command=self._on_command,
        )
        self.offsets = OffsetStore(self.client, config.offset_log)
        self.statuses = StatusStore(self.client, config.status_log)
        #: one set of coordinator connections for the herder's membership and requests
        self.connections = CoordinatorConnections(config.bootstrap)
        self.coordinator = CoordinatorClient(config.bootstrap, connections=self.connections)
        self.worker = Worker(
            self.worker_id,
            plugins,
            self.statuses,
            execution_factory,
            task_shutdown_timeout_ms=config.task_shutdown_timeout_ms,
            task_start_timeout_ms=config.task_start_timeout_ms,
            connector_call_timeout_ms=config.connector_call_timeout_ms,
            topic_tracking=config.topic_tracking,
        )
        self._member_factory = member_factory
        self.worker.on_task_reconfiguration = self._request_reconfiguration
        self.loggers = Loggers()
        self.connector_offsets = ConnectorOffsets(self.offsets, self.coordinator)
        self.member: GroupMember | None = None
        #: why the group refused this worker for good (a fatal group error, such as
        #: INVALID_SESSION_TIMEOUT); ``on_failed`` is told, and the worker then stops
        self.failure: HerderError | None = None
        self._on_failed = on_failed
        self.assignment: Assignment | None = None
        self.generation: Generation | None = None
        #: the snapshot the running work was started from
        self._applied = ClusterConfigSnapshot.EMPTY
        self._pending_assignment: tuple[Generation, Assignment] | None = None
        #: the generation the member holds now: set on assignment, None once revoked.
        #: Work of any other generation must not start.
        self._member_generation: Generation | None = None
        #: revocations waiting for the loop to stop the work (the member awaits each)
        self._revocations: list[asyncio.Future[None]] = []
        #: connectors restarted for a new config: their task configs are written even
        #: if they come out equal, so their tasks restart with it (KAFKA-9228)
        self._reconfigured: set[str] = set()
        #: connector code the herder has set going and does not wait for (connector
        #: starts, task config generation): the loop goes on meanwhile, as Connect's
        #: herder has since KAFKA-9374
        self._calls: set[asyncio.Task[Any]] = set()
        self._config_dirty = False
        self._reconfigure = ReconfigurationSchedule()
        self._leader_epoch: tuple[int, int] | None = None  # (generation, epoch)
        self._requests: RequestQueue[_Request] = RequestQueue()
        self._wake = asyncio.Event()
        self._work_lock = asyncio.Lock()
        self._stopping = False
        self._loop_task: asyncio.Task[None] | None = None
        self._http = httpx.AsyncClient(timeout=30)
        self._pending_restarts: dict[str, RestartRequest] = {}
        #: leader only: the REST URL of the worker each connector and task was given to
        self._owners: dict[str | ConnectorTaskId, str] = {}
        #: what the herder loop is busy with, and since when (wall clock), for timeouts
        self._stage: tuple[str, float] | None = None

    # -- lifecycle ------------------------------------------------------------------

    async def start(self, url: str) -> None:
        self.url = url
        # the loop's blocking calls on daemon threads: a hung filesystem call must not
        # keep a stopped worker's process alive
        asyncio.get_running_loop().set_default_executor(SharedExecutor(blocking_calls()))
        with self._doing(f"connecting to the ensemble at {','.join(self.config.bootstrap)}"):
            await self.client.start()
            for store in (self.configs, self.offsets, self.statuses):
                await store.start()
        self._applied = ClusterConfigSnapshot.EMPTY
        self.member = self._member_factory(
            self.config.bootstrap,
            self.config.group_id,
            protocol_type="connect",
            protocols=self._protocols,
            assign=self._assign,
            on_assigned=self._on_assigned,
            on_revoked=self._on_revoked,
            session_timeout_ms=self.config.session_timeout_ms,
            rebalance_timeout_ms=self.config.rebalance_timeout_ms,
            heartbeat_interval_ms=self.config.heartbeat_interval_ms,
            client_id=self.worker_id,
            connections=self.connections,
            on_failed=self._member_failed,
        )
        await self.member.start()
        self._loop_task = asyncio.create_task(self._run(), name=f"herder-{self.worker_id}")
        # the tasks use this worker's session, coordinator connections and offsets, and
        # what they add (and the retention passes every worker runs) opens now rather
        # than with the first task
        factory = self.worker.execution_factory
        share = getattr(factory, "share", None)
        if callable(share):
            share(self.client, self.coordinator, self.connections, self.offsets)
        open_executions = getattr(factory, "open", None)
        if callable(open_executions):
            self._in_background(open_executions())
        log.info(
            "worker %s started, REST at %s, group %s", self.worker_id, url, self.config.group_id
        )

    async def stop(self) -> None:
        """Stop all work, leave the group, fail whatever requests are still queued."""
        if self._stopping:
            return
        self._stopping = True
        self.worker.revoked()  # nothing starts from now on
        self._wake.set()
        if self._loop_task is not None:
            self._loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._loop_task
        # connector calls under way get the graceful timeout to end (a start that ends
        # later is stopped by the worker when it does)
        if self._calls:
            await asyncio.wait(
                list(self._calls), timeout=self.config.task_shutdown_timeout_ms / 1000
            )
        for call in list(self._calls):
            call.cancel()
        async with self._work_lock:
            await self.worker.stop_all()
        for done in self._revocations:
            if not done.done():
                done.set_result(None)
        if self.member is not None:
            await self.member.close(leave=True)
        for _, future in self._requests.drain():
            if not future.done():
                future.set_exception(ServerStopping(self._stopping_message))
        # before the connections it shares with the executions close under it
        await self.worker.close()
        for store in (self.configs, self.offsets, self.statuses):
            await store.stop()
        await self.coordinator.close()
        await self.connections.close()
        await self.client.close()
        await self._http.aclose()
        log.info("worker %s stopped", self.worker_id)

    def health(self) -> tuple[bool, str]:
        """Whether this worker is in its group with an assignment; if not, why not."""
        if self.failure is not None:
            return False, f"Worker is out of its group for good and is stopping: {self.failure}"
        if self._stopping:
            return False, "Worker is stopping."
        if self.assignment is None:
            activity = self.current_activity()
            if self.generation is None:
                return False, f"Worker is still starting up: it is {activity}."
            return False, f"Worker is rebalancing: it is {activity}."
        return True, "Worker has completed startup and is ready to handle requests."

    # -- group membership callbacks ---------------------------------------------------

    def _member_failed(self, cause: HerderError) -> None:
        self.failure = out_of_group(cause, self.config)
        log.error("worker %s: %s", self.worker_id, self.failure)
        if self._on_failed is not None:
            self._on_failed(self.failure)

    def _protocols(self) -> list[tuple[str, bytes]]:
        metadata = WorkerMetadata(config_offset=self.configs.snapshot().offset, url=self.url)
        return [(EagerAssignor.protocol.value, encode_metadata(metadata))]

    def _assign(self, leader_id: str, protocol: str, members: Any) -> dict[str, bytes]:
        decoded = {member: decode_metadata(data) for member, data in members.items()}
        result = EagerAssignor().assign(leader_id, decoded, self.configs.snapshot())
        owners: dict[str | ConnectorTaskId, str] = {}
        for member, assignment in result.items():
            for name in assignment.connectors:
                owners[name] = decoded[member].url
            for task_id in assignment.tasks:
                owners[task_id] = decoded[member].url
        self._owners = owners
        return {member: encode_assignment(a) for member, a in result.items()}

    async def _on_revoked(self) -> None:
        """Eager protocol: everything stops before the member rejoins.

        From this moment no work of the revoked generation may start, wherever the
        herder loop is (catching up with the config log for it, or about to pick up its
        parked assignment); the stopping itself happens on the herder loop, between two
        of its steps, as Connect's herder handles revocation inside its own tick.
        """
        self._member_generation = None
        self._pending_assignment = None
        self.worker.revoked()
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._revocations.append(done)
        self._wake.set()
        await done

    async def _on_assigned(self, generation: Generation, data: bytes) -> None:
        self._member_generation = generation
        self._pending_assignment = (generation, decode_assignment(data))
        self._wake.set()

    async def _revoke(self) -> None:
        revocations, self._revocations = self._revocations, []
        async with self._work_lock:
            await self.worker.stop_all()
            self.assignment = None
            self._reconfigured.clear()
        for done in revocations:
            if not done.done():
                done.set_result(None)

    def _still_current(self, generation: Generation) -> bool:
        if self._member_generation is generation:
            return True
        log.info(
            "worker %s: generation %d was revoked before its work started; dropping it",
            self.worker_id,
            generation.generation_id,
        )
        return False

    def _config_updated(self, snapshot: ClusterConfigSnapshot) -> None:
        self._config_dirty = True
        self._wake.set()

    def _on_command(self, command: ConfigCommand) -> None:
        if isinstance(command, ClusterLoggerLevel):
            try:
                self.loggers.set_level(command.namespace, command.level)
            except HerderError as exc:
                log.warning("ignoring cluster logger level for %s: %s", command.namespace, exc)
            return
        pending = self._pending_restarts.get(command.connector)
        self._pending_restarts[command.connector] = (
            command if pending is None else more_impactful(pending, command)
        )
        self._wake.set()

    def _request_reconfiguration(self, name: str) -> None:
        self._reconfigure.request(name, _now_ms())
        self._wake.set()

    # -- the loop ---------------------------------------------------------------------

    async def _run(self) -> None:
        while not self._stopping:
            timeout = self._next_due()
            # not asyncio.wait_for, which before Python 3.12 can swallow stop()'s
            # cancellation when the wake-up comes in the same turn
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._wake.wait()
            self._wake.clear()
            if self._stopping:
                return
            try:
                await self._tick()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("worker %s: herder tick failed", self.worker_id)
                await asyncio.sleep(0.5)

    def _next_due(self) -> float | None:
        dues = [
            d
            for d in (self._requests.next_due_ms(), self._reconfigure.next_due_ms())
            if d is not None
        ]
        return max(0.0, (min(dues) - _now_ms()) / 1000) if dues else None

    @contextlib.contextmanager
    def _doing(self, what: str) -> Any:
        self._stage = (what, time.time())
        try:
            yield
        finally:
            self._stage = None

    def current_activity(self) -> str:
        """What the herder loop is doing now, for a request that timed out waiting on it."""
        if self._stage is not None:
            what, since = self._stage
            began = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(since))
            return f"{what}, which began at {began}"
        if self.assignment is None:
            return "ensuring membership in the cluster (a rebalance is under way)"
        return "idle"

    async def _tick(self) -> None:
        if self._revocations:
            with self._doing("stopping the work of a revoked generation"):
                await self._revoke()
        if self._pending_assignment is not None:
            generation, assignment = self._pending_assignment
            self._pending_assignment = None
            with self._doing(f"starting the work of generation {generation.generation_id}"):
                await self._handle_assignment(generation, assignment)
        if self._config_dirty and self.assignment is not None:
            self._config_dirty = False
            with self._doing("applying a change read from the config log"):
                await self._handle_config_update()
        if self._pending_restarts and self.assignment is not None:
            restarts, self._pending_restarts = self._pending_restarts, {}
            for restart in restarts.values():
                with self._doing(f"restarting connector {restart.connector}"):
                    await self._carry_out_restart(restart)
        for name in self._reconfigure.due(_now_ms()):
            self._reconfigure.begin(name)
            self._in_background(self._reconfigure_tasks(name))
        while (request := self._requests.pop_due(_now_ms())) is not None:
            action, future = request
            if future.done():  # its caller gave up waiting
                continue
            try:
                with self._doing("serving a request of the REST API"):
                    result = await action()
            except Exception as exc:
                if not future.done():
                    future.set_exception(exc)
            else:
                if not future.done():
                    future.set_result(result)

    async def _handle_assignment(self, generation: Generation, assignment: Assignment) -> None:
        member = self.member
        assert member is not None
        decision = after_rebalance(assignment, self.configs.snapshot().offset)
        if decision is AfterRebalance.CATCH_UP_AND_REJOIN:
            log.warning(
                "worker %s: assignment failed (config mismatch); catching up", self.worker_id
            )
            await self._catch_up_or_back_off()
            member.request_rejoin()
            return
        if decision is AfterRebalance.CATCH_UP_THEN_START:
            if not await self._catch_up_or_back_off(assignment.config_offset):
                member.request_rejoin()
                return
            if not self._still_current(generation):
                return
            decision = after_rebalance(assignment, self.configs.snapshot().offset)
        if decision is AfterRebalance.REJOIN:
            log.info("worker %s: configs moved on since the assignment; rejoining", self.worker_id)
            member.request_rejoin()
            return
        if generation.is_leader:
            try:
                await self._take_leader_epoch(generation)
            except HerderError as exc:
                # a leader without its epoch could write no config: let another try
                log.warning(
                    "worker %s: could not take the leader's fencing epoch (%s); rejoining",
                    self.worker_id,
                    exc,
                )
                member.request_rejoin()
                return
            if not self._still_current(generation):
                return
        self.generation = generation
        self.assignment = assignment
        self.worker.assigned(generation.generation_id)
        snapshot = self.configs.snapshot()
        async with self._work_lock:
            self._applied = snapshot
            await self._start_work(snapshot, assignment)
        log.info(
            "worker %s: generation %d, %d connectors and %d tasks (leader at %s)",
            self.worker_id,
            generation.generation_id,
            len(assignment.connectors),
            len(assignment.tasks),
            assignment.leader_url,
        )

    async def _catch_up_or_back_off(self, offset: int = -1) -> bool:
        """Read the config log to its end (at least to ``offset``); whether that worked.

        If it did not, leave the group before backing off, as Connect's herder does: the
        others rebalance without this worker instead of waiting on it (a leader that
        cannot assign would hold every rebalance up). The caller rejoins afterwards.
        """
        cfg = self.config
        try:
            await self.configs.read_to_end(timeout=max(cfg.worker_sync_timeout_ms, 1) / 1000)
            if self.configs.snapshot().offset >= offset:
                return True
        except (TimeoutError, HerderError) as exc:
            log.warning(
                "worker %s: could not read the config log to its end: %s", self.worker_id, exc
            )
        log.warning(
            "worker %s: leaving the group for worker.unsync.backoff.ms=%d before rejoining",
            self.worker_id,
            cfg.worker_unsync_backoff_ms,
        )
        if self.member is not None:
            await self.member.leave_group()
        await asyncio.sleep(cfg.worker_unsync_backoff_ms / 1000)
        return False

    def _in_background(self, work: Awaitable[T]) -> asyncio.Task[T]:
        """Run ``work`` (which waits on connector code) beside the herder loop."""
        task: asyncio.Task[T] = asyncio.ensure_future(work)
        self._calls.add(task)

        def done(finished: asyncio.Task[T]) -> None:
            self._calls.discard(finished)
            self._wake.set()  # what it finished may be due for the loop (a retry)
            if not finished.cancelled() and finished.exception() is not None:
                log.error(
                    "worker %s: %s failed",
                    self.worker_id,
                    finished.get_coro(),
                    exc_info=finished.exception(),
                )

        task.add_done_callback(done)
        return task

    async def _start_work(self, snapshot: ClusterConfigSnapshot, assignment: Assignment) -> None:
        for name in assignment.connectors:
            config = snapshot.connector_config(name)
            if config is not None:
                self._in_background(self._start_connector(name, config, snapshot))
        await asyncio.gather(*(self._start_task(t, snapshot) for t in assignment.tasks))

    async def _start_connector(
        self, name: str, config: dict[str, str], snapshot: ClusterConfigSnapshot
    ) -> bool:
        """Start connector ``name`` in this generation; whether it runs."""
        target = snapshot.target_state(name) or TargetState.STARTED
        generation = self.worker.generation
        started = await self.worker.start_connector(name, config, target, generation)
        if started and target is TargetState.STARTED:
            self._request_reconfiguration(name)
        return started

    async def _start_task(self, task_id: ConnectorTaskId, snapshot: ClusterConfigSnapshot) -> None:
        task_config = snapshot.task_config(task_id)
        connector_config = snapshot.connector_config(task_id.connector)
        if task_config is None or connector_config is None:
            return
        target = snapshot.target_state(task_id.connector) or TargetState.STARTED
        await self.worker.start_task(
            task_id, task_config, connector_config, target, self.worker.generation
        )

    async def _handle_config_update(self) -> None:
        new = self.configs.snapshot()
        diff = ConfigDiff.between(self._applied, new)
        if diff.empty:
            self._applied = new
            return
        assignment = self.assignment
        if self.member is None or assignment is None:
            # no work runs yet: the next assignment is made from these configs
            self._config_dirty = True
            return
        if diff.needs_rebalance:
            log.info(
                "worker %s: connectors added %s, removed %s, re-tasked %s: rebalancing",
                self.worker_id,
                sorted(diff.added),
                sorted(diff.removed),
                sorted(diff.task_configs_changed),
            )
            for name in diff.removed:
                await self._destroy(name)
            self.member.request_rejoin()
            return
        async with self._work_lock:
            mine = set(assignment.connectors)
            for name in diff.connector_configs_changed & mine:
                config = new.connector_config(name)
                await self.worker.stop_connector(name)
                if config is not None:
                    self._reconfigured.add(name)
                    self._in_background(self._start_connector(name, config, new))
            for name in diff.target_states_changed:
                target = new.target_state(name) or TargetState.STARTED
                if name in mine:
                    self._in_background(self._retarget(name, target))
                for task_id in assignment.tasks:
                    if task_id.connector == name:
                        await self.worker.set_task_target(task_id, target)
            self._applied = new

    async def _retarget(self, name: str, target: TargetState) -> None:
        await self.worker.set_connector_target(name, target)
        if target is TargetState.STARTED:
            self._request_reconfiguration(name)

    async def _destroy(self, name: str) -> None:
        """A deleted connector: stop it and its tasks here, and tombstone their statuses."""
        async with self._work_lock:
            tasks = [t for t in self.worker.tasks | self.worker.held_back if t.connector == name]
            await self.worker.stop_tasks(tasks, destroyed=True)
            await self.worker.stop_connector(name, destroyed=True)

    # -- task configs -------------------------------------------------------------------

    async def _reconfigure_tasks(self, name: str) -> None:
        """Generate connector ``name``'s task configs beside the herder loop, and publish
        them only if they still speak for it: the same generation, the same running
        instance, the same connector config as when they were asked for."""
        snapshot = self.configs.snapshot()
        config = snapshot.connector_config(name)
        stopped = snapshot.target_state(name) is TargetState.STOPPED
        generation = self._member_generation
        instance = self.worker.assignment_of(name)
        if name not in self.worker.connectors or config is None or stopped:
            self._reconfigure.succeeded(name)
            self._reconfigured.discard(name)
            return
        try:
            max_tasks = int(config.get("tasks.max", "1"))
            try:
                wanted = await self.worker.task_configs(name, max_tasks)
            except ConnectorCallTimeout:
                # stuck: the worker made it FAILED, naming the call, until a restart
                self._reconfigure.succeeded(name)
                return

            async def still_current() -> bool:
                return (
                    self._member_generation is generation
                    and self.worker.is_assigned(name, instance)
                    and self.configs.snapshot().connector_config(name) == config
                )

            async def write() -> None:
                if await still_current():
                    await self.write_task_configs(name, wanted)

            snapshot = self.configs.snapshot()
            if (
                wanted != snapshot.task_configs(name)
                or name in snapshot.inconsistent
                or name in self._reconfigured
            ):
                if self.is_leader:
                    await self.submit(write)  # checked and written on the herder loop
                elif await self.submit(still_current):
                    await self._send_task_configs_to_leader(name, wanted)
            self._reconfigured.discard(name)
        except Exception as exc:
            delay = self._reconfigure.failed(name, _now_ms())
            log.warning(
                "connector %s: task reconfiguration failed (%s); retrying in %d ms",
                name,
                exc,
                delay,
            )
            return
        self._reconfigure.succeeded(name)

    async def _send_task_configs_to_leader(self, name: str, configs: list[dict[str, str]]) -> None:
        url = self.leader_url
        if not url:
            raise RebalanceInProgress("no leader known to send task configs to")
        response = await self._http.post(f"{url}/connectors/{name}/tasks", json=configs)
        if response.status_code >= 400:
            raise HerderError(f"leader refused task configs for {name}: {response.text}")

    async def write_task_configs(self, name: str, configs: list[dict[str, str]]) -> None:
        """Leader only: fence the connector's old tasks, then write its new task set."""
        self._require_leader()
        if name not in self.configs.snapshot():
            # a deleted connector's task set would come back with a connector of its name
            raise NotFound(f"Connector {name} not found")
        await self.coordinator.init_fencing(f"connector-{name}")
        await self._write_configs(task_config_records(name, configs))
        log.info("connector %s: wrote %d task configs", name, len(configs))

    # -- leadership -------------------------------------------------------------------

    @property
    def is_leader(self) -> bool:
        gen = self.generation
        return gen is not None and gen.is_leader and self.assignment is not None

    @property
    def leader_url(self) -> str | None:
        return self.assignment.leader_url if self.assignment is not None else None

    def _require_leader(self) -> None:
        if not self.is_leader:
            raise NotLeaderWorker(self.leader_url)

    async def _take_leader_epoch(self, generation: Generation) -> None:
        if self._leader_epoch is not None and self._leader_epoch[0] == generation.generation_id:
            return
        epoch = await self.coordinator.init_fencing(self._leader_fence_id)
        self._leader_epoch = (generation.generation_id, epoch)
        log.info(
            "worker %s leads generation %d with fencing epoch %d",
            self.worker_id,
            generation.generation_id,
            epoch,
        )

    @property
    def _leader_fence_id(self) -> str:
        return f"connect-leader-{self.config.group_id}"

    async def _write_configs(self, records: list[tuple[str, bytes | None]]) -> None:
        self._require_leader()
        assert self._leader_epoch is not None
        checks: list[Op] = [fencing_op(self._leader_fence_id, self._leader_epoch[1])]
        try:
            await self.configs.write(records, checks)
        except CheckFailed:
            log.error(
                "worker %s: a newer leader took over; this one's write was fenced", self.worker_id
            )
            self._leader_epoch = None
            if self.member is not None:
                self.member.request_rejoin()
            raise NotLeaderWorker(None) from None

    # -- requests (from the REST API) -----------------------------------------------------

    @property
    def _stopping_message(self) -> str:
        return (
            f"worker {self.worker_id} is stopping; send the request to another worker of "
            f"group {self.config.group_id}, or to this one once it has restarted"
        )

    async def submit(self, action: Callable[[], Awaitable[T]], delay_s: float = 0.0) -> T:
        """Run ``action`` on the herder loop, after ``delay_s``, in order of arrival."""
        if self._stopping:
            raise ServerStopping(self._stopping_message)
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._requests.push((action, future), _now_ms(), int(delay_s * 1000))
        self._wake.set()
        return await future

    async def put_connector_config(
        self,
        name: str,
        config: dict[str, str],
        *,
        allow_replace: bool,
        initial_state: TargetState | None = None,
    ) -> bool:
        """Create or update a connector (leader only); whether it was created.

        A new connector's ``initial_state`` is written before its config in the same
        transaction, so it never runs, even briefly, in a state it was not created in.
        """

        # connector code, with its deadline, before the herder loop takes the request
        await self.validate_connector_config(config)

        async def action() -> bool:
            self._require_leader()
            await self.configs.read_to_end()
            exists = name in self.configs.snapshot()
            if exists and not allow_replace:
                raise AlreadyExists(f"Connector {name} already exists")
            records: list[ConfigRecord] = []
            if initial_state is not None and not exists:
                records.append(target_state_record(name, initial_state))
            records.append(connector_config_record(name, config))
            await self._write_configs(records)
            await self.configs.read_to_end()
            return not exists

        return await self.submit(action)

    async def patch_connector_config(self, name: str, patch: dict[str, str | None]) -> None:
        """Merge ``patch`` into the connector's config (None removes a key); leader only."""

        def merge(current: dict[str, str]) -> dict[str, str]:
            merged = {**current, **{k: v for k, v in patch.items() if v is not None}}
            for key, value in patch.items():
                if value is None:
                    merged.pop(key, None)
            merged["name"] = name
            return merged

        async def current() -> dict[str, str]:
            self._require_leader()
            await self.configs.read_to_end()
            config = self.configs.snapshot().connector_config(name)
            if config is None:
                raise NotFound(f"Connector {name} not found")
            return config

        base = await self.submit(current)
        # connector code, with its deadline, outside the herder loop; the write then
        # goes through only if the config is still the one merged with
        await self.validate_connector_config(merge(base))

        async def action() -> None:
            if await current() != base:
                raise ConfigChanged(
                    f"Connector {name}'s config changed while the patch was validated; "
                    "send the patch again"
                )
            await self._write_configs([connector_config_record(name, merge(base))])
            await self.configs.read_to_end()

        await self.submit(action)

    async def validate_config(self, config: dict[str, str]) -> ConfigInfos:
        """Connect's validation of a connector config (``.../config/validate``): the
        connector's own code, on the connector pool with its deadline."""
        return await self.worker.call_connector(
            config.get("name") or config.get("connector.class", "?"),
            "validate()",
            ConfigInfos.validate,
            self.plugins,
            config,
        )

    async def validate_connector_config(self, config: dict[str, str]) -> None:
        """Refuse a config with one error naming each bad key (REST 400)."""
        class_name = config.get("connector.class", "")
        if not class_name:
            problems = [
                'connector.class: Missing required configuration "connector.class" which has '
                "no default value."
            ]
        else:
            problems = (await self.validate_config(config)).errors()
        if not problems:
            # what only the data plane can judge: transforms as configured together,
            # predicates they name, converters, errors.*
            check_data_plane = getattr(self.worker.execution_factory, "validate_config", None)
            if check_data_plane is not None:
                problems = check_data_plane(config)
        if problems:
            raise ConfigError(
                "Connector configuration is invalid and contains the following "
                f"{len(problems)} error(s):\n" + "\n".join(problems) + "\nYou can also find "
                "the above list of errors at the endpoint "
                "`/connector-plugins/{connectorType}/config/validate`"
            )

    async def delete_connector(self, name: str) -> None:
        async def action() -> None:
            self._require_leader()
            await self.configs.read_to_end()
            if name not in self.configs.snapshot():
                raise NotFound(f"Connector {name} not found")
            await self._write_configs([connector_removal_record(name)])
            await self.configs.read_to_end()
            # a deleted connector's active topics go with it, as in Connect
            await self.statuses.delete_topics(name)

        await self.submit(action)

    async def set_target_state(self, name: str, state: TargetState) -> None:
        async def action() -> None:
            self._require_leader()
            await self.configs.read_to_end()
            if name not in self.configs.snapshot():
                raise NotFound(f"Connector {name} not found")
            await self._write_configs([target_state_record(name, state)])

        await self.submit(action)

    async def stop_connector(self, name: str) -> None:
        """STOPPED: the connector shuts down and its task set is emptied (leader only).

        The empty task set and the target state go in one transaction, after the
        connector's old tasks are fenced, so no task of it runs or commits afterwards.
        """

        async def action() -> None:
            self._require_leader()
            await self.configs.read_to_end()
            if name not in self.configs.snapshot():
                raise NotFound(f"Connector {name} not found")
            await self.coordinator.init_fencing(f"connector-{name}")
            records = [
                *task_config_records(name, []),
                target_state_record(name, TargetState.STOPPED),
            ]
            await self._write_configs(records)
            await self.configs.read_to_end()
            log.info("connector %s: stopped, task configs emptied", name)

        await self.submit(action)

    async def put_task_configs(self, name: str, configs: list[dict[str, str]]) -> None:
        async def action() -> None:
            self._require_leader()
            if name not in self.configs.snapshot():
                raise NotFound(f"Connector {name} not found")
            await self.write_task_configs(name, configs)

        await self.submit(action)

    # -- restarts -------------------------------------------------------------------

    def _require_stable(self) -> Assignment:
        if self.assignment is None:
            raise NotLeaderWorker(None)
        return self.assignment

    async def restart_connector(self, name: str) -> None:
        """Restart connector ``name`` where it runs (answered by its worker)."""

        async def action() -> asyncio.Task[bool]:
            assignment = self._require_stable()
            snapshot = self.configs.snapshot()
            config = snapshot.connector_config(name)
            if config is None:
                raise NotFound(f"Unknown connector: {name}")
            if name in assignment.connectors:
                async with self._work_lock:
                    await self.worker.stop_connector(name)
                return self._in_background(self._start_connector(name, config, snapshot))
            if self.is_leader:
                raise NotOwner(f"Connector {name}", self._owners.get(name))
            raise NotLeaderWorker(self.leader_url)

        # answered once the start is over, which the herder loop does not wait for
        started = await (await self.submit(action))
        failure = self.worker.connector_failure(name)
        if not started and failure is not None:
            # Connect answers a failed restart with 500 and the cause
            raise HerderError(f"Failed to start connector: {name}: {failure}")
        log.info("connector %s restarted at the user's request", name)

    async def restart_task(self, task_id: ConnectorTaskId) -> None:
        """Restart one task where it runs (answered by its worker)."""

        async def action() -> None:
            assignment = self._require_stable()
            snapshot = self.configs.snapshot()
            if task_id.connector not in snapshot:
                raise NotFound(f"Unknown connector: {task_id.connector}")
            if snapshot.task_config(task_id) is None:
                raise NotFound(f"Unknown task: {task_id}")
            if task_id in assignment.tasks:
                async with self._work_lock:
                    await self.worker.stop_tasks([task_id])
                    await self._start_task(task_id, snapshot)
                log.info("task %s restarted at the user's request", task_id)
            elif self.is_leader:
                raise NotOwner(f"Task {task_id}", self._owners.get(task_id))
            else:
                raise NotLeaderWorker(self.leader_url)

        await self.submit(action)

    def _restart_plan(self, request: RestartRequest) -> RestartPlan:
        snapshot = self.configs.snapshot()
        view = self.statuses.view
        tasks = snapshot.tasks(request.connector)
        statuses = {t: s for t in tasks if (s := view.task(t)) is not None}
        return RestartPlan.build(request, view.connector(request.connector), tasks, statuses)

    async def restart_connector_and_tasks(self, request: RestartRequest) -> RestartPlan:
        """Record ``request`` in ``_configs`` (leader only); returns what it restarts."""

        async def action() -> RestartPlan:
            self._require_leader()
            await self.configs.read_to_end()
            if request.connector not in self.configs.snapshot():
                raise NotFound(f"Unknown connector: {request.connector}")
            await self._write_configs([restart_request_record(request)])
            # the plan is made from every status written so far, not this worker's view
            # of them, which may lag another worker's latest writes
            await self.statuses.read_to_end()
            return self._restart_plan(request)

        return await self.submit(action)

    async def _carry_out_restart(self, request: RestartRequest) -> None:
        """Restart what of ``request``'s plan runs on this worker."""
        assignment = self.assignment
        snapshot = self.configs.snapshot()
        config = snapshot.connector_config(request.connector)
        if assignment is None or config is None:
            return
        plan = self._restart_plan(request)
        tasks = [t for t in plan.tasks if t in assignment.tasks]
        restart_connector = plan.restart_connector and request.connector in assignment.connectors
        if not tasks and not restart_connector:
            return
        log.info(
            "connector %s: restarting%s%s as requested",
            request.connector,
            " the connector" if restart_connector else "",
            f" tasks {[t.task for t in tasks]}" if tasks else "",
        )
        async with self._work_lock:
            if restart_connector:
                await self.worker.publish_restarting(request.connector)
            for task_id in tasks:
                await self.worker.publish_restarting(task_id)
            if tasks:
                await self.worker.stop_tasks(tasks)
            if restart_connector:
                await self.worker.stop_connector(request.connector)
                self._in_background(self._start_connector(request.connector, config, snapshot))
            for task_id in tasks:
                await self._start_task(task_id, snapshot)

    # -- offsets ----------------------------------------------------------------------

    def _connector_kind(self, name: str) -> ConnectorType:
        config = self.configs.snapshot().connector_config(name)
        if config is None:
            raise NotFound(f"Connector {name} not found")
        return self.plugins.type_of(config.get("connector.class", ""))

    async def connector_offsets_of(self, name: str) -> dict[str, Any]:
        """``GET /connectors/<name>/offsets``: the connector's committed offsets."""
        await self.configs.read_to_end()
        if self._connector_kind(name) is ConnectorType.SINK:
            return {"offsets": await self.connector_offsets.sink_offsets(name)}
        return {"offsets": await self.connector_offsets.source_offsets(name)}

    async def modify_connector_offsets(
        self, name: str, changes: list[OffsetChange] | None
    ) -> dict[str, str]:
        """Alter (``changes``) or reset (None) a STOPPED connector's offsets; leader only."""

        async def action() -> dict[str, str]:
            self._require_leader()
            await self.configs.read_to_end()
            snapshot = self.configs.snapshot()
            kind = self._connector_kind(name)
            if snapshot.target_state(name) is not TargetState.STOPPED or snapshot.task_count(name):
                raise ConfigError(
                    "Connectors must be in the STOPPED state before their offsets can be "
                    "modified. This can be done for the specified connector by issuing a 'PUT' "
                    f"request to the '/connectors/{name}/stop' endpoint"
                )
            offsets = self.connector_offsets
            if kind is ConnectorType.SINK:
                await (
                    offsets.reset_sink(name)
                    if changes is None
                    else offsets.alter_sink(name, changes)
                )
            else:
                await (
                    offsets.reset_source(name)
                    if changes is None
                    else offsets.alter_source(name, changes)
                )
            change = _RESET if changes is None else _ALTERED
            log.info("connector %s: offsets %s", name, change)
            return _offsets_message(change)

        return await self.submit(action)

    # -- active topics and loggers ------------------------------------------------------

    def active_topics(self, name: str) -> list[str]:
        return [t.topic for t in self.statuses.view.topics(name)]

    async def reset_active_topics(self, name: str) -> None:
        forgotten = await self.statuses.delete_topics(name)
        log.info("connector %s: active topics %s reset", name, forgotten)

    async def set_cluster_logger_level(self, namespace: str, level: str) -> None:
        """Have every worker set ``namespace`` to ``level``, through ``_configs``."""
        parse_level(level)

        async def action() -> None:
            self._require_leader()
            await self._write_configs(
                [logger_level_record(ClusterLoggerLevel(namespace, level.upper()))]
            )

        await self.submit(action)
