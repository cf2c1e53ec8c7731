"""The one Kubernetes Event recorder: Events about pods (today the node agent's hook failures and
refusals, ``runtime_proxy.engine.events`` names them, and its evictions,
``runtime_proxy.loops.evict``), rate-limited per object and node-wide, aggregated, and sent by
their own thread. The manager and the extender record no Events.

``Lifecycle.run`` (``runtime_proxy.engine.lifecycle``) hands every failure of a stage about a
pod to an ``EventSink``; ``EventRecorder`` is the production one, built by the node agent's
composition root:

- ``record`` never blocks and never raises: it only touches a few small tables under a lock.
  The Events are sent by the recorder's own daemon thread, never on the event loop nor in the
  default executor, so an API server that is slow or never answers holds that thread only.
- Aggregation: an Event already queued for the same object and reason takes the repeat into its
  ``count`` (no write of its own); a repeat after it was sent (within ``aggregate_seconds``,
  client-go's 600 s) patches the sent Event's ``count``, ``lastTimestamp`` and message with a
  JSON merge patch.
- client-go's spam filter (``EventSourceObjectSpamFilter``): every write (a create or a count
  patch) about one involved object from this source takes a token from that object's bucket,
  ``object_burst`` (25) deep and refilled at ``object_qps`` (one per 300 s), client-go's
  defaults; past that, repeats are dropped and counted (``rate_limited``). At most
  ``max_objects`` objects' buckets are remembered (the least recent forgotten; client-go's LRU
  holds 4096 too).
- The node-wide cap: every write also takes a token from one bucket for the whole recorder
  (the node), ``node_burst`` (20) deep and refilled at ``node_qps`` (2 writes/s), so a failure
  storm over many pods costs the API server at most that, whatever the number of pods (before,
  9.2 writes/s per node were measured under one). A write over the cap is dropped and counted
  (``node_capped``), and logged at most once per ``log_every`` seconds with the number dropped
  since.
- Bounded: at most ``queue_size`` distinct Events wait to be sent (a new one past that is
  dropped and counted, ``dropped``); at most ``max_series`` sent Events are remembered.
- No cluster access (no ``api`` given, or its credentials fail to load): nothing is sent and
  every Event is counted as ``no_access``; the first failure is logged.

Events are core/v1 Events (``involvedObject`` the pod by namespace, name and uid; ``source``
and ``reportingController`` the recorder's ``component``, ``reportingInstance`` and
``source.host`` the node), sent through ``rhp_kube.http`` (``KubeEventsApi``: the transport of
every other call, on an event loop of the sending thread's own). RBAC: ``create`` and ``patch``
on ``events`` in the core group.

Metric: ``rhp_pod_events_total{reason, outcome}``.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Protocol

import structlog
from prometheus_client import Counter

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

log = structlog.get_logger(__name__)

__all__ = [
    "COMPONENT",
    "EVENTS",
    "EventRecorder",
    "EventSink",
    "EventsApi",
    "KubeEventsApi",
    "PodEvent",
    "TokenBucket",
    "event_body",
]

COMPONENT = "runtime-hook-proxy"  # the default source of Events

EVENTS = Counter(
    "rhp_pod_events_total",
    "Kubernetes Events about pods (hook failures and refusals, evictions), by reason and outcome: queued, "
    "aggregated (folded into a queued Event's count), sent, failed (the API refused or did not "
    "answer), rate_limited (over the pod's spam-filter budget), node_capped (over the node-wide "
    "cap on Event writes), dropped (queue full), no_access (no cluster credentials).",
    ["reason", "outcome"],
)

# client-go's EventSourceObjectSpamFilter defaults: a burst of 25 writes per source and object,
# refilled at one per 5 minutes.
OBJECT_BURST = 25
OBJECT_QPS = 1.0 / 300.0
# The node-wide cap on Event writes.
NODE_BURST = 20
NODE_QPS = 2.0

# What one Event may carry (the API server refuses messages past 1 KiB in events.k8s.io).
_MESSAGE_MAX = 1024
_NAME_MAX = 253
_REPLY_MAX = 1 << 20  # the API server's echo of one Event; a larger reply is refused unread


@dataclass(frozen=True)
class PodEvent:
    """An Event about one pod: ``reason`` (``REASON_FAILED``, ``REASON_REFUSED``) and a message."""

    namespace: str
    name: str
    uid: str
    reason: str
    message: str
    type: str = "Warning"


class EventSink(Protocol):
    """Where ``Lifecycle`` records Events; ``record`` must neither block nor raise."""

    def record(self, event: PodEvent) -> None: ...


class EventsApi(Protocol):
    """The two API calls the recorder makes (blocking; called on its own thread)."""

    def create(self, namespace: str, body: Mapping[str, object]) -> None: ...

    def patch(self, namespace: str, name: str, body: Mapping[str, object]) -> None: ...


def _stamp(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


class TokenBucket:
    """``burst`` tokens, refilled at ``qps`` per second of ``now`` (passed in: the recorder's
    clock). Not thread-safe: the recorder holds its lock."""

    __slots__ = ("burst", "qps", "stamp", "tokens")

    def __init__(self, qps: float, burst: int, now: float) -> None:
        self.qps, self.burst = qps, burst
        self.tokens = float(burst)
        self.stamp = now

    def _refill(self, now: float) -> None:
        if now > self.stamp:
            self.tokens = min(float(self.burst), self.tokens + (now - self.stamp) * self.qps)
        self.stamp = max(self.stamp, now)

    def ready(self, now: float) -> bool:
        self._refill(now)
        return self.tokens >= 1.0

    def take(self, now: float) -> bool:
        """Take a token when there is one."""
        if not self.ready(now):
            return False
        self.tokens -= 1.0
        return True


def event_body(event: PodEvent, *, name: str, host: str, count: int, first: datetime,
               last: datetime, component: str = COMPONENT) -> dict[str, object]:
    """The core/v1 Event for ``event`` (JSON shape, as the API server takes it)."""
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": name, "namespace": event.namespace},
        "involvedObject": {"apiVersion": "v1", "kind": "Pod", "namespace": event.namespace,
                           "name": event.name, "uid": event.uid},
        "reason": event.reason,
        "message": event.message[:_MESSAGE_MAX],
        "type": event.type,
        "count": count,
        "firstTimestamp": _stamp(first),
        "lastTimestamp": _stamp(last),
        "source": {"component": component, **({"host": host} if host else {})},
        "reportingComponent": component,
        "reportingInstance": host or component,
    }


@dataclass
class _Pending:
    event: PodEvent
    count: int
    first: datetime
    last: datetime


@dataclass
class _Sent:
    name: str
    count: int
    first: datetime
    at: float  # clock() of the last send


class EventRecorder:
    """Aggregated Events on pods, limited per pod and node-wide, sent off the event loop (module
    docstring).

    :param api: makes the API client on first use (may raise: no credentials); ``None``: the
        node has no cluster access and Events are only counted.
    :param host: this node's name (``source.host``, ``reportingInstance``).
    :param component: the Events' source.
    :param object_burst, object_qps: each pod's token bucket (client-go's spam filter).
    :param node_burst, node_qps: the one bucket of every write of this recorder.
    :param queue_size: distinct Events waiting to be sent.
    :param aggregate_seconds: how long a sent Event takes repeats into its count.
    """

    def __init__(
        self,
        api: Callable[[], EventsApi] | None,
        *,
        host: str = "",
        component: str = COMPONENT,
        object_burst: int = OBJECT_BURST,
        object_qps: float = OBJECT_QPS,
        node_burst: int = NODE_BURST,
        node_qps: float = NODE_QPS,
        queue_size: int = 256,
        aggregate_seconds: float = 600.0,
        max_series: int = 4096,
        max_objects: int = 4096,
        log_every: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._factory = api
        self._api: EventsApi | None = None
        self.host = host
        self.component = component
        self.object_burst, self.object_qps = object_burst, object_qps
        self.queue_size = queue_size
        self.aggregate_seconds = aggregate_seconds
        self.max_series = max_series
        self.max_objects = max_objects
        self.log_every = log_every
        self.clock = clock
        self.wall = wall
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        # (pod key, reason) -> the Event waiting to be sent, oldest first.
        self._pending: OrderedDict[tuple[str, str], _Pending] = OrderedDict()
        # (pod key, reason) -> the Event last sent for it, least recent first.
        self._sent: OrderedDict[tuple[str, str], _Sent] = OrderedDict()
        # pod key -> its spam-filter bucket, least recent first.
        self._objects: OrderedDict[str, TokenBucket] = OrderedDict()
        self._node = TokenBucket(node_qps, node_burst, clock())
        self._capped = 0  # writes dropped by the node-wide cap since it was last logged
        self._capped_logged: float | None = None
        self._thread: threading.Thread | None = None
        self._closed = False
        self._busy = False

    @property
    def has_access(self) -> bool:
        """Whether this recorder sends Events (it has, or may still load, cluster credentials)."""
        return self._factory is not None

    # -- the caller's side (any thread, the event loop included) -------------------------------

    def record(self, event: PodEvent) -> None:
        """Queue ``event`` (or fold it into one queued for the same pod and reason); never
        blocks on the API and never raises."""
        try:
            self._record(event)
        except Exception:  # an Event is never worth a failed call
            log.exception("event not recorded", reason=event.reason)

    def _record(self, event: PodEvent) -> None:
        if self._factory is None:
            EVENTS.labels(event.reason, "no_access").inc()
            return
        key = (event.uid or f"{event.namespace}/{event.name}", event.reason)
        report = 0
        with self._lock:
            if self._closed:
                return
            pending = self._pending.get(key)
            now = self.wall()
            if pending is not None:
                pending.count += 1
                pending.last = now
                pending.event = event
                outcome = "aggregated"
            elif len(self._pending) >= self.queue_size:
                outcome = "dropped"
            else:
                outcome = self._admit(key[0])
                if outcome == "queued":
                    self._pending[key] = _Pending(event, 1, now, now)
                    self._start()
                    self._wake.notify()
                elif outcome == "node_capped":
                    report = self._capped_report()
        EVENTS.labels(event.reason, outcome).inc()
        if report:
            log.warning("pod Events over the node-wide cap dropped", dropped=report,
                        cap_per_second=self._node.qps, burst=self._node.burst)

    def _admit(self, pod: str) -> str:
        """Whether one more write about ``pod`` may be made now: a token from its own bucket and
        one from the node's, both taken only when both have one."""
        now = self.clock()
        bucket = self._objects.get(pod)
        if bucket is None:
            bucket = self._objects[pod] = TokenBucket(self.object_qps, self.object_burst, now)
        self._objects.move_to_end(pod)
        while len(self._objects) > self.max_objects:
            self._objects.popitem(last=False)
        if not bucket.ready(now):
            return "rate_limited"
        if not self._node.take(now):
            return "node_capped"
        bucket.take(now)
        return "queued"

    def _capped_report(self) -> int:
        """Count one write dropped by the node-wide cap; the number to log now (0: not yet)."""
        self._capped += 1
        now = self.clock()
        if self._capped_logged is not None and now - self._capped_logged < self.log_every:
            return 0
        self._capped_logged = now
        report, self._capped = self._capped, 0
        return report

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="rhp-events", daemon=True)
            self._thread.start()

    def close(self) -> None:
        """Stop the sender (queued Events are not sent)."""
        with self._lock:
            self._closed = True
            self._pending.clear()
            self._wake.notify_all()

    def idle(self) -> bool:
        """Nothing queued and nothing being sent (for tests and shutdown)."""
        with self._lock:
            return not self._pending and not self._busy

    # -- the sender thread ---------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._pending and not self._closed:
                    self._wake.wait()
                if self._closed:
                    return
                key, item = self._pending.popitem(last=False)
                self._busy = True
            try:
                self._send(key, item)
            except Exception:  # never lets the thread die
                log.exception("event sender failed", reason=item.event.reason)
            finally:
                with self._lock:
                    self._busy = False

    def _client(self) -> EventsApi | None:
        if self._api is None and self._factory is not None:
            try:
                self._api = self._factory()
            except Exception as exc:
                log.warning("no cluster access for pod Events; they are counted only",
                            error=f"{type(exc).__name__}: {str(exc)[:200]}")
                self._factory = None
        return self._api

    def _send(self, key: tuple[str, str], item: _Pending) -> None:
        event = item.event
        api = self._client()
        if api is None:
            EVENTS.labels(event.reason, "no_access").inc()
            return
        with self._lock:
            sent = self._sent.get(key)
        now = self.clock()
        if sent is not None and now - sent.at < self.aggregate_seconds:
            count = sent.count + item.count
            patch = {"count": count, "lastTimestamp": _stamp(item.last), "message": event.message[:_MESSAGE_MAX]}
            try:
                api.patch(event.namespace, sent.name, patch)
            except Exception as exc:  # gone (expired), or the API failed: a new Event instead
                log.debug("pod event not patched; creating a new one", error=str(exc)[:200])
                sent = None
            else:
                self._remember(key, _Sent(sent.name, count, sent.first, now))
                EVENTS.labels(event.reason, "sent").inc()
                return
        name = f"{event.name}.{uuid.uuid4().hex[:16]}"[-_NAME_MAX:].lstrip(".-")
        body = event_body(event, name=name, host=self.host, count=item.count, first=item.first, last=item.last,
                          component=self.component)
        try:
            api.create(event.namespace, body)
        except Exception as exc:
            EVENTS.labels(event.reason, "failed").inc()
            log.warning("pod event not recorded", namespace=event.namespace, pod=event.name, pod_uid=event.uid,
                        reason=event.reason, error=f"{type(exc).__name__}: {str(exc)[:200]}")
            return
        self._remember(key, _Sent(name, item.count, item.first, now))
        EVENTS.labels(event.reason, "sent").inc()

    def _remember(self, key: tuple[str, str], sent: _Sent) -> None:
        with self._lock:
            self._sent[key] = sent
            self._sent.move_to_end(key)
            while len(self._sent) > self.max_series:
                self._sent.popitem(last=False)


