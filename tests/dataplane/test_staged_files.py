"""What a staged segment file holds beyond its records: Parquet statistics where reads use them."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from herder.connect import SourceRecord
from herder.dataplane import SegmentWriter, SparkRuntime, Storage
from tests.dataplane.conftest import connected
from tests.integration.conftest import ServerHandle

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.timeout(300)]


def statistics_by_column(path: Path) -> dict[str, bool]:
    """Whether each column of ``path`` has min/max statistics in every row group."""
    meta = pq.read_metadata(path)
    return {
        meta.schema.column(i).path: all(
            meta.row_group(g).column(i).is_stats_set for g in range(meta.num_row_groups)
        )
        for i in range(meta.num_columns)
    }


async def test_staged_files_have_statistics_for_seq_and_timestamp_only(
    ensemble: ServerHandle, storage: Storage, spark: SparkRuntime
) -> None:
    """Reads filter by ``seq``; a value's statistics would cost a comparison of every
    value written, and nothing reads them."""
    root = Path(storage.root)
    async with connected(ensemble, storage, spark) as topics:
        await topics.create("stats", 3)
        writer = SegmentWriter(topics, spark, "stats-0", 1)
        lines = [SourceRecord({}, {}, "stats", b"line %d" % i) for i in range(50)]
        keyed = [
            SourceRecord({}, {}, "stats", b"v%d" % i, key=b"k%d" % i, timestamp_ms=1_000 + i,
                         headers=[("h", b"%d" % i)])
            for i in range(50)
        ]  # fmt: skip
        seen: dict[str, bool] = {}
        for records in (lines, keyed):  # one partition, in order; then three, with seq
            staged = await writer.stage(records)
            for segment in staged.segments:
                for file in segment.files:
                    for column, has in statistics_by_column(root / file).items():
                        assert has == (column in ("seq", "timestamp")), f"{column} in {file}"
                        seen[column] = has
            await topics.commit(staged)
    assert {"value", "key", "seq", "timestamp"} <= set(seen)
    assert any(column.startswith("headers.") for column in seen)
