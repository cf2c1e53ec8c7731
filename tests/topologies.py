"""Named CPU topologies for tests, defined once (kubelet cpumanager style), plus ``cpus()``.

Each topology notes where its shape comes from. CPU ids follow Linux's usual enumeration for
the machine kind (HT siblings of core ``c`` on one socket are ``c`` and ``c + cores``) unless
noted.
"""

from __future__ import annotations

from hooks.facts import CPUInfo, CPUTopology, parse_cpu_list


def cpus(text: str) -> frozenset[int]:
    """CPU ids in the kernel's list format: ``cpus("0-3,8")``."""
    return parse_cpu_list(text)


def _topology(sockets: int, cores_per_socket: int, threads: int, numa_per_socket: int = 1) -> CPUTopology:
    total_cores = sockets * cores_per_socket
    out: list[CPUInfo] = []
    for t in range(threads):
        for core in range(total_cores):
            socket = core // cores_per_socket
            numa = socket * numa_per_socket + (core % cores_per_socket) // (cores_per_socket // numa_per_socket)
            out.append(CPUInfo(id=t * total_cores + core, core=core, socket=socket, node=numa))
    return CPUTopology(tuple(sorted(out, key=lambda c: c.id)))


# This VM (Firecracker, 2 vCPUs, no SMT, one NUMA node): what sysfs shows here.
THIS_VM = _topology(1, 2, 1)
# A single-socket HT desktop (e.g. 4 cores / 8 threads, one NUMA node): kubelet's
# topoSingleSocketHT shape.
SINGLE_SOCKET_HT = _topology(1, 4, 2)
# Dual socket, one NUMA node per socket, 4 cores each, no SMT: CPUs 0-3 on node 0, 4-7 on node 1.
DUAL_SOCKET_NO_HT = _topology(2, 4, 1)
# Dual socket, one NUMA node per socket, 4 cores each, HT: node 0 = 0-3,8-11; node 1 = 4-7,12-15
# (kubelet's topoDualSocketHT shape).
DUAL_SOCKET_HT = _topology(2, 4, 2)
