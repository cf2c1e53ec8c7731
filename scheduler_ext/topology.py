"""The CPU and GPU topology of one node, as plain values, and the parsers that build them.

Who calls this: ``scheduler_ext.state`` parses node, NodeResourceTopology and Device objects
through the functions here, and ``scheduler_ext.allocator`` reads the resulting values. Nothing
here does I/O or keeps state; parsing is memoised by the annotation text, because thousands of
nodes of one model report the same ``node.koordinator.sh/cpu-topology`` string.

Inputs (Koordinator formats, see ``koordinator.md`` 4.2 and 4.3):

- ``node.koordinator.sh/cpu-topology``: ``{"detail":[{"id":0,"core":0,"socket":0,"node":0},...]}``
- ``kubelet.koordinator.sh/cpu-manager-policy``: ``{"policy":"static","reservedCPUs":"0-1",...}``
- ``node.koordinator.sh/reservation``: ``{"reservedCPUs":"0-5",...}``
- ``node.koordinator.sh/system-qos-resource``: ``{"cpuset":"0-1","cpusetExclusive":true}``
- ``node.koordinator.sh/pod-cpu-allocs``: ``[{"uid":...,"cpuset":"...","managedByKubelet":true}]``
- Device ``spec.devices[]`` of ``type: gpu``.

Core ids are not trusted to be unique across sockets: a core is keyed by (socket, node, core)
and renumbered densely, so ``CPUTopology.core_of`` is always a unique index.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from hooks.facts import format_cpu_list, parse_cpu_list
from scheduler_ext.quantity import parse_quantity

__all__ = [
    "ANN_CPU_TOPOLOGY",
    "ANN_KUBELET_CPU_MANAGER_POLICY",
    "ANN_POD_CPU_ALLOCS",
    "ANN_RESERVATION",
    "ANN_SYSTEM_QOS_RESOURCE",
    "CPUInfo",
    "CPUTopology",
    "GPUDevice",
    "TopologyError",
    "format_cpu_list",
    "parse_cpu_list",
    "parse_cpu_topology",
    "parse_gpu_devices",
    "parse_kubelet_managed_cpus",
    "parse_kubelet_reserved_cpus",
    "parse_node_reserved_cpus",
    "parse_system_qos_cpus",
    "synthetic_topology",
]

ANN_CPU_TOPOLOGY = "node.koordinator.sh/cpu-topology"
ANN_KUBELET_CPU_MANAGER_POLICY = "kubelet.koordinator.sh/cpu-manager-policy"
ANN_RESERVATION = "node.koordinator.sh/reservation"
ANN_SYSTEM_QOS_RESOURCE = "node.koordinator.sh/system-qos-resource"
ANN_POD_CPU_ALLOCS = "node.koordinator.sh/pod-cpu-allocs"

GPU_CORE = "koordinator.sh/gpu-core"
GPU_MEMORY = "koordinator.sh/gpu-memory"
GPU_MEMORY_RATIO = "koordinator.sh/gpu-memory-ratio"


class TopologyError(ValueError):
    """A topology annotation or Device object that cannot be used; the message says why."""


@dataclass(frozen=True, slots=True)
class CPUInfo:
    """One logical CPU: its id, its (dense, unique) physical core, socket and NUMA node."""

    cpu: int
    core: int
    socket: int
    node: int


class CPUTopology:
    """An immutable CPU topology with every set the allocator asks for precomputed.

    Built once per distinct annotation string and shared by every node that reports it.
    """

    __slots__ = (
        "core_cpus",
        "core_of",
        "cores_in_numa",
        "cpus",
        "cpus_per_core",
        "details",
        "numa_cpus",
        "numa_nodes",
        "numa_socket",
        "socket_cpus",
        "sockets",
    )

    details: Mapping[int, CPUInfo]  # cpu id -> info; never changes
    cpus: frozenset[int]  # every logical CPU
    core_of: Mapping[int, int]  # cpu id -> dense core index
    core_cpus: tuple[frozenset[int], ...]  # core index -> its logical CPUs
    numa_nodes: tuple[int, ...]  # ascending NUMA node ids
    numa_cpus: Mapping[int, frozenset[int]]  # NUMA node -> CPUs
    cores_in_numa: Mapping[int, tuple[int, ...]]  # NUMA node -> core indexes, ascending
    numa_socket: Mapping[int, int]  # NUMA node -> socket (the lowest if a node spans sockets)
    sockets: tuple[int, ...]  # ascending socket ids
    socket_cpus: Mapping[int, frozenset[int]]
    cpus_per_core: int  # threads per core (the largest seen; 1 without SMT)

    def __init__(self, infos: Iterable[CPUInfo]) -> None:
        details = {i.cpu: i for i in infos}
        if not details:
            raise TopologyError("CPU topology lists no CPUs")
        keys = sorted({(i.socket, i.node, i.core) for i in details.values()})
        dense = {k: n for n, k in enumerate(keys)}
        core_members: list[set[int]] = [set() for _ in keys]
        fixed: dict[int, CPUInfo] = {}
        for cpu, info in details.items():
            idx = dense[(info.socket, info.node, info.core)]
            core_members[idx].add(cpu)
            fixed[cpu] = CPUInfo(cpu, idx, info.socket, info.node)
        self.details = fixed
        self.cpus = frozenset(fixed)
        self.core_of = {cpu: info.core for cpu, info in fixed.items()}
        self.core_cpus = tuple(frozenset(m) for m in core_members)
        numa: dict[int, set[int]] = {}
        sock: dict[int, set[int]] = {}
        numa_cores: dict[int, set[int]] = {}
        numa_socket: dict[int, int] = {}
        for cpu, info in fixed.items():
            numa.setdefault(info.node, set()).add(cpu)
            sock.setdefault(info.socket, set()).add(cpu)
            numa_cores.setdefault(info.node, set()).add(info.core)
            numa_socket[info.node] = min(numa_socket.get(info.node, info.socket), info.socket)
        self.numa_nodes = tuple(sorted(numa))
        self.numa_cpus = {n: frozenset(c) for n, c in numa.items()}
        self.cores_in_numa = {n: tuple(sorted(c)) for n, c in numa_cores.items()}
        self.numa_socket = numa_socket
        self.sockets = tuple(sorted(sock))
        self.socket_cpus = {s: frozenset(c) for s, c in sock.items()}
        self.cpus_per_core = max(len(m) for m in core_members)

    def __repr__(self) -> str:
        return (
            f"CPUTopology(cpus={len(self.cpus)}, cores={len(self.core_cpus)}, "
            f"sockets={len(self.sockets)}, numa={len(self.numa_nodes)}, threads={self.cpus_per_core})"
        )

    def cpus_in_numa(self, nodes: Iterable[int]) -> frozenset[int]:
        """The CPUs of the given NUMA nodes (unknown ids contribute nothing)."""
        out: frozenset[int] = frozenset()
        for n in nodes:
            out = out | self.numa_cpus.get(n, frozenset())
        return out

    def free_cores(self, free: frozenset[int], nodes: Iterable[int] | None = None) -> list[int]:
        """Core indexes whose every CPU is in ``free``, ascending, optionally within NUMA nodes."""
        wanted = self.numa_nodes if nodes is None else nodes
        out: list[int] = []
        for n in wanted:
            for core in self.cores_in_numa.get(n, ()):
                if self.core_cpus[core] <= free:
                    out.append(core)
        return sorted(out)


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
            infos.append(CPUInfo(cpu=t * cores_total + core, core=core, socket=socket, node=node))
    return CPUTopology(infos)


def topology_annotation(topo: CPUTopology) -> str:
    """The ``node.koordinator.sh/cpu-topology`` JSON for a topology (used by tests and tools)."""
    detail = [
        {"id": i.cpu, "core": i.core, "socket": i.socket, "node": i.node}
        for i in sorted(topo.details.values(), key=lambda x: x.cpu)
    ]
    return json.dumps({"detail": detail}, separators=(",", ":"))


def _int_field(entry: Mapping[str, Any], key: str, default: int | None = None) -> int:
    value = entry.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise TopologyError(f"field {key!r} must be a non-negative integer, got {value!r}")
    return value


@functools.lru_cache(maxsize=256)
def parse_cpu_topology(text: str) -> CPUTopology:
    """Parse ``node.koordinator.sh/cpu-topology``; memoised by the exact text."""
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise TopologyError(f"cpu-topology is not JSON: {exc}") from None
    detail = doc.get("detail") if isinstance(doc, dict) else None
    if not isinstance(detail, list) or not detail:
        raise TopologyError("cpu-topology has no non-empty 'detail' list")
    infos: list[CPUInfo] = []
    seen: set[int] = set()
    for entry in detail:
        if not isinstance(entry, dict):
            raise TopologyError(f"cpu-topology entry is not an object: {entry!r}")
        cpu = _int_field(entry, "id")
        if cpu in seen:
            raise TopologyError(f"cpu-topology lists CPU {cpu} twice")
        seen.add(cpu)
        infos.append(
            CPUInfo(
                cpu=cpu,
                core=_int_field(entry, "core"),
                socket=_int_field(entry, "socket", 0),
                node=_int_field(entry, "node", 0),
            )
        )
    return CPUTopology(infos)


def _json_doc(text: str | None, what: str) -> Any:
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise TopologyError(f"{what} is not JSON: {exc}") from None


def _cpuset_field(doc: Any, key: str, what: str) -> frozenset[int]:
    if not isinstance(doc, dict):
        return frozenset()
    value = doc.get(key) or ""
    if not isinstance(value, str):
        raise TopologyError(f"{what}.{key} must be a CPU list string")
    try:
        return parse_cpu_list(value)
    except ValueError as exc:
        raise TopologyError(f"{what}.{key}: {exc}") from None


@functools.lru_cache(maxsize=1024)
def parse_kubelet_reserved_cpus(text: str | None) -> frozenset[int]:
    """``reservedCPUs`` from ``kubelet.koordinator.sh/cpu-manager-policy`` (empty if absent)."""
    doc = _json_doc(text, ANN_KUBELET_CPU_MANAGER_POLICY)
    return _cpuset_field(doc, "reservedCPUs", ANN_KUBELET_CPU_MANAGER_POLICY)


@functools.lru_cache(maxsize=1024)
def parse_node_reserved_cpus(text: str | None) -> frozenset[int]:
    """``reservedCPUs`` from ``node.koordinator.sh/reservation`` (empty if absent)."""
    doc = _json_doc(text, ANN_RESERVATION)
    return _cpuset_field(doc, "reservedCPUs", ANN_RESERVATION)


@functools.lru_cache(maxsize=1024)
def parse_system_qos_cpus(text: str | None) -> frozenset[int]:
    """Exclusive system-QoS CPUs from ``node.koordinator.sh/system-qos-resource``.

    Only an exclusive cpuset is withheld from binding; ``cpusetExclusive`` defaults to true
    when the cpuset is given, as in Koordinator.
    """
    doc = _json_doc(text, ANN_SYSTEM_QOS_RESOURCE)
    if not isinstance(doc, dict) or doc.get("cpusetExclusive", True) is False:
        return frozenset()
    return _cpuset_field(doc, "cpuset", ANN_SYSTEM_QOS_RESOURCE)


@functools.lru_cache(maxsize=1024)
def parse_kubelet_managed_cpus(text: str | None) -> frozenset[int]:
    """CPUs that kubelet's static policy handed out (``pod-cpu-allocs`` with managedByKubelet)."""
    doc = _json_doc(text, ANN_POD_CPU_ALLOCS)
    if doc is None:
        return frozenset()
    if not isinstance(doc, list):
        raise TopologyError(f"{ANN_POD_CPU_ALLOCS} must be a list")
    out: frozenset[int] = frozenset()
    for entry in doc:
        if isinstance(entry, dict) and entry.get("managedByKubelet"):
            out = out | _cpuset_field(entry, "cpuset", ANN_POD_CPU_ALLOCS)
    return out


