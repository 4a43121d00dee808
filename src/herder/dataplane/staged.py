"""A batch Spark has written but the ensemble does not know of yet."""

from __future__ import annotations

from dataclasses import dataclass

from herder.dataplane.storage import batch_dir


@dataclass(frozen=True)
class StagedSegment:
    """The records one batch holds for one partition: Parquet files, not yet a segment."""

    topic: str
    partition: int
    count: int
    #: Parquet files relative to ``storage.root``
    files: list[str]
    bytes: int
    max_timestamp: int
    #: records per file when the files hold runs of records in order (see
    #: :attr:`Segment.file_counts <herder.dataplane.metadata.Segment.file_counts>`)
    file_counts: list[int] | None = None
    #: the Spark types of the typed key and value (see :mod:`.typed`), None for bytes
    key_type: str | None = None
    value_type: str | None = None
    #: the value's fields every record holds alike, kept here rather than in the files
    #: (see :attr:`Segment.value_constants <herder.dataplane.metadata.Segment.value_constants>`)
    value_constants: str | None = None


@dataclass(frozen=True)
class StagedBatch:
    """What :meth:`SegmentWriter.stage <herder.dataplane.writer.SegmentWriter.stage>` wrote.

    ``topic_versions`` are the topic incarnations the batch was partitioned for; the
    commit checks them, so a batch never lands in a topic deleted and created again
    since (whose partitions may differ). Readers see none of it until
    :meth:`Topics.commit <herder.dataplane.topics.Topics.commit>` publishes it.
    """

    task: str
    epoch: int
    batch: int
    segments: list[StagedSegment]
    topic_versions: dict[str, int]

    @property
    def dir(self) -> str:
        """The batch's directory, relative to ``storage.root``."""
        return batch_dir(self.task, self.epoch, self.batch)

    @property
    def records(self) -> int:
        return sum(s.count for s in self.segments)

    @property
    def bytes(self) -> int:
        return sum(s.bytes for s in self.segments)
