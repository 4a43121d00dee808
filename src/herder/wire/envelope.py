"""The envelope every frame carries, and the registry of APIs and their versions.

A request frame is ``[api, version, correlation_id, body]``; a response frame is
``[correlation_id, error_code, error_message, body]``. Both are MessagePack arrays
encoded by msgspec. The body stays raw until the receiver knows which type to decode
it as, so an envelope can always be read (and answered) even when its body cannot.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import msgspec

from herder.errors import UnknownApi

Req = TypeVar("Req", bound=msgspec.Struct)
Resp = TypeVar("Resp", bound=msgspec.Struct)


class RequestEnvelope(msgspec.Struct, array_like=True):
    api: int
    version: int
    correlation_id: int
    body: msgspec.Raw


class ResponseEnvelope(msgspec.Struct, array_like=True):
    correlation_id: int
    error_code: int
    error_message: str
    body: msgspec.Raw


@dataclass(frozen=True, slots=True)
class Api(Generic[Req, Resp]):
    """One API: its key, name, the versions this build speaks, and its message types.

    Message types are ``msgspec.Struct`` classes whose later fields have defaults, so a
    newer peer's extra fields are ignored and an older peer's missing ones defaulted;
    the version tells a handler which fields the peer meant.
    """

    key: int
    name: str
    request: type[Req]
    response: type[Resp]
    min_version: int = 0
    max_version: int = 0
    #: whether it changes state: a principal with the ``read`` role is refused it
    writes: bool = False

    def supports(self, version: int) -> bool:
        return self.min_version <= version <= self.max_version


class ApiVersionRange(msgspec.Struct, array_like=True):
    api: int
    min_version: int
    max_version: int


class ApiVersionsRequest(msgspec.Struct, kw_only=True):
    client_name: str = ""


class ApiVersionsResponse(msgspec.Struct, kw_only=True):
    apis: list[ApiVersionRange] = []
    server_name: str = ""


#: Kafka's key for ApiVersions, kept so the handshake reads familiarly in captures.
API_VERSIONS: Api[ApiVersionsRequest, ApiVersionsResponse] = Api(
    18, "ApiVersions", ApiVersionsRequest, ApiVersionsResponse
)


class ApiRegistry:
    """The APIs one side speaks, with cached decoders for their bodies."""

    def __init__(self, apis: list[Api[Any, Any]] | None = None) -> None:
        self._apis: dict[int, Api[Any, Any]] = {}
        self._request_decoders: dict[int, msgspec.msgpack.Decoder[Any]] = {}
        self._response_decoders: dict[int, msgspec.msgpack.Decoder[Any]] = {}
        self.add(API_VERSIONS)
        for api in apis or []:
            self.add(api)

    def add(self, api: Api[Any, Any]) -> None:
        existing = self._apis.get(api.key)
        if existing is not None and existing is not api:
            raise ValueError(f"api key {api.key} is both {existing.name} and {api.name}")
        self._apis[api.key] = api
        self._request_decoders[api.key] = msgspec.msgpack.Decoder(api.request)
        self._response_decoders[api.key] = msgspec.msgpack.Decoder(api.response)

    def __contains__(self, key: int) -> bool:
        return key in self._apis

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self._apis.values())

    def get(self, key: int) -> Api[Any, Any]:
        try:
            return self._apis[key]
        except KeyError:
            raise UnknownApi(f"unknown api key {key}") from None

    def ranges(self) -> list[ApiVersionRange]:
        return [
            ApiVersionRange(a.key, a.min_version, a.max_version)
            for a in sorted(self._apis.values(), key=lambda a: a.key)
        ]

    def decode_request(self, key: int, data: bytes | msgspec.Raw) -> Any:
        return self._request_decoders[key].decode(data)

    def decode_response(self, key: int, data: bytes | msgspec.Raw) -> Any:
        return self._response_decoders[key].decode(data)


_encoder = msgspec.msgpack.Encoder()
_request_envelope = msgspec.msgpack.Decoder(RequestEnvelope)
_response_envelope = msgspec.msgpack.Decoder(ResponseEnvelope)
encode = _encoder.encode


def encode_request(api: int, version: int, correlation_id: int, body: msgspec.Struct) -> bytes:
    return _encoder.encode(
        RequestEnvelope(api, version, correlation_id, msgspec.Raw(_encoder.encode(body)))
    )


def encode_response(
    correlation_id: int, body: msgspec.Struct | None, error_code: int = 0, error_message: str = ""
) -> bytes:
    raw = msgspec.Raw(_encoder.encode(body)) if body is not None else msgspec.Raw(b"\xc0")
    return _encoder.encode(ResponseEnvelope(correlation_id, error_code, error_message, raw))


def decode_request_envelope(frame: bytes) -> RequestEnvelope:
    return _request_envelope.decode(frame)


def decode_response_envelope(frame: bytes) -> ResponseEnvelope:
    return _response_envelope.decode(frame)
