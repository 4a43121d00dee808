"""Random histories of joins, syncs, heartbeats, leaves, commits, store completions and time.

Four clients act in a random order at random times against a store that answers at
once or later, sometimes with an error. Most steps are a client doing what a Kafka
client would do next (join, rejoin with its id, sync, heartbeat) so histories reach
stable generations; the rest are arbitrary requests, leaves, metadata changes and
time passing. After every step:

* at most one leader per generation, and only the leader's join response lists members;
* every member of a Stable group was last told (by a join response) the group's
  current generation;
* a group's generation never decreases, and no client ever sees its generation go back;
* a removed member's requests fail with UNKNOWN_MEMBER_ID;
* no request is answered twice, and once time runs on, every request has been answered.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from herder.coordinator import Group, GroupState
from herder.coordinator.messages import JoinGroupResponse, SyncGroupResponse
from herder.errors import ErrorCode

from .support import REBALANCE_MS, Harness, Reply

pytestmark = pytest.mark.unit

GROUP = "g"
CLIENTS = 4
#: answers after which a client must rejoin before it can sync or heartbeat again
REJOIN = {ErrorCode.REBALANCE_IN_PROGRESS, ErrorCode.ILLEGAL_GENERATION}


@dataclass
class Client:
    name: str
    member_id: str = ""
    generation: int = -1
    highest_generation: int = -1
    members: list[str] = field(default_factory=list)
    synced: bool = False
    must_rejoin: bool = True
    metadata: bytes = b"v0"

    def forget(self) -> None:
        self.member_id, self.generation, self.must_rejoin = "", -1, True


@dataclass
class World:
    h: Harness
    clients: list[Client]
    replies: list[Reply[Any]] = field(default_factory=list)
    leaders: dict[int, set[str]] = field(default_factory=dict)
    told_generation: dict[str, int] = field(default_factory=dict)
    ever_members: set[str] = field(default_factory=set)
    last_group: Group | None = None
    last_generation: int = 0
    #: what this history reached, reported as hypothesis events to judge coverage
    seen: set[str] = field(default_factory=set)

    def group(self) -> Group | None:
        return self.h.coordinator.group(GROUP)

    def removed(self, member_id: str) -> bool:
        group = self.group()
        present = group is not None and (group.has(member_id) or member_id in group.pending_members)
        return member_id in self.ever_members and not present


def on_join(world: World, client: Client, response: JoinGroupResponse) -> None:
    code = ErrorCode(response.error_code)
    world.seen.add(f"join answered {code.name}")
    if code == ErrorCode.MEMBER_ID_REQUIRED:
        client.member_id = response.member_id
    elif code == ErrorCode.UNKNOWN_MEMBER_ID and response.member_id == client.member_id:
        client.forget()
    elif code == ErrorCode.NONE:
        is_leader = response.leader == response.member_id
        assert bool(response.members) == is_leader
        leaders = world.leaders.setdefault(response.generation_id, set())
        leaders.add(response.leader)
        assert len(leaders) == 1, f"two leaders in generation {response.generation_id}"
        world.told_generation[response.member_id] = response.generation_id
        if response.member_id == client.member_id:
            assert response.generation_id >= client.highest_generation
            client.generation = client.highest_generation = response.generation_id
            client.members = [m.member_id for m in response.members]
            client.synced, client.must_rejoin = False, False


def on_answer(world: World, client: Client, member_id: str, kind: str, response: Any) -> None:
    code = ErrorCode(response.error_code)
    world.seen.add(f"{kind} answered {code.name}")
    if client.member_id != member_id:
        return
    if code == ErrorCode.UNKNOWN_MEMBER_ID:
        client.forget()
    elif code in REJOIN:
        client.must_rejoin = True
    elif kind == "sync" and code == ErrorCode.NONE:
        client.synced = True


def act(world: World, op: tuple[Any, ...]) -> None:
    h = world.h
    kind = op[0]
    if kind == "advance":
        h.advance(op[1])
        return
    if kind == "store":
        if h.store.pending:
            h.store.complete_next(op[1])
        return
    client = world.clients[op[1]]
    if kind == "progress":
        if not client.member_id or client.must_rejoin:
            kind = "join"
        else:
            kind = "heartbeat" if client.synced else "sync"
    member_id = client.member_id
    if kind != "join" and not member_id:
        return
    if kind == "commit" and client.generation < 0:
        return  # generation -1 is the admin commit, allowed without membership
    was_removed = bool(member_id) and world.removed(member_id)

    def answer(response: Any, kind: str = kind) -> None:
        on_answer(world, client, member_id, kind, response)

    reply: Reply[Any]
    if kind == "join":
        if op[0] == "join" and op[2]:
            client.metadata = client.metadata[::-1]  # new metadata: forces a rebalance
        reply = Reply(lambda response: on_join(world, client, response))
        protocols = (("range", client.metadata),)
        h.join(GROUP, member_id, client_id=client.name, protocols=protocols, reply=reply)
    elif kind == "sync":
        assignments = {m: m.encode() for m in client.members} if client.members else None
        reply = Reply[SyncGroupResponse](answer)
        h.sync(GROUP, member_id, client.generation, assignments, reply=reply)
    elif kind == "heartbeat":
        reply = h.heartbeat(GROUP, member_id, client.generation)
        answer(reply.value)
    elif kind == "leave":
        reply = h.leave(GROUP, member_id)
        client.forget()
    elif kind == "commit":
        reply = h.commit(
            GROUP, {("t", 0): op[2]}, member_id=member_id, generation=client.generation
        )
    else:
        raise AssertionError(kind)
    world.replies.append(reply)
    if was_removed and reply.done:
        # a leave answers for each member: the request itself succeeded
        error = reply.value.member_error(member_id) if kind == "leave" else reply.error
        assert error == ErrorCode.UNKNOWN_MEMBER_ID, (kind, reply.value)


def check(world: World) -> None:
    for reply in world.replies:
        assert len(reply.responses) <= 1, f"answered twice: {reply.responses}"
    group = world.group()
    if group is None:
        return
    world.seen.add(f"group {group.state.value}")
    world.ever_members.update(group.member_ids)
    world.ever_members.update(group.pending_members)
    if group is not world.last_group:
        world.last_group, world.last_generation = group, group.generation_id
    assert group.generation_id >= world.last_generation
    world.last_generation = group.generation_id
    assert (group.leader_id is None) == (not group.member_ids)
    assert group.leader_id is None or group.has(group.leader_id)
    if group.state is GroupState.STABLE:
        told = {world.told_generation.get(m) for m in group.member_ids}
        assert told == {group.generation_id}, (told, group)


#: (kind, client, argument): progress weighs most, so histories reach stable generations
KINDS = ["progress"] * 4 + ["join", "sync", "heartbeat", "leave", "commit", "advance", "store"]
ADVANCE_MS = [100, 1_000, 1_000, 3_000, 3_000, 9_000, 31_000]
STORE_OUTCOMES = [ErrorCode.NONE] * 4 + [ErrorCode.NOT_LEADER, ErrorCode.REQUEST_TIMED_OUT] * 2
operations = st.tuples(
    st.sampled_from(KINDS), st.integers(0, CLIENTS - 1), st.integers(0, len(ADVANCE_MS) - 1)
).map(
    lambda op: (
        ("advance", ADVANCE_MS[op[2]])
        if op[0] == "advance"
        else ("store", STORE_OUTCOMES[op[2]])
        if op[0] == "store"
        else (op[0], op[1], op[2] % 2 == 0)
        if op[0] == "join"
        else (op[0], op[1], op[2])
    )
)


@settings(max_examples=120, deadline=None)
@given(deferred=st.booleans(), history=st.lists(operations, min_size=20, max_size=80))
def test_random_histories_keep_the_group_invariants(
    deferred: bool, history: list[tuple[Any, ...]]
) -> None:
    h = Harness(deferred=deferred)
    world = World(h, [Client(f"c{i}") for i in range(CLIENTS)])
    for op in history:
        act(world, op)
        check(world)
    # let everything finish: every parked request must be answered by then
    for _ in range(4):
        h.store.complete_all()
        h.advance(REBALANCE_MS + 1)
        check(world)
    assert all(reply.done for reply in world.replies)
    for what in sorted(world.seen):
        event(what)
