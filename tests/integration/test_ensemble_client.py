"""The ensemble client against real server processes: failover, retries, tailing."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from herder.ensemble.client import EnsembleClient
from herder.ensemble.sync_client import SyncEnsembleClient
from herder.ensemble.tailer import LogTailer
from herder.ensemble.txn import Record
from herder.errors import HerderError
from herder.wire.framing import FrameDecoder
from tests.harness import Processes, free_port
from tests.integration.conftest import ServerHandle, make_server

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


class AnswerDropper:
    """A TCP proxy that, once armed, cuts the connection instead of relaying one answer."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.armed = False
        self.dropped = 0
        self.port = 0
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        server_r, server_w = await asyncio.open_connection("127.0.0.1", self.target_port)

        async def upstream() -> None:
            while data := await client_r.read(65536):
                server_w.write(data)
            server_w.close()

        async def downstream() -> None:
            decoder = FrameDecoder()
            while data := await server_r.read(65536):
                for frame in decoder.feed(data):
                    if self.armed and b"\xa6result" in frame:
                        # the answer to a Transact carries a result; drop it and hang up
                        self.armed = False
                        self.dropped += 1
                        client_w.close()
                        server_w.close()
                        return
                    client_w.write(len(frame).to_bytes(4, "big") + frame)
            client_w.close()

        await asyncio.gather(upstream(), downstream(), return_exceptions=True)


def test_failover_to_the_next_bootstrap_server(processes: Processes, tmp_path: Path) -> None:
    server = make_server(processes, tmp_path).start()
    dead = f"127.0.0.1:{free_port()}"

    async def scenario() -> None:
        client = EnsembleClient(f"{dead},{server.bootstrap}", retry_backoff_ms=20)
        client._next_server = 0  # start with the dead one, deterministically
        await client.start()
        assert client.address == server.bootstrap
        await client.create_log("l")
        await client.append("l", b"before")
        session = client.session_id
        await asyncio.to_thread(server.kill9)
        await asyncio.to_thread(server.start)
        # the client moves on through its list, finds the restarted server, resumes
        offset = await client.append("l", b"after")
        assert offset == 1
        assert client.session_id == session, "the session survives a server restart"
        await client.close()

    asyncio.run(scenario())


def test_a_retried_write_after_a_dropped_answer_applies_once(ensemble_server: ServerHandle) -> None:
    async def scenario() -> None:
        proxy = AnswerDropper(ensemble_server.port)
        await proxy.start()
        async with EnsembleClient(f"127.0.0.1:{proxy.port}", retry_backoff_ms=20) as client:
            await client.create_log("once")
            proxy.armed = True
            offset = await client.append("once", b"exactly-once")
            assert proxy.dropped == 1, "the first answer never reached the client"
            await client.append("once", b"next")
            records = (await client.read("once")).records
            assert [r.value for r in records] == [b"exactly-once", b"next"]
            assert offset == 0

    asyncio.run(scenario())


def test_read_to_end_sees_everything_written_before_it(ensemble_server: ServerHandle) -> None:
    async def scenario() -> None:
        async with (
            EnsembleClient(ensemble_server.bootstrap) as writer,
            EnsembleClient(ensemble_server.bootstrap) as reader,
        ):
            await writer.create_log("cfg", compacted=True)
            seen: list[Record] = []
            tailer = LogTailer(reader, "cfg", seen.append, max_records=7)
            await tailer.start()
            for _ in range(3):
                written = [
                    await writer.append("cfg", b"v%d" % i, key=b"k%d" % (i % 40))
                    for i in range(100)
                ]
                end = await tailer.read_to_end()
                assert end == written[-1] + 1
                assert seen[-1].offset == written[-1]
                assert tailer.position == end
            await tailer.stop()
            # every record handed over once, in offset order
            offsets = [r.offset for r in seen]
            assert offsets == sorted(set(offsets))

    asyncio.run(scenario())


def test_sync_facade(ensemble_server: ServerHandle) -> None:
    with SyncEnsembleClient(ensemble_server.bootstrap) as client:
        client.create_log("s")
        assert [client.append("s", b"%d" % i) for i in range(3)] == [0, 1, 2]
        assert client.end_offsets(["s"]) == {"s": 3}
        assert client.sync() >= client.describe_log("s").last_zxid


def test_an_expired_session_is_replaced(ensemble_server: ServerHandle) -> None:
    from herder.ensemble import apis
    from herder.wire import ApiRegistry, WireClient

    async def scenario() -> None:
        async with EnsembleClient(ensemble_server.bootstrap, session_timeout_ms=1000) as client:
            await client.create_log("renew")
            old = client.session_id
            # end the session behind the client's back, as an expiry would
            host, port = ensemble_server.bootstrap.split(":")
            raw = WireClient(host, int(port), ApiRegistry(apis.CLIENT_APIS))
            await raw.request(apis.CLOSE_SESSION, apis.CloseSessionRequest(session_id=old))
            await raw.close()
            deadline = asyncio.get_running_loop().time() + 10
            while client.session_id in (old, 0):
                assert asyncio.get_running_loop().time() < deadline, "session never renewed"
                await asyncio.sleep(0.05)
            assert await client.append("renew", b"after") == 0

    asyncio.run(scenario())


def test_a_client_over_the_connection_limit_is_told_which_and_gets_in_when_it_can(
    processes: Processes, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server = make_server(processes, tmp_path, maxClientCnxns=2).start()

    async def scenario() -> None:
        first = await EnsembleClient(server.bootstrap, name="first").start()
        second = await EnsembleClient(server.bootstrap, name="second").start()
        refused = EnsembleClient(server.bootstrap, name="third", give_up_after=1.0)
        with pytest.raises(HerderError) as failure:
            await refused.start()
        assert "maxClientCnxns" in str(failure.value) and "at most 2" in str(failure.value)
        assert any("maxClientCnxns" in r.getMessage() for r in caplog.records)

        # it backs off and tries again: once a connection is free it gets in
        def refusals() -> int:
            return sum("maxClientCnxns" in r.getMessage() for r in caplog.records)

        before = refusals()
        waiting = asyncio.ensure_future(EnsembleClient(server.bootstrap, name="patient").start())
        while refusals() <= before:  # refused at least once (the test's timeout bounds it)
            await asyncio.sleep(0.02)
        assert not waiting.done()
        await first.close()
        patient = await asyncio.wait_for(waiting, 10)
        assert patient.session_id
        await patient.close()
        await second.close()

    asyncio.run(scenario())
    assert server.proc is not None and "refusing connection" in server.proc.output()


def test_writes_in_flight_when_a_connection_drops_are_all_applied_once(
    ensemble_server: ServerHandle,
) -> None:
    # one session shared by many writers (a worker's tasks): when the connection drops
    # with several writes in flight, they are sent again in the order of their sequence
    # numbers, so none is refused as out of order and none applies twice
    async def scenario() -> None:
        proxy = AnswerDropper(ensemble_server.port)
        await proxy.start()
        async with EnsembleClient(f"127.0.0.1:{proxy.port}", retry_backoff_ms=20) as client:
            await client.create_log("many")
            for round_ in range(5):
                proxy.armed = True
                values = [b"%d-%d" % (round_, i) for i in range(20)]
                await asyncio.gather(*(client.append("many", v) for v in values))
                assert proxy.dropped == round_ + 1
            records = (await client.read("many", max_records=1000)).records
            got = [r.value for r in records]
            assert sorted(got) == sorted(b"%d-%d" % (r, i) for r in range(5) for i in range(20))

    asyncio.run(scenario())
