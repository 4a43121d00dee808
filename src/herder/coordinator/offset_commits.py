"""OffsetCommit, OffsetFetch and the expiry of an empty group's offsets.

Commits are judged by the group's membership (the seed's ``doCommitOffsets``): a
member of the current generation may commit, also while the group prepares a
rebalance (its partitions are still its own until it rejoins); during
CompletingRebalance nobody may, because the assignment is about to change hands; and
a group with no members accepts commits with generation -1, which is how admin tools
reset a group's position. A commit naming a group instance id that now belongs to
another member id (an older process of a static member) is refused with
FENCED_INSTANCE_ID. Committed offsets become visible to OffsetFetch only once the
store has them, with the leader epoch they were committed with.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from herder.coordinator.context import CoordinatorContext
from herder.coordinator.group import Group, GroupState
from herder.coordinator.messages import (
    CommittedPartition,
    FetchedOffset,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
    first_error,
)
from herder.coordinator.offsets import OffsetAndMetadata, TopicPartition
from herder.coordinator.rebalance import Rebalancer
from herder.coordinator.records import OffsetRecord
from herder.coordinator.store import offset_write_error
from herder.errors import ErrorCode

log = logging.getLogger(__name__)

CommitCallback = Callable[[OffsetCommitResponse], None]


def _commit_response(
    request: OffsetCommitRequest, errors: dict[TopicPartition, ErrorCode]
) -> OffsetCommitResponse:
    partitions = [
        CommittedPartition(
            topic=item.topic,
            partition=item.partition,
            error_code=errors[TopicPartition(item.topic, item.partition)],
        )
        for item in request.offsets
    ]
    top = first_error(partition.error_code for partition in partitions)
    return OffsetCommitResponse(error_code=top, partitions=partitions)


class OffsetCommits:
    def __init__(
        self, context: CoordinatorContext, groups: dict[str, Group], rebalancer: Rebalancer
    ) -> None:
        self._ctx = context
        self._groups = groups
        self._rebalancer = rebalancer

    def refuse_commit(self, request: OffsetCommitRequest, error: ErrorCode) -> OffsetCommitResponse:
        """The same error for every partition of the request."""
        errors = {TopicPartition(item.topic, item.partition): error for item in request.offsets}
        response = _commit_response(request, errors)
        # a request that names no partition must still say why nothing happened
        response.error_code = error
        return response

    def commit(self, request: OffsetCommitRequest, respond: CommitCallback) -> None:
        group = self._groups.get(request.group_id)
        if group is None:
            if request.generation_id >= 0:
                # a member of a generation this coordinator never saw: a stale client
                self._ctx.reply(respond, self.refuse_commit(request, ErrorCode.ILLEGAL_GENERATION))
                return
            group = self._groups[request.group_id] = Group(request.group_id, self._ctx.now_ms)
        error = self._refusal(group, request)
        if error is not None:
            self._ctx.reply(respond, self.refuse_commit(request, error))
        else:
            self._store(group, request, respond)

    def _refusal(self, group: Group, request: OffsetCommitRequest) -> ErrorCode | None:
        if group.is_in(GroupState.DEAD):
            return ErrorCode.UNKNOWN_MEMBER_ID
        if request.generation_id < 0 and group.is_in(GroupState.EMPTY):
            return None
        # membership before state (as Kafka does since 2.x; the seed checks the state
        # first): a removed member learns to drop its id instead of rejoining with it
        error = group.validate_member(request.member_id, request.group_instance_id)
        if error is not None:
            return error
        if request.generation_id != group.generation_id:
            return ErrorCode.ILLEGAL_GENERATION
        if group.is_in(GroupState.COMPLETING_REBALANCE):
            return ErrorCode.REBALANCE_IN_PROGRESS
        # a commit is a sign of life as good as a heartbeat
        self._rebalancer.schedule_session(group, group.get(request.member_id))
        return None

    def _store(self, group: Group, request: OffsetCommitRequest, respond: CommitCallback) -> None:
        now = self._ctx.now_ms
        limit = self._ctx.config.offset_metadata_max_bytes
        errors: dict[TopicPartition, ErrorCode] = {}
        accepted: dict[TopicPartition, OffsetAndMetadata] = {}
        for item in request.offsets:
            partition = TopicPartition(item.topic, item.partition)
            if len(item.metadata.encode()) > limit:
                errors[partition] = ErrorCode.OFFSET_METADATA_TOO_LARGE
            else:
                errors[partition] = ErrorCode.NONE
                accepted[partition] = OffsetAndMetadata(
                    offset=item.offset,
                    metadata=item.metadata,
                    commit_timestamp_ms=now,
                    leader_epoch=item.leader_epoch,
                )
        if not accepted:
            self._ctx.reply(respond, _commit_response(request, errors))
            return
        group.offsets.prepare_commit(accepted)
        records: dict[TopicPartition, OffsetRecord | None] = {
            partition: OffsetRecord.of(group.group_id, partition, offset)
            for partition, offset in accepted.items()
        }

        def on_stored(error: ErrorCode, zxid: int | None) -> None:
            for partition, offset in accepted.items():
                if error == ErrorCode.NONE:
                    group.offsets.complete_commit(partition, offset)
                else:
                    group.offsets.fail_commit(partition, offset)
                errors[partition] = offset_write_error(error)
            if error != ErrorCode.NONE:
                log.warning("group %s: offset commit failed: %s", group.group_id, error.name)
            self._ctx.reply(respond, _commit_response(request, errors))

        completion = self._ctx.completion(on_stored)
        self._ctx.write(lambda: self._ctx.store.store_offsets(group.group_id, records, completion))

    def fetch(self, request: OffsetFetchRequest) -> OffsetFetchResponse:
        """Committed offsets, whatever the group's state (it may not use membership)."""
        group = self._groups.get(request.group_id)
        committed = group.offsets.committed() if group else {}
        wanted = sorted(committed) if request.partitions is None else request.partitions
        offsets = []
        for partition in wanted:
            offset = committed.get(partition)
            fetched = FetchedOffset(topic=partition.topic, partition=partition.partition)
            if offset is not None:
                fetched.offset = offset.offset
                fetched.metadata = offset.metadata
                fetched.leader_epoch = offset.leader_epoch
            offsets.append(fetched)
        return OffsetFetchResponse(offsets=offsets)

    # -- retention -----------------------------------------------------------------

    def start_expiry(self) -> None:
        self._ctx.schedule(self._ctx.config.offsets_retention_check_interval_ms, self._expire)

    def _expire(self) -> None:
        """Drop expired offsets of Empty groups; a group left with nothing is deleted.

        Groups with members keep their offsets however old: the members still rely on
        them. In-memory state changes at once; a failed tombstone write is only logged,
        as in Kafka, since the offsets are past their retention either way.
        """
        now = self._ctx.now_ms
        retention = self._ctx.config.offsets_retention_ms
        for group in [g for g in self._groups.values() if g.is_in(GroupState.EMPTY)]:
            expired = group.offsets.expire(now, retention, group.state_timestamp_ms)
            if group.is_vacant:
                del self._groups[group.group_id]
                self._rebalancer.retire(group, ErrorCode.NOT_COORDINATOR)
                log.info("group %s expired with its %d offsets", group.group_id, len(expired))
                self._write_expiry(group.group_id, expired, delete_group=True)
            elif expired:
                log.info("group %s: %d offsets expired", group.group_id, len(expired))
                self._write_expiry(group.group_id, expired, delete_group=False)
        self.start_expiry()

    def _write_expiry(
        self, group_id: str, partitions: list[TopicPartition], *, delete_group: bool
    ) -> None:
        def on_written(error: ErrorCode, zxid: int | None) -> None:
            if error != ErrorCode.NONE:
                log.warning("group %s: expiring offsets not stored: %s", group_id, error.name)

        completion = self._ctx.completion(on_written)
        store = self._ctx.store
        if delete_group:
            self._ctx.write(lambda: store.delete_group(group_id, partitions, completion))
        else:
            tombstones: dict[TopicPartition, OffsetRecord | None] = dict.fromkeys(partitions)
            self._ctx.write(lambda: store.store_offsets(group_id, tombstones, completion))
