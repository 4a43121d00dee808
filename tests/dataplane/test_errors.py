"""The ``errors.*`` settings: parsing, retries of retriable failures, failure wording.

Dead letters themselves are shown on a real pipeline in test_transforms_pipeline.py.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from herder.config import InvalidConfiguration
from herder.dataplane import errors
from herder.dataplane.errors import ErrorHandling, Failure, task_failure
from herder.dataplane.transforms.pipeline import RecordPipeline, validate_record_handling
from herder.errors import ErrorCode, NotLeader, RetriableError

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(errors, "_FIRST_RETRY_DELAY_S", 0.01)


def test_settings_have_connects_defaults_and_names() -> None:
    default = ErrorHandling.from_settings({})
    assert not default.tolerate_all and not default.dead_letters
    assert default.retry_timeout_ms == 0 and default.retry_delay_max_ms == 60_000
    handling = ErrorHandling.from_settings(
        {
            "errors.tolerance": "all",
            "errors.deadletterqueue.topic.name": " dlq ",
            "errors.deadletterqueue.context.headers.enable": "true",
            "errors.log.enable": "true",
            "errors.log.include.messages": "true",
            "errors.retry.timeout": "-1",
            "errors.retry.delay.max.ms": "10",
        }
    )
    assert handling.dead_letters and handling.dead_letter_topic == "dlq"
    assert handling.context_headers and handling.log_failures and handling.log_messages
    assert handling.retry_timeout_ms == -1
    with pytest.raises(InvalidConfiguration, match=r"errors\.tolerance"):
        ErrorHandling.from_settings({"errors.tolerance": "some"})
    assert validate_record_handling({"errors.retry.timeout": "-2"}) == [
        "errors.retry.timeout: Invalid value -2 for configuration errors.retry.timeout: "
        "Value must be at least -1"
    ]


class Flaky:
    """Fails with a retriable error ``failures`` times, then returns ``"ok"``."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        if self.calls <= self.failures:
            raise NotLeader("not now")
        return "ok"

    async def run(self) -> str:
        return self()


def test_retry_until_success_within_the_timeout() -> None:
    flaky = Flaky(3)
    handling = ErrorHandling(retry_timeout_ms=5_000, retry_delay_max_ms=20)
    assert asyncio.run(handling.retry(flaky.run, "op")) == "ok"
    assert flaky.calls == 4


def test_no_retry_by_default_and_give_up_after_the_timeout() -> None:
    flaky = Flaky(1)
    with pytest.raises(NotLeader):
        asyncio.run(ErrorHandling().retry(flaky.run, "op"))
    assert flaky.calls == 1
    forever = Flaky(10**9)
    started = time.monotonic()
    with pytest.raises(RetriableError):
        asyncio.run(
            ErrorHandling(retry_timeout_ms=200, retry_delay_max_ms=20).retry(forever.run, "op")
        )
    assert 0.1 < time.monotonic() - started < 5 and forever.calls > 3
    # other errors are not retried at all
    calls = []

    async def broken() -> None:
        calls.append(1)
        raise ValueError("bug")

    with pytest.raises(ValueError):
        asyncio.run(ErrorHandling(retry_timeout_ms=-1).retry(broken, "op"))
    assert calls == [1]


def _pipeline(settings: dict[str, str]) -> RecordPipeline:
    none: Any = None
    return RecordPipeline(
        settings, connector="c", task=0, topics=none, spark=none, coordinator=none
    )


def test_a_polls_retriable_failure_fails_the_task_or_is_tolerated() -> None:
    settings = {"errors.retry.timeout": "100", "errors.retry.delay.max.ms": "10"}
    with pytest.raises(NotLeader):
        asyncio.run(_pipeline(settings).poll(Flaky(10**9).run))
    tolerant = _pipeline({**settings, "errors.tolerance": "all"})
    assert asyncio.run(tolerant.poll(Flaky(10**9).run)) is None
    assert asyncio.run(tolerant.poll(Flaky(2).run)) == "ok"


def test_a_failure_reads_as_connects() -> None:
    failure = Failure(
        "TRANSFORMATION",
        "org.apache.kafka.connect.transforms.Cast$Value",
        "herder.dataplane.errors.RecordError",
        "cast: Cannot cast field 'a' \"x\" to int32",
        "orders",
        0,
        7,
        None,
        b'{"a":"x"}',
    )
    error = task_failure("sink-0", failure)
    assert error.code == ErrorCode.INVALID_RECORD
    assert str(error) == (
        "Tolerance exceeded in error handler: Error encountered in task sink-0. Executing stage "
        "'TRANSFORMATION' with class 'org.apache.kafka.connect.transforms.Cast$Value', where "
        "record is {topic=orders, partition=0, offset=7}: herder.dataplane.errors.RecordError: "
        "cast: Cannot cast field 'a' \"x\" to int32"
    )
    assert 'value={"a":"x"}' in failure.describe("sink-0", with_messages=True)
