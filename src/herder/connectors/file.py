"""FileStreamSource and FileStreamSink: lines of a file into a topic, and back out.

As in Kafka Connect's file connectors (seed 001): the source follows a file as it grows
and records its byte position as the source offset, so a restarted task resumes after
the last line it committed; the sink appends each record's value as a line.

A large backlog (``parallel.min.bytes`` or more not yet read) is not read line by line
in the task: the task plans byte ranges of whole lines and the position they reach,
and returns a :class:`~herder.connect.SourceBatch` whose lines Spark's executors read in
parallel (:mod:`herder.dataplane.datasource`); the position is committed with the
records as ever. A backlog that is the whole file (a file met for the first time) is
read by Spark's own text reader, and committed only if the file did not grow meanwhile.
Small increments, the steady state of a followed file, are read in the task, which
keeps a line's latency low.

The sink is exactly once across crash-stop failures of its worker: it runs as one task,
records the file's length in the metadata of every offset commit, and on (re)start
truncates the file back to that length, so lines written after the last commit, which
will be delivered again, are not kept twice.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Callable, Collection, Mapping
from typing import TYPE_CHECKING, Any

from herder.config import ConfigDef, Importance, Range, Type
from herder.connect import (
    SinkConnector,
    SinkTask,
    SourceBatch,
    SourceConnector,
    SourceRecord,
    SourceTask,
    TopicPartition,
)
from herder.errors import RetriableError
from herder.files import write_all

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

VERSION = "1.0"
FILE = "file"
TOPIC = "topic"
TOPICS = "topics"
BATCH_SIZE = "batch.size"
POLL_INTERVAL_MS = "poll.interval.ms"
PARALLEL_MIN_BYTES = "parallel.min.bytes"
PARALLEL_SPLIT_BYTES = "parallel.split.bytes"
PARALLEL_MAX_BYTES = "parallel.max.bytes"
PARALLEL_WHOLE_MAX_BYTES = "parallel.whole.max.bytes"

_READ_CHUNK = 4 * 1024 * 1024


def _binary_data(array: Any) -> memoryview:
    """The bytes of a binary Arrow array's values, one after another, without copying."""
    import numpy as np
    import pyarrow as pa

    _, offsets_buffer, data_buffer = array.buffers()
    if len(array) == 0 or data_buffer is None:
        return memoryview(b"")
    wide = pa.types.is_large_binary(array.type)
    offsets = np.frombuffer(offsets_buffer, dtype=np.int64 if wide else np.int32)
    first, last = offsets[array.offset], offsets[array.offset + len(array)]
    return memoryview(data_buffer)[first:last]


def lines_data(values: pa.ChunkedArray) -> list[memoryview]:
    """The bytes of ``values`` (binary) as lines, each value followed by a newline and a
    null an empty line, one buffer per chunk: each value and its newline joined by
    Arrow, so the lines' data buffer is the file's bytes, in order, with no Python
    object per line."""
    import pyarrow as pa
    import pyarrow.compute as pc

    empty, newline = pa.scalar(b"", pa.binary()), pa.scalar(b"\n", pa.binary())
    return [
        _binary_data(
            pc.binary_join_element_wise(
                chunk, empty, newline, null_handling="replace", null_replacement=""
            )
        )
        for chunk in values.chunks
    ]


