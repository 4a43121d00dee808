"""An ensemble server: storage, state machine and client RPCs behind one asyncio loop.

Start-up recovers the state from the newest valid snapshot plus the transaction log,
starts a new epoch (persisted before anything is proposed in it), and serves clients.
Writes go through the :mod:`pipeline <herder.ensemble.pipeline>` (zxid, fsync, apply);
reads are answered from the applied state. Sessions are the leader's business: its
tracker decides expiry and proposes it as a transaction, so replicas never consult
their own clocks.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Sequence
from functools import partial

from herder.ensemble import apis
from herder.ensemble.config import EnsembleConfig
from herder.ensemble.pipeline import StandalonePipeline
from herder.ensemble.services import LeaderService
from herder.ensemble.sessions import SessionIdAllocator, SessionTracker
from herder.ensemble.state import StateMachine
from herder.ensemble.storage.committer import GroupCommitter
from herder.ensemble.storage.files import FileSystem
from herder.ensemble.storage.policy import SnapshotPolicy
from herder.ensemble.storage.store import Storage
from herder.ensemble.txn import (
    CloseSession,
    CreateSession,
    ExpireSessions,
    Noop,
    Op,
    Txn,
    TxnResult,
    WriteTxn,
    decode_txn,
    format_zxid,
    zxid_epoch,
)
from herder.errors import (
    InvalidSessionTimeout,
    NotLeader,
    NotSupported,
    ProtocolError,
    SessionExpired,
)
from herder.wire import ApiRegistry, RequestContext, WireServer

log = logging.getLogger(__name__)

#: the longest a long poll may park on the server
MAX_WAIT_MS = 60_000


def _now_ms() -> int:
    return int(time.time() * 1000)


def _monotonic_ms() -> int:
    return int(time.monotonic() * 1000)


class EnsembleServer:
    """One standalone ensemble server (replication arrives with the Zab peer)."""

    def __init__(
        self,
        config: EnsembleConfig,
        *,
        fs: FileSystem | None = None,
        services: Sequence[LeaderService] = (),
    ) -> None:
        self.config = config
        self.services = list(services)
        self._fs = fs
        self.role = "standalone"
        self.storage: Storage | None = None
        self.state = StateMachine()
        self.pipeline: StandalonePipeline | None = None
        self.wire = WireServer(
            ApiRegistry(apis.CLIENT_APIS),
            name=f"herder-ensemble-{config.server_id}",
            max_frame_bytes=config.max_frame_bytes,
            max_connections_per_host=config.max_client_connections,
        )
        self.tracker = SessionTracker(config.tick_time_ms)
        self._ids = SessionIdAllocator(config.server_id, _now_ms())
        self._policy = SnapshotPolicy(config.snap_count, random.Random())
        self._snapshotting: asyncio.Task[None] | None = None
        self._snapshots_taken = 0
        self._expiry_task: asyncio.Task[None] | None = None
        self._stopped = asyncio.Event()
        self._committer: GroupCommitter | None = None
        self.epoch = 0
        self.port = 0

    # -- lifecycle ----------------------------------------------------------------

    async def start(self) -> None:
        cfg = self.config
        if not cfg.standalone:
            raise NotSupported(
                f"the config lists {len(cfg.peers)} servers, but replication is not supported"
                " yet: run one server (no server.N lines, or just one)"
            )
        storage = await asyncio.to_thread(
            Storage.open,
            str(cfg.data_dir),
            str(cfg.data_log_dir),
            fs=self._fs,
            log_file_size=cfg.prealloc_bytes,
            snap_retain_count=cfg.snap_retain_count,
        )
        self.storage = storage
        recovery = storage.recovery
        state = (
            StateMachine.restore(recovery.snapshot.payload) if recovery.snapshot else StateMachine()
        )
        for entry in recovery.transactions:
            state.apply(decode_txn(entry.payload))
        self.state = state
        log.info(
            "server %d recovered %d logs and %d sessions up to zxid %s",
            cfg.server_id,
            len(state.logs()),
            len(state.sessions()),
            format_zxid(state.last_zxid),
        )
        # A standalone server is its own leader: each start is a new epoch, persisted
        # before any transaction of that epoch is written.
        epochs = storage.epochs
        last_epoch = max(
            epochs.accepted_epoch(), epochs.current_epoch(), zxid_epoch(state.last_zxid)
        )
        self.epoch = last_epoch + 1
        await asyncio.to_thread(epochs.set_accepted_epoch, self.epoch)
        await asyncio.to_thread(epochs.set_current_epoch, self.epoch)
        self._committer = GroupCommitter(storage)
        self.pipeline = StandalonePipeline(
            state, self._committer, self.epoch, _now_ms, on_applied=self._applied
        )
        now = _monotonic_ms()
        for info in state.sessions().values():
            self.tracker.add(info.session_id, info.timeout_ms, now)
        await self.pipeline.submit(lambda h: Noop(h))
        self._route()
        for service in self.services:
            service.attach(self)
        for service in self.services:
            await service.became_leader(self.epoch)
        self.port = await self.wire.start(cfg.client_address, cfg.client_port)
        self._expiry_task = asyncio.create_task(self._expire_sessions())
        log.info(
            "server %d (%s, epoch %d) serving clients on %s:%d",
            cfg.server_id,
            self.role,
            self.epoch,
            cfg.client_address,
            self.port,
        )

    async def stop(self) -> None:
        """Stop serving, finish what is being written, release the data directory."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        for service in self.services:
            service.lost_leadership()
        await self.wire.stop()
        if self._expiry_task is not None:
            self._expiry_task.cancel()
        if self.pipeline is not None:
            self.pipeline.stop()
        if self._snapshotting is not None:
            await asyncio.gather(self._snapshotting, return_exceptions=True)
        if self._committer is not None:
            await self._committer.close()
        if self.storage is not None:
            await asyncio.to_thread(self.storage.close)
        log.info("server %d stopped", self.config.server_id)

    async def wait_stopped(self) -> None:
        await self._stopped.wait()

    # -- background work ----------------------------------------------------------

    async def _expire_sessions(self) -> None:
        interval = max(self.config.tick_time_ms / 2000, 0.01)
        assert self.pipeline is not None
        while True:
            await asyncio.sleep(interval)
            expired = self.tracker.expired(_monotonic_ms())
            if expired:
                log.info("expiring sessions %s", ", ".join(f"{s:#x}" for s in expired))
                try:
                    await self.pipeline.submit(partial(ExpireSessions, session_ids=expired))
                except Exception:
                    log.exception("could not expire sessions")

    def _applied(self, txn: Txn, result: TxnResult) -> None:
        if self._policy.record_txn() and self._snapshotting is None:
            self._snapshotting = asyncio.get_running_loop().create_task(self._snapshot())

    async def _snapshot(self) -> None:
        assert self.storage is not None and self._committer is not None
        zxid = self.state.last_zxid
        payload = self.state.snapshot()
        try:
            await self._committer.exclusive(self.storage.write_snapshot, zxid, payload)
            self._snapshots_taken += 1
            log.info("snapshot at zxid %s (%d bytes)", format_zxid(zxid), len(payload))
        except Exception:
            log.exception("snapshot at zxid %s failed", format_zxid(zxid))
        finally:
            self._snapshotting = None

    # -- what hosted services see (ServiceHost) -------------------------------------

    @property
    def server_id(self) -> int:
        return self.config.server_id

    @property
    def is_leader(self) -> bool:
        return self.pipeline is not None and not self._stopped.is_set()

    def leader_client_address(self) -> tuple[int, str] | None:
        if not self.is_leader:
            return None
        host = self.config.client_address
        if host in ("0.0.0.0", "::", ""):
            host = "127.0.0.1"
        return self.config.server_id, f"{host}:{self.port}"

    async def commit(self, ops: Sequence[Op]) -> TxnResult:
        if self.pipeline is None or self._stopped.is_set():
            raise NotLeader(f"server {self.config.server_id} is not the leader")
        return await self.pipeline.submit(partial(WriteTxn, ops=list(ops)))

    # -- handlers -----------------------------------------------------------------

    def _route(self) -> None:
        w = self.wire
        w.route(apis.CONNECT_SESSION, self._connect_session)
        w.route(apis.PING_SESSION, self._ping_session)
        w.route(apis.CLOSE_SESSION, self._close_session)
        w.route(apis.TRANSACT, self._transact)
        w.route(apis.LIST_LOGS, self._list_logs)
        w.route(apis.DESCRIBE_LOG, self._describe_log)
        w.route(apis.READ_LOG, self._read_log)
        w.route(apis.END_OFFSETS, self._end_offsets)
        w.route(apis.SYNC, self._sync)
        w.route(apis.STATUS, self._status)

    def _live_session(self, session_id: int) -> None:
        if session_id and not self.tracker.touch(session_id, _monotonic_ms()):
            raise SessionExpired(f"session {session_id:#x} has expired or was closed")

    async def _connect_session(
        self, req: apis.ConnectSessionRequest, ctx: RequestContext
    ) -> apis.ConnectSessionResponse:
        assert self.pipeline is not None
        cfg = self.config
        if req.session_id:
            self._live_session(req.session_id)
            info = self.state.sessions().get(req.session_id)
            if info is None:
                raise SessionExpired(f"session {req.session_id:#x} has expired or was closed")
            return apis.ConnectSessionResponse(
                session_id=info.session_id,
                timeout_ms=info.timeout_ms,
                server_id=cfg.server_id,
                last_zxid=self.state.last_zxid,
                last_seq=info.last_seq,
            )
        if req.timeout_ms <= 0:
            raise InvalidSessionTimeout(f"session timeout {req.timeout_ms} ms must be positive")
        timeout = min(max(req.timeout_ms, cfg.min_session_timeout_ms), cfg.max_session_timeout_ms)
        session_id = self._ids.allocate()
        result = await self.pipeline.submit(lambda h: CreateSession(h, session_id, timeout))
        result.raise_for_error()
        self.tracker.add(session_id, timeout, _monotonic_ms())
        log.info(
            "session %#x opened by %s (%s), timeout %d ms",
            session_id,
            req.client_name or "?",
            ctx.connection.peer,
            timeout,
        )
        return apis.ConnectSessionResponse(
            session_id=session_id,
            timeout_ms=timeout,
            server_id=cfg.server_id,
            last_zxid=result.zxid,
        )

    async def _ping_session(
        self, req: apis.PingSessionRequest, ctx: RequestContext
    ) -> apis.PingSessionResponse:
        self._live_session(req.session_id)
        return apis.PingSessionResponse(last_zxid=self.state.last_zxid)

    async def _close_session(
        self, req: apis.CloseSessionRequest, ctx: RequestContext
    ) -> apis.CloseSessionResponse:
        assert self.pipeline is not None
        self._live_session(req.session_id)
        self.tracker.remove(req.session_id)
        result = await self.pipeline.submit(lambda h: CloseSession(h, req.session_id))
        result.raise_for_error()
        return apis.CloseSessionResponse(zxid=result.zxid)

    async def _transact(
        self, req: apis.TransactRequest, ctx: RequestContext
    ) -> apis.TransactResponse:
        assert self.pipeline is not None
        if not req.ops:
            raise ProtocolError("a transaction needs at least one operation")
        if req.session_id == 0:
            raise ProtocolError("a write needs a session: connect one first")
        self._live_session(req.session_id)
        ops = req.ops
        result = await self.pipeline.submit(
            lambda h: WriteTxn(h, ops), session_id=req.session_id, seq=req.seq
        )
        return apis.TransactResponse(result=result)

    async def _list_logs(
        self, req: apis.ListLogsRequest, ctx: RequestContext
    ) -> apis.ListLogsResponse:
        return apis.ListLogsResponse(logs=self.state.logs())

    async def _describe_log(
        self, req: apis.DescribeLogRequest, ctx: RequestContext
    ) -> apis.DescribeLogResponse:
        return apis.DescribeLogResponse(log=self.state.describe(req.name))

    async def _await_zxid(self, zxid: int, wait_ms: int) -> None:
        assert self.pipeline is not None
        if zxid and self.state.last_zxid < zxid:
            await self.pipeline.watch.wait_for_zxid(
                zxid, lambda: self.state.last_zxid, min(max(wait_ms, 1000), MAX_WAIT_MS) / 1000
            )

    async def _read_log(
        self, req: apis.ReadLogRequest, ctx: RequestContext
    ) -> apis.ReadLogResponse:
        assert self.pipeline is not None
        await self._await_zxid(req.min_zxid, req.wait_ms)
        state = self.state
        records = state.read(req.log, req.from_offset, req.max_records, req.max_bytes)
        if not records and req.wait_ms > 0 and not self._stopped.is_set():
            end = state.end_offset(req.log)
            if end <= req.from_offset:
                await self.pipeline.watch.wait_for_log(
                    req.log, min(req.wait_ms, MAX_WAIT_MS) / 1000
                )
                records = state.read(req.log, req.from_offset, req.max_records, req.max_bytes)
        end = state.end_offset(req.log)
        next_offset = records[-1].offset + 1 if records else max(req.from_offset, end)
        return apis.ReadLogResponse(
            records=records, next_offset=next_offset, end_offset=end, last_zxid=state.last_zxid
        )

    async def _end_offsets(
        self, req: apis.EndOffsetsRequest, ctx: RequestContext
    ) -> apis.EndOffsetsResponse:
        await self._await_zxid(req.min_zxid, req.wait_ms)
        return apis.EndOffsetsResponse(
            end_offsets={name: self.state.end_offset(name) for name in req.logs},
            last_zxid=self.state.last_zxid,
        )

    async def _sync(self, req: apis.SyncRequest, ctx: RequestContext) -> apis.SyncResponse:
        # Standalone: everything committed is applied here already.
        return apis.SyncResponse(zxid=self.state.last_zxid)

    async def _status(self, req: apis.StatusRequest, ctx: RequestContext) -> apis.StatusResponse:
        assert self.pipeline is not None and self.storage is not None
        cfg = self.config
        stats = self.storage.stats()
        return apis.StatusResponse(
            server_id=cfg.server_id,
            role=self.role,
            epoch=self.epoch,
            last_zxid=stats.last_zxid,
            committed_zxid=self.state.last_zxid,
            sessions=len(self.state.sessions()),
            logs=len(self.state.logs()),
            outstanding_requests=self.pipeline.outstanding,
            client_address=f"{cfg.client_address}:{self.port}",
            peers=[
                apis.PeerInfo(
                    server_id=p.server_id,
                    role="observer" if p.observer else "participant",
                    client_address=p.client_address,
                )
                for p in cfg.peers.values()
            ],
            fsyncs=stats.fsyncs,
            snapshots=self._snapshots_taken,
        )


async def run_server(config: EnsembleConfig, services: Sequence[LeaderService] = ()) -> None:
    """Run a server until SIGTERM or SIGINT, then stop it cleanly."""
    import signal

    server = EnsembleServer(config, services=services)
    await server.start()
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("server %d stopping on signal", config.server_id)
    await server.stop()
