"""A simulated server host: its disk, its state machine, and the peer it runs.

The state machine is simply the list of txns applied so far, so that the checker can
compare any server's state with the common history; a snapshot is that list encoded
with msgspec. The host implements :class:`~herder.ensemble.zab.HostLog` for its peer.
"""

from __future__ import annotations

from bisect import bisect_right
from operator import attrgetter
from typing import TYPE_CHECKING

import msgspec

from herder.ensemble.zab import Peer, PersistedState, Snapshot, Txn
from tests.sim.checker import SafetyViolation
from tests.sim.disk import SimDisk

if TYPE_CHECKING:
    from tests.sim.cluster import Simulation

NEVER = 1 << 62

_zxid = attrgetter("zxid")
encode_state = msgspec.msgpack.Encoder().encode
decode_state = msgspec.msgpack.Decoder(list[Txn]).decode


class SimServer:
    """One host: a simulated disk, a state machine (the applied txns) and maybe a peer."""

    def __init__(self, sid: int, sim: Simulation) -> None:
        self.sid = sid
        self.sim = sim
        self.disk = SimDisk()
        self.peer: Peer | None = None
        self.incarnation = 0
        self.applied: list[Txn] = []
        self.timer_at = NEVER
        self.snapshot_every = sim.rng.randint(5, 60)
        self.since_snapshot = 0

    # -- HostLog ---------------------------------------------------------------------

    def read_log(self, start: int, limit_bytes: int | None) -> list[Txn] | None:
        log = self.disk.view.log
        if not log or log[0].zxid > start:
            return None
        # from the last txn at or before start
        txns = log[bisect_right(log, start, key=_zxid) - 1 :]
        if limit_bytes is not None and sum(16 + len(t.payload) for t in txns) > limit_bytes:
            return None
        return txns

    def snapshot_size(self) -> int:
        return len(self.disk.view.snapshot.data)

    def snapshot_for_sync(self) -> Snapshot:
        applied = self.applied
        return Snapshot(applied[-1].zxid if applied else 0, encode_state(applied))

    # -- life and death ---------------------------------------------------------------

    def start(self, now: int, corrupt: bool) -> None:
        sim = self.sim
        if corrupt and self.disk.corrupt(sim.rng):
            sim.report.corruptions += 1
        durable = self.disk.durable
        snapshot = durable.snapshot
        self.applied = decode_state(snapshot.data)
        sim.checker.on_restore(self.sid, self.applied)
        self.incarnation += 1
        self.timer_at = NEVER
        self.since_snapshot = 0
        state = PersistedState(
            accepted_epoch=durable.accepted_epoch,
            current_epoch=durable.current_epoch,
            applied_zxid=snapshot.zxid,
            log_tail=[t for t in durable.log if t.zxid > snapshot.zxid],
            needs_snap=durable.needs_snap,
        )
        self.peer = Peer(
            self.sid, sim.config, state, self, rng_seed=sim.rng.getrandbits(64), now_ms=now
        )

    def crash(self) -> None:
        survivors = self.disk.crash(self.sim.rng)
        self.sim.checker.on_durable(self.sid, survivors)
        self.peer = None
        self.incarnation += 1
        self.applied = []

    def restore(self, snapshot: Snapshot) -> None:
        self.applied = decode_state(snapshot.data)
        if snapshot.zxid != (self.applied[-1].zxid if self.applied else 0):
            raise SafetyViolation(f"server {self.sid} got a SNAP whose zxid is not its state's")
        self.sim.checker.on_restore(self.sid, self.applied)
