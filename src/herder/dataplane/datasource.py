"""Lines of a file read in parallel on Spark's executors, by planned byte ranges.

A source with a large backlog in a file should not pass every line through the
driver's Python (SPARK_NOTES: Python rows into Spark are the pipeline's slowest step).
Instead the driver *plans*: it cuts the backlog ``[start, end)`` into byte ranges that
each begin and end on a line boundary (:func:`plan_line_ranges`, a few small reads
near each cut), and the offset the batch reaches is ``end``, known before any job
runs. The ranges then go to :class:`LineRangesDataSource`, a Python Data Source
(``pyspark.sql.datasource``) whose reader runs on the executors, one input partition
per range, and yields Arrow record batches built with numpy — no Python object per
line. One range is one Spark partition, and the ranges come in file order, so the
DataFrame's rows are the lines in order: staged to one topic partition as they come,
they get their offsets in that order without being numbered (see
:mod:`herder.dataplane.writer`).

A backlog that is the whole of a file is read by Spark's own text reader instead
(:func:`whole_file_lines_dataframe`), which costs less than any Python reader: Spark
splits it and reads the splits in parallel, in file order, one split per core (up to
:data:`WHOLE_FILE_SPLIT_MAX_BYTES` each). That reader trusts the size
it listed and reads one line past a split's end, so a file that grows during the job
gives an extra line: the caller checks, once the job is done, that the file still has
the size it planned for (:func:`file_identity`).

Lines are split on ``\\n``; a ``\\r`` before it is dropped, as FileStreamSource does.
The text reader gives each line's bytes as they are in a ``string`` column (Spark does
not decode them); they are staged as they come, without a copy into ``binary``, unless
the file holds a ``\\r`` at all, which costs an expression per line.
"""

from __future__ import annotations

import json
import os
import re
import threading
import weakref
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from itertools import pairwise
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from herder.files import holds_byte

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

#: The name Spark knows the data source by (``spark.read.format(...)``).
LINE_RANGES_FORMAT = "herder-line-ranges"
LINE_RANGES_DDL = "value binary"
#: How much of a file one Arrow batch is built from.
READ_CHUNK_BYTES = 8 * 1024 * 1024
#: How far the planner looks past a cut for the end of its line before giving up on it.
_SCAN_BYTES = 64 * 1024

#: Paths Spark's text reader takes as they are (it reads globs and URIs): others are
#: read by byte ranges.
_PLAIN_PATH = re.compile(r"/[A-Za-z0-9._/+-]*")
_SCHEMA = pa.schema([("value", pa.binary())])
_NEWLINE = 10
_CARRIAGE_RETURN = 13


@dataclass(frozen=True)
class ByteRange(InputPartition):
    """Bytes ``[start, end)`` of a file: whole lines, the last one ending in ``\\n``."""

    start: int
    end: int


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


def read_line_range(path: str, start: int, end: int) -> Iterator[pa.RecordBatch]:
    """The lines of bytes ``[start, end)`` of ``path``, as record batches of ``value``."""
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
                yield pa.RecordBatch.from_arrays([values], schema=_SCHEMA)
        if pending:
            raise OSError(f"{path}: the range ending at byte {end} does not end a line")


class LineRangesDataSource(DataSource):
    """``spark.read.format("herder-line-ranges").option("path", p).option("ranges", json)``.

    ``ranges`` is a JSON list of ``[start, end]`` byte ranges of whole lines; each is
    one input partition, read on an executor.
    """

    @classmethod
    def name(cls) -> str:
        return LINE_RANGES_FORMAT

    def schema(self) -> str:
        return LINE_RANGES_DDL

    def reader(self, schema: StructType) -> DataSourceReader:
        ranges = [ByteRange(int(a), int(b)) for a, b in json.loads(self.options["ranges"])]
        return _LineRangesReader(self.options["path"], ranges)


class _LineRangesReader(DataSourceReader):
    def __init__(self, path: str, ranges: list[ByteRange]) -> None:
        self.path = path
        self.ranges = ranges

    def partitions(self) -> Sequence[InputPartition]:
        return self.ranges

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, ByteRange)
        yield from read_line_range(self.path, partition.start, partition.end)


