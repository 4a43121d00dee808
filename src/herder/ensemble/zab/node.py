"""What every role of a peer shares: identity, config, log, epochs and the outbox.

A peer is always in exactly one role (electing, leading or learning); the roles come
and go while the :class:`Node` lives as long as the peer. Everything a role wants done
goes through the node's outbox, which :meth:`Peer.ready` hands to the host.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass

from herder.ensemble.zab.config import Role, ZabConfig
from herder.ensemble.zab.effects import (
    Append,
    Envelope,
    EpochKind,
    Event,
    Ready,
    SaveEpoch,
    SaveSnapshot,
    Snapshot,
    Truncate,
)
from herder.ensemble.zab.history import History
from herder.ensemble.zab.host import HostLog, PersistedState
from herder.ensemble.zab.messages import Message, Txn
from herder.ensemble.zab.zxid import epoch_of


class StepDown(Exception):
    """Raised inside a role to leave it: the peer goes back to leader election.

    ``quiet`` marks a step down that repeats one already reported (a server retrying a
    leader that keeps refusing it), logged at debug level only.
    """

    def __init__(self, reason: str, *, quiet: bool = False) -> None:
        super().__init__(reason)
        self.quiet = quiet


@dataclass(slots=True)
class Refusal:
    """The leader (and its epoch) that last refused this server, and how many times."""

    leader: int
    epoch: int
    count: int = 1


class Node:
    __slots__ = (
        "_done_token",
        "_log_ends",
        "_next_token",
        "_snap_token",
        "accepted_epoch",
        "config",
        "current_epoch",
        "durable_zxid",
        "history",
        "host",
        "id",
        "needs_snap",
        "outbox",
        "refusal",
        "rng",
        "touches",
    )

    def __init__(
        self, my_id: int, config: ZabConfig, state: PersistedState, host: HostLog, rng_seed: int
    ) -> None:
        if my_id not in config.servers:
            raise ValueError(f"server {my_id} is not in the ensemble's configuration")
        self.id = my_id
        self.config = config
        self.host = host
        self.rng = random.Random(rng_seed)
        self.history = History(state.applied_zxid, state.log_tail, config.commit_log_count)
        # A learner may log txns of a new epoch (a DIFF during broadcast) just before it
        # writes currentEpoch; a crash in between leaves a log ahead of the file. That
        # log is a prefix of the new epoch's history, so the epoch it shows is the
        # truth, and acceptedEpoch can never trail currentEpoch.
        self.current_epoch = max(state.current_epoch, epoch_of(self.history.last))
        self.accepted_epoch = max(state.accepted_epoch, self.current_epoch)
        self.needs_snap = state.needs_snap
        self.durable_zxid = self.history.last
        self.outbox = Ready()
        self.touches: list[bytes] = []
        self._next_token = 1
        self._done_token = 0
        # (token, end of the log once that op is durable), for ops that move the end
        self._log_ends: deque[tuple[int, int]] = deque()
        self._snap_token: int | None = None
        self.refusal: Refusal | None = None

    # -- identity -------------------------------------------------------------------

    @property
    def is_participant(self) -> bool:
        return self.config.servers[self.id] is Role.PARTICIPANT

    @property
    def can_vote(self) -> bool:
        """Whether this peer's history may count in an election (and it may lead)."""
        return self.is_participant and not self.needs_snap

    # -- outbox -----------------------------------------------------------------------

    def send(self, to: int, message: Message) -> None:
        self.outbox.messages.append(Envelope(to, message))

    def emit(self, event: Event) -> None:
        self.outbox.events.append(event)

    def take_ready(self) -> Ready:
        ready, self.outbox = self.outbox, Ready()
        return ready

    # -- disk -------------------------------------------------------------------------

    def _token(self) -> int:
        token = self._next_token
        self._next_token += 1
        return token

    def log_append(self, txn: Txn) -> int:
        self.history.append(txn)
        token = self._token()
        disk = self.outbox.disk
        last = disk[-1] if disk else None
        if isinstance(last, Append):
            last.txns.append(txn)
            last.token = token
        else:
            disk.append(Append(token, [txn]))
        self._log_ends.append((token, txn.zxid))
        return token

    def log_truncate(self, zxid: int) -> int:
        self.history.truncate(zxid)
        token = self._token()
        self.outbox.disk.append(Truncate(token, zxid))
        self._log_ends.append((token, self.history.last))
        return token

    def install_snapshot(self, snapshot: Snapshot, txns: list[Txn]) -> int:
        """Take a leader's SNAP and the txns streamed after it, as one disk op."""
        history = self.history
        history.reset(snapshot.zxid)
        for txn in txns:
            history.append(txn)
        token = self._token()
        self.outbox.disk.append(SaveSnapshot(token, snapshot, txns))
        self.outbox.snapshot = snapshot
        # the snapshot replaces whatever state those commits would have built
        self.outbox.committed.clear()
        self._log_ends.append((token, history.last))
        self._snap_token = token
        return token

    def save_epoch(self, kind: EpochKind, epoch: int) -> int:
        if kind is EpochKind.ACCEPTED:
            self.accepted_epoch = epoch
        else:
            self.current_epoch = epoch
        token = self._token()
        self.outbox.disk.append(SaveEpoch(token, kind, epoch))
        return token

    def issued_token(self) -> int:
        """The token of the last disk op issued (0 if none)."""
        return self._next_token - 1

    def is_durable(self, token: int) -> bool:
        return token <= self._done_token

    def disk_done(self, token: int) -> None:
        if token <= self._done_token:
            return
        if token >= self._next_token:
            raise ValueError(f"disk_done({token}) for an operation never issued")
        self._done_token = token
        ends = self._log_ends
        while ends and ends[0][0] <= token:
            self.durable_zxid = ends.popleft()[1]
        if self._snap_token is not None and self._snap_token <= token:
            # the corrupt log is gone with the snapshot that replaced it
            self.needs_snap = False
            self._snap_token = None

    # -- state machine ------------------------------------------------------------

    def commit(self, up_to: int) -> list[Txn]:
        newly = self.history.commit(up_to)
        self.outbox.committed.extend(newly)
        return newly
