"""One relayed connection: kubelet's downstream connection spliced to its own upstream one.

Called by ``RelayTransport`` (``runtime_proxy.cri.relay``), which creates one ``Session`` per
accepted downstream connection. The session opens the upstream connection, copies frames both
ways and passes intercepted calls to the ``CallInterceptor``. The package docstring explains the
design; the comments here explain the bookkeeping.

Terms used below: *client* is the downstream peer (kubelet), *server* the upstream peer
(containerd). "Up" means toward the server, "down" toward the client.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import time
import zlib
from collections.abc import Callable, Coroutine, Generator, Iterable, Sequence
from typing import TYPE_CHECKING, Any, cast

import structlog
from hpack import Decoder, HPACKError, NeverIndexedHeaderTuple

from runtime_proxy import metrics
from runtime_proxy.cri.methods import is_known_unary
from runtime_proxy.cri.relay import _wire as w
from runtime_proxy.cri.relay._limits import Budget, RelayLimits, hit
from runtime_proxy.cri.transport import HookRejected

if TYPE_CHECKING:
    from runtime_proxy.cri.transport import CallInterceptor

log = structlog.get_logger("runtime_proxy.cri.relay")

_MASK31 = 0x7FFFFFFF
_FH = w.FRAME_HEADER
_unpack_header = _FH.unpack_from

# Largest intercepted response the relay copies for ``after`` (the response itself always flows);
# kubelet's and containerd's message limit, 16 MiB, plus the gRPC prefix. The largest request
# is ``RelayLimits.stream_buffer`` (``_limits``).
MAX_INTERCEPTED_RESPONSE = 16 * 1024 * 1024 + 5
# Locally answered streams whose late upstream frames are dropped; oldest forgotten first.
_MAX_DROPPED = 1024
# Response bytes of an intercepted call the relay keeps back with the trailers, at most; well
# below the smallest stream window (65535), so the server never waits for the relay.
_HOLD_LIMIT = 16384
# Refuse mode (backend unreachable): close the connection this long after the last answer.
_REFUSE_LINGER = 0.05
_REFUSE_IDLE = 1.0
_HEADER_LIST_LIMIT = 1 << 20

# gRPC status code names by number, as ``grpc.StatusCode`` names them (the metrics' ``code``).
_CODE_NAMES = (
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
)
# What a caller sees when the server resets a stream, by HTTP/2 error code (gRPC's mapping).
_RST_CODES = {w.CANCEL: "CANCELLED", w.REFUSED_STREAM: "UNAVAILABLE"}
# ``_icache`` flags: the method is intercepted; the method's calls are timed (metrics).
_ICPT = 1
_TIMED = 2

# Request bytes the relay swallowed and owes the client as a connection WINDOW_UPDATE are sent
# with the next write to the client (the answer, usually) instead of in a write of their own,
# unless they reach this many: far below any connection window (65535 at least), so the
# client's window never runs out because of what the relay still owes.
_OWED_FLUSH = 16384

_perf = time.perf_counter
_LATENCY: dict[str, Any] = {}  # method -> its child of metrics.CALL_LATENCY


def _observe(method: str, code: str, seconds: float) -> None:
    """``metrics.observe_call``, with the per-method histogram looked up once."""
    child = _LATENCY.get(method)
    if child is None:
        child = _LATENCY[method] = metrics.CALL_LATENCY.labels(method)
    child.observe(seconds)
    if code != "OK":
        metrics.CALL_ERRORS.labels(method, code).inc()


def _code_name(number: int) -> str:
    return _CODE_NAMES[number] if 0 <= number < len(_CODE_NAMES) else "UNKNOWN"


def _status_of(headers: Iterable[tuple[bytes, bytes]]) -> str:
    """The ``code`` label for a trailer block: its grpc-status, by name."""
    for name, value in headers:
        if name == b"grpc-status":
            try:
                return _code_name(int(value))
            except ValueError:
                return "UNKNOWN"
    return "UNKNOWN"


# Session states.
_CONNECTING, _RELAY, _REFUSE, _CLOSED = range(4)

# Why a side's reading is paused: the client's write buffer is full; the server's write buffer is
# full; a client DATA frame waits for the server's window; the backend connection is not up yet.
_PAUSE_DOWN_FULL = 1
_PAUSE_UP_FULL = 2
_PAUSE_GATED = 4
_PAUSE_EARLY = 8

# Phases of an intercepted stream.
_COLLECT = 0  # buffering the request DATA until END_STREAM
_HOOK = 1  # ``before`` (or ``undecodable``) is running
_INJECT = 2  # rebuilt request is being sent upstream
_SENT = 3  # request fully sent, response flowing
_AFTER = 4  # trailers held while ``after`` runs
_LOCAL = 5  # answered by the relay itself; upstream stream reset
_DONE = 6  # finished or cancelled


class FrameError(Exception):
    """A frame the relay cannot accept; ends the connection it came from with GOAWAY(code)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


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
        self.dec = Decoder(max_header_list_size=_HEADER_LIST_LIMIT)
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


class Intercepted:
    """One intercepted stream."""

    __slots__ = (
        "after_task",
        "client_ended",
        "cwin",
        "hdr_end_stream",
        "held_down",
        "held_headers",
        "held_pure",
        "held_size",
        "off",
        "out",
        "path",
        "phase",
        "req",
        "resp",
        "resp_encoding",
        "sent_msg",
        "sid",
        "trailers",
        "trailers_raw",
        "window",
    )

    def __init__(self, sid: int, path: str, window: int, client_window: int) -> None:
        self.sid = sid  # never changes
        self.path = path  # never changes
        self.phase = _COLLECT  # moves forward only, see the phase constants
        self.req = bytearray()  # request DATA payload while collecting
        self.cwin = client_window  # the client's send window on this stream while collecting
        self.client_ended = False  # client sent END_STREAM
        self.hdr_end_stream = False  # the request HEADERS carried END_STREAM (no body at all)
        self.window = window  # server's send window for this stream, as the relay accounts it
        self.out: bytes = b""  # rebuilt request being injected (counted in the buffer budgets)
        self.off = 0  # bytes of ``out`` already sent
        self.sent_msg: bytes | None = None  # the request message ``before`` returned
        self.resp: bytearray | None = bytearray()  # response DATA copy for ``after``; None = gave up
        self.resp_encoding = b""  # grpc-encoding of the response
        self.trailers: list[tuple[bytes, bytes]] = []  # held trailers
        self.trailers_raw: bytes | None = None  # their frames as the server sent them, if kept so
        self.after_task: asyncio.Task[None] | None = None
        # Request HEADERS frame kept back until the rebuilt request can follow it in one write
        # (None once sent). ``held_pure``: the block cannot change the HPACK table, so it may
        # be dropped altogether if the call is refused.
        self.held_headers: bytes | None = None
        self.held_pure = False
        # Response frames (headers, DATA) kept back so that the answer reaches the client in
        # one piece with its trailers; None once the response passes through instead.
        self.held_down: list[bytes] | None = []
        self.held_size = 0


