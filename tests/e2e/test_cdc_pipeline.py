"""PostgreSQL → PostgreSQL in two connector configs: PostgresCdcSource (an initial
snapshot in chunks, then the stream) → topics → ExtractNewRecordState → JdbcSink
(upsert, deletes by key), on real ensemble and worker processes and a real PostgreSQL
with ``wal_level=logical``.

* Random inserts, updates, deletes and primary-key updates run on the source tables
  (integer, bigint and text primary keys) on two workers; the worker running the
  capture task is killed with ``kill -9`` twice, once in the middle of the snapshot and
  once while it streams, and its task moves to the other worker each time. At the end
  each target table equals its source, row for row. (Two tables of 300 rows in the
  default suite, three of 600 in the ``slow`` one, and there also two tables on one
  worker, killed once and restarted.)
* Rows changed while their table is being snapshotted — before their chunk is read,
  and after — end up right in the target: the committed source offsets show the
  snapshot still in progress after the changes were made.
"""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass
from typing import Any

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


@dataclass(frozen=True)
class Table:
    """A source table, its first rows, and the random changes a :class:`Writer` makes."""

    name: str
    ddl: str
    columns: str
    #: SQL filling the table with ``n`` rows, keys 1..n (``{n}`` replaced)
    fill: str
    #: an INSERT with one parameter: the new row's number
    insert: str
    #: what an update sets
    update: str
    #: the new primary key of a row whose key changes (one parameter: a new number)
    new_key: str = "%s"


ACCOUNTS = Table(
    "accounts",
    "id integer PRIMARY KEY, owner text, balance numeric(12,2), opened date",
    "id, owner, balance, opened",
    "INSERT INTO accounts SELECT i, 'o' || i, i / 3.0, DATE '2020-01-01' + i % 900"
    " FROM generate_series(1, {n}) i",
    "INSERT INTO accounts VALUES (%(n)s::int, 'o' || %(n)s::int, %(n)s::int / 7.0,"
    " DATE '2024-01-01' + %(n)s::int %% 300)",
    "balance = balance + 1",
)
EVENTS = Table(
    "events",
    "id bigint PRIMARY KEY, kind text, at timestamp, amount double precision",
    "id, kind, at, amount",
    "INSERT INTO events SELECT i, 'old', TIMESTAMP '2024-01-01' + i * INTERVAL '1 minute',"
    " i / 7.0 FROM generate_series(1, {n}) i",
    "INSERT INTO events VALUES (%(n)s::bigint, 'new', now()::timestamp, %(n)s::bigint / 11.0)",
    "kind = 'upd', amount = amount * 2",
)
ITEMS = Table(
    "items",
    "sku text PRIMARY KEY, qty integer, price numeric(10,2), note text",
    "sku, qty, price, note",
    "INSERT INTO items SELECT 'k' || i, i % 50, i / 4.0, CASE WHEN i % 5 = 0 THEN NULL"
    " ELSE 'note ' || i END FROM generate_series(1, {n}) i",
    "INSERT INTO items VALUES ('k' || %(n)s::int, 1, %(n)s::int / 9.0, 'fresh')",
    "qty = qty + 1, note = NULL",
    "'k' || %s",
)


def dbname(url: str) -> str:
    return url.rsplit("/", 1)[1]


def key_of(table: Table) -> str:
    return table.columns.split(",", 1)[0]


