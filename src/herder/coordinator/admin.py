"""ListGroups, DescribeGroups and DeleteGroups: what operators and admin tools ask for."""

from __future__ import annotations

import logging
from collections.abc import Callable

from herder.coordinator.context import CoordinatorContext
from herder.coordinator.group import Group, GroupState
from herder.coordinator.messages import (
    DeletedGroup,
    DeleteGroupsRequest,
    DeleteGroupsResponse,
    DescribedGroup,
    DescribeGroupsRequest,
    DescribeGroupsResponse,
    ListGroupsRequest,
    ListGroupsResponse,
    first_error,
)
from herder.coordinator.rebalance import Rebalancer
from herder.coordinator.store import store_error
from herder.errors import ErrorCode

log = logging.getLogger(__name__)

#: why the coordinator cannot serve a request for a group id (None: it can)
Refusal = Callable[[str | None], ErrorCode | None]


class GroupAdmin:
    def __init__(
        self,
        context: CoordinatorContext,
        groups: dict[str, Group],
        rebalancer: Rebalancer,
        refusal: Refusal,
    ) -> None:
        self._ctx = context
        self._groups = groups
        self._rebalancer = rebalancer
        self._refusal = refusal

    def list_groups(self, request: ListGroupsRequest) -> ListGroupsResponse:
        """Every group, sorted, or those in the states asked for (KIP-518, any case);
        while loading, those loaded so far with LOAD_IN_PROGRESS."""
        error = self._refusal(None) or ErrorCode.NONE
        if error == ErrorCode.NOT_COORDINATOR:
            return ListGroupsResponse(error_code=error)
        wanted = {state.lower() for state in request.states_filter}
        listed = (self._groups[group_id] for group_id in sorted(self._groups))
        groups = [group.overview() for group in listed if not wanted or group.is_in_any(wanted)]
        return ListGroupsResponse(error_code=error, groups=groups)

    def describe_groups(self, request: DescribeGroupsRequest) -> DescribeGroupsResponse:
        """Each group's state and members; an unknown group is described as Dead."""
        described = []
        for group_id in request.group_ids:
            error = self._refusal(group_id)
            group = self._groups.get(group_id)
            if error is not None:
                described.append(DescribedGroup(error_code=error, group_id=group_id))
            elif group is None:
                described.append(DescribedGroup(group_id=group_id, state=GroupState.DEAD.value))
            else:
                described.append(group.describe())
        top = first_error(group.error_code for group in described)
        return DescribeGroupsResponse(error_code=top, groups=described)

    def delete_groups(
        self, request: DeleteGroupsRequest, respond: Callable[[DeleteGroupsResponse], None]
    ) -> None:
        """Delete Empty groups with their offsets; answered once every deletion is stored.

        A deleted group is gone from memory at once (a new member may start it afresh);
        its tombstones follow in the log, after anything written for it before.
        """
        results = {group_id: self._delete_refusal(group_id) for group_id in request.group_ids}
        outstanding = {group_id for group_id, error in results.items() if error is None}

        def answer() -> None:
            items = [
                DeletedGroup(group_id=group_id, error_code=results[group_id] or ErrorCode.NONE)
                for group_id in request.group_ids
            ]
            top = first_error(item.error_code for item in items)
            self._ctx.reply(respond, DeleteGroupsResponse(error_code=top, results=items))

        def on_deleted(group_id: str, error: ErrorCode) -> None:
            results[group_id] = store_error(error)
            outstanding.discard(group_id)
            if not outstanding:
                answer()

        if not outstanding:
            answer()
        for group_id in sorted(outstanding):
            self._delete_group(group_id, on_deleted)

    def _delete_refusal(self, group_id: str) -> ErrorCode | None:
        error = self._refusal(group_id)
        if error is not None:
            return error
        group = self._groups.get(group_id)
        if group is None or group.is_in(GroupState.DEAD):
            return ErrorCode.GROUP_ID_NOT_FOUND
        if not group.is_in(GroupState.EMPTY):
            return ErrorCode.NON_EMPTY_GROUP
        return None

    def _delete_group(self, group_id: str, on_deleted: Callable[[str, ErrorCode], None]) -> None:
        group = self._groups.pop(group_id)
        partitions = group.offsets.partitions()
        self._rebalancer.retire(group, ErrorCode.NOT_COORDINATOR)
        log.info("deleting group %s and its %d offsets", group_id, len(partitions))
        completion = self._ctx.completion(lambda error, zxid: on_deleted(group_id, error))
        self._ctx.write(lambda: self._ctx.store.delete_group(group_id, partitions, completion))
