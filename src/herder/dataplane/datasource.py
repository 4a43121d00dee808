"""Lines of a file read in parallel on Spark's executors, by planned byte ranges.

A source with a large backlog in a file should not pass every line through the
driver's Python (SPARK_NOTES: Python rows into Spark are the pipeline's slowest step).
Instead the driver *plans*: it cuts the backlog ``[start, end)`` into byte ranges that
each begin and end on a line boundary (:func:`plan_line_ranges`, a few small reads
near each cut), and the offset the batch reaches is ``end``, known before any job
runs. The ranges then go to :class:`LineRangesDataSource`, a Python Data Source
(``pyspark.sql.datasource``) whose reader runs on the executors, one input partition
per range, and yields Arrow record batches built with numpy — no Python object per
line.

The driver also counts each range's lines (:func:`number_lines`), so every line comes
with ``seq``, its number in the batch, and the batch is staged to its topic without
the shuffle that numbering rows in Spark costs (see
:data:`herder.dataplane.writer.SEQ`).

Lines are split on ``\\n``; a ``\\r`` before it is dropped, as FileStreamSource does.
"""

from __future__ import annotations

import json
import os
import threading
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

#: The name Spark knows the data source by (``spark.read.format(...)``).
LINE_RANGES_FORMAT = "herder-line-ranges"
LINE_RANGES_DDL = "value binary"
SEQUENCED_LINE_RANGES_DDL = "value binary, seq bigint"
#: How much of a file one Arrow batch is built from.
READ_CHUNK_BYTES = 8 * 1024 * 1024
#: How far the planner looks past a cut for the end of its line before giving up on it.
_SCAN_BYTES = 64 * 1024

_NEWLINE = 10
_CARRIAGE_RETURN = 13


@dataclass(frozen=True)
class ByteRange(InputPartition):
    """Bytes ``[start, end)`` of a file: whole lines, the last one ending in ``\\n``.

    ``first_line`` is the number, within the whole planned backlog, of its first line
    (see :func:`number_lines`).
    """

    start: int
    end: int
    first_line: int = 0


def last_line_end(path: str, start: int, end: int) -> int:
    """The offset just past the last ``\\n`` in bytes ``[start, end)``; ``start`` if none."""
    with open(path, "rb") as f:
        position = end
        while position > start:
            step = min(_SCAN_BYTES, position - start)
            f.seek(position - step)
            found = f.read(step).rfind(b"\n")
            if found >= 0:
                return position - step + found + 1
            position -= step
    return start


