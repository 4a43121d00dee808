"""The part of a peer's log it keeps in memory.

Two things are kept: the last ``keep`` committed txns (ZooKeeper's ``committedLog``,
from which a leader sends DIFFs) and every txn after the commit point, which the peer
must be able to hand out as committed once it learns they are. Older txns live only in
the host's log on disk.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable
from operator import attrgetter

from herder.ensemble.zab.messages import Txn
from herder.ensemble.zab.zxid import hex_zxid

_zxid = attrgetter("zxid")


class DivergedHistory(RuntimeError):
    """Asked to drop or reorder committed txns: a protocol bug or a lost disk.

    Zab never truncates committed txns, so a server that is told to has lost the ground
    it stands on and must stop rather than serve a rewritten history.
    """


class History:
    """Committed window + uncommitted tail, in zxid order.

    ``committed`` is the last zxid handed out as committed (or restored from a
    snapshot); ``last`` the last zxid logged.
    """

    __slots__ = ("_n_committed", "_txns", "committed", "keep", "last")

    def __init__(self, committed: int, tail: Iterable[Txn], keep: int) -> None:
        self.keep = keep
        self.committed = committed
        self._txns: list[Txn] = []
        self._n_committed = 0
        self.last = committed
        for txn in tail:
            if txn.zxid > committed:
                self.append(txn)

    def __len__(self) -> int:
        return len(self._txns)

    @property
    def first(self) -> int:
        """The zxid of the oldest txn in memory (``committed`` if none is)."""
        return self._txns[0].zxid if self._txns else self.committed

    def append(self, txn: Txn) -> None:
        if txn.zxid <= self.last:
            raise DivergedHistory(
                f"txn {hex_zxid(txn.zxid)} does not follow the last one, {hex_zxid(self.last)}"
            )
        self._txns.append(txn)
        self.last = txn.zxid

    def truncate(self, zxid: int) -> None:
        """Drop every txn after ``zxid``."""
        if zxid < self.committed:
            raise DivergedHistory(
                f"told to truncate to {hex_zxid(zxid)} below the committed "
                f"{hex_zxid(self.committed)}"
            )
        del self._txns[bisect_right(self._txns, zxid, key=_zxid) :]
        self.last = self._txns[-1].zxid if self._txns else self.committed

    def reset(self, zxid: int) -> None:
        """Start over from a snapshot at ``zxid``: nothing in memory, all committed."""
        self._txns.clear()
        self._n_committed = 0
        self.committed = self.last = zxid

    def commit(self, up_to: int) -> list[Txn]:
        """Mark every txn up to ``up_to`` committed; return those newly committed."""
        if up_to <= self.committed:
            return []
        end = bisect_right(self._txns, up_to, key=_zxid)
        newly = self._txns[self._n_committed : end]
        self._n_committed = end
        self.committed = max(self.committed, min(up_to, self.last))
        if self._n_committed > self.keep:
            drop = self._n_committed - self.keep
            del self._txns[:drop]
            self._n_committed -= drop
        return newly

    def upto(self, zxid: int) -> list[Txn]:
        """The txns in memory with a zxid at most ``zxid``."""
        return self._txns[: bisect_right(self._txns, zxid, key=_zxid)]

    def after(self, zxid: int) -> list[Txn]:
        """The txns in memory with a zxid greater than ``zxid``."""
        return self._txns[bisect_right(self._txns, zxid, key=_zxid) :]

    def uncommitted(self) -> list[Txn]:
        return self._txns[self._n_committed :]
