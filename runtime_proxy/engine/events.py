"""Kubernetes Events on pods for what their hooks did: the answer to "what happened to my pod?"
when a hook failed or refused a call, whatever its failure policy (``Ignore`` included).

``Lifecycle.run`` hands every failure of a stage about a pod to an ``EventSink``; the
``EventRecorder`` here is the production one, built by the composition root:

- ``record`` never blocks and never raises: it only touches a small table under a lock. The
  Events are sent by the recorder's own daemon thread, never on the event loop nor in the
  default executor, so an API server that is slow or never answers holds that thread only.
- Aggregation, like client-go's event correlator: an Event already queued for the same pod and
  reason takes the repeat into its ``count``; a repeat after it was sent (within
  ``aggregate_seconds``) patches the sent Event's ``count``, ``lastTimestamp`` and message.
- Rate limit: at most ``per_pod`` sends (creates or patches) per pod per ``window`` seconds;
  past that, repeats are dropped and counted (``rate_limited``).
- Bounded: at most ``queue_size`` distinct Events wait to be sent (a new one past that is
  dropped and counted, ``dropped``); at most ``max_series`` sent Events and ``max_pods`` pods'
  rate windows are remembered (the least recent are forgotten).
- No cluster access (no ``api`` given, or its credentials fail to load): nothing is sent and
  every Event is counted as ``no_access``; the first failure is logged.

Events are core/v1 Events (``involvedObject`` the pod by namespace, name and uid; ``source``
and ``reportingController`` ``runtime-hook-proxy``, ``reportingInstance`` and ``source.host``
the node). RBAC: ``create`` and ``patch`` on ``events`` in the core group.

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
from typing import Any, Protocol

import structlog
from prometheus_client import Counter

log = structlog.get_logger(__name__)

__all__ = [
    "COMPONENT",
    "EVENTS",
    "REASON_FAILED",
    "REASON_REFUSED",
    "EventRecorder",
    "EventSink",
    "EventsApi",
    "PodEvent",
    "event_body",
]

COMPONENT = "runtime-hook-proxy"
# A hook failed and the call went on without it (policy Ignore, or a stage that cannot refuse).
REASON_FAILED = "RuntimeHookFailed"
# A Fail-policy hook failed and the call was refused.
REASON_REFUSED = "RuntimeHookRefused"

EVENTS = Counter(
    "rhp_pod_events_total",
    "Kubernetes Events about pods (hook failures and refusals), by reason and outcome: queued, "
    "aggregated (folded into a queued Event's count), sent, failed (the API refused or did not "
    "answer), rate_limited, dropped (queue full), no_access (no cluster credentials).",
    ["reason", "outcome"],
)

# What one Event may carry (the API server refuses messages past 1 KiB in events.k8s.io).
_MESSAGE_MAX = 1024
_NAME_MAX = 253


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


def event_body(event: PodEvent, *, name: str, host: str, count: int, first: datetime,
               last: datetime) -> dict[str, object]:
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
        "source": {"component": COMPONENT, **({"host": host} if host else {})},
        "reportingComponent": COMPONENT,
        "reportingInstance": host or COMPONENT,
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
    """Rate-limited, aggregated Events on pods, sent off the event loop (module docstring).

    :param api: makes the API client on first use (may raise: no credentials); ``None``: the
        node has no cluster access and Events are only counted.
    :param host: this node's name (``source.host``, ``reportingInstance``).
    :param per_pod: sends per pod per ``window`` seconds.
    :param queue_size: distinct Events waiting to be sent.
    :param aggregate_seconds: how long a sent Event takes repeats into its count.
    """

    def __init__(
        self,
        api: Callable[[], EventsApi] | None,
        *,
        host: str = "",
        per_pod: int = 5,
        window: float = 60.0,
        queue_size: int = 256,
        aggregate_seconds: float = 600.0,
        max_series: int = 4096,
        max_pods: int = 4096,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._factory = api
        self._api: EventsApi | None = None
        self.host = host
        self.per_pod = per_pod
        self.window = window
        self.queue_size = queue_size
        self.aggregate_seconds = aggregate_seconds
        self.max_series = max_series
        self.max_pods = max_pods
        self.clock = clock
        self.wall = wall
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        # (pod key, reason) -> the Event waiting to be sent, oldest first.
        self._pending: OrderedDict[tuple[str, str], _Pending] = OrderedDict()
        # (pod key, reason) -> the Event last sent for it, least recent first.
        self._sent: OrderedDict[tuple[str, str], _Sent] = OrderedDict()
        # pod key -> clock() of its sends within the window, least recent pod first.
        self._sends: OrderedDict[str, list[float]] = OrderedDict()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._busy = False

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
            elif not self._allowed(key[0]):
                outcome = "rate_limited"
            elif len(self._pending) >= self.queue_size:
                outcome = "dropped"
            else:
                self._pending[key] = _Pending(event, 1, now, now)
                outcome = "queued"
                self._start()
                self._wake.notify()
        EVENTS.labels(event.reason, outcome).inc()

    def _allowed(self, pod: str) -> bool:
        """Whether ``pod`` may have one more send now (taken from its budget when so)."""
        now = self.clock()
        sends = [t for t in self._sends.get(pod, ()) if now - t < self.window]
        if len(sends) >= self.per_pod:
            self._sends[pod] = sends
            return False
        sends.append(now)
        self._sends[pod] = sends
        self._sends.move_to_end(pod)
        while len(self._sends) > self.max_pods:
            self._sends.popitem(last=False)
        return True

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
        body = event_body(event, name=name, host=self.host, count=item.count, first=item.first, last=item.last)
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
    """``EventsApi`` over a ``kubernetes.client.ApiClient`` (core/v1 Events)."""

    def __init__(self, api_client: object, *, request_timeout: float = 5.0) -> None:
        from kubernetes import client

        self._core = client.CoreV1Api(api_client)
        self.request_timeout = request_timeout

    def create(self, namespace: str, body: Mapping[str, object]) -> None:
        event: Any = dict(body)  # Any: typed CoreV1Event, but the client sends a plain dict as the JSON body
        self._core.create_namespaced_event(namespace, event, _request_timeout=self.request_timeout)

    def patch(self, namespace: str, name: str, body: Mapping[str, object]) -> None:
        # A JSON merge patch (the client would otherwise send a dict as a JSON patch, which
        # the API server refuses).
        self._core.patch_namespaced_event(name, namespace, dict(body), _request_timeout=self.request_timeout,
                                          _content_type="application/merge-patch+json")
