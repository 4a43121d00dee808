"""JdbcSink against a real PostgreSQL: insert, upsert, update and delete; tables created
and evolved from the records' schemas; exactly once through the offsets table, a batch
delivered again and a zombie's late commit included; bad input refused by name."""

from __future__ import annotations

import datetime as dt
import logging
import threading
from decimal import Decimal
from typing import Any

import pytest

from herder.connect import TopicPartition
from herder.connectors.jdbc import JdbcSinkConnector
from herder.connectors.jdbc.postgres import DatabaseError, TableId
from herder.connectors.jdbc.sink import plain_insert_check
from herder.dataplane import SparkRuntime
from tests.connectors.jdbc import credentials, sink_task
from tests.fixtures.postgres import PostgresServer
from tests.harness import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.timeout(300)]

TP = TopicPartition("orders", 0)
VALUE_DDL = "id long, amount decimal(12,2), placed date, updated timestamp_ntz, note string"


def dbname(url: str) -> str:
    return url.rsplit("/", 1)[1]


#: both forms a typed record reaches a sink in: structs, and envelopes (older topics)
FORMS = pytest.mark.parametrize("native", [True, False], ids=["native", "envelope"])


def records(
    spark: SparkRuntime,
    items: list[tuple[int, dict[str, Any] | None, dict[str, Any] | None]],
    value_ddl: str = VALUE_DDL,
    key_ddl: str = "id long",
    topic: str = "orders",
    *,
    native: bool = False,
) -> Any:
    """A sink's DataFrame of typed records: (offset, key, value) each, None for none;
    as JsonConverter's envelopes (bytes: a topic written before typed columns), or
    ``native``, structs as topics carry typed records."""
    from pyspark.sql import functions as F

    from herder.dataplane.schemas import encode_column

    def struct(ddl: str) -> str:
        return "struct<" + ",".join(f.replace(" ", ":", 1) for f in ddl.split(", ")) + ">"

    df = spark.session.createDataFrame(
        items, f"offset long, k {struct(key_ddl)}, v {struct(value_ddl)}"
    )
    return df.select(
        F.lit(topic).alias("topic"),
        F.lit(0).alias("partition"),
        F.col("offset"),
        F.current_timestamp().alias("timestamp"),
        (F.col("k") if native else encode_column(F.col("k"), df.schema["k"].dataType)).alias("key"),
        (
            F.col("v") if native else encode_column(F.col("v"), df.schema["v"].dataType, "orders")
        ).alias("value"),
        F.array().cast("array<struct<key:string,value:binary>>").alias("headers"),
    )


def order(i: int, note: str = "") -> dict[str, Any]:
    return {
        "id": i,
        "amount": Decimal(i) * Decimal("1.25"),
        "placed": dt.date(2024, 1, 1) + dt.timedelta(days=i),
        "updated": dt.datetime(2024, 1, 1, 0, 0, 0, i),
        "note": note or f"order {i}",
    }


def config(url: str, **extra: str) -> dict[str, str]:
    dotted = {k.replace("_", "."): v for k, v in extra.items()}
    return {**credentials(url), "topics": "orders", **dotted}


def put(task: Any, df: Any, reached: int) -> None:
    """One delivery, as the runtime makes it: put, then the commit's pre_commit."""
    task.put(df)
    assert task.pre_commit({TP: reached}) == {TP: reached}


