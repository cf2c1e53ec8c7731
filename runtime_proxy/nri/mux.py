"""The NRI multiplexer: several logical connections over one stream socket.

Every frame is ``[u32 BE connection id][u32 BE payload length]`` followed by the payload. The
runtime calls the plugin on connection 1 (``PLUGIN_CONN``) and the plugin calls the runtime on
connection 2 (``RUNTIME_CONN``). There are no open or close frames; a frame for a connection the
reader does not know is dropped by the caller.

The Go reader on the runtime side hands each frame to a ttrpc reader with a 4096-byte buffer
and fails when a frame does not fit, so ``encode`` splits payloads into frames of at most
``MAX_SEND_PAYLOAD`` bytes. ``FrameDecoder`` refuses frames larger than its bound before
buffering them.
"""

from __future__ import annotations

import struct

__all__ = [
    "HEADER",
    "MAX_RECV_PAYLOAD",
    "MAX_SEND_PAYLOAD",
    "PLUGIN_CONN",
    "RUNTIME_CONN",
    "FrameDecoder",
    "FrameTooLarge",
    "encode",
]

HEADER = struct.Struct(">II")
PLUGIN_CONN = 1
RUNTIME_CONN = 2
MAX_SEND_PAYLOAD = 4096
# The largest ttrpc request the plugin accepts (``ttrpc.MAX_RECV_MESSAGE``, 14 MiB, the runtime's
# own frame bound) plus its header; a frame never needs more.
MAX_RECV_PAYLOAD = (14 << 20) + 64


class FrameTooLarge(ValueError):
    """A frame header announced more bytes than the decoder accepts."""


def encode(conn_id: int, payload: bytes, max_payload: int = MAX_SEND_PAYLOAD) -> bytes:
    """``payload`` as frames for ``conn_id``, each carrying at most ``max_payload`` bytes."""
    if max_payload <= 0:
        raise ValueError("max_payload must be positive")
    if not payload:
        return HEADER.pack(conn_id, 0)
    view = memoryview(payload)
    parts: list[bytes] = []
    for start in range(0, len(view), max_payload):
        chunk = view[start : start + max_payload]
        parts.append(HEADER.pack(conn_id, len(chunk)))
        parts.append(bytes(chunk))
    return b"".join(parts)


class FrameDecoder:
    """Splits a byte stream into ``(connection id, payload)`` frames, whatever the chunking."""

    def __init__(self, max_payload: int = MAX_RECV_PAYLOAD) -> None:
        self.max_payload = max_payload
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        """Frames completed by ``data``. Raises ``FrameTooLarge`` as soon as a header announces
        an oversized frame (nothing of it is buffered beyond the header)."""
        self._buf += data
        frames: list[tuple[int, bytes]] = []
        offset = 0
        buf = self._buf
        with memoryview(buf) as view:  # each frame is copied once, out of the buffer
            while len(buf) - offset >= HEADER.size:
                conn_id, length = HEADER.unpack_from(buf, offset)
                if length > self.max_payload:
                    raise FrameTooLarge(f"frame of {length} bytes on connection {conn_id} (limit {self.max_payload})")
                end = offset + HEADER.size + length
                if len(buf) < end:
                    break
                frames.append((conn_id, bytes(view[offset + HEADER.size : end])))
                offset = end
        if offset:
            del buf[:offset]
        return frames

    @property
    def buffered(self) -> int:
        return len(self._buf)
