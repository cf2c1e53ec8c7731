"""The proxy's shared Prometheus metrics and the optional HTTP endpoint that serves them.

Written by the transports (per-method latency and codes), the interceptor (skipped hooks), the
pipeline (per-plugin latency, errors, timeouts, conflicts), the hook-server registry (refused
registrations), the store (objects tracked) and the server (runtime health). The loops, the
node config, sysfs and ``runtime_proxy.engine.bound`` keep their own metrics next to their code;
all are in the default registry and scraped from ``--metrics-addr`` (``:PORT`` = loopback).
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram, start_http_server

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


def serve(addr: str) -> None:
    """Serve /metrics on ``HOST:PORT`` (``:PORT`` = loopback) in a background thread."""
    host, port = parse_addr(addr)
    start_http_server(port, addr=host)