class Writer:
    """Random changes to the source tables on a thread, one small transaction each:
    inserts, updates, deletes and primary-key updates."""

    KINDS = ("insert", "update", "delete", "key")

    def __init__(
        self, server: PostgresServer, db: str, tables: list[Table], seed: int, pause: float = 0.02
    ) -> None:
        self.conn = psycopg.connect(server.dsn(db), autocommit=True)
        self.tables = tables
        self.random = random.Random(seed)
        self.pause = pause
        self.next_id = 100_000
        self.stop = threading.Event()
        self.count = 0
        self.made = dict.fromkeys(self.KINDS, 0)
        self.thread = threading.Thread(target=self._run, name="cdc-writer", daemon=True)

    def change(self) -> tuple[Table, str, Any]:
        """One random change; the table, what it was, and the key it touched (None if
        the table had no row to change)."""
        table = self.random.choice(self.tables)
        choice = self.random.random()
        key = key_of(table)
        # the row to change: a random one (random(): the server's, not this seed's)
        pick = f"(SELECT {key} FROM {table.name} ORDER BY random() LIMIT 1)"
        with self.conn.transaction():
            if choice < 0.35:
                kind = "insert"
                self.next_id += 1
                self.conn.execute(table.insert, {"n": self.next_id})  # type: ignore[arg-type]
                touched: Any = self.next_id
            else:
                if choice < 0.7:
                    kind, sql = "update", f"UPDATE {table.name} SET {table.update}"
                elif choice < 0.85:
                    kind, sql = "delete", f"DELETE FROM {table.name}"
                else:
                    kind = "key"
                    self.next_id += 1
                    new_key = table.new_key.replace("%s", str(self.next_id))
                    sql = f"UPDATE {table.name} SET {key} = {new_key}"
                cursor = self.conn.execute(
                    f"{sql} WHERE {key} = {pick} RETURNING {key}"  # type: ignore[arg-type]
                )
                row = cursor.fetchone()
                touched = row[0] if row else None
        self.count += 1
        self.made[kind] += 1
        return table, kind, touched

    def _run(self) -> None:
        while not self.stop.is_set():
            self.change()
            self.stop.wait(self.pause)

    def __enter__(self) -> Writer:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.thread.join(timeout=30)
        self.conn.close()


def create_tables(server: PostgresServer, db: str, tables: list[Table], rows: int) -> None:
    for table in tables:
        server.execute(f"CREATE TABLE {table.name} ({table.ddl})", db)
        server.execute(table.fill.format(n=rows), db)
    server.execute('CREATE SCHEMA "pg.public"', db)


def capture_config(
    server: PostgresServer, db: str, tables: list[Table], **extra: str
) -> dict[str, str]:
    names = "|".join(t.name for t in tables)
    return {
        "connector.class": SOURCE, "database.hostname": "127.0.0.1",
        "database.port": str(server.port), "database.user": SUPERUSER,
        "database.password": SUPERUSER_PASSWORD, "database.dbname": db, "topic.prefix": "pg",
        "table.include.list": rf"public\.({names})", "publication.autocreate.mode": "filtered",
        # slots are the server's, not the database's: one per test's database
        "slot.name": f"s_{db}"[:63], "poll.interval.ms": "100",
        **{k.replace("_", "."): v for k, v in extra.items()},
    }  # fmt: skip


def replica_config(server: PostgresServer, db: str, tables: list[Table]) -> dict[str, str]:
    return {
        "connector.class": SINK, "topics": ",".join(f"pg.public.{t.name}" for t in tables),
        "connection.url": server.jdbc_url(db), "connection.user": SUPERUSER,
        "connection.password": SUPERUSER_PASSWORD, "insert.mode": "upsert",
        "pk.mode": "record_key", "delete.enabled": "true", "auto.create": "true",
        "auto.evolve": "true", "transforms": "unwrap", "transforms.unwrap.type": UNWRAP,
        "transforms.unwrap.delete.handling.mode": "none",
        "transforms.unwrap.drop.tombstones": "false",
    }  # fmt: skip


def differences(server: PostgresServer, db: str, table: Table) -> int:
    columns = table.columns
    source, target = f"public.{table.name}", f'"pg.public".{table.name}'
    rows = server.execute(
        f"SELECT count(*) FROM ((SELECT {columns} FROM {source} EXCEPT SELECT {columns}"
        f" FROM {target}) UNION ALL (SELECT {columns} FROM {target} EXCEPT"
        f" SELECT {columns} FROM {source})) d",
        db,
    )
    return int(rows[0][0])  # type: ignore[call-overload]


def sample_differences(server: PostgresServer, db: str, tables: list[Table]) -> str:
    """Some rows each side has and the other has not, to say how a replica differs."""
    lines = []
    for table in tables:
        source, target = f"public.{table.name}", f'"pg.public".{table.name}'
        for a, b in ((source, target), (target, source)):
            rows = server.execute(
                f"SELECT {table.columns} FROM {a} EXCEPT SELECT {table.columns} FROM {b}"
                " ORDER BY 1 LIMIT 5",
                db,
            )
            lines.append(f"in {a}, not in {b}: {rows}")
    return "\n".join(lines)


def targets_exist(server: PostgresServer, db: str, tables: list[Table]) -> bool:
    rows = server.execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'pg.public'", db)
    return rows[0][0] == len(tables)


def failed(cluster: Cluster, name: str) -> None:
    for task in cluster.status(name).get("tasks", []):
        if task["state"] == "FAILED":
            raise AssertionError(f"task of {name} failed:\n{task.get('trace')}")


