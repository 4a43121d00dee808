"""A sink task that says which columns its put reads (``SinkTask.columns_read``) is
given whole files as Spark's scan of those columns, each Spark partition a file and
its offset range; with transforms, which may read any column, it gets them all."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from herder.connect import SinkTask, SourceRecord, TopicPartition
from herder.dataplane import SegmentWriter, SparkRuntime
from herder.dataplane.execution import SinkExecution, TaskExecutions, columns_read_by
from herder.errors import ConfigError
from herder.runtime.core.member import Generation
from herder.runtime.core.protocol import ConnectorTaskId
from tests.dataplane.conftest import worker_executions
from tests.integration.conftest import ServerHandle

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.timeout(180)]


class ValuesOnly(SinkTask):
    """Keeps each put's columns, and each Spark partition's values with its range."""

    offset_ranged = True

    def __init__(
        self, columns: dict[str, str | None] | None = None, *, all_of_them: bool = False
    ) -> None:
        self.columns = None if all_of_them else columns or {"value": None}
        self.puts: list[tuple[list[str], list[tuple[Any, list[bytes]]]]] = []

    def start(self, config: dict[str, str]) -> None: ...

    def columns_read(self) -> dict[str, str | None] | None:
        return self.columns

    def put(self, df: Any) -> None:
        ranges = self.context.offset_ranges()
        assert ranges is not None
        parts = [[r["value"] for r in part] for part in df.rdd.glom().collect()]
        self.puts.append((df.columns, list(zip(ranges, parts, strict=True))))

    def stop(self) -> None: ...


class Member:
    """Accepts every offset commit: the group coordinator is not what is tested here."""

    async def commit_offsets(self, offsets: Mapping[Any, tuple[int, str]], generation: Any) -> None:
        """Accepted, whatever they are."""


@pytest.fixture
def executions(tmp_path: Path, ensemble: ServerHandle, spark: SparkRuntime) -> TaskExecutions:
    # the delivery goes through Spark, as a big one does
    return worker_executions(tmp_path, ensemble, **{"dataplane.trickle.max.records": "0"})


async def deliver(
    executions: TaskExecutions, task: ValuesOnly, topic: str, config: dict[str, str]
) -> None:
    """Stage two files of lines into ``topic`` and deliver them to ``task`` in one put."""
    run = executions(ConnectorTaskId(topic, 0), task, config, {"connector.class": "x"})
    assert isinstance(run, SinkExecution)
    await run.topics.create(topic, 1)
    writer = SegmentWriter(run.topics, run.runtime.spark, task="filler-0", epoch=1)
    for start, end in ((0, 300), (300, 900)):
        records = [SourceRecord({}, {}, topic, b"v%04d" % i) for i in range(start, end)]
        await run.topics.commit(await writer.stage(records))
    task.initialize(run.context)
    # as the execution asks a task it has started
    await run._ask_how_it_takes_batches(run.control)
    run.member = Member()  # type: ignore[assignment]
    run._generation = Generation(1, "m", "m", "range")
    run.positions = {TopicPartition(topic, 0): 0}
    try:
        assert await run._deliver_batch(10_000)
    finally:
        run.control.end()
    assert run.positions == {TopicPartition(topic, 0): 900}


async def test_a_task_of_values_gets_the_scan_of_its_files(executions: TaskExecutions) -> None:
    await executions.open()
    try:
        task = ValuesOnly()
        await deliver(executions, task, "columns-bare", {"topics": "columns-bare"})
        [(columns, parts)] = task.puts
        assert columns == ["value"]
        # the bigger file first, as Spark reads them, each with its range
        assert [(r.from_offset, r.until_offset) for r, _ in parts] == [(300, 900), (0, 300)]
        for offsets, values in parts:
            assert values == [
                b"v%04d" % i for i in range(offsets.from_offset, offsets.until_offset)
            ]

        routed = ValuesOnly()
        router = "org.apache.kafka.connect.transforms.RegexRouter"
        transformed = {
            "topics": "columns-routed",
            "transforms": "route",
            "transforms.route.type": router,
            "transforms.route.regex": "(.*)",
            "transforms.route.replacement": "$1-routed",
        }
        await deliver(executions, routed, "columns-routed", transformed)
        [(columns, _)] = routed.puts
        assert columns == ["topic", "partition", "offset", "timestamp", "key", "value", "headers"]
    finally:
        await executions.close()


def test_a_column_a_sink_record_lacks_is_a_config_error() -> None:
    assert columns_read_by(ValuesOnly(all_of_them=True), "c-0") is None
    said = {"value": "string", "offset": None, "key": None}
    assert list(columns_read_by(ValuesOnly(said), "c-0") or {}) == ["offset", "key", "value"]
    with pytest.raises(ConfigError, match=r"c-0 says its put reads column 'body'"):
        columns_read_by(ValuesOnly({"value": None, "body": None}), "c-0")
    for column, how in (("offset", "string"), ("value", "int")):
        with pytest.raises(ConfigError, match=f"reads column {column!r} as {how!r}"):
            columns_read_by(ValuesOnly({column: how}), "c-0")
