"""The relay starts a call's hook at once, on the read that completed the request, and gives it
a task only when it first waits (``Session._start_eager``). Relay-only: one ``Session`` driven
with fake transports, as in ``test_relay_frames``.
"""

from __future__ import annotations

import asyncio
import contextvars
from typing import Any

from hpack import Encoder
from test_relay_frames import FakeTransport, _frames, _request_headers, _session
from transport_backend import RecordedCall, RecordingInterceptor

from runtime_proxy.cri.relay import _wire as w

MARK: contextvars.ContextVar[str] = contextvars.ContextVar("mark", default="unset")


class Hook(RecordingInterceptor):
    """Marks the context, then behaves like the suite's hook (``sleep:S:`` waits)."""

    def __init__(self) -> None:
        super().__init__()
        self.finished = 0
        self.cancelled = 0

    async def before(self, method: str, request: bytes) -> RecordedCall:
        MARK.set("hook")
        try:
            out = await super().before(method, request)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        self.finished += 1
        return out


def _request(body: bytes) -> bytes:
    enc = Encoder()
    return b"".join(
        [
            w.PREFACE,
            w.settings(),
            w.frame(w.HEADERS, w.FLAG_END_HEADERS, 1, _request_headers(enc, "/test.Hooked/Unary")),
            w.frame(w.DATA, w.FLAG_END_STREAM, 1, w.grpc_frame(body)),
        ]
    )


def _up_data(up: FakeTransport) -> bytes:
    frames = _frames(bytes(up.data[len(w.PREFACE) :]))
    return b"".join(p for t, _, sid, p in frames if t == w.DATA and sid == 1)


async def test_a_hook_that_does_not_wait_sends_in_the_same_write() -> None:
    hook = Hook()
    s, _down, up = _session(hook)
    writes: list[Any] = []
    original = up.write

    def write(data: Any) -> None:
        writes.append(bytes(data))
        original(data)

    up.write = write  # type: ignore[method-assign]
    s.data_received(_request(b"grow:3:x"))
    # No loop turn yet: the hook ran and its request went up with the rest of the read.
    assert hook.finished == 1 and not s._tasks
    assert len(writes) == 1
    assert _up_data(up) == w.grpc_frame(b"grow:3:x\x03\x0a\x11")
    # The hook's context changes stay with the hook.
    assert MARK.get() == "unset"
    s.close()


async def test_a_hook_that_waits_continues_in_a_task() -> None:
    hook = Hook()
    s, _down, up = _session(hook)
    s.data_received(_request(b"sleep:0.05:"))
    assert hook.finished == 0 and len(s._tasks) == 1
    assert _up_data(up) == b""
    await asyncio.wait_for(asyncio.gather(*s._tasks), 5)
    assert hook.finished == 1
    assert _up_data(up) == w.grpc_frame(b"sleep:0.05:")
    assert MARK.get() == "unset"
    s.close()


async def test_closing_the_connection_cancels_a_waiting_hook() -> None:
    hook = Hook()
    s, down, _up = _session(hook)
    s.data_received(_request(b"sleep:30:"))
    (task,) = s._tasks
    await asyncio.sleep(0.01)
    s.connection_lost(None)
    await asyncio.wait([task], timeout=5)
    assert task.cancelled()
    assert hook.cancelled == 1 and hook.finished == 0
    assert down.closed
