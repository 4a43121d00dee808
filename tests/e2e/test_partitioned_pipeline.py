"""A partitioned topic written and read by four tasks each, over two workers, with a kill -9.

Two workers run a DirectorySource and a DirectorySink (text) with ``tasks.max=4`` each,
on a topic created with eight partitions (``herder topics create --partitions 8``, as
an operator does: a sink task that starts before any source creates a missing topic
with its own ``topic.creation.default.partitions``, one by default). The source's tasks
share the input directory's JSON files out among themselves, their batches go to the
topic's eight partitions, and the sink's four group members get two partitions each. Half the files
are there at the start; once rows come out, the worker running the most tasks is
killed with ``kill -9`` and started again, and the other half of the files arrive.
Every row comes out exactly once, the topic holds each once, and both connectors end
with four RUNNING tasks, the eight of them spread over both workers.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.e2e.test_pipeline import Cluster, Worker
from tests.harness import HERDER, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.spark]

PARTITIONS = 8
TASKS = 4
FILES = 48
ROWS_PER_FILE = 1_000
TOTAL = FILES * ROWS_PER_FILE


def write_file(directory: Path, index: int) -> None:
    """File ``index`` of the input, written aside and renamed in (the source reads only
    whole files)."""
    first = index * ROWS_PER_FILE
    temp = directory / f".part-{index}.json"
    temp.write_text("".join(f'{{"id": {i}}}\n' for i in range(first, first + ROWS_PER_FILE)))
    temp.rename(directory / f"part-{index}.json")


def output_ids(directory: Path) -> list[int]:
    """The ids in the sink's visible files (not its ``_tmp/``)."""
    if not directory.exists():
        return []
    ids: list[int] = []
    for path in directory.iterdir():
        if path.is_file() and not path.name.startswith((".", "_")):
            ids += [json.loads(line)["id"] for line in path.read_text().splitlines()]
    return ids


def running(cluster: Cluster, name: str) -> list[str] | None:
    """The worker ids of ``name``'s tasks, if all TASKS of them are RUNNING."""
    tasks = cluster.status(name).get("tasks", [])
    failed = [t for t in tasks if t["state"] == "FAILED"]
    if failed:
        raise AssertionError(f"a task of {name} failed:\n{failed[0].get('trace')}")
    if len(tasks) != TASKS or any(t["state"] != "RUNNING" for t in tasks):
        return None
    return [t["worker_id"] for t in tasks]


def busiest(cluster: Cluster) -> Worker:
    """The live worker running the most tasks of both connectors."""
    owners = Counter(
        t["worker_id"]
        for name in ("parts-in", "parts-out")
        for t in cluster.status(name).get("tasks", [])
        if t["state"] == "RUNNING"
    )
    live = [w for w in cluster.workers if w.worker_id in owners]
    assert live, f"no live worker runs a task: {owners}"
    return max(live, key=lambda w: owners[w.worker_id])


@pytest.mark.timeout(1200)
def test_four_tasks_each_side_over_eight_partitions_survive_a_kill9(
    cluster: Cluster, tmp_path: Path
) -> None:
    started = time.monotonic()
    cluster.start_worker()
    cluster.start_worker()
    source, sink = tmp_path / "in", tmp_path / "out"
    source.mkdir()
    for index in range(FILES // 2):
        write_file(source, index)
    subprocess.run(
        [*HERDER, "topics", "create", "parts", "--partitions", str(PARTITIONS),
         "--bootstrap", cluster.server.bootstrap],
        check=True, timeout=60, capture_output=True,
    )  # fmt: skip
    # the sink first: its tasks start no Spark job until there are records
    cluster.create(
        "parts-out",
        {"connector.class": "DirectorySink", "directory": str(sink), "format": "text",
         "topics": "parts", "tasks.max": str(TASKS)},
    )  # fmt: skip
    cluster.create(
        "parts-in",
        {"connector.class": "DirectorySource", "directory": str(source), "format": "json",
         "topic": "parts", "tasks.max": str(TASKS), "poll.interval.ms": "200",
         "batch.max.files": "4"},
    )  # fmt: skip

    wait_until(lambda: output_ids(sink), timeout=600, interval=0.5, what="the first rows out")
    victim = busiest(cluster)
    cluster.kill9(victim)
    cluster.restart(victim)
    for index in range(FILES // 2, FILES):
        write_file(source, index)

    def complete() -> bool:
        for name in ("parts-in", "parts-out"):
            running(cluster, name)  # raises on a FAILED task
        return len(output_ids(sink)) >= TOTAL

    wait_until(complete, timeout=900, interval=1, what=f"{TOTAL} rows out")
    ids = output_ids(sink)
    counts = Counter(ids)
    duplicated = sorted(i for i, c in counts.items() if c > 1)
    missing = sorted(set(range(TOTAL)) - set(counts))
    assert not duplicated and not missing and len(ids) == TOTAL, (
        f"{len(ids)} rows for {TOTAL}: {len(duplicated)} duplicated (first {duplicated[:5]}),"
        f" {len(missing)} missing (first {missing[:5]})"
    )

    topic = cluster.describe_topic("parts")
    assert topic["partitions"] == PARTITIONS
    ends = [p["end_offset"] for p in topic["partition_details"]]
    assert sum(ends) == TOTAL, f"the topic holds {sum(ends)} records for {TOTAL}: {ends}"
    filled = [p for p, end in enumerate(ends) if end]
    assert len(filled) > 1, f"every record went to one partition: {ends}"
    # the sink wrote each partition's records under that partition's name
    written = {int(p.name.split("+")[1]) for p in sink.iterdir() if p.is_file()}
    assert written == set(filled)
    owners: list[str] = []
    for name in ("parts-in", "parts-out"):
        found = wait_until(
            lambda name=name: running(cluster, name),  # type: ignore[misc]
            timeout=120,
            interval=0.5,
            what=f"{TASKS} tasks of {name} RUNNING",
        )
        assert isinstance(found, list)
        owners += found
    # the assignor balances the workers' task counts (not each connector's spread)
    assert len(set(owners)) == 2, f"the tasks are not spread over both workers: {owners}"
    print(
        json.dumps(
            {
                "test": "partitions kill9",
                "rows": TOTAL,
                "partition_ends": ends,
                "task_owners": dict(Counter(owners)),
                "seconds": round(time.monotonic() - started),
            }
        )
    )
