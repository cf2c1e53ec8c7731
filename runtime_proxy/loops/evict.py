"""The evictors of the usage loop (``runtime_proxy.loops.qos``): how a planned eviction
(``hooks.plan.Eviction``, from the ``memory_evict`` and ``cpu_evict`` plugins) is carried out.

- ``ApiEvictor`` (``evictBy: api``, the default): a Kubernetes policy/v1 ``Eviction`` of the
  pod with its UID as a precondition (``deleteOptions.preconditions.uid``), so
  PodDisruptionBudgets are honoured and a pod that was replaced under the same name is never
  hit; then a Warning Event on the pod naming the feature and the reason ("trigger by
  runtime-hook-proxy feature BEMemoryEvict, evict pod: ns/name: ..."), recorded through the
  node's one Event recorder (``rhp_kube.events``: its spam filter and node-wide cap cover
  eviction Events too; without one, the evictor's own recorder over its credentials). HTTP 429 (a
  PodDisruptionBudget forbids it now) is ``refused``: the pod is tried again on a later round,
  no sooner than a backoff that doubles from ``backoff_initial`` to ``backoff_max`` seconds.
  404 (the pod is gone) and 409 (its UID changed: the pod we meant is gone) count as done.
  Credentials: the ``ApiClient`` given, else in-cluster (service account) or kubeconfig
  (``KUBECONFIG``, ``~/.kube/config``), loaded on first use, for configuration only: the calls
  go through ``rhp_kube.http`` (``BlockingKubeHTTP``, the one transport), each answer read at
  most ``_REPLY_MAX`` bytes far; they block the evictor's own worker threads
  (``EVICTION_THREADS``, each running its calls on an event loop of its own), so calls to an API
  server that never answers never hold the default executor. An Eviction's answer that does not
  decode fails the eviction (a later round asks again). RBAC: ``create`` on ``pods/eviction`` and ``events``.
- ``DeleteEvictor`` (``evictBy: delete``): the pod deleted with its UID as a precondition, as
  kubelet's own node-pressure eviction ends a pod (PodDisruptionBudgets are not consulted, as
  kubelet does not), then the same Events. Unlike an Eviction, whose request names a pod but
  not its node, a delete lets the API server see the pod: the chart's admission policy
  (``packaging/helm/runtime-hook-proxy/templates/node-policy.yaml``) refuses a node agent's
  delete of a pod bound to another node. 404 and 409 count as done. RBAC: ``delete`` on
  ``pods``, ``create`` on ``events``.
- ``RuntimeEvictor`` (``evictBy: runtime``): for nodes without cluster access, stops every
  running container of the pod through the CRI backend (``StopContainer`` with timeout 0),
  as koordlet does by default; kubelet then reports the pod's containers as exited.

Both remember the UIDs they evicted for ``hooks.usage.EVICTION_MEMORY_SECONDS`` and never
evict one twice in that time (the usage loop also leaves them out). Cool-downs between
evictions (4 s memory, 20 s CPU) are decided by the plugins from ``Usage.recent_evictions``;
dry-run is handled by the usage loop, which logs and hands nothing to an evictor.

Metric: ``rhp_evictions_total{feature, method, outcome}`` (method ``api``, ``delete`` or
``runtime``; outcome ``evicted``, ``gone``,
``refused``, ``failed``).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Protocol

import structlog
from prometheus_client import Counter

from cri_protos import api_pb2
from hooks.plan import Eviction
from hooks.usage import EVICTION_MEMORY_SECONDS
from koord_formats import keys
from rhp_kube.events import EventRecorder, EventSink, KubeEventsApi, PodEvent
from runtime_proxy.loops.qos import EvictionResult

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

    from rhp_kube.http import BlockingKubeHTTP

__all__ = ["EVICTIONS", "ApiEvictor", "DeleteEvictor", "RuntimeEvictor", "event_message", "evictor_for"]

log = structlog.get_logger("runtime_proxy.loops.evict")

EVICTIONS = Counter(
    "rhp_evictions_total",
    "Evictions carried out by the evictor, by feature, method (api, runtime) and outcome "
    "(evicted, gone, refused, failed).",
    ["feature", "method", "outcome"],
)

COMPONENT = "runtime-hook-proxy"
# Worker threads of one ApiEvictor (the usage loop keeps at most as many evictions in flight).
EVICTION_THREADS = 4
# The API server's answer to an Eviction (a Status) or a delete (the pod, at most about 1.5 MiB).
_REPLY_MAX = 4 << 20


def event_message(e: Eviction) -> str:
    """The Event message of an eviction (Koordinator's wording with our name)."""
    return f"trigger by {COMPONENT} feature {e.feature}, evict pod: {e.namespace}/{e.name}: {e.reason}"[:1024]


class _Recent:
    """UIDs evicted within ``EVICTION_MEMORY_SECONDS``, and per-UID backoff after a refusal.
    Safe from several threads (the usage loop runs evictions side by side)."""

    def __init__(self, clock: Callable[[], float], initial: float, maximum: float) -> None:
        self.clock = clock
        self.initial, self.maximum = initial, maximum
        self.done: dict[str, float] = {}
        self.backoff: dict[str, tuple[float, float]] = {}  # uid -> (next try at, current delay)
        self._lock = threading.Lock()

    def prune(self) -> None:
        with self._lock:
            now = self.clock()
            for uid in [u for u, at in self.done.items() if now - at > EVICTION_MEMORY_SECONDS]:
                del self.done[uid]
            for uid in [u for u, (at, _) in self.backoff.items() if now - at > EVICTION_MEMORY_SECONDS]:
                del self.backoff[uid]

    def early(self, e: Eviction) -> EvictionResult | None:
        """A result without trying: already evicted, or still backing off."""
        with self._lock:
            if e.uid in self.done:
                return EvictionResult(e, "evicted", "evicted before; not evicted twice")
            held = self.backoff.get(e.uid)
            if held is not None and self.clock() < held[0]:
                return EvictionResult(e, "refused", f"backing off for {held[0] - self.clock():.1f} s after a refusal")
            return None

    def refused(self, uid: str) -> None:
        with self._lock:
            held = self.backoff.get(uid)
            delay = self.initial if held is None else min(held[1] * 2, self.maximum)
            self.backoff[uid] = (self.clock() + delay, delay)

    def evicted(self, uid: str) -> None:
        with self._lock:
            self.backoff.pop(uid, None)
            self.done[uid] = self.clock()


def _pod_path(e: Eviction) -> str:
    from rhp_kube.http import seg

    return f"/api/v1/namespaces/{seg(e.namespace)}/pods/{seg(e.name)}"


def _load_api_client() -> ApiClient:
    """The node's ``ApiClient`` (``rhp_kube.credentials``: in-cluster, else ``KUBECONFIG``, read
    when called; a FIFO or a huge file there is refused instead of holding the eviction thread)."""
    from rhp_kube import credentials

    return credentials.load()


class ApiEvictor:
    """Evicts through the Kubernetes Eviction API (see the module docstring).

    :param api_client: a ``kubernetes.client.ApiClient``; ``None`` loads credentials on first use.
    :param node_name: this node, named as the Events' source host.
    :param backoff_initial: seconds before the first retry after a 429; doubles per refusal.
    :param backoff_max: the longest backoff.
    :param request_timeout: seconds per API call.
    :param events: where the eviction Events go (the node's recorder); ``None``: a recorder of
        the evictor's own, over the same credentials.
    """

    method = "api"

    def __init__(
        self,
        api_client: ApiClient | None = None,
        *,
        node_name: str = "",
        backoff_initial: float = 1.0,
        backoff_max: float = 60.0,
        request_timeout: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        events: EventSink | None = None,
    ) -> None:
        self._api_client = api_client
        self.node_name = node_name
        self._events: EventSink = events if events is not None else EventRecorder(
            self._events_api, host=node_name, component=COMPONENT)
        self.request_timeout = request_timeout
        self._recent = _Recent(clock, backoff_initial, backoff_max)
        self._warned: set[str] = set()
        self._client_lock = threading.Lock()
        self._http: BlockingKubeHTTP | None = None
        # Its own threads: calls to an API server that never answers hold these, never the
        # default executor the usage loop samples in.
        self._executor = ThreadPoolExecutor(max_workers=EVICTION_THREADS, thread_name_prefix="rhp-evict")

    async def evict(self, evictions: Sequence[Eviction]) -> Sequence[EvictionResult]:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._evict_all, list(evictions))

    # -- worker thread ---------------------------------------------------------------------

    def _evict_all(self, evictions: list[Eviction]) -> list[EvictionResult]:
        self._recent.prune()
        try:
            with self._client_lock:
                if self._api_client is None:
                    self._api_client = _load_api_client()
                if self._http is None:
                    from rhp_kube.http import BlockingKubeHTTP

                    self._http = BlockingKubeHTTP(self._api_client, timeout=self.request_timeout,
                                                  limit=EVICTION_THREADS)  # fmt: skip
                http = self._http
        except Exception as exc:  # no credentials: every eviction fails, the loop goes on
            msg = (f"no cluster access for evictions ({type(exc).__name__}: {str(exc)[:200]}); install "
                   "the [cluster] extra (the kubernetes client) and give credentials, or set "
                   "usageLoop.evictBy: runtime")
            log.error("cannot evict", error=msg)
            return [self._count(EvictionResult(e, "failed", msg), "failed") for e in evictions]
        return [self._evict_one(http, e) for e in evictions]

    def _count(self, result: EvictionResult, outcome: str) -> EvictionResult:
        EVICTIONS.labels(result.eviction.feature, self.method, outcome).inc()
        return result

    def _evict_one(self, http: BlockingKubeHTTP, e: Eviction) -> EvictionResult:
        early = self._recent.early(e)
        if early is not None:
            return early
        from rhp_kube.errors import APIError

        pod = f"{e.namespace}/{e.name}"
        try:
            self._request(http, e)
        except APIError as exc:
            status = exc.status
            if status == 0:  # connection errors, timeouts, an answer past its bound
                log.warning("eviction failed", pod=pod, uid=e.uid, feature=e.feature, error=str(exc)[:200])
                return self._count(EvictionResult(e, "failed", f"{type(exc).__name__}: {str(exc)[:200]}"), "failed")
            if status in (404, 409):
                self._recent.evicted(e.uid)
                log.info("pod to evict is already gone", pod=pod, uid=e.uid, feature=e.feature, status=status)
                return self._count(EvictionResult(e, "evicted", f"already gone (HTTP {status})"), "gone")
            if status == 429:
                self._recent.refused(e.uid)
                log.warning("eviction refused by a PodDisruptionBudget; retried later", pod=pod, uid=e.uid,
                            feature=e.feature)
                if e.uid not in self._warned:
                    self._warned.add(e.uid)
                    self._event(e, "Warning", keys.EVENT_REASON_EVICT_POD_FAIL,
                                f"{event_message(e)}; refused for now by a PodDisruptionBudget")
                return self._count(EvictionResult(e, "refused", "HTTP 429: a PodDisruptionBudget forbids it now"),
                                   "refused")
            log.warning("eviction failed", pod=pod, uid=e.uid, feature=e.feature, status=status)
            reason = str(exc).removeprefix(f"{status}: ")  # the Status's message, else the HTTP reason
            return self._count(EvictionResult(e, "failed", f"HTTP {status}: {reason[:200]}"), "failed")
        except Exception as exc:  # an answer that does not decode
            log.warning("eviction failed", pod=pod, uid=e.uid, feature=e.feature, error=str(exc)[:200])
            return self._count(EvictionResult(e, "failed", f"{type(exc).__name__}: {str(exc)[:200]}"), "failed")
        self._recent.evicted(e.uid)
        self._warned.discard(e.uid)
        log.warning("pod evicted", pod=pod, uid=e.uid, feature=e.feature, reason=e.reason)
        self._event(e, "Warning", keys.EVENT_REASON_EVICT_POD_SUCCESS, event_message(e))
        return self._count(EvictionResult(e, "evicted"), "evicted")

    def _request(self, http: BlockingKubeHTTP, e: Eviction) -> None:
        """The API call that evicts ``e``: a policy/v1 Eviction with the pod's UID. Its answer
        must decode (a JSON object), else the eviction is not trusted and fails."""
        from rhp_kube.http import json_object

        body = {"apiVersion": "policy/v1", "kind": "Eviction",
                "metadata": {"name": e.name, "namespace": e.namespace},
                "deleteOptions": {"preconditions": {"uid": e.uid}}}  # fmt: skip
        answer = http.request("POST", f"{_pod_path(e)}/eviction", body, max_bytes=_REPLY_MAX)
        if not isinstance(json_object(answer), dict):
            raise ValueError("the Eviction's answer is not a JSON object")

    def _events_api(self) -> KubeEventsApi:
        """The Events calls of the evictor's own recorder, over its credentials."""
        with self._client_lock:
            if self._api_client is None:
                self._api_client = _load_api_client()
            return KubeEventsApi(self._api_client, request_timeout=self.request_timeout)

    def _event(self, e: Eviction, kind: str, reason: str, message: str) -> None:
        """Record an Event on the pod through the recorder (never blocks, never raises)."""
        self._events.record(PodEvent(namespace=e.namespace, name=e.name, uid=e.uid, reason=reason,
                                     message=message, type=kind))


