"""A group member: :class:`~herder.runtime.core.member.MemberMachine` over real connections.

:class:`GroupMember` keeps a membership of one group alive until :meth:`GroupMember.close`.
The protocol (when to join, sync, heartbeat, revoke, back off, give up) is all the
machine's; this shell runs one asyncio task that waits for whatever comes first (an
answer from the coordinator, the machine's next deadline on the monotonic clock, a
callback finishing, a call of the public API), feeds it to the machine and carries out
the effects it returns:

* requests go to the coordinator over the process's shared
  :class:`~herder.coordinator.client.CoordinatorConnections`, each in a task of its own
  whose answer comes back to the loop; the machine awaits one at a time, so a new one
  abandons the one before;
* ``on_revoked`` is awaited before the machine hears ``revoked``, ``on_assigned`` runs
  after every successful sync; the callbacks run one after another, in a task of their
  own, so they may take their time while the heartbeats go on;
* the leader's ``assign`` runs when the machine asks for it;
* ``on_failed`` hears once of a failure for good.

It also commits and fetches the group's offsets, with the member's generation so that a
stale member's commit is refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
import socket
import time
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from typing import Any

from herder.coordinator import apis
from herder.coordinator import messages as m
from herder.coordinator.client import CoordinatorConnections, CoordinatorLink
from herder.coordinator.offsets import TopicPartition
from herder.errors import ErrorCode, HerderError, NetworkError, error_from_code
from herder.runtime.core.member import (
    Assign,
    Assigned,
    Effect,
    Failed,
    Generation,
    HeartbeatFailed,
    MemberMachine,
    MemberState,
    Rediscover,
    Revoke,
    SendHeartbeat,
    SendJoin,
    SendLeave,
    SendSync,
)
from herder.wire import Api

log = logging.getLogger(__name__)

__all__ = ["AssignFn", "Generation", "GroupMember"]

#: run by the leader: (leader id, protocol, member id -> metadata) -> member id -> assignment
AssignFn = Callable[[str, str, Mapping[str, bytes]], Mapping[str, bytes]]

#: what the loop feeds the machine: an event, given the time, returns the effects
_Event = Callable[[int], list[Effect]]

#: how long a LeaveGroup may take before the member gives up on it (its session then
#: expires instead, and the group rebalances a little later)
_LEAVE_TIMEOUT_S = 5.0
#: errors that end the offset requests' coordinator (the next request finds it again)
_COORDINATOR_MOVED = {
    ErrorCode.NOT_COORDINATOR,
    ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
}


def _now_ms() -> int:
    return time.monotonic_ns() // 1_000_000


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
        on_joining: Callable[[], None] | None = None,
        session_timeout_ms: int = 10_000,
        rebalance_timeout_ms: int = 60_000,
        heartbeat_interval_ms: int = 3_000,
        client_id: str = "herder",
        retry_backoff_ms: int = 100,
        request_timeout_ms: int = 30_000,
        connections: CoordinatorConnections | None = None,
        group_instance_id: str | None = None,
        cooperative_protocols: Collection[str] = (),
    ) -> None:
        self.group_id = group_id
        self.client_id = client_id
        self.assign = assign
        self.on_assigned = on_assigned
        self.on_revoked = on_revoked
        self.on_heartbeat_error = on_heartbeat_error
        self.on_failed = on_failed
        #: told each time the member sends a JoinGroup (a rebalance of its own begins,
        #: whether or not it revokes anything first)
        self.on_joining = on_joining
        self.request_timeout_ms = request_timeout_ms
        self._machine = MemberMachine(
            group_id,
            protocol_type=protocol_type,
            protocols=protocols,
            session_timeout_ms=session_timeout_ms,
            rebalance_timeout_ms=rebalance_timeout_ms,
            heartbeat_interval_ms=heartbeat_interval_ms,
            client_id=client_id,
            client_host=socket.gethostname(),
            retry_backoff_ms=retry_backoff_ms,
            request_timeout_ms=request_timeout_ms,
            rng=random.Random(),
            group_instance_id=group_instance_id,
            cooperative_protocols=cooperative_protocols,
        )
        #: a static member needs JoinGroup version 1, which knows instance ids
        self._min_version = 1 if group_instance_id is not None else 0
        # the machine times its requests out; the transport's timeout only ends a
        # request nobody abandoned, so it outlasts every deadline the machine sets
        self._backstop_s = (rebalance_timeout_ms + request_timeout_ms) / 1000 + 10
        self._owns_connections = connections is None
        self._connections = connections or CoordinatorConnections(
            bootstrap, request_timeout_ms=request_timeout_ms
        )
        self._link = CoordinatorLink(
            self._connections, group_id, f"group {group_id}" if group_id else "this member"
        )
        self._inbox: asyncio.Queue[tuple[_Event, asyncio.Future[None] | None]] = asyncio.Queue()
        self._loop_task: asyncio.Task[None] | None = None
        #: set when the event the loop carries out now has been (leave_group waits on it)
        self._done: asyncio.Future[None] | None = None
        #: the request whose answer the machine awaits
        self._request: asyncio.Task[None] | None = None
        #: the callback that runs now or last ran: the next one waits for it
        self._callback: asyncio.Task[None] | None = None
        #: the generation whose on_assigned has finished (wait_stable's answer)
        self._ready: Generation | None = None
        self._changed = asyncio.Event()
        #: a failure of this shell itself (a bug): the member stopped with it
        self._crash: HerderError | None = None
        self._failure_told = False
        self._closed = False

    # -- what the machine knows -------------------------------------------------------

    @property
    def member_id(self) -> str:
        return self._machine.member_id

    @property
    def generation(self) -> Generation | None:
        """The generation this member holds an assignment for (None while rebalancing)."""
        return self._machine.generation

    @property
    def failure(self) -> HerderError | None:
        return self._machine.failure or self._crash

    @property
    def state(self) -> MemberState:
        return self._machine.state

    # -- lifecycle --------------------------------------------------------------------

    async def start(self) -> GroupMember:
        if self._loop_task is not None:
            return self
        self._post(self._machine.start)
        self._loop_task = asyncio.create_task(self._run(), name=f"member-{self.group_id}")
        return self

    def request_rejoin(self) -> None:
        """Rejoin at the next opportunity (e.g. this member's metadata changed)."""
        self._ready = None  # wait_stable waits for the next generation from now on
        self._post(self._machine.request_rejoin)

    async def wait_stable(self, timeout: float | None = None) -> Generation:
        """Wait until this member holds an assignment (its ``on_assigned`` has run);
        raise its failure if it has one."""
        async with asyncio.timeout(timeout):
            while True:
                failure = self.failure
                if failure is not None:
                    raise failure
                generation = self.generation
                if generation is not None and generation is self._ready:
                    return generation
                await self._changed.wait()

    def revocation_finished(self) -> None:
        """Cooperative protocols: the work an assignment revoked has stopped, so the
        member may join again (for the follow-up round)."""
        self._post(self._machine.revoked)

    async def leave_group(self) -> None:
        """Leave the group now and stay out until :meth:`request_rejoin`.

        The others rebalance without this member at once (Kafka's ``maybeLeaveGroup``),
        instead of waiting for a member that cannot take part, e.g. a Connect leader
        backing off because it could not read the config log. An assignment held is
        revoked (``on_revoked`` runs) meanwhile; the LeaveGroup does not wait for it.
        """
        if self._loop_task is None or self._loop_task.done():
            await self._execute(self._machine.leave(_now_ms()))
            return
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._post(self._machine.leave, done)
        await done

    async def close(self, *, leave: bool | None = None) -> None:
        """Stop heartbeating; leave the group unless the member is static (``leave``
        True leaves in any case, False never: see :meth:`MemberMachine.close`)."""
        if self._closed:
            return
        self._closed = True
        for task in (self._loop_task, self._request, self._callback):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        for effect in self._machine.close(_now_ms(), leave=leave):
            if isinstance(effect, SendLeave):
                await self._leave(effect.request)
        await self._link.drop()
        if self._owns_connections:
            await self._connections.close()
        self._notify()

    # -- the loop ---------------------------------------------------------------------

    def _post(self, event: _Event, done: asyncio.Future[None] | None = None) -> None:
        self._inbox.put_nowait((event, done))

    async def _run(self) -> None:
        machine = self._machine
        try:
            while machine.state not in (MemberState.FAILED, MemberState.CLOSED):
                due = machine.next_deadline_ms()
                wait = None if due is None else max(0, due - _now_ms()) / 1000
                event: _Event | None = None
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(wait):
                        event, self._done = await self._inbox.get()
                now = _now_ms()
                effects = event(now) if event is not None else []
                effects += machine.tick(now)
                await self._execute(effects)
                self._event_done()
                self._notify()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("group %s: member %s stopped on a bug", self.group_id, self.member_id)
            self._crash = HerderError(f"the member of group {self.group_id} stopped: {exc!r}")
            self._tell_failure(self._crash)
        finally:
            # whoever waits for an event this loop will not carry out goes on
            self._event_done()
            while not self._inbox.empty():
                _, self._done = self._inbox.get_nowait()
                self._event_done()
            self._notify()

    def _event_done(self) -> None:
        done, self._done = self._done, None
        if done is not None and not done.done():
            done.set_result(None)

    def _notify(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def _execute(self, effects: list[Effect]) -> None:
        for effect in effects:
            if isinstance(effect, SendJoin):
                if self.on_joining is not None:
                    self.on_joining()
                self._send(
                    effect.token, apis.JOIN_GROUP, effect.request, self._machine.join_answered
                )
            elif isinstance(effect, SendSync):
                self._send(
                    effect.token, apis.SYNC_GROUP, effect.request, self._machine.sync_answered
                )
            elif isinstance(effect, SendHeartbeat):
                self._send(
                    effect.token, apis.HEARTBEAT, effect.request, self._machine.heartbeat_answered
                )
            elif isinstance(effect, SendLeave):
                await self._leave(effect.request)
            elif isinstance(effect, Rediscover):
                self._abandon_request()
                await self._link.drop()
            elif isinstance(effect, Revoke):
                self._then(self._revoke)
            elif isinstance(effect, Assign):
                self._run_assignor(effect)
            elif isinstance(effect, Assigned):
                self._then(functools.partial(self._assigned, effect.generation, effect.assignment))
            elif isinstance(effect, HeartbeatFailed):
                self._heartbeat_failed(effect.error)
            elif isinstance(effect, Failed):
                self._abandon_request()
                self._tell_failure(effect.error)

    # -- requests ---------------------------------------------------------------------

    def _send(
        self,
        token: int,
        api: Api[Any, Any],
        request: Any,
        answered: Callable[[int, Any, int], list[Effect]],
    ) -> None:
        self._abandon_request()

        async def send() -> None:
            error: HerderError
            try:
                response = await self._link.request(
                    api, request, timeout=self._backstop_s, min_version=self._min_version
                )
            except HerderError as exc:
                error = exc
            except OSError as exc:
                error = NetworkError(f"{api.name} for group {self.group_id}: {exc}")
            else:
                self._post(functools.partial(answered, token, response))
                return
            self._post(functools.partial(self._machine.request_failed, token, error))

        self._request = asyncio.create_task(send(), name=f"member-{self.group_id}-{api.name}")

    def _abandon_request(self) -> None:
        """The machine awaits no answer to the request under way any more."""
        if self._request is not None:
            self._request.cancel()
            self._request = None

    async def _leave(self, request: m.LeaveGroupRequest) -> None:
        """Send a LeaveGroup to the coordinator known now, if any: finding one just for
        a leave could hold a closing member up, and its session ends anyway."""
        (member_id,) = request.member_ids
        try:
            reply = await self._link.request(
                apis.LEAVE_GROUP, request, timeout=_LEAVE_TIMEOUT_S, find=False
            )
        except (HerderError, OSError) as exc:
            log.info("member %s could not leave group %s: %s", member_id, self.group_id, exc)
            return
        code = ErrorCode(reply.member_error(member_id))
        if code == ErrorCode.NONE:
            log.info("member %s left group %s", member_id, self.group_id)
        else:
            # e.g. UNKNOWN_MEMBER_ID: its session had already ended
            log.info("member %s leaving group %s: %s", member_id, self.group_id, code.name)

    # -- callbacks --------------------------------------------------------------------

    def _then(self, callback: Callable[[], Awaitable[None]]) -> None:
        """Run ``callback`` after the callbacks before it, beside the loop."""
        previous = self._callback

        async def run() -> None:
            if previous is not None:
                with contextlib.suppress(Exception):
                    await previous
            await callback()

        self._callback = asyncio.create_task(run(), name=f"member-{self.group_id}-callback")

    async def _revoke(self) -> None:
        if self.on_revoked is not None:
            try:
                await self.on_revoked()
            except Exception:
                # the work is as stopped as it will get; the group must not wait on it
                log.exception("group %s: on_revoked failed", self.group_id)
        self._post(self._machine.revoked)

    async def _assigned(self, generation: Generation, assignment: bytes) -> None:
        try:
            await self.on_assigned(generation, assignment)
        except Exception:
            log.exception(
                "group %s: on_assigned failed for generation %d",
                self.group_id,
                generation.generation_id,
            )
        self._ready = generation
        self._notify()

    def _run_assignor(self, effect: Assign) -> None:
        token = effect.token
        try:
            result = self.assign(effect.leader_id, effect.protocol, effect.members)
        except Exception as exc:
            log.exception("group %s: the assignor failed", self.group_id)
            error = exc if isinstance(exc, HerderError) else HerderError(f"assignor: {exc!r}")
            self._post(functools.partial(self._machine.request_failed, token, error))
            return
        self._post(functools.partial(self._machine.assignment_made, token, dict(result)))

    def _heartbeat_failed(self, error: str) -> None:
        if self.on_heartbeat_error is not None:
            try:
                self.on_heartbeat_error(error)
            except Exception:
                log.exception("group %s: heartbeat error callback failed", self.group_id)

    def _tell_failure(self, error: HerderError) -> None:
        if self._failure_told:
            return
        self._failure_told = True
        if self.on_failed is not None:
            try:
                self.on_failed(error)
            except Exception:
                log.exception("group %s: failure callback failed", self.group_id)

    # -- offsets ----------------------------------------------------------------------

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
        reply = await self._link.request(
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
            if code in _COORDINATOR_MOVED:
                await self._link.drop()
            raise error_from_code(code, f"offset commit for group {self.group_id}: {code.name}")

    async def fetch_offsets(
        self, partitions: Sequence[TopicPartition] | None = None
    ) -> dict[TopicPartition, tuple[int, str]]:
        """Committed (offset, metadata) per partition; all of the group's when None."""
        reply = await self._link.request(
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
