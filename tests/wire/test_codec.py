import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from herder.errors import FrameTooLarge
from herder.wire.envelope import (
    API_VERSIONS,
    ApiRegistry,
    decode_request_envelope,
    decode_response_envelope,
    encode_request,
    encode_response,
)
from herder.wire.framing import FrameDecoder, encode_frame
from tests.strategies import for_type
from tests.wire.apis import ALL_APIS

pytestmark = pytest.mark.unit


@given(st.lists(st.binary(max_size=300), max_size=20), st.integers(1, 64))
def test_frames_reassemble_from_any_chunking(payloads: list[bytes], chunk: int) -> None:
    stream = b"".join(encode_frame(p) for p in payloads)
    decoder = FrameDecoder()
    out: list[bytes] = []
    for i in range(0, len(stream), chunk):
        out += decoder.feed(stream[i : i + chunk])
    assert out == payloads
    assert decoder.buffered == 0


def test_oversized_frame_is_refused_before_its_body_arrives() -> None:
    decoder = FrameDecoder(max_frame_bytes=1024)
    with pytest.raises(FrameTooLarge, match="1025 bytes exceeds the limit of 1024"):
        decoder.feed((1025).to_bytes(4, "big"))


def test_truncated_frame_waits_for_the_rest() -> None:
    decoder = FrameDecoder()
    frame = encode_frame(b"hello world")
    assert decoder.feed(frame[:7]) == []
    assert decoder.buffered == 7
    assert decoder.feed(frame[7:]) == [b"hello world"]


@pytest.mark.parametrize("api", ALL_APIS, ids=lambda a: a.name)
def test_every_message_round_trips(api) -> None:  # type: ignore[no-untyped-def]
    registry = ApiRegistry([api])

    @given(for_type(api.request), for_type(api.response), st.integers(0, 2**31 - 1))
    def round_trip(request, response, cid):  # type: ignore[no-untyped-def]
        env = decode_request_envelope(encode_request(api.key, 0, cid, request))
        assert (env.api, env.version, env.correlation_id) == (api.key, 0, cid)
        assert registry.decode_request(api.key, env.body) == request
        renv = decode_response_envelope(encode_response(cid, response))
        assert renv.correlation_id == cid and renv.error_code == 0
        assert registry.decode_response(api.key, renv.body) == response

    round_trip()


def test_error_response_carries_code_and_message() -> None:
    env = decode_response_envelope(encode_response(7, None, 16, "not the coordinator"))
    assert (env.correlation_id, env.error_code, env.error_message) == (7, 16, "not the coordinator")
    assert msgspec.msgpack.decode(env.body) is None


def test_registry_refuses_two_apis_on_one_key() -> None:
    from herder.wire.envelope import Api

    registry = ApiRegistry()
    clash = Api(API_VERSIONS.key, "Other", msgspec.Struct, msgspec.Struct)
    with pytest.raises(ValueError, match="both ApiVersions and Other"):
        registry.add(clash)
