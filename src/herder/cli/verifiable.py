"""``herder verifiable member``: a group member that reports everything it goes through.

In the tradition of Kafka's verifiable consumer: system tests start a few, stop or kill
some, and check from the event lines on stdout (one JSON object per line, flushed at
once, each with a ``timestamp`` in epoch milliseconds) that the group behaved: one
generation, one leader, disjoint assignments covering every resource, a prompt
rebalance after a graceful leave, a rebalance only after the session timeout after a
crash.

Events: ``started``; ``joined`` (member id, generation, leader, this member's
assignment) after every successful sync; ``revoked`` (the assignment given up) before
every rejoin that follows one; ``left`` after leaving the group on SIGTERM or SIGINT;
``error`` when the membership fails for good (then the exit status is 1).

With ``--instance-id`` the member is static (KIP-345): it names its group instance id
on every request, and on SIGTERM or SIGINT it stops *without* leaving (``stopped``
instead of ``left``), as Kafka's consumer does, so that a new process with the same
instance id started within the session timeout takes its place, and its assignment,
without a rebalance. A process whose instance id was taken over by another fails with
FENCED_INSTANCE_ID.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import time
from collections.abc import Mapping
from typing import Any

import click

from herder.cli.output import bootstrap_option, print_json, text_or_base64
from herder.runtime.core.member import Generation
from herder.runtime.shell.member import GroupMember

#: how often the main loop looks for a failed membership while waiting for a signal
_FAILURE_POLL_S = 0.1


@click.group()
def verifiable() -> None:
    """Test clients that print each event as a JSON line (like Kafka's verifiable clients)."""


def round_robin(resources: list[str], member_ids: list[str]) -> dict[str, list[str]]:
    """Resource i goes to the i-th member (sorted by id), cycling: disjoint and covering."""
    members = sorted(member_ids)
    assignment: dict[str, list[str]] = {member_id: [] for member_id in members}
    for index, resource in enumerate(resources):
        assignment[members[index % len(members)]].append(resource)
    return assignment


class VerifiableMember:
    """One :class:`GroupMember` whose callbacks print events; the leader assigns."""

    def __init__(
        self,
        protocol: str,
        resources: list[str],
        *,
        instance_id: str | None = None,
        **member_args: Any,
    ) -> None:
        self.protocol = protocol
        self.resources = resources
        self.instance_id = instance_id
        self.member = GroupMember(
            group_instance_id=instance_id,
            protocols=self._protocols,
            assign=self._assign,
            on_assigned=self._on_assigned,
            on_revoked=self._on_revoked,
            on_heartbeat_error=self._on_heartbeat_error,
            **member_args,
        )
        self.generation: Generation | None = None
        self.assignment: list[Any] = []

    @staticmethod
    def emit(event: str, **fields: Any) -> None:
        print_json({"event": event, "timestamp": int(time.time() * 1000), **fields})

    # -- the group protocol -----------------------------------------------------------

    def _protocols(self) -> list[tuple[str, bytes]]:
        # every member advertises its resources; the leader assigns its own list first,
        # then any other member knows of, so members that disagree lose nothing
        metadata = json.dumps({"resources": self.resources}).encode()
        return [(self.protocol, metadata)]

    def _assign(
        self, leader_id: str, protocol: str, members: Mapping[str, bytes]
    ) -> dict[str, bytes]:
        resources = list(self.resources)
        for metadata in members.values():
            with contextlib.suppress(ValueError, TypeError, AttributeError):
                for resource in json.loads(metadata).get("resources", []):
                    if isinstance(resource, str) and resource not in resources:
                        resources.append(resource)
        plan = round_robin(resources, list(members))
        return {member_id: json.dumps(given).encode() for member_id, given in plan.items()}

    async def _on_assigned(self, generation: Generation, data: bytes) -> None:
        try:
            assignment = json.loads(data) if data else []
        except ValueError:
            assignment = [text_or_base64(data)]
        self.generation = generation
        self.assignment = assignment if isinstance(assignment, list) else [assignment]
        self.emit(
            "joined",
            instance_id=self.instance_id,
            member_id=generation.member_id,
            generation=generation.generation_id,
            leader=generation.leader_id,
            is_leader=generation.is_leader,
            protocol=generation.protocol,
            assignment=self.assignment,
        )

    def _on_heartbeat_error(self, error: str) -> None:
        self.emit(
            "heartbeat_error",
            member_id=self.member.member_id,
            generation=self.generation.generation_id if self.generation else None,
            error=error,
        )

    async def _on_revoked(self) -> None:
        self.emit(
            "revoked",
            member_id=self.member.member_id,
            generation=self.generation.generation_id if self.generation else None,
            assignment=self.assignment,
        )
        self.assignment = []

    # -- the process ------------------------------------------------------------------

    async def run(self) -> None:
        """Stay in the group until SIGTERM/SIGINT, then leave it; raise if it fails."""
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        signals = (signal.SIGTERM, signal.SIGINT)
        for sig in signals:
            loop.add_signal_handler(sig, stop.set)
        try:
            self.emit(
                "started",
                group=self.member.group_id,
                instance_id=self.instance_id,
                client_id=self.member.client_id,
                protocol=self.protocol,
                resources=self.resources,
            )
            await self.member.start()
            while not stop.is_set() and self.member.failure is None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), _FAILURE_POLL_S)
            failure = self.member.failure
            if failure is not None:
                self.emit("error", error=failure.code.name, message=str(failure))
                await self.member.close(leave=False)
                raise failure
            member_id = self.member.member_id
            if self.generation is not None and self.assignment:
                # stopping gives the assignment up here, as a rebalance would
                await self._on_revoked()
            # a static member keeps its place for the next process with its instance id
            leave = self.instance_id is None
            await self.member.close(leave=leave)
            self.emit(
                "left" if leave else "stopped",
                member_id=member_id,
                instance_id=self.instance_id,
                generation=self.generation.generation_id if self.generation else None,
            )
        finally:
            for sig in signals:
                loop.remove_signal_handler(sig)


