"""The client side of the group coordinator: connections, a link to one coordinator,
administrative requests.

:class:`CoordinatorConnections` are a process's connections to the coordinator, shared
by all its group members (FindCoordinator goes to any ensemble server over them);
:class:`CoordinatorLink` sends requests to the coordinator of one key, finding it again
after an error that may mean it moved; :class:`CoordinatorClient` makes the
administrative requests (list, describe, delete groups; fencing epochs). The group
member itself, which the worker runtime drives, is in :mod:`herder.runtime.core.member`
(its protocol) and :mod:`herder.runtime.shell.member` (its asyncio shell).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any, TypeVar

import msgspec

from herder.coordinator import apis
from herder.coordinator import messages as m
from herder.ensemble.client import parse_bootstrap
from herder.errors import (
    AuthenticationFailed,
    CoordinatorNotAvailable,
    ErrorCode,
    HerderError,
    NotAuthorized,
    TlsHandshakeFailed,
    TlsRequired,
    UnsupportedVersion,
    error_from_code,
)
from herder.wire import Api, ApiRegistry, WireClient
from herder.wire.auth import ClientSecurity

Resp = TypeVar("Resp", bound=msgspec.Struct)

#: refusals of who we are, not of where we asked: no other server would answer otherwise
_REFUSED_FOR_GOOD = (AuthenticationFailed, NotAuthorized, TlsHandshakeFailed, TlsRequired)


class CoordinatorConnections:
    """A process's connections to the group coordinator, shared by all its members.

    A worker has one group member per sink task besides its own: each keeps its own
    member id, generation and heartbeats, but their requests share one connection per
    server (the wire is pipelined and answers out of order), so the connections a
    worker holds do not grow with its tasks and stay under the ensemble's
    ``maxClientCnxns``. FindCoordinator goes to any server over the same connections.
    """

    def __init__(
        self,
        bootstrap: str | Sequence[str],
        *,
        request_timeout_ms: int = 30_000,
        security: ClientSecurity | None = None,
    ) -> None:
        self.servers = parse_bootstrap(bootstrap)
        self.request_timeout_ms = request_timeout_ms
        self.security = security
        self._registry = ApiRegistry(apis.COORDINATOR_APIS)
        self._wires: dict[tuple[str, int], WireClient] = {}
        #: every wire made, in use or forgotten, for close() to end them all
        self._made: list[WireClient] = []

    async def _wire(self, host: str, port: int) -> WireClient:
        wire = self._wires.get((host, port))
        if wire is None:
            wire = WireClient(
                host,
                port,
                self._registry,
                connect_timeout=3,
                request_timeout=self.request_timeout_ms / 1000,
                security=self.security,
            )
            self._wires[(host, port)] = wire
            self._made.append(wire)
        if not wire.connected:
            await wire.connect()
        return wire

    async def coordinator(self, key: str, what: str = "") -> WireClient:
        """A connection to the coordinator of ``key``, found by asking any server."""
        last: Exception | None = None
        for host, port in random.sample(self.servers, len(self.servers)):
            try:
                probe = await self._wire(host, port)
                found = await probe.request(
                    apis.FIND_COORDINATOR, apis.FindCoordinatorRequest(key=key), timeout=5
                )
            except _REFUSED_FOR_GOOD:
                raise  # the next server would refuse the same credentials
            except (HerderError, OSError) as exc:
                last = exc
                continue
            if found.error_code != ErrorCode.NONE:
                last = CoordinatorNotAvailable(found.error_message or "no coordinator")
                continue
            return await self._wire(found.host, found.port)
        raise CoordinatorNotAvailable(
            f"no group coordinator reachable for {what or repr(key)}: {last}"
        )

    async def forget(self, wire: WireClient) -> None:
        """A member is done with ``wire`` after an error: closed and replaced if it is
        no longer connected; left to the others if it is (it may just lead elsewhere)."""
        if not wire.connected:
            for address, known in list(self._wires.items()):
                if known is wire:
                    del self._wires[address]
            # closed for good: a member still holding it gets an error, not a reconnect
            await wire.close()
            if wire in self._made:
                self._made.remove(wire)

    @property
    def open(self) -> int:
        """Connections open now."""
        return sum(1 for wire in self._wires.values() if wire.connected)

    async def close(self) -> None:
        wires, self._made, self._wires = self._made, [], {}
        for wire in wires:
            await wire.close()


class CoordinatorLink:
    """Requests to the coordinator of one key, over shared :class:`CoordinatorConnections`.

    The coordinator is found by the first request and kept until an error that may mean
    it moved (any retriable one) or until :meth:`drop`; the next request finds it again.
    """

    def __init__(self, connections: CoordinatorConnections, key: str, what: str) -> None:
        self.connections = connections
        self.key = key
        #: what the requests are for, in errors ("group g1")
        self.what = what
        self._wire: WireClient | None = None

    async def request(
        self,
        api: Api[Any, Resp],
        body: msgspec.Struct,
        *,
        timeout: float,
        find: bool = True,
        min_version: int = 0,
    ) -> Resp:
        """Send ``body`` to the coordinator, finding it first unless ``find`` is False
        (then CoordinatorNotAvailable when none is known). A coordinator that speaks
        ``api`` below ``min_version`` (it would drop fields the request relies on) is
        refused with UnsupportedVersion."""
        wire = self._wire
        if wire is None or not wire.connected:
            if not find:
                raise CoordinatorNotAvailable(f"no coordinator known for {self.what}")
            wire = self._wire = await self.connections.coordinator(self.key, self.what)
        if min_version and wire.versions.get(api.key, 0) < min_version:
            raise UnsupportedVersion(
                f"the coordinator at {wire.address} speaks {api.name} below version "
                f"{min_version}, which {self.what} needs; upgrade the ensemble"
            )
        try:
            return await wire.request(api, body, timeout=timeout)
        except HerderError as exc:
            if exc.retriable:
                await self.drop()
            raise

    async def drop(self) -> None:
        """Forget the coordinator: the next request finds it again."""
        wire, self._wire = self._wire, None
        if wire is not None:
            await self.connections.forget(wire)


class CoordinatorClient:
    """Administrative requests to the coordinator: list, describe, delete groups, fencing."""

    def __init__(
        self,
        bootstrap: str | Sequence[str],
        *,
        connections: CoordinatorConnections | None = None,
        security: ClientSecurity | None = None,
    ) -> None:
        self._owns_connections = connections is None
        self._connections = connections or CoordinatorConnections(bootstrap, security=security)
        self._link = CoordinatorLink(self._connections, "", "administrative requests")

    async def request(self, api: Api[Any, Resp], body: msgspec.Struct) -> Resp:
        return await self._link.request(api, body, timeout=30)

    async def init_fencing(self, fenced_id: str) -> int:
        """Take a new fencing epoch for ``fenced_id``; older holders are fenced from now on."""
        reply = await self.request(apis.INIT_FENCING, m.InitFencingRequest(fenced_id=fenced_id))
        if reply.error_code != ErrorCode.NONE:
            raise error_from_code(reply.error_code, f"init fencing for {fenced_id}")
        return reply.epoch

    async def close(self) -> None:
        await self._link.drop()
        if self._owns_connections:
            await self._connections.close()
