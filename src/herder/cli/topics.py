"""``herder topics``: create, inspect, read and delete data topics.

Everything but ``consume`` and ``delete`` talks to the ensemble only. ``consume`` reads
segment files with pyarrow rather than Spark: a CLI that prints a few records should
not wait seconds for a JVM, and a segment is an ordinary Parquet file. It needs
``--storage-root`` (or ``HERDER_STORAGE_ROOT``), as ``delete`` does to remove files.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import click

from herder.cli.ensemble_security import ensemble_security, ensemble_security_options
from herder.cli.output import (
    bootstrap_option,
    json_option,
    print_json,
    print_table,
    text_or_base64,
)

if TYPE_CHECKING:
    # imported where used: pyarrow costs every ``herder`` command half a second
    from herder.dataplane.metadata import PartitionState, Topic
    from herder.dataplane.topics import Topics

storage_root_option = click.option(
    "--storage-root",
    envvar="HERDER_STORAGE_ROOT",
    default=None,
    help="The workers' storage.root: a local directory or filesystem URI "
    "(env HERDER_STORAGE_ROOT).",
)


@click.group()
@click.option(
    "--timeout",
    type=float,
    default=15.0,
    show_default=True,
    envvar="HERDER_TIMEOUT",
    help="Seconds to keep looking for a reachable ensemble server (env HERDER_TIMEOUT).",
)
@click.pass_context
def topics(ctx: click.Context, timeout: float) -> None:
    """Data topics: partitions of Parquet segments, their metadata in the ensemble."""
    ctx.obj = {"timeout": timeout}


@asynccontextmanager
async def _topics(bootstrap: str, storage_root: str | None = None) -> AsyncIterator[Topics]:
    from herder.dataplane.storage import Storage
    from herder.dataplane.topics import Topics
    from herder.ensemble.client import EnsembleClient

    settings = click.get_current_context().find_object(dict) or {}
    client = EnsembleClient(
        bootstrap,
        name="herder-cli",
        session_timeout_ms=10_000,
        give_up_after=settings.get("timeout", 15.0),
        security=ensemble_security(),
    )
    storage = Storage(storage_root) if storage_root else None
    async with client:
        yield Topics(client, storage)


def _need_root(storage_root: str | None, why: str) -> str:
    if not storage_root:
        raise click.UsageError(f"give --storage-root (or set HERDER_STORAGE_ROOT) {why}")
    return storage_root


def _parse_configs(items: Sequence[str]) -> dict[str, str]:
    configs = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{item!r} is not KEY=VALUE", param_hint="--config")
        configs[key.strip()] = value.strip()
    return configs


def _when(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat(timespec="seconds")


def _summary(topic: Topic) -> dict[str, Any]:
    return {
        "name": topic.name,
        "partitions": topic.partitions,
        "config": topic.config,
        "created_ms": topic.spec.created_ms,
    }


def _partition(state: PartitionState) -> dict[str, Any]:
    live = state.live()
    return {
        "partition": state.partition,
        "start_offset": live[0].base_offset if live else state.next_offset,
        "end_offset": state.next_offset,
        "segments": len(live),
        "bytes": state.size_bytes,
        "retired_segments": len(state.retired()),
        "segment_list": [
            {
                "base_offset": s.base_offset,
                "count": s.count,
                "bytes": s.bytes,
                "max_timestamp": s.max_timestamp,
                "files": s.files,
            }
            for s in live
        ],
    }


@topics.command()
@click.argument("name")
@click.option(
    "--partitions", "-p", type=click.IntRange(min=1), default=1, show_default=True,
    help="How many partitions the topic has.",
)  # fmt: skip
@click.option("--config", "-c", "configs", multiple=True, help="A topic config, KEY=VALUE.")
@click.option("--if-not-exists", is_flag=True, help="Succeed if the topic already exists.")
@bootstrap_option
@ensemble_security_options
@json_option
def create(
    name: str,
    partitions: int,
    configs: tuple[str, ...],
    if_not_exists: bool,
    bootstrap: str,
    as_json: bool,
) -> None:
    """Create topic NAME.

    Configs: retention.ms, retention.bytes, retention.file.delete.delay.ms.
    """
    config = _parse_configs(configs)

    async def run() -> Topic:
        async with _topics(bootstrap) as t:
            return await t.create(name, partitions, config, if_absent=if_not_exists)

    topic = asyncio.run(run())
    if as_json:
        print_json(_summary(topic))
    else:
        click.echo(f"created topic {topic.name} with {topic.partitions} partitions")


@topics.command("list")
@bootstrap_option
@ensemble_security_options
@json_option
def list_(bootstrap: str, as_json: bool) -> None:
    """List every topic."""

    async def run() -> list[Topic]:
        async with _topics(bootstrap) as t:
            return await t.list_topics()

    found = asyncio.run(run())
    if as_json:
        print_json([_summary(t) for t in found])
        return
    print_table(
        None,
        ["name", "partitions", "retention.ms", "retention.bytes", "created"],
        [
            [t.name, t.partitions, t.config["retention.ms"], t.config["retention.bytes"],
             _when(t.spec.created_ms)]
            for t in found
        ],
    )  # fmt: skip


@topics.command()
@click.argument("name")
@bootstrap_option
@ensemble_security_options
@json_option
def describe(name: str, bootstrap: str, as_json: bool) -> None:
    """Describe topic NAME: its configs, and each partition's offsets, segments and bytes."""

    async def run() -> tuple[Topic, list[PartitionState]]:
        async with _topics(bootstrap) as t:
            topic = await t.get(name)
            return topic, await t.partitions(name)

    topic, states = asyncio.run(run())
    parts = [_partition(s) for s in states]
    if as_json:
        print_json({**_summary(topic), "partition_details": parts})
        return
    click.echo(
        f"topic {topic.name}: {topic.partitions} partitions, created {_when(topic.spec.created_ms)}"
    )
    click.echo("config: " + ", ".join(f"{k}={v}" for k, v in topic.config.items()))
    print_table(
        None,
        ["partition", "start", "end", "segments", "bytes", "retired"],
        [
            [p["partition"], p["start_offset"], p["end_offset"], p["segments"], p["bytes"],
             p["retired_segments"]]
            for p in parts
        ],
    )  # fmt: skip


