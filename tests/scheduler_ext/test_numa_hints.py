"""NUMA placement as koord-scheduler does it (``scheduler_ext/numa.py``), one row per rule:
zones from the NRT, the even split, hint generation, the topology-manager merge, and zone
accounting end to end through ``extender.plan``."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from koord_formats.errors import FormatError
from koord_formats.nrt import parse_zones
from koord_formats.quantity import parse_bytes, parse_cpu_milli
from koord_formats.topology import format_cpu_topology
from scheduler_ext import numa
from scheduler_ext.extender import ExtenderConfig, evaluate, plan
from scheduler_ext.numa import Hint, distribute_evenly, merge_hints, parse_nrt_zones
from scheduler_ext.pods import parse_pod
from scheduler_ext.state import ClusterState, load_objects
from tests.scheduler_ext.builders import TOPO_QUAD_NUMA, TOPO_SMALL, GiB, node, nrt, pod

F = frozenset
RS = "scheduling.koordinator.sh/resource-status"


def _amount(name: str, value: object) -> int:
    return parse_cpu_milli(value) if name == "cpu" else parse_bytes(value)


def zones_doc(cpu: Mapping[int, str], memory: Mapping[int, str] | None = None) -> list[dict[str, Any]]:
    out = []
    for n, c in cpu.items():
        res = [{"name": "cpu", "allocatable": c, "capacity": c, "available": c}]
        if memory:
            res.append({"name": "memory", "allocatable": memory[n], "capacity": memory[n], "available": memory[n]})
        out.append({"name": f"node-{n}", "type": "Node", "resources": res})
    return out


def test_nrt_zones_keep_node_zones_named_node_n_with_cpu_and_memory() -> None:
    doc = [*zones_doc({0: "8", 1: "7500m"}, {0: "16Gi", 1: "16Gi"}),
           {"name": "socket-0", "type": "Socket", "resources": []},
           {"name": "node-x", "type": "Node", "resources": []},
           {"name": "node-2", "type": "Node", "resources": [{"name": "hugepages-2Mi", "allocatable": "1Gi"}]}]
    assert parse_nrt_zones(doc, _amount) == {0: {"cpu": 8000, "memory": 16 * GiB},
                                             1: {"cpu": 7500, "memory": 16 * GiB}, 2: {}}


@pytest.mark.parametrize(
    "zones",
    ["not a list", [{"name": "node-0", "type": "Node", "resources": "x"}],
     [{"name": "node-0", "type": "Node", "resources": [{"name": "cpu", "allocatable": "lots"}]}]],
    ids=["zones-not-a-list", "resources-not-a-list", "unreadable-quantity"],
)
def test_bad_nrt_zones_are_refused(zones: object) -> None:
    with pytest.raises(numa.ZoneError):
        parse_nrt_zones(zones, _amount)


@pytest.mark.parametrize(
    "zones",
    [[{"name": "node-0", "type": "Node", "resources": [{"name": "hugepages-2Mi", "allocatable": "lots"}]}],
     [{"name": "node-0", "resources": []}],
     [{"name": "node-0", "type": "Node", "resources": [{"allocatable": "1"}]}],
     ["node-0"],
     [{"name": "x" * 10_000, "type": "Node", "resources": []}]],
    ids=["bad-quantity-of-another-resource", "zone-without-type", "resource-without-name", "zone-not-an-object",
         "huge-name"],
)
def test_the_extender_refuses_what_the_one_nrt_parser_refuses(zones: object) -> None:
    """The extender reads zones through koord_formats.nrt.parse_zones: what that parser refuses
    (Koordinator's Go types would not decode it either) makes the zones unusable, even where
    the bad part is a zone or resource the extender would skip."""
    with pytest.raises(FormatError):
        parse_zones(zones)
    with pytest.raises(numa.ZoneError):
        parse_nrt_zones(zones, _amount)


@dataclass(frozen=True)
class SplitRow:
    description: str
    requests: Mapping[str, int]
    available: Mapping[int, Mapping[str, int]]
    mask: frozenset[int]
    expected: Mapping[int, Mapping[str, int]]
    reasons: tuple[str, ...] = ()
    cpu_bind: bool = True
    full_cores: int = 0


SPLITS = [
    SplitRow("whole CPUs split evenly over two NUMA nodes", {"cpu": 4000}, {0: {"cpu": 8000}, 1: {"cpu": 8000}},
             F({0, 1}), {0: {"cpu": 2000}, 1: {"cpu": 2000}}),
    SplitRow("an odd count leaves the extra CPU to the node with more available",
             {"cpu": 5000}, {0: {"cpu": 8000}, 1: {"cpu": 6000}}, F({0, 1}), {0: {"cpu": 3000}, 1: {"cpu": 2000}}),
    SplitRow("a node short of its share gives what it has and the rest rolls on",
             {"cpu": 6000}, {0: {"cpu": 2000}, 1: {"cpu": 8000}}, F({0, 1}), {0: {"cpu": 2000}, 1: {"cpu": 4000}}),
    SplitRow("required FullPCPUs splits in whole cores", {"cpu": 6000}, {0: {"cpu": 8000}, 1: {"cpu": 8000}},
             F({0, 1}), {0: {"cpu": 2000}, 1: {"cpu": 4000}}, full_cores=2),
    SplitRow("shared pods split milli-cores", {"cpu": 1500}, {0: {"cpu": 8000}, 1: {"cpu": 8000}}, F({0, 1}),
             {0: {"cpu": 750}, 1: {"cpu": 750}}, cpu_bind=False),
    SplitRow("memory splits too when the zones report it", {"cpu": 2000, "memory": 3 * GiB},
             {0: {"cpu": 8000, "memory": 8 * GiB}, 1: {"cpu": 8000, "memory": 8 * GiB}}, F({0, 1}),
             {0: {"cpu": 1000, "memory": 3 * GiB // 2}, 1: {"cpu": 1000, "memory": 3 * GiB - 3 * GiB // 2}}),
    SplitRow("memory the zones do not report is not split", {"cpu": 2000, "memory": GiB},
             {0: {"cpu": 8000}, 1: {"cpu": 8000}}, F({0, 1}), {0: {"cpu": 1000}, 1: {"cpu": 1000}}),
    SplitRow("never past a node's available: the shortfall is Koordinator's reason", {"cpu": 8000},
             {0: {"cpu": 2000}, 1: {"cpu": 4000}}, F({0, 1}), {0: {"cpu": 2000}, 1: {"cpu": 4000}},
             reasons=("Insufficient NUMA cpu",)),
    SplitRow("the hint decides the nodes, not the zones", {"cpu": 4000},
             {0: {"cpu": 8000}, 1: {"cpu": 8000}, 2: {"cpu": 8000}}, F({1, 2}), {1: {"cpu": 2000}, 2: {"cpu": 2000}}),
]


@pytest.mark.parametrize("row", SPLITS, ids=lambda r: r.description)
def test_distribute_evenly(row: SplitRow) -> None:
    got = distribute_evenly(row.requests, row.available, row.mask, cpu_bind=row.cpu_bind, full_cores=row.full_cores)
    assert ({n: dict(v) for n, v in got.per_node.items()}, got.reasons) == (row.expected, row.reasons)


@dataclass(frozen=True)
class MergeRow:
    description: str
    policy: str
    providers: Sequence[Mapping[str, Sequence[Hint] | None]]
    affinity: frozenset[int] | None
    admit: bool
    reasons: tuple[str, ...] = ()


def h(nodes: set[int], preferred: bool, score: int = 0) -> Hint:
    return Hint(F(nodes), preferred, score)


MERGES = [
    MergeRow("BestEffort takes the narrowest preferred hint", "BestEffort",
             [{"cpu": [h({0}, True), h({1}, True), h({0, 1}, False)]}], F({0}), True),
    MergeRow("equal masks tie on score, the higher wins", "BestEffort",
             [{"cpu": [h({0}, True, 10), h({1}, True, 60)]}], F({1}), True),
    MergeRow("Restricted admits a preferred wide hint", "Restricted", [{"cpu": [h({0, 1}, True)]}], F({0, 1}), True),
    MergeRow("Restricted refuses a resource with no hint", "Restricted", [{"cpu": []}], F({0, 1}), False,
             ("Unsatisfied NUMA cpu",)),
    MergeRow("Restricted refuses when providers only meet on a mask neither prefers", "Restricted",
             [{"cpu": [h({0}, True)]}, {"gpu": [h({1}, True)]}], F({0, 1}), False,
             ("Unaligned NUMA Hint cause cpu prefer [01] among [01] & gpu prefer [10] among [10]",)),
    MergeRow("SingleNUMANode keeps only single-node preferred hints", "SingleNUMANode",
             [{"cpu": [h({0, 1}, True)]}], None, False, ("Unaligned NUMA Hint cause cpu prefer [11] among [11]",)),
    MergeRow("SingleNUMANode: CPU and GPU meet on one node", "SingleNUMANode",
             [{"cpu": [h({0}, True), h({1}, True)]}, {"gpu": [h({1}, True)]}], F({1}), True),
    MergeRow("a provider without preference is neutral", "SingleNUMANode",
             [{"cpu": [h({1}, True)]}, {"gpu": None}], F({1}), True),
    MergeRow("a preferred merge needs every provider to name the same mask", "BestEffort",
             [{"cpu": [h({0, 1}, True)]}, {"gpu": [h({0}, True)]}], F({0, 1}), True),
]


@pytest.mark.parametrize("row", MERGES, ids=lambda r: r.description)
def test_merge_hints_like_koordinators_topology_manager(row: MergeRow) -> None:
    got = merge_hints(row.policy, (0, 1), row.providers)
    assert (got.affinity, got.admit, got.reasons) == (row.affinity, row.admit, row.reasons)


def test_masks_print_as_koordinator_prints_them() -> None:
    assert [numa.mask_text(F(m)) for m in ({0}, {1}, {0, 1}, {2}, {0, 3})] == ["01", "10", "11", "0100", "1001"]


def test_hints_prefer_the_narrowest_mask_that_fits_now() -> None:
    zones = {0: {"cpu": 8000}, 1: {"cpu": 8000}}
    available = {0: {"cpu": 2000}, 1: {"cpu": 8000}}
    hints = numa.generate_hints(zones, available, {"cpu": 4000}, "BestEffort",
                                lambda m: sum(available[n]["cpu"] for n in m) >= 4000)
    assert hints == {"cpu": [Hint(F({1}), True, 50), Hint(F({0, 1}), False, 37)]}


def test_restricted_prefers_every_mask_that_fits() -> None:
    zones = {0: {"cpu": 8000}, 1: {"cpu": 8000}}
    hints = numa.generate_hints(zones, zones, {"cpu": 4000}, "Restricted", lambda m: True)
    assert [x.preferred for x in hints["cpu"]] == [True, True, True]


def _state(objs: list[dict[str, Any]]) -> ClusterState:
    state = ClusterState()
    load_objects(state, objs)
    return state


def _with_zones(doc: dict[str, Any], zones: list[dict[str, Any]]) -> dict[str, Any]:
    doc["zones"] = zones
    return doc


def test_zone_accounting_books_cpuset_and_shared_pods_and_never_passes_allocatable() -> None:
    zones = zones_doc({0: "8", 1: "8"}, {0: "16Gi", 1: "16Gi"})
    placed = pod("old", cpu="6", memory="12Gi", node_name="n", numa_policy="SingleNUMANode", annotations={
        RS: json.dumps({"cpuset": "0-2,8-10",
                        "numaNodeResources": [{"node": 0, "resources": {"cpu": "6", "memory": "12Gi"}}]})})
    state = _state([node("n"), _with_zones(nrt("n", format_cpu_topology(TOPO_SMALL)), zones), placed])
    ns = state.nodes["n"]
    cfg = ExtenderConfig()
    shared = parse_pod(pod("ls", cpu="1500m", memory="6Gi", qos="LS", numa_policy="SingleNUMANode"))
    with state.lock:
        got = plan(ns, shared, cfg)
    # NUMA 0 has 2 CPUs and 4Gi left: the shared pod goes to NUMA 1 whole
    assert json.loads(got.annotations[RS]) == {
        "numaNodeResources": [{"node": 1, "resources": {"cpu": "1500m", "memory": "6Gi"}}]}
    # Preferred: under the default Required the cpuset confined to NUMA 0 keeps {0,1} out
    big = parse_pod(pod("big", cpu="4", memory="12Gi", annotations={
        "scheduling.koordinator.sh/numa-topology-spec":
            json.dumps({"numaTopologyPolicy": "Restricted", "singleNUMANodeExclusive": "Preferred"})}))
    with state.lock:
        state.hold("ls-uid", "n", got.allocation)
        ns.refresh()
        verdict = evaluate(ns, big, cfg)
    # memory left: 4Gi on NUMA 0 and 10Gi on NUMA 1; only both together hold 12Gi, but NUMA 0
    # has 2 CPUs and NUMA 1 6.5: the even split gives 2 CPUs each, so it fits on {0,1}
    assert verdict.ok, verdict.reason
    with state.lock:
        placement = plan(ns, big, cfg)
    status = json.loads(placement.annotations[RS])
    per = {e["node"]: e["resources"] for e in status["numaNodeResources"]}
    assert per == {0: {"cpu": "2", "memory": "4Gi"}, 1: {"cpu": "2", "memory": "8Gi"}}


def test_zone_cpu_excludes_withheld_cpus() -> None:
    zones = zones_doc({0: "8", 1: "8"})
    ann = {"kubelet.koordinator.sh/cpu-manager-policy": json.dumps({"policy": "static", "reservedCPUs": "0-1,8-9"})}
    state = _state([node("n"), _with_zones(nrt("n", format_cpu_topology(TOPO_SMALL), annotations=ann), zones)])
    ns = state.nodes["n"]
    p = parse_pod(pod("ls", cpu="5", qos="LS", numa_policy="SingleNUMANode"))
    with state.lock:
        placement = plan(ns, p, ExtenderConfig())
    status = json.loads(placement.annotations[RS])
    # NUMA 0 keeps 4 of its 8 CPUs after kubelet's reserved 0-1,8-9; the zones report no memory
    assert status == {"numaNodeResources": [{"node": 1, "resources": {"cpu": "5"}}]}


def test_four_numa_nodes_even_split_over_the_narrowest_pair() -> None:
    state = _state([node("n"), nrt("n", format_cpu_topology(TOPO_QUAD_NUMA))])
    ns = state.nodes["n"]
    p = parse_pod(pod("p", cpu="12", numa_policy="Restricted",
                      resource_spec={"requiredCPUBindPolicy": "FullPCPUs"}))
    with state.lock:
        placement = plan(ns, p, ExtenderConfig())
    assert placement.affinity == F({0, 1})
    per_node = {n: len(placement.allocation.cpus & TOPO_QUAD_NUMA.numa_cpus[n]) for n in range(4)}
    assert per_node == {0: 6, 1: 6, 2: 0, 3: 0}
