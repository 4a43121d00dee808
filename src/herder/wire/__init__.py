"""The wire protocol: length-prefixed MessagePack frames, typed messages, RPC.

Every process in herder talks to every other through this package: the ensemble's
client port and quorum links, the group coordinator's APIs. See :mod:`.envelope` for
the frame layout, :mod:`.server` and :mod:`.client` for the two ends.
"""

from herder.wire.client import WireClient
from herder.wire.envelope import (
    API_VERSIONS,
    Api,
    ApiRegistry,
    ApiVersionRange,
    ApiVersionsRequest,
    ApiVersionsResponse,
)
from herder.wire.framing import DEFAULT_MAX_FRAME_BYTES, FrameDecoder, encode_frame
from herder.wire.server import Connection, RequestContext, WireServer

__all__ = [
    "API_VERSIONS",
    "DEFAULT_MAX_FRAME_BYTES",
    "Api",
    "ApiRegistry",
    "ApiVersionRange",
    "ApiVersionsRequest",
    "ApiVersionsResponse",
    "Connection",
    "FrameDecoder",
    "RequestContext",
    "WireClient",
    "WireServer",
    "encode_frame",
]
