"""JoinGroup, SyncGroup, Heartbeat and LeaveGroup on one group (the seed's ``doJoinGroup``…).

The coordinator has already checked that it serves the group and found (or made) it;
what is left is the seed's decision table for each request in each group state. The
delayed operations those decisions start or complete live in ``rebalance``.
"""

from __future__ import annotations

import logging

from herder.coordinator.context import CoordinatorContext
from herder.coordinator.group import Group, GroupState
from herder.coordinator.member import (
    JoinCallback,
    Member,
    SupportedProtocol,
    SyncCallback,
    protocols_of,
)
from herder.coordinator.messages import (
    NO_MEMBER_ID,
    HeartbeatRequest,
    JoinGroupRequest,
    JoinGroupResponse,
    SyncGroupRequest,
    SyncGroupResponse,
)
from herder.coordinator.rebalance import Rebalancer
from herder.coordinator.store import group_write_error
from herder.errors import ErrorCode

log = logging.getLogger(__name__)

PREPARING = GroupState.PREPARING_REBALANCE
COMPLETING = GroupState.COMPLETING_REBALANCE
STABLE = GroupState.STABLE


class Membership:
    def __init__(self, context: CoordinatorContext, rebalancer: Rebalancer) -> None:
        self._ctx = context
        self._rebalancer = rebalancer

    # -- JoinGroup -----------------------------------------------------------------

    def join(self, group: Group, request: JoinGroupRequest, respond: JoinCallback) -> None:
        protocols = protocols_of(request.protocols)
        names = [name for name, _ in protocols]
        member_id = request.member_id
        if member_id == NO_MEMBER_ID:
            self._join_without_id(group, request, names, respond)
        elif not group.supports_protocols(request.protocol_type, names):
            self._join_error(respond, member_id, ErrorCode.INCONSISTENT_GROUP_PROTOCOL)
        elif member_id in group.pending_members:
            self._rebalancer.withdraw_member_id(group, member_id)
            self._add_member_and_rebalance(group, member_id, request, protocols, respond)
        elif not group.has(member_id):
            self._join_error(respond, member_id, ErrorCode.UNKNOWN_MEMBER_ID)
        else:
            self._rejoin(group, group.get(member_id), request, protocols, respond)
        self._rebalancer.maybe_complete_join(group)

    def _join_without_id(
        self, group: Group, request: JoinGroupRequest, names: list[str], respond: JoinCallback
    ) -> None:
        """Hand out a member id to rejoin with (KIP-394); the group only counts it for now.

        Making the member come back with the id before it joins means a client that
        lost the response cannot leave an orphan member behind: an unused id is
        forgotten after the session timeout.
        """
        if group.size >= self._ctx.config.group_max_size:
            log.info("group %s is full (%d): refused a new member", group.group_id, group.size)
            self._join_error(respond, NO_MEMBER_ID, ErrorCode.GROUP_MAX_SIZE_REACHED)
        elif not group.supports_protocols(request.protocol_type, names):
            self._join_error(respond, NO_MEMBER_ID, ErrorCode.INCONSISTENT_GROUP_PROTOCOL)
        else:
            member_id = self._rebalancer.issue_member_id(
                group, request.client_id, request.session_timeout_ms
            )
            self._join_error(respond, member_id, ErrorCode.MEMBER_ID_REQUIRED)

    def _rejoin(
        self,
        group: Group,
        member: Member,
        request: JoinGroupRequest,
        protocols: list[SupportedProtocol],
        respond: JoinCallback,
    ) -> None:
        unchanged = member.matches(protocols)
        is_leader = member.member_id == group.leader_id
        if (group.is_in(COMPLETING) and unchanged) or (
            group.is_in(STABLE) and unchanged and not is_leader
        ):
            # it lost the join response, or it is a follower with nothing new: tell it
            # the current generation, so it can go on to SyncGroup
            self._ctx.reply(respond, group.join_response(member.member_id))
        else:
            # new metadata, a rejoin during the rebalance, or the leader asking for a
            # rebalance (it may see changes its metadata does not show, such as new topics)
            self._update_member_and_rebalance(group, member, request, protocols, respond)

    def _add_member_and_rebalance(
        self,
        group: Group,
        member_id: str,
        request: JoinGroupRequest,
        protocols: list[SupportedProtocol],
        respond: JoinCallback,
    ) -> None:
        member = Member(
            member_id=member_id,
            client_id=request.client_id,
            client_host=request.client_host,
            session_timeout_ms=request.session_timeout_ms,
            rebalance_timeout_ms=request.rebalance_timeout_ms,
            protocol_type=request.protocol_type,
            protocols=protocols,
            awaiting_join=respond,
        )
        group.add(member)
        if group.is_in(PREPARING):
            group.new_member_added = True
        log.info("group %s: member %s joined", group.group_id, member_id)
        self._rebalancer.maybe_prepare_rebalance(group, f"member {member_id} joined")

    def _update_member_and_rebalance(
        self,
        group: Group,
        member: Member,
        request: JoinGroupRequest,
        protocols: list[SupportedProtocol],
        respond: JoinCallback,
    ) -> None:
        superseded = group.park_join(member, respond)
        if superseded is not None:
            # every request is answered exactly once: the one this rejoin replaces too
            self._join_error(superseded, member.member_id, ErrorCode.REBALANCE_IN_PROGRESS)
        group.update_protocols(member, protocols)
        member.session_timeout_ms = request.session_timeout_ms
        member.rebalance_timeout_ms = request.rebalance_timeout_ms
        self._rebalancer.maybe_prepare_rebalance(group, f"member {member.member_id} rejoined")

    def _join_error(self, respond: JoinCallback, member_id: str, error: ErrorCode) -> None:
        self._ctx.reply(respond, JoinGroupResponse(error_code=error, member_id=member_id))

    # -- SyncGroup -----------------------------------------------------------------

    def sync(self, group: Group, request: SyncGroupRequest, respond: SyncCallback) -> None:
        member_id = request.member_id
        if not group.has(member_id):
            self._sync_error(respond, ErrorCode.UNKNOWN_MEMBER_ID)
        elif request.generation_id != group.generation_id:
            self._sync_error(respond, ErrorCode.ILLEGAL_GENERATION)
        elif group.is_in(PREPARING):
            self._sync_error(respond, ErrorCode.REBALANCE_IN_PROGRESS)
        elif group.is_in(COMPLETING):
            member = group.get(member_id)
            self._rebalancer.mark_synced(group, member_id)
            if member.awaiting_sync is not None:
                self._sync_error(member.awaiting_sync, ErrorCode.REBALANCE_IN_PROGRESS)
            member.awaiting_sync = respond
            if member_id == group.leader_id:
                self._store_assignment(group, request)
        elif group.is_in(STABLE):
            member = group.get(member_id)
            self._rebalancer.mark_synced(group, member_id)
            self._ctx.reply(respond, SyncGroupResponse(assignment=member.assignment))
            self._rebalancer.schedule_session(group, member)
        else:
            self._sync_error(respond, ErrorCode.UNKNOWN_MEMBER_ID)

    def _store_assignment(self, group: Group, request: SyncGroupRequest) -> None:
        """Persist the leader's assignment; the group turns Stable once it is stored.

        Members the leader left out get an empty assignment; entries for strangers are
        dropped.
        """
        given = {item.member_id: item.assignment for item in request.assignments}
        assignments = {member_id: given.get(member_id, b"") for member_id in group.member_ids}
        generation = group.generation_id
        record = group.to_record(assignments, self._ctx.now_ms)
        log.info("group %s: assignment received for generation %d", group.group_id, generation)

        def on_stored(error: ErrorCode, zxid: int | None) -> None:
            # the group may have moved on (a join, a leave, an unload) meanwhile
            if not (group.is_in(COMPLETING) and group.generation_id == generation):
                return
            if error != ErrorCode.NONE:
                log.warning(
                    "group %s: storing generation %d failed: %s",
                    group.group_id,
                    generation,
                    error.name,
                )
                self._rebalancer.fail_pending_syncs(group, group_write_error(error))
                reason = f"storing the assignment failed: {error.name}"
                self._rebalancer.maybe_prepare_rebalance(group, reason)
                return
            for member in group.members:
                member.assignment = assignments[member.member_id]
            self._rebalancer.answer_pending_syncs(group, ErrorCode.NONE)
            group.transition_to(STABLE, self._ctx.now_ms)
            log.info("group %s is stable at generation %d", group.group_id, generation)

        completion = self._ctx.completion(on_stored)
        self._ctx.write(lambda: self._ctx.store.store_group(group.group_id, record, completion))

    def _sync_error(self, respond: SyncCallback, error: ErrorCode) -> None:
        self._ctx.reply(respond, SyncGroupResponse(error_code=error))

    # -- Heartbeat and LeaveGroup ----------------------------------------------------

    def heartbeat(self, group: Group, request: HeartbeatRequest) -> ErrorCode:
        """Today's Kafka answers: the member and its generation are checked first.

        Only a member of the current generation shows it is alive (its session starts
        over); a stale or unknown one is told so and gains nothing. During
        CompletingRebalance a current member hears NONE: it has its join response and
        is on its way to SyncGroup (or already waiting there), so there is nothing to
        rejoin for.
        """
        if group.is_in(GroupState.EMPTY, GroupState.DEAD) or not group.has(request.member_id):
            return ErrorCode.UNKNOWN_MEMBER_ID
        if request.generation_id != group.generation_id:
            return ErrorCode.ILLEGAL_GENERATION
        self._rebalancer.schedule_session(group, group.get(request.member_id))
        return ErrorCode.REBALANCE_IN_PROGRESS if group.is_in(PREPARING) else ErrorCode.NONE

    def leave(self, group: Group, member_id: str) -> ErrorCode:
        if group.is_in(GroupState.DEAD):
            return ErrorCode.UNKNOWN_MEMBER_ID
        if member_id in group.pending_members:
            self._rebalancer.withdraw_member_id(group, member_id)
            self._rebalancer.maybe_complete_join(group)
            return ErrorCode.NONE
        if not group.has(member_id):
            return ErrorCode.UNKNOWN_MEMBER_ID
        log.info("group %s: member %s left", group.group_id, member_id)
        self._rebalancer.on_member_failure(group, group.get(member_id), f"{member_id} left")
        return ErrorCode.NONE
