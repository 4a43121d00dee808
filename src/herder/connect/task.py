"""The part every task shares, whichever way it moves data."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Final

__all__ = ["UNDEFINED_VERSION", "Task"]

#: What ``version()`` reports for connectors and tasks that do not say.
UNDEFINED_VERSION: Final = "undefined"


class Task(ABC):
    """A unit of work the runtime places on some worker: started once, stopped once.

    The runtime instantiates tasks with no arguments; do the work in :meth:`start`.
    """

    def version(self) -> str:
        """The task's version; by convention the same as its connector's."""
        return UNDEFINED_VERSION

    @abstractmethod
    def start(self, config: dict[str, str]) -> None:
        """Begin work with one of the configs ``Connector.task_configs`` returned."""

    @abstractmethod
    def stop(self) -> None:
        """Release what :meth:`start` acquired. The task will not be used again."""
