"""Error handling for records: Connect's ``errors.*`` settings, dead letters, retries.

A record can fail on its way through a task — its bytes do not convert, or a
transform cannot apply to it. ``errors.tolerance`` says what happens then: ``none``
(the default) fails the task with the failure in its status; ``all`` skips the record,
and, if ``errors.deadletterqueue.topic.name`` is set, writes it as it was read to that
topic, with the failure in ``__connect.errors.*`` headers when
``errors.deadletterqueue.context.headers.enable`` is true. ``errors.log.enable`` logs
every failure (with the record's key and value if ``errors.log.include.messages``).

Failures are found the Spark way: each stage marks a failing row in an error column
instead of raising, so good and bad rows separate with a filter and nothing is
collected to Python but the few failures that get logged.

``errors.retry.timeout`` and ``errors.retry.delay.max.ms`` bound how long an operation
failing with a :class:`~herder.errors.RetriableError` is retried (a source's poll, the
write of dead letters), with exponential backoff from 300 ms.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from herder.config import ConfigDef, Importance, Range, Type, ValidString
from herder.errors import ErrorCode, HerderError, RetriableError

log = logging.getLogger(__name__)

T = TypeVar("T")

ERRORS_GROUP: Final = "Error Handling"
RETRY_TIMEOUT: Final = "errors.retry.timeout"
RETRY_DELAY_MAX_MS: Final = "errors.retry.delay.max.ms"
TOLERANCE: Final = "errors.tolerance"
LOG_ENABLE: Final = "errors.log.enable"
LOG_INCLUDE_MESSAGES: Final = "errors.log.include.messages"
DLQ_TOPIC: Final = "errors.deadletterqueue.topic.name"
DLQ_REPLICATION_FACTOR: Final = "errors.deadletterqueue.topic.replication.factor"
DLQ_CONTEXT_HEADERS: Final = "errors.deadletterqueue.context.headers.enable"

#: Connect's header names for a dead letter's context
HEADER_PREFIX: Final = "__connect.errors."
HEADER_TOPIC: Final = HEADER_PREFIX + "topic"
HEADER_PARTITION: Final = HEADER_PREFIX + "partition"
HEADER_OFFSET: Final = HEADER_PREFIX + "offset"
HEADER_CONNECTOR: Final = HEADER_PREFIX + "connector.name"
HEADER_TASK: Final = HEADER_PREFIX + "task.id"
HEADER_STAGE: Final = HEADER_PREFIX + "stage"
HEADER_CLASS: Final = HEADER_PREFIX + "class.name"
HEADER_EXCEPTION: Final = HEADER_PREFIX + "exception.class.name"
HEADER_MESSAGE: Final = HEADER_PREFIX + "exception.message"

#: Connect's names of the stages a record can fail in
STAGE_KEY_CONVERTER: Final = "KEY_CONVERTER"
STAGE_VALUE_CONVERTER: Final = "VALUE_CONVERTER"
STAGE_TRANSFORMATION: Final = "TRANSFORMATION"

#: failures logged per batch at most, so a batch where everything fails cannot flood the log
LOGGED_PER_BATCH: Final = 100
_FIRST_RETRY_DELAY_S: Final = 0.3


class RecordError(HerderError):
    """A record failed conversion or a transform (Connect's DataException)."""

    code = ErrorCode.INVALID_RECORD


def error_config_def() -> ConfigDef:
    """Connect's ``errors.*`` connector keys, with Connect's defaults."""
    return (
        ConfigDef()
        .define(RETRY_TIMEOUT, Type.LONG, default=0, validator=Range.at_least(-1),
                importance=Importance.MEDIUM, group=ERRORS_GROUP,
                documentation="How long (ms) a failed operation is retried; 0 means no "
                "retries, -1 retries forever.")
        .define(RETRY_DELAY_MAX_MS, Type.LONG, default=60_000, validator=Range.at_least(1),
                importance=Importance.MEDIUM, group=ERRORS_GROUP,
                documentation="The longest wait (ms) between two retries.")
        .define(TOLERANCE, Type.STRING, default="none", validator=ValidString.in_("none", "all"),
                importance=Importance.MEDIUM, group=ERRORS_GROUP,
                documentation="none: a failing record fails the task; all: it is skipped.")
        .define(LOG_ENABLE, Type.BOOLEAN, default=False, importance=Importance.MEDIUM,
                group=ERRORS_GROUP, documentation="Log each failing record's failure.")
        .define(LOG_INCLUDE_MESSAGES, Type.BOOLEAN, default=False, importance=Importance.MEDIUM,
                group=ERRORS_GROUP,
                documentation="Include the failing record's key and value in the log.")
        .define(DLQ_TOPIC, Type.STRING, default="", importance=Importance.MEDIUM,
                group=ERRORS_GROUP,
                documentation="The topic failing records go to (with errors.tolerance=all); "
                "empty for none.")
        .define(DLQ_REPLICATION_FACTOR, Type.SHORT, default=3, importance=Importance.LOW,
                group=ERRORS_GROUP,
                documentation="Accepted for Connect's sake; topic data is as durable as "
                "storage.root.")
        .define(DLQ_CONTEXT_HEADERS, Type.BOOLEAN, default=False, importance=Importance.MEDIUM,
                group=ERRORS_GROUP,
                documentation="Add the failure (__connect.errors.* headers) to dead letters.")
    )  # fmt: skip


@dataclass(frozen=True)
class ErrorHandling:
    """A connector's ``errors.*`` settings, parsed."""

    tolerate_all: bool = False
    log_failures: bool = False
    log_messages: bool = False
    dead_letter_topic: str | None = None
    context_headers: bool = False
    retry_timeout_ms: int = 0
    retry_delay_max_ms: int = 60_000

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any]) -> ErrorHandling:
        values = error_config_def().parse(settings)
        return cls(
            tolerate_all=values[TOLERANCE] == "all",
            log_failures=values[LOG_ENABLE],
            log_messages=values[LOG_INCLUDE_MESSAGES],
            dead_letter_topic=values[DLQ_TOPIC].strip() or None,
            context_headers=values[DLQ_CONTEXT_HEADERS],
            retry_timeout_ms=values[RETRY_TIMEOUT],
            retry_delay_max_ms=values[RETRY_DELAY_MAX_MS],
        )

    @property
    def dead_letters(self) -> bool:
        """Whether failing records are written somewhere rather than only skipped."""
        return self.tolerate_all and self.dead_letter_topic is not None

    async def retry(
        self,
        operation: Callable[[], Awaitable[T]],
        what: str,
        on_retry: Callable[[], None] | None = None,
    ) -> T:
        """``operation()``, retried on RetriableError for up to ``errors.retry.timeout``.

        The delay doubles from 300 ms up to ``errors.retry.delay.max.ms``; once the
        timeout is spent the last failure is raised.
        """
        timeout = self.retry_timeout_ms
        deadline = time.monotonic() + timeout / 1000
        delay = _FIRST_RETRY_DELAY_S
        attempt = 0
        while True:
            try:
                return await operation()
            except RetriableError as exc:
                attempt += 1
                if timeout == 0 or (timeout > 0 and time.monotonic() + delay > deadline):
                    if timeout != 0:
                        log.warning("%s failed %d times; giving up: %s", what, attempt, exc)
                    raise
                log.info("%s failed (attempt %d), retrying in %.1fs: %s", what, attempt, delay, exc)
                if on_retry is not None:
                    on_retry()
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.retry_delay_max_ms / 1000)