class Session(asyncio.Protocol):
    """The downstream protocol of one relayed connection, and its upstream half."""

    def __init__(
        self,
        interceptor: CallInterceptor,
        backend: str,
        connect_timeout: float,
        on_closed: Callable[[Session], None],
        *,
        limits: RelayLimits | None = None,
        budget: Budget | None = None,
    ) -> None:
        self._interceptor = interceptor
        self._limits = limits = limits or RelayLimits()
        self._block_limit = limits.header_block
        self._budget = budget or Budget(limits.total_buffer)
        # Request bytes held for this connection's intercepted calls (``req`` and ``out``).
        self.buffered = 0
        # Why reading from each side is paused (``_PAUSE_*`` bits); it resumes when none is left.
        self._down_stop = 0
        self._up_stop = 0
        self._backend = backend
        self._connect_timeout = connect_timeout
        self._on_closed = on_closed
        self._loop = asyncio.get_running_loop()
        self.down: asyncio.Transport | None = None
        self.up: asyncio.Transport | None = None
        self.state = _CONNECTING
        self.draining = False
        self._cin = bytearray()  # client bytes not yet parsed (partial frame, or waiting)
        self._sin = bytearray()  # server bytes not yet parsed
        self._preface_ok = False
        self._gated = False  # client parsing stopped: a DATA frame exceeds the server's window
        # HPACK decoders mirroring each direction's encoder.
        self._c_dec = MirrorDecoder()
        self._s_dec = MirrorDecoder()
        # Server header fragments forwarded, not yet decoded, each with the stream whose call
        # it ends when that call is timed (its grpc-status is wanted), else 0.
        self._s_pending: list[tuple[bytes, int]] = []
        # Header blocks being assembled (HEADERS + CONTINUATION).
        self._c_block: bytearray | None = None
        self._c_block_sid = 0
        self._c_block_flags = 0
        self._s_block: bytearray | None = None
        self._s_block_sid = 0
        self._s_block_flags = 0
        self._s_block_raw: list[bytes] = []
        # Server->client header blocks go verbatim until the relay first holds or drops one;
        # from then on every server block is re-encoded with the relay's literal-only encoder.
        self.verbatim = True
        # The intercepted stream whose kept-back response blocks are the server's own bytes
        # (kept so while ``verbatim``): they reach the client in order, before any later server
        # block; should another block come first, ``verbatim`` ends (see _server_block_done).
        self._vheld: Intercepted | None = None
        self.c_max_sid = 0
        # Streams the server has not finished: sid -> 1 once response headers went down.
        self.live: dict[int, int] = {}
        self._icpt: dict[int, Intercepted] = {}
        self._dropped: dict[int, None] = {}
        self._inject_q: list[Intercepted] = []
        self._held: list[Intercepted] = []  # intercepted streams whose HEADERS are kept back, in order
        self._icache: dict[bytes, tuple[str, int]] = {}  # :path -> (method, _ICPT | _TIMED flags)
        # Calls the metrics time, as the grpc transport does (known unary CRI methods and
        # intercepted ones): sid -> (method, start). Each ends in ``_finish`` with its code.
        self._timed: dict[int, tuple[str, float]] = {}
        # Flow control toward the server. ``_up_window`` is the server's connection receive
        # window as the relay accounts it exactly; ``_debt`` is how far the client's view of
        # that window exceeds it (bytes the relay injected that the server has not yet
        # returned); the relay swallows that much of the server's connection WINDOW_UPDATEs.
        self._up_window = w.DEFAULT_WINDOW
        self._debt = 0
        self._up_init_window = w.DEFAULT_WINDOW
        self._up_max_frame = w.DEFAULT_MAX_FRAME  # largest frame the server accepts
        self._down_max_frame = w.DEFAULT_MAX_FRAME  # largest frame the client accepts
        self._up_frame_limit = w.DEFAULT_MAX_FRAME  # largest seen, for validating client frames
        self._down_frame_limit = w.DEFAULT_MAX_FRAME
        self._server_settings_q: list[list[tuple[int, int]]] = []  # sent by the server, not yet ACKed
        self._client_settings_q: list[list[tuple[int, int]]] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._after_tasks: set[asyncio.Task[None]] = set()
        self._refuse_timer: asyncio.TimerHandle | None = None
        self._refuse_answered = False
        self._refuse_block_sid = 0
        self._refuse_block = bytearray()
        self._closing_up = False
        self._refuse_message = ""
        self._resume = False  # a server WINDOW_UPDATE or SETTINGS may unblock sending
        # Connection window the relay owes the client (swallowed request bytes), see _OWED_FLUSH.
        self._owed = 0
        # Intercepted streams whose hook (``before``; ``after``) became due during the current
        # parse: started when the parse ends, so what they send joins the parse's one write.
        self._due_before: list[Intercepted] = []
        self._due_after: list[Intercepted] = []
        # While a parse runs, frames the relay writes itself join its output in order.
        self._up_q: list[Any] | None = None
        self._down_q: list[Any] | None = None

    # --- asyncio protocol (downstream) -------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.down = cast(asyncio.Transport, transport)  # uvloop's transports are not subclasses
        self._spawn(self._connect())

    def data_received(self, data: bytes) -> None:
        if self.state == _RELAY:
            if self._gated or self._cin:
                self._cin += data
                if not self._gated:
                    self._client_input()
            else:
                self._client_input(data)
        elif self.state == _CONNECTING:
            self._cin += data
            if len(self._cin) > self._limits.early_input:
                self._pause_down(_PAUSE_EARLY)
        elif self.state == _REFUSE:
            self._cin += data
            self._refuse_input()

    def eof_received(self) -> bool | None:
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self._close_all()

    def pause_writing(self) -> None:
        # The client does not read: stop reading what would make more to write to it (the
        # server's frames, and the client's own, which the relay may answer itself).
        self._pause_up(_PAUSE_DOWN_FULL)
        self._pause_down(_PAUSE_DOWN_FULL)

    def resume_writing(self) -> None:
        self._resume_up(_PAUSE_DOWN_FULL)
        self._resume_down(_PAUSE_DOWN_FULL)

    def _pause_down(self, why: int) -> None:
        if not self._down_stop and self.down is not None:
            self.down.pause_reading()
        self._down_stop |= why

    def _resume_down(self, why: int) -> None:
        if self._down_stop & why:
            self._down_stop &= ~why
            if not self._down_stop and self.down is not None and not self.down.is_closing():
                self.down.resume_reading()

    def _pause_up(self, why: int) -> None:
        if not self._up_stop and self.up is not None:
            self.up.pause_reading()
        self._up_stop |= why

    def _resume_up(self, why: int) -> None:
        if self._up_stop & why:
            self._up_stop &= ~why
            if not self._up_stop and self.up is not None and not self.up.is_closing():
                self.up.resume_reading()

    # --- lifecycle -----------------------------------------------------------------------------
    def _spawn(self, coro: Any) -> asyncio.Task[None]:
        task: asyncio.Task[None] = self._loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _start_eager(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None] | None:
        """Run ``coro`` at once until it first waits; only then does it get a task.

        A hook that answers without waiting (no plugin for the stage, say) then costs no trip
        through the event loop, and what it sends joins the write in progress. Python 3.12's
        eager tasks do the same; on 3.11 the part before the first wait runs outside any task
        (``asyncio.current_task()`` is None there), in a context of its own."""
        ctx = contextvars.copy_context()
        try:
            first = ctx.run(coro.send, None)
        except StopIteration:
            return None
        except BaseException:
            # ``_run_before``/``_run_after`` catch everything; this is a relay bug.
            log.exception("relay.task_failed")
            self.close(w.INTERNAL_ERROR)
            return None
        task: asyncio.Task[None] = self._loop.create_task(_resume(coro, first), context=ctx)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _start_due(self) -> None:
        """Start the hooks that became due during the parse that just ended."""
        if self._due_before:
            due, self._due_before = self._due_before, []
            for st in due:
                self._start_eager(self._run_before(st))
        if self._due_after:
            due, self._due_after = self._due_after, []
            for st in due:
                task = self._start_eager(self._run_after(st))
                if task is not None:
                    self._after_tasks.add(task)
                    task.add_done_callback(self._after_tasks.discard)
                    st.after_task = task

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            # A bug in the relay: never let it vanish with the task. The connection cannot be
            # trusted any more, so it ends (the caller reconnects).
            log.error("relay.task_failed", exc_info=task.exception())
            self.close(w.INTERNAL_ERROR)

    async def _connect(self) -> None:
        """Open the upstream connection; on failure answer the client from refuse mode.

        The switch to relaying happens in ``upstream_made``, not here: the server (grpc-go in
        containerd) sends its SETTINGS as soon as it accepts, and uvloop runs I/O callbacks
        before the ready queue, so the upstream ``data_received`` can come before this
        coroutine resumes. Only ``connection_made`` is guaranteed to come first."""
        try:
            async with asyncio.timeout(self._connect_timeout):
                await self._loop.create_unix_connection(lambda: _Upstream(self), self._backend)
        except (OSError, TimeoutError) as exc:
            if self.state == _CONNECTING:
                log.warning("relay.backend_unreachable", backend=self._backend, error=str(exc) or type(exc).__name__)
                self._start_refusing(f"backend unavailable: {exc or 'connect timeout'}")
            return

    def upstream_made(self, transport: asyncio.Transport) -> None:
        """The upstream connection is up: relay from now on (before any upstream byte arrives)."""
        if self.state != _CONNECTING:  # the client went away meanwhile
            transport.close()
            return
        self.up = transport
        self.state = _RELAY
        if self._up_stop:
            transport.pause_reading()
        if self._cin:
            self._client_input()
        self._resume_down(_PAUSE_EARLY)
        if self._sin and self.state == _RELAY:
            self.server_data(b"")

    @property
    def busy(self) -> bool:
        """Streams in flight (used by graceful stop)."""
        return bool(self.live) and self.state == _RELAY

    def start_drain(self) -> None:
        """Tell the client to open no new streams here (GOAWAY with the maximal stream id)."""
        if self.draining:
            return
        self.draining = True
        if self.state == _RELAY and self.down is not None:
            self.down.write(w.goaway(w.MAX_STREAM_ID, w.NO_ERROR))

    def close(self, code: int = w.NO_ERROR) -> None:
        """End the connection now: GOAWAY to the client, both transports closed."""
        if self.state == _CLOSED:
            return
        if self.down is not None and self.state != _CONNECTING:
            self.down.write(w.goaway(self.c_max_sid, code))
        self._close_all()

    def _close_all(self) -> None:
        if self.state == _CLOSED:
            return
        self.state = _CLOSED
        if self._refuse_timer is not None:
            self._refuse_timer.cancel()
        for task in list(self._tasks):
            # ``after`` records what the runtime did: it must finish. Everything else stops.
            if task not in self._after_tasks:
                task.cancel()
        if self.down is not None:
            self.down.close()
        if self.up is not None:
            self.up.close()
        self.live.clear()
        for st in [*self._icpt.values(), *self._inject_q]:
            self._release(st)
        self._budget.held -= self.buffered  # nothing, unless a stream was forgotten while holding
        self.buffered = 0
        if self._timed:
            # Calls cut off with the connection: by the backend going away, or by the client.
            code = "UNAVAILABLE" if self._closing_up else "CANCELLED"
            for sid in list(self._timed):
                self._finish(sid, code)
        self._on_closed(self)

    def _finish(self, sid: int, code: str) -> None:
        """A timed call ended for the caller with ``code``: record it (once)."""
        timed = self._timed.pop(sid, None)
        if timed is not None:
            _observe(timed[0], code, _perf() - timed[1])

    async def wait_tasks(self, timeout: float) -> None:
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=timeout)

    def _fail_client(self, err: FrameError) -> None:
        log.warning("relay.client_protocol_error", error=str(err), code=err.code)
        self.close(err.code)

    def _fail_server(self, err: FrameError) -> None:
        log.warning("relay.backend_protocol_error", error=str(err), code=err.code)
        if self.up is not None:
            self.up.write(w.goaway(0, err.code))
            self.up.close()
        self.upstream_lost("backend protocol error")

    def upstream_lost(self, reason: str) -> None:
        """The upstream connection ended: answer what can be answered, then close."""
        if self.state == _CONNECTING:
            self._start_refusing(f"backend unavailable: {reason}")
            return
        if self.state != _RELAY or self._closing_up:
            return
        self._closing_up = True
        self._flush_server_decode_quietly()
        out = []
        for sid, flags in list(self.live.items()):
            st = self._icpt.get(sid)
            if st is not None and st.phase == _AFTER:
                continue  # its trailers follow when ``after`` ends
            if not flags & 1:
                out.append(self._error_frames(sid, w.GRPC_UNAVAILABLE, f"backend connection lost: {reason}", False))
                del self.live[sid]
                self._finish(sid, "UNAVAILABLE")
        if out and self.down is not None:
            self.down.write(b"".join(out))
        pending = [st.after_task for st in self._icpt.values() if st.after_task is not None]
        if pending:
            self._spawn(self._close_after(pending))
        else:
            self.close()

    async def _close_after(self, pending: Sequence[asyncio.Task[None]]) -> None:
        await asyncio.wait(pending, timeout=10.0)
        self.close()

    # --- refuse mode: backend unreachable -------------------------------------------------------
    def _start_refusing(self, message: str) -> None:
        if self.state not in (_CONNECTING, _RELAY):
            return
        self.state = _REFUSE
        self._refuse_message = message
        self._resume_down(_PAUSE_EARLY)
        assert self.down is not None
        self.down.write(w.settings())
        self._refuse_timer = self._loop.call_later(_REFUSE_IDLE, self.close)
        self._refuse_input()

    def _refuse_input(self) -> None:
        """Act as a minimal HTTP/2 server that answers every stream UNAVAILABLE."""
        buf = self._cin
        pos = 0
        out: list[bytes] = []
        if not self._preface_ok:
            if len(buf) < len(w.PREFACE):
                return
            if bytes(buf[: len(w.PREFACE)]) != w.PREFACE:
                self.close(w.PROTOCOL_ERROR)
                return
            self._preface_ok = True
            pos = len(w.PREFACE)
        n = len(buf)
        while n - pos >= 9:
            lt, flags, sid = _unpack_header(buf, pos)
            end = pos + 9 + (lt >> 8)
            if end > n:
                break
            if lt >> 8 > w.DEFAULT_MAX_FRAME:  # the refuse-mode server's SETTINGS are empty
                self.close(w.FRAME_SIZE_ERROR)
                return
            ftype = lt & 0xFF
            sid &= _MASK31
            if ftype == w.SETTINGS and not flags & w.FLAG_ACK:
                out.append(w.SETTINGS_ACK)
            elif ftype == w.PING and not flags & w.FLAG_ACK and end - pos == 17:
                out.append(w.frame(w.PING, w.FLAG_ACK, 0, bytes(buf[pos + 9 : end])))
            elif ftype in (w.HEADERS, w.CONTINUATION):
                if ftype == w.HEADERS:
                    self._refuse_block_sid = sid
                    try:
                        a, b = _padded(buf, pos, end - pos - 9, flags, True)
                    except FrameError as err:
                        self.close(err.code)
                        return
                    self._refuse_block = bytearray(buf[a:b])
                else:
                    self._refuse_block += buf[pos + 9 : end]
                if len(self._refuse_block) > self._block_limit:
                    hit("header_block")
                    self.close(w.ENHANCE_YOUR_CALM)
                    return
                if flags & w.FLAG_END_HEADERS:
                    block, self._refuse_block = bytes(self._refuse_block), bytearray()
                    try:  # for the metrics (and to keep the decoder in step)
                        headers = self._c_dec.decode(block)
                    except HPACKError:
                        self.close(w.COMPRESSION_ERROR)
                        return
                    if self._refuse_block_sid > self.c_max_sid:
                        self.c_max_sid = self._refuse_block_sid
                        out.append(self._error_frames(self.c_max_sid, w.GRPC_UNAVAILABLE, self._refuse_message, False))
                        self._refuse_answered = True
                        method, kind = self._method_kind(headers)
                        if kind & _TIMED:
                            _observe(method, "UNAVAILABLE", 0.0)
            pos = end
        del buf[:pos]
        if self._refuse_answered and self._refuse_timer is not None:
            self._refuse_timer.cancel()
            self._refuse_timer = self._loop.call_later(_REFUSE_LINGER, self.close)
        if out and self.down is not None:
            self.down.write(b"".join(out))

    # --- client -> server ----------------------------------------------------------------------
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
        if self.state != _RELAY:
            return
        if data is None:
            del self._cin[:pos]
        elif pos < len(data):
            self._cin += memoryview(data)[pos:]
        if self._gated:
            self._pause_down(_PAUSE_GATED)
        if self._resume and self._up_q is None:
            self._resume = False
            self._pump()

    def _parse_client(self, buf: bytes | bytearray) -> int:
        n = len(buf)
        pos = 0
        if not self._preface_ok:
            if n < 24:
                if bytes(buf) != w.PREFACE[:n]:
                    raise FrameError(w.PROTOCOL_ERROR, "bad connection preface")
                return 0
            if bytes(buf[:24]) != w.PREFACE:
                raise FrameError(w.PROTOCOL_ERROR, "bad connection preface")
            self._preface_ok = True
            pos = 24
        start = 0
        mv = memoryview(buf)
        up: list[Any] = []
        down: list[Any] = []
        self._up_q = up
        self._down_q = down
        icpt = self._icpt
        limit = self._up_frame_limit
        try:
            while n - pos >= 9:
                lt, flags, sid = _unpack_header(buf, pos)
                length = lt >> 8
                if length > limit:
                    raise FrameError(w.FRAME_SIZE_ERROR, f"client frame of {length} bytes")
                end = pos + 9 + length
                if end > n:
                    break
                ftype = lt & 0xFF
                sid &= _MASK31
                if self._c_block is not None and ftype != w.CONTINUATION:
                    raise FrameError(w.PROTOCOL_ERROR, "header block interrupted")
                if ftype == w.DATA:
                    if sid == 0:
                        raise FrameError(w.PROTOCOL_ERROR, "DATA on stream 0")
                    if icpt and sid in icpt:
                        if length > self._up_window + self._debt - self._owed:
                            self._flow_control_violation()
                        if pos > start:
                            up.append(mv[start:pos])
                        start = end
                        self._client_icpt_data(icpt[sid], mv, pos, length, flags, down)
                    else:
                        if length > self._up_window:
                            # The client's view of the window is the server's plus the debt,
                            # less the window the relay owes it and has not yet returned.
                            if length > self._up_window + self._debt - self._owed:
                                self._flow_control_violation()
                            self._gated = True
                            break
                        self._up_window -= length
                elif ftype == w.HEADERS:
                    if sid == 0:
                        raise FrameError(w.PROTOCOL_ERROR, "HEADERS on stream 0")
                    a, b = _padded(buf, pos, length, flags, True)
                    if length > self._block_limit and b - a > self._block_limit:
                        self._block_too_large("request")
                    self._c_block_sid = sid
                    self._c_block_flags = flags
                    if self._held:  # header blocks keep their order (HPACK, stream ids)
                        if pos > start:
                            up.append(mv[start:pos])
                        start = pos
                        up.extend(self._flush_held(None))
                    if not flags & w.FLAG_END_HEADERS:
                        self._c_block = bytearray(mv[a:b])
                    elif sid > self.c_max_sid:
                        block = bytes(buf[a:b])
                        st = self._client_block_done(block)
                        if st is not None:  # keep the HEADERS until the request can follow
                            if pos > start:
                                up.append(mv[start:pos])
                            start = end
                            st.held_headers = bytes(mv[pos:end])
                            st.held_pure = not block or min(block) >= 0x80
                            self._held.append(st)
                            if len(icpt) > self._limits.intercepted_streams:
                                self._too_many(st)
                    else:
                        up.append(mv[start:end])  # the block may make the relay write upstream
                        start = end
                        self._client_block_done(bytes(buf[a:b]))
                elif ftype == w.CONTINUATION:
                    if self._c_block is None or sid != self._c_block_sid:
                        raise FrameError(w.PROTOCOL_ERROR, "unexpected CONTINUATION")
                    self._c_block += mv[pos + 9 : end]
                    if len(self._c_block) > self._block_limit:
                        self._block_too_large("request")
                    if flags & w.FLAG_END_HEADERS:
                        if icpt:
                            up.append(mv[start:end])
                            start = end
                        block, self._c_block = bytes(self._c_block), None
                        st = self._client_block_done(block)
                        if st is not None and len(icpt) > self._limits.intercepted_streams:
                            self._too_many(st)
                elif ftype == w.RST_STREAM:
                    if length != 4 or sid == 0:
                        raise FrameError(w.PROTOCOL_ERROR, "bad RST_STREAM")
                    if self._held:
                        if pos > start:
                            up.append(mv[start:pos])
                        start = pos
                        up.extend(self._flush_held(None))
                    self.live.pop(sid, None)
                    if self._timed:
                        self._finish(sid, "CANCELLED")
                    st = icpt.pop(sid, None) if icpt else None
                    if st is not None:
                        local = st.phase == _LOCAL
                        self._cancel_icpt(st)
                        if local:
                            if pos > start:
                                up.append(mv[start:pos])
                            start = end
                    elif sid in self._dropped:
                        if pos > start:
                            up.append(mv[start:pos])
                        start = end
                elif ftype == w.WINDOW_UPDATE:
                    if length != 4:
                        raise FrameError(w.FRAME_SIZE_ERROR, "bad WINDOW_UPDATE")
                elif ftype == w.SETTINGS:
                    if sid != 0 or length % 6:
                        raise FrameError(w.PROTOCOL_ERROR, "bad SETTINGS")
                    if self._held:  # e.g. an ACK of a header table size must follow the blocks
                        if pos > start:
                            up.append(mv[start:pos])
                        start = pos
                        up.extend(self._flush_held(None))
                    if flags & w.FLAG_ACK:
                        if self._server_settings_q:  # the client now uses the server's settings
                            self._server_settings(self._server_settings_q.pop(0))
                    else:
                        self._client_settings_q.append(w.parse_settings(mv[pos + 9 : end]))
                        self._client_settings_early(self._client_settings_q[-1])
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
                pos = end
            if self._due_before and self.state == _RELAY:
                # What the hooks send goes after everything parsed so far, in the same write.
                if pos > start:
                    up.append(mv[start:pos])
                start = pos
                self._start_due()
            if self.state != _RELAY:
                return pos
            self._up_q = self._down_q = None
            if start == 0 and pos == n and not up and isinstance(buf, bytes):
                self.up.write(buf)  # type: ignore[union-attr]
            else:
                if pos > start:
                    up.append(mv[start:pos])
                if up:
                    self.up.write(b"".join(up))  # type: ignore[union-attr]
            if down:
                self.down.write(b"".join(down))  # type: ignore[union-attr]
            return pos
        finally:
            self._up_q = self._down_q = None
            up.clear()
            down.clear()
            mv.release()

    # SETTINGS bind the side that receives them from the moment it acknowledges them: the relay
    # applies the client's settings (to what it sends the client) when the server's ACK passes,
    # and the server's when the client's ACK passes. Limits used only to check incoming frames
    # or header blocks are widened at once, as the sender may use them before the ACK arrives.
    def _client_settings_early(self, pairs: list[tuple[int, int]]) -> None:
        for key, value in pairs:
            if key == w.SETTINGS_MAX_FRAME_SIZE:
                self._down_frame_limit = max(self._down_frame_limit, value)
            elif key == w.SETTINGS_HEADER_TABLE_SIZE:
                self._s_dec.dec.max_allowed_table_size = max(self._s_dec.dec.max_allowed_table_size, value)

    def _client_settings(self, pairs: list[tuple[int, int]]) -> None:
        for key, value in pairs:
            if key == w.SETTINGS_MAX_FRAME_SIZE:
                self._down_max_frame = value

    def _server_settings_early(self, pairs: list[tuple[int, int]]) -> None:
        for key, value in pairs:
            if key == w.SETTINGS_MAX_FRAME_SIZE:
                self._up_frame_limit = max(self._up_frame_limit, value)
            elif key == w.SETTINGS_HEADER_TABLE_SIZE:
                self._c_dec.dec.max_allowed_table_size = max(self._c_dec.dec.max_allowed_table_size, value)

    def _flush_held(self, upto: Intercepted | None) -> list[bytes]:
        """Release kept-back request HEADERS, oldest first, through ``upto`` (None: all)."""
        out: list[bytes] = []
        held = self._held
        while held:
            st = held.pop(0)
            if st.held_headers is not None:
                out.append(st.held_headers)
                st.held_headers = None
            if st is upto:
                break
        return out

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
            if kind & _TIMED:
                self._timed[sid] = (method, _perf())
            if kind & _ICPT:
                st = Intercepted(sid, method, self._up_init_window, self._up_init_window)
                self._icpt[sid] = st
                if end_stream:
                    st.hdr_end_stream = True
                    if len(self._icpt) <= self._limits.intercepted_streams:
                        self._request_complete(st)
                return st
            return None
        # A header block on a stream the client opened earlier: request trailers.
        old = self._icpt.get(sid)
        if old is not None and old.phase == _COLLECT:
            # The block has to go upstream in order (HPACK), ahead of the request the relay
            # still holds, so the request cannot be rebuilt: refuse the call.
            old.client_ended = end_stream
            self._answer_local(old, w.GRPC_INTERNAL, "request trailers are not supported on intercepted methods")
        return None

    def _method_kind(self, headers: list[tuple[bytes, bytes]]) -> tuple[str, int]:
        """The method a request header block names, and its ``_ICPT``/``_TIMED`` flags."""
        path = b""
        for name, value in headers:
            if name == b":path":
                path = value
                break
        hit = self._icache.get(path)
        if hit is None:
            method = path.decode("latin-1")
            kind = _ICPT if self._interceptor.intercepts(method) else 0
            if kind or is_known_unary(method):
                kind |= _TIMED
            hit = (method, kind)
            if len(self._icache) < 4096:
                self._icache[path] = hit
        return hit

    def _client_icpt_data(
        self, st: Intercepted, mv: memoryview, pos: int, length: int, flags: int, down: list[bytes]
    ) -> None:
        """Swallow request DATA of an intercepted stream; give the client its window back."""
        end_stream = flags & w.FLAG_END_STREAM
        if st.phase == _COLLECT and length:
            st.cwin -= length
            if st.cwin < 0:
                hit("flow_control")
                st.client_ended = bool(end_stream)
                self._answer_local(st, w.GRPC_INTERNAL, "", reset=w.FLOW_CONTROL_ERROR)
            else:
                a, b = _padded(mv, pos, length, flags, False)
                size = b - a
                over = self._over_budget(len(st.req) + size, size)
                if over:
                    st.client_ended = bool(end_stream)
                    self._answer_local(st, w.GRPC_RESOURCE_EXHAUSTED, over)
                else:
                    st.req += mv[a:b]
                    self._hold(size)
        if length:
            repay = min(length, self._debt)
            self._debt -= repay
            if length > repay:
                self._owed += length - repay
                if self._owed >= _OWED_FLUSH:
                    down.append(self._take_owed())
            if not end_stream and st.phase == _COLLECT:
                st.cwin += length
                down.append(w.window_update(st.sid, length))
        if end_stream:
            st.client_ended = True
            if st.phase == _COLLECT:
                self._request_complete(st)
            elif st.phase == _LOCAL:
                self._icpt.pop(st.sid, None)

    def _request_complete(self, st: Intercepted) -> None:
        st.client_ended = True
        st.phase = _HOOK
        self._due_before.append(st)  # started when the parse ends (``_start_due``)

    def _take_owed(self) -> bytes:
        owed, self._owed = self._owed, 0
        return w.window_update(0, owed)

    # --- resource limits (``_limits``) ---------------------------------------------------------
    def _flow_control_violation(self) -> None:
        hit("flow_control")
        raise FrameError(w.FLOW_CONTROL_ERROR, "client DATA beyond the connection window")

    def _block_too_large(self, side: str) -> None:
        hit("header_block")
        raise FrameError(w.ENHANCE_YOUR_CALM, f"{side} header block over {self._block_limit} bytes")

    def _too_many(self, st: Intercepted) -> None:
        hit("intercepted_streams")
        st.client_ended = st.hdr_end_stream
        self._answer_local(st, w.GRPC_RESOURCE_EXHAUSTED, "too many intercepted calls on this connection")

    def _over_budget(self, stream_total: int, more: int) -> str:
        """Which buffer limit holding ``more`` request bytes would cross ("" if none), counted."""
        if stream_total > self._limits.stream_buffer:
            hit("stream_buffer")
            return "request too large for an intercepted method"
        if self.buffered + more > self._limits.connection_buffer:
            hit("connection_buffer")
            return "too many request bytes held for intercepted calls on this connection"
        if self._budget.held + more > self._budget.limit:
            hit("total_buffer")
            return "too many request bytes held for intercepted calls"
        return ""

    def _hold(self, size: int) -> None:
        self.buffered += size
        self._budget.held += size

    def _release(self, st: Intercepted) -> None:
        """Forget the request bytes ``st`` holds and give them back to the budgets."""
        size = len(st.req) + len(st.out)
        if size:
            st.req = bytearray()
            st.out = b""
            self.buffered -= size
            self._budget.held -= size

    async def _run_before(self, st: Intercepted) -> None:
        msg, why = w.grpc_message(st.req)
        try:
            if msg is None:
                await self._interceptor.undecodable(st.path, why)
                out = bytes(st.req)
            else:
                new = await self._interceptor.before(st.path, msg)
                st.sent_msg = new
                out = bytes(st.req) if new == msg else w.grpc_frame(new)
        except HookRejected as exc:
            if st.phase == _HOOK:
                self._answer_local(st, exc.code, exc.message)
            return
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("relay.hook_failed", method=st.path)
            if st.phase == _HOOK:
                self._answer_local(st, w.GRPC_INTERNAL, f"hook failed: {type(exc).__name__}")
            return
        self._release(st)
        if st.phase != _HOOK or self.state != _RELAY:
            return
        if st.hdr_end_stream:  # the HEADERS alone carry the whole request
            st.phase = _SENT
            if st.held_headers is not None:
                self._send_up(b"".join(self._flush_held(st)))
            return
        st.out = out
        st.off = 0
        self._hold(len(out))
        st.phase = _INJECT
        self._inject_q.append(st)
        self._pump()

    def _pump(self) -> None:
        """Send as much of the rebuilt requests as the server's windows allow."""
        if self.state != _RELAY or not self._inject_q:
            return
        frames: list[bytes] = []
        keep: list[Intercepted] = []
        for st in self._inject_q:
            if st.phase != _INJECT:
                continue
            if st.held_headers is not None:
                frames.extend(self._flush_held(st))
            total = len(st.out)
            while True:
                rest = total - st.off
                chunk = min(rest, st.window, self._up_window, self._up_max_frame)
                if chunk <= 0 and rest > 0:
                    break
                last = chunk == rest
                frames.append(w.frame_header(w.DATA, w.FLAG_END_STREAM if last else 0, st.sid, chunk))
                frames.append(st.out[st.off : st.off + chunk])
                st.off += chunk
                st.window -= chunk
                self._up_window -= chunk
                self._debt += chunk
                if last:
                    st.phase = _SENT
                    self._release(st)
                    break
            if st.phase == _INJECT:
                keep.append(st)
        self._inject_q = keep
        if frames:
            self._send_up(b"".join(frames))

    def _answer_local(self, st: Intercepted, code: int, message: str, *, reset: int | None = None) -> None:
        """Answer an intercepted call without the runtime; reset the upstream stream.

        With ``reset``, the client gets only RST_STREAM(reset) instead of a gRPC status."""
        if st.phase in (_LOCAL, _DONE):
            return
        st.phase = _LOCAL
        self._release(st)
        sid = st.sid
        self._finish(sid, _code_name(code))
        self._dropped[sid] = None
        if len(self._dropped) > _MAX_DROPPED:
            del self._dropped[next(iter(self._dropped))]
        if self.state != _RELAY:
            return
        flags = self.live.pop(sid, None)
        if flags is None:  # the server already finished the stream
            return
        if st.held_headers is not None and st.held_pure:
            # The server never saw the stream, and its header block changes nothing: drop it.
            self._held.remove(st)
            st.held_headers = None
        else:
            if st.held_headers is not None:
                self._send_up(b"".join(self._flush_held(st)))
            self._send_up(w.rst_stream(sid, w.CANCEL))
        if reset is not None:
            out = w.rst_stream(sid, reset)
        else:
            out = self._error_frames(sid, code, message, bool(flags & 1))
            if not st.client_ended:
                out += w.rst_stream(sid, w.NO_ERROR)
        if st.client_ended:
            self._icpt.pop(sid, None)
        self._send_down(out)

    def _send_up(self, data: bytes) -> None:
        if self._up_q is not None:
            self._up_q.append(data)
        elif self.up is not None:
            self.up.write(data)

    def _send_down(self, data: bytes) -> None:
        if self._down_q is not None:
            self._down_q.append(data)
        elif self.down is not None:
            if self._owed:
                data = self._take_owed() + data
            self.down.write(data)

    def _cancel_icpt(self, st: Intercepted) -> None:
        st.phase = _DONE
        self._release(st)
        st.resp = None
        st.held_down = None
        self._drop_vheld(st)

    def _drop_vheld(self, st: Intercepted) -> None:
        """Server blocks kept back verbatim for ``st`` will never reach the client: the client's
        table may miss what they changed, so every later block is re-encoded."""
        if self._vheld is st:
            self._vheld = None
            self.verbatim = False

    def _error_frames(self, sid: int, code: int, message: str, headers_sent: bool) -> bytes:
        return w.grpc_error_frames(sid, code, message, headers_sent=headers_sent, max_frame=self._down_max_frame)

    # --- server -> client ----------------------------------------------------------------------
    def server_data(self, data: bytes) -> None:
        if self.state != _RELAY:
            if self.state == _CONNECTING:  # cannot happen (``upstream_made`` comes first); keep it
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
            self._drain_server_decode()
        except FrameError as err:
            self._fail_server(err)
            return
        except HPACKError as err:
            self._fail_server(FrameError(w.COMPRESSION_ERROR, f"response header block: {err}"))
            return
        if self.state != _RELAY:
            return
        if buf is self._sin:
            del self._sin[:pos]
        elif pos < len(buf):
            self._sin += memoryview(buf)[pos:]
        if self._resume:
            self._pump()
            if self._gated:
                self._gated = False
                self._client_input()
                if not self._gated:
                    self._resume_down(_PAUSE_GATED)

    def _parse_server(self, buf: bytes | bytearray) -> int:
        n = len(buf)
        pos = 0
        start = 0
        mv = memoryview(buf)
        down: list[Any] = []
        up: list[Any] = []
        self._up_q = up
        self._down_q = down
        icpt = self._icpt
        dropped = self._dropped
        limit = self._down_frame_limit
        try:
            while n - pos >= 9:
                lt, flags, sid = _unpack_header(buf, pos)
                length = lt >> 8
                if length > limit:
                    raise FrameError(w.FRAME_SIZE_ERROR, f"server frame of {length} bytes")
                end = pos + 9 + length
                if end > n:
                    break
                ftype = lt & 0xFF
                sid &= _MASK31
                if self._s_block is not None and ftype != w.CONTINUATION:
                    raise FrameError(w.PROTOCOL_ERROR, "header block interrupted")
                if ftype == w.DATA:
                    if sid == 0:
                        raise FrameError(w.PROTOCOL_ERROR, "DATA on stream 0")
                    if dropped and sid in dropped:
                        if pos > start:
                            down.append(mv[start:pos])
                        start = end
                        if length:  # the client never sees it: return the window ourselves
                            up.append(w.window_update(0, length))
                    else:
                        if icpt:
                            st = icpt.get(sid)
                            if st is not None:
                                if st.resp is not None:
                                    a, b = _padded(mv, pos, length, flags, False)
                                    if len(st.resp) + (b - a) > MAX_INTERCEPTED_RESPONSE:
                                        st.resp = None
                                    else:
                                        st.resp += mv[a:b]
                                if st.held_down is not None:
                                    if pos > start:
                                        down.append(mv[start:pos])
                                    start = end
                                    st.held_down.append(bytes(mv[pos:end]))
                                    st.held_size += length
                                    if st.held_size > _HOLD_LIMIT or flags & w.FLAG_END_STREAM:
                                        self._release_down(st, down)
                        if flags & w.FLAG_END_STREAM:
                            self._server_ended(sid)
                            if self._timed:  # no trailers: the caller gets an error
                                self._finish(sid, "INTERNAL")
                elif ftype == w.HEADERS:
                    if sid == 0:
                        raise FrameError(w.PROTOCOL_ERROR, "HEADERS on stream 0")
                    a, b = _padded(buf, pos, length, flags, True)
                    if length > self._block_limit and b - a > self._block_limit:
                        self._block_too_large("response")
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
                    else:
                        if pos > start:
                            down.append(mv[start:pos])
                        start = end
                        self._s_block = bytearray(mv[a:b])
                        self._s_block_sid = sid
                        self._s_block_flags = flags
                        self._s_block_raw = [bytes(mv[pos:end])]
                        if flags & w.FLAG_END_HEADERS:
                            self._server_block_done(down)
                elif ftype == w.CONTINUATION:
                    if self._s_block is None or sid != self._s_block_sid:
                        raise FrameError(w.PROTOCOL_ERROR, "unexpected CONTINUATION")
                    if pos > start:
                        down.append(mv[start:pos])
                    start = end
                    self._s_block += mv[pos + 9 : end]
                    if len(self._s_block) > self._block_limit:
                        self._block_too_large("response")
                    self._s_block_raw.append(bytes(mv[pos:end]))
                    if flags & w.FLAG_END_HEADERS:
                        self._server_block_done(down)
                elif ftype == w.RST_STREAM:
                    if length != 4 or sid == 0:
                        raise FrameError(w.PROTOCOL_ERROR, "bad RST_STREAM")
                    self.live.pop(sid, None)
                    if self._timed:
                        self._finish(sid, _RST_CODES.get(w.u32(buf, pos + 9), "INTERNAL"))
                    st = icpt.pop(sid, None) if icpt else None
                    if st is not None:
                        self._cancel_icpt(st)
                    if dropped and sid in dropped:
                        if pos > start:
                            down.append(mv[start:pos])
                        start = end
                elif ftype == w.WINDOW_UPDATE:
                    if length != 4:
                        raise FrameError(w.FRAME_SIZE_ERROR, "bad WINDOW_UPDATE")
                    inc = w.u32(buf, pos + 9) & _MASK31
                    if sid == 0:
                        self._up_window += inc
                        self._resume = True
                        if self._debt:
                            take = min(inc, self._debt)
                            self._debt -= take
                            if pos > start:
                                down.append(mv[start:pos])
                            start = end
                            if inc > take:
                                down.append(w.window_update(0, inc - take))
                    elif icpt and sid in icpt:
                        # The relay owns the request side of an intercepted stream.
                        icpt[sid].window += inc
                        self._resume = True
                        if pos > start:
                            down.append(mv[start:pos])
                        start = end
                elif ftype == w.SETTINGS:
                    if sid != 0 or length % 6:
                        raise FrameError(w.PROTOCOL_ERROR, "bad SETTINGS")
                    if flags & w.FLAG_ACK:
                        if self._client_settings_q:
                            self._client_settings(self._client_settings_q.pop(0))
                    else:
                        self._server_settings_q.append(w.parse_settings(mv[pos + 9 : end]))
                        self._server_settings_early(self._server_settings_q[-1])
                elif ftype == w.PING:
                    if sid != 0 or length != 8:
                        raise FrameError(w.PROTOCOL_ERROR, "bad PING")
                elif ftype == w.GOAWAY:
                    if sid != 0 or length < 8:
                        raise FrameError(w.PROTOCOL_ERROR, "bad GOAWAY")
                    if self._timed:  # streams above the last one the server took never run
                        last = w.u32(buf, pos + 9) & _MASK31
                        for other in [t for t in self._timed if t > last]:
                            self._finish(other, "UNAVAILABLE")
                elif ftype == w.PUSH_PROMISE:
                    raise FrameError(w.PROTOCOL_ERROR, "PUSH_PROMISE (push is off for gRPC)")
                pos = end
            if self._due_after and self.state == _RELAY:
                if pos > start:
                    down.append(mv[start:pos])
                start = pos
                self._start_due()
            if self.state != _RELAY:
                return pos
            self._up_q = self._down_q = None
            if start == 0 and pos == n and not down and not self._owed and isinstance(buf, bytes):
                self.down.write(buf)  # type: ignore[union-attr]
            else:
                if pos > start:
                    down.append(mv[start:pos])
                if self._owed:  # first, so it never waits behind a full write buffer
                    down.insert(0, self._take_owed())
                if down:
                    self.down.write(b"".join(down))  # type: ignore[union-attr]
            if up:
                self.up.write(b"".join(up))  # type: ignore[union-attr]
            return pos
        finally:
            self._up_q = self._down_q = None
            down.clear()
            up.clear()
            mv.release()

    def _server_settings(self, pairs: list[tuple[int, int]]) -> None:
        for key, value in pairs:
            if key == w.SETTINGS_INITIAL_WINDOW_SIZE:
                delta = value - self._up_init_window
                self._up_init_window = value
                for st in self._icpt.values():
                    st.window += delta
                    st.cwin += delta
                self._resume = True
            elif key == w.SETTINGS_MAX_FRAME_SIZE:
                self._up_max_frame = value
                self._resume = True

    def _s_decode(self, block: bytes) -> list[tuple[bytes, bytes]]:
        if self._s_pending:
            self._drain_server_decode()
        return self._s_dec.decode(block)

    def _drain_server_decode(self) -> None:
        pending = self._s_pending
        if pending:
            advance = self._s_dec.advance
            for block, sid in pending:
                if sid:
                    self._finish(sid, _status_of(self._s_dec.decode(block)))
                else:
                    advance(block)
            pending.clear()

    def _flush_server_decode_quietly(self) -> None:
        with contextlib.suppress(HPACKError):
            self._drain_server_decode()

    def _server_ended(self, sid: int) -> None:
        self.live.pop(sid, None)
        st = self._icpt.get(sid) if self._icpt else None
        if st is not None and st.phase != _AFTER:
            del self._icpt[sid]
            self._cancel_icpt(st)

    def _server_block_done(self, down: list[Any]) -> None:
        block = self._s_block
        assert block is not None
        self._s_block = None
        sid = self._s_block_sid
        flags = self._s_block_flags
        raw = self._s_block_raw
        self._s_block_raw = []
        headers = self._s_decode(bytes(block))
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
                if st.held_down is not None and st.phase == _SENT:
                    if self.verbatim:
                        self._vheld = st
                        st.held_down.append(raw[0] if len(raw) == 1 else b"".join(raw))
                    else:
                        st.held_down.append(w.header_frames(sid, _encode_block(headers), False, self._down_max_frame))
                    return
            else:
                status = b""
                for name, value in headers:
                    if name == b"grpc-status":
                        status = value
                        break
                if st.held_down and self._vheld is not st:  # what was kept back goes first
                    self.verbatim = False
                if status == b"0" and st.phase == _SENT:
                    if self.verbatim:
                        self._vheld = st
                        st.trailers_raw = raw[0] if len(raw) == 1 else b"".join(raw)
                    st.phase = _AFTER
                    st.trailers = headers
                    self._due_after.append(st)  # started when the parse ends (``_start_due``)
                    return
                self._release_down(st, down)
        if self.verbatim:
            down.extend(raw)
        else:
            down.append(w.header_frames(sid, _encode_block(headers), end_stream, self._down_max_frame))
        if end_stream:
            self._server_ended(sid)
            if self._timed:
                self._finish(sid, _status_of(headers))
        elif sid in self.live:
            self.live[sid] = 1

    def _release_down(self, st: Intercepted, down: list[Any]) -> None:
        """Send the response frames kept back so far; the rest of the response passes through."""
        if st.held_down:
            down.extend(st.held_down)
            if st.sid in self.live:
                self.live[st.sid] = 1
        st.held_down = None
        if self._vheld is st:
            self._vheld = None

    async def _run_after(self, st: Intercepted) -> None:
        response = _response_message(st.resp, st.resp_encoding)
        if response is None:
            log.warning("relay.after_skipped", method=st.path, reason="response not one decodable message")
        elif st.sent_msg is None:
            log.warning("relay.after_skipped", method=st.path, reason="request was not decoded")
        else:
            try:
                await self._interceptor.after(st.path, st.sent_msg, response)
            except Exception:
                log.exception("relay.after_failed", method=st.path)
        st.resp = None
        self._icpt.pop(st.sid, None)
        if self.state != _RELAY or st.phase != _AFTER:
            self.live.pop(st.sid, None)
            self._drop_vheld(st)
            return
        st.phase = _DONE
        self.live.pop(st.sid, None)
        if self._vheld is st:
            self._vheld = None
        if self.down is not None:
            out = st.held_down or []
            st.held_down = None
            raw = st.trailers_raw
            if raw is None:
                raw = w.header_frames(st.sid, _encode_block(st.trailers), True, self._down_max_frame)
            out.append(raw)
            self._send_down(b"".join(out))
            self._finish(st.sid, "OK")


