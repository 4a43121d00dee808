"""PostgreSQL → PostgreSQL in two connector configs: PostgresCdcSource (an initial
snapshot in chunks, then the stream) → topics → ExtractNewRecordState → JdbcSink
(upsert, deletes by key), on real ensemble and worker processes and a real PostgreSQL
with ``wal_level=logical``.

Random inserts, updates, deletes and primary-key updates run on two source tables from
before the snapshot until after a worker was killed with ``kill -9``; at the end each
target table equals its source, row for row.
"""

from __future__ import annotations

import random
import threading

import psycopg
import pytest

from tests.e2e.test_pipeline import Cluster
from tests.fixtures.postgres import (
    SUPERUSER,
    SUPERUSER_PASSWORD,
    PostgresServer,
    logical_database,
    logical_postgres,
)
from tests.harness import wait_until

__all__ = ["logical_database", "logical_postgres"]

pytestmark = [pytest.mark.integration, pytest.mark.spark]

SOURCE = "herder.connectors.cdc.PostgresCdcSourceConnector"
SINK = "herder.connectors.jdbc.JdbcSinkConnector"
UNWRAP = "herder.connectors.cdc.unwrap.ExtractNewRecordState"
TABLES = {
    "accounts": "id integer PRIMARY KEY, owner text, balance numeric(12,2), opened date",
    "events": "id bigint PRIMARY KEY, kind text, at timestamp, amount double precision",
}
COLUMNS = {"accounts": "id, owner, balance, opened", "events": "id, kind, at, amount"}


def dbname(url: str) -> str:
    return url.rsplit("/", 1)[1]


