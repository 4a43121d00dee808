"""A group's state (the seed's GroupMetadata): members, generation, leader, protocol.

The group is a plain object with no notion of requests, time passing or storage; the
coordinator drives it. What it guards is the state machine: only the seed's
transitions are legal, and any other raises :class:`IllegalGroupTransition`, because
it means the coordinator has a bug, and carrying on would hand two members the same
partitions.

* Empty → PreparingRebalance: a member joins;
* PreparingRebalance → CompletingRebalance: every member rejoined (or the rebalance
  timed out) and at least one is left; → Empty: none is left;
* CompletingRebalance → Stable: the leader's assignment is stored;
* CompletingRebalance or Stable → PreparingRebalance: a member joins, changes its
  metadata, leaves, expires or never syncs, or the leader rejoins;
* any state → Dead: the group is unloaded, deleted or expired.

Static members (KIP-345) are also indexed by their ``group.instance.id``; at most one
member holds an instance id, and a restarted process takes its member over
(:meth:`Group.replace_static_member`) instead of joining beside it.
"""

from __future__ import annotations

import enum
from collections import Counter, deque

from herder.coordinator.member import JoinCallback, Member, SupportedProtocol, SyncCallback
from herder.coordinator.messages import (
    DescribedGroup,
    DescribedMember,
    JoinGroupMember,
    JoinGroupResponse,
    ListedGroup,
    RebalanceRecord,
)
from herder.coordinator.offsets import GroupOffsets
from herder.coordinator.records import GroupRecord
from herder.coordinator.timers import Timer
from herder.errors import ErrorCode, HerderError

#: completed rebalances a group remembers for DescribeGroups
REBALANCE_HISTORY = 20


