"""What the client sends: the connection preface and every frame, parsed in one pass per read.

Runs of frames that pass unchanged are written upstream as one span, without a copy when a read
holds only whole frames; intercepted streams' frames are taken out of the span (``_intercept``).
Every request header block is decoded to read ``:path``.
"""

from __future__ import annotations

from hpack import HPACKError

from runtime_proxy.cri.methods import is_known_unary
from runtime_proxy.cri.relay import _wire as w
from runtime_proxy.cri.relay._frames import PAD_OR_PRIORITY, FrameError, FrameWalk, padded
from runtime_proxy.cri.relay._intercept import Interception
from runtime_proxy.cri.relay._metrics import perf
from runtime_proxy.cri.relay._state import PAUSE_GATED, RELAY
from runtime_proxy.cri.relay._streams import (
    COLLECT,
    ICPT,
    LOCAL,
    TIMED,
    Intercepted,
)


class ClientSide(Interception):
    """Client-to-server parsing (a ``Session`` unit)."""

    def _client_input(self, data: bytes | None = None) -> None:
        buf: bytes | bytearray = self._cin if data is None else data
        try:
            pos = self._parse_client(buf)
        except FrameError as err:
            self._fail_client(err)
            return
        except HPACKError as err:
            self._fail_client(FrameError(w.COMPRESSION_ERROR, f"request header block: {err}"))
            return
        if self.state != RELAY:
            return
        if data is None:
            del self._cin[:pos]
        elif pos < len(data):
            self._cin += memoryview(data)[pos:]
        if self._gated:
            self._pause_down(PAUSE_GATED)
        if self._resume and self._up_q is None:
            self._resume = False
            if self._inject_q:
                self._pump()

    def _parse_client(self, buf: bytes | bytearray) -> int:
        """Handle the whole frames of one read and write what passes; returns the bytes used."""
        pos = 0
        if not self._preface_ok:
            if len(buf) < 24:
                if bytes(buf) != w.PREFACE[: len(buf)]:
                    raise FrameError(w.PROTOCOL_ERROR, "bad connection preface")
                return 0
            if bytes(buf[:24]) != w.PREFACE:
                raise FrameError(w.PROTOCOL_ERROR, "bad connection preface")
            self._preface_ok = True
            pos = 24
        up: list[bytes | memoryview] = []
        down: list[bytes | memoryview] = []
        self._up_q = up
        self._down_q = down
        walk = self._c_walk
        try:
            for ftype, flags, sid, length in walk.frames(buf, pos, self._up_frame_limit, up):
                if self._c_block is not None and ftype != w.CONTINUATION:
                    raise FrameError(w.PROTOCOL_ERROR, "header block interrupted")
                if ftype == w.DATA:
                    if sid and length <= self._up_window and not (self._icpt and sid in self._icpt):
                        self._up_window -= length  # passes in the span
                    elif not self._client_data(walk, flags, sid, length, down):
                        break  # gated: the frame waits for the server's window
                elif ftype == w.HEADERS:
                    self._client_headers(walk, flags, sid, length)
                elif ftype == w.CONTINUATION:
                    self._client_continuation(walk, flags, sid)
                elif ftype == w.RST_STREAM:
                    self._client_reset(walk, sid, length)
                elif ftype == w.WINDOW_UPDATE:
                    if length != 4:
                        raise FrameError(w.FRAME_SIZE_ERROR, "bad WINDOW_UPDATE")
                elif ftype == w.SETTINGS:
                    self._client_settings_frame(walk, flags, sid, length)
                elif ftype == w.PING:
                    if sid != 0 or length != 8:
                        raise FrameError(w.PROTOCOL_ERROR, "bad PING")
                elif ftype == w.GOAWAY:
                    if sid != 0 or length < 8:
                        raise FrameError(w.PROTOCOL_ERROR, "bad GOAWAY")
                elif ftype == w.PRIORITY:
                    if sid == 0 or length != 5:
                        raise FrameError(w.PROTOCOL_ERROR, "bad PRIORITY")
                elif ftype == w.PUSH_PROMISE:
                    raise FrameError(w.PROTOCOL_ERROR, "PUSH_PROMISE from a client")
            if self._due_before and self.state == RELAY:
                # What the hooks send goes after everything parsed so far, in the same write.
                walk.flush()
                self._start_due()
            if self.state != RELAY:
                return walk.pos
            # What the read produced: up in one write, down in another.
            self._up_q = self._down_q = None
            if walk.start == 0 and walk.pos == walk.n and not up and type(buf) is bytes:
                self.up.write(buf)  # type: ignore[union-attr]  # the read, whole
            else:
                walk.flush()
                if up:
                    self.up.write(b"".join(up))  # type: ignore[union-attr]
            if down:
                self.down.write(b"".join(down))  # type: ignore[union-attr]
            return walk.pos
        finally:
            self._up_q = self._down_q = None
            up.clear()
            down.clear()
            if walk.mv is not None:
                walk.finish()
            walk.buf = b""

    def _client_data(self, walk: FrameWalk, flags: int, sid: int, length: int, down: list[bytes | memoryview]) -> bool:
        """A request DATA frame off the plain path (``_parse_client``: stream 0, an intercepted
        stream, or past the server's window); False when it has to wait for the window."""
        if sid == 0:
            raise FrameError(w.PROTOCOL_ERROR, "DATA on stream 0")
        icpt = self._icpt
        if icpt and sid in icpt:
            if length > self._up_window and length > self._up_window + self._debt - self._owed:
                self._flow_control_violation()
            walk.take()
            self._client_icpt_data(icpt[sid], walk.view(), walk.pos, length, flags, down)
            return True
        if length > self._up_window:
            # The client's view of the window is the server's plus the debt,
            # less the window the relay owes it and has not yet returned.
            if length > self._up_window + self._debt - self._owed:
                self._flow_control_violation()
            self._gated = True
            return False
        self._up_window -= length
        return True

    def _client_headers(self, walk: FrameWalk, flags: int, sid: int, length: int) -> None:
        if sid == 0:
            raise FrameError(w.PROTOCOL_ERROR, "HEADERS on stream 0")
        buf = walk.buf
        if flags & PAD_OR_PRIORITY:
            a, b = padded(buf, walk.pos, length, flags, True)
            if length > self._block_limit and b - a > self._block_limit:
                self._block_too_large("request")
        else:
            a, b = walk.pos + 9, walk.end
            if length > self._block_limit:
                self._block_too_large("request")
        self._c_block_sid = sid
        self._c_block_flags = flags
        if self._held:  # header blocks keep their order (HPACK, stream ids)
            walk.flush()
            walk.out.extend(self._flush_held(None))
        if not flags & w.FLAG_END_HEADERS:
            self._c_block = bytearray(walk.view()[a:b])
        elif sid > self.c_max_sid:
            block = bytes(buf[a:b])
            st = self._client_block_done(block)
            if st is not None:  # keep the HEADERS until the request can follow
                st.held_headers = walk.cut()
                st.held_pure = not block or min(block) >= 0x80
                self._held.append(st)
                if len(self._icpt) > self._icpt_cap:
                    self._too_many(st)
        else:
            walk.keep()  # the block may make the relay write upstream
            self._client_block_done(bytes(buf[a:b]))

    def _client_continuation(self, walk: FrameWalk, flags: int, sid: int) -> None:
        if self._c_block is None or sid != self._c_block_sid:
            raise FrameError(w.PROTOCOL_ERROR, "unexpected CONTINUATION")
        self._c_block += walk.payload()
        if len(self._c_block) > self._block_limit:
            self._block_too_large("request")
        if flags & w.FLAG_END_HEADERS:
            if self._icpt:
                walk.keep()
            block, self._c_block = bytes(self._c_block), None
            st = self._client_block_done(block)
            if st is not None and len(self._icpt) > self._icpt_cap:
                self._too_many(st)

    def _client_reset(self, walk: FrameWalk, sid: int, length: int) -> None:
        if length != 4 or sid == 0:
            raise FrameError(w.PROTOCOL_ERROR, "bad RST_STREAM")
        if self._held:
            walk.flush()
            walk.out.extend(self._flush_held(None))
        self.live.pop(sid, None)
        if self._timed:
            self._finish(sid, "CANCELLED")
        st = self._icpt.pop(sid, None) if self._icpt else None
        if st is not None:
            local = st.phase == LOCAL
            self._cancel_icpt(st)
            if local:
                walk.take()
        elif sid in self._dropped:
            walk.take()

    def _client_settings_frame(self, walk: FrameWalk, flags: int, sid: int, length: int) -> None:
        if sid != 0 or length % 6:
            raise FrameError(w.PROTOCOL_ERROR, "bad SETTINGS")
        if self._held:  # e.g. an ACK of a header table size must follow the blocks
            walk.flush()
            walk.out.extend(self._flush_held(None))
        if flags & w.FLAG_ACK:
            if self._server_settings_q:  # the client now uses the server's settings
                self._server_settings(self._server_settings_q.pop(0))
        else:
            self._client_settings_q.append(w.parse_settings(walk.payload()))
            self._client_settings_early(self._client_settings_q[-1])

    def _client_block_done(self, block: bytes) -> Intercepted | None:
        """Decode a request header block; returns the new stream if it is intercepted."""
        sid = self._c_block_sid
        end_stream = bool(self._c_block_flags & w.FLAG_END_STREAM)
        headers = self._c_dec.decode(block)
        if sid > self.c_max_sid:
            if not sid & 1:
                raise FrameError(w.PROTOCOL_ERROR, f"client opened even stream {sid}")
            self.c_max_sid = sid
            self.live[sid] = 0
            method, kind = self._method_kind(headers)
            if kind & TIMED:
                self._timed[sid] = (method, perf())
            if kind & ICPT:
                st = Intercepted(sid, method, self._up_init_window, self._up_init_window)
                self._icpt[sid] = st
                if end_stream:
                    st.hdr_end_stream = True
                    if len(self._icpt) <= self._icpt_cap:
                        self._request_complete(st)
                return st
            return None
        # A header block on a stream the client opened earlier: request trailers.
        old = self._icpt.get(sid)
        if old is not None and old.phase == COLLECT:
            # The block has to go upstream in order (HPACK), ahead of the request the relay
            # still holds, so the request cannot be rebuilt: refuse the call.
            old.client_ended = end_stream
            self._answer_local(old, w.GRPC_INTERNAL, "request trailers are not supported on intercepted methods")
        return None

    def _method_kind(self, headers: list[tuple[bytes, bytes]]) -> tuple[str, int]:
        """The method a request header block names, and its ``ICPT``/``TIMED`` flags."""
        if headers is self._kind_of[0]:  # the same cached block as last time (``MirrorDecoder``)
            return self._kind_of[1]
        path = b""
        for name, value in headers:
            if name == b":path":
                path = value
                break
        hit = self._icache.get(path)
        if hit is None:
            method = path.decode("latin-1")
            kind = ICPT if self._interceptor.intercepts(method) else 0
            if kind or is_known_unary(method):
                kind |= TIMED
            hit = (method, kind)
            if len(self._icache) < 4096:
                self._icache[path] = hit
        self._kind_of = (headers, hit)
        return hit
