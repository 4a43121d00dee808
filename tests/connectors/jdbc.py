"""What the JDBC connector tests share: tasks run by hand (a context that remembers
offsets), and the rows a batch holds, from its typed records."""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from herder.connect import (
    OffsetReader,
    SinkTaskContext,
    SourceBatch,
    SourceOffset,
    SourcePartition,
    SourceTaskContext,
    TopicPartition,
)
from herder.connectors.jdbc import JdbcSinkTask, JdbcSourceTask
from tests.fixtures.postgres import SUPERUSER, SUPERUSER_PASSWORD, PostgresServer


def credentials(url: str) -> dict[str, str]:
    return {
        "connection.url": url,
        "connection.user": SUPERUSER,
        "connection.password": SUPERUSER_PASSWORD,
    }


class Offsets(OffsetReader):
    """Committed source offsets, as the runtime keeps them."""

    def __init__(self) -> None:
        self.committed: dict[str, SourceOffset] = {}

    def offsets(self, partitions: Sequence[SourcePartition]) -> list[SourceOffset | None]:
        return [self.committed.get(repr(sorted(p.items()))) for p in partitions]

    def commit(self, batch: SourceBatch) -> None:
        for partition, offset in batch.offsets:
            self.committed[repr(sorted(partition.items()))] = offset


class SourceContext(SourceTaskContext):
    def __init__(self, offsets: Offsets) -> None:
        self._offsets = offsets

    @property
    def configs(self) -> Mapping[str, str]:
        return {}

    @property
    def offset_reader(self) -> OffsetReader:
        return self._offsets


def source_task(config: dict[str, str], offsets: Offsets | None = None) -> JdbcSourceTask:
    task = JdbcSourceTask()
    task.initialize(SourceContext(offsets or Offsets()))
    task.start(config)
    return task


def rows_of(batch: SourceBatch) -> list[dict[str, Any]]:
    """The rows a batch's typed records hold: its values are structs of the rows'
    columns, with their types."""
    from pyspark.sql import types as T

    assert isinstance(batch.data.schema["value"].dataType, T.StructType)
    rows = [row.asDict(recursive=True) for row in batch.data.select("value.*").collect()]
    if batch.pieces is not None:
        # the same rows as the pieces the executors write when nothing transforms them
        assert piece_rows(batch) == rows
    return rows


def piece_rows(batch: SourceBatch) -> list[dict[str, Any]]:
    """The rows of a batch's Arrow pieces (read here), as Spark gives them: timestamps
    as the session's (UTC) wall clock."""
    assert batch.pieces is not None
    rows = []
    for index in range(batch.pieces.count):
        for part in batch.pieces.read(index):
            rows += part.column(part.schema.get_field_index("value")).to_pylist()
    return [
        {k: v.replace(tzinfo=None) if isinstance(v, dt.datetime) else v for k, v in row.items()}
        for row in rows
    ]


def poll_rows(task: JdbcSourceTask, offsets: Offsets | None = None) -> list[dict[str, Any]]:
    """The rows of the task's next batch (committed to ``offsets``); [] if none."""
    batch = task.poll()
    if batch is None:
        return []
    if offsets is not None:
        offsets.commit(batch)
    return rows_of(batch)


class SinkContext(SinkTaskContext):
    def __init__(self) -> None:
        self.rewinds: dict[TopicPartition, int] = {}

    @property
    def configs(self) -> Mapping[str, str]:
        return {}

    def assignment(self) -> frozenset[TopicPartition]:
        return frozenset()

    def offset(self, partition: TopicPartition, offset: int) -> None:
        self.rewinds[partition] = offset

    def committed(self, partition: TopicPartition) -> tuple[int, str] | None:
        return None

    def pause(self, *partitions: TopicPartition) -> None:
        return None

    def resume(self, *partitions: TopicPartition) -> None:
        return None

    def paused(self) -> frozenset[TopicPartition]:
        return frozenset()

    def request_commit(self) -> None:
        return None


def sink_task(
    config: dict[str, str], partitions: Collection[TopicPartition]
) -> tuple[JdbcSinkTask, SinkContext]:
    task = JdbcSinkTask()
    context = SinkContext()
    task.initialize(context)
    task.start({"connector.name": "sink", **config})
    task.open(partitions)
    return task, context


def table_rows(postgres: PostgresServer, database: str, sql: str) -> list[tuple[Any, ...]]:
    return postgres.execute(sql, database)
