"""The pod webhook's HTTPS server, apart from the manager's event loop: its own thread and
event loop, a bound on the reviews in flight, and a serving certificate re-read when its files
change.

Who calls this: ``colocation_manager.cli`` starts a ``WebhookServer`` beside the elector and
the reconciler when ``--webhook-listen`` is given; every replica serves (leadership only gates
the manager's writes).

- **Apart from the Lease.** The server runs uvicorn on a thread of its own with its own event
  loop, so any number of connections, slow or unauthenticated, and any review that takes long
  cost the webhook's loop, never the loop that renews the Lease.
- **Bounded.** At most ``max_inflight`` reviews are answered at once; a request beyond that gets
  ``503`` at once (``rhp_manager_webhook_refused_total``), and the API server applies the
  webhook's failure policy to it. At most ``max_connections`` connections are open; idle
  keep-alive connections are closed after ``KEEP_ALIVE_SECONDS``.
- **Certificate reload.** ``ReloadingCertificate`` checks the certificate and key files (their
  device, inode, size and modification time, after following links, as a renewed Secret volume
  or ``colocation_manager.certs`` changes them) at every TLS handshake and loads them again
  when they changed, so the next handshake presents the renewed certificate without a restart.
  A pair that does not load (a half-written renewal, a key of another certificate) keeps the
  previous one and is logged once; it is tried again when the files change again.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import ssl
import threading
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from typing import Any

import structlog
from prometheus_client import Counter

from rhp_ops.files import FileRefused, read_regular_file

__all__ = ["KEEP_ALIVE_SECONDS", "MAX_PEM_BYTES", "ReloadingCertificate", "WebhookServer", "bounded"]

log = structlog.get_logger("colocation_manager.serving")

MAX_PEM_BYTES = 1 << 20
KEEP_ALIVE_SECONDS = 5
REFUSED = Counter("rhp_manager_webhook_refused_total",
                  "Webhook requests refused with 503 because max-inflight reviews were being answered")

Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]], Awaitable[None]]


def _signature(path: str) -> tuple[int, int, int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


class ReloadingCertificate:
    """A TLS server context that presents the certificate in ``cert`` and ``key`` as they are
    at each handshake. The constructor loads them (``ssl.SSLError``, ``OSError`` or
    ``FileRefused`` when it cannot)."""

    def __init__(self, cert: str, key: str) -> None:
        self.cert, self.key = cert, key
        self._lock = threading.Lock()
        self._loaded: tuple[tuple[int, int, int, int], ...] = ()
        self._failed: tuple[tuple[int, int, int, int], ...] = ()
        self._current = self._load()
        self._loaded = self._signatures()
        self.context = self._new_context()
        self.context.load_cert_chain(cert, key)
        self.context.sni_callback = self._on_hello
        self.reloads = 0

    def _signatures(self) -> tuple[tuple[int, int, int, int], ...]:
        return _signature(self.cert), _signature(self.key)

    @staticmethod
    def _new_context() -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        return context

    def _load(self) -> ssl.SSLContext:
        for path in (self.cert, self.key):
            read_regular_file(path, limit=MAX_PEM_BYTES)  # a FIFO or a huge file is refused unread
        context = self._new_context()
        context.load_cert_chain(self.cert, self.key)
        return context

    def current(self) -> ssl.SSLContext:
        """The context of the files as they are now (loaded again when they changed)."""
        with self._lock:
            try:
                seen = self._signatures()
            except OSError:
                return self._current  # between the removal and the new files of a renewal
            if seen in (self._loaded, self._failed):
                return self._current
            try:
                self._current = self._load()
            except (OSError, ssl.SSLError, FileRefused) as exc:
                self._failed = seen
                log.warning("renewed webhook certificate not loaded; serving the previous one",
                            cert=self.cert, error=str(exc)[:300])
                return self._current
            self._loaded = seen
            self.reloads += 1
            log.info("webhook certificate loaded again", cert=self.cert)
            return self._current

    def _on_hello(self, conn: ssl.SSLObject | ssl.SSLSocket, _server_name: str | None,
                  _context: ssl.SSLContext) -> None:
        conn.context = self.current()


def bounded(app: ASGIApp, max_inflight: int) -> ASGIApp:
    """``app`` answering at most ``max_inflight`` HTTP requests at once; the others get 503."""
    inflight = 0

    async def bounded_app(scope: Scope, receive: Callable[[], Awaitable[Any]],
                          send: Callable[[Any], Awaitable[None]]) -> None:
        nonlocal inflight
        if scope.get("type") != "http":
            await app(scope, receive, send)
            return
        if inflight >= max_inflight:
            REFUSED.inc()
            await send({"type": "http.response.start", "status": 503,
                        "headers": [(b"content-type", b"text/plain"), (b"retry-after", b"1")]})
            await send({"type": "http.response.body", "body": b"webhook busy\n"})
            return
        inflight += 1
        try:
            await app(scope, receive, send)
        finally:
            inflight -= 1

    return bounded_app


class WebhookServer:
    """uvicorn serving ``app`` over TLS on its own thread and event loop."""

    def __init__(self, app: ASGIApp, host: str, port: int, certificate: ReloadingCertificate, *,
                 max_inflight: int = 32, max_connections: int = 1024) -> None:
        import uvicorn

        if max_inflight < 1 or max_connections < max_inflight:
            raise ValueError("1 <= max_inflight <= max_connections")
        self.certificate = certificate
        # Bound here, so an address in use is the caller's error, not a silent thread's.
        self.sock = socket.create_server((host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET,
                                         reuse_port=False, backlog=max_connections)
        self.sock.setblocking(False)
        tls = certificate.context

        class Config(uvicorn.Config):
            def load(self) -> None:
                super().load()
                self.ssl = tls  # the reloading context, whatever uvicorn's version makes of files

        class Server(uvicorn.Server):
            @contextlib.contextmanager
            def capture_signals(self) -> Iterator[None]:  # the manager handles SIGTERM and SIGINT
                yield

        self.server = Server(Config(
            bounded(app, max_inflight), log_level="warning", log_config=None, access_log=False, lifespan="off",
            limit_concurrency=max_connections, timeout_keep_alive=KEEP_ALIVE_SECONDS,
        ))
        self._thread = threading.Thread(target=self._run, name="webhook", daemon=True)

    @property
    def port(self) -> int:
        port: int = self.sock.getsockname()[1]
        return port

    def _run(self) -> None:
        try:
            asyncio.run(self.server.serve(sockets=[self.sock]))
        except BaseException as exc:  # a thread's end is logged, never silent
            log.error("webhook server stopped", error=repr(exc)[:300])

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self.server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(timeout)
        self.sock.close()