def balanced_split_bytes(total: int, split_bytes: int, parallelism: int | None) -> int:
    """Bytes per range so that ``total`` bytes make a multiple of ``parallelism`` ranges
    of at most ``split_bytes``: with 2 cores, 200 MB in 64 MB ranges would be 4 ranges of
    50 MB rather than 3 of 64 MB and a short one, which leave a core idle at the end."""
    if parallelism is None or parallelism < 1 or total <= 0:
        return split_bytes
    ranges = -(-total // split_bytes)
    ranges = -(-ranges // parallelism) * parallelism
    return max(1, -(-total // ranges))


def plan_line_ranges(path: str, start: int, end: int, split_bytes: int) -> list[ByteRange]:
    """``[start, end)`` in ranges of about ``split_bytes``, each cut just after a ``\\n``.

    ``end`` must itself be just after a ``\\n`` (see :func:`last_line_end`). A line
    longer than a range joins the range it starts in.
    """
    if split_bytes < 1:
        raise ValueError("split_bytes must be at least 1")
    cuts = [start]
    with open(path, "rb") as f:
        target = start + split_bytes
        while target < end:
            f.seek(target - 1)
            cut = None
            position = target - 1
            while position < end:
                chunk = f.read(min(_SCAN_BYTES, end - position))
                if not chunk:
                    break
                found = chunk.find(b"\n")
                if found >= 0:
                    cut = position + found + 1
                    break
                position += len(chunk)
            if cut is None or cut >= end:
                break
            cuts.append(cut)
            target = cut + split_bytes
    cuts.append(end)
    return [ByteRange(a, b) for a, b in pairwise(cuts) if b > a]


def number_lines(path: str, ranges: Sequence[ByteRange]) -> tuple[list[ByteRange], int]:
    """``ranges`` with the number of each one's first line, and how many lines they hold.

    Counting newlines costs one sequential read of the backlog on the driver (the
    operating system's cache then serves the executors' reads); it gives every line its
    position in the batch before the job, so Spark need not number rows with a shuffle.
    """
    numbered, lines = [], 0
    with open(path, "rb", buffering=0) as f:
        for r in ranges:
            numbered.append(ByteRange(r.start, r.end, lines))
            f.seek(r.start)
            position = r.start
            while position < r.end:
                chunk = f.read(min(READ_CHUNK_BYTES, r.end - position))
                if not chunk:
                    raise OSError(
                        f"{path} ended at byte {position}; lines up to {r.end} were planned"
                    )
                lines += chunk.count(b"\n")
                position += len(chunk)
    return numbered, lines


def lines_to_array(buffer: bytes | bytearray | memoryview) -> pa.BinaryArray:
    """The lines of ``buffer`` (which ends in ``\\n``) as one binary array, ``\\r\\n`` aware."""
    data = np.frombuffer(buffer, dtype=np.uint8)
    newline = data == _NEWLINE
    ends = np.flatnonzero(newline)
    if not _has_crlf(data, ends):
        # line i ends at ends[i]; with the i newlines before it taken out, at ends[i] - i
        offsets = np.empty(len(ends) + 1, dtype=np.int32)
        offsets[0] = 0
        np.subtract(ends, np.arange(len(ends)), out=offsets[1:], casting="unsafe")
        values = data[~newline]
    else:
        starts = np.empty_like(ends)
        starts[0:1] = 0
        starts[1:] = ends[:-1] + 1
        before = ends - 1
        crlf = (before >= starts) & (data[np.maximum(before, 0)] == _CARRIAGE_RETURN)
        keep = ~newline
        keep[before[crlf]] = False
        offsets = np.zeros(len(ends) + 1, dtype=np.int32)
        np.cumsum(ends - crlf - starts, out=offsets[1:])
        values = data[keep]
    return pa.Array.from_buffers(
        pa.binary(), len(ends), [None, pa.py_buffer(offsets), pa.py_buffer(values)]
    )


def _has_crlf(data: np.ndarray, ends: np.ndarray) -> bool:
    """Whether some line of ``data`` (ending at ``ends``) ends in ``\\r\\n``."""
    inner = ends[ends > 0]
    return bool(np.any(data[inner - 1] == _CARRIAGE_RETURN))


def read_line_range(
    path: str, start: int, end: int, first_line: int | None = None
) -> Iterator[pa.RecordBatch]:
    """The lines of bytes ``[start, end)`` of ``path``, as record batches of ``value``,
    and of ``seq`` (each line's number, from ``first_line``) unless that is None."""
    fields = [("value", pa.binary())]
    if first_line is not None:
        fields.append(("seq", pa.int64()))
    schema = pa.schema(fields)
    line = first_line or 0
    with open(path, "rb", buffering=0) as f:
        f.seek(start)
        position = start
        pending = b""
        while position < end:
            # read straight into a buffer that begins with the last chunk's partial line
            want = min(READ_CHUNK_BYTES, end - position)
            buffer = bytearray(len(pending) + want)
            buffer[: len(pending)] = pending
            got = f.readinto(memoryview(buffer)[len(pending) :])
            if not got:
                raise OSError(f"{path} ended at byte {position}; lines up to {end} were planned")
            del buffer[len(pending) + got :]
            position += got
            cut = buffer.rfind(b"\n") + 1
            pending = bytes(buffer[cut:])
            if cut:
                values = lines_to_array(memoryview(buffer)[:cut])
                columns = [values]
                if first_line is not None:
                    columns.append(pa.array(np.arange(line, line + len(values), dtype=np.int64)))
                line += len(values)
                yield pa.RecordBatch.from_arrays(columns, schema=schema)
        if pending:
            raise OSError(f"{path}: the range ending at byte {end} does not end a line")


class LineRangesDataSource(DataSource):
    """``spark.read.format("herder-line-ranges").option("path", p).option("ranges", json)``.

    ``ranges`` is a JSON list of ``[start, end, first_line]`` byte ranges of whole lines;
    each is one input partition, read on an executor. With ``sequenced=true`` each row
    also gets ``seq``, its line's number.
    """

    @classmethod
    def name(cls) -> str:
        return LINE_RANGES_FORMAT

    @property
    def _sequenced(self) -> bool:
        return self.options.get("sequenced", "false") == "true"

    def schema(self) -> str:
        return SEQUENCED_LINE_RANGES_DDL if self._sequenced else LINE_RANGES_DDL

    def reader(self, schema: StructType) -> DataSourceReader:
        ranges = [
            ByteRange(int(a), int(b), int(n)) for a, b, n in json.loads(self.options["ranges"])
        ]
        return _LineRangesReader(self.options["path"], ranges, self._sequenced)


class _LineRangesReader(DataSourceReader):
    def __init__(self, path: str, ranges: list[ByteRange], sequenced: bool) -> None:
        self.path = path
        self.ranges = ranges
        self.sequenced = sequenced

    def partitions(self) -> Sequence[InputPartition]:
        return self.ranges

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, ByteRange)
        first = partition.first_line if self.sequenced else None
        yield from read_line_range(self.path, partition.start, partition.end, first)


#: sessions that know the data source already (registering again makes Spark warn)
_registered: weakref.WeakSet[SparkSession] = weakref.WeakSet()
_registering = threading.Lock()


def line_ranges_dataframe(
    session: SparkSession, path: str, ranges: Sequence[ByteRange], *, sequenced: bool = False
) -> DataFrame:
    """A DataFrame (``value binary``) of the lines in ``ranges`` of ``path``, in order;
    ``sequenced`` adds ``seq``, each line's number (``ranges`` from :func:`number_lines`)."""
    with _registering:
        if session not in _registered:
            session.dataSource.register(LineRangesDataSource)
            _registered.add(session)
    return (
        session.read.format(LINE_RANGES_FORMAT)
        .option("path", os.path.abspath(path))
        .option("ranges", json.dumps([[r.start, r.end, r.first_line] for r in ranges]))
        .option("sequenced", str(sequenced).lower())
        .load()
    )
