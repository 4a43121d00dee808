"""What the change data capture tests share: a CDC task run by hand (offsets committed
as the runtime commits them, then the task told), and the events a batch holds."""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

from herder.connect import SourceBatch
from herder.connectors.cdc import PostgresCdcSourceTask
from tests.connectors.jdbc import Offsets, SourceContext
from tests.fixtures.postgres import SUPERUSER, SUPERUSER_PASSWORD, PostgresServer


def dbname(url: str) -> str:
    return url.rsplit("/", 1)[1]


def cdc_config(server: PostgresServer, url: str, **extra: str) -> dict[str, str]:
    return {
        "database.hostname": "127.0.0.1",
        "database.port": str(server.port),
        "database.user": SUPERUSER,
        "database.password": SUPERUSER_PASSWORD,
        "database.dbname": dbname(url),
        "topic.prefix": "pg",
        "slot.name": "herder_" + dbname(url)[:40],
        "poll.interval.ms": "50",
        **{k.replace("_", "."): v for k, v in extra.items()},
    }


def cdc_task(config: dict[str, str], offsets: Offsets) -> PostgresCdcSourceTask:
    task = PostgresCdcSourceTask()
    task.initialize(SourceContext(offsets))
    task.start(config)
    return task


Event = tuple[str, dict[str, Any] | None, dict[str, Any] | None]


def with_topic(batch: SourceBatch) -> Any:
    """The batch's DataFrame with a ``topic`` column (a batch of one topic names it
    instead)."""
    from pyspark.sql import functions as F

    if batch.topic is None:
        return batch.data
    return batch.data.withColumn("topic", F.lit(batch.topic))


def events_of(batch: SourceBatch) -> list[Event]:
    """(topic, key, value) of each record of a batch, in order: typed values as they
    are, values of bytes decoded from their envelopes (heartbeats)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import BinaryType, StringType

    from herder.dataplane.schemas import distinct_schemas, merged_struct, with_decoded

    df = with_topic(batch).withColumn("_n", F.monotonically_increasing_id())
    found: list[tuple[int, Event]] = []
    for (topic,) in df.select("topic").distinct().collect():
        part = df.where(F.col("topic") == topic)
        decoded: dict[str, tuple[str, dict]] = {}
        for column in ("key", "value"):
            if not isinstance(part.schema[column].dataType, (BinaryType, StringType)):
                part = part.withColumn(f"_{column}", F.col(column))
                continue
            schemas = distinct_schemas(part, column)
            if schemas:
                decoded[f"_{column}"] = (column, merged_struct(schemas))
        typed = with_decoded(part, decoded)
        for row in typed.collect():
            data = row.asDict(recursive=True)
            found.append((data["_n"], (topic, data.get("_key"), data.get("_value"))))
    events = [event for _, event in sorted(found, key=lambda e: e[0])]
    if batch.pieces is not None:
        # the pieces the executors write when nothing transforms the batch: the same
        # keys and rows, the rest of each envelope the batch's constants
        assert batch.constants is not None
        assert piece_events(batch) == [
            (t, k, {**(v or {}), **batch.constants}) for t, k, v in events
        ]  # fmt: skip
    return events


def piece_events(batch: SourceBatch) -> list[Event]:
    """The events of a batch's Arrow pieces (read here), their values whole: timestamps
    as the session's (UTC) wall clock, as Spark gives them."""
    assert batch.pieces is not None and batch.topic is not None and batch.constants
    events: list[Event] = []
    for index in range(batch.pieces.count):
        for part in batch.pieces.read(index):
            for key, value in zip(
                part.column(0).to_pylist(), part.column(1).to_pylist(), strict=True
            ):
                after = {
                    k: v.replace(tzinfo=None) if isinstance(v, dt.datetime) else v
                    for k, v in value["after"].items()
                }
                events.append((batch.topic, key, {**batch.constants, **value, "after": after}))
    return events


def poll_events(
    task: PostgresCdcSourceTask, offsets: Offsets, *, confirm: bool = True
) -> list[Event]:
    """The events of the task's next batch, committed to ``offsets`` (and, with
    ``confirm``, the task told so, as the runtime tells it); [] if none."""
    batch = task.poll()
    if batch is None:
        return []
    events = events_of(batch)
    offsets.commit(batch)
    if confirm:
        task.commit()
    return events


def next_events(
    task: PostgresCdcSourceTask, offsets: Offsets, *, confirm: bool = True, timeout: float = 60
) -> list[Event]:
    """The events of the task's next batch that has some."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = poll_events(task, offsets, confirm=confirm)
        if found:
            return found
    raise AssertionError(f"no batch in {timeout} s")


def poll_until(
    task: PostgresCdcSourceTask, offsets: Offsets, count: int, timeout: float = 60
) -> list[Event]:
    """Events of the task's batches until ``count`` change events came (the slot decodes
    what the server has flushed, which asynchronous commits leave a moment behind)."""
    found: list[Event] = []
    deadline = time.monotonic() + timeout
    while len(changes(found)) < count:
        assert time.monotonic() < deadline, f"{len(changes(found))} of {count} changes came"
        found += poll_events(task, offsets)
    return found


def changes(events: list[Event]) -> list[tuple[str, Any, Any]]:
    """(op, before, after) of each change event (tombstones and heartbeats left out)."""
    return [(v["op"], v["before"], v["after"]) for _, _, v in events if v is not None and "op" in v]
