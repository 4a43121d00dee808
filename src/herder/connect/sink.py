"""Sink tasks: receive records from topics as DataFrames and write them out.

Each sink connector is a consumer group (``connect-<name>``); its tasks share the
partitions of the subscribed topics. The runtime reads the records after each
partition's committed offset, hands them to :meth:`SinkTask.put` as one Spark DataFrame,
and commits offsets once :meth:`SinkTask.pre_commit` says the data is safely written.
That is at-least-once delivery; a sink that makes its writes idempotent, or stores its
position next to the data and reports it back with :meth:`SinkTaskContext.offset`, gets
exactly-once.

Offsets here follow Kafka's commit convention: the offset of the *next* record to read
in a partition, one past the last record written.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, ClassVar, Final

from herder.connect.records import OffsetRange, TopicPartition
from herder.connect.task import Task

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

__all__ = ["SinkTask", "SinkTaskContext"]


class SinkTaskContext(ABC):
    """The runtime, as a running sink task sees it. Available as ``SinkTask.context``.

    Call these from the task's own methods (on the runtime's thread), not from threads
    of your own.
    """

    @property
    @abstractmethod
    def configs(self) -> Mapping[str, str]:
        """The task's config, as passed to :meth:`SinkTask.start`."""

    @abstractmethod
    def assignment(self) -> frozenset[TopicPartition]:
        """The partitions this task currently owns."""

    @abstractmethod
    def offset(self, partition: TopicPartition, offset: int) -> None:
        """Resume ``partition`` at ``offset`` instead of at its committed offset.

        For sinks that store their position in the destination: call it from
        :meth:`SinkTask.open` with the offset after the last record you stored.
        """

    @abstractmethod
    def committed(self, partition: TopicPartition) -> tuple[int, str] | None:
        """The offset and metadata last committed for ``partition`` (None if never).

        The metadata is what :meth:`SinkTask.commit_metadata` returned at that commit:
        sinks that keep their position in the destination read it back in
        :meth:`SinkTask.open`.
        """

    @abstractmethod
    def pause(self, *partitions: TopicPartition) -> None:
        """Stop delivering records of these partitions (the destination is busy)."""

    @abstractmethod
    def resume(self, *partitions: TopicPartition) -> None:
        """Deliver records of these paused partitions again."""

    @abstractmethod
    def paused(self) -> frozenset[TopicPartition]:
        """The partitions currently paused by this task."""

    @abstractmethod
    def request_commit(self) -> None:
        """Commit offsets soon, without waiting for ``offset.flush.interval.ms``."""

    def offset_ranges(self) -> Sequence[OffsetRange] | None:
        """How the DataFrame of the :meth:`SinkTask.put` in progress is split: its Spark
        partition *i* holds records of the *i*-th range, in offset order (less any a
        transform dropped), as Spark's Kafka integration gives ``offsetRanges``. The
        ranges themselves come in the order of the partitions, which is not always
        offset order (Spark reads the biggest file first). A sink
        can then write each Spark partition as an output of its own, without a shuffle.

        None outside a put, for a task that is not :attr:`SinkTask.offset_ranged`, and
        when the DataFrame's partitions do not follow offset ranges (a read of many small
        files, or of files whose records are not stored in offset order: such a read is
        sorted instead).
        """
        return None


def partitions_of(table: pa.Table) -> Iterator[tuple[TopicPartition, pa.Table]]:
    """Each topic partition of an Arrow table of records (its ``topic`` and
    ``partition`` columns) with its rows, in order, partitions as they first appear."""
    import pyarrow.compute as pc

    places = zip(table["topic"].to_pylist(), table["partition"].to_pylist(), strict=True)
    for topic, partition in dict.fromkeys(places):
        mine = pc.and_(pc.equal(table["topic"], topic), pc.equal(table["partition"], partition))
        yield TopicPartition(topic, partition), table.filter(mine)


def rows_in(table: pa.Table, offsets: OffsetRange) -> pa.Table:
    """The rows of an Arrow table of sink records (see :meth:`SinkTask.put_arrow`) that
    fall in ``offsets``."""
    import pyarrow.compute as pc

    tp = offsets.topic_partition
    inside = pc.and_(
        pc.and_(pc.equal(table["topic"], tp.topic), pc.equal(table["partition"], tp.partition)),
        pc.and_(
            pc.greater_equal(table["offset"], offsets.from_offset),
            pc.less(table["offset"], offsets.until_offset),
        ),
    )
    return table.filter(inside)