class KubeEventsApi:
    """``EventsApi`` over ``rhp_kube.http.BlockingKubeHTTP`` (core/v1 Events), the transport of
    every other call: a create is a POST, a count update a JSON merge patch, each bounded by
    ``request_timeout``; a failure is one of ``rhp_kube.errors``.

    The recorder calls it from its sending thread only, so the calls run on that thread's own
    event loop: never on the node agent's loop, and an API server that does not answer holds
    that thread only."""

    def __init__(self, api_client: ApiClient, *, request_timeout: float = 5.0) -> None:
        from rhp_kube.http import BlockingKubeHTTP

        self._http = BlockingKubeHTTP(api_client, timeout=request_timeout, limit=2)
        self.request_timeout = request_timeout

    def create(self, namespace: str, body: Mapping[str, object]) -> None:
        from rhp_kube.http import JSON_TYPE, seg

        self._http.request("POST", f"/api/v1/namespaces/{seg(namespace)}/events", dict(body), JSON_TYPE,
                           max_bytes=_REPLY_MAX)  # fmt: skip

    def patch(self, namespace: str, name: str, body: Mapping[str, object]) -> None:
        from rhp_kube.http import MERGE_PATCH, seg

        self._http.request("PATCH", f"/api/v1/namespaces/{seg(namespace)}/events/{seg(name)}", dict(body),
                           MERGE_PATCH, max_bytes=_REPLY_MAX)  # fmt: skip

    def close(self) -> None:
        """Close the connections and the loop (when no call runs)."""
        self._http.close()
