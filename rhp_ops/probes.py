"""The probe and metrics endpoint every long-running command serves: ``GET /metrics`` (the
default Prometheus registry), ``/healthz`` (liveness: 503 with the reason when the command's
liveness check fails, so kubelet restarts it) and ``/readyz`` (readiness: 503 with the reason
until the command can serve); every other path is 404 and every other method 405. A plain
``http.server`` on its own thread: a busy or blocked event loop never delays a probe.

Used by ``runtime_proxy.metrics`` (``runtime-proxy serve``, ``nri``, ``hook-server``) and the
manager (``scheduler-ext manager --metrics-listen``); imports nothing of ours but
``rhp_ops.build``.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import REGISTRY
from prometheus_client.exposition import choose_encoder

from rhp_ops.build import export_build_info

__all__ = ["Check", "parse_addr", "serve"]

# A readiness or liveness check: (ok, reason). It runs on the HTTP server's thread, never an event loop.
Check = Callable[[], tuple[bool, str]]


def parse_addr(addr: str) -> tuple[str, int]:
    """``HOST:PORT`` -> ``(host, port)``. An empty host (``:9464``) means loopback
    (``127.0.0.1``), never every interface; ``[::1]:9464`` gives ``::1``. Raises ValueError."""
    host, sep, port_text = addr.strip().rpartition(":")
    if not sep or not port_text.isascii() or not port_text.isdigit():
        raise ValueError(f"metrics address {addr!r} must be HOST:PORT or :PORT")
    port = int(port_text)
    if not 0 < port < 65536:
        raise ValueError(f"metrics address {addr!r}: port must be in 1..65535")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not host:
        host = "127.0.0.1"
    return host, port


def _always() -> tuple[bool, str]:
    return True, "ok"


class _Handler(BaseHTTPRequestHandler):
    server: _ProbeServer
    protocol_version = "HTTP/1.1"
    timeout = 10  # seconds a client may take to send its request

    def _send(self, code: int, body: bytes, content_type: str = "text/plain; charset=utf-8") -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
            self._send(200, encoder(REGISTRY), content_type)
        elif path in ("/healthz", "/readyz"):
            check = self.server.liveness if path == "/healthz" else self.server.readiness
            what = "liveness" if path == "/healthz" else "readiness"
            try:
                ok, reason = check()
            except Exception as exc:  # a failing check means "not ok", never a dead probe
                ok, reason = False, f"{what} check failed: {type(exc).__name__}"
            self._send(200 if ok else 503, (reason or ("ok" if ok else f"{what} failed")).encode()[:4096] + b"\n")
        else:
            self._send(404, b"not found; try /metrics, /healthz or /readyz\n")

    do_HEAD = do_GET

    def _refuse(self) -> None:
        self._send(405, b"method not allowed\n")

    do_POST = do_PUT = do_DELETE = do_PATCH = _refuse

    def log_message(self, format: str, *args: object) -> None:
        return  # requests are not logged; scrapes and probes come every few seconds


class _ProbeServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], readiness: Check, liveness: Check) -> None:
        self.readiness, self.liveness = readiness, liveness
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, _Handler)


def serve(addr: str, component: str, *, readiness: Check | None = None,
          liveness: Check | None = None) -> ThreadingHTTPServer:
    """Serve ``/metrics`` (with ``rhp_build_info{component}``), ``/healthz`` and ``/readyz`` on
    ``HOST:PORT`` (``:PORT`` = loopback) in a background thread; ``liveness`` decides
    ``/healthz`` and ``readiness`` ``/readyz`` (each always passes when ``None``). Returns the
    server (``shutdown()`` and ``server_close()`` stop it). Raises ``OSError`` when the address
    cannot be used and ``ValueError`` for a malformed one."""
    host, port = parse_addr(addr)
    export_build_info(component)
    server = _ProbeServer((host, port), readiness or _always, liveness or _always)
    threading.Thread(target=server.serve_forever, name=f"{component}-probes", daemon=True).start()
    return server