def source_offset(cluster: Cluster, name: str) -> dict[str, Any] | None:
    """The source connector's committed offset (``GET /connectors/<name>/offsets``)."""
    reply = cluster.http.get(f"{cluster.answering().url}/connectors/{name}/offsets", timeout=10)
    assert reply.status_code == 200, reply.text
    offsets = reply.json()["offsets"]
    return offsets[0]["offset"] if offsets else None


def snapshotting(offset: dict[str, Any] | None) -> bool:
    """Whether a committed CDC offset is in the middle of a snapshot: some chunk is
    committed, some table is left."""
    return offset is not None and bool(offset.get("snapshot_tables"))


def wait_until_equal(server: PostgresServer, db: str, tables: list[Table], cluster: Cluster,
                     timeout: float = 300) -> None:  # fmt: skip
    """Until each target table equals its source (failing at once if a task failed)."""

    def caught_up() -> bool:
        failed(cluster, "capture")
        failed(cluster, "replica")
        return targets_exist(server, db, tables) and all(
            differences(server, db, t) == 0 for t in tables
        )

    try:
        wait_until(caught_up, timeout=timeout, interval=1, what="the replica to equal its source")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{sample_differences(server, db, tables)}") from None


@pytest.mark.timeout(1200)
@pytest.mark.parametrize(
    ("tables", "rows"),
    [
        pytest.param([ACCOUNTS, ITEMS], 300, id="short"),
        pytest.param([ACCOUNTS, EVENTS, ITEMS], 600, id="full", marks=pytest.mark.slow),
    ],
)
def test_replica_equals_source_after_two_kill_9s(
    cluster: Cluster,
    logical_postgres: PostgresServer,
    logical_database: str,
    tables: list[Table],
    rows: int,
) -> None:
    """The worker running the capture task is killed in the middle of the snapshot, and
    again while it streams; the task moves to the other worker each time."""
    db = dbname(logical_database)
    create_tables(logical_postgres, db, tables, rows=rows)
    cluster.start_worker()
    cluster.start_worker()
    # (a snapshot reads rows inserted past its end too: a writer that inserts faster than
    # a loaded machine reads chunks would keep it from ending)
    with Writer(logical_postgres, db, tables, seed=27, pause=0.1) as writer:
        cluster.create(
            "capture",
            capture_config(logical_postgres, db, tables, snapshot_chunk_rows="300",
                           snapshot_split_rows="300"),
        )  # fmt: skip
        cluster.create("replica", replica_config(logical_postgres, db, tables))

        def capture_owner_mid_snapshot() -> Any:
            failed(cluster, "replica")
            owner = cluster.task_owner("capture")
            return owner if owner and snapshotting(source_offset(cluster, "capture")) else None

        # the first kill: the capture task's worker, some chunks of the snapshot committed
        owner = wait_until(capture_owner_mid_snapshot, timeout=300, interval=0.1,
                           what="a snapshot under way")  # fmt: skip
        cluster.kill9(owner)  # type: ignore[arg-type]
        assert snapshotting(source_offset(cluster, "capture")), "killed after the snapshot"
        cluster.start_worker()

        def streaming_owner() -> Any:
            failed(cluster, "replica")
            offset = source_offset(cluster, "capture")
            owner = cluster.task_owner("capture")
            return owner if offset is not None and not snapshotting(offset) else None

        # the second kill: once the snapshot is done, while the stream is committed
        owner = wait_until(streaming_owner, timeout=600, interval=0.2, what="the stream")
        streamed_from = source_offset(cluster, "capture")
        before = writer.count

        def streamed() -> bool:
            moved = source_offset(cluster, "capture") != streamed_from
            return moved and writer.count >= before + 100

        wait_until(streamed, timeout=120, interval=0.2, what="changes streamed")
        owner = cluster.task_owner("capture") or owner
        cluster.kill9(owner)  # type: ignore[arg-type]
        cluster.start_worker()
        after_kill = writer.count
        wait_until(lambda: writer.count >= after_kill + 100, timeout=120,
                   what="changes after the second kill")  # fmt: skip
    assert all(writer.made[kind] > 10 for kind in Writer.KINDS), writer.made
    wait_until_equal(logical_postgres, db, tables, cluster)
    for table in tables:
        assert differences(logical_postgres, db, table) == 0
        count = logical_postgres.execute(f"SELECT count(*) FROM {table.name}", db)[0][0]
        assert count > rows * 2 // 3  # type: ignore[operator]


