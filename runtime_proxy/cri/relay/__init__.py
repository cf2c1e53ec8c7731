"""The HTTP/2 frame relay: the proxy's fast transport between kubelet and containerd.

Who calls it: the proxy's wiring (``runtime_proxy.commands.serve``) builds a ``RelayTransport`` with the
listen path, the containerd socket and the hook pipeline's ``CallInterceptor``, then awaits
``start()`` and, on shutdown, ``stop(grace)``. What it passes on: every call reaches containerd
as the same bytes kubelet sent, except the request message of an intercepted method, which is
what ``CallInterceptor.before`` returned.

Design (``docs/transports.md`` has the long version):

* **One upstream connection per downstream connection.** Stream ids, HPACK state, SETTINGS,
  PING and flow-control windows are all per connection, so a 1:1 splice lets frames pass end
  to end unchanged. A shared upstream connection would force the relay to renumber streams,
  re-encode every header block and terminate flow control: the cost this transport exists to
  avoid. kubelet keeps one long-lived connection per service, so the extra connections are
  few.
* **Copy, don't parse, except where needed.** Bytes are read with ``asyncio.Protocol`` (uvloop
  where the application installed it), frame headers are read with one ``struct`` call, and runs
  of frames that pass unchanged are written with one ``transport.write`` per read, without a
  copy when a read holds whole frames only.
* **Header blocks.** Every client (request) header block is HPACK-decoded by a decoder kept in
  step with kubelet's encoder, to read ``:path``; the block itself is always forwarded
  verbatim and in order, also for intercepted streams, so containerd's decoder and the stream
  ids never diverge. Server (response) header blocks are decoded too (after the write, off the
  latency path). They pass verbatim until the relay first has to drop one (the late answer on
  a stream the relay answered itself) or let one overtake another it holds back (an intercepted
  call's response headers and trailers wait for ``after``; held blocks stay the server's own
  bytes while no other block passes them). From then on the relay re-encodes every response block with
  representations that never touch kubelet's dynamic table (static indexes and literals
  without indexing, no table size updates), so holding, dropping and injecting blocks is safe.
  The relay's own answers (rejections, UNAVAILABLE) use the same encoder.
* **Intercepted calls.** The request HEADERS frame is kept back (released early if another
  header block, SETTINGS or RST_STREAM must follow it in order) while the request DATA is
  buffered until END_STREAM; the 5-byte gRPC prefix is checked (compressed, several or no
  messages, or a truncated one go to ``undecodable``), ``before`` is awaited and HEADERS plus the
  rebuilt message go upstream in one write, in DATA frames sized to containerd's acknowledged
  SETTINGS_MAX_FRAME_SIZE and its windows. The response (HEADERS and up to 16 KiB of DATA) is
  kept back with its trailers while ``after`` runs; a longer response flows and only the
  trailers wait, which is when a gRPC call completes for the caller. A ``HookRejected`` (or a
  refusing ``undecodable``) is answered by the relay (``:status 200``, ``content-type``, then
  ``grpc-status``/percent-encoded ``grpc-message`` trailers). containerd never sees the stream
  when its kept-back header block was pure-indexed (it cannot change the HPACK table, so it can
  be dropped); otherwise the block goes up followed by RST_STREAM(CANCEL), so no handler runs.
* **Flow control.** Request bytes the relay swallows are returned to kubelet with WINDOW_UPDATEs
  (connection and stream) as they are buffered, within the limits of ``_limits.RelayLimits``
  (per call, per connection, per transport), which also bound header blocks and open intercepted
  calls; DATA past an advertised window is a FLOW_CONTROL_ERROR. Bytes it injects are accounted
  against containerd's exact windows, which the relay tracks; the amount by which kubelet's view
  of containerd's connection window then exceeds the real one is a *debt* that the relay repays
  by swallowing that much of containerd's connection WINDOW_UPDATEs (or of later swallowed
  request bytes). While in debt, a pass-through DATA frame larger than the real window waits in
  the relay until the window opens, so containerd never sees a flow-control violation.
* **Failures.** Backend unreachable at connect: the relay speaks just enough HTTP/2 to answer
  every stream with UNAVAILABLE, then GOAWAY and closes, so the caller gets a status at once and
  the next call reconnects. Backend lost mid-call: streams without response headers get
  UNAVAILABLE, then GOAWAY and close (the rest fail as UNAVAILABLE with the connection). A
  malformed frame from either side ends that connection with GOAWAY; the listener keeps
  serving. A client RST_STREAM passes upstream unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import socket
import stat

import structlog

from runtime_proxy.cri.relay._limits import Budget, RelayLimits
from runtime_proxy.cri.relay._session import Session
from runtime_proxy.cri.transport import CallInterceptor

__all__ = ["RelayLimits", "RelayTransport", "new_event_loop"]

log = structlog.get_logger("runtime_proxy.cri.relay")


def _unix_path(address: str) -> str:
    for prefix in ("unix://", "unix:"):
        if address.startswith(prefix):
            return address[len(prefix) :]
    return address


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A uvloop event loop where uvloop is installed, else asyncio's default one."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        return asyncio.new_event_loop()
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop


class RelayTransport:
    """Listen on a unix socket and relay each connection to ``backend`` frame by frame."""

    def __init__(
        self,
        listen: str,
        backend: str,
        interceptor: CallInterceptor,
        *,
        connect_timeout: float = 2.0,
        limits: RelayLimits | None = None,
    ) -> None:
        self.listen = _unix_path(listen)
        self.backend = _unix_path(backend)
        self.interceptor = interceptor
        self.connect_timeout = connect_timeout
        self.limits = limits or RelayLimits()
        self._budget = Budget(self.limits.total_buffer)
        self._server: asyncio.AbstractServer | None = None
        self._sessions: set[Session] = set()

    @property
    def connections(self) -> int:
        """Downstream connections currently open."""
        return len(self._sessions)

    @property
    def buffered_bytes(self) -> int:
        """Request bytes held for intercepted calls across all connections (``_limits``)."""
        return self._budget.held

    async def start(self) -> None:
        """Bind the listen socket (mode 0660; its directory is created, a stale socket file is
        removed) and serve."""
        if self._server is not None:
            raise RuntimeError("RelayTransport already started")
        os.makedirs(os.path.dirname(self.listen) or ".", exist_ok=True)
        _remove_stale_socket(self.listen)
        loop = asyncio.get_running_loop()
        old_umask = os.umask(0o117)
        try:
            self._server = await loop.create_unix_server(self._new_session, self.listen)
        finally:
            os.umask(old_umask)
        os.chmod(self.listen, 0o660)
        log.info("relay.listening", listen=self.listen, backend=self.backend)

    def _new_session(self) -> Session:
        session = Session(
            self.interceptor,
            self.backend,
            self.connect_timeout,
            self._sessions.discard,
            limits=self.limits,
            budget=self._budget,
        )
        self._sessions.add(session)
        return session

    async def stop(self, grace: float = 5.0) -> None:
        """Stop accepting, let in-flight streams finish for up to ``grace`` seconds, close."""
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.listen)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(grace, 0.0)
        for session in list(self._sessions):
            session.start_drain()
        while any(s.busy for s in self._sessions) and loop.time() < deadline:
            await asyncio.sleep(0.005)
        sessions = list(self._sessions)
        for session in sessions:
            session.close()
        for session in sessions:
            await session.wait_tasks(timeout=max(0.0, deadline - loop.time()) + 0.1)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(server.wait_closed(), timeout=1.0)
        log.info("relay.stopped", listen=self.listen)


def _remove_stale_socket(path: str) -> None:
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise FileExistsError(errno.EEXIST, "listen path exists and is not a socket", path)
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(0.5)
    try:
        probe.connect(path)
    except (ConnectionRefusedError, FileNotFoundError):
        os.unlink(path)
        return
    except OSError:
        os.unlink(path)
        return
    finally:
        probe.close()
    raise OSError(errno.EADDRINUSE, "another process serves this socket", path)
