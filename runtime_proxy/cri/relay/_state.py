"""The state one relayed connection keeps, and the small operations every part of it uses.

``Session`` (``_session``) is built from units that share this state, each in its own module:
``_flow`` (SETTINGS, windows and resource limits), ``_intercept`` (intercepted calls: hooks,
injection, local answers), ``_client`` (parsing what the client sends), ``_server`` (parsing
what the server sends) and ``_refuse`` (the minimal server used when the backend is
unreachable). They are mixins over one object rather than separate objects so that the parsers'
hot loops read plain instance attributes (``self._up_window``), as a single class did.

Terms used in all of them: *client* is the downstream peer (kubelet), *server* the upstream
peer (containerd). "Up" means toward the server, "down" toward the client.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Protocol

import structlog

from runtime_proxy.cri.relay import _wire as w
from runtime_proxy.cri.relay._frames import FrameError, FrameWalk, MirrorDecoder
from runtime_proxy.cri.relay._limits import Budget, RelayLimits
from runtime_proxy.cri.relay._metrics import observe_call, perf
from runtime_proxy.cri.relay._streams import Intercepted

if TYPE_CHECKING:
    from runtime_proxy.cri.transport import CallInterceptor

log = structlog.get_logger("runtime_proxy.cri.relay")

# Largest intercepted response the relay copies for ``after`` (the response itself always flows);
# kubelet's and containerd's message limit, 16 MiB, plus the gRPC prefix. The largest request
# is ``RelayLimits.stream_buffer`` (``_limits``).
MAX_INTERCEPTED_RESPONSE = 16 * 1024 * 1024 + 5
# Locally answered streams whose late upstream frames are dropped; oldest forgotten first.
MAX_DROPPED = 1024
# Response bytes of an intercepted call the relay keeps back with the trailers, at most; well
# below the smallest stream window (65535), so the server never waits for the relay.
HOLD_LIMIT = 16384
# Request bytes the relay swallowed and owes the client as a connection WINDOW_UPDATE are sent
# with the next write to the client (the answer, usually) instead of in a write of their own,
# unless they reach this many: far below any connection window (65535 at least), so the
# client's window never runs out because of what the relay still owes.
OWED_FLUSH = 16384

# Session states.
CONNECTING, RELAY, REFUSE, CLOSED = range(4)

# Why a side's reading is paused: the client's write buffer is full; the server's write buffer is
# full; a client DATA frame waits for the server's window; the backend connection is not up yet.
PAUSE_DOWN_FULL = 1
PAUSE_UP_FULL = 2
PAUSE_GATED = 4
PAUSE_EARLY = 8


class Refuser(Protocol):
    """What a session needs of its refuse-mode server (``_refuse.RefuseServer``); a protocol here
    so that this module, which ``_refuse`` builds on, never imports it back."""

    def feed(self) -> None: ...

    def cancel(self) -> None: ...


class SessionState:
    """Fields of one relayed connection (see ``_session.Session``) and shared operations."""

    def __init__(
        self,
        interceptor: CallInterceptor,
        backend: str,
        connect_timeout: float,
        on_closed: Callable[[SessionState], None],
        *,
        limits: RelayLimits | None = None,
        budget: Budget | None = None,
    ) -> None:
        self._interceptor = interceptor
        self._limits = limits = limits or RelayLimits()
        self._block_limit = limits.header_block
        self._stream_cap = limits.stream_buffer
        self._conn_cap = limits.connection_buffer
        self._icpt_cap = limits.intercepted_streams
        self._budget = budget or Budget(limits.total_buffer)
        # Request bytes held for this connection's intercepted calls (``req`` and ``out``).
        self.buffered = 0
        # Why reading from each side is paused (``PAUSE_*`` bits); it resumes when none is left.
        self._down_stop = 0
        self._up_stop = 0
        self._backend = backend
        self._connect_timeout = connect_timeout
        self._on_closed = on_closed
        self._loop = asyncio.get_running_loop()
        self.down: asyncio.Transport | None = None
        self.up: asyncio.Transport | None = None
        self.state = CONNECTING
        self.draining = False
        self._tasks: set[asyncio.Task[None]] = set()
        self._after_tasks: set[asyncio.Task[None]] = set()
        self._closing_up = False
        self._refuser: Refuser | None = None  # the minimal server of refuse mode
        self._init_parsing()
        self._init_streams()
        self._init_flow()

    def _init_parsing(self) -> None:
        """Each side's unparsed bytes, HPACK decoders and header blocks being assembled."""
        self._cin = bytearray()  # client bytes not yet parsed (partial frame, or waiting)
        self._sin = bytearray()  # server bytes not yet parsed
        self._preface_ok = False
        self._gated = False  # client parsing stopped: a DATA frame exceeds the server's window
        # HPACK decoders mirroring each direction's encoder.
        self._c_dec = MirrorDecoder()
        self._s_dec = MirrorDecoder()
        # Each direction's walk over a read (one at a time: a parse never starts inside another).
        self._c_walk = FrameWalk("client")
        self._s_walk = FrameWalk("server")
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

    def _init_streams(self) -> None:
        """The streams the relay tracks, and what the current parse will write."""
        # Streams the server has not finished: sid -> 1 once response headers went down.
        self.live: dict[int, int] = {}
        self._icpt: dict[int, Intercepted] = {}
        self._dropped: dict[int, None] = {}
        self._inject_q: list[Intercepted] = []
        self._held: list[Intercepted] = []  # intercepted streams whose HEADERS are kept back, in order
        self._icache: dict[bytes, tuple[str, int]] = {}  # :path -> (method, ICPT | TIMED flags)
        # The last request header list ``_method_kind`` read, and its answer: a decoded list is
        # never changed, and the decoder's cache hands out the same list for the same block.
        self._kind_of: tuple[list[tuple[bytes, bytes]] | None, tuple[str, int]] = (None, ("", 0))
        # Calls the metrics time, as the grpc transport does (known unary CRI methods and
        # intercepted ones): sid -> (method, start). Each ends in ``_finish`` with its code.
        self._timed: dict[int, tuple[str, float]] = {}
        # Intercepted streams whose hook (``before``; ``after``) became due during the current
        # parse: started when the parse ends, so what they send joins the parse's one write.
        self._due_before: list[Intercepted] = []
        self._due_after: list[Intercepted] = []
        # While a parse runs, frames the relay writes itself join its output in order.
        self._up_q: list[bytes | memoryview] | None = None
        self._down_q: list[bytes | memoryview] | None = None

    def _init_flow(self) -> None:
        """Windows, frame sizes and SETTINGS of both sides (``_flow``)."""
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
        self._resume = False  # a server WINDOW_UPDATE or SETTINGS may unblock sending
        # Connection window the relay owes the client (swallowed request bytes), see OWED_FLUSH.
        self._owed = 0

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

    def _spawn(self, coro: Coroutine[object, None, None]) -> asyncio.Task[None]:
        task: asyncio.Task[None] = self._loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            # A bug in the relay: never let it vanish with the task. The connection cannot be
            # trusted any more, so it ends (the caller reconnects).
            log.error("relay.task_failed", exc_info=task.exception())
            self.close(w.INTERNAL_ERROR)

    def _finish(self, sid: int, code: str) -> None:
        """A timed call ended for the caller with ``code``: record it (once)."""
        timed = self._timed.pop(sid, None)
        if timed is not None:
            observe_call(timed[0], code, perf() - timed[1])

    def _take_owed(self) -> bytes:
        owed, self._owed = self._owed, 0
        return w.window_update(0, owed)

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

    def _error_frames(self, sid: int, code: int, message: str, headers_sent: bool) -> bytes:
        return w.grpc_error_frames(sid, code, message, headers_sent=headers_sent, max_frame=self._down_max_frame)

    # Implemented by the units (``_session``, ``_client``); declared here for the others.
    def close(self, code: int = w.NO_ERROR) -> None:
        raise NotImplementedError

    def _client_input(self, data: bytes | None = None) -> None:
        raise NotImplementedError

    def _fail_client(self, err: FrameError) -> None:
        raise NotImplementedError

    def _fail_server(self, err: FrameError) -> None:
        raise NotImplementedError

    def _method_kind(self, headers: list[tuple[bytes, bytes]]) -> tuple[str, int]:
        raise NotImplementedError
