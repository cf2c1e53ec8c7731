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

``parse_zones`` reads a ``zones`` list back (every zone and resource, not only the NUMA ones,
so a writer can keep what others put there: a manager's batch resources per NUMA zone);
``format_zone`` writes one such zone again. ``read_annotations`` reads an object's annotations
with their bounds. ``topology_policy`` maps kubelet's topology manager policy and scope to the
NRT's ``topologyPolicies`` value (koordlet's ``getTopologyPolicy``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from koord_formats import keys
from koord_formats.bounded import MAX_ANNOTATION_CHARS, MAX_NAME_CHARS, read_list, read_object, read_str
from koord_formats.errors import FormatError
from koord_formats.quantity import format_bytes, format_milli_cpu, parse_quantity

__all__ = [
    "API_GROUP",
    "API_VERSION",
    "KIND",
    "MAX_ZONES",
    "MAX_ZONE_RESOURCES",
    "PLURAL",
    "ZONE_TYPE_NODE",
    "Zone",
    "ZoneAmounts",
    "ZoneResource",
    "format_zone",
    "format_zones",
    "parse_zones",
    "read_annotations",
    "topology_policy",
    "zone_name",
]

API_GROUP = "topology.node.k8s.io"
API_VERSION = "v1alpha1"
KIND = "NodeResourceTopology"
PLURAL = "noderesourcetopologies"
ZONE_TYPE_NODE = "Node"
# Bounds of what is read back (by the node agent and by the scheduler, whose
# scheduler_ext.numa.parse_nrt_zones reads through parse_zones) and an object's annotations as
# the API server caps them (256 KiB together).
MAX_ZONES = 256
MAX_ZONE_RESOURCES = 64
MAX_ANNOTATIONS = 1024
_MAX_QUANTITY_CHARS = 64

# kubelet's policy names (KubeletConfiguration topologyManagerPolicy) -> the NRT policy per scope.
_POLICY_NAMES = {
    "single-numa-node": keys.NUMA_POLICY_SINGLE_NUMA_NODE,
    "restricted": keys.NUMA_POLICY_RESTRICTED,
    "best-effort": keys.NUMA_POLICY_BEST_EFFORT,
}


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
        return keys.NUMA_POLICY_NONE
    return name + level


@dataclass(frozen=True, slots=True)
class ZoneResource:
    """One ``resources`` entry of a zone; the quantities as written (each checked to parse)."""

    name: str
    capacity: str
    allocatable: str
    available: str


@dataclass(frozen=True, slots=True)
class Zone:
    """One ``zones`` entry: its name, type and resources."""

    name: str
    type: str
    resources: tuple[ZoneResource, ...] = ()


def _quantity_text(value: object, what: str) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        text = str(value)
    else:
        text = read_str(value, what, _MAX_QUANTITY_CHARS)
    parse_quantity(text)  # FormatError when it is no quantity
    return text


def parse_zones(value: object) -> tuple[Zone, ...]:
    """A NodeResourceTopology's ``zones`` (decoded JSON); ``()`` for null. ``FormatError`` when it
    is not a list of at most ``MAX_ZONES`` objects with a name and type, each with at most
    ``MAX_ZONE_RESOURCES`` resources whose quantities parse."""
    if value is None:
        return ()
    out: list[Zone] = []
    for entry in read_list(value, "zones", MAX_ZONES):
        item = read_object(entry, "zone")
        name = read_str(item.get("name"), "zone name")
        what = f"zone {name}"
        raw = item.get("resources")
        resources: list[ZoneResource] = []
        for res in [] if raw is None else read_list(raw, f"{what} resources", MAX_ZONE_RESOURCES):
            r = read_object(res, f"{what} resource")
            rname = read_str(r.get("name"), f"{what} resource name")
            capacity = _quantity_text(r.get("capacity", "0"), f"{what} {rname} capacity")
            allocatable = _quantity_text(r.get("allocatable", capacity), f"{what} {rname} allocatable")
            available = _quantity_text(r.get("available", allocatable), f"{what} {rname} available")
            resources.append(ZoneResource(rname, capacity, allocatable, available))
        out.append(Zone(name=name, type=read_str(item.get("type"), f"{what} type", 64), resources=tuple(resources)))
    return tuple(out)


def format_zone(zone: Zone) -> dict[str, Any]:
    """One ``zones`` entry for ``zone`` (its resources in the given order)."""
    return {
        "name": zone.name,
        "type": zone.type,
        "resources": [{"name": r.name, "capacity": r.capacity, "allocatable": r.allocatable,
                       "available": r.available} for r in zone.resources],
    }  # fmt: skip


def read_annotations(value: object, what: str = "annotations") -> Mapping[str, str]:
    """An object's ``metadata.annotations`` (string to string; ``{}`` for null), at most
    ``MAX_ANNOTATIONS`` entries of at most ``MAX_ANNOTATION_CHARS`` characters together."""
    if value is None:
        return MappingProxyType({})
    doc = read_object(value, what)
    if len(doc) > MAX_ANNOTATIONS:
        raise FormatError(f"{what}: {len(doc)} entries, more than {MAX_ANNOTATIONS}")
    out: dict[str, str] = {}
    budget = MAX_ANNOTATION_CHARS
    for k, v in doc.items():
        key = read_str(k, f"{what} key", MAX_NAME_CHARS + 64)
        val = read_str(v, f"{what} {key}", MAX_ANNOTATION_CHARS)
        budget -= len(key) + len(val)
        if budget < 0:
            raise FormatError(f"{what}: more than {MAX_ANNOTATION_CHARS} characters together")
        out[key] = val
    return MappingProxyType(out)
