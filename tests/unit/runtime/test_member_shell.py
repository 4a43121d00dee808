"""The group member's asyncio shell against a coordinator played in process.

The protocol itself is the machine's (``test_member_machine``); these check that the
shell carries its effects out: the callbacks run in order, a revocation is awaited
before the next JoinGroup while heartbeats go on, a leave goes out, a failure is told.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from herder.coordinator import apis
from herder.coordinator import messages as m
from herder.errors import ErrorCode, HerderError, InconsistentGroupProtocol
from herder.runtime.core.member import Generation
from herder.runtime.shell.member import GroupMember

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]


class Coordinator:
    """A one-member group: every JoinGroup makes a new generation led by its sender."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, Any]] = []
        self.join_code = ErrorCode.NONE
        self.generation = 0
        self.connected = True

    def sent(self, name: str) -> int:
        return sum(1 for sent, _ in self.requests if sent == name)

    async def request(self, api: Any, body: Any, *, timeout: float) -> Any:
        self.requests.append((api.name, body))
        if api is apis.JOIN_GROUP:
            if self.join_code != ErrorCode.NONE:
                return m.JoinGroupResponse(error_code=self.join_code)
            if not body.member_id:
                return m.JoinGroupResponse(
                    error_code=ErrorCode.MEMBER_ID_REQUIRED, member_id=f"m{len(self.requests)}"
                )
            self.generation += 1
            return m.JoinGroupResponse(
                generation_id=self.generation,
                protocol_name="rr",
                leader=body.member_id,
                member_id=body.member_id,
                members=[m.JoinGroupMember(member_id=body.member_id, metadata=b"md")],
            )
        if api is apis.SYNC_GROUP:
            (given,) = body.assignments
            return m.SyncGroupResponse(assignment=given.assignment)
        if api is apis.HEARTBEAT:
            return m.HeartbeatResponse()
        if api is apis.LEAVE_GROUP:
            return m.LeaveGroupResponse(members=[m.LeftMember(member_id=body.member_ids[0])])
        raise AssertionError(api)


class Connections:
    """Stands in for CoordinatorConnections: every key's coordinator is ``coordinator``."""

    def __init__(self, coordinator: Coordinator) -> None:
        self.coordinator_ = coordinator

    async def coordinator(self, key: str, what: str = "") -> Coordinator:
        return self.coordinator_

    async def forget(self, wire: Any) -> None:
        return None


class Callbacks:
    def __init__(self) -> None:
        self.calls: list[str] = []
        self.assigned: list[tuple[Generation, bytes]] = []
        self.assignor_saw: list[dict[str, bytes]] = []
        self.failures: list[HerderError] = []
        self.release_revocation = asyncio.Event()
        self.release_revocation.set()

    def assign(self, leader: str, protocol: str, members: Any) -> dict[str, bytes]:
        self.calls.append("assign")
        self.assignor_saw.append(dict(members))
        return {member: b"work" for member in members}

    async def on_assigned(self, generation: Generation, data: bytes) -> None:
        self.calls.append("assigned")
        self.assigned.append((generation, data))

    async def on_revoked(self) -> None:
        self.calls.append("revoking")
        await self.release_revocation.wait()
        self.calls.append("revoked")


def member(coordinator: Coordinator, callbacks: Callbacks) -> GroupMember:
    return GroupMember(
        "127.0.0.1:9",
        "g",
        protocol_type="test",
        protocols=lambda: [("rr", b"md")],
        assign=callbacks.assign,
        on_assigned=callbacks.on_assigned,
        on_revoked=callbacks.on_revoked,
        on_failed=callbacks.failures.append,
        heartbeat_interval_ms=20,
        connections=Connections(coordinator),  # type: ignore[arg-type]
    )


async def until(condition: Any, timeout: float = 5) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.01)


async def test_a_revocation_is_awaited_before_the_next_join_and_heartbeats_go_on() -> None:
    coordinator, callbacks = Coordinator(), Callbacks()
    mbr = await member(coordinator, callbacks).start()
    generation = await mbr.wait_stable(5)
    assert generation == Generation(1, mbr.member_id, mbr.member_id, "rr", (mbr.member_id,))
    assert callbacks.assignor_saw == [{mbr.member_id: b"md"}]
    assert callbacks.assigned == [(generation, b"work")]

    callbacks.release_revocation.clear()
    mbr.request_rejoin()
    await until(lambda: callbacks.calls[-1:] == ["revoking"])
    assert mbr.generation is None
    joins, beats = coordinator.sent("JoinGroup"), coordinator.sent("Heartbeat")
    await until(lambda: coordinator.sent("Heartbeat") >= beats + 3)
    assert coordinator.sent("JoinGroup") == joins, "joined while the work was still stopping"

    callbacks.release_revocation.set()
    second = await mbr.wait_stable(5)
    assert second.generation_id == 2
    assert callbacks.calls == ["assign", "assigned", "revoking", "revoked", "assign", "assigned"]
    await mbr.close()
    assert coordinator.requests[-1] == (
        "LeaveGroup",
        m.LeaveGroupRequest(group_id="g", member_ids=[mbr.member_id]),
    )
    assert callbacks.failures == []


async def test_leave_group_revokes_leaves_and_stays_out_until_asked_back() -> None:
    coordinator, callbacks = Coordinator(), Callbacks()
    mbr = await member(coordinator, callbacks).start()
    await mbr.wait_stable(5)
    gone = mbr.member_id
    await mbr.leave_group()
    assert mbr.generation is None and mbr.member_id == ""
    assert ("LeaveGroup", m.LeaveGroupRequest(group_id="g", member_ids=[gone])) in (
        coordinator.requests
    )
    await until(lambda: "revoked" in callbacks.calls)
    sent = len(coordinator.requests)
    await asyncio.sleep(0.1)  # five heartbeat intervals: nothing goes out meanwhile
    assert len(coordinator.requests) == sent

    mbr.request_rejoin()
    generation = await mbr.wait_stable(5)
    assert generation.generation_id == 2 and mbr.member_id not in ("", gone)
    await mbr.close(leave=False)
    assert coordinator.requests[-1][0] != "LeaveGroup"


async def test_a_fatal_answer_fails_the_member_once_and_wait_stable_raises_it() -> None:
    coordinator, callbacks = Coordinator(), Callbacks()
    coordinator.join_code = ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    mbr = await member(coordinator, callbacks).start()
    with pytest.raises(InconsistentGroupProtocol):
        await mbr.wait_stable(5)
    assert mbr.failure is not None and callbacks.failures == [mbr.failure]
    mbr.request_rejoin()
    await asyncio.sleep(0.05)  # time to send a JoinGroup, which must not go out
    assert coordinator.sent("JoinGroup") == 1
    assert callbacks.failures == [mbr.failure]
    await mbr.close()
