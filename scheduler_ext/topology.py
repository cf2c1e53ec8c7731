"""What the extender reads about one node's CPUs and GPUs, built on ``koord_formats``.

Who calls this: ``scheduler_ext.state`` turns Node, NodeResourceTopology and Device objects into
values here, and ``scheduler_ext.allocator`` reads them. Nothing here does I/O or keeps state.

Every Koordinator annotation is parsed by ``koord_formats`` (the CPU topology by
``koord_formats.topology``, the node CPU annotations by ``koord_formats.node``); this module only
combines them into what binding needs and reads the Device object, which is an API object
rather than an annotation. Every function raises ``koord_formats.FormatError`` and nothing else
for bad input.

- ``cpu_topology``: the NRT's ``node.koordinator.sh/cpu-topology``, else the Node's.
- ``unbindable_cpus``: CPUs no pod may be bound to: kubelet's reserved CPUs
  (``kubelet.koordinator.sh/cpu-manager-policy``), CPUs kubelet's static policy handed out
  (``node.koordinator.sh/pod-cpu-allocs`` with ``managedByKubelet``), the node reservation's
  ``reservedCPUs`` and exclusive system-QoS CPUs (``node.koordinator.sh/system-qos-resource``,
  exclusive unless ``cpusetExclusive`` is false), as koord-scheduler's
  ``nodenumaresource/topology_options.go`` does.
- ``parse_gpu_devices``: the GPUs of a Device object's ``spec.devices``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from koord_formats import keys
from koord_formats.bounded import read_int, read_list, read_object, read_str
from koord_formats.errors import FormatError
from koord_formats.node import (
    parse_kubelet_cpu_manager_policy,
    parse_node_reservation,
    parse_pod_cpu_allocs,
    parse_system_qos_resource,
)
from koord_formats.topology import CPUInfo, CPUTopology, parse_cpu_topology
from scheduler_ext.pods import quantity

__all__ = [
    "DEVICE_TYPE_GPU",
    "MAX_DEVICES",
    "GPUDevice",
    "cpu_topology",
    "parse_gpu_devices",
    "synthetic_topology",
    "unbindable_cpus",
]

# ``type`` of a GPU in a Device object and its key in ``device-allocated``
# (apis/scheduling/v1alpha1/device_types.go ``GPU``).
DEVICE_TYPE_GPU = "gpu"
# Devices one Device object may list; real nodes have a few dozen (GPUs, RDMA NICs, VFs).
MAX_DEVICES = 1024
_MAX_MINOR = 65535


def _annotation(primary: Mapping[str, Any], fallback: Mapping[str, Any] | None, key: str) -> str | None:
    """The annotation text from ``primary``, else from ``fallback``; ``None`` when neither has
    one. ``FormatError`` when the value is not a string (annotation values always are)."""
    value = primary.get(key) or (fallback.get(key) if fallback is not None else None)
    if not value:
        return None
    if not isinstance(value, str):
        raise FormatError(f"{key}: expected a string, got {type(value).__name__}")
    return value


def cpu_topology(
    nrt_annotations: Mapping[str, Any], node_annotations: Mapping[str, Any]
) -> CPUTopology | None:
    """The node's CPU topology from its NRT (else its Node); ``None`` when neither reports one."""
    text = _annotation(nrt_annotations, node_annotations, keys.NODE_ANNOTATION_CPU_TOPOLOGY)
    return None if text is None else parse_cpu_topology(text)


def unbindable_cpus(
    node_annotations: Mapping[str, Any], nrt_annotations: Mapping[str, Any]
) -> frozenset[int]:
    """The CPUs binding must leave alone (see the module docstring)."""
    out: frozenset[int] = frozenset()
    kubelet = _annotation(nrt_annotations, None, keys.NODE_ANNOTATION_KUBELET_CPU_MANAGER_POLICY)
    if kubelet is not None:
        out |= parse_kubelet_cpu_manager_policy(kubelet).reserved_cpus
    allocs = _annotation(nrt_annotations, None, keys.NODE_ANNOTATION_POD_CPU_ALLOCS)
    if allocs is not None:
        for alloc in parse_pod_cpu_allocs(allocs):
            if alloc.managed_by_kubelet:
                out |= alloc.cpus
    reservation = _annotation(node_annotations, nrt_annotations, keys.NODE_ANNOTATION_RESERVATION)
    if reservation is not None:
        out |= parse_node_reservation(reservation).reserved_cpus
    system_qos = _annotation(node_annotations, nrt_annotations, keys.NODE_ANNOTATION_SYSTEM_QOS_RESOURCE)
    if system_qos is not None:
        out |= parse_system_qos_resource(system_qos).exclusive_cpus
    return out


