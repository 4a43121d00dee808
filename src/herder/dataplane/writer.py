"""Staging: one Spark job writes a batch of records as Parquet, ready to commit.

A :class:`SegmentWriter` belongs to one writer incarnation — a source task with its
fencing epoch — and stages each batch into a directory of its own
(``_staging/<task>-e<epoch>/<batch>/``, see :mod:`.storage`), partitioned by topic and
partition, so one job writes every partition of every topic the batch touches.
Nothing it writes is visible until :meth:`Topics.commit
<herder.dataplane.topics.Topics.commit>` publishes the batch's segments.

Offsets are given out only at commit, as a segment's ``base_offset``, so staging needs
no coordination with other writers; a record's place within its segment is fixed by the
write. A batch whose records all go to one partition (one topic, no keys — a file's
lines, a poll of keyless records — or a topic of one partition, such as a table
snapshot's chunk of keyed rows) is written as it comes, each Spark task's rows to
files of its own, in order; the segment records how many each file holds, and a
record's place is its file's first plus its row's index in the file (see
:func:`_write_partition`): no shuffle, no numbering. A batch spread over partitions
gives each record ``seq``, its place in its segment counted from 0: records that arrive
as Python objects get their partition and ``seq`` in Python while they are turned into
Arrow (:mod:`.records`); a DataFrame's rows get them in Spark, the partition from the
same rules as an expression and ``seq`` as ``row_number`` over its partition, ordered
by ``monotonically_increasing_id`` — which is not contiguous, but does follow the
input's order — so the job shuffles by partition once and never brings rows back to
Python.

What a segment holds (count, newest timestamp) is read from the Parquet footers Spark
wrote, and its size from the file listing, so the write is the batch's only Spark job.

A SourceBatch may say which fields of its values every record holds alike (its
``constants``, see :mod:`.typed`): the files leave them out. It may also give its rows
as Arrow pieces (:class:`~herder.connect.ArrowPieces`), as a table read through ADBC
is: a batch into one partition is then written by the executors themselves, a file per
piece with pyarrow, laid out as Spark's write would lay it out
(:meth:`SegmentWriter._stage_pieces`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import re
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from zlib import crc32

import pyarrow.compute as pc

from herder.connect.records import SOURCE_BATCH_COLUMNS, ArrowPieces, SourceRecord
from herder.dataplane.codec import DEFAULT_CODEC, SegmentCodec
from herder.dataplane.metadata import Topic
from herder.dataplane.records import HEADERS_DDL, records_to_table
from herder.dataplane.spark import SparkRuntime
from herder.dataplane.staged import StagedBatch, StagedSegment
from herder.dataplane.storage import Storage, batch_dir, check_task_name, writer_dir
from herder.dataplane.topics import Topics
from herder.dataplane.trickle import OFF, TrickleLimits, write_in_order, write_partitioned
from herder.dataplane.typed import (
    BYTES_TYPES,
    SPARK_ROW_METADATA,
    part_types,
    sql_name,
    type_json,
    usable_constants,
)
from herder.errors import ConfigError

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import Column, DataFrame, DataFrameWriter, SparkSession
    from pyspark.sql.types import StructType

log = logging.getLogger(__name__)

#: Records one Spark task writes when a batch of SourceRecords is staged.
ROWS_PER_WRITE_TASK = 100_000
#: Most records in one staged file: the unit a sink's delivery reads whole. As many as a
#: sink's delivery takes by default, so that a Spark task's split of a large file (128 MiB
#: by default, over a million short lines) is one file rather than a file and a remnant.
MAX_RECORDS_PER_FILE = 2_000_000
#: Parquet writer options of every staged file: min/max statistics only for ``seq``, which
#: reads filter by (pushed down to the Parquet reader), and ``timestamp``, whose maximum
#: gives a batch's newest timestamp from the footers (:func:`_summarize`). Nothing reads a
#: key's, a value's or a header's, and they cost the writer a comparison of every value
#: (2,000,000 lines of 100 bytes: staged in 0.83 s and 1.47 CPU-s without them, 0.95 s
#: and 1.73 CPU-s with them).
STAGED_FILE_STATISTICS = {
    "parquet.column.statistics.enabled": "false",
    "parquet.column.statistics.enabled#seq": "true",
    "parquet.column.statistics.enabled#timestamp": "true",
}


class SegmentWriter:
    """Stages batches for one writer (``task``) holding fencing epoch ``epoch``.

    With ``auto_create`` a topic that does not exist is created with the default
    partition count (``topic.creation.default.partitions``) when a batch names it.
    Jobs run in Spark scheduler pool ``pool`` (the task's, by default). Every file is
    compressed with ``codec`` (the worker's ``producer.compression.type``).
    """

    def __init__(
        self,
        topics: Topics,
        spark: SparkRuntime,
        task: str,
        epoch: int,
        *,
        auto_create: bool = True,
        pool: str | None = None,
        trickle: TrickleLimits = OFF,
        codec: SegmentCodec = DEFAULT_CODEC,
    ) -> None:
        self.topics = topics
        self.spark = spark
        self.task = check_task_name(task)
        self.epoch = epoch
        self.auto_create = auto_create
        self.pool = pool if pool is not None else task
        #: batches of SourceRecords within these limits are staged by pyarrow
        self.trickle = trickle
        self.codec = codec
        self._next_batch: int | None = None
        self._allocating = asyncio.Lock()
        self._staged = 0

    @property
    def storage(self) -> Storage:
        return self.topics.storage

    async def stage(
        self,
        data: Sequence[SourceRecord] | DataFrame,
        topic: str | None = None,
        *,
        constants: Mapping[str, Any] | None = None,
        pieces: ArrowPieces | None = None,
    ) -> StagedBatch:
        """Write ``data`` (SourceRecords, or a DataFrame of SOURCE_BATCH_COLUMNS) as a
        batch; ``constants`` and ``pieces``: see :meth:`stage_dataframe`."""
        if isinstance(data, Sequence):
            if topic is not None:
                raise TypeError("SourceRecords name their own topics; give no topic")
            return await self.stage_records(data)
        return await self.stage_dataframe(data, topic, constants, pieces)

    async def stage_records(self, records: Sequence[SourceRecord]) -> StagedBatch:
        """Stage a poll's records: Arrow built column-wise, one createDataFrame, one write."""
        topics = await self._resolve({r.topic for r in records})
        batch = await self._allocate()
        if not records:
            return StagedBatch(self.task, self.epoch, batch, [], {})
        counts = {name: t.partitions for name, t in topics.items()}
        sticky = self._sticky(counts)
        now = self.topics.clock()
        path = batch_dir(self.task, self.epoch, batch)
        made: pa.Table | None = None
        if self.trickle.takes(len(records), self.trickle.max_bytes):
            # off the event loop, as the Spark job's own conversion is
            staged = await asyncio.to_thread(
                self._stage_trickle, records, counts, sticky, now, path
            )
            if isinstance(staged, list):
                return self._staged_batch(batch, staged, topics)
            made = staged  # too many bytes: Spark's, converted already

        def job() -> list[StagedSegment]:
            table = made if made is not None else records_to_table(records, counts, sticky, now)
            return self._stage_table(table, path, by_spark=True)

        segments = await self.spark.run(job, pool=self.pool)
        return self._staged_batch(batch, segments, topics)

    def _stage_trickle(
        self,
        records: Sequence[SourceRecord],
        counts: Mapping[str, int],
        sticky: Mapping[str, int],
        now: int,
        path: str,
    ) -> list[StagedSegment] | pa.Table:
        """Stage a small batch with pyarrow (:mod:`.trickle`), its files laid out as
        :meth:`stage_records`'s Spark job lays them out; or, if its records hold more
        bytes than the trickle path takes, write nothing and give back their table (of
        STAGE_SCHEMA) for Spark. One call on one thread: each hop between threads costs
        a record's latency a wake-up."""
        table = records_to_table(records, counts, sticky, now)
        if not self.trickle.takes(table.num_rows, table.nbytes):
            return table
        return self._stage_table(table, path, by_spark=False)

    def _stage_table(self, table: pa.Table, path: str, *, by_spark: bool) -> list[StagedSegment]:
        """Write a poll's records (a table of STAGE_SCHEMA) as batch ``path``, by Spark
        or by pyarrow, laid out alike: the rows of one partition in order, without the
        columns they all share (:func:`_lean`), or a directory per partition."""
        only = _single_partition(table)
        shared = None
        if only is not None:
            # one partition: the files' order is the records' (see _stage_in_order)
            table, shared = _lean(table.drop_columns(["topic", "partition", "seq"]))
        if by_spark:
            # createDataFrame makes a Spark partition of every Arrow batch (10k rows),
            # and each would write a file into every partition directory it touches;
            # coalescing keeps neighbouring rows together (without locality, coalesce
            # groups consecutive partitions, in order), so each file holds a run of records
            tasks = -(-table.num_rows // ROWS_PER_WRITE_TASK)
            df = self.spark.session.createDataFrame(table).coalesce(tasks)
            if only is None:
                _write(df, self.storage.uri(path), self.codec)
            else:
                _write_partition(df, self.storage, path, *only, self.codec)
        elif only is None:
            write_partitioned(self.storage, path, table, self.codec)
        else:
            write_in_order(self.storage, path, *only, table, self.codec)
        if only is None:
            return _describe(self.storage, path)
        return _describe(self.storage, path, positional=True, timestamp=shared)

    async def stage_dataframe(
        self,
        df: DataFrame,
        topic: str | None = None,
        constants: Mapping[str, Any] | None = None,
        pieces: ArrowPieces | None = None,
    ) -> StagedBatch:
        """Stage a DataFrame's rows (a SourceBatch's ``data``) to ``topic`` or its ``topic`` column.

        Without ``topic`` the DataFrame's distinct topics are found first, which costs a
        job that reads the source once more: name the topic when there is only one.

        ``constants`` (field name → value) are top-level fields of a struct value that
        every row holds with that value (a SourceBatch's ``constants``): those a segment
        can keep once (:func:`~.typed.usable_constants`) are left out of the files.

        ``pieces`` are the same rows as Arrow pieces (a SourceBatch's ``pieces``): a
        batch whose rows all go to one partition is then written on the executors
        with pyarrow, a file per piece (:meth:`_stage_pieces`).
        """
        # the schema, from the JVM: on a job thread, not the event loop
        types: dict[str, str] = await self.spark.run(lambda: dict(df.dtypes), pool=self.pool)
        kept: tuple[str, dict[str, Any]] | None = None
        if constants and types.get("value", "").startswith("struct<"):
            df, types, kept = await self.spark.run(
                _without_constants, df, constants, pool=self.pool
            )
        if pieces is not None and constants and (kept is None or set(kept[1]) != set(constants)):
            # pieces may leave out every field the source calls constant, but the files
            # must hold those a segment cannot keep once: Spark writes them from ``df``
            pieces = None
        batch = await self._stage_dataframe(df, types, topic, pieces)
        if kept is None:
            return batch
        stored, usable = kept
        text = json.dumps(usable, separators=(",", ":"), sort_keys=True)
        segments = [
            dataclasses.replace(s, value_type=stored, value_constants=text) for s in batch.segments
        ]
        return dataclasses.replace(batch, segments=segments)

    async def _stage_dataframe(
        self, df: DataFrame, types: dict[str, str], topic: str | None, pieces: ArrowPieces | None
    ) -> StagedBatch:
        columns = set(types)
        if "value" not in columns:
            raise ConfigError("a SourceBatch DataFrame needs a value column")
        unknown = sorted(columns - set(SOURCE_BATCH_COLUMNS))
        if unknown:
            raise ConfigError(
                f"a SourceBatch DataFrame has no use for column {unknown[0]!r} "
                f"(its columns are {', '.join(SOURCE_BATCH_COLUMNS)})"
            )
        if topic is not None:
            topics = await self._resolve({topic})
            if "partition" not in columns and (
                "key" not in columns or topics[topic].partitions == 1
            ):
                # no partitions of the rows' own, and no keys to spread the rows or
                # nowhere to spread them: every row goes to one partition
                if pieces is not None and "headers" not in types and "timestamp" not in types:
                    return await self._stage_pieces(df, pieces, topics[topic])
                return await self._stage_in_order(df, types, topics[topic])
        elif "topic" in columns:
            topics = await self._resolve(await self.spark.run(_distinct_topics, df, pool=self.pool))
        else:
            raise ConfigError("a SourceBatch needs a topic, or a topic column in its DataFrame")
        batch = await self._allocate()
        if not topics:  # an empty DataFrame with a topic column
            return StagedBatch(self.task, self.epoch, batch, [], {})
        counts = {name: t.partitions for name, t in topics.items()}
        sticky = self._sticky(counts)
        now = self.topics.clock()
        path = batch_dir(self.task, self.epoch, batch)

        def job() -> list[StagedSegment]:
            rows = _sequenced(df, types, topic, counts, sticky, now)
            _write(rows, self.storage.uri(path), self.codec)
            return _describe(self.storage, path)

        segments = await self.spark.run(job, pool=self.pool)
        return self._staged_batch(batch, segments, topics)

    async def _stage_in_order(
        self, df: DataFrame, types: Mapping[str, str], topic: Topic
    ) -> StagedBatch:
        """Stage rows that all go to one partition (one topic and no partitions of their
        own; no keys, or a topic of one partition) as they come, without numbering them.

        Spark writes each of the DataFrame's partitions in order to files of its own,
        named by its index (see :func:`_write_partition`), so the files, in order, hold
        the records in the DataFrame's order — the order in which numbering them would
        have given offsets — and a record's offset is its file's first offset plus its
        row's index in the file. Spark adds no shuffle, and the files no ``seq``: a
        snapshot's chunk of keyed rows into a topic of one partition is written as a
        keyless batch is, keys and all, rather than shuffled and sorted to be numbered.
        """
        batch = await self._allocate()
        sticky = self._sticky({topic.name: topic.partitions})
        now = self.topics.clock()
        path = batch_dir(self.task, self.epoch, batch)

        def job() -> list[StagedSegment]:
            # keys only if the rows have them; no headers and, unless the rows have
            # their own, one timestamp: the files leave those columns out (see _lean).
            # Values alone are written as they come: another select costs an analysis.
            rows = df
            if list(types) != ["value"]:
                # in the order of a segment file's columns (SEGMENT_SCHEMA)
                columns = [_key(types).alias("key")] if "key" in types else []
                columns.append(_value(types).alias("value"))
                if "headers" in types:
                    columns.append(_headers(types).alias("headers"))
                if "timestamp" in types:
                    columns.append(_timestamp(types, now).cast("long").alias("timestamp"))
                rows = df.select(*columns)
            shared = None if "timestamp" in types else now
            return self._written_in_order(
                path,
                "Spark wrote",
                lambda: _write_partition(
                    rows, self.storage, path, topic.name, sticky[topic.name], self.codec
                ),
                shared,
            )

        segments = await self.spark.run(job, pool=self.pool)
        return self._staged_batch(batch, segments, {topic.name: topic})

    async def _stage_pieces(self, df: DataFrame, pieces: ArrowPieces, topic: Topic) -> StagedBatch:
        """Stage rows that all go to one partition, given as Arrow pieces, as
        :meth:`_stage_in_order` stages their DataFrame: the same files in the same order
        (one per piece, and one more every :data:`MAX_RECORDS_PER_FILE` rows, named as
        Spark's task of its index would name them), but written
        by each piece's executor with pyarrow, as it reads them. Spark's JVM never takes
        the rows: a snapshot chunk of 500,000 rows read by ADBC in 4 pieces on 2 cores is
        written in 0.55-0.7 s rather than 1.0 s. The types are the DataFrame's, as Spark
        would have stored them."""
        batch = await self._allocate()
        sticky = self._sticky({topic.name: topic.partitions})
        now = self.topics.clock()
        path = batch_dir(self.task, self.epoch, batch)
        folder = f"{path}/topic={topic.name}/partition={sticky[topic.name]}"

        def job() -> list[StagedSegment]:
            schema = df.schema
            types = part_types(schema.json().encode())
            segments = self._written_in_order(
                path,
                f"executors wrote {pieces.count} pieces of",
                lambda: _write_pieces(
                    self.spark.session, self.storage.root, folder, pieces, schema, self.codec
                ),
                now,
            )
            return [
                dataclasses.replace(s, key_type=types.get("key"), value_type=types.get("value"))
                for s in segments
            ]

        segments = await self.spark.run(job, pool=self.pool)
        return self._staged_batch(batch, segments, {topic.name: topic})

    def _written_in_order(
        self,
        path: str,
        how: str,
        write: Callable[[], Collection[str] | None],
        shared: int | None,
    ) -> list[StagedSegment]:
        """The segments of batch ``path`` once ``write`` wrote each partition's files in
        order (``shared``: the timestamp of every record, if the files have none): the
        files ``write`` returns, or if None every file of the batch."""
        began = time.monotonic()
        files = write()
        written = time.monotonic()
        segments = _describe(self.storage, path, positional=True, timestamp=shared, only=files)
        log.debug(
            "task %s: %s batch %s in %.3f s, described in %.3f s",
            self.task,
            how,
            path,
            written - began,
            time.monotonic() - written,
        )
        return segments

    async def discard(self, staged: StagedBatch) -> None:
        """Delete a batch that will never be committed (its commit was refused)."""
        await asyncio.to_thread(self.storage.delete_dir, staged.dir)

    async def reap(self) -> list[str]:
        """Delete what this task's older epochs staged and never committed.

        Call once this writer's epoch is the task's fencing epoch in the ensemble.
        """
        return await self.topics.reap_staging(self.task, self.epoch)

    # -- helpers -----------------------------------------------------------------------

    async def _resolve(self, names: Iterable[str]) -> dict[str, Topic]:
        resolved = {}
        for name in names:
            if not isinstance(name, str):
                raise TypeError(f"a topic name is a str, not {type(name).__name__}")
            resolved[name] = await (
                self.topics.ensure(name) if self.auto_create else self.topics.get(name)
            )
        return resolved

    async def _allocate(self) -> int:
        """The next batch number: past every batch directory this writer already has."""
        async with self._allocating:
            if self._next_batch is None:
                entries = await asyncio.to_thread(
                    self.storage.list_dir, writer_dir(self.task, self.epoch)
                )
                names = [e.path.rsplit("/", 1)[-1] for e in entries]
                self._next_batch = max((int(n) for n in names if n.isdigit()), default=-1) + 1
            batch = self._next_batch
            self._next_batch += 1
            return batch

    def _sticky(self, counts: Mapping[str, int]) -> dict[str, int]:
        # rotate per batch, starting from a point of the task's own, so keyless records
        # of several tasks do not all pile into partition 0
        start = crc32(self.task.encode())
        self._staged += 1
        return {name: (start + self._staged) % n for name, n in counts.items()}

    def _staged_batch(
        self, batch: int, segments: list[StagedSegment], topics: Mapping[str, Topic]
    ) -> StagedBatch:
        staged = StagedBatch(
            self.task,
            self.epoch,
            batch,
            segments,
            {name: topics[name].version for name in {s.topic for s in segments}},
        )
        log.debug(
            "task %s staged batch %s: %d records in %d segments",
            self.task,
            staged.dir,
            staged.records,
            len(segments),
        )
        return staged


def _distinct_topics(df: DataFrame) -> list[str]:
    names = [row[0] for row in df.select("topic").distinct().collect()]
    if None in names:
        raise ConfigError("a SourceBatch DataFrame has rows whose topic is null")
    return names


def _by_topic(topic: Column, values: Mapping[str, int]) -> Column:
    """``values[topic]`` as a Spark expression."""
    from pyspark.sql import functions as F

    items = sorted(values.items())
    if len(items) == 1:
        return F.lit(items[0][1])
    expr = F.when(topic == items[0][0], items[0][1])
    for name, value in items[1:]:
        expr = expr.when(topic == name, value)
    return expr


def _key(types: Mapping[str, str]) -> Column:
    """Each row's key as a segment holds it: bytes (of a ``binary`` or ``string`` key)
    as ``binary``, whose CRC-32 picks a keyed record's partition however it came; any
    other type is a typed key, stored natively (:mod:`.typed`)."""
    from pyspark.sql import functions as F

    if types["key"] in BYTES_TYPES:
        return F.col("key").cast("binary")
    return F.col("key")


def _value(types: Mapping[str, str]) -> Column:
    """Each row's value as a segment holds it (``types``: the DataFrame's, by column):
    as it is. A ``string`` holds its bytes (Spark's text reader does not decode lines)
    and Parquet stores it as it stores ``binary``, which readers ask for: casting would
    copy every value. Any other type is a typed value, stored natively (:mod:`.typed`)."""
    from pyspark.sql import functions as F

    return F.col("value")


def _headers(types: Mapping[str, str]) -> Column:
    """Each row's headers as a segment holds them: none (an empty list) for null, or
    for every row of a DataFrame without the column."""
    from pyspark.sql import functions as F

    empty = F.array().cast(HEADERS_DDL)
    if "headers" not in types:
        return empty
    return F.coalesce(F.col("headers").cast(HEADERS_DDL), empty)


def _timestamp(types: Mapping[str, str], now_ms: int) -> Column:
    """Each row's timestamp in ms: its own, or ``now_ms`` where it has none."""
    from pyspark.sql import functions as F

    if "timestamp" not in types:
        return F.lit(now_ms)
    return F.coalesce(F.unix_millis(F.col("timestamp")), F.lit(now_ms))


def _sequenced(
    df: DataFrame,
    types: Mapping[str, str],
    topic: str | None,
    counts: Mapping[str, int],
    sticky: Mapping[str, int],
    now_ms: int,
) -> DataFrame:
    """``df`` with the columns of a staged batch, partition and ``seq`` included."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    topic_col = F.lit(topic) if topic is not None else F.col("topic")
    if "key" not in types:
        key, hashed = F.lit(None).cast("binary"), F.lit(0)
    else:
        key = _key(types)
        # bytes by their CRC-32, as a SourceRecord's; a typed key by Spark's hash of it
        hashed = F.crc32(key) if types["key"] in BYTES_TYPES else F.hash(key)
    headers = _headers(types)
    timestamp = _timestamp(types, now_ms)
    count = _by_topic(topic_col, counts)
    by_key = F.when(key.isNotNull(), F.pmod(hashed, count).cast("int")).otherwise(
        _by_topic(topic_col, sticky).cast("int")
    )
    if "partition" in types:
        given = F.col("partition").cast("int")
        partition = (
            F.when(given.isNull(), by_key)
            .when(
                (given < 0) | (given >= count),
                F.raise_error(
                    F.format_string(
                        "topic %s has no partition %d (it has %d)", topic_col, given, count
                    )
                ),
            )
            .otherwise(given)
        )
    else:
        partition = by_key
    rows = df.select(
        topic_col.alias("topic"),
        partition.alias("partition"),
        key.alias("key"),
        _value(types).alias("value"),
        headers.alias("headers"),
        timestamp.cast("long").alias("timestamp"),
        F.monotonically_increasing_id().alias("_order"),
    )
    order = Window.partitionBy("topic", "partition").orderBy("_order")
    return rows.withColumn("seq", F.row_number().over(order) - 1).drop("_order")


def _staged_write(df: DataFrame, codec: SegmentCodec) -> DataFrameWriter:
    """The writer of a staged batch's files: new files only, cut every
    :data:`MAX_RECORDS_PER_FILE` rows, with :data:`STAGED_FILE_STATISTICS`, compressed
    with ``codec``."""
    return (
        df.write.option("maxRecordsPerFile", MAX_RECORDS_PER_FILE)
        .option("compression", codec.spark)
        .options(**STAGED_FILE_STATISTICS)
        # "error" rather than its synonym "errorifexists", which Spark Connect's client
        # does not know
        .mode("error")
    )


def _write(df: DataFrame, uri: str, codec: SegmentCodec) -> None:
    """Write a batch whose rows go to several partitions: a directory per partition."""
    columns = ["key", "value", "headers", "timestamp", "seq", "topic", "partition"]
    _staged_write(df.select(*columns), codec).partitionBy("topic", "partition").parquet(uri)


def _write_partition(
    df: DataFrame, storage: Storage, batch: str, topic: str, partition: int, codec: SegmentCodec
) -> None:
    """Write a batch whose rows all go to ``partition`` of ``topic``, into its directory.

    ``df`` has the columns of a segment file, in their order
    (:data:`~herder.dataplane.records.SEGMENT_SCHEMA`, those it keeps). Without
    ``partitionBy`` Spark adds no sort before writing, so each task's file holds its rows
    in the order they come, and a task starts a new file (``c001``, …) every
    :data:`MAX_RECORDS_PER_FILE` rows: the files, in :func:`_file_order`, hold the
    DataFrame's rows in order, and need no ``seq``.
    """
    folder = storage.uri(f"{batch}/topic={topic}/partition={partition}")
    _staged_write(df, codec).parquet(folder)


def _lean(table: pa.Table) -> tuple[pa.Table, int | None]:
    """``table`` without the columns a segment file may leave out, and the timestamp
    every row shares if that column went (None if it stayed).

    A file without ``key`` has no keys, without ``headers`` no headers, and without
    ``timestamp`` every record has its segment's ``max_timestamp``: readers fill them in
    (:mod:`.reader`). Polls of keyless lines, the common case, then write two columns.
    """
    drop, shared = [], None
    if table["key"].null_count == table.num_rows:
        drop.append("key")
    if not pc.max(pc.list_value_length(table["headers"])).as_py():
        drop.append("headers")
    low, high = pc.min_max(table["timestamp"]).values()
    if low.as_py() == high.as_py():
        drop.append("timestamp")
        shared = low.as_py()
    return table.drop_columns(drop), shared


def _single_partition(table: pa.Table) -> tuple[str, int] | None:
    """The (topic, partition) of every row of a staged table, if they share one."""
    if table.num_rows == 0:
        return None
    topics = pc.unique(table["topic"])
    partitions = pc.unique(table["partition"])
    if len(topics) != 1 or len(partitions) != 1:
        return None
    return topics[0].as_py(), partitions[0].as_py()


_PART_FILE = re.compile(r"part-(\d+)-.*-c(\d+)(?:\.|$)")


def _file_order(path: str) -> tuple[int, int, str]:
    """Sorts Spark's output files by task, then by file within the task (``c000``, …)."""
    found = _PART_FILE.match(path.rsplit("/", 1)[-1])
    return (int(found[1]), int(found[2]), path) if found else (-1, -1, path)


def _write_pieces(
    session: SparkSession,
    root: str,
    folder: str,
    pieces: ArrowPieces,
    schema: StructType,
    codec: SegmentCodec,
) -> list[str]:
    """Have Spark's executors write each of ``pieces`` into ``folder`` (under storage
    ``root``): a Spark task a piece, reading it and writing it as a segment file with
    pyarrow (:func:`~herder.dataplane.trickle.write_piece`), with the columns of
    ``schema`` (a batch DataFrame's, as a segment keeps them): its value's fields only,
    if it is a struct (a piece's value may hold more). Returns the files written."""
    read = pieces.read
    has_key = "key" in schema.names
    value_type = schema["value"].dataType
    keep = [f.name for f in value_type.fields] if hasattr(value_type, "fields") else None
    per_file = MAX_RECORDS_PER_FILE

    def write(numbers: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa

        from herder.dataplane.storage import Storage
        from herder.dataplane.trickle import write_piece

        storage = Storage(root)
        for batch in numbers:
            for index in batch.column(0).to_pylist():
                segment_rows = (_segment_columns(b, has_key, keep) for b in read(index))
                files = write_piece(storage, folder, index, segment_rows, per_file, codec)
                yield pa.RecordBatch.from_pydict({"path": [path for path, _ in files]})

    count = pieces.count
    # one result per piece, from the task attempt that succeeded: the files a batch is
    # made of (an attempt that failed, or a speculative twin, may have left others)
    found = session.range(0, count, 1, count).mapInArrow(write, "path string").collect()
    return [row["path"] for row in found]


def _segment_columns(
    batch: pa.RecordBatch, has_key: bool, keep: Sequence[str] | None
) -> pa.RecordBatch:
    """A piece's batch as a segment file's columns: ``key`` if the records have keys,
    and ``value``, with the struct fields ``keep`` (all of them if None)."""
    import pyarrow as pa

    names = batch.schema.names
    missing = [c for c in (["key"] if has_key else []) + ["value"] if c not in names]
    if missing:
        raise ValueError(f"a piece's batch has no {missing[0]} column (it has {names})")
    value = batch.column("value")
    if keep is not None and [f.name for f in value.type] != list(keep):
        fields = {f.name: f for f in value.type}
        lacking = [name for name in keep if name not in fields]
        if lacking:
            raise ValueError(f"a piece's values have no field {lacking[0]!r}")
        value = pa.StructArray.from_arrays(
            [value.field(name) for name in keep],
            fields=[fields[name] for name in keep],
            mask=value.is_null(),
        )
    columns = ([batch.column("key")] if has_key else []) + [value]
    return pa.RecordBatch.from_arrays(columns, names=(["key"] if has_key else []) + ["value"])


def _without_constants(
    df: DataFrame, constants: Mapping[str, Any]
) -> tuple[DataFrame, dict[str, str], tuple[str, dict[str, Any]] | None]:
    """``df`` without the value's fields of ``constants`` that a segment can keep once,
    its columns' types, and (the value's stored type, those fields' values); or ``df``
    as it is if none can be kept."""
    from pyspark.sql import functions as F

    stored = type_json(json.loads(df.schema["value"].dataType.json()))
    usable = usable_constants(stored, constants)
    if not usable:
        return df, dict(df.dtypes), None
    # quoted: dropFields takes a name with a dot for a path into nested structs
    names = [sql_name(name) for name in usable]
    lean = df.withColumn("value", F.col("value").dropFields(*names))
    return lean, dict(lean.dtypes), (stored, usable)


def _describe(
    storage: Storage,
    batch: str,
    *,
    positional: bool = False,
    timestamp: int | None = None,
    only: Collection[str] | None = None,
) -> list[StagedSegment]:
    """The segments of a written batch, from its file listing and Parquet footers; their
    files are on disk when this returns (they are committed next). ``only``: the files
    the batch is made of, if not every file it has.

    ``positional``: each partition's files were written in order, without ``seq`` (see
    :func:`_write_partition`); the segments then say how many records each file holds,
    and a record's offset follows from its file and its row. ``timestamp``: the one
    every record has, for files written without that column.
    """
    found: dict[tuple[str, int], list[tuple[str, int]]] = {}
    for entry in storage.list_dir(batch, recursive=True):
        parts = entry.path[len(batch) + 1 :].split("/")
        if entry.is_dir or len(parts) != 3 or not parts[2].endswith(".parquet"):
            continue
        topic_dir, partition_dir, name = parts
        if name.startswith((".", "_")) or not topic_dir.startswith("topic="):
            continue
        if only is not None and entry.path not in only:
            continue
        key = (topic_dir[len("topic=") :], int(partition_dir[len("partition=") :]))
        found.setdefault(key, []).append((entry.path, entry.size))
    segments = [
        segment
        for (topic, partition), files in sorted(found.items())
        if (segment := _segment(storage, topic, partition, files, positional, timestamp))
    ]
    storage.make_durable(path for segment in segments for path in segment.files)
    return segments


def _segment(
    storage: Storage,
    topic: str,
    partition: int,
    files: list[tuple[str, int]],
    positional: bool,
    timestamp: int | None,
) -> StagedSegment | None:
    """The segment of ``partition``'s ``files`` (paths and sizes), from their footers;
    None if they hold no rows."""
    ordered = sorted(files, key=lambda f: _file_order(f[0]))
    if positional and _file_order(ordered[0][0])[0] < 0:
        # the files' order is the records' only through Spark's names for them
        raise RuntimeError(
            f"cannot tell where {ordered[0][0]} goes among the files Spark wrote: its"
            " name is not part-<task>-<job>-c<file>"
        )
    summaries = [_summarize(storage, path, timestamp) for path, _size in ordered]
    kept = [f for f in summaries if f.rows]
    if not kept:
        return None
    sizes = dict(files)
    # one job wrote them from one DataFrame: its files share their types
    typed = kept[0].types
    return StagedSegment(
        topic=topic,
        partition=partition,
        count=sum(f.rows for f in kept),
        files=[f.path for f in kept],
        bytes=sum(sizes[f.path] for f in kept),
        max_timestamp=max(f.newest for f in kept),
        file_counts=[f.rows for f in kept] if positional else None,
        key_type=typed.get("key"),
        value_type=typed.get("value"),
    )


@dataclass(frozen=True)
class _FileSummary:
    """What a staged file's footer says: its rows, their newest timestamp, and the
    types of its typed parts (see :mod:`.typed`)."""

    path: str
    rows: int
    newest: int
    types: dict[str, str]


def _summarize(storage: Storage, path: str, shared: int | None) -> _FileSummary:
    """One read of a Parquet file's footer; ``shared`` is every row's timestamp if the
    file has no such column."""
    meta = storage.footer(path)
    names = meta.schema.names
    types = part_types((meta.metadata or {}).get(SPARK_ROW_METADATA))
    if "timestamp" not in names:
        if shared is None:
            raise RuntimeError(f"{path} has no timestamp column and none was given for it")
        return _FileSummary(path, meta.num_rows, shared, types)
    groups = (meta.row_group(i) for i in range(meta.num_row_groups))
    column = names.index("timestamp")
    stamps = [g.column(column).statistics for g in groups if g.num_rows]
    if all(stats is not None and stats.has_min_max for stats in stamps):
        newest = max((int(stats.max) for stats in stamps), default=-1)
    else:
        table: pa.Table = storage.read_table([path], columns=["timestamp"])
        newest = int(pc.max(table["timestamp"]).as_py())
    return _FileSummary(path, meta.num_rows, newest, types)
