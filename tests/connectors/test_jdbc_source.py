"""JdbcSource against a real PostgreSQL: each mode reads what it should, offsets in
Connect's shape resume a task, big batches are read by key ranges on the executors, and
bad configs are refused with the table and column named."""

from __future__ import annotations

import datetime as dt
import logging
import threading
from decimal import Decimal
from typing import Any

import pytest

from herder.connect import ConnectorContext
from herder.connectors.jdbc import JdbcSourceConnector
from herder.connectors.jdbc.postgres import DatabaseError
from herder.dataplane import SparkRuntime
from tests.connectors.jdbc import Offsets, credentials, poll_rows, rows_of, source_task
from tests.fixtures.postgres import PostgresServer

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.timeout(300)]


def dbname(url: str) -> str:
    return url.rsplit("/", 1)[1]


def config(url: str, **extra: str) -> dict[str, str]:
    return {
        **credentials(url),
        "topic.prefix": "pg-",
        "poll.interval.ms": "10",
        "tables": "orders",
        **{k.replace("_", "."): v for k, v in extra.items()},
    }


@pytest.fixture
def orders(postgres: PostgresServer, database: str) -> str:
    postgres.execute(
        "CREATE TABLE orders (id bigserial PRIMARY KEY, customer integer, note text,"
        " amount numeric(12,2), placed date, updated timestamp NOT NULL, paid boolean)",
        dbname(database),
    )
    return database


def add_orders(postgres: PostgresServer, url: str, first: int, count: int) -> None:
    postgres.execute(
        "INSERT INTO orders (id, customer, note, amount, placed, updated, paid)"
        f" SELECT i, i % 7, 'order ' || i, i * 1.25, DATE '2024-01-01' + i,"
        f" TIMESTAMP '2024-01-01 00:00:00' + i * INTERVAL '1.5 seconds', i % 2 = 0"
        f" FROM generate_series({first}, {first + count - 1}) i",
        dbname(url),
    )


def test_incrementing_reads_new_rows_only_and_resumes_from_its_offset(
    spark: SparkRuntime, postgres: PostgresServer, orders: str
) -> None:
    add_orders(postgres, orders, 1, 5)
    offsets = Offsets()
    task = source_task(config(orders, mode="incrementing", incrementing_column_name="id"), offsets)
    try:
        batch = task.poll()
        assert batch is not None
        assert batch.topic == "pg-orders"
        assert batch.offsets == [
            ({"protocol": "1", "table": f"{dbname(orders)}.public.orders"}, {"incrementing": 5})
        ]
        offsets.commit(batch)
        first = rows_of(batch)
        assert sorted(r["id"] for r in first) == [1, 2, 3, 4, 5]
        row = next(r for r in first if r["id"] == 2)
        assert row["amount"] == Decimal("2.50")
        assert row["placed"] == dt.date(2024, 1, 3)
        assert row["updated"] == dt.datetime(2024, 1, 1, 0, 0, 3)
        assert row["paid"] is True and row["note"] == "order 2"
        assert task.poll() is None
        add_orders(postgres, orders, 6, 3)
        assert sorted(r["id"] for r in poll_rows(task, offsets)) == [6, 7, 8]
    finally:
        task.stop()
    # a new incarnation starts after the committed offset
    add_orders(postgres, orders, 9, 2)
    again = source_task(config(orders, mode="incrementing", incrementing_column_name="id"), offsets)
    try:
        assert sorted(r["id"] for r in poll_rows(again, offsets)) == [9, 10]
    finally:
        again.stop()


