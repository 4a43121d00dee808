import asyncio
import random
import struct

import msgspec
import pytest

from herder.errors import ConnectionClosed, ErrorCode, RequestTimedOut, UnsupportedVersion
from herder.wire import ApiRegistry, RequestContext, WireClient, WireServer
from herder.wire.envelope import decode_response_envelope, encode_request
from herder.wire.framing import FrameDecoder, encode_frame
from tests.wire.apis import ECHO, EchoRequest, EchoResponse

pytestmark = pytest.mark.unit


async def echo(body: EchoRequest, ctx: RequestContext) -> EchoResponse:
    if body.delay_ms:
        await asyncio.sleep(body.delay_ms / 1000)
    return EchoResponse(payload=body.payload)


async def start_server(**kw: int) -> WireServer:
    server = WireServer(ApiRegistry(), name="test", **kw)
    server.route(ECHO, echo)
    await server.start("127.0.0.1", 0)
    return server


async def raw_exchange(port: int, data: bytes, read_frames: int = 0) -> tuple[list[bytes], bool]:
    """Send raw bytes; return the frames answered and whether the server closed on us."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    await writer.drain()
    decoder = FrameDecoder()
    frames: list[bytes] = []
    closed = False
    try:
        while len(frames) < read_frames or not read_frames:
            chunk = await asyncio.wait_for(reader.read(65536), 2.0)
            if not chunk:
                closed = True
                break
            frames += decoder.feed(chunk)
    except TimeoutError:
        pass
    writer.close()
    return frames, closed


async def test_bad_connections_do_not_disturb_a_good_one() -> None:
    server = await start_server(max_frame_bytes=4096)
    good = WireClient("127.0.0.1", server.port, ApiRegistry([ECHO]))
    await good.connect()
    stop = asyncio.Event()
    served = 0

    async def keep_asking() -> None:
        nonlocal served
        while not stop.is_set():
            reply = await good.request(ECHO, EchoRequest(payload=b"%d" % served))
            assert reply.payload == b"%d" % served
            served += 1

    worker = asyncio.create_task(keep_asking())

    # garbage that is framed but is not an envelope: connection closed
    _, closed = await raw_exchange(server.port, encode_frame(b"\xff\x00garbage"))
    assert closed
    # random bytes whose length prefix is absurd: oversized, closed
    _, closed = await raw_exchange(server.port, struct.pack(">I", 10**9) + b"x" * 10)
    assert closed
    # a frame over the configured limit
    _, closed = await raw_exchange(server.port, encode_frame(b"\x00" * 5000))
    assert closed
    # a truncated frame, then the client goes away: nothing to answer, nothing breaks
    frames, closed = await raw_exchange(server.port, encode_frame(b"abcdefgh")[:6])
    assert frames == [] and not closed
    # an unknown api version and an unknown api: answered with errors, connection kept
    bad_version = encode_frame(encode_request(ECHO.key, 7, 1, EchoRequest()))
    unknown_api = encode_frame(encode_request(4242, 0, 2, EchoRequest()))
    fine = encode_frame(encode_request(ECHO.key, 1, 3, EchoRequest(payload=b"ok")))
    frames, closed = await raw_exchange(server.port, bad_version + unknown_api + fine, 3)
    answers = {e.correlation_id: e for e in map(decode_response_envelope, frames)}
    assert answers[1].error_code == ErrorCode.UNSUPPORTED_VERSION
    assert "version 7 is not supported" in answers[1].error_message
    assert answers[2].error_code == ErrorCode.UNKNOWN_API
    assert answers[3].error_code == 0
    assert msgspec.msgpack.decode(answers[3].body) == {"payload": b"ok"}
    # a well-framed request whose body has the wrong shape: an error, connection kept
    wrong_shape = encode_frame(
        msgspec.msgpack.encode([ECHO.key, 0, 9, msgspec.Raw(msgspec.msgpack.encode([1, 2]))])
    )
    frames, closed = await raw_exchange(server.port, wrong_shape, 1)
    assert decode_response_envelope(frames[0]).error_code == ErrorCode.INVALID_REQUEST
    assert not closed

    before = served
    while served < before + 20:
        await asyncio.sleep(0.01)
    stop.set()
    await worker
    assert good.connected
    await good.close()
    await server.stop()


async def test_a_thousand_pipelined_requests_complete_out_of_order() -> None:
    server = await start_server()
    client = WireClient("127.0.0.1", server.port, ApiRegistry([ECHO]))
    await client.connect()
    rng = random.Random(7)
    finished: list[int] = []

    async def one(i: int) -> None:
        reply = await client.request(
            ECHO, EchoRequest(payload=i.to_bytes(4, "big"), delay_ms=rng.randrange(0, 30))
        )
        assert int.from_bytes(reply.payload, "big") == i
        finished.append(i)

    await asyncio.gather(*(one(i) for i in range(1000)))
    assert sorted(finished) == list(range(1000))
    assert finished != list(range(1000)), "handlers with random delays must finish out of order"
    assert len(server.connections) == 1
    await client.close()
    await server.stop()


async def test_version_negotiation_and_unsupported_versions() -> None:
    server = await start_server()
    client = WireClient("127.0.0.1", server.port, ApiRegistry([ECHO]))
    await client.connect()
    assert client.versions[ECHO.key] == 1
    assert client.server_name == "test"
    with pytest.raises(UnsupportedVersion):
        await client.request(ECHO, EchoRequest(), version=5)
    # the server refuses a version it does not speak even if a client sends it anyway
    with pytest.raises(UnsupportedVersion, match="version 3 is not supported"):
        await client.send_raw(ECHO.key, 3, EchoRequest())
    await client.close()
    await server.stop()


async def test_timeouts_and_lost_connections_fail_requests_cleanly() -> None:
    server = await start_server()
    client = WireClient("127.0.0.1", server.port, ApiRegistry([ECHO]))
    with pytest.raises(RequestTimedOut):
        await client.request(ECHO, EchoRequest(delay_ms=500), timeout=0.05)
    # the late answer is discarded; the connection keeps working
    assert (await client.request(ECHO, EchoRequest(payload=b"x"))).payload == b"x"
    slow = asyncio.create_task(client.request(ECHO, EchoRequest(delay_ms=5000)))
    await asyncio.sleep(0.05)
    for conn in list(server.connections.values()):
        conn.close("test")
    with pytest.raises(ConnectionClosed):
        await slow
    # the next request reconnects on its own
    assert (await client.request(ECHO, EchoRequest(payload=b"y"))).payload == b"y"
    await client.close()
    await server.stop()


async def test_a_request_cancelled_as_its_answer_arrives_is_cancelled() -> None:
    # the answer and the cancellation land in the same turn of the loop: the request
    # must still end cancelled, or a task told to stop (a log tailer) never does
    server = await start_server()
    client = WireClient("127.0.0.1", server.port, ApiRegistry([ECHO]))
    await client.connect()
    try:
        request = asyncio.create_task(
            client.request(ECHO, EchoRequest(payload=b"x", delay_ms=60_000))
        )
        while not client._pending:
            await asyncio.sleep(0)
        ((_, answer),) = client._pending.values()
        answer.set_result(EchoResponse(payload=b"x"))
        request.cancel()
        with pytest.raises(asyncio.CancelledError):
            await request
    finally:
        await client.close()
        await server.stop()
