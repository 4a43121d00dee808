"""``herder logs``: create, inspect, write and read the ensemble's logs."""

from __future__ import annotations

import asyncio
import sys
import threading

import click

from herder.cli.ensemble_security import ensemble_security, ensemble_security_options
from herder.cli.output import (
    bootstrap_option,
    json_option,
    print_json,
    print_table,
    text_or_base64,
)
from herder.ensemble.client import EnsembleClient
from herder.ensemble.state import LogInfo
from herder.ensemble.txn import Record, format_zxid


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
def logs(ctx: click.Context, timeout: float) -> None:
    """The ensemble's named logs of keyed records."""
    ctx.obj = {"timeout": timeout}


def _client(bootstrap: str) -> EnsembleClient:
    settings = click.get_current_context().find_object(dict) or {}
    return EnsembleClient(
        bootstrap,
        name="herder-cli",
        session_timeout_ms=10_000,
        give_up_after=settings.get("timeout", 15.0),
        security=ensemble_security(),
    )


def _info(info: LogInfo) -> dict[str, object]:
    return {
        "name": info.name,
        "compacted": info.compacted,
        "start_offset": info.start_offset,
        "end_offset": info.end_offset,
        "records": info.records,
        "bytes": info.size_bytes,
        "created_zxid": info.created_zxid,
        "last_zxid": info.last_zxid,
    }


@logs.command()
@click.argument("name")
@click.option("--compacted", is_flag=True, help="Keep only the latest record per key.")
@bootstrap_option
@ensemble_security_options
@json_option
def create(name: str, compacted: bool, bootstrap: str, as_json: bool) -> None:
    """Create log NAME."""

    async def run() -> int:
        async with _client(bootstrap) as client:
            return await client.create_log(name, compacted=compacted)

    zxid = asyncio.run(run())
    if as_json:
        print_json({"name": name, "compacted": compacted, "zxid": zxid})
    else:
        kind = "compacted log" if compacted else "log"
        click.echo(f"created {kind} {name} at zxid {format_zxid(zxid)}")


@logs.command("list")
@bootstrap_option
@ensemble_security_options
@json_option
def list_(bootstrap: str, as_json: bool) -> None:
    """List every log."""

    async def run() -> list[LogInfo]:
        async with _client(bootstrap) as client:
            return await client.list_logs()

    infos = asyncio.run(run())
    if as_json:
        print_json([_info(i) for i in infos])
        return
    print_table(
        None,
        ["name", "kind", "start", "end", "records", "bytes"],
        [
            [i.name, "compacted" if i.compacted else "plain", i.start_offset, i.end_offset,
             i.records, i.size_bytes]
            for i in infos
        ],
    )  # fmt: skip


@logs.command()
@click.argument("name")
@bootstrap_option
@ensemble_security_options
@json_option
def describe(name: str, bootstrap: str, as_json: bool) -> None:
    """Describe log NAME."""

    async def run() -> LogInfo:
        async with _client(bootstrap) as client:
            return await client.describe_log(name)

    info = _info(asyncio.run(run()))
    if as_json:
        print_json(info)
        return
    for key, value in info.items():
        if key.endswith("zxid"):
            value = format_zxid(int(value))  # type: ignore[call-overload]
        click.echo(f"{key:>13}: {value}")


@logs.command()
@click.argument("name")
@click.option("--key", "-k", default=None, help="The record's key (UTF-8).")
@click.option("--value", "-v", default=None, help="The record's value (UTF-8).")
@click.option("--stdin", "from_stdin", is_flag=True, help="Append each line of standard input.")
@click.option(
    "--in-flight", default=500, show_default=True, help="With --stdin, appends awaiting answers."
)
@bootstrap_option
@ensemble_security_options
def append(
    name: str,
    key: str | None,
    value: str | None,
    from_stdin: bool,
    in_flight: int,
    bootstrap: str,
) -> None:
    """Append a record to NAME and print its offset.

    With --stdin each line becomes a record, appended pipelined, and `OFFSET<TAB>VALUE`
    is printed for each as soon as it is acknowledged, so a run that is cut short tells
    exactly which lines were stored.
    """
    if from_stdin == (value is not None):
        raise click.UsageError("give exactly one of --value and --stdin")
    key_bytes = key.encode() if key is not None else None
    if value is not None:

        async def one() -> int:
            async with _client(bootstrap) as client:
                return await client.append(name, value.encode(), key_bytes)

        click.echo(asyncio.run(one()))
        return
    asyncio.run(_append_stdin(bootstrap, name, key_bytes, max(1, in_flight)))


async def _append_stdin(bootstrap: str, name: str, key: bytes | None, in_flight: int) -> None:
    loop = asyncio.get_running_loop()
    lines: asyncio.Queue[str | None] = asyncio.Queue(maxsize=in_flight * 2)

    def read_lines() -> None:
        for line in sys.stdin:
            asyncio.run_coroutine_threadsafe(lines.put(line.rstrip("\r\n")), loop).result()
        asyncio.run_coroutine_threadsafe(lines.put(None), loop).result()

    threading.Thread(target=read_lines, daemon=True).start()
    window = asyncio.Semaphore(in_flight)
    failures: list[BaseException] = []

    async def send(client: EnsembleClient, line: str) -> None:
        try:
            offset = await client.append(name, line.encode(), key)
        except Exception as exc:
            failures.append(exc)
        else:
            sys.stdout.write(f"{offset}\t{line}\n")
            sys.stdout.flush()
        finally:
            window.release()

    async with _client(bootstrap) as client:
        tasks = set()
        while (line := await lines.get()) is not None and not failures:
            await window.acquire()
            task = asyncio.create_task(send(client, line))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.gather(*tasks)
    if failures:
        raise failures[0]


def _record_json(record: Record) -> dict[str, object]:
    return {
        "offset": record.offset,
        "key": text_or_base64(record.key),
        "value": text_or_base64(record.value),
        "zxid": record.zxid,
        "timestamp": record.timestamp_ms,
        **(
            {"headers": {k: text_or_base64(v) for k, v in record.headers}} if record.headers else {}
        ),
    }


@logs.command()
@click.argument("name")
@click.option("--from", "from_offset", default=0, show_default=True, help="First offset to read.")
@click.option("--max", "max_records", type=int, default=None, help="Stop after this many records.")
@click.option("--follow", "-f", is_flag=True, help="Keep waiting for new records.")
@bootstrap_option
@ensemble_security_options
def read(
    name: str, from_offset: int, max_records: int | None, follow: bool, bootstrap: str
) -> None:
    """Print the records of NAME, one JSON object per line.

    Keys and values are UTF-8 text where they decode, else {"base64": "…"}.
    """
    asyncio.run(_read(bootstrap, name, from_offset, max_records, follow))


async def _read(
    bootstrap: str, name: str, position: int, max_records: int | None, follow: bool
) -> None:
    printed = 0
    async with _client(bootstrap) as client:
        while max_records is None or printed < max_records:
            want = 1000 if max_records is None else min(1000, max_records - printed)
            reply = await client.read(
                name, position, max_records=want, wait_ms=5_000 if follow else 0
            )
            for record in reply.records:
                print_json(_record_json(record))
                printed += 1
            position = reply.next_offset
            if not reply.records and not follow and position >= reply.end_offset:
                break
