"""How commands print: rich tables for people, one JSON document per line for scripts."""

from __future__ import annotations

import base64
import json
import sys
from collections.abc import Sequence
from typing import Any

import click
from rich.console import Console
from rich.table import Table

BOOTSTRAP_HELP = "Ensemble servers, host:port[,host:port…] (env HERDER_BOOTSTRAP)."

bootstrap_option = click.option(
    "--bootstrap",
    "-b",
    default="127.0.0.1:2191",
    show_default=True,
    envvar="HERDER_BOOTSTRAP",
    help=BOOTSTRAP_HELP,
)
json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")


def console() -> Console:
    # a pipe or a file has no width: never squeeze a table into 80 columns there
    out = Console(soft_wrap=True)
    return out if out.is_terminal else Console(soft_wrap=True, width=240)


def print_json(value: Any) -> None:
    sys.stdout.write(json.dumps(value, default=str, ensure_ascii=False) + "\n")
    sys.stdout.flush()


def print_table(title: str | None, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    table = Table(title=title, show_lines=False, header_style="bold")
    for col in columns:
        table.add_column(col)
    for row in rows:
        table.add_row(*("" if v is None else str(v) for v in row))
    console().print(table)


def text_or_base64(data: bytes | None) -> Any:
    """UTF-8 text where the bytes decode, else ``{"base64": "…"}`` so nothing is mangled."""
    if data is None:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(data).decode("ascii")}
