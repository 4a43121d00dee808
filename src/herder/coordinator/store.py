"""Where the coordinator's writes go: an interface the ensemble (or a test) implements.

Every change the seed persists (a generation's assignments, an empty group, offset
commits, deletions) and every fencing epoch goes through :class:`GroupStore`. The
coordinator never waits: it hands over the write with a callback and carries on;
the store calls back exactly once, either before the call returns or later, with the
error code of the write (``ErrorCode.NONE`` on success) and, when the store is the
ensemble, the zxid the write committed at.

A store error reaches clients translated as Kafka translates the log's errors for its
group coordinator (``GroupMetadataManager.storeGroup`` and ``storeOffsets``): a lost
leadership becomes NOT_COORDINATOR, an unavailable log COORDINATOR_NOT_AVAILABLE, and
so on, so clients react with the retry logic they already have.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from herder.coordinator.offsets import TopicPartition
from herder.coordinator.records import FencingRecord, GroupRecord, OffsetRecord
from herder.errors import ErrorCode


class StoreCallback(Protocol):
    """Called once when a write completes: its error (NONE on success) and its zxid."""

    def __call__(self, error: ErrorCode, zxid: int | None = None) -> None: ...


class GroupStore(Protocol):
    """Durable writes to the ``_groups`` and ``_fencing`` logs (see ``records``)."""

    def store_group(self, group_id: str, record: GroupRecord, callback: StoreCallback) -> None:
        """Write ``group:<group_id>``."""

    def store_offsets(
        self,
        group_id: str,
        offsets: Mapping[TopicPartition, OffsetRecord | None],
        callback: StoreCallback,
    ) -> None:
        """Write the offset keys of ``group_id`` in one transaction; None deletes a key."""

    def delete_group(
        self, group_id: str, partitions: Sequence[TopicPartition], callback: StoreCallback
    ) -> None:
        """Delete ``group:<group_id>`` and the given offset keys in one transaction."""

    def store_fencing(self, record: FencingRecord, callback: StoreCallback) -> None:
        """Write ``<record.fenced_id>`` in ``_fencing``."""


_LOST_LEADERSHIP = frozenset({ErrorCode.NOT_LEADER, ErrorCode.NOT_LEADER_OR_FOLLOWER})
_UNAVAILABLE = frozenset(
    {
        ErrorCode.UNKNOWN_LOG,
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ErrorCode.SERVER_STOPPING,
        ErrorCode.NETWORK_EXCEPTION,
        ErrorCode.CONNECTION_CLOSED,
        ErrorCode.SESSION_EXPIRED,
        ErrorCode.UNKNOWN_SESSION,
    }
)
_TOO_LARGE = frozenset({ErrorCode.FRAME_TOO_LARGE, ErrorCode.MALFORMED_FRAME})


def store_error(error: ErrorCode) -> ErrorCode:
    """What any failed write means to a client: lost leadership, unavailable log, or as is."""
    if error in _LOST_LEADERSHIP:
        return ErrorCode.NOT_COORDINATOR
    if error in _UNAVAILABLE:
        return ErrorCode.COORDINATOR_NOT_AVAILABLE
    return error


def group_write_error(error: ErrorCode) -> ErrorCode:
    """What a failed group write means to members awaiting SyncGroup.

    A timeout becomes REBALANCE_IN_PROGRESS: the write may or may not land, so the
    members rejoin rather than trust an assignment the log might not hold.
    """
    if error == ErrorCode.REQUEST_TIMED_OUT:
        return ErrorCode.REBALANCE_IN_PROGRESS
    if error in _TOO_LARGE:
        return ErrorCode.UNKNOWN_SERVER_ERROR
    return store_error(error)


def offset_write_error(error: ErrorCode) -> ErrorCode:
    """What a failed offset commit means to the committer: too large is its own fault."""
    if error in _TOO_LARGE:
        return ErrorCode.INVALID_COMMIT_OFFSET_SIZE
    return store_error(error)
