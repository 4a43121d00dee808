"""What one sink delivery reads: whole pieces of each partition, within a budget.

A delivery reads from each assigned partition's position up to where a piece ends
(:meth:`~herder.dataplane.metadata.PartitionState.piece_ends`), within ``max_records``
records in all. For a sink that writes an output per offset range
(:attr:`~herder.connect.SinkTask.offset_ranged`) a delivery also takes at most
:data:`~herder.dataplane.reader.MAX_FILES_UNIONED` pieces of a topic, as many as a read
keeps one Spark partition each: every range it puts is then a whole piece, and the
outputs it names by their ranges' first offsets are those any other instance of the
task writes from the same position, however much more or less it finds to read. That is
what keeps a zombie's late delivery (a paused worker's, say) from writing records twice
beside its successor's outputs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypeVar

from herder.connect import OffsetRange, TopicPartition
from herder.dataplane.metadata import PartitionState
from herder.dataplane.reader import MAX_FILES_UNIONED

T = TypeVar("T")


@dataclass
class DeliveryPlan:
    """Fed each partition's position and state in turn; says what to read."""

    budget: int
    ranged: bool
    #: records the deliveries of small files may hold and still take the trickle path
    #: (0: none may). A delivery whose first piece fits is one of small files: it takes
    #: only what still fits, of this partition and the next, rather than gathering up
    #: to ``budget`` for one Spark job; a delivery whose first piece is bigger (bulk
    #: data) goes through Spark, and takes up to ``budget``
    small_budget: int = 0
    #: pieces a ranged delivery read by Spark should hold, one per core Spark has, even
    #: past ``budget`` (see :meth:`PartitionState.read_stop
    #: <herder.dataplane.metadata.PartitionState.read_stop>`): each of its pieces is a
    #: Spark partition, read by one core. Other reads are cut into splits for the cores
    #: by Spark, whatever their files, and keep to ``budget``: their sinks may collect
    #: what they read to the driver
    spread: int = 1
    #: ``[position, stop)`` of each partition to read, by topic
    by_topic: dict[str, dict[int, tuple[int, int]]] = field(default_factory=dict)
    #: the pieces read, as offset ranges in (partition, offset) order, by topic (for an
    #: offset-ranged sink)
    ranges: dict[str, list[OffsetRange]] = field(default_factory=dict)
    #: pieces taken so far, by topic (each topic's read is a Spark job of its own)
    _pieces: dict[str, int] = field(default_factory=dict)
    #: whether this is a delivery of small files; None until its first piece is taken
    _small: bool | None = None

    @property
    def reached(self) -> dict[TopicPartition, int]:
        """Where each partition read reaches."""
        return {
            TopicPartition(topic, partition): stop
            for topic, reads in self.by_topic.items()
            for partition, (_, stop) in reads.items()
        }

    def wants(self, topic: str) -> bool:
        """Whether this delivery can take more of ``topic``."""
        if self._small and self.small_budget <= 0:
            return False
        left = self._pieces_left(topic)
        return self.budget > 0 and (left is None or left > 0)

    def _pieces_left(self, topic: str) -> int | None:
        """Pieces a ranged read of ``topic`` may still take; None if it is not ranged."""
        if not self.ranged:
            return None
        return max(0, MAX_FILES_UNIONED - self._pieces.get(topic, 0))

    def take(self, tp: TopicPartition, position: int, state: PartitionState | None) -> None:
        """Read ``tp`` from ``position``, as much as the plan allows."""
        if state is None or not self.wants(tp.topic):
            return
        left = self._pieces_left(tp.topic)
        taken_before = self._pieces.get(tp.topic, 0)
        spread = self.spread - taken_before if left is not None else 1
        stop = state.read_stop(position, self.budget, left, max(1, spread))
        if stop <= position:
            return
        if self.small_budget > 0 and self._small is not False:
            if stop - position > self.small_budget:
                small = state.read_stop(position, min(self.budget, self.small_budget), left)
                if small - position <= self.small_budget:
                    stop = small
                elif self._small:
                    # a piece bigger than what is left: for a later delivery, which
                    # starts at another partition (the caller turns the order round)
                    return
            self._small = stop - position <= self.small_budget
            if self._small:
                self.small_budget -= stop - position
        taken = []
        start = position
        for end in state.piece_ends(position):
            if end > stop:
                break
            taken.append(OffsetRange(tp, start, end))
            start = end
        self._pieces[tp.topic] = taken_before + len(taken)
        if left is not None:
            ranges = self.ranges.setdefault(tp.topic, [])
            ranges.extend(taken)
            ranges.sort()
        self.budget -= stop - position
        self.by_topic.setdefault(tp.topic, {})[tp.partition] = (position, stop)


def in_turn(items: list[T], turn: int) -> list[T]:
    """``items`` starting at the ``turn``-th (modulo their number), then round: the order
    of a task's partitions for its ``turn``-th delivery, so that a partition whose
    records do not fit one delivery is first in some later one rather than always
    last behind the same others."""
    if not items:
        return items
    start = turn % len(items)
    return items[start:] + items[:start]
