"""``herder status``'s screen from a status document: every part, and failures' causes."""

from __future__ import annotations

import pytest
from rich.console import Console

from herder.cli.status import render

pytestmark = pytest.mark.unit

DOC = {
    "ensemble": [
        {
            "server_id": 1,
            "address": "h:2191",
            "role": "leader",
            "leader": 1,
            "epoch": 4,
            "last_zxid": "0x400000010",
            "learners": [2],
            "last_sync": None,
        },
        {"server_id": 2, "address": "h:2192", "error": "connection refused"},
    ],
    "group": {
        "group_id": "g",
        "generation": 3,
        "state": "Stable",
        "rebalance_reason": "member w2 joined",
        "last_rebalance_time_ms": 12,
    },
    "workers": [{"id": "h:8083", "url": "http://h:8083", "leader": True, "tasks": ["c-0"]}],
    "connectors": [
        {
            "name": "c",
            "type": "sink",
            "state": "RUNNING",
            "worker_id": "h:8083",
            "trace": None,
            "tasks": [
                {
                    "id": 0,
                    "state": "FAILED",
                    "worker_id": "h:8083",
                    "records": 10,
                    "records_per_second": 1.5,
                    "lag_records": 4,
                    "lag_seconds": 2.0,
                    "trace": "Traceback\n  ...\nIsADirectoryError: [Errno 21] Is a directory",
                }
            ],
        },
    ],
    "errors": ["the tasks of http://h:8084: timed out"],
}


def test_the_screen_has_every_part() -> None:
    out = Console(width=200, record=True)
    out.print(render(DOC))
    screen = out.export_text()
    for expected in (
        "h:2192",
        "unreachable: connection refused",
        "leader",
        "generation 3",
        "member w2 joined, took 12 ms",
        "http://h:8083",
        "c-0",
        "FAILED",
        "1.5",
        "2.0",
        "c-0 failed: IsADirectoryError: [Errno 21] Is a directory",
        "note: the tasks of http://h:8084: timed out",
    ):
        assert expected in screen, (expected, screen)
