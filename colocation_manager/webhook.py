"""The pod admission webhook (``POST /mutate-pod``, ``POST /validate-pod``), served over HTTPS
by ``scheduler-ext manager --webhook-listen``.

Who calls this: ``colocation_manager.cli`` builds a ``WebhookState`` (fed by a ``Watches``
over Namespaces, ClusterColocationProfiles and PriorityClasses) and serves ``create_app`` with
``colocation_manager.serving.WebhookServer`` (its own thread and loop, a bound on reviews in
flight, a certificate reloaded when renewed); each review runs on a worker thread. The API
server sends an ``admission.k8s.io/v1`` AdmissionReview; ``review`` answers it with the pure
decisions of ``colocation_manager.profile``.

Hostile input: the body is bounded (``MAX_REVIEW_BYTES``, refused unread when its declared
length is larger, and cut off when the stream is) before one orjson decode; a review that is not
of the AdmissionReview shape gets HTTP 400; a pod that cannot be read is refused with the
reason (the mutation) or the rules' message (the validation), costing only that pod. A profile
that does not parse is left out and logged (``rhp_manager_bad_objects_total{kind}``); the
others still apply.
"""

from __future__ import annotations

import base64
import random
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
import structlog
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from colocation_manager.controller import BAD_OBJECTS
from colocation_manager.kubeio import NAMESPACES, PRIORITY_CLASSES
from colocation_manager.objects import string_map
from colocation_manager.profile import PriorityClassInfo, mutate_pod, validate_pod
from koord_formats import FormatError, profile
from koord_formats.errors import describe
from koord_formats.profile import ColocationProfile, parse_profile

__all__ = ["MAX_REVIEW_BYTES", "WEBHOOK_KINDS", "WebhookState", "create_app", "review"]

log = structlog.get_logger("colocation_manager.webhook")

# An AdmissionReview carries the pod (and on UPDATE the old pod): the API server stores objects
# of at most 1.5 MiB, so two of them and the envelope fit.
MAX_REVIEW_BYTES = 4 << 20
PROFILES = profile.PLURAL
WEBHOOK_KINDS = (NAMESPACES, PROFILES, PRIORITY_CLASSES)


