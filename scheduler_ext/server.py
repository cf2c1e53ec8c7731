"""The HTTP face of the extender: JSON in, one call into ``scheduler_ext.verbs`` (filter,
prioritize, preempt) or ``scheduler_ext.binder`` (bind), JSON out.

Who calls this: kube-scheduler's HTTPExtender, with Go's ``encoding/json`` field names (the
extender structs carry no json tags, so the keys are ``Pod``, ``Nodes``, ``NodeNames``,
``FailedNodes``, ``FailedAndUnresolvableNodes``, ``Error``, ``Host``, ``Score``, ``PodName``,
``PodNamespace``, ``PodUID``, ``Node``, ``NodeNameToVictims``, ``NodeNameToMetaVictims``,
``Pods``, ``UID``, ``NumPDBViolations``). ``scheduler_ext.cli serve`` runs the app under uvicorn.

Both ``nodeCacheCapable`` modes are accepted: with ``NodeNames`` the reply carries
``NodeNames``; with ``Nodes`` (a NodeList) it carries the surviving Node objects unchanged.

Failure policy: a body that is malformed or over a bound (``MAX_BODY_BYTES``, ``MAX_NODES``,
``MAX_VICTIM_PODS``, and orjson's nesting limit of 1024) gets HTTP 200 with ``Error`` set for
filter and bind, whose reply types carry that field (kube-scheduler then reports a scheduler
error and retries with backoff), and HTTP 400 with the reason as text for prioritize and
preempt, whose reply types have no error field (kube-scheduler treats any non-200 as that
verb's error: a failed prioritize adds no score, a failed preempt fails that preemption). A
pod whose content is invalid is not a malformed body: filter reports it on every node as
``FailedAndUnresolvableNodes`` with the reason. Every verb runs on the event loop: filter and
prioritize only read the cache, and bind is a coroutine whose API calls await, so the next
pod's filter is served while a bind waits on the API server.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from typing import Any, Protocol, TypeVar

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

from rhp_kube.liveness import Liveness
from rhp_ops.build import export_build_info
from scheduler_ext.admission import ERR_INVALID_CPU_TOPOLOGY
from scheduler_ext.binder import Binder
from scheduler_ext.decide import DEFAULT_CONFIG, ExtenderConfig
from scheduler_ext.guard import BAD_OBJECTS, MAX_BODY_BYTES, decode_pod, describe
from scheduler_ext.pods import PodRequest
from scheduler_ext.requeue import Requeuer, topology_refusals
from scheduler_ext.state import ClusterState
from scheduler_ext.verbs import FilterResult, filter_nodes, preempt_nodes, prioritize_nodes

__all__ = [
    "MAX_BODY_BYTES",
    "MAX_NODES",
    "MAX_VICTIM_PODS",
    "BadRequest",
    "ExtenderApp",
    "create_app",
    "create_health_app",
]

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

# Bounds on one verb body, checked before (size: ``MAX_BODY_BYTES``, kept in
# ``scheduler_ext.guard`` so the command line reads it without this module's web stack) or right
# after (counts) decoding.
MAX_NODES = 10_000  # candidate nodes in filter/prioritize, nodes in preempt
MAX_VICTIM_PODS = 10_000  # victims over all nodes of one preempt call
MAX_NAME = 253  # a DNS subdomain: pod, namespace and node names, UIDs
# Candidates are judged in slices sized by time (``_sliced``): the first slice is small, each
# next one is sized from the last one's cost to take about ``SLICE_SECONDS``, and the verb
# yields to the loop whenever ``YIELD_SECONDS`` of verdicts have run since the last yield. A
# usual call (up to ~500 memoised or cheap verdicts, a millisecond or two) never yields; a call
# whose nodes are costly (thousands of candidates, or Reservations a pod matches on every node)
# holds the loop for at most about ``YIELD_SECONDS`` plus one node's verdict at a time.
FIRST_SLICE = 1
MAX_SLICE = 500
SLICE_SECONDS = 0.005
YIELD_SECONDS = 0.02


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
        stale = GaugeMetricFamily(
            "scheduler_ext_cache_stale", "1 for a kind whose cache is not listed or whose watch went silent.",
            labels=["kind"],
        )
        for kind, text in self.state.health().items():
            stale.add_metric([kind], 0.0 if text in ("ok", "not installed") else 1.0)
        yield stale
        yield GaugeMetricFamily(
            "scheduler_ext_gpu_fragmentation_ratio",
            "Share of free GPU core that sits on partially used GPUs (0 = every free GPU is whole).",
            value=self.state.gpu_fragmentation(),
        )
        yield GaugeMetricFamily(
            "scheduler_ext_ready", "1 when every kind is listed and none is stale (its watch silent too long).",
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


class BadRequest(ValueError):
    """A verb body that is malformed or over a bound; the message says which."""


# the reply for a body that cannot be served, per verb (see the failure policy above)
Refusal = Callable[[str], Reply]


def _filter_refusal(message: str) -> Reply:
    return _json({"Nodes": None, "NodeNames": None, "FailedNodes": {},
                  "FailedAndUnresolvableNodes": {}, "Error": message})


def _bind_refusal(message: str) -> Reply:
    return _json({"Error": message})


def _status_refusal(message: str) -> Reply:
    return _text(message, 400)


def _timed(verb: str, fn: VerbHandler, refuse: Refusal) -> VerbHandler:
    """Time and count ``fn``; a ``BadRequest`` or any other failure becomes ``refuse``'s reply
    (for prioritize and preempt an unexpected failure stays a 500: it is a bug, not input)."""
    seconds = VERB_SECONDS.labels(verb)
    totals = {o: VERB_TOTAL.labels(verb, o) for o in ("ok", "bad_request", "error")}
    bad_bodies = BAD_OBJECTS.labels("request", "body")
    has_error_field = verb in ("filter", "bind")

    async def handler(raw: bytes) -> Reply:
        started = time.perf_counter()
        outcome = "ok"
        try:
            reply = await fn(raw)
            if reply[0] != 200:
                outcome = "bad_request"
            return reply
        except BadRequest as exc:
            outcome = "bad_request"
            bad_bodies.inc()
            return refuse(str(exc))
        except Exception as exc:
            outcome = "error"
            log.exception("verb failed", verb=verb)
            if has_error_field:
                return refuse(f"internal error: {describe(exc)}")
            return _text("Internal Server Error", 500)
        finally:
            seconds.observe(time.perf_counter() - started)
            totals[outcome].inc()

    return handler


def _body(raw: bytes) -> dict[str, Any]:
    try:
        doc = orjson.loads(raw)
    except ValueError as exc:  # orjson.JSONDecodeError is a ValueError; also nesting over 1024
        raise BadRequest(f"request body is not JSON: {str(exc)[:200]}") from None
    if not isinstance(doc, dict):
        raise BadRequest("request body must be a JSON object")
    return doc


def _pod_arg(args: dict[str, Any]) -> dict[str, Any]:
    pod = args.get("Pod")
    if not isinstance(pod, dict):
        raise BadRequest("Pod is missing" if pod is None else "Pod must be an object")
    return pod


class ExtenderApp:
    """The ASGI app: the four POST verbs straight off the ASGI messages, the rest via Starlette.

    The verbs are the hot path (three calls per pod). Starlette's middleware stack, routing
    and Request/Response objects cost about a quarter of a filter call's CPU, so the verbs skip
    them; a wrong method on a verb path and every GET still go through Starlette (405, 404).
    """

    def __init__(
        self,
        verbs: Mapping[str, VerbHandler],
        fallback: Starlette,
        refusals: Mapping[str, Refusal] | None = None,
        *,
        max_body: int = MAX_BODY_BYTES,
    ) -> None:
        self.verbs = dict(verbs)
        self.fallback = fallback
        self.refusals = dict(refusals or {})
        self.max_body = max_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        handler = self.verbs.get(scope["path"]) if scope["type"] == "http" else None
        if handler is None or scope["method"] != "POST":
            await self.fallback(scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        too_big = _declared_length(scope) > self.max_body
        while not too_big:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body:
                too_big = True
                break
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        headers = []
        if too_big:  # answered without reading the rest; the connection closes after the reply
            BAD_OBJECTS.labels("request", "body").inc()
            refuse = self.refusals.get(scope["path"], _status_refusal)
            status, body, ctype = refuse(f"request body is larger than {self.max_body} bytes")
            headers.append((b"connection", b"close"))
        else:
            try:
                status, body, ctype = await handler(b"".join(chunks))
            except Exception:
                log.exception("verb failed", path=scope["path"])
                status, body, ctype = _text("Internal Server Error", 500)
        headers += [(b"content-type", ctype), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def _declared_length(scope: Scope) -> int:
    """The request's Content-Length, 0 when absent or unreadable (then the read is bounded)."""
    for name, value in scope.get("headers") or ():
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return 0
    return 0


