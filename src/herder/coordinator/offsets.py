"""A group's committed offsets, and the commits still being written.

A commit is *pending* from the moment the coordinator accepts it until the store
confirms it; only then does OffsetFetch see it. A failed write leaves the previous
committed offset in place. If two commits for one partition are in flight, the later
one stays pending until its own write completes, so an earlier completion never hides
it (the seed's ``completePendingOffsetWrite``/``failPendingOffsetWrite``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import msgspec


class TopicPartition(msgspec.Struct, frozen=True, order=True):
    """One partition of a data topic; frozen so it can key a dict."""

    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"


class OffsetAndMetadata(msgspec.Struct, frozen=True, kw_only=True):
    """A committed position with the committer's free-form note and the commit time."""

    offset: int
    metadata: str = ""
    commit_timestamp_ms: int
    #: the leader epoch the position was read under (-1: none given)
    leader_epoch: int = -1


class GroupOffsets:
    """The committed and pending offsets of one group."""

    def __init__(self) -> None:
        self._committed: dict[TopicPartition, OffsetAndMetadata] = {}
        self._pending: dict[TopicPartition, OffsetAndMetadata] = {}

    def __len__(self) -> int:
        return len(self._committed)

    @property
    def has_offsets(self) -> bool:
        """Whether anything is committed or on its way (an Empty group lingers while so)."""
        return bool(self._committed or self._pending)

    def get(self, partition: TopicPartition) -> OffsetAndMetadata | None:
        return self._committed.get(partition)

    def committed(self) -> dict[TopicPartition, OffsetAndMetadata]:
        return dict(self._committed)

    def partitions(self) -> list[TopicPartition]:
        """Every partition with an offset committed or on its way."""
        return sorted(self._committed.keys() | self._pending.keys())

    def load(self, offsets: Mapping[TopicPartition, OffsetAndMetadata]) -> None:
        """Take offsets read back from the store as committed."""
        self._committed.update(offsets)

    def prepare_commit(self, offsets: Mapping[TopicPartition, OffsetAndMetadata]) -> None:
        """Stage offsets whose write has been handed to the store."""
        self._pending.update(offsets)

    def complete_commit(self, partition: TopicPartition, offset: OffsetAndMetadata) -> None:
        """The store wrote ``offset``: make it visible, unless the partition was dropped."""
        if partition in self._pending:
            self._committed[partition] = offset
            if self._pending[partition] == offset:
                del self._pending[partition]

    def fail_commit(self, partition: TopicPartition, offset: OffsetAndMetadata) -> None:
        """The store refused ``offset``: forget it, keeping any later commit pending."""
        if self._pending.get(partition) == offset:
            del self._pending[partition]

    def remove(self, partitions: Iterable[TopicPartition]) -> None:
        for partition in partitions:
            self._pending.pop(partition, None)
            self._committed.pop(partition, None)

    def expire(
        self, now_ms: int, retention_ms: int, empty_since_ms: int | None
    ) -> list[TopicPartition]:
        """Drop the offsets whose retention has run out; return their partitions.

        Retention counts from the later of the commit and the moment the group became
        empty (Kafka's KIP-211), so a group that was busy for a month keeps its offsets
        for the full retention after its last member left. A partition with a commit in
        flight is kept: the write about to land is newer than anything expired.
        """
        since = empty_since_ms if empty_since_ms is not None else 0
        expired = [
            partition
            for partition, offset in self._committed.items()
            if partition not in self._pending
            and now_ms - max(offset.commit_timestamp_ms, since) >= retention_ms
        ]
        for partition in expired:
            del self._committed[partition]
        return sorted(expired)
