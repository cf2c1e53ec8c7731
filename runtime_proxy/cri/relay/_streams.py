"""The state of one intercepted call (``Intercepted``) and the phases it moves through.

Created by ``_client`` when a request header block names an intercepted method; moved forward
by ``_intercept`` (hooks, injection, local answers) and ``_server`` (the response).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from runtime_proxy.cri.transport import InterceptedCall

# ``SessionState._icache`` flags: the method is intercepted; the method's calls are timed.
ICPT = 1
TIMED = 2

# Phases of an intercepted stream.
COLLECT = 0  # buffering the request DATA until END_STREAM
HOOK = 1  # ``before`` (or ``undecodable``) is running
INJECT = 2  # rebuilt request is being sent upstream
SENT = 3  # request fully sent, response flowing
AFTER = 4  # trailers held while ``after`` runs
LOCAL = 5  # answered by the relay itself; upstream stream reset
DONE = 6  # finished or cancelled


class Intercepted:
    """One intercepted stream."""

    __slots__ = (
        "after_task",
        "call",
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
        "sid",
        "trailers",
        "trailers_raw",
        "window",
    )

    def __init__(self, sid: int, path: str, window: int, client_window: int) -> None:
        self.sid = sid  # never changes
        self.path = path  # never changes
        self.phase = COLLECT  # moves forward only, see the phase constants
        self.req = bytearray()  # request DATA payload while collecting
        # The client's window on this stream while collecting: the relay returns each DATA frame's
        # bytes at once, so this stays the initial window (moved only by SETTINGS).
        self.cwin = client_window
        self.client_ended = False  # client sent END_STREAM
        self.hdr_end_stream = False  # the request HEADERS carried END_STREAM (no body at all)
        self.window = window  # server's send window for this stream, as the relay accounts it
        self.out: bytes = b""  # rebuilt request being injected (counted in the buffer budgets)
        self.off = 0  # bytes of ``out`` already sent
        self.call: InterceptedCall | None = None  # what ``before`` returned (None: not decoded)
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
