"""PostgresCdcSource in operation, against a real PostgreSQL: the lag it reports, what
each ``snapshot.mode`` emits, a table dropped while its changes wait in the slot or
while it is snapshotted, and a connection the server terminates mid-stream."""

from __future__ import annotations

import logging
import subprocess
import threading
import time
from typing import Any

import pytest

from herder.connectors.cdc import PostgresCdcSourceConnector, PostgresCdcSourceTask
from herder.connectors.jdbc.postgres import DatabaseError
from herder.dataplane import SparkRuntime
from tests.connectors.cdc import (
    Event,
    cdc_config,
    cdc_task,
    changes,
    dbname,
    poll_events,
    poll_until,
)
from tests.connectors.jdbc import Offsets
from tests.fixtures.postgres import PostgresServer
from tests.harness import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.timeout(300)]


def slot_exists(server: PostgresServer, url: str) -> bool:
    rows = server.execute(
        f"SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'herder_{dbname(url)[:40]}'",
        dbname(url),
    )
    return bool(rows[0][0])


def flushed_past_now(server: PostgresServer, url: str) -> None:
    """Wait until the server has flushed every WAL record written so far, so a reader
    of the slot could see all of it (the test server commits asynchronously)."""
    (insert,) = server.execute("SELECT pg_current_wal_insert_lsn()::text", dbname(url))[0]

    def flushed() -> bool:
        rows = server.execute(
            f"SELECT pg_current_wal_flush_lsn() >= '{insert}'::pg_lsn", dbname(url)
        )
        return bool(rows[0][0])

    wait_until(flushed, timeout=30, interval=0.05, what="the WAL flushed")


def ids(events: list[Event], op: str | None = None) -> list[int]:
    return [k["id"] for _, k, v in events if k and v and (op is None or v["op"] == op)]


def test_lag_counts_a_backlog_in_bytes_and_seconds_and_falls_once_it_is_taken(
    spark: SparkRuntime, logical_postgres: PostgresServer, logical_database: str
) -> None:
    db = dbname(logical_database)
    logical_postgres.execute("CREATE TABLE t (id integer PRIMARY KEY, note text)", db)
    offsets = Offsets()
    config = cdc_config(logical_postgres, logical_database, snapshot_mode="no_data")
    task = cdc_task(config, offsets)
    try:
        assert poll_events(task, offsets) == []
        for i in range(1, 21):
            logical_postgres.execute(f"INSERT INTO t VALUES ({i}, repeat('x', 500))", db)
        flushed_past_now(logical_postgres, logical_database)
        behind: dict[str, Any] = {}

        def measured_behind() -> bool:
            behind.update(task.lag() or {})
            return behind.get("seconds", 0) > 0

        wait_until(measured_behind, timeout=30, interval=0.05, what="a lag in seconds")
        assert behind["bytes"] > 20 * 500
        events = poll_until(task, offsets, 20)
        assert ids(events, "c") == list(range(1, 21))
        caught_up = task.lag()
        assert caught_up is not None
        assert caught_up["seconds"] == 0
        assert caught_up["bytes"] < behind["bytes"]
    finally:
        task.stop()


def test_initial_only_reads_the_rows_and_streams_nothing_with_no_slot(
    spark: SparkRuntime, logical_postgres: PostgresServer, logical_database: str
) -> None:
    db = dbname(logical_database)
    logical_postgres.execute(
        "CREATE TABLE stock (id integer PRIMARY KEY, qty integer);"
        "INSERT INTO stock SELECT i, i FROM generate_series(1, 2500) i",
        db,
    )
    offsets = Offsets()
    config = cdc_config(
        logical_postgres, logical_database, snapshot_mode="initial_only",
        snapshot_chunk_rows="1000", snapshot_split_rows="500",
    )  # fmt: skip
    task = cdc_task(config, offsets)
    try:
        assert not slot_exists(logical_postgres, logical_database)
        found = poll_events(task, offsets)
        # changes to rows read and not yet read, made between chunks
        logical_postgres.execute(
            "UPDATE stock SET qty = -1 WHERE id IN (10, 2000);"
            "DELETE FROM stock WHERE id = 1500;"
            "INSERT INTO stock VALUES (3000, 3000)",
            db,
        )
        flushed_past_now(logical_postgres, logical_database)
        while task.snapshot is not None:
            found += poll_events(task, offsets)
        logical_postgres.execute("INSERT INTO stock VALUES (4000, 4000)", db)
        flushed_past_now(logical_postgres, logical_database)
        for _ in range(5):
            assert task.poll() is None
    finally:
        task.stop()
    assert {v["op"] for _, _, v in found if v} == {"r"}
    rows = {v["after"]["id"]: v["after"]["qty"] for _, _, v in found if v}
    assert len(rows) == len(ids(found))  # each row once
    # 10 was read before its change, 2000 after it; 3000 came above the highest key
    # the table had when its snapshot began, as a row inserted after a snapshot's start
    # is not in Debezium's either
    expected = {i: i for i in range(1, 2501) if i != 1500} | {2000: -1}
    assert rows == expected
    assert not slot_exists(logical_postgres, logical_database)