def test_unique_keys_within_batch_max_rows_values_are_planned_from_their_bounds(
    spark: SparkRuntime,
    postgres: PostgresServer,
    orders: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Unique keys spanning at most batch.max.rows values are one batch, planned from
    their bounds alone (the read says "at most" that many rows); keys spanning more are
    counted to the batch.max.rows-th, and fewer rows than that are one batch too. (A
    backlog of more rows is cut there: see the next test.)"""
    caplog.set_level(logging.INFO, logger="herder.connectors.jdbc.source")
    for first in (1, 400, 2_000, 2_500, 9_000):
        add_orders(postgres, orders, first, 1)
    offsets = Offsets()
    settings = config(
        orders, mode="incrementing", incrementing_column_name="id", batch_max_rows="3000"
    )
    task = source_task(settings, offsets)
    try:
        batch = task.poll()
        assert batch is not None
        # keys 1..9000 span more than 3000 values: counted, 5 rows
        assert "(5 rows in 1 pieces)" in caplog.text
        assert batch.offsets[0][1] == {"incrementing": 9_000}
        assert sorted(r["id"] for r in rows_of(batch)) == [1, 400, 2_000, 2_500, 9_000]
        offsets.commit(batch)
        assert task.poll() is None
        add_orders(postgres, orders, 9_100, 1)
        add_orders(postgres, orders, 11_000, 1)
        batch = task.poll()
        assert batch is not None
        # 9100..11000: within 3000 values, one batch from the bounds
        assert "(at most 1901 rows in 1 pieces)" in caplog.text
        assert batch.offsets[0][1] == {"incrementing": 11_000}
        assert sorted(r["id"] for r in rows_of(batch)) == [9_100, 11_000]
    finally:
        task.stop()


def test_a_backlog_is_read_in_batches_by_key_ranges_on_the_executors(
    spark: SparkRuntime, postgres: PostgresServer, orders: str
) -> None:
    add_orders(postgres, orders, 1, 5000)
    task = source_task(
        config(
            orders,
            mode="incrementing",
            incrementing_column_name="id",
            batch_max_rows="3000",
            parallel_min_rows="1000",
            parallel_split_rows="800",
        )
    )
    try:
        batch = task.poll()
        assert batch is not None
        assert batch.offsets[0][1] == {"incrementing": 3000}
        assert batch.data.rdd.getNumPartitions() == 4
        ids = [r["id"] for r in rows_of(batch)]
        rest = [r["id"] for r in poll_rows(task)]
        assert sorted(ids + rest) == list(range(1, 5001))
        assert len(ids) == 3000
    finally:
        task.stop()


def test_timestamp_mode_picks_up_updated_rows(
    spark: SparkRuntime, postgres: PostgresServer, orders: str
) -> None:
    add_orders(postgres, orders, 1, 4)
    offsets = Offsets()
    task = source_task(config(orders, mode="timestamp", timestamp_column_name="updated"), offsets)
    try:
        assert sorted(r["id"] for r in poll_rows(task, offsets)) == [1, 2, 3, 4]
        ((_, offset),) = offsets.committed.items()
        assert offset == {"timestamp": 1704067206000, "timestamp_nanos": 0}
        assert poll_rows(task, offsets) == []
        postgres.execute(
            "UPDATE orders SET note = 'changed', updated = TIMESTAMP '2024-06-01 12:00:00.000123'"
            " WHERE id = 2",
            dbname(orders),
        )
        changed = poll_rows(task, offsets)
        assert [(r["id"], r["note"]) for r in changed] == [(2, "changed")]
        ((_, offset),) = offsets.committed.items()
        assert offset == {"timestamp": 1717243200000, "timestamp_nanos": 123000}
    finally:
        task.stop()


def test_timestamp_and_incrementing_loses_and_repeats_no_row_sharing_a_timestamp(
    spark: SparkRuntime, postgres: PostgresServer, orders: str
) -> None:
    add_orders(postgres, orders, 1, 7)
    postgres.execute("UPDATE orders SET updated = TIMESTAMP '2024-03-01 00:00:00'", dbname(orders))
    offsets = Offsets()
    settings = config(
        orders,
        mode="timestamp+incrementing",
        timestamp_column_name="updated",
        incrementing_column_name="id",
        batch_max_rows="3",
    )
    task = source_task(settings, offsets)
    seen: list[int] = []
    try:
        for _ in range(3):
            seen += [r["id"] for r in poll_rows(task, offsets)]
        assert poll_rows(task, offsets) == []
        assert sorted(seen) == list(range(1, 8))
        ((_, offset),) = offsets.committed.items()
        assert offset == {"timestamp": 1709251200000, "timestamp_nanos": 0, "incrementing": 7}
    finally:
        task.stop()


def test_bulk_reads_the_whole_table_every_time(
    spark: SparkRuntime, postgres: PostgresServer, orders: str
) -> None:
    add_orders(postgres, orders, 1, 3)
    task = source_task(config(orders, mode="bulk"))
    try:
        first = task.poll()
        assert first is not None and first.offsets == []
        assert sorted(r["id"] for r in rows_of(first)) == [1, 2, 3]
        add_orders(postgres, orders, 4, 1)
        assert sorted(r["id"] for r in poll_rows(task)) == [1, 2, 3, 4]
    finally:
        task.stop()


def test_a_custom_query_goes_to_the_prefix_topic(
    spark: SparkRuntime, postgres: PostgresServer, orders: str
) -> None:
    add_orders(postgres, orders, 1, 6)
    settings = config(
        orders,
        mode="incrementing",
        incrementing_column_name="id",
        query="SELECT id, note, amount * 2 AS doubled FROM orders WHERE paid",
        topic_prefix="paid-orders",
    )
    del settings["tables"]
    task = source_task(settings)
    try:
        batch = task.poll()
        assert batch is not None and batch.topic == "paid-orders"
        assert batch.offsets == [({"query": "query"}, {"incrementing": 6})]
        rows = sorted(rows_of(batch), key=lambda r: r["id"])
        assert [r["id"] for r in rows] == [2, 4, 6]
        assert set(rows[0]) == {"id", "note", "doubled"}
        # numeric without a declared scale has no fixed type: it is read as its text
        assert rows[0]["doubled"] == "5.00"
    finally:
        task.stop()


def test_the_connector_spreads_tables_over_tasks(postgres: PostgresServer, database: str) -> None:
    for name in ("a", "b", "c"):
        postgres.execute(f"CREATE TABLE {name} (id serial PRIMARY KEY)", dbname(database))
    connector = JdbcSourceConnector()
    connector.start({**credentials(database), "mode": "bulk", "topic.prefix": "t-",
                     "table.blacklist": "c"})  # fmt: skip
    try:
        assert [c["tables"] for c in connector.task_configs(5)] == ["a", "b"]
        assert [c["tables"] for c in connector.task_configs(1)] == ["a,b"]
    finally:
        connector.stop()


def errors_of(url: str, **extra: str) -> dict[str, list[str]]:
    settings = {**credentials(url), "topic.prefix": "t-", **extra}
    results = JdbcSourceConnector().validate(settings)
    return {k: v.errors for k, v in results.items() if v.errors}


def test_validate_names_the_key_table_and_column_that_are_wrong(
    postgres: PostgresServer, orders: str
) -> None:
    postgres.execute("CREATE TABLE shapes (id serial PRIMARY KEY, p point)", dbname(orders))
    wrong_password = errors_of(orders, mode="bulk", **{"connection.password": "nope"})
    assert "password authentication failed" in wrong_password["connection.password"][0]
    assert "nope" not in str(wrong_password)
    missing = errors_of(orders, mode="bulk", **{"table.whitelist": "orders,nosuch"})
    assert "nosuch" in missing["table.whitelist"][0]
    column = errors_of(
        orders, mode="incrementing", **{"incrementing.column.name": "serial_no",
                                        "table.whitelist": "orders"}
    )  # fmt: skip
    assert "no column 'serial_no'" in column["incrementing.column.name"][0]
    nullable = errors_of(
        orders, mode="incrementing", **{"incrementing.column.name": "customer",
                                        "table.whitelist": "orders"}
    )  # fmt: skip
    assert "nullable" in nullable["incrementing.column.name"][0]
    unmappable = errors_of(orders, mode="bulk", **{"table.whitelist": "shapes"})
    message = unmappable["table.whitelist"][0]
    assert "table shapes" in message and "'p'" in message and "point" in message
    required = errors_of(orders, mode="incrementing", **{"table.whitelist": "orders"})
    assert "required" in required["incrementing.column.name"][0]
    ok = errors_of(
        orders, mode="incrementing", **{"incrementing.column.name": "id",
                                        "table.whitelist": "orders"}
    )  # fmt: skip
    assert ok == {}


def test_a_table_dropped_mid_stream_fails_the_task_naming_it(
    spark: SparkRuntime, postgres: PostgresServer, orders: str
) -> None:
    add_orders(postgres, orders, 1, 2)
    task = source_task(config(orders, mode="incrementing", incrementing_column_name="id"))
    try:
        assert poll_rows(task)
        postgres.execute("DROP TABLE orders", dbname(orders))
        with pytest.raises(
            DatabaseError, match=r'^table orders: relation "public\.orders" does not exist'
        ):
            task.poll()
    finally:
        task.stop()


def test_rows_newer_than_the_delay_wait_and_a_lost_connection_is_made_again(
    spark: SparkRuntime, postgres: PostgresServer, orders: str
) -> None:
    add_orders(postgres, orders, 1, 2)
    postgres.execute(
        "INSERT INTO orders (id, note, updated) VALUES (3, 'just now', LOCALTIMESTAMP)",
        dbname(orders),
    )
    settings = config(orders, mode="timestamp", timestamp_column_name="updated",
                      timestamp_delay_interval_ms="3600000")  # fmt: skip
    task = source_task(settings)
    try:
        assert sorted(r["id"] for r in poll_rows(task)) == [1, 2]
        # the server ends the task's session: the next poll connects again
        postgres.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            f" WHERE datname = '{dbname(orders)}' AND pid <> pg_backend_pid()"
        )
        postgres.execute(
            "UPDATE orders SET updated = TIMESTAMP '2024-06-01 00:00:00' WHERE id = 1",
            dbname(orders),
        )
        assert [r["id"] for r in poll_rows(task)] == [1]
    finally:
        task.stop()


class Reconfigurations(ConnectorContext):
    def __init__(self) -> None:
        self.requested = threading.Event()

    def request_task_reconfiguration(self) -> None:
        self.requested.set()

    def raise_error(self, error: BaseException) -> None:
        raise AssertionError(error)


def test_a_new_table_is_found_and_the_tasks_reconfigured(
    postgres: PostgresServer, database: str
) -> None:
    postgres.execute("CREATE TABLE a (id serial PRIMARY KEY)", dbname(database))
    connector = JdbcSourceConnector()
    context = Reconfigurations()
    connector.initialize(context)
    connector.start({**credentials(database), "mode": "bulk", "topic.prefix": "t-",
                     "table.poll.interval.ms": "100"})  # fmt: skip
    try:
        assert [c["tables"] for c in connector.task_configs(2)] == ["a"]
        postgres.execute("CREATE TABLE b (id serial PRIMARY KEY)", dbname(database))
        assert context.requested.wait(30)
        assert [c["tables"] for c in connector.task_configs(2)] == ["a", "b"]
    finally:
        connector.stop()


def test_a_python_worker_keeps_its_connection_for_the_next_piece(
    postgres: PostgresServer, orders: str
) -> None:
    """Pieces read one after the other in one process share a connection, each in a
    transaction of its own (a snapshot imported, or not); one the server ended since is
    replaced; a read stopped midway keeps nothing."""
    from pyspark.sql.types import LongType, StructField, StructType

    from herder.connectors.jdbc import reading

    add_orders(postgres, orders, 1, 50)
    dsn = postgres.dsn(dbname(orders))
    schema = StructType([StructField("id", LongType())])
    sql = "SELECT id FROM orders WHERE id >= {} AND id < {}"

    def ids(low: int, high: int, snapshot: str | None = None) -> list[int]:
        batches = reading.read_piece(dsn, sql.format(low, high), schema, snapshot)
        return [i for batch in batches for i in batch.column(0).to_pylist()]

    def backend() -> int:
        """The server process of the connection kept, asked on it (its transaction
        ended after, as a read leaves it)."""
        conn = reading._KEPT[dsn]
        with conn.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            (pid,) = cursor.fetchone()
        conn.rollback()
        return int(pid)

    reading._KEPT.pop(dsn, None)
    try:
        assert ids(1, 11) == list(range(1, 11))
        first = backend()
        # a snapshot exported elsewhere, imported by the kept connection's next read
        with psycopg_connection(postgres.dsn(dbname(orders))) as exporter:
            exporter.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            (snapshot,) = exporter.execute("SELECT pg_export_snapshot()").fetchone()
            postgres.execute("DELETE FROM orders WHERE id = 15", dbname(orders))
            assert ids(11, 21, snapshot) == list(range(11, 21))  # as the snapshot saw them
        assert backend() == first
        assert ids(11, 21) == [i for i in range(11, 21) if i != 15]
        postgres.execute(f"SELECT pg_terminate_backend({first})", dbname(orders))
        assert ids(21, 31) == list(range(21, 31))  # on a new connection
        assert backend() != first
        stopped = reading.read_piece(dsn, sql.format(1, 51), schema)
        next(stopped)
        stopped.close()
        assert dsn not in reading._KEPT
    finally:
        kept = reading._KEPT.pop(dsn, None)
        if kept is not None:
            kept.close()


def psycopg_connection(dsn: str) -> Any:
    import psycopg

    return psycopg.connect(dsn, autocommit=True)
