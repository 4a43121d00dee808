"""A fake store, a reply recorder and a harness that drives the coordinator by hand."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from random import Random
from typing import Any, Generic, TypeVar

from herder.coordinator import (
    CoordinatorConfig,
    Group,
    GroupCoordinator,
    GroupState,
    GroupStore,
    StoreCallback,
    TopicPartition,
    collect_groups,
)
from herder.coordinator.messages import (
    DeleteGroupsRequest,
    DeleteGroupsResponse,
    DescribeGroupsRequest,
    DescribeGroupsResponse,
    HeartbeatRequest,
    HeartbeatResponse,
    InitFencingRequest,
    InitFencingResponse,
    JoinGroupProtocol,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    LeaveGroupResponse,
    LeavingMember,
    ListGroupsRequest,
    ListGroupsResponse,
    OffsetCommitPartition,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
    SyncGroupAssignment,
    SyncGroupRequest,
    SyncGroupResponse,
)
from herder.coordinator.records import (
    FencingRecord,
    GroupRecord,
    OffsetRecord,
    encode_record,
    fencing_key,
    group_key,
    offset_key,
)
from herder.errors import ErrorCode

T = TypeVar("T")

SESSION_MS = 10_000
REBALANCE_MS = 30_000
DEFAULT_PROTOCOLS = (("range", b"range-meta"),)


class Reply(Generic[T]):
    """A ``respond`` callback that remembers every response it was given."""

    def __init__(self, on_response: Callable[[T], None] | None = None) -> None:
        self.responses: list[T] = []
        self._on_response = on_response

    def __call__(self, response: T) -> None:
        self.responses.append(response)
        if self._on_response is not None:
            self._on_response(response)

    @property
    def done(self) -> bool:
        return bool(self.responses)

    @property
    def value(self) -> T:
        assert len(self.responses) == 1, f"expected exactly one response, got {self.responses}"
        return self.responses[0]

    @property
    def error(self) -> ErrorCode:
        return ErrorCode(self.value.error_code)  # type: ignore[attr-defined]


@dataclass
class Write:
    log: str
    entries: list[tuple[bytes, bytes | None]]
    callback: StoreCallback


class FakeStore(GroupStore):
    """Two in-memory logs; writes complete at once, or only when the test says so.

    ``errors`` are handed to the next writes in order instead of success, so a test can
    fail exactly the write it means to.
    """

    def __init__(self, *, deferred: bool = False) -> None:
        self.deferred = deferred
        self.errors: deque[ErrorCode] = deque()
        self.pending: deque[Write] = deque()
        self.groups_log: list[tuple[bytes, bytes | None]] = []
        self.fencing_log: list[tuple[bytes, bytes | None]] = []
        self.zxid = 0x1_0000_0000
        self.writes = 0

    def store_group(self, group_id: str, record: GroupRecord, callback: StoreCallback) -> None:
        self._write("_groups", [(group_key(group_id), encode_record(record))], callback)

    def store_offsets(
        self,
        group_id: str,
        offsets: Mapping[TopicPartition, OffsetRecord | None],
        callback: StoreCallback,
    ) -> None:
        entries = [
            (offset_key(group_id, tp), None if rec is None else encode_record(rec))
            for tp, rec in offsets.items()
        ]
        self._write("_groups", entries, callback)

    def delete_group(
        self, group_id: str, partitions: Sequence[TopicPartition], callback: StoreCallback
    ) -> None:
        entries: list[tuple[bytes, bytes | None]] = [(group_key(group_id), None)]
        entries += [(offset_key(group_id, tp), None) for tp in partitions]
        self._write("_groups", entries, callback)

    def store_fencing(self, record: FencingRecord, callback: StoreCallback) -> None:
        self._write("_fencing", [(fencing_key(record.fenced_id), encode_record(record))], callback)

    def _write(
        self, log: str, entries: list[tuple[bytes, bytes | None]], callback: StoreCallback
    ) -> None:
        self.writes += 1
        self.pending.append(Write(log, entries, callback))
        if not self.deferred:
            self.complete_all()

    def complete_next(self, error: ErrorCode | None = None) -> Write:
        write = self.pending.popleft()
        if error is None:
            error = self.errors.popleft() if self.errors else ErrorCode.NONE
        if error == ErrorCode.NONE:
            self.zxid += 1
            target = self.groups_log if write.log == "_groups" else self.fencing_log
            target.extend(write.entries)
            write.callback(ErrorCode.NONE, self.zxid)
        else:
            write.callback(error)
        return write

    def complete_all(self, error: ErrorCode | None = None) -> None:
        while self.pending:
            self.complete_next(error)


@dataclass
class FormedGroup:
    group_id: str
    members: list[str]
    leader: str
    generation: int

    @property
    def followers(self) -> list[str]:
        return [m for m in self.members if m != self.leader]


class Harness:
    """One coordinator, its fake store and a hand-driven clock, serving from the start."""

    def __init__(
        self,
        config: CoordinatorConfig | None = None,
        *,
        deferred: bool = False,
        seed: int = 0,
        start_ms: int = 1_000_000,
    ) -> None:
        self.store = FakeStore(deferred=deferred)
        self.coordinator = GroupCoordinator(self.store, random=Random(seed), config=config)
        self.now = start_ms
        self.coordinator.begin_loading(self.now)
        self.coordinator.finish_loading(self.now)

    def group(self, group_id: str = "g") -> Group:
        group = self.coordinator.group(group_id)
        assert group is not None, f"no group {group_id}"
        return group

    def state(self, group_id: str = "g") -> GroupState:
        return self.group(group_id).state

    def advance(self, ms: int) -> None:
        self.now += ms
        self.coordinator.tick(self.now)

    def _send(self, request: Any, reply: Reply[Any] | None = None) -> Reply[Any]:
        reply = reply if reply is not None else Reply()
        self.coordinator.handle(request, self.now, reply)
        return reply

    # -- requests ------------------------------------------------------------------

    def join(
        self,
        group_id: str,
        member_id: str = "",
        *,
        client_id: str = "client",
        session_ms: int = SESSION_MS,
        rebalance_ms: int = REBALANCE_MS,
        protocol_type: str = "consumer",
        protocols: Sequence[tuple[str, bytes]] = DEFAULT_PROTOCOLS,
        instance_id: str | None = None,
        reply: Reply[JoinGroupResponse] | None = None,
    ) -> Reply[JoinGroupResponse]:
        return self._send(
            JoinGroupRequest(
                group_id=group_id,
                member_id=member_id,
                group_instance_id=instance_id,
                client_id=client_id,
                client_host="/127.0.0.1",
                session_timeout_ms=session_ms,
                rebalance_timeout_ms=rebalance_ms,
                protocol_type=protocol_type,
                protocols=[JoinGroupProtocol(name=n, metadata=m) for n, m in protocols],
            ),
            reply,
        )

    def new_member_id(self, group_id: str, client_id: str = "client", **kwargs: Any) -> str:
        """Do the first half of a join: get a member id with MEMBER_ID_REQUIRED."""
        reply = self.join(group_id, client_id=client_id, **kwargs)
        assert reply.error == ErrorCode.MEMBER_ID_REQUIRED, reply.value
        return reply.value.member_id

    def sync(
        self,
        group_id: str,
        member_id: str,
        generation: int,
        assignments: Mapping[str, bytes] | None = None,
        *,
        instance_id: str | None = None,
        protocol_type: str | None = None,
        protocol_name: str | None = None,
        reply: Reply[SyncGroupResponse] | None = None,
    ) -> Reply[SyncGroupResponse]:
        items = [
            SyncGroupAssignment(member_id=m, assignment=a) for m, a in (assignments or {}).items()
        ]
        return self._send(
            SyncGroupRequest(
                group_id=group_id,
                generation_id=generation,
                member_id=member_id,
                assignments=items,
                group_instance_id=instance_id,
                protocol_type=protocol_type,
                protocol_name=protocol_name,
            ),
            reply,
        )

    def heartbeat(
        self, group_id: str, member_id: str, generation: int, *, instance_id: str | None = None
    ) -> Reply[HeartbeatResponse]:
        return self._send(
            HeartbeatRequest(
                group_id=group_id,
                generation_id=generation,
                member_id=member_id,
                group_instance_id=instance_id,
            )
        )

    def leave(self, group_id: str, *member_ids: str) -> Reply[LeaveGroupResponse]:
        return self._send(LeaveGroupRequest(group_id=group_id, member_ids=list(member_ids)))

    def leave_members(
        self, group_id: str, *members: tuple[str, str | None]
    ) -> Reply[LeaveGroupResponse]:
        """LeaveGroup in its v3 form: (member id, group instance id) pairs."""
        leaving = [LeavingMember(member_id=m, group_instance_id=i) for m, i in members]
        return self._send(LeaveGroupRequest(group_id=group_id, members=leaving))

    def commit(
        self,
        group_id: str,
        offsets: Mapping[tuple[str, int], int | tuple[int, str]],
        *,
        member_id: str = "",
        generation: int = -1,
        instance_id: str | None = None,
        leader_epoch: int = -1,
    ) -> Reply[OffsetCommitResponse]:
        items = []
        for (topic, partition), value in offsets.items():
            offset, metadata = value if isinstance(value, tuple) else (value, "")
            items.append(
                OffsetCommitPartition(
                    topic=topic,
                    partition=partition,
                    offset=offset,
                    metadata=metadata,
                    leader_epoch=leader_epoch,
                )
            )
        return self._send(
            OffsetCommitRequest(
                group_id=group_id,
                generation_id=generation,
                member_id=member_id,
                offsets=items,
                group_instance_id=instance_id,
            )
        )

    def fetch(
        self, group_id: str, partitions: Sequence[tuple[str, int]] | None = None
    ) -> Reply[OffsetFetchResponse]:
        wanted = None if partitions is None else [TopicPartition(t, p) for t, p in partitions]
        return self._send(OffsetFetchRequest(group_id=group_id, partitions=wanted))

    def fetched(self, group_id: str) -> dict[tuple[str, int], int]:
        reply = self.fetch(group_id)
        return {(o.topic, o.partition): o.offset for o in reply.value.offsets}

    def list_groups(self) -> Reply[ListGroupsResponse]:
        return self._send(ListGroupsRequest())

    def describe(self, *group_ids: str) -> Reply[DescribeGroupsResponse]:
        return self._send(DescribeGroupsRequest(group_ids=list(group_ids)))

    def delete(self, *group_ids: str) -> Reply[DeleteGroupsResponse]:
        return self._send(DeleteGroupsRequest(group_ids=list(group_ids)))

    def init_fencing(self, fenced_id: str) -> Reply[InitFencingResponse]:
        return self._send(InitFencingRequest(fenced_id=fenced_id))

    # -- whole scenarios -----------------------------------------------------------

    def form_group(
        self, group_id: str, size: int, *, sync: bool = True, **join_kwargs: Any
    ) -> FormedGroup:
        """Bring ``size`` members into one generation; with ``sync``, make it Stable."""
        ids = [self.new_member_id(group_id, client_id=f"c{i}", **join_kwargs) for i in range(size)]
        replies = [
            self.join(group_id, member_id, client_id=f"c{i}", **join_kwargs)
            for i, member_id in enumerate(ids)
        ]
        responses = [reply.value for reply in replies]
        assert all(r.error_code == ErrorCode.NONE for r in responses), responses
        leader = responses[0].leader
        generation = responses[0].generation_id
        formed = FormedGroup(group_id, ids, leader, generation)
        if sync:
            self.sync_all(formed)
        return formed

    def form_static_group(
        self, group_id: str, instances: Sequence[str], **join_kwargs: Any
    ) -> FormedGroup:
        """Bring static members ``instances`` into one Stable generation.

        Static members join without a MEMBER_ID_REQUIRED round; they are joined while
        the first rebalance waits (the harness's config must set an initial rebalance
        delay), so one generation takes them all.
        """
        assert self.coordinator.config.group_initial_rebalance_delay_ms > 0
        replies = [
            self.join(group_id, client_id=i, instance_id=i, **join_kwargs) for i in instances
        ]
        while not all(reply.done for reply in replies):
            self.advance(self.coordinator.config.group_initial_rebalance_delay_ms)
        responses = [reply.value for reply in replies]
        assert all(r.error_code == ErrorCode.NONE for r in responses), responses
        formed = FormedGroup(
            group_id,
            [r.member_id for r in responses],
            responses[0].leader,
            responses[0].generation_id,
        )
        self.sync_all(formed)
        return formed

    def sync_all(self, formed: FormedGroup) -> dict[str, bytes]:
        """Leader assigns ``b"to-<member>"`` to everyone; returns what each member got."""
        assignments = {m: f"to-{m}".encode() for m in formed.members}
        replies = {
            formed.leader: self.sync(formed.group_id, formed.leader, formed.generation, assignments)
        }
        for follower in formed.followers:
            replies[follower] = self.sync(formed.group_id, follower, formed.generation)
        self.store.complete_all()
        result = {}
        for member, reply in replies.items():
            assert reply.error == ErrorCode.NONE, reply.value
            result[member] = reply.value.assignment
        return result


def loaded_copy(h: Harness, now_ms: int) -> tuple[GroupCoordinator, FakeStore]:
    """A second coordinator that loads what the first one stored (a new ensemble leader)."""
    store = FakeStore()
    coordinator = GroupCoordinator(store, random=Random(1))
    coordinator.begin_loading(now_ms)
    for stored in collect_groups(h.store.groups_log).values():
        coordinator.load_group(stored.group_id, stored.record, stored.offsets, now_ms)
    coordinator.finish_loading(now_ms)
    return coordinator, store
