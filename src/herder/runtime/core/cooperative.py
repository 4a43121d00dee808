"""The leader's incremental cooperative assignment (KIP-415, ``compatible``/``sessioned``).

Under the eager protocol every rebalance stops all work everywhere. Here each worker
joins saying what it holds, and the leader moves only what must move, in two rounds:
the first *revokes* it from the worker holding it (that worker stops it and rejoins),
the follow-up round gives it to its new worker. Nothing is ever given to a worker while
another member still holds it, so a task never runs on two members at once.

Work of a worker that left the group is *lost*: nobody holds it and nobody is told to
stop it. The leader holds it back for ``scheduled.rebalance.max.delay.ms``, so that a
worker that is only restarting gets its work back (it comes back with the same URL) and
nothing else moves; when the delay runs out the lost work goes to whoever has room.
Every member is told how much of the delay is left, and rejoins when it has passed.
While lost work is held back nothing is revoked to balance the load either.

Revoking rebalances in a row are backed off (Connect's KAFKA-12495): when a round would
revoke work to balance the load and the round before revoked too, it revokes nothing and
asks everyone to rejoin after 40 ms, then 1.6 s, then 64 s (at most
``scheduled.rebalance.max.delay.ms``), so workers coming and going one after another do
not make the group shuffle its work back and forth at every step.

Pure: :meth:`CooperativeAssignor.assign` takes the leader's :class:`Memory` of the
previous round and returns the new one beside the assignments; the same inputs always
give the same answer.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from herder.runtime.core.assignor import config_mismatch
from herder.runtime.core.config_state import ClusterConfigSnapshot, TargetState
from herder.runtime.core.protocol import (
    CONNECT_PROTOCOL_V1,
    Assignment,
    ConnectorTaskId,
    WorkerMetadata,
)

__all__ = ["CooperativeAssignor", "Held", "Memory"]

log = logging.getLogger(__name__)

#: Connect's default ``scheduled.rebalance.max.delay.ms``: five minutes
DEFAULT_MAX_DELAY_MS = 300_000

_Item = TypeVar("_Item", str, ConnectorTaskId)


@dataclass(frozen=True)
class Held:
    """Connectors and tasks held by one worker."""

    connectors: frozenset[str] = frozenset()
    tasks: frozenset[ConnectorTaskId] = frozenset()

    def __bool__(self) -> bool:
        return bool(self.connectors or self.tasks)

    def __or__(self, other: Held) -> Held:
        return Held(self.connectors | other.connectors, self.tasks | other.tasks)

    def __sub__(self, other: Held) -> Held:
        return Held(self.connectors - other.connectors, self.tasks - other.tasks)

    def __and__(self, other: Held) -> Held:
        return Held(self.connectors & other.connectors, self.tasks & other.tasks)


@dataclass(frozen=True)
class Memory:
    """What the leader remembers from its previous round.

    ``members`` is each member's work after that round (without what it was told to
    give up), with its URL; ``lost`` the work of departed workers held back, by their
    URL, until ``lost_until_ms``. A new leader starts from the empty memory: it cannot
    tell lost work from new work, so it hands out at once whatever nobody holds.
    """

    members: Mapping[str, tuple[str, Held]] = field(default_factory=dict)
    lost: Mapping[str, Held] = field(default_factory=dict)
    lost_until_ms: int | None = None
    #: whether the previous round revoked work to balance the load, and how many rounds
    #: in a row wanted to
    revoked_in_previous: bool = False
    successive_revoking: int = 0
    #: a revoking round backed off: no load-balancing revocation before this time
    revoke_after_ms: int | None = None


class CooperativeAssignor:
    """Connect's IncrementalCooperativeAssignor, in its rules rather than its code.

    Connectors and tasks are balanced separately, each to within one of the mean: a
    worker may keep up to its share (the larger shares go to the workers already
    holding most, so the fewest move); what it holds beyond is revoked; what nobody
    holds goes to the workers with the most room. A worker that holds something twice
    over with another member, or something no longer configured (a deleted connector,
    the tasks of a STOPPED one), gives it up.
    """

    def __init__(
        self, max_delay_ms: int = DEFAULT_MAX_DELAY_MS, version: int = CONNECT_PROTOCOL_V1
    ) -> None:
        self.max_delay_ms = max_delay_ms
        self.version = version

    def assign(
        self,
        leader_id: str,
        members: Mapping[str, WorkerMetadata],
        snapshot: ClusterConfigSnapshot,
        memory: Memory,
        now_ms: int,
    ) -> tuple[dict[str, Assignment], Memory]:
        """Every member's assignment for this round, keyed by member id, and what the
        leader must remember for the next one."""
        mismatch = config_mismatch(leader_id, members, snapshot, self.version)
        if mismatch is not None:
            return mismatch, memory
        leader_url = members[leader_id].url

        configured = _configured(snapshot)
        owned = {
            member: Held(frozenset(md.connectors), frozenset(md.tasks))
            for member, md in members.items()
        }
        twice = _held_twice(owned.values())
        revoked = {member: held - configured | (held & twice) for member, held in owned.items()}
        kept = {member: owned[member] - revoked[member] for member in members}
        # what a member holds, even what it must give up, goes to nobody else this round
        unheld = configured - _union(owned.values())

        lost, lost_until = self._lost(members, memory, unheld, now_ms)
        urls = {md.url: member for member, md in members.items()}
        returned = {
            urls[url]: work & unheld for url, work in lost.items() if url in urls and work & unheld
        }
        lost = {url: work for url, work in lost.items() if url not in urls}
        held_back = _union(lost.values())
        if not held_back:
            lost_until = None
        elif lost_until is not None and now_ms >= lost_until:
            log.info("Leader %s: the delay for lost work has passed; reassigning it", leader_id)
            lost, held_back, lost_until = {}, Held(), None
        to_assign = unheld - held_back

        def balance(revoke: bool) -> tuple[_Balance[str], _Balance[ConnectorTaskId]]:
            return (
                _Balance(
                    {m: kept[m].connectors for m in members},
                    {m: returned.get(m, Held()).connectors for m in members},
                    to_assign.connectors,
                    revoke=revoke,
                ),
                _Balance(
                    {m: kept[m].tasks for m in members},
                    {m: returned.get(m, Held()).tasks for m in members},
                    to_assign.tasks,
                    revoke=revoke,
                ),
            )

        revoked_before = memory.revoked_in_previous
        successive = memory.successive_revoking
        revoke_after = memory.revoke_after_ms
        if revoke_after is not None and now_ms >= revoke_after:
            # the backoff has passed: the next revoking round may revoke
            revoke_after, revoked_before = None, False
        holding_back = lost_until is not None or revoke_after is not None
        connectors, tasks = balance(revoke=not holding_back)
        balancing = connectors.revokes or tasks.revokes
        revoked_now = False
        if holding_back or not balancing:
            successive = 0
        elif revoked_before:
            successive += 1
            backoff = self._backoff(successive)
            if backoff > 0:
                log.info(
                    "Leader %s: revoking rebalances in a row; revoking nothing to balance the "
                    "load for %d ms",
                    leader_id,
                    backoff,
                )
                revoke_after = now_ms + backoff
                connectors, tasks = balance(revoke=False)
            else:
                revoked_now = True
        else:
            revoked_now = True
        delay = min(
            (d - now_ms for d in (lost_until, revoke_after) if d is not None and d > now_ms),
            default=0,
        )
        result: dict[str, Assignment] = {}
        remembered: dict[str, tuple[str, Held]] = {}
        for member in members:
            final = Held(frozenset(connectors.final[member]), frozenset(tasks.final[member]))
            gone = revoked[member] | Held(
                frozenset(connectors.revoked[member]), frozenset(tasks.revoked[member])
            )
            remembered[member] = (members[member].url, final)
            result[member] = Assignment(
                version=self.version,
                leader=leader_id,
                leader_url=leader_url,
                config_offset=snapshot.offset,
                connectors=tuple(sorted(final.connectors)),
                tasks=tuple(sorted(final.tasks)),
                revoked_connectors=tuple(sorted(gone.connectors)),
                revoked_tasks=tuple(sorted(gone.tasks)),
                delay=delay,
            )
        return result, Memory(
            remembered,
            lost,
            lost_until,
            revoked_in_previous=revoked_now,
            successive_revoking=successive,
            revoke_after_ms=revoke_after,
        )

    def _backoff(self, successive: int) -> int:
        """How long the ``successive``-th revoking round in a row waits (Connect's
        exponential backoff: 40 ms, 1.6 s, 64 s, ..., at most the scheduled delay)."""
        if self.max_delay_ms <= 0:
            return 0
        return int(min(self.max_delay_ms, 40 ** min(successive, 8)))

    def _lost(
        self, members: Mapping[str, WorkerMetadata], memory: Memory, unheld: Held, now_ms: int
    ) -> tuple[dict[str, Held], int | None]:
        """The work of departed workers that nobody holds, by their URL, and until when
        it is held back (None: nothing is, or it goes out at once)."""
        lost = {url: work & unheld for url, work in memory.lost.items() if work & unheld}
        lost_until = memory.lost_until_ms
        for member, (url, work) in sorted(memory.members.items()):
            if member in members or not work & unheld:
                continue
            lost[url] = lost.get(url, Held()) | (work & unheld)
            if lost_until is None:
                lost_until = now_ms + self.max_delay_ms
                log.info(
                    "Worker %s (%s) left the group; holding its work back for %d ms",
                    member,
                    url,
                    self.max_delay_ms,
                )
        if not lost or self.max_delay_ms <= 0:
            return {}, None
        return lost, lost_until


class _Balance(Generic[_Item]):
    """One kind of work (connectors or tasks) balanced over the members."""

    def __init__(
        self,
        kept: Mapping[str, frozenset[_Item]],
        returned: Mapping[str, frozenset[_Item]],
        unheld: frozenset[_Item],
        *,
        revoke: bool = True,
    ) -> None:
        """``revoke``: take what a member holds beyond its share from it; otherwise
        every member keeps all it holds and only what nobody holds is spread."""
        members = sorted(kept)
        total = sum(len(kept[m]) for m in members) + len(unheld)
        share, extra = divmod(total, len(members))
        # the larger shares go to the workers holding most already, so fewest move
        by_load = sorted(members, key=lambda m: (-len(kept[m]), m))
        target = {m: share + (1 if i < extra else 0) for i, m in enumerate(by_load)}
        self.revoked: dict[str, list[_Item]] = {}
        self.final: dict[str, list[_Item]] = {}
        for m in members:
            ordered = sorted(kept[m])
            share = target[m] if revoke else len(ordered)
            self.revoked[m] = ordered[share:]
            self.final[m] = ordered[:share]
        preferred = {item: m for m in members for item in returned[m]}
        for item in sorted(unheld):
            owner = preferred.get(item)
            if owner is None or len(self.final[owner]) >= target[owner]:
                owner = min(members, key=lambda m: (len(self.final[m]) - target[m], m))
            self.final[owner].append(item)

    @property
    def revokes(self) -> bool:
        return any(self.revoked.values())


def _configured(snapshot: ClusterConfigSnapshot) -> Held:
    """The work to run: every connector, and the tasks of those not STOPPED."""
    tasks: set[ConnectorTaskId] = set()
    for name in snapshot.connectors:
        if snapshot.target_state(name) is not TargetState.STOPPED:
            tasks.update(snapshot.tasks(name))
    return Held(frozenset(snapshot.connectors), frozenset(tasks))


def _held_twice(held: Iterable[Held]) -> Held:
    seen, twice = Held(), Held()
    for work in held:
        twice = twice | (seen & work)
        seen = seen | work
    return twice


def _union(held: Iterable[Held]) -> Held:
    out = Held()
    for work in held:
        out = out | work
    return out
