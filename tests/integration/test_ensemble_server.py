"""One real ensemble server process: durability across kill -9, and bad clients."""

from __future__ import annotations

import asyncio
import struct

import pytest

from herder.ensemble import apis
from herder.ensemble.client import EnsembleClient
from herder.ensemble.txn import Append, CheckEndOffset, CreateLog
from herder.errors import CheckFailed, ErrorCode, UnknownLog
from herder.wire import ApiRegistry, WireClient
from herder.wire.envelope import encode_request
from herder.wire.framing import encode_frame
from tests.integration.conftest import ServerHandle

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def test_acknowledged_appends_survive_kill9(ensemble_server: ServerHandle) -> None:
    acknowledged: dict[int, bytes] = {}

    async def write_until_killed() -> None:
        client = EnsembleClient(ensemble_server.bootstrap, give_up_after=0.5)
        await client.start()
        await client.create_log("stream")
        stop = asyncio.Event()

        async def writer(w: int) -> None:
            n = 0
            while not stop.is_set():
                value = b"w%d-%d" % (w, n)
                try:
                    offset = await client.append("stream", value)
                except Exception:
                    stop.set()
                    return
                acknowledged[offset] = value
                n += 1

        writers = [asyncio.create_task(writer(w)) for w in range(20)]
        while len(acknowledged) < 2000:
            await asyncio.sleep(0.01)
        await asyncio.to_thread(ensemble_server.kill9)
        await asyncio.gather(*writers)
        await client.close()

    asyncio.run(write_until_killed())
    assert len(acknowledged) >= 2000
    ensemble_server.start()

    async def read_back() -> list[tuple[int, bytes | None]]:
        async with EnsembleClient(ensemble_server.bootstrap) as client:
            out = []
            position = 0
            while True:
                reply = await client.read("stream", position, max_records=5000)
                out += [(r.offset, r.value) for r in reply.records]
                position = reply.next_offset
                if position >= reply.end_offset:
                    return out

    stored = asyncio.run(read_back())
    offsets = [o for o, _ in stored]
    assert offsets == list(range(len(stored))), "offsets are dense and in order"
    values = [v for _, v in stored]
    assert len(set(values)) == len(values), "no record is stored twice"
    by_offset = dict(stored)
    for offset, value in acknowledged.items():
        assert by_offset.get(offset) == value, f"acknowledged record at {offset} lost"


def test_bad_clients_leave_the_server_serving(ensemble_server: ServerHandle) -> None:
    async def scenario() -> None:
        async with EnsembleClient(ensemble_server.bootstrap) as good:
            await good.create_log("fine")
            port = ensemble_server.port
            # garbage bytes, an absurd frame length, a truncated frame
            for junk in (b"\x00\x00\x00\x05hello", struct.pack(">I", 2**31) + b"zz", b"\x00\x00"):
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(junk)
                await writer.drain()
                writer.close()
                await good.append("fine", junk)
            # a version the server does not speak
            wire = WireClient("127.0.0.1", port, ApiRegistry(apis.CLIENT_APIS))
            await wire.connect()
            with pytest.raises(Exception) as exc_info:
                await wire.send_raw(apis.TRANSACT.key, 9, apis.ListLogsRequest())
            assert getattr(exc_info.value, "code", None) == ErrorCode.UNSUPPORTED_VERSION
            # a body of the wrong shape for the api
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(
                encode_frame(encode_request(apis.TRANSACT.key, 0, 1, apis.ListLogsRequest()))
            )
            await writer.drain()
            assert (await asyncio.wait_for(reader.read(4096), 5)) != b""
            writer.close()
            await wire.close()
            # a transaction on an unknown log, and a failing check: refused whole
            with pytest.raises(UnknownLog):
                await good.transact([Append("missing", None, b"x")])
            with pytest.raises(CheckFailed):
                await good.transact([Append("fine", None, b"y"), CheckEndOffset("fine", 0)])
            await good.transact([CreateLog("fine", if_absent=True)])
            reply = await good.read("fine")
            assert [r.value for r in reply.records] == [
                b"\x00\x00\x00\x05hello",
                struct.pack(">I", 2**31) + b"zz",
                b"\x00\x00",
            ]
            status = await good.status()
            names = {info.name for info in await good.list_logs()}
            assert status.role == "standalone" and status.logs == len(names)
            assert {"fine", "_groups", "_fencing"} <= names

    asyncio.run(scenario())
    assert ensemble_server.proc is not None and ensemble_server.proc.alive()


def test_sigterm_stops_cleanly_and_keeps_data(ensemble_server: ServerHandle) -> None:
    async def write() -> None:
        async with EnsembleClient(ensemble_server.bootstrap) as client:
            await client.create_log("kept", compacted=True)
            for i in range(50):
                await client.append("kept", b"%d" % i, key=b"k%d" % (i % 5))

    asyncio.run(write())
    assert ensemble_server.stop() == 0
    ensemble_server.start()

    async def read() -> list[bytes | None]:
        async with EnsembleClient(ensemble_server.bootstrap) as client:
            return [r.value for r in (await client.read("kept")).records]

    assert asyncio.run(read()) == [b"45", b"46", b"47", b"48", b"49"]


def test_snapshots_are_taken_purged_and_recovered_from(processes, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from tests.integration.conftest import make_server

    server = make_server(processes, tmp_path, snapCount=40).start()

    async def write(first: int, count: int) -> None:
        async with EnsembleClient(server.bootstrap) as client:
            await client.create_log("snap", compacted=True, if_absent=True)
            for i in range(first, first + count):
                await client.append("snap", b"%d" % i, key=b"k%d" % (i % 7))

    asyncio.run(write(0, 400))
    snapshots = sorted(p.name for p in server.data_dir.iterdir() if p.name.startswith("snapshot."))
    assert 3 <= len(snapshots) <= 4, f"snapshots taken and old ones purged: {snapshots}"
    server.kill9()
    server.start()
    asyncio.run(write(400, 10))

    async def read() -> dict[bytes | None, bytes | None]:
        async with EnsembleClient(server.bootstrap) as client:
            return {r.key: r.value for r in (await client.read("snap")).records}

    latest = asyncio.run(read())
    assert latest == {b"k%d" % (i % 7): b"%d" % i for i in range(403, 410)}


def test_ports_in_use_are_reported_in_one_line(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import socket
    import subprocess

    from tests.harness import HERDER, free_port

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    busy = taken.getsockname()[1]
    try:
        ports = [(free_port(), free_port()) for _ in range(3)]
        for name, lines in (
            ("client", f"clientPort={busy}\nclientPortAddress=127.0.0.1\n"),
            (
                "quorum",
                f"server.id=1\nserver.1=127.0.0.1:{busy}:{ports[0][1]};127.0.0.1:{free_port()}\n"
                + "".join(
                    f"server.{i}=127.0.0.1:{ports[i - 1][0]}:{ports[i - 1][1]}\n" for i in (2, 3)
                ),
            ),
        ):
            config = tmp_path / f"{name}.properties"
            config.write_text(f"dataDir={tmp_path / name}\n{lines}")
            out = subprocess.run(
                [*HERDER, "ensemble", "start", "--config", str(config)],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert out.returncode == 1, out.stderr
            assert str(busy) in out.stderr and "Traceback" not in out.stderr, out.stderr
    finally:
        taken.close()
