"""The execution factory protocol: a factory that only makes executions still serves."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from herder.connect import Task
from herder.runtime.core.protocol import ConnectorTaskId
from herder.runtime.worker import ExecutionFactory, TaskControl, TaskExecution

pytestmark = pytest.mark.unit


class _Idle:
    async def execute(self, control: TaskControl) -> None:
        control.started()


class OnlyExecutions(ExecutionFactory):
    def __call__(
        self,
        task_id: ConnectorTaskId,
        task: Task,
        config: dict[str, str],
        connector_config: dict[str, str],
    ) -> TaskExecution:
        return _Idle()


def test_a_factory_gets_do_nothing_versions_of_what_it_does_not_need() -> None:
    factory = OnlyExecutions()
    unused: Any = object()

    factory.share(unused, unused, unused, unused)
    asyncio.run(factory.open())
    assert factory.validate_config({"transforms": "a", "transforms.a.type": "NoSuch"}) == []
    asyncio.run(factory.close())
