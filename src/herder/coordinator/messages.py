"""Requests and responses of the group coordinator, as they will travel on the wire.

Each is a ``msgspec.Struct`` with keyword-only fields, later fields defaulted, so the
wire layer can send them unchanged and a peer one version apart still decodes them.
Shapes follow Kafka's APIs of the same names (LeaveGroup in its v3 form, a list of
members; DescribeGroups and DeleteGroups over several groups at once).

Every response carries ``error_code``, an :class:`~herder.errors.ErrorCode` value.
Where a request names several things (partitions, groups, leaving members) each item
also gets its own code, and the top-level code is the first item's error, so a client
that sent one item can read the top-level code alone. An error about the coordinator
itself (NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS) is set on every item too.
LeaveGroup is the exception, as in Kafka's v3+: its top-level code says only whether
the request failed as a whole, and each member's fate is in its own result.

Static membership (KIP-345): a member that sets ``group_instance_id`` keeps its place
in the group across restarts. It sends the id on JoinGroup, SyncGroup, Heartbeat,
LeaveGroup and OffsetCommit; the coordinator answers FENCED_INSTANCE_ID to a request
whose member id is no longer the one the instance id belongs to (an older process of
the same instance). ``None`` means a dynamic member, as before.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from herder.coordinator.offsets import TopicPartition
from herder.errors import ErrorCode

#: the member id of a member that has none yet
NO_MEMBER_ID = ""
#: the generation of a response that carries none; also what an admin tool commits with
NO_GENERATION = -1
#: the offset OffsetFetch reports for a partition with nothing committed
NO_OFFSET = -1
#: the leader epoch of an offset committed without one
NO_LEADER_EPOCH = -1


def first_error(codes: Iterable[int]) -> int:
    """The first code that is not NONE, else NONE: the top-level code of a multi-item reply."""
    return next((code for code in codes if code != ErrorCode.NONE), ErrorCode.NONE)


class JoinGroupProtocol(msgspec.Struct, kw_only=True):
    """One protocol a member can speak, with the metadata it votes with."""

    name: str
    metadata: bytes = b""


class JoinGroupRequest(msgspec.Struct, kw_only=True):
    group_id: str
    member_id: str = NO_MEMBER_ID
    #: a static member's identity across restarts (KIP-345); None for a dynamic member
    group_instance_id: str | None = None
    client_id: str = ""
    client_host: str = ""
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    #: in the member's order of preference
    protocols: list[JoinGroupProtocol] = []


class JoinGroupMember(msgspec.Struct, kw_only=True):
    member_id: str
    metadata: bytes = b""
    group_instance_id: str | None = None


class JoinGroupResponse(msgspec.Struct, kw_only=True):
    error_code: int = ErrorCode.NONE
    generation_id: int = NO_GENERATION
    protocol_name: str = ""
    leader: str = ""
    #: the member's id; with MEMBER_ID_REQUIRED, the id to rejoin with
    member_id: str = NO_MEMBER_ID
    #: filled for the leader only: every member with its metadata for the chosen protocol
    members: list[JoinGroupMember] = []
    #: the group's protocol type (KIP-559), "" with an error
    protocol_type: str = ""
    #: the leader is told it leads but must not assign: a static leader that restarted
    #: into a Stable group, whose assignment stands (JoinGroup v9's SkipAssignment);
    #: it syncs with no assignments and gets its own back
    skip_assignment: bool = False


class SyncGroupAssignment(msgspec.Struct, kw_only=True):
    member_id: str
    assignment: bytes = b""


class SyncGroupRequest(msgspec.Struct, kw_only=True):
    group_id: str
    generation_id: int
    member_id: str
    #: sent by the leader only; members it leaves out get an empty assignment
    assignments: list[SyncGroupAssignment] = []
    group_instance_id: str | None = None
    #: what the member's JoinGroup response said (KIP-559); checked when given
    protocol_type: str | None = None
    protocol_name: str | None = None


class SyncGroupResponse(msgspec.Struct, kw_only=True):
    error_code: int = ErrorCode.NONE
    assignment: bytes = b""
    #: the generation's protocol type and name (KIP-559), "" with an error
    protocol_type: str = ""
    protocol_name: str = ""


class HeartbeatRequest(msgspec.Struct, kw_only=True):
    group_id: str
    generation_id: int
    member_id: str
    group_instance_id: str | None = None


class HeartbeatResponse(msgspec.Struct, kw_only=True):
    error_code: int = ErrorCode.NONE


class LeavingMember(msgspec.Struct, kw_only=True):
    """One member to remove (LeaveGroup v3's MemberIdentity).

    A static member is named by its ``group_instance_id``, with or without its member
    id: without one (``NO_MEMBER_ID``) an operator removes whichever process holds the
    instance id now; with one, the member id must be the instance's current one.
    """

    member_id: str = NO_MEMBER_ID
    group_instance_id: str | None = None


class LeaveGroupRequest(msgspec.Struct, kw_only=True):
    group_id: str
    #: members named by member id alone (the form before LeaveGroup v3)
    member_ids: list[str] = []
    members: list[LeavingMember] = []

    def leaving(self) -> list[LeavingMember]:
        """Every member this request names, in both forms."""
        return [LeavingMember(member_id=m) for m in self.member_ids] + list(self.members)


class LeftMember(msgspec.Struct, kw_only=True):
    member_id: str
    error_code: int = ErrorCode.NONE
    group_instance_id: str | None = None


class LeaveGroupResponse(msgspec.Struct, kw_only=True):
    #: NONE unless the request failed as a whole; see ``members`` for each member
    error_code: int = ErrorCode.NONE
    members: list[LeftMember] = []

    def member_error(self, member_id: str, group_instance_id: str | None = None) -> int:
        """Whether the member left: the request's error, else that member's own."""
        if self.error_code != ErrorCode.NONE:
            return self.error_code
        codes = (
            m.error_code
            for m in self.members
            if m.member_id == member_id and m.group_instance_id == group_instance_id
        )
        return next(codes, ErrorCode.UNKNOWN_MEMBER_ID)


class OffsetCommitPartition(msgspec.Struct, kw_only=True):
    topic: str
    partition: int
    offset: int
    metadata: str = ""
    #: the epoch of the partition's leader the committed position was read under
    #: (Kafka's committed leader epoch), stored and returned by OffsetFetch
    leader_epoch: int = NO_LEADER_EPOCH


class OffsetCommitRequest(msgspec.Struct, kw_only=True):
    group_id: str
    #: NO_GENERATION (with no member id) commits for a group that has no members
    generation_id: int = NO_GENERATION
    member_id: str = NO_MEMBER_ID
    offsets: list[OffsetCommitPartition] = []
    group_instance_id: str | None = None


class CommittedPartition(msgspec.Struct, kw_only=True):
    topic: str
    partition: int
    error_code: int = ErrorCode.NONE


class OffsetCommitResponse(msgspec.Struct, kw_only=True):
    error_code: int = ErrorCode.NONE
    partitions: list[CommittedPartition] = []


class OffsetFetchRequest(msgspec.Struct, kw_only=True):
    group_id: str
    #: None fetches every partition the group has committed
    partitions: list[TopicPartition] | None = None


class FetchedOffset(msgspec.Struct, kw_only=True):
    topic: str
    partition: int
    offset: int = NO_OFFSET
    metadata: str = ""
    error_code: int = ErrorCode.NONE
    leader_epoch: int = NO_LEADER_EPOCH


class OffsetFetchResponse(msgspec.Struct, kw_only=True):
    error_code: int = ErrorCode.NONE
    offsets: list[FetchedOffset] = []


class ListGroupsRequest(msgspec.Struct, kw_only=True):
    """The groups the coordinator knows, all of them or those in some states."""

    #: state names to keep, in any case (KIP-518); empty: every group
    states_filter: list[str] = []


class ListedGroup(msgspec.Struct, kw_only=True):
    group_id: str
    protocol_type: str = ""
    state: str = ""


class ListGroupsResponse(msgspec.Struct, kw_only=True):
    error_code: int = ErrorCode.NONE
    groups: list[ListedGroup] = []


class DescribeGroupsRequest(msgspec.Struct, kw_only=True):
    group_ids: list[str] = []


class DescribedMember(msgspec.Struct, kw_only=True):
    member_id: str
    client_id: str = ""
    client_host: str = ""
    #: metadata for the group's protocol and the assignment: only while Stable
    metadata: bytes = b""
    assignment: bytes = b""
    group_instance_id: str | None = None


class RebalanceRecord(msgspec.Struct, kw_only=True):
    """One rebalance that ended with the group Stable: the generation it made, why it
    began, when (wall clock, ms) and how long it took to reach Stable."""

    generation_id: int
    reason: str = ""
    started_ms: int = 0
    time_ms: int = 0


class DescribedGroup(msgspec.Struct, kw_only=True):
    error_code: int = ErrorCode.NONE
    group_id: str
    state: str = ""
    protocol_type: str = ""
    protocol: str = ""
    members: list[DescribedMember] = []
    #: the current generation (0 before the first) and its leader ("" when none)
    generation_id: int = -1
    leader: str = ""
    #: why the group's current or last rebalance began (herder's, as Kafka's join
    #: reason of KIP-800), how long the last one took (-1: none since this coordinator
    #: took the group over), and when the group entered its state (wall clock, ms)
    rebalance_reason: str = ""
    last_rebalance_time_ms: int = -1
    state_timestamp_ms: int = 0
    #: the latest rebalances this coordinator saw the group through, oldest first
    rebalances: list[RebalanceRecord] = []


class DescribeGroupsResponse(msgspec.Struct, kw_only=True):
    error_code: int = ErrorCode.NONE
    groups: list[DescribedGroup] = []


class DeleteGroupsRequest(msgspec.Struct, kw_only=True):
    group_ids: list[str] = []


class DeletedGroup(msgspec.Struct, kw_only=True):
    group_id: str
    error_code: int = ErrorCode.NONE


class DeleteGroupsResponse(msgspec.Struct, kw_only=True):
    error_code: int = ErrorCode.NONE
    results: list[DeletedGroup] = []


class InitFencingRequest(msgspec.Struct, kw_only=True):
    """Take a new fencing epoch for ``fenced_id`` (a source task, a connector, the leader)."""

    fenced_id: str


class InitFencingResponse(msgspec.Struct, kw_only=True):
    error_code: int = ErrorCode.NONE
    fenced_id: str = ""
    epoch: int = -1


CoordinatorRequest = (
    JoinGroupRequest
    | SyncGroupRequest
    | HeartbeatRequest
    | LeaveGroupRequest
    | OffsetCommitRequest
    | OffsetFetchRequest
    | ListGroupsRequest
    | DescribeGroupsRequest
    | DeleteGroupsRequest
    | InitFencingRequest
)

CoordinatorResponse = (
    JoinGroupResponse
    | SyncGroupResponse
    | HeartbeatResponse
    | LeaveGroupResponse
    | OffsetCommitResponse
    | OffsetFetchResponse
    | ListGroupsResponse
    | DescribeGroupsResponse
    | DeleteGroupsResponse
    | InitFencingResponse
)