class Writer:
    """Random changes to the source tables on a thread, one small transaction each."""

    def __init__(self, server: PostgresServer, db: str, seed: int) -> None:
        self.conn = psycopg.connect(server.dsn(db), autocommit=True)
        self.random = random.Random(seed)
        self.next_id = 100_000
        self.stop = threading.Event()
        self.count = 0
        self.thread = threading.Thread(target=self._run, name="cdc-writer", daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            table = self.random.choice(list(TABLES))
            choice = self.random.random()
            ids = f"(SELECT id FROM {table} ORDER BY random() LIMIT 1)"
            with self.conn.transaction():
                if choice < 0.35:
                    self.next_id += 1
                    if table == "accounts":
                        self.conn.execute(
                            "INSERT INTO accounts VALUES (%s, %s, %s, DATE '2024-01-01' + %s)",
                            (self.next_id, f"o{self.next_id}", self.next_id / 7, self.count % 300),
                        )
                    else:
                        self.conn.execute(
                            "INSERT INTO events VALUES (%s, 'new', now()::timestamp, %s)",
                            (self.next_id, self.random.random()),
                        )
                elif choice < 0.7:
                    column = "balance = balance + 1" if table == "accounts" else "kind = 'upd'"
                    self.conn.execute(f"UPDATE {table} SET {column} WHERE id = {ids}")
                elif choice < 0.85:
                    self.conn.execute(f"DELETE FROM {table} WHERE id = {ids}")
                else:
                    self.next_id += 1
                    self.conn.execute(f"UPDATE {table} SET id = {self.next_id} WHERE id = {ids}")
            self.count += 1
            self.stop.wait(0.02)

    def __enter__(self) -> Writer:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.thread.join(timeout=30)
        self.conn.close()


def differences(server: PostgresServer, db: str, table: str) -> int:
    columns = COLUMNS[table]
    source, target = f"public.{table}", f'"pg.public".{table}'
    rows = server.execute(
        f"SELECT count(*) FROM ((SELECT {columns} FROM {source} EXCEPT SELECT {columns}"
        f" FROM {target}) UNION ALL (SELECT {columns} FROM {target} EXCEPT"
        f" SELECT {columns} FROM {source})) d",
        db,
    )
    return int(rows[0][0])  # type: ignore[call-overload]


def sample_differences(server: PostgresServer, db: str) -> str:
    """Some rows each side has and the other has not, to say how a replica differs."""
    lines = []
    for table, columns in COLUMNS.items():
        source, target = f"public.{table}", f'"pg.public".{table}'
        for a, b in ((source, target), (target, source)):
            rows = server.execute(
                f"SELECT {columns} FROM {a} EXCEPT SELECT {columns} FROM {b} ORDER BY 1 LIMIT 5",
                db,
            )
            lines.append(f"in {a}, not in {b}: {rows}")
    return "\n".join(lines)


def target_exists(server: PostgresServer, db: str) -> bool:
    rows = server.execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'pg.public'", db)
    return rows[0][0] == len(TABLES)


def failed(cluster: Cluster, name: str) -> None:
    for task in cluster.status(name).get("tasks", []):
        if task["state"] == "FAILED":
            raise AssertionError(f"task of {name} failed:\n{task.get('trace')}")


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_a_replica_equals_its_source_after_random_changes_and_a_kill_9(
    cluster: Cluster, logical_postgres: PostgresServer, logical_database: str
) -> None:
    db = dbname(logical_database)
    for table, columns in TABLES.items():
        logical_postgres.execute(f"CREATE TABLE {table} ({columns})", db)
    logical_postgres.execute(
        "INSERT INTO accounts SELECT i, 'o' || i, i / 3.0, DATE '2020-01-01' + i % 900"
        " FROM generate_series(1, 2000) i;"
        "INSERT INTO events SELECT i, 'old', TIMESTAMP '2024-01-01' + i * INTERVAL '1 minute',"
        " i / 7.0 FROM generate_series(1, 2000) i;"
        'CREATE SCHEMA "pg.public"',
        db,
    )
    worker = cluster.start_worker()
    with Writer(logical_postgres, db, seed=27) as writer:
        cluster.create(
            "capture",
            {"connector.class": SOURCE, "database.hostname": "127.0.0.1",
             "database.port": str(logical_postgres.port), "database.user": SUPERUSER,
             "database.password": SUPERUSER_PASSWORD, "database.dbname": db,
             "topic.prefix": "pg", "table.include.list": r"public\.(accounts|events)",
             "publication.autocreate.mode": "filtered", "slot.name": "replica",
             "snapshot.chunk.rows": "1200", "snapshot.split.rows": "600",
             "poll.interval.ms": "100"},
        )  # fmt: skip
        cluster.create(
            "replica",
            {"connector.class": SINK, "topics": "pg.public.accounts,pg.public.events",
             "connection.url": logical_postgres.jdbc_url(db), "connection.user": SUPERUSER,
             "connection.password": SUPERUSER_PASSWORD, "insert.mode": "upsert",
             "pk.mode": "record_key", "delete.enabled": "true", "auto.create": "true",
             "auto.evolve": "true", "transforms": "unwrap", "transforms.unwrap.type": UNWRAP,
             "transforms.unwrap.delete.handling.mode": "none",
             "transforms.unwrap.drop.tombstones": "false"},
        )  # fmt: skip

        def replicating() -> bool:
            failed(cluster, "capture")
            failed(cluster, "replica")
            return target_exists(logical_postgres, db)

        wait_until(replicating, timeout=400, interval=0.5, what="the replica tables")
        cluster.kill9(worker)
        cluster.start_worker()
        started = writer.count

        def written_on() -> bool:
            failed(cluster, "capture")
            return writer.count >= started + 200

        wait_until(written_on, timeout=300, interval=0.2, what="changes after the restart")

    def caught_up() -> bool:
        failed(cluster, "capture")
        failed(cluster, "replica")
        return target_exists(logical_postgres, db) and all(
            differences(logical_postgres, db, t) == 0 for t in TABLES
        )

    try:
        wait_until(caught_up, timeout=600, interval=1, what="the replica to equal its source")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{sample_differences(logical_postgres, db)}") from None
    for table in TABLES:
        assert differences(logical_postgres, db, table) == 0
        count = logical_postgres.execute(f"SELECT count(*) FROM {table}", db)[0][0]
        assert count > 1000