@dataclass(frozen=True)
class Failure:
    """One failing record, as collected for the log or for the task's failure."""

    stage: str
    executing_class: str
    exception_class: str
    message: str
    topic: str | None
    partition: int | None
    offset: int | None
    key: bytes | None = None
    value: bytes | None = None

    def where(self) -> str:
        parts = [f"topic={self.topic}"]
        if self.partition is not None:
            parts.append(f"partition={self.partition}")
        if self.offset is not None:
            parts.append(f"offset={self.offset}")
        return ", ".join(parts)

    def describe(self, task: str, *, with_messages: bool = False) -> str:
        """Connect's wording for a failure, as logged and as a failed task's cause."""
        text = (
            f"Error encountered in task {task}. Executing stage '{self.stage}' with class "
            f"'{self.executing_class}', where record is {{{self.where()}}}"
        )
        if with_messages:
            text += f", key={_show(self.key)}, value={_show(self.value)}"
        return f"{text}: {self.exception_class}: {self.message}"


def _show(data: bytes | None) -> str:
    if data is None:
        return "null"
    return data.decode("utf-8", errors="replace")


def report(task: str, handling: ErrorHandling, failures: list[Failure]) -> None:
    """Log collected failures (``errors.log.enable``); at most :data:`LOGGED_PER_BATCH`."""
    if not handling.log_failures:
        return
    for failure in failures[:LOGGED_PER_BATCH]:
        log.error("%s", failure.describe(task, with_messages=handling.log_messages))
    if len(failures) > LOGGED_PER_BATCH:
        log.error("task %s: more failing records in this batch were not logged", task)


def task_failure(task: str, failure: Failure) -> RecordError:
    """The error a task fails with under ``errors.tolerance=none``."""
    return RecordError(f"Tolerance exceeded in error handler: {failure.describe(task)}")
