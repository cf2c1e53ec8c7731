"""Per-object isolation: one hostile object costs only itself, and is logged and counted.

Who calls this: ``scheduler_ext.state`` (watch events and lists), ``scheduler_ext.extender``
(the pod a bind reads), ``scheduler_ext.server`` (verb bodies) and ``scheduler_ext.cli``
(``simulate``). The parsers (``scheduler_ext.pods``, ``annotations``, ``topology``) raise
``ValueError`` for content they reject; the callers here also catch anything else a parser or a
wrongly typed object can raise (``AttributeError`` on a number where an object belongs,
``RecursionError`` on deep JSON, ``OverflowError`` on ``1e400``), as the last line that keeps
one object from stopping a watch, a list or a request.

Every skip increments ``scheduler_ext_bad_objects_total{kind, reason}``: ``kind`` is the watch
kind (``pods``, ``nodes``, ``noderesourcetopologies``, ``devices``) or ``request`` for verb
bodies; ``reason`` is one of the fixed words in ``REASONS`` (never an error text, so the label
set stays small).
"""

from __future__ import annotations

import dataclasses
import decimal
from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import Any

import structlog
from prometheus_client import Counter

from scheduler_ext.pods import PodRequest, parse_pod

__all__ = ["BAD_OBJECTS", "DECIMAL_EXPONENT_LIMIT", "REASONS", "bad_object", "bounded_decimals", "decode_pod",
           "describe"]

log = structlog.get_logger("scheduler_ext.guard")

REASONS = (
    "object",  # the object's own structure (metadata, spec, event) has the wrong types
    "allocation",  # a bound pod's resource-status / device-allocated cannot be read
    "request",  # a pod's resources or scheduling annotations cannot be read
    "topology",  # a node's CPU topology or reserved-CPU annotations cannot be read
    "devices",  # a Device object's GPU list cannot be read
    "undecodable",  # a watch line or list page that is not JSON
    "body",  # a verb request body over a bound or of the wrong shape
)

BAD_OBJECTS = Counter(
    "scheduler_ext_bad_objects_total",
    "Objects and requests skipped or rejected because their content could not be read, "
    "by kind and reason.",
    ["kind", "reason"],
)


# Decimal arithmetic inside the parsers stays within 10**±40: ample for any real quantity (1Ei is
# about 1.2e18 bytes), while "1e500000" raises decimal.Overflow at its first operation instead of
# expanding half a million digits (int() of it took seconds and held the GIL throughout).
DECIMAL_EXPONENT_LIMIT = 40


def bounded_decimals() -> AbstractContextManager[decimal.Context]:
    """A decimal context (thread- and task-local) whose exponents stay within the limit above."""
    return decimal.localcontext(Emax=DECIMAL_EXPONENT_LIMIT, Emin=-DECIMAL_EXPONENT_LIMIT)


def describe(exc: BaseException) -> str:
    """A one-line error text of bounded length (a parser's message may quote the input)."""
    text = f"{type(exc).__name__}: {exc}" if not isinstance(exc, ValueError) else str(exc)
    return text if len(text) <= 300 else text[:297] + "..."


def bad_object(kind: str, reason: str, name: str, exc: BaseException | str) -> str:
    """Log and count one skipped object; returns the error text."""
    error = exc if isinstance(exc, str) else describe(exc)
    BAD_OBJECTS.labels(kind, reason).inc()
    log.warning("skipped unreadable object", kind=kind, reason=reason, object=name[:300], error=error)
    return error


_EMPTY_POD = parse_pod({})


def decode_pod(pod: Mapping[str, Any]) -> PodRequest:
    """``parse_pod`` that never raises: any failure is a ``PodRequest`` whose ``error`` says why.

    A pod that cannot be decoded is refused on every node (filter reports it unresolvable, bind
    returns the error); it never fails the request or the watch that carried it.
    """
    try:
        with bounded_decimals():
            return parse_pod(pod)
    except Exception as exc:  # the last line: a parser bug or a type it did not expect
        meta = pod.get("metadata") if isinstance(pod, Mapping) else None
        meta = meta if isinstance(meta, Mapping) else {}
        name = f"{meta.get('namespace') or 'default'}/{meta.get('name') or ''}"
        error = bad_object("pods", "request", name, exc)
        return dataclasses.replace(
            _EMPTY_POD,
            uid=str(meta.get("uid") or "")[:128],
            namespace=str(meta.get("namespace") or "default")[:253],
            name=str(meta.get("name") or "")[:253],
            error=f"invalid pod request: {error}",
        )
