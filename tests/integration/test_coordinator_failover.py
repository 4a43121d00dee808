"""The group coordinator moves with the ensemble's leadership and keeps what it stored."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from herder.coordinator import apis
from herder.coordinator import messages as m
from herder.coordinator.client import CoordinatorClient
from herder.coordinator.offsets import TopicPartition
from herder.errors import InvalidSessionTimeout, RetriableError
from herder.runtime.shell.member import GroupMember
from tests.harness import Processes
from tests.integration.conftest import make_ensemble
from tests.integration.test_replication import leader_of

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

RESOURCES = [f"r{i}" for i in range(6)]


def round_robin(leader: str, protocol: str, members: dict[str, bytes]) -> dict[str, bytes]:
    ids = sorted(members)
    out: dict[str, list[str]] = {i: [] for i in ids}
    for n, resource in enumerate(RESOURCES):
        out[ids[n % len(ids)]].append(resource)
    return {i: json.dumps(r).encode() for i, r in out.items()}


async def _nothing(*_: object) -> None:
    return None


def member(bootstrap: str, session_ms: int = 6000) -> GroupMember:
    return GroupMember(
        bootstrap,
        "g",
        protocol_type="test",
        protocols=lambda: [("rr", b"")],
        assign=round_robin,
        on_assigned=_nothing,
        session_timeout_ms=session_ms,
        rebalance_timeout_ms=10_000,
        heartbeat_interval_ms=300,
    )


def test_offsets_and_the_group_survive_a_kill9_of_the_ensemble_leader(
    processes: Processes, tmp_path: Path
) -> None:
    ensemble = make_ensemble(processes, tmp_path, 3).start()
    old = leader_of(ensemble)
    committed = {TopicPartition("t", 0): (42, "a"), TopicPartition("t", 1): (7, "b")}

    async def before() -> list[GroupMember]:
        members = [member(ensemble.bootstrap) for _ in range(3)]
        for mbr in members:
            await mbr.start()
        while not (
            all(mbr.generation for mbr in members)
            and len({mbr.generation.generation_id for mbr in members}) == 1  # type: ignore[union-attr]
            and all(len(mbr.generation.members or []) in (0, 3) for mbr in members)  # type: ignore[union-attr]
        ):
            await asyncio.sleep(0.05)
        await members[0].commit_offsets(committed)
        return members

    async def scenario() -> None:
        members = await asyncio.wait_for(before(), 60)
        ensemble[old].kill9()
        # the first thing asked of the new coordinator: no member has committed since
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 60
        while True:
            try:
                fetched = await members[1].fetch_offsets()
                break
            except RetriableError:
                assert loop.time() < deadline, "no coordinator answered after the failover"
                await asyncio.sleep(0.1)
        assert fetched == committed
        new = await asyncio.to_thread(leader_of, ensemble, old)
        assert new != old
        # the group is whole again under the new leader: every member in one generation
        admin = CoordinatorClient(ensemble.bootstrap)
        try:
            while True:
                reply = await admin.request(
                    apis.DESCRIBE_GROUPS, m.DescribeGroupsRequest(group_ids=["g"])
                )
                (group,) = reply.groups
                gens = {mbr.generation.generation_id for mbr in members if mbr.generation}
                if group.state == "Stable" and len(group.members) == 3 and len(gens) == 1:
                    break
                assert loop.time() < deadline, f"the group did not reform: {group}"
                await asyncio.sleep(0.1)
            # and it works: a commit in the current generation, fetched back
            await members[2].commit_offsets({TopicPartition("t", 0): (43, "c")})
            assert (await members[0].fetch_offsets([TopicPartition("t", 0)])) == {
                TopicPartition("t", 0): (43, "c")
            }
        finally:
            await admin.close()
            for mbr in members:
                await mbr.close()

    asyncio.run(scenario())


def test_a_session_shorter_than_a_leader_change_is_refused_with_the_reason(
    processes: Processes, tmp_path: Path
) -> None:
    # syncLimit 5 x tickTime 200 ms plus the election: a 1,200 ms session cannot outlast it
    ensemble = make_ensemble(
        processes, tmp_path, 3, **{"group.min.session.timeout.ms": 500}
    ).start()
    leader_of(ensemble)

    async def scenario() -> None:
        admin = CoordinatorClient(ensemble.bootstrap)
        try:
            with pytest.raises(InvalidSessionTimeout, match="leader change"):
                await admin.request(
                    apis.JOIN_GROUP,
                    m.JoinGroupRequest(
                        group_id="short",
                        session_timeout_ms=1200,
                        rebalance_timeout_ms=5000,
                        protocol_type="test",
                        protocols=[m.JoinGroupProtocol(name="rr", metadata=b"")],
                    ),
                )
        finally:
            await admin.close()

    asyncio.run(scenario())


def static_member(bootstrap: str, instance_id: str) -> GroupMember:
    return GroupMember(
        bootstrap,
        "static",
        group_instance_id=instance_id,
        protocol_type="test",
        protocols=lambda: [("rr", b"")],
        assign=round_robin,
        on_assigned=_nothing,
        session_timeout_ms=15_000,
        rebalance_timeout_ms=10_000,
        heartbeat_interval_ms=300,
    )


async def described(bootstrap: str, group_id: str) -> m.DescribedGroup:
    admin = CoordinatorClient(bootstrap)
    try:
        reply = await admin.request(
            apis.DESCRIBE_GROUPS, m.DescribeGroupsRequest(group_ids=[group_id])
        )
        return reply.groups[0]
    finally:
        await admin.close()


def test_static_members_keep_their_places_across_a_kill9_of_the_ensemble_leader(
    processes: Processes, tmp_path: Path
) -> None:
    ensemble = make_ensemble(processes, tmp_path, 3).start()
    old = leader_of(ensemble)
    instances = ["worker-0", "worker-1", "worker-2"]

    async def scenario() -> None:
        members = [static_member(ensemble.bootstrap, name) for name in instances]
        for mbr in members:
            await mbr.start()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 60
        while True:
            group = await described(ensemble.bootstrap, "static")
            gens = {mbr.generation.generation_id for mbr in members if mbr.generation}
            if group.state == "Stable" and len(group.members) == 3 and len(gens) == 1:
                break
            assert loop.time() < deadline, f"no generation: {group}"
            await asyncio.sleep(0.05)
        generation = gens.pop()
        ensemble[old].kill9()
        # the new coordinator loads the members with their instance ids, same generation
        while True:
            try:
                group = await described(ensemble.bootstrap, "static")
            except RetriableError:
                group = None
            if group is not None and group.state == "Stable":
                break
            assert loop.time() < deadline + 60, "no coordinator after the failover"
            await asyncio.sleep(0.1)
        assert sorted(mbr.group_instance_id or "" for mbr in group.members) == instances
        assert group.generation_id == generation
        # a static member restarts under the new coordinator: its place, no rebalance
        await members[1].close(leave=False)
        members[1] = static_member(ensemble.bootstrap, "worker-1")
        await members[1].start()
        back = await asyncio.wait_for(members[1].wait_stable(), 30)
        assert back.generation_id == generation
        group = await described(ensemble.bootstrap, "static")
        assert group.generation_id == generation and group.state == "Stable"
        assert back.member_id in [mbr.member_id for mbr in group.members]
        for mbr in members:
            await mbr.close(leave=False)

    asyncio.run(scenario())
