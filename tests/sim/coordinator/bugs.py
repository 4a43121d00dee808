"""Bugs the simulator can plant in the coordinator core, to prove its checks catch them.

Each is a plausible mistake, planted by patching the core's classes for the duration
of a run (the production code carries no switch for them):

* ``commit_any_generation``: OffsetCommit checks the member but not its generation;
* ``no_fencing``: a restarted static member joins beside its old member (which stays
  on as a plain member) instead of taking it over, and requests are judged by member
  id alone;
* ``takeover_keeps_old_leader``: a takeover in a Stable group does not move the
  leadership to the new member id, so the group is led by an id no longer a member;
* ``takeover_loses_assignment``: a takeover forgets the member's assignment;
* ``no_capacity_rebalance_on_load``: a group loaded over ``group.max.size`` stays Stable.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from herder.coordinator.group import Group, GroupState
from herder.coordinator.membership import Membership
from herder.coordinator.messages import JoinGroupRequest
from herder.coordinator.offset_commits import OffsetCommits
from herder.coordinator.rebalance import Rebalancer
from herder.errors import ErrorCode

Patch = dict[tuple[type, str], Callable[..., Any]]


def _commit_any_generation() -> Patch:
    def refusal(self: OffsetCommits, group: Group, request: Any) -> ErrorCode | None:
        if request.generation_id < 0 and group.is_in(GroupState.EMPTY):
            return None
        error = group.validate_member(request.member_id, request.group_instance_id)
        if error is not None:
            return error
        if group.is_in(GroupState.COMPLETING_REBALANCE):
            return ErrorCode.REBALANCE_IN_PROGRESS
        return None

    return {(OffsetCommits, "_refusal"): refusal}


def _no_fencing() -> Patch:
    def join_static(
        self: Membership, group: Group, request: JoinGroupRequest, protocols: Any, respond: Any
    ) -> None:
        instance_id = request.group_instance_id
        assert instance_id is not None
        old_member_id = group.static_member_id(instance_id)
        if old_member_id is not None:
            # the old member stays, as a plain member, beside the new one
            group.get(old_member_id).group_instance_id = None
            del group._static_members[instance_id]
        member_id = self._ctx.new_member_id(instance_id)
        self._add_member_and_rebalance(group, member_id, request, protocols, respond)

    def validate(self: Group, member_id: str, group_instance_id: str | None) -> ErrorCode | None:
        return None if self.has(member_id) else ErrorCode.UNKNOWN_MEMBER_ID

    return {
        (Membership, "_join_static_without_id"): join_static,
        (Group, "validate_member"): validate,
    }


def _takeover_keeps_old_leader() -> Patch:
    original = Group.replace_static_member

    def replace(self: Group, group_instance_id: str, new_member_id: str) -> Any:
        old_member_id, leader = self._static_members[group_instance_id], self.leader_id
        result = original(self, group_instance_id, new_member_id)
        if leader == old_member_id and self.state is GroupState.STABLE:
            self.leader_id = old_member_id
        return result

    return {(Group, "replace_static_member"): replace}


def _takeover_loses_assignment() -> Patch:
    original = Group.replace_static_member

    def replace(self: Group, group_instance_id: str, new_member_id: str) -> Any:
        member, *callbacks = original(self, group_instance_id, new_member_id)
        member.assignment = b""
        return (member, *callbacks)

    return {(Group, "replace_static_member"): replace}


def _no_capacity_rebalance_on_load() -> Patch:
    def nothing(self: Rebalancer, group: Group) -> None:
        return None

    return {(Rebalancer, "rebalance_if_over_capacity"): nothing}


BUGS: dict[str, Callable[[], Patch]] = {
    "commit_any_generation": _commit_any_generation,
    "no_fencing": _no_fencing,
    "takeover_keeps_old_leader": _takeover_keeps_old_leader,
    "takeover_loses_assignment": _takeover_loses_assignment,
    "no_capacity_rebalance_on_load": _no_capacity_rebalance_on_load,
}


@contextlib.contextmanager
def planted(bug: str | None) -> Iterator[None]:
    """Patch the core with ``bug`` (None: no bug) until the block ends."""
    if bug is None:
        yield
        return
    patches = BUGS[bug]()
    originals = {key: key[0].__dict__[key[1]] for key in patches}
    try:
        for (cls, name), function in patches.items():
            setattr(cls, name, function)
        yield
    finally:
        for (cls, name), function in originals.items():
            setattr(cls, name, function)
