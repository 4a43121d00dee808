"""PostgresCdcSource's stream against a real PostgreSQL (wal_level=logical): Debezium's
change events from pgoutput, whole transactions in order, the LSN committed with the
batch and confirmed to the slot after, so a restarted task repeats and loses nothing."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest

from herder.dataplane import SparkRuntime
from tests.connectors.cdc import (
    cdc_config,
    cdc_task,
    changes,
    dbname,
    next_events,
    poll_events,
    poll_until,
)
from tests.connectors.jdbc import Offsets
from tests.fixtures.postgres import PostgresServer
from tests.harness import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.timeout(300)]


@pytest.fixture
def shop(logical_postgres: PostgresServer, logical_database: str) -> str:
    logical_postgres.execute(
        "CREATE TABLE orders (id bigint PRIMARY KEY, customer integer NOT NULL, note text,"
        " amount numeric(12,2), placed date, updated timestamp, at timestamptz, paid boolean,"
        " raw bytea, tags text[]);"
        "CREATE TABLE customers (id integer PRIMARY KEY, name text)",
        dbname(logical_database),
    )
    return logical_database


def slot_position(server: PostgresServer, url: str) -> str | None:
    rows = server.execute(
        "SELECT confirmed_flush_lsn::text FROM pg_replication_slots"
        f" WHERE slot_name = 'herder_{dbname(url)[:40]}'",
        dbname(url),
    )
    return str(rows[0][0]) if rows else None


def test_inserts_updates_and_deletes_become_debezium_change_events(
    spark: SparkRuntime, logical_postgres: PostgresServer, shop: str
) -> None:
    db = dbname(shop)
    offsets = Offsets()
    task = cdc_task(cdc_config(logical_postgres, shop, snapshot_mode="no_data"), offsets)
    try:
        assert poll_events(task, offsets) == []
        logical_postgres.execute(
            "BEGIN;"
            "INSERT INTO orders VALUES (1, 7, 'first', 12.50, '2024-02-03',"
            " '2024-02-03 04:05:06.789', '2024-02-03 04:05:06+02', true, '\\x0102', '{a,\"b,c\"}');"
            "INSERT INTO customers VALUES (7, 'Ada');"
            "UPDATE orders SET note = 'changed', amount = 13 WHERE id = 1;"
            "COMMIT;"
            "DELETE FROM orders WHERE id = 1;",
            db,
        )
        events = poll_until(task, offsets, 4)
    finally:
        task.stop()
    # each table's events in its topic, in order
    orders = [(k, v) for t, k, v in events if t == "pg.public.orders"]
    assert [(t, k, v["after"]) for t, k, v in events if t == "pg.public.customers"] == [
        ("pg.public.customers", {"id": 7}, {"id": 7, "name": "Ada"})
    ]
    assert [k for k, _ in orders] == [{"id": 1}] * 4
    events = [("pg.public.orders", k, v) for k, v in orders]
    ops = changes(events)
    assert [op for op, _, _ in ops] == ["c", "u", "d"]
    created = ops[0][2]
    assert created == {
        "id": 1,
        "customer": 7,
        "note": "first",
        "amount": Decimal("12.50"),
        "placed": dt.date(2024, 2, 3),
        "updated": dt.datetime(2024, 2, 3, 4, 5, 6, 789000),
        "at": dt.datetime(2024, 2, 3, 2, 5, 6),
        "paid": True,
        "raw": b"\x01\x02",
        "tags": ["a", "b,c"],
    }
    assert ops[0][1] is None
    assert ops[1][2]["note"] == "changed" and ops[1][2]["amount"] == Decimal("13.00")
    # REPLICA IDENTITY DEFAULT: a delete's before holds the key only
    assert ops[2][1]["id"] == 1 and ops[2][1]["note"] is None and ops[2][2] is None
    assert events[3][2] is None  # the tombstone after the delete
    first = events[0][2]
    assert first is not None
    source = first["source"]
    assert source["connector"] == "postgresql" and source["name"] == "pg"
    assert (source["db"], source["schema"], source["table"]) == (db, "public", "orders")
    assert source["snapshot"] == "false" and source["txId"] > 0 and source["lsn"] > 0
    # the changes of one transaction share its id
    assert events[1][2] is not None and events[2][2] is not None
    assert events[1][2]["source"]["txId"] == source["txId"]
    assert events[2][2]["source"]["txId"] != source["txId"]
    assert offsets.committed  # the offset names the slot position reached
    (offset,) = offsets.committed.values()
    assert offset["lsn"] > 0 and offset["txId"] == events[2][2]["source"]["txId"]


def test_a_primary_key_update_is_a_delete_and_a_create_and_full_identity_gives_before(
    spark: SparkRuntime, logical_postgres: PostgresServer, shop: str
) -> None:
    db = dbname(shop)
    logical_postgres.execute("ALTER TABLE customers REPLICA IDENTITY FULL", db)
    offsets = Offsets()
    task = cdc_task(cdc_config(logical_postgres, shop, snapshot_mode="never"), offsets)
    try:
        logical_postgres.execute(
            "INSERT INTO customers VALUES (1, 'Ada');"
            "UPDATE customers SET id = 2 WHERE id = 1;"
            "UPDATE customers SET name = 'Grace' WHERE id = 2;",
            db,
        )
        events = poll_until(task, offsets, 4)
    finally:
        task.stop()
    assert [(k, v and v["op"]) for _, k, v in events] == [
        ({"id": 1}, "c"),
        ({"id": 1}, "d"),
        ({"id": 1}, None),
        ({"id": 2}, "c"),
        ({"id": 2}, "u"),
    ]
    assert changes(events)[-1][1:] == ({"id": 2, "name": "Ada"}, {"id": 2, "name": "Grace"})


def test_a_restart_resumes_at_the_committed_lsn_without_loss_or_repeat(
    spark: SparkRuntime, logical_postgres: PostgresServer, shop: str
) -> None:
    db = dbname(shop)
    config = cdc_config(logical_postgres, shop, snapshot_mode="no_data")
    offsets = Offsets()
    task = cdc_task(config, offsets)
    try:
        logical_postgres.execute(
            "INSERT INTO customers SELECT i, 'c' || i FROM generate_series(1, 3) i", db
        )
        assert len(changes(next_events(task, offsets, confirm=False))) == 3
        # committed, but the task stops before confirming it to the slot
    finally:
        task.stop()
    before_confirm = slot_position(logical_postgres, shop)
    logical_postgres.execute("INSERT INTO customers VALUES (4, 'c4')", db)
    again = cdc_task(config, offsets)
    try:
        # the slot is advanced to the committed offset at start
        assert slot_position(logical_postgres, shop) != before_confirm
        wait_until(again.poll, timeout=60, what="a batch")
        # this batch is written but never committed: the next incarnation reads it again
    finally:
        again.stop()
    third = cdc_task(config, offsets)
    try:
        found = changes(next_events(third, offsets))
        assert [after["id"] for _, _, after in found] == [4]
        assert poll_events(third, offsets) == []
    finally:
        third.stop()


def test_a_crash_between_the_batches_of_a_transaction_loses_and_repeats_none(
    spark: SparkRuntime, logical_postgres: PostgresServer, shop: str
) -> None:
    """A transaction over two tables is a batch per table (each of one type); a task
    that dies after committing the first gives the second, and only it, once restarted,
    and the slot is not confirmed past the transaction until the second commits."""
    db = dbname(shop)
    config = cdc_config(logical_postgres, shop, snapshot_mode="no_data")
    offsets = Offsets()
    task = cdc_task(config, offsets)
    try:
        assert poll_events(task, offsets) == []
        held = slot_position(logical_postgres, shop)
        logical_postgres.execute(
            "BEGIN; INSERT INTO customers VALUES (1, 'a'); INSERT INTO orders (id, customer)"
            " VALUES (10, 1); INSERT INTO customers VALUES (2, 'b'); COMMIT",
            db,
        )
        first = next_events(task, offsets)
        assert [(t, v["after"]["id"]) for t, _, v in first] == [
            ("pg.public.customers", 1),
            ("pg.public.customers", 2),
        ]
        assert slot_position(logical_postgres, shop) == held
        wait_until(task.poll, timeout=60, what="the second batch")  # never committed
    finally:
        task.stop()
    again = cdc_task(config, offsets)
    try:
        rest = next_events(again, offsets)
        assert [(t, v["after"]["id"]) for t, _, v in rest] == [("pg.public.orders", 10)]
        assert slot_position(logical_postgres, shop) != held
        logical_postgres.execute("INSERT INTO customers VALUES (3, 'c')", db)
        assert [v["after"]["id"] for _, _, v in next_events(again, offsets)] == [3]
    finally:
        again.stop()


def test_a_transaction_stays_whole_and_heartbeats_advance_an_idle_slot(
    spark: SparkRuntime, logical_postgres: PostgresServer, shop: str
) -> None:
    db = dbname(shop)
    logical_postgres.execute("CREATE TABLE other (id integer PRIMARY KEY)", db)
    offsets = Offsets()
    config = cdc_config(
        logical_postgres,
        shop,
        snapshot_mode="no_data",
        max_batch_size="10",
        heartbeat_interval_ms="1",
        table_include_list="public\\.orders,public\\.customers",
    )
    task = cdc_task(config, offsets)
    try:
        logical_postgres.execute(
            "INSERT INTO customers SELECT i, 'c' || i FROM generate_series(1, 50) i", db
        )
        # more messages than max.batch.size: the transaction still comes whole
        assert len(changes(next_events(task, offsets))) == 50
        start = slot_position(logical_postgres, shop)
        logical_postgres.execute("INSERT INTO other SELECT generate_series(1, 100)", db)

        def heartbeat() -> bool:
            events = poll_events(task, offsets)
            assert not changes(events)  # `other` is not captured
            return any(t == "__debezium-heartbeat.pg" for t, _, _ in events)

        wait_until(heartbeat, timeout=60, what="a heartbeat")
        assert slot_position(logical_postgres, shop) != start
    finally:
        task.stop()
