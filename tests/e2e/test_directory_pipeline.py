"""Directory connectors end to end: real ensemble and worker processes, Spark in the worker.

For each format Spark reads and writes (Parquet, CSV, JSON lines), files in a directory
go DirectorySource → topic → DirectorySink, and the rows that come out are the rows
that went in, each once; a file added while the pipeline runs follows the others. A
FileStreamSource with a backlog big enough to be read by byte ranges on the executors
feeds a DirectorySink writing text, and the lines come out byte for byte, each once. A
Parquet table of nested types (decimals, dates, timestamps, arrays, maps, structs) comes
out of DirectorySource → topic → DirectorySink with the same types.
"""

from __future__ import annotations

import csv
import datetime as dt
import json
from decimal import Decimal
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


def nested_table(first: int, count: int) -> pa.Table:
    """Rows of every kind of type a Parquet table holds: decimal, date, timestamps (with
    and without a zone), arrays, maps, structs (nested), bytes."""
    ids = list(range(first, first + count))
    address = pa.struct([("city", pa.string()), ("zip", pa.int32())])
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "amount": pa.array([Decimal(i) / 100 for i in ids], pa.decimal128(12, 2)),
            "day": pa.array([dt.date(2020, 1, 1) + dt.timedelta(days=i) for i in ids]),
            "at": pa.array(
                [dt.datetime(2024, 5, 1, tzinfo=dt.UTC) + dt.timedelta(seconds=i) for i in ids],
                pa.timestamp("us", tz="UTC"),
            ),
            "tags": pa.array(
                [[f"t{i}", None] if i % 2 else [] for i in ids], pa.list_(pa.string())
            ),
            "attrs": pa.array(
                [[("n", i), ("m", -i)] for i in ids], pa.map_(pa.string(), pa.int32())
            ),
            "customer": pa.array(
                [{"name": f"c{i}", "address": {"city": f"city {i}", "zip": i}} for i in ids],
                pa.struct([("name", pa.string()), ("address", address)]),
            ),
            "blob": pa.array([bytes([i % 256, 0]) for i in ids], pa.binary()),
        }
    )


@pytest.mark.timeout(600)
def test_a_parquet_table_of_nested_types_comes_out_with_the_same_types(
    cluster: Cluster, tmp_path: Path
) -> None:
    """DirectorySource → topic → DirectorySink keeps every column's type, the topic
    holding typed values; a sink that takes bytes (text) gets them serialised by its
    converter: JsonConverter's envelope with schemas.enable=true, plain JSON without."""
    given = nested_table(0, 300)
    inbox, outbox = tmp_path / "in", tmp_path / "out"
    envelopes, plain = tmp_path / "envelopes", tmp_path / "plain"
    inbox.mkdir()
    pq.write_table(given, inbox / ".nested.parquet")
    (inbox / ".nested.parquet").rename(inbox / "nested.parquet")
    cluster.start_worker()
    typed = {"value.converter.schemas.enable": "true"}
    cluster.create(
        "nested-in",
        {"connector.class": "DirectorySource", "directory": str(inbox), "format": "parquet",
         "topic": "nested", "poll.interval.ms": "200", **typed},
    )  # fmt: skip
    cluster.create(
        "nested-out",
        {"connector.class": "DirectorySink", "directory": str(outbox), "format": "parquet",
         "topics": "nested"},
    )  # fmt: skip
    cluster.create(
        "nested-envelopes",
        {"connector.class": "DirectorySink", "directory": str(envelopes), "format": "text",
         "topics": "nested", **typed},
    )  # fmt: skip
    cluster.create(
        "nested-plain",
        {"connector.class": "FileStreamSink", "file": str(plain), "topics": "nested"},
    )  # fmt: skip
    names = ["nested-in", "nested-out", "nested-envelopes", "nested-plain"]

    def lines(path: Path) -> list[str]:
        if path.is_dir():
            return [
                x for p in sorted(path.iterdir()) if p.is_file() for x in p.read_text().splitlines()
            ]
        return path.read_text().splitlines() if path.exists() else []

    def arrived() -> bool:
        for name in names:
            for task in cluster.status(name).get("tasks", []):
                assert task["state"] != "FAILED", f"{name}: {task.get('trace')}"
        out = read_output(outbox, "parquet") if outbox.exists() else []
        return (
            len(out) >= given.num_rows
            and len(lines(envelopes)) >= given.num_rows
            and len(lines(plain)) >= given.num_rows
        )

    wait_until(arrived, timeout=300, interval=0.5, what="the nested rows out")
    files = sorted(p for p in outbox.iterdir() if p.is_file())
    out = pa.concat_tables(pq.read_table(p) for p in files).sort_by("id")
    assert out.schema.names == given.schema.names
    for field in given.schema:
        got = out.schema.field(field.name).type
        assert got == field.type, f"{field.name}: {got} out, {field.type} in"
    assert out.to_pylist() == given.to_pylist()

    first = json.loads(lines(envelopes)[0])
    assert set(first) == {"schema", "payload"}
    schema_fields = {f["field"]: f for f in first["schema"]["fields"]}
    assert schema_fields["amount"]["name"] == "org.apache.kafka.connect.data.Decimal"
    assert schema_fields["customer"]["type"] == "struct"
    assert schema_fields["attrs"]["type"] == "map"
    assert sorted(json.loads(x)["payload"]["id"] for x in lines(envelopes)) == list(range(300))
    plain_rows = sorted((json.loads(x) for x in lines(plain)), key=lambda r: r["id"])
    assert plain_rows[7]["customer"] == {"name": "c7", "address": {"city": "city 7", "zip": 7}}
    assert plain_rows[7]["day"] == "2020-01-08"
