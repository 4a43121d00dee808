"""DirectorySink handing its partitions over between task instances, on a real Spark.

One file per (topic, partition, base offset), renamed into place: a batch delivered
again — by the next owner after a crash, or by a zombie that lost its partitions but
still writes — replaces the file it wrote before instead of adding its records twice,
and files written after the last commit are removed when the partitions are opened.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from herder.connect import TopicPartition
from herder.connectors.directory import DirectorySinkTask
from herder.dataplane import SparkRuntime, spark_runtime, stop_spark
from herder.dataplane.reader import SINK_DDL
from tests.e2e.test_file_sink_handover import TP, Offsets

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkRuntime]:
    runtime = spark_runtime(
        {
            "spark.master": "local[1]",
            "spark.driver.memory": "512m",
            "spark.sql.shuffle.partitions": "2",
        }
    )
    runtime.start()
    try:
        yield runtime
    finally:
        stop_spark()


def numbered(i: int) -> str:
    return f"{i:09d}"


def records(spark: SparkRuntime, ranges: Mapping[TopicPartition, tuple[int, int]]):  # type: ignore[no-untyped-def]
    """What the runtime puts: the records of each partition's [first, last), in order."""
    rows = [
        (tp.topic, tp.partition, i, None, None, numbered(i).encode(), [])
        for tp, (first, last) in sorted(ranges.items())
        for i in range(first, last)
    ]
    return spark.session.createDataFrame(rows, SINK_DDL)


def started(directory: Path, offsets: Offsets, fmt: str = "text") -> DirectorySinkTask:
    task = DirectorySinkTask()
    task.initialize(offsets)
    task.start({"directory": str(directory), "format": fmt, "topics": TP.topic})
    return task


def deliver(
    spark: SparkRuntime, task: DirectorySinkTask, offsets: Offsets, first: int, last: int
) -> None:
    """put and commit records [first, last) of TP, as the runtime does."""
    task.put(records(spark, {TP: (first, last)}))
    safe = task.pre_commit({TP: last})
    offsets.committed_offsets[TP] = (safe[TP], task.commit_metadata(TP))


def lines_in(directory: Path) -> list[str]:
    """Every line of every visible file, files in name order."""
    files = sorted(p for p in directory.iterdir() if p.is_file())
    return [line for p in files for line in p.read_text().splitlines()]


def test_a_zombies_redelivery_replaces_its_own_batch(spark: SparkRuntime, tmp_path: Path) -> None:
    offsets = Offsets()
    old = started(tmp_path, offsets)
    old.open([TP])
    deliver(spark, old, offsets, 0, 10)
    # the old instance loses its partition without knowing it; the new one takes over
    new = started(tmp_path, offsets)
    new.open([TP])
    deliver(spark, new, offsets, 10, 20)
    # the zombie delivers the same batch again, after its new owner did
    old.put(records(spark, {TP: (10, 20)}))
    deliver(spark, new, offsets, 20, 25)
    old.stop()
    new.stop()
    assert lines_in(tmp_path) == [numbered(i) for i in range(25)]
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == [
        "numbers+0+00000000000000000000.txt",
        "numbers+0+00000000000000000010.txt",
        "numbers+0+00000000000000000020.txt",
    ]
    assert not list((tmp_path / "_tmp").iterdir())


def test_files_written_after_the_last_commit_are_removed_and_written_again(
    spark: SparkRuntime, tmp_path: Path
) -> None:
    offsets = Offsets()
    old = started(tmp_path, offsets)
    old.open([TP])
    deliver(spark, old, offsets, 0, 10)
    old.put(records(spark, {TP: (10, 15)}))  # written, then the worker dies
    old.pre_commit({TP: 15})  # ... before its commit reached the coordinator
    old.put(records(spark, {TP: (15, 18)}))
    new = started(tmp_path, offsets)
    new.open([TP])  # from offset 10: the files at 10 and 15 are gone
    assert lines_in(tmp_path) == [numbered(i) for i in range(10)]
    deliver(spark, new, offsets, 10, 30)
    new.stop()
    assert lines_in(tmp_path) == [numbered(i) for i in range(30)]


@pytest.mark.parametrize("fmt", ["parquet", "csv", "json"])
def test_partitions_of_one_batch_get_a_file_each(
    spark: SparkRuntime, tmp_path: Path, fmt: str
) -> None:
    other = TopicPartition("numbers", 1)
    offsets = Offsets()
    task = started(tmp_path, offsets, fmt)
    offsets.committed_offsets[other] = (100, "")
    task.open([TP, other])
    values = {TP: (0, 40), other: (100, 130)}
    rows = [
        (tp.topic, tp.partition, i, None, None, b'{"n": %d, "s": "v%d"}' % (i, i), [])
        for tp, (first, last) in values.items()
        for i in range(first, last)
    ]
    task.put(spark.session.createDataFrame(rows, SINK_DDL))
    task.stop()
    ext = "json" if fmt == "json" else fmt
    names = sorted(p.name for p in tmp_path.iterdir() if p.is_file())
    assert names == [
        f"numbers+0+00000000000000000000.{ext}",
        f"numbers+1+00000000000000000100.{ext}",
    ]
    reader = spark.session.read.format(fmt)
    if fmt == "csv":
        reader = reader.option("header", "true").option("inferSchema", "true")
    for name, (first, last) in zip(names, values.values(), strict=True):
        got = reader.load(str(tmp_path / name)).collect()
        # each file keeps its partition's offset order
        assert [(r["n"], r["s"]) for r in got] == [(i, f"v{i}") for i in range(first, last)]


def test_a_task_removes_what_its_crashed_predecessors_left_half_written(
    spark: SparkRuntime, tmp_path: Path
) -> None:
    temps = tmp_path / "_tmp"
    left = {
        name: temps / name
        for name in (f"task0-{'a' * 32}-3", f"task1-{'b' * 32}-0", f"task2-{'c' * 32}-7", "other")
    }
    for path in left.values():
        path.mkdir(parents=True)
        (path / "part-00000.txt").write_text("half written\n")
    offsets = Offsets()
    task = DirectorySinkTask()
    task.initialize(offsets)
    # task 0 of 2: its own number's leftovers go, and those of a task 2 no longer run
    task.start({"directory": str(tmp_path), "format": "text", "topics": TP.topic,
                "task.index": "0", "task.count": "2"})  # fmt: skip
    assert sorted(p.name for p in temps.iterdir()) == ["other", f"task1-{'b' * 32}-0"]
    task.open([TP])
    deliver(spark, task, offsets, 0, 3)
    assert lines_in(tmp_path) == [numbered(i) for i in range(3)]
    assert sorted(p.name for p in temps.iterdir()) == ["other", f"task1-{'b' * 32}-0"]
    task.close([TP])
    task.stop()
