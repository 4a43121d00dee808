"""A sink task of a partitioned topic follows only the partitions assigned to it.

With ``tasks.max`` sink tasks sharing a topic of many partitions, each task gets a few of
them from its group. If every task refreshed the segment log of every partition before
each delivery, the metadata reads would grow with tasks times partitions and each task would
keep state for partitions it never reads; here a task assigned two partitions of eight
reads exactly those two, and the records it delivers are theirs.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from herder.connect import SinkTask, SourceRecord, TopicPartition
from herder.dataplane import SegmentWriter, SparkRuntime
from herder.dataplane.execution import SinkExecution, TaskExecutions
from herder.runtime.core.member import Generation
from herder.runtime.core.protocol import ConnectorTaskId
from herder.runtime.worker_config import WorkerConfig
from tests.dataplane.conftest import TEST_SPARK_CONF
from tests.integration.conftest import ServerHandle

pytestmark = [pytest.mark.spark, pytest.mark.integration]

TOPIC = "eight"
PARTITIONS = 8
PER_PARTITION = 5
ASSIGNED = (TopicPartition(TOPIC, 1), TopicPartition(TOPIC, 6))


class Collecting(SinkTask):
    """Keeps the (partition, offset) of every record it is given."""

    def __init__(self) -> None:
        self.delivered: list[tuple[int, int]] = []

    def start(self, config: dict[str, str]) -> None: ...

    def put(self, df: Any) -> None:
        self.delivered += [(r["partition"], r["offset"]) for r in df.collect()]

    def stop(self) -> None: ...


class Member:
    """Accepts every offset commit: the group coordinator is not what is tested here."""

    async def commit_offsets(self, offsets: Mapping[Any, tuple[int, str]], generation: Any) -> None:
        """Accepted, whatever they are."""


@pytest.fixture
def executions(tmp_path: Path, ensemble: ServerHandle, spark: SparkRuntime) -> TaskExecutions:
    """A worker's executions on the shared ensemble and Spark (the test closes them on
    its own event loop)."""
    return TaskExecutions(
        WorkerConfig.from_properties(
            {
                "group.id": "g",
                "bootstrap.servers": ensemble.bootstrap,
                "storage.root": str(tmp_path / "data"),
                "dataplane.spark.warmup": "false",
                **TEST_SPARK_CONF,
            }
        )
    )


async def fill(run: SinkExecution) -> None:
    """Commit PER_PARTITION records to every partition of TOPIC."""
    topics = run.topics
    await topics.create(TOPIC, PARTITIONS)
    writer = SegmentWriter(topics, run.runtime.spark, task="filler-0", epoch=1)
    records = [
        SourceRecord({}, {}, TOPIC, f"{p}:{i}", partition=p)
        for p in range(PARTITIONS)
        for i in range(PER_PARTITION)
    ]
    await topics.commit(await writer.stage(records))


@pytest.mark.timeout(180)
async def test_a_sink_task_reads_only_the_metadata_of_its_partitions(
    executions: TaskExecutions,
) -> None:
    await executions.open()
    try:
        await deliver_two_of_eight(executions)
    finally:
        await executions.close()


async def deliver_two_of_eight(executions: TaskExecutions) -> None:
    task = Collecting()
    run = executions(ConnectorTaskId("c", 0), task, {"topics": TOPIC}, {"connector.class": "x"})
    assert isinstance(run, SinkExecution)
    await fill(run)
    # a fresh view, as a task that has just joined its group has
    run.topics._states.clear()
    run.member = Member()  # type: ignore[assignment]
    run._generation = Generation(1, "m", "m", "range")
    run.positions = dict.fromkeys(ASSIGNED, 0)

    assert await run._deliver_batch(1000)

    assert sorted(task.delivered) == [
        (tp.partition, offset) for tp in ASSIGNED for offset in range(PER_PARTITION)
    ]
    followed = {partition for name, _, partition in run.topics._states if name == TOPIC}
    assert followed == {tp.partition for tp in ASSIGNED}
    assert run.positions == dict.fromkeys(ASSIGNED, PER_PARTITION)
