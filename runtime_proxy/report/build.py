"""Pure builders of what the node reports: the NodeResourceTopology's and the Device's managed
parts, and the merge of those parts into the object read back from the API server (``None``
when nothing would change, so unchanged values are never written).

The NodeResourceTopology, as koordlet reports it (``states_noderesourcetopology.go``):

- annotations ``node.koordinator.sh/cpu-topology`` (the sysfs topology), ``cpu-shared-pools``
  and ``be-cpu-shared-pools`` (``hooks.facts.compute_share_pools`` over the node with its bound
  pods: koordlet's ``calCPUSharePools``), ``kubelet.koordinator.sh/cpu-manager-policy`` (policy,
  options and, for ``static``, the reserved CPUs: ``reservedSystemCPUs``, else
  ``kubeReserved.cpu + systemReserved.cpu`` rounded up to whole CPUs taken core by core from the
  lowest socket, as kubelet's static policy takes them), ``node.koordinator.sh/pod-cpu-allocs``
  (under the ``static`` policy: the CPUs kubelet pinned, from its checkpoint, for each pod that
  is neither LS nor BE and has no cpuset of Koordinator's: koordlet's ``calGuaranteedCpu``,
  ``managedByKubelet``; those CPUs leave the LS share pool), ``node.koordinator.sh/cpu-basic-info``
  (CPU model, vendor, hyper-threading, turbo: ``runtime_proxy.report.sources.read_cpu_basic_info``;
  the manager chooses the node's CPU normalization ratio by it);
- ``topologyPolicies``: kubelet's topology manager policy and scope (``koord_formats.nrt``);
- ``zones``: one ``Node`` zone per NUMA node with its CPUs and ``MemTotal`` as capacity and
  allocatable. Merged as koordlet merges them: zones that are not ours are dropped, and in ours
  every resource other than ``cpu`` and ``memory`` (a manager's batch amounts) is kept.

The Device: one entry per GPU (``koord_formats.device``); entries of other types (RDMA, FPGA)
written by others are kept. A node without GPUs creates no Device, and removes its GPU entries
from one that exists.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hooks.facts import NodeFacts, PodFacts, compute_share_pools, pod_resource_status
from koord_formats import device as device_format
from koord_formats import keys
from koord_formats import nrt as nrt_format
from koord_formats.cpunormalization import CPUBasicInfo, format_cpu_basic_info
from koord_formats.device import GPUInfo, format_gpu_devices, split_devices
from koord_formats.errors import FormatError
from koord_formats.node import (
    KubeletCPUManagerPolicy,
    PodCPUAlloc,
    format_kubelet_cpu_manager_policy,
    format_pod_cpu_allocs,
    format_share_pools,
)
from koord_formats.nrt import (
    ZONE_TYPE_NODE,
    Zone,
    ZoneAmounts,
    format_zone,
    format_zones,
    parse_zones,
    read_annotations,
    topology_policy,
)
from koord_formats.topology import CPUTopology, format_cpu_topology
from runtime_proxy.report.sources import KubeletConfig
from runtime_proxy.report.writer import KubeObject

__all__ = [
    "MANAGED_NRT_ANNOTATIONS",
    "MANAGED_ZONE_RESOURCES",
    "NRTReport",
    "build_nrt",
    "kubelet_allocs",
    "merge_device",
    "merge_nrt",
    "new_device",
    "new_nrt",
    "static_reserved_cpus",
]

MANAGED_NRT_ANNOTATIONS = (
    keys.NODE_ANNOTATION_CPU_TOPOLOGY,
    keys.NODE_ANNOTATION_POD_CPU_ALLOCS,
    keys.NODE_ANNOTATION_CPU_SHARED_POOLS,
    keys.NODE_ANNOTATION_BE_CPU_SHARED_POOLS,
    keys.NODE_ANNOTATION_KUBELET_CPU_MANAGER_POLICY,
    keys.NODE_ANNOTATION_CPU_BASIC_INFO,
)
MANAGED_ZONE_RESOURCES = ("cpu", "memory")
_TOPOLOGY_POLICIES = "topologyPolicies"


@dataclass(frozen=True, slots=True)
class NRTReport:
    """The managed parts of this node's NodeResourceTopology."""

    annotations: Mapping[str, str]
    policy: str
    zones: tuple[KubeObject, ...]


