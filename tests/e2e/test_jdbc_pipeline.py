"""JDBC connectors end to end: real ensemble and worker processes, Spark in the worker,
a real PostgreSQL.

A Parquet file with decimals, dates and timestamps goes DirectorySource → topic →
JdbcSink into a table it creates with the same types, and back out through JdbcSource →
topic → DirectorySink into a Parquet file equal to the first. A worker killed with
``kill -9`` in the middle of a table copy (JdbcSource → topic → JdbcSink,
``insert.mode=insert``) leaves, once restarted, a target table equal to the source: no
row lost, none twice.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.connectors.jdbc import credentials
from tests.e2e.test_pipeline import Cluster
from tests.fixtures.postgres import PostgresServer, database, postgres
from tests.harness import wait_until

__all__ = ["database", "postgres"]

pytestmark = [pytest.mark.integration, pytest.mark.spark]

SOURCE = "herder.connectors.jdbc.JdbcSourceConnector"
SINK = "herder.connectors.jdbc.JdbcSinkConnector"
ROWS = 2000


def dbname(url: str) -> str:
    return url.rsplit("/", 1)[1]


def typed_table() -> pa.Table:
    ids = list(range(ROWS))
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "amount": pa.array([Decimal(i) / 100 for i in ids], pa.decimal128(12, 2)),
            "day": pa.array([dt.date(2020, 1, 1) + dt.timedelta(days=i) for i in ids]),
            "at": pa.array(
                [dt.datetime(2024, 5, 1) + dt.timedelta(seconds=i, microseconds=i) for i in ids],
                pa.timestamp("us"),
            ),
            "name": pa.array([f"row {i}" if i % 10 else None for i in ids], pa.string()),
            "ok": pa.array([i % 3 == 0 for i in ids], pa.bool_()),
        }
    )


def parquet_rows(directory: Path) -> pa.Table | None:
    files = sorted(p for p in directory.glob("*.parquet"))
    if not files:
        return None
    return pa.concat_tables(pq.read_table(p) for p in files)


def failed(cluster: Cluster, name: str) -> None:
    for task in cluster.status(name).get("tasks", []):
        if task["state"] == "FAILED":
            raise AssertionError(f"task of {name} failed:\n{task.get('trace')}")


@pytest.mark.timeout(600)
def test_a_typed_parquet_file_goes_through_postgres_and_back_unchanged(
    cluster: Cluster, postgres: PostgresServer, database: str, tmp_path: Path
) -> None:
    given = typed_table()
    inbox, outbox = tmp_path / "in", tmp_path / "out"
    inbox.mkdir()
    pq.write_table(given, inbox / ".typed.parquet")
    (inbox / ".typed.parquet").rename(inbox / "typed.parquet")
    cluster.start_worker()
    typed = {"value.converter.schemas.enable": "true"}
    cluster.create(
        "files-in",
        {"connector.class": "DirectorySource", "directory": str(inbox), "format": "parquet",
         "topic": "typed", **typed},
    )  # fmt: skip
    cluster.create(
        "to-postgres",
        {"connector.class": SINK, "topics": "typed", "table.name.format": "typed_copy",
         "insert.mode": "upsert", "pk.mode": "record_value", "pk.fields": "id",
         "auto.create": "true", **credentials(database)},
    )  # fmt: skip
    db = dbname(database)

    def copied() -> bool:
        failed(cluster, "to-postgres")
        rows = postgres.execute("SELECT to_regclass('typed_copy') IS NOT NULL", db)
        return bool(rows[0][0]) and postgres.execute("SELECT count(*) FROM typed_copy", db) == [
            (ROWS,)
        ]

    wait_until(copied, timeout=240, interval=0.5, what="the table to fill")
    types = postgres.execute(
        "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute"
        " WHERE attrelid = 'typed_copy'::regclass AND attnum > 0 ORDER BY attnum",
        db,
    )
    assert types == [
        ("id", "bigint"),
        ("amount", "numeric(12,2)"),
        ("day", "date"),
        ("at", "timestamp without time zone"),
        ("name", "text"),
        ("ok", "boolean"),
    ]
    cluster.create(
        "from-postgres",
        {"connector.class": SOURCE, "mode": "incrementing", "incrementing.column.name": "id",
         "table.whitelist": "typed_copy", "topic.prefix": "back-", "poll.interval.ms": "200",
         **credentials(database)},
    )  # fmt: skip
    cluster.create(
        "files-out",
        {"connector.class": "DirectorySink", "directory": str(outbox), "format": "parquet",
         "topics": "back-typed_copy", **typed},
    )  # fmt: skip

    def written() -> pa.Table | None:
        failed(cluster, "from-postgres")
        failed(cluster, "files-out")
        table = parquet_rows(outbox) if outbox.exists() else None
        return table if table is not None and table.num_rows >= ROWS else None

    out: Any = wait_until(written, timeout=240, interval=0.5, what="the Parquet files out")
    out = out.sort_by("id")
    assert [(f.name, f.type) for f in out.schema] == [(f.name, f.type) for f in given.schema]
    assert out.to_pylist() == given.to_pylist()

    # bad input: a config the database refuses is refused before it is stored; a table
    # dropped under a running source fails its task, the cause naming the table
    refused = cluster.http.post(
        f"{cluster.answering().url}/connectors",
        json={"name": "wrong", "config": {
            "connector.class": SOURCE, "mode": "bulk", "topic.prefix": "x-",
            **credentials(database), "connection.password": "wrong"}},
    )  # fmt: skip
    assert refused.status_code == 400, refused.text
    assert "password authentication failed" in refused.text
    postgres.execute("DROP TABLE typed_copy", db)

    def failed_naming_the_table() -> str | None:
        tasks = cluster.status("from-postgres").get("tasks", [])
        trace = tasks[0].get("trace") or "" if tasks and tasks[0]["state"] == "FAILED" else ""
        return trace if "typed_copy" in trace else None

    trace = wait_until(failed_naming_the_table, timeout=60, what="the source task to fail")
    assert 'relation "public.typed_copy" does not exist' in str(trace)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_kill_9_in_the_middle_of_a_table_copy_loses_and_repeats_nothing(
    cluster: Cluster, postgres: PostgresServer, database: str
) -> None:
    total = 500_000
    db = dbname(database)
    postgres.execute(
        "CREATE TABLE src (id bigint PRIMARY KEY, n integer, note text, at timestamp,"
        " amount numeric(12,2), flag boolean)",
        db,
    )
    postgres.execute(
        "INSERT INTO src SELECT i, i % 1000, 'note ' || i, TIMESTAMP '2024-01-01' + i *"
        f" INTERVAL '1 second', i / 100.0, i % 2 = 0 FROM generate_series(1, {total}) i",
        db,
    )
    worker = cluster.start_worker()
    cluster.create(
        "copy-out",
        {"connector.class": SOURCE, "mode": "incrementing", "incrementing.column.name": "id",
         "table.whitelist": "src", "topic.prefix": "copy-", "batch.max.rows": "25000",
         "poll.interval.ms": "200", **credentials(database)},
    )  # fmt: skip
    cluster.create(
        "copy-in",
        {"connector.class": SINK, "topics": "copy-src", "table.name.format": "dst",
         "insert.mode": "insert", "auto.create": "true", "consumer.max.records": "50000",
         **credentials(database)},
    )  # fmt: skip

    def count() -> int:
        if not postgres.execute("SELECT to_regclass('dst') IS NOT NULL", db)[0][0]:
            return 0
        return int(postgres.execute("SELECT count(*) FROM dst", db)[0][0])

    wait_until(lambda: 0 < count() < total, timeout=300, interval=0.05, what="a copy under way")
    cluster.kill9(worker)
    at_kill = count()
    assert at_kill < total
    cluster.start_worker()

    def done() -> bool:
        failed(cluster, "copy-in")
        failed(cluster, "copy-out")
        return count() >= total

    wait_until(done, timeout=600, interval=0.5, what="the copy to finish")
    assert postgres.execute("SELECT count(*), count(DISTINCT id) FROM dst", db) == [(total, total)]
    differing = postgres.execute(
        "SELECT count(*) FROM ((SELECT * FROM src EXCEPT SELECT * FROM dst)"
        " UNION ALL (SELECT * FROM dst EXCEPT SELECT * FROM src)) d",
        db,
    )
    assert differing == [(0,)]