class FileStreamSourceConnector(SourceConnector):
    """Reads the lines of one file (``file``) into ``topic``; one task."""

    def version(self) -> str:
        return VERSION

    def config_def(self) -> ConfigDef:
        return (
            ConfigDef()
            .define(FILE, Type.STRING, importance=Importance.HIGH,
                    documentation="The file to read; it is followed as it grows.")
            .define(TOPIC, Type.STRING, importance=Importance.HIGH,
                    documentation="The topic to write the lines to.")
            .define(BATCH_SIZE, Type.INT, default=100_000, validator=Range.at_least(1),
                    importance=Importance.LOW, documentation="Most lines returned by one poll.")
            .define(POLL_INTERVAL_MS, Type.INT, default=200, validator=Range.at_least(1),
                    importance=Importance.LOW,
                    documentation="How long a poll waits for the file to grow.")
            .define(PARALLEL_MIN_BYTES, Type.LONG, default=16 * 1024 * 1024,
                    validator=Range.at_least(1), importance=Importance.LOW,
                    documentation="A backlog of at least this many unread bytes is read by"
                    " Spark's executors in parallel, by byte ranges, instead of in the task.")
            .define(PARALLEL_SPLIT_BYTES, Type.LONG, default=64 * 1024 * 1024,
                    validator=Range.at_least(1), importance=Importance.LOW,
                    documentation="Most bytes of the backlog one Spark task reads (fewer when"
                    " that gives every core the same share).")
            .define(PARALLEL_MAX_BYTES, Type.LONG, default=256 * 1024 * 1024,
                    validator=Range.at_least(1), importance=Importance.LOW,
                    documentation="Most bytes of the backlog one batch reads by byte ranges.")
            .define(PARALLEL_WHOLE_MAX_BYTES, Type.LONG, default=8 * 1024**3,
                    validator=Range.at_least(1), importance=Importance.LOW,
                    documentation="A file met from its start, of whole lines and at most this"
                    " many bytes, is one batch read by Spark's own text reader; a bigger one"
                    " is read by byte ranges, parallel.max.bytes a batch.")
        )  # fmt: skip

    def start(self, config: dict[str, str]) -> None:
        self.config = dict(config)

    def task_class(self) -> type[SourceTask]:
        return FileStreamSourceTask

    def task_configs(self, max_tasks: int) -> list[dict[str, str]]:
        # one file, one reader: more tasks would read the same lines twice
        return [dict(self.config)]

    def stop(self) -> None:
        return None


