"""The HTTP face of the extender: JSON in, one call into ``scheduler_ext.extender``, JSON out.

Who calls this: kube-scheduler's HTTPExtender, with Go's ``encoding/json`` field names (the
extender structs carry no json tags, so the keys are ``Pod``, ``Nodes``, ``NodeNames``,
``FailedNodes``, ``FailedAndUnresolvableNodes``, ``Error``, ``Host``, ``Score``, ``PodName``,
``PodNamespace``, ``PodUID``, ``Node``, ``NodeNameToVictims``, ``NodeNameToMetaVictims``,
``Pods``, ``UID``, ``NumPDBViolations``). ``scheduler_ext.cli serve`` runs the app under uvicorn.

Both ``nodeCacheCapable`` modes are accepted: with ``NodeNames`` the reply carries
``NodeNames``; with ``Nodes`` (a NodeList) it carries the surviving Node objects unchanged.

Failure policy: a request that cannot be decoded gets HTTP 200 with ``Error`` set for filter
and bind (kube-scheduler then reports a scheduler error and retries with backoff) and HTTP 400
for prioritize and preempt (the scheduler ignores a failed prioritize). Every verb runs on the
event loop: filter and prioritize only read the cache, and bind is a coroutine whose API calls
await, so the next pod's filter is served while a bind waits on the API server.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from typing import Any

import orjson
import structlog
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from scheduler_ext.extender import (
    DEFAULT_CONFIG,
    Binder,
    ExtenderConfig,
    filter_nodes,
    preempt_nodes,
    prioritize_nodes,
)
from scheduler_ext.guard import decode_pod
from scheduler_ext.state import ClusterState

__all__ = ["ExtenderApp", "create_app", "create_health_app"]

log = structlog.get_logger("scheduler_ext.server")

VERB_SECONDS = Histogram(
    "scheduler_ext_verb_duration_seconds",
    "Time spent serving one extender verb, request decoding included.",
    ["verb"],
    buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)
VERB_TOTAL = Counter(
    "scheduler_ext_verb_requests_total", "Extender verbs served, by outcome.", ["verb", "outcome"]
)
NODES_FAILED = Counter(
    "scheduler_ext_filter_failed_nodes_total", "Nodes filtered out, by kind.", ["kind"]
)

CONTENT_TYPE_LATEST = "text/plain; version=0.0.4; charset=utf-8"


class StateCollector(Collector):
    """Cache size, held allocations and GPU fragmentation, computed at scrape time."""

    def __init__(self, state: ClusterState) -> None:
        self.state = state

    def collect(self) -> Iterator[GaugeMetricFamily]:
        counts = self.state.snapshot_counts()
        yield GaugeMetricFamily("scheduler_ext_nodes", "Nodes in the cache.", value=counts["nodes"])
        yield GaugeMetricFamily("scheduler_ext_pods", "Pods in the cache.", value=counts["pods"])
        yield GaugeMetricFamily(
            "scheduler_ext_held_allocations",
            "Allocations held by binds that the watch has not confirmed yet.",
            value=counts["held"],
        )
        yield GaugeMetricFamily(
            "scheduler_ext_gpu_fragmentation_ratio",
            "Share of free GPU core that sits on partially used GPUs (0 = every free GPU is whole).",
            value=self.state.gpu_fragmentation(),
        )
        yield GaugeMetricFamily(
            "scheduler_ext_ready", "1 when the first list of every kind is in the cache.",
            value=1.0 if self.state.ready else 0.0,
        )


JSON_TYPE = b"application/json"
TEXT_TYPE = b"text/plain; charset=utf-8"

# (status, body, content type): what a verb handler returns; the ASGI front sends it as is
Reply = tuple[int, bytes, bytes]
VerbHandler = Callable[[bytes], Awaitable[Reply]]


def _json(data: Any, status: int = 200) -> Reply:
    return status, orjson.dumps(data), JSON_TYPE


def _text(text: str, status: int) -> Reply:
    return status, text.encode(), TEXT_TYPE


def _timed(verb: str, fn: VerbHandler) -> VerbHandler:
    seconds = VERB_SECONDS.labels(verb)
    totals = {o: VERB_TOTAL.labels(verb, o) for o in ("ok", "bad_request", "error")}

    async def handler(raw: bytes) -> Reply:
        started = time.perf_counter()
        outcome = "ok"
        try:
            reply = await fn(raw)
            if reply[0] != 200:
                outcome = "bad_request"
            return reply
        except Exception:
            outcome = "error"
            raise
        finally:
            seconds.observe(time.perf_counter() - started)
            totals[outcome].inc()

    return handler


def _body(raw: bytes) -> dict[str, Any]:
    try:
        doc = orjson.loads(raw)
    except ValueError as exc:  # orjson.JSONDecodeError is a ValueError
        raise ValueError(f"request body is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ValueError("request body must be a JSON object")
    return doc


class ExtenderApp:
    """The ASGI app: the four POST verbs straight off the ASGI messages, the rest via Starlette.

    The verbs are the hot path (three calls per pod). Starlette's middleware stack, routing
    and Request/Response objects cost about a quarter of a filter call's CPU, so the verbs skip
    them; a wrong method on a verb path and every GET still go through Starlette (405, 404).
    """

    def __init__(self, verbs: Mapping[str, VerbHandler], fallback: Starlette) -> None:
        self.verbs = dict(verbs)
        self.fallback = fallback

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        handler = self.verbs.get(scope["path"]) if scope["type"] == "http" else None
        if handler is None or scope["method"] != "POST":
            await self.fallback(scope, receive, send)
            return
        chunks: list[bytes] = []
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        try:
            status, body, ctype = await handler(b"".join(chunks))
        except Exception:
            log.exception("verb failed", path=scope["path"])
            status, body, ctype = _text("Internal Server Error", 500)
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", ctype), (b"content-length", str(len(body)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": body})


def _names(args: dict[str, Any]) -> tuple[list[str], list[dict[str, Any]] | None]:
    """Candidate names, and the Node objects when sent (nodeCacheCapable: false)."""
    names = args.get("NodeNames")
    if names is not None:
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise ValueError("NodeNames must be a list of strings")
        return names, None
    nodes = args.get("Nodes")
    if isinstance(nodes, dict):
        items = nodes.get("items") or []
        if not isinstance(items, list):
            raise ValueError("Nodes.items must be a list")
        out = [str(((i or {}).get("metadata") or {}).get("name") or "") for i in items]
        return out, items
    return [], None


Endpoint = Callable[[Request], Awaitable[Response]]


def _probe_endpoints(state: ClusterState) -> tuple[Endpoint, Endpoint, Endpoint]:
    """``/healthz``, ``/readyz`` and ``/metrics`` of one cache."""
    registry = CollectorRegistry(auto_describe=True)
    registry.register(StateCollector(state))

    async def healthz(request: Request) -> Response:
        return PlainTextResponse("ok")

    async def readyz(request: Request) -> Response:
        if state.ready:
            return PlainTextResponse("ok")
        missing = sorted({"nodes", "pods", "noderesourcetopologies", "devices"} - state.synced)
        return PlainTextResponse(f"cache not synced: {', '.join(missing)}", status_code=503)

    async def metrics(request: Request) -> Response:
        body = generate_latest(REGISTRY) + generate_latest(registry)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    return healthz, readyz, metrics


def create_health_app(state: ClusterState) -> Starlette:
    """Only ``GET /healthz``, ``/readyz`` and ``/metrics``: for ``serve --health-listen``, where
    kubelet probes and scrapers connect without the client certificate the verbs require."""
    healthz, readyz, metrics = _probe_endpoints(state)
    return Starlette(
        routes=[
            Route("/healthz", healthz, methods=["GET"]),
            Route("/readyz", readyz, methods=["GET"]),
            Route("/metrics", metrics, methods=["GET"]),
        ]
    )


def create_app(
    state: ClusterState,
    binder: Binder | None,
    cfg: ExtenderConfig = DEFAULT_CONFIG,
    *,
    prefix: str = "",
) -> ExtenderApp:
    """The ASGI app. ``binder`` is ``None`` when no API server is configured."""
    prefix = "/" + prefix.strip("/") if prefix.strip("/") else ""

    async def filter_verb(raw: bytes) -> Reply:
        try:
            args = _body(raw)
            pod_json = args.get("Pod")
            if not isinstance(pod_json, dict):
                raise ValueError("Pod is missing")
            names, items = _names(args)
        except ValueError as exc:
            return _json({"Nodes": None, "NodeNames": None, "FailedNodes": {},
                          "FailedAndUnresolvableNodes": {}, "Error": str(exc)})
        pod = decode_pod(pod_json)
        result = filter_nodes(state, pod, names, cfg)
        if result.failed:
            NODES_FAILED.labels("failed").inc(len(result.failed))
        if result.unresolvable:
            NODES_FAILED.labels("unresolvable").inc(len(result.unresolvable))
        reply: dict[str, Any] = {
            "FailedNodes": result.failed,
            "FailedAndUnresolvableNodes": result.unresolvable,
            "Error": "",
        }
        if items is None:
            reply["Nodes"], reply["NodeNames"] = None, result.passed
        else:
            keep = set(result.passed)
            reply["Nodes"] = {"items": [i for i, n in zip(items, names, strict=True) if n in keep]}
            reply["NodeNames"] = None
        return _json(reply)

    async def prioritize_verb(raw: bytes) -> Reply:
        try:
            args = _body(raw)
            pod_json = args.get("Pod")
            if not isinstance(pod_json, dict):
                raise ValueError("Pod is missing")
            names, _ = _names(args)
        except ValueError as exc:
            return _text(str(exc), 400)
        scores = prioritize_nodes(state, decode_pod(pod_json), names, cfg)
        return 200, orjson.dumps([{"Host": n, "Score": s} for n, s in scores]), JSON_TYPE

    async def bind_verb(raw: bytes) -> Reply:
        try:
            args = _body(raw)
            name, namespace = args.get("PodName"), args.get("PodNamespace")
            uid, node = args.get("PodUID") or "", args.get("Node")
            if not (isinstance(name, str) and name and isinstance(namespace, str) and namespace):
                raise ValueError("PodName and PodNamespace are required")
            if not (isinstance(node, str) and node) or not isinstance(uid, str):
                raise ValueError("Node is required and PodUID must be a string")
        except ValueError as exc:
            return _json({"Error": str(exc)})
        if binder is None:
            return _json({"Error": "this extender runs without an API server and cannot bind"})
        return _json({"Error": await binder.bind(namespace, name, uid, node)})

    async def preempt_verb(raw: bytes) -> Reply:
        try:
            args = _body(raw)
            pod_json = args.get("Pod")
            if not isinstance(pod_json, dict):
                raise ValueError("Pod is missing")
            victims: dict[str, list[str]] = {}
            pdb: dict[str, int] = {}
            meta = args.get("NodeNameToMetaVictims")
            full = args.get("NodeNameToVictims")
            source = meta if isinstance(meta, dict) else full if isinstance(full, dict) else {}
            for node, v in source.items():
                pods = (v or {}).get("Pods") or []
                if source is meta:
                    victims[node] = [str(p.get("UID") or "") for p in pods]
                else:
                    victims[node] = [str(((p.get("metadata") or {}).get("uid")) or "") for p in pods]
                pdb[node] = int((v or {}).get("NumPDBViolations") or 0)
        except (ValueError, AttributeError, TypeError) as exc:
            return _text(f"bad preempt request: {exc}", 400)
        kept = preempt_nodes(state, decode_pod(pod_json), victims, cfg)
        return _json(
            {
                "NodeNameToMetaVictims": {
                    node: {"Pods": [{"UID": u} for u in uids], "NumPDBViolations": pdb.get(node, 0)}
                    for node, uids in kept.items()
                }
            }
        )

    healthz, readyz, metrics = _probe_endpoints(state)

    verbs: dict[str, VerbHandler] = {
        f"{prefix}/filter": _timed("filter", filter_verb),
        f"{prefix}/prioritize": _timed("prioritize", prioritize_verb),
        f"{prefix}/bind": _timed("bind", bind_verb),
        f"{prefix}/preempt": _timed("preempt", preempt_verb),
    }

    async def not_post(request: Request) -> Response:  # routed only for the 405 it earns
        return PlainTextResponse("Method Not Allowed", status_code=405)

    routes = [
        *(Route(path, not_post, methods=["POST"]) for path in verbs),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            if binder is not None:
                await binder.aclose()  # the bind path's HTTP session lives on this loop

    return ExtenderApp(verbs, Starlette(routes=routes, lifespan=lifespan))