class _Resumed:
    """Drives a coroutine that ``Session._start_eager`` already started, from its first wait on:
    what it waits for is passed to the task, and what the task sends or throws is passed back."""

    __slots__ = ("_coro", "_first")

    def __init__(self, coro: Coroutine[Any, Any, None], first: Any) -> None:
        self._coro = coro
        self._first = first

    def __await__(self) -> Generator[Any, Any, None]:
        coro, waiting = self._coro, self._first
        self._first = None
        while True:
            try:
                sent = yield waiting
            except BaseException as exc:  # cancellation, or an error the awaited future raised
                try:
                    waiting = coro.throw(exc)
                except StopIteration:
                    return
            else:
                try:
                    waiting = coro.send(sent)
                except StopIteration:
                    return


async def _resume(coro: Coroutine[Any, Any, None], first: Any) -> None:
    await _Resumed(coro, first)


class _Upstream(asyncio.Protocol):
    """The upstream half: hands everything to its session."""

    def __init__(self, session: Session) -> None:
        self._s = session

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._s.upstream_made(cast(asyncio.Transport, transport))

    def data_received(self, data: bytes) -> None:
        self._s.server_data(data)

    def eof_received(self) -> bool | None:
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self._s.upstream_lost(str(exc) if exc else "closed by the backend")

    def pause_writing(self) -> None:
        self._s._pause_down(_PAUSE_UP_FULL)
        self._s._pause_up(_PAUSE_UP_FULL)

    def resume_writing(self) -> None:
        self._s._resume_down(_PAUSE_UP_FULL)
        self._s._resume_up(_PAUSE_UP_FULL)


def _padded(buf: bytes | bytearray | memoryview, pos: int, length: int, flags: int, headers: bool) -> tuple[int, int]:
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


def _encode_block(headers: Iterable[tuple[bytes, bytes]]) -> bytes:
    enc = w.encode_field
    return b"".join(enc(n, v, isinstance(h, NeverIndexedHeaderTuple)) for h in headers for n, v in (h,))


def _response_message(data: bytearray | None, encoding: bytes) -> bytes | None:
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
