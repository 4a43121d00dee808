"""A backlog read by byte ranges, staged in file order without numbering its lines.

The lines of a file, read in parallel by the line-ranges Data Source, are staged to a
topic as they come — each range's Spark task writes its own files, with no ``seq``
column — and committed with the source offset the planned ranges reach; read back, every
line has its offset, in file order, also when a filter took some lines out on the way.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from herder.dataplane import SegmentWriter, SparkRuntime, Storage
from herder.dataplane.datasource import ByteRange, line_ranges_dataframe, plan_line_ranges
from herder.ensemble.txn import Append
from tests.dataplane.conftest import connected
from tests.integration.conftest import ServerHandle

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.timeout(300)]


def write_lines(path: Path, count: int) -> list[bytes]:
    lines = [b"line %06d" % i + b"z" * (i % 23) for i in range(count)]
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    return lines


def planned(tmp_path: Path, count: int, parts: int) -> tuple[Path, list[bytes], list[ByteRange]]:
    """A backlog file of ``count`` lines and its ranges (about ``parts``)."""
    path = tmp_path / "backlog.txt"
    lines = write_lines(path, count)
    size = path.stat().st_size
    return path, lines, plan_line_ranges(str(path), 0, size, size // parts)


async def test_planned_ranges_are_staged_in_file_order_with_their_offset(
    ensemble: ServerHandle, storage: Storage, spark: SparkRuntime, tmp_path: Path
) -> None:
    path, lines, ranges = planned(tmp_path, 12_000, 4)
    size = path.stat().st_size
    assert len(ranges) >= 4

    async with connected(ensemble, storage, spark) as topics:
        await topics.create("backlog", 3)
        writer = SegmentWriter(topics, spark, "backlog-0", 1)
        await topics.client.create_log("_test_offsets", compacted=True, if_absent=True)
        df = await spark.run(lambda: line_ranges_dataframe(spark.session, str(path), ranges))
        staged = await writer.stage(df, "backlog")
        # one partition; one file per range, written by the range's own Spark task
        [segment] = staged.segments
        assert segment.count == len(lines) and len(segment.files) == len(ranges)
        assert segment.file_counts is not None and sum(segment.file_counts) == len(lines)
        for file in segment.files:
            assert storage.footer(file).schema.names == ["value"]  # no seq, key, headers
        offset = Append("_test_offsets", b"backlog", b'{"position": %d}' % size)
        await topics.commit(staged, [offset])

        got = await spark.run((await topics.read("backlog", ordered=True)).collect)
        assert [r["value"] for r in got] == lines
        assert [r["offset"] for r in got] == list(range(len(lines)))
        reply = await topics.client.read("_test_offsets", 0)
        assert reply.records[-1].value == b'{"position": %d}' % size


async def test_rows_a_filter_left_are_staged_in_order_with_consecutive_offsets(
    ensemble: ServerHandle, storage: Storage, spark: SparkRuntime, tmp_path: Path
) -> None:
    from pyspark.sql import functions as F

    path, lines, ranges = planned(tmp_path, 3_000, 3)
    async with connected(ensemble, storage, spark) as topics:
        await topics.create("gaps", 1)
        writer = SegmentWriter(topics, spark, "gaps-0", 1)
        df = await spark.run(lambda: line_ranges_dataframe(spark.session, str(path), ranges))
        number = F.substring(F.col("value").cast("string"), 6, 6).cast("int")
        kept = df.where(number % 3 != 0)  # as a Filter transform would
        staged = await writer.stage(kept, "gaps")
        await topics.commit(staged)
        got = await spark.run((await topics.read("gaps", ordered=True)).collect)
        expected = [line for i, line in enumerate(lines) if i % 3 != 0]
        assert [r["value"] for r in got] == expected
        assert [r["offset"] for r in got] == list(range(len(expected)))
