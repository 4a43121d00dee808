"""JoinGroup, SyncGroup, Heartbeat and LeaveGroup on one group (the seed's ``doJoinGroup``…).

The coordinator has already checked that it serves the group and found (or made) it;
what is left is the seed's decision table for each request in each group state, as
today's Kafka has it: ``group.max.size`` checked on every join (a member beyond it is
refused and, if it was a member, removed), static membership (KIP-345), and a member
that names a group instance id that now belongs to another member id answered
FENCED_INSTANCE_ID everywhere. The delayed operations those decisions start or
complete live in ``rebalance``.

A static member that restarts rejoins with its instance id and no member id. It takes
its member over under a new member id (the old id is fenced from then on) and, if the
group is Stable and its protocol would not change, gets its assignment back without a
rebalance once the group's record with the new id is stored. Joining while the group
completes a rebalance starts another, since the leader may already be assigning to the
old id; joining while the group prepares one just takes part in it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

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
    LeavingMember,
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
        instance_id = request.group_instance_id
        if not self._admits(group, member_id, instance_id):
            self._refuse_over_capacity(group, member_id)
            self._join_error(respond, NO_MEMBER_ID, ErrorCode.GROUP_MAX_SIZE_REACHED)
        elif not group.supports_protocols(request.protocol_type, names):
            self._join_error(respond, member_id, ErrorCode.INCONSISTENT_GROUP_PROTOCOL)
        elif member_id == NO_MEMBER_ID and instance_id is not None:
            self._join_static_without_id(group, request, protocols, respond)
        elif member_id == NO_MEMBER_ID:
            self._join_without_id(group, request, respond)
        elif member_id in group.pending_members:
            self._rebalancer.withdraw_member_id(group, member_id)
            if instance_id is not None:
                # ids handed out with MEMBER_ID_REQUIRED are dynamic members' ids; a
                # static member joins without one
                self._join_error(respond, member_id, ErrorCode.UNKNOWN_MEMBER_ID)
            else:
                self._add_member_and_rebalance(group, member_id, request, protocols, respond)
        elif (error := group.validate_member(member_id, instance_id)) is not None:
            self._join_error(respond, member_id, error)
        else:
            self._rejoin(group, group.get(member_id), request, protocols, respond)
        self._rebalancer.maybe_complete_join(group)

    def _admits(self, group: Group, member_id: str, instance_id: str | None) -> bool:
        """Whether ``group.max.size`` lets this join in (Kafka's ``acceptJoiningMember``).

        While the group prepares a rebalance, the members already rejoined are the next
        generation: a member that has not rejoined yet gets in only while they are
        fewer than the limit, so a group over it (loaded so, or the limit lowered) sheds
        its last joiners. Otherwise a member the group knows always gets in, and a new
        one only below the limit. A restarted static member taking its own place over
        is the member it replaces (Kafka would count it as new, and refuse it in a full
        group, which could then never restart a member). herder also counts the member
        ids it has handed out and not seen back, so that MEMBER_ID_REQUIRED answers
        cannot promise more places than there are.
        """
        limit = self._ctx.config.group_max_size
        if member_id == NO_MEMBER_ID:
            if instance_id is None and group.size >= limit:
                return False
            member_id = group.static_member_id(instance_id) or NO_MEMBER_ID
        known = group.get(member_id) if group.has(member_id) else None
        if group.is_in(PREPARING):
            rejoined = known is not None and known.is_awaiting_join
            return rejoined or group.awaiting_join_count < limit
        if group.is_in(COMPLETING, STABLE):
            return known is not None or len(group.members) < limit
        return True

    def _refuse_over_capacity(self, group: Group, member_id: str) -> None:
        log.info(
            "group %s is full (group.max.size %d): refused %s",
            group.group_id,
            self._ctx.config.group_max_size,
            member_id or "a new member",
        )
        if member_id in group.pending_members:
            self._rebalancer.withdraw_member_id(group, member_id)
        elif group.has(member_id):
            self._rebalancer.remove_member(group, group.get(member_id), ErrorCode.UNKNOWN_MEMBER_ID)

    def _join_without_id(
        self, group: Group, request: JoinGroupRequest, respond: JoinCallback
    ) -> None:
        """Hand out a member id to rejoin with (KIP-394); the group only counts it for now.

        Making the member come back with the id before it joins means a client that
        lost the response cannot leave an orphan member behind: an unused id is
        forgotten after the session timeout.
        """
        member_id = self._rebalancer.issue_member_id(
            group, request.client_id, request.session_timeout_ms
        )
        self._join_error(respond, member_id, ErrorCode.MEMBER_ID_REQUIRED)

    def _join_static_without_id(
        self,
        group: Group,
        request: JoinGroupRequest,
        protocols: list[SupportedProtocol],
        respond: JoinCallback,
    ) -> None:
        """A static member joins at once (no MEMBER_ID_REQUIRED round): its instance id
        already names it, and a second process with the same id replaces the first."""
        instance_id = request.group_instance_id
        assert instance_id is not None
        new_member_id = self._ctx.new_member_id(instance_id)
        if group.static_member_id(instance_id) is None:
            self._add_member_and_rebalance(group, new_member_id, request, protocols, respond)
        else:
            self._replace_static_member(group, new_member_id, request, protocols, respond)

    def _replace_static_member(
        self,
        group: Group,
        new_member_id: str,
        request: JoinGroupRequest,
        protocols: list[SupportedProtocol],
        respond: JoinCallback,
    ) -> None:
        """A static member restarted: it takes its member over under ``new_member_id``."""
        instance_id = request.group_instance_id
        assert instance_id is not None
        old_member_id = group.static_member_id(instance_id)
        assert old_member_id is not None
        previous_leader = group.leader_id
        member, fenced_join, fenced_sync = group.replace_static_member(instance_id, new_member_id)
        log.info(
            "group %s: static member %s rejoined in %s; member %s replaces %s",
            group.group_id,
            instance_id,
            group.state.value,
            new_member_id,
            old_member_id,
        )
        if fenced_join is not None:
            self._join_error(fenced_join, old_member_id, ErrorCode.FENCED_INSTANCE_ID)
        if fenced_sync is not None:
            self._sync_error(fenced_sync, ErrorCode.FENCED_INSTANCE_ID)
        before = _MemberSettings.of(member)
        group.update_protocols(member, protocols)
        member.session_timeout_ms = request.session_timeout_ms
        member.rebalance_timeout_ms = request.rebalance_timeout_ms
        group.park_join(member, respond)
        self._rebalancer.schedule_session(group, member)
        if group.is_in(STABLE):
            if group.select_protocol() == group.protocol:
                self._store_replacement(group, member, old_member_id, before, previous_leader)
            else:
                reason = f"static member {instance_id} rejoined with a change of protocol"
                self._rebalancer.maybe_prepare_rebalance(group, reason)
        elif group.is_in(COMPLETING):
            # the leader may be assigning to the old member id right now: start over
            reason = f"static member {instance_id} rejoined during CompletingRebalance"
            self._rebalancer.maybe_prepare_rebalance(group, reason)

    def _store_replacement(
        self,
        group: Group,
        member: Member,
        old_member_id: str,
        before: _MemberSettings,
        previous_leader: str | None,
    ) -> None:
        """Store the group with the new member id, then give the member its place back.

        If the write fails, the replacement is undone (the log still names the old id)
        and the new process is told the write's error, to join again. If the group
        moved on meanwhile (a rebalance with the member in it, another restart of the
        same instance, an unload), the join is answered there instead.
        """
        respond = member.awaiting_join
        instance_id = member.group_instance_id
        assert respond is not None and instance_id is not None
        generation = group.generation_id
        assignments = {m.member_id: m.assignment for m in group.members}
        record = group.to_record(assignments, self._ctx.now_ms)

        def on_stored(error: ErrorCode, zxid: int | None) -> None:
            still_waiting = member.awaiting_join is respond and group.has(member.member_id)
            if not (still_waiting and group.is_in(STABLE) and group.generation_id == generation):
                return
            group.unpark_join(member)
            if error != ErrorCode.NONE:
                log.warning(
                    "group %s: storing static member %s as %s failed: %s; %s keeps it",
                    group.group_id,
                    instance_id,
                    member.member_id,
                    error.name,
                    old_member_id,
                )
                before.restore(group, member)
                group.replace_static_member(instance_id, old_member_id)
                self._rebalancer.schedule_session(group, member)
                response = group.join_response(NO_MEMBER_ID)
                response.error_code = group_write_error(error)
                response.leader = previous_leader or ""
                self._ctx.reply(respond, response)
                return
            # the leader learns it leads, but the assignment stands: nothing to assign
            self._ctx.reply(respond, group.join_response(member.member_id, skip_assignment=True))
            self._rebalancer.schedule_session(group, member)

        completion = self._ctx.completion(on_stored)
        self._ctx.write(lambda: self._ctx.store.store_group(group.group_id, record, completion))

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
            group_instance_id=request.group_instance_id,
            awaiting_join=respond,
        )
        group.add(member)
        self._rebalancer.start_new_member_timer(group, member)
        if group.is_in(PREPARING):
            group.new_member_added = True
        if member.is_static:
            log.info(
                "group %s: static member %s joined as %s",
                group.group_id,
                member.group_instance_id,
                member_id,
            )
        else:
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
        error = self._sync_refusal(group, request)
        if error is not None:
            self._sync_error(respond, error)
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
            response = SyncGroupResponse(
                assignment=member.assignment,
                protocol_type=group.protocol_type or "",
                protocol_name=group.protocol or "",
            )
            self._ctx.reply(respond, response)
            self._rebalancer.schedule_session(group, member)
        else:
            self._sync_error(respond, ErrorCode.UNKNOWN_MEMBER_ID)

    @staticmethod
    def _sync_refusal(group: Group, request: SyncGroupRequest) -> ErrorCode | None:
        """Member (and instance), then generation, then KIP-559's protocol check."""
        error = group.validate_member(request.member_id, request.group_instance_id)
        if error is not None:
            return error
        if request.generation_id != group.generation_id:
            return ErrorCode.ILLEGAL_GENERATION
        if request.protocol_type is not None and request.protocol_type != group.protocol_type:
            return ErrorCode.INCONSISTENT_GROUP_PROTOCOL
        if request.protocol_name is not None and request.protocol_name != group.protocol:
            return ErrorCode.INCONSISTENT_GROUP_PROTOCOL
        return None

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
        if group.is_in(GroupState.EMPTY, GroupState.DEAD):
            return ErrorCode.UNKNOWN_MEMBER_ID
        error = group.validate_member(request.member_id, request.group_instance_id)
        if error is not None:
            return error
        if request.generation_id != group.generation_id:
            return ErrorCode.ILLEGAL_GENERATION
        self._rebalancer.schedule_session(group, group.get(request.member_id))
        return ErrorCode.REBALANCE_IN_PROGRESS if group.is_in(PREPARING) else ErrorCode.NONE

    def leave(self, group: Group, leaving: LeavingMember) -> ErrorCode:
        """Remove one member, as Kafka's LeaveGroup v3+ does.

        An instance id without a member id removes whoever holds it now (an operator
        removing a static member for good); with a member id, it must be the current
        holder's, else FENCED_INSTANCE_ID. A member id alone removes that member, static
        or not: a static member that means to come back simply does not send
        LeaveGroup (as Kafka's consumer does not), so its place waits for it until its
        session runs out.
        """
        if group.is_in(GroupState.DEAD):
            return ErrorCode.UNKNOWN_MEMBER_ID
        member_id, instance_id = leaving.member_id, leaving.group_instance_id
        if member_id == NO_MEMBER_ID:
            current = group.static_member_id(instance_id)
            if current is None:
                return ErrorCode.UNKNOWN_MEMBER_ID
            member_id = current
        elif member_id in group.pending_members:
            self._rebalancer.withdraw_member_id(group, member_id)
            self._rebalancer.maybe_complete_join(group)
            return ErrorCode.NONE
        else:
            error = group.validate_member(member_id, instance_id)
            if error is not None:
                return error
        log.info("group %s: member %s left", group.group_id, member_id)
        self._rebalancer.on_member_failure(group, group.get(member_id), f"{member_id} left")
        return ErrorCode.NONE


@dataclass(frozen=True, slots=True)
class _MemberSettings:
    """What a static member's rejoin changes, to put back if the change is not stored."""

    protocols: list[SupportedProtocol]
    session_timeout_ms: int
    rebalance_timeout_ms: int

    @classmethod
    def of(cls, member: Member) -> _MemberSettings:
        return cls(list(member.protocols), member.session_timeout_ms, member.rebalance_timeout_ms)

    def restore(self, group: Group, member: Member) -> None:
        group.update_protocols(member, self.protocols)
        member.session_timeout_ms = self.session_timeout_ms
        member.rebalance_timeout_ms = self.rebalance_timeout_ms
