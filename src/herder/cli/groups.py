"""``herder groups``: list, describe and delete the coordinator's groups.

The counterpart of ``kafka-consumer-groups``: every command finds the coordinator (the
ensemble leader) through any bootstrap server and asks it directly. While the
coordinator moves or is still loading its groups, a request is retried until
``--timeout``; any other refusal (NON_EMPTY_GROUP, GROUP_ID_NOT_FOUND …) is the
user's to fix and is reported at once, in one line.
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import click

from herder.cli.ensemble_security import ensemble_security, ensemble_security_options
from herder.cli.output import (
    bootstrap_option,
    json_option,
    print_json,
    print_table,
    text_or_base64,
)
from herder.coordinator import apis
from herder.coordinator import messages as m
from herder.coordinator.client import CoordinatorClient
from herder.errors import ErrorCode, GroupIdNotFound, HerderError, error_from_code

T = TypeVar("T")

#: what the user is told, after the error's name, about a refusal they can act on
_HINTS: dict[ErrorCode, str] = {
    ErrorCode.NON_EMPTY_GROUP: "it still has members: stop them, or wait for their "
    "sessions to expire, then try again",
    ErrorCode.GROUP_ID_NOT_FOUND: "no such group",
    ErrorCode.INVALID_GROUP_ID: "a group id must not be empty",
}


@click.group()
@click.option(
    "--timeout",
    type=float,
    default=15.0,
    show_default=True,
    envvar="HERDER_TIMEOUT",
    help="Seconds to keep looking for the coordinator (env HERDER_TIMEOUT).",
)
@click.pass_context
def groups(ctx: click.Context, timeout: float) -> None:
    """Groups on the coordinator: members, generations, assignments, offsets."""
    ctx.obj = {"timeout": timeout}


def _timeout() -> float:
    settings = click.get_current_context().find_object(dict) or {}
    return float(settings.get("timeout", 15.0))


def _refusal(code: int, what: str) -> HerderError:
    """The error for ``code``, named, with what the user can do about it where we know."""
    try:
        name, hint = ErrorCode(code).name, _HINTS.get(ErrorCode(code))
    except ValueError:
        name, hint = f"error code {code}", None
    return error_from_code(code, f"{what}: {name}" + (f" ({hint})" if hint else ""))


async def _with_coordinator(
    bootstrap: str, timeout: float, work: Callable[[CoordinatorClient], Awaitable[T]]
) -> T:
    """Run ``work``, retrying it while the coordinator is unreachable, moving or loading."""
    deadline = time.monotonic() + timeout
    delay = 0.1
    security = ensemble_security()
    while True:
        client = CoordinatorClient(bootstrap, security=security)
        try:
            return await work(client)
        except HerderError as exc:
            if not exc.retriable:
                raise
            if time.monotonic() + delay > deadline:
                raise type(exc)(
                    f"no coordinator answered through {bootstrap} within {timeout:g}s: {exc}"
                ) from None
        finally:
            await client.close()
        await asyncio.sleep(delay)
        delay = min(delay * 2, 1.0)


def _check(code: int, what: str) -> None:
    """Raise for an error code in a reply; retriable codes raise retriable errors."""
    if code != ErrorCode.NONE:
        raise _refusal(code, what)


# -- list ---------------------------------------------------------------------------------


@groups.command("list")
@click.option(
    "--state",
    "states",
    multiple=True,
    metavar="STATE",
    help="Only groups in this state (Empty, PreparingRebalance, CompletingRebalance, "
    "Stable; any case); repeat for several.",
)
@bootstrap_option
@ensemble_security_options
@json_option
def list_(states: tuple[str, ...], bootstrap: str, as_json: bool) -> None:
    """List every group (or those in --state) with its protocol type and state."""

    async def work(client: CoordinatorClient) -> list[m.ListedGroup]:
        request = m.ListGroupsRequest(states_filter=list(states))
        reply = await client.request(apis.LIST_GROUPS, request)
        _check(reply.error_code, "list groups")
        return reply.groups

    listed = asyncio.run(_with_coordinator(bootstrap, _timeout(), work))
    rows = [
        {"group_id": g.group_id, "protocol_type": g.protocol_type, "state": g.state} for g in listed
    ]
    if as_json:
        print_json(rows)
        return
    print_table(None, ["group", "protocol type", "state"], [list(row.values()) for row in rows])


# -- describe -----------------------------------------------------------------------------


def _describe_json(group: m.DescribedGroup, offsets: list[m.FetchedOffset]) -> dict[str, Any]:
    return {
        "group_id": group.group_id,
        "state": group.state,
        "protocol_type": group.protocol_type,
        "protocol": group.protocol,
        "generation": group.generation_id,
        "leader": group.leader,
        "members": [
            {
                "member_id": member.member_id,
                "group_instance_id": member.group_instance_id,
                "client_id": member.client_id,
                "client_host": member.client_host,
                "metadata": text_or_base64(member.metadata),
                "assignment": text_or_base64(member.assignment),
            }
            for member in group.members
        ],
        "offsets": [
            {
                "topic": o.topic,
                "partition": o.partition,
                "offset": o.offset,
                "metadata": o.metadata,
            }
            for o in offsets
        ],
    }


def _human_bytes(data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return "base64:" + base64.b64encode(data).decode("ascii")


@groups.command()
@click.argument("group_id", metavar="GROUP")
@bootstrap_option
@ensemble_security_options
@json_option
def describe(group_id: str, bootstrap: str, as_json: bool) -> None:
    """Describe GROUP: state, generation, leader, members and committed offsets.

    Assignments are shown as UTF-8 text where they decode, else base64 (in --json,
    {"base64": "…"}). Members' assignments are known only while the group is Stable.
    A static member shows its group instance id (null in --json for a dynamic one).
    """

    async def work(client: CoordinatorClient) -> tuple[m.DescribedGroup, list[m.FetchedOffset]]:
        reply = await client.request(
            apis.DESCRIBE_GROUPS, m.DescribeGroupsRequest(group_ids=[group_id])
        )
        _check(reply.error_code, f"describe group {group_id!r}")
        (group,) = reply.groups
        _check(group.error_code, f"describe group {group_id!r}")
        if group.state == "Dead":
            raise GroupIdNotFound(f"group {group_id!r} does not exist")
        fetched = await client.request(apis.OFFSET_FETCH, m.OffsetFetchRequest(group_id=group_id))
        _check(fetched.error_code, f"fetch the offsets of group {group_id!r}")
        offsets = sorted(
            (o for o in fetched.offsets if o.offset != m.NO_OFFSET),
            key=lambda o: (o.topic, o.partition),
        )
        return group, offsets

    group, offsets = asyncio.run(_with_coordinator(bootstrap, _timeout(), work))
    if as_json:
        print_json(_describe_json(group, offsets))
        return
    fields = [
        ("group", group.group_id),
        ("state", group.state),
        ("protocol type", group.protocol_type or "-"),
        ("protocol", group.protocol or "-"),
        ("generation", group.generation_id),
        ("leader", group.leader or "-"),
    ]
    for name, value in fields:
        click.echo(f"{name:>13}: {value}")
    print_table(
        "members",
        ["member id", "instance id", "client id", "host", "leader", "assignment"],
        [
            [
                member.member_id,
                member.group_instance_id or "-",
                member.client_id,
                member.client_host,
                "*" if member.member_id == group.leader else "",
                _human_bytes(member.assignment),
            ]
            for member in group.members
        ],
    )
    print_table(
        "committed offsets",
        ["topic", "partition", "offset", "metadata"],
        [[o.topic, o.partition, o.offset, o.metadata] for o in offsets],
    )


# -- delete -------------------------------------------------------------------------------


@groups.command()
@click.argument("group_id", metavar="GROUP")
@bootstrap_option
@ensemble_security_options
@json_option
def delete(group_id: str, bootstrap: str, as_json: bool) -> None:
    """Delete GROUP and its committed offsets; only a group with no members (Empty)."""

    async def work(client: CoordinatorClient) -> None:
        reply = await client.request(
            apis.DELETE_GROUPS, m.DeleteGroupsRequest(group_ids=[group_id])
        )
        codes = [result.error_code for result in reply.results] or [reply.error_code]
        _check(m.first_error(codes), f"cannot delete group {group_id!r}")

    asyncio.run(_with_coordinator(bootstrap, _timeout(), work))
    if as_json:
        print_json({"group_id": group_id, "deleted": True})
    else:
        click.echo(f"deleted group {group_id}")
