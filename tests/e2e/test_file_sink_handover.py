"""FileStreamSink handing its file over between task instances, without Spark.

When a sink task moves (a rebalance, a crash, a worker too slow to stop its task), the
new instance may start while the old one is still writing and committing. Whatever the
new one saw of the file at start, it must continue right after the length committed
with the offsets it resumes from: drop what was written past it, and never write over
what was committed.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pyarrow as pa
import pytest

from herder.connect import SinkTaskContext, TopicPartition
from herder.connectors.file import FileStreamSinkTask

pytestmark = pytest.mark.unit

TP = TopicPartition("numbers", 0)


class Offsets(SinkTaskContext):
    """The group's committed offsets, shared by every task instance (the coordinator)."""

    def __init__(self) -> None:
        self.committed_offsets: dict[TopicPartition, tuple[int, str]] = {}

    @property
    def configs(self) -> Mapping[str, str]:
        return {}

    def assignment(self) -> frozenset[TopicPartition]:
        return frozenset([TP])

    def offset(self, partition: TopicPartition, offset: int) -> None:
        raise AssertionError("the sink resumes from its committed offsets")

    def committed(self, partition: TopicPartition) -> tuple[int, str] | None:
        return self.committed_offsets.get(partition)

    def pause(self, *partitions: TopicPartition) -> None: ...

    def resume(self, *partitions: TopicPartition) -> None: ...

    def paused(self) -> frozenset[TopicPartition]:
        return frozenset()

    def request_commit(self) -> None: ...


class Rows:
    """Stands in for a DataFrame: the sink only selects ``value`` and takes it as Arrow."""

    def __init__(self, first: int, last: int) -> None:
        self.values = [b"%09d" % i for i in range(first, last)]

    def select(self, *columns: str) -> Rows:
        assert columns == ("value",)
        return self

    def toArrow(self) -> pa.Table:
        return pa.table({"value": pa.array(self.values, pa.binary())})


def started(path: Path, offsets: Offsets) -> FileStreamSinkTask:
    task = FileStreamSinkTask()
    task.initialize(offsets)
    task.start({"file": str(path)})
    return task


def deliver(task: FileStreamSinkTask, offsets: Offsets, first: int, last: int) -> None:
    """put, flush and commit records [first, last), as the runtime does."""
    task.put(Rows(first, last))  # type: ignore[arg-type]
    task.flush({TP: last})
    offsets.committed_offsets[TP] = (last, task.commit_metadata(TP))


def lines(first: int, last: int) -> bytes:
    return b"".join(b"%09d\n" % i for i in range(first, last))


def test_a_new_instance_continues_after_a_commit_made_since_it_started(tmp_path: Path) -> None:
    path, offsets = tmp_path / "out.txt", Offsets()
    old = started(path, offsets)
    old.open([TP])
    deliver(old, offsets, 0, 10)
    new = started(path, offsets)  # sees ten lines
    deliver(old, offsets, 10, 20)  # the old instance is not done yet: it commits ten more
    old.stop()
    new.open([TP])  # assigned from offset 20
    deliver(new, offsets, 20, 30)
    new.stop()
    assert path.read_bytes() == lines(0, 30)


def test_a_new_instance_drops_what_was_written_after_the_last_commit(tmp_path: Path) -> None:
    path, offsets = tmp_path / "out.txt", Offsets()
    old = started(path, offsets)
    old.open([TP])
    deliver(old, offsets, 0, 10)
    old.put(Rows(10, 15))  # type: ignore[arg-type]  # written, then the worker dies
    new = started(path, offsets)
    new.open([TP])  # assigned from offset 10: lines 10..14 will come again
    deliver(new, offsets, 10, 20)
    new.stop()
    assert path.read_bytes() == lines(0, 20)


def test_a_file_replaced_behind_herders_back_is_appended_to_without_a_hole(
    tmp_path: Path,
) -> None:
    path, offsets = tmp_path / "out.txt", Offsets()
    old = started(path, offsets)
    old.open([TP])
    deliver(old, offsets, 0, 10)
    old.stop()
    path.unlink()  # the user removes the output; the group's offsets stay
    new = started(path, offsets)
    new.open([TP])
    deliver(new, offsets, 10, 20)
    new.stop()
    assert path.read_bytes() == lines(10, 20)
