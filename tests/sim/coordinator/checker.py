"""The invariants the coordinator simulation checks, at every answer and after every step.

* **One generation, one view**: the members of a generation agree on its leader (as an
  identity: a static member's instance id, a dynamic member's member id), the leader
  is a member of the group when it is named, and only the leader is sent the member
  list; a member's assignment in a generation never changes once given, and the
  assignments of one generation are disjoint.
* **No stale commits**: an offset commit from a generation other than the group's
  current one is never accepted (nor from a member that is not in the group).
* **Capacity**: a Stable group never has more members than ``group.max.size``.
* **Fencing**: once a static member's new process holds an assignment (its SyncGroup
  succeeded, so the takeover is stored), no request from an earlier member id of the
  same instance ever succeeds again.
* Every request is answered at most once, and the group's static members are indexed
  consistently (each instance id names a member that has it).

Answers are checked when the core gives them (before the network delays or loses
them), so what is judged is the coordinator, not the delivery. The four named
invariants (``INVARIANTS``) can be checked one at a time, so that a planted bug can be
shown to be caught by the check meant for it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection
from typing import Any

from herder.coordinator import GroupCoordinator, GroupState
from herder.coordinator.messages import (
    JoinGroupRequest,
    JoinGroupResponse,
    OffsetCommitRequest,
    SyncGroupRequest,
    SyncGroupResponse,
)
from herder.errors import ErrorCode
from tests.sim.coordinator.clients import GROUP

#: the invariants by name: one view per generation, no stale commits, capacity, fencing
INVARIANTS = frozenset({"agreement", "stale_commits", "capacity", "fencing"})


class SafetyViolation(AssertionError):
    pass


class Checker:
    def __init__(self, invariants: Collection[str] = INVARIANTS) -> None:
        unknown = set(invariants) - INVARIANTS
        if unknown:
            raise ValueError(f"no such invariants: {sorted(unknown)}")
        self.invariants = frozenset(invariants)
        #: member id -> identity (the instance id of a static member, else the member id)
        self.identity: dict[str, str] = {}
        #: (coordinator incarnation, generation) -> leader identity, from join answers
        self.leaders: dict[tuple[int, int], str] = {}
        #: (generation, identity) -> the assignment it was given
        self.assignments: dict[tuple[int, str], bytes] = {}
        #: generation -> resource -> identity holding it
        self.holders: dict[int, dict[str, str]] = {}
        #: instance id -> its member ids, in the order their takeovers became durable
        self.incarnations: dict[str, list[str]] = {}
        #: member ids whose instance has been taken over by a later process for good
        self.fenced: set[str] = set()
        self.answers: Counter[int] = Counter()
        #: leaders named by join answers of the current step, checked once it ends
        self._named_leaders: list[tuple[str, int]] = []

    def _who(self, member_id: str) -> str:
        return self.identity.get(member_id, member_id)

    # -- answers ---------------------------------------------------------------------

    def on_answer(
        self,
        request_id: int,
        request: Any,
        response: Any,
        incarnation: int,
        current: bool,
        judged: bool,
    ) -> None:
        """An answer as the core gave it: ``current`` if its coordinator still serves,
        ``judged`` unless it was given blindly (a heartbeat while loading)."""
        self.answers[request_id] += 1
        if self.answers[request_id] > 1:
            raise SafetyViolation(f"request {request_id} answered twice: {response}")
        if ErrorCode(response.error_code) != ErrorCode.NONE or not judged:
            return
        member_id = getattr(request, "member_id", "")
        if isinstance(request, JoinGroupRequest):
            member_id = response.member_id
            self._joined(request, response, incarnation, current)
        if member_id in self.fenced and "fencing" in self.invariants:
            raise SafetyViolation(
                f"{type(request).__name__} of {member_id} succeeded after its instance "
                f"{self.identity.get(member_id)} was taken over by a later process"
            )
        if isinstance(request, SyncGroupRequest):
            self._synced(request, response)

    def _joined(
        self,
        request: JoinGroupRequest,
        response: JoinGroupResponse,
        incarnation: int,
        current: bool,
    ) -> None:
        member_id = response.member_id
        if request.group_instance_id is not None:
            self.identity[member_id] = request.group_instance_id
        for listed in response.members:
            if listed.group_instance_id is not None:
                self.identity[listed.member_id] = listed.group_instance_id
        is_leader = response.leader == member_id
        if bool(response.members) != is_leader and "agreement" in self.invariants:
            raise SafetyViolation(
                f"{member_id} was sent {len(response.members)} members in generation "
                f"{response.generation_id}, led by {response.leader}"
            )
        if current:
            self._named_leaders.append((response.leader, response.generation_id))

    def _synced(self, request: SyncGroupRequest, response: SyncGroupResponse) -> None:
        member_id, generation = request.member_id, request.generation_id
        who = self._who(member_id)
        # the takeover is in the log now: every earlier id of this instance is fenced
        instance = request.group_instance_id
        if instance is not None:
            seen = self.incarnations.setdefault(instance, [])
            if member_id not in seen:
                self.fenced.update(seen)
                seen.append(member_id)
        if "agreement" not in self.invariants:
            return
        key = (generation, who)
        given = self.assignments.setdefault(key, response.assignment)
        if given != response.assignment:
            raise SafetyViolation(
                f"{who} was given {response.assignment!r} in generation {generation}, "
                f"after {given!r} in the same generation"
            )
        holders = self.holders.setdefault(generation, {})
        for resource in filter(None, response.assignment.decode().split(",")):
            holder = holders.setdefault(resource, who)
            if holder != who:
                raise SafetyViolation(
                    f"{resource} given to both {holder} and {who} in generation {generation}"
                )

    def on_commit_accepted(
        self, request: OffsetCommitRequest, coordinator: GroupCoordinator
    ) -> None:
        group = coordinator.group(request.group_id)
        assert group is not None
        if "stale_commits" not in self.invariants:
            return
        if request.generation_id < 0 and group.state is GroupState.EMPTY:
            return
        if request.generation_id != group.generation_id or not group.has(request.member_id):
            raise SafetyViolation(
                f"commit of {request.member_id} for generation {request.generation_id} accepted "
                f"while the group is at generation {group.generation_id} ({group.state.value}, "
                f"members {group.member_ids})"
            )

    # -- state -----------------------------------------------------------------------

    def after_step(self, coordinator: GroupCoordinator | None, incarnation: int) -> None:
        group = coordinator.group(GROUP) if coordinator is not None else None
        for member in group.members if group is not None else ():
            if member.group_instance_id is not None:
                self.identity[member.member_id] = member.group_instance_id
        named, self._named_leaders = self._named_leaders, []
        if "agreement" not in self.invariants:
            named = []
        for leader, generation in named:
            who = self._who(leader)
            agreed = self.leaders.setdefault((incarnation, generation), who)
            if agreed != who:
                raise SafetyViolation(
                    f"generation {generation} has two leaders: {agreed} and {who}"
                )
        if coordinator is None or group is None:
            return
        for leader, generation in named:
            if generation == group.generation_id and not group.has(leader):
                raise SafetyViolation(
                    f"members were told {leader} leads generation {generation}, "
                    f"but it is not a member ({group.member_ids})"
                )
        limit = coordinator.config.group_max_size
        over = group.state is GroupState.STABLE and len(group.members) > limit
        if over and "capacity" in self.invariants:
            raise SafetyViolation(
                f"Stable group has {len(group.members)} members, over group.max.size {limit}"
            )
        for member in group.members:
            instance = member.group_instance_id
            if instance is not None and group.static_member_id(instance) != member.member_id:
                raise SafetyViolation(
                    f"member {member.member_id} has instance {instance}, which the group "
                    f"gives to {group.static_member_id(instance)}"
                )
