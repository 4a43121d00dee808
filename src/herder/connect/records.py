"""What flows through connectors: source records and batches, and topic partitions.

A source task hands the runtime either :class:`SourceRecord` objects (convenient for
sources that produce rows one at a time) or a :class:`SourceBatch`, a Spark DataFrame
together with the source offsets it reaches (the fast path for sources that can
describe their input to Spark). Sink tasks receive DataFrames, never Python records.

Source partitions and offsets are JSON-able dicts, exactly as in Kafka Connect: the
partition names a stream in the source system (``{"filename": "/var/log/app.log"}``),
the offset says how far into it a record is (``{"position": 4096}``). The runtime stores
the latest offset per partition and gives it back to the next task incarnation through
:attr:`~herder.connect.SourceTaskContext.offset_reader`, so use values that survive a
JSON round trip (str, int, float, bool, None, lists and dicts of them).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass
from typing import TYPE_CHECKING, Any, Final, TypeAlias

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

__all__ = [
    "SINK_COLUMNS",
    "SOURCE_BATCH_COLUMNS",
    "Header",
    "SourceBatch",
    "SourceOffset",
    "SourcePartition",
    "SourceRecord",
    "TopicPartition",
]

#: Names a stream in the source system, e.g. ``{"filename": "/var/log/app.log"}``.
SourcePartition: TypeAlias = dict[str, Any]
#: A position in a source partition, e.g. ``{"position": 4096}``.
SourceOffset: TypeAlias = dict[str, Any]
#: One record header: a name and its value. Names may repeat, as in Kafka.
Header: TypeAlias = tuple[str, bytes | str | None]

#: Columns a :class:`SourceBatch` DataFrame may have. They follow Spark's own Kafka
#: sink: ``value`` (string or binary) is required; ``key`` (string or binary),
#: ``topic`` (string; required unless the batch names one), ``partition`` (int),
#: ``headers`` (array<struct<key: string, value: binary>>) and ``timestamp``
#: (timestamp) are optional.
SOURCE_BATCH_COLUMNS: Final = ("topic", "partition", "key", "value", "headers", "timestamp")

#: Columns of the DataFrame :meth:`~herder.connect.SinkTask.put` receives, as Spark's
#: Kafka source has them: ``topic``, ``partition`` and ``offset`` locate each record,
#: then its ``timestamp``, ``key``, ``value`` and ``headers`` as the source wrote them.
SINK_COLUMNS: Final = ("topic", "partition", "offset", "timestamp", "key", "value", "headers")


@dataclass(frozen=True, order=True, slots=True)
class TopicPartition:
    """One partition of a topic. Hashable and ordered, so it can key offsets maps."""

    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"


@dataclass(frozen=True, slots=True, order=True)
class OffsetRange:
    """Offsets ``[from_offset, until_offset)`` of one topic partition, as Spark's Kafka
    integration names them. :meth:`~herder.connect.SinkTaskContext.offset_ranges` says
    which range each Spark partition of a sink's DataFrame holds."""

    topic_partition: TopicPartition
    from_offset: int
    until_offset: int


@dataclass(slots=True)
class SourceRecord:
    """One record read from a source system, to be written to ``topic``.

    ``source_partition`` and ``source_offset`` say where it came from: once the record
    is committed to the topic, ``source_offset`` is what a restarted task reads back for
    ``source_partition``. Leave ``partition`` as None to let the runtime pick one from
    the key, and ``timestamp_ms`` as None to stamp the record when it is written.

    Sources may produce millions of these, so the class is kept lean (slots, no
    validation); the runtime checks types when it turns a poll's records into a batch.
    """

    source_partition: SourcePartition
    source_offset: SourceOffset
    topic: str
    value: bytes | str | None
    _: KW_ONLY
    key: bytes | str | None = None
    partition: int | None = None
    headers: Sequence[Header] = ()
    timestamp_ms: int | None = None


