"""The worker's own metric group: connector starts that succeed and fail, and the status
of each connector, as the worker publishes them."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from herder.connect import SourceConnector, SourceTask
from herder.runtime.core.config_state import TargetState
from herder.runtime.plugins import Plugins
from herder.runtime.rest.prometheus import render
from herder.runtime.worker import Worker
from tests.ops.metrics_text import parse, value

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]


class Starts(SourceConnector):
    """Fails to start when its config says so."""

    def start(self, config: dict[str, str]) -> None:
        if config.get("fail") == "true":
            raise RuntimeError("cannot reach the source system")

    def stop(self) -> None:
        pass

    def task_class(self) -> type[SourceTask]:
        return SourceTask

    def task_configs(self, max_tasks: int) -> list[dict[str, str]]:
        return []

    def version(self) -> str:
        return "1"


class Statuses:
    async def put(self, status: Any) -> None:
        pass


def test_connector_starts_and_statuses_are_counted() -> None:
    async def run() -> Worker:
        w = Worker("w1", Plugins([Starts]), Statuses(), lambda *a: None)  # type: ignore[arg-type]
        w.assigned(1)
        config = {"connector.class": "Starts"}
        assert await w.start_connector("good", config, TargetState.STARTED, 1)
        assert not await w.start_connector(
            "bad", {**config, "fail": "true"}, TargetState.STARTED, 1
        )
        assert await w.start_connector("idle", config, TargetState.PAUSED, 1)
        await w.stop_connector("idle")
        return w

    worker = asyncio.run(run())
    m = parse(render(worker.metrics.samples(), process=False).decode())
    assert value(m, "kafka_connect_worker_connector_startup_attempts_total") == 3
    assert value(m, "kafka_connect_worker_connector_startup_success_total") == 2
    assert value(m, "kafka_connect_worker_connector_startup_failure_total") == 1
    assert value(m, "kafka_connect_worker_connector_startup_failure_percentage") == pytest.approx(
        1 / 3
    )
    assert value(m, "kafka_connect_worker_connector_count") == 2  # the stopped one is gone
    assert value(m, "kafka_connect_connector_status", connector="good", status="running") == 1
    assert value(m, "kafka_connect_connector_status", connector="bad", status="failed") == 1
    assert (
        value(
            m, "kafka_connect_connector_connector_class", connector="good", connector_class="Starts"
        )
        == 1
    )
    assert (
        value(m, "kafka_connect_connector_connector_type", connector="bad", connector_type="source")
        == 1
    )
