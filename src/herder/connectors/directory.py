"""DirectorySource and DirectorySink: files that Spark reads and writes, into and out of topics.

**DirectorySource** picks up new files in a directory (Parquet, CSV or JSON lines) and
has Spark's own readers read them, in parallel on the executors: a poll plans which
files make the batch and returns a :class:`~herder.connect.SourceBatch` of them, with
one source offset per file (``{"directory": d, "file": name}`` → its size and
modification time), committed with the records in the batch's one transaction. Each
row becomes a record whose value is the row as a JSON object (Connect's JSON converter
without schemas) or, with ``value.converter.schemas.enable=true``, a typed record: a
struct of the row's columns with the file's types, carried natively in the topic
(:mod:`herder.dataplane.typed`). A file is read once:
files are expected to arrive whole (written elsewhere and moved in, or written under a
name starting with ``.`` or ``_``, which are skipped, and renamed when done); a file
that changes after it was read is not read again. With ``tasks.max`` above 1 the files
are shared out among the tasks by a hash of their names (BLAKE2b modulo the number of
tasks), so each file has one reader and a directory of many files is read by several
tasks at once; each task's batches go to the topic's partitions like any keyless
records (one partition a batch, rotating), so a topic of several partitions fills
evenly.

**DirectorySink** writes each batch it is given with Spark, as Parquet, CSV, JSON lines
or text, in files named ``<topic>+<partition>+<base offset, 20 digits>.<format>``, each
holding a run of the partition's offsets from its base offset on. When the batch's
Spark partitions each hold a range of offsets
(:meth:`~herder.connect.SinkTaskContext.offset_ranges`: the runtime reads a topic's
files one Spark partition each), each partition's task writes the file of its range,
with no shuffle and nothing to join afterwards; otherwise a batch has one file per
topic partition, from the partition's first offset in the batch. Either way the files
of a batch follow from the offsets it holds. Each file is written under a temporary
name (in ``_tmp/``, which Spark's readers skip) and renamed into place, so a reader
never sees half a file and a batch delivered again — after a crash, or by a zombie
task that lost its partitions — replaces itself instead of being added twice. When it
is given partitions, a task deletes the files of those partitions from their committed
offset on (written but never committed; they will come again).

For text, a record's value is the line; for JSON, the value (a JSON document) is written
as it is, or parsed with ``schema``; for Parquet and CSV, values are JSON objects parsed
with ``schema`` or, without one, with the schema Spark infers from the batch (which
costs one more pass over it, and orders columns by name). Typed values (a topic's
native columns) are written with their types: a struct's fields as the columns
(Parquet, CSV, JSON), as text the line ``value.converter`` makes of each
(JsonConverter's envelope with ``schemas.enable=true``, plain JSON without). With
``value.converter.schemas.enable=true``, values of bytes are JsonConverter envelopes
(a topic written before typed columns), written with the types their schemas give, a
batch whose records' schemas differ with every field of them all. CSV is read and
written as
RFC 4180 has it: a quote inside a quoted field is doubled.

The sink's directory must be on a local (or mounted) filesystem, where a rename
replaces its target atomically. A batch's files, and their names in the directory, are
flushed to disk before ``put`` returns, so the offsets committed after it never point
past what a power loss can take.
"""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import itertools
import logging
import os
import re
import shutil
import threading
import time
import uuid
from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from herder.config import ConfigDef, Importance, Range, Type, ValidString
from herder.connect import (
    OffsetRange,
    SinkConnector,
    SinkTask,
    SourceBatch,
    SourceConnector,
    SourceTask,
    TopicPartition,
    partitions_of,
    rows_in,
)
from herder.connectors.spark_files import hidden, is_data_file, is_first_part, join_parts
from herder.dataplane.transforms.converters import Converter
from herder.errors import ConfigError
from herder.files import WriteBehind, fsync_path, write_all

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.fs as pafs
    from pyspark.sql import DataFrame, DataFrameWriter
    from pyspark.sql.types import DataType

log = logging.getLogger(__name__)

VERSION = "1.0"
DIRECTORY = "directory"
FORMAT = "format"
TOPIC = "topic"
TOPICS = "topics"
SCHEMA = "schema"
CSV_HEADER = "csv.header"
FILE_PATTERN = "file.pattern"
BATCH_MAX_FILES = "batch.max.files"
POLL_INTERVAL_MS = "poll.interval.ms"
SCHEMAS_ENABLE = "value.converter.schemas.enable"