_STR_ONLY = frozenset((str,))


def _names(args: dict[str, Any]) -> tuple[list[str], list[dict[str, Any]] | None]:
    """Candidate names, and the Node objects when sent (nodeCacheCapable: false)."""
    names = args.get("NodeNames")
    if names is not None:
        # the element types in C (``map``, ``set``) instead of a generator of ``isinstance``
        # calls (a third of the cost at 500 names); a decoded body holds exact types only
        if not isinstance(names, list) or not set(map(type, names)) <= _STR_ONLY:
            raise BadRequest("NodeNames must be a list of strings")
        if len(names) > MAX_NODES:
            raise BadRequest(f"NodeNames lists {len(names)} nodes, more than the limit of {MAX_NODES}")
        return names, None
    nodes = args.get("Nodes")
    if nodes is None:
        return [], None
    if not isinstance(nodes, dict):
        raise BadRequest("Nodes must be a NodeList object")
    items = nodes.get("items")
    if items is None:
        return [], []
    if not isinstance(items, list):
        raise BadRequest("Nodes.items must be a list")
    if len(items) > MAX_NODES:
        raise BadRequest(f"Nodes lists {len(items)} nodes, more than the limit of {MAX_NODES}")
    out: list[str] = []
    for item in items:
        meta = item.get("metadata") if isinstance(item, dict) else None
        name = meta.get("name") if isinstance(meta, dict) else None
        if not isinstance(name, str) or not name:
            raise BadRequest("every item of Nodes needs a metadata.name string")
        out.append(name)
    return out, items


