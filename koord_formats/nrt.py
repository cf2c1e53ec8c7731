"""The NodeResourceTopology object's own fields (``topology.node.k8s.io/v1alpha1``, kind
``NodeResourceTopology``, cluster-scoped, one per node named like the node): the NUMA zones and
the topology policies. Its Koordinator annotations have their formats in
``koord_formats.topology`` (``cpu-topology``) and ``koord_formats.node`` (share pools, kubelet's
CPU manager policy, pod CPU allocations).

Zones as koordlet writes them (``states_noderesourcetopology.go`` ``calTopologyZoneList``): one
zone per NUMA node, ``{"name": "node-<id>", "type": "Node", "resources": [{"name", "capacity",
"allocatable", "available"}]}``, resources ascending by name; CPU as a count of CPUs, memory in
bytes (the NUMA node's ``MemTotal``); available equals allocatable. ``format_zones`` writes them;
the extender reads them with ``scheduler_ext.numa.parse_nrt_zones`` (the round trip:
``tests/formats/test_format_nrt.py``).

``topology_policy`` maps kubelet's topology manager policy and scope to the NRT's
``topologyPolicies`` value (koordlet's ``getTopologyPolicy``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from koord_formats.quantity import format_bytes, format_milli_cpu

__all__ = [
    "API_GROUP",
    "API_VERSION",
    "KIND",
    "PLURAL",
    "ZONE_TYPE_NODE",
    "ZoneAmounts",
    "format_zones",
    "topology_policy",
    "zone_name",
]

API_GROUP = "topology.node.k8s.io"
API_VERSION = "v1alpha1"
KIND = "NodeResourceTopology"
PLURAL = "noderesourcetopologies"
ZONE_TYPE_NODE = "Node"

# kubelet's policy names (KubeletConfiguration topologyManagerPolicy) -> the NRT policy per scope.
_POLICY_NAMES = {"single-numa-node": "SingleNUMANode", "restricted": "Restricted", "best-effort": "BestEffort"}


@dataclass(frozen=True, slots=True)
class ZoneAmounts:
    """One NUMA zone: capacity and allocatable CPU (milli-cores) and memory (bytes)."""

    cpu_capacity_milli: int
    cpu_allocatable_milli: int
    memory_capacity: int
    memory_allocatable: int


def zone_name(numa_node: int) -> str:
    """``node-<id>``, the zone name the scheduler reads a NUMA node id from."""
    return f"node-{numa_node}"


def format_zones(zones: Mapping[int, ZoneAmounts]) -> list[dict[str, Any]]:
    """The ``zones`` list for NUMA node id -> amounts, ascending by id."""
    out: list[dict[str, Any]] = []
    for node in sorted(zones):
        z = zones[node]
        cpu_alloc = format_milli_cpu(z.cpu_allocatable_milli)
        mem_alloc = format_bytes(z.memory_allocatable)
        out.append({
            "name": zone_name(node),
            "type": ZONE_TYPE_NODE,
            "resources": [
                {"name": "cpu", "capacity": format_milli_cpu(z.cpu_capacity_milli), "allocatable": cpu_alloc,
                 "available": cpu_alloc},
                {"name": "memory", "capacity": format_bytes(z.memory_capacity), "allocatable": mem_alloc,
                 "available": mem_alloc},
            ],
        })  # fmt: skip
    return out


def topology_policy(policy: str, scope: str) -> str:
    """The NRT ``topologyPolicies`` entry for kubelet's topology manager ``policy`` and
    ``scope`` (``container``, kubelet's default, or ``pod``): ``SingleNUMANodeContainerLevel``,
    ``RestrictedPodLevel``, ...; ``None`` for ``none``, an empty or unknown policy or scope."""
    name = _POLICY_NAMES.get(policy)
    level = {"container": "ContainerLevel", "pod": "PodLevel"}.get(scope or "container")
    if name is None or level is None:
        return "None"
    return name + level
