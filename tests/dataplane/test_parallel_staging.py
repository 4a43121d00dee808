"""A backlog read by byte ranges, staged with the line numbers planned on the driver.

The lines of a file, read in parallel by the line-ranges Data Source with their ``seq``
numbered before the job, are staged to a topic without a shuffle and committed with the
source offset the planned ranges reach; read back, every line has its offset, in file
order. Rows that lost some of their numbers on the way (a filter) are numbered again.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from herder.dataplane import SegmentWriter, SparkRuntime, Storage
from herder.dataplane.datasource import (
    ByteRange,
    line_ranges_dataframe,
    number_lines,
    plan_line_ranges,
)
from herder.ensemble.txn import Append
from tests.dataplane.conftest import connected
from tests.integration.conftest import ServerHandle

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.timeout(300)]


def write_lines(path: Path, count: int) -> list[bytes]:
    lines = [b"line %06d" % i + b"z" * (i % 23) for i in range(count)]
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    return lines


def planned(
    tmp_path: Path, count: int, parts: int
) -> tuple[Path, list[bytes], list[ByteRange], int]:
    """A backlog file of ``count`` lines, its ranges (about ``parts``), numbered, and the
    number of lines the numbering counted."""
    path = tmp_path / "backlog.txt"
    lines = write_lines(path, count)
    size = path.stat().st_size
    ranges, counted = number_lines(str(path), plan_line_ranges(str(path), 0, size, size // parts))
    return path, lines, ranges, counted


async def test_planned_ranges_are_staged_in_file_order_with_their_offset(
    ensemble: ServerHandle, storage: Storage, spark: SparkRuntime, tmp_path: Path
) -> None:
    path, lines, ranges, counted = planned(tmp_path, 12_000, 4)
    size = path.stat().st_size
    assert counted == len(lines) and len(ranges) >= 4
    assert [r.first_line for r in ranges] == sorted({r.first_line for r in ranges})

    async with connected(ensemble, storage, spark) as topics:
        await topics.create("backlog", 3)
        writer = SegmentWriter(topics, spark, "backlog-0", 1)
        await topics.client.create_log("_test_offsets", compacted=True, if_absent=True)
        df = await spark.run(
            lambda: line_ranges_dataframe(spark.session, str(path), ranges, sequenced=True)
        )
        staged = await writer.stage(df, "backlog")
        # one partition; one file per range, written by the range's own Spark task
        assert [s.count for s in staged.segments] == [len(lines)]
        assert len(staged.segments[0].files) == len(ranges)
        offset = Append("_test_offsets", b"backlog", b'{"position": %d}' % size)
        await topics.commit(staged, [offset])

        got = await spark.run((await topics.read("backlog", ordered=True)).collect)
        assert [r["value"] for r in got] == lines
        assert [r["offset"] for r in got] == list(range(len(lines)))
        reply = await topics.client.read("_test_offsets", 0)
        assert reply.records[-1].value == b'{"position": %d}' % size


async def test_rows_missing_some_numbers_are_numbered_again(
    ensemble: ServerHandle, storage: Storage, spark: SparkRuntime, tmp_path: Path
) -> None:
    from pyspark.sql import functions as F

    path, lines, ranges, _ = planned(tmp_path, 3_000, 3)
    async with connected(ensemble, storage, spark) as topics:
        await topics.create("gaps", 1)
        writer = SegmentWriter(topics, spark, "gaps-0", 1)
        df = await spark.run(
            lambda: line_ranges_dataframe(spark.session, str(path), ranges, sequenced=True)
        )
        kept = df.where(F.col("seq") % 3 != 0)  # as a Filter transform would
        staged = await writer.stage(kept, "gaps")
        await topics.commit(staged)
        got = await spark.run((await topics.read("gaps", ordered=True)).collect)
        expected = [line for i, line in enumerate(lines) if i % 3 != 0]
        assert sorted(r["value"] for r in got) == sorted(expected)
        assert [r["offset"] for r in got] == list(range(len(expected)))
