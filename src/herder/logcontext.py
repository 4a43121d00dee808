"""Which connector or task a log line is about, and the two log formats.

Kafka Connect puts ``[connector|task-N] `` (or ``[connector|worker] `` for the
connector itself) in front of every line logged while it runs that connector's or
task's code, through log4j's MDC (``connector.context``). Here the same context lives in
a :class:`~contextvars.ContextVar`: set around a task's execution, it follows the task's
coroutines, and the runtime copies it to the threads that run the task's calls and its
Spark jobs. :class:`ContextFilter` adds it to every record as ``record.context`` (with
the trailing space, or empty), and ``record.connector`` / ``record.task`` for the JSON
format.

``log.format=json`` (or ``herder --log-format json``) writes one JSON object a line:
``ts`` (ISO 8601, UTC), ``level``, ``logger``, ``message``, ``connector`` and ``task``
when known, ``thread``, and ``exception`` with the traceback when there is one.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import IO

__all__ = [
    "FORMATS",
    "ContextFilter",
    "JsonFormatter",
    "configure",
    "current",
    "scope",
    "set_format",
]

#: (connector, task or None for the connector itself, extra scope or None)
_CONTEXT: contextvars.ContextVar[tuple[str, int | None, str | None] | None] = (
    contextvars.ContextVar("herder_connector_context", default=None)
)

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(context)s%(message)s"
FORMATS = ("text", "json")


def current() -> tuple[str, int | None, str | None] | None:
    """The connector, task and scope of the code running now, if any."""
    return _CONTEXT.get()


@contextlib.contextmanager
def scope(connector: str, task: int | None = None, extra: str | None = None) -> Iterator[None]:
    """Log lines within name ``connector`` (and ``task``; the connector itself if None)."""
    token = _CONTEXT.set((connector, task, extra))
    try:
        yield
    finally:
        _CONTEXT.reset(token)


def enter(connector: str, task: int | None = None) -> None:
    """Set the context for the rest of the current coroutine (or thread) and what it starts."""
    _CONTEXT.set((connector, task, None))


def render(context: tuple[str, int | None, str | None] | None) -> str:
    """Connect's ``connector.context``: ``[name|task-0] ``, ``[name|worker] ``, or ''."""
    if context is None:
        return ""
    connector, task, extra = context
    who = "worker" if task is None else f"task-{task}"
    return f"[{connector}|{who}{'|' + extra if extra else ''}] "


class ContextFilter(logging.Filter):
    """Adds ``context``, ``connector`` and ``task`` to every record it passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        context = _CONTEXT.get()
        record.context = render(context)
        record.connector = context[0] if context else None
        record.task = context[1] if context else None
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object a line (see the module docstring)."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "thread": record.threadName,
        }
        connector = getattr(record, "connector", None)
        if connector is not None:
            entry["connector"] = connector
            task = getattr(record, "task", None)
            if task is not None:
                entry["task"] = task
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        elif record.stack_info:
            entry["exception"] = record.stack_info
        return json.dumps(entry, default=str)


def _formatter(fmt: str) -> logging.Formatter:
    if fmt == "json":
        return JsonFormatter()
    if fmt == "text":
        return logging.Formatter(TEXT_FORMAT)
    raise ValueError(f"log format {fmt!r} is not one of {', '.join(FORMATS)}")


def configure(level: str, fmt: str = "text", stream: IO[str] | None = None) -> None:
    """Log to ``stream`` (stderr) at ``level`` in format ``fmt`` (text or json)."""
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(_formatter(fmt))
    handler.addFilter(ContextFilter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())


def set_format(fmt: str) -> None:
    """Switch every handler of the root logger to ``fmt`` (a worker's ``log.format``)."""
    formatter = _formatter(fmt)
    for handler in logging.getLogger().handlers:
        handler.setFormatter(formatter)
        if not any(isinstance(f, ContextFilter) for f in handler.filters):
            handler.addFilter(ContextFilter())
