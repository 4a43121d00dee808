"""Frames on a byte stream: a 4-byte big-endian length, then that many bytes.

Sans-IO in the manner of h11: :class:`FrameDecoder` is fed whatever bytes arrived and
hands back whole frames; it never touches a socket, so the server, the client and the
tests share it and a fuzzer can drive it directly.
"""

from __future__ import annotations

import struct

from herder.errors import FrameTooLarge

LENGTH = struct.Struct(">I")
DEFAULT_MAX_FRAME_BYTES = 16 * 1024 * 1024


def encode_frame(payload: bytes) -> bytes:
    """One frame: the payload's length, big-endian, then the payload."""
    return LENGTH.pack(len(payload)) + payload


class FrameDecoder:
    """Reassembles frames from arbitrary chunks of a stream.

    A length above ``max_frame_bytes`` raises :class:`FrameTooLarge` as soon as the
    4-byte prefix is seen, before any of the body is buffered: a peer cannot make us
    hold a huge buffer by announcing one.
    """

    __slots__ = ("_buffer", "_need", "max_frame_bytes")

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        self.max_frame_bytes = max_frame_bytes
        self._buffer = bytearray()
        self._need = -1  # body length of the frame being read, or -1 while reading a prefix

    @property
    def buffered(self) -> int:
        """Bytes received that are not yet part of a whole frame (a truncated frame)."""
        return len(self._buffer) + (4 if self._need >= 0 else 0)

    def feed(self, data: bytes) -> list[bytes]:
        """Add ``data``; return every frame it completed, oldest first."""
        buf = self._buffer
        buf += data
        frames: list[bytes] = []
        pos = 0
        end = len(buf)
        while True:
            if self._need < 0:
                if end - pos < 4:
                    break
                (length,) = LENGTH.unpack_from(buf, pos)
                if length > self.max_frame_bytes:
                    raise FrameTooLarge(
                        f"frame of {length} bytes exceeds the limit of {self.max_frame_bytes}"
                    )
                pos += 4
                self._need = length
            if end - pos < self._need:
                break
            frames.append(bytes(buf[pos : pos + self._need]))
            pos += self._need
            self._need = -1
        if pos:
            del buf[:pos]
        return frames