@FORMS
def test_insert_creates_the_table_with_the_records_types_and_writes_each_record_once(
    spark: SparkRuntime, postgres: PostgresServer, database: str, native: bool
) -> None:
    batch = records(spark, [(i, None, order(i)) for i in range(1000)], native=native)
    task, context = sink_task(config(database, auto_create="true"), [TP])
    try:
        assert context.rewinds == {}
        put(task, batch.where("offset < 600"), 600)
        # the same records again, and more: a delivery after a crash before the group commit
        put(task, batch, 1000)
    finally:
        task.stop()
    db = dbname(database)
    assert postgres.execute(
        "SELECT count(*), count(DISTINCT id), sum(amount), max(updated) FROM orders", db
    ) == [(1000, 1000, Decimal("624375.00"), dt.datetime(2024, 1, 1, 0, 0, 0, 999))]
    assert postgres.execute(
        "SELECT column_name, format_type(atttypid, atttypmod) FROM information_schema.columns"
        " JOIN pg_attribute ON attrelid = 'orders'::regclass AND attname = column_name"
        " WHERE table_name = 'orders' ORDER BY ordinal_position",
        db,
    ) == [
        ("id", "bigint"),
        ("amount", "numeric(12,2)"),
        ("placed", "date"),
        ("updated", "timestamp without time zone"),
        ("note", "text"),
    ]
    assert postgres.execute(
        "SELECT connector, topic, partition, next_offset FROM herder_sink_offsets", db
    ) == [("sink", "orders", 0, 1000)]
    assert postgres.execute(
        "SELECT count(*) FROM pg_tables WHERE tablename LIKE 'herder_stage%'", db
    ) == [(0,)]
    # a new incarnation resumes from the offsets table, whatever the group committed
    again, context = sink_task(config(database), [TP])
    again.stop()
    assert context.rewinds == {TP: 1000}


@FORMS
def test_upsert_and_delete_by_record_key(
    spark: SparkRuntime, postgres: PostgresServer, database: str, native: bool
) -> None:
    settings = config(
        database, insert_mode="upsert", pk_mode="record_key", delete_enabled="true",
        auto_create="true",
    )  # fmt: skip
    task, _ = sink_task(settings, [TP])
    try:
        put(task, records(spark, [(i, {"id": i}, order(i)) for i in range(4)], native=native), 4)
        put(
            task,
            records(
                spark,
                [
                    (4, {"id": 2}, order(2, "first change")),
                    (5, {"id": 3}, None),  # a tombstone
                    (6, {"id": 2}, order(2, "second change")),
                    (7, {"id": 9}, order(9)),
                    (8, {"id": 0}, None),
                    (9, {"id": 0}, order(0, "back again")),
                ],
                native=native,
            ),
            10,
        )
    finally:
        task.stop()
    assert postgres.execute("SELECT id, note FROM orders ORDER BY id", dbname(database)) == [
        (0, "back again"),
        (1, "order 1"),
        (2, "second change"),
        (9, "order 9"),
    ]
    primary = postgres.execute(
        "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid"
        " AND a.attnum = ANY(i.indkey) WHERE i.indrelid = 'orders'::regclass AND i.indisprimary",
        dbname(database),
    )
    assert primary == [("id",)]


def test_an_upsert_inserts_plainly_only_keys_that_cannot_be_in_the_table(
    postgres: PostgresServer, database: str
) -> None:
    """The check that lets an upsert skip ON CONFLICT's speculative insertions."""
    db = dbname(database)
    postgres.execute(
        "CREATE TABLE keyed (id bigint PRIMARY KEY, note text);"
        " CREATE TABLE unkeyed (id bigint, note text);"
        ' CREATE TABLE pair ("B" int, a int, note text, PRIMARY KEY (a, "B"));'
        ' CREATE TABLE stage (id bigint, a int, "B" int, note text)',
        db,
    )

    def apart(table: str, keys: list[str], target: list[int], staged: list[int]) -> bool:
        postgres.execute(f"TRUNCATE {table}, stage", db)
        for k in target:
            columns = '(a, "B")' if table == "pair" else "(id)"
            values = f"({k}, {k})" if table == "pair" else f"({k})"
            postgres.execute(f"INSERT INTO {table} {columns} VALUES {values}", db)
        for k in staged:
            postgres.execute(f"INSERT INTO stage VALUES ({k}, {k}, {k}, '{k}')", db)
        sql = plain_insert_check(TableId("public", table).sql, "stage", keys)
        return bool(postgres.execute(sql, db)[0][0])

    assert apart("keyed", ["id"], [], [1, 2, 3])  # a first load
    assert apart("keyed", ["id"], [1, 2, 3], [4, 5])  # keys that only grow
    assert apart("keyed", ["id"], [10, 20], [1, 5])  # below the table's
    assert not apart("keyed", ["id"], [1, 5], [3])  # between its keys: maybe there
    assert not apart("keyed", ["id"], [1, 2, 3], [3, 4])
    # no unique index for ON CONFLICT: the upsert fails, and so must the plain insert
    assert not apart("unkeyed", ["id"], [], [1])
    assert not apart("keyed", ["note"], [], [1])
    # a key of several columns: only an empty table is apart
    assert apart("pair", ["B", "a"], [], [1])
    assert not apart("pair", ["B", "a"], [5], [1])


