"""The network between ensemble servers: election links and leader/learner links.

Two listeners per server, as in ZooKeeper: the *election port* carries fast leader
election notifications, the *quorum port* the packets between a leader and its learners.

* Election: one connection per pair of servers, opened by the one with the larger id
  (ZooKeeper's ``QuorumCnxManager`` rule); each side keeps its last notification for
  the other and sends it again whenever a link comes up, so a restarted server hears
  the current votes at once rather than at the next resend.
* Quorum: a learner opens a connection to its leader's quorum port when it first has a
  packet for it; the leader answers on the connection the learner opened. A leader
  keeps one connection per learner (a newer one replaces an older one).

Every connection starts with the opener's server id (8 bytes), then carries frames: a
4-byte length and one :func:`~herder.ensemble.zab.messages.encode` d message. A frame
that does not decode, or a greeting from a server not in the config, closes that
connection only. The transport promises nothing the protocol relies on: Zab's packets
carry their own session and sequence numbers. It reports a closed leader/learner
connection (``on_lost``), so that a learner whose leader died goes back to election at
once instead of waiting ``syncLimit`` ticks, as a ZooKeeper learner does when its
socket closes.

With ``sslQuorum`` both ports are TLS and both ends of every connection present a
certificate the other checks against the quorum truststore (and, with hostname
verification, that it names the ``server.N`` address dialled): a server whose certificate
the ensemble does not trust cannot vote or follow. A refused handshake is logged once per
peer and reason, on both sides.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import struct
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

import msgspec

from herder.ensemble.config import PeerAddress
from herder.ensemble.zab import Message
from herder.ensemble.zab.messages import LearnerInfo, Notification, decode, encode
from herder.wire.listener import HANDSHAKE_TIMEOUT_S, RefusalLog, TlsListener, describe_tls_failure

log = logging.getLogger(__name__)

_LENGTH = struct.Struct(">I")
_ID = struct.Struct(">q")
#: backoff between attempts to (re)open a link
RETRY_MIN_S = 0.05
RETRY_MAX_S = 1.0
#: the largest quorum frame: a SNAP carries the whole state
MAX_FRAME_BYTES = 1 << 30
CONNECT_TIMEOUT_S = 5.0


class _Link:
    """One connection's writing side."""

    __slots__ = ("closed", "peer_id", "writer")

    def __init__(self, peer_id: int, writer: asyncio.StreamWriter) -> None:
        self.peer_id = peer_id
        self.writer = writer
        self.closed = False

    def send(self, frame: bytes) -> None:
        if not self.closed:
            self.writer.write(frame)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.writer.close()


def _frame(message: Message) -> bytes:
    body = encode(message)
    return _LENGTH.pack(len(body)) + body