@dataclass
class WebhookState:
    """What the webhook reads of the cluster, kept by watches (``replace`` and ``apply``)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    namespaces: dict[str, dict[str, str]] = field(default_factory=dict)
    profiles: dict[str, ColocationProfile] = field(default_factory=dict)
    priority_classes: dict[str, PriorityClassInfo] = field(default_factory=dict)
    synced: set[str] = field(default_factory=set)

    def _table(self, kind: str) -> dict[str, Any]:
        tables: dict[str, dict[str, Any]] = {NAMESPACES: self.namespaces, PROFILES: self.profiles,
                                             PRIORITY_CLASSES: self.priority_classes}
        return tables[kind]

    def replace(self, kind: str, items: list[dict[str, Any]], *, absent: bool = False) -> None:
        with self.lock:
            self._table(kind).clear()
        for obj in items:
            self.apply(kind, "ADDED", obj)
        with self.lock:
            self.synced.add(kind)

    def apply(self, kind: str, event: str, obj: Mapping[str, Any]) -> None:
        meta = obj.get("metadata")
        name = meta.get("name") if isinstance(meta, Mapping) else None
        if not isinstance(name, str) or not name or len(name) > 253:
            BAD_OBJECTS.labels(kind).inc()
            return
        table = self._table(kind)
        if event == "DELETED":
            with self.lock:
                table.pop(name, None)
            return
        try:
            value: Any
            if kind == NAMESPACES:
                value = string_map(meta.get("labels") if isinstance(meta, Mapping) else None, "namespace labels")
            elif kind == PROFILES:
                value = parse_profile(obj)
                for problem in value.problems:
                    log.warning("ClusterColocationProfile problem", profile=name, error=problem[:300])
            else:
                raw = obj.get("value")
                if isinstance(raw, bool) or not isinstance(raw, int) or not -(2**31) <= raw < 2**31:
                    raise FormatError("PriorityClass value: expected a 32-bit integer")
                policy = obj.get("preemptionPolicy")
                value = PriorityClassInfo(raw, policy if isinstance(policy, str) and len(policy) < 64 else "")
        except FormatError as exc:
            BAD_OBJECTS.labels(kind).inc()
            log.warning("object left out", kind=kind, name=name, error=describe(exc))
            with self.lock:
                table.pop(name, None)
            return
        with self.lock:
            table[name] = value

    def snapshot(self) -> tuple[dict[str, dict[str, str]], list[ColocationProfile], dict[str, PriorityClassInfo]]:
        with self.lock:
            return dict(self.namespaces), list(self.profiles.values()), dict(self.priority_classes)


class BadReview(ValueError):
    """A body that is not an AdmissionReview request."""


def _request_of(body: bytes) -> Mapping[str, Any]:
    if len(body) > MAX_REVIEW_BYTES:
        raise BadReview(f"body larger than {MAX_REVIEW_BYTES} bytes")
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BadReview(f"not JSON: {exc}") from None
    request = doc.get("request") if isinstance(doc, dict) else None
    if not isinstance(request, dict) or not isinstance(request.get("uid"), str) or len(request["uid"]) > 128:
        raise BadReview("not an AdmissionReview with a request and its uid")
    return request


def review(body: bytes, action: str, state: WebhookState, roll: Callable[[], int]) -> dict[str, Any]:
    """The AdmissionReview response to ``body`` for ``action`` ("mutate" or "validate");
    ``BadReview`` when the body is not an AdmissionReview request."""
    request = _request_of(body)
    response: dict[str, Any] = {"uid": request["uid"], "allowed": True}
    out = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}
    kind = request.get("kind")
    if not isinstance(kind, dict) or kind.get("kind") != "Pod" or kind.get("group") not in ("", None):
        return out
    operation = request.get("operation")
    pod = request.get("object")
    if not isinstance(pod, dict):
        return out
    raw_namespace = request.get("namespace")
    namespace = raw_namespace if isinstance(raw_namespace, str) else ""
    who = f"{namespace}/{(pod.get('metadata') or {}).get('name') or '(generated)'}"
    if action == "mutate":
        if operation != "CREATE":
            return out
        namespaces, profiles, classes = state.snapshot()
        mutation = mutate_pod(pod, namespaces.get(namespace, {}), profiles, classes, roll)
        if mutation.error:
            log.warning("pod refused by the mutating webhook", pod=who, error=mutation.error[:300])
            response.update(allowed=False, status={"code": 400, "message": mutation.error[:1000]})
        elif mutation.patch:
            response["patchType"] = "JSONPatch"
            response["patch"] = base64.b64encode(orjson.dumps(list(mutation.patch))).decode()
            log.info("pod mutated", pod=who, profiles=list(mutation.profiles))
        return out
    if operation not in ("CREATE", "UPDATE"):
        return out
    old = request.get("oldObject") if operation == "UPDATE" else None
    errors = validate_pod(pod, old if isinstance(old, dict) else None)
    if errors:
        message = "; ".join(errors)[:1000]
        log.info("pod refused by the validating webhook", pod=who, error=message)
        response.update(allowed=False, status={"code": 422, "message": message})
    return out


async def _body(request: Request) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > MAX_REVIEW_BYTES):
        raise BadReview(f"body larger than {MAX_REVIEW_BYTES} bytes")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_REVIEW_BYTES:
            raise BadReview(f"body larger than {MAX_REVIEW_BYTES} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def create_app(state: WebhookState, roll: Callable[[], int] | None = None) -> Starlette:
    """The webhook's ASGI app (``roll``: the probability draw, 0..99; random by default)."""
    draw = roll or (lambda: random.randrange(100))  # a sampling draw, not a secret

    def handler(action: str) -> Callable[[Request], Any]:
        async def handle(request: Request) -> Response:
            try:
                # On a worker thread: a review that takes long never holds the webhook's loop.
                answer = await run_in_threadpool(review, await _body(request), action, state, draw)
            except BadReview as exc:
                return Response(str(exc), status_code=400, media_type="text/plain")
            return Response(orjson.dumps(answer), media_type="application/json")

        return handle

    async def healthz(_: Request) -> Response:
        return Response("ok", media_type="text/plain")

    return Starlette(routes=[
        Route("/mutate-pod", handler("mutate"), methods=["POST"]),
        Route("/validate-pod", handler("validate"), methods=["POST"]),
        Route("/healthz", healthz, methods=["GET"]),
    ])
