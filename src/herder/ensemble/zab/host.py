"""What a peer needs from the server it runs on, beyond its inputs.

The peer keeps in memory only the recent part of its log (the last
``commit_log_count`` committed txns and everything not yet known to be committed). Two
rarer needs reach the host's disk and state machine through :class:`HostLog`; the
simulator implements it over its fake disk, the real server over its storage.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from herder.ensemble.zab.effects import Snapshot
from herder.ensemble.zab.messages import Txn


class HostLog(Protocol):
    def read_log(self, start: int, limit_bytes: int | None) -> Sequence[Txn] | None:
        """The logged txns from the last one at or before ``start`` to the end of the log.

        Starting one txn early lets a leader see what precedes a zxid the learner has
        and it lacks (TRUNC to it). Returns ``None`` when the log does not reach back to
        ``start`` (its first txn is later, e.g. purged) or when the txns from there on
        take more than ``limit_bytes`` on disk (``None``: no limit).
        """
        ...

    def snapshot_size(self) -> int:
        """Bytes of the newest snapshot on disk (0 if there is none)."""
        ...

    def snapshot_for_sync(self) -> Snapshot:
        """The state machine's state at the last zxid the peer told the host to apply."""
        ...


@dataclass(frozen=True)
class PersistedState:
    """What a peer starts from: its epoch files and the part of its log it must know.

    ``applied_zxid`` is the zxid of the snapshot the host restored its state machine
    from, and ``log_tail`` the logged txns after it. Those txns are *not* applied yet:
    whether they committed is only known once the peer has synchronised with a leader,
    and the peer then hands them out as committed. ``needs_snap`` says the host found
    corruption in its own log: the peer then never votes or leads on that history and
    asks its leader for a SNAP.
    """

    accepted_epoch: int = 0
    current_epoch: int = 0
    applied_zxid: int = 0
    log_tail: Sequence[Txn] = field(default_factory=tuple)
    needs_snap: bool = False