@topics.command()
@click.argument("name")
@click.option("--keep-files", is_flag=True, help="Delete the metadata only; leave the files.")
@bootstrap_option
@ensemble_security_options
@storage_root_option
def delete(name: str, keep_files: bool, bootstrap: str, storage_root: str | None) -> None:
    """Delete topic NAME and its segment files."""
    if not keep_files:
        _need_root(storage_root, "to delete the topic's files, or pass --keep-files")

    async def run() -> None:
        async with _topics(bootstrap, storage_root) as t:
            await t.delete(name, delete_files=not keep_files)

    asyncio.run(run())
    click.echo(f"deleted topic {name}")


@topics.command()
@click.argument("name")
@click.option("--from-beginning", is_flag=True, help="Start at each partition's start offset.")
@click.option("--max", "max_records", type=click.IntRange(min=1), default=None,
              help="Stop after this many records.")  # fmt: skip
@click.option(
    "--timeout-ms",
    type=click.IntRange(min=0),
    default=None,
    help="Stop once no record arrived for this long (default: keep waiting).",
)
@bootstrap_option
@ensemble_security_options
@storage_root_option
def consume(
    name: str,
    from_beginning: bool,
    max_records: int | None,
    timeout_ms: int | None,
    bootstrap: str,
    storage_root: str | None,
) -> None:
    """Print the records of NAME as they are committed, one JSON object per line.

    Starts at the end of each partition (only new records) unless --from-beginning.
    Keys, values and header values are UTF-8 text where they decode, else
    {"base64": "…"}; timestamps are milliseconds since the epoch.
    """
    root = _need_root(storage_root, "to read the topic's files")
    asyncio.run(_consume(bootstrap, root, name, from_beginning, max_records, timeout_ms))


async def _consume(
    bootstrap: str,
    root: str,
    name: str,
    from_beginning: bool,
    max_records: int | None,
    timeout_ms: int | None,
) -> None:
    from herder.dataplane.reader import slice_batches

    loop = asyncio.get_running_loop()
    printed = 0
    async with _topics(bootstrap, root) as t:
        storage = t.storage
        positions = await (t.start_offsets(name) if from_beginning else t.end_offsets(name))
        last_record = loop.time()
        while True:
            ranges = {p: (offset, None) for p, offset in positions.items()}
            got = 0
            for piece in await t.plan_read(name, ranges):
                tables = slice_batches(storage, piece)
                while (table := await asyncio.to_thread(next, tables, None)) is not None:
                    for row in table.to_pylist():
                        print_json(_record_json(name, row))
                        positions[row["partition"]] = row["offset"] + 1
                        printed += 1
                        got += 1
                        if max_records is not None and printed >= max_records:
                            return
            now = loop.time()
            if got:
                last_record = now
            elif timeout_ms is not None and (now - last_record) * 1000 >= timeout_ms:
                return
            if not got:
                await asyncio.sleep(0.2)


def _record_json(topic: str, row: dict[str, Any]) -> dict[str, Any]:
    record = {
        "topic": topic,
        "partition": row["partition"],
        "offset": row["offset"],
        "timestamp": row["timestamp"],
        "key": text_or_base64(row["key"]),
        "value": text_or_base64(row["value"]),
    }
    if row["headers"]:
        record["headers"] = [[h["key"], text_or_base64(h["value"])] for h in row["headers"]]
    return record