class FileStreamSourceTask(SourceTask):
    """Follows a file; the source offset is the byte position after the last line."""

    def start(self, config: dict[str, str]) -> None:
        settings = FileStreamSourceConnector().config_def().parse(config)
        self.path = settings[FILE]
        self.topic = settings[TOPIC]
        self.batch_size = settings[BATCH_SIZE]
        self.poll_interval = settings[POLL_INTERVAL_MS] / 1000
        self.parallel_min_bytes = settings[PARALLEL_MIN_BYTES]
        self.parallel_split_bytes = settings[PARALLEL_SPLIT_BYTES]
        self.parallel_max_bytes = settings[PARALLEL_MAX_BYTES]
        self.parallel_whole_max_bytes = settings[PARALLEL_WHOLE_MAX_BYTES]
        self.partition = {"filename": self.path}
        stored = self.context.offset_reader.offset(self.partition)
        self.position = int(stored["position"]) if stored else 0
        self._file: Any = None
        self._pending = b""
        #: whether a backlog that is the whole file may go to Spark's text reader (not
        #: after the file grew during such a read: it is being written to)
        self._whole_file_reads = True
        # The runtime gathers the records of several polls into one batch, but a
        # SourceBatch is a batch of its own: one is returned only when no records are
        # waiting for a commit.
        self._records_uncommitted = False

    def _open(self) -> bool:
        if self._file is not None:
            return True
        try:
            self._file = open(self.path, "rb")  # noqa: SIM115 - kept open across polls
        except FileNotFoundError:
            return False
        self._file.seek(self.position)
        return True

    def poll(self) -> list[SourceRecord] | SourceBatch | None:
        deadline = time.monotonic() + self.poll_interval
        while True:
            # Lines are read in the task only up to the size seen here, so a backlog that
            # appears meanwhile goes to Spark whole, at the next turn.
            size = self._size()
            if not self._records_uncommitted:
                backlog = self._plan_backlog(size)
                if backlog is not None:
                    return backlog
            records = self._read_lines(size)
            # While records wait for their commit, the runtime is gathering a batch, and
            # a poll that returns nothing sends it: waiting here would only hold back
            # lines already read (by up to poll.interval.ms).
            if records or self._records_uncommitted or time.monotonic() >= deadline:
                self._records_uncommitted = self._records_uncommitted or bool(records)
                return records or None
            # a stat every 10 ms: a new line waits 5 ms on average to be seen
            time.sleep(min(0.01, self.poll_interval))

    def _size(self) -> int:
        try:
            return os.stat(self.path).st_size
        except FileNotFoundError:
            return 0

    def commit(self) -> None:
        self._records_uncommitted = False

    def _plan_backlog(self, size: int) -> SourceBatch | None:
        """A SourceBatch of the unread whole lines, if there are enough to read in parallel.

        The lines and the position they reach are fixed here, before Spark reads a byte,
        so the position committed with the batch is exactly where it ends. A file read
        from its start to its end, all whole lines, goes to Spark's own text reader; the
        batch then checks, before it commits, that the file did not grow meanwhile
        (:meth:`_check_unchanged`). Anything else is read by planned byte ranges.
        """
        # imported here: they bring pyspark, which finding this plugin should not need
        from herder.dataplane.datasource import (
            balanced_split_bytes,
            last_line_end,
            line_ranges_dataframe,
            plan_line_ranges,
        )
        from herder.dataplane.spark import spark_runtime

        if size - self.position < self.parallel_min_bytes:
            return None
        began = time.monotonic()
        runtime = spark_runtime()
        start = self.position
        whole = self._whole_file(runtime.session, size)
        if whole is not None:
            end, (data, check) = size, whole
            how = "whole by Spark's text reader"
        else:
            end = last_line_end(self.path, start, min(size, start + self.parallel_max_bytes))
            if end - start < self.parallel_min_bytes:
                return None
            check = None
            split = balanced_split_bytes(
                end - start, self.parallel_split_bytes, runtime.parallelism
            )
            ranges = plan_line_ranges(self.path, start, end, split)
            data = line_ranges_dataframe(runtime.session, self.path, ranges)
            how = f"in {len(ranges)} ranges on Spark's executors"
        log.info(
            "%s: reading bytes %d to %d %s (planned in %.3f s)",
            self.path,
            start,
            end,
            how,
            time.monotonic() - began,
        )
        self._seek(end)
        return SourceBatch(data, [(self.partition, {"position": end})], self.topic, check=check)

    def _whole_file(
        self, session: SparkSession, size: int
    ) -> tuple[DataFrame, Callable[[], None]] | None:
        """The whole file's lines read by Spark's text reader, and the check the batch
        makes before it commits, if the backlog is the file (read from its start, all
        whole lines, within ``parallel.whole.max.bytes``) and Spark can be given its path."""
        from herder.dataplane.datasource import (
            file_identity,
            last_line_end,
            whole_file_lines_dataframe,
        )

        if (
            self.position != 0
            or not self._whole_file_reads
            or size > self.parallel_whole_max_bytes
            or last_line_end(self.path, 0, size) != size
        ):
            return None
        identity = file_identity(self.path)
        if identity[2] != size:
            return None
        data = whole_file_lines_dataframe(session, self.path)
        if data is None:
            return None
        return data, functools.partial(self._check_unchanged, identity)

    def _seek(self, position: int) -> None:
        self.position = position
        self._pending = b""
        if self._file is not None:
            self._file.seek(position)

    def _check_unchanged(self, identity: tuple[int, int, int]) -> None:
        """After Spark read the whole file: had it grown (or been replaced), Spark may
        have read a line past the planned end, so the batch is read again by ranges."""
        from herder.dataplane.datasource import file_identity

        try:
            now = file_identity(self.path)
        except FileNotFoundError:
            now = None
        if now == identity:
            return
        self._whole_file_reads = False
        self._seek(0)
        raise RetriableError(
            f"{self.path} changed while Spark read it whole; reading it again by byte ranges"
        )

    def _read_lines(self, size: int) -> list[SourceRecord]:
        """Whole lines up to byte ``size``, ``batch.size`` of them at most."""
        if not self._open():
            return []
        records: list[SourceRecord] = []
        while len(records) < self.batch_size:
            unread = size - self.position - len(self._pending)
            if unread <= 0:
                break
            chunk = self._file.read(min(_READ_CHUNK, unread))
            if not chunk:
                break
            data = self._pending + chunk
            end = data.rfind(b"\n")
            if end < 0:
                self._pending = data
                continue
            self._pending = data[end + 1 :]
            position = self.position
            for line in data[: end + 1].split(b"\n")[:-1]:
                position += len(line) + 1
                text = line[:-1] if line.endswith(b"\r") else line
                records.append(
                    SourceRecord(self.partition, {"position": position}, self.topic, text)
                )
            self.position = position
        return records

    def stop(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class FileStreamSinkConnector(SinkConnector):
    """Appends the value of each record of ``topics`` to ``file`` as a line; one task."""

    def version(self) -> str:
        return VERSION

    def config_def(self) -> ConfigDef:
        return (
            ConfigDef()
            .define(FILE, Type.STRING, importance=Importance.HIGH,
                    documentation="The file to append lines to.")
            .define(TOPICS, Type.LIST, default="", importance=Importance.HIGH,
                    documentation="The topics to read.")
        )  # fmt: skip

    def start(self, config: dict[str, str]) -> None:
        self.config = dict(config)

    def task_class(self) -> type[SinkTask]:
        return FileStreamSinkTask

    def task_configs(self, max_tasks: int) -> list[dict[str, str]]:
        # exactly once rests on one writer owning the file and its committed length
        return [dict(self.config)]

    def stop(self) -> None:
        return None


class FileStreamSinkTask(SinkTask):
    """Appends values as lines; commits the file length with every offset commit."""

    def start(self, config: dict[str, str]) -> None:
        self.path = config[FILE]
        directory = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(directory, exist_ok=True)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o644)
        self._length = os.lseek(self._fd, 0, os.SEEK_END)

    def open(self, partitions: Collection[TopicPartition]) -> None:
        # The runtime commits every newly opened partition before its first put, so a
        # length is always on record: the next record goes right after it. Undo whatever
        # was appended after it, since those records will be delivered again. The length
        # seen at start() is no guide: an earlier owner of the partitions may have
        # written and committed more since.
        lengths = []
        for tp in partitions:
            committed = self.context.committed(tp)
            if committed is not None and committed[1].isdigit():
                lengths.append(int(committed[1]))
        if not lengths:
            return
        length = max(lengths)
        size = os.fstat(self._fd).st_size
        if size > length:
            os.ftruncate(self._fd, length)
            os.fsync(self._fd)
        elif size < length:
            log.warning(
                "%s is shorter (%d bytes) than the length committed with its offsets (%d):"
                " it was truncated or replaced outside herder; appending at its end",
                self.path,
                size,
                length,
            )
        self._length = min(size, length)

    def put(self, df: DataFrame) -> None:
        self._append(df.select("value").toArrow().column(0))

    def accepts_arrow(self) -> bool:
        return True

    def put_arrow(self, table: pa.Table) -> None:
        self._append(table.column("value"))

    def _append(self, values: pa.ChunkedArray) -> None:
        """Append each of ``values`` and a newline (a null as an empty line)."""
        for data in lines_data(values):
            write_all(self._fd, data, self._length)
            self._length += len(data)

    def flush(self, offsets: Mapping[TopicPartition, int]) -> None:
        os.fsync(self._fd)

    def commit_metadata(self, partition: TopicPartition) -> str:
        return str(self._length)

    def stop(self) -> None:
        os.close(self._fd)
