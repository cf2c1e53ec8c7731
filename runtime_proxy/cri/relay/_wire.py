"""HTTP/2 and gRPC wire helpers for the relay: frame constants, frame builders and the tiny HPACK
encoder the relay uses for the header blocks it writes itself.

Called by ``_session`` only. Nothing here keeps state except the bounded encoding cache.

The relay's own header blocks never change the peer decoder's dynamic table: every field is
either a fully indexed *static* entry (``:status: 200``) or a "literal header field without
indexing" (or "never indexed", when the origin asked for that) whose name is a static-table
index or a literal. No dynamic-table size update is ever emitted. So a block the relay writes
can sit anywhere between the origin's blocks and the receiver's decoder stays in step with the
origin's encoder (RFC 7541 sections 6.1, 6.2.2, 6.2.3).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

from hpack.table import HeaderTable

# Frame types (RFC 9113 section 6).
DATA = 0x0
HEADERS = 0x1
PRIORITY = 0x2
RST_STREAM = 0x3
SETTINGS = 0x4
PUSH_PROMISE = 0x5
PING = 0x6
GOAWAY = 0x7
WINDOW_UPDATE = 0x8
CONTINUATION = 0x9

# Flags.
FLAG_END_STREAM = 0x1
FLAG_ACK = 0x1
FLAG_END_HEADERS = 0x4
FLAG_PADDED = 0x8
FLAG_PRIORITY = 0x20

# SETTINGS identifiers.
SETTINGS_HEADER_TABLE_SIZE = 0x1
SETTINGS_ENABLE_PUSH = 0x2
SETTINGS_MAX_CONCURRENT_STREAMS = 0x3
SETTINGS_INITIAL_WINDOW_SIZE = 0x4
SETTINGS_MAX_FRAME_SIZE = 0x5
SETTINGS_MAX_HEADER_LIST_SIZE = 0x6

# Error codes.
NO_ERROR = 0x0
PROTOCOL_ERROR = 0x1
INTERNAL_ERROR = 0x2
FLOW_CONTROL_ERROR = 0x3
STREAM_CLOSED = 0x5
FRAME_SIZE_ERROR = 0x6
REFUSED_STREAM = 0x7
CANCEL = 0x8
COMPRESSION_ERROR = 0x9
ENHANCE_YOUR_CALM = 0xB

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DEFAULT_WINDOW = 65535
DEFAULT_MAX_FRAME = 16384
MAX_WINDOW = 2**31 - 1
MAX_STREAM_ID = 2**31 - 1

# length(24) + type(8) as one big-endian u32, then flags(8), then R + stream id(32).
FRAME_HEADER = struct.Struct(">IBI")
U32 = struct.Struct(">I")
_SETTING = struct.Struct(">HI")

# gRPC status codes used by the relay itself.
GRPC_INTERNAL = 13
GRPC_UNAVAILABLE = 14
GRPC_RESOURCE_EXHAUSTED = 8


def frame(ftype: int, flags: int, sid: int, payload: bytes = b"") -> bytes:
    """One frame: header plus payload."""
    return FRAME_HEADER.pack((len(payload) << 8) | ftype, flags, sid) + payload


def frame_header(ftype: int, flags: int, sid: int, length: int) -> bytes:
    return FRAME_HEADER.pack((length << 8) | ftype, flags, sid)


def window_update(sid: int, increment: int) -> bytes:
    return FRAME_HEADER.pack((4 << 8) | WINDOW_UPDATE, 0, sid) + U32.pack(increment)


def rst_stream(sid: int, code: int) -> bytes:
    return FRAME_HEADER.pack((4 << 8) | RST_STREAM, 0, sid) + U32.pack(code)


def goaway(last_sid: int, code: int, debug: bytes = b"") -> bytes:
    return frame(GOAWAY, 0, 0, U32.pack(last_sid) + U32.pack(code) + debug)


def settings(pairs: Iterable[tuple[int, int]] = ()) -> bytes:
    return frame(SETTINGS, 0, 0, b"".join(_SETTING.pack(k, v) for k, v in pairs))


SETTINGS_ACK = frame(SETTINGS, FLAG_ACK, 0)


def parse_settings(payload: bytes | memoryview) -> list[tuple[int, int]]:
    return [_SETTING.unpack_from(payload, i) for i in range(0, len(payload) - 5, 6)]


def u32(data: bytes | bytearray | memoryview, offset: int = 0) -> int:
    value: int = U32.unpack_from(data, offset)[0]
    return value


# --- HPACK, encoding side ------------------------------------------------------------------------
_STATIC_NAME: dict[bytes, int] = {}
_STATIC_FULL: dict[tuple[bytes, bytes], int] = {}
for _i, (_n, _v) in enumerate(HeaderTable.STATIC_TABLE, start=1):
    _STATIC_NAME.setdefault(_n, _i)
    _STATIC_FULL.setdefault((_n, _v), _i)


def _hpack_int(value: int, prefix_bits: int, pattern: int) -> bytes:
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((pattern | value,))
    out = bytearray((pattern | limit,))
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _hpack_str(data: bytes) -> bytes:
    return _hpack_int(len(data), 7, 0x00) + data


_FIELD_CACHE: dict[tuple[bytes, bytes, bool], bytes] = {}
_FIELD_CACHE_MAX = 4096


def encode_field(name: bytes, value: bytes, sensitive: bool = False) -> bytes:
    """One header field that leaves the receiver's dynamic table untouched."""
    key = (name, value, sensitive)
    out = _FIELD_CACHE.get(key)
    if out is not None:
        return out
    full = None if sensitive else _STATIC_FULL.get((name, value))
    if full is not None:
        out = _hpack_int(full, 7, 0x80)
    else:
        pattern = 0x10 if sensitive else 0x00
        idx = _STATIC_NAME.get(name)
        if idx is not None:
            out = _hpack_int(idx, 4, pattern) + _hpack_str(value)
        else:
            out = bytes((pattern,)) + _hpack_str(name) + _hpack_str(value)
    if len(_FIELD_CACHE) < _FIELD_CACHE_MAX and len(value) <= 256:
        _FIELD_CACHE[key] = out
    return out