@pytest.mark.timeout(400)
def test_rows_changed_while_their_table_is_snapshotted_end_up_right_in_the_target(
    cluster: Cluster, logical_postgres: PostgresServer, logical_database: str
) -> None:
    tables = [ACCOUNTS]
    db = dbname(logical_database)
    create_tables(logical_postgres, db, tables, rows=800)
    cluster.start_worker()
    cluster.create(
        "capture",
        capture_config(logical_postgres, db, tables, snapshot_chunk_rows="200",
                       snapshot_split_rows="100"),
    )  # fmt: skip
    cluster.create("replica", replica_config(logical_postgres, db, tables))

    def first_chunk() -> dict[str, Any] | None:
        failed(cluster, "capture")
        offset = source_offset(cluster, "capture")
        return offset if snapshotting(offset) else None

    wait_until(first_chunk, timeout=300, interval=0.1, what="the snapshot's first chunk")
    writer = Writer(logical_postgres, db, tables, seed=28, pause=0.05)
    # each change, then where the committed snapshot was once it was made: a change to
    # a key past the last chunk read is read with its chunk, later. (Some hundred
    # changes at most: the snapshot reads rows inserted past its end too, so a writer
    # faster than a loaded machine's chunks would keep it going.)
    ahead = behind = 0
    try:
        while writer.count < 300:
            _, kind, key = writer.change()
            writer.stop.wait(writer.pause)
            offset = source_offset(cluster, "capture")
            if not snapshotting(offset):
                break
            assert offset is not None
            if key is not None and kind in ("update", "delete"):
                if int(key) > int(offset["snapshot_after"]):
                    ahead += 1
                else:
                    behind += 1
    finally:
        writer.conn.close()
    # the snapshot went on for many changes, to rows read before them and after
    assert ahead >= 5 and behind >= 5, (ahead, behind)
    wait_until_equal(logical_postgres, db, tables, cluster)
    count = logical_postgres.execute("SELECT count(*) FROM accounts", db)[0][0]
    assert count > 600  # type: ignore[operator]
    # the chunks went the runtime's short way: written by the executors with pyarrow,
    # each event's key and ``after`` in the files and the rest of its envelope kept once
    # in its segment; the stream's events, through Spark's writer, whole
    written = file_kinds(cluster, "pg.public.accounts")
    assert ("parquet-cpp-arrow", ("after",)) in written, written
    assert ("parquet-mr", ("before", "after", "source", "op", "ts_ms")) in written, written


def file_kinds(cluster: Cluster, topic: str) -> set[tuple[str, tuple[str, ...]]]:
    """(the writer, the value's fields) of each Parquet file of ``topic``."""
    import pyarrow.parquet as pq

    kinds = set()
    for path in cluster.storage.glob(f"_staging/*/*/topic={topic}/partition=*/*.parquet"):
        meta = pq.read_metadata(path)
        fields = tuple(f.name for f in meta.schema.to_arrow_schema().field("value").type)
        kinds.add((meta.created_by.split(" ")[0], fields))
    return kinds


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_a_replica_equals_its_source_after_random_changes_and_a_kill_9(
    cluster: Cluster, logical_postgres: PostgresServer, logical_database: str
) -> None:
    tables = [ACCOUNTS, EVENTS]
    db = dbname(logical_database)
    create_tables(logical_postgres, db, tables, rows=2000)
    worker = cluster.start_worker()
    with Writer(logical_postgres, db, tables, seed=27) as writer:
        cluster.create(
            "capture",
            capture_config(logical_postgres, db, tables, snapshot_chunk_rows="1200",
                           snapshot_split_rows="600"),
        )  # fmt: skip
        cluster.create("replica", replica_config(logical_postgres, db, tables))

        def replicating() -> bool:
            failed(cluster, "capture")
            failed(cluster, "replica")
            return targets_exist(logical_postgres, db, tables)

        wait_until(replicating, timeout=400, interval=0.5, what="the replica tables")
        cluster.kill9(worker)
        cluster.start_worker()
        started = writer.count

        def written_on() -> bool:
            failed(cluster, "capture")
            return writer.count >= started + 200

        wait_until(written_on, timeout=300, interval=0.2, what="changes after the restart")

    wait_until_equal(logical_postgres, db, tables, cluster, timeout=600)
    for table in tables:
        assert differences(logical_postgres, db, table) == 0
        count = logical_postgres.execute(f"SELECT count(*) FROM {table.name}", db)[0][0]
        assert count > 1000  # type: ignore[operator]
