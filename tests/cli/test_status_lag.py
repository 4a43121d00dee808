"""``herder connectors status`` shows a lag column only when some task reports a lag."""

from __future__ import annotations

import pytest

from herder.cli.connectors import _print_status

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]


def status(**task: object) -> dict[str, object]:
    return {
        "name": "inventory",
        "type": "source",
        "connector": {"state": "RUNNING", "worker_id": "w1:8083"},
        "tasks": [{"id": 0, "state": "PAUSED", "worker_id": "w1:8083", **task}],
    }


def test_a_reported_lag_is_a_column_of_the_tasks(capsys: pytest.CaptureFixture[str]) -> None:
    _print_status(status(lag={"bytes": 4096, "seconds": 1.5}))
    out = capsys.readouterr().out
    assert "lag" in out and "bytes=4096 seconds=1.5" in out


def test_no_lag_no_column(capsys: pytest.CaptureFixture[str]) -> None:
    _print_status(status())
    assert "lag" not in capsys.readouterr().out
