"""Refuse mode: the minimal HTTP/2 server a session becomes when the backend is unreachable.

``Session`` (``_session``) switches to it when the upstream connection cannot be opened. It
sends empty SETTINGS, acknowledges the client's SETTINGS and PINGs, answers every new stream
with trailers-only UNAVAILABLE, and closes the connection ``REFUSE_LINGER`` seconds after its
last answer (``REFUSE_IDLE`` seconds after it started when it answered nothing). Because the
connection became ready, gRPC clients reconnect on their next call without backoff.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from hpack import HPACKError

from runtime_proxy.cri.relay import _wire as w
from runtime_proxy.cri.relay._frames import MASK31, FrameError, padded, unpack_header
from runtime_proxy.cri.relay._limits import hit
from runtime_proxy.cri.relay._metrics import observe_call
from runtime_proxy.cri.relay._streams import TIMED

if TYPE_CHECKING:
    from runtime_proxy.cri.relay._state import SessionState

# Close the connection this long after the last answer; or after this long without one.
REFUSE_LINGER = 0.05
REFUSE_IDLE = 1.0


class RefuseServer:
    """Answers one session's client while the backend is unreachable."""

    __slots__ = ("_answered", "_block", "_block_sid", "_message", "_s", "_timer")

    def __init__(self, session: SessionState, message: str) -> None:
        self._s = session
        self._message = message
        self._answered = False
        self._block_sid = 0
        self._block = bytearray()
        assert session.down is not None
        session.down.write(w.settings())
        self._timer: asyncio.TimerHandle = session._loop.call_later(REFUSE_IDLE, session.close)

    def cancel(self) -> None:
        """Stop the close timer (the session is closing anyway)."""
        self._timer.cancel()

    def feed(self) -> None:
        """Answer the whole frames in the session's client buffer, and drop them from it."""
        s = self._s
        buf = s._cin
        pos = 0
        out: list[bytes] = []
        if not s._preface_ok:
            if len(buf) < len(w.PREFACE):
                return
            if bytes(buf[: len(w.PREFACE)]) != w.PREFACE:
                s.close(w.PROTOCOL_ERROR)
                return
            s._preface_ok = True
            pos = len(w.PREFACE)
        n = len(buf)
        while n - pos >= 9:
            lt, flags, sid = unpack_header(buf, pos)
            end = pos + 9 + (lt >> 8)
            if end > n:
                break
            if lt >> 8 > w.DEFAULT_MAX_FRAME:  # this server's SETTINGS are empty
                s.close(w.FRAME_SIZE_ERROR)
                return
            ftype = lt & 0xFF
            sid &= MASK31
            if ftype == w.SETTINGS and not flags & w.FLAG_ACK:
                out.append(w.SETTINGS_ACK)
            elif ftype == w.PING and not flags & w.FLAG_ACK and end - pos == 17:
                out.append(w.frame(w.PING, w.FLAG_ACK, 0, bytes(buf[pos + 9 : end])))
            elif ftype in (w.HEADERS, w.CONTINUATION):
                if ftype == w.HEADERS:
                    self._block_sid = sid
                    try:
                        a, b = padded(buf, pos, end - pos - 9, flags, True)
                    except FrameError as err:
                        s.close(err.code)
                        return
                    self._block = bytearray(buf[a:b])
                else:
                    self._block += buf[pos + 9 : end]
                if len(self._block) > s._block_limit:
                    hit("header_block")
                    s.close(w.ENHANCE_YOUR_CALM)
                    return
                if flags & w.FLAG_END_HEADERS:
                    block, self._block = bytes(self._block), bytearray()
                    try:  # for the metrics (and to keep the decoder in step)
                        headers = s._c_dec.decode(block)
                    except HPACKError:
                        s.close(w.COMPRESSION_ERROR)
                        return
                    if self._block_sid > s.c_max_sid:
                        s.c_max_sid = self._block_sid
                        out.append(s._error_frames(s.c_max_sid, w.GRPC_UNAVAILABLE, self._message, False))
                        self._answered = True
                        method, kind = s._method_kind(headers)
                        if kind & TIMED:
                            observe_call(method, "UNAVAILABLE", 0.0)
            pos = end
        del buf[:pos]
        if self._answered:
            self._timer.cancel()
            self._timer = s._loop.call_later(REFUSE_LINGER, s.close)
        if out and s.down is not None:
            s.down.write(b"".join(out))
