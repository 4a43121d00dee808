"""Kafka's group coordinator as a pure core: membership, rebalances, offsets, fencing epochs.

``GroupCoordinator`` (``coordinator``) handles requests; ``Group`` (``group``) holds one
group's state machine; ``messages`` are the requests and responses, ``records`` what is
persisted through a ``GroupStore`` (``store``); ``timers`` carries the delayed
operations on the injected clock. See ``coordinator`` for how to drive it.
"""

from herder.coordinator.config import CoordinatorConfig
from herder.coordinator.coordinator import CoordinatorStatus, GroupCoordinator
from herder.coordinator.fencing import FencingCheck, fencing_check
from herder.coordinator.group import Group, GroupState, IllegalGroupTransition
from herder.coordinator.offsets import OffsetAndMetadata, TopicPartition
from herder.coordinator.records import (
    FENCING_LOG,
    GROUPS_LOG,
    FencingRecord,
    GroupRecord,
    MemberRecord,
    OffsetRecord,
    StoredGroup,
    collect_groups,
)
from herder.coordinator.store import GroupStore, StoreCallback

__all__ = [
    "FENCING_LOG",
    "GROUPS_LOG",
    "CoordinatorConfig",
    "CoordinatorStatus",
    "FencingCheck",
    "FencingRecord",
    "Group",
    "GroupCoordinator",
    "GroupRecord",
    "GroupState",
    "GroupStore",
    "IllegalGroupTransition",
    "MemberRecord",
    "OffsetAndMetadata",
    "OffsetRecord",
    "StoreCallback",
    "StoredGroup",
    "TopicPartition",
    "collect_groups",
    "fencing_check",
]