class DeleteEvictor(ApiEvictor):
    """Evicts by deleting the pod with its UID as a precondition (see the module docstring);
    the same parameters as ``ApiEvictor``."""

    method = "delete"

    def _request(self, http: BlockingKubeHTTP, e: Eviction) -> None:
        from rhp_kube.errors import TooLargeError

        options = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": e.uid}}
        # The answer (the pod) is not decoded: only the status code matters.
        try:
            http.request("DELETE", _pod_path(e), options, max_bytes=_REPLY_MAX)
        except TooLargeError as exc:
            if not 200 <= exc.status <= 299:
                raise


class _Runtime(Protocol):
    """What ``RuntimeEvictor`` needs of ``runtime_proxy.runtime.client.RuntimeClient``."""

    runtime: Any  # Any: runtime_proxy.runtime.client.CriStub, or a test's fake of its three calls
    timeout: float


class RuntimeEvictor:
    """Stops the pod's running containers through the CRI backend (see the module docstring).

    :param client: the proxy's ``RuntimeClient`` (its ``runtime`` stub and ``timeout``).
    """

    method = "runtime"

    def __init__(self, client: _Runtime, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.client = client
        self._recent = _Recent(clock, 1.0, 60.0)

    async def evict(self, evictions: Sequence[Eviction]) -> Sequence[EvictionResult]:
        self._recent.prune()
        out: list[EvictionResult] = []
        for e in evictions:
            early = self._recent.early(e)
            if early is not None:
                out.append(early)
                continue
            try:
                stopped = await self._stop_pod(e.uid)
            except Exception as exc:  # one pod's failure is that pod's
                log.warning("runtime eviction failed", pod=f"{e.namespace}/{e.name}", uid=e.uid, error=str(exc)[:200])
                EVICTIONS.labels(e.feature, self.method, "failed").inc()
                out.append(EvictionResult(e, "failed", f"{type(exc).__name__}: {str(exc)[:200]}"))
                continue
            self._recent.evicted(e.uid)
            outcome = "evicted" if stopped else "gone"
            EVICTIONS.labels(e.feature, self.method, outcome).inc()
            log.warning("pod evicted by stopping its containers", pod=f"{e.namespace}/{e.name}", uid=e.uid,
                        feature=e.feature, containers=stopped, message=event_message(e))
            out.append(EvictionResult(e, "evicted", f"stopped {stopped} containers"))
        return out

    async def _stop_pod(self, uid: str) -> int:
        """Stop every running container of the pod ``uid``; the number stopped."""
        rt, timeout = self.client.runtime, self.client.timeout
        sandboxes: api_pb2.ListPodSandboxResponse = await rt.ListPodSandbox(
            api_pb2.ListPodSandboxRequest(), timeout=timeout
        )
        stopped = 0
        for sb in sandboxes.items:
            if sb.metadata.uid != uid:
                continue
            running = api_pb2.ContainerStateValue(state=api_pb2.CONTAINER_RUNNING)
            listed: api_pb2.ListContainersResponse = await rt.ListContainers(
                api_pb2.ListContainersRequest(filter=api_pb2.ContainerFilter(pod_sandbox_id=sb.id, state=running)),
                timeout=timeout,
            )
            for c in listed.containers:
                await rt.StopContainer(api_pb2.StopContainerRequest(container_id=c.id, timeout=0), timeout=timeout)
                stopped += 1
        return stopped


def evictor_for(evict_by: str, *, runtime: _Runtime | None, node_name: str = "",
                events: EventSink | None = None) -> ApiEvictor | RuntimeEvictor:
    """The evictor the config's ``usageLoop.evictBy`` names: ``api``, ``delete`` or ``runtime``
    (which needs ``runtime``, the CRI runtime client); ``events`` the node's Event recorder."""
    if evict_by == "runtime":
        if runtime is None:
            raise ValueError("evictBy runtime needs a CRI runtime client")
        return RuntimeEvictor(runtime)
    if evict_by == "api":
        return ApiEvictor(node_name=node_name, events=events)
    if evict_by == "delete":
        return DeleteEvictor(node_name=node_name, events=events)
    raise ValueError(f"unknown evictBy {evict_by!r} (api, delete or runtime)")
