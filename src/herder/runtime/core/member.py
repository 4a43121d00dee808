"""A group member's protocol as a pure state machine, in the shape of Kafka's
AbstractCoordinator.

**How to drive it.** Every method takes the current time (``now_ms``) and returns the
effects to carry out, in order:

* :class:`SendJoin`, :class:`SendSync`, :class:`SendHeartbeat`: send the request to the
  group coordinator and feed its answer back with the same token (``join_answered``,
  ``sync_answered``, ``heartbeat_answered``), or an error that came instead of an
  answer (connection lost, no coordinator found) to ``request_failed``. The machine
  awaits one request at a time: a new ``Send*`` makes every earlier token stale, an
  answer with a stale token is ignored, and the shell may abandon the earlier request.
* :class:`SendLeave`: fire and forget.
* :class:`Rediscover`: drop the coordinator connection; the next request finds the
  coordinator again.
* :class:`Revoke`: stop all work of that generation, then call ``revoked``.
* :class:`Assign` (the leader only): run the assignor over the members' metadata and
  feed the result to ``assignment_made``.
* :class:`Assigned`: from now on the member holds ``assignment`` in ``generation``
  (in cooperative mode: stop what it revokes, then call ``revoked``).
* :class:`HeartbeatFailed`: news for a callback; the machine has dealt with it.
* :class:`Failed`: the member stops for good; nothing is emitted after it.

Call ``tick`` whenever ``next_deadline_ms`` has passed: a heartbeat may be due, a
backoff over, a request past its deadline. The machine, not the transport, times its
requests out (JoinGroup and SyncGroup after the rebalance timeout plus 5 s, a heartbeat
after three intervals, at least 3 s) and treats an expired request as a retriable
failure.

**A round.** JoinGroup (MEMBER_ID_REQUIRED: again at once with the id it gives;
UNKNOWN_MEMBER_ID: again at once without an id; REBALANCE_IN_PROGRESS or
ILLEGAL_GENERATION: again at once with the id), the assignor if this member leads,
SyncGroup (the same answers but MEMBER_ID_REQUIRED), then heartbeats every
``heartbeat_interval_ms``. NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE,
COORDINATOR_LOAD_IN_PROGRESS and any retriable failure drop the coordinator and join
again after a jittered backoff that doubles from ``retry_backoff_ms`` up to
``retry_backoff_max_ms`` and starts over once a round succeeds. Anything else is fatal.
An error raised in place of an answer is judged by its code as the answer would be.

**Revocation.** Before every join that follows an assignment the machine emits
:class:`Revoke` and sends the JoinGroup only after ``revoked``. Heartbeats for the held
generation go on meanwhile, so the session survives a revocation slower than it; they
stop when the JoinGroup is sent. A heartbeat answered REBALANCE_IN_PROGRESS starts that
(heartbeats going on); ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID (which forgets the id) and
FENCED too, but stop the heartbeats, whose generation is over; a coordinator error or a
lost heartbeat drops the coordinator and the heartbeats go on against the next one.

**Cooperative mode** (a generation whose protocol is one of ``cooperative_protocols``,
Connect's ``compatible`` and ``sessioned``, KIP-415): the member keeps its work across a
rejoin, so no :class:`Revoke`
precedes a join. Instead every :class:`Assigned` opens a revocation: the holder stops
what the assignment revokes (perhaps nothing), calls ``revoked`` and, if it stopped
anything, ``request_rejoin`` so the leader can hand it on; no JoinGroup goes out in
between, so the metadata of the next join never claims work that is on its way out.
Only when the member learns that its generation went on without it (a heartbeat
answered ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID or FENCED, or a join or sync answered
UNKNOWN_MEMBER_ID) does it give everything up with :class:`Revoke` before it joins:
its work may have been handed to others meanwhile.

**Leaving.** ``leave`` emits :class:`Revoke` (if an assignment is held) and then
:class:`SendLeave` at once, without waiting for ``revoked``: the others rebalance
without this member straight away, as after Kafka's ``maybeLeaveGroup``, instead of
waiting for a member that may be busy elsewhere (a Connect herder leaves from its own
loop, which is also what stops the revoked work). The member forgets its id and stays
out until ``request_rejoin``; a join then still waits for the revocation to be done.
``close`` only leaves: whoever closes a member stops its work themselves.
"""

