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
from tests.dataplane.conftest import worker_executions
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
    return worker_executions(tmp_path, ensemble)


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


class CollectingArrow(Collecting):
    """A Collecting task that takes small deliveries as Arrow tables (the trickle path)."""

    def accepts_arrow(self) -> bool:
        return True

    def put_arrow(self, table: Any) -> None:
        self.delivered += list(
            zip(table["partition"].to_pylist(), table["offset"].to_pylist(), strict=True)
        )


@pytest.mark.timeout(180)
async def test_a_big_file_behind_a_steady_trickle_is_delivered(
    tmp_path: Path, ensemble: ServerHandle
) -> None:
    """Small files keep arriving in partition 0; partition 1 holds a file bigger than
    the trickle path takes. Deliveries of small files take only what fits, so the big
    file waits, but each delivery starts at the next partition: it is first in one of
    the next, and goes through Spark, instead of waiting behind partition 0 for ever."""
    executions = worker_executions(tmp_path, ensemble, **{"dataplane.trickle.max.records": "10"})
    await executions.open()
    try:
        task = CollectingArrow()
        run = executions(ConnectorTaskId("c", 0), task, {"topics": "two"}, {"connector.class": "x"})
        assert isinstance(run, SinkExecution)
        topics = run.topics
        await topics.create("two", 2)
        writer = SegmentWriter(topics, run.runtime.spark, task="filler-0", epoch=1)

        async def commit(partition: int, count: int) -> None:
            records = [SourceRecord({}, {}, "two", f"{partition}", partition=partition)] * count
            await topics.commit(await writer.stage(records))

        await commit(1, 50)
        run.member = Member()  # type: ignore[assignment]
        run._generation = Generation(1, "m", "m", "range")
        run._accepts_arrow = True
        tps = [TopicPartition("two", p) for p in range(2)]
        run.positions = dict.fromkeys(tps, 0)
        for _ in range(4):
            await commit(0, 5)
            assert await run._deliver_batch(1000)
            if run.positions[tps[1]] == 50:
                break
        assert run.positions[tps[1]] == 50, f"partition 1 waited: {run.positions}"
        assert sorted(o for p, o in task.delivered if p == 1) == list(range(50))
    finally:
        await executions.close()
