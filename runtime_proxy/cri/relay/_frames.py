"""Frame-level helpers of the relay that read what peers send: the frame error, the content
bounds of a padded frame, the HPACK decoder kept in step with a peer's encoder, the relay's
re-encoding of a decoded block, and the decoding of one gRPC response message for ``after``.

Used by the session units (``_client``, ``_server``, ``_intercept``, ``_refuse``). Both
parsers walk a read with one ``FrameWalk``: it reads each frame header with ``unpack_header``
(one ``struct`` call), bounds the frame, and keeps the span of frames that pass unchanged.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Iterator

from hpack import Decoder, NeverIndexedHeaderTuple

from runtime_proxy.cri.relay import _wire as w

MASK31 = 0x7FFFFFFF
unpack_header = w.FRAME_HEADER.unpack_from
unpack_u32 = w.U32.unpack_from
# A DATA or HEADERS frame whose content is not its whole payload.
PAD_OR_PRIORITY = w.FLAG_PADDED | w.FLAG_PRIORITY
# Largest decoded header list the relay accepts from either side.
HEADER_LIST_LIMIT = 1 << 20


class FrameError(Exception):
    """A frame the relay cannot accept; ends the connection it came from with GOAWAY(code)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


class FrameWalk:
    """One direction's pass over the whole frames of each read, and the span of them that passes
    unchanged. A session keeps one per direction and walks each read with ``frames``.

    ``frames`` yields ``(type, flags, stream id, length)`` for each whole frame, in order; while
    the caller handles a frame, ``pos`` and ``end`` are its first byte and the byte after it.
    A frame longer than ``limit`` is a FRAME_SIZE_ERROR; a partial frame at the end of the read
    ends the walk with ``pos`` on it. When the caller stops iterating early, ``pos`` is the
    first frame not consumed.

    Frames the caller leaves alone stay in the current span (``start`` up to the frame being
    handled) and reach ``out`` as one view of the read, without a copy. ``take`` cuts the
    current frame out of the span (the caller holds, drops or rewrites it), ``cut`` does so and
    returns a copy of it, ``flush`` ends the span before the current frame (so what the caller
    appends to ``out`` next goes after the frames before it; after the walk, before the first
    byte not consumed), ``keep`` ends the span after it. ``view`` is the read as a
    ``memoryview``, made on first use (a read that passes whole needs none); ``finish``
    releases it, so that a ``bytearray`` read can be resized again.
    """

    __slots__ = ("buf", "end", "mv", "n", "out", "pos", "side", "start")
    buf: bytes | bytearray
    mv: memoryview | None
    out: list[bytes | memoryview]

    def __init__(self, side: str) -> None:
        self.side = side
        self.buf = b""
        self.mv = None
        self.n = self.pos = self.end = self.start = 0
        self.out = []

    def frames(
        self, buf: bytes | bytearray, pos: int, limit: int, out: list[bytes | memoryview]
    ) -> Iterator[tuple[int, int, int, int]]:
        """Walk ``buf`` from ``pos``, each frame at most ``limit`` long; the spans go to ``out``."""
        self.buf = buf
        self.mv = None
        self.n = n = len(buf)
        self.pos = self.end = pos
        self.start = 0
        self.out = out
        while n - pos >= 9:
            lt, flags, sid = unpack_header(buf, pos)
            length = lt >> 8
            if length > limit:
                raise FrameError(w.FRAME_SIZE_ERROR, f"{self.side} frame of {length} bytes")
            end = pos + 9 + length
            if end > n:
                return
            self.end = end
            yield lt & 0xFF, flags, sid & MASK31, length
            self.pos = pos = end

    def view(self) -> memoryview:
        """The read as a ``memoryview`` (a non-empty view is true: ``mv or view()`` makes it once)."""
        mv = self.mv
        if mv is None:
            mv = self.mv = memoryview(self.buf)
        return mv

    def finish(self) -> None:
        """Release the view of the read (the caller checks that one was made)."""
        if self.mv is not None:
            self.mv.release()
            self.mv = None

    def flush(self) -> None:
        """End the span just before the current frame."""
        pos = self.pos
        if pos > self.start:
            self.out.append((self.mv or self.view())[self.start : pos])
        self.start = pos

    def take(self) -> None:
        """Cut the current frame out of the span."""
        pos = self.pos
        if pos > self.start:
            self.out.append((self.mv or self.view())[self.start : pos])
        self.start = self.end

    def keep(self) -> None:
        """End the span just after the current frame."""
        self.out.append((self.mv or self.view())[self.start : self.end])
        self.start = self.end

    def cut(self) -> bytes:
        """Cut the current frame out of the span (``take``) and return a copy of it."""
        pos = self.pos
        if pos > self.start:
            self.out.append((self.mv or self.view())[self.start : pos])
        self.start = self.end
        buf = self.buf
        if type(buf) is bytes:
            return buf[self.pos : self.end]
        return bytes((self.mv or self.view())[self.pos : self.end])

    def payload(self) -> memoryview:
        """The current frame's payload, as a view of the read."""
        return (self.mv or self.view())[self.pos + 9 : self.end]


