"""The ensemble client through its servers' failures, as the nemesis soak found them.

A client whose server falls silent — paused, or cut off by the network, so that it
neither answers nor closes the connection — resumes its session on another server of
the ensemble before the session can expire (found by the nemesis soak: with pings that
waited the 30 s request timeout, every worker connected to an isolated leader lost its
session and its tasks failed). A log tailer whose client's session expired reads on
under the next session."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import pytest

from herder.ensemble import apis
from herder.ensemble.client import EnsembleClient
from herder.ensemble.tailer import LogTailer
from herder.wire import ApiRegistry, WireClient
from tests.harness import Processes
from tests.integration.conftest import make_ensemble, make_server
from tests.integration.test_replication import leader_of

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

SESSION_MS = 6_000


def test_a_client_leaves_a_silent_server_before_its_session_expires(
    processes: Processes, tmp_path: Path
) -> None:
    ensemble = make_ensemble(processes, tmp_path, 3, maxSessionTimeout=60_000).start()
    leader_of(ensemble)

    async def scenario() -> None:
        client = EnsembleClient(ensemble.bootstrap, session_timeout_ms=SESSION_MS)
        async with client:
            await client.create_log("silent", if_absent=True)
            session, silent = client.session_id, client.server_id
            proc = ensemble[silent].proc
            assert proc is not None
            proc.signal(signal.SIGSTOP)
            try:
                deadline = time.monotonic() + 3 * SESSION_MS / 1000
                while client.server_id == silent:
                    assert time.monotonic() < deadline, (
                        f"the client is still on silent server {silent}"
                    )
                    await asyncio.sleep(0.1)
                await client.append("silent", b"after")
                assert client.session_id == session, "the session expired on the way"
            finally:
                proc.signal(signal.SIGCONT)

    asyncio.run(scenario())


def test_a_tailer_reads_on_after_its_clients_session_expired(
    processes: Processes, tmp_path: Path
) -> None:
    """Found by the nemesis soak: a worker whose session expired while its server was
    out of reach stopped tailing its config, status and offset logs for good."""
    server = make_server(processes, tmp_path, maxSessionTimeout=60_000).start()

    async def scenario() -> None:
        seen: list[bytes | None] = []
        async with EnsembleClient(server.bootstrap, session_timeout_ms=2_000) as client:
            await client.create_log("tailed")
            tailer = LogTailer(client, "tailed", lambda r: seen.append(r.value))
            await tailer.start()
            old = client.session_id
            # the session ends while the client is away: closed behind its back, then
            # its connection dropped, so that it finds the session gone on reconnecting
            host, port = server.bootstrap.split(":")
            raw = WireClient(host, int(port), ApiRegistry(apis.CLIENT_APIS))
            await raw.request(apis.CLOSE_SESSION, apis.CloseSessionRequest(session_id=old))
            await raw.close()
            server.kill9()
            server.start()
            async with EnsembleClient(server.bootstrap) as writer:
                await writer.append("tailed", b"after")
            deadline = time.monotonic() + 30
            while b"after" not in seen:
                assert time.monotonic() < deadline, "the tailer stopped reading"
                await asyncio.sleep(0.1)
            assert client.session_id not in (old, 0)
            await tailer.stop()

    asyncio.run(scenario())


def test_reads_and_rewritable_writes_go_on_under_a_new_session_after_an_expiry(
    processes: Processes, tmp_path: Path
) -> None:
    """Found by the nemesis soak: a sink task whose worker's session expired while the
    ensemble was out of reach failed on its next read of a topic's metadata, and its
    FAILED status, written under the same session, was lost, so the cluster went on
    showing it RUNNING. A read needs no session, and a status written twice is the same
    status: both go on under the client's next session. A write that must not be
    applied twice still fails with the expiry, for its caller to judge."""
    from herder.ensemble.txn import Append
    from herder.errors import SessionExpired, UnknownSession
    from herder.runtime.core.protocol import ConnectorTaskId
    from herder.runtime.core.status import State, TaskStatus
    from herder.runtime.stores import StatusStore

    server = make_server(processes, tmp_path, maxSessionTimeout=60_000).start()
    host, port = server.bootstrap.split(":")

    async def expire(client: EnsembleClient) -> int:
        """End ``client``'s session behind its back, and drop its connection, so that
        it finds the session gone on reconnecting."""
        old = client.session_id
        raw = WireClient(host, int(port), ApiRegistry(apis.CLIENT_APIS))
        await raw.request(apis.CLOSE_SESSION, apis.CloseSessionRequest(session_id=old))
        await raw.close()
        server.kill9()
        server.start()
        return old

    async def scenario() -> None:
        # pings far apart: the requests below, not the ping loop, meet the expiry
        async with EnsembleClient(server.bootstrap, session_timeout_ms=30_000) as client:
            await client.create_log("kept")
            await client.append("kept", b"before")
            old = await expire(client)
            reply = await client.read("kept")
            assert [r.value for r in reply.records] == [b"before"]
            assert client.session_id not in (old, 0)

            statuses = StatusStore(client)
            await statuses.start()
            old = await expire(client)
            failed = TaskStatus(ConnectorTaskId("c", 0), State.FAILED, "w", 3, trace="boom")
            await statuses.put(failed)
            assert client.session_id not in (old, 0)

            old = await expire(client)
            with pytest.raises((SessionExpired, UnknownSession)):
                await client.transact([Append("kept", None, b"once")])
            await statuses.stop()
        async with EnsembleClient(server.bootstrap) as reader:
            fresh = StatusStore(reader)
            await fresh.start()
            stored = fresh.view.task(ConnectorTaskId("c", 0))
            assert stored is not None and stored.state is State.FAILED
            await fresh.stop()
            values = [r.value for r in (await reader.read("kept")).records]
            assert values == [b"before"]

    asyncio.run(scenario())