def test_initial_only_needs_no_logical_wal_level(postgres: PostgresServer, database: str) -> None:
    # no slot, no publication: a server with wal_level=replica serves a one-off copy
    postgres.execute("CREATE TABLE t (id integer PRIMARY KEY)", dbname(database))
    config = cdc_config(postgres, database, snapshot_mode="initial_only")
    assert not any(v.errors for v in PostgresCdcSourceConnector().validate(config).values())
    task = cdc_task(config, Offsets())
    try:
        assert task.snapshot is not None and task.snapshot.tables == ("t",)
    finally:
        task.stop()


@pytest.mark.parametrize("mode", ["no_data", "never"])
def test_no_data_and_never_stream_without_reading_existing_rows(
    spark: SparkRuntime, logical_postgres: PostgresServer, logical_database: str, mode: str
) -> None:
    db = dbname(logical_database)
    logical_postgres.execute(
        "CREATE TABLE t (id integer PRIMARY KEY); INSERT INTO t SELECT generate_series(1, 50)",
        db,
    )
    offsets = Offsets()
    task = cdc_task(cdc_config(logical_postgres, logical_database, snapshot_mode=mode), offsets)
    try:
        assert task.snapshot is None
        logical_postgres.execute("INSERT INTO t VALUES (51); UPDATE t SET id = 52 WHERE id = 1", db)
        events = poll_until(task, offsets, 3)
    finally:
        task.stop()
    assert [(op, (b or {}).get("id"), (a or {}).get("id")) for op, b, a in changes(events)] == [
        ("c", None, 51),
        ("d", 1, None),
        ("c", None, 52),
    ]


def test_changes_of_a_table_dropped_while_they_wait_in_the_slot_still_come(
    spark: SparkRuntime, logical_postgres: PostgresServer, logical_database: str
) -> None:
    db = dbname(logical_database)
    logical_postgres.execute(
        "CREATE TABLE keep (id integer PRIMARY KEY); CREATE TABLE doomed (id integer PRIMARY KEY,"
        " note text)",
        db,
    )
    offsets = Offsets()
    task = cdc_task(
        cdc_config(logical_postgres, logical_database, snapshot_mode="no_data"), offsets
    )
    try:
        logical_postgres.execute(
            "INSERT INTO doomed VALUES (1, 'last words'); INSERT INTO keep VALUES (1);"
            "DROP TABLE doomed; INSERT INTO keep VALUES (2)",
            db,
        )
        events = poll_until(task, offsets, 3)
        assert [(t, k) for t, k, v in events if v] == [
            ("pg.public.doomed", {"id": 1}),
            ("pg.public.keep", {"id": 1}),
            ("pg.public.keep", {"id": 2}),
        ]
        assert changes(events)[0] == ("c", None, {"id": 1, "note": "last words"})
        logical_postgres.execute("INSERT INTO keep VALUES (3)", db)
        assert ids(poll_until(task, offsets, 1)) == [3]
    finally:
        task.stop()