def _victims(args: dict[str, Any]) -> tuple[dict[str, list[str]], dict[str, int]]:
    """Victim UIDs and PDB violation counts by node, from either preempt request shape."""
    meta = args.get("NodeNameToMetaVictims")
    full = args.get("NodeNameToVictims")
    if meta is not None and not isinstance(meta, dict):
        raise BadRequest("NodeNameToMetaVictims must be an object")
    if full is not None and not isinstance(full, dict):
        raise BadRequest("NodeNameToVictims must be an object")
    source = meta if meta is not None else full if full is not None else {}
    if len(source) > MAX_NODES:
        raise BadRequest(f"preempt names {len(source)} nodes, more than the limit of {MAX_NODES}")
    victims: dict[str, list[str]] = {}
    pdb: dict[str, int] = {}
    total = 0
    for node, v in source.items():
        if not isinstance(v, dict):
            raise BadRequest(f"victims of node {node[:MAX_NAME]!r} must be an object")
        pods = v.get("Pods")
        pods = [] if pods is None else pods
        if not isinstance(pods, list):
            raise BadRequest(f"Pods of node {node[:MAX_NAME]!r} must be a list")
        total += len(pods)
        if total > MAX_VICTIM_PODS:
            raise BadRequest(f"preempt lists more than {MAX_VICTIM_PODS} victim pods")
        uids: list[str] = []
        for p in pods:
            if source is meta:
                uid = p.get("UID") if isinstance(p, dict) else None
            else:
                pod_meta = p.get("metadata") if isinstance(p, dict) else None
                uid = pod_meta.get("uid") if isinstance(pod_meta, dict) else None
            if not isinstance(uid, str):
                raise BadRequest(f"a victim on node {node[:MAX_NAME]!r} has no UID string")
            uids.append(uid)
        count = v.get("NumPDBViolations")
        count = 0 if count is None else count
        if not isinstance(count, int) or isinstance(count, bool) or not 0 <= count <= 2**31:
            raise BadRequest(f"NumPDBViolations of node {node[:MAX_NAME]!r} must be a small whole number")
        victims[node], pdb[node] = uids, count
    return victims, pdb


T = TypeVar("T")


async def _sliced(items: Sequence[T], judge: Callable[[Sequence[T]], None]) -> None:
    """``judge`` over consecutive slices of ``items``, sized and yielded as the constants above
    say (the caller's ``judge`` collects its own results)."""
    size, since_yield, start = FIRST_SLICE, 0.0, 0
    while start < len(items):
        if since_yield >= YIELD_SECONDS:
            await asyncio.sleep(0)
            since_yield = 0.0
        began = time.perf_counter()
        judge(items[start:start + size])
        took = time.perf_counter() - began
        start += size
        since_yield += took
        size = max(1, min(MAX_SLICE, int(size * SLICE_SECONDS / max(took, 1e-6))))


