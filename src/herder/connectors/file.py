"""FileStreamSource and FileStreamSink: lines of a file into a topic, and back out.

As in Kafka Connect's file connectors (seed 001): the source follows a file as it grows
and records its byte position as the source offset, so a restarted task resumes after
the last line it committed; the sink appends each record's value as a line.

The sink is exactly once across crash-stop failures of its worker: it runs as one task,
records the file's length in the metadata of every offset commit, and on (re)start
truncates the file back to that length, so lines written after the last commit, which
will be delivered again, are not kept twice.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING, Any

from herder.config import ConfigDef, Importance, Range, Type
from herder.connect import (
    SinkConnector,
    SinkTask,
    SourceConnector,
    SourceRecord,
    SourceTask,
    TopicPartition,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

log = logging.getLogger(__name__)

VERSION = "1.0"
FILE = "file"
TOPIC = "topic"
TOPICS = "topics"
BATCH_SIZE = "batch.size"
POLL_INTERVAL_MS = "poll.interval.ms"

_READ_CHUNK = 4 * 1024 * 1024


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
        self.path = config[FILE]
        self.topic = config[TOPIC]
        self.batch_size = int(config.get(BATCH_SIZE, "100000"))
        self.poll_interval = int(config.get(POLL_INTERVAL_MS, "200")) / 1000
        self.partition = {"filename": self.path}
        stored = self.context.offset_reader.offset(self.partition)
        self.position = int(stored["position"]) if stored else 0
        self._file: Any = None
        self._pending = b""

    def _open(self) -> bool:
        if self._file is not None:
            return True
        try:
            self._file = open(self.path, "rb")  # noqa: SIM115 - kept open across polls
        except FileNotFoundError:
            return False
        self._file.seek(self.position)
        return True

    def poll(self) -> list[SourceRecord] | None:
        deadline = time.monotonic() + self.poll_interval
        while True:
            records = self._read_lines()
            if records or time.monotonic() >= deadline:
                return records or None
            time.sleep(min(0.05, self.poll_interval))

    def _read_lines(self) -> list[SourceRecord]:
        if not self._open():
            return []
        records: list[SourceRecord] = []
        while len(records) < self.batch_size:
            chunk = self._file.read(_READ_CHUNK)
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
        table = df.select("value").toArrow()
        values = table.column(0).to_pylist()
        if not values:
            return
        data = b"".join((v if v is not None else b"") + b"\n" for v in values)
        os.pwrite(self._fd, data, self._length)
        self._length += len(data)

    def flush(self, offsets: Mapping[TopicPartition, int]) -> None:
        os.fsync(self._fd)

    def commit_metadata(self, partition: TopicPartition) -> str:
        return str(self._length)

    def stop(self) -> None:
        os.close(self._fd)
