"""The group coordinator: Kafka's GroupCoordinator as a pure core on an injected clock.

**How to drive it.** Every request method takes the request, the current time and a
``respond`` callback::

    coordinator.join_group(request, now_ms, respond)

``respond`` is called exactly once with the response: before the method returns when
the answer is known at once, or during a later call (another request, ``tick``, a
store completion, an unload) when the request is parked (a JoinGroup waiting for the
rebalance, a SyncGroup waiting for the leader, any write waiting for the store).
Responses are delivered only after the state change they report is complete, so a
callback may call straight back into the coordinator. Callbacks must not raise.

An asyncio shell gives each request a future (``respond=future.set_result``), calls
``tick(now_ms)`` whenever ``next_deadline()`` passes, and implements
:class:`~herder.coordinator.store.GroupStore` on the ensemble. The core itself reads
no clock, starts nothing, and draws member ids from the injected ``random.Random``.

**Lifecycle.** A coordinator starts INACTIVE (every request: NOT_COORDINATOR). When
its server becomes ensemble leader, the shell calls ``begin_loading``, feeds every
group and fencing epoch read from the logs to ``load_group``/``load_fencing``
(requests meanwhile: COORDINATOR_LOAD_IN_PROGRESS), then ``finish_loading``. When it
loses leadership it calls ``unload_all``: parked requests are answered NOT_COORDINATOR
and every group is Dead.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Mapping
from random import Random
from typing import Any

from herder.coordinator.admin import GroupAdmin
from herder.coordinator.config import CoordinatorConfig
from herder.coordinator.context import CoordinatorContext
from herder.coordinator.fencing import FencingCheck, FencingEpochs
from herder.coordinator.group import Group
from herder.coordinator.membership import Membership
from herder.coordinator.messages import (
    NO_MEMBER_ID,
    CoordinatorRequest,
    DeleteGroupsRequest,
    DeleteGroupsResponse,
    DescribeGroupsRequest,
    DescribeGroupsResponse,
    HeartbeatRequest,
    HeartbeatResponse,
    InitFencingRequest,
    InitFencingResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    LeaveGroupResponse,
    LeftMember,
    ListGroupsRequest,
    ListGroupsResponse,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
    SyncGroupRequest,
    SyncGroupResponse,
)
from herder.coordinator.offset_commits import OffsetCommits
from herder.coordinator.offsets import OffsetAndMetadata, TopicPartition
from herder.coordinator.rebalance import Rebalancer
from herder.coordinator.records import FencingRecord, GroupRecord
from herder.coordinator.store import GroupStore, store_error
from herder.errors import ErrorCode, NotCoordinator

log = logging.getLogger(__name__)


class CoordinatorStatus(enum.Enum):
    INACTIVE = "inactive"
    LOADING = "loading"
    ACTIVE = "active"


class GroupCoordinator:
    """Group membership, offsets and fencing epochs for every group of one ensemble."""

    def __init__(
        self,
        store: GroupStore,
        *,
        random: Random,
        config: CoordinatorConfig | None = None,
    ) -> None:
        self.config = config or CoordinatorConfig()
        self._ctx = CoordinatorContext(self.config, store, random)
        self._groups: dict[str, Group] = {}
        #: groups unloaded one by one (``unload_group``): served elsewhere now
        self._unloaded: set[str] = set()
        self._rebalancer = Rebalancer(self._ctx)
        self._membership = Membership(self._ctx, self._rebalancer)
        self._offsets = OffsetCommits(self._ctx, self._groups, self._rebalancer)
        self._admin = GroupAdmin(
            self._ctx,
            self._groups,
            self._rebalancer,
            lambda group_id: self._refusal(group_id, empty_id_allowed=True),
        )
        self._fencing = FencingEpochs()
        self._status = CoordinatorStatus.INACTIVE
        self._handlers: dict[type[Any], Callable[[Any, int, Callable[[Any], None]], None]] = {
            JoinGroupRequest: self.join_group,
            SyncGroupRequest: self.sync_group,
            HeartbeatRequest: self.heartbeat,
            LeaveGroupRequest: self.leave_group,
            OffsetCommitRequest: self.commit_offsets,
            OffsetFetchRequest: self.fetch_offsets,
            ListGroupsRequest: self.list_groups,
            DescribeGroupsRequest: self.describe_groups,
            DeleteGroupsRequest: self.delete_groups,
            InitFencingRequest: self.init_fencing,
        }

    # -- state, for the shell, metrics and tests -----------------------------------

    @property
    def status(self) -> CoordinatorStatus:
        return self._status

    @property
    def now_ms(self) -> int:
        """The latest time the coordinator has been told."""
        return self._ctx.now_ms

    def group(self, group_id: str) -> Group | None:
        return self._groups.get(group_id)

    @property
    def group_ids(self) -> list[str]:
        return sorted(self._groups)

    def next_deadline(self) -> int | None:
        """When the next timer is due: the latest moment to call ``tick``."""
        return self._ctx.timers.next_deadline()

    def tick(self, now_ms: int) -> None:
        """Let time pass: fire every delayed operation due by ``now_ms``.

        Every request method does this first as well, so a request never sees a member
        whose session has run out.
        """
        with self._ctx.step(now_ms):
            ...  # no work of its own: entering the step fires the timers due by now_ms

    def handle(
        self, request: CoordinatorRequest, now_ms: int, respond: Callable[[Any], None]
    ) -> None:
        """Dispatch any coordinator request to its method (for the wire layer)."""
        handler = self._handlers.get(type(request))
        if handler is None:
            raise TypeError(f"not a group coordinator request: {type(request).__name__}")
        handler(request, now_ms, respond)

    # -- lifecycle -----------------------------------------------------------------

    def begin_loading(self, now_ms: int) -> None:
        if self._status is not CoordinatorStatus.INACTIVE:
            raise RuntimeError(f"cannot begin loading while {self._status.value}")
        with self._ctx.step(now_ms):
            self._status = CoordinatorStatus.LOADING
            log.info("group coordinator loading")

    def load_group(
        self,
        group_id: str,
        record: GroupRecord | None,
        offsets: Mapping[TopicPartition, OffsetAndMetadata],
        now_ms: int,
    ) -> None:
        """Take a group read back from ``_groups`` (see ``records.collect_groups``).

        Its members get a full session from ``now_ms``: they may have heartbeated to
        the previous coordinator a moment ago, and must not be expired for it. A group
        is loaded once: loading it again would leave the first copy's timers running
        against a group nobody serves, so it is refused. A group stored with more
        members than ``group.max.size`` allows now rebalances at once, as in Kafka: the
        members that rejoin first keep their places, the others are refused.
        """
        if self._status is not CoordinatorStatus.LOADING:
            raise RuntimeError(f"cannot load group {group_id} while {self._status.value}")
        if group_id in self._groups:
            raise ValueError(f"group {group_id} is already loaded")
        with self._ctx.step(now_ms):
            if record is not None and record.group_id != group_id:
                raise ValueError(f"record of group {record.group_id} loaded as {group_id}")
            if record is not None:
                group = Group.from_record(record)
            else:
                # only offsets were stored (admin commits): empty since before any of them
                since = min((o.commit_timestamp_ms for o in offsets.values()), default=now_ms)
                group = Group(group_id, since)
            group.offsets.load(offsets)
            self._groups[group_id] = group
            self._unloaded.discard(group_id)
            self._rebalancer.start_sessions(group)
            self._rebalancer.rebalance_if_over_capacity(group)
            log.info(
                "loaded group %s: %s, generation %d, %d members, %d offsets",
                group_id,
                group.state.value,
                group.generation_id,
                len(group.members),
                len(group.offsets),
            )

    def load_fencing(self, fenced_id: str, epoch: int, zxid: int | None) -> None:
        """Take a fencing epoch read back from ``_fencing`` with the zxid that wrote it."""
        if self._status is not CoordinatorStatus.LOADING:
            raise RuntimeError(f"cannot load fencing epochs while {self._status.value}")
        self._fencing.load(fenced_id, epoch, zxid)

    def finish_loading(self, now_ms: int) -> None:
        if self._status is not CoordinatorStatus.LOADING:
            raise RuntimeError(f"cannot finish loading while {self._status.value}")
        with self._ctx.step(now_ms):
            self._status = CoordinatorStatus.ACTIVE
            self._offsets.start_expiry()
            log.info(
                "group coordinator active: %d groups, %d fencing ids",
                len(self._groups),
                len(self._fencing),
            )

    def unload_group(self, group_id: str) -> None:
        """Stop serving one group: its parked requests get NOT_COORDINATOR, it is Dead.

        From then on every request for it is answered NOT_COORDINATOR (as Kafka does
        for a group whose partition emigrated), rather than starting it afresh at
        generation 0 beside the copy its new coordinator serves. Loading it again, or
        ``unload_all``, ends that.
        """
        with self._ctx.step():
            self._unloaded.add(group_id)
            group = self._groups.pop(group_id, None)
            if group is not None:
                self._rebalancer.retire(group, ErrorCode.NOT_COORDINATOR)
                log.info("unloaded group %s", group_id)

    def unload_all(self) -> None:
        """Stop being the coordinator (leadership lost): every group Dead, all answered."""
        with self._ctx.step():
            for group_id in list(self._groups):
                group = self._groups.pop(group_id)
                self._rebalancer.retire(group, ErrorCode.NOT_COORDINATOR)
            self._unloaded.clear()
            # a fresh registry: a bump completing after this lands in the old one
            self._fencing = FencingEpochs()
            self._ctx.timers.clear()
            self._status = CoordinatorStatus.INACTIVE
            log.info("group coordinator inactive: all groups unloaded")

    def _refusal(self, group_id: str | None, *, empty_id_allowed: bool = False) -> ErrorCode | None:
        """Why this coordinator cannot serve a request for ``group_id`` now (None if it can).

        In Kafka's order (``validateGroupStatus``): the group id first, then whether
        this coordinator is active, loading, and serving that group. The group id "" is
        refused only where a group means a membership (JoinGroup, SyncGroup, Heartbeat,
        LeaveGroup). As in Kafka, requests about a group's stored state accept it
        (``empty_id_allowed``): OffsetCommit and OffsetFetch, for clients that keep
        offsets without a group, and DescribeGroups and DeleteGroups, so that state can
        be seen and removed.
        """
        if group_id is not None and not group_id and not empty_id_allowed:
            return ErrorCode.INVALID_GROUP_ID
        if self._status is CoordinatorStatus.INACTIVE:
            return ErrorCode.NOT_COORDINATOR
        if self._status is CoordinatorStatus.LOADING:
            return ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
        if group_id in self._unloaded:
            return ErrorCode.NOT_COORDINATOR
        return None

    # -- membership ----------------------------------------------------------------

    def join_group(
        self, request: JoinGroupRequest, now_ms: int, respond: Callable[[JoinGroupResponse], None]
    ) -> None:
        with self._ctx.step(now_ms):
            error = self._refusal(request.group_id)
            timeout = request.session_timeout_ms
            if error is None and not (
                self.config.group_min_session_timeout_ms
                <= timeout
                <= self.config.group_max_session_timeout_ms
            ):
                error = ErrorCode.INVALID_SESSION_TIMEOUT
            group = self._groups.get(request.group_id)
            if error is None and group is None and request.member_id != NO_MEMBER_ID:
                error = ErrorCode.UNKNOWN_MEMBER_ID
            if error is not None:
                response = JoinGroupResponse(error_code=error, member_id=request.member_id)
                self._ctx.reply(respond, response)
                return
            if group is None:
                group = self._groups[request.group_id] = Group(request.group_id, now_ms)
                self._membership.join(group, request, respond)
                if group.is_vacant:
                    # refused before anyone got in: do not list a group nobody is in
                    del self._groups[request.group_id]
            else:
                self._membership.join(group, request, respond)

    def sync_group(
        self, request: SyncGroupRequest, now_ms: int, respond: Callable[[SyncGroupResponse], None]
    ) -> None:
        with self._ctx.step(now_ms):
            error = self._refusal(request.group_id)
            if error == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS:
                # the rebalance this sync belongs to was lost with the old coordinator;
                # rejoining is what the member must do, and it needs no rediscovery
                error = ErrorCode.REBALANCE_IN_PROGRESS
            group = self._groups.get(request.group_id)
            if error is None and group is not None:
                self._membership.sync(group, request, respond)
            else:
                error = error or ErrorCode.UNKNOWN_MEMBER_ID
                self._ctx.reply(respond, SyncGroupResponse(error_code=error))

    def heartbeat(
        self, request: HeartbeatRequest, now_ms: int, respond: Callable[[HeartbeatResponse], None]
    ) -> None:
        with self._ctx.step(now_ms):
            error = self._refusal(request.group_id)
            if error == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS:
                # as the seed does: the member's group is about to be loaded with it
                error = ErrorCode.NONE
            group = self._groups.get(request.group_id)
            if error is None:
                error = (
                    ErrorCode.UNKNOWN_MEMBER_ID
                    if group is None
                    else self._membership.heartbeat(group, request)
                )
            self._ctx.reply(respond, HeartbeatResponse(error_code=error))

    def leave_group(
        self,
        request: LeaveGroupRequest,
        now_ms: int,
        respond: Callable[[LeaveGroupResponse], None],
    ) -> None:
        """Remove each named member; one unknown member does not stop the others.

        As in Kafka's LeaveGroup v3+, the top-level code is only for a request that
        failed as a whole (not the coordinator, loading, invalid group id); whether
        each member left is in its own result.
        """
        with self._ctx.step(now_ms):
            error = self._refusal(request.group_id)
            leaving = request.leaving()
            if error is not None:
                members = [
                    LeftMember(
                        member_id=m.member_id,
                        group_instance_id=m.group_instance_id,
                        error_code=error,
                    )
                    for m in leaving
                ]
                self._ctx.reply(respond, LeaveGroupResponse(error_code=error, members=members))
                return
            group = self._groups.get(request.group_id)
            members = [
                LeftMember(
                    member_id=m.member_id,
                    group_instance_id=m.group_instance_id,
                    error_code=ErrorCode.UNKNOWN_MEMBER_ID
                    if group is None
                    else self._membership.leave(group, m),
                )
                for m in leaving
            ]
            self._ctx.reply(respond, LeaveGroupResponse(members=members))

    # -- offsets -------------------------------------------------------------------

    def commit_offsets(
        self,
        request: OffsetCommitRequest,
        now_ms: int,
        respond: Callable[[OffsetCommitResponse], None],
    ) -> None:
        with self._ctx.step(now_ms):
            error = self._refusal(request.group_id, empty_id_allowed=True)
            if error is not None:
                self._ctx.reply(respond, self._offsets.refuse_commit(request, error))
            else:
                self._offsets.commit(request, respond)

    def fetch_offsets(
        self,
        request: OffsetFetchRequest,
        now_ms: int,
        respond: Callable[[OffsetFetchResponse], None],
    ) -> None:
        with self._ctx.step(now_ms):
            error = self._refusal(request.group_id, empty_id_allowed=True)
            if error is not None:
                self._ctx.reply(respond, OffsetFetchResponse(error_code=error))
            else:
                self._ctx.reply(respond, self._offsets.fetch(request))

    # -- administration ------------------------------------------------------------

    def list_groups(
        self,
        request: ListGroupsRequest,
        now_ms: int,
        respond: Callable[[ListGroupsResponse], None],
    ) -> None:
        with self._ctx.step(now_ms):
            self._ctx.reply(respond, self._admin.list_groups(request))

    def describe_groups(
        self,
        request: DescribeGroupsRequest,
        now_ms: int,
        respond: Callable[[DescribeGroupsResponse], None],
    ) -> None:
        with self._ctx.step(now_ms):
            self._ctx.reply(respond, self._admin.describe_groups(request))

    def delete_groups(
        self,
        request: DeleteGroupsRequest,
        now_ms: int,
        respond: Callable[[DeleteGroupsResponse], None],
    ) -> None:
        with self._ctx.step(now_ms):
            self._admin.delete_groups(request, respond)

    # -- fencing -------------------------------------------------------------------

    def init_fencing(
        self,
        request: InitFencingRequest,
        now_ms: int,
        respond: Callable[[InitFencingResponse], None],
    ) -> None:
        """Bump the fencing epoch of ``request.fenced_id``; answered once it is stored."""
        with self._ctx.step(now_ms):
            fenced_id = request.fenced_id
            error = self._refusal(None)
            if error is None and not fenced_id:
                error = ErrorCode.INVALID_REQUEST
            if error is not None:
                response = InitFencingResponse(error_code=error, fenced_id=fenced_id)
                self._ctx.reply(respond, response)
                return
            fencing = self._fencing
            epoch = fencing.issue(fenced_id)

            def on_stored(error: ErrorCode, zxid: int | None) -> None:
                if error != ErrorCode.NONE:
                    log.warning(
                        "fencing epoch %d of %s not stored: %s", epoch, fenced_id, error.name
                    )
                    response = InitFencingResponse(
                        error_code=store_error(error), fenced_id=fenced_id
                    )
                else:
                    fencing.confirm(fenced_id, epoch, zxid)
                    log.info("%s now holds fencing epoch %d", fenced_id, epoch)
                    response = InitFencingResponse(fenced_id=fenced_id, epoch=epoch)
                self._ctx.reply(respond, response)

            record = FencingRecord(fenced_id=fenced_id, epoch=epoch)
            completion = self._ctx.completion(on_stored)
            self._ctx.write(lambda: self._ctx.store.store_fencing(record, completion))

    def fencing_check(self, fenced_id: str, epoch: int) -> FencingCheck:
        """The ensemble check a writer holding ``epoch`` puts into its transaction.

        Raises ``Fenced`` if ``epoch`` is not the current one, ``NotCoordinator`` if this
        coordinator is not serving.
        """
        if self._status is not CoordinatorStatus.ACTIVE:
            raise NotCoordinator(f"the group coordinator is {self._status.value}")
        return self._fencing.check(fenced_id, epoch)

    def fencing_epoch(self, fenced_id: str) -> int | None:
        current = self._fencing.current(fenced_id)
        return current.epoch if current else None
