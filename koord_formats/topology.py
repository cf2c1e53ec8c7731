"""The node's CPU topology as one immutable value, and ``node.koordinator.sh/cpu-topology``.

``CPUTopology`` is used by the node plugins (share pools, NUMA checks) and by the extender's
allocator alike. It is built from ``CPUInfo`` rows, by ``parse_cpu_topology`` from the
annotation text (``{"detail":[{"id":0,"core":0,"socket":0,"node":0},...]}``), by
``cpu_topology_from_json`` from an already decoded document, or from sysfs by
``runtime_proxy.state.sysfs``. Every constructor rejects a CPU listed twice.

Core ids are not trusted to be unique across sockets or NUMA nodes: a physical core is keyed by
(socket, node, core) and numbered densely, so ``core_of`` is always a unique core index.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any, NamedTuple

from koord_formats.bounded import load_json, memo_by_text, read_int, read_list, read_object
from koord_formats.cpulist import MAX_CPU_ID
from koord_formats.errors import FormatError

__all__ = [
    "MAX_TOPOLOGY_CHARS",
    "MAX_TOPOLOGY_CPUS",
    "CPUInfo",
    "CPUTopology",
    "cpu_topology_from_json",
    "format_cpu_topology",
    "parse_cpu_topology",
]

# The largest machines Linux distributions build for stay below 4096 logical CPUs.
MAX_TOPOLOGY_CPUS = 4096
# 4096 CPUs at about 45 characters each, with room for spaces.
MAX_TOPOLOGY_CHARS = 384 * 1024
_MAX_NUMA_ID = 1023
_MAX_SOCKET_ID = 1023
_MAX_CORE_ID = 2 * MAX_CPU_ID + 1


class CPUInfo(NamedTuple):
    """One logical CPU as the annotation lists it: id, core, socket and NUMA node."""

    id: int
    core: int
    socket: int
    node: int


class CPUTopology:
    """An immutable set of logical CPUs with the sets callers ask for precomputed.

    Equal (and hashing equal) when built from the same rows.
    """

    __slots__ = (
        "core_cpus",
        "core_of",
        "cores_in_numa",
        "cpus",
        "cpus_per_core",
        "details",
        "infos",
        "numa_cpus",
        "numa_nodes",
        "numa_socket",
        "socket_cpus",
        "sockets",
    )

    infos: tuple[CPUInfo, ...]  # the rows, ascending by CPU id
    details: Mapping[int, CPUInfo]  # CPU id -> its row
    cpus: frozenset[int]  # every logical CPU
    core_of: Mapping[int, int]  # CPU id -> dense core index
    core_cpus: tuple[frozenset[int], ...]  # core index -> its logical CPUs
    numa_nodes: tuple[int, ...]  # ascending NUMA node ids
    numa_cpus: Mapping[int, frozenset[int]]  # NUMA node -> its CPUs
    cores_in_numa: Mapping[int, tuple[int, ...]]  # NUMA node -> core indexes, ascending
    numa_socket: Mapping[int, int]  # NUMA node -> socket (the lowest if a node spans sockets)
    sockets: tuple[int, ...]  # ascending socket ids
    socket_cpus: Mapping[int, frozenset[int]]  # socket -> its CPUs
    cpus_per_core: int  # threads per core (the largest seen; 1 without SMT, 0 when empty)

    def __init__(self, infos: Iterable[CPUInfo] = ()) -> None:
        rows = tuple(sorted(infos))
        details = {i.id: i for i in rows}
        if len(details) != len(rows):
            seen: set[int] = set()
            for i in rows:
                if i.id in seen:
                    raise FormatError(f"CPU topology: CPU {i.id} is listed twice")
                seen.add(i.id)
        dense = {k: n for n, k in enumerate(sorted({(i.socket, i.node, i.core) for i in rows}))}
        members: list[list[int]] = [[] for _ in dense]
        numa: dict[int, list[int]] = {}
        sock: dict[int, list[int]] = {}
        numa_cores: dict[int, set[int]] = {}
        core_of: dict[int, int] = {}
        for cpu, core, socket, node in rows:
            idx = dense[(socket, node, core)]
            members[idx].append(cpu)
            core_of[cpu] = idx
            numa.setdefault(node, []).append(cpu)
            sock.setdefault(socket, []).append(cpu)
            numa_cores.setdefault(node, set()).add(idx)
        numa_socket: dict[int, int] = {}
        for socket, node, _core in dense:
            numa_socket.setdefault(node, socket)  # keys ascend by socket: the lowest comes first
        self.infos = rows
        self.details = MappingProxyType(details)
        self.cpus = frozenset(details)
        self.core_of = MappingProxyType(core_of)
        self.core_cpus = tuple(frozenset(m) for m in members)
        self.numa_nodes = tuple(sorted(numa))
        self.numa_cpus = MappingProxyType({n: frozenset(c) for n, c in numa.items()})
        self.cores_in_numa = MappingProxyType({n: tuple(sorted(c)) for n, c in numa_cores.items()})
        self.numa_socket = MappingProxyType(numa_socket)
        self.sockets = tuple(sorted(sock))
        self.socket_cpus = MappingProxyType({s: frozenset(c) for s, c in sock.items()})
        self.cpus_per_core = max(map(len, members), default=0)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CPUTopology) and self.infos == other.infos

    def __hash__(self) -> int:
        return hash(self.infos)

    def __bool__(self) -> bool:
        return bool(self.infos)

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

    @classmethod
    def from_annotation(cls, data: object) -> CPUTopology:
        """The same as ``cpu_topology_from_json``."""
        return cpu_topology_from_json(data)


def cpu_topology_from_json(data: object) -> CPUTopology:
    """A topology from the decoded annotation document; ``FormatError`` when it is not an
    object with a non-empty ``detail`` list of at most ``MAX_TOPOLOGY_CPUS`` CPU rows, or lists
    a CPU twice."""
    doc = read_object(data, "cpu-topology")
    detail = read_list(doc.get("detail"), "cpu-topology detail", MAX_TOPOLOGY_CPUS)
    if not detail:
        raise FormatError("cpu-topology: the detail list is empty")
    rows: list[CPUInfo] = []
    for entry in detail:
        item: Mapping[str, Any] = read_object(entry, "cpu-topology entry")
        cpu, core, socket, node = item.get("id"), item.get("core"), item.get("socket", 0), item.get("node", 0)
        # One cheap check for the common case; the readers below explain what is wrong.
        if not (
            type(cpu) is int
            and type(core) is int
            and type(socket) is int
            and type(node) is int
            and 0 <= cpu <= MAX_CPU_ID
            and 0 <= core <= _MAX_CORE_ID
            and 0 <= socket <= _MAX_SOCKET_ID
            and 0 <= node <= _MAX_NUMA_ID
        ):
            read_int(cpu, "cpu-topology id", 0, MAX_CPU_ID)
            read_int(core, "cpu-topology core", 0, _MAX_CORE_ID)
            read_int(socket, "cpu-topology socket", 0, _MAX_SOCKET_ID)
            read_int(node, "cpu-topology node", 0, _MAX_NUMA_ID)
        rows.append(CPUInfo(cpu, core, socket, node))  # type: ignore[arg-type]
    return CPUTopology(rows)


@memo_by_text(maxsize=64, max_chars=MAX_TOPOLOGY_CHARS)
def parse_cpu_topology(text: str) -> CPUTopology:
    """Parse ``node.koordinator.sh/cpu-topology``; memoised by the exact text, because every
    node of one machine model reports the same string."""
    return cpu_topology_from_json(load_json(text, "cpu-topology", max_chars=MAX_TOPOLOGY_CHARS))


def format_cpu_topology(topo: CPUTopology) -> str:
    """The annotation JSON for ``topo`` (rows ascending by CPU id, compact separators)."""
    detail = [{"id": i.id, "core": i.core, "socket": i.socket, "node": i.node} for i in topo.infos]
    return json.dumps({"detail": detail}, separators=(",", ":"))