@dataclass(frozen=True, slots=True)
class ArrowPieces:
    """A SourceBatch's records as ``count`` pieces that an executor reads as Arrow, for
    the runtime to write there as they come, without handing them to Spark's JVM.

    ``read(i)`` (run on an executor: it must pickle) yields piece ``i``'s rows in
    order, as record batches of a ``value`` column and, if the records have keys, a
    ``key`` column: the batch DataFrame's columns, of the Arrow types of its Spark
    types, but that the value may leave out the fields the batch names as
    ``constants``. The pieces in order hold the DataFrame's rows in its order.
    """

    count: int
    read: Callable[[int], Iterator[pa.RecordBatch]]

    def dataframe(self, session: SparkSession, schema: StructType) -> DataFrame:
        """The pieces as a DataFrame of ``schema`` (their batches' Spark schema), a
        Spark partition per piece, in order, each read on an executor when a job runs."""
        read = self.read

        def batches(numbers: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            for batch in numbers:
                for index in batch.column(0).to_pylist():
                    yield from read(index)

        return session.range(0, self.count, 1, self.count).mapInArrow(batches, schema)


@dataclass(frozen=True, slots=True)
class SourceBatch:
    """A DataFrame of records for the runtime to write, and the source offsets it reaches.

    Return one from :meth:`~herder.connect.SourceTask.poll` when the source can describe
    its input to Spark (a byte range of a file, a set of files, a key range of a table):
    the records never pass through Python, and Spark executors read in parallel.

    ``offsets`` must be planned *before* the job runs, from what the DataFrame covers
    (``[({"filename": f}, {"position": end_of_range})]``): the runtime commits them in
    the same transaction as the records, so a batch is written exactly once or not at
    all. Each source partition may appear once, and partitions and offsets must be
    JSON-able (TypeError otherwise). ``topic`` names the destination for
    every row; leave it None when the DataFrame has a ``topic`` column. The DataFrame's
    columns are described by :data:`SOURCE_BATCH_COLUMNS`. With one topic and no
    ``partition`` or ``key`` column, the records' order is the DataFrame's: its Spark
    partitions in order, each one's rows in order.

    ``constants``, if given, names top-level fields of a struct ``value`` that every
    row of ``data`` holds with the same value, and that value (JSON-able: null,
    strings, booleans, numbers, and dicts of them for struct fields), as a snapshot
    chunk's change events share their ``source`` and ``op``. The runtime may then write
    those fields once, in the segment's metadata, rather than in every row's Parquet
    leaves; readers get every record whole. It is a promise: a row whose field differs
    is read back with the constant. It is ignored when transforms change the records.

    ``pieces``, if given, are the same records as Arrow pieces (:class:`ArrowPieces`):
    when the batch goes to one partition of one topic, as ``data`` read in order, and
    no transform changes it, the runtime writes the pieces on the executors with
    pyarrow, each piece a segment file, rather than have Spark's JVM take every row
    from Python and write it. ``data`` must give exactly the same records.

    ``check``, if given, is called after Spark wrote the batch and before it commits,
    for a DataFrame that read what was planned only if its input did not change during
    the job (a file read whole by Spark's text reader, which reads a line past its end
    if the file grew). Raising :class:`~herder.errors.RetriableError` there discards the
    written batch and polls the task again — so the task must first rewind what the
    batch's poll advanced; any other exception fails the task.
    """

    data: DataFrame
    offsets: Sequence[tuple[SourcePartition, SourceOffset]]
    topic: str | None = None
    check: Callable[[], None] | None = None
    constants: Mapping[str, Any] | None = None
    pieces: ArrowPieces | None = None

    def __post_init__(self) -> None:
        # Checked here, where the author's code is on the stack, rather than when the
        # runtime commits the offsets; a canonical JSON form makes dict partitions
        # comparable in a set.
        seen: set[str] = set()
        for partition, offset in self.offsets:
            if not isinstance(partition, dict) or not isinstance(offset, dict):
                raise TypeError("SourceBatch offsets are (partition dict, offset dict) pairs")
            canonical = json.dumps(partition, sort_keys=True)
            json.dumps(offset)
            if canonical in seen:
                raise ValueError(f"source partition {partition} appears twice in a SourceBatch")
            seen.add(canonical)
        if self.constants is not None:
            if not all(isinstance(name, str) for name in self.constants):
                raise TypeError("SourceBatch constants are keyed by the value's field names")
            json.dumps(self.constants)