class GroupState(enum.Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    #: the seed's AwaitingSync: joined, waiting for the leader's assignment
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


_VALID_PREVIOUS: dict[GroupState, frozenset[GroupState]] = {
    GroupState.DEAD: frozenset(GroupState),
    GroupState.COMPLETING_REBALANCE: frozenset({GroupState.PREPARING_REBALANCE}),
    GroupState.STABLE: frozenset({GroupState.COMPLETING_REBALANCE}),
    GroupState.PREPARING_REBALANCE: frozenset(
        {GroupState.STABLE, GroupState.COMPLETING_REBALANCE, GroupState.EMPTY}
    ),
    GroupState.EMPTY: frozenset({GroupState.PREPARING_REBALANCE}),
}


class IllegalGroupTransition(HerderError):
    """The coordinator tried a transition the group state machine forbids (a bug)."""


class Group:
    """One group's membership and generation, plus its offsets and delayed operations.

    ``pending_members`` are ids handed out with MEMBER_ID_REQUIRED whose owners have not
    rejoined yet; each has a timer that forgets it at its session timeout.
    ``pending_sync`` are the members of the current generation that have not sent
    SyncGroup yet. ``join_timer`` is the group's delayed join, ``sync_timer`` the
    deadline for the pending syncs.

    Parking and unparking a member's JoinGroup goes through :meth:`park_join` and
    :meth:`unpark_join`, and protocol changes through :meth:`update_protocols`, so the
    group keeps counts that answer "has everyone rejoined?" and "which protocols does
    everyone speak?" without a pass over ten thousand members on every join.
    """

    def __init__(self, group_id: str, now_ms: int) -> None:
        self.group_id = group_id
        self._state = GroupState.EMPTY
        #: when the group entered its current state (offset retention counts from Empty)
        self.state_timestamp_ms = now_ms
        self.protocol_type: str | None = None
        self.protocol: str | None = None
        self.generation_id = 0
        self.leader_id: str | None = None
        self._members: dict[str, Member] = {}
        #: group.instance.id -> the member id that holds it now
        self._static_members: dict[str, str] = {}
        #: how many members support each protocol name
        self._protocol_support: Counter[str] = Counter()
        #: how many members have a JoinGroup parked
        self._awaiting_join = 0
        self.pending_members: dict[str, Timer] = {}
        self.pending_sync: set[str] = set()
        self.offsets = GroupOffsets()
        self.join_timer: Timer | None = None
        self.sync_timer: Timer | None = None
        #: while set, the delayed join waits out group.initial.rebalance.delay.ms
        self.initial_delay_active = False
        #: whether a member arrived during the initial rebalance delay (which then extends)
        self.new_member_added = False
        #: when the rebalance under way began (None: none is), and why it began
        self.rebalance_started_ms: int | None = None
        self.rebalance_reason = ""
        #: rebalances that ended with the group Stable, and how long the last and the
        #: longest took (ms), for the coordinator's metrics
        self.rebalances_completed = 0
        self.last_rebalance_ms: int | None = None
        self.max_rebalance_ms = 0
        #: the latest completed rebalances, for DescribeGroups
        self.rebalance_history: deque[RebalanceRecord] = deque(maxlen=REBALANCE_HISTORY)

    def __repr__(self) -> str:
        return (
            f"Group({self.group_id!r}, {self._state.value}, generation={self.generation_id}, "
            f"members={list(self._members)})"
        )

    # -- state ---------------------------------------------------------------------

    @property
    def state(self) -> GroupState:
        return self._state

    def is_in(self, *states: GroupState) -> bool:
        return self._state in states

    @property
    def can_rebalance(self) -> bool:
        return self._state in _VALID_PREVIOUS[GroupState.PREPARING_REBALANCE]

    def transition_to(self, target: GroupState, now_ms: int) -> None:
        if self._state not in _VALID_PREVIOUS[target]:
            raise IllegalGroupTransition(
                f"group {self.group_id}: cannot move from {self._state.value} to {target.value}"
            )
        if target is GroupState.PREPARING_REBALANCE and self.rebalance_started_ms is None:
            self.rebalance_started_ms = now_ms
        elif target is GroupState.STABLE and self.rebalance_started_ms is not None:
            took = max(0, now_ms - self.rebalance_started_ms)
            self.rebalance_history.append(
                RebalanceRecord(
                    generation_id=self.generation_id,
                    reason=self.rebalance_reason,
                    started_ms=self.rebalance_started_ms,
                    time_ms=took,
                )
            )
            self.rebalances_completed += 1
            self.last_rebalance_ms = took
            self.max_rebalance_ms = max(self.max_rebalance_ms, took)
            self.rebalance_started_ms = None
        elif target in (GroupState.EMPTY, GroupState.DEAD):
            self.rebalance_started_ms = None
        self._state = target
        self.state_timestamp_ms = now_ms

    # -- members -------------------------------------------------------------------

    def has(self, member_id: str) -> bool:
        return member_id in self._members

    def get(self, member_id: str) -> Member:
        return self._members[member_id]

    @property
    def members(self) -> list[Member]:
        return list(self._members.values())

    @property
    def member_ids(self) -> list[str]:
        return list(self._members)

    @property
    def awaiting_join_count(self) -> int:
        """Members with a JoinGroup parked: who is in the next generation so far."""
        return self._awaiting_join

    def static_member_id(self, group_instance_id: str | None) -> str | None:
        """The member id that holds ``group_instance_id`` now (None: no one does)."""
        if group_instance_id is None:
            return None
        return self._static_members.get(group_instance_id)

    def validate_member(self, member_id: str, group_instance_id: str | None) -> ErrorCode | None:
        """Why a request from ``member_id`` is refused, if it is (Kafka's
        ``validateCurrentMember``): FENCED_INSTANCE_ID when its instance id now belongs
        to another member id (a newer process of the same instance took over), else
        UNKNOWN_MEMBER_ID when the instance or the member is not in the group.
        """
        if group_instance_id is not None:
            current = self._static_members.get(group_instance_id)
            if current is None:
                return ErrorCode.UNKNOWN_MEMBER_ID
            return ErrorCode.FENCED_INSTANCE_ID if current != member_id else None
        return None if member_id in self._members else ErrorCode.UNKNOWN_MEMBER_ID

    @property
    def size(self) -> int:
        """Members plus ids given out and not yet used: what ``group.max.size`` bounds."""
        return len(self._members) + len(self.pending_members)

    @property
    def is_vacant(self) -> bool:
        """No members, no one about to join, no offsets: nothing worth keeping."""
        return not self._members and not self.pending_members and not self.offsets.has_offsets

    def add(self, member: Member) -> None:
        """Add a member; the first member of a group decides its protocol type and leads."""
        if not self._members:
            self.protocol_type = member.protocol_type
        if member.protocol_type != self.protocol_type or not self.supports_protocols(
            member.protocol_type, member.protocol_names
        ):
            raise ValueError(f"member {member.member_id} cannot join group {self.group_id}")
        instance_id = member.group_instance_id
        if instance_id is not None and instance_id in self._static_members:
            raise ValueError(f"group {self.group_id} already has a member for {instance_id}")
        if self.leader_id is None:
            self.leader_id = member.member_id
        self._members[member.member_id] = member
        if instance_id is not None:
            self._static_members[instance_id] = member.member_id
        self._protocol_support.update(set(member.protocol_names))
        if member.is_awaiting_join:
            self._awaiting_join += 1
        self.pending_sync.discard(member.member_id)

    def remove(self, member_id: str) -> Member:
        """Remove a member; a removed leader is replaced, preferring one that has rejoined.

        Preferring a member that is awaiting a join keeps the leadership with someone
        who will be in the next generation.
        """
        member = self._members.pop(member_id)
        if member.group_instance_id is not None:
            self._static_members.pop(member.group_instance_id, None)
        self._protocol_support.subtract(set(member.protocol_names))
        if member.is_awaiting_join:
            self._awaiting_join -= 1
        self.pending_sync.discard(member_id)
        if member_id == self.leader_id:
            self.leader_id = self._next_leader()
        return member

    def replace_static_member(
        self, group_instance_id: str, new_member_id: str
    ) -> tuple[Member, JoinCallback | None, SyncCallback | None]:
        """Hand the instance's member over to ``new_member_id`` (a restarted process).

        The member keeps its place (order, leadership, assignment, pending sync); what
        the previous process was waiting for is taken back and returned, to be answered
        FENCED_INSTANCE_ID: that process is not the member any more.
        """
        old_member_id = self._static_members[group_instance_id]
        member = self._members[old_member_id]
        fenced_join = self.unpark_join(member)
        fenced_sync, member.awaiting_sync = member.awaiting_sync, None
        member.member_id = new_member_id
        self._members = {
            (new_member_id if key == old_member_id else key): value
            for key, value in self._members.items()
        }
        self._static_members[group_instance_id] = new_member_id
        if self.leader_id == old_member_id:
            self.leader_id = new_member_id
        if old_member_id in self.pending_sync:
            self.pending_sync.discard(old_member_id)
            self.pending_sync.add(new_member_id)
        return member, fenced_join, fenced_sync

    def elect_joined_leader(self) -> bool:
        """Make sure the leader is a member that rejoined; False if none did.

        A static member that did not rejoin stays in the group (it may be restarting),
        but it cannot lead the next generation: it would not get the join response
        that asks it to assign.
        """
        if self.leader_id is None:
            return False
        if self._members[self.leader_id].is_awaiting_join:
            return True
        joined = next((m.member_id for m in self._members.values() if m.is_awaiting_join), None)
        if joined is None:
            return False
        self.leader_id = joined
        return True

    def _next_leader(self) -> str | None:
        if self._awaiting_join:
            for member in self._members.values():
                if member.is_awaiting_join:
                    return member.member_id
        return next(iter(self._members), None)

    def park_join(self, member: Member, respond: JoinCallback) -> JoinCallback | None:
        """Hold the member's JoinGroup until the rebalance completes; return one it replaces."""
        superseded = self.unpark_join(member)
        member.awaiting_join = respond
        if self._members.get(member.member_id) is member:
            self._awaiting_join += 1
        return superseded

    def unpark_join(self, member: Member) -> JoinCallback | None:
        """Take back the member's parked JoinGroup (None if there is none)."""
        respond = member.awaiting_join
        if respond is not None:
            member.awaiting_join = None
            if self._members.get(member.member_id) is member:
                self._awaiting_join -= 1
        return respond

    def update_protocols(self, member: Member, protocols: list[SupportedProtocol]) -> None:
        self._protocol_support.subtract(set(member.protocol_names))
        member.protocols = protocols
        self._protocol_support.update(set(member.protocol_names))

    @property
    def not_yet_rejoined(self) -> list[Member]:
        return [member for member in self._members.values() if not member.is_awaiting_join]

    @property
    def has_all_members_joined(self) -> bool:
        """Every member has rejoined and no one holding a fresh id is about to."""
        return not self.pending_members and self._awaiting_join == len(self._members)

    @property
    def rebalance_timeout_ms(self) -> int:
        """The longest rebalance timeout of any member: how long a rebalance may wait."""
        return max((member.rebalance_timeout_ms for member in self._members.values()), default=0)

    # -- protocols -------------------------------------------------------------------

    def candidate_protocols(self) -> set[str]:
        """The protocols every member supports."""
        everyone = len(self._members)
        if not everyone:
            return set()
        return {name for name, count in self._protocol_support.items() if count == everyone}

    def supports_protocols(self, protocol_type: str, names: list[str]) -> bool:
        """Whether a member of ``protocol_type`` speaking ``names`` may join.

        A group without members takes any non-empty type and protocol list; otherwise
        the type must match and one of the names must be supported by every member.
        """
        if not self._members:
            return bool(protocol_type) and bool(names)
        candidates = self.candidate_protocols()
        return protocol_type == self.protocol_type and any(name in candidates for name in names)

    def select_protocol(self) -> str:
        """The protocol most members vote for among those all members support.

        Each member votes for its most preferred candidate. A tie goes to the protocol
        the longest-standing member prefers, so every replay of a history picks the same.
        """
        if not self._members:
            raise ValueError(f"group {self.group_id} has no members to select a protocol")
        candidates = self.candidate_protocols()
        votes = Counter(member.vote(candidates) for member in self._members.values())
        first = next(iter(self._members.values()))
        preference = {name: rank for rank, name in enumerate(first.protocol_names)}
        return max(votes, key=lambda name: (votes[name], -preference[name]))

    # -- generations -----------------------------------------------------------------

    def init_next_generation(self, now_ms: int) -> None:
        """Start the next generation from the members that rejoined (and static members
        kept while they restart)."""
        if any(not member.is_static for member in self.not_yet_rejoined):
            raise ValueError(f"group {self.group_id} has dynamic members that did not rejoin")
        self.generation_id += 1
        self.pending_sync.clear()
        if self._members:
            self.protocol = self.select_protocol()
            self.transition_to(GroupState.COMPLETING_REBALANCE, now_ms)
        else:
            self.protocol = None
            self.transition_to(GroupState.EMPTY, now_ms)

    def member_metadata(self) -> list[JoinGroupMember]:
        """Every member's metadata for the chosen protocol (what the leader assigns from)."""
        if self.protocol is None or self.is_in(GroupState.DEAD, GroupState.PREPARING_REBALANCE):
            raise ValueError(f"group {self.group_id} has no current generation in {self.state}")
        protocol = self.protocol
        return [
            JoinGroupMember(
                member_id=member.member_id,
                metadata=member.metadata(protocol),
                group_instance_id=member.group_instance_id,
            )
            for member in self._members.values()
        ]

    def join_response(self, member_id: str, *, skip_assignment: bool = False) -> JoinGroupResponse:
        """The current generation as told to ``member_id``; the leader also gets the members."""
        is_leader = member_id == self.leader_id
        return JoinGroupResponse(
            generation_id=self.generation_id,
            protocol_type=self.protocol_type or "",
            protocol_name=self.protocol or "",
            leader=self.leader_id or "",
            member_id=member_id,
            members=self.member_metadata() if is_leader else [],
            skip_assignment=skip_assignment and is_leader,
        )

    def to_record(self, assignments: dict[str, bytes], now_ms: int) -> GroupRecord:
        """The record of the current generation with ``assignments`` for its members."""
        protocol = self.protocol or ""
        members = (
            [
                member.to_record(protocol, assignments.get(member.member_id, b""))
                for member in self._members.values()
            ]
            if protocol
            else []
        )
        return GroupRecord(
            group_id=self.group_id,
            protocol_type=self.protocol_type or "",
            generation_id=self.generation_id,
            protocol=protocol,
            leader=self.leader_id or "",
            state_timestamp_ms=now_ms,
            members=members,
        )

    @classmethod
    def from_record(cls, record: GroupRecord) -> Group:
        """A group as stored: Stable with its members, or Empty."""
        group = cls(record.group_id, record.state_timestamp_ms)
        group.generation_id = record.generation_id
        group.protocol_type = record.protocol_type or None
        if record.members:
            group.protocol = record.protocol
            group._state = GroupState.STABLE
            for stored in record.members:
                member = Member.from_record(stored, record.protocol_type, record.protocol)
                group._members[member.member_id] = member
                if member.group_instance_id is not None:
                    group._static_members[member.group_instance_id] = member.member_id
                # what a stored member speaks is the group's protocol: a newcomer must too
                group._protocol_support.update(set(member.protocol_names))
            group.leader_id = record.leader if record.leader in group._members else None
            if group.leader_id is None:
                group.leader_id = next(iter(group._members))
        return group

    # -- views -------------------------------------------------------------------

    def is_in_any(self, state_names: set[str]) -> bool:
        """Whether the group's state is one of ``state_names`` (lower case)."""
        return self._state.value.lower() in state_names

    def overview(self) -> ListedGroup:
        return ListedGroup(
            group_id=self.group_id,
            protocol_type=self.protocol_type or "",
            state=self._state.value,
        )

    def describe(self) -> DescribedGroup:
        """The DescribeGroup view; metadata and assignments only once the group is Stable."""
        protocol = self.protocol if self.is_in(GroupState.STABLE) else None
        members = [
            DescribedMember(
                member_id=member.member_id,
                client_id=member.client_id,
                client_host=member.client_host,
                metadata=member.metadata(protocol) if protocol else b"",
                assignment=member.assignment if protocol else b"",
                group_instance_id=member.group_instance_id,
            )
            for member in self._members.values()
        ]
        return DescribedGroup(
            group_id=self.group_id,
            state=self._state.value,
            protocol_type=self.protocol_type or "",
            protocol=protocol or "",
            members=members,
            generation_id=self.generation_id,
            leader=self.leader_id or "",
            rebalance_reason=self.rebalance_reason,
            last_rebalance_time_ms=-1 if self.last_rebalance_ms is None else self.last_rebalance_ms,
            state_timestamp_ms=self.state_timestamp_ms,
            rebalances=list(self.rebalance_history),
        )
