"""The ensemble client: what workers, the coordinator's members and the CLI talk through.

One :class:`EnsembleClient` holds one connection and one session. Requests are
pipelined. On a lost connection, a server that stops or is not the leader, the client
moves to the next server of its bootstrap list (with backoff), resumes its session
there, and resends what was in flight; every write carries ``(session id, sequence)``
so a resent write that had already committed returns its original result instead of
applying twice. Pings keep the session alive while the client is idle.

The client remembers the highest zxid it has seen and asks any server it reads from to
be at least that far along, so a reader never goes back in time when it fails over.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import random
from collections.abc import Sequence
from typing import Any, TypeVar

import msgspec

from herder.ensemble import apis
from herder.ensemble.state import RESULT_WINDOW, LogInfo
from herder.ensemble.txn import Append, CreateLog, Op, TxnResult
from herder.errors import (
    HerderError,
    NetworkError,
    RetriableError,
    SessionExpired,
    TooManyConnections,
    UnknownSession,
)
from herder.wire import Api, ApiRegistry, WireClient
from herder.wire.auth import ClientSecurity

log = logging.getLogger(__name__)

Resp = TypeVar("Resp", bound=msgspec.Struct)

_WRITES = {apis.TRANSACT.key, apis.CLOSE_SESSION.key}


#: what to do when no ensemble server answers
NO_ENSEMBLE_ADVICE = (
    "start one with `herder ensemble start --config ensemble.properties`, or point "
    "bootstrap.servers (--bootstrap on the command line) at one that runs"
)


def parse_bootstrap(bootstrap: str | Sequence[str]) -> list[tuple[str, int]]:
    """``"h1:p1,h2:p2"`` (or a list of ``host:port``) as (host, port) pairs."""
    items = bootstrap.split(",") if isinstance(bootstrap, str) else list(bootstrap)
    servers = []
    for item in (i.strip() for i in items):
        if not item:
            continue
        host, sep, port = item.rpartition(":")
        if not sep or not port.isdigit():
            raise NetworkError(f"bootstrap server {item!r} is not host:port")
        servers.append((host or "127.0.0.1", int(port)))
    if not servers:
        raise NetworkError("the bootstrap list names no server")
    return servers


class EnsembleClient:
    """A session with the ensemble, kept across server failures."""

    def __init__(
        self,
        bootstrap: str | Sequence[str],
        *,
        session_timeout_ms: int = 30_000,
        name: str = "herder-client",
        request_timeout: float = 30.0,
        connect_timeout: float = 5.0,
        retry_backoff_ms: int = 100,
        retry_backoff_max_ms: int = 2_000,
        give_up_after: float = 60.0,
        security: ClientSecurity | None = None,
    ) -> None:
        self.servers = parse_bootstrap(bootstrap)
        #: TLS and credentials for every server (the ensemble's ``ensemble.ssl.*`` …)
        self.security = security
        self.session_timeout_ms = session_timeout_ms
        self.name = name
        self.request_timeout = request_timeout
        self.connect_timeout = connect_timeout
        self.retry_backoff_ms = retry_backoff_ms
        self.retry_backoff_max_ms = retry_backoff_max_ms
        self.give_up_after = give_up_after
        self.session_id = 0
        self.server_id = 0
        #: the highest zxid any answer has shown this client
        self.last_zxid = 0
        self._registry = ApiRegistry(apis.CLIENT_APIS)
        self._wire: WireClient | None = None
        self._next_server = random.randrange(len(self.servers))
        self._seq = itertools.count(1)
        self._reconnecting: asyncio.Task[None] | None = None
        #: held while an expired session is replaced: one new session for all who saw it
        self._renewing = asyncio.Lock()
        self._pinger: asyncio.Task[None] | None = None
        self._window = asyncio.Semaphore(RESULT_WINDOW)
        self._closed = False

    # -- connection and session ---------------------------------------------------

    @property
    def address(self) -> str:
        return self._wire.address if self._wire is not None else ""

    async def start(self) -> EnsembleClient:
        """Connect to a server of the bootstrap list and open a session."""
        await self._reconnect()
        self._pinger = asyncio.create_task(self._ping_loop())
        return self

    async def __aenter__(self) -> EnsembleClient:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the session (its owned keys are deleted) and the connection."""
        if self._closed:
            return
        self._closed = True
        if self._pinger is not None:
            self._pinger.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._pinger
        if self.session_id and self._wire is not None and self._wire.connected:
            with contextlib.suppress(HerderError):
                await self._wire.request(
                    apis.CLOSE_SESSION,
                    apis.CloseSessionRequest(session_id=self.session_id),
                    timeout=5.0,
                )
        if self._wire is not None:
            await self._wire.close()

    async def _reconnect(self) -> None:
        """Find a server that answers and open or resume the session there."""
        if self._reconnecting is None or self._reconnecting.done():
            self._reconnecting = asyncio.create_task(self._find_server())
        await asyncio.shield(self._reconnecting)

    async def _find_server(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.give_up_after
        backoff = self.retry_backoff_ms / 1000
        last_error: Exception | None = None
        if self._wire is not None:
            await self._wire.close()
            self._wire = None
        while not self._closed:
            for _ in range(len(self.servers)):
                host, port = self.servers[self._next_server]
                self._next_server = (self._next_server + 1) % len(self.servers)
                wire = WireClient(
                    host,
                    port,
                    self._registry,
                    name=self.name,
                    connect_timeout=self._connect_timeout(),
                    request_timeout=self.request_timeout,
                    security=self.security,
                )
                try:
                    await wire.connect()
                    await self._open_session(wire)
                except SessionExpired:
                    await wire.close()
                    raise
                except TooManyConnections as exc:
                    last_error = exc
                    log.warning("%s; trying again", exc)
                    await wire.close()
                    continue
                except (RetriableError, OSError) as exc:
                    last_error = exc
                    log.debug("server %s:%d unavailable: %s", host, port, exc)
                    await wire.close()
                    continue
                self._wire = wire
                return
            if loop.time() >= deadline:
                raise NetworkError(
                    f"no ensemble server of {self._bootstrap_text()} answered within "
                    f"{self.give_up_after:.0f}s (last error: {last_error}); {NO_ENSEMBLE_ADVICE}"
                )
            await asyncio.sleep(backoff * (0.5 + random.random()))
            backoff = min(backoff * 2, self.retry_backoff_max_ms / 1000)

    def _connect_timeout(self) -> float:
        """How long to wait for one server to accept: no longer than the session timeout
        spread over the servers, so that trying an unreachable one (its SYNs dropped,
        nothing refused) leaves time to reach the others before the session expires."""
        share = self.session_timeout_ms / 1000 / len(self.servers)
        return min(self.connect_timeout, share)

    def _bootstrap_text(self) -> str:
        return ",".join(f"{h}:{p}" for h, p in self.servers)

    async def _open_session(self, wire: WireClient) -> None:
        reply = await wire.request(
            apis.CONNECT_SESSION,
            apis.ConnectSessionRequest(
                timeout_ms=self.session_timeout_ms,
                session_id=self.session_id,
                client_name=self.name,
            ),
        )
        if self.session_id == 0:
            log.debug("session %#x opened on server %d", reply.session_id, reply.server_id)
        self.session_id = reply.session_id
        self.session_timeout_ms = reply.timeout_ms
        self.server_id = reply.server_id
        self._saw(reply.last_zxid)

    async def _ping_loop(self) -> None:
        while not self._closed:
            await asyncio.sleep(self.session_timeout_ms / 3000)
            pinged = self.session_id
            try:
                # A server cut off by the network, or paused, answers nothing and closes
                # nothing: only a ping that waits no longer than a third of the session
                # timeout notices it in time to resume the session on another server
                # (ZooKeeper's client gives up on a silent server likewise, well before
                # its session could expire).
                await self._call(
                    apis.PING_SESSION,
                    apis.PingSessionRequest(session_id=self.session_id),
                    timeout=self.session_timeout_ms / 3000,
                )
            except asyncio.CancelledError:
                raise
            except (SessionExpired, UnknownSession) as exc:
                await self._renew_session(exc, pinged)
            except HerderError as exc:
                log.warning("session %#x ping failed: %s", self.session_id, exc)

    async def _renew_session(self, cause: HerderError, expired: int) -> None:
        """The ensemble expired session ``expired`` (we were silent too long): open a new
        one, unless another caller that saw it expire did already.

        Keys the old session owned are gone, as its expiry promised; writes in flight
        under it failed with SESSION_EXPIRED and are the caller's to retry.
        """
        async with self._renewing:
            if self.session_id != expired:
                return
            self.session_id = 0
            self._seq = itertools.count(1)
            for attempt in range(2):
                wire = self._wire
                try:
                    if wire is None or not wire.connected:
                        await self._reconnect()
                    else:
                        await self._open_session(wire)
                    break
                except HerderError as exc:
                    # a reconnection under way may have been resuming the expired
                    # session: once it has failed, the next one opens a new session
                    if attempt == 0 and isinstance(exc, SessionExpired | UnknownSession):
                        continue
                    self.session_id = expired
                    log.warning("could not renew expired session %#x: %s", expired, exc)
                    return
        log.warning("session %#x: %s; continuing as session %#x", expired, cause, self.session_id)

    def _saw(self, zxid: int) -> None:
        if zxid > self.last_zxid:
            self.last_zxid = zxid

    async def _call(
        self,
        api: Api[Any, Resp],
        body: msgspec.Struct,
        timeout: float | None = None,
        *,
        renew: bool = False,
    ) -> Resp:
        """Send ``body``; on a retriable failure move to another server and resend. With
        ``renew`` (a request that needs no session, such as a read), a session that
        expired is replaced and the request sent again under the new one; without it
        the expiry is the caller's."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.give_up_after
        while True:
            session = self.session_id
            try:
                return await self._send(api, body, timeout, deadline)
            except (SessionExpired, UnknownSession) as exc:
                await self._renew_or_raise(exc, session, renew and loop.time() < deadline)

    async def _send(
        self, api: Api[Any, Resp], body: msgspec.Struct, timeout: float | None, deadline: float
    ) -> Resp:
        """Send ``body`` to a server until one answers, or ``deadline`` passes."""
        loop = asyncio.get_running_loop()
        while True:
            wire = self._wire
            if wire is None:
                await self._reconnect()
                continue
            try:
                return await wire.request(api, body, timeout=timeout)
            except RetriableError as exc:
                if self._closed or loop.time() >= deadline:
                    raise
                log.info(
                    "%s to %s failed (%s); moving to another server", api.name, wire.address, exc
                )
                if self._wire is wire:
                    self._wire = None
                    await wire.close()
                await self._reconnect()

    async def _renew_or_raise(
        self, expiry: SessionExpired | UnknownSession, session: int, renew: bool
    ) -> None:
        """Replace ``session``, which ``expiry`` says has ended, if the caller may go on
        under a new one (``renew``); raise ``expiry`` if it may not, or if no new session
        could be opened."""
        if not renew or self._closed:
            raise expiry
        await self._renew_session(expiry, session)
        if self.session_id in (session, 0):
            raise expiry  # not renewed: the expiry stands

    # -- writes -------------------------------------------------------------------

    async def transact(
        self, ops: Sequence[Op], *, check: bool = True, renew: bool = False
    ) -> TxnResult:
        """Apply ``ops`` atomically; raise the refusal (e.g. CheckFailed) unless ``check=False``.

        A write under a session that expired fails with SessionExpired: it may have
        been applied before the session ended, and writing it again under a new session
        could apply it twice. ``renew`` says that twice does no harm (a compacted log's
        latest record for a key, say): the write is then made again under a new session.
        """
        while True:
            session = self.session_id
            try:
                async with self._window:
                    # the session the write is made under, once it may be sent
                    session, seq = self.session_id, next(self._seq)
                    reply = await self._call(
                        apis.TRANSACT,
                        apis.TransactRequest(session_id=session, seq=seq, ops=list(ops)),
                    )
                break
            except (SessionExpired, UnknownSession) as exc:
                await self._renew_or_raise(exc, session, renew)
        result = reply.result
        self._saw(result.zxid)
        if check:
            result.raise_for_error()
        return result

    async def create_log(
        self, name: str, *, compacted: bool = False, if_absent: bool = False
    ) -> int:
        """Create a log; return the zxid that created it."""
        result = await self.transact([CreateLog(name, compacted, if_absent)])
        return result.zxid

    async def append(
        self,
        log_name: str,
        value: bytes | None,
        key: bytes | None = None,
        headers: list[tuple[str, bytes]] | None = None,
        *,
        owned: bool = False,
    ) -> int:
        """Append one record; return its offset."""
        result = await self.transact([Append(log_name, key, value, headers or [], owned)])
        return result.offsets[0]

    # -- reads --------------------------------------------------------------------

    async def list_logs(self) -> list[LogInfo]:
        reply = await self._call(apis.LIST_LOGS, apis.ListLogsRequest(), renew=True)
        return reply.logs

    async def describe_log(self, name: str) -> LogInfo:
        reply = await self._call(apis.DESCRIBE_LOG, apis.DescribeLogRequest(name=name), renew=True)
        return reply.log

    async def read(
        self,
        log_name: str,
        from_offset: int = 0,
        *,
        max_records: int = 1000,
        max_bytes: int = 4 * 1024 * 1024,
        wait_ms: int = 0,
        min_zxid: int = 0,
    ) -> apis.ReadLogResponse:
        """Records from ``from_offset``; with ``wait_ms`` wait for some to arrive."""
        timeout = self.request_timeout + wait_ms / 1000
        reply = await self._call(
            apis.READ_LOG,
            apis.ReadLogRequest(
                log=log_name,
                from_offset=from_offset,
                max_records=max_records,
                max_bytes=max_bytes,
                wait_ms=wait_ms,
                min_zxid=max(min_zxid, self.last_zxid),
            ),
            timeout=timeout,
            renew=True,
        )
        self._saw(reply.last_zxid)
        return reply

    async def end_offsets(self, logs: Sequence[str], *, min_zxid: int = 0) -> dict[str, int]:
        reply = await self._call(
            apis.END_OFFSETS,
            apis.EndOffsetsRequest(logs=list(logs), min_zxid=max(min_zxid, self.last_zxid)),
            renew=True,
        )
        self._saw(reply.last_zxid)
        return reply.end_offsets

    async def sync(self) -> int:
        """Bring the connected server up to the leader's commit point; return that zxid."""
        reply = await self._call(apis.SYNC, apis.SyncRequest(), renew=True)
        self._saw(reply.zxid)
        return reply.zxid

    async def status(self) -> apis.StatusResponse:
        """The connected server's status."""
        return await self._call(apis.STATUS, apis.StatusRequest(), renew=True)


async def server_status(
    address: str, timeout: float = 3.0, *, security: ClientSecurity | None = None
) -> apis.StatusResponse:
    """Ask one server for its status, without opening a session."""
    ((host, port),) = parse_bootstrap(address)
    wire = WireClient(
        host,
        port,
        ApiRegistry(apis.CLIENT_APIS),
        connect_timeout=timeout,
        request_timeout=timeout,
        security=security,
    )
    try:
        return await wire.request(apis.STATUS, apis.StatusRequest())
    finally:
        await wire.close()
