"""The proxy's shared Prometheus metrics and the optional HTTP endpoint that serves them with
the probes (``rhp_ops.probes``): ``GET /metrics``, ``/healthz`` (200 unless the command's
liveness check fails: the node config's cluster watch dead or silent past its bound) and
``/readyz`` (200 when the command's readiness check passes, 503 with the reason otherwise);
every other path is 404 and every other method 405.

Written by the transports (per-method latency and codes), the interceptor (skipped hooks), the
pipeline (per-plugin latency, errors, timeouts, conflicts), the hook-server registry (refused
registrations), the store (objects tracked) and the server (runtime health). The loops, the
node config, sysfs and ``runtime_proxy.engine.bound`` keep their own metrics next to their code;
all are in the default registry and scraped from ``--metrics-addr`` (``:PORT`` = loopback).
"""

from __future__ import annotations

import socket
from http.server import ThreadingHTTPServer

from prometheus_client import Counter, Gauge, Histogram

from rhp_ops import probes
from rhp_ops.probes import Check, parse_addr

# A readiness or liveness check: (ok, reason). It runs on the HTTP server's thread, never the event loop.
Readiness = Check
__all__ = ["Readiness", "parse_addr", "serve", "socket_accepts"]

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


def serve(addr: str, readiness: Readiness | None = None, liveness: Readiness | None = None) -> ThreadingHTTPServer:
    """Serve ``/metrics``, ``/healthz`` and ``/readyz`` on ``HOST:PORT`` (``:PORT`` = loopback)
    in a background thread (``rhp_ops.probes.serve``): ``readiness`` decides ``/readyz`` and
    ``liveness`` ``/healthz`` (each always passes when ``None``). Returns the server
    (``shutdown()`` and ``server_close()`` stop it). Raises ``OSError`` when the address cannot
    be used and ``ValueError`` for a malformed one."""
    return probes.serve(addr, "runtime-proxy", readiness=readiness, liveness=liveness)
