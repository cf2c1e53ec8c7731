"""Named topologies and object builders shared by the scheduler tests and benchmarks.

Topologies (each noted with what it models):

- ``TOPO_SMALL``: 2 sockets x 1 NUMA x 4 cores x 2 threads = 16 CPUs; CPUs 0-3 and 8-11 on
  NUMA 0 (Linux numbering: siblings are N apart).
- ``TOPO_BENCH``: 2 sockets x 1 NUMA x 52 cores x 2 threads = 208 CPUs ("two sockets of 104
  CPUs", the scale benchmark's node).
- ``TOPO_QUAD_NUMA``: 2 sockets x 2 NUMA x 4 cores x 2 threads = 32 CPUs (sub-NUMA
  clustering, like AMD NPS2 or Intel SNC2).
- ``TOPO_NO_SMT``: 1 socket x 2 NUMA x 4 cores x 1 thread.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from koord_formats.cpulist import parse_cpu_list
from koord_formats.topology import format_cpu_topology
from scheduler_ext.topology import synthetic_topology

TOPO_SMALL = synthetic_topology(2, 1, 4, 2)
TOPO_BENCH = synthetic_topology(2, 1, 52, 2)
TOPO_QUAD_NUMA = synthetic_topology(2, 2, 4, 2)
TOPO_NO_SMT = synthetic_topology(1, 2, 4, 1)

GiB = 1 << 30


def cpus(text: str) -> frozenset[int]:
    """Kernel list format in test rows: ``cpus("0-3,8")``."""
    return parse_cpu_list(text)


def node(
    name: str,
    *,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    cpu: str = "208",
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": dict(labels or {}), "annotations": dict(annotations or {})},
        "status": {"allocatable": {"cpu": cpu, "memory": "512Gi", "pods": "250"}},
    }


def nrt(
    name: str,
    topo_annotation: str,
    *,
    annotations: Mapping[str, str] | None = None,
    policies: Sequence[str] = ("None",),
) -> dict[str, Any]:
    ann = {"node.koordinator.sh/cpu-topology": topo_annotation}
    ann.update(annotations or {})
    return {
        "apiVersion": "topology.node.k8s.io/v1alpha1",
        "kind": "NodeResourceTopology",
        "metadata": {"name": name, "annotations": ann},
        "topologyPolicies": list(policies),
        "zones": [],
    }


def device(
    name: str,
    gpus: int = 8,
    *,
    numa_of: Sequence[int] | None = None,
    pcie_of: Sequence[str] | None = None,
    unhealthy: Sequence[int] = (),
    memory: str = "80Gi",
) -> dict[str, Any]:
    """A Device CR with ``gpus`` GPUs; by default half on NUMA 0 and half on NUMA 1, two per
    PCIe switch."""
    devices = []
    for minor in range(gpus):
        numa = numa_of[minor] if numa_of is not None else (0 if minor < gpus // 2 else 1)
        pcie = pcie_of[minor] if pcie_of is not None else f"pci{minor // 2}"
        devices.append(
            {
                "type": "gpu",
                "id": f"GPU-{name}-{minor}",
                "minor": minor,
                "health": minor not in unhealthy,
                "resources": {
                    "koordinator.sh/gpu-core": "100",
                    "koordinator.sh/gpu-memory": memory,
                    "koordinator.sh/gpu-memory-ratio": "100",
                },
                "topology": {"socketID": numa, "nodeID": numa, "pcieID": pcie, "busID": f"0000:{minor:02x}:00.0"},
            }
        )
    return {
        "apiVersion": "scheduling.koordinator.sh/v1alpha1",
        "kind": "Device",
        "metadata": {"name": name},
        "spec": {"devices": devices},
    }


def pod(
    name: str,
    *,
    cpu: str | None = "4",
    memory: str | None = "8Gi",
    qos: str | None = "LSR",
    namespace: str = "default",
    priority: int | None = 9000,
    extra: Mapping[str, str] | None = None,
    resource_spec: Mapping[str, str] | None = None,
    numa_policy: str | None = None,
    annotations: Mapping[str, str] | None = None,
    node_name: str | None = None,
    uid: str | None = None,
    scheduler_name: str | None = None,
) -> dict[str, Any]:
    """A pod; one given a ``node_name`` was placed by koord-scheduler (a trusted scheduler, whose
    allocation annotations the extender counts) unless ``scheduler_name`` says otherwise."""
    requests: dict[str, str] = {}
    if cpu is not None:
        requests["cpu"] = cpu
    if memory is not None:
        requests["memory"] = memory
    requests.update(extra or {})
    ann = dict(annotations or {})
    if resource_spec is not None:
        ann["scheduling.koordinator.sh/resource-spec"] = json.dumps(dict(resource_spec))
    if numa_policy is not None:
        ann["scheduling.koordinator.sh/numa-topology-spec"] = json.dumps({"numaTopologyPolicy": numa_policy})
    spec: dict[str, Any] = {
        "containers": [
            {"name": "main", "image": "busybox", "resources": {"requests": requests, "limits": dict(requests)}}
        ],
        "schedulerName": scheduler_name or ("koord-scheduler" if node_name else "default-scheduler"),
    }
    if priority is not None:
        spec["priority"] = priority
    if node_name:
        spec["nodeName"] = node_name
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid or str(uuid.uuid4()),
            "labels": {"koordinator.sh/qosClass": qos} if qos else {},
            "annotations": ann,
        },
        "spec": spec,
        "status": {"phase": "Running" if node_name else "Pending"},
    }


def cluster(
    names: Sequence[str],
    topo_annotation: str | None = None,
    *,
    labels: Mapping[str, str] | None = None,
    gpus: int = 0,
) -> list[dict[str, Any]]:
    """Node + NRT (+ Device) objects for each name."""
    text = topo_annotation or format_cpu_topology(TOPO_SMALL)
    out: list[dict[str, Any]] = []
    for n in names:
        out.append(node(n, labels=labels))
        out.append(nrt(n, text))
        if gpus:
            out.append(device(n, gpus))
    return out


def reservation(
    name: str,
    node_name: str,
    *,
    cpuset: str | None = None,
    numa: Mapping[int, Mapping[str, str]] | None = None,
    owners: Sequence[Mapping[str, Any]] | None = None,
    phase: str = "Available",
    policy: str | None = None,
    allocate_once: bool | None = None,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    uid: str | None = None,
    unschedulable: bool | None = None,
    taints: Sequence[Mapping[str, str]] | None = None,
    allocatable: Mapping[str, str] | None = None,
    allocated: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A Reservation on ``node_name``; ``cpuset`` and ``numa`` become its resource-status.
    Owners default to every pod labelled ``app: web``."""
    ann = dict(annotations or {})
    status_doc: dict[str, Any] = {}
    if cpuset is not None:
        status_doc["cpuset"] = cpuset
    if numa:
        status_doc["numaNodeResources"] = [{"node": n, "resources": dict(r)} for n, r in sorted(numa.items())]
    if status_doc:
        ann["scheduling.koordinator.sh/resource-status"] = json.dumps(status_doc)
    spec: dict[str, Any] = {
        "template": {"metadata": {}, "spec": {"containers": [{"name": "main"}]}},
        "owners": list(owners) if owners is not None else [{"labelSelector": {"matchLabels": {"app": "web"}}}],
        "ttl": "24h",
    }
    if policy is not None:
        spec["allocatePolicy"] = policy
    if allocate_once is not None:
        spec["allocateOnce"] = allocate_once
    if unschedulable is not None:
        spec["unschedulable"] = unschedulable
    if taints is not None:
        spec["taints"] = list(taints)
    status: dict[str, Any] = {"phase": phase, "nodeName": node_name}
    if allocatable is not None:
        status["allocatable"] = dict(allocatable)
    if allocated is not None:
        status["allocated"] = dict(allocated)
    return {
        "apiVersion": "scheduling.koordinator.sh/v1alpha1",
        "kind": "Reservation",
        "metadata": {"name": name, "uid": uid or f"uid-{name}", "labels": dict(labels or {}), "annotations": ann},
        "spec": spec,
        "status": status,
    }
