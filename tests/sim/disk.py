"""A simulated disk: what survives a crash is what was synced, plus luck.

Operations are issued in order and become durable in order (one queue, group commit).
A crash keeps the durable state, then some prefix of what was still pending (the OS
may have flushed it) and possibly part of one more append: its first records made it,
the next one is torn and dropped on restart, as a real log reader would.
"""

from __future__ import annotations

import random
from bisect import bisect_right
from dataclasses import dataclass, field
from operator import attrgetter

from herder.ensemble.zab import (
    Append,
    DiskOp,
    EpochKind,
    SaveEpoch,
    SaveSnapshot,
    Snapshot,
    Truncate,
    Txn,
)

_zxid = attrgetter("zxid")
EMPTY_STATE = b"\x90"  # msgpack's empty array: the state machine before any txn


@dataclass(frozen=True, slots=True)
class HostSnapshot:
    """The host's own periodic snapshot of its state machine (not a Zab op)."""

    snapshot: Snapshot


@dataclass(slots=True)
class DiskState:
    accepted_epoch: int = 0
    current_epoch: int = 0
    snapshot: Snapshot = field(default_factory=lambda: Snapshot(0, EMPTY_STATE))
    #: the snapshot before the newest: the log is kept back to it, as ZooKeeper's purge does
    previous_snapshot_zxid: int = 0
    log: list[Txn] = field(default_factory=list)
    needs_snap: bool = False

    def copy(self) -> DiskState:
        return DiskState(
            self.accepted_epoch,
            self.current_epoch,
            self.snapshot,
            self.previous_snapshot_zxid,
            list(self.log),
            self.needs_snap,
        )

    def apply(self, op: DiskOp | HostSnapshot) -> None:
        if isinstance(op, Append):
            self.log.extend(op.txns)
        elif isinstance(op, Truncate):
            del self.log[bisect_right(self.log, op.zxid, key=_zxid) :]
        elif isinstance(op, SaveEpoch):
            if op.kind is EpochKind.ACCEPTED:
                self.accepted_epoch = op.epoch
            else:
                self.current_epoch = op.epoch
        elif isinstance(op, SaveSnapshot):
            self.snapshot = op.snapshot
            self.previous_snapshot_zxid = op.snapshot.zxid
            self.log = list(op.txns)
            self.needs_snap = False
        else:
            self.previous_snapshot_zxid = self.snapshot.zxid
            self.snapshot = op.snapshot
            del self.log[: bisect_right(self.log, self.previous_snapshot_zxid, key=_zxid)]

    @property
    def last_zxid(self) -> int:
        return self.log[-1].zxid if self.log else self.snapshot.zxid


class SimDisk:
    def __init__(self) -> None:
        self.durable = DiskState()
        self.view = DiskState()  # durable + everything issued: what the host reads
        self.pending: list[tuple[int, DiskOp | HostSnapshot]] = []
        self.issued = 0

    def issue(self, op: DiskOp | HostSnapshot) -> int:
        """Queue ``op``; returns its ordinal, for :meth:`complete`."""
        self.view.apply(op)
        self.issued += 1
        self.pending.append((self.issued, op))
        return self.issued

    def complete(self, ordinal: int) -> tuple[int, list[Txn]]:
        """Make every op up to ``ordinal`` durable: (highest Zab token, txns appended)."""
        token = 0
        appended: list[Txn] = []
        pending = self.pending
        n = 0
        for number, op in pending:
            if number > ordinal:
                break
            n += 1
            self.durable.apply(op)
            if isinstance(op, Append | SaveSnapshot):
                appended.extend(op.txns)
            if not isinstance(op, HostSnapshot):
                token = op.token
        del pending[:n]
        return token, appended

    def crash(self, rng: random.Random) -> list[Txn]:
        """Lose what was not synced, except what luck kept; returns txns that survived."""
        kept = rng.randint(0, len(self.pending))
        survivors: list[Txn] = []
        for _, op in self.pending[:kept]:
            self.durable.apply(op)
            if isinstance(op, Append | SaveSnapshot):
                survivors.extend(op.txns)
        if kept < len(self.pending):
            _, op = self.pending[kept]
            if isinstance(op, Append) and rng.random() < 0.5:
                # a torn append: its first records made it, the next one is garbage that
                # a restart reads as a torn tail and truncates
                whole = op.txns[: rng.randint(0, len(op.txns) - 1)]
                self.durable.log.extend(whole)
                survivors.extend(whole)
        self.pending.clear()
        self.view = self.durable.copy()
        return survivors

    def corrupt(self, rng: random.Random) -> bool:
        """Damage a record that has good ones after it; the host then needs a SNAP."""
        log = self.durable.log
        if len(log) < 2:
            return False
        bad = rng.randrange(len(log) - 1)
        # everything from the bad record on is unreadable
        del log[bad:]
        self.durable.needs_snap = True
        self.view = self.durable.copy()
        return True