def static_reserved_cpus(topo: CPUTopology, kubelet: KubeletConfig) -> frozenset[int]:
    """The CPUs kubelet's static policy keeps for itself: ``reservedSystemCPUs`` when set, else
    ``ceil(kubeReserved.cpu + systemReserved.cpu)`` CPUs, whole cores first, from the lowest
    socket and core up."""
    if kubelet.reserved_system_cpus is not None:
        return kubelet.reserved_system_cpus & topo.cpus
    want = math.ceil(kubelet.reserved_cpu_milli / 1000)
    out: list[int] = []
    for core in sorted(range(len(topo.core_cpus)), key=lambda c: min(topo.core_cpus[c])):
        if len(out) >= want:
            break
        out.extend(sorted(topo.core_cpus[core])[: want - len(out)])
    return frozenset(out)


def kubelet_allocs(pinned: Mapping[str, frozenset[int]], pods: Sequence[PodFacts]) -> tuple[PodCPUAlloc, ...]:
    """``pod-cpu-allocs`` entries for kubelet's pinned CPUs (pod uid -> CPUs): every pod there
    except those Koordinator manages (QoS LS or BE, or a cpuset in ``resource-status``), with its
    namespace and name when the pod is known, sorted by uid."""
    known = {p.uid: p for p in pods if p.uid}
    out: list[PodCPUAlloc] = []
    for uid in sorted(pinned):
        pod = known.get(uid)
        if pod is not None:
            if pod.qos_label in (keys.QOS_LS, keys.QOS_BE):
                continue
            try:
                status = pod_resource_status(pod.annotations)
            except FormatError:
                status = None
            if status is not None and status.cpuset:
                continue
        out.append(PodCPUAlloc(pod.namespace if pod else "", pod.name if pod else "", uid, pinned[uid], True))
    return tuple(out)


def build_nrt(
    topo: CPUTopology,
    node: NodeFacts,
    kubelet: KubeletConfig,
    numa_memory: Mapping[int, int],
    allocs: Sequence[PodCPUAlloc] = (),
    basic_info: CPUBasicInfo | None = None,
) -> NRTReport:
    """The managed parts for ``topo`` (from sysfs), ``node`` (with its bound pods),
    ``kubelet``'s settings, each NUMA node's memory, ``allocs``, kubelet's pinned CPUs
    (``kubelet_allocs``; reported under the ``static`` policy only) and ``basic_info`` (the
    ``cpu-basic-info`` annotation; left out when ``None``). Raises ``FormatError`` when the
    node's annotations the share pools depend on are malformed."""
    static = kubelet.cpu_manager_policy == "static"
    allocs_text = format_pod_cpu_allocs(allocs if static else ())
    facts = node.replace(cpu_topology=topo,
                         annotations={**node.annotations, keys.NODE_ANNOTATION_POD_CPU_ALLOCS: allocs_text})
    reserved = static_reserved_cpus(topo, kubelet) if static else frozenset()
    policy = KubeletCPUManagerPolicy(kubelet.cpu_manager_policy, kubelet.options, reserved)
    annotations = {
        keys.NODE_ANNOTATION_CPU_TOPOLOGY: format_cpu_topology(topo),
        keys.NODE_ANNOTATION_CPU_SHARED_POOLS: format_share_pools(compute_share_pools(facts)),
        keys.NODE_ANNOTATION_BE_CPU_SHARED_POOLS: format_share_pools(compute_share_pools(facts, be=True)),
        keys.NODE_ANNOTATION_KUBELET_CPU_MANAGER_POLICY: format_kubelet_cpu_manager_policy(policy),
        keys.NODE_ANNOTATION_POD_CPU_ALLOCS: allocs_text,
    }
    if basic_info is not None:
        annotations[keys.NODE_ANNOTATION_CPU_BASIC_INFO] = format_cpu_basic_info(basic_info)
    zones = {
        n: ZoneAmounts(len(cpus) * 1000, len(cpus) * 1000, numa_memory.get(n, 0), numa_memory.get(n, 0))
        for n, cpus in topo.numa_cpus.items()
    }
    return NRTReport(
        annotations=annotations,
        policy=topology_policy(kubelet.topology_manager_policy, kubelet.topology_manager_scope),
        zones=tuple(format_zones(zones)),
    )


