"""Random histories of joins, syncs, heartbeats, leaves, commits, store completions and time.

Five clients (two of them static members, with a group instance id) act in a random
order at random times against a store that answers at once or later, sometimes with
an error. Most steps are a client doing what a Kafka client would do next (join,
rejoin with its id, sync, heartbeat) so histories reach stable generations; the rest
are arbitrary requests, leaves, metadata changes, time passing, a static client's
process restarting (its old process may go on as a zombie, sending with its old id),
and the coordinator moving (a fresh one loads the stored groups, with a
``group.max.size`` drawn anew). The new-member join timeout is drawn short or long.
After every step:

* at most one leader per generation (an identity: a static member's instance id), and
  only the leader's join response lists members;
* every dynamic member of a Stable group was last told (by a join response) the
  group's current generation, and no static member was told a later one;
* a group's generation never decreases, and no client ever sees its generation go back
  (while one coordinator serves: a move may lose generations that were never stored);
* a Stable group is within ``group.max.size``;
* a removed member's requests fail with UNKNOWN_MEMBER_ID (or FENCED_INSTANCE_ID when
  its instance id has moved on), and once a static client's new process has synced,
  no request of an older process of it ever succeeds;
* no request is answered twice, and once time runs on, every request has been answered.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from random import Random
from typing import Any

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from herder.coordinator import (
    CoordinatorConfig,
    Group,
    GroupCoordinator,
    GroupState,
    collect_groups,
)
from herder.coordinator.messages import JoinGroupResponse, SyncGroupResponse
from herder.errors import ErrorCode

from .support import REBALANCE_MS, Harness, Reply

pytestmark = pytest.mark.unit

GROUP = "g"
CLIENTS = 5
STATIC = {3: "inst-3", 4: "inst-4"}
#: answers after which a client must rejoin before it can sync or heartbeat again
REJOIN = {ErrorCode.REBALANCE_IN_PROGRESS, ErrorCode.ILLEGAL_GENERATION}
UNLIMITED = 2**31 - 1
CAPACITIES = [2, 3, UNLIMITED, UNLIMITED]


@dataclass
class Client:
    name: str
    instance_id: str | None = None
    member_id: str = ""
    generation: int = -1
    highest_generation: int = -1
    members: list[str] = field(default_factory=list)
    synced: bool = False
    must_rejoin: bool = True
    metadata: bytes = b"v0"
    #: (member id, generation) of earlier processes of this static client still running
    zombies: list[tuple[str, int]] = field(default_factory=list)
    #: which process of the client is running (a restart starts the next one)
    process: int = 0

    def forget(self) -> None:
        self.member_id, self.generation, self.must_rejoin = "", -1, True


@dataclass
class World:
    h: Harness
    clients: list[Client]
    replies: list[Reply[Any]] = field(default_factory=list)
    #: (coordinator incarnation, generation) -> leader identity
    leaders: dict[tuple[int, int], str] = field(default_factory=dict)
    told_generation: dict[str, int] = field(default_factory=dict)
    ever_members: set[str] = field(default_factory=set)
    #: member id -> identity (instance id of a static member)
    identity: dict[str, str] = field(default_factory=dict)
    #: instance id -> its member ids whose sync succeeded, in order
    synced_ids: dict[str, list[str]] = field(default_factory=dict)
    fenced: set[str] = field(default_factory=set)
    incarnation: int = 0
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


def on_join(
    world: World, client: Client, process: int, response: JoinGroupResponse, incarnation: int
) -> None:
    code = ErrorCode(response.error_code)
    world.seen.add(f"join answered {code.name}")
    if process != client.process:
        return
    if code == ErrorCode.MEMBER_ID_REQUIRED:
        client.member_id = response.member_id
    elif code == ErrorCode.UNKNOWN_MEMBER_ID and response.member_id == client.member_id:
        client.forget()
    elif code == ErrorCode.NONE:
        if client.instance_id is not None:
            world.identity[response.member_id] = client.instance_id
        is_leader = response.leader == response.member_id
        assert bool(response.members) == is_leader
        for listed in response.members:
            if listed.group_instance_id is not None:
                world.identity[listed.member_id] = listed.group_instance_id
        group = world.group()
        if group is not None and group.has(response.leader):
            instance = group.get(response.leader).group_instance_id
            if instance is not None:
                world.identity[response.leader] = instance
        who = world.identity.get(response.leader, response.leader)
        agreed = world.leaders.setdefault((incarnation, response.generation_id), who)
        assert agreed == who, f"two leaders in generation {response.generation_id}"
        world.told_generation[response.member_id] = response.generation_id
        if response.member_id == client.member_id or not client.member_id:
            # a static client's first join of a process learns its member id here
            assert response.generation_id >= client.highest_generation
            client.member_id = response.member_id
            client.generation = client.highest_generation = response.generation_id
            client.members = [m.member_id for m in response.members]
            if response.skip_assignment:
                client.members = []
            client.synced, client.must_rejoin = False, False


def on_answer(world: World, client: Client, member_id: str, kind: str, response: Any) -> None:
    code = ErrorCode(response.error_code)
    world.seen.add(f"{kind} answered {code.name}")
    if code == ErrorCode.NONE:
        assert member_id not in world.fenced, f"{kind} of the fenced {member_id} succeeded"
    if kind == "sync" and code == ErrorCode.NONE and client.instance_id is not None:
        # this process holds the instance's place for good: earlier ones are fenced
        earlier = world.synced_ids.setdefault(client.instance_id, [])
        if member_id not in earlier:
            world.fenced.update(earlier)
            earlier.append(member_id)
    if client.member_id != member_id:
        return
    if code == ErrorCode.UNKNOWN_MEMBER_ID:
        client.forget()
    elif code in REJOIN:
        client.must_rejoin = True
    elif kind == "sync" and code == ErrorCode.NONE:
        client.synced = True


def move_coordinator(world: World, capacity: int) -> None:
    """The ensemble leader moves: a fresh coordinator loads what was stored."""
    h = world.h
    h.store.complete_all()
    h.coordinator.unload_all()
    config = CoordinatorConfig(
        group_max_size=capacity,
        group_new_member_join_timeout_ms=h.coordinator.config.group_new_member_join_timeout_ms,
    )
    world.incarnation += 1
    coordinator = GroupCoordinator(h.store, random=Random(world.incarnation), config=config)
    coordinator.begin_loading(h.now)
    for stored in collect_groups(h.store.groups_log).values():
        coordinator.load_group(stored.group_id, stored.record, stored.offsets, h.now)
    coordinator.finish_loading(h.now)
    h.coordinator = coordinator
    group = world.group()
    for member_id in group.member_ids if group else []:
        world.told_generation[member_id] = group.generation_id if group else 0
    for client in world.clients:
        # generations that were never stored are forgotten with the old coordinator
        client.highest_generation = -1
    world.seen.add(f"moved with group.max.size {capacity}")


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
    if kind == "move":
        move_coordinator(world, op[1])
        return
    client = world.clients[op[1]]
    if kind == "restart":
        if client.instance_id is not None:
            if client.member_id:
                client.zombies.append((client.member_id, client.generation))
            client.forget()
            client.process += 1
            world.seen.add("static restart")
        return
    if kind == "zombie":
        if client.zombies:
            zombie(world, client, *client.zombies[op[2] % len(client.zombies)])
        return
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
    instance = client.instance_id

    def answer(response: Any, kind: str = kind) -> None:
        on_answer(world, client, member_id, kind, response)

    reply: Reply[Any]
    if kind == "join":
        if op[0] == "join" and op[2] % 2 == 0:
            client.metadata = client.metadata[::-1]  # new metadata: forces a rebalance
        incarnation, process = world.incarnation, client.process
        reply = Reply(lambda response: on_join(world, client, process, response, incarnation))
        protocols = (("range", client.metadata),)
        h.join(
            GROUP,
            member_id,
            client_id=client.name,
            protocols=protocols,
            instance_id=instance,
            reply=reply,
        )
    elif kind == "sync":
        assignments = {m: m.encode() for m in client.members} if client.members else None
        reply = Reply[SyncGroupResponse](answer)
        h.sync(GROUP, member_id, client.generation, assignments, instance_id=instance, reply=reply)
    elif kind == "heartbeat":
        reply = h.heartbeat(GROUP, member_id, client.generation, instance_id=instance)
        answer(reply.value)
    elif kind == "leave":
        if instance is not None and op[2] % 2:
            reply = h.leave_members(GROUP, ("", instance))
        else:
            reply = h.leave(GROUP, member_id)
        client.forget()
    elif kind == "commit":
        reply = h.commit(
            GROUP,
            {("t", 0): op[2]},
            member_id=member_id,
            generation=client.generation,
            instance_id=instance,
        )
    else:
        raise AssertionError(kind)
    world.replies.append(reply)
    if was_removed and reply.done and not (kind == "leave" and instance is not None):
        # a leave answers for each member: the request itself succeeded
        error = reply.value.member_error(member_id) if kind == "leave" else reply.error
        refusals = {ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.FENCED_INSTANCE_ID}
        if kind == "join":
            refusals.add(ErrorCode.GROUP_MAX_SIZE_REACHED)  # capacity is checked first
        if kind == "commit" and world.group() is None:
            refusals.add(ErrorCode.ILLEGAL_GENERATION)  # the group was never stored
        assert error in refusals, (kind, reply.value)


def zombie(world: World, client: Client, member_id: str, generation: int) -> None:
    """An older process of a static client goes on sending with its old id."""
    h = world.h
    reply = h.heartbeat(GROUP, member_id, generation, instance_id=client.instance_id)
    world.replies.append(reply)
    code = reply.error
    world.seen.add(f"zombie heartbeat answered {code.name}")
    if code == ErrorCode.NONE:
        assert member_id not in world.fenced, f"the fenced {member_id} heartbeated"


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
        assert len(group.members) <= world.h.coordinator.config.group_max_size
        for member in group.members:
            told = world.told_generation.get(member.member_id)
            if member.is_static:
                assert told is None or told <= group.generation_id, (told, group)
            else:
                assert told == group.generation_id, (told, group)
        if any(m.is_static and m.is_awaiting_join for m in group.members):
            world.seen.add("static takeover stored while Stable")


#: (kind, client, argument): progress weighs most, so histories reach stable generations
KINDS = ["progress"] * 5 + [
    "join",
    "sync",
    "heartbeat",
    "leave",
    "commit",
    "advance",
    "store",
    "restart",
    "zombie",
    "move",
]
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
        else ("move", CAPACITIES[op[2] % len(CAPACITIES)])
        if op[0] == "move"
        else (op[0], op[1], op[2])
    )
)


@settings(max_examples=150, deadline=None)
@given(
    deferred=st.booleans(),
    new_member_timeout_ms=st.sampled_from([20_000, 300_000]),
    history=st.lists(operations, min_size=20, max_size=80),
)
def test_random_histories_keep_the_group_invariants(
    deferred: bool, new_member_timeout_ms: int, history: list[tuple[Any, ...]]
) -> None:
    config = CoordinatorConfig(group_new_member_join_timeout_ms=new_member_timeout_ms)
    h = Harness(config, deferred=deferred)
    clients = [Client(f"c{i}", STATIC.get(i)) for i in range(CLIENTS)]
    world = World(h, clients)
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
