"""The delayed operations of the seed's purgatories, and the rebalances they drive.

All of them are timers on the coordinator's one queue:

* the **delayed join** of a group in PreparingRebalance: completes as soon as every
  member (and every holder of a freshly issued member id) has rejoined, or at the
  largest rebalance timeout, when the dynamic members that did not rejoin are removed
  (static members stay, as in Kafka: they may be restarting, and coming back would
  then cost no rebalance; they are removed if they do not sync, or when their session
  ends); for an Empty group it first waits out ``group.initial.rebalance.delay.ms``
  (every Empty group, as in Kafka, not only one that never had a generation: members
  coming back to an emptied group arrive one by one just the same);
* the **session timer** of each member (the seed's delayed heartbeat): expires the
  member unless it heartbeats, commits, or is awaiting a join or sync response; a
  member not yet in any generation has ``group.new.member.join.timeout.ms`` instead,
  and is expired when it runs out even while its join is parked (KIP-394);
* the **pending member** timer of each id handed out with MEMBER_ID_REQUIRED: forgets
  the id if nobody joins with it within the session timeout;
* the **pending sync** deadline after a join completes: members that have not sent
  SyncGroup within the rebalance timeout are removed and the group rebalances (a
  leader that never syncs would otherwise strand its followers forever).
"""

from __future__ import annotations

import logging

from herder.coordinator.context import CoordinatorContext
from herder.coordinator.group import Group, GroupState
from herder.coordinator.member import Member
from herder.coordinator.messages import JoinGroupResponse, SyncGroupResponse
from herder.errors import ErrorCode

log = logging.getLogger(__name__)

PREPARING = GroupState.PREPARING_REBALANCE
COMPLETING = GroupState.COMPLETING_REBALANCE
STABLE = GroupState.STABLE


