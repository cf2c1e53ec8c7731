"""One relayed connection: kubelet's downstream connection spliced to its own upstream one.

Called by ``RelayTransport`` (``runtime_proxy.cri.relay``), which creates one ``Session`` per
accepted downstream connection. The session opens the upstream connection, copies frames both
ways and passes intercepted calls to the ``CallInterceptor``. The package docstring explains the
design.

This module holds the connection's lifecycle: the asyncio protocol callbacks of both halves,
opening the upstream connection, backpressure between the halves, graceful drain, close, and the
switch to refuse mode (``_refuse``). The rest of the session comes from its units, which share
the state of ``_state.SessionState``: ``_client`` and ``_server`` parse each direction,
``_intercept`` runs intercepted calls, ``_flow`` keeps SETTINGS and the resource limits.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import cast

from runtime_proxy.cri.relay import _wire as w
from runtime_proxy.cri.relay._client import ClientSide
from runtime_proxy.cri.relay._frames import FrameError
from runtime_proxy.cri.relay._refuse import RefuseServer
from runtime_proxy.cri.relay._server import ServerSide
from runtime_proxy.cri.relay._state import (
    CLOSED,
    CONNECTING,
    PAUSE_DOWN_FULL,
    PAUSE_EARLY,
    PAUSE_UP_FULL,
    REFUSE,
    RELAY,
    log,
)
from runtime_proxy.cri.relay._state import RELAY as _RELAY  # noqa: F401 - the tests' name
from runtime_proxy.cri.relay._streams import AFTER

__all__ = ["Session"]


class Session(ClientSide, ServerSide, asyncio.Protocol):
    """The downstream protocol of one relayed connection, and its upstream half."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.down = cast(asyncio.Transport, transport)  # uvloop's transports are not subclasses
        self._spawn(self._connect())

    def data_received(self, data: bytes) -> None:
        if self.state == RELAY:
            if self._gated or self._cin:
                self._cin += data
                if not self._gated:
                    self._client_input()
            else:
                self._client_input(data)
        elif self.state == CONNECTING:
            self._cin += data
            if len(self._cin) > self._limits.early_input:
                self._pause_down(PAUSE_EARLY)
        elif self.state == REFUSE and self._refuser is not None:
            self._cin += data
            self._refuser.feed()

    def eof_received(self) -> bool | None:
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self._close_all()

    def pause_writing(self) -> None:
        # The client does not read: stop reading what would make more to write to it (the
        # server's frames, and the client's own, which the relay may answer itself).
        self._pause_up(PAUSE_DOWN_FULL)
        self._pause_down(PAUSE_DOWN_FULL)

    def resume_writing(self) -> None:
        self._resume_up(PAUSE_DOWN_FULL)
        self._resume_down(PAUSE_DOWN_FULL)

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
            if self.state == CONNECTING:
                log.warning("relay.backend_unreachable", backend=self._backend, error=str(exc) or type(exc).__name__)
                self._start_refusing(f"backend unavailable: {exc or 'connect timeout'}")
            return

    def upstream_made(self, transport: asyncio.Transport) -> None:
        """The upstream connection is up: relay from now on (before any upstream byte arrives)."""
        if self.state != CONNECTING:  # the client went away meanwhile
            transport.close()
            return
        self.up = transport
        self.state = RELAY
        if self._up_stop:
            transport.pause_reading()
        if self._cin:
            self._client_input()
        self._resume_down(PAUSE_EARLY)
        if self._sin and self.state == RELAY:
            self.server_data(b"")

    @property
    def busy(self) -> bool:
        """Streams in flight (used by graceful stop)."""
        return bool(self.live) and self.state == RELAY

    def start_drain(self) -> None:
        """Tell the client to open no new streams here (GOAWAY with the maximal stream id)."""
        if self.draining:
            return
        self.draining = True
        if self.state == RELAY and self.down is not None:
            self.down.write(w.goaway(w.MAX_STREAM_ID, w.NO_ERROR))

    def close(self, code: int = w.NO_ERROR) -> None:
        """End the connection now: GOAWAY to the client, both transports closed."""
        if self.state == CLOSED:
            return
        if self.down is not None and self.state != CONNECTING:
            self.down.write(w.goaway(self.c_max_sid, code))
        self._close_all()

    def _close_all(self) -> None:
        if self.state == CLOSED:
            return
        self.state = CLOSED
        if self._refuser is not None:
            self._refuser.cancel()
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
        if self.state == CONNECTING:
            self._start_refusing(f"backend unavailable: {reason}")
            return
        if self.state != RELAY or self._closing_up:
            return
        self._closing_up = True
        self._flush_server_decode_quietly()
        out = []
        for sid, flags in list(self.live.items()):
            st = self._icpt.get(sid)
            if st is not None and st.phase == AFTER:
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

    def _start_refusing(self, message: str) -> None:
        if self.state not in (CONNECTING, RELAY):
            return
        self.state = REFUSE
        self._resume_down(PAUSE_EARLY)
        self._refuser = RefuseServer(self, message)
        self._refuser.feed()


class _Upstream(asyncio.Protocol):
    """The upstream half: hands everything to its session."""

    def __init__(self, session: Session) -> None:
        self._s = session
        # The transport calls the session's parser itself: no frame of ours between them on
        # every read (both uvloop and asyncio look the method up on the instance).
        self.data_received = session.server_data  # type: ignore[method-assign]

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._s.upstream_made(cast(asyncio.Transport, transport))

    def data_received(self, data: bytes) -> None:  # replaced per instance in ``__init__``
        self._s.server_data(data)

    def eof_received(self) -> bool | None:
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self._s.upstream_lost(str(exc) if exc else "closed by the backend")

    def pause_writing(self) -> None:
        self._s._pause_down(PAUSE_UP_FULL)
        self._s._pause_up(PAUSE_UP_FULL)

    def resume_writing(self) -> None:
        self._s._resume_down(PAUSE_UP_FULL)
        self._s._resume_up(PAUSE_UP_FULL)
