"""A sink task's offset commit that fails for now is tried again; one refused ends the
delivery until the next assignment. Neither fails the task. And ``put`` runs its Spark
jobs in the task's scheduler pool.

During an ensemble election no server can name the group coordinator for a moment; a
commit made then fails with COORDINATOR_NOT_AVAILABLE. Connect's sink tasks log such a
failure and commit again later; they fail only on what cannot succeed. The execution's
group member is replaced here by one whose commits fail as told, since making the real
coordinator unreachable at the exact moment of a commit is a matter of luck (the
replicated pipeline test kills the ensemble leader under a running sink for that).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from herder.connect import SinkTask, TopicPartition
from herder.connectors.directory import DirectorySinkTask
from herder.dataplane.execution import DEFAULT_SINK_MAX_RECORDS, SinkExecution, TaskExecutions
from herder.dataplane.spark import POOL_PROPERTY
from herder.errors import CoordinatorNotAvailable, HerderError, IllegalGeneration
from herder.runtime.core.member import Generation
from herder.runtime.core.protocol import ConnectorTaskId
from herder.runtime.worker_config import WorkerConfig

pytestmark = pytest.mark.spark  # building an execution starts the process's Spark runtime

TP = TopicPartition("t", 0)


class Sink(SinkTask):
    def __init__(self) -> None:
        self.pools: list[str | None] = []

    def start(self, config: dict[str, str]) -> None: ...

    def put(self, df: Any) -> None:
        context = df.sparkSession.sparkContext
        self.pools.append(context.getLocalProperty(POOL_PROPERTY))
        df.count()  # a job, submitted from put's thread

    def stop(self) -> None: ...


class Member:
    """Commits fail with each of ``failures`` in turn, then succeed."""

    def __init__(self, *failures: HerderError) -> None:
        self.failures = list(failures)
        self.committed: list[dict[Any, tuple[int, str]]] = []

    async def commit_offsets(self, offsets: Mapping[Any, tuple[int, str]], generation: Any) -> None:
        if self.failures:
            raise self.failures.pop(0)
        self.committed.append(dict(offsets))


@pytest.fixture
def executions(tmp_path: Path) -> Iterator[TaskExecutions]:
    executions = TaskExecutions(
        WorkerConfig.from_properties(
            {"group.id": "g", "bootstrap.servers": "127.0.0.1:9", "storage.root": str(tmp_path)}
        )
    )
    yield executions
    asyncio.run(executions.close())


def execution(executions: TaskExecutions, member: Member) -> SinkExecution:
    run = executions(ConnectorTaskId("c", 0), Sink(), {"topics": "t"}, {"connector.class": "x"})
    assert isinstance(run, SinkExecution)
    run.member = member  # type: ignore[assignment]
    run._generation = Generation(3, "m", "m", "range")
    run.positions = {TP: 10}
    return run


async def test_a_commit_that_fails_for_now_is_tried_again(executions: TaskExecutions) -> None:
    member = Member(CoordinatorNotAvailable("the ensemble has no leader right now"))
    run = execution(executions, member)
    assert await run._commit_positions() is False  # no exception: the task goes on
    assert run._uncommitted and run._generation is not None
    run.positions = {TP: 12}  # delivered meanwhile
    assert await run._commit_positions() is True
    assert not run._uncommitted
    assert [{(g.topic, g.partition): v[0] for g, v in c.items()} for c in member.committed] == [
        {("t", 0): 12}
    ]


async def test_a_commit_refused_for_an_old_generation_waits_for_the_next(
    executions: TaskExecutions,
) -> None:
    run = execution(executions, Member(IllegalGeneration("generation 3 is over")))
    assert await run._commit_positions() is False
    assert run._generation is None and not run._uncommitted


async def test_put_runs_its_jobs_in_the_tasks_scheduler_pool(executions: TaskExecutions) -> None:
    run = execution(executions, Member())
    assert isinstance(run.task, Sink)
    df = run.runtime.spark.session.range(3)
    await run._put(df)
    await run._put(df)  # put's threads are reused: the pool is set each time
    assert run.task.pools == ["c-0", "c-0"]


def test_a_delivery_holds_what_the_connector_or_else_the_task_says(
    executions: TaskExecutions,
) -> None:
    """A task that collects its DataFrame gets the runtime's budget; DirectorySink, whose
    puts run on Spark's executors, takes more a delivery; a connector's
    ``consumer.max.records`` overrides both."""
    task = ConnectorTaskId("c", 0)
    collecting = executions(task, Sink(), {"topics": "t"}, {"connector.class": "x"})
    assert isinstance(collecting, SinkExecution)
    assert collecting.max_records() == DEFAULT_SINK_MAX_RECORDS
    settings = {"topics": "t", "directory": "/d", "format": "text"}
    spark_side = executions(task, DirectorySinkTask(), settings, {"connector.class": "x"})
    assert isinstance(spark_side, SinkExecution)
    assert spark_side.max_records() == 10 * DEFAULT_SINK_MAX_RECORDS
    told = executions(
        task, DirectorySinkTask(), settings, {"connector.class": "x", "consumer.max.records": "7"}
    )
    assert isinstance(told, SinkExecution) and told.max_records() == 7