def synthetic_topology(
    sockets: int, numa_per_socket: int, cores_per_numa: int, threads: int = 2
) -> CPUTopology:
    """A regular machine numbered like Linux: first threads 0..N-1, then siblings N..2N-1, ...

    Used by tests and benchmarks (e.g. 2 sockets x 1 NUMA x 52 cores x 2 threads = 104 CPUs
    per socket) and mirrors how x86 servers enumerate SMT siblings.
    """
    cores_total = sockets * numa_per_socket * cores_per_numa
    infos: list[CPUInfo] = []
    for t in range(threads):
        for core in range(cores_total):
            node = core // cores_per_numa
            socket = node // numa_per_socket
            infos.append(CPUInfo(id=t * cores_total + core, core=core, socket=socket, node=node))
    return CPUTopology(infos)


@dataclass(frozen=True, slots=True)
class GPUDevice:
    """One GPU from a Device object. Capacity is in Koordinator's units (core and ratio in %)."""

    minor: int
    id: str
    healthy: bool
    core: int  # gpu-core capacity, 100 for a whole card
    memory: int  # bytes
    ratio: int  # gpu-memory-ratio capacity, 100
    socket: int
    numa: int  # -1 when unknown
    pcie: str  # PCIe switch id, "" when unknown
    bus_id: str


def _optional_id(value: object) -> int:
    """A topology id (socket, NUMA node) or -1 when it is absent or not a usable integer."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _MAX_MINOR:
        return -1
    return value


def _optional_str(value: object, what: str) -> str:
    if value is None:
        return ""
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    return read_str(value, what)


def _capacity(resources: Mapping[str, Any], name: str, default: int) -> int:
    value = resources.get(name)
    return default if value is None else math.floor(quantity(value))


def parse_gpu_devices(spec: object) -> tuple[GPUDevice, ...]:
    """The GPUs of a Device object's ``spec`` (other device types are ignored), by minor.

    ``FormatError`` when ``spec`` or a GPU entry is malformed (no valid minor, a bad quantity,
    more than ``MAX_DEVICES`` devices).
    """
    if not spec:
        return ()
    what = "Device spec"
    raw = read_object(spec, what).get("devices")
    devices = [] if raw is None else read_list(raw, f"{what} devices", MAX_DEVICES)
    out: dict[int, GPUDevice] = {}
    for dev in devices:
        if not isinstance(dev, dict) or dev.get("type") != DEVICE_TYPE_GPU:
            continue
        minor = read_int(dev.get("minor"), f"{what} GPU minor", 0, _MAX_MINOR)
        res_raw = dev.get("resources")
        res = {} if res_raw is None else read_object(res_raw, f"{what} GPU {minor} resources")
        topo_raw = dev.get("topology")
        topo = {} if topo_raw is None else read_object(topo_raw, f"{what} GPU {minor} topology")
        try:
            core = _capacity(res, keys.RESOURCE_GPU_CORE, 100)
            memory = _capacity(res, keys.RESOURCE_GPU_MEMORY, 0)
            ratio = _capacity(res, keys.RESOURCE_GPU_MEMORY_RATIO, 100)
        except FormatError as exc:
            raise FormatError(f"{what} GPU {minor}: {exc}") from None
        out[minor] = GPUDevice(
            minor=minor,
            id=_optional_str(dev.get("id"), f"{what} GPU {minor} id"),
            healthy=dev.get("health", True) is not False,
            core=core,
            memory=memory,
            ratio=ratio,
            socket=_optional_id(topo.get("socketID", -1)),
            numa=_optional_id(topo.get("nodeID", -1)),
            pcie=_optional_str(topo.get("pcieID"), f"{what} GPU {minor} pcieID"),
            bus_id=_optional_str(topo.get("busID"), f"{what} GPU {minor} busID"),
        )
    return tuple(out[m] for m in sorted(out))
