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


# Version 1 of the group APIs (every field it adds is optional, so version 0 peers are
# served as before): group_instance_id on JoinGroup, SyncGroup, Heartbeat, LeaveGroup
# (members by instance id) and OffsetCommit, and instance ids in JoinGroup's member list
# and DescribeGroups (KIP-345); JoinGroup's skip_assignment; protocol type and name on
# JoinGroup and SyncGroup (KIP-559); ListGroups' states filter (KIP-518); a leader
# epoch on committed offsets. A static member must see version 1 negotiated: a server
# that speaks only 0 would ignore its instance id and treat it as a dynamic member.
FIND_COORDINATOR = Api(10, "FindCoordinator", FindCoordinatorRequest, FindCoordinatorResponse)
OFFSET_COMMIT = Api(
    8, "OffsetCommit", m.OffsetCommitRequest, m.OffsetCommitResponse, 0, 1, writes=True
)
OFFSET_FETCH = Api(9, "OffsetFetch", m.OffsetFetchRequest, m.OffsetFetchResponse, 0, 1)
JOIN_GROUP = Api(11, "JoinGroup", m.JoinGroupRequest, m.JoinGroupResponse, 0, 1, writes=True)
HEARTBEAT = Api(12, "Heartbeat", m.HeartbeatRequest, m.HeartbeatResponse, 0, 1, writes=True)
LEAVE_GROUP = Api(13, "LeaveGroup", m.LeaveGroupRequest, m.LeaveGroupResponse, 0, 1, writes=True)
SYNC_GROUP = Api(14, "SyncGroup", m.SyncGroupRequest, m.SyncGroupResponse, 0, 1, writes=True)
DESCRIBE_GROUPS = Api(15, "DescribeGroups", m.DescribeGroupsRequest, m.DescribeGroupsResponse, 0, 1)
LIST_GROUPS = Api(16, "ListGroups", m.ListGroupsRequest, m.ListGroupsResponse, 0, 1)
DELETE_GROUPS = Api(42, "DeleteGroups", m.DeleteGroupsRequest, m.DeleteGroupsResponse, writes=True)
INIT_FENCING = Api(22, "InitFencing", m.InitFencingRequest, m.InitFencingResponse, writes=True)

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
