"""ttrpc message framing: a 10-byte header, then the payload.

Header: u32 BE payload length, u32 BE stream id, u8 message type (1 request, 2 response, 3
data), u8 flags. Unary calls use flags 0 and carry a ``ttrpc.Request`` or ``ttrpc.Response``
envelope (``cri_protos/ttrpc.proto``). The caller picks odd, increasing stream ids per
connection and the response reuses the request's id.

``MessageDecoder`` reassembles messages from the byte stream of one logical connection and
refuses a message whose header announces more than its bound. Sent messages stay within
``MAX_MESSAGE`` (4 MiB, what a Go ttrpc peer accepts). Requests are accepted up to
``MAX_RECV_MESSAGE``: containerd 1.7 sends its whole state in one Synchronize message, which
passes 4 MiB on a node with many pods (measured: 5 MiB for ten pods and containers with 250 KiB
of annotations each), while containerd 2.x splits it (``more``).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

__all__ = [
    "HEADER",
    "MAX_MESSAGE",
    "MAX_RECV_MESSAGE",
    "TYPE_DATA",
    "TYPE_REQUEST",
    "TYPE_RESPONSE",
    "Message",
    "MessageDecoder",
    "MessageTooLarge",
    "encode_message",
]

HEADER = struct.Struct(">IIBB")
TYPE_REQUEST = 1
TYPE_RESPONSE = 2
TYPE_DATA = 3
MAX_MESSAGE = 4 << 20
MAX_RECV_MESSAGE = 14 << 20

# grpc status codes used in ttrpc responses.
CODE_UNKNOWN = 2
CODE_DEADLINE_EXCEEDED = 4
CODE_UNIMPLEMENTED = 12
CODE_INTERNAL = 13


class MessageTooLarge(ValueError):
    """A message header announced more bytes than the decoder accepts."""


@dataclass(frozen=True)
class Message:
    stream_id: int
    type: int
    flags: int
    payload: bytes


def encode_message(stream_id: int, msg_type: int, payload: bytes, flags: int = 0) -> bytes:
    if len(payload) > MAX_MESSAGE:
        raise MessageTooLarge(f"message of {len(payload)} bytes (limit {MAX_MESSAGE})")
    return HEADER.pack(len(payload), stream_id, msg_type, flags) + payload


class MessageDecoder:
    """Reassembles ttrpc messages from arbitrarily split chunks of one connection's stream."""

    def __init__(self, max_message: int = MAX_MESSAGE) -> None:
        self.max_message = max_message
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[Message]:
        self._buf += data
        out: list[Message] = []
        offset = 0
        buf = self._buf
        with memoryview(buf) as view:  # each message is copied once, out of the buffer
            while len(buf) - offset >= HEADER.size:
                length, stream_id, msg_type, flags = HEADER.unpack_from(buf, offset)
                if length > self.max_message:
                    raise MessageTooLarge(f"message of {length} bytes on stream {stream_id} "
                                          f"(limit {self.max_message})")
                end = offset + HEADER.size + length
                if len(buf) < end:
                    break
                out.append(Message(stream_id, msg_type, flags, bytes(view[offset + HEADER.size : end])))
                offset = end
        if offset:
            del buf[:offset]
        return out
