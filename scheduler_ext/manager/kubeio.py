"""The manager's API calls, on the extender's client code (``scheduler_ext.kube``).

Who calls this: ``scheduler_ext.manager.cli``. ``manager_resources`` and ``webhook_resources``
are what the manager's caches watch with the one list-and-watch (``rhp_kube.watch``): Nodes,
Pods, NodeMetrics, NodeSLOs, NodeResourceTopologies and the one ConfigMap (by name in its
namespace); Namespaces, ClusterColocationProfiles and PriorityClasses for the webhook. The CRDs
may be missing (listed as empty and absent: not written). ``ManagerAPI`` adds the writes to
``BindClient`` (aiohttp on the event loop, typed errors): NodeMetric and NodeSLO create, spec
replace and delete, and the Node status merge patch. ``LeaseCalls`` gives the election
(``rhp_kube.lease.Elector``) the Lease calls of ``BindClient``, a conflict as ``None``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from koord_formats import nodemetric, nrt, profile, sloconfig
from rhp_kube.watch import Resource, collection
from scheduler_ext.errors import ConflictError, NotFoundError
from scheduler_ext.kube import MERGE_PATCH, BindClient, _json, _seg

__all__ = ["KINDS", "LeaseCalls", "ManagerAPI", "manager_resources", "webhook_resources"]

NODES, PODS, NODEMETRICS, NODESLOS, CONFIGMAPS = "nodes", "pods", "nodemetrics", "nodeslos", "configmaps"
NRTS = nrt.PLURAL
KINDS = (NODES, PODS, NODEMETRICS, NODESLOS, CONFIGMAPS, NRTS)
# What the pod webhook watches (scheduler_ext/manager/webhook.py).
NAMESPACES, PRIORITY_CLASSES = "namespaces", "priorityclasses"
_GROUPS = {
    NODEMETRICS: (nodemetric.API_GROUP, nodemetric.API_VERSION, nodemetric.PLURAL),
    NODESLOS: (sloconfig.NODESLO_API_GROUP, sloconfig.NODESLO_API_VERSION, sloconfig.NODESLO_PLURAL),
    profile.PLURAL: (profile.API_GROUP, profile.API_VERSION, profile.PLURAL),
    NRTS: (nrt.API_GROUP, nrt.API_VERSION, nrt.PLURAL),
}


def manager_resources(config_namespace: str, config_name: str) -> list[Resource]:
    """The manager cache's kinds (``KINDS``); the ConfigMap by name in its namespace."""
    out = [Resource(NODES, collection("", "v1", NODES)), Resource(PODS, collection("", "v1", PODS)),
           Resource(CONFIGMAPS, collection("", "v1", CONFIGMAPS, config_namespace),
                    field_selector=f"metadata.name={config_name}")]
    out += [Resource(kind, _cluster_path(kind), optional=True) for kind in (NODEMETRICS, NODESLOS, NRTS)]
    return out


def webhook_resources() -> list[Resource]:
    """The webhook's kinds (``scheduler_ext.manager.webhook.WEBHOOK_KINDS``)."""
    return [Resource(NAMESPACES, collection("", "v1", NAMESPACES)),
            Resource(profile.PLURAL, _cluster_path(profile.PLURAL), optional=True),
            Resource(PRIORITY_CLASSES, collection("scheduling.k8s.io", "v1", PRIORITY_CLASSES))]


def _cluster_path(kind: str, name: str = "") -> str:
    group, version, plural = _GROUPS[kind]
    path = f"/apis/{group}/{version}/{plural}"
    return f"{path}/{_seg(name)}" if name else path


class ManagerAPI(BindClient):
    """The manager's writes, as coroutines; every error is one of ``scheduler_ext.errors``."""

    async def create_object(self, kind: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """POST a NodeMetric or NodeSLO (409 when it exists); ``patch_object`` and
        ``delete_object`` take these kinds and NodeResourceTopologies (patch only)."""
        return _json(await self._request("POST", _cluster_path(kind), body))

    async def patch_object(self, kind: str, name: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        """JSON merge patch of a NodeMetric or NodeSLO (a ``metadata.resourceVersion`` in the
        patch makes it conditional: 409 when the object changed since)."""
        return _json(await self._request("PATCH", _cluster_path(kind, name), patch, MERGE_PATCH))

    async def delete_object(self, kind: str, name: str, uid: str = "") -> None:
        """DELETE a NodeMetric or NodeSLO; with ``uid`` only that incarnation of it (409 else)."""
        body = {"kind": "DeleteOptions", "apiVersion": "v1", "preconditions": {"uid": uid}} if uid else None
        await self._request("DELETE", _cluster_path(kind, name), body)

    async def patch_node_status(self, name: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        """JSON merge patch of the Node's status subresource (``null`` removes a key; a
        ``metadata.resourceVersion`` makes it conditional)."""
        return _json(await self._request("PATCH", f"/api/v1/nodes/{_seg(name)}/status", patch, MERGE_PATCH))


    async def get_secret(self, namespace: str, name: str) -> dict[str, Any]:
        """The Secret holding the webhook's certificate (``scheduler_ext.manager.certs``)."""
        return _json(await self._request("GET", f"/api/v1/namespaces/{_seg(namespace)}/secrets/{_seg(name)}"))

    async def replace_secret(self, namespace: str, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """PUT the Secret (its ``metadata.resourceVersion`` guards the write: 409 when stale)."""
        path = f"/api/v1/namespaces/{_seg(namespace)}/secrets/{_seg(name)}"
        return _json(await self._request("PUT", path, body))

    async def get_mutating_webhook(self, name: str) -> dict[str, Any]:
        return _json(await self._request("GET", f"{_WEBHOOKS}/{_seg(name)}"))

    async def patch_mutating_webhook(self, name: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        """Strategic merge patch of a MutatingWebhookConfiguration (its webhooks merged by name)."""
        return _json(await self._request("PATCH", f"{_WEBHOOKS}/{_seg(name)}", patch, STRATEGIC_MERGE_PATCH))


_WEBHOOKS = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"


class LeaseCalls:
    """``rhp_kube.lease.LeaseAPI`` over ``BindClient``'s Lease calls: 404 on a read and 409 (or
    404) on a write are answers (``None``); every other failure raises."""

    def __init__(self, client: BindClient) -> None:
        self.client = client

    async def get_lease(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        try:
            return await self.client.get_lease(namespace, name)
        except NotFoundError:
            return None

    async def create_lease(self, namespace: str, body: Mapping[str, Any]) -> Mapping[str, Any] | None:
        try:
            return await self.client.create_lease(namespace, body)
        except ConflictError:
            return None

    async def replace_lease(self, namespace: str, name: str, body: Mapping[str, Any]) -> Mapping[str, Any] | None:
        try:
            return await self.client.replace_lease(namespace, name, body)
        except (ConflictError, NotFoundError):
            return None
