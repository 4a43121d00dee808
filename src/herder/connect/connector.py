"""Connectors and tasks: the two classes a connector author writes.

A :class:`Connector` is the planner. The runtime starts one instance per connector
somewhere in the cluster; it looks at its config (and perhaps the external system) and
splits the work into task configs. A task is the worker: the runtime starts one per task
config, anywhere in the cluster, and it moves the data. Write a :class:`SourceConnector`
with a :class:`~herder.connect.SourceTask` to bring data in, or a :class:`SinkConnector`
with a :class:`~herder.connect.SinkTask` to send it out.

Both are instantiated by the runtime with no arguments, so keep ``__init__`` free of
required parameters and of work: do the work in ``start``, undo it in ``stop``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from enum import StrEnum
from typing import Final

from herder.config.definition import ConfigDef, ConfigValue
from herder.connect.sink import SinkTask
from herder.connect.source import SourceTask
from herder.connect.task import UNDEFINED_VERSION, Task

__all__ = [
    "Connector",
    "ConnectorContext",
    "ConnectorType",
    "SinkConnector",
    "SourceConnector",
]


class ConnectorContext(ABC):
    """The runtime, as a running connector sees it. Available as ``Connector.context``."""

    @abstractmethod
    def request_task_reconfiguration(self) -> None:
        """Ask the runtime to call :meth:`Connector.task_configs` again.

        Call it when the work should be split differently: a table was added, a
        directory appeared. The runtime rewrites the task configs only if they changed,
        which moves tasks between workers, so do not call it when nothing changed.
        """

    @abstractmethod
    def raise_error(self, error: BaseException) -> None:
        """Report that the connector has failed for good, from any thread.

        The connector is marked FAILED with this error's trace; a user restart is
        needed. Use it for failures noticed in a background thread, where raising
        would reach nobody.
        """


class Connector(ABC):
    """Plans the work of one connector and splits it into task configs.

    Lifecycle: the runtime calls :meth:`initialize`, then :meth:`start` with the
    connector config, then :meth:`task_configs` whenever it needs the work split (at
    start, and after :meth:`ConnectorContext.request_task_reconfiguration`), and finally
    :meth:`stop`. An instance is not started again after it stops, except through
    :meth:`reconfigure`.
    """

    context: ConnectorContext

    def initialize(self, context: ConnectorContext) -> None:
        """Receive the runtime's context before :meth:`start`; override only to extend."""
        self.context = context

    def version(self) -> str:
        """The connector's version, shown by ``GET /connector-plugins``."""
        return UNDEFINED_VERSION

    def config_def(self) -> ConfigDef:
        """The keys this connector understands, with types, defaults and documentation.

        Declare every key you read: the REST API validates configs against this before
        they are stored, and documents the connector from it. The default declares none.
        """
        return ConfigDef()

    def validate(self, config: Mapping[str, str]) -> dict[str, ConfigValue]:
        """Check a config before it is stored; every key gets its errors, none raise.

        The default checks each key against :meth:`config_def`. Override to add checks
        that span keys or need the external system (extend the default's result rather
        than replacing it), reporting problems in the ConfigValue's ``errors``.
        """
        return self.config_def().validate(config)

    @abstractmethod
    def start(self, config: dict[str, str]) -> None:
        """Begin with the (already validated) connector config.

        Raise :class:`herder.errors.ConfigError` for a config that cannot work; the
        connector is then marked FAILED with your message.
        """

    def reconfigure(self, config: dict[str, str]) -> None:
        """Switch to a new config. The default stops and starts again."""
        self.stop()
        self.start(config)

    @abstractmethod
    def task_class(self) -> type[Task]:
        """The task class the runtime instantiates for each task config."""

    @abstractmethod
    def task_configs(self, max_tasks: int) -> list[dict[str, str]]:
        """Split the work into at most ``max_tasks`` task configs (``tasks.max``).

        Each dict is one task's config, given to its :meth:`Task.start`. Return fewer
        when there is less to split (one file, one table), and the same configs for the
        same work: the runtime compares them with the stored ones to decide whether
        tasks must move.
        """

    @abstractmethod
    def stop(self) -> None:
        """Stop planning and release resources; tasks are stopped separately."""


class SourceConnector(Connector):
    """A connector whose tasks read from an external system into topics."""

    @abstractmethod
    def task_class(self) -> type[SourceTask]:
        """The :class:`~herder.connect.SourceTask` class of this connector."""


class SinkConnector(Connector):
    """A connector whose tasks write records from topics to an external system.

    The runtime subscribes its tasks to the topics named by ``topics`` (a comma-separated
    list) or matched by ``topics.regex``, and spreads their partitions over the tasks.
    """

    TOPICS_CONFIG: Final = "topics"
    TOPICS_REGEX_CONFIG: Final = "topics.regex"

    @abstractmethod
    def task_class(self) -> type[SinkTask]:
        """The :class:`~herder.connect.SinkTask` class of this connector."""


class ConnectorType(StrEnum):
    """Which way a connector moves data; the ``type`` of the REST API's plugin listing."""

    SOURCE = "source"
    SINK = "sink"
    UNKNOWN = "unknown"

    @classmethod
    def of(cls, connector: type[Connector] | Connector) -> ConnectorType:
        """The type of a connector class or instance."""
        klass = connector if isinstance(connector, type) else type(connector)
        if issubclass(klass, SourceConnector):
            return cls.SOURCE
        if issubclass(klass, SinkConnector):
            return cls.SINK
        return cls.UNKNOWN