#: sessions that know the data source already (registering again makes Spark warn)
_registered: weakref.WeakSet[SparkSession] = weakref.WeakSet()
_registering = threading.Lock()


def line_ranges_dataframe(
    session: SparkSession, path: str, ranges: Sequence[ByteRange]
) -> DataFrame:
    """A DataFrame (``value binary``) of the lines in ``ranges`` of ``path``, in order:
    one Spark partition per range."""
    with _registering:
        if session not in _registered:
            session.dataSource.register(LineRangesDataSource)
            _registered.add(session)
    return (
        session.read.format(LINE_RANGES_FORMAT)
        .option("path", os.path.abspath(path))
        .option("ranges", json.dumps([[r.start, r.end] for r in ranges]))
        .load()
    )


def file_identity(path: str) -> tuple[int, int, int]:
    """The file at ``path`` as (device, inode, size): a file only appended to keeps the
    first two, and its size says whether it grew."""
    stat = os.stat(path)
    return stat.st_dev, stat.st_ino, stat.st_size


#: Spark's setting for the most bytes of a file one split reads.
MAX_PARTITION_BYTES = "spark.sql.files.maxPartitionBytes"
#: Most bytes of a whole file one Spark task reads (:func:`whole_file_lines_dataframe`).
#: Spark cuts a file into its share of the cores, or into 128 MiB splits if that is
#: less: 1 GB of lines on 2 cores would be 8 tasks. Each task is one more staged file
#: or more for a sink to read, and costs Spark a task's start and its writer's: staged
#: in 2 splits, 10,000,000 lines of 100 bytes took 1.59 s against 1.72 s in 8 (medians
#: of 8, alternating, in one process; plain Spark's 8 splits took 1.75 s). A bound
#: remains so that a big file on few cores is still cut into tasks a retry can redo.
WHOLE_FILE_SPLIT_MAX_BYTES = 1 << 30
_WHOLE_FILE_SPLITS = {MAX_PARTITION_BYTES: str(WHOLE_FILE_SPLIT_MAX_BYTES)}


def whole_file_lines_dataframe(session: SparkSession, path: str) -> DataFrame | None:
    """A DataFrame (``value``: each line's bytes, typed ``string``) of every line of
    ``path`` read by Spark's text reader, in order; None if Spark cannot be given the
    path as it is.

    The file must end in ``\\n`` and must not grow until the job is done (see the module
    docstring): compare :func:`file_identity` before and after.

    Unless ``session`` sets ``spark.sql.files.maxPartitionBytes`` (the worker's
    properties, say), the file is read in a :func:`~herder.dataplane.spark.derived_session`
    that cuts it into one split per core, up to :data:`WHOLE_FILE_SPLIT_MAX_BYTES` each,
    rather than Spark's 128 MiB splits (see :data:`WHOLE_FILE_SPLIT_MAX_BYTES`).
    """
    from pyspark.sql import functions as F

    from herder.dataplane.spark import derived_session

    path = os.path.abspath(path)
    if not _PLAIN_PATH.fullmatch(path):
        return None
    if session.conf.get(MAX_PARTITION_BYTES, None) is None:
        session = derived_session(session, _WHOLE_FILE_SPLITS) or session
    # the file is searched while Spark's JVM plans its read, neither holding the GIL:
    # 200 MB were planned in 31-33 ms that way, against 38-39 ms one after the other
    with ThreadPoolExecutor(1, thread_name_prefix="herder-line-ends") as search:
        carriage_return = search.submit(holds_byte, path, ord("\r"))
        # "\r\n" ends a line as "\n" does; a lone "\r" belongs to its line (so lineSep
        # is "\n")
        lines = session.read.option("lineSep", "\n").text(f"file://{path}")
        if not carriage_return.result():
            return lines
    # bytes, not characters: a line need not be UTF-8, and a string's length counts
    # code points; only the lines that end in "\r" pay for the copy
    stripped = F.expr(
        "CASE WHEN endswith(value, '\\r')"
        " THEN CAST(substring(CAST(value AS BINARY), 1, octet_length(value) - 1) AS STRING)"
        " ELSE value END"
    )
    return lines.select(stripped.alias("value"))
