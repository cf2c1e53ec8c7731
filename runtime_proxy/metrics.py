"""The proxy's shared Prometheus metrics and the optional HTTP endpoint that serves them with
the probes: ``GET /metrics``, ``/healthz`` (200 while the process serves HTTP) and ``/readyz``
(200 when the command's readiness check passes, 503 with the reason otherwise); every other path
is 404 and every other method 405.

Written by the transports (per-method latency and codes), the interceptor (skipped hooks), the
pipeline (per-plugin latency, errors, timeouts, conflicts), the hook-server registry (refused
registrations), the store (objects tracked) and the server (runtime health). The loops, the
node config, sysfs and ``runtime_proxy.engine.bound`` keep their own metrics next to their code;
all are in the default registry and scraped from ``--metrics-addr`` (``:PORT`` = loopback).
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import REGISTRY, Counter, Gauge, Histogram
from prometheus_client.exposition import choose_encoder

from rhp_ops.build import export_build_info

# A readiness check: (ready, reason). It runs on the HTTP server's thread, never the event loop.
Readiness = Callable[[], tuple[bool, str]]

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)

CALL_LATENCY = Histogram(
    "rhp_cri_call_duration_seconds",
    "Time to serve a CRI call through the proxy, by method.",
    ["method"],
    buckets=_LATENCY_BUCKETS,
)
CALL_ERRORS = Counter(
    "rhp_cri_call_errors_total", "CRI calls that ended with a status other than OK.", ["method", "code"]
)
PLUGIN_LATENCY = Histogram(
    "rhp_plugin_duration_seconds", "Time spent in one plugin call.", ["plugin", "stage"], buckets=_LATENCY_BUCKETS
)
PLUGIN_ERRORS = Counter(
    "rhp_plugin_errors_total",
    "Plugin calls that raised, returned garbage or conflicted, by policy outcome.",
    ["plugin", "stage", "kind"],
)
PLUGIN_TIMEOUTS = Counter("rhp_plugin_timeouts_total", "Plugin calls that ran past their timeout.", ["plugin", "stage"])
HOOKS_SKIPPED = Counter("rhp_hooks_skipped_total", "Calls whose hooks were skipped, by reason.", ["reason"])
STORE_OBJECTS = Gauge("rhp_store_objects", "Pods and containers the proxy tracks.", ["kind"])
RELAY_LIMIT_HITS = Counter(
    "rhp_relay_limit_hits_total",
    "Times a peer hit one of the relay's resource limits (runtime_proxy/cri/relay/_limits.py).",
    ["limit"],
)
NRI_LIMIT_HITS = Counter(
    "rhp_nri_limit_hits_total",
    "Times the NRI runtime hit one of the plugin's limits (requests_in_flight: a request dropped; "
    "write_timeout: a session closed because the runtime did not read our replies; synchronize_bytes, "
    "synchronize_objects: a Synchronize refused).",
    ["limit"],
)
NRI_EVENTS_IGNORED = Counter(
    "rhp_nri_events_ignored_total",
    "NRI events ignored because their pod is not in the plugin's store (only creating events add pods).",
    ["event"],
)
BACKEND_UP = Gauge("rhp_backend_up", "1 when the runtime answered the last health check.")
REGISTRATIONS_REFUSED = Counter(
    "rhp_hookserver_registrations_refused_total",
    "Hook-server registration files refused (unsafe owner or mode, symlink, malformed, own socket), by reason.",
    ["reason"],
)


def observe_call(method: str, code: str, seconds: float) -> None:
    CALL_LATENCY.labels(method).observe(seconds)
    if code != "OK":
        CALL_ERRORS.labels(method, code).inc()


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


def socket_accepts(path: str, timeout: float = 1.0) -> tuple[bool, str]:
    """Whether a unix stream socket at ``path`` accepts a connection: ``(True, "")`` or
    ``(False, why)``. Blocking: readiness checks call it on the HTTP server's thread."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(path)
        return True, ""
    except OSError as exc:
        return False, exc.strerror or type(exc).__name__
    finally:
        sock.close()


def _always_ready() -> tuple[bool, str]:
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
        elif path == "/healthz":
            self._send(200, b"ok\n")
        elif path == "/readyz":
            try:
                ready, reason = self.server.readiness()
            except Exception as exc:  # a failing check means "not ready", never a dead probe
                ready, reason = False, f"readiness check failed: {type(exc).__name__}"
            self._send(200 if ready else 503, (reason or ("ok" if ready else "not ready")).encode()[:4096] + b"\n")
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

    def __init__(self, address: tuple[str, int], readiness: Readiness) -> None:
        self.readiness = readiness
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, _Handler)


def serve(addr: str, readiness: Readiness | None = None) -> ThreadingHTTPServer:
    """Serve ``/metrics``, ``/healthz`` and ``/readyz`` on ``HOST:PORT`` (``:PORT`` = loopback)
    in a background thread; ``readiness`` decides ``/readyz`` (always ready when ``None``).
    Returns the server (``shutdown()`` and ``server_close()`` stop it). Raises ``OSError`` when
    the address cannot be used and ``ValueError`` for a malformed one."""
    host, port = parse_addr(addr)
    export_build_info("runtime-proxy")
    server = _ProbeServer((host, port), readiness or _always_ready)
    threading.Thread(target=server.serve_forever, name="rhp-metrics", daemon=True).start()
    return server
