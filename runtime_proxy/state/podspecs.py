"""The pods of this node as the cluster has them: the batch resources each one's containers ask
for, by pod uid, which CRI and NRI do not carry (extended resources never reach the runtime).

Built by ``runtime_proxy.wiring.pod_specs`` when ``fromCluster`` is set (else ``NoPodSpecs``);
the doors' lifecycle core (``runtime_proxy.engine.lifecycle.Lifecycle.run``) and the reconciler
(``runtime_proxy.loops.reconciler``) put what it knows into ``PodFacts.batch_resources`` before
a stage runs, so the batch_resource plugin stays a pure function of its facts.

``ClusterPods`` list-watches the pods whose ``spec.nodeName`` is this node through the one
list-and-watch (``rhp_kube.watch``, on its own thread, supervised: no fault ends it; credentials
from ``rhp_kube.credentials``). Each pod is bounded before it is read (``MAX_POD_EVENT_CHARS`` as
JSON; a larger one is refused and counted) and parsed by the one parser of its format
(``koord_formats.pod.parse_pod_batch_resources``): a malformed pod is logged, counted and
forgotten, and costs only itself. At most ``MAX_PODS`` pods are kept (the oldest seen goes
first). A list (the first, and each after a 410 or a fault) replaces what is known: a pod it
does not hold is forgotten (its DELETED event was missed while disconnected). ``liveness`` fails
when the watch has heard nothing from the API server past its bound (the command's ``/healthz``).

A lifecycle call for a BE pod the watch has not seen yet waits for it a little (``wait``, up to
``WAIT_SECONDS``, only while the watch is connected): kubelet and this watch learn of a new pod
at about the same time, and its sandbox is usually made after the pod reached the watch. Every
change of a pod's batch resources calls ``on_change`` (the reconciler's trigger), so a pod whose
call did not wait long enough is corrected by the next reconcile round.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import structlog
from prometheus_client import Counter, Gauge

from hooks.facts import ContainerResourceSpec, PodFacts
from koord_formats import FormatError, keys
from koord_formats.pod import PodBatchResources, parse_pod_batch_resources
from rhp_kube.liveness import DEAD_AFTER

__all__ = [
    "MAX_PODS",
    "MAX_POD_EVENT_CHARS",
    "WAIT_SECONDS",
    "ClusterPods",
    "NoPodSpecs",
    "PodSpecSource",
]

log = structlog.get_logger("runtime_proxy.state.podspecs")

POD_SPECS_REJECTED = Counter("rhp_pod_specs_rejected", "pods of the cluster's pod watch refused: too-large "
                             "(refused unparsed), malformed (the pod's batch resources are unknown)", ["reason"])
POD_SPECS_KNOWN = Gauge("rhp_pod_specs_known", "pods of this node whose spec the pod watch holds")
POD_SPECS_WAITED = Counter("rhp_pod_specs_waited", "lifecycle calls of BE pods that waited for the pod watch, "
                           "by outcome (found, timeout)", ["outcome"])

# What one pod's watch event may be: the API server stores objects of up to about 1.5 MiB.
MAX_POD_EVENT_CHARS = 2 << 20
# The pods kept (kubelet's maxPods defaults to 110; a node of thousands is not one we serve).
MAX_PODS = 4096
# How long a lifecycle call of a BE pod the watch has not seen yet waits for it: well inside
# containerd's NRI plugin request timeout (2 s by default), past which containerd drops the plugin.
WAIT_SECONDS = 0.5


class PodSpecSource(Protocol):
    """Where a pod's facts get what only the cluster knows of it (``PodFacts.batch_resources``)."""

    def facts(self, pod: PodFacts) -> PodFacts:
        """``pod`` with what the source knows of it filled in (``pod`` itself when nothing)."""
        ...

    async def wait(self, pod: PodFacts) -> PodFacts:
        """``facts``, after waiting a little for a BE pod the source has not seen yet."""
        ...

    def subscribe(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (on the event loop) whenever what the source knows changed."""
        ...


class NoPodSpecs:
    """No cluster access: pods keep the facts the runtime gave (only the annotation path)."""

    def facts(self, pod: PodFacts) -> PodFacts:
        return pod

    async def wait(self, pod: PodFacts) -> PodFacts:
        return pod

    def subscribe(self, callback: Callable[[], None]) -> None:
        """Nothing ever changes."""

    async def start(self) -> None:
        """Nothing to watch."""

    async def stop(self) -> None:
        """Nothing to stop."""

    def liveness(self) -> tuple[bool, str]:
        """Nothing watched: always alive."""
        return True, "not watching"


@dataclass(frozen=True)
class _Known:
    """One pod as the watch saw it: its batch resources and the stream that last listed it."""

    containers: Mapping[str, ContainerResourceSpec]
    stream: int


class ClusterPods:
    """The pods of ``node_name`` from the cluster, by uid (see the module doc).

    :param api_client: a ready ``kubernetes.client.ApiClient``; ``None``: credentials in-cluster
        (service account), else from ``kubeconfig`` / ``~/.kube/config``.
    """

    def __init__(
        self,
        node_name: str,
        *,
        api_client: Any = None,  # Any: kubernetes.client.ApiClient (untyped)
        kubeconfig: str | None = None,
        watch_timeout: int = 300,
        retry_seconds: float = 1.0,
        wait_seconds: float = WAIT_SECONDS,
        max_pods: int = MAX_PODS,
        read_deadline: float | None = None,
        dead_after: float = DEAD_AFTER,
    ) -> None:
        self.node_name = node_name
        self._api_client = api_client
        self._kubeconfig = kubeconfig
        self.watch_timeout = watch_timeout
        self.retry_seconds = retry_seconds
        self.wait_seconds = wait_seconds
        self.max_pods = max_pods
        # a stream silent this long is cut: past the server's end of the stream plus a margin
        self.read_deadline = read_deadline if read_deadline is not None else watch_timeout + 30.0
        self.dead_after = max(dead_after, self.read_deadline + 30.0)
        self._lock = threading.Lock()
        self._pods: OrderedDict[str, _Known] = OrderedDict()
        self._stream = 0
        # True while a stream is open (then a pod not seen yet is worth waiting for).
        self.connected = False
        self._informer: Any = None  # Any: rhp_kube.watch.Informer (imported with the [cluster] extra)
        self._on_change: Callable[[], None] = lambda: None
        self._subscribers: list[Callable[[], None]] = []

    # -- what the doors and the reconciler ask ---------------------------------------------------

    def known(self, uid: str) -> Mapping[str, ContainerResourceSpec] | None:
        """The batch resources of pod ``uid`` (empty: it asks for none); None when not seen."""
        with self._lock:
            entry = self._pods.get(uid)
        return None if entry is None else entry.containers

    def facts(self, pod: PodFacts) -> PodFacts:
        if not pod.uid:
            return pod
        containers = self.known(pod.uid)
        if containers is None or containers == pod.batch_resources:
            return pod
        return pod.replace(batch_resources=containers)

    async def wait(self, pod: PodFacts) -> PodFacts:
        if (not pod.uid or pod.qos_label != keys.QOS_BE or not self.connected
                or pod.annotations.get(keys.ANNOTATION_EXTENDED_RESOURCE_SPEC)):
            return self.facts(pod)
        deadline = time.monotonic() + self.wait_seconds
        waited = False
        while self.known(pod.uid) is None and self.connected and time.monotonic() < deadline:
            waited = True
            await asyncio.sleep(0.05)
        if waited:
            found = self.known(pod.uid) is not None
            POD_SPECS_WAITED.labels("found" if found else "timeout").inc()
            if not found:
                log.warning("pod not seen by the pod watch in time; its batch resources wait for the reconciler",
                            seconds=self.wait_seconds)
        return self.facts(pod)

    # -- the watch's events (pure of I/O) ---------------------------------------------------------

    def handle_event(self, event: Mapping[str, Any]) -> bool:  # Any: JSON not yet checked
        """Fold one watch event (``{"type": ADDED|MODIFIED|DELETED, "object": {...}}``) in; True
        when a pod's batch resources changed (arrived, changed, left). A malformed pod is
        forgotten (its batch resources are unknown), logged and counted."""
        etype = event.get("type")
        obj = event.get("object")
        if etype not in ("ADDED", "MODIFIED", "DELETED") or not isinstance(obj, Mapping):
            return False
        if etype != "DELETED":
            import orjson  # the [cluster] extra's, as the watch that calls this

            size = len(orjson.dumps(obj))
            if size > MAX_POD_EVENT_CHARS:
                POD_SPECS_REJECTED.labels("too-large").inc()
                uid = _uid_of(obj)
                log.warning("pod refused unread by the pod watch; its batch resources are unknown", pod_uid=uid,
                            chars=size, limit=MAX_POD_EVENT_CHARS)
                return self._forget(uid) if uid else False
        try:
            pod = parse_pod_batch_resources(dict(obj))
        except FormatError as exc:
            POD_SPECS_REJECTED.labels("malformed").inc()
            uid = _uid_of(obj)
            log.warning("pod refused by the pod watch; its batch resources are unknown", pod_uid=uid,
                        error=str(exc)[:300])
            return self._forget(uid) if uid else False
        if etype == "DELETED":
            return self._forget(pod.uid)
        return self._keep(pod)

    def _keep(self, pod: PodBatchResources) -> bool:
        with self._lock:
            before = self._pods.pop(pod.uid, None)
            self._pods[pod.uid] = _Known(pod.containers, self._stream)
            while len(self._pods) > self.max_pods:
                self._pods.popitem(last=False)
            POD_SPECS_KNOWN.set(len(self._pods))
        return before is None or before.containers != pod.containers

    def _forget(self, uid: str) -> bool:
        with self._lock:
            gone = self._pods.pop(uid, None)
            POD_SPECS_KNOWN.set(len(self._pods))
        return gone is not None

    # -- ``rhp_kube.watch.Sink``: called on the watch's thread ----------------------------------

    def replace(self, kind: str, items: list[dict[str, Any]], *, absent: bool) -> None:
        """A fresh list of the node's pods: each is folded in, and a pod it does not hold is
        forgotten (its DELETED event was missed while the watch was away)."""
        listed: set[str] = set()
        changed = False
        for obj in items:
            changed = self.handle_event({"type": "ADDED", "object": obj}) or changed
            uid = _uid_of(obj)
            if uid:
                listed.add(uid)
        with self._lock:
            gone = [uid for uid in self._pods if uid not in listed]
        for uid in gone:
            changed = self._forget(uid) or changed
        self.connected = True
        if changed:
            self._on_change()

    def apply(self, kind: str, event: str, obj: dict[str, Any]) -> None:
        self.connected = True
        if self.handle_event({"type": event, "object": obj}):
            self._on_change()

    def _http(self) -> Any:  # Any: rhp_kube.http.KubeHTTP
        from rhp_kube.http import watch_transport

        return watch_transport(self._api_client, self._kubeconfig)

    def start_thread(self, on_change: Callable[[], None]) -> None:
        """Start the watch's thread; ``on_change`` is called from it when a pod's batch resources
        changed."""
        from rhp_kube.watch import Informer, Resource, WatchOptions, collection

        self._on_change = on_change
        resource = Resource("pods", collection("", "v1", "pods"), field_selector=f"spec.nodeName={self.node_name}")
        options = WatchOptions(watch_timeout=self.watch_timeout, read_deadline=self.read_deadline,
                               backoff_initial=self.retry_seconds, dead_after=self.dead_after,
                               max_line_bytes=2 * MAX_POD_EVENT_CHARS)
        self._informer = Informer(self._http, [resource], self, component="node-pods", options=options)
        self._informer.start_thread()

    def liveness(self) -> tuple[bool, str]:
        """``rhp_kube.watch.Informer.liveness`` of the pod watch (alive when not started)."""
        informer = self._informer
        if informer is None:
            return True, "not watching"
        alive, why = informer.liveness()
        return bool(alive), str(why)

    def subscribe(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` on the event loop after a pod's batch resources changed."""
        self._subscribers.append(callback)

    def _notify(self) -> None:
        for callback in list(self._subscribers):
            try:
                callback()
            except Exception:
                log.exception("pod watch subscriber failed")

    async def start(self) -> None:
        """Start watching (``start_thread``); subscribers are called on the running loop."""
        loop = asyncio.get_running_loop()

        def changed() -> None:
            if not loop.is_closed():
                with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                    loop.call_soon_threadsafe(self._notify)

        self.start_thread(changed)

    async def stop(self) -> None:
        self.connected = False
        informer, self._informer = self._informer, None
        if informer is not None:
            await asyncio.to_thread(informer.close)


def _uid_of(obj: Mapping[str, Any]) -> str:  # Any: JSON not yet checked
    meta = obj.get("metadata")
    uid = meta.get("uid") if isinstance(meta, Mapping) else None
    return uid if isinstance(uid, str) and len(uid) <= 128 else ""
