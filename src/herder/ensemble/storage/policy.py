"""When to take a snapshot: every ``snapCount`` transactions, give or take, as ZooKeeper.

If every server snapshotted at exactly the same transaction count, the whole ensemble
would pause to serialise its state at the same moment. ZooKeeper staggers them: after
each snapshot it draws a random offset in ``[0, snapCount/2)`` and snapshots again once
more than ``snapCount/2 + offset`` transactions were logged. So do we, with the
randomness passed in so the simulator replays it.
"""

from __future__ import annotations

import random

#: ZooKeeper's default snapCount
DEFAULT_SNAP_COUNT = 100_000


class SnapshotPolicy:
    """Counts logged transactions and says when the next snapshot is due."""

    def __init__(self, snap_count: int, rng: random.Random) -> None:
        if snap_count < 2:
            raise ValueError(f"snapCount must be at least 2, not {snap_count}")
        self._half = snap_count // 2
        self._rng = rng
        self._count = 0
        self._threshold = self._draw()

    def _draw(self) -> int:
        return self._half + self._rng.randrange(self._half)

    @property
    def threshold(self) -> int:
        """Snapshot once more transactions than this were logged since the last one."""
        return self._threshold

    def record_txn(self) -> bool:
        """Count one logged transaction; True when a snapshot is due (the count restarts)."""
        self._count += 1
        if self._count <= self._threshold:
            return False
        self._count = 0
        self._threshold = self._draw()
        return True