SOURCE_FORMATS = ("parquet", "csv", "json")
SINK_FORMATS = ("parquet", "csv", "json", "text")
_EXTENSIONS = {"parquet": "parquet", "csv": "csv", "json": "json", "text": "txt"}
TEMP_DIR = "_tmp"
#: Set on each DirectorySource and DirectorySink task's config: its number, and how many
#: tasks there are.
TASK_INDEX = "task.index"
TASK_COUNT = "task.count"
_TEMP = re.compile(r"task(?P<index>\d+)-(?P<run>[0-9a-f]{32})-\d+")
_OUTPUT = re.compile(r"(?P<topic>.+)\+(?P<partition>\d+)\+(?P<base>\d{20})\.(?P<ext>\w+)")
#: Spark's name for a write task's file: ``part-<its partition, 5 digits>-<job>…``
_PART = re.compile(r"part-(?P<index>\d+)-")


# -- source ------------------------------------------------------------------------------


class DirectorySourceConnector(SourceConnector):
    """New files of ``directory`` (``format``: parquet, csv or json) into ``topic``, shared
    out among up to ``tasks.max`` tasks by file name."""

    def version(self) -> str:
        return VERSION

    def config_def(self) -> ConfigDef:
        return (
            ConfigDef()
            .define(DIRECTORY, Type.STRING, importance=Importance.HIGH,
                    documentation="The directory to read new files from: a path, or a URI"
                    " such as s3a://bucket/in.")
            .define(FORMAT, Type.STRING, validator=ValidString.in_(*SOURCE_FORMATS),
                    importance=Importance.HIGH,
                    documentation="How the files are written: parquet, csv or json (lines).")
            .define(TOPIC, Type.STRING, importance=Importance.HIGH,
                    documentation="The topic to write the rows to.")
            .define(SCHEMA, Type.STRING, default="", importance=Importance.MEDIUM,
                    documentation="The files' schema as a Spark DDL string ('id long,"
                    " name string'); empty to take Parquet's own, infer JSON's, and read"
                    " every CSV column as a string.")
            .define(CSV_HEADER, Type.BOOLEAN, default=True, importance=Importance.LOW,
                    documentation="Whether the first line of each CSV file names its columns.")
            .define(FILE_PATTERN, Type.STRING, default="*", importance=Importance.LOW,
                    documentation="A glob that names the files to read (names starting with"
                    " . or _ are always skipped).")
            .define(BATCH_MAX_FILES, Type.INT, default=1000, validator=Range.at_least(1),
                    importance=Importance.LOW, documentation="Most files one batch reads.")
            .define(POLL_INTERVAL_MS, Type.INT, default=1000, validator=Range.at_least(1),
                    importance=Importance.LOW,
                    documentation="How long a poll waits for new files.")
            .define(SCHEMAS_ENABLE, Type.BOOLEAN, default=False, importance=Importance.MEDIUM,
                    documentation="Write typed records (the row as a struct of its columns)"
                    " that keep the files' column types.")
        )  # fmt: skip

    def start(self, config: dict[str, str]) -> None:
        self.config = dict(config)

    def task_class(self) -> type[SourceTask]:
        return DirectorySourceTask

    def task_configs(self, max_tasks: int) -> list[dict[str, str]]:
        # every task lists the directory, and reads the files whose names hash to it: two
        # tasks never read the same file
        return [
            {**self.config, TASK_INDEX: str(i), TASK_COUNT: str(max_tasks)}
            for i in range(max_tasks)
        ]

    def stop(self) -> None:
        return None


class _Listing:
    """A directory's files, by name, through pyarrow's filesystems."""

    def __init__(self, directory: str) -> None:
        from herder.dataplane.storage import filesystem

        try:
            self.fs, self.base, self.spark_base = filesystem(directory)
        except ValueError as exc:
            raise ConfigError(f"{DIRECTORY}={directory!r} cannot be listed: {exc}") from exc

    def files(self) -> list[pafs.FileInfo]:
        import pyarrow.fs as pafs

        selector = pafs.FileSelector(self.base, allow_not_found=True)
        return [i for i in self.fs.get_file_info(selector) if i.type == pafs.FileType.File]

    def spark_path(self, name: str) -> str:
        """``name`` as a Spark read takes it (see :func:`~herder.dataplane.storage.literal`)."""
        from herder.dataplane.storage import literal

        return literal(f"{self.spark_base}/{name}")


