"""A source connector that moves no data, for measuring what the runtime itself costs.

``bench/workers.py`` creates many of these: each task's ``poll`` waits ``poll.ms``
(default 200) and returns nothing, so no batch is ever staged and no Spark job runs.
What is left is the runtime's own work per task: its thread, its ensemble connection,
its fencing epoch, its status. Workers import it by its dotted name,
``bench.idle_connector.IdleSourceConnector``, which works when they run from the
repository root.
"""

from __future__ import annotations

import threading

from herder.config import ConfigDef, Importance, Range, Type
from herder.connect import SourceConnector, SourceRecord, SourceTask

POLL_MS = "poll.ms"
DEFAULT_POLL_MS = 200


class IdleSourceConnector(SourceConnector):
    """Splits nothing into exactly ``tasks.max`` idle tasks."""

    def config_def(self) -> ConfigDef:
        return ConfigDef().define(
            POLL_MS,
            Type.INT,
            default=DEFAULT_POLL_MS,
            validator=Range.at_least(0),
            importance=Importance.LOW,
            documentation="How long each poll waits before returning no records.",
        )

    def start(self, config: dict[str, str]) -> None:
        self.config = config

    def task_class(self) -> type[SourceTask]:
        return IdleSourceTask

    def task_configs(self, max_tasks: int) -> list[dict[str, str]]:
        poll_ms = self.config.get(POLL_MS, str(DEFAULT_POLL_MS))
        return [{POLL_MS: poll_ms, "task.index": str(i)} for i in range(max_tasks)]

    def stop(self) -> None:
        pass

    def version(self) -> str:
        return "1.0-bench"


class IdleSourceTask(SourceTask):
    """Each poll waits ``poll.ms`` (cut short by :meth:`stop`) and returns None."""

    def start(self, config: dict[str, str]) -> None:
        self.poll_s = int(config.get(POLL_MS, DEFAULT_POLL_MS)) / 1000
        self.stopping = threading.Event()

    def poll(self) -> list[SourceRecord] | None:
        self.stopping.wait(self.poll_s)
        return None

    def stop(self) -> None:
        self.stopping.set()

    def version(self) -> str:
        return "1.0-bench"
