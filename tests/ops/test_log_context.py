"""Log lines name their connector and task, in text (Connect's MDC) and in JSON."""

from __future__ import annotations

import asyncio
import io
import json
import logging
from collections.abc import Iterator

import pytest

from herder import logcontext
from herder.runtime.worker import TaskControl

pytestmark = pytest.mark.unit

log = logging.getLogger("herder.test.context")


@pytest.fixture
def captured() -> Iterator[io.StringIO]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    stream = io.StringIO()
    yield stream
    for handler in list(root.handlers):
        root.removeHandler(handler)
    for handler in handlers:
        root.addHandler(handler)
    root.setLevel(level)


def test_text_lines_carry_connects_context(captured: io.StringIO) -> None:
    stream = captured
    logcontext.configure("INFO", "text", stream)
    log.info("outside")
    with logcontext.scope("orders", 3):
        log.info("polled %d", 7)
    with logcontext.scope("orders"):
        log.info("connector line")
    lines = stream.getvalue().splitlines()
    assert lines[0].endswith("herder.test.context: outside")
    assert lines[1].endswith("herder.test.context: [orders|task-3] polled 7")
    assert lines[2].endswith("herder.test.context: [orders|worker] connector line")


def test_json_lines(captured: io.StringIO) -> None:
    stream = captured
    logcontext.configure("INFO", "json", stream)
    with logcontext.scope("orders", 0):
        try:
            raise ValueError("boom")
        except ValueError:
            log.exception("put failed")
    log.warning("plain")
    first, second = (
        json.loads(line) for line in stream.getvalue().splitlines() if line.startswith("{")
    )
    assert first["connector"] == "orders" and first["task"] == 0
    assert first["level"] == "ERROR" and first["message"] == "put failed"
    assert "ValueError: boom" in first["exception"]
    assert first["logger"] == "herder.test.context"
    assert "connector" not in second and second["level"] == "WARNING"


def test_a_tasks_calls_on_its_thread_keep_the_tasks_context(
    captured: io.StringIO,
) -> None:
    stream = captured
    logcontext.configure("INFO", "text", stream)

    async def run() -> None:
        control = TaskControl("task-orders-1")
        logcontext.enter("orders", 1)
        await control.call(log.info, "on the task's thread")
        control.end()

    asyncio.run(run())
    assert "[orders|task-1] on the task's thread" in stream.getvalue()
