"""Per-object isolation: one hostile object costs only itself, and is logged and counted.

Who calls this: ``scheduler_ext.state`` (watch events and lists), ``scheduler_ext.binder``
(the pod a bind reads), ``scheduler_ext.server`` (verb bodies) and ``scheduler_ext.cli``
(``simulate``). The parsers (``koord_formats``, and ``scheduler_ext.pods``, ``annotations``,
``topology`` on top of it) raise ``koord_formats.FormatError`` for content they reject, and
``parse_pod`` turns that into ``PodRequest.error``; the callers here also catch anything else,
as the last line that keeps one object from stopping a watch, a list or a request.

Every skip increments ``scheduler_ext_bad_objects_total{kind, reason}``: ``kind`` is the watch
kind (``pods``, ``nodes``, ``noderesourcetopologies``, ``devices``, ``reservations``) or ``request`` for verb
bodies; ``reason`` is one of the fixed words in ``REASONS`` (never an error text, so the label
set stays small).
"""

from __future__ import annotations

import dataclasses
import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import structlog
from prometheus_client import Counter

from koord_formats.errors import describe
from scheduler_ext.pods import PodRequest, parse_pod

__all__ = ["BAD_OBJECTS", "MAX_BODY_BYTES", "REASONS", "bad_object", "decode_pod", "describe"]

log = structlog.get_logger("scheduler_ext.guard")

# The largest verb body ``scheduler_ext.server`` reads (``scheduler-ext serve --max-body-bytes``
# by default). A NodeList of 500 full Node objects (nodeCacheCapable: false) is a few MiB; orjson
# decodes 8 MiB in a few tens of milliseconds, the most one request may hold the loop for.
MAX_BODY_BYTES = 8 << 20

REASONS = (
    "object",  # the object's own structure (metadata, spec, event) has the wrong types
    "allocation",  # a bound pod's resource-status / device-allocated cannot be read
    "request",  # a pod's resources or scheduling annotations cannot be read
    "topology",  # a node's CPU topology or reserved-CPU annotations cannot be read
    "devices",  # a Device object's GPU list cannot be read
    "reservation",  # a Reservation's owners, policies, status or annotations cannot be read
    "undecodable",  # a watch line or list page that is not JSON
    "body",  # a verb request body over a bound or of the wrong shape
)

BAD_OBJECTS = Counter(
    "scheduler_ext_bad_objects_total",
    "Objects and requests skipped or rejected because their content could not be read, "
    "by kind and reason.",
    ["kind", "reason"],
)


def bad_object(kind: str, reason: str, name: str, exc: BaseException | str) -> str:
    """Log and count one skipped object; returns the error text."""
    error = exc if isinstance(exc, str) else describe(exc)
    BAD_OBJECTS.labels(kind, reason).inc()
    log.warning("skipped unreadable object", kind=kind, reason=reason, object=name[:300], error=error)
    return error


_EMPTY_POD = parse_pod({})


# (uid, resourceVersion) -> the pod's decoded request; least recently used first out
_DECODED: OrderedDict[tuple[str, str], PodRequest] = OrderedDict()
_DECODED_MAX = 4096
_DECODED_LOCK = threading.Lock()


def _version_key(pod: object) -> tuple[str, str] | None:
    """``(uid, resourceVersion)`` when the pod carries both as short strings, else ``None``.

    The API server gives every change of an object a new resourceVersion, so one key always
    stands for one content: the pod kube-scheduler sends to filter, prioritize and preempt is
    the object the watch saw."""
    if not isinstance(pod, Mapping):
        return None
    meta = pod.get("metadata")
    if not isinstance(meta, Mapping):
        return None
    uid, rv = meta.get("uid"), meta.get("resourceVersion")
    if isinstance(uid, str) and isinstance(rv, str) and 0 < len(uid) <= 253 and 0 < len(rv) <= 253:
        return uid, rv
    return None


def decode_pod(pod: Mapping[str, Any]) -> PodRequest:
    """``parse_pod`` that never raises: any failure is a ``PodRequest`` whose ``error`` says why,
    logged and counted once per pod version.

    A pod that cannot be decoded is refused on every node (filter reports it unresolvable, bind
    returns the error); it never fails the request or the watch that carried it. Results are
    memoised by ``(uid, resourceVersion)`` (at most ``_DECODED_MAX`` versions): the verbs of
    one scheduling cycle and the watch decode the same version once, and an invalid pod is
    logged and counted once, not on every verb call.
    """
    key = _version_key(pod)
    if key is not None:
        with _DECODED_LOCK:
            hit = _DECODED.get(key)
            if hit is not None:
                _DECODED.move_to_end(key)
                return hit
    req = _decode(pod)
    if key is not None:
        with _DECODED_LOCK:
            _DECODED[key] = req
            if len(_DECODED) > _DECODED_MAX:
                _DECODED.popitem(last=False)
    return req


def _decode(pod: Mapping[str, Any]) -> PodRequest:
    try:
        req = parse_pod(pod)
        if req.error:
            bad_object("pods", "request", req.full_name, req.error)
        return req
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
