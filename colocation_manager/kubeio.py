"""The manager's API calls, on the one Kubernetes access layer (``rhp_kube``).

Who calls this: ``colocation_manager.cli``. ``manager_resources`` and ``webhook_resources``
are what the manager's caches watch with the one list-and-watch (``rhp_kube.watch``): Nodes,
Pods, NodeMetrics, NodeSLOs, NodeResourceTopologies and the one ConfigMap (by name in its
namespace); Namespaces, ClusterColocationProfiles and PriorityClasses for the webhook. The CRDs
may be missing (listed as empty and absent: not written). ``ManagerAPI`` makes the writes on
``rhp_kube.http.KubeHTTP`` (aiohttp on the event loop, typed errors): NodeMetric and NodeSLO
create, spec replace and delete, the Node status merge patch, the Node merge patch (its CPU
normalization ratio annotation), the webhook's Secret and configuration. ``LeaseCalls``
(``rhp_kube.lease``) gives the election (``rhp_kube.lease.Elector``) its Lease calls on the same
transport, a conflict as ``None``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from koord_formats import nodemetric, nrt, profile, sloconfig
from rhp_kube.http import MERGE_PATCH, KubeHTTP, json_object, seg
from rhp_kube.lease import LeaseCalls
from rhp_kube.watch import Resource, collection

__all__ = ["KINDS", "LeaseCalls", "ManagerAPI", "manager_resources", "webhook_resources"]

NODES, PODS, NODEMETRICS, NODESLOS, CONFIGMAPS = "nodes", "pods", "nodemetrics", "nodeslos", "configmaps"
NRTS = nrt.PLURAL
KINDS = (NODES, PODS, NODEMETRICS, NODESLOS, CONFIGMAPS, NRTS)
# What the pod webhook watches (colocation_manager/webhook.py).
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
    """The webhook's kinds (``colocation_manager.webhook.WEBHOOK_KINDS``)."""
    return [Resource(NAMESPACES, collection("", "v1", NAMESPACES)),
            Resource(profile.PLURAL, _cluster_path(profile.PLURAL), optional=True),
            Resource(PRIORITY_CLASSES, collection("scheduling.k8s.io", "v1", PRIORITY_CLASSES))]


def _cluster_path(kind: str, name: str = "") -> str:
    group, version, plural = _GROUPS[kind]
    path = f"/apis/{group}/{version}/{plural}"
    return f"{path}/{seg(name)}" if name else path


class ManagerAPI(KubeHTTP):
    """The manager's writes, as coroutines; every error is one of ``rhp_kube.errors``."""

    async def create_object(self, kind: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """POST a NodeMetric or NodeSLO (409 when it exists); ``patch_object`` and
        ``delete_object`` take these kinds and NodeResourceTopologies (patch only)."""
        return json_object(await self.request("POST", _cluster_path(kind), body))

    async def patch_object(self, kind: str, name: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        """JSON merge patch of a NodeMetric or NodeSLO (a ``metadata.resourceVersion`` in the
        patch makes it conditional: 409 when the object changed since)."""
        return json_object(await self.request("PATCH", _cluster_path(kind, name), patch, MERGE_PATCH))

    async def delete_object(self, kind: str, name: str, uid: str = "") -> None:
        """DELETE a NodeMetric or NodeSLO; with ``uid`` only that incarnation of it (409 else)."""
        body = {"kind": "DeleteOptions", "apiVersion": "v1", "preconditions": {"uid": uid}} if uid else None
        await self.request("DELETE", _cluster_path(kind, name), body)

    async def patch_node(self, name: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        """JSON merge patch of the Node itself (its metadata: the CPU normalization ratio
        annotation; a ``metadata.resourceVersion`` makes it conditional)."""
        return json_object(await self.request("PATCH", f"/api/v1/nodes/{seg(name)}", patch, MERGE_PATCH))

    async def patch_node_status(self, name: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        """JSON merge patch of the Node's status subresource (``null`` removes a key; a
        ``metadata.resourceVersion`` makes it conditional)."""
        return json_object(await self.request("PATCH", f"/api/v1/nodes/{seg(name)}/status", patch, MERGE_PATCH))


    async def get_secret(self, namespace: str, name: str) -> dict[str, Any]:
        """The Secret holding the webhook's certificate (``colocation_manager.certs``)."""
        return json_object(await self.request("GET", f"/api/v1/namespaces/{seg(namespace)}/secrets/{seg(name)}"))

    async def replace_secret(self, namespace: str, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """PUT the Secret (its ``metadata.resourceVersion`` guards the write: 409 when stale)."""
        path = f"/api/v1/namespaces/{seg(namespace)}/secrets/{seg(name)}"
        return json_object(await self.request("PUT", path, body))

    async def get_mutating_webhook(self, name: str) -> dict[str, Any]:
        return json_object(await self.request("GET", f"{_WEBHOOKS}/{seg(name)}"))

    async def patch_mutating_webhook(self, name: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        """Strategic merge patch of a MutatingWebhookConfiguration (its webhooks merged by name)."""
        return json_object(await self.request("PATCH", f"{_WEBHOOKS}/{seg(name)}", patch, STRATEGIC_MERGE_PATCH))


_WEBHOOKS = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
