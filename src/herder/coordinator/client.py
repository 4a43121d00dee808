"""A group member, in the shape of Kafka's AbstractCoordinator.

:class:`GroupMember` finds the coordinator (FindCoordinator on any ensemble server),
joins the group (answering MEMBER_ID_REQUIRED by rejoining with the id it is given),
runs the pluggable assignor when it is the leader, syncs, and then heartbeats in the
background at ``heartbeat_interval_ms``. REBALANCE_IN_PROGRESS, ILLEGAL_GENERATION and
UNKNOWN_MEMBER_ID send it back to joining; NOT_COORDINATOR or a lost connection send it
back to finding the coordinator. ``on_revoked`` runs before every rejoin that follows
an assignment, ``on_assigned`` after every successful sync; both may take their time,
heartbeats go on meanwhile. ``close`` leaves the group so the others rebalance at once
instead of waiting out this member's session.

It also commits and fetches offsets (with the member's generation, so a stale member's
commit is refused) and takes fencing epochs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import socket
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import msgspec

from herder.coordinator import apis
from herder.coordinator import messages as m
from herder.coordinator.offsets import TopicPartition
from herder.ensemble.client import parse_bootstrap
from herder.errors import (
    CoordinatorNotAvailable,
    ErrorCode,
    HerderError,
    NotCoordinator,
    RetriableError,
    error_from_code,
)
from herder.wire import Api, ApiRegistry, WireClient

log = logging.getLogger(__name__)

Resp = TypeVar("Resp", bound=msgspec.Struct)

#: errors after which the member must find the coordinator again
_REDISCOVER = {
    ErrorCode.NOT_COORDINATOR,
    ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
}
#: errors after which the member must join again (keeping its member id)
_REJOIN = {ErrorCode.REBALANCE_IN_PROGRESS, ErrorCode.ILLEGAL_GENERATION}


@dataclass(frozen=True)
class Generation:
    """One generation of the group as this member saw it after a successful sync."""

    generation_id: int
    member_id: str
    leader_id: str
    protocol: str
    members: tuple[str, ...] = ()

    @property
    def is_leader(self) -> bool:
        return self.member_id == self.leader_id


#: run by the leader: (leader id, protocol, member id -> metadata) -> member id -> assignment
AssignFn = Callable[[str, str, Mapping[str, bytes]], Mapping[str, bytes]]


class CoordinatorConnections:
    """A process's connections to the group coordinator, shared by all its members.

    A worker has one group member per sink task besides its own: each keeps its own
    member id, generation and heartbeats, but their requests share one connection per
    server (the wire is pipelined and answers out of order), so the connections a
    worker holds do not grow with its tasks and stay under the ensemble's
    ``maxClientCnxns``. FindCoordinator goes to any server over the same connections.
    """

    def __init__(self, bootstrap: str | Sequence[str], *, request_timeout_ms: int = 30_000) -> None:
        self.servers = parse_bootstrap(bootstrap)
        self.request_timeout_ms = request_timeout_ms
        self._registry = ApiRegistry(apis.COORDINATOR_APIS)
        self._wires: dict[tuple[str, int], WireClient] = {}
        #: every wire made, in use or forgotten, for close() to end them all
        self._made: list[WireClient] = []

    async def _wire(self, host: str, port: int) -> WireClient:
        wire = self._wires.get((host, port))
        if wire is None:
            wire = WireClient(
                host,
                port,
                self._registry,
                connect_timeout=3,
                request_timeout=self.request_timeout_ms / 1000,
            )
            self._wires[(host, port)] = wire
            self._made.append(wire)
        if not wire.connected:
            await wire.connect()
        return wire

    async def coordinator(self, key: str, what: str = "") -> WireClient:
        """A connection to the coordinator of ``key``, found by asking any server."""
        last: Exception | None = None
        for host, port in random.sample(self.servers, len(self.servers)):
            try:
                probe = await self._wire(host, port)
                found = await probe.request(
                    apis.FIND_COORDINATOR, apis.FindCoordinatorRequest(key=key), timeout=5
                )
            except (HerderError, OSError) as exc:
                last = exc
                continue
            if found.error_code != ErrorCode.NONE:
                last = CoordinatorNotAvailable(found.error_message or "no coordinator")
                continue
            return await self._wire(found.host, found.port)
        raise CoordinatorNotAvailable(
            f"no group coordinator reachable for {what or repr(key)}: {last}"
        )

    async def forget(self, wire: WireClient) -> None:
        """A member is done with ``wire`` after an error: closed and replaced if it is
        no longer connected; left to the others if it is (it may just lead elsewhere)."""
        if not wire.connected:
            for address, known in list(self._wires.items()):
                if known is wire:
                    del self._wires[address]
            # closed for good: a member still holding it gets an error, not a reconnect
            await wire.close()
            if wire in self._made:
                self._made.remove(wire)

    @property
    def open(self) -> int:
        """Connections open now."""
        return sum(1 for wire in self._wires.values() if wire.connected)

    async def close(self) -> None:
        wires, self._made, self._wires = self._made, [], {}
        for wire in wires:
            await wire.close()


class GroupMember:
    """Keeps a membership of ``group_id`` alive until :meth:`close`."""

    def __init__(
        self,
        bootstrap: str | Sequence[str],
        group_id: str,
        *,
        protocol_type: str,
        protocols: Callable[[], Sequence[tuple[str, bytes]]],
        assign: AssignFn,
        on_assigned: Callable[[Generation, bytes], Awaitable[None]],
        on_revoked: Callable[[], Awaitable[None]] | None = None,
        on_heartbeat_error: Callable[[str], None] | None = None,
        on_failed: Callable[[HerderError], None] | None = None,
        session_timeout_ms: int = 10_000,
        rebalance_timeout_ms: int = 60_000,
        heartbeat_interval_ms: int = 3_000,
        client_id: str = "herder",
        retry_backoff_ms: int = 100,
        request_timeout_ms: int = 30_000,
        connections: CoordinatorConnections | None = None,
    ) -> None:
        self.servers = parse_bootstrap(bootstrap)
        self.group_id = group_id
        self.protocol_type = protocol_type
        self.protocols = protocols
        self.assign = assign
        self.on_assigned = on_assigned
        self.on_revoked = on_revoked
        self.on_heartbeat_error = on_heartbeat_error
        #: called once, when the membership fails for good (``failure``)
        self.on_failed = on_failed
        self.session_timeout_ms = session_timeout_ms
        self.rebalance_timeout_ms = rebalance_timeout_ms
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.client_id = client_id
        self.retry_backoff_ms = retry_backoff_ms
        self.request_timeout_ms = request_timeout_ms
        self.member_id = m.NO_MEMBER_ID
        #: the generation this member holds an assignment for (None while rebalancing)
        self.generation: Generation | None = None
        self.failure: HerderError | None = None
        self._owns_connections = connections is None
        self._connections = connections or CoordinatorConnections(
            bootstrap, request_timeout_ms=request_timeout_ms
        )
        self._coordinator: WireClient | None = None
        self._rejoin = asyncio.Event()
        self._rejoin.set()
        self._assigned = False
        self._closed = False
        self._run_task: asyncio.Task[None] | None = None
        self._heartbeat_task: asyncio.Task[None] | None = None
        self._stable = asyncio.Event()
        self._host = socket.gethostname()

    # -- lifecycle ------------------------------------------------------------------

    async def start(self) -> GroupMember:
        self._run_task = asyncio.create_task(self._run(), name=f"member-{self.group_id}")
        return self

    def request_rejoin(self) -> None:
        """Rejoin at the next opportunity (e.g. this member's metadata changed)."""
        self._stable.clear()
        self._rejoin.set()

    async def wait_stable(self, timeout: float | None = None) -> Generation:
        """Wait until this member holds an assignment; raise its failure if it has one."""
        async with asyncio.timeout(timeout):
            while True:
                if self.failure is not None:
                    raise self.failure
                if self._stable.is_set() and self.generation is not None:
                    return self.generation
                waiter = asyncio.create_task(self._stable.wait())
                done, _ = await asyncio.wait(
                    [waiter, self._run_task] if self._run_task else [waiter],
                    return_when=asyncio.FIRST_COMPLETED,
                )
                if waiter not in done:
                    waiter.cancel()

    async def leave_group(self) -> None:
        """Leave the group now and stay out until :meth:`request_rejoin`.

        The others rebalance without this member at once (Kafka's ``maybeLeaveGroup``),
        instead of waiting for a member that cannot take part, e.g. a Connect leader
        backing off because it could not read the config log.
        """
        self._stop_heartbeats()
        self._rejoin.clear()
        self._stable.clear()
        self.generation = None
        member_id, self.member_id = self.member_id, m.NO_MEMBER_ID
        if member_id and self._coordinator is not None:
            try:
                reply = await self._coordinator.request(
                    apis.LEAVE_GROUP,
                    m.LeaveGroupRequest(group_id=self.group_id, member_ids=[member_id]),
                    timeout=5,
                )
                _log_left(reply, member_id, self.group_id)
            except (HerderError, OSError) as exc:
                # its session expires instead: the group rebalances a little later
                log.info("member %s could not leave group %s: %s", member_id, self.group_id, exc)

    async def close(self, *, leave: bool = True) -> None:
        """Stop heartbeating and (by default) leave the group."""
        if self._closed:
            return
        self._closed = True
        for task in (self._run_task, self._heartbeat_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        if leave and self.member_id and self._coordinator is not None:
            with contextlib.suppress(HerderError, OSError):
                reply = await self._coordinator.request(
                    apis.LEAVE_GROUP,
                    m.LeaveGroupRequest(group_id=self.group_id, member_ids=[self.member_id]),
                    timeout=5,
                )
                _log_left(reply, self.member_id, self.group_id)
        self._coordinator = None
        if self._owns_connections:
            await self._connections.close()

    # -- the membership loop --------------------------------------------------------

    async def _run(self) -> None:
        backoff = self.retry_backoff_ms / 1000
        while not self._closed:
            try:
                await self._rejoin.wait()
                await self._join_and_sync()
                backoff = self.retry_backoff_ms / 1000
            except asyncio.CancelledError:
                raise
            except RetriableError as exc:
                log.info("group %s: %s; retrying", self.group_id, exc)
                await self._drop_coordinator()
                await asyncio.sleep(backoff * (0.5 + random.random()))
                backoff = min(backoff * 2, 2.0)
            except HerderError as exc:
                log.error("group %s: member %s failed: %s", self.group_id, self.member_id, exc)
                self.failure = exc
                self._stable.set()
                if self.on_failed is not None:
                    self.on_failed(exc)
                return

    async def _join_and_sync(self) -> None:
        if self._assigned:
            self._assigned = False
            if self.on_revoked is not None:
                await self.on_revoked()
        self._rejoin.clear()
        self._stable.clear()
        self._stop_heartbeats()
        join = await self._send(
            apis.JOIN_GROUP,
            m.JoinGroupRequest(
                group_id=self.group_id,
                member_id=self.member_id,
                client_id=self.client_id,
                client_host=self._host,
                session_timeout_ms=self.session_timeout_ms,
                rebalance_timeout_ms=self.rebalance_timeout_ms,
                protocol_type=self.protocol_type,
                protocols=[m.JoinGroupProtocol(name=n, metadata=md) for n, md in self.protocols()],
            ),
            timeout=self.rebalance_timeout_ms / 1000 + 5,
        )
        code = ErrorCode(join.error_code)
        if code == ErrorCode.MEMBER_ID_REQUIRED:
            self.member_id = join.member_id
            self._rejoin.set()
            return
        if code == ErrorCode.UNKNOWN_MEMBER_ID:
            self.member_id = m.NO_MEMBER_ID
            self._rejoin.set()
            return
        if code in _REJOIN:
            self._rejoin.set()
            return
        self._raise(code, "JoinGroup")
        self.member_id = join.member_id
        assignments: list[m.SyncGroupAssignment] = []
        if join.leader == self.member_id:
            members = {member.member_id: member.metadata for member in join.members}
            result = self.assign(self.member_id, join.protocol_name, members)
            assignments = [
                m.SyncGroupAssignment(member_id=k, assignment=v) for k, v in result.items()
            ]
        sync = await self._send(
            apis.SYNC_GROUP,
            m.SyncGroupRequest(
                group_id=self.group_id,
                generation_id=join.generation_id,
                member_id=self.member_id,
                assignments=assignments,
            ),
            timeout=self.rebalance_timeout_ms / 1000 + 5,
        )
        code = ErrorCode(sync.error_code)
        if code == ErrorCode.UNKNOWN_MEMBER_ID:
            self.member_id = m.NO_MEMBER_ID
            self._rejoin.set()
            return
        if code in _REJOIN:
            self._rejoin.set()
            return
        self._raise(code, "SyncGroup")
        self.generation = Generation(
            join.generation_id,
            self.member_id,
            join.leader,
            join.protocol_name,
            tuple(sorted(member.member_id for member in join.members)),
        )
        self._heartbeat_task = asyncio.create_task(self._heartbeats(self.generation))
        self._assigned = True
        log.info(
            "member %s joined group %s generation %d (leader %s)",
            self.member_id,
            self.group_id,
            join.generation_id,
            join.leader,
        )
        await self.on_assigned(self.generation, sync.assignment)
        if not self._rejoin.is_set():
            self._stable.set()

    def _raise(self, code: ErrorCode, what: str) -> None:
        if code == ErrorCode.NONE:
            return
        if code in _REDISCOVER:
            raise NotCoordinator(f"{what}: {code.name}")
        raise error_from_code(code, f"{what} for group {self.group_id} failed: {code.name}")

    # -- heartbeats -----------------------------------------------------------------

    def _stop_heartbeats(self) -> None:
        if self._heartbeat_task is not None:
            self._heartbeat_task.cancel()
            self._heartbeat_task = None

    async def _heartbeats(self, generation: Generation) -> None:
        interval = self.heartbeat_interval_ms / 1000
        while not self._closed:
            await asyncio.sleep(interval)
            try:
                reply = await self._send(
                    apis.HEARTBEAT,
                    m.HeartbeatRequest(
                        group_id=self.group_id,
                        generation_id=generation.generation_id,
                        member_id=generation.member_id,
                    ),
                    timeout=max(interval, 1.0) * 3,
                )
            except RetriableError as exc:
                log.info("group %s: heartbeat failed (%s)", self.group_id, exc)
                self._heartbeat_error(exc.code.name)
                await self._drop_coordinator()
                continue
            code = ErrorCode(reply.error_code)
            if code == ErrorCode.NONE:
                continue
            log.info("group %s: heartbeat answered %s", self.group_id, code.name)
            self._heartbeat_error(code.name)
            if code == ErrorCode.UNKNOWN_MEMBER_ID:
                self.member_id = m.NO_MEMBER_ID
            if code in _REDISCOVER:
                await self._drop_coordinator()
                continue
            self.request_rejoin()
            if code != ErrorCode.REBALANCE_IN_PROGRESS:
                return
            # Keep the session alive while on_revoked stops the work (it may take longer
            # than the session): heartbeats stop only when JoinGroup is sent, as in Kafka.

    def _heartbeat_error(self, error: str) -> None:
        if self.on_heartbeat_error is not None:
            try:
                self.on_heartbeat_error(error)
            except Exception:
                log.exception("group %s: heartbeat error callback failed", self.group_id)

    # -- the coordinator connection ---------------------------------------------------

    async def _drop_coordinator(self) -> None:
        wire, self._coordinator = self._coordinator, None
        if wire is not None:
            await self._connections.forget(wire)

    async def _find_coordinator(self) -> WireClient:
        if self._coordinator is not None and self._coordinator.connected:
            return self._coordinator
        what = f"group {self.group_id}" if self.group_id else "administrative requests"
        self._coordinator = await self._connections.coordinator(self.group_id, what)
        return self._coordinator

    async def _send(self, api: Api[Any, Resp], body: msgspec.Struct, timeout: float) -> Resp:
        wire = await self._find_coordinator()
        try:
            return await wire.request(api, body, timeout=timeout)
        except HerderError as exc:
            if exc.retriable:
                await self._drop_coordinator()
            raise

    # -- offsets and fencing --------------------------------------------------------

    async def commit_offsets(
        self,
        offsets: Mapping[TopicPartition, tuple[int, str]],
        *,
        generation: Generation | None = None,
    ) -> None:
        """Commit ``offsets`` ((offset, metadata) per partition) as this generation's.

        Raises ILLEGAL_GENERATION / UNKNOWN_MEMBER_ID / REBALANCE_IN_PROGRESS if this
        member no longer owns the generation: its commit must not count.
        """
        gen = generation or self.generation
        reply = await self._send(
            apis.OFFSET_COMMIT,
            m.OffsetCommitRequest(
                group_id=self.group_id,
                generation_id=gen.generation_id if gen else m.NO_GENERATION,
                member_id=gen.member_id if gen else m.NO_MEMBER_ID,
                offsets=[
                    m.OffsetCommitPartition(
                        topic=tp.topic, partition=tp.partition, offset=o, metadata=md
                    )
                    for tp, (o, md) in offsets.items()
                ],
            ),
            timeout=self.request_timeout_ms / 1000,
        )
        code = ErrorCode(reply.error_code)
        if code != ErrorCode.NONE:
            if code in _REDISCOVER:
                await self._drop_coordinator()
            raise error_from_code(code, f"offset commit for group {self.group_id}: {code.name}")

    async def fetch_offsets(
        self, partitions: Sequence[TopicPartition] | None = None
    ) -> dict[TopicPartition, tuple[int, str]]:
        """Committed (offset, metadata) per partition; all of the group's when None."""
        reply = await self._send(
            apis.OFFSET_FETCH,
            m.OffsetFetchRequest(
                group_id=self.group_id, partitions=list(partitions) if partitions else None
            ),
            timeout=self.request_timeout_ms / 1000,
        )
        if reply.error_code != ErrorCode.NONE:
            raise error_from_code(reply.error_code, f"offset fetch for group {self.group_id}")
        return {
            TopicPartition(o.topic, o.partition): (o.offset, o.metadata)
            for o in reply.offsets
            if o.offset != m.NO_OFFSET
        }


class CoordinatorClient:
    """Administrative requests to the coordinator: list, describe, delete groups, fencing."""

    def __init__(
        self, bootstrap: str | Sequence[str], *, connections: CoordinatorConnections | None = None
    ) -> None:
        self._member = GroupMember(
            bootstrap,
            "",
            protocol_type="",
            protocols=list,
            assign=lambda *_: {},
            on_assigned=_nothing,
            connections=connections,
        )

    async def request(self, api: Api[Any, Resp], body: msgspec.Struct) -> Resp:
        return await self._member._send(api, body, timeout=30)

    async def init_fencing(self, fenced_id: str) -> int:
        """Take a new fencing epoch for ``fenced_id``; older holders are fenced from now on."""
        reply = await self.request(apis.INIT_FENCING, m.InitFencingRequest(fenced_id=fenced_id))
        if reply.error_code != ErrorCode.NONE:
            raise error_from_code(reply.error_code, f"init fencing for {fenced_id}")
        return reply.epoch

    async def close(self) -> None:
        await self._member.close(leave=False)


async def _nothing(*_: object) -> None:
    return None


def _log_left(reply: m.LeaveGroupResponse, member_id: str, group_id: str) -> None:
    code = ErrorCode(reply.member_error(member_id))
    if code == ErrorCode.NONE:
        log.info("member %s left group %s", member_id, group_id)
    else:
        # e.g. UNKNOWN_MEMBER_ID: its session had already ended; the group is without it
        log.info("member %s leaving group %s: %s", member_id, group_id, code.name)