def test_a_table_dropped_mid_snapshot_is_left_and_the_others_go_on(
    spark: SparkRuntime, logical_postgres: PostgresServer, logical_database: str
) -> None:
    db = dbname(logical_database)
    logical_postgres.execute(
        "CREATE TABLE a_big (id integer PRIMARY KEY); CREATE TABLE b_small (id integer"
        " PRIMARY KEY); INSERT INTO a_big SELECT generate_series(1, 2500);"
        "INSERT INTO b_small SELECT generate_series(1, 10)",
        db,
    )
    offsets = Offsets()
    config = cdc_config(
        logical_postgres, logical_database, snapshot_chunk_rows="1000", snapshot_split_rows="500"
    )
    task = cdc_task(config, offsets)
    try:
        first = poll_events(task, offsets)
        assert ids(first, "r") == list(range(1, 1001))
        logical_postgres.execute("DROP TABLE a_big", db)
        rest: list[Event] = []
        while task.snapshot is not None:
            rest += poll_events(task, offsets)
        assert {t for t, _, _ in rest} == {"pg.public.b_small"}
        assert sorted(ids(rest, "r")) == list(range(1, 11))
        logical_postgres.execute("INSERT INTO b_small VALUES (11)", db)
        assert ids(poll_until(task, offsets, 1), "c") == [11]
    finally:
        task.stop()


def terminate_others(server: PostgresServer, url: str) -> int:
    """End every other session on the test's database, as an operator or a failover
    would; how many there were."""
    rows = server.execute(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
        f" WHERE datname = '{dbname(url)}' AND pid <> pg_backend_pid()",
        dbname(url),
    )
    return int(rows[0][0])  # type: ignore[call-overload]


def test_a_terminated_connection_is_opened_again_and_a_restart_loses_and_repeats_nothing(
    spark: SparkRuntime, logical_postgres: PostgresServer, logical_database: str
) -> None:
    db = dbname(logical_database)
    logical_postgres.execute("CREATE TABLE t (id integer PRIMARY KEY)", db)
    offsets = Offsets()
    config = cdc_config(logical_postgres, logical_database, snapshot_mode="no_data")
    task: PostgresCdcSourceTask = cdc_task(config, offsets)
    delivered: list[int] = []
    try:
        for i in range(1, 6):
            logical_postgres.execute(f"INSERT INTO t VALUES ({i})", db)
        delivered += ids(poll_until(task, offsets, 5))
        assert terminate_others(logical_postgres, logical_database) >= 1
        for i in range(6, 11):
            logical_postgres.execute(f"INSERT INTO t VALUES ({i})", db)
        delivered += ids(poll_until(task, offsets, 5))
        # a batch read, then the connection ended and the task with it before the commit
        logical_postgres.execute("INSERT INTO t VALUES (11); INSERT INTO t VALUES (12)", db)
        flushed_past_now(logical_postgres, logical_database)
        deadline = time.monotonic() + 60
        lost = None
        while lost is None:
            assert time.monotonic() < deadline, "no batch"
            lost = task.poll()
        terminate_others(logical_postgres, logical_database)
    finally:
        task.stop()
    again = cdc_task(config, offsets)
    try:
        logical_postgres.execute("INSERT INTO t VALUES (13)", db)
        delivered += ids(poll_until(again, offsets, 3))
    finally:
        again.stop()
    assert delivered == list(range(1, 14))


def test_the_lag_measured_while_the_task_streams_never_takes_the_slot_from_it(
    spark: SparkRuntime, logical_postgres: PostgresServer, logical_database: str
) -> None:
    """The status endpoint measures the lag (a peek at the slot) whenever it is asked,
    from another thread, while the task peeks and confirms: a slot serves one session
    at a time, so they take turns rather than fail each other."""
    db = dbname(logical_database)
    logical_postgres.execute("CREATE TABLE t (id integer PRIMARY KEY, note text)", db)
    offsets = Offsets()
    config = cdc_config(logical_postgres, logical_database, snapshot_mode="no_data",
                        max_batch_size="40")  # fmt: skip
    task = cdc_task(config, offsets)
    measured: list[dict[str, Any]] = []
    failures: list[BaseException] = []
    done = threading.Event()

    def measure() -> None:
        while not done.is_set():
            try:
                measured.append(task.lag() or {})
            except BaseException as exc:
                failures.append(exc)
                return

    meter = threading.Thread(target=measure, daemon=True)
    try:
        assert poll_events(task, offsets) == []
        # a backlog of many small transactions keeps the slot ahead of its confirmed
        # position, so every measure peeks, and the task confirms batch after batch
        logical_postgres.execute(
            "DO $$ BEGIN FOR i IN 1..400 LOOP"
            " INSERT INTO t VALUES (i, repeat('x', 200)); COMMIT; END LOOP; END $$",
            db,
        )
        flushed_past_now(logical_postgres, logical_database)
        meter.start()
        events = poll_until(task, offsets, 400, timeout=120)
    finally:
        done.set()
        meter.join(timeout=30)
        task.stop()
    assert not failures, f"measuring the lag failed: {failures[0]!r}"
    assert ids(events, "c") == list(range(1, 401))
    assert any(m.get("bytes", 0) > 0 for m in measured), "no measure saw a backlog"