@verifiable.command()
@click.option("--group", "group_id", required=True, help="The group to join.")
@click.option("--protocol", required=True, help="The assignment protocol's name.")
@click.option(
    "--resources",
    required=True,
    help="Comma-separated resources the leader assigns round-robin (members sorted by id).",
)
@click.option(
    "--protocol-type",
    default="verifiable",
    show_default=True,
    help="The group's protocol type; every member must use the same.",
)
@click.option(
    "--client-id", default="herder-verifiable", show_default=True, help="Shown by describe."
)
@click.option(
    "--instance-id",
    default=None,
    help="Be a static member with this group.instance.id: a restart within the session "
    "timeout gets the same place and assignment back without a rebalance, and SIGTERM "
    "stops without leaving the group.",
)
@click.option(
    "--session-timeout-ms",
    type=click.IntRange(min=1),
    default=10_000,
    show_default=True,
    help="Without a heartbeat for this long the member is expelled.",
)
@click.option(
    "--rebalance-timeout-ms",
    type=click.IntRange(min=1),
    default=60_000,
    show_default=True,
    help="How long a rebalance waits for this member to rejoin.",
)
@click.option(
    "--heartbeat-interval-ms",
    type=click.IntRange(min=1),
    default=3_000,
    show_default=True,
    help="Time between heartbeats; below the session timeout.",
)
@bootstrap_option
def member(
    group_id: str,
    protocol: str,
    resources: str,
    protocol_type: str,
    client_id: str,
    instance_id: str | None,
    session_timeout_ms: int,
    rebalance_timeout_ms: int,
    heartbeat_interval_ms: int,
    bootstrap: str,
) -> None:
    """Join --group, print one JSON line per event until SIGTERM, then leave and exit 0.

    Events: started, joined (member_id, generation, leader, assignment), revoked, left
    (stopped, for a static member, which does not leave), error. Every line has "event"
    and "timestamp" (epoch milliseconds).
    """
    names = [r.strip() for r in resources.split(",") if r.strip()]
    if not names:
        raise click.BadParameter("name at least one resource", param_hint="--resources")
    if instance_id is not None and not instance_id.strip():
        raise click.BadParameter("must not be empty", param_hint="--instance-id")
    if heartbeat_interval_ms >= session_timeout_ms:
        raise click.BadParameter(
            "must be below --session-timeout-ms", param_hint="--heartbeat-interval-ms"
        )
    client = VerifiableMember(
        protocol,
        names,
        instance_id=instance_id,
        bootstrap=bootstrap,
        group_id=group_id,
        protocol_type=protocol_type,
        client_id=client_id,
        session_timeout_ms=session_timeout_ms,
        rebalance_timeout_ms=rebalance_timeout_ms,
        heartbeat_interval_ms=heartbeat_interval_ms,
    )
    asyncio.run(client.run())
