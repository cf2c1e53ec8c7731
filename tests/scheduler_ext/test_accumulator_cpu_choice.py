"""Koordinator's CPU choice (``scheduler_ext/accumulator.py``), one row per rule.

Topologies (``tests/scheduler_ext/builders.py``): ``TOPO_SMALL`` is 16 CPUs on two sockets, one
NUMA node each (NUMA 0 = cores 0-3 = CPUs 0-3,8-11; NUMA 1 = CPUs 4-7,12-15); ``TOPO_104`` is
104 CPUs on two sockets (NUMA 0 = cores 0-25 = CPUs 0-25,52-77; NUMA 1 = CPUs 26-51,78-103),
siblings numbered like Linux (core k = CPUs k and k + cores).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from koord_formats.topology import CPUTopology
from scheduler_ext.accumulator import AllocationError, ExclusiveUse, allocate_cpuset
from scheduler_ext.topology import synthetic_topology
from tests.scheduler_ext.builders import TOPO_SMALL, cpus

TOPO_104 = synthetic_topology(2, 1, 26, 2)
LEAST = "LeastAllocated"
MOST = "MostAllocated"


@dataclass(frozen=True)
class Row:
    description: str
    topo: CPUTopology
    taken: str  # CPUs already held, kernel list format
    n: int
    expected: str  # kernel list format
    policy: str = "FullPCPUs"
    required: bool = False
    strategy: str = LEAST
    exclusive: str = "None"
    used: ExclusiveUse = field(default_factory=ExclusiveUse)


ROWS = [
    Row("FullPCPUs takes whole cores of the first NUMA node, ties by id", TOPO_SMALL, "", 4, "0-1,8-9"),
    Row("an odd FullPCPUs count takes a core's first thread last", TOPO_SMALL, "", 3, "0-1,8"),
    Row("a whole NUMA node when the request is its size", TOPO_SMALL, "", 8, "0-3,8-11"),
    Row("MostAllocated picks the NUMA node with fewer whole free cores", TOPO_SMALL, "1", 4, "0,2,8,10",
        strategy=MOST),
    Row("LeastAllocated picks the NUMA node with more whole free cores", TOPO_SMALL, "1", 4, "4-5,12-13"),
    Row("FullPCPUs never fills a half-used core while whole cores are free", TOPO_SMALL, "0", 1, "1",
        strategy=MOST),
    Row("LeastAllocated moves a FullPCPUs pair away from a half-used NUMA node", TOPO_SMALL, "0", 2, "4,12"),
    Row("beyond one socket: the socket with most free cores whole, then core by core", TOPO_SMALL, "", 10,
        "0-4,8-12"),
    Row("SpreadByPCPUs takes one thread per core inside one NUMA node", TOPO_SMALL, "", 4, "0-3",
        policy="SpreadByPCPUs"),
    Row("preferred SpreadByPCPUs stays in one NUMA node and doubles threads there", TOPO_SMALL, "", 6,
        "0-3,8-9", policy="SpreadByPCPUs"),
    Row("required SpreadByPCPUs uses the lowest free thread of each core", TOPO_SMALL, "0-1", 4, "2-3,8-9",
        policy="SpreadByPCPUs", required=True),
    Row("required FullPCPUs skips half-used cores", TOPO_SMALL, "0,4", 4, "1-2,9-10", required=True,
        strategy=MOST),
    Row("PCPULevel avoids cores an exclusive pod uses, moving to the other NUMA node", TOPO_SMALL, "1", 4,
        "4-7", policy="SpreadByPCPUs", strategy=MOST, exclusive="PCPULevel", used=ExclusiveUse(cores=frozenset({1}))),
    Row("without exclusivity the same pod shares core 1's sibling", TOPO_SMALL, "1", 4, "0,2-3,9",
        policy="SpreadByPCPUs", strategy=MOST),
    Row("NUMANodeLevel avoids a NUMA node an exclusive pod uses", TOPO_SMALL, "0", 2, "4,12", strategy=MOST,
        exclusive="NUMANodeLevel", used=ExclusiveUse(numa_nodes=frozenset({0}))),
    Row("without exclusivity MostAllocated packs into that NUMA node", TOPO_SMALL, "0", 2, "1,9", strategy=MOST),
    Row("104 CPUs: whole cores of NUMA 0 first", TOPO_104, "", 4, "0-1,52-53"),
    Row("104 CPUs: more than a socket takes socket 0 whole, then NUMA 1 core by core", TOPO_104, "", 60,
        "0-29,52-81"),
    Row("104 CPUs: MostAllocated packs into the busy NUMA node's remaining cores", TOPO_104, "0-19,52-71", 8,
        "20-23,72-75", strategy=MOST),
    Row("104 CPUs: LeastAllocated goes to the idle NUMA node", TOPO_104, "0-19,52-71", 8, "26-29,78-81"),
    Row("104 CPUs: preferred SpreadByPCPUs doubles threads inside NUMA 0", TOPO_104, "", 30, "0-25,52-55",
        policy="SpreadByPCPUs"),
    Row("104 CPUs: required SpreadByPCPUs spans NUMA nodes, one thread per core", TOPO_104, "", 30, "0-29",
        policy="SpreadByPCPUs", required=True),
    Row("104 CPUs: FullPCPUs skips a NUMA node with no whole core free", TOPO_104, "52-77", 4, "26-27,78-79",
        strategy=MOST),
]


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.description)
def test_cpu_choice(row: Row) -> None:
    available = row.topo.cpus - cpus(row.taken)
    got = allocate_cpuset(
        row.topo,
        available,
        row.n,
        bind_policy=row.policy,
        required=row.required,
        exclusive_policy=row.exclusive,
        strategy=row.strategy,
        used=row.used,
    )
    assert got == cpus(row.expected)


@dataclass(frozen=True)
class Refused:
    description: str
    taken: str
    n: int
    policy: str
    required: bool
    reason: str


REFUSALS = [
    Refused("more CPUs than are free", "0-11", 5, "FullPCPUs", False,
            "not enough cpus available to satisfy request"),
    Refused("required FullPCPUs without enough whole free cores", "0-7", 2, "FullPCPUs", True,
            "not enough cpus available to satisfy request"),
    Refused("required SpreadByPCPUs without enough cores with a free thread", "0-3,8-11", 5, "SpreadByPCPUs", True,
            "not enough cpus available to satisfy request"),
]


@pytest.mark.parametrize("row", REFUSALS, ids=lambda r: r.description)
def test_cpu_choice_refuses_with_koordinators_reason(row: Refused) -> None:
    with pytest.raises(AllocationError, match=row.reason):
        allocate_cpuset(TOPO_SMALL, TOPO_SMALL.cpus - cpus(row.taken), row.n,
                        bind_policy=row.policy, required=row.required)


def test_numa_shares_are_taken_inside_each_node_with_the_policy() -> None:
    got = allocate_cpuset(TOPO_SMALL, TOPO_SMALL.cpus, 4, bind_policy="FullPCPUs", required=True,
                          numa_cpus={0: 2, 1: 2})
    assert got == cpus("0,4,8,12")


def test_numa_shares_that_do_not_add_up_are_refused() -> None:
    with pytest.raises(AllocationError, match="not enough cpus"):
        allocate_cpuset(TOPO_SMALL, TOPO_SMALL.cpus - cpus("4-7,12-15"), 4, bind_policy="FullPCPUs",
                        required=False, numa_cpus={0: 2, 1: 2})