from __future__ import annotations

import enum
import logging
import random
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

from herder.coordinator import messages as m
from herder.errors import ErrorCode, HerderError, RequestTimedOut, error_from_code

log = logging.getLogger(__name__)

#: how much longer than the rebalance timeout a member waits for JoinGroup and SyncGroup
JOIN_TIMEOUT_LAPSE_MS = 5_000
#: the least heartbeat interval a heartbeat's deadline (three intervals) is counted from
MIN_HEARTBEAT_TIMEOUT_BASE_MS = 1_000
#: a backoff is drawn from [1 - JITTER, 1 + JITTER] times its exponential term
BACKOFF_JITTER = 0.2

#: answers after which the member must find the coordinator again
_REDISCOVER = frozenset(
    {
        ErrorCode.NOT_COORDINATOR,
        ErrorCode.COORDINATOR_NOT_AVAILABLE,
        ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
    }
)
#: answers to a join or a sync after which the member joins again at once, keeping its id
_REJOIN = frozenset({ErrorCode.REBALANCE_IN_PROGRESS, ErrorCode.ILLEGAL_GENERATION})
#: heartbeat answers that end the generation the heartbeats are for
_GENERATION_OVER = frozenset(
    {ErrorCode.ILLEGAL_GENERATION, ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.FENCED}
)


@dataclass(frozen=True)
class Generation:
    """One generation of the group as this member saw it after a successful sync."""

    generation_id: int
    member_id: str
    leader_id: str
    protocol: str
    members: tuple[str, ...] = ()

    @property
    def is_leader(self) -> bool:
        return self.member_id == self.leader_id


class MemberState(enum.Enum):
    #: not in a generation: joins once started and any backoff is over
    UNJOINED = "unjoined"
    #: gave an assignment up and waits for ``revoked`` before it may join
    REVOKING = "revoking"
    #: JoinGroup sent
    JOINING = "joining"
    #: the assignor runs (leader) or SyncGroup is sent
    SYNCING = "syncing"
    #: holds an assignment and heartbeats
    STABLE = "stable"
    #: left the group; stays out until ``request_rejoin``
    LEFT = "left"
    #: failed for good (``failure`` says why)
    FAILED = "failed"
    CLOSED = "closed"


# -- effects ----------------------------------------------------------------------------


@dataclass(frozen=True)
class SendJoin:
    token: int
    request: m.JoinGroupRequest


@dataclass(frozen=True)
class SendSync:
    token: int
    request: m.SyncGroupRequest


@dataclass(frozen=True)
class SendHeartbeat:
    token: int
    request: m.HeartbeatRequest


@dataclass(frozen=True)
class SendLeave:
    """Fire and forget: no answer is fed back."""

    request: m.LeaveGroupRequest


@dataclass(frozen=True)
class Rediscover:
    """Drop the coordinator connection and find the coordinator again."""


@dataclass(frozen=True)
class Revoke:
    """Stop all work of ``generation``; call ``MemberMachine.revoked`` when it has stopped."""

    generation: Generation


@dataclass(frozen=True)
class Assign:
    """This member leads: run the assignor, call ``MemberMachine.assignment_made``."""

    token: int
    leader_id: str
    protocol: str
    members: dict[str, bytes]


@dataclass(frozen=True)
class Assigned:
    generation: Generation
    assignment: bytes


@dataclass(frozen=True)
class HeartbeatFailed:
    """A heartbeat failed (``error`` is the error's name); the machine has handled it."""

    error: str


