"""A replicated server's write path: the Zab peer, its disk, its network, its state.

:class:`ZabReplica` is the host of a :class:`~herder.ensemble.zab.Peer` on a real
server. It feeds the peer what happens (messages from :class:`QuorumNetwork`, time, the
disk catching up, client writes) and carries out what the peer asks (disk operations in
order on the server's :class:`~herder.ensemble.storage.store.Storage`, messages,
snapshots to restore, committed transactions to apply, role changes).

Writes: a server wraps a client's write into a transaction whose header names the
server and a request number (``origin``) and hands the bytes to the peer — proposed
directly on the leader, sent to the leader as a REQUEST on a learner. The write is
answered when *this* server applies the committed transaction with that origin, so a
client's next read on the same server sees it. Until then the zxid in the header is a
placeholder: the leader chooses zxids, and every server applies a transaction at the
zxid Zab committed it under.

It offers what the standalone pipeline offers (``submit``, ``watch``, ``outstanding``,
``stop``), so the server's handlers do not care which one they talk to.

Everything it does goes through seams a simulator can take over: the clocks and the
peer's random seed are parameters, the disk is the :class:`Storage` (over any
:class:`~herder.ensemble.storage.files.FileSystem`), and the network, the timers and the
disk's worker threads are the running asyncio loop's. ``tests/sim/real`` runs whole
ensembles of replicas on simulated loops, disks and links, one seed one history.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence

import msgspec

from herder.ensemble.config import EnsembleConfig
from herder.ensemble.pipeline import AppliedWatch
from herder.ensemble.quorum import QuorumNetwork
from herder.ensemble.state import StateMachine
from herder.ensemble.storage.committer import GroupCommitter
from herder.ensemble.storage.store import Storage
from herder.ensemble.txn import (
    Append as AppendOp,
)
from herder.ensemble.txn import (
    Txn,
    TxnHeader,
    TxnResult,
    WriteTxn,
    decode_txn,
    encode_txn,
    format_zxid,
)
from herder.ensemble.zab import (
    Append,
    DiskOp,
    DivergedHistory,
    EpochKind,
    Event,
    Following,
    Leading,
    Looking,
    LostLeadership,
    Message,
    Peer,
    PeerStatus,
    PersistedState,
    Ready,
    Role,
    SaveEpoch,
    SaveSnapshot,
    Snapshot,
    Truncate,
    ZabConfig,
)
from herder.ensemble.zab import (
    Txn as ZabTxn,
)
from herder.ensemble.zab.messages import Diff, Snap, Trunc
from herder.errors import NotLeader, ServerStopping

log = logging.getLogger(__name__)

#: a snapshot installed from a leader's SNAP carries the txns streamed after it, so that
#: the snapshot and those txns reach the disk in one rename (see ``SaveSnapshot``)
_TAIL_MAGIC = b"HZTAIL1\x00"
_tail_encoder = msgspec.msgpack.Encoder()
_tail_decoder = msgspec.msgpack.Decoder(tuple[bytes, list[ZabTxn]])

_SYNC_KINDS: dict[type, str] = {Diff: "DIFF", Trunc: "TRUNC", Snap: "SNAP"}


def _monotonic_ms() -> int:
    return int(time.monotonic() * 1000)


def _now_ms() -> int:
    return int(time.time() * 1000)


def zab_config(config: EnsembleConfig) -> ZabConfig:
    return ZabConfig(
        servers={
            sid: Role.OBSERVER if peer.observer else Role.PARTICIPANT
            for sid, peer in config.peers.items()
        },
        tick_ms=config.tick_time_ms,
        init_limit=config.init_limit,
        sync_limit=config.sync_limit,
        commit_log_count=config.commit_log_count,
        snapshot_size_factor=config.snapshot_size_factor,
        force_snap_sync=config.force_snapshot_sync,
    )


def split_snapshot(payload: bytes) -> tuple[bytes, list[ZabTxn]]:
    """A stored snapshot's state and the txns logged with it (none for our own)."""
    if payload.startswith(_TAIL_MAGIC):
        state, txns = _tail_decoder.decode(payload[len(_TAIL_MAGIC) :])
        return state, txns
    return payload, []


