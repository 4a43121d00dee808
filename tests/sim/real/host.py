"""One simulated server process running the real host code.

A :class:`RealHost` is what ``herder ensemble start`` builds, minus the client port:
:class:`~herder.ensemble.storage.store.Storage` opened on a
:class:`~herder.ensemble.storage.simfs.SimulatedFileSystem`, a
:class:`~herder.ensemble.storage.committer.GroupCommitter`, and a
:class:`~herder.ensemble.replica.ZabReplica` whose :class:`~herder.ensemble.quorum.QuorumNetwork`
talks over :mod:`tests.sim.real.net`, all on the host's own
:class:`~tests.sim.real.loop.SimLoop`. The file system outlives the process: a crash
throws the loop and everything on it away and loses what the disk had not synced
(tearing the unsynced tail at random), and a restart recovers from what is left, as a
real server does.

The checker sees the ensemble through the host's callbacks: each applied transaction
(the client write it carries), each transaction the log made durable (read back from
the simulated disk), a state replaced by a leader's SNAP, and who leads which epoch. A
restarted host also checks its disk kept what its storage had called durable.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from herder.ensemble.config import EnsembleConfig
from herder.ensemble.replica import ZabReplica
from herder.ensemble.state import StateMachine
from herder.ensemble.storage import GroupCommitter, SimulatedFileSystem, Storage
from herder.ensemble.txn import Append, Txn, TxnResult, WriteTxn, decode_txn
from herder.ensemble.zab import ServerState, ZabPhase, hex_zxid
from herder.ensemble.zab import Txn as ZabTxn
from tests.sim.checker import SafetyViolation
from tests.sim.real.loop import SimLoop

if TYPE_CHECKING:
    from tests.sim.real.cluster import RealReport, RealSimulation

DATA_DIR = "/data"
#: the simulated client writes append one record each to this log
WRITES_LOG = "sim"
#: a small log file size, so that logs roll and old files are purged within a run
LOG_FILE_SIZE = 2048
#: the wall clock the servers stamp transactions with, at simulated time zero
WALL_CLOCK_START_MS = 1_700_000_000_000


def write_of(payload: bytes) -> bytes:
    """The client write a logged transaction carries: the value it appends."""
    txn = decode_txn(payload)
    if not isinstance(txn, WriteTxn):
        return payload
    return _value(txn)


def _value(txn: WriteTxn) -> bytes:
    for op in txn.ops:
        if isinstance(op, Append) and op.log == WRITES_LOG and op.value is not None:
            return op.value
    raise SafetyViolation(f"a transaction carries no simulated write: {txn!r}")


class RealHost:
    """One server: a disk that survives crashes, and the process that may not."""

    def __init__(self, sid: int, sim: RealSimulation, config: EnsembleConfig) -> None:
        self.sid = sid
        self.sim = sim
        self.config = config
        self.fs = SimulatedFileSystem()
        self.incarnation = 0
        self.loop: SimLoop | None = None
        self.replica: ZabReplica | None = None
        self.storage: Storage | None = None
        #: what this server has applied, as (zxid, write) pairs, as the checker sees it
        self.applied: list[ZabTxn] = []
        self._state: StateMachine | None = None
        self._durable = 0
        #: the highest zxid the storage had called durable when the process last died
        self._promised = 0
        #: (acceptedEpoch, currentEpoch) as the disk last had them
        self._epochs = (0, 0)
        self._since_snapshot = 0
        self.snapshot_every = sim.rng.randint(5, 60)
        #: the dead processes' objects: kept, so none is finalised mid-run
        self.graveyard: list[Any] = []
        self.fatal: str | None = None

    @property
    def up(self) -> bool:
        return self.replica is not None

    # -- life and death ----------------------------------------------------------------

    def start(self) -> None:
        sim = self.sim
        self.incarnation += 1
        self.fatal = None
        loop = SimLoop(self.sid, sim.clock, sim.net, sim.rng, sim.profile.disk_ms)
        storage = Storage.open(
            DATA_DIR, fs=self.fs, log_file_size=LOG_FILE_SIZE, faults=sim.zab.faults
        )
        self._check_kept(storage)
        committer = GroupCommitter(storage)
        incarnation = self.incarnation
        replica = ZabReplica(
            self.config,
            storage,
            committer,
            on_applied=lambda txn, result: self._applied(incarnation, txn, result),
            on_event=lambda event: None,
            on_touches=lambda sessions: None,
            on_fatal=lambda reason: self._fatal(incarnation, reason),
            clock=sim.clock.ms,
            wall_clock=lambda: WALL_CLOCK_START_MS + sim.clock.ms(),
            rng_seed=sim.rng.getrandbits(64),
            zab=sim.zab,
        )
        self.loop, self.storage, self.replica = loop, storage, replica
        checker = sim.checker
        checker.on_durable(
            self.sid, [ZabTxn(t.zxid, write_of(t.payload)) for t in storage.recovery.transactions]
        )
        self._durable = storage.durable_zxid
        self._epochs = (storage.epochs.accepted_epoch(), storage.epochs.current_epoch())
        self._state = replica.state
        self.applied = _writes_in(replica.state)
        checker.on_restore(self.sid, self.applied)
        self._since_snapshot = 0
        loop.call_in(loop.create_task, self._boot(replica))

    async def _boot(self, replica: ZabReplica) -> None:
        # as EnsembleServer._start_replica does
        await replica.net.start()
        await replica.start()

    def tally(self, report: RealReport) -> None:
        """Add the running incarnation's syncs and snapshots to ``report``."""
        if self.replica is not None:
            report.syncs.update(self.replica.syncs)
            report.snapshots += self.replica.snapshots_taken

    def crash(self) -> None:
        """The process dies: its loop stops for good, the disk loses what was unsynced."""
        assert self.loop is not None and self.replica is not None
        self.tally(self.sim.report)
        self.loop.dead = True
        self.graveyard.append((self.loop, self.replica, self.storage))
        self._promised = self._durable
        self.sim.net.crashed(self.sid)
        self.fs.crash(self.sim.rng, tear=True)
        self.loop = self.replica = self.storage = None
        self._state = None
        self.applied = []
        self.incarnation += 1

    def _check_kept(self, storage: Storage) -> None:
        """A disk keeps what its storage called durable: the log reaches as far again."""
        recovery = storage.recovery
        recovered = max(
            recovery.snapshot.zxid if recovery.snapshot is not None else 0,
            recovery.transactions[-1].zxid if recovery.transactions else 0,
        )
        if recovered < self._promised:
            raise SafetyViolation(
                f"server {self.sid} recovered its log up to {hex_zxid(recovered)} only, but "
                f"had called {hex_zxid(self._promised)} durable before it crashed"
            )

    def discard(self) -> None:
        """The run is over: this host's loops, living and dead, run nothing more."""
        loops = [entry[0] for entry in self.graveyard]
        if self.loop is not None:
            loops.append(self.loop)
        for loop in loops:
            loop.discard()

    def _fatal(self, incarnation: int, reason: str) -> None:
        if incarnation == self.incarnation:
            self.fatal = reason

    # -- what the checker sees ---------------------------------------------------------

    def _applied(self, incarnation: int, txn: Txn, result: TxnResult) -> None:
        if incarnation != self.incarnation:
            return
        try:
            self._check_applied(txn, result)
        except SafetyViolation as violation:
            # the replica would take it for its own failure and stop: the run fails on it
            self.sim.violations.append(violation)
            raise

    def _check_applied(self, txn: Txn, result: TxnResult) -> None:
        self.check_restored(before=txn.header.zxid)
        if not isinstance(txn, WriteTxn):
            raise SafetyViolation(f"server {self.sid} applied a txn nobody wrote: {txn!r}")
        if not result.ok:
            raise SafetyViolation(f"server {self.sid} refused a plain append: {result!r}")
        entry = ZabTxn(txn.header.zxid, _value(txn))
        self.sim.checker.on_apply(self.sid, entry)
        self.applied.append(entry)
        self._since_snapshot += 1
        if self._since_snapshot >= self.snapshot_every and self.replica is not None:
            self._since_snapshot = 0
            self.replica.snapshot_soon()

    def check_restored(self, before: int | None = None) -> None:
        """If a leader's SNAP replaced the state, tell the checker what it now holds."""
        replica = self.replica
        if replica is None or replica.state is self._state:
            return
        self._state = replica.state
        writes = _writes_in(replica.state)
        if before is not None:
            writes = [w for w in writes if w.zxid < before]
        self.applied = writes
        self.sim.checker.on_restore(self.sid, writes)

    def after_step(self) -> None:
        """What the step changed on disk and in the role, for the checker."""
        replica, storage = self.replica, self.storage
        if replica is None or storage is None:
            return
        self.check_restored()
        durable = storage.durable_zxid
        if durable > self._durable:
            fresh = [
                ZabTxn(t.zxid, write_of(t.payload))
                for t in storage.transactions_after(self._durable)
                if t.zxid <= durable
            ]
            self.sim.checker.on_durable(self.sid, fresh)
        self._durable = durable
        epochs = (storage.epochs.accepted_epoch(), storage.epochs.current_epoch())
        if epochs != self._epochs:
            self._epochs = epochs
            self.sim.on_new_epoch(self)
        status = replica.peer.status
        if status.state is ServerState.LEADING and status.phase >= ZabPhase.SYNCHRONIZATION:
            self.sim.checker.on_leading(status.epoch, self.sid, self.incarnation)


def _writes_in(state: StateMachine) -> list[ZabTxn]:
    if WRITES_LOG not in {info.name for info in state.logs()}:
        return []
    records = state.read(WRITES_LOG, 0, 1 << 30)
    return [ZabTxn(r.zxid, r.value or b"") for r in records]
