"""The group coordinator's APIs on the ensemble's client port.

Every ensemble server routes them; only the leader's coordinator is active, so the others
answer NOT_COORDINATOR, and FindCoordinator (served everywhere) says where the leader is.
Keys follow Kafka's where Kafka has the API.
"""

from __future__ import annotations

from typing import Any

import msgspec

from herder.coordinator import messages as m
from herder.coordinator.records import FENCING_LOG, FencingRecord, encode_record, fencing_key
from herder.ensemble.txn import CheckKeyValue
from herder.errors import ErrorCode
from herder.wire.envelope import Api


class FindCoordinatorRequest(msgspec.Struct, kw_only=True):
    #: the group (or fenced id) the caller wants a coordinator for; all share the leader
    key: str = ""


class FindCoordinatorResponse(msgspec.Struct, kw_only=True):
    error_code: int = ErrorCode.NONE
    error_message: str = ""
    node_id: int = -1
    host: str = ""
    port: int = -1


FIND_COORDINATOR = Api(10, "FindCoordinator", FindCoordinatorRequest, FindCoordinatorResponse)
OFFSET_COMMIT = Api(8, "OffsetCommit", m.OffsetCommitRequest, m.OffsetCommitResponse)
OFFSET_FETCH = Api(9, "OffsetFetch", m.OffsetFetchRequest, m.OffsetFetchResponse)
JOIN_GROUP = Api(11, "JoinGroup", m.JoinGroupRequest, m.JoinGroupResponse)
HEARTBEAT = Api(12, "Heartbeat", m.HeartbeatRequest, m.HeartbeatResponse)
LEAVE_GROUP = Api(13, "LeaveGroup", m.LeaveGroupRequest, m.LeaveGroupResponse)
SYNC_GROUP = Api(14, "SyncGroup", m.SyncGroupRequest, m.SyncGroupResponse)
DESCRIBE_GROUPS = Api(15, "DescribeGroups", m.DescribeGroupsRequest, m.DescribeGroupsResponse)
LIST_GROUPS = Api(16, "ListGroups", m.ListGroupsRequest, m.ListGroupsResponse)
DELETE_GROUPS = Api(42, "DeleteGroups", m.DeleteGroupsRequest, m.DeleteGroupsResponse)
INIT_FENCING = Api(22, "InitFencing", m.InitFencingRequest, m.InitFencingResponse)

#: the APIs the coordinator core answers (FindCoordinator is answered by every server)
GROUP_APIS: list[Api[Any, Any]] = [
    OFFSET_COMMIT,
    OFFSET_FETCH,
    JOIN_GROUP,
    HEARTBEAT,
    LEAVE_GROUP,
    SYNC_GROUP,
    DESCRIBE_GROUPS,
    LIST_GROUPS,
    DELETE_GROUPS,
    INIT_FENCING,
]
COORDINATOR_APIS: list[Api[Any, Any]] = [FIND_COORDINATOR, *GROUP_APIS]


def fencing_op(fenced_id: str, epoch: int) -> CheckKeyValue:
    """The ensemble check, for a writer's own transaction, that ``fenced_id`` still holds
    ``epoch``: a newer incarnation's InitFencing rewrites the key and the check fails."""
    return CheckKeyValue(
        FENCING_LOG,
        fencing_key(fenced_id),
        encode_record(FencingRecord(fenced_id=fenced_id, epoch=epoch)),
    )
