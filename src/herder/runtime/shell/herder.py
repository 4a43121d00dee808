"""The distributed herder's shell: carries out what :class:`HerderCore` decides.

One asyncio task per worker (the herder loop) feeds the core its events — the group
member's assignments and revocations, the config log's records, restart requests,
reconfiguration requests, the time — and carries out the effects the core queues, one
at a time and in order: stopping and starting work on the :class:`Worker`, reading the
config log, taking the leader's fencing epoch, writing task configs. Connector code the
herder does not wait for (a connector's start, its task-config generation, a pause or
resume) runs beside the loop and reports back to the core when it ends, as Connect's
herder has done since KAFKA-9374. Requests from the REST API queue on the same loop
(:mod:`herder.runtime.shell.requests`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from herder.coordinator.client import CoordinatorClient, CoordinatorConnections
from herder.ensemble.client import EnsembleClient
from herder.errors import HerderError, RebalanceInProgress, ServerStopping
from herder.runtime.connector_offsets import ConnectorOffsets
from herder.runtime.core import effects as fx
from herder.runtime.core.config_state import (
    ClusterConfigSnapshot,
    ClusterLoggerLevel,
    ConfigCommand,
)
from herder.runtime.core.herder import HerderCore
from herder.runtime.core.member import Generation
from herder.runtime.core.protocol import (
    COOPERATIVE_PROTOCOLS,
    ConnectorTaskId,
    decode_assignment,
    decode_metadata,
    encode_assignment,
    parse_connect_protocol,
)
from herder.runtime.core.rebalance_metrics import RebalanceMetrics
from herder.runtime.core.rules import RequestQueue
from herder.runtime.core.session_key import SessionKey, session_key_record, signature_headers
from herder.runtime.core.status import ConnectorStatus, State, TaskStatus
from herder.runtime.group_failure import out_of_group
from herder.runtime.loggers import Loggers
from herder.runtime.plugins import Plugins
from herder.runtime.shell.member import GroupMember
from herder.runtime.shell.requests import HerderRequests
from herder.runtime.stores import ConfigStore, OffsetStore, StatusStore
from herder.runtime.threads import SharedExecutor, blocking_calls
from herder.runtime.worker import ConnectorCallTimeout, ExecutionFactory, Worker
from herder.runtime.worker_config import WorkerConfig

log = logging.getLogger(__name__)

T = TypeVar("T")

_Request = tuple[Callable[[], Awaitable[Any]], "asyncio.Future[Any]"]


def _now_ms() -> int:
    return int(time.monotonic() * 1000)


def _wall_ms() -> int:
    return int(time.time() * 1000)


class DistributedHerder(HerderRequests):
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
        self._on_failed = on_failed
        self.url = ""
        self.client = EnsembleClient(
            config.bootstrap,
            name=self.worker_id,
            session_timeout_ms=max(config.session_timeout_ms, 6_000),
            security=config.ensemble_security,
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
        self.connections = CoordinatorConnections(
            config.bootstrap, security=config.ensemble_security
        )
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
        self.core = HerderCore(
            self.worker_id,
            "",
            statuses=self.statuses.view,
            unsync_backoff_ms=config.worker_unsync_backoff_ms,
            protocol=parse_connect_protocol(config.connect_protocol),
            max_delay_ms=config.scheduled_rebalance_max_delay_ms,
            key_policy=config.key_policy,
        )
        self._member_factory = member_factory
        #: Connect's connect-worker-rebalance-metrics of this worker
        self.rebalance_metrics = RebalanceMetrics()
        self.worker.on_task_reconfiguration = self._request_reconfiguration
        self.loggers = Loggers()
        self.connector_offsets = ConnectorOffsets(self.offsets, self.coordinator)
        self.member: GroupMember | None = None
        #: revocations waiting for the loop to stop the work (the member awaits each)
        self._revocations: list[asyncio.Future[None]] = []
        #: connector code under way beside the loop (starts, task configs, retargets)
        self._calls: set[asyncio.Task[Any]] = set()
        #: the latest start of each connector, for a restart request to wait on
        self._connector_starts: dict[str, asyncio.Task[bool]] = {}
        self._requests: RequestQueue[_Request] = RequestQueue()
        self._wake = asyncio.Event()
        self._stopping = False
        self._loop_task: asyncio.Task[None] | None = None
        self._http = config.http_client(30)
        #: what the herder loop is busy with, and since when (wall clock), for timeouts
        self._stage: tuple[str, float] | None = None

    # -- what the REST layer and tests read ---------------------------------------------

    @property
    def assignment(self) -> Any:
        return self.core.assignment

    @property
    def generation(self) -> Generation | None:
        return self.core.generation

    @property
    def is_leader(self) -> bool:
        return self.core.is_leader

    @property
    def leader_url(self) -> str | None:
        return self.core.leader_url

    @property
    def failure(self) -> HerderError | None:
        return self.core.failure

    def rebalance_metrics_now(self) -> dict[str, Any]:
        """This worker's rebalance metrics under Connect's names."""
        return self.rebalance_metrics.snapshot(_now_ms())

    def health(self) -> tuple[bool, str]:
        """Whether this worker is in its group with an assignment; if not, why not."""
        if self.failure is not None:
            return False, f"Worker is out of its group for good and is stopping: {self.failure}"
        if self._stopping:
            return False, "Worker is stopping."
        if self.core.assignment is None:
            activity = self.current_activity()
            if self.core.generation is None and self.core.member_generation is None:
                return False, f"Worker is still starting up: it is {activity}."
            return False, f"Worker is rebalancing: it is {activity}."
        return True, "Worker has completed startup and is ready to handle requests."

    # -- lifecycle ------------------------------------------------------------------

    async def start(self, url: str) -> None:
        self.url = url
        self.core.url = url
        # the loop's blocking calls on daemon threads: a hung filesystem call must not
        # keep a stopped worker's process alive
        asyncio.get_running_loop().set_default_executor(SharedExecutor(blocking_calls()))
        with self._doing(f"connecting to the ensemble at {','.join(self.config.bootstrap)}"):
            await self.client.start()
            for store in (self.configs, self.offsets, self.statuses):
                await store.start()
        self.member = self._member_factory(
            self.config.bootstrap,
            self.config.group_id,
            protocol_type="connect",
            protocols=self._protocols,
            assign=self._assign,
            on_assigned=self._on_assigned,
            on_revoked=self._on_revoked,
            on_failed=self._member_failed,
            # every join is a rebalance of this worker's, cooperative ones included,
            # which revoke nothing before they join
            on_joining=lambda: self.rebalance_metrics.started(_now_ms()),
            cooperative_protocols=COOPERATIVE_PROTOCOLS,
            session_timeout_ms=self.config.session_timeout_ms,
            rebalance_timeout_ms=self.config.rebalance_timeout_ms,
            heartbeat_interval_ms=self.config.heartbeat_interval_ms,
            client_id=self.worker_id,
            connections=self.connections,
            group_instance_id=self.config.group_instance_id,
        )
        if self.config.group_instance_id is not None:
            log.info(
                "worker %s is a static member of group %s with group.instance.id %s: a restart "
                "within session.timeout.ms=%d keeps its work and rebalances no other worker",
                self.worker_id,
                self.config.group_id,
                self.config.group_instance_id,
                self.config.session_timeout_ms,
            )
        await self.member.start()
        self._loop_task = asyncio.create_task(self._run(), name=f"herder-{self.worker_id}")
        # the tasks use this worker's session, coordinator connections and offsets, and
        # what they add (and the retention passes every worker runs) opens now rather
        # than with the first task
        factory = self.worker.execution_factory
        factory.share(self.client, self.coordinator, self.connections, self.offsets)
        self._in_background(factory.open())
        log.info(
            "worker %s started, REST at %s, group %s", self.worker_id, url, self.config.group_id
        )

    async def stop(self) -> None:
        """Stop all work, leave the group, fail whatever requests are still queued."""
        if self._stopping:
            return
        self._stopping = True
        self.worker.revoked()  # nothing starts from now on
        # the tasks stop because the worker does, not because they moved or ended
        self.worker.execution_factory.worker_stopping()
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
        await self.worker.stop_all()
        self._finish_revocations()
        if self.member is not None:
            # a static worker keeps its place for its next process (KIP-345)
            await self.member.close()
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

    # -- events for the core ----------------------------------------------------------

    def _protocols(self) -> list[tuple[str, bytes]]:
        return self.core.protocols()

    def _assign(self, leader_id: str, protocol: str, members: Any) -> dict[str, bytes]:
        decoded = {member: decode_metadata(data) for member, data in members.items()}
        result = self.core.assign(leader_id, decoded, protocol, _now_ms())
        return {m: encode_assignment(a) for m, a in result.items()}

    async def _on_revoked(self) -> None:
        """Nothing of the revoked generation starts from here on; the work stops on the
        herder loop, between two of its steps, and the member rejoins once it has."""
        self.worker.revoked()
        self.core.revoking()
        self.rebalance_metrics.started(_now_ms())
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._revocations.append(done)
        self._wake.set()
        await done

    async def _on_assigned(self, generation: Generation, data: bytes) -> None:
        self.core.assigned(generation, decode_assignment(data))
        self._wake.set()

    def _member_failed(self, cause: HerderError) -> None:
        """The membership ended for good: requests are refused with the cause from now on,
        and ``on_failed`` is told, so the worker process stops."""
        failure = out_of_group(cause, self.config)
        log.error("worker %s: %s", self.worker_id, failure)
        self.core.member_failed(failure)
        self._wake.set()
        if self._on_failed is not None:
            self._on_failed(failure)

    def _config_updated(self, snapshot: ClusterConfigSnapshot) -> None:
        self.core.configs_read(snapshot)
        self._wake.set()

    def _on_command(self, command: ConfigCommand) -> None:
        if isinstance(command, ClusterLoggerLevel):
            try:
                self.loggers.set_level(command.namespace, command.level)
            except HerderError as exc:
                log.warning("ignoring cluster logger level for %s: %s", command.namespace, exc)
            return
        self.core.restart_recorded(command)
        self._wake.set()

    def _request_reconfiguration(self, name: str) -> None:
        self.core.request_reconfiguration(name, _now_ms())
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
                await self._step()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("worker %s: herder step failed", self.worker_id)
                await asyncio.sleep(0.5)

    def _next_due(self) -> float | None:
        dues = [d for d in (self._requests.next_due_ms(), self.core.next_due_ms()) if d is not None]
        return max(0.0, (min(dues) - _now_ms()) / 1000) if dues else None

    async def _step(self) -> None:
        await self._carry_out()
        self.core.tick(_now_ms(), _wall_ms())
        await self._carry_out()
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
            await self._carry_out()

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
        if self.core.assignment is None:
            return "ensuring membership in the cluster (a rebalance is under way)"
        return "idle"

    # -- carrying out effects -------------------------------------------------------------

    async def _carry_out(self, effects: list[fx.Effect] | None = None) -> None:
        """Carry out ``effects`` and then whatever the core queues, until it queues nothing.

        The core's outbox is read one effect at a time (a row of task starts at once), so
        a revocation that comes in while an effect is under way drops the starts queued
        behind it.
        """
        given = deque(effects or ())
        while (effect := given.popleft() if given else self.core.take()) is not None:
            if isinstance(effect, fx.StartTask):
                batch = [effect]
                if not given:
                    batch += self.core.take_task_starts()
                with self._doing(f"starting {len(batch)} tasks"):
                    await asyncio.gather(*(self._start_task(e) for e in batch))
                continue
            await self._do(effect)

    async def _do(self, effect: fx.Effect) -> None:
        core, worker = self.core, self.worker
        match effect:
            case fx.StopAll():
                with self._doing("stopping the work of a revoked generation"):
                    await worker.stop_all()
                core.work_stopped()
            case fx.FinishRevocation():
                if self._revocations:
                    self._finish_revocations()  # the member's on_revoked returns
                elif self.member is not None:
                    # a cooperative assignment's revocation: the member may rejoin
                    self.member.revocation_finished()
            case fx.ReadToEnd(at_least=at_least):
                with self._doing("reading the config log to its end"):
                    core.caught_up(await self._read_configs_to(at_least))
            case fx.LeaveAndBackOff(backoff_ms=backoff_ms):
                log.warning(
                    "worker %s: leaving the group for worker.unsync.backoff.ms=%d before rejoining",
                    self.worker_id,
                    backoff_ms,
                )
                if self.member is not None:
                    await self.member.leave_group()
                await asyncio.sleep(backoff_ms / 1000)
                core.backed_off()
            case fx.Rejoin():
                if self.member is not None:
                    self.member.request_rejoin()
            case fx.TakeLeaderEpoch(generation=generation):
                with self._doing(f"taking the leader's fencing epoch of {generation}"):
                    try:
                        epoch = await self.coordinator.init_fencing(self._leader_fence_id)
                    except HerderError as exc:
                        core.leader_epoch_failed(generation, exc)
                    else:
                        core.leader_epoch_taken(generation, epoch)
            case fx.BeginGeneration(generation=generation):
                worker.assigned(generation.generation_id)
                leader = core.assignment.leader_url if core.assignment is not None else ""
                self.rebalance_metrics.completed(_now_ms(), generation.generation_id, leader)
            case fx.StartConnector():
                self._start_connector(effect)
            case fx.StartTask():
                await self._start_task(effect)
            case fx.StopConnector(name=name, destroyed=destroyed):
                await worker.stop_connector(name, destroyed=destroyed)
            case fx.StopTasks(task_ids=task_ids, destroyed=destroyed):
                await worker.stop_tasks(list(task_ids), destroyed=destroyed)
            case fx.Destroy(name=name):
                tasks = [t for t in worker.tasks | worker.held_back if t.connector == name]
                await worker.stop_tasks(tasks, destroyed=True)
                await worker.stop_connector(name, destroyed=True)
            case fx.SetConnectorTarget(name=name, instance=instance, target=target):
                self._in_background(self._retarget(name, instance, target))
            case fx.SetTaskTarget(task_id=task_id, target=target):
                await worker.set_task_target(task_id, target)
            case fx.PublishRestarting(instance=instance):
                await worker.publish_restarting(instance)
            case fx.GenerateTaskConfigs(ticket=ticket):
                self._in_background(self._generate_task_configs(ticket))
            case fx.WriteTaskConfigs(ticket=ticket, configs=configs):
                await self._publish_task_configs(ticket, configs, forward_to=None)
            case fx.ForwardTaskConfigs(ticket=ticket, configs=configs, leader_url=url):
                self._in_background(self._publish_task_configs(ticket, configs, forward_to=url))
            case fx.DistributeSessionKey(created_ms=created_ms):
                await self._distribute_session_key(created_ms)
            case fx.PublishUnassigned(work=work, generation=generation):
                self._in_background(self._publish_unassigned(work, generation.generation_id))

    async def _publish_unassigned(
        self, work: tuple[tuple[str | ConnectorTaskId, str], ...], generation: int
    ) -> None:
        statuses = [
            ConnectorStatus(what, State.UNASSIGNED, worker_id, generation)
            if isinstance(what, str)
            else TaskStatus(what, State.UNASSIGNED, worker_id, generation)
            for what, worker_id in work
        ]
        view = self.statuses.view
        # work already shown waiting for the same worker needs no new record
        await self.statuses.put_all(
            [
                s
                for s in statuses
                if (c := view.get(s)) is None
                or (c.state, c.worker_id) != (State.UNASSIGNED, s.worker_id)
            ]
        )

    async def _distribute_session_key(self, created_ms: int) -> None:
        policy = self.config.key_policy
        key = SessionKey(secrets.token_bytes(policy.key_bytes), policy.key_algorithm, created_ms)
        try:
            with self._doing("writing a new session key to the config log"):
                await self._write_configs([session_key_record(key)])
        except HerderError as exc:
            log.info("worker %s: could not write a new session key (%s)", self.worker_id, exc)
            self.core.session_key_written(False, _now_ms())
        else:
            log.info(
                "worker %s: wrote a new session key for signing internal requests",
                self.worker_id,
            )
            self.core.session_key_written(True, _now_ms())

    def _finish_revocations(self) -> None:
        revocations, self._revocations = self._revocations, []
        for done in revocations:
            if not done.done():
                done.set_result(None)

    async def _read_configs_to(self, at_least: int) -> bool:
        timeout = max(self.config.worker_sync_timeout_ms, 1) / 1000
        try:
            await self.configs.read_to_end(timeout=timeout)
        except (TimeoutError, HerderError) as exc:
            log.warning(
                "worker %s: could not read the config log to its end: %s", self.worker_id, exc
            )
            return False
        return self.configs.snapshot().offset >= at_least

    def _in_background(self, work: Awaitable[T]) -> asyncio.Task[T]:
        """Run ``work`` (which waits on connector code) beside the herder loop."""
        task: asyncio.Task[T] = asyncio.ensure_future(work)
        self._calls.add(task)

        def done(finished: asyncio.Task[T]) -> None:
            self._calls.discard(finished)
            self._wake.set()  # what it finished may have queued effects for the loop
            if not finished.cancelled() and finished.exception() is not None:
                log.error(
                    "worker %s: %s failed",
                    self.worker_id,
                    finished.get_coro(),
                    exc_info=finished.exception(),
                )

        task.add_done_callback(done)
        return task

    def _start_connector(self, effect: fx.StartConnector) -> asyncio.Task[bool]:
        async def start() -> bool:
            started = await self.worker.start_connector(
                effect.name, effect.config, effect.target, effect.generation.generation_id
            )
            self.core.connector_started(effect.name, effect.instance, started, _now_ms())
            return started

        task = self._in_background(start())
        self._connector_starts[effect.name] = task
        return task

    async def _start_task(self, effect: fx.StartTask) -> None:
        await self.worker.start_task(
            effect.task_id,
            effect.task_config,
            effect.connector_config,
            effect.target,
            effect.generation.generation_id,
        )

    async def _retarget(self, name: str, instance: int, target: Any) -> None:
        await self.worker.set_connector_target(name, target)
        self.core.connector_retargeted(name, instance, target, _now_ms())

    async def _generate_task_configs(self, ticket: fx.Ticket) -> None:
        try:
            configs = await self.worker.task_configs(ticket.name, ticket.max_tasks)
        except ConnectorCallTimeout as exc:
            # stuck: the worker made it FAILED, naming the call, until a restart
            self.core.task_configs_failed(ticket, exc, _now_ms(), retry=False)
        except Exception as exc:
            self.core.task_configs_failed(ticket, exc, _now_ms())
        else:
            self.core.task_configs_generated(ticket, configs, _now_ms())

    async def _publish_task_configs(
        self, ticket: fx.Ticket, configs: tuple[dict[str, str], ...], *, forward_to: str | None
    ) -> None:
        """Write (leader) or forward the task set, if it still speaks for the connector."""
        try:
            if self.core.still_current(ticket):
                if forward_to is None and self.core.is_leader:
                    await self.write_task_configs(ticket.name, list(configs))
                else:
                    await self._send_task_configs_to_leader(
                        ticket.name, list(configs), forward_to or self.core.leader_url
                    )
        except Exception as exc:
            self.core.task_configs_failed(ticket, exc, _now_ms())
        else:
            self.core.task_configs_done(ticket, _now_ms())

    async def _send_task_configs_to_leader(
        self, name: str, configs: list[dict[str, str]], url: str | None
    ) -> None:
        if not url:
            raise RebalanceInProgress("no leader known to send task configs to")
        body = json.dumps(configs).encode()
        headers = {"content-type": "application/json"}
        if self.core.signs_requests:
            headers |= signature_headers(
                self.core.snapshot.session_key, self.config.key_policy.signature_algorithm, body
            )
        response = await self._http.post(
            f"{url}/connectors/{name}/tasks", content=body, headers=headers
        )
        if response.status_code >= 400:
            raise HerderError(f"leader refused task configs for {name}: {response.text}")

    # -- requests ---------------------------------------------------------------------

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