class DirectorySourceTask(SourceTask):
    """Each poll: the unread files of the directory that are this task's, oldest first,
    as one SourceBatch."""

    def version(self) -> str:
        return VERSION

    def start(self, config: dict[str, str]) -> None:
        settings = DirectorySourceConnector().config_def().parse(config)
        self.directory: str = settings[DIRECTORY]
        self.format: str = settings[FORMAT]
        self.topic: str = settings[TOPIC]
        self.schema: str = settings[SCHEMA]
        self.csv_header: bool = settings[CSV_HEADER]
        self.pattern: str = settings[FILE_PATTERN]
        self.max_files: int = settings[BATCH_MAX_FILES]
        self.poll_interval = settings[POLL_INTERVAL_MS] / 1000
        self.typed: bool = settings[SCHEMAS_ENABLE]
        self.listing = _Listing(self.directory)
        # a config written before files were shared out (no task.count) reads them all
        self.task_index = int(config.get(TASK_INDEX, "0"))
        self.task_count = int(config.get(TASK_COUNT, "1"))
        #: files read (committed, or returned in a batch since this task started)
        self.read: set[str] = set()
        self._stopping = threading.Event()

    def _partition(self, name: str) -> dict[str, Any]:
        return {"directory": self.directory, "file": name}

    def _unread(self) -> list[pafs.FileInfo]:
        fresh = [
            info
            for info in self.listing.files()
            if info.base_name not in self.read
            and not hidden(info.base_name)
            and fnmatch.fnmatchcase(info.base_name, self.pattern)
            and self.owns(info.base_name)
        ]
        if not fresh:
            return []
        partitions = [self._partition(i.base_name) for i in fresh]
        committed = self.context.offset_reader.offsets(partitions)
        unread = []
        for info, offset in zip(fresh, committed, strict=True):
            if offset is None:
                unread.append(info)
            else:
                self.read.add(info.base_name)
        return unread

    def owns(self, name: str) -> bool:
        """Whether file ``name`` is this task's to read (see the module's docstring)."""
        if self.task_count == 1:
            return True
        # a well-mixed hash: CRC-32 of names that differ in a digit or two (part-1,
        # part-2, ...) falls into a few residues only
        digest = hashlib.blake2b(name.encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big") % self.task_count == self.task_index

    def poll(self) -> SourceBatch | None:
        deadline = time.monotonic() + self.poll_interval
        while not self._stopping.is_set():
            unread = self._unread()
            if unread:
                return self._batch(unread)
            if time.monotonic() >= deadline:
                return None
            self._stopping.wait(min(0.1, self.poll_interval))
        return None

    def _batch(self, unread: list[pafs.FileInfo]) -> SourceBatch:
        """The oldest unread files as one batch: which files, and their offsets, fixed
        here before Spark reads any of them."""
        from pyspark.sql import functions as F

        from herder.dataplane.spark import spark_runtime

        chosen = sorted(unread, key=lambda i: (i.mtime_ns or 0, i.base_name))[: self.max_files]
        reader = spark_runtime().session.read.format(self.format)
        if self.schema:
            reader = reader.schema(self.schema)
        if self.format == "csv":
            reader = reader.option("header", str(self.csv_header).lower()).option("escape", '"')
        rows = reader.load([self.listing.spark_path(i.base_name) for i in chosen])
        row = F.struct(*[F.col(f"`{c}`") for c in rows.columns])
        if self.typed:
            # a typed value: the row with its columns' types, stored as it is
            data = rows.select(row.alias("value"))
        else:
            data = rows.select(F.to_json(row).alias("value"))
        offsets = [
            (self._partition(i.base_name), {"size": i.size, "modified_ns": i.mtime_ns})
            for i in chosen
        ]
        self.read.update(i.base_name for i in chosen)
        log.info("%s: reading %d new files into %s", self.directory, len(chosen), self.topic)
        return SourceBatch(data, offsets, self.topic)

    def stop(self) -> None:
        self._stopping.set()


# -- sink --------------------------------------------------------------------------------


class DirectorySinkConnector(SinkConnector):
    """Writes the records of ``topics`` into ``directory`` as ``format`` files."""

    def version(self) -> str:
        return VERSION

    def config_def(self) -> ConfigDef:
        return (
            ConfigDef()
            .define(DIRECTORY, Type.STRING, importance=Importance.HIGH,
                    documentation="The directory to write files into (a local or mounted"
                    " filesystem: files are renamed into place).")
            .define(FORMAT, Type.STRING, validator=ValidString.in_(*SINK_FORMATS),
                    importance=Importance.HIGH,
                    documentation="parquet, csv, json (lines) or text (each value a line).")
            .define(TOPICS, Type.LIST, default="", importance=Importance.HIGH,
                    documentation="The topics to read.")
            .define(SCHEMA, Type.STRING, default="", importance=Importance.MEDIUM,
                    documentation="The schema of the values (JSON objects) as a Spark DDL"
                    " string, for parquet, csv and json; empty to infer it from each batch"
                    " (parquet, csv) or write values as they are (json).")
            .define(CSV_HEADER, Type.BOOLEAN, default=True, importance=Importance.LOW,
                    documentation="Whether each CSV file starts with a line of column names.")
            .define(SCHEMAS_ENABLE, Type.BOOLEAN, default=False, importance=Importance.MEDIUM,
                    documentation="Values of bytes are typed records (JsonConverter's"
                    " envelope): write them with the types of their schemas; typed values"
                    " as text lines: as envelopes.")
        )  # fmt: skip

    def start(self, config: dict[str, str]) -> None:
        self.config = dict(config)
        directory = self.config.get(DIRECTORY, "")
        if "://" in directory and not directory.startswith("file://"):
            raise ConfigError(
                f"{DIRECTORY}={directory!r}: DirectorySink needs a local or mounted"
                " filesystem (it renames files into place); give a path"
            )

    def task_class(self) -> type[SinkTask]:
        return DirectorySinkTask

    def task_configs(self, max_tasks: int) -> list[dict[str, str]]:
        # files are per partition, so any number of tasks can share the directory; each
        # knows its number, to clean up what an earlier instance of it left in _tmp/
        return [
            {**self.config, TASK_INDEX: str(i), TASK_COUNT: str(max_tasks)}
            for i in range(max_tasks)
        ]

    def stop(self) -> None:
        return None


def output_name(tp: TopicPartition, base_offset: int, fmt: str) -> str:
    """The file holding ``tp``'s records from ``base_offset`` on, of one batch."""
    return f"{tp.topic}+{tp.partition}+{base_offset:020d}.{_EXTENSIONS[fmt]}"


def _part_index(name: str) -> int | None:
    """The Spark partition whose task wrote the file ``name``."""
    found = _PART.match(name)
    return int(found["index"]) if found else None


class DirectorySinkTask(SinkTask):
    """One Spark write per batch; files renamed into place by (topic, partition, base)."""

    offset_ranged = True
    typed_records = True
    # Spark writes every delivery on the executors: ten times the runtime's default
    max_records_per_delivery = 20_000_000

    def version(self) -> str:
        return VERSION

    def start(self, config: dict[str, str]) -> None:
        settings = DirectorySinkConnector().config_def().parse(config)
        directory: str = settings[DIRECTORY]
        self.directory = os.path.abspath(directory.removeprefix("file://"))
        self.format: str = settings[FORMAT]
        self.schema: str = settings[SCHEMA]
        self.csv_header: bool = settings[CSV_HEADER]
        self.typed: bool = settings[SCHEMAS_ENABLE]
        self.topics: list[str] = [t for t in settings[TOPICS] if t]
        self.converter = Converter.from_settings("value", config)
        #: the Spark type of the batch being put, if its values are typed columns
        self._value_type: DataType | None = None
        created = []
        folder = self.directory
        while not os.path.isdir(folder):
            created.append(folder)
            folder = os.path.dirname(folder)
        os.makedirs(self.directory, exist_ok=True)
        for folder in created:  # its entry in its parent, as for the files in it
            fsync_path(os.path.dirname(folder))
        index, count = int(config.get(TASK_INDEX, 0)), int(config.get(TASK_COUNT, 1))
        self._temp_prefix = f"task{index}-{uuid.uuid4().hex}"
        self._temps = itertools.count()
        self._remove_leftovers(index, count)
        #: the first offset of each owned partition's next batch
        self.bases: dict[TopicPartition, int] = {}

    def open(self, partitions: Collection[TopicPartition]) -> None:
        for tp in partitions:
            committed = self.context.committed(tp)
            base = committed[0] if committed is not None else 0
            self.bases[tp] = base
            for name, found_base in self._outputs(tp):
                if found_base >= base:
                    # written, never committed: the records will come again from ``base``
                    os.unlink(os.path.join(self.directory, name))
                    log.info("%s: removed %s, written after the last commit", self.directory, name)

    def _remove_leftovers(self, index: int, count: int) -> None:
        """Delete what earlier instances of this task (and, for task 0, tasks numbered
        past the current count) left half written in ``_tmp/`` when they crashed.

        An earlier instance may still be running, a zombie: its write then fails, as
        its commit would have been refused anyway.
        """
        temps = os.path.join(self.directory, TEMP_DIR)
        try:
            names = os.listdir(temps)
        except FileNotFoundError:
            return
        for name in names:
            found = _TEMP.fullmatch(name)
            if found is None or name.startswith(self._temp_prefix):
                continue
            owner = int(found["index"])
            if owner == index or (index == 0 and owner >= count):
                shutil.rmtree(os.path.join(temps, name), ignore_errors=True)
                log.info("%s: removed %s, left by an earlier instance", self.directory, name)

    def _outputs(self, tp: TopicPartition) -> list[tuple[str, int]]:
        found = []
        for name in os.listdir(self.directory):
            match = _OUTPUT.fullmatch(name)
            if (
                match
                and match["topic"] == tp.topic
                and int(match["partition"]) == tp.partition
                and match["ext"] == _EXTENSIONS[self.format]
            ):
                found.append((name, int(match["base"])))
        return found

    def put(self, df: DataFrame) -> None:
        from pyspark.sql import types as T

        owned = sorted(self.bases)
        if not owned:
            return
        value_type = df.schema["value"].dataType
        # bytes, or bytes as text (see columns_read): no typed value is a string
        plain = isinstance(value_type, T.BinaryType | T.StringType)
        self._value_type = None if plain else value_type
        temp = os.path.join(self.directory, TEMP_DIR, f"{self._temp_prefix}-{next(self._temps)}")
        try:
            ranges = self.context.offset_ranges()
            if ranges is not None:
                outputs = self._write_ranges(df, temp, ranges)
            else:
                outputs = self._write_batch(df, temp, owned)
            for path in outputs.values():
                fsync_path(path)
            self._place(outputs)
        finally:
            shutil.rmtree(temp, ignore_errors=True)

    def _place(self, outputs: dict[str, str]) -> None:
        """Rename flushed outputs (name → path in the task's temporary directory) into
        place, then flush the directory's entries."""
        for name, path in outputs.items():
            os.replace(path, os.path.join(self.directory, name))
        if outputs:
            fsync_path(self.directory)

    def columns_read(self) -> dict[str, str | None]:
        # a ranged put writes each range's values to the file named by its first offset;
        # lines of text are written from strings
        return {"value": "string" if self.format == "text" else None}

    def accepts_arrow(self) -> bool:
        # values written as they are, a line each: no Spark expression to apply
        return self.format == "text" or (
            self.format == "json" and not self.schema and not self.typed
        )

    def put_arrow(self, table: pa.Table) -> None:
        """A small batch of values of bytes as lines, written here rather than by Spark:
        per partition, the file of its records from its first offset in the batch, as
        :meth:`_write_batch` names it, renamed into place and flushed as :meth:`put`'s."""
        if not self.bases:
            return
        temp = os.path.join(self.directory, TEMP_DIR, f"{self._temp_prefix}-{next(self._temps)}")
        os.makedirs(temp)
        try:
            outputs = {}
            for tp, rows in partitions_of(table):
                if tp not in self.bases:
                    continue
                for first, part in self._cut(tp, rows):
                    values = part["value"]
                    if self.format == "json":  # as put does: a null is no document
                        values = values.drop_null()
                    if len(values):
                        name = output_name(tp, first, self.format)
                        outputs[name] = _write_lines(os.path.join(temp, name), values)
            self._place(outputs)
        finally:
            shutil.rmtree(temp, ignore_errors=True)

    def _cut(self, tp: TopicPartition, rows: pa.Table) -> list[tuple[int, pa.Table]]:
        """``tp``'s rows of a put_arrow as outputs and their first offsets: one per
        offset range of the delivery (its pieces, named as a ranged put names them, so
        any instance of the task writes the same outputs), or one for them all."""
        ranges = [r for r in self.context.offset_ranges() or () if r.topic_partition == tp]
        if not ranges:
            return [(rows["offset"][0].as_py(), rows)] if len(rows) else []
        return [(r.from_offset, rows_in(rows, r)) for r in ranges]

    def _write_ranges(
        self, df: DataFrame, temp: str, ranges: Sequence[OffsetRange]
    ) -> dict[str, str]:
        """Write a DataFrame whose Spark partitions hold ``ranges``: each partition's
        file is the output of its range, named by the range's first offset. No shuffle,
        no sort, no join; a range whose records a transform all dropped has no output."""
        began = time.monotonic()
        with WriteBehind(temp, is_data_file):
            self._save(self._rows(df, located=False).write, temp)
        parts: dict[int, list[str]] = {}
        for path in self._data_files(temp, several=True):  # in name order: c000, c001, …
            index = _part_index(os.path.basename(path))
            if index is None or index >= len(ranges):
                raise RuntimeError(f"Spark wrote {path}, which no offset range of the batch has")
            parts.setdefault(index, []).append(path)
        outputs = {}
        for index, paths in parts.items():
            path = paths[0]
            if len(paths) > 1:  # a partition cut into files (spark.sql.files.maxRecordsPerFile)
                path = os.path.join(temp, f"range-{index}")
                join_parts(paths, path)
            tp, first = ranges[index].topic_partition, ranges[index].from_offset
            outputs[output_name(tp, first, self.format)] = path
        log.debug(
            "%s: Spark wrote %d ranges in %.3f s",
            self.directory,
            len(ranges),
            time.monotonic() - began,
        )
        return outputs

    def _write_batch(self, df: DataFrame, temp: str, owned: list[TopicPartition]) -> dict[str, str]:
        """Write a batch whose Spark partitions do not follow offset ranges: one output
        per owned partition, named by its base offset."""
        began = time.monotonic()
        single = len(owned) == 1
        # Spark's parts joined into the partition's one file
        joined = single and self._lines
        if joined:
            # the runtime's rows come in offset order, spread over Spark partitions in
            # that order: their files, one after another, are the partition's file
            writer = self._rows(df, located=False).write
        elif single:
            # one Spark task, to write one file, keeps the runtime's offset order
            writer = self._rows(df, located=False).coalesce(1).write
        else:
            writer = (
                self._rows(df, located=True)
                .repartition("topic", "partition")
                .sortWithinPartitions("topic", "partition", "offset")
                .drop("offset")
                .write.partitionBy("topic", "partition")
            )
        # of parts to be joined, the first one is kept, the others copied into it
        wanted = is_first_part if joined else is_data_file
        with WriteBehind(temp, wanted):
            self._save(writer, temp)
        written = time.monotonic()
        if joined:
            join_parts(self._data_files(temp, several=True), os.path.join(temp, "lines"))
        log.debug(
            "%s: Spark wrote a batch in %.3f s, its files were joined in %.3f s",
            self.directory,
            written - began,
            time.monotonic() - written,
        )
        return {
            output_name(tp, self.bases[tp], self.format): path
            for tp, path in self._written(temp, owned).items()
        }

    def _save(self, writer: DataFrameWriter, temp: str) -> None:
        if self.format == "csv":
            writer = writer.option("header", str(self.csv_header).lower()).option("escape", '"')
        writer.format("text" if self._lines else self.format).save(temp)

    @property
    def _lines(self) -> bool:
        """Whether values are written as they are, a line each (text, and JSON as given)."""
        return self.format == "text" or (
            self.format == "json" and not self.schema and not self.typed and not self._value_type
        )

    def _rows(self, df: DataFrame, *, located: bool) -> DataFrame:
        """``df`` as the columns to write, with ``topic``, ``partition`` and ``offset`` if
        ``located`` (a write of several partitions, which sorts and splits by them)."""
        from pyspark.sql import functions as F

        where = ["topic", "partition", "offset"] if located else []
        if self._value_type is not None:
            return self._typed_rows(df, where, self._value_type)
        value = F.col("value").cast("string").alias("value")
        if self.format == "text":
            if not where and df.dtypes == [("value", "string")]:
                # a scan of values read as text (see columns_read): written as it is,
                # with no projection copying each row
                return df
            return df.select(*where, value)
        if self.format == "json" and not self.schema:
            return df.where(F.col("value").isNotNull()).select(*where, value)
        if self.typed:
            from herder.dataplane.schemas import distinct_schemas, merged_struct, with_decoded

            present = df.where(F.col("value").isNotNull())
            schemas = distinct_schemas(present)
            if not schemas:
                return present.select(*where)
            typed = with_decoded(present, {"_row": ("value", merged_struct(schemas))})
            return typed.select(*where, "_row.*")
        values = df.where(F.col("value").isNotNull()).select(*where, value)
        schema: Any = self.schema
        if not schema:
            schema = df.sparkSession.read.json(values.select("value")).schema
        parsed = values.select(*where, F.from_json("value", schema).alias("_row"))
        return parsed.select(*where, "_row.*")

    def _typed_rows(self, df: DataFrame, where: list[str], dtype: DataType) -> DataFrame:
        """Typed values (see :mod:`herder.dataplane.typed`) as the columns to write: a
        struct's fields with their types (Parquet, CSV, JSON), any other value as a
        ``value`` column; for text, each value's line as ``value.converter``
        serialises it (JsonConverter with ``schemas.enable=true``: its envelope)."""
        from pyspark.sql import functions as F
        from pyspark.sql import types as T

        present = df.where(F.col("value").isNotNull())
        if self.format == "text":
            topics = ", ".join(self.topics)
            line = self.converter.serialize_typed(F.col("value"), dtype, topics)
            return present.select(*where, line.cast("string").alias("value"))
        if isinstance(dtype, T.StructType):
            return present.select(*where, "value.*")
        return present.select(*where, "value")

    def _written(self, temp: str, owned: list[TopicPartition]) -> dict[TopicPartition, str]:
        """The one data file Spark wrote for each partition, by partition."""
        written = {}
        if len(owned) == 1:
            for path in self._data_files(temp):
                written[owned[0]] = path
            return written
        for tp in owned:
            folder = os.path.join(temp, f"topic={tp.topic}", f"partition={tp.partition}")
            for path in self._data_files(folder):
                written[tp] = path
        return written

    def _data_files(self, folder: str, *, several: bool = False) -> list[str]:
        """Files Spark wrote in ``folder`` that hold rows, in name order (which is Spark's
        partition order); at most one unless ``several``."""
        try:
            names = sorted(n for n in os.listdir(folder) if not hidden(n))
        except FileNotFoundError:
            return []
        paths = [os.path.join(folder, n) for n in names]
        if len(paths) > 1 and not several:
            raise RuntimeError(f"Spark wrote {len(paths)} files in {folder}; one was expected")
        return [p for p in paths if self._has_rows(p)]

    def _has_rows(self, path: str) -> bool:
        if self.format != "parquet":
            return os.path.getsize(path) > 0
        import pyarrow.parquet as pq

        return bool(pq.read_metadata(path).num_rows)

    def pre_commit(self, offsets: Mapping[TopicPartition, int]) -> Mapping[TopicPartition, int]:
        # what is committed now is where each partition's next batch starts
        for tp, offset in offsets.items():
            if tp in self.bases:
                self.bases[tp] = offset
        return offsets

    def close(self, partitions: Collection[TopicPartition]) -> None:
        for tp in partitions:
            self.bases.pop(tp, None)

    def stop(self) -> None:
        # what a put interrupted by a failure left behind; other tasks' are theirs
        temps = os.path.join(self.directory, TEMP_DIR)
        with contextlib.suppress(FileNotFoundError):
            for name in os.listdir(temps):
                if name.startswith(self._temp_prefix):
                    shutil.rmtree(os.path.join(temps, name), ignore_errors=True)


def _write_lines(path: str, values: pa.Array) -> str:
    """A new file at ``path`` of ``values`` as lines, flushed; its path."""
    from herder.connectors.file import lines_data

    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        for data in lines_data(values):
            write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    return path
