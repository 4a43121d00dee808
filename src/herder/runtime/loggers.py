"""Logger levels changed at run time: ``/admin/loggers`` (Connect's KIP-495 and KIP-976).

Levels are named as Connect names them (log4j's TRACE, DEBUG, INFO, WARN, ERROR, FATAL,
OFF) and mapped onto Python's logging. Setting a namespace sets that logger and every
logger below it, as Connect does, and remembers when each was last changed
(``last_modified``, null for a logger nobody changed since the worker started).
Levels live in this process only: a restarted worker starts from its logging config.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from herder.errors import ErrorCode, HerderError

__all__ = ["LEVELS", "ROOT", "Loggers", "UnknownLevel"]

ROOT = "root"
TRACE = 5
OFF = logging.CRITICAL + 10

#: Connect's level names -> Python levels
LEVELS: dict[str, int] = {
    "TRACE": TRACE,
    "DEBUG": logging.DEBUG,
    "INFO": logging.INFO,
    "WARN": logging.WARNING,
    "ERROR": logging.ERROR,
    "FATAL": logging.CRITICAL,
    "OFF": OFF,
}


class UnknownLevel(HerderError):
    """A level name Connect does not know."""

    code = ErrorCode.INVALID_CONFIG
    http_status = 404  # as Connect answers it
    advice = "use one of TRACE, DEBUG, INFO, WARN, ERROR, FATAL or OFF"


def level_name(level: int) -> str:
    """Connect's name for a Python level (the nearest one at or below it)."""
    best = "TRACE"
    for name, value in sorted(LEVELS.items(), key=lambda item: item[1]):
        if value <= level:
            best = name
    return best


def parse_level(name: str) -> int:
    level = LEVELS.get(name.strip().upper())
    if level is None:
        raise UnknownLevel(f"invalid log level '{name}'.")
    return level


class Loggers:
    """This process's loggers, their levels and when the REST API last changed them."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._modified: dict[str, int] = {}
        if logging.getLevelName(TRACE) == f"Level {TRACE}":
            logging.addLevelName(TRACE, "TRACE")

    @staticmethod
    def _logger(name: str) -> logging.Logger:
        return logging.getLogger() if name == ROOT else logging.getLogger(name)

    @staticmethod
    def _known() -> list[str]:
        manager = logging.Logger.manager
        return sorted(n for n, lg in manager.loggerDict.items() if isinstance(lg, logging.Logger))

    def all_levels(self) -> dict[str, dict[str, object]]:
        """The root logger and every logger with a level of its own (GET /admin/loggers)."""
        out = {ROOT: self._describe(ROOT)}
        for name in self._known():
            if logging.getLogger(name).level != logging.NOTSET:
                out[name] = self._describe(name)
        return out

    def level(self, name: str) -> dict[str, object] | None:
        """One logger's effective level, None if no such logger exists."""
        if name != ROOT and name not in self._known():
            return None
        return self._describe(name)

    def _describe(self, name: str) -> dict[str, object]:
        return {
            "level": level_name(self._logger(name).getEffectiveLevel()),
            "last_modified": self._modified.get(name),
        }

    def set_level(self, namespace: str, level_text: str) -> list[str]:
        """Set ``namespace`` and the loggers below it; returns their names, sorted."""
        level = parse_level(level_text)
        if namespace == ROOT:
            affected = [ROOT, *self._known()]
        else:
            below = [n for n in self._known() if n.startswith(namespace + ".")]
            affected = [namespace, *below]
        now = int(self._clock() * 1000)
        for name in affected:
            self._logger(name).setLevel(level)
            self._modified[name] = now
        logging.getLogger(__name__).info(
            "logger %s set to %s (%d loggers)", namespace, level_text.upper(), len(affected)
        )
        return sorted(affected)