class Rebalancer:
    def __init__(self, context: CoordinatorContext) -> None:
        self._ctx = context

    # -- the delayed join ----------------------------------------------------------

    def maybe_prepare_rebalance(self, group: Group, reason: str) -> None:
        if group.can_rebalance:
            self._prepare_rebalance(group, reason)

    def _prepare_rebalance(self, group: Group, reason: str) -> None:
        if group.is_in(COMPLETING):
            # members waiting for this generation's assignment must rejoin instead
            self.fail_pending_syncs(group, ErrorCode.REBALANCE_IN_PROGRESS)
        self._cancel_sync_deadline(group)
        delay = self._ctx.config.group_initial_rebalance_delay_ms
        from_empty = group.is_in(GroupState.EMPTY) and delay > 0
        group.transition_to(PREPARING, self._ctx.now_ms)
        group.rebalance_reason = reason
        log.info(
            "group %s preparing to rebalance from generation %d: %s",
            group.group_id,
            group.generation_id,
            reason,
        )
        if from_empty:
            # wait for more members before an empty group's next generation (Kafka's
            # InitialDelayedJoin), extending while members keep arriving
            remaining = max(group.rebalance_timeout_ms - delay, 0)
            group.new_member_added = False
            group.initial_delay_active = True
            group.join_timer = self._ctx.schedule(
                delay, lambda: self._end_initial_delay(group, remaining)
            )
        else:
            group.join_timer = self._ctx.schedule(
                group.rebalance_timeout_ms, lambda: self._complete_join(group)
            )
            self.maybe_complete_join(group)

    def _end_initial_delay(self, group: Group, remaining_ms: int) -> None:
        if group.new_member_added and remaining_ms > 0:
            delay = min(self._ctx.config.group_initial_rebalance_delay_ms, remaining_ms)
            group.new_member_added = False
            group.join_timer = self._ctx.schedule(
                delay, lambda: self._end_initial_delay(group, remaining_ms - delay)
            )
        else:
            self._complete_join(group)

    def maybe_complete_join(self, group: Group) -> None:
        if (
            group.is_in(PREPARING)
            and not group.initial_delay_active
            and group.has_all_members_joined
        ):
            self._complete_join(group)

    def _complete_join(self, group: Group) -> None:
        """End the rebalance: drop members that did not rejoin, start the next generation."""
        if group.join_timer is not None:
            group.join_timer.cancel()
            group.join_timer = None
        group.initial_delay_active = False
        if not group.is_in(PREPARING):
            return
        for member in group.not_yet_rejoined:
            if not member.is_static:
                log.info(
                    "group %s: member %s did not rejoin in time", group.group_id, member.member_id
                )
                self.remove_member(group, member, ErrorCode.UNKNOWN_MEMBER_ID)
        self._shed_over_capacity(group)
        if group.members and not group.elect_joined_leader():
            # only static members are left and none rejoined: give them another rebalance
            # timeout to come back, or their sessions to run out
            log.info(
                "group %s: no member rejoined; waiting for the static members %s",
                group.group_id,
                group.member_ids,
            )
            group.join_timer = self._ctx.schedule(
                group.rebalance_timeout_ms, lambda: self._complete_join(group)
            )
            return
        group.init_next_generation(self._ctx.now_ms)
        if group.is_in(GroupState.EMPTY):
            log.info("group %s is empty at generation %d", group.group_id, group.generation_id)
            self._store_empty_group(group)
            return
        log.info(
            "group %s generation %d: protocol %s, leader %s, members %s",
            group.group_id,
            group.generation_id,
            group.protocol,
            group.leader_id,
            group.member_ids,
        )
        for member in group.members:
            respond = group.unpark_join(member)
            if respond is not None:
                self._ctx.reply(respond, group.join_response(member.member_id))
            member.is_new = False
            self.schedule_session(group, member)
        group.pending_sync = set(group.member_ids)
        generation = group.generation_id
        group.sync_timer = self._ctx.schedule(
            group.rebalance_timeout_ms, lambda: self._expire_pending_syncs(group, generation)
        )

    def _shed_over_capacity(self, group: Group) -> None:
        """Keep the next generation within ``group.max.size``.

        Joins beyond the limit are refused as they come, so what can overflow here are
        static members kept although they did not rejoin: they go first, the most
        recent first (a group loaded over capacity sheds its last joiners).
        """
        excess = len(group.members) - self._ctx.config.group_max_size
        if excess <= 0:
            return
        members = list(reversed(group.members))
        order = [m for m in members if not m.is_awaiting_join] + [
            m for m in members if m.is_awaiting_join
        ]
        for member in order[:excess]:
            log.info(
                "group %s: member %s removed: the group is over group.max.size %d",
                group.group_id,
                member.member_id,
                self._ctx.config.group_max_size,
            )
            self.remove_member(group, member, ErrorCode.GROUP_MAX_SIZE_REACHED)

    def rebalance_if_over_capacity(self, group: Group) -> None:
        """A group with more members than ``group.max.size`` (loaded so, after the limit
        was lowered) rebalances, so that its last joiners can be refused."""
        limit = self._ctx.config.group_max_size
        if len(group.members) > limit:
            reason = f"{len(group.members)} members, over group.max.size {limit}"
            self.maybe_prepare_rebalance(group, reason)

    def _store_empty_group(self, group: Group) -> None:
        record = group.to_record({}, self._ctx.now_ms)

        def on_stored(error: ErrorCode, zxid: int | None) -> None:
            if error != ErrorCode.NONE:
                # harmless: the generation in the log has no live members either way
                log.warning(
                    "group %s: could not store empty generation %d: %s",
                    group.group_id,
                    record.generation_id,
                    error.name,
                )

        completion = self._ctx.completion(on_stored)
        self._ctx.write(lambda: self._ctx.store.store_group(group.group_id, record, completion))

    # -- waiting syncs and the pending sync deadline -----------------------------------

    def fail_pending_syncs(self, group: Group, error: ErrorCode) -> None:
        for member in group.members:
            member.assignment = b""
        self.answer_pending_syncs(group, error)

    def answer_pending_syncs(self, group: Group, error: ErrorCode) -> None:
        for member in group.members:
            respond = member.awaiting_sync
            if respond is None:
                continue
            member.awaiting_sync = None
            response = SyncGroupResponse(error_code=error, assignment=member.assignment)
            if error == ErrorCode.NONE:
                response.protocol_type = group.protocol_type or ""
                response.protocol_name = group.protocol or ""
            self._ctx.reply(respond, response)
            # its session may have run out while it waited; it gets a fresh one now
            self.schedule_session(group, member)

    def mark_synced(self, group: Group, member_id: str) -> None:
        group.pending_sync.discard(member_id)
        if not group.pending_sync:
            self._cancel_sync_deadline(group)

    def _cancel_sync_deadline(self, group: Group) -> None:
        group.pending_sync.clear()
        if group.sync_timer is not None:
            group.sync_timer.cancel()
            group.sync_timer = None

    def _expire_pending_syncs(self, group: Group, generation: int) -> None:
        group.sync_timer = None
        if group.generation_id != generation or not group.is_in(COMPLETING, STABLE):
            return
        missing = [member for member in group.members if member.member_id in group.pending_sync]
        for member in missing:
            log.info(
                "group %s: member %s did not sync generation %d in time",
                group.group_id,
                member.member_id,
                generation,
            )
            self.remove_member(group, member, ErrorCode.UNKNOWN_MEMBER_ID)
        if missing:
            self.maybe_prepare_rebalance(group, "members did not sync in time")

    # -- sessions and member ids ---------------------------------------------------

    def schedule_session(self, group: Group, member: Member) -> None:
        """The member showed it is alive: its session starts over from now."""
        self._schedule_expiry(group, member, member.session_timeout_ms)

    def start_new_member_timer(self, group: Group, member: Member) -> None:
        """A member that joined for the first time has this long to be in a generation."""
        member.is_new = True
        self._schedule_expiry(group, member, self._ctx.config.group_new_member_join_timeout_ms)

    def _schedule_expiry(self, group: Group, member: Member, timeout_ms: int) -> None:
        if member.session_timer is not None:
            member.session_timer.cancel()
        member.session_timer = self._ctx.schedule(
            timeout_ms, lambda: self._expire_session(group, member)
        )

    def _expire_session(self, group: Group, member: Member) -> None:
        member.session_timer = None
        if not group.has(member.member_id) or group.get(member.member_id) is not member:
            return
        if member.is_new:
            log.info(
                "group %s: new member %s was not in a generation within %d ms",
                group.group_id,
                member.member_id,
                self._ctx.config.group_new_member_join_timeout_ms,
            )
        elif member.is_awaiting_join or member.is_awaiting_sync:
            # the coordinator owes it an answer; the session restarts when it is given
            return
        else:
            log.info("group %s: session of member %s expired", group.group_id, member.member_id)
        self.on_member_failure(group, member, f"session of {member.member_id} expired")

    def issue_member_id(self, group: Group, client_id: str, session_timeout_ms: int) -> str:
        """A fresh member id, held for its owner until the session timeout."""
        member_id = self._ctx.new_member_id(client_id)
        group.pending_members[member_id] = self._ctx.schedule(
            session_timeout_ms, lambda: self._expire_pending_member(group, member_id)
        )
        return member_id

    def withdraw_member_id(self, group: Group, member_id: str) -> None:
        """The owner of an issued id joined with it or gave it up."""
        group.pending_members.pop(member_id).cancel()

    def _expire_pending_member(self, group: Group, member_id: str) -> None:
        if group.pending_members.pop(member_id, None) is None:
            return
        log.info("group %s: member id %s was never used", group.group_id, member_id)
        self.maybe_complete_join(group)

    # -- members leaving -----------------------------------------------------------

    def on_member_failure(self, group: Group, member: Member, reason: str) -> None:
        """A member left or died: remove it and rebalance (or finish the rebalance)."""
        self.remove_member(group, member, ErrorCode.UNKNOWN_MEMBER_ID)
        if group.is_in(STABLE, COMPLETING):
            self.maybe_prepare_rebalance(group, reason)
        else:
            self.maybe_complete_join(group)

    def remove_member(self, group: Group, member: Member, error: ErrorCode) -> None:
        """Remove a member, answering whatever it is still waiting for with ``error``."""
        group.remove(member.member_id)
        self._release(group, member, error)

    def _release(self, group: Group, member: Member, error: ErrorCode) -> None:
        if member.session_timer is not None:
            member.session_timer.cancel()
            member.session_timer = None
        parked_join = group.unpark_join(member)
        if parked_join is not None:
            response = JoinGroupResponse(error_code=error, member_id=member.member_id)
            self._ctx.reply(parked_join, response)
        if member.awaiting_sync is not None:
            self._ctx.reply(member.awaiting_sync, SyncGroupResponse(error_code=error))
            member.awaiting_sync = None

    # -- loading and unloading -----------------------------------------------------

    def start_sessions(self, group: Group) -> None:
        """A loaded group's members get a full session from now to show they are alive."""
        for member in group.members:
            self.schedule_session(group, member)

    def retire(self, group: Group, error: ErrorCode) -> None:
        """Mark the group Dead, stop its timers, answer its waiting requests with ``error``."""
        group.transition_to(GroupState.DEAD, self._ctx.now_ms)
        for timer in (group.join_timer, group.sync_timer, *group.pending_members.values()):
            if timer is not None:
                timer.cancel()
        group.join_timer = group.sync_timer = None
        group.pending_members.clear()
        group.pending_sync.clear()
        for member in group.members:
            self._release(group, member, error)
