"""How a leader brings one learner to its history: ZooKeeper's ``syncFollower``.

:func:`plan_sync` is a pure function of the learner's last zxid and the leader's
histories, so each case can be tested on its own. Every plan is one marker (DIFF or
TRUNC) followed by PROPOSAL/COMMIT pairs, or a SNAP. The cases, in ZooKeeper's order:

1. a forced snapshot (the learner's log is corrupt, or ``force_snap_sync``) → SNAP;
2. the learner is at the leader's last zxid → an empty DIFF;
3. the learner is past the end of the committed log, and not at a new epoch's first
   zxid → TRUNC to the end;
4. the learner is inside the committed log → DIFF and the missing pairs when its zxid
   is in the log; TRUNC to the zxid before it, then the pairs, when its zxid is missing
   but the next one has the same epoch; SNAP when the next one is of another epoch
   (a TRUNC must never cross an epoch);
5. the learner is before the committed log → the same walk over the on-disk log, then
   the committed log, provided what must be sent is under ``snapshot_size_factor``
   times the snapshot's size and the two leave no gap between them; otherwise SNAP.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from herder.ensemble.zab.messages import Txn
from herder.ensemble.zab.zxid import epoch_of, is_epoch_start


class SyncKind(enum.Enum):
    DIFF = "DIFF"
    TRUNC = "TRUNC"
    SNAP = "SNAP"


@dataclass(frozen=True)
class SyncPlan:
    """``kind`` with its zxid (unused for SNAP), then a PROPOSAL/COMMIT pair per txn."""

    kind: SyncKind
    zxid: int = -1
    txns: Sequence[Txn] = field(default_factory=tuple)


SNAP = SyncPlan(SyncKind.SNAP)

#: reads the leader's on-disk log from a zxid on (see ``HostLog.read_log``)
TxnLogReader = Callable[[int], Sequence[Txn] | None]


class _Walk:
    """ZooKeeper's ``queueCommittedProposals``, state kept across the two logs it walks."""

    def __init__(self, peer_zxid: int, last_committed: int) -> None:
        self.peer_zxid = peer_zxid
        self.last_committed = last_committed
        self.marker: tuple[SyncKind, int] | None = None
        self.queued = peer_zxid
        self.txns: list[Txn] = []

    def feed(self, txns: Iterable[Txn], stop_after: int | None = None) -> bool:
        """Queue what the learner lacks from ``txns``; False if only a SNAP will do."""
        peer = self.peer_zxid
        previous = -1
        for txn in txns:
            zxid = txn.zxid
            if stop_after is not None and zxid > stop_after:
                break
            if zxid < peer:
                previous = zxid
                continue
            if self.marker is None:
                if zxid == peer:
                    self.marker = (SyncKind.DIFF, self.last_committed)
                    continue
                if is_epoch_start(peer):
                    self.marker = (SyncKind.DIFF, self.last_committed)
                elif epoch_of(zxid) != epoch_of(peer) or previous < 0:
                    return False
                else:
                    # the learner has a txn the leader never had: cut back to the one
                    # before it, which both have
                    self.marker = (SyncKind.TRUNC, previous)
            if zxid <= self.queued:
                continue
            self.txns.append(txn)
            self.queued = zxid
        if self.marker is None and is_epoch_start(peer):
            self.marker = (SyncKind.DIFF, self.last_committed)
        return True

    def plan(self) -> SyncPlan:
        if self.marker is None:
            return SNAP
        kind, zxid = self.marker
        return SyncPlan(kind, zxid, self.txns)


def plan_sync(
    peer_zxid: int,
    committed_log: Sequence[Txn],
    last_processed: int,
    *,
    force_snap: bool = False,
    txn_log: TxnLogReader | None = None,
) -> SyncPlan:
    """Decide how to synchronise a learner whose last logged zxid is ``peer_zxid``.

    ``committed_log`` is the leader's in-memory committed log, ending at
    ``last_processed``; ``txn_log`` reads the leader's on-disk log with the size limit
    already applied (``None``: synchronising from it is turned off).
    """
    if committed_log:
        min_committed, max_committed = committed_log[0].zxid, committed_log[-1].zxid
    else:
        min_committed = max_committed = last_processed
    if force_snap:
        return SNAP
    if peer_zxid == last_processed:
        return SyncPlan(SyncKind.DIFF, peer_zxid)
    if peer_zxid > max_committed and not is_epoch_start(peer_zxid):
        return SyncPlan(SyncKind.TRUNC, max_committed)
    walk = _Walk(peer_zxid, max_committed)
    if min_committed <= peer_zxid <= max_committed:
        if not walk.feed(committed_log):
            return SNAP
        return walk.plan()
    if peer_zxid < min_committed and txn_log is not None:
        older = txn_log(peer_zxid)
        if not older or not walk.feed(older, stop_after=min_committed):
            return SNAP
        if walk.queued < min_committed:
            return SNAP  # the on-disk log ends before the committed log starts
        walk.feed(committed_log)
        return walk.plan()
    return SNAP


class SyncThrottle:
    """Caps concurrent syncs of one kind (``learner.maxConcurrent{Snap,Diff}Syncs``).

    Followers are exempt, since a quorum must be able to catch up whatever observers do,
    but they still count towards the limit.
    """

    __slots__ = ("in_progress", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.in_progress = 0

    def begin(self, *, exempt: bool) -> bool:
        if not exempt and self.in_progress >= self.limit:
            return False
        self.in_progress += 1
        return True

    def end(self) -> None:
        self.in_progress -= 1
