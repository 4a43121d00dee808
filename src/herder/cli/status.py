"""``herder status``: the whole cluster on one screen.

Asks one worker (``--url``) for ``GET /admin/cluster`` and Connect's
``GET /connectors?expand=status&expand=info``, and shows the ensemble (servers, roles,
leader), the worker group (each worker's id, URL, role and task count; the generation
and the last rebalance's cause), and every connector and task (state, worker, records
moved, sink lag), then the last line of each failure's trace. ``--watch`` redraws it
every ``--interval`` seconds until Ctrl-C; ``--json`` prints the same as one JSON
document.
"""

from __future__ import annotations

import time
from typing import Any

import click
from rich.console import Group
from rich.table import Table
from rich.text import Text

from herder.cli.connectors import ClientSecurity, ConnectRest, url_option
from herder.cli.output import console, json_option, print_json

__all__ = ["status"]


def _fmt(value: Any, digits: int = 0) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def gather(rest: ConnectRest) -> dict[str, Any]:
    """The status document: ensemble, group and workers, connectors with their tasks."""
    cluster = rest.get("/admin/cluster")
    listed = rest.get("/connectors", expand=["status", "info"]) or {}
    metrics = {(t["connector"], t["task"]): t for t in cluster.get("tasks", [])}
    connectors = []
    for name in sorted(listed):
        entry = listed[name]
        status = entry.get("status") or {}
        kind = status.get("type") or (entry.get("info") or {}).get("type")
        tasks = []
        for task in status.get("tasks", []):
            figures = metrics.get((name, task["id"]), {}).get("metrics", {})
            sink = kind == "sink"
            tasks.append(
                {
                    "id": task["id"],
                    "state": task["state"],
                    "worker_id": task.get("worker_id"),
                    "records": figures.get(
                        "sink-record-send-total" if sink else "source-record-write-total"
                    ),
                    "records_per_second": figures.get(
                        "sink-record-send-rate" if sink else "source-record-write-rate"
                    ),
                    "lag_records": figures.get("sink-task-lag-records") if sink else None,
                    "lag_seconds": figures.get("sink-task-lag-seconds") if sink else None,
                    "record_errors": figures.get("total-record-errors"),
                    "trace": task.get("trace"),
                }
            )
        connector = status.get("connector") or {}
        connectors.append(
            {
                "name": name,
                "type": kind,
                "state": connector.get("state"),
                "worker_id": connector.get("worker_id"),
                "trace": connector.get("trace"),
                "tasks": tasks,
            }
        )
    group = cluster.get("group") or {}
    return {
        "worker": cluster.get("worker"),
        "ensemble": cluster.get("ensemble"),
        "group": {k: v for k, v in group.items() if k != "workers"},
        "workers": group.get("workers", []),
        "connectors": connectors,
        "errors": cluster.get("errors", []),
    }


def _table(title: str, columns: list[str], rows: list[list[Any]]) -> Group:
    """``title`` on a line of its own (a long one is not squeezed to the table's width),
    then the table."""
    table = Table(header_style="bold")
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(*(_fmt(v) if not isinstance(v, str) else v for v in row))
    return Group(Text(title, style="bold"), table)


def render(doc: dict[str, Any]) -> Group:
    """The one screen of ``herder status``."""
    parts: list[Any] = []
    ensemble = doc.get("ensemble")
    if isinstance(ensemble, list):
        rows = [
            [
                s.get("server_id"),
                s.get("address"),
                s.get("role") or f"unreachable: {s.get('error')}",
                s.get("leader"),
                s.get("epoch"),
                s.get("last_zxid"),
                ",".join(str(x) for x in s.get("learners", [])) or "-",
                s.get("last_sync"),
            ]
            for s in ensemble
        ]
        columns = ["server", "address", "role", "leader", "epoch", "zxid", "learners", "sync"]
        parts.append(_table("Ensemble", columns, rows))
    else:
        parts.append(Text(f"Ensemble: {(ensemble or {}).get('error', 'unknown')}"))
    group = doc.get("group", {})
    if "error" in group:
        parts.append(Text(f"Workers: {group['error']}"))
    else:
        title = (
            f"Workers (group {group.get('group_id')}, generation {group.get('generation')}, "
            f"{group.get('state')}; last rebalance: {group.get('rebalance_reason') or '-'}"
            + (
                f", took {group['last_rebalance_time_ms']} ms)"
                if group.get("last_rebalance_time_ms") is not None
                else ")"
            )
        )
        rows = [
            [w["id"], w.get("url"), "leader" if w.get("leader") else "member", len(w["tasks"])]
            for w in doc.get("workers", [])
        ]
        parts.append(_table(title, ["worker", "url", "role", "tasks"], rows))
    rows = []
    for c in doc.get("connectors", []):
        rows.append([c["name"], c["type"], c["state"], c["worker_id"], "", "", "", ""])
        for t in c["tasks"]:
            rows.append(
                [
                    f"  {c['name']}-{t['id']}",
                    "task",
                    t["state"],
                    t["worker_id"],
                    _fmt(t["records"]),
                    _fmt(t["records_per_second"], 1),
                    _fmt(t["lag_records"]),
                    _fmt(t["lag_seconds"], 1),
                ]
            )
    columns = ["connector / task", "type", "state", "worker", "records", "rec/s", "lag", "lag s"]
    parts.append(_table("Connectors and tasks", columns, rows))
    for c in doc.get("connectors", []):
        for who, what in [(c["name"], c), *((f"{c['name']}-{t['id']}", t) for t in c["tasks"])]:
            if what["state"] == "FAILED" and what.get("trace"):
                lines = [line for line in what["trace"].splitlines() if line.strip()]
                parts.append(Text(f"{who} failed: {lines[-1].strip()}", style="red"))
    for error in doc.get("errors", []):
        parts.append(Text(f"note: {error}", style="yellow"))
    return Group(*parts)


@click.command()
@url_option
@json_option
@click.option("--watch", is_flag=True, help="Redraw every --interval seconds until Ctrl-C.")
@click.option(
    "--interval", default=2.0, show_default=True, type=click.FloatRange(min=0.2), help="Seconds."
)
def status(url: str, as_json: bool, watch: bool, interval: float) -> None:
    """The ensemble, the workers, the connectors and tasks (state, worker, lag) at once."""
    rest = ConnectRest(url, ClientSecurity.from_environment())
    try:
        while True:
            doc = gather(rest)
            if as_json:
                print_json(doc)
            else:
                out = console()
                if watch:
                    out.clear()
                out.print(render(doc))
            if not watch:
                return
            time.sleep(interval)
    finally:
        rest.close()
