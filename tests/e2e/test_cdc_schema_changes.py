"""Schema changes through change data capture, end to end: a column added, one dropped
and one widened from integer to bigint in the middle of the stream reach a PostgreSQL
target through ExtractNewRecordState → JdbcSink (``auto.evolve``) and a Parquet
directory through ExtractNewRecordState → DirectorySink, on real ensemble and worker
processes and a real PostgreSQL with ``wal_level=logical``.

The target table gains the new column (NULL in the rows written before it) and the
wider type; it keeps the dropped column, as JDBC sinks do (NULL in the rows written
after the drop). The Parquet files written after the change have the new column and the
wider type, and not the dropped column. (ExtractNewRecordState gives each row with its
schema, JsonConverter's envelope: ``value.converter.schemas.enable=true`` has
DirectorySink write the types that schema gives.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.e2e.test_cdc_pipeline import (
    UNWRAP,
    Table,
    capture_config,
    dbname,
    failed,
    replica_config,
)
from tests.e2e.test_pipeline import Cluster
from tests.fixtures.postgres import PostgresServer, logical_database, logical_postgres
from tests.harness import wait_until

__all__ = ["logical_database", "logical_postgres"]

pytestmark = [pytest.mark.integration, pytest.mark.spark]

SHIFTING = Table(
    "shifting",
    "id integer PRIMARY KEY, n integer, gone text",
    "id, n, gone",
    "INSERT INTO shifting SELECT i, i * 10, 'g' || i FROM generate_series(1, {n}) i",
    "",
    "",
)
BIG = 5_000_000_000


def column_types(server: PostgresServer, db: str, table: str) -> dict[str, str]:
    rows = server.execute(
        "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute"
        f" WHERE attrelid = '{table}'::regclass AND attnum > 0 AND NOT attisdropped",
        db,
    )
    return {str(name): str(kind) for name, kind in rows}


def parquet_files(directory: Path) -> list[pa.Table]:
    """The sink's files, in offset order (their names end in the base offset)."""
    if not directory.exists():
        return []
    files = sorted(directory.glob("*.parquet"), key=lambda p: int(p.stem.rsplit("+", 1)[1]))
    return [pq.read_table(p) for p in files]


@pytest.mark.timeout(600)
def test_columns_added_dropped_and_widened_mid_stream_reach_the_target_and_parquet(
    cluster: Cluster, logical_postgres: PostgresServer, logical_database: str, tmp_path: Path
) -> None:
    db = dbname(logical_database)
    logical_postgres.execute(f"CREATE TABLE shifting ({SHIFTING.ddl})", db)
    logical_postgres.execute(SHIFTING.fill.format(n=20), db)
    logical_postgres.execute('CREATE SCHEMA "pg.public"', db)
    outbox = tmp_path / "parquet"
    cluster.start_worker()
    cluster.create("capture", capture_config(logical_postgres, db, [SHIFTING]))
    cluster.create("replica", replica_config(logical_postgres, db, [SHIFTING]))
    cluster.create(
        "files",
        {"connector.class": "DirectorySink", "directory": str(outbox), "format": "parquet",
         "topics": "pg.public.shifting", "transforms": "unwrap",
         "transforms.unwrap.type": UNWRAP, "value.converter.schemas.enable": "true"},
    )  # fmt: skip
    target = '"pg.public".shifting'

    def rows_of_target() -> list[tuple[Any, ...]]:
        for name in ("capture", "replica", "files"):
            failed(cluster, name)
        if not logical_postgres.execute(f"SELECT to_regclass('{target}') IS NOT NULL", db)[0][0]:
            return []
        return logical_postgres.execute(f"SELECT * FROM {target} ORDER BY id", db)

    def parquet_rows() -> int:
        return sum(t.num_rows for t in parquet_files(outbox))

    wait_until(lambda: len(rows_of_target()) == 20 and parquet_rows() == 20, timeout=300,
               interval=0.5, what="the snapshot in the target and the files")  # fmt: skip
    assert column_types(logical_postgres, db, target) == {
        "id": "integer",
        "n": "integer",
        "gone": "text",
    }

    logical_postgres.execute(
        "ALTER TABLE shifting ADD COLUMN added text;"
        " ALTER TABLE shifting DROP COLUMN gone;"
        " ALTER TABLE shifting ALTER COLUMN n TYPE bigint;"
        f" INSERT INTO shifting SELECT i, {BIG} + i, 'a' || i FROM generate_series(21, 25) i;"
        " UPDATE shifting SET added = 'later', n = n + 1 WHERE id = 1",
        db,
    )
    wait_until(lambda: len(rows_of_target()) == 25 and parquet_rows() == 26, timeout=300,
               interval=0.5, what="the changes after the ALTERs")  # fmt: skip

    assert column_types(logical_postgres, db, target) == {
        "id": "integer",
        "n": "bigint",
        "gone": "text",
        "added": "text",
    }
    rows = {
        r[0]: r for r in logical_postgres.execute(f"SELECT id, n, gone, added FROM {target}", db)
    }
    assert rows[1] == (1, 11, "g1", "later")  # gone: as it was before the drop
    assert rows[2] == (2, 20, "g2", None)  # written before the column was added
    assert rows[21] == (21, BIG + 21, None, "a21")  # written after the drop
    source = logical_postgres.execute("SELECT id, n, added FROM shifting ORDER BY id", db)
    assert logical_postgres.execute(f"SELECT id, n, added FROM {target} ORDER BY id", db) == source

    files = parquet_files(outbox)
    first, last = files[0], files[-1]
    assert first.schema.field("n").type == pa.int32()
    assert "gone" in first.schema.names and "added" not in first.schema.names
    assert last.schema.field("n").type == pa.int64()
    assert last.schema.field("added").type == pa.string()
    assert "gone" not in last.schema.names
    written = pa.concat_tables(
        t.select(["id", "n", "added"]) for t in files if "added" in t.schema.names
    ).to_pylist()
    assert {"id": 21, "n": BIG + 21, "added": "a21"} in written
    assert {"id": 1, "n": 11, "added": "later"} in written
