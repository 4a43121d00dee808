"""PostgresCdcSource's setup and operations against real PostgreSQL servers: each bad
input gives one clear error saying what to do; the publication per
``publication.autocreate.mode``; schema changes reach later events; a dropped table
stops nothing; ``slot.drop.on.stop``."""

from __future__ import annotations

from typing import Any

import pytest

from herder.connect import SourceBatch
from herder.connectors.cdc import PostgresCdcSourceConnector
from herder.connectors.cdc.slot import SetupError
from herder.dataplane import SparkRuntime
from tests.connectors.cdc import cdc_config, cdc_task, dbname, events_of
from tests.connectors.jdbc import Offsets
from tests.fixtures.postgres import PostgresServer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def slots(server: PostgresServer, url: str) -> list[Any]:
    return [r[0] for r in server.execute("SELECT slot_name FROM pg_replication_slots", dbname(url))]


def test_wal_level_not_logical_says_how_to_change_it(
    postgres: PostgresServer, database: str
) -> None:
    config = cdc_config(postgres, database)
    with pytest.raises(SetupError, match=r"wal_level is 'replica'.*ALTER SYSTEM SET wal_level"):
        cdc_task(config, Offsets())
    results = PostgresCdcSourceConnector().validate(config)
    assert "ALTER SYSTEM SET wal_level = logical" in results["database.hostname"].errors[0]


def test_a_user_without_replication_is_told_which_privilege(
    logical_postgres: PostgresServer, logical_database: str
) -> None:
    logical_postgres.execute(
        "DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'reader') THEN"
        " CREATE ROLE reader LOGIN PASSWORD 'pw'; END IF; END $$"
    )
    config = {
        **cdc_config(logical_postgres, logical_database),
        "database.user": "reader",
        "database.password": "pw",
    }
    with pytest.raises(SetupError, match=r"'reader' lacks the REPLICATION privilege.*ALTER ROLE"):
        cdc_task(config, Offsets())
    assert "REPLICATION" in PostgresCdcSourceConnector().validate(config)["database.user"].errors[0]


def test_publication_autocreate_modes(
    logical_postgres: PostgresServer, logical_database: str
) -> None:
    db = dbname(logical_database)
    logical_postgres.execute("CREATE TABLE a (id integer PRIMARY KEY); CREATE TABLE b (id int)", db)
    disabled = cdc_config(
        logical_postgres, logical_database, publication_autocreate_mode="disabled",
        publication_name="pub",
    )  # fmt: skip
    with pytest.raises(SetupError, match=r"publication 'pub' does not exist.*CREATE PUBLICATION"):
        cdc_task(disabled, Offsets())
    filtered = {
        **disabled,
        "publication.autocreate.mode": "filtered",
        "table.include.list": r"public\.a",
        "snapshot.mode": "no_data",
    }
    cdc_task(filtered, Offsets()).stop()
    published = logical_postgres.execute(
        "SELECT tablename FROM pg_publication_tables WHERE pubname = 'pub'", db
    )
    assert published == [("a",)]
    # now it exists: disabled takes it as it is
    cdc_task({**filtered, "publication.autocreate.mode": "disabled"}, Offsets()).stop()


def test_a_lost_slot_is_an_error_and_slot_drop_on_stop_drops_it(
    logical_postgres: PostgresServer, logical_database: str
) -> None:
    config = cdc_config(
        logical_postgres, logical_database, snapshot_mode="never", slot_drop_on_stop="true"
    )
    offsets = Offsets()
    offsets.committed[repr(sorted({"server": "pg"}.items()))] = {"lsn": 1}
    with pytest.raises(SetupError, match=r"replication slot .* is gone.*delete and create"):
        cdc_task(config, offsets)
    task = cdc_task(config, Offsets())
    assert config["slot.name"] in slots(logical_postgres, logical_database)
    task.stop()
    assert config["slot.name"] not in slots(logical_postgres, logical_database)


@pytest.mark.spark
def test_added_dropped_and_widened_columns_reach_later_events(
    spark: SparkRuntime, logical_postgres: PostgresServer, logical_database: str
) -> None:
    import time

    db = dbname(logical_database)
    logical_postgres.execute(
        "CREATE TABLE t (id integer PRIMARY KEY, n integer, gone text);"
        "CREATE TABLE doomed (id integer PRIMARY KEY)",
        db,
    )
    offsets = Offsets()
    config = cdc_config(logical_postgres, logical_database, snapshot_mode="no_data")
    task = cdc_task(config, offsets)

    def next_batch() -> SourceBatch:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            batch = task.poll()
            if batch is not None:
                offsets.commit(batch)
                task.commit()
                return batch
        raise AssertionError("no batch")

    def after_fields(batch: SourceBatch) -> list[tuple[str, str]]:
        after = batch.data.schema["value"].dataType["after"].dataType
        return [(f.name, f.dataType.simpleString()) for f in after.fields]

    try:
        logical_postgres.execute(
            "INSERT INTO t VALUES (1, 1, 'x');"
            "ALTER TABLE t ADD COLUMN added text; ALTER TABLE t DROP COLUMN gone;"
            "ALTER TABLE t ALTER COLUMN n TYPE bigint;"
            "INSERT INTO t VALUES (2, 5000000000, 'new');"
            "DROP TABLE doomed;",
            db,
        )
        # one transaction, two shapes of the table: a batch (of one type) for each
        batches = [next_batch()]
        while sum(len(events_of(b)) for b in batches) < 2:
            batches.append(next_batch())
        assert [b.topic for b in batches] == ["pg.public.t", "pg.public.t"]
        assert [after_fields(b) for b in batches] == [
            [("id", "int"), ("n", "int"), ("gone", "string")],
            [("id", "int"), ("n", "bigint"), ("added", "string")],
        ]
        # the first commits half the transaction: the stream's position stays before it
        (first,) = [offset for _, offset in batches[0].offsets]
        (second,) = [offset for _, offset in batches[1].offsets]
        assert first["batch_runs"] == 1 and first["batch_upto"] == second["lsn"] > first["lsn"]
        assert "batch_upto" not in second
        rows = [v["after"] for b in batches for _, _, v in events_of(b) if v]
        assert rows[-1] == {"id": 2, "n": 5_000_000_000, "added": "new"}
        # the stream goes on after a captured table was dropped
        logical_postgres.execute("INSERT INTO t VALUES (3, 3, 'three')", db)
        assert [v["after"]["id"] for _, _, v in events_of(next_batch()) if v] == [3]
    finally:
        task.stop()