@dataclass(frozen=True)
class Failed:
    """Fatal: the member stops for good."""

    error: HerderError


Effect = (
    SendJoin
    | SendSync
    | SendHeartbeat
    | SendLeave
    | Rediscover
    | Revoke
    | Assign
    | Assigned
    | HeartbeatFailed
    | Failed
)


class _Kind(enum.Enum):
    JOIN = "JoinGroup"
    ASSIGN = "the assignor"
    SYNC = "SyncGroup"
    HEARTBEAT = "Heartbeat"


@dataclass(frozen=True)
class _Awaited:
    kind: _Kind
    token: int
    #: None: no deadline (the assignor runs in the member's own process)
    deadline_ms: int | None


class MemberMachine:
    """One member of ``group_id``: joins, syncs, heartbeats, revokes, leaves."""

    def __init__(
        self,
        group_id: str,
        *,
        protocol_type: str,
        protocols: Callable[[], Sequence[tuple[str, bytes]]],
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
        heartbeat_interval_ms: int,
        client_id: str,
        client_host: str,
        retry_backoff_ms: int = 100,
        retry_backoff_max_ms: int = 2000,
        request_timeout_ms: int = 30_000,
        rng: random.Random,
        group_instance_id: str | None = None,
        cooperative_protocols: Collection[str] = (),
    ) -> None:
        self.group_id = group_id
        self.protocol_type = protocol_type
        #: (name, metadata) in order of preference, asked afresh for every JoinGroup
        self.protocols = protocols
        self.session_timeout_ms = session_timeout_ms
        self.rebalance_timeout_ms = rebalance_timeout_ms
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.client_id = client_id
        self.client_host = client_host
        self.retry_backoff_ms = retry_backoff_ms
        self.retry_backoff_max_ms = max(retry_backoff_max_ms, retry_backoff_ms)
        #: for the requests of the shell outside the protocol's rounds (offsets)
        self.request_timeout_ms = request_timeout_ms
        self._rng = rng
        #: a static member's instance id (KIP-345): it keeps its place across restarts
        self.group_instance_id = group_instance_id
        #: in a generation of these protocols the member keeps its work across rejoins
        #: and revocations come with assignments (KIP-415)
        self.cooperative_protocols = frozenset(cooperative_protocols)

        self.state = MemberState.UNJOINED
        self.member_id = m.NO_MEMBER_ID
        #: the generation whose assignment this member holds (None while rebalancing,
        #: unless cooperative: then it is held until the next one or given up)
        self.generation: Generation | None = None
        self.failure: HerderError | None = None

        self._started = False
        self._tokens = 0
        #: the one request (or assignor run) whose answer is awaited
        self._awaited: _Awaited | None = None
        #: the JoinGroup answer of the round under way, until its SyncGroup is answered
        self._joined: m.JoinGroupResponse | None = None
        #: a join round is wanted
        self._rejoin = False
        #: revocations opened (a Revoke, or an Assigned in cooperative mode) that
        #: ``revoked`` has not closed yet
        self._revocations = 0
        #: cooperative: the held generation went on without this member
        self._generation_lost = False
        #: the generation heartbeats go out for (None: no heartbeats)
        self._heartbeat_generation: Generation | None = None
        self._heartbeat_due_ms: int | None = None
        #: no JoinGroup before this (a backoff after a retriable failure)
        self._retry_at_ms: int | None = None
        #: retriable failures since the last successful round: the backoff's exponent
        self._retries = 0

    # -- events -----------------------------------------------------------------------

    def start(self, now_ms: int) -> list[Effect]:
        """Join the group (unless :meth:`leave` came first: then not until asked to)."""
        if self._started or self.state in (MemberState.FAILED, MemberState.CLOSED):
            return []
        self._started = True
        if self.state is MemberState.UNJOINED:
            self._rejoin = True
        return self._advance(now_ms, [])

    def join_answered(self, token: int, response: m.JoinGroupResponse, now_ms: int) -> list[Effect]:
        if not self._awaits(_Kind.JOIN, token):
            return []
        self._awaited = None
        out: list[Effect] = []
        code = response.error_code
        if code == ErrorCode.NONE:
            self.member_id = response.member_id
            self._joined = response
            self.state = MemberState.SYNCING
            if response.leader == self.member_id and not response.skip_assignment:
                token = self._token()
                self._awaited = _Awaited(_Kind.ASSIGN, token, None)
                members = {member.member_id: member.metadata for member in response.members}
                out.append(Assign(token, response.leader, response.protocol_name, members))
            else:
                self._send_sync(now_ms, [], out)
        elif code == ErrorCode.MEMBER_ID_REQUIRED:
            log.debug("group %s: rejoining with member id %s", self.group_id, response.member_id)
            self.member_id = response.member_id
            self._round_over()
        else:
            self._round_failed(_Kind.JOIN, self._error(_Kind.JOIN, code), now_ms, out)
        return self._advance(now_ms, out)

    def assignment_made(
        self, token: int, assignments: Mapping[str, bytes], now_ms: int
    ) -> list[Effect]:
        if not self._awaits(_Kind.ASSIGN, token):
            return []
        self._awaited = None
        out: list[Effect] = []
        given = [
            m.SyncGroupAssignment(member_id=member_id, assignment=assignment)
            for member_id, assignment in assignments.items()
        ]
        self._send_sync(now_ms, given, out)
        return self._advance(now_ms, out)

    def sync_answered(self, token: int, response: m.SyncGroupResponse, now_ms: int) -> list[Effect]:
        if not self._awaits(_Kind.SYNC, token):
            return []
        self._awaited = None
        joined, self._joined = self._joined, None
        assert joined is not None
        out: list[Effect] = []
        code = response.error_code
        if code == ErrorCode.NONE:
            generation = Generation(
                joined.generation_id,
                self.member_id,
                joined.leader,
                joined.protocol_name,
                tuple(sorted(member.member_id for member in joined.members)),
            )
            log.info(
                "member %s joined group %s generation %d (leader %s)",
                self.member_id,
                self.group_id,
                generation.generation_id,
                generation.leader_id,
            )
            self.generation = generation
            self.state = MemberState.STABLE
            self._retries = 0
            self._heartbeat_generation = generation
            self._heartbeat_due_ms = now_ms + self.heartbeat_interval_ms
            self._generation_lost = False
            out.append(Assigned(generation, response.assignment))
            if generation.protocol in self.cooperative_protocols:
                self._revocations += 1
        else:
            self._round_failed(_Kind.SYNC, self._error(_Kind.SYNC, code), now_ms, out)
        return self._advance(now_ms, out)

    def heartbeat_answered(
        self, token: int, response: m.HeartbeatResponse, now_ms: int
    ) -> list[Effect]:
        if not self._awaits(_Kind.HEARTBEAT, token):
            return []
        self._awaited = None
        out: list[Effect] = []
        code = response.error_code
        if code == ErrorCode.NONE:
            self._heartbeat_due_ms = now_ms + self.heartbeat_interval_ms
        else:
            self._heartbeat_failed(self._error(_Kind.HEARTBEAT, code), now_ms, out)
        return self._advance(now_ms, out)

    def request_failed(self, token: int, error: HerderError, now_ms: int) -> list[Effect]:
        """An error came instead of the answer to ``token`` (or the assignor raised)."""
        awaited = self._awaited
        if awaited is None or awaited.token != token:
            return []
        self._awaited = None
        out: list[Effect] = []
        self._failed(awaited.kind, error, now_ms, out)
        return self._advance(now_ms, out)

    def revoked(self, now_ms: int) -> list[Effect]:
        """The work of the oldest open revocation has stopped (in cooperative mode: what
        the latest assignment revoked, perhaps nothing)."""
        if not self._revocations or self.state in (MemberState.FAILED, MemberState.CLOSED):
            return []
        self._revocations -= 1
        return self._advance(now_ms, [])

    def request_rejoin(self, now_ms: int) -> list[Effect]:
        """Join again at the next opportunity (e.g. this member's metadata changed)."""
        if self.state in (MemberState.FAILED, MemberState.CLOSED):
            return []
        if self.state is MemberState.LEFT:
            self.state = MemberState.UNJOINED
        self._rejoin = True
        return self._advance(now_ms, [])

    def leave(self, now_ms: int) -> list[Effect]:
        """Leave the group now (see the module's docstring for the order of effects)."""
        if self.state in (MemberState.FAILED, MemberState.CLOSED, MemberState.LEFT):
            return []
        out: list[Effect] = []
        if self.generation is not None:
            self._give_up(out)
        if self.member_id:
            out.append(SendLeave(self._leave_request()))
        log.info("member %s leaves group %s", self.member_id or "(no id yet)", self.group_id)
        self.member_id = m.NO_MEMBER_ID
        self._stop()
        self.state = MemberState.LEFT
        return out

    def close(self, now_ms: int, *, leave: bool | None = None) -> list[Effect]:
        """Stop for good. ``leave``: None leaves the group unless the member is static
        (a restart within its session timeout takes its place back without a rebalance,
        KIP-345); True leaves it in any case (a static member is named by its instance
        id, so its place goes with it); False stays (the session runs out instead)."""
        if self.state in (MemberState.FAILED, MemberState.CLOSED):
            return []
        out: list[Effect] = []
        if leave is None:
            leave = self.group_instance_id is None
        if leave and self.member_id:
            out.append(SendLeave(self._leave_request()))
        self._stop()
        self.state = MemberState.CLOSED
        return out

    def _leave_request(self) -> m.LeaveGroupRequest:
        if self.group_instance_id is None:
            return m.LeaveGroupRequest(group_id=self.group_id, member_ids=[self.member_id])
        return m.LeaveGroupRequest(
            group_id=self.group_id,
            members=[
                m.LeavingMember(member_id=self.member_id, group_instance_id=self.group_instance_id)
            ],
        )

    def tick(self, now_ms: int) -> list[Effect]:
        """Whatever is due: a request past its deadline, the end of a backoff, a heartbeat."""
        out: list[Effect] = []
        awaited = self._awaited
        if (
            awaited is not None
            and awaited.deadline_ms is not None
            and now_ms >= awaited.deadline_ms
        ):
            self._awaited = None
            error = RequestTimedOut(
                f"{awaited.kind.value} for group {self.group_id} got no answer in "
                f"{self._timeout_ms(awaited.kind)} ms"
            )
            self._failed(awaited.kind, error, now_ms, out)
        return self._advance(now_ms, out)

    def next_deadline_ms(self) -> int | None:
        """When :meth:`tick` has something to do next (None: only an event can change it)."""
        if self.state in (MemberState.FAILED, MemberState.CLOSED):
            return None
        due: list[int] = []
        if self._awaited is not None and self._awaited.deadline_ms is not None:
            due.append(self._awaited.deadline_ms)
        heartbeat = self._heartbeats_due_at()
        if heartbeat is not None:
            due.append(heartbeat)
        if self._joins_waiting() and not self._revocations and self._retry_at_ms is not None:
            due.append(self._retry_at_ms)
        return min(due) if due else None

    # -- what happens next --------------------------------------------------------------

    def _advance(self, now_ms: int, out: list[Effect]) -> list[Effect]:
        """Send what the state calls for now: the JoinGroup of a round, a heartbeat."""
        if self._joins_waiting():
            held = self.generation
            if held is not None and (
                held.protocol not in self.cooperative_protocols or self._generation_lost
            ):
                self._give_up(out)
            if self._revocations:
                self.state = MemberState.REVOKING
            elif self._retry_at_ms is None or now_ms >= self._retry_at_ms:
                self._send_join(now_ms, out)
            else:
                self.state = MemberState.UNJOINED
        due = self._heartbeats_due_at()
        if due is not None and now_ms >= due:
            self._send_heartbeat(now_ms, out)
        return out

    def _joins_waiting(self) -> bool:
        """A round is wanted and none is under way."""
        return (
            self._started
            and self._rejoin
            and self.state in (MemberState.UNJOINED, MemberState.REVOKING, MemberState.STABLE)
        )

    def _heartbeats_due_at(self) -> int | None:
        if self._heartbeat_generation is None or self._awaited is not None:
            return None
        return self._heartbeat_due_ms

    def _give_up(self, out: list[Effect]) -> None:
        assert self.generation is not None
        out.append(Revoke(self.generation))
        self.generation = None
        self._generation_lost = False
        self._revocations += 1

    def _send_join(self, now_ms: int, out: list[Effect]) -> None:
        self._rejoin = False
        self._retry_at_ms = None
        # the heartbeats of the old generation end here, as in Kafka: an answer to one
        # still under way is stale from now on
        self._heartbeat_generation = self._heartbeat_due_ms = None
        self._joined = None
        self.state = MemberState.JOINING
        token = self._await(_Kind.JOIN, now_ms)
        request = m.JoinGroupRequest(
            group_id=self.group_id,
            member_id=self.member_id,
            client_id=self.client_id,
            client_host=self.client_host,
            session_timeout_ms=self.session_timeout_ms,
            rebalance_timeout_ms=self.rebalance_timeout_ms,
            protocol_type=self.protocol_type,
            protocols=[m.JoinGroupProtocol(name=n, metadata=md) for n, md in self.protocols()],
            group_instance_id=self.group_instance_id,
        )
        out.append(SendJoin(token, request))

    def _send_sync(
        self, now_ms: int, assignments: list[m.SyncGroupAssignment], out: list[Effect]
    ) -> None:
        assert self._joined is not None
        token = self._await(_Kind.SYNC, now_ms)
        request = m.SyncGroupRequest(
            group_id=self.group_id,
            generation_id=self._joined.generation_id,
            member_id=self.member_id,
            assignments=assignments,
            group_instance_id=self.group_instance_id,
            protocol_type=self.protocol_type,
            protocol_name=self._joined.protocol_name,
        )
        out.append(SendSync(token, request))

    def _send_heartbeat(self, now_ms: int, out: list[Effect]) -> None:
        generation = self._heartbeat_generation
        assert generation is not None
        self._heartbeat_due_ms = None  # set again by the answer
        token = self._await(_Kind.HEARTBEAT, now_ms)
        request = m.HeartbeatRequest(
            group_id=self.group_id,
            generation_id=generation.generation_id,
            member_id=self.member_id,
            group_instance_id=self.group_instance_id,
        )
        out.append(SendHeartbeat(token, request))

    # -- failures -----------------------------------------------------------------------

    def _failed(self, kind: _Kind, error: HerderError, now_ms: int, out: list[Effect]) -> None:
        if kind is _Kind.HEARTBEAT:
            self._heartbeat_failed(error, now_ms, out)
        else:
            self._round_failed(kind, error, now_ms, out)

    def _round_failed(
        self, kind: _Kind, error: HerderError, now_ms: int, out: list[Effect]
    ) -> None:
        """A join, assignor run or sync failed: join again (at once or after a backoff)
        or fail for good."""
        code = error.code
        if code == ErrorCode.UNKNOWN_MEMBER_ID:
            log.info(
                "group %s: %s answered %s; rejoining without member id %s",
                self.group_id,
                kind.value,
                code.name,
                self.member_id,
            )
            self.member_id = m.NO_MEMBER_ID
            self._generation_lost = True
            self._round_over()
        elif code in _REJOIN:
            log.info("group %s: %s answered %s; rejoining", self.group_id, kind.value, code.name)
            self._round_over()
        elif code in _REDISCOVER or error.retriable:
            delay = self._back_off(now_ms)
            log.info(
                "group %s: %s failed (%s); finding the coordinator, joining again in %d ms",
                self.group_id,
                kind.value,
                error,
                delay,
            )
            out.append(Rediscover())
            self._round_over()
        else:
            self._fail(error, out)

    def _heartbeat_failed(self, error: HerderError, now_ms: int, out: list[Effect]) -> None:
        code = error.code
        log.info(
            "group %s: heartbeat of member %s failed: %s", self.group_id, self.member_id, error
        )
        out.append(HeartbeatFailed(code.name))
        if code == ErrorCode.REBALANCE_IN_PROGRESS:
            # keep the session alive while the work stops: the heartbeats stop only when
            # the JoinGroup goes out
            self._rejoin = True
            self._heartbeat_due_ms = now_ms + self.heartbeat_interval_ms
        elif code in _GENERATION_OVER:
            if code == ErrorCode.UNKNOWN_MEMBER_ID:
                self.member_id = m.NO_MEMBER_ID
            self._generation_lost = True
            self._rejoin = True
            self._heartbeat_generation = self._heartbeat_due_ms = None
        elif code in _REDISCOVER or error.retriable:
            out.append(Rediscover())
            self._heartbeat_due_ms = now_ms + self.heartbeat_interval_ms
        else:
            self._fail(error, out)

    def _round_over(self) -> None:
        """The round under way ended without an assignment; another is wanted."""
        self._joined = None
        self.state = MemberState.UNJOINED
        self._rejoin = True

    def _back_off(self, now_ms: int) -> int:
        term = min(self.retry_backoff_ms * 2 ** min(self._retries, 32), self.retry_backoff_max_ms)
        factor = self._rng.uniform(1 - BACKOFF_JITTER, 1 + BACKOFF_JITTER)
        delay = min(int(term * factor), self.retry_backoff_max_ms)
        self._retries += 1
        self._retry_at_ms = now_ms + delay
        return delay

    def _fail(self, error: HerderError, out: list[Effect]) -> None:
        log.error("group %s: member %s failed: %s", self.group_id, self.member_id, error)
        self.failure = error
        self._stop()
        self.state = MemberState.FAILED
        out.append(Failed(error))

    def _stop(self) -> None:
        """Nothing awaited, no heartbeats, no round wanted."""
        self._awaited = None
        self._joined = None
        self._heartbeat_generation = self._heartbeat_due_ms = None
        self._rejoin = False
        self._retry_at_ms = None
        self._retries = 0

    # -- requests -----------------------------------------------------------------------

    def _token(self) -> int:
        self._tokens += 1
        return self._tokens

    def _await(self, kind: _Kind, now_ms: int) -> int:
        token = self._token()
        self._awaited = _Awaited(kind, token, now_ms + self._timeout_ms(kind))
        return token

    def _awaits(self, kind: _Kind, token: int) -> bool:
        awaited = self._awaited
        return awaited is not None and awaited.kind is kind and awaited.token == token

    def _timeout_ms(self, kind: _Kind) -> int:
        if kind is _Kind.HEARTBEAT:
            return 3 * max(self.heartbeat_interval_ms, MIN_HEARTBEAT_TIMEOUT_BASE_MS)
        return self.rebalance_timeout_ms + JOIN_TIMEOUT_LAPSE_MS

    def _error(self, kind: _Kind, code: int) -> HerderError:
        try:
            name = ErrorCode(code).name
        except ValueError:
            name = f"error code {code}"
        return error_from_code(code, f"{kind.value} for group {self.group_id} failed: {name}")