def header_frames(sid: int, block: bytes, end_stream: bool, max_frame: int) -> bytes:
    """HEADERS (+ CONTINUATION) frames carrying ``block``."""
    flags = FLAG_END_STREAM if end_stream else 0
    if len(block) <= max_frame:
        return frame(HEADERS, flags | FLAG_END_HEADERS, sid, block)
    parts = [frame(HEADERS, flags, sid, block[:max_frame])]
    pos = max_frame
    while pos < len(block):
        chunk = block[pos : pos + max_frame]
        pos += max_frame
        parts.append(frame(CONTINUATION, FLAG_END_HEADERS if pos >= len(block) else 0, sid, chunk))
    return b"".join(parts)


_RESPONSE_HEADERS = encode_field(b":status", b"200") + encode_field(b"content-type", b"application/grpc")


def percent_encode(message: str) -> bytes:
    """grpc-message encoding: UTF-8, then %XX for bytes outside 0x20-0x7E and for '%'."""
    raw = message.encode("utf-8", "replace")
    if all(0x20 <= b <= 0x7E and b != 0x25 for b in raw):
        return raw
    return b"".join(bytes((b,)) if 0x20 <= b <= 0x7E and b != 0x25 else b"%%%02X" % b for b in raw)


def grpc_error_frames(sid: int, code: int, message: str, *, headers_sent: bool, max_frame: int) -> bytes:
    """The relay's own answer on ``sid``: response HEADERS (unless already sent) and trailers."""
    trailers = encode_field(b"grpc-status", str(code).encode()) + encode_field(b"grpc-message", percent_encode(message))
    head = b"" if headers_sent else header_frames(sid, _RESPONSE_HEADERS, False, max_frame)
    return head + header_frames(sid, trailers, True, max_frame)


def grpc_message(data: bytes | bytearray | memoryview) -> tuple[bytes | None, str]:
    """Split one gRPC length-prefixed message: (message, "") or (None, reason)."""
    if len(data) == 0:
        return None, "no request message"
    if len(data) < 5:
        return None, "truncated message prefix"
    if data[0] & 1:
        return None, "compressed message"
    size = u32(data, 1)
    if 5 + size < len(data):
        return None, "several messages"
    if 5 + size > len(data):
        return None, "truncated message"
    return bytes(data[5:]), ""


def grpc_frame(message: bytes) -> bytes:
    return b"\x00" + U32.pack(len(message)) + message