class SinkTask(Task):
    """Writes one share of a sink connector's partitions to the destination.

    Lifecycle: :meth:`initialize`, :meth:`start`, :meth:`open` with the first assigned
    partitions, then :meth:`put` for every batch read and :meth:`pre_commit` before
    each offset commit; on every rebalance :meth:`close` for the partitions taken away
    and :meth:`open` for the new ones; finally :meth:`close` and :meth:`stop`.
    """

    #: The config key through which tasks receive their subscribed topics.
    TOPICS_CONFIG: Final = "topics"
    #: Whether :meth:`put` is given DataFrames with a Spark partition per range of
    #: offsets where the topic's files allow it, saying which range each holds
    #: (:meth:`SinkTaskContext.offset_ranges`; the partitions hold their ranges in the
    #: order Spark reads the files, not necessarily in offset order). For a sink that
    #: writes each partition out on its own; others do without it: Spark cuts big files
    #: into splits for its cores, and a partition per file leaves cores idle when the
    #: files are fewer than the cores.
    offset_ranged: ClassVar[bool] = False
    #: Whether :meth:`put` takes typed keys and values as topics hold them: native Spark
    #: columns (a struct of a table's columns, a decimal …). A sink that writes bytes
    #: leaves it False and gets ``key`` and ``value`` as binary, typed ones serialised
    #: with the connector's ``key.converter`` / ``value.converter`` (JsonConverter with
    #: ``schemas.enable=true``: Connect's envelope of schema and payload).
    typed_records: ClassVar[bool] = False
    #: The records one delivery reads (its budget) unless the connector's
    #: ``consumer.max.records`` says otherwise; None for the runtime's default, which
    #: bounds what a task that collects its DataFrame to the driver holds at once. A
    #: delivery reads whole files: one bigger than the budget whole, and, for an
    #: :attr:`offset_ranged` task read by Spark, one per core while they end within
    #: twice the budget. A task whose :meth:`put` writes on Spark's executors, never
    #: collecting, may take more: fewer, bigger Spark jobs cost less per record.
    max_records_per_delivery: ClassVar[int | None] = None

    context: SinkTaskContext

    def initialize(self, context: SinkTaskContext) -> None:
        """Receive the runtime's context before :meth:`start`; override only to extend."""
        self.context = context

    def open(self, partitions: Collection[TopicPartition]) -> None:
        """These partitions are now this task's: set up writers for them.

        Sinks that keep their position in the destination look it up here and report it
        with :meth:`SinkTaskContext.offset`. The default does nothing.
        """

    @abstractmethod
    def put(self, df: DataFrame) -> None:
        """Write a batch of records, one row each; columns are
        :data:`~herder.connect.records.SINK_COLUMNS`.

        Writing may be asynchronous: the records need to be durable only when
        :meth:`flush` returns. Raising fails the task; raise a
        :class:`herder.errors.RetriableError` to have the same batch put again.
        """

    def accepts_arrow(self) -> bool:
        """Whether this task takes small batches as Arrow tables (:meth:`put_arrow`).

        A batch of a few records costs a Spark job when it comes as a DataFrame, which
        is most of its latency; the runtime reads such a batch itself and hands it to
        :meth:`put_arrow` instead, where a task says it can write it (see the worker's
        ``dataplane.trickle.max.records``). Asked once, after :meth:`start`. The
        default is False: every batch goes to :meth:`put`.
        """
        return False

    def columns_read(self) -> Mapping[str, str | None] | None:
        """The columns of :data:`~herder.connect.records.SINK_COLUMNS` that :meth:`put`
        reads when it is given offset ranges (:meth:`SinkTaskContext.offset_ranges`),
        each with how it reads it, or None (the default) for all of them. Asked once,
        after :meth:`start`. How: None for the type the runtime gives, or ``"string"``
        for a key or value of bytes read as text (the bytes as they are, which is what
        ``CAST(value AS STRING)`` gives; typed keys and values still come typed).

        The runtime may then leave the other columns out of such a DataFrame, and give
        bytes as strings: a read of whole files gives Spark's scan of them as it is,
        rather than a projection that works out every record's place, time and headers,
        which Spark plans at each delivery (some 20-30 ms of the driver's time) only for
        them to be dropped again, and a text sink's values need no cast (a projection
        that copies every row: 2,000,000 lines of 100 bytes were written as text in
        0.38 s read as strings, 0.44 s read as bytes and cast). It may also give every
        column as usual: a task that names columns must read no others, and take bytes
        either way.
        """
        return None

    def put_arrow(self, table: pa.Table) -> None:
        """Write a small batch given as a ``pyarrow.Table`` of the columns :meth:`put`
        gets (``timestamp`` in ms, UTC), in (partition, offset) order; called only when
        :meth:`accepts_arrow` says so. The same contract as :meth:`put` otherwise;
        :meth:`SinkTaskContext.offset_ranges` gives the offset ranges the table's rows
        fall in, in order.

        The default puts the table as a DataFrame, with a Spark partition per offset
        range (as :meth:`put` gets one from the runtime): a task that overrides it
        writes the table without Spark, which is what makes the trickle path fast.
        """
        from functools import reduce

        from pyspark.sql import SparkSession

        session = SparkSession.active()
        ranges = self.context.offset_ranges()
        if not ranges:
            self.put(session.createDataFrame(table))
            return
        parts = [session.createDataFrame(rows_in(table, r)).coalesce(1) for r in ranges]
        self.put(reduce(lambda a, b: a.unionAll(b), parts))

    def flush(self, offsets: Mapping[TopicPartition, int]) -> None:
        """Make everything put so far durable; ``offsets`` is how far that reaches."""

    def pre_commit(self, offsets: Mapping[TopicPartition, int]) -> Mapping[TopicPartition, int]:
        """The offsets that are safe to commit now, given how far :meth:`put` has got.

        The default flushes and returns ``offsets`` unchanged. A sink that writes
        asynchronously returns less, the offsets up to which its writes are durable; an
        empty mapping commits nothing this time.
        """
        self.flush(offsets)
        return offsets

    def commit_metadata(self, partition: TopicPartition) -> str:
        """A string committed with ``partition``'s offset (after :meth:`pre_commit`).

        A sink that must undo writes made after its last commit (a file it appends to)
        records its position here and reads it back with
        :meth:`SinkTaskContext.committed` when the partition is opened again.
        """
        return ""

    def close(self, partitions: Collection[TopicPartition]) -> None:
        """These partitions are no longer this task's: close their writers.

        Called after their last offset commit. The default does nothing.
        """