class MirrorDecoder:
    """An ``hpack.Decoder`` kept in step with one direction's encoder, plus a cache.

    A block whose bytes are all >= 0x80 is a run of one-byte *indexed* fields: decoding it
    cannot change the dynamic table, and the same bytes mean the same headers until some
    other block changes the table. Such blocks (a steady stream of identical calls produces
    them) are served from a cache that is emptied whenever a block that may change the table
    is decoded; ``advance`` skips them altogether.
    """

    __slots__ = ("_cache", "dec")

    def __init__(self) -> None:
        self.dec = Decoder(max_header_list_size=HEADER_LIST_LIMIT)
        self._cache: dict[bytes, list[tuple[bytes, bytes]]] = {}

    def decode(self, block: bytes) -> list[tuple[bytes, bytes]]:
        if block and min(block) >= 0x80:
            hit = self._cache.get(block)
            if hit is None:
                hit = list(self.dec.decode(block, raw=True))
                if len(self._cache) < 256:
                    self._cache[block] = hit
            return hit
        if self._cache:
            self._cache.clear()
        return list(self.dec.decode(block, raw=True))

    def advance(self, block: bytes) -> None:
        """Keep the table in step with a block whose headers are not needed."""
        if block and min(block) >= 0x80:
            return
        if self._cache:
            self._cache.clear()
        self.dec.decode(block, raw=True)


def padded(buf: bytes | bytearray | memoryview, pos: int, length: int, flags: int, headers: bool) -> tuple[int, int]:
    """Start and end of a DATA or HEADERS frame's content, without padding and priority."""
    a = pos + 9
    b = a + length
    if flags & w.FLAG_PADDED:
        if length < 1:
            raise FrameError(w.PROTOCOL_ERROR, "padded frame too short")
        pad = buf[a]
        a += 1
        b -= pad
    if headers and flags & w.FLAG_PRIORITY:
        a += 5
    if b < a:
        raise FrameError(w.PROTOCOL_ERROR, "padding exceeds the frame")
    return a, b


def encode_block(headers: Iterable[tuple[bytes, bytes]]) -> bytes:
    enc = w.encode_field
    return b"".join(enc(n, v, isinstance(h, NeverIndexedHeaderTuple)) for h in headers for n, v in (h,))


def response_message(data: bytearray | None, encoding: bytes) -> bytes | None:
    if data is None or len(data) < 5:
        return None
    size = w.u32(data, 1)
    if 5 + size != len(data):
        return None
    body = bytes(data[5:])
    if data[0] & 1:
        if encoding == b"gzip":
            try:
                return zlib.decompress(body, wbits=31)
            except zlib.error:
                return None
        if encoding == b"deflate":
            try:
                return zlib.decompress(body)
            except zlib.error:
                return None
        return None
    return body