class _TakeSnapshot:
    """A host disk op: persist the state as of ``zxid`` once the log has it."""

    __slots__ = ("payload", "zxid")

    def __init__(self, zxid: int, payload: bytes) -> None:
        self.zxid = zxid
        self.payload = payload


class ZabReplica:
    """Runs this server's Zab peer; see the module docstring."""

    def __init__(
        self,
        config: EnsembleConfig,
        storage: Storage,
        committer: GroupCommitter,
        *,
        on_applied: Callable[[Txn, TxnResult], None],
        on_event: Callable[[Event], None],
        on_touches: Callable[[list[int]], None],
        on_fatal: Callable[[str], None] = lambda reason: None,
        clock: Callable[[], int] = _monotonic_ms,
        wall_clock: Callable[[], int] = _now_ms,
        rng_seed: int | None = None,
        zab: ZabConfig | None = None,
    ) -> None:
        """``clock`` gives the peer's time (monotonic ms), ``wall_clock`` the timestamps
        written into transactions; ``rng_seed`` seeds the peer's election jitter (random
        by default) and ``zab`` replaces the Zab settings derived from ``config``: all
        for a simulator that must replay one history exactly from one seed."""
        self.config = config
        self._clock = clock
        self._wall_clock = wall_clock
        self.storage = storage
        self._committer = committer
        self._on_applied = on_applied
        self._on_event = on_event
        self._on_touches = on_touches
        self._on_fatal = on_fatal
        self.watch = AppliedWatch()
        recovery = storage.recovery
        tail: list[ZabTxn] = []
        applied_zxid = 0
        state = StateMachine()
        self.snapshot_bytes = 0
        if recovery.snapshot is not None:
            data, tail = split_snapshot(recovery.snapshot.payload)
            state = StateMachine.restore(data)
            applied_zxid = recovery.snapshot.zxid
            self.snapshot_bytes = len(recovery.snapshot.payload)
        logged = {t.zxid for t in tail}
        tail += [ZabTxn(t.zxid, t.payload) for t in recovery.transactions if t.zxid not in logged]
        tail.sort(key=lambda t: t.zxid)
        self.state = state
        epochs = storage.epochs
        self.zab = zab or zab_config(config)
        self.peer = Peer(
            config.server_id,
            self.zab,
            PersistedState(
                accepted_epoch=epochs.accepted_epoch(),
                current_epoch=epochs.current_epoch(),
                applied_zxid=applied_zxid,
                log_tail=tail,
            ),
            self,
            rng_seed=int.from_bytes(os.urandom(8), "big") if rng_seed is None else rng_seed,
            now_ms=clock(),
        )
        self.net = QuorumNetwork(
            config.server_id,
            config.peers,
            on_message=self._message,
            on_lost=self._lost,
            tls=config.security.quorum_contexts(),
        )
        self.serving = False
        self.leading = False
        self.leader_id: int | None = None
        self.epoch = -1
        #: how this server last synchronised with a leader (DIFF, TRUNC or SNAP)
        self.last_sync = ""
        self.syncs: dict[str, int] = {"DIFF": 0, "TRUNC": 0, "SNAP": 0}
        self._pending: dict[int, asyncio.Future[TxnResult]] = {}
        base = (config.server_id & 0xFFF) << 51
        self._origins = itertools.count(base | (wall_clock() * 1000 & ((1 << 51) - 1)) or 1)
        self._disk: deque[DiskOp | _TakeSnapshot] = deque()
        self._disk_wake = asyncio.Event()
        self._disk_task: asyncio.Task[None] | None = None
        #: why this server stopped taking part (see _fail); None while it takes part
        self.failure: str | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: int | None = None
        self._driving = False
        self._again = False
        self._stopping = False
        self._touched: set[int] = set()
        self.snapshots_taken = 0

    # -- lifecycle ------------------------------------------------------------------

    async def start(self) -> None:
        """Start the disk and the peer; the server has started :attr:`net` already."""
        self._disk_task = asyncio.get_running_loop().create_task(self._disk_loop())
        self._drive()

    async def stop(self) -> None:
        self.stop_accepting()
        if self._timer is not None:
            self._timer.cancel()
        await self.net.stop()
        if self._disk_task is not None:
            self._disk_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._disk_task

    def stop_accepting(self) -> None:
        self._stopping = True
        self._fail_pending(ServerStopping("the server is shutting down; retry on another server"))
        self.watch.wake_all()

    # -- what the server's handlers use ---------------------------------------------

    @property
    def outstanding(self) -> int:
        return len(self._pending)

    @property
    def status(self) -> PeerStatus:
        return self.peer.status

    def touch(self, session_id: int) -> None:
        """A client of this learner showed its session is alive: tell the leader."""
        self._touched.add(session_id)

    async def submit(
        self, build: Callable[[TxnHeader], Txn], session_id: int = 0, seq: int = 0
    ) -> TxnResult:
        """Have the ensemble commit what ``build`` makes; answer once applied here."""
        if self._stopping:
            raise ServerStopping("the server is shutting down; retry on another server")
        if not self.serving:
            raise NotLeader(
                f"server {self.config.server_id} is not serving: it is not in sync with a"
                " leader (an election is under way or it cannot reach a quorum)"
            )
        origin = next(self._origins)
        txn = build(TxnHeader(0, self._wall_clock(), session_id, seq, origin))
        future: asyncio.Future[TxnResult] = asyncio.get_running_loop().create_future()
        self._pending[origin] = future
        try:
            self.peer.forward(encode_txn(txn), self._clock())
        except NotLeader:
            del self._pending[origin]
            self._drive()
            raise
        except Exception as exc:
            del self._pending[origin]
            self._core_failed(exc)
            raise ServerStopping(
                f"server {self.config.server_id} stopped: {self.failure}"
            ) from None
        self._drive()
        return await asyncio.shield(future)

    # -- inputs -----------------------------------------------------------------------

    # Every input reaches the core through one of these. An exception out of the core
    # (a step down never leaves it) means this server cannot go on: one that re-synced
    # would only meet the same error again, so it stops (see _fail).

    def _message(self, sid: int, message: Message) -> None:
        if self.failure is not None:
            return
        kind = _SYNC_KINDS.get(type(message))
        if kind is not None:
            self.last_sync = kind
            self.syncs[kind] += 1
        try:
            self.peer.step(message, sid, self._clock())
            self._drive()
        except Exception as exc:
            self._core_failed(exc)

    def _lost(self, sid: int) -> None:
        if self.failure is not None:
            return
        try:
            self.peer.disconnected(sid, self._clock())
            self._drive()
        except Exception as exc:
            self._core_failed(exc)

    def _tick(self) -> None:
        self._timer = self._timer_at = None
        if self.failure is not None:
            return
        if self._touched and not self.leading:
            self.peer.add_touches([s.to_bytes(8, "big") for s in self._touched])
            self._touched.clear()
        try:
            self.peer.tick(self._clock())
            self._drive()
        except Exception as exc:
            self._core_failed(exc)

    def _disk_done(self, token: int) -> None:
        if self.failure is not None:
            return
        try:
            self.peer.disk_done(token, self._clock())
            self._drive()
        except Exception as exc:
            self._core_failed(exc)

    def _core_failed(self, exc: Exception) -> None:
        if isinstance(exc, DivergedHistory):
            self._fail(
                f"its history diverged from the leader's ({exc}); it must not serve a"
                " rewritten history. Move its data directory aside and start it again to"
                " re-sync by SNAP from the leader",
            )
        else:
            self._fail(f"its replication failed ({type(exc).__name__}: {exc})", exc)

    def _fail(self, reason: str, exc: BaseException | None = None) -> None:
        """Stop taking part in the ensemble for good, loudly, and tell the server.

        A server that kept its links after such a failure would be a zombie: answering
        the leader's pings (or, leading, pinging its learners) while it can no longer
        log or apply anything. It closes them instead, so the others drop it at once,
        and the server exits with a non-zero status for its supervisor to see.
        """
        if self.failure is not None:
            return
        self.failure = reason
        log.critical(
            "server %d: stopping: %s",
            self.config.server_id,
            reason,
            exc_info=exc,
        )
        self.serving = self.leading = False
        self.stop_accepting()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = self._timer_at = None
        asyncio.get_running_loop().create_task(self.net.stop())
        self._on_fatal(reason)

    # -- effects ----------------------------------------------------------------------

    def _drive(self) -> None:
        if self._driving:
            self._again = True
            return
        self._driving = True
        try:
            while True:
                self._again = False
                ready = self.peer.ready()
                if ready:
                    self._carry_out(ready)
                if not self._again and not self.peer.has_ready():
                    break
        finally:
            self._driving = False
        self._schedule()

    def _carry_out(self, ready: Ready) -> None:
        if ready.disk:
            self._disk.extend(ready.disk)
            self._disk_wake.set()
        send = self.net.send
        for envelope in ready.messages:
            send(envelope.to, envelope.message)
        if ready.snapshot is not None:
            self._restore(ready.snapshot)
        if ready.committed:
            self._apply(ready.committed)
        for event in ready.events:
            self._event(event)
        for touches in ready.touches:
            self._on_touches([int.from_bytes(t, "big") for t in touches.touches if len(t) == 8])

    def _schedule(self) -> None:
        due = self.peer.next_deadline()
        if self._timer_at is not None and self._timer_at <= due:
            return
        if self._timer is not None:
            self._timer.cancel()
        loop = asyncio.get_running_loop()
        delay = max(0.0, (due - self._clock()) / 1000)
        self._timer_at = due
        self._timer = loop.call_later(delay, self._tick)

    def _restore(self, snapshot: Snapshot) -> None:
        self.state = StateMachine.restore(snapshot.data)
        log.info(
            "server %d: state replaced by the leader's snapshot at zxid %s",
            self.config.server_id,
            format_zxid(snapshot.zxid),
        )
        self.watch.applied(snapshot.zxid, set(), every_log=True)

    def _apply(self, committed: Iterable[ZabTxn]) -> None:
        touched: set[str] = set()
        every_log = False
        last = 0
        state = self.state
        pending = self._pending
        for entry in committed:
            txn = decode_txn(entry.payload)
            header = txn.header
            if header.zxid != entry.zxid:
                txn = msgspec.structs.replace(
                    txn, header=msgspec.structs.replace(header, zxid=entry.zxid)
                )
            result = state.apply(txn)
            last = entry.zxid
            if isinstance(txn, WriteTxn):
                if result.ok:
                    touched.update(op.log for op in txn.ops if isinstance(op, AppendOp))
            else:
                every_log = True
            self._on_applied(txn, result)
            if header.origin:
                future = pending.pop(header.origin, None)
                if future is not None and not future.done():
                    future.set_result(result)
        if last:
            self.watch.applied(last, touched, every_log=every_log)

    def _event(self, event: Event) -> None:
        sid = self.config.server_id
        if isinstance(event, Looking):
            was_serving = self.serving
            self.serving = self.leading = False
            self.leader_id = None
            self.net.drop_leader()
            self.net.drop_learners()
            if was_serving:
                self._fail_pending(
                    NotLeader(f"server {sid} lost its leader ({event.reason}); retry")
                )
        elif isinstance(event, LostLeadership):
            self.leading = False
        elif isinstance(event, Leading):
            self.serving = self.leading = True
            self.leader_id = sid
            self.epoch = event.epoch
        elif isinstance(event, Following):
            self.serving = True
            self.leading = False
            self.leader_id = event.leader
            self.epoch = event.epoch
        self._on_event(event)

    def _fail_pending(self, exc: BaseException) -> None:
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(exc)

    def snapshot_soon(self) -> None:
        """Persist the applied state once the log holds everything it covers."""
        self._disk.append(_TakeSnapshot(self.state.last_zxid, self.state.snapshot()))
        self._disk_wake.set()

    # -- the disk -----------------------------------------------------------------------

    async def _disk_loop(self) -> None:
        queue = self._disk
        committer = self._committer
        while True:
            while not queue:
                self._disk_wake.clear()
                await self._disk_wake.wait()
            try:
                head = queue[0]
                if isinstance(head, Append):
                    durable: asyncio.Future[int] | None = None
                    token = 0
                    while queue and isinstance(queue[0], Append):
                        op = queue.popleft()
                        assert isinstance(op, Append)
                        for txn in op.txns:
                            durable = committer.append(txn.zxid, txn.payload)
                        token = op.token
                    if durable is not None and not self.zab.faults.host_acks_before_fsync:
                        await durable
                    self._disk_done(token)
                    continue
                queue.popleft()
                await committer.flush()
                if isinstance(head, _TakeSnapshot):
                    await self._take_snapshot(head)
                    continue
                await committer.exclusive(self._run, head)
                self._disk_done(head.token)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                # Whatever is on disk now is not what the peer was promised: stop
                # answering for it, and stop answering at all, so the others drop this
                # server at once rather than keep a silent zombie.
                self._fail(
                    f"a disk operation failed ({type(exc).__name__}: {exc}); fix the data"
                    " directory (free space, permissions, the device) and start it again:"
                    " it recovers from its log and re-syncs with the leader",
                    exc,
                )
                return

    def _run(self, op: DiskOp) -> None:
        """One non-append disk op, in a thread, while no fsync of the log runs."""
        storage = self.storage
        if isinstance(op, Truncate):
            storage.truncate_to(op.zxid)
        elif isinstance(op, SaveEpoch):
            if op.kind is EpochKind.ACCEPTED:
                storage.epochs.set_accepted_epoch(op.epoch)
            else:
                storage.epochs.set_current_epoch(op.epoch)
        elif isinstance(op, SaveSnapshot):
            self._install(op.snapshot, op.txns)
        else:  # pragma: no cover - the loop handles the others
            raise AssertionError(f"unexpected disk op {op!r}")

    async def _take_snapshot(self, op: _TakeSnapshot) -> None:
        storage = self.storage
        if not 0 < op.zxid <= storage.last_zxid:
            return  # the log was replaced meanwhile (a SNAP): nothing to cover
        try:
            await self._committer.exclusive(storage.write_snapshot, op.zxid, op.payload)
        except (OSError, ValueError) as exc:
            log.error(
                "server %d: snapshot at zxid %s failed: %s",
                self.config.server_id,
                format_zxid(op.zxid),
                exc,
            )
            return
        self.snapshot_bytes = len(op.payload)
        self.snapshots_taken += 1
        log.info(
            "server %d: snapshot at zxid %s (%d bytes)",
            self.config.server_id,
            format_zxid(op.zxid),
            len(op.payload),
        )

    def _install(self, snapshot: Snapshot, txns: Sequence[ZabTxn]) -> None:
        storage = self.storage
        if snapshot.zxid == 0:
            storage.truncate_to(0)
        else:
            payload = snapshot.data
            if txns:
                payload = _TAIL_MAGIC + _tail_encoder.encode((snapshot.data, list(txns)))
            storage.install_snapshot(snapshot.zxid, payload)
            self.snapshot_bytes = len(payload)
        for txn in txns:
            storage.append(txn.zxid, txn.payload)
        storage.sync()

    # -- HostLog ------------------------------------------------------------------------

    def read_log(self, start: int, limit_bytes: int | None) -> Sequence[ZabTxn] | None:
        if limit_bytes is not None and self.storage.log_bytes_after(start) > limit_bytes:
            # over the limit (a SNAP it is): known from the records' headers alone,
            # without reading a whole log file back to find out
            return None
        out: list[ZabTxn] = []
        size = 0
        for txn in self.storage.transactions_from(start):
            if txn.zxid <= start:
                out = [ZabTxn(txn.zxid, txn.payload)]
                size = 16 + len(txn.payload)
                continue
            out.append(ZabTxn(txn.zxid, txn.payload))
            size += 16 + len(txn.payload)
            if limit_bytes is not None and size > limit_bytes:
                return None
        return out if out else None

    def snapshot_size(self) -> int:
        return self.snapshot_bytes

    def snapshot_for_sync(self) -> Snapshot:
        return Snapshot(self.state.last_zxid, self.state.snapshot())