@dataclass(frozen=True, slots=True)
class GPUDevice:
    """One GPU from a Device object. Capacity is in Koordinator's units (core and ratio in %)."""

    minor: int
    id: str
    healthy: bool
    core: int  # koordinator.sh/gpu-core capacity, 100 for a whole card
    memory: int  # bytes
    ratio: int  # koordinator.sh/gpu-memory-ratio capacity, 100
    socket: int
    numa: int  # -1 when unknown
    pcie: str  # PCIe switch id, "" when unknown
    bus_id: str


def parse_gpu_devices(spec: Mapping[str, Any] | None) -> tuple[GPUDevice, ...]:
    """The GPUs of a Device object's ``spec`` (other device types are ignored), by minor."""
    if not spec:
        return ()
    devices = spec.get("devices") or []
    if not isinstance(devices, list):
        raise TopologyError("Device spec.devices must be a list")
    out: dict[int, GPUDevice] = {}
    for dev in devices:
        if not isinstance(dev, dict) or dev.get("type") != "gpu":
            continue
        minor = dev.get("minor")
        if not isinstance(minor, int) or isinstance(minor, bool) or minor < 0:
            raise TopologyError(f"GPU without a valid minor: {dev.get('id')!r}")
        res = dev.get("resources") or {}
        topo = dev.get("topology") or {}
        try:
            core = int(parse_quantity(res.get(GPU_CORE, 100)))
            memory = int(parse_quantity(res.get(GPU_MEMORY, 0)))
            ratio = int(parse_quantity(res.get(GPU_MEMORY_RATIO, 100)))
        except ValueError as exc:
            raise TopologyError(f"GPU {minor}: {exc}") from None
        numa = topo.get("nodeID", -1)
        socket = topo.get("socketID", -1)
        out[minor] = GPUDevice(
            minor=minor,
            id=str(dev.get("id") or ""),
            healthy=dev.get("health", True) is not False,
            core=core,
            memory=memory,
            ratio=ratio,
            socket=socket if isinstance(socket, int) else -1,
            numa=numa if isinstance(numa, int) else -1,
            pcie=str(topo.get("pcieID") or ""),
            bus_id=str(topo.get("busID") or ""),
        )
    return tuple(out[m] for m in sorted(out))
