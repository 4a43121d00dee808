"""``herder topics`` through a real ensemble server process."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from herder.connect import SourceRecord
from herder.dataplane import SegmentWriter, SparkRuntime, Storage
from tests.dataplane.conftest import connected
from tests.harness import HERDER
from tests.integration.conftest import ServerHandle

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.timeout(300)]


def herder(
    server: ServerHandle, *args: str, root: Path | None = None
) -> subprocess.CompletedProcess[str]:
    extra = ["--storage-root", str(root)] if root is not None else []
    return subprocess.run(
        [*HERDER, "topics", *args, "--bootstrap", server.bootstrap, *extra],
        capture_output=True,
        text=True,
        timeout=60,
    )


def lines(out: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    assert out.returncode == 0, out.stderr
    return [json.loads(line) for line in out.stdout.splitlines()]


async def test_create_list_describe_consume_delete(
    ensemble: ServerHandle, storage: Storage, spark: SparkRuntime
) -> None:
    root = Path(storage.root)
    created = herder(ensemble, "create", "clicks", "--partitions", "2", "-c", "retention.ms=60000")
    assert created.returncode == 0 and "created topic clicks with 2 partitions" in created.stdout
    again = herder(ensemble, "create", "clicks")
    assert again.returncode == 1 and again.stderr.strip() == "error: topic 'clicks' already exists"
    bad = herder(ensemble, "create", "other", "-c", "cleanup.policy=compact")
    assert bad.returncode == 1 and bad.stderr.startswith("error: unknown topic config")

    async with connected(ensemble, storage, spark) as topics:
        writer = SegmentWriter(topics, spark, "cli-0", 1)
        records = [SourceRecord({}, {}, "clicks", f"v{i}", partition=i % 2) for i in range(6)]
        records.append(SourceRecord({}, {}, "clicks", b"\xff\x00", key="bin", partition=0))
        await topics.commit(await writer.stage(records))

    listed = lines(herder(ensemble, "list", "--json"))[0]
    clicks = next(t for t in listed if t["name"] == "clicks")
    assert clicks["partitions"] == 2 and clicks["config"]["retention.ms"] == 60000
    described = lines(herder(ensemble, "describe", "clicks", "--json"))[0]
    parts = {p["partition"]: p for p in described["partition_details"]}
    assert (parts[0]["end_offset"], parts[1]["end_offset"]) == (4, 3)
    assert parts[0]["segments"] == 1 and parts[0]["bytes"] > 0
    assert "partition" in herder(ensemble, "describe", "clicks").stdout

    first = lines(
        herder(ensemble, "consume", "clicks", "--from-beginning", "--max", "2", root=root)
    )
    assert [(r["partition"], r["offset"], r["value"]) for r in first] == [
        (0, 0, "v0"),
        (0, 1, "v2"),
    ]
    everything = lines(
        herder(ensemble, "consume", "clicks", "--from-beginning", "--timeout-ms", "300", root=root)
    )
    assert len(everything) == 7
    binary = next(r for r in everything if r["key"] == "bin")
    assert binary["value"] == {"base64": "/wA="} and binary["topic"] == "clicks"
    assert lines(herder(ensemble, "consume", "clicks", "--timeout-ms", "300", root=root)) == []
    no_root = herder(ensemble, "consume", "clicks")
    assert no_root.returncode == 2 and "--storage-root" in no_root.stderr

    deleted = herder(ensemble, "delete", "clicks", root=root)
    assert deleted.returncode == 0, deleted.stderr
    assert not list(root.rglob("topic=clicks"))
    assert "clicks" not in {t["name"] for t in lines(herder(ensemble, "list", "--json"))[0]}
    missing = herder(ensemble, "describe", "clicks")
    assert missing.returncode == 1 and "does not exist" in missing.stderr
