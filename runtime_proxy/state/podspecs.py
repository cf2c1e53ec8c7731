"""The pods of this node as the cluster has them: the batch resources each one's containers ask
for, by pod uid, which CRI and NRI do not carry (extended resources never reach the runtime).

Built by ``runtime_proxy.wiring.pod_specs`` when ``fromCluster`` is set (else ``NoPodSpecs``);
the doors' lifecycle core (``runtime_proxy.engine.lifecycle.Lifecycle.run``) and the reconciler
(``runtime_proxy.loops.reconciler``) put what it knows into ``PodFacts.batch_resources`` before
a stage runs, so the batch_resource plugin stays a pure function of its facts.

``ClusterPods`` list-watches the pods whose ``spec.nodeName`` is this node with the official
client in one worker thread, with reconnects (the style of ``runtime_proxy.state.nodeconfig``'s
``ClusterWatch``). Each event is bounded before it is parsed (``MAX_POD_EVENT_CHARS``; a larger one
is refused unparsed) and each pod is parsed by the one parser of its format
(``koord_formats.pod.parse_pod_batch_resources``): a malformed pod is logged, counted and
forgotten, and costs only itself. At most ``MAX_PODS`` pods are kept (the oldest seen goes
first). Every new stream lists the node's pods again as ADDED events; a pod missing from two
streams in a row (of those that gave any event) is forgotten: its DELETED event was missed while
disconnected.

A lifecycle call for a BE pod the watch has not seen yet waits for it a little (``wait``, up to
``WAIT_SECONDS``, only while the watch is connected): kubelet and this watch learn of a new pod
at about the same time, and its sandbox is usually made after the pod reached the watch. Every
change of a pod's batch resources calls ``on_change`` (the reconciler's trigger), so a pod whose
call did not wait long enough is corrected by the next reconcile round.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
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
from rhp_ops.files import check_kubeconfig

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
# How long a lifecycle call of a BE pod the watch has not seen yet waits for it.
WAIT_SECONDS = 2.0
_TOO_LARGE = "TOO_LARGE"


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
    ) -> None:
        self.node_name = node_name
        self._api_client = api_client
        self._kubeconfig = kubeconfig
        self.watch_timeout = watch_timeout
        self.retry_seconds = retry_seconds
        self.wait_seconds = wait_seconds
        self.max_pods = max_pods
        self._lock = threading.Lock()
        self._pods: OrderedDict[str, _Known] = OrderedDict()
        self._stream = 0
        # True while a stream is open (then a pod not seen yet is worth waiting for).
        self.connected = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._watch: Any = None  # Any: kubernetes.watch.Watch (untyped)
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

    def begin_stream(self) -> None:
        """A new stream (it lists every pod of the node again): pods listed by neither the last
        whole stream nor this one are forgotten when this one starts."""
        with self._lock:
            self._stream += 1
            stale = [uid for uid, entry in self._pods.items() if entry.stream < self._stream - 2]
            for uid in stale:
                del self._pods[uid]
            POD_SPECS_KNOWN.set(len(self._pods))

    def handle_event(self, event: Mapping[str, Any]) -> bool:  # Any: JSON not yet checked
        """Fold one watch event (``{"type": ADDED|MODIFIED|DELETED, "object": {...}}``) in; True
        when a pod's batch resources changed (arrived, changed, left). A malformed pod is
        forgotten (its batch resources are unknown), logged and counted."""
        etype = event.get("type")
        obj = event.get("object")
        if etype not in ("ADDED", "MODIFIED", "DELETED") or not isinstance(obj, Mapping):
            return False
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

    # -- the watch thread ---------------------------------------------------------------------

    def _client(self) -> Any:  # Any: kubernetes.client.ApiClient (untyped)
        if self._api_client is None:
            from kubernetes import client, config

            k8s_config: Any = config  # Any: the untyped kubernetes.config module
            cfg = client.Configuration()
            if os.environ.get("KUBERNETES_SERVICE_HOST"):
                k8s_config.load_incluster_config(client_configuration=cfg)
            else:
                check_kubeconfig(self._kubeconfig)
                k8s_config.load_kube_config(config_file=self._kubeconfig, client_configuration=cfg)
            self._api_client = client.ApiClient(cfg)
        return self._api_client

    def _watch_loop(self, on_change: Callable[[], None]) -> None:
        from kubernetes import client

        new_watch = _bounded_watch()
        selector = f"spec.nodeName={self.node_name}"
        while not self._stop.is_set():
            w = new_watch()
            self._watch = w
            try:
                api = self._client()
                stream = w.stream(client.CoreV1Api(api).list_pod_for_all_namespaces, field_selector=selector,
                                  timeout_seconds=self.watch_timeout)
                self.connected = True
                first = True
                for event in stream:
                    if self._stop.is_set():
                        break
                    if first:  # a stream that lists nothing (or fails at once) forgets nothing
                        self.begin_stream()
                        first = False
                    if event.get("type") == _TOO_LARGE:
                        POD_SPECS_REJECTED.labels("too-large").inc()
                        log.warning("pod watch event refused unparsed", chars=event.get("size"),
                                    limit=MAX_POD_EVENT_CHARS)
                        continue
                    obj = event.get("object")
                    if not isinstance(obj, Mapping):
                        obj = api.sanitize_for_serialization(obj)
                    if self.handle_event({"type": event.get("type"), "object": obj}):
                        on_change()
            except Exception as exc:
                self.connected = False
                if not self._stop.is_set():
                    log.warning("pod watch failed; retrying", error=str(exc)[:300])
                    self._stop.wait(self.retry_seconds)
            finally:
                w.stop()
        self.connected = False

    def start_thread(self, on_change: Callable[[], None]) -> None:
        """Start the watch thread; ``on_change`` is called from it when a pod's batch resources
        changed."""
        self._stop.clear()
        self._thread = threading.Thread(target=self._watch_loop, args=(on_change,), name="watch-pods", daemon=True)
        self._thread.start()

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
        self._stop.set()
        self.connected = False
        if self._watch is not None:
            self._watch.stop()
        self._thread = None


def _bounded_watch() -> Any:  # Any: a subclass of the untyped kubernetes.watch.Watch
    """The client's ``Watch`` with each event bounded (``MAX_POD_EVENT_CHARS``, read when the event
    arrives; a larger one becomes a ``TOO_LARGE`` event, never parsed) and parsed once into plain
    dicts (no model objects)."""
    from kubernetes import watch

    class BoundedWatch(watch.Watch):
        def unmarshal_event(self, data: str, return_type: object) -> Any:  # Any: the client's event dict
            if len(data) > MAX_POD_EVENT_CHARS:
                return {"type": _TOO_LARGE, "object": None, "size": len(data)}
            return super().unmarshal_event(data, None)  # type: ignore[no-untyped-call]

    return BoundedWatch


def _uid_of(obj: Mapping[str, Any]) -> str:  # Any: JSON not yet checked
    meta = obj.get("metadata")
    uid = meta.get("uid") if isinstance(meta, Mapping) else None
    return uid if isinstance(uid, str) and len(uid) <= 128 else ""
