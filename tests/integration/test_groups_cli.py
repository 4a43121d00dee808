"""``herder groups list|describe|delete`` against a real ensemble server.

The groups are made by GroupMember clients in the test process, which keep
heartbeating while each CLI command runs in a thread.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from herder.coordinator import apis
from herder.coordinator import messages as m
from herder.coordinator.client import CoordinatorClient
from herder.coordinator.offsets import TopicPartition
from herder.runtime.core.member import Generation
from herder.runtime.shell.member import GroupMember
from tests.harness import HERDER, Processes, free_port
from tests.integration.conftest import ServerHandle, make_server

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

RESOURCES = ["r0", "r1", "r2", "r3", "r4"]
BINARY = b"\xff\xfe\x01"


@pytest.fixture
def server(processes: Processes, tmp_path: Path) -> Iterator[ServerHandle]:
    yield make_server(processes, tmp_path, **{"group.min.session.timeout.ms": 1000}).start()


async def herder(server: ServerHandle, *args: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(
        subprocess.run,
        [*HERDER, "groups", *args, "--bootstrap", server.bootstrap],
        capture_output=True,
        text=True,
        timeout=60,
    )


async def herder_json(server: ServerHandle, *args: str) -> Any:
    done = await herder(server, *args, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def round_robin(leader: str, protocol: str, members: Mapping[str, bytes]) -> dict[str, bytes]:
    ids = sorted(members)
    given: dict[str, list[str]] = {member_id: [] for member_id in ids}
    for i, resource in enumerate(RESOURCES):
        given[ids[i % len(ids)]].append(resource)
    return {member_id: json.dumps(r).encode() for member_id, r in given.items()}


async def ignore(generation: Generation, assignment: bytes) -> None:
    return None


def make_member(
    server: ServerHandle, group_id: str, client_id: str, assign: Any = round_robin
) -> GroupMember:
    return GroupMember(
        server.bootstrap,
        group_id,
        protocol_type="test",
        protocols=lambda: [("rr", b"meta")],
        assign=assign,
        on_assigned=ignore,
        client_id=client_id,
        # long enough that a busy machine never expels a member in the middle of the test
        session_timeout_ms=10_000,
        rebalance_timeout_ms=10_000,
        heartbeat_interval_ms=300,
    )


async def one_generation(members: list[GroupMember]) -> Generation:
    """Wait until every member holds the same generation, which has them all."""
    while True:
        gens = [mbr.generation for mbr in members]
        if all(g is not None for g in gens) and len({g.generation_id for g in gens if g}) == 1:
            leader = next(g for g in gens if g and g.is_leader)
            if len(leader.members) == len(members):
                return leader
        await asyncio.sleep(0.05)


async def state_of(server: ServerHandle, group_id: str) -> str:
    admin = CoordinatorClient(server.bootstrap)
    try:
        reply = await admin.request(
            apis.DESCRIBE_GROUPS, m.DescribeGroupsRequest(group_ids=[group_id])
        )
        return reply.groups[0].state
    finally:
        await admin.close()


def test_list_describe_delete(server: ServerHandle) -> None:
    async def scenario() -> None:
        workers = [make_member(server, "g1", f"client-{i}") for i in range(2)]
        binary = make_member(
            server,
            "bin",
            "client-bin",
            assign=lambda _l, _p, members: dict.fromkeys(members, BINARY),
        )
        for mbr in [*workers, binary]:
            await mbr.start()
        generation = await asyncio.wait_for(one_generation(workers), 30)
        await asyncio.wait_for(binary.wait_stable(), 30)
        await workers[0].commit_offsets(
            {TopicPartition("t", 0): (42, "meta"), TopicPartition("t", 1): (7, "")}
        )
        # the last member's sync may still be on its way: describe a settled group
        while await state_of(server, "g1") != "Stable":
            await asyncio.sleep(0.05)

        listed = await herder_json(server, "list")
        assert {"group_id": "g1", "protocol_type": "test", "state": "Stable"} in listed
        assert {"group_id": "bin", "protocol_type": "test", "state": "Stable"} in listed
        human_list = (await herder(server, "list")).stdout
        assert "g1" in human_list and "bin" in human_list and "Stable" in human_list

        described = await herder_json(server, "describe", "g1")
        assert described["group_id"] == "g1"
        assert (described["state"], described["protocol_type"], described["protocol"]) == (
            "Stable",
            "test",
            "rr",
        )
        assert described["generation"] == generation.generation_id
        assert described["leader"] == generation.leader_id
        by_id = {member["member_id"]: member for member in described["members"]}
        assert set(by_id) == {mbr.member_id for mbr in workers}
        assert {member["client_id"] for member in by_id.values()} == {"client-0", "client-1"}
        assert all(member["client_host"] for member in by_id.values())
        assert all(member["metadata"] == "meta" for member in by_id.values())
        assigned = [r for member in by_id.values() for r in json.loads(member["assignment"])]
        assert sorted(assigned) == RESOURCES
        assert described["offsets"] == [
            {"topic": "t", "partition": 0, "offset": 42, "metadata": "meta"},
            {"topic": "t", "partition": 1, "offset": 7, "metadata": ""},
        ]
        (bin_member,) = (await herder_json(server, "describe", "bin"))["members"]
        assert bin_member["assignment"] == {"base64": "//4B"}

        human = (await herder(server, "describe", "g1")).stdout
        for text in ("Stable", generation.leader_id, "client-0", "client-1", "42", "meta"):
            assert text in human
        assert f"generation: {generation.generation_id}" in human
        assert "base64://4B" in (await herder(server, "describe", "bin")).stdout

        refused = await herder(server, "delete", "g1")
        assert refused.returncode == 1
        assert refused.stderr.count("\n") == 1 and "Traceback" not in refused.stderr
        assert refused.stderr.startswith("error: cannot delete group 'g1': NON_EMPTY_GROUP")
        assert "g1" in [g["group_id"] for g in await herder_json(server, "list")]

        for mbr in workers:
            await mbr.close()
        while await state_of(server, "g1") != "Empty":
            await asyncio.sleep(0.05)
        empty = await herder_json(server, "describe", "g1")
        assert empty["state"] == "Empty" and empty["members"] == [] and empty["leader"] == ""
        assert [o["offset"] for o in empty["offsets"]] == [42, 7]

        assert await herder_json(server, "delete", "g1") == {"group_id": "g1", "deleted": True}
        assert "g1" not in [g["group_id"] for g in await herder_json(server, "list")]
        gone = await herder(server, "describe", "g1")
        assert gone.returncode == 1
        assert gone.stderr == (
            "error: group 'g1' does not exist; `herder groups list` shows the groups there are\n"
        )
        again = await herder(server, "delete", "g1")
        assert again.returncode == 1
        assert again.stderr.startswith("error: cannot delete group 'g1': GROUP_ID_NOT_FOUND")
        await binary.close()

    asyncio.run(scenario())


def test_no_coordinator_is_one_line() -> None:
    done = subprocess.run(
        [*HERDER, "groups", "--timeout", "1", "list", "--bootstrap", f"127.0.0.1:{free_port()}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("error: no coordinator")
    assert "herder ensemble status" in done.stderr


def test_describe_shows_instance_ids_and_list_filters_by_state(server: ServerHandle) -> None:
    async def scenario() -> None:
        admin = CoordinatorClient(server.bootstrap)
        try:
            # a static member joins at once, without a MEMBER_ID_REQUIRED round
            joined = await admin.request(
                apis.JOIN_GROUP,
                m.JoinGroupRequest(
                    group_id="static",
                    group_instance_id="worker-a",
                    client_id="client-a",
                    session_timeout_ms=30_000,
                    rebalance_timeout_ms=10_000,
                    protocol_type="test",
                    protocols=[m.JoinGroupProtocol(name="rr", metadata=b"meta")],
                ),
            )
            assert joined.error_code == 0 and joined.member_id.startswith("worker-a-")
            synced = await admin.request(
                apis.SYNC_GROUP,
                m.SyncGroupRequest(
                    group_id="static",
                    generation_id=joined.generation_id,
                    member_id=joined.member_id,
                    group_instance_id="worker-a",
                    assignments=[m.SyncGroupAssignment(member_id=joined.member_id)],
                ),
            )
            assert synced.error_code == 0 and synced.protocol_name == "rr"
            # a group with offsets and no members: Empty
            one = m.OffsetCommitPartition(topic="t", partition=0, offset=1)
            await admin.request(
                apis.OFFSET_COMMIT, m.OffsetCommitRequest(group_id="idle", offsets=[one])
            )
        finally:
            await admin.close()

        (member,) = (await herder_json(server, "describe", "static"))["members"]
        assert (member["member_id"], member["group_instance_id"]) == (joined.member_id, "worker-a")
        human = (await herder(server, "describe", "static")).stdout
        assert "instance id" in human and "worker-a" in human

        stable = await herder_json(server, "list", "--state", "stable")
        assert [g["group_id"] for g in stable] == ["static"]
        both = await herder_json(server, "list", "--state", "Stable", "--state", "EMPTY")
        assert sorted(g["group_id"] for g in both) == ["idle", "static"]
        assert await herder_json(server, "list", "--state", "PreparingRebalance") == []

    asyncio.run(scenario())
