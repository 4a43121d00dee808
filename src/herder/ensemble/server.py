"""An ensemble server: storage, state machine and client RPCs behind one asyncio loop.

A config without ``server.N`` lines (or with one) runs a standalone server: start-up
recovers the state from the newest valid snapshot plus the transaction log, starts a
new epoch (persisted before anything is proposed in it), and writes go through the
:mod:`pipeline <herder.ensemble.pipeline>` (zxid, fsync, apply).

With several servers, a :class:`~herder.ensemble.replica.ZabReplica` runs Zab between
them: one leader per epoch; writes sent to any server are committed by a quorum and
answered once the receiving server applied them; reads are served from the receiving
server's applied state (``sync`` first for the leader's latest). A server that is not
in sync with a leader refuses requests and drops its clients, who move on through
their bootstrap list.

Sessions are the leader's business: its tracker decides expiry and proposes it as a
transaction, so replicas never consult their own clocks; learners pass their clients'
touches to the leader with their pings.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Sequence
from functools import partial
from typing import Any

from herder.ensemble import apis
from herder.ensemble.admin import AdminServer, RequestStats
from herder.ensemble.config import EnsembleConfig
from herder.ensemble.pipeline import StandalonePipeline
from herder.ensemble.replica import ZabReplica
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
from herder.ensemble.zab import Event, Following, Leading, Looking, LostLeadership
from herder.errors import (
    HerderError,
    InvalidSessionTimeout,
    NotLeader,
    ProtocolError,
    SessionExpired,
)
from herder.wire import ApiRegistry, RequestContext, WireServer

log = logging.getLogger(__name__)

#: the longest a long poll may park on the server
MAX_WAIT_MS = 60_000
#: what an election adds to a leader change: its final wait, and a margin for the rest
ELECTION_MS = 400


def _now_ms() -> int:
    return int(time.time() * 1000)


def _monotonic_ms() -> int:
    return int(time.monotonic() * 1000)


class EnsembleServer:
    """One ensemble server, standalone or one of a replicated ensemble."""

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
        self.role = "standalone" if config.standalone else "looking"
        self.storage: Storage | None = None
        self._state = StateMachine()
        self.pipeline: StandalonePipeline | ZabReplica | None = None
        self.replica: ZabReplica | None = None
        self.wire = WireServer(
            ApiRegistry(apis.CLIENT_APIS),
            name=f"herder-ensemble-{config.server_id}",
            max_frame_bytes=config.max_frame_bytes,
            max_connections_per_host=config.max_client_connections,
            access=config.security.access,
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
        #: the port clients reach: the plaintext one, or the secure one if it is alone
        self.port = 0
        self.secure_port: int | None = None
        self._leading_task: asyncio.Task[None] | None = None
        self._services_active = False
        #: client requests counted and timed, for mntr and /metrics
        self.request_stats = RequestStats()
        self.started_at = time.monotonic()
        #: the admin and metrics HTTP ports that are on
        self.admin_servers: list[AdminServer] = []
        #: why the server stopped by itself (a diverged history, a failed disk), if it did
        self.failure: str | None = None
        self._fatal_stop: asyncio.Task[None] | None = None

    @property
    def state(self) -> StateMachine:
        """The applied state (a replica's is replaced when a leader sends a SNAP)."""
        return self.replica.state if self.replica is not None else self._state

    # -- lifecycle ----------------------------------------------------------------

    async def start(self) -> None:
        cfg = self.config
        storage = await asyncio.to_thread(
            Storage.open,
            str(cfg.data_dir),
            str(cfg.data_log_dir),
            fs=self._fs,
            log_file_size=cfg.prealloc_bytes,
            snap_retain_count=cfg.snap_retain_count,
        )
        self.storage = storage
        self._committer = GroupCommitter(storage)
        self._committer.fsync_warning_ms = cfg.fsync_warning_ms
        self._route()
        for service in self.services:
            service.attach(self)
        if cfg.standalone:
            await self._start_standalone(storage)
        else:
            await self._start_replica(storage)
        await self._listen_for_clients()
        for address, what in ((cfg.admin_server, "admin server"), (cfg.metrics_server, "metrics")):
            if address is not None:
                admin = AdminServer(self, address[0], address[1], what)
                try:
                    await admin.start()
                except HerderError:
                    await self.stop()
                    raise
                self.admin_servers.append(admin)
        log.info(
            "server %d (%s, epoch %d) serving clients on %s",
            cfg.server_id,
            self.role,
            self.epoch,
            self._listening_text(),
        )

    async def _listen_for_clients(self) -> None:
        cfg = self.config
        security = cfg.security
        address, port = cfg.client_address, cfg.client_port
        try:
            if cfg.plaintext_client:
                self.port = await self.wire.start(address, port)
            if security.secure_client_port is not None:
                address, port = security.secure_client_address, security.secure_client_port
                self.secure_port = await self.wire.start(
                    address,
                    port,
                    tls=security.client_context(),
                    plaintext_too=security.port_unification,
                )
                if not cfg.plaintext_client:
                    self.port = self.secure_port
        except OSError as exc:
            await self.stop()
            raise HerderError(f"cannot serve clients on {address}:{port}: {exc.strerror}") from None

    def _listening_text(self) -> str:
        cfg = self.config
        parts = []
        if cfg.plaintext_client:
            parts.append(f"{cfg.client_address}:{self.port}")
        if self.secure_port is not None:
            both = " and plaintext" if cfg.security.port_unification else ""
            parts.append(f"{cfg.security.secure_client_address}:{self.secure_port} (TLS{both})")
        access = cfg.security.access
        if access is not None:
            parts.append(
                f"authentication {'enforced' if access.enforce else 'optional'} "
                f"({', '.join(sorted(access.schemes))})"
            )
        return ", ".join(parts)

    async def _start_replica(self, storage: Storage) -> None:
        assert self._committer is not None
        replica = ZabReplica(
            self.config,
            storage,
            self._committer,
            on_applied=self._applied,
            on_event=self._zab_event,
            on_touches=self._touched,
            on_fatal=self._fatal,
        )
        self.replica = replica
        self.pipeline = replica
        me = self.config.peers[self.config.server_id]
        try:
            await replica.net.start()
        except OSError as exc:
            await self.stop()
            raise HerderError(
                f"cannot listen on {me.host}:{me.quorum_port} (quorum) and"
                f" {me.host}:{me.election_port} (election): {exc.strerror}"
            ) from None
        log.info(
            "server %d joining an ensemble of %d (%s), last logged zxid %s",
            self.config.server_id,
            len(self.config.peers),
            ", ".join(
                f"{p.server_id}{' observer' if p.observer else ''}"
                for p in self.config.peers.values()
            ),
            format_zxid(storage.last_zxid),
        )
        await replica.start()

    async def _start_standalone(self, storage: Storage) -> None:
        cfg = self.config
        recovery = storage.recovery
        state = (
            StateMachine.restore(recovery.snapshot.payload) if recovery.snapshot else StateMachine()
        )
        for entry in recovery.transactions:
            state.apply(decode_txn(entry.payload))
        self._state = state
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
        assert self._committer is not None
        self.pipeline = StandalonePipeline(
            state, self._committer, self.epoch, _now_ms, on_applied=self._applied
        )
        self._track_sessions()
        await self.pipeline.submit(lambda h: Noop(h))
        self._services_active = True
        for service in self.services:
            await service.became_leader(self.epoch)
        self._expiry_task = asyncio.create_task(self._expire_sessions())

    def _track_sessions(self) -> None:
        """Take over session expiry: every open session gets a whole timeout from now."""
        self.tracker = SessionTracker(self.config.tick_time_ms)
        now = _monotonic_ms()
        for info in self.state.sessions().values():
            self.tracker.add(info.session_id, info.timeout_ms, now)

    async def stop(self) -> None:
        """Stop serving, finish what is being written, release the data directory."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        self._deactivate_services()
        if self.replica is not None:
            self.replica.stop_accepting()
        for admin in self.admin_servers:
            await admin.stop()
        await self.wire.stop()
        if self._expiry_task is not None:
            self._expiry_task.cancel()
        if self.replica is not None:
            await self.replica.stop()
        elif self.pipeline is not None:
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

    def _fatal(self, reason: str) -> None:
        """The replica stopped taking part in the ensemble for good: stop the server."""
        self.failure = reason
        self._fatal_stop = asyncio.get_running_loop().create_task(self.stop())

    # -- roles (replicated) -----------------------------------------------------------

    def _zab_event(self, event: Event) -> None:
        assert self.replica is not None
        if isinstance(event, LostLeadership):
            self._deactivate_services()
        elif isinstance(event, Looking):
            self._deactivate_services()
            was = self.role
            self.role = "looking"
            if was != "looking":
                log.warning(
                    "server %d: %s -> looking (%s); dropping its clients",
                    self.config.server_id,
                    was,
                    event.reason,
                )
                for conn in list(self.wire.connections.values()):
                    conn.close(f"server {self.config.server_id} is looking for a leader")
        elif isinstance(event, Leading):
            self.role = "leader"
            self.epoch = event.epoch
            log.info("server %d: leading epoch %d", self.config.server_id, event.epoch)
            self._track_sessions()
            self._expiry_task = asyncio.get_running_loop().create_task(self._expire_sessions())
            self._leading_task = asyncio.get_running_loop().create_task(
                self._activate_services(event.epoch)
            )
        elif isinstance(event, Following):
            self.role = "observer" if event.observer else "follower"
            self.epoch = event.epoch
            log.info(
                "server %d: %s of leader %d in epoch %d",
                self.config.server_id,
                self.role,
                event.leader,
                event.epoch,
            )

    async def _activate_services(self, epoch: int) -> None:
        self._services_active = True
        for service in self.services:
            try:
                await service.became_leader(epoch)
            except NotLeader:
                return
            except Exception:
                log.exception("service failed to start on the new leader")

    def _deactivate_services(self) -> None:
        if self._expiry_task is not None and self.replica is not None:
            self._expiry_task.cancel()
            self._expiry_task = None
        if self._leading_task is not None:
            self._leading_task.cancel()
            self._leading_task = None
        if self._services_active or self._stopped.is_set():
            self._services_active = False
            for service in self.services:
                service.lost_leadership()

    def _touched(self, session_ids: list[int]) -> None:
        now = _monotonic_ms()
        for session_id in session_ids:
            self.tracker.touch(session_id, now)

    @property
    def _tracks_sessions(self) -> bool:
        return self.replica is None or self.replica.leading

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
        if self._tracks_sessions:
            if isinstance(txn, CreateSession) and result.ok:
                self.tracker.add(txn.session_id, txn.timeout_ms, _monotonic_ms())
            elif isinstance(txn, CloseSession):
                self.tracker.remove(txn.session_id)
            elif isinstance(txn, ExpireSessions):
                for session_id in txn.session_ids:
                    self.tracker.remove(session_id)
        if self._policy.record_txn():
            if self.replica is not None:
                self.replica.snapshot_soon()
            elif self._snapshotting is None:
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
        if self.pipeline is None or self._stopped.is_set():
            return False
        return self.replica is None or self.replica.leading

    @property
    def leader_change_ms(self) -> int:
        cfg = self.config
        if cfg.standalone:
            return 0
        return cfg.sync_limit * cfg.tick_time_ms + ELECTION_MS

    def leader_client_address(self) -> tuple[int, str] | None:
        if self._stopped.is_set() or self.pipeline is None:
            return None
        replica = self.replica
        leader = self.config.server_id
        if replica is not None:
            if not replica.serving or replica.leader_id is None:
                return None
            leader = replica.leader_id
        if leader != self.config.server_id:
            peer = self.config.peers.get(leader)
            if peer is None or not peer.client_port:
                return None
            return leader, peer.client_address
        host = self.config.client_address
        if not self.config.plaintext_client:
            host = self.config.security.secure_client_address
        if host in ("0.0.0.0", "::", ""):
            host = "127.0.0.1"
        return self.config.server_id, f"{host}:{self.port}"

    async def commit(self, ops: Sequence[Op]) -> TxnResult:
        if not self.is_leader:
            raise NotLeader(f"server {self.config.server_id} is not the leader")
        assert self.pipeline is not None
        return await self.pipeline.submit(partial(WriteTxn, ops=list(ops)))

    # -- handlers -----------------------------------------------------------------

    @property
    def fsync_threshold_exceeded(self) -> int:
        """fsyncs of the log slower than ``fsync.warningthresholdms``."""
        return self._committer.fsync_threshold_exceeded if self._committer else 0

    def _route(self) -> None:
        w = self.wire
        timed = self.request_stats.timed
        w.route(apis.CONNECT_SESSION, timed(self._connect_session))
        w.route(apis.PING_SESSION, timed(self._ping_session))
        w.route(apis.CLOSE_SESSION, timed(self._close_session))
        w.route(apis.TRANSACT, timed(self._transact))
        w.route(apis.LIST_LOGS, timed(self._list_logs))
        w.route(apis.DESCRIBE_LOG, timed(self._describe_log))
        w.route(apis.READ_LOG, timed(self._read_log))
        w.route(apis.END_OFFSETS, timed(self._end_offsets))
        w.route(apis.SYNC, timed(self._sync))
        w.route(apis.STATUS, timed(self._status))

    def _serving(self) -> None:
        """Refuse a request unless this server is in sync with a leader."""
        replica = self.replica
        if replica is not None and not replica.serving:
            raise NotLeader(
                f"server {self.config.server_id} is not serving: it is not in sync with a"
                " leader; try another server"
            )

    def _live_session(self, session_id: int) -> None:
        self._serving()
        if not session_id:
            return
        if self._tracks_sessions:
            if not self.tracker.touch(session_id, _monotonic_ms()):
                raise SessionExpired(f"session {session_id:#x} has expired or was closed")
            return
        assert self.replica is not None
        if session_id not in self.state.sessions():
            raise SessionExpired(f"session {session_id:#x} has expired or was closed")
        self.replica.touch(session_id)

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
        self._serving()
        if req.timeout_ms <= 0:
            raise InvalidSessionTimeout(f"session timeout {req.timeout_ms} ms must be positive")
        timeout = min(max(req.timeout_ms, cfg.min_session_timeout_ms), cfg.max_session_timeout_ms)
        session_id = self._ids.allocate()
        result = await self.pipeline.submit(lambda h: CreateSession(h, session_id, timeout))
        result.raise_for_error()
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
        self._serving()
        return apis.ListLogsResponse(logs=self.state.logs())

    async def _describe_log(
        self, req: apis.DescribeLogRequest, ctx: RequestContext
    ) -> apis.DescribeLogResponse:
        self._serving()
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
        self._serving()
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
        self._serving()
        await self._await_zxid(req.min_zxid, req.wait_ms)
        return apis.EndOffsetsResponse(
            end_offsets={name: self.state.end_offset(name) for name in req.logs},
            last_zxid=self.state.last_zxid,
        )

    async def _sync(self, req: apis.SyncRequest, ctx: RequestContext) -> apis.SyncResponse:
        self._serving()
        if self.replica is None:
            # standalone: everything committed is applied here already
            return apis.SyncResponse(zxid=self.state.last_zxid)
        # A no-op through the leader: once this server applied it, it has applied
        # everything the leader committed before it.
        self.request_stats.pending_syncs += 1
        try:
            result = await self.replica.submit(lambda h: Noop(h))
        finally:
            self.request_stats.pending_syncs -= 1
        return apis.SyncResponse(zxid=max(result.zxid, self.state.last_zxid))

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
            **self._replica_status(),
        )

    def _replica_status(self) -> dict[str, Any]:
        replica = self.replica
        if replica is None:
            return {
                "snapshots": self._snapshots_taken,
                "leader": self.config.server_id,
                "accepted_epoch": self.epoch,
                "current_epoch": self.epoch,
            }
        status = replica.status
        return {
            "snapshots": replica.snapshots_taken,
            "learners": replica.net.connected_learners if replica.leading else [],
            "leader": status.leader if status.leader is not None else -1,
            "phase": status.phase.name,
            "accepted_epoch": status.accepted_epoch,
            "current_epoch": status.current_epoch,
            "last_sync": replica.last_sync,
            "syncs": dict(replica.syncs),
        }


async def run_server(server: EnsembleServer) -> None:
    """Start ``server``, run it until SIGTERM or SIGINT, then stop it cleanly."""
    import signal

    await server.start()
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    signalled = asyncio.ensure_future(stop.wait())
    stopped = asyncio.ensure_future(server.wait_stopped())
    await asyncio.wait((signalled, stopped), return_when=asyncio.FIRST_COMPLETED)
    signalled.cancel()
    stopped.cancel()
    if server.failure is None:
        log.info("server %d stopping on signal", server.config.server_id)
    await server.stop()
    if server.failure is not None:
        # a non-zero exit, so that a supervisor sees the server failed
        raise HerderError(f"server {server.config.server_id} stopped: {server.failure}")
