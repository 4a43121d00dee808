"""PostgresCdcSource's snapshots against a real PostgreSQL: a table read in primary-key
chunks on the executors, merged with the stream by low/high watermarks (a row changed
meanwhile comes once, as its change, never overtaken by an older read), resumed after a
crash from the last committed chunk."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from herder.connect import SourceBatch
from herder.connectors.jdbc.postgres import DatabaseError
from herder.dataplane import SparkRuntime
from tests.connectors.cdc import Event, cdc_config, cdc_task, dbname, events_of
from tests.connectors.jdbc import Offsets
from tests.fixtures.postgres import PostgresServer

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.timeout(400)]

ROWS = 2500


@pytest.fixture(params=["counted", "analysed"])
def stock(
    request: pytest.FixtureRequest, logical_postgres: PostgresServer, logical_database: str
) -> str:
    """The table, as created (no statistics: its chunks are counted keys) or analysed
    (dense keys: its chunks are key ranges, see ``plan_chunk``)."""
    logical_postgres.execute(
        "CREATE TABLE stock (id integer PRIMARY KEY, item text, qty integer, seen timestamptz);"
        "INSERT INTO stock SELECT i, 'item ' || i, i, TIMESTAMPTZ '2024-05-01 00:00:00+02'"
        f" + i * INTERVAL '1 second' FROM generate_series(1, {ROWS}) i",
        dbname(logical_database),
    )
    if request.param == "analysed":
        logical_postgres.execute("ANALYZE stock", dbname(logical_database))
    return logical_database


def config(server: PostgresServer, url: str, **extra: str) -> dict[str, str]:
    return cdc_config(server, url, snapshot_chunk_rows="1000", snapshot_split_rows="400", **extra)


def replay(events: list[Event], rows: dict[int, dict[str, Any]]) -> None:
    """Apply change events to ``rows`` (by id) as a sink applies them."""
    for _, key, value in events:
        if value is None or key is None or "op" not in value:
            continue
        if value["op"] == "d":
            rows.pop(key["id"], None)
        else:
            rows[key["id"]] = value["after"]


def table(server: PostgresServer, url: str) -> dict[int, dict[str, Any]]:
    found = server.execute("SELECT id, item, qty, seen FROM stock", dbname(url))
    return {
        # Spark gives timestamps back as the session's (UTC) wall clock
        int(i): {"id": i, "item": item, "qty": qty, "seen": utc(seen)}  # type: ignore[call-overload]
        for i, item, qty, seen in found
    }


def utc(moment: Any) -> dt.datetime:
    return moment.astimezone(dt.UTC).replace(tzinfo=None)


def poll_batch(task: Any, offsets: Offsets) -> list[Event]:
    return poll_one(task, offsets)[1]


def poll_one(
    task: Any, offsets: Offsets, *, commit: bool = True
) -> tuple[SourceBatch, list[Event]]:
    """The task's next batch and its events, read (as the runtime writes them) before
    the batch commits."""
    batch = task.poll()
    assert batch is not None
    events = events_of(batch)
    if commit:
        offsets.commit(batch)
        task.commit()
    return batch, events


def poll_chunk(task: Any, offsets: Offsets, *, commit: bool = True) -> list[Event]:
    """The events of the next snapshot chunk: the changes up to its high watermark, in
    batches of their own if there are any, then its rows, in a batch of the table's one
    topic (written in order, with no shuffle)."""
    events: list[Event] = []
    while True:
        batch, found = poll_one(task, offsets, commit=commit)
        assert batch.topic is not None  # the table's one topic, no topic column
        events += found
        if any(v is not None and v["op"] == "r" for _, _, v in found):
            assert {v["op"] for _, _, v in found if v} == {"r"}
            return events


def test_chunks_merge_with_changes_made_during_the_snapshot(
    spark: SparkRuntime, logical_postgres: PostgresServer, stock: str
) -> None:
    db = dbname(stock)
    offsets = Offsets()
    task = cdc_task(config(logical_postgres, stock), offsets)
    rows: dict[int, dict[str, Any]] = {}
    try:
        first = poll_chunk(task, offsets)
        assert {v["op"] for _, _, v in first if v} == {"r"}
        assert sorted(key["id"] for _, key, _ in first if key) == list(range(1, 1001))
        replay(first, rows)
        # changes to rows of chunks read and not yet read, made before the next chunk,
        # committed as PostgreSQL does by default: durable in the WAL before they are
        # visible (this server commits asynchronously otherwise; see docs/cdc.md)
        logical_postgres.execute(
            "SET synchronous_commit = on;"
            "UPDATE stock SET qty = -1 WHERE id IN (5, 1500);"
            "DELETE FROM stock WHERE id IN (6, 1600);"
            "INSERT INTO stock VALUES (9000, 'late', 1, now());"
            "UPDATE stock SET id = 9001 WHERE id = 1700",
            db,
        )
        second = poll_chunk(task, offsets)
        by_key: dict[int, list[str]] = {}
        for _, key, value in second:
            if key is not None and value is not None:
                by_key.setdefault(key["id"], []).append(value["op"])
        # a row the stream changed inside the chunk's window is not read again
        assert by_key[1500] == ["u"] and by_key[1600] == ["d"]
        assert by_key[1700] == ["d"] and by_key[9001] == ["c"] and by_key[6] == ["d"]
        assert by_key[1501] == ["r"] and by_key[5] == ["u"]
        replay(second, rows)
        third = poll_chunk(task, offsets)
        replay(third, rows)
        assert rows == table(logical_postgres, stock)
        (offset,) = offsets.committed.values()
        assert "snapshot_tables" not in offset or not offset["snapshot_tables"]
    finally:
        task.stop()


def test_a_crash_mid_snapshot_resumes_after_the_last_committed_chunk(
    spark: SparkRuntime, logical_postgres: PostgresServer, stock: str
) -> None:
    offsets = Offsets()
    task = cdc_task(config(logical_postgres, stock), offsets)
    try:
        first = poll_chunk(task, offsets)
        lost = poll_chunk(task, offsets, commit=False)  # written, never committed
    finally:
        task.stop()
    assert [k["id"] for _, k, _ in lost][:1] == [1001]
    again = cdc_task(config(logical_postgres, stock), offsets)
    try:
        rest = poll_chunk(again, offsets) + poll_chunk(again, offsets)
    finally:
        again.stop()
    ids = [k["id"] for _, k, v in first + rest if v is not None and v["op"] == "r"]
    assert sorted(ids) == list(range(1, ROWS + 1))  # each row once, none lost


def test_a_snapshot_ends_at_the_highest_key_its_table_had_when_it_began(
    spark: SparkRuntime, logical_postgres: PostgresServer, stock: str
) -> None:
    """Rows inserted above that key while the snapshot runs come by the stream, so a
    table that grows faster than its chunks are read is snapshotted all the same."""
    db = dbname(stock)
    offsets = Offsets()
    task = cdc_task(config(logical_postgres, stock), offsets)
    rows: dict[int, dict[str, Any]] = {}
    try:
        polled = poll_chunk(task, offsets)
        replay(polled, rows)
        # more rows than several chunks hold, all above the table's highest key
        logical_postgres.execute(
            "INSERT INTO stock SELECT i, 'new ' || i, i, now()"
            f" FROM generate_series({ROWS + 1}, {ROWS + 5000}) i",
            db,
        )
        for _ in range(2):  # the two chunks left of the 2,500 rows, and the inserts
            more = poll_chunk(task, offsets)
            replay(more, rows)
            polled += more
        (offset,) = offsets.committed.values()
        assert not offset.get("snapshot_tables"), "the snapshot is over after its 2,500 rows"
        read = [k["id"] for _, k, v in polled if k is not None and v is not None and v["op"] == "r"]
        assert sorted(read) == list(range(1, ROWS + 1))
        while len(rows) < ROWS + 5000:  # the inserts, as created
            more = poll_batch(task, offsets)
            assert more, "the stream brings every inserted row"
            replay(more, rows)
        assert rows == table(logical_postgres, stock)
    finally:
        task.stop()


def test_a_chunk_by_key_range_starts_at_the_next_key_past_a_gap(
    spark: SparkRuntime, logical_postgres: PostgresServer, logical_database: str
) -> None:
    """Keys 1-1,000 and 2,101-2,600 (1.73 keys a row: dense), in chunks of 400 rows:
    693 keys each. The third would be keys 1,387-2,079, which hold no row; it starts at
    the next key instead, 2,101, and is the rest of the table. Every row is read once."""
    db = dbname(logical_database)
    logical_postgres.execute(
        "CREATE TABLE stock (id integer PRIMARY KEY, item text, qty integer, seen timestamptz);"
        "INSERT INTO stock SELECT i, 'item ' || i, i, now() FROM generate_series(1, 1000) i;"
        "INSERT INTO stock SELECT i, 'item ' || i, i, now() FROM generate_series(2101, 2600) i;"
        "ANALYZE stock",
        db,
    )
    offsets = Offsets()
    task = cdc_task(
        cdc_config(logical_postgres, logical_database, snapshot_chunk_rows="400"), offsets
    )
    chunks = []
    try:
        while True:
            events = poll_batch(task, offsets)
            chunks.append(sorted(k["id"] for _, k, v in events if k and v and v["op"] == "r"))
            (offset,) = offsets.committed.values()
            if not offset.get("snapshot_tables"):
                break
    finally:
        task.stop()
    assert [(c[0], c[-1]) if c else None for c in chunks] == [
        (1, 693), (694, 1000), (2101, 2600)
    ]  # fmt: skip
    assert sorted(i for c in chunks for i in c) == [*range(1, 1001), *range(2101, 2601)]


def test_a_table_without_a_primary_key_cannot_be_snapshotted(
    spark: SparkRuntime, logical_postgres: PostgresServer, logical_database: str
) -> None:
    logical_postgres.execute("CREATE TABLE loose (a integer)", dbname(logical_database))
    task = cdc_task(config(logical_postgres, logical_database), Offsets())
    try:
        with pytest.raises(DatabaseError, match=r"table loose has no primary key.*no_data"):
            task.poll()
    finally:
        task.stop()


def test_snapshot_events_are_the_typed_envelopes_the_stream_gives_the_same_rows(
    spark: SparkRuntime,
) -> None:
    """A chunk's ``r`` events, built by the executors as they read, are the typed change
    events the stream path builds from the same rows (:class:`Run`), value for value and
    of the same type (but for which fields may be null), whatever the columns hold."""
    from decimal import Decimal

    from herder.connectors.cdc.events import EventBatch, TableShape, source_type
    from herder.connectors.cdc.snapshot import snapshot_events
    from herder.connectors.jdbc.postgres import Column, TableId

    columns = (
        Column("id", "bigint", False),
        Column("note", "text"),
        Column("placed", "timestamp without time zone"),
        Column("seen", "timestamp with time zone"),
        Column("amount", "numeric(12,2)"),
        Column("paid", "boolean"),
        Column("data", "bytea"),
        Column("day", "date"),
    )
    shape = TableShape(TableId('odd "schema"', "t"), 'p.odd "schema".t', columns, ("id",))
    moment = dt.datetime(2024, 5, 1, 12, 30, 0, 123456)
    rows = spark.session.createDataFrame(
        [
            (
                1,
                'a "quoted",\nline: \u00e9\u4e2d',
                moment,
                moment,
                Decimal("12.34"),
                True,
                b"\x00\xff",
                dt.date(2024, 5, 1),
            ),
            (2, None, None, None, None, None, None, None),
            (
                3,
                '"after":null',
                moment,
                moment,
                Decimal("-0.01"),
                False,
                b"",
                dt.date(1969, 12, 31),
            ),
        ],
        schema=shape.row_type,
    )
    source = {f.name: None for f in source_type().fields} | {
        "version": "2.7", "connector": "postgresql", "name": 'p "x" \'y\' \\z', "ts_ms": 17,
        "snapshot": "true", "db": "d\u00e9", "schema": 'odd "schema"', "table": "t", "lsn": 99,
    }  # fmt: skip
    ts_ms = 1_714_566_600_000
    got = snapshot_events(spark.session, rows, shape, [], source, ts_ms)
    events = EventBatch()
    for row in rows.collect():
        after = row.asDict()
        value = {"before": None, "after": after, "source": source, "op": "r", "ts_ms": ts_ms}
        events.add(shape, {"id": after["id"]}, value)
    (run,) = events.runs
    expected = run.dataframe(spark.session)
    assert _nullable(got.schema).simpleString() == _nullable(expected.schema).simpleString()
    assert got.schema["value"].dataType.simpleString() == shape.value_type.simpleString()
    got_rows = sorted(tuple(r) for r in got.collect())
    assert got_rows == sorted(tuple(r) for r in expected.collect())
    assert len(got_rows) == 3


def _nullable(dtype: Any) -> Any:
    """``dtype`` with every field optional."""
    from pyspark.sql.types import StructField, StructType

    if isinstance(dtype, StructType):
        return StructType([StructField(f.name, _nullable(f.dataType), True) for f in dtype])
    return dtype
