"""Group members against the coordinator hosted by a real ensemble server."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from herder.coordinator import apis
from herder.coordinator import messages as m
from herder.coordinator.client import CoordinatorClient, CoordinatorConnections
from herder.coordinator.offsets import TopicPartition
from herder.errors import IllegalGeneration
from herder.runtime.core.member import Generation
from herder.runtime.shell.member import GroupMember
from tests.harness import Processes
from tests.integration.conftest import ServerHandle, make_ensemble

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

RESOURCES = [f"r{i}" for i in range(7)]


def round_robin(leader: str, protocol: str, members: dict[str, bytes]) -> dict[str, bytes]:
    ids = sorted(members)
    out: dict[str, list[str]] = {m: [] for m in ids}
    for i, resource in enumerate(RESOURCES):
        out[ids[i % len(ids)]].append(resource)
    return {m: json.dumps(r).encode() for m, r in out.items()}


class Recorder:
    def __init__(self) -> None:
        self.assignments: list[tuple[Generation, list[str]]] = []
        self.revoked = 0

    async def assigned(self, generation: Generation, data: bytes) -> None:
        self.assignments.append((generation, json.loads(data or b"[]")))

    async def on_revoked(self) -> None:
        self.revoked += 1


def member(server: ServerHandle, rec: Recorder, session_ms: int = 6000) -> GroupMember:
    return GroupMember(
        server.bootstrap,
        "g1",
        protocol_type="test",
        protocols=lambda: [("rr", b"")],
        assign=round_robin,
        on_assigned=rec.assigned,
        on_revoked=rec.on_revoked,
        session_timeout_ms=session_ms,
        rebalance_timeout_ms=10_000,
        heartbeat_interval_ms=300,
    )


def test_members_form_a_generation_and_rebalance_on_leave(ensemble_server: ServerHandle) -> None:
    async def scenario() -> None:
        recs = [Recorder() for _ in range(3)]
        members = [member(ensemble_server, r) for r in recs]
        for mbr in members:
            await mbr.start()

        async def converged(n: int) -> set[int]:
            while True:
                gens = {mbr.generation.generation_id for mbr in members[:n] if mbr.generation}
                leader = [mbr for mbr in members[:n] if mbr.generation and mbr.generation.is_leader]
                if (
                    len(gens) == 1
                    and len(leader) == 1
                    and len(leader[0].generation.members) == n  # type: ignore[union-attr]
                    and all(
                        r.assignments and r.assignments[-1][0].generation_id in gens
                        for r in recs[:n]
                    )
                ):
                    return gens
                await asyncio.sleep(0.05)

        (gen,) = await asyncio.wait_for(converged(3), 30)
        latest = [r.assignments[-1][1] for r in recs]
        assert sorted(r for rs in latest for r in rs) == sorted(RESOURCES), "disjoint and covering"
        leaders = {mbr.generation.leader_id for mbr in members if mbr.generation}
        assert len(leaders) == 1
        # commit offsets with the generation, then a stale generation is refused
        await members[0].commit_offsets({TopicPartition("t", 0): (42, "meta")})
        fetched = await members[1].fetch_offsets([TopicPartition("t", 0)])
        assert fetched == {TopicPartition("t", 0): (42, "meta")}
        stale = members[0].generation
        await members[2].close()
        (gen2,) = await asyncio.wait_for(converged(2), 10)
        assert gen2 > gen
        assert sorted(x for r in recs[:2] for x in r.assignments[-1][1]) == sorted(RESOURCES)
        with pytest.raises(IllegalGeneration):
            await members[0].commit_offsets({TopicPartition("t", 0): (1, "")}, generation=stale)
        admin = CoordinatorClient(ensemble_server.bootstrap)
        assert await admin.init_fencing("task-a") == 0
        assert await admin.init_fencing("task-a") == 1
        await admin.close()
        for mbr in members[:2]:
            await mbr.close()

    asyncio.run(scenario())


def test_a_member_that_leaves_stays_out_until_asked_to_rejoin(
    ensemble_server: ServerHandle,
) -> None:
    # what a Connect leader does before backing off when it cannot read the config log
    async def scenario() -> None:
        recs = [Recorder() for _ in range(2)]
        members = [member(ensemble_server, r) for r in recs]
        for mbr in members:
            await mbr.start()
        for mbr in members:
            await mbr.wait_stable(20)
        admin = CoordinatorClient(ensemble_server.bootstrap)

        async def described() -> m.DescribedGroup:
            reply = await admin.request(
                apis.DESCRIBE_GROUPS, m.DescribeGroupsRequest(group_ids=["g1"])
            )
            return reply.groups[0]

        leaving = members[0]
        gone_id = leaving.member_id
        await leaving.leave_group()
        assert leaving.generation is None
        # the other rebalances without it at once, not after a session timeout
        deadline = asyncio.get_running_loop().time() + 10
        while True:
            group = await described()
            if group.state == "Stable" and [x.member_id for x in group.members] == [
                members[1].member_id
            ]:
                break
            assert asyncio.get_running_loop().time() < deadline, group
            await asyncio.sleep(0.05)
        await asyncio.sleep(1.0)  # three heartbeat intervals: it has not come back
        assert gone_id not in [x.member_id for x in (await described()).members]
        leaving.request_rejoin()
        await leaving.wait_stable(20)
        assert len((await described()).members) == 2
        await admin.close()
        for mbr in members:
            await mbr.close()

    asyncio.run(scenario())


def test_members_sharing_connections_start_together(processes: Processes, tmp_path: Path) -> None:
    # a worker's sink tasks start at once over one set of connections, to an ensemble of
    # three: none may use a connection another is still opening (it would find no
    # coordinator APIs on it, and fail for good)
    ensemble = make_ensemble(processes, tmp_path, 3).start()

    async def scenario() -> None:
        connections = CoordinatorConnections(ensemble.bootstrap)
        members = [
            GroupMember(
                ensemble.bootstrap,
                f"shared-{i}",
                protocol_type="test",
                protocols=lambda: [("rr", b"")],
                assign=round_robin,
                on_assigned=Recorder().assigned,
                session_timeout_ms=6000,
                heartbeat_interval_ms=300,
                connections=connections,
            )
            for i in range(40)
        ]
        await asyncio.gather(*(mbr.start() for mbr in members))
        await asyncio.gather(*(mbr.wait_stable(30) for mbr in members))
        assert all(mbr.failure is None for mbr in members)
        assert connections.open <= 3, "a connection per server at most, shared"
        for mbr in members:
            await mbr.close()
        await connections.close()

    asyncio.run(scenario())