async def _filter_sliced(
    state: ClusterState, pod: PodRequest, names: list[str], cfg: ExtenderConfig
) -> FilterResult:
    """``filter_nodes`` over time-bounded slices of the candidates (``_sliced``)."""
    passed: list[str] = []
    failed: dict[str, str] = {}
    unresolvable: dict[str, str] = {}

    def judge(part: Sequence[str]) -> None:
        result = filter_nodes(state, pod, part, cfg)
        passed.extend(result.passed)
        failed.update(result.failed)
        unresolvable.update(result.unresolvable)

    await _sliced(names, judge)
    return FilterResult(passed, failed, unresolvable)


async def _prioritize_sliced(
    state: ClusterState, pod: PodRequest, names: list[str], cfg: ExtenderConfig
) -> list[tuple[str, int]]:
    scores: list[tuple[str, int]] = []
    await _sliced(names, lambda part: scores.extend(prioritize_nodes(state, pod, part, cfg)))
    return scores


async def _preempt_sliced(
    state: ClusterState, pod: PodRequest, victims: dict[str, list[str]], cfg: ExtenderConfig
) -> dict[str, list[str]]:
    kept: dict[str, list[str]] = {}
    await _sliced(list(victims.items()), lambda part: kept.update(preempt_nodes(state, pod, dict(part), cfg)))
    return kept


Endpoint = Callable[[Request], Awaitable[Response]]


def _probe_endpoints(state: ClusterState, liveness: Liveness | None = None) -> tuple[Endpoint, Endpoint, Endpoint]:
    """``/healthz``, ``/readyz`` and ``/metrics`` of one cache (with ``rhp_build_info``).

    ``/healthz`` is liveness: 503 with the reason when ``liveness`` says the watches are dead or
    have heard nothing from the API server past their bound (``rhp_kube.watch.Informer.liveness``),
    so kubelet restarts the extender; ``/readyz`` is "can serve now" (every kind listed, none
    stale): it fails sooner and recovers by itself when the watches hear again."""
    export_build_info("scheduler-ext")
    registry = CollectorRegistry(auto_describe=True)
    registry.register(StateCollector(state))

    async def healthz(request: Request) -> Response:
        if liveness is not None:
            alive, why = liveness()
            if not alive:
                return PlainTextResponse(f"not alive: {why}"[:4096] + "\n", status_code=503)
        return PlainTextResponse("ok")

    async def readyz(request: Request) -> Response:
        """200 when every kind is listed and none is stale; the body says each kind's state, so
        a missing optional CRD (Device, Reservation, NodeResourceTopology: "not installed") is
        reported without making the extender unready (the cluster simply has none)."""
        health = state.health()
        bad = {k: v for k, v in health.items() if v not in ("ok", "not installed")}
        lines = "".join(f"{k}: {v}\n" for k, v in health.items() if v != "ok")
        if not bad:
            return PlainTextResponse("ok\n" + lines if lines else "ok")
        return PlainTextResponse("cache not ready\n" + lines, status_code=503)

    async def metrics(request: Request) -> Response:
        body = generate_latest(REGISTRY) + generate_latest(registry)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    return healthz, readyz, metrics


def create_health_app(state: ClusterState, liveness: Liveness | None = None) -> Starlette:
    """Only ``GET /healthz``, ``/readyz`` and ``/metrics``: for ``serve --health-listen``, where
    kubelet probes and scrapers connect without the client certificate the verbs require."""
    healthz, readyz, metrics = _probe_endpoints(state, liveness)
    return Starlette(
        routes=[
            Route("/healthz", healthz, methods=["GET"]),
            Route("/readyz", readyz, methods=["GET"]),
            Route("/metrics", metrics, methods=["GET"]),
        ]
    )


class Background(Protocol):
    """A task that runs with the app (started in its lifespan, stopped before it ends)."""

    def start(self) -> None: ...

    async def stop(self) -> None: ...


