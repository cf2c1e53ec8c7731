"""``singleNUMANodeExclusive`` as koord-scheduler applies it, one row per rule.

NUMA node states come from the cpusets already placed (``numa.numa_node_states``): a cpuset on
several NUMA nodes makes each "shared", one confined to a NUMA node makes it "single". Under
Required a one-node set on a shared NUMA node, or a wider set holding a single NUMA node, is not
preferred (``numa.exclusive_allows``); Restricted and SingleNUMANode then refuse the node with
"Unaligned NUMA Hint cause ...", BestEffort still admits. Required is the default when the pod
names a NUMA policy; Preferred changes nothing.

Topologies: ``TOPO_SMALL`` is 16 CPUs on two sockets (NUMA 0 = CPUs 0-3,8-11; NUMA 1 = CPUs
4-7,12-15); ``TOPO_104`` is 104 CPUs on two sockets (NUMA 0 = CPUs 0-25,52-77; NUMA 1 = CPUs
26-51,78-103). Without NRT zones each NUMA node is a zone of its bindable CPUs.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from koord_formats import keys
from koord_formats.topology import CPUTopology, format_cpu_topology
from scheduler_ext import numa
from scheduler_ext.extender import ExtenderConfig, evaluate, plan
from scheduler_ext.numa import Hint, merge_hints
from scheduler_ext.pods import parse_pod
from scheduler_ext.state import ClusterState, load_objects
from scheduler_ext.topology import synthetic_topology
from tests.scheduler_ext.builders import TOPO_SMALL, cpus, node, nrt, pod

F = frozenset
TOPO_104 = synthetic_topology(2, 1, 26, 2)
RS = "scheduling.koordinator.sh/resource-status"
NTS = "scheduling.koordinator.sh/numa-topology-spec"
SINGLE, SHARED = keys.NUMA_NODE_SINGLE, keys.NUMA_NODE_SHARED
OK, UNSCHEDULABLE = "ok", "Unschedulable"
LSR_FULL = {"requiredCPUBindPolicy": "FullPCPUs"}


# ---- states and the check -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cpusets", "expected"),
    [
        pytest.param([], {}, id="no cpuset leaves every NUMA node idle"),
        pytest.param(["0-1,8-9"], {0: SINGLE}, id="a cpuset inside NUMA 0 makes it single"),
        pytest.param(["3,4"], {0: SHARED, 1: SHARED}, id="a cpuset across both NUMA nodes makes both shared"),
        pytest.param(["0", "3,4"], {0: SHARED, 1: SHARED}, id="a spanning cpuset outweighs a single one"),
        pytest.param(["3,4", "0"], {0: SHARED, 1: SHARED}, id="the order of the cpusets does not matter"),
        pytest.param(["0", "12"], {0: SINGLE, 1: SINGLE}, id="one-node cpusets on each node make both single"),
        pytest.param(["99"], {}, id="CPUs of no NUMA node are skipped"),
        pytest.param([""], {}, id="an empty cpuset counts for nothing"),
    ],
)
def test_numa_node_states(cpusets: Sequence[str], expected: Mapping[int, str]) -> None:
    assert numa.numa_node_states([cpus(c) for c in cpusets], TOPO_SMALL.numa_cpus) == expected


@pytest.mark.parametrize(
    ("mask", "exclusive", "states", "allowed"),
    [
        pytest.param({0}, "Required", {0: SHARED}, False, id="Required refuses one shared NUMA node"),
        pytest.param({0}, "Required", {0: SINGLE}, True, id="Required takes one single NUMA node"),
        pytest.param({0}, "Required", {}, True, id="Required takes one idle NUMA node"),
        pytest.param({0, 1}, "Required", {1: SINGLE}, False, id="Required refuses a wide set with a single node"),
        pytest.param({0, 1}, "Required", {0: SHARED, 1: SHARED}, True, id="Required takes a wide set of shared nodes"),
        pytest.param({0}, "Preferred", {0: SHARED}, True, id="Preferred never refuses"),
        pytest.param({0, 1}, "", {0: SINGLE}, True, id="no exclusivity never refuses"),
    ],
)
def test_exclusive_allows(mask: set[int], exclusive: str, states: Mapping[int, str], allowed: bool) -> None:
    assert numa.exclusive_allows(F(mask), exclusive, states) is allowed


@dataclass(frozen=True)
class MergeRow:
    description: str
    policy: str
    hints: Sequence[Hint]
    states: Mapping[int, str]
    affinity: frozenset[int] | None
    admit: bool
    exclusive: str = "Required"


def h(nodes: set[int], preferred: bool, score: int = 0) -> Hint:
    return Hint(F(nodes), preferred, score)


MERGES = [
    MergeRow("BestEffort moves a one-node pod off the shared NUMA node to a preferred one", "BestEffort",
             [h({0}, True, 90), h({1}, True, 10)], {0: SHARED}, F({1}), True),
    MergeRow("BestEffort without exclusivity keeps the higher score", "BestEffort",
             [h({0}, True, 90), h({1}, True, 10)], {0: SHARED}, F({0}), True, exclusive=""),
    MergeRow("BestEffort admits even when no set is allowed, taking the narrowest", "BestEffort",
             [h({0}, True), h({1}, True), h({0, 1}, False)], {0: SHARED, 1: SHARED}, F({0}), True),
    MergeRow("Restricted refuses a wide set that holds a single NUMA node", "Restricted",
             [h({0, 1}, True)], {0: SINGLE}, F({0, 1}), False),
    MergeRow("SingleNUMANode refuses when every node is shared", "SingleNUMANode",
             [h({0}, True), h({1}, True)], {0: SHARED, 1: SHARED}, F({0}), False),
    MergeRow("SingleNUMANode takes the node that is not shared", "SingleNUMANode",
             [h({0}, True, 90), h({1}, True, 10)], {0: SHARED}, F({1}), True),
]


@pytest.mark.parametrize("row", MERGES, ids=lambda r: r.description)
def test_merge_with_exclusivity(row: MergeRow) -> None:
    got = merge_hints(row.policy, (0, 1), [{"cpu": row.hints}], exclusive=row.exclusive, states=row.states)
    assert (got.affinity, got.admit) == (row.affinity, row.admit)


# ---- through the extender -----------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    description: str
    pod: Mapping[str, Any]
    expect: str
    reason: str = ""
    topo: CPUTopology = TOPO_SMALL
    taken: tuple[str, ...] = ()  # cpusets of pods already placed on the node
    labels: Mapping[str, str] = field(default_factory=dict)
    affinity: frozenset[int] | None = None  # the NUMA set a bind books, when admitted


def spec(policy: str | None, exclusive: str | None = None) -> dict[str, str]:
    doc = {}
    if policy is not None:
        doc["numaTopologyPolicy"] = policy
    if exclusive is not None:
        doc["singleNUMANodeExclusive"] = exclusive
    return {NTS: json.dumps(doc)}


def lsr(cpu: str, policy: str | None, exclusive: str | None = None) -> dict[str, Any]:
    return {"cpu": cpu, "memory": None, "resource_spec": LSR_FULL, "annotations": spec(policy, exclusive)}


def ls(cpu: str, policy: str | None, exclusive: str | None = None) -> dict[str, Any]:
    return {"cpu": cpu, "memory": None, "qos": "LS", "annotations": spec(policy, exclusive)}


UNALIGNED_SMALL_ONE = "Unaligned NUMA Hint cause cpu prefer [01 10] among [01 10 11]"

CASES = [
    Case("16 CPUs: a Required one-node cpuset pod is refused when a spanning cpuset shares both NUMA nodes",
         lsr("2", "SingleNUMANode", "Required"), UNSCHEDULABLE, UNALIGNED_SMALL_ONE, taken=("3,7",)),
    Case("16 CPUs: left out, exclusivity defaults to Required when the pod names a NUMA policy",
         lsr("2", "SingleNUMANode"), UNSCHEDULABLE, UNALIGNED_SMALL_ONE, taken=("3,7",)),
    Case("16 CPUs: Preferred exclusivity admits the same pod next to the spanning cpuset",
         lsr("2", "SingleNUMANode", "Preferred"), OK, taken=("3,7",), affinity=F({0})),
    Case("16 CPUs: a node-label policy alone sets no exclusivity, so the pod is admitted",
         lsr("2", None), OK, taken=("3,7",), labels={keys.LABEL_NUMA_TOPOLOGY_POLICY: "SingleNUMANode"},
         affinity=F({0})),
    Case("16 CPUs: a one-node pod may join NUMA nodes used by one-node cpusets",
         lsr("2", "SingleNUMANode", "Required"), OK, taken=("0", "4"), affinity=F({0})),
    Case("16 CPUs: Restricted across both NUMA nodes is refused while one holds a one-node cpuset",
         ls("10", "Restricted", "Required"), UNSCHEDULABLE,
         "Unaligned NUMA Hint cause cpu prefer [11] among [11]", taken=("0",)),
    Case("16 CPUs: Restricted across both NUMA nodes is admitted when a spanning cpuset made both shared",
         ls("10", "Restricted", "Required"), OK, taken=("0,4",), affinity=F({0, 1})),
    Case("16 CPUs: Restricted Preferred crosses a single NUMA node",
         ls("10", "Restricted", "Preferred"), OK, taken=("0",), affinity=F({0, 1})),
    Case("16 CPUs: BestEffort Required still admits across a single NUMA node",
         ls("10", "BestEffort", "Required"), OK, taken=("0",), affinity=F({0, 1})),
    Case("16 CPUs: a shared pod's own NUMA booking makes no NUMA node single or shared",
         ls("10", "Restricted", "Required"), OK, affinity=F({0, 1})),
    Case("104 CPUs: a Required one-node cpuset pod is refused beside a spanning cpuset",
         lsr("4", "SingleNUMANode", "Required"), UNSCHEDULABLE, UNALIGNED_SMALL_ONE, topo=TOPO_104,
         taken=("24-27",)),
    Case("104 CPUs: Preferred places the same pod on the NUMA node with more free CPUs",
         lsr("4", "SingleNUMANode", "Preferred"), OK, topo=TOPO_104, taken=("24-29",), affinity=F({0})),
    Case("104 CPUs: Restricted over 52 CPUs is refused while NUMA 1 holds a one-node cpuset",
         ls("60", "Restricted", "Required"), UNSCHEDULABLE,
         "Unaligned NUMA Hint cause cpu prefer [11] among [11]", topo=TOPO_104, taken=("26-27",)),
    Case("104 CPUs: Restricted over 52 CPUs is admitted when every used NUMA node is shared",
         ls("60", "Restricted", "Required"), OK, topo=TOPO_104, taken=("0,26",), affinity=F({0, 1})),
    Case("104 CPUs: a one-node pod goes where one-node cpusets already are",
         lsr("20", "SingleNUMANode", "Required"), OK, topo=TOPO_104, taken=("0-9", "26-49,78-101"),
         affinity=F({0})),
]


def _state(case: Case) -> ClusterState:
    objs: list[dict[str, Any]] = [node("n", labels=case.labels), nrt("n", format_cpu_topology(case.topo))]
    for i, cpuset in enumerate(case.taken):
        objs.append(pod(f"placed-{i}", cpu="1", node_name="n", annotations={RS: json.dumps({"cpuset": cpuset})}))
    state = ClusterState()
    load_objects(state, objs)
    return state


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.description)
def test_exclusivity_through_the_extender(case: Case) -> None:
    state = _state(case)
    ns = state.nodes["n"]
    req = parse_pod(pod("new", **case.pod))
    with state.lock:
        verdict = evaluate(ns, req, ExtenderConfig())
        got = OK if verdict.ok else ("UnschedulableAndUnresolvable" if verdict.unresolvable else UNSCHEDULABLE)
        assert (got, verdict.reason if not verdict.ok else "") == (case.expect, case.reason)
        if verdict.ok:
            placement = plan(ns, req, ExtenderConfig())
            assert placement.affinity == case.affinity
            taken = frozenset().union(*(cpus(c) for c in case.taken))
            assert not placement.allocation.cpus & taken


def test_an_unknown_exclusivity_refuses_the_pod_everywhere_naming_it() -> None:
    state = _state(Case("", {}, OK))
    req = parse_pod(pod("new", **lsr("2", "SingleNUMANode", "Sometimes")))
    with state.lock:
        verdict = evaluate(state.nodes["n"], req, ExtenderConfig())
    assert (verdict.ok, verdict.unresolvable) == (False, True)
    assert verdict.reason == "invalid pod request: numa-topology-spec: unknown singleNUMANodeExclusive 'Sometimes'"


def test_a_placed_spanning_pod_changes_the_next_verdict() -> None:
    state = _state(Case("", {}, OK))
    ns = state.nodes["n"]
    req = parse_pod(pod("new", **lsr("2", "SingleNUMANode", "Required")))
    cfg = ExtenderConfig()
    with state.lock:
        assert evaluate(ns, req, cfg).ok
    state.apply("pods", "ADDED", pod("span", cpu="2", node_name="n", annotations={RS: json.dumps({"cpuset": "3,7"})}))
    with state.lock:
        ns = state.nodes["n"]
        ns.refresh()
        verdict = evaluate(ns, req, cfg)
    assert (verdict.ok, verdict.reason) == (False, UNALIGNED_SMALL_ONE)
