"""Simulated group members: what the group member client does, one event at a time.

A :class:`Client` is a member as an operator sees it (a name and, for a static member,
its ``group.instance.id``); each start of it is a :class:`Process`. A process joins
(answering MEMBER_ID_REQUIRED by rejoining with the id), the leader assigns the
resources round-robin and syncs, then it heartbeats and now and then commits an offset
with its generation. It rejoins when an answer says so, finds the coordinator again
(backs off) after NOT_COORDINATOR and the like, and stops for good on an error a real
client cannot get past (FENCED_INSTANCE_ID, GROUP_MAX_SIZE_REACHED).

A process never reads the coordinator's state: it knows only what its answers said.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from herder.coordinator.messages import (
    HeartbeatRequest,
    JoinGroupProtocol,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    LeavingMember,
    OffsetCommitPartition,
    OffsetCommitRequest,
    SyncGroupAssignment,
    SyncGroupRequest,
    SyncGroupResponse,
)
from herder.errors import ErrorCode

if TYPE_CHECKING:
    from tests.sim.coordinator.world import World

GROUP = "sim-group"
PROTOCOL_TYPE = "sim"
PROTOCOL = "round-robin"
RESOURCES = [f"r{i}" for i in range(12)]

#: answers that send a process back to finding the coordinator before it rejoins
_REDISCOVER = {
    ErrorCode.NOT_COORDINATOR,
    ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
    ErrorCode.COORDINATOR_NOT_AVAILABLE,
}
#: answers that send a process back to joining, keeping its member id
_REJOIN = {ErrorCode.REBALANCE_IN_PROGRESS, ErrorCode.ILLEGAL_GENERATION}
#: answers a real client gives up on
_FATAL = {
    ErrorCode.FENCED_INSTANCE_ID,
    ErrorCode.GROUP_MAX_SIZE_REACHED,
    ErrorCode.INCONSISTENT_GROUP_PROTOCOL,
    ErrorCode.INVALID_SESSION_TIMEOUT,
    ErrorCode.INVALID_GROUP_ID,
}


@dataclass(frozen=True)
class Timing:
    session_timeout_ms: int
    rebalance_timeout_ms: int
    heartbeat_interval_ms: int
    commit_interval_ms: int
    backoff_ms: int = 100


@dataclass(frozen=True)
class Client:
    name: str
    instance_id: str | None
    timing: Timing

    @property
    def is_static(self) -> bool:
        return self.instance_id is not None


class Phase(enum.Enum):
    JOINING = "joining"
    SYNCING = "syncing"
    STABLE = "stable"
    BACKOFF = "backoff"
    #: stopped or crashed: it sends nothing and hears nothing any more
    DEAD = "dead"
    #: gave up on an error it cannot get past
    FAILED = "failed"


def round_robin(member_ids: list[str]) -> dict[str, bytes]:
    """Resource i to the i-th member by id, cycling: disjoint and covering."""
    members = sorted(member_ids)
    given: dict[str, list[str]] = {member_id: [] for member_id in members}
    for index, resource in enumerate(RESOURCES):
        given[members[index % len(members)]].append(resource)
    return {member_id: ",".join(names).encode() for member_id, names in given.items()}


class Process:
    """One run of a client, from its start until it dies or gives up."""

    def __init__(self, world: World, client: Client, pid: int) -> None:
        self.world = world
        self.client = client
        self.pid = pid
        self.member_id = ""
        self.generation = -1
        self.leader = ""
        self.assignment: bytes | None = None
        self.metadata = b"m0"
        self.phase = Phase.JOINING
        #: the request id of the JoinGroup or SyncGroup this process waits for
        self.awaiting: int | None = None
        #: bumped whenever the heartbeat and commit loops must stop (a rejoin, a death)
        self._loop = 0
        self._offset = 0

    def __repr__(self) -> str:
        who = self.client.instance_id or self.client.name
        return f"<{who}#{self.pid} {self.phase.value} {self.member_id or '-'} g{self.generation}>"

    @property
    def alive(self) -> bool:
        return self.phase not in (Phase.DEAD, Phase.FAILED)

    # -- what the world does to it ---------------------------------------------------

    def start(self) -> None:
        self.join()

    def die(self) -> None:
        self.phase = Phase.DEAD
        self.awaiting = None
        self._loop += 1

    def stop(self, *, leave: bool) -> None:
        """A graceful stop: a dynamic member leaves by its member id; a static one
        leaves (for good) by its instance id only when asked to, as Kafka's consumer."""
        leaving = None
        if leave and self.client.is_static:
            leaving = LeavingMember(group_instance_id=self.client.instance_id)
        elif leave and self.member_id:
            leaving = LeavingMember(member_id=self.member_id)
        if leaving is not None:
            request = LeaveGroupRequest(group_id=GROUP, members=[leaving])
            self.world.send(self, "leave", request, timeout_ms=5_000)
        self.die()

    def change_metadata(self) -> None:
        """Its subscription changed: rejoin with new metadata (a rebalance follows)."""
        if self.phase is Phase.STABLE:
            self.metadata = b"m%d" % (int(self.metadata[1:]) + 1)
            self.join()

    # -- the membership protocol -------------------------------------------------------

    def join(self) -> None:
        self._loop += 1
        self.phase = Phase.JOINING
        self.assignment = None
        timing = self.client.timing
        request = JoinGroupRequest(
            group_id=GROUP,
            member_id=self.member_id,
            group_instance_id=self.client.instance_id,
            client_id=self.client.name,
            client_host="sim",
            session_timeout_ms=timing.session_timeout_ms,
            rebalance_timeout_ms=timing.rebalance_timeout_ms,
            protocol_type=PROTOCOL_TYPE,
            protocols=[JoinGroupProtocol(name=PROTOCOL, metadata=self.metadata)],
        )
        self.awaiting = self.world.send(
            self, "join", request, timeout_ms=timing.rebalance_timeout_ms + 5_000
        )

    def _backoff_then_join(self) -> None:
        self._loop += 1
        self.phase = Phase.BACKOFF
        self.awaiting = None
        loop = self._loop

        def again() -> None:
            if self._loop == loop and self.alive:
                self.join()

        self.world.schedule(self.client.timing.backoff_ms, again)

    def _fail(self, error: ErrorCode) -> None:
        self.world.trace(f"{self!r} gives up: {error.name}")
        self.phase = Phase.FAILED
        self.awaiting = None
        self._loop += 1

    def on_join(self, response: JoinGroupResponse) -> None:
        code = ErrorCode(response.error_code)
        if code == ErrorCode.MEMBER_ID_REQUIRED:
            self.member_id = response.member_id
            self.join()
        elif code == ErrorCode.UNKNOWN_MEMBER_ID:
            self.member_id = ""
            self._backoff_then_join()
        elif code in _REJOIN:
            self.join()
        elif code in _FATAL:
            self._fail(code)
        elif code != ErrorCode.NONE:
            self._backoff_then_join()
        else:
            self.member_id = response.member_id
            self.generation = response.generation_id
            self.leader = response.leader
            assignments: list[SyncGroupAssignment] = []
            if response.leader == self.member_id and not response.skip_assignment:
                plan = round_robin([m.member_id for m in response.members])
                assignments = [
                    SyncGroupAssignment(member_id=m, assignment=a) for m, a in plan.items()
                ]
            self.phase = Phase.SYNCING
            request = SyncGroupRequest(
                group_id=GROUP,
                generation_id=self.generation,
                member_id=self.member_id,
                group_instance_id=self.client.instance_id,
                protocol_type=response.protocol_type,
                protocol_name=response.protocol_name,
                assignments=assignments,
            )
            timeout = self.client.timing.rebalance_timeout_ms + 5_000
            self.awaiting = self.world.send(self, "sync", request, timeout_ms=timeout)

    def on_sync(self, response: SyncGroupResponse) -> None:
        code = ErrorCode(response.error_code)
        if code == ErrorCode.UNKNOWN_MEMBER_ID:
            self.member_id = ""
            self._backoff_then_join()
        elif code in _REJOIN:
            self.join()
        elif code in _FATAL:
            self._fail(code)
        elif code != ErrorCode.NONE:
            self._backoff_then_join()
        else:
            self.phase = Phase.STABLE
            self.awaiting = None
            self.assignment = response.assignment
            self._loop += 1
            self._every(self.client.timing.heartbeat_interval_ms, self._heartbeat)
            self._every(self.client.timing.commit_interval_ms, self._commit)

    def on_timeout(self, kind: str) -> None:
        """A join or sync answer that never came: join again (same member id)."""
        if kind in ("join", "sync"):
            self.join()

    # -- heartbeats and commits ----------------------------------------------------------

    def _every(self, interval_ms: int, action: Callable[[], None]) -> None:
        loop = self._loop

        def tick() -> None:
            if self._loop == loop and self.phase is Phase.STABLE:
                action()
                self.world.schedule(interval_ms, tick)

        self.world.schedule(interval_ms, tick)

    def _heartbeat(self) -> None:
        request = HeartbeatRequest(
            group_id=GROUP,
            generation_id=self.generation,
            member_id=self.member_id,
            group_instance_id=self.client.instance_id,
        )
        self.world.send(
            self, "heartbeat", request, timeout_ms=self.client.timing.heartbeat_interval_ms
        )

    def on_heartbeat(self, request: HeartbeatRequest, code: ErrorCode) -> None:
        if self.phase is not Phase.STABLE or request.generation_id != self.generation:
            return
        if code == ErrorCode.UNKNOWN_MEMBER_ID:
            self.member_id = ""
            self.join()
        elif code in _REJOIN:
            self.join()
        elif code in _FATAL:
            self._fail(code)

    def _commit(self) -> None:
        self._offset += 1
        partition = sum(map(ord, self.client.name)) % 4
        request = OffsetCommitRequest(
            group_id=GROUP,
            generation_id=self.generation,
            member_id=self.member_id,
            group_instance_id=self.client.instance_id,
            offsets=[OffsetCommitPartition(topic="t", partition=partition, offset=self._offset)],
        )
        self.world.send(self, "commit", request, timeout_ms=5_000)

    def on_response(self, kind: str, request_id: int, request: Any, response: Any) -> None:
        if not self.alive:
            return
        if kind == "join" and request_id == self.awaiting:
            self.on_join(response)
        elif kind == "sync" and request_id == self.awaiting:
            self.on_sync(response)
        elif kind == "heartbeat":
            self.on_heartbeat(request, ErrorCode(response.error_code))
        elif kind == "commit" and ErrorCode(response.error_code) in _FATAL:
            self._fail(ErrorCode(response.error_code))
