"""PostgresCdcSource operated through a real worker's REST API, against a real
PostgreSQL with ``wal_level=logical``: the slot lag a user reads in the connector's
status grows while the connector is paused and writes go on, and falls once it has
caught up (its heartbeats moving the slot past WAL that holds no captured change);
deleting a connector drops its slot only with ``slot.drop.on.stop=true``."""

from __future__ import annotations

from typing import Any

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


def dbname(url: str) -> str:
    return url.rsplit("/", 1)[1]


def capture(server: PostgresServer, db: str, prefix: str, **extra: str) -> dict[str, str]:
    return {
        "connector.class": SOURCE,
        "database.hostname": "127.0.0.1",
        "database.port": str(server.port),
        "database.user": SUPERUSER,
        "database.password": SUPERUSER_PASSWORD,
        "database.dbname": db,
        "topic.prefix": prefix,
        "slot.name": f"{prefix}_slot",
        "snapshot.mode": "no_data",
        "poll.interval.ms": "100",
        **{k.replace("_", "."): v for k, v in extra.items()},
    }


def slots(server: PostgresServer, db: str) -> set[str]:
    return {str(r[0]) for r in server.execute("SELECT slot_name FROM pg_replication_slots", db)}


def task_of(cluster: Cluster, name: str) -> dict[str, Any]:
    """Task 0's entry in the connector's status ({} before it has one)."""
    tasks = cluster.status(name).get("tasks", [])
    if tasks and tasks[0]["state"] == "FAILED":
        raise AssertionError(f"task of {name} failed:\n{tasks[0].get('trace')}")
    return tasks[0] if tasks else {}


@pytest.mark.timeout(600)
def test_the_status_shows_slot_lag_while_paused_and_delete_drops_only_slots_asked_to(
    cluster: Cluster, logical_postgres: PostgresServer, logical_database: str
) -> None:
    db = dbname(logical_database)
    logical_postgres.execute("CREATE TABLE t (id integer PRIMARY KEY, note text)", db)
    worker = cluster.start_worker()
    # heartbeats move the slot past WAL written for no captured table (autovacuum's, here)
    cluster.create("keeps", capture(logical_postgres, db, "keeps", heartbeat_interval_ms="500"))
    cluster.create("drops", capture(logical_postgres, db, "drops", slot_drop_on_stop="true"))

    def running_with_lag(name: str) -> bool:
        task = task_of(cluster, name)
        return task.get("state") == "RUNNING" and "lag" in task

    for name in ("keeps", "drops"):
        wait_until(lambda n=name: running_with_lag(n), timeout=300, interval=0.5, what=name)
    assert {"keeps_slot", "drops_slot"} <= slots(logical_postgres, db)

    reply = cluster.http.put(f"{worker.url}/connectors/keeps/pause")
    assert reply.status_code == 202, reply.text
    wait_until(lambda: task_of(cluster, "keeps").get("state") == "PAUSED", timeout=60)
    for i in range(1, 51):
        logical_postgres.execute(f"INSERT INTO t VALUES ({i}, repeat('x', 200))", db)
    behind: dict[str, Any] = {}

    def lag_grows() -> bool:
        lag = task_of(cluster, "keeps").get("lag") or {}
        if lag.get("seconds", 0) > 0 and lag.get("bytes", 0) > 50 * 200:
            behind.setdefault("first", lag)
            behind["last"] = lag
        return "first" in behind and behind["last"]["seconds"] > behind["first"]["seconds"]

    wait_until(lag_grows, timeout=120, interval=0.2, what="the lag of a paused connector")

    reply = cluster.http.put(f"{worker.url}/connectors/keeps/resume")
    assert reply.status_code == 202, reply.text

    def caught_up() -> bool:
        task = task_of(cluster, "keeps")
        lag = task.get("lag") or {}
        return (
            task.get("state") == "RUNNING"
            and lag.get("seconds") == 0
            and lag.get("bytes", behind["last"]["bytes"]) < behind["last"]["bytes"]
        )

    wait_until(caught_up, timeout=300, interval=0.2, what="the connector to catch up")

    for name in ("keeps", "drops"):
        reply = cluster.http.delete(f"{worker.url}/connectors/{name}")
        assert reply.status_code == 204, reply.text
    wait_until(lambda: "drops_slot" not in slots(logical_postgres, db), timeout=120)
    wait_until(
        lambda: "task keeps-0 stopped" in worker.proc.output(),
        timeout=120,
        what="the deleted connector's task to stop",
    )
    assert "keeps_slot" in slots(logical_postgres, db)