# long: the verbs are closures over the one state, binder and config this app serves
def create_app(
    state: ClusterState,
    binder: Binder | None,
    cfg: ExtenderConfig = DEFAULT_CONFIG,
    *,
    prefix: str = "",
    max_body: int = MAX_BODY_BYTES,
    requeuer: Requeuer | None = None,
    liveness: Liveness | None = None,
    background: Sequence[Background] = (),
) -> ExtenderApp:
    """The ASGI app. ``binder`` is ``None`` when no API server is configured; ``requeuer``
    (started and stopped with the app) is told of every pod filter refuses for a node's missing
    CPU topology, or on any node while a kind of the cache is stale (``scheduler_ext.requeue``);
    ``liveness`` decides ``/healthz`` (the watches'); ``background`` runs on the verbs' loop with the
    app (the reservation controller, ``scheduler_ext.reserver``)."""
    prefix = "/" + prefix.strip("/") if prefix.strip("/") else ""

    async def filter_verb(raw: bytes) -> Reply:
        args = _body(raw)
        pod_json = _pod_arg(args)
        names, items = _names(args)
        pod = decode_pod(pod_json)
        stale = bool(state.stale_kinds())  # before: the answer comes from the cache as it is now
        result = await _filter_sliced(state, pod, names, cfg)
        if result.failed:
            NODES_FAILED.labels("failed").inc(len(result.failed))
        if result.unresolvable:
            NODES_FAILED.labels("unresolvable").inc(len(result.unresolvable))
            if requeuer is not None:
                requeuer.refused(pod_json, topology_refusals(result.unresolvable, ERR_INVALID_CPU_TOPOLOGY))
        if stale and requeuer is not None and (result.failed or result.unresolvable):
            requeuer.refused_while_stale(pod_json)
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
        args = _body(raw)
        pod_json = _pod_arg(args)
        names, _ = _names(args)
        scores = await _prioritize_sliced(state, decode_pod(pod_json), names, cfg)
        return 200, orjson.dumps([{"Host": n, "Score": s} for n, s in scores]), JSON_TYPE

    async def bind_verb(raw: bytes) -> Reply:
        args = _body(raw)
        name, namespace = args.get("PodName"), args.get("PodNamespace")
        uid, node = args.get("PodUID") or "", args.get("Node")
        if not (isinstance(name, str) and name and isinstance(namespace, str) and namespace):
            raise BadRequest("PodName and PodNamespace are required")
        if not (isinstance(node, str) and node) or not isinstance(uid, str):
            raise BadRequest("Node is required and PodUID must be a string")
        if max(len(name), len(namespace), len(node), len(uid)) > MAX_NAME:
            raise BadRequest(f"PodName, PodNamespace, PodUID and Node are at most {MAX_NAME} characters")
        if binder is None:
            return _json({"Error": "this extender runs without an API server and cannot bind"})
        return _json({"Error": await binder.bind(namespace, name, uid, node)})

    async def preempt_verb(raw: bytes) -> Reply:
        args = _body(raw)
        pod_json = _pod_arg(args)
        try:
            victims, pdb = _victims(args)
        except BadRequest as exc:
            raise BadRequest(f"bad preempt request: {exc}") from None
        kept = await _preempt_sliced(state, decode_pod(pod_json), victims, cfg)
        return _json(
            {
                "NodeNameToMetaVictims": {
                    node: {"Pods": [{"UID": u} for u in uids], "NumPDBViolations": pdb.get(node, 0)}
                    for node, uids in kept.items()
                }
            }
        )

    healthz, readyz, metrics = _probe_endpoints(state, liveness)

    table: dict[str, tuple[VerbHandler, Refusal]] = {
        "filter": (filter_verb, _filter_refusal),
        "prioritize": (prioritize_verb, _status_refusal),
        "bind": (bind_verb, _bind_refusal),
        "preempt": (preempt_verb, _status_refusal),
    }
    verbs = {f"{prefix}/{v}": _timed(v, fn, refuse) for v, (fn, refuse) in table.items()}
    refusals = {f"{prefix}/{v}": refuse for v, (_, refuse) in table.items()}

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
        if requeuer is not None:
            requeuer.start()
        if binder is not None:
            binder.start()  # the ledger sweep
        for part in background:
            part.start()
        try:
            yield
        finally:
            for part in background:
                await part.stop()
            if requeuer is not None:
                await requeuer.stop()
            if binder is not None:
                await binder.aclose()  # the bind path's HTTP session lives on this loop

    return ExtenderApp(verbs, Starlette(routes=routes, lifespan=lifespan), refusals, max_body=max_body)
