"""The extender's use of the Kubernetes access layer (``rhp_kube``).

Who calls this: ``scheduler_ext.cli serve`` keeps its cluster cache (``state.ClusterState``) in
step with ``watch_cluster`` (the one list-and-watch, ``rhp_kube.watch.Informer``, on its own
thread and event loop, into ``CacheSink``) and makes its API calls through a ``BindClient``
(``binder.Binder`` the pod calls, ``ledger.LeaseLedger`` the Lease calls, ``requeue.Requeuer``).

Watches: Nodes, Pods, NodeResourceTopologies, Devices and Reservations (and NodeMetrics with
load-aware scheduling), each decoded by orjson into plain dicts, never the client's model
objects (50,000 pods as models would cost seconds and hundreds of MiB), unknown fields kept.
The optional CRDs (everything but Nodes and Pods) may be missing: the kind is then listed as
empty and "not installed" (``/readyz`` says so without failing).

Keys (``KubeKeyAPI``): the signing key's Secret and ConfigMap through the same transport,
synchronously on a loop of its own, a few times at start.

Bind side (``BindClient``): pod GET/PATCH, Binding, Lease GET/POST/PUT as coroutines on the
server's event loop over aiohttp (``rhp_kube.http.KubeHTTP``); a bind is usually the Binding
(which carries the annotations) and one Lease write. Every error is one of ``rhp_kube.errors``
(named by ``scheduler_ext.errors``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from koord_formats import keys, nodemetric
from rhp_kube.http import JSON_TYPE, MERGE_PATCH, BlockingKubeHTTP, KubeHTTP, json_object, lease_path, seg
from rhp_kube.watch import Informer, Resource, WatchOptions, collection
from scheduler_ext.state import NODE_METRICS, ClusterState

if TYPE_CHECKING:
    import kubernetes

__all__ = ["JSON_TYPE", "MERGE_PATCH", "BindClient", "CacheSink", "KubeKeyAPI", "resources", "watch_cluster"]

# kind -> the collection the extender watches; all but Nodes and Pods are CRDs that may be missing
_PATHS = {
    "nodes": collection("", "v1", "nodes"),
    "pods": collection("", "v1", "pods"),
    "noderesourcetopologies": collection("topology.node.k8s.io", "v1alpha1", "noderesourcetopologies"),
    "devices": collection("scheduling.koordinator.sh", "v1alpha1", "devices"),
    "reservations": collection(keys.RESERVATION_API_GROUP, keys.RESERVATION_API_VERSION, keys.RESERVATION_PLURAL),
    NODE_METRICS: collection(nodemetric.API_GROUP, nodemetric.API_VERSION, nodemetric.PLURAL),  # load-aware only
}


def resources(kinds: tuple[str, ...]) -> list[Resource]:
    """The collections of ``kinds`` (``ClusterState.kinds``)."""
    return [Resource(kind, _PATHS[kind], optional=kind not in ("nodes", "pods")) for kind in kinds]


class ReservationSink(Protocol):
    """Where the Reservation objects go besides the cache (``scheduler_ext.reserver.ReservationStore``)."""

    def replace(self, items: list[dict[str, Any]]) -> None: ...

    def apply(self, event: str, obj: dict[str, Any]) -> None: ...


class CacheSink:
    """``rhp_kube.watch.Sink`` over the extender's cache: a list replaces a kind, an event is
    applied, and every word from the API server is recorded (``ClusterState.heard``) for
    ``/readyz``'s staleness and the HA ledger's ``settled``. A kind whose CRD is missing is
    empty and "not installed"."""

    def __init__(self, state: ClusterState, reservations: ReservationSink | None = None) -> None:
        self.state = state
        self.reservations = reservations  # the reservation controller's copy (``scheduler_ext.reserver``)

    def replace(self, kind: str, items: list[dict[str, Any]], *, absent: bool) -> None:
        if kind == "reservations" and self.reservations is not None:
            self.reservations.replace(items)
        if absent:
            if kind not in self.state.synced:
                self.state.replace(kind, [])  # the CRD is not installed: nothing to know
        else:
            self.state.replace(kind, items)
        self.state.heard(kind, absent=absent)

    def apply(self, kind: str, event: str, obj: dict[str, Any]) -> None:
        self.state.apply(kind, event, obj)
        if kind == "reservations" and self.reservations is not None:
            self.reservations.apply(event, obj)

    def heard(self, kind: str) -> None:
        self.state.heard(kind)


def watch_cluster(
    state: ClusterState, http: KubeHTTP, options: WatchOptions, reservations: ReservationSink | None = None
) -> Informer:
    """Start the extender's watches on their own thread (``close`` stops them); ``state``'s
    readiness and the extender's ``/healthz`` (``Informer.liveness``) follow them. Reservation
    objects also go to ``reservations`` (the reservation controller's store) when given."""
    sink = CacheSink(state, reservations)
    informer = Informer(http, resources(state.kinds), sink, component="extender", options=options,
                        on_heard=sink.heard)
    informer.start_thread()
    return informer


_json = json_object
_seg = seg
_KEYS_MAX = 4 << 20  # a Secret or ConfigMap of keys (the API server stores at most about 1.5 MiB)


def _pod_path(namespace: str, name: str) -> str:
    return f"/api/v1/namespaces/{_seg(namespace)}/pods/{_seg(name)}"


class BindClient(KubeHTTP):
    """The bind path's API calls as coroutines (``rhp_kube.http.KubeHTTP``: one session per
    event loop, ``timeout`` bounds each call)."""

    async def _request(self, method: str, path: str, body: Any = None, content_type: str = JSON_TYPE) -> bytes:
        return await self.request(method, path, body, content_type)

    async def get_pod(self, namespace: str, name: str) -> dict[str, Any]:
        return _json(await self._request("GET", _pod_path(namespace, name)))

    async def patch_pod_annotations(
        self, namespace: str, name: str, annotations: Mapping[str, str | None], resource_version: str
    ) -> dict[str, Any]:
        """JSON merge patch of annotations (``None`` deletes a key), guarded by resourceVersion."""
        meta: dict[str, Any] = {"annotations": dict(annotations)}
        if resource_version:
            meta["resourceVersion"] = resource_version
        return _json(
            await self._request("PATCH", _pod_path(namespace, name), {"metadata": meta}, MERGE_PATCH)
        )

    async def bind_pod(
        self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str], resource_version: str
    ) -> None:
        """POST the ``pods/binding`` subresource. kube-apiserver's BindingREST copies the
        Binding's ``metadata.annotations`` onto the pod in the same storage update that sets
        ``spec.nodeName``, and takes its ``metadata.uid`` and ``metadata.resourceVersion`` as
        preconditions (409 when the pod was replaced, changed since that version, or bound)."""
        meta: dict[str, Any] = {"name": name, "namespace": namespace}
        if uid:
            meta["uid"] = uid
        if resource_version:
            meta["resourceVersion"] = resource_version
        if annotations:
            meta["annotations"] = dict(annotations)
        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": meta,
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        await self._request("POST", _pod_path(namespace, name) + "/binding", body)

    async def get_lease(self, namespace: str, name: str) -> dict[str, Any]:
        return _json(await self._request("GET", lease_path(namespace, name)))

    async def create_lease(self, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]:
        return _json(await self._request("POST", lease_path(namespace), body))

    async def replace_lease(self, namespace: str, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """PUT; ``metadata.resourceVersion`` in ``body`` makes it a compare-and-swap (409)."""
        return _json(await self._request("PUT", lease_path(namespace, name), body))


class KubeKeyAPI:
    """Secrets and ConfigMaps (``scheduler_ext.keystore.KeyAPI``) through
    ``rhp_kube.http.BlockingKubeHTTP``, the transport of every other call, synchronously:
    ``serve`` calls it a few times at start, before its server runs (``close`` ends its loop).
    Each call is bounded by ``timeout``; a failure is one of ``rhp_kube.errors``."""

    def __init__(self, api_client: kubernetes.client.ApiClient, *, timeout: float = 10.0) -> None:
        self._http = BlockingKubeHTTP(api_client, timeout=timeout, limit=2)

    def _do(self, method: str, path: str, body: Mapping[str, Any] | None = None) -> dict[str, Any]:
        data = None if body is None else dict(body)
        return _json(self._http.request(method, path, data, max_bytes=_KEYS_MAX))

    @staticmethod
    def _path(kind: str, namespace: str) -> str:
        if kind not in ("secrets", "configmaps"):
            raise ValueError(f"not a key object kind: {kind}")
        return f"/api/v1/namespaces/{_seg(namespace)}/{kind}"

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any]:
        return self._do("GET", f"{self._path(kind, namespace)}/{_seg(name)}")

    def create(self, kind: str, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]:
        return self._do("POST", self._path(kind, namespace), body)

    def replace(self, kind: str, namespace: str, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        return self._do("PUT", f"{self._path(kind, namespace)}/{_seg(name)}", body)

    def close(self) -> None:
        self._http.close()