class ReleaseOnRetry(logging.Handler):
    """Ends the process holding the slot when the task logs that it will try again."""

    def __init__(self, holder: subprocess.Popen[bytes]) -> None:
        super().__init__()
        self.holder = holder
        self.retries = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "held by another session" in record.getMessage():
            self.retries += 1
            self.holder.terminate()


def test_a_slot_another_session_holds_is_waited_for_then_named(
    spark: SparkRuntime, logical_postgres: PostgresServer, logical_database: str
) -> None:
    """A slot held by another session (here pg_recvlogical; after a kill -9, the killed
    worker's server process finishing its peek) is tried again, as Debezium's
    slot.max.retries and slot.retry.delay.ms say; once they run out, the error names
    who holds it and what to do."""
    db = dbname(logical_database)
    logical_postgres.execute("CREATE TABLE t (id integer PRIMARY KEY)", db)
    offsets = Offsets()
    config = cdc_config(logical_postgres, logical_database, snapshot_mode="no_data",
                        slot_max_retries="4", slot_retry_delay_ms="500")  # fmt: skip
    task = cdc_task(config, offsets)

    def hold_slot() -> subprocess.Popen[bytes]:
        holder = subprocess.Popen(
            [
                str(logical_postgres.bindir / "pg_recvlogical"),
                "-d", logical_postgres.dsn(db), "--slot", config["slot.name"],
                "--start", "-f", "/dev/null", "-o", "proto_version=1",
                "-o", "publication_names=dbz_publication",
            ],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )  # fmt: skip

        def held() -> bool:
            assert holder.poll() is None, holder.stderr.read() if holder.stderr else ""
            rows = logical_postgres.execute(
                "SELECT active FROM pg_replication_slots"
                f" WHERE slot_name = '{config['slot.name']}'",
                db,
            )
            return bool(rows and rows[0][0])

        wait_until(held, timeout=30, interval=0.05, what="pg_recvlogical holding the slot")
        return holder

    try:
        assert poll_events(task, offsets) == []
        logical_postgres.execute("INSERT INTO t VALUES (1)", db)
        flushed_past_now(logical_postgres, logical_database)
        holder = hold_slot()
        # let go of it once the task says it waits for it: the poll then gets the change
        waited = ReleaseOnRetry(holder)
        slot_log = logging.getLogger("herder.connectors.cdc.slot")
        slot_log.addHandler(waited)
        try:
            events = poll_until(task, offsets, 1)
        finally:
            slot_log.removeHandler(waited)
            holder.terminate()
            holder.wait(timeout=30)
        assert waited.retries >= 1
        assert ids(events, "c") == [1]
        logical_postgres.execute("INSERT INTO t VALUES (2)", db)
        flushed_past_now(logical_postgres, logical_database)
        holder = hold_slot()
        try:
            with pytest.raises(DatabaseError) as failed:
                poll_until(task, offsets, 1)
        finally:
            holder.terminate()
            holder.wait(timeout=30)
        message = str(failed.value)
        assert config["slot.name"] in message and "is active for PID" in message
        assert "after 4 retries" in message and "slot.name" in message
    finally:
        task.stop()
    # nothing was confirmed past what was delivered: a new task gets change 2
    again = cdc_task(config, offsets)
    try:
        assert ids(poll_until(again, offsets, 1), "c") == [2]
    finally:
        again.stop()
