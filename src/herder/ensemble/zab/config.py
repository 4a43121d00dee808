"""The settings a Zab peer runs with, under ZooKeeper's names where ZooKeeper has one."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from herder.errors import ConfigError


class Role(enum.Enum):
    """What a server does in the ensemble (``server.N=…:participant|observer``)."""

    PARTICIPANT = "participant"
    OBSERVER = "observer"


@dataclass(frozen=True)
class Faults:
    """Deliberate protocol bugs, all off by default.

    They exist only so that the simulator (``tests/sim``) can prove it catches exactly
    these mistakes; a real server never turns one on.
    """

    #: the leader commits a proposal as soon as any one server (itself) has it on disk
    commit_on_one_ack: bool = False
    #: ``acceptedEpoch`` is updated in memory but never written to disk
    skip_accepted_epoch_persist: bool = False
    #: a learner ACKs NEWLEADER before the DIFF/TRUNC/SNAP it received is durable
    ack_newleader_before_disk: bool = False
    #: the leader proposes each client write a learner forwards (REQUEST) twice
    propose_requests_twice: bool = False
    #: a follower logs and ACKs proposals but never applies a COMMIT in broadcast
    follower_ignores_commits: bool = False
    #: the server hosting the peer (``ZabReplica``) reports appended transactions
    #: durable as soon as they are handed to the log, before their fsync completes
    host_acks_before_fsync: bool = False
    #: storage starts a new log file without syncing its directory, so a crash can
    #: lose the file's name, and with it records already acknowledged
    storage_skips_log_dir_fsync: bool = False


#: The faults planted outside the protocol core, in the host and its storage: a
#: simulator that drives the core alone cannot plant them.
HOST_FAULTS: Final = frozenset({"host_acks_before_fsync", "storage_skips_log_dir_fsync"})


@dataclass(frozen=True)
class ZabConfig:
    """The ensemble's membership and timing; every server must run with the same one.

    Times are in milliseconds; ``init_limit`` and ``sync_limit`` count ticks, as in
    ZooKeeper. ``snapshot_size_factor`` below zero turns synchronisation from the
    on-disk transaction log off (ZooKeeper's ``zookeeper.snapshotSizeFactor``).
    """

    servers: Mapping[int, Role]
    tick_ms: int = 2000
    init_limit: int = 10
    sync_limit: int = 5
    commit_log_count: int = 500
    snapshot_size_factor: float = 0.33
    finalize_wait_ms: int = 200
    max_notification_interval_ms: int = 60_000
    max_concurrent_snap_syncs: int = 10
    max_concurrent_diff_syncs: int = 100
    #: always synchronise learners by snapshot (ZooKeeper's ``zookeeper.forceSnapshotSync``)
    force_snap_sync: bool = False
    faults: Faults = Faults()
    voters: frozenset[int] = field(init=False)
    quorum_size: int = field(init=False)

    def __post_init__(self) -> None:
        if not self.servers:
            raise ConfigError("the ensemble needs at least one server (server.N=…)")
        for sid in self.servers:
            if sid < 0:
                raise ConfigError(f"server.{sid}: server ids must not be negative")
        voters = frozenset(s for s, role in self.servers.items() if role is Role.PARTICIPANT)
        if not voters:
            raise ConfigError("the ensemble needs at least one participant (not only observers)")
        for key, value in (
            ("tickTime", self.tick_ms),
            ("initLimit", self.init_limit),
            ("syncLimit", self.sync_limit),
            ("commitLogCount", self.commit_log_count),
            ("learner.maxConcurrentSnapSyncs", self.max_concurrent_snap_syncs),
            ("learner.maxConcurrentDiffSyncs", self.max_concurrent_diff_syncs),
        ):
            if value < 1:
                raise ConfigError(f"{key}={value}: must be at least 1")
        if self.finalize_wait_ms < 0:
            raise ConfigError(f"finalizeWait={self.finalize_wait_ms}: must not be negative")
        if self.max_notification_interval_ms < self.finalize_wait_ms:
            raise ConfigError(
                f"maxNotificationInterval={self.max_notification_interval_ms}: "
                f"must be at least finalizeWait ({self.finalize_wait_ms})"
            )
        object.__setattr__(self, "voters", voters)
        object.__setattr__(self, "quorum_size", len(voters) // 2 + 1)

    def is_participant(self, sid: int) -> bool:
        return sid in self.voters

    def is_quorum(self, sids: set[int] | frozenset[int]) -> bool:
        """Whether ``sids`` hold a majority of the participants (observers never count)."""
        return len(self.voters.intersection(sids)) >= self.quorum_size
