"""The relay's call metrics, as the grpc transport records them: one
``rhp_cri_call_duration_seconds{method}`` observation per timed call and one
``rhp_cri_call_errors_total{method,code}`` when its status is not OK (``runtime_proxy.metrics``).

Used by the session units: a call is timed from its request headers to the moment the caller
has its status (``SessionState._finish``).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

from runtime_proxy import metrics
from runtime_proxy.cri.relay import _wire as w

if TYPE_CHECKING:
    from prometheus_client import Histogram

# gRPC status code names by number, as ``grpc.StatusCode`` names them (the metrics' ``code``).
CODE_NAMES = (
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
)
# What a caller sees when the server resets a stream, by HTTP/2 error code (gRPC's mapping).
RST_CODES = {w.CANCEL: "CANCELLED", w.REFUSED_STREAM: "UNAVAILABLE"}

perf = time.perf_counter
_LATENCY: dict[str, Histogram] = {}  # method -> its child of metrics.CALL_LATENCY


def observe_call(method: str, code: str, seconds: float) -> None:
    """``metrics.observe_call``, with the per-method histogram looked up once."""
    child = _LATENCY.get(method)
    if child is None:
        child = _LATENCY[method] = metrics.CALL_LATENCY.labels(method)
    child.observe(seconds)
    if code != "OK":
        metrics.CALL_ERRORS.labels(method, code).inc()


def code_name(number: int) -> str:
    return CODE_NAMES[number] if 0 <= number < len(CODE_NAMES) else "UNKNOWN"


def status_of(headers: Iterable[tuple[bytes, bytes]]) -> str:
    """The ``code`` label for a trailer block: its grpc-status, by name."""
    for name, value in headers:
        if name == b"grpc-status":
            try:
                return code_name(int(value))
            except ValueError:
                return "UNKNOWN"
    return "UNKNOWN"
