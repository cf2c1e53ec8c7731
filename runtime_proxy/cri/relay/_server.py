"""What the server sends: every frame, parsed in one pass per read.

Response header blocks pass verbatim and are decoded after the write while the relay has
neither dropped nor held one; after that every block is re-encoded (``docs/transports.md``).
Intercepted streams' responses are held or copied for ``after`` (``_intercept``).
"""

from __future__ import annotations

import contextlib

from hpack import HPACKError

from runtime_proxy.cri.relay import _wire as w
from runtime_proxy.cri.relay._frames import (
    MASK31,
    PAD_OR_PRIORITY,
    FrameError,
    FrameWalk,
    encode_block,
    padded,
    unpack_u32,
)
from runtime_proxy.cri.relay._intercept import Interception
from runtime_proxy.cri.relay._metrics import RST_CODES, status_of
from runtime_proxy.cri.relay._state import CONNECTING, HOLD_LIMIT, MAX_INTERCEPTED_RESPONSE, PAUSE_GATED, RELAY
from runtime_proxy.cri.relay._streams import (
    AFTER,
    SENT,
)


class ServerSide(Interception):
    """Server-to-client parsing (a ``Session`` unit)."""

    def server_data(self, data: bytes) -> None:
        if self.state != RELAY:
            if self.state == CONNECTING:  # cannot happen (``upstream_made`` comes first); keep it
                self._sin += data
            return
        if self._sin:
            self._sin += data
            buf: bytes | bytearray = self._sin
        else:
            buf = data
        self._resume = False
        try:
            pos = self._parse_server(buf)
            if self._s_pending:
                self._drain_server_decode()
        except FrameError as err:
            self._fail_server(err)
            return
        except HPACKError as err:
            self._fail_server(FrameError(w.COMPRESSION_ERROR, f"response header block: {err}"))
            return
        if self.state != RELAY:
            return
        if buf is self._sin:
            del self._sin[:pos]
        elif pos < len(buf):
            self._sin += memoryview(buf)[pos:]
        if self._resume:
            if self._inject_q:
                self._pump()
            if self._gated:
                self._gated = False
                self._client_input()
                if not self._gated:
                    self._resume_down(PAUSE_GATED)

    def _parse_server(self, buf: bytes | bytearray) -> int:
        """Handle the whole frames of one read and write what passes; returns the bytes used."""
        down: list[bytes | memoryview] = []
        up: list[bytes | memoryview] = []
        self._up_q = up
        self._down_q = down
        walk = self._s_walk
        try:
            for ftype, flags, sid, length in walk.frames(buf, 0, self._down_frame_limit, down):
                if self._s_block is not None and ftype != w.CONTINUATION:
                    raise FrameError(w.PROTOCOL_ERROR, "header block interrupted")
                if ftype == w.DATA:
                    if not sid or self._dropped or self._icpt or flags & w.FLAG_END_STREAM:
                        self._server_data(walk, flags, sid, length, up)  # else it passes in the span
                elif ftype == w.HEADERS:
                    self._server_headers(walk, flags, sid, length)
                elif ftype == w.CONTINUATION:
                    self._server_continuation(walk, flags, sid)
                elif ftype == w.RST_STREAM:
                    self._server_reset(walk, sid, length)
                elif ftype == w.WINDOW_UPDATE:
                    if sid or length != 4 or self._debt:
                        self._server_window_update(walk, sid, length)
                    else:  # the connection's window, nothing owed: it passes in the span
                        self._up_window += unpack_u32(buf, walk.pos + 9)[0] & MASK31
                        self._resume = True
                elif ftype == w.SETTINGS:
                    if sid != 0 or length % 6:
                        raise FrameError(w.PROTOCOL_ERROR, "bad SETTINGS")
                    if flags & w.FLAG_ACK:
                        if self._client_settings_q:
                            self._client_settings(self._client_settings_q.pop(0))
                    else:
                        self._server_settings_q.append(w.parse_settings(walk.payload()))
                        self._server_settings_early(self._server_settings_q[-1])
                elif ftype == w.PING:
                    if sid != 0 or length != 8:
                        raise FrameError(w.PROTOCOL_ERROR, "bad PING")
                elif ftype == w.GOAWAY:
                    self._server_goaway(walk, sid, length)
                elif ftype == w.PUSH_PROMISE:
                    raise FrameError(w.PROTOCOL_ERROR, "PUSH_PROMISE (push is off for gRPC)")
            if self._due_after and self.state == RELAY:
                walk.flush()
                self._start_due()
            if self.state != RELAY:
                return walk.pos
            # What the read produced: down in one write, up in another.
            self._up_q = self._down_q = None
            if walk.start == 0 and walk.pos == walk.n and not down and not self._owed and type(buf) is bytes:
                self.down.write(buf)  # type: ignore[union-attr]  # the read, whole
            else:
                walk.flush()
                if self._owed:  # first, so it never waits behind a full write buffer
                    down.insert(0, self._take_owed())
                if down:
                    self.down.write(b"".join(down))  # type: ignore[union-attr]
            if up:
                self.up.write(b"".join(up))  # type: ignore[union-attr]
            return walk.pos
        finally:
            self._up_q = self._down_q = None
            down.clear()
            up.clear()
            if walk.mv is not None:
                walk.finish()
            walk.buf = b""

    def _server_data(self, walk: FrameWalk, flags: int, sid: int, length: int, up: list[bytes | memoryview]) -> None:
        if sid == 0:
            raise FrameError(w.PROTOCOL_ERROR, "DATA on stream 0")
        dropped = self._dropped
        if dropped and sid in dropped:
            walk.take()
            if length:  # the client never sees it: return the window ourselves
                up.append(w.window_update(0, length))
            return
        st = self._icpt.get(sid) if self._icpt else None
        if st is not None:
            # Response DATA of an intercepted call: copied for ``after``, held while it may be.
            if st.resp is not None:
                a, b = (
                    padded(walk.buf, walk.pos, length, flags, False)
                    if flags & w.FLAG_PADDED
                    else (walk.pos + 9, walk.end)
                )
                if len(st.resp) + (b - a) > MAX_INTERCEPTED_RESPONSE:
                    st.resp = None
                else:
                    st.resp += walk.view()[a:b]
            if st.held_down is not None:
                st.held_down.append(walk.cut())
                st.held_size += length
                if st.held_size > HOLD_LIMIT or flags & w.FLAG_END_STREAM:
                    self._release_down(st, walk.out)
        if flags & w.FLAG_END_STREAM:
            self._server_ended(sid)
            if self._timed:  # no trailers: the caller gets an error
                self._finish(sid, "INTERNAL")

    def _server_headers(self, walk: FrameWalk, flags: int, sid: int, length: int) -> None:
        if sid == 0:
            raise FrameError(w.PROTOCOL_ERROR, "HEADERS on stream 0")
        buf = walk.buf
        if flags & PAD_OR_PRIORITY:
            a, b = padded(buf, walk.pos, length, flags, True)
            if length > self._block_limit and b - a > self._block_limit:
                self._block_too_large("response")
        else:
            a, b = walk.pos + 9, walk.end
            if length > self._block_limit:
                self._block_too_large("response")
        icpt = self._icpt
        dropped = self._dropped
        if (
            flags & w.FLAG_END_HEADERS
            and self.verbatim
            and self._vheld is None
            and not (icpt and sid in icpt)
            and not (dropped and sid in dropped)
        ):
            # Fast path: forward as is, decode after the write (if at all).
            frag = buf[a:b]
            if flags & w.FLAG_END_STREAM and self._timed and sid in self._timed:
                self._s_pending.append((bytes(frag), sid))  # the call's grpc-status
            elif not frag or min(frag) < 0x80:
                self._s_pending.append((bytes(frag), 0))
            if flags & w.FLAG_END_STREAM:
                self.live.pop(sid, None)
            elif sid in self.live:
                self.live[sid] = 1
            return
        raw = walk.cut()
        self._s_block_sid = sid
        self._s_block_flags = flags
        if flags & w.FLAG_END_HEADERS:  # the whole block in this frame
            block = buf[a:b]
            self._server_block_done(walk.out, block if type(block) is bytes else bytes(block), [raw])
        else:
            self._s_block = bytearray(walk.view()[a:b])
            self._s_block_raw = [raw]

    def _server_continuation(self, walk: FrameWalk, flags: int, sid: int) -> None:
        if self._s_block is None or sid != self._s_block_sid:
            raise FrameError(w.PROTOCOL_ERROR, "unexpected CONTINUATION")
        self._s_block_raw.append(walk.cut())
        self._s_block += walk.payload()
        if len(self._s_block) > self._block_limit:
            self._block_too_large("response")
        if flags & w.FLAG_END_HEADERS:
            block, self._s_block = bytes(self._s_block), None
            raw, self._s_block_raw = self._s_block_raw, []
            self._server_block_done(walk.out, block, raw)

    def _server_reset(self, walk: FrameWalk, sid: int, length: int) -> None:
        if length != 4 or sid == 0:
            raise FrameError(w.PROTOCOL_ERROR, "bad RST_STREAM")
        self.live.pop(sid, None)
        if self._timed:
            self._finish(sid, RST_CODES.get(w.u32(walk.buf, walk.pos + 9), "INTERNAL"))
        st = self._icpt.pop(sid, None) if self._icpt else None
        if st is not None:
            self._cancel_icpt(st)
        if self._dropped and sid in self._dropped:
            walk.take()

    def _server_window_update(self, walk: FrameWalk, sid: int, length: int) -> None:
        if length != 4:
            raise FrameError(w.FRAME_SIZE_ERROR, "bad WINDOW_UPDATE")
        inc = unpack_u32(walk.buf, walk.pos + 9)[0] & MASK31
        if sid == 0:
            self._up_window += inc
            self._resume = True
            if self._debt:
                take = min(inc, self._debt)
                self._debt -= take
                walk.take()
                if inc > take:
                    walk.out.append(w.window_update(0, inc - take))
        elif self._icpt and sid in self._icpt:
            # The relay owns the request side of an intercepted stream.
            self._icpt[sid].window += inc
            self._resume = True
            walk.take()

    def _server_goaway(self, walk: FrameWalk, sid: int, length: int) -> None:
        if sid != 0 or length < 8:
            raise FrameError(w.PROTOCOL_ERROR, "bad GOAWAY")
        if self._timed:  # streams above the last one the server took never run
            last = w.u32(walk.buf, walk.pos + 9) & MASK31
            for other in [t for t in self._timed if t > last]:
                self._finish(other, "UNAVAILABLE")

    def _drain_server_decode(self) -> None:
        pending = self._s_pending
        if pending:
            advance = self._s_dec.advance
            for block, sid in pending:
                if sid:
                    self._finish(sid, status_of(self._s_dec.decode(block)))
                else:
                    advance(block)
            pending.clear()

    def _flush_server_decode_quietly(self) -> None:
        with contextlib.suppress(HPACKError):
            self._drain_server_decode()

    def _server_ended(self, sid: int) -> None:
        self.live.pop(sid, None)
        st = self._icpt.get(sid) if self._icpt else None
        if st is not None and st.phase != AFTER:
            del self._icpt[sid]
            self._cancel_icpt(st)

    def _server_block_done(self, down: list[bytes | memoryview], block: bytes, raw: list[bytes]) -> None:
        """A whole response header block (``raw``: its frames as the server sent them)."""
        sid = self._s_block_sid
        flags = self._s_block_flags
        if self._s_pending:  # blocks passed earlier come first in the decoder
            self._drain_server_decode()
        headers = self._s_dec.decode(block)
        end_stream = bool(flags & w.FLAG_END_STREAM)
        vheld = self._vheld
        if vheld is not None and vheld.sid != sid:
            # A block would overtake server blocks kept back verbatim: from now on blocks are
            # re-encoded, so the client's table stays as those kept-back blocks expect.
            self.verbatim = False
            self._vheld = None
        if sid in self._dropped:
            self.verbatim = False  # a server block the client never sees
            return
        st = self._icpt.get(sid)
        if st is not None:
            if not end_stream:
                for name, value in headers:
                    if name == b"grpc-encoding":
                        st.resp_encoding = value
                if st.held_down is not None and st.phase == SENT:
                    if self.verbatim:
                        self._vheld = st
                        st.held_down.append(raw[0] if len(raw) == 1 else b"".join(raw))
                    else:
                        st.held_down.append(w.header_frames(sid, encode_block(headers), False, self._down_max_frame))
                    return
            else:
                status = b""
                for name, value in headers:
                    if name == b"grpc-status":
                        status = value
                        break
                if st.held_down and self._vheld is not st:  # what was kept back goes first
                    self.verbatim = False
                if status == b"0" and st.phase == SENT:
                    if self.verbatim:
                        self._vheld = st
                        st.trailers_raw = raw[0] if len(raw) == 1 else b"".join(raw)
                    st.phase = AFTER
                    st.trailers = headers
                    self._due_after.append(st)  # started when the parse ends (``_start_due``)
                    return
                self._release_down(st, down)
        if self.verbatim:
            down.extend(raw)
        else:
            down.append(w.header_frames(sid, encode_block(headers), end_stream, self._down_max_frame))
        if end_stream:
            self._server_ended(sid)
            if self._timed:
                self._finish(sid, status_of(headers))
        elif sid in self.live:
            self.live[sid] = 1