class QuorumNetwork:
    """Carries :class:`~herder.ensemble.zab.Envelope` s between the servers of ``peers``."""

    def __init__(
        self,
        my_id: int,
        peers: Mapping[int, PeerAddress],
        *,
        on_message: Callable[[int, Message], None],
        on_lost: Callable[[int], None],
        bind_host: str | None = None,
        tls: tuple[ssl.SSLContext, ssl.SSLContext] | None = None,
    ) -> None:
        self.my_id = my_id
        self.peers = dict(peers)
        self._on_message = on_message
        self._on_lost = on_lost
        self._bind_host = bind_host
        self._election: dict[int, _Link] = {}
        #: set when a server with a smaller id connected: dial it now, not after a backoff
        self._redial: dict[int, asyncio.Event] = {}
        self._last_vote: dict[int, bytes] = {}
        #: learner side: the connection to our leader (id, link or None while opening)
        self._to_leader: tuple[int, _Link | None] | None = None
        self._to_leader_queue: list[bytes] = []
        self._to_leader_task: asyncio.Task[None] | None = None
        self._following: int | None = None
        #: leader side: the newest connection from each learner
        self._learners: dict[int, _Link] = {}
        self._servers: list[asyncio.Server] = []
        #: (listening, connecting) TLS contexts with sslQuorum
        self._tls = tls
        self._listeners: list[TlsListener] = []
        self._refusals = RefusalLog(log)
        self._tasks: set[asyncio.Task[None]] = set()
        self._stopped = False

    # -- lifecycle ------------------------------------------------------------------

    async def start(self) -> None:
        me = self.peers[self.my_id]
        host = self._bind_host or me.host
        if self._tls is None:
            self._servers.append(
                await asyncio.start_server(self._accept_election, host, me.election_port)
            )
            self._servers.append(
                await asyncio.start_server(self._accept_quorum, host, me.quorum_port)
            )
        else:
            await self._listen_tls(
                host, me.election_port, self._accept_election, "an election link"
            )
            await self._listen_tls(host, me.quorum_port, self._accept_quorum, "a quorum link")
        for sid in sorted(self.peers):
            if sid < self.my_id:
                self._redial[sid] = asyncio.Event()
                self._spawn(self._keep_election_link(sid))
            elif sid > self.my_id:
                self._spawn(self._announce(sid))

    async def _listen_tls(
        self,
        host: str,
        port: int,
        accept: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Coroutine[Any, Any, None]],
        what: str,
    ) -> None:
        assert self._tls is not None

        async def on_tls(sock: socket.socket, peer: str) -> None:
            loop = asyncio.get_running_loop()
            reader = asyncio.StreamReader(limit=1 << 20, loop=loop)
            accepted = await listener.accept_tls(
                sock, peer, lambda: asyncio.StreamReaderProtocol(reader, loop=loop)
            )
            if accepted is not None:
                transport, protocol = accepted
                await accept(reader, asyncio.StreamWriter(transport, protocol, reader, loop))

        listener = TlsListener(
            self._tls[0],
            on_tls=on_tls,
            on_plain=None,
            refuse_plain=lambda peer: b"",
            refusals=self._refusals,
            what=f"{what} (sslQuorum)",
        )
        await listener.start(host, port)
        self._listeners.append(listener)

    async def stop(self) -> None:
        self._stopped = True
        for listener in self._listeners:
            await listener.stop()
        for server in self._servers:
            server.close()
        for link in [*self._election.values(), *self._learners.values()]:
            link.close()
        self.drop_leader()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for server in self._servers:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 1.0)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # -- sending ----------------------------------------------------------------------

    def send(self, to: int, message: Message) -> None:
        if to not in self.peers or to == self.my_id:
            return
        frame = _frame(message)
        if isinstance(message, Notification):
            self._last_vote[to] = frame
            link = self._election.get(to)
            if link is not None:
                link.send(frame)
            return
        if isinstance(message, LearnerInfo):
            # a learner's first packet: from now on ``to`` is the leader we follow
            self._following = to
        if to == self._following:
            self._send_to_leader(to, frame)
            return
        learner = self._learners.get(to)
        if learner is not None:
            learner.send(frame)
        # else: a learner that is not connected; it reconnects and starts over

    def _send_to_leader(self, leader: int, frame: bytes) -> None:
        current = self._to_leader
        if current is None or current[0] != leader:
            self.drop_leader()
            self._following = leader
            self._to_leader = (leader, None)
            self._to_leader_queue = [frame]
            self._to_leader_task = self._spawn(self._keep_leader_link(leader))
            return
        link = current[1]
        if link is None:
            self._to_leader_queue.append(frame)
        else:
            link.send(frame)

    def drop_leader(self) -> None:
        """Close the connection to the leader we followed (we left that role)."""
        self._following = None
        current, self._to_leader = self._to_leader, None
        self._to_leader_queue = []
        if self._to_leader_task is not None:
            self._to_leader_task.cancel()
            self._to_leader_task = None
        if current is not None and current[1] is not None:
            current[1].close()

    def drop_learners(self) -> None:
        """Close every learner's connection (we stopped leading)."""
        learners, self._learners = self._learners, {}
        for link in learners.values():
            link.close()

    @property
    def connected_learners(self) -> list[int]:
        return sorted(self._learners)

    @property
    def election_links(self) -> list[int]:
        return sorted(self._election)

    # -- connections we open ----------------------------------------------------------

    async def _open(
        self, sid: int, port_of: Callable[[PeerAddress], int]
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        peer = self.peers[sid]
        tls = self._tls[1] if self._tls is not None else None
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(
                    peer.host,
                    port_of(peer),
                    limit=1 << 20,
                    ssl=tls,
                    server_hostname=peer.host if tls is not None else None,
                    ssl_handshake_timeout=HANDSHAKE_TIMEOUT_S if tls is not None else None,
                ),
                CONNECT_TIMEOUT_S,
            )
        except ssl.SSLError as exc:
            self._refusals.refused(
                f"a TLS link to server {sid} (sslQuorum)",
                f"{peer.host}:{port_of(peer)}",
                describe_tls_failure(exc),
            )
            raise
        writer.write(_ID.pack(self.my_id))
        return reader, writer

    async def _keep_election_link(self, sid: int) -> None:
        backoff = RETRY_MIN_S
        redial = self._redial[sid]
        while not self._stopped:
            redial.clear()
            try:
                reader, writer = await self._open(sid, lambda p: p.election_port)
            except (OSError, TimeoutError):
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(redial.wait(), backoff)
                backoff = min(backoff * 2, RETRY_MAX_S)
                continue
            backoff = RETRY_MIN_S
            link = self._up_election(sid, writer)
            await self._read(sid, reader, link)
            self._down_election(sid, link)
            await asyncio.sleep(RETRY_MIN_S)

    async def _announce(self, sid: int) -> None:
        """Tell server ``sid`` (a larger id, which opens our election link) that this
        one is up, so that it connects at once: a restarted server then hears the
        current votes in one round trip, not after the other's reconnection backoff.
        ZooKeeper's ``QuorumCnxManager`` answers a connection from a smaller id the
        same way."""
        with contextlib.suppress(OSError, TimeoutError):
            _, writer = await self._open(sid, lambda p: p.election_port)
            writer.close()

    async def _keep_leader_link(self, leader: int) -> None:
        try:
            reader, writer = await self._open(leader, lambda p: p.quorum_port)
        except (OSError, TimeoutError) as exc:
            log.debug("server %d: cannot reach leader %d: %s", self.my_id, leader, exc)
            if self._to_leader is not None and self._to_leader[0] == leader:
                # nothing was delivered; the learner repeats its FOLLOWERINFO every tick,
                # and its next packet tries again
                self._to_leader = None
                self._to_leader_queue = []
            return
        current = self._to_leader
        if current is None or current[0] != leader:
            writer.close()
            return
        link = _Link(leader, writer)
        self._to_leader = (leader, link)
        for frame in self._to_leader_queue:
            link.send(frame)
        self._to_leader_queue = []
        await self._read(leader, reader, link)
        link.close()
        current = self._to_leader
        if current is not None and current[1] is link:
            self._to_leader = None
            if not self._stopped:
                log.info("server %d: connection to leader %d closed", self.my_id, leader)
                self._on_lost(leader)

    # -- connections others open ------------------------------------------------------

    async def _greeting(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> int:
        try:
            raw = await asyncio.wait_for(reader.readexactly(_ID.size), CONNECT_TIMEOUT_S)
        except (asyncio.IncompleteReadError, OSError, TimeoutError):
            writer.close()
            return -1
        sid = int(_ID.unpack(raw)[0])
        if sid not in self.peers or sid == self.my_id:
            log.warning(
                "server %d: closing a connection from %s claiming to be server %d, which is"
                " not in the config",
                self.my_id,
                writer.get_extra_info("peername"),
                sid,
            )
            writer.close()
            return -1
        return sid

    async def _accept_election(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        sid = await self._greeting(reader, writer)
        if sid < 0:
            return
        if sid < self.my_id:
            # the larger id opens election links: that server just came up (see
            # _announce), so open ours now rather than at the end of its backoff
            writer.close()
            redial = self._redial.get(sid)
            if redial is not None:
                redial.set()
            return
        link = self._up_election(sid, writer)
        await self._read(sid, reader, link)
        self._down_election(sid, link)

    def _up_election(self, sid: int, writer: asyncio.StreamWriter) -> _Link:
        old = self._election.get(sid)
        if old is not None:
            old.close()
        link = _Link(sid, writer)
        self._election[sid] = link
        vote = self._last_vote.get(sid)
        if vote is not None:
            link.send(vote)
        return link

    def _down_election(self, sid: int, link: _Link) -> None:
        link.close()
        if self._election.get(sid) is link:
            del self._election[sid]

    async def _accept_quorum(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        sid = await self._greeting(reader, writer)
        if sid < 0:
            return
        old = self._learners.get(sid)
        if old is not None:
            old.close()
        link = _Link(sid, writer)
        self._learners[sid] = link
        await self._read(sid, reader, link)
        link.close()
        if self._learners.get(sid) is link:
            del self._learners[sid]
            if not self._stopped:
                self._on_lost(sid)

    # -- reading ----------------------------------------------------------------------

    async def _read(self, sid: int, reader: asyncio.StreamReader, link: _Link) -> None:
        """Deliver frames from ``sid`` until the connection ends or misbehaves."""
        try:
            while not link.closed:
                head = await reader.readexactly(_LENGTH.size)
                (size,) = _LENGTH.unpack(head)
                if size > MAX_FRAME_BYTES:
                    log.warning(
                        "server %d: server %d sent a %d-byte frame; closing", self.my_id, sid, size
                    )
                    return
                body = await reader.readexactly(size)
                try:
                    message = decode(body)
                except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                    log.warning(
                        "server %d: undecodable frame from server %d (%s); closing",
                        self.my_id,
                        sid,
                        exc,
                    )
                    return
                if link.closed:
                    return
                self._on_message(sid, message)
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            return
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("server %d: handling a message from server %d failed", self.my_id, sid)
        finally:
            link.close()