@pytest.mark.parametrize("deletes", [False, True], ids=["no deletes", "delete.enabled"])
def test_an_upsert_into_an_empty_table_keeps_each_keys_latest_record(
    spark: SparkRuntime,
    postgres: PostgresServer,
    database: str,
    caplog: pytest.LogCaptureFixture,
    deletes: bool,
) -> None:
    """A key staged twice (a plain insert of every row would fail on it) and, with
    deletes, a key inserted then deleted in the same batch (one that must not be
    inserted at all)."""
    settings = config(
        database, insert_mode="upsert", pk_mode="record_key", auto_create="true",
        delete_enabled=str(deletes).lower(),
    )  # fmt: skip
    task, _ = sink_task(settings, [TP])
    caplog.set_level(logging.DEBUG, logger="herder.connectors.jdbc.sink")
    batch = [
        (0, {"id": 1}, order(1, "first")),
        (1, {"id": 2}, order(2)),
        (2, {"id": 1}, order(1, "latest")),
        (3, {"id": 3}, order(3)),
        (4, {"id": 3}, None),  # a tombstone: a delete with delete.enabled, else skipped
    ]
    try:
        put(task, records(spark, batch), 5)
        # without deletes the plain insert takes every row and fails on key 1; with them
        # it takes each key's latest and succeeds
        first = "moved by insert" if deletes else "moved by upsert after a conflict"
        assert first in caplog.text
        caplog.clear()
        # more new keys, one repeated: this table's batches repeat keys, so the plain
        # insert now takes each key's latest, and succeeds
        again = [(5, {"id": 10}, order(10)), (6, {"id": 10}, order(10, "again"))]
        put(task, records(spark, again), 7)
        assert "moved by insert" in caplog.text
    finally:
        task.stop()
    remaining = [(1, "latest"), (2, "order 2")] + ([] if deletes else [(3, "order 3")])
    assert postgres.execute("SELECT id, note FROM orders ORDER BY id", dbname(database)) == (
        [*remaining, (10, "again")]
    )


