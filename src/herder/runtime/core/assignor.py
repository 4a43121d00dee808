"""The leader's eager round-robin assignment of connectors and tasks to workers.

Pure: the group leader calls :meth:`EagerAssignor.assign` with every member's metadata
and its own config snapshot, and sends each member the :class:`~.protocol.Assignment`
it returns. Given the same inputs it always gives the same answer.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Mapping
from typing import Final

from herder.runtime.core.config_state import ClusterConfigSnapshot, TargetState
from herder.runtime.core.protocol import (
    CONNECT_PROTOCOL_V0,
    Assignment,
    AssignmentError,
    ConnectorTaskId,
    ConnectProtocol,
    WorkerMetadata,
)

__all__ = ["EagerAssignor", "config_mismatch"]

log = logging.getLogger(__name__)


def config_mismatch(
    leader_id: str,
    members: Mapping[str, WorkerMetadata],
    snapshot: ClusterConfigSnapshot,
    version: int = CONNECT_PROTOCOL_V0,
) -> dict[str, Assignment] | None:
    """What every member gets when the leader is behind one of them (seeds 001/002):
    CONFIG_MISMATCH with the highest offset seen, so each reads to the end and rejoins.
    None when the leader has read as far as every member, so it may assign."""
    if leader_id not in members:
        raise ValueError(f"leader {leader_id!r} is not among the members")
    max_offset = max(m.config_offset for m in members.values())
    if snapshot.offset >= max_offset:
        return None
    log.warning(
        "Leader %s has read the config log to %d but a member is at %d; "
        "assigning nothing (CONFIG_MISMATCH)",
        leader_id,
        snapshot.offset,
        max_offset,
    )
    mismatch = Assignment(
        version=version,
        error=AssignmentError.CONFIG_MISMATCH,
        leader=leader_id,
        leader_url=members[leader_id].url,
        config_offset=max_offset,
    )
    return dict.fromkeys(members, mismatch)


class EagerAssignor:
    """Kafka Connect's original assignor (``connect.protocol=eager``).

    Members and connectors are sorted, and one circular walk over the members deals out
    every connector first, then every connector's tasks in order. Dealing connectors
    before tasks matters: dealing a connector and then its tasks in one pass would, for
    the common single-task connector on an even number of workers, put every connector
    on the even workers and every task, the part that does the work, on the odd ones.

    Target states do not move work: a PAUSED connector keeps its tasks where they are,
    and a STOPPED connector is assigned (it must answer for itself) but has no tasks.
    A connector whose task set is inconsistent is assigned without tasks: none of them
    may start until the worker running the connector has written a complete set.

    A group whose workers offer the cooperative protocols as well as eager falls back to
    eager while one of them offers eager alone. The cooperative workers come into that
    first eager round still running their work (they keep it across rejoins) and say so
    in their metadata: that round hands out nothing and revokes what they hold, and once
    they have stopped it and rejoined, the work is dealt out as ever. Dealing it out at
    once would start it on a second worker while the first still runs it.
    """

    protocol: Final = ConnectProtocol.EAGER

    def assign(
        self,
        leader_id: str,
        members: Mapping[str, WorkerMetadata],
        snapshot: ClusterConfigSnapshot,
    ) -> dict[str, Assignment]:
        """Every member's assignment for this generation, keyed by member id.

        ``snapshot`` is the leader's view of the config log; its offset is the leader's
        config offset. If some member has read further than that, the leader could not
        catch up before assigning, so nobody gets work: every member gets
        CONFIG_MISMATCH with the highest offset seen, reads to the end and rejoins.
        """
        mismatch = config_mismatch(leader_id, members, snapshot)
        if mismatch is not None:
            return mismatch
        leader_url = members[leader_id].url

        holding = sorted(m for m, md in members.items() if md.connectors or md.tasks)
        if holding:
            log.info(
                "Leader %s: members %s still hold work from a cooperative generation; "
                "revoking it before dealing anything out",
                leader_id,
                holding,
            )
            return {
                member: Assignment(
                    leader=leader_id,
                    leader_url=leader_url,
                    config_offset=snapshot.offset,
                    revoked_connectors=md.connectors,
                    revoked_tasks=md.tasks,
                )
                for member, md in members.items()
            }

        connectors: dict[str, list[str]] = {m: [] for m in members}
        tasks: dict[str, list[ConnectorTaskId]] = {m: [] for m in members}
        dealer = itertools.cycle(sorted(members))
        names = sorted(snapshot.connectors)
        for name in names:
            connectors[next(dealer)].append(name)
        for name in names:
            if snapshot.target_state(name) is TargetState.STOPPED:
                continue
            for task in snapshot.tasks(name):
                tasks[next(dealer)].append(task)

        return {
            member: Assignment(
                leader=leader_id,
                leader_url=leader_url,
                config_offset=snapshot.offset,
                connectors=tuple(connectors[member]),
                tasks=tuple(tasks[member]),
            )
            for member in members
        }