def new_nrt(name: str, report: NRTReport, owner: Mapping[str, str] | None) -> KubeObject:
    """A NodeResourceTopology to create for node ``name`` (owned by the Node when ``owner``, a
    metadata ``ownerReferences`` entry, is given, so it goes with the Node)."""
    meta: KubeObject = {"name": name, "annotations": dict(report.annotations)}
    if owner is not None:
        meta["ownerReferences"] = [dict(owner)]
    return {"apiVersion": f"{nrt_format.API_GROUP}/{nrt_format.API_VERSION}", "kind": nrt_format.KIND, "metadata": meta,
            _TOPOLOGY_POLICIES: [report.policy], "zones": list(report.zones)}


def _merged_zones(existing: Sequence[Zone], ours: Sequence[KubeObject]) -> list[KubeObject]:
    by_name = {z.name: z for z in existing if z.type == ZONE_TYPE_NODE}
    out: list[KubeObject] = []
    for zone in ours:
        merged = copy.deepcopy(zone)
        old = by_name.get(zone["name"])
        if old is not None:
            merged["resources"] += [format_zone(Zone("", "", (r,)))["resources"][0] for r in old.resources
                                    if r.name not in MANAGED_ZONE_RESOURCES]
        out.append(merged)
    return out


def merge_nrt(existing: KubeObject, report: NRTReport) -> KubeObject | None:
    """``existing`` (a NodeResourceTopology read back, decoded from bounded JSON) with the
    managed parts of ``report`` in it, or ``None`` when they are already there. Raises
    ``FormatError`` when the parts it reads (annotations, zones, policies) are malformed."""
    meta = dict(existing.get("metadata") or {})
    annotations = read_annotations(meta.get("annotations"), "NodeResourceTopology annotations")
    old_zones = parse_zones(existing.get("zones"))
    zones = _merged_zones(old_zones, report.zones)
    policies = existing.get(_TOPOLOGY_POLICIES)
    same = (
        all(annotations.get(k) == v for k, v in report.annotations.items())
        and policies == [report.policy]
        and [format_zone(z) for z in old_zones] == zones
    )
    if same:
        return None
    out = dict(existing)
    meta["annotations"] = {**annotations, **report.annotations}
    out["metadata"] = meta
    out[_TOPOLOGY_POLICIES] = [report.policy]
    out["zones"] = zones
    return out


def new_device(name: str, gpus: Sequence[GPUInfo], owner: Mapping[str, str] | None) -> KubeObject | None:
    """A Device to create for node ``name``, or ``None`` when the node has no GPU."""
    if not gpus:
        return None
    meta: KubeObject = {"name": name}
    if owner is not None:
        meta["ownerReferences"] = [dict(owner)]
    return {"apiVersion": f"{device_format.API_GROUP}/{device_format.API_VERSION}", "kind": device_format.KIND,
            "metadata": meta,
            "spec": {"devices": format_gpu_devices(gpus)}}


def merge_device(existing: KubeObject, gpus: Sequence[GPUInfo]) -> KubeObject | None:
    """``existing`` (a Device read back) with its GPU entries replaced by ``gpus``, or ``None``
    when they are already these. Raises ``FormatError`` when its spec is malformed."""
    spec = existing.get("spec")
    old_gpus, others = split_devices(spec)
    ours = format_gpu_devices(gpus)
    if old_gpus == ours:
        return None
    out = dict(existing)
    out["spec"] = {**dict(spec or {}), "devices": others + ours}
    return out