def test_an_upsert_into_a_database_without_plpgsql_uses_on_conflict(
    spark: SparkRuntime,
    postgres: PostgresServer,
    database: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    db = dbname(database)
    postgres.execute("DROP EXTENSION plpgsql", db)
    settings = config(database, insert_mode="upsert", pk_mode="record_key", auto_create="true")
    task, _ = sink_task(settings, [TP])
    caplog.set_level(logging.INFO, logger="herder.connectors.jdbc.sink")
    try:
        put(task, records(spark, [(i, {"id": i}, order(i)) for i in range(3)]), 3)
        put(
            task, records(spark, [(3, {"id": 1}, order(1, "changed")), (4, {"id": 7}, order(7))]), 5
        )
    finally:
        task.stop()
    assert "PL/pgSQL is not installed" in caplog.text
    assert postgres.execute("SELECT id, note FROM orders ORDER BY id", db) == [
        (0, "order 0"),
        (1, "changed"),
        (2, "order 2"),
        (7, "order 7"),
    ]
    assert postgres.execute("SELECT next_offset FROM herder_sink_offsets", db) == [(5,)]


def test_an_upsert_whose_key_another_writer_inserts_meanwhile_upserts_it(
    spark: SparkRuntime,
    postgres: PostgresServer,
    database: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The check finds the table empty, but another transaction inserts one of the
    keys before the plain insert reaches it: the insert is rolled back to its savepoint
    and the rows upserted, in the same transaction as the offsets."""
    import psycopg

    db = dbname(database)
    settings = config(database, insert_mode="upsert", pk_mode="record_key", auto_create="true")
    task, _ = sink_task(settings, [TP])
    other = psycopg.connect(postgres.dsn(db))
    caplog.set_level(logging.DEBUG, logger="herder.connectors.jdbc.sink")
    try:
        put(task, records(spark, [(0, {"id": 0}, order(0))]), 1)
        assert "moved by insert" in caplog.text  # into an empty table
        postgres.execute("DELETE FROM orders", db)
        task.put(records(spark, [(i, {"id": i}, order(i, "staged")) for i in range(1, 101)]))
        # uncommitted: the check does not see it, the plain insert waits for it
        other.execute("INSERT INTO orders (id, note) VALUES (50, 'the other writer')")
        committed = threading.Thread(target=lambda: task.pre_commit({TP: 101}))
        committed.start()
        wait_until(
            lambda: postgres.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                f" AND datname = '{db}'"
            )[0][0],
            what="the plain insert to wait for the other writer's row",
        )
        other.commit()
        committed.join(timeout=60)
        assert not committed.is_alive()
    finally:
        other.close()
        task.stop()
    assert "moved by upsert after a conflict" in caplog.text
    assert postgres.execute("SELECT count(*), min(id), max(id) FROM orders", db) == [(100, 1, 100)]
    assert postgres.execute("SELECT note FROM orders WHERE id = 50", db) == [("staged",)]
    assert postgres.execute("SELECT next_offset FROM herder_sink_offsets", db) == [(101,)]


def test_kafka_coordinates_as_the_primary_key(
    spark: SparkRuntime, postgres: PostgresServer, database: str
) -> None:
    settings = config(database, insert_mode="upsert", pk_mode="kafka", auto_create="true")
    task, _ = sink_task(settings, [TP])
    try:
        put(task, records(spark, [(i, None, order(i)) for i in range(3)]), 3)
    finally:
        task.stop()
    rows = postgres.execute(
        "SELECT __connect_topic, __connect_partition, __connect_offset, id FROM orders"
        " ORDER BY __connect_offset",
        dbname(database),
    )
    assert rows == [("orders", 0, 0, 0), ("orders", 0, 1, 1), ("orders", 0, 2, 2)]


@FORMS
def test_update_changes_existing_rows_only(
    spark: SparkRuntime, postgres: PostgresServer, database: str, native: bool
) -> None:
    db = dbname(database)
    postgres.execute("CREATE TABLE orders (id bigint PRIMARY KEY, note text, extra int)", db)
    postgres.execute("INSERT INTO orders VALUES (1, 'one', 7), (2, 'two', 8)", db)
    settings = config(
        database, insert_mode="update", pk_mode="record_value", pk_fields="id",
        fields_whitelist="id,note",
    )  # fmt: skip
    task, _ = sink_task(settings, [TP])
    try:
        changes = [(0, None, order(2, "changed")), (1, None, order(5))]
        put(task, records(spark, changes, native=native), 2)
    finally:
        task.stop()
    assert postgres.execute("SELECT * FROM orders ORDER BY id", db) == [
        (1, "one", 7),
        (2, "changed", 8),
    ]


def test_auto_evolve_adds_a_new_field_as_a_column(
    spark: SparkRuntime, postgres: PostgresServer, database: str, caplog: pytest.LogCaptureFixture
) -> None:
    settings = config(database, auto_create="true", auto_evolve="true")
    task, _ = sink_task(settings, [TP])
    try:
        put(task, records(spark, [(0, None, {"id": 1, "note": "old"})], "id long, note string"), 1)
        # one delivery with both schemas: the new field's column comes before the rows
        older = records(spark, [(1, None, {"id": 2, "note": "old"})], "id long, note string")
        newer = records(
            spark,
            [(2, None, {"id": 3, "note": "new", "email": "c@example.org"})],
            "id long, note string, email string",
        )
        with caplog.at_level(logging.INFO, logger="herder.connectors.jdbc.sink"):
            put(task, older.unionByName(newer), 3)
        assert "holds records of schemas not seen before" in caplog.text
    finally:
        task.stop()
    assert postgres.execute("SELECT id, note, email FROM orders ORDER BY id", dbname(database)) == [
        (1, "old", None),
        (2, "old", None),
        (3, "new", "c@example.org"),
    ]


def test_a_zombie_commit_after_the_partition_moved_writes_nothing_twice(
    spark: SparkRuntime, postgres: PostgresServer, database: str
) -> None:
    batch = records(spark, [(i, None, order(i)) for i in range(150)])
    zombie, _ = sink_task(config(database, auto_create="true"), [TP])
    owner, _ = sink_task(config(database, auto_create="true"), [TP])
    try:
        zombie.put(batch.where("offset < 100"))
        put(owner, batch, 150)
        # the zombie, paused before its commit, wakes up and commits what it staged
        zombie.pre_commit({TP: 100})
    finally:
        zombie.stop()
        owner.stop()
    db = dbname(database)
    assert postgres.execute("SELECT count(*), count(DISTINCT id) FROM orders", db) == [(150, 150)]
    assert postgres.execute("SELECT next_offset FROM herder_sink_offsets", db) == [(150,)]


def test_bad_input_is_refused_naming_the_table_and_column(
    spark: SparkRuntime, postgres: PostgresServer, database: str
) -> None:
    db = dbname(database)
    task, _ = sink_task(config(database), [TP])
    try:
        with pytest.raises(DatabaseError, match=r"table orders does not exist \(and auto"):
            task.put(records(spark, [(0, None, order(0))]))
        postgres.execute("CREATE TABLE orders (id bigint PRIMARY KEY, note text)", db)
        with pytest.raises(DatabaseError, match="table orders has no column 'amount'"):
            task.put(records(spark, [(0, None, order(0))]))
        plain = records(spark, [(0, None, None)]).selectExpr(
            "topic", "partition", "offset", "timestamp", "key",
            "CAST('{\"id\": 1}' AS BINARY) AS value", "headers",
        )  # fmt: skip
        with pytest.raises(DatabaseError, match="value without a schema"):
            task.put(plain)
        nulls = records(spark, [(0, None, {"id": None, "note": "x"})], "id long, note string")
        task.put(nulls)
        with pytest.raises(DatabaseError, match='"id" of relation "orders"'):
            task.pre_commit({TP: 1})
    finally:
        task.stop()


def test_validate_refuses_keys_that_do_not_go_together(
    postgres: PostgresServer, database: str
) -> None:
    def errors(**extra: str) -> dict[str, list[str]]:
        results = JdbcSinkConnector().validate(config(database, **extra))
        return {k: v.errors for k, v in results.items() if v.errors}

    assert "pk.mode=record_key" in errors(delete_enabled="true")["delete.enabled"][0]
    assert "primary key" in errors(insert_mode="upsert")["insert.mode"][0]
    wrong = errors(connection_password="nope")
    assert "password authentication failed" in wrong["connection.password"][0]
    assert errors() == {}


def test_auto_evolve_widens_a_column_whose_field_became_a_wider_integer(
    spark: SparkRuntime, postgres: PostgresServer, database: str
) -> None:
    settings = config(database, auto_create="true", auto_evolve="true", insert_mode="upsert",
                      pk_mode="record_key")  # fmt: skip
    task, _ = sink_task(settings, [TP])
    try:
        put(task, records(spark, [(0, {"id": 1}, {"id": 1, "n": 7})], "id int, n int", "id int"),
            1)  # fmt: skip
        # the source's column became a bigint (ALTER COLUMN n TYPE bigint), and holds more
        wide = {"id": 2, "n": 5_000_000_000}
        put(task, records(spark, [(1, {"id": 2}, wide)], "id int, n long", "id int"), 2)
    finally:
        task.stop()
    db = dbname(database)
    assert postgres.execute("SELECT id, n FROM orders ORDER BY id", db) == [
        (1, 7),
        (2, 5_000_000_000),
    ]
    assert postgres.execute(
        "SELECT format_type(atttypid, atttypmod) FROM pg_attribute"
        " WHERE attrelid = 'orders'::regclass AND attname = 'n'",
        db,
    ) == [("bigint",)]
