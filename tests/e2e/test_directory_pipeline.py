"""Directory connectors end to end: real ensemble and worker processes, Spark in the worker.

For each format Spark reads and writes (Parquet, CSV, JSON lines), files in a directory
go DirectorySource → topic → DirectorySink, and the rows that come out are the rows
that went in, each once; a file added while the pipeline runs follows the others. A
FileStreamSource with a backlog big enough to be read by byte ranges on the executors
feeds a DirectorySink writing text, and the lines come out byte for byte, each once.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.e2e.test_pipeline import Cluster
from tests.harness import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.spark]

ROWS_PER_FILE = 500


def rows_of(file_index: int) -> list[dict[str, Any]]:
    first = file_index * ROWS_PER_FILE
    return [
        {"id": i, "name": f'row {i}, "quoted"', "score": i / 4}
        for i in range(first, first + ROWS_PER_FILE)
    ]


def write_input(directory: Path, fmt: str, index: int) -> None:
    rows = rows_of(index)
    path = directory / f"part-{index}.{fmt}"
    temp = directory / f".part-{index}.{fmt}"  # hidden until complete
    if fmt == "parquet":
        pq.write_table(pa.Table.from_pylist(rows), temp)
    elif fmt == "csv":
        with open(temp, "w", newline="") as f:
            writer = csv.DictWriter(f, ["id", "name", "score"])
            writer.writeheader()
            writer.writerows(rows)
    else:
        temp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    temp.rename(path)


def read_output(directory: Path, fmt: str) -> list[dict[str, Any]]:
    """Rows of every visible output file, normalised to the input's types."""
    rows: list[dict[str, Any]] = []
    for path in sorted(p for p in directory.iterdir() if p.is_file()):
        if fmt == "parquet":
            rows += pq.read_table(path).to_pylist()
        elif fmt == "csv":
            with open(path, newline="") as f:
                rows += [
                    {"id": int(r["id"]), "name": r["name"], "score": float(r["score"])}
                    for r in csv.DictReader(f)
                ]
        else:
            rows += [json.loads(line) for line in path.read_text().splitlines()]
    return rows


def key(row: dict[str, Any]) -> tuple[Any, ...]:
    return (int(row["id"]), row["name"], float(row["score"]))


FORMATS = ["parquet", "csv", "json"]


@pytest.mark.timeout(900)
def test_directories_and_a_file_backlog_arrive_exactly_once(
    cluster: Cluster, tmp_path: Path
) -> None:
    cluster.start_worker()
    for fmt in FORMATS:
        source, sink = tmp_path / f"in-{fmt}", tmp_path / f"out-{fmt}"
        source.mkdir()
        for index in range(2):
            write_input(source, fmt, index)
        cluster.create(
            f"{fmt}-out",
            {"connector.class": "DirectorySink", "directory": str(sink), "format": fmt,
             "topics": f"rows-{fmt}"},
        )  # fmt: skip
        cluster.create(
            f"{fmt}-in",
            {"connector.class": "DirectorySource", "directory": str(source), "format": fmt,
             "topic": f"rows-{fmt}", "poll.interval.ms": "200"},
        )  # fmt: skip

    lines_in, lines_out = tmp_path / "lines.txt", tmp_path / "lines-out"
    with open(lines_in, "w") as f:
        for i in range(60_000):
            f.write(f"line {i:09d} " + "x" * (i % 50) + "\n")
    cluster.create(
        "lines-out",
        {"connector.class": "DirectorySink", "directory": str(lines_out), "format": "text",
         "topics": "lines"},
    )  # fmt: skip
    cluster.create(
        "lines-in",
        {"connector.class": "FileStreamSource", "file": str(lines_in), "topic": "lines",
         "parallel.min.bytes": "100000", "parallel.split.bytes": "1000000"},
    )  # fmt: skip

    def failures() -> list[str]:
        names = [f"{fmt}-{end}" for fmt in FORMATS for end in ("in", "out")]
        return [
            f"{name}: {t.get('trace')}"
            for name in [*names, "lines-in", "lines-out"]
            for t in cluster.status(name).get("tasks", [])
            if t["state"] == "FAILED"
        ]

    def arrived(fmt: str, files: int) -> bool:
        failed = failures()
        assert not failed, failed[0]
        out = tmp_path / f"out-{fmt}"
        return out.exists() and len(read_output(out, fmt)) >= files * ROWS_PER_FILE

    for fmt in FORMATS:
        wait_until(lambda fmt=fmt: arrived(fmt, 2), timeout=300, interval=0.5, what=f"{fmt} rows")
        write_input(tmp_path / f"in-{fmt}", fmt, 2)  # a new file, while it runs
    for fmt in FORMATS:
        wait_until(lambda fmt=fmt: arrived(fmt, 3), timeout=300, interval=0.5, what=f"{fmt} file 3")

    expected = sorted(key(r) for index in range(3) for r in rows_of(index))
    for fmt in FORMATS:
        got = sorted(key(r) for r in read_output(tmp_path / f"out-{fmt}", fmt))
        assert got == expected, f"{fmt}: the rows out are not the rows in"
        topic = cluster.describe_topic(f"rows-{fmt}")
        assert sum(p["end_offset"] for p in topic["partition_details"]) == 3 * ROWS_PER_FILE

    expected_bytes = lines_in.read_bytes()

    def lines_arrived() -> bool:
        failed = failures()
        assert not failed, failed[0]
        files = sorted(p for p in lines_out.iterdir() if p.is_file()) if lines_out.exists() else []
        return sum(p.stat().st_size for p in files) >= len(expected_bytes)

    wait_until(lines_arrived, timeout=300, interval=0.5, what="60,000 lines")
    files = sorted(p for p in lines_out.iterdir() if p.is_file())
    assert b"".join(p.read_bytes() for p in files) == expected_bytes
    topic = cluster.describe_topic("lines")
    assert sum(p["end_offset"] for p in topic["partition_details"]) == 60_000
