"""koord-scheduler's PreFilter/Filter rules, one row per rule, through ``extender.evaluate``.

Each row names the rule it checks (``scheduler_ext/admission.py`` numbers them) and gives the
status Koordinator answers: ok, Unschedulable (``FailedNodes``) or UnschedulableAndUnresolvable
(``FailedAndUnresolvableNodes``), with Koordinator's reason text.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from koord_formats.topology import CPUTopology, format_cpu_topology
from scheduler_ext.extender import ExtenderConfig, evaluate, needs
from scheduler_ext.pods import parse_pod
from scheduler_ext.state import ClusterState, load_objects
from scheduler_ext.topology import synthetic_topology
from tests.scheduler_ext.builders import TOPO_NO_SMT, TOPO_SMALL, node, nrt, pod

# two sockets, one NUMA node each, 26 cores x 2 threads: NUMA 0 = 0-25,52-77, NUMA 1 = 26-51,78-103
TOPO_104 = synthetic_topology(2, 1, 26, 2)

OK = "ok"
UNSCHEDULABLE = "Unschedulable"
UNRESOLVABLE = "UnschedulableAndUnresolvable"
FULL_ONLY = {"node.koordinator.sh/cpu-bind-policy": "FullPCPUsOnly"}
SPREAD_ONLY = {"node.koordinator.sh/cpu-bind-policy": "SpreadByPCPUs"}
KUBELET_FULL = {"kubelet.koordinator.sh/cpu-manager-policy": json.dumps(
    {"policy": "static", "options": {"full-pcpus-only": "true"}, "reservedCPUs": ""})}
RS = "scheduling.koordinator.sh/resource-status"


@dataclass(frozen=True)
class Case:
    description: str
    pod: Mapping[str, Any]  # keyword arguments of ``builders.pod``
    expect: str  # OK, UNSCHEDULABLE or UNRESOLVABLE
    reason: str = ""  # Koordinator's reason (a prefix is enough for our own texts)
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    nrt_annotations: Mapping[str, str] = field(default_factory=dict)
    policies: Sequence[str] = ("None",)
    topo: CPUTopology | None = TOPO_SMALL
    taken: Sequence[str] = ()  # cpusets of placed pods
    bind: tuple[str, bool] | None = None  # expected (bind policy, required) when it binds


CASES = [
    Case("a pod that requests nothing is skipped, even on a node that forces binding",
         {"cpu": None, "memory": None}, OK, labels=FULL_ONLY),
    Case("LSR koord-prod with a fractional CPU and the default policy must be integer",
         {"cpu": "1500m"}, UNRESOLVABLE, "the requested CPUs must be integer"),
    Case("preferred Default means the scheduler's default FullPCPUs, so a fraction is refused",
         {"cpu": "1500m", "resource_spec": {"preferredCPUBindPolicy": "Default"}}, UNRESOLVABLE,
         "the requested CPUs must be integer"),
    Case("preferred SpreadByPCPUs with a fraction is refused too",
         {"cpu": "2500m", "resource_spec": {"preferredCPUBindPolicy": "SpreadByPCPUs"}}, UNRESOLVABLE,
         "the requested CPUs must be integer"),
    Case("ConstrainedBurst never binds, so a fraction is fine",
         {"cpu": "1500m", "resource_spec": {"preferredCPUBindPolicy": "ConstrainedBurst"}}, OK),
    Case("LSR of batch priority does not bind and may ask a fraction",
         {"cpu": "1500m", "priority": 5500}, OK),
    Case("an LS pod with a fraction is plain on a node without a bind policy",
         {"cpu": "500m", "qos": "LS"}, OK),
    Case("a node labelled FullPCPUsOnly makes any CPU request bind, so an LS fraction is refused",
         {"cpu": "500m", "qos": "LS"}, UNRESOLVABLE, "the requested CPUs must be integer", labels=FULL_ONLY),
    Case("a node labelled FullPCPUsOnly binds an LS pod's whole CPUs as required FullPCPUs",
         {"cpu": "2", "qos": "LS"}, OK, labels=FULL_ONLY, bind=("FullPCPUs", True)),
    Case("kubelet's static policy with full-pcpus-only counts as FullPCPUsOnly",
         {"cpu": "1500m", "qos": "LS"}, UNRESOLVABLE, "the requested CPUs must be integer",
         nrt_annotations=KUBELET_FULL),
    Case("a node labelled SpreadByPCPUs binds a preferred FullPCPUs pod as required SpreadByPCPUs",
         {"cpu": "3"}, OK, labels=SPREAD_ONLY, bind=("SpreadByPCPUs", True)),
    Case("a pod requiring SpreadByPCPUs conflicts with a FullPCPUsOnly node",
         {"cpu": "2", "resource_spec": {"requiredCPUBindPolicy": "SpreadByPCPUs"}}, UNRESOLVABLE,
         "node(s) cpu bind policy conflicts with pod's required cpu bind policy", labels=FULL_ONLY),
    Case("a pod requiring FullPCPUs conflicts with a SpreadByPCPUs node",
         {"cpu": "2", "resource_spec": {"requiredCPUBindPolicy": "FullPCPUs"}}, UNRESOLVABLE,
         "node(s) cpu bind policy conflicts with pod's required cpu bind policy", labels=SPREAD_ONLY),
    Case("a pod preferring SpreadByPCPUs does not conflict; the node's FullPCPUs is required",
         {"cpu": "4", "resource_spec": {"preferredCPUBindPolicy": "SpreadByPCPUs"}}, OK, labels=FULL_ONLY,
         bind=("FullPCPUs", True)),
    Case("required FullPCPUs needs a multiple of the threads per core",
         {"cpu": "3", "resource_spec": {"requiredCPUBindPolicy": "FullPCPUs"}}, UNRESOLVABLE,
         "node(s) requested cpus not multiple cpus per core"),
    Case("required Default is the default FullPCPUs, required, so SMT alignment applies",
         {"cpu": "3", "resource_spec": {"requiredCPUBindPolicy": "Default"}}, UNRESOLVABLE,
         "node(s) requested cpus not multiple cpus per core"),
    Case("a FullPCPUsOnly node applies SMT alignment to a preferred pod",
         {"cpu": "3"}, UNRESOLVABLE, "node(s) requested cpus not multiple cpus per core", labels=FULL_ONLY),
    Case("preferred FullPCPUs with an odd count is fine (no SMT rule)",
         {"cpu": "3"}, OK, bind=("FullPCPUs", False)),
    Case("required FullPCPUs with an odd count is fine without SMT",
         {"cpu": "3", "resource_spec": {"requiredCPUBindPolicy": "FullPCPUs"}}, OK, topo=TOPO_NO_SMT,
         bind=("FullPCPUs", True)),
    Case("binding CPUs needs a CPU topology",
         {"cpu": "2"}, UNRESOLVABLE, "node(s) invalid CPU Topology", topo=None),
    Case("a plain pod does not need a CPU topology",
         {"cpu": "500m", "qos": "LS"}, OK, topo=None),
    Case("a pod NUMA policy that differs from the node label is refused",
         {"cpu": "2", "numa_policy": "SingleNUMANode"}, UNRESOLVABLE, "node(s) NUMA Topology policy not match",
         labels={"node.koordinator.sh/numa-topology-policy": "Restricted"}),
    Case("kubelet's SingleNUMANodePodLevel in the NRT matches a SingleNUMANode pod",
         {"cpu": "2", "numa_policy": "SingleNUMANode"}, OK, policies=("SingleNUMANodePodLevel",)),
    Case("kubelet's container-level policy is not a node policy, so any pod policy fits",
         {"cpu": "2", "numa_policy": "Restricted"}, OK, policies=("SingleNUMANodeContainerLevel",)),
    Case("the node label wins over the NRT's kubelet policy",
         {"cpu": "2", "numa_policy": "Restricted"}, UNRESOLVABLE, "node(s) NUMA Topology policy not match",
         labels={"node.koordinator.sh/numa-topology-policy": "BestEffort"}, policies=("Restricted",)),
    Case("a node NUMA policy applies to a plain pod without a NUMA zone",
         {"cpu": "500m", "qos": "LS"}, UNRESOLVABLE, "node(s) missing NUMA resources", topo=None,
         labels={"node.koordinator.sh/numa-topology-policy": "SingleNUMANode"}),
    Case("an unreadable CPU amplification ratio refuses pods with a CPU request",
         {"cpu": "2"}, UNRESOLVABLE, "node(s) invalid CPU amplification ratio",
         annotations={"node.koordinator.sh/resource-amplification-ratio": "{not json"}),
    Case("a readable amplification ratio is fine",
         {"cpu": "2"}, OK, annotations={"node.koordinator.sh/resource-amplification-ratio": '{"cpu": 1.5}'}),
    Case("a node whose CPUs are all taken is Unschedulable (preemption may help)",
         {"cpu": "4"}, UNSCHEDULABLE, "not enough cpus available to satisfy request",
         taken=("0-3,8-11", "4-7,12-15")),
    Case("required FullPCPUs needs whole free cores, not just free CPUs",
         {"cpu": "2", "resource_spec": {"requiredCPUBindPolicy": "FullPCPUs"}}, UNSCHEDULABLE,
         "not enough cpus available to satisfy request", taken=("0-7",)),
    Case("required SpreadByPCPUs needs free cores, one thread each",
         {"cpu": "5", "resource_spec": {"requiredCPUBindPolicy": "SpreadByPCPUs"}}, UNSCHEDULABLE,
         "not enough cpus available to satisfy request", taken=("0-3,8-11",)),
    Case("SingleNUMANode with no NUMA node able to hold the pod is not aligned",
         {"cpu": "6", "numa_policy": "SingleNUMANode"}, UNSCHEDULABLE,
         "Unaligned NUMA Hint cause cpu prefer [11] among [11]", taken=("0-2", "4-6")),
    Case("Restricted with no NUMA set able to hold the pod is unsatisfied",
         {"cpu": "10", "numa_policy": "Restricted"}, UNSCHEDULABLE, "Unsatisfied NUMA cpu",
         taken=("0-3", "4-7")),
    Case("104 CPUs: a full node is Unschedulable",
         {"cpu": "2"}, UNSCHEDULABLE, "not enough cpus available to satisfy request", topo=TOPO_104,
         taken=("0-103",)),
    Case("104 CPUs: required FullPCPUs fits in the last two whole cores",
         {"cpu": "4", "resource_spec": {"requiredCPUBindPolicy": "FullPCPUs"}}, OK, topo=TOPO_104,
         taken=("0-49,52-101",), bind=("FullPCPUs", True)),
    Case("104 CPUs: required FullPCPUs is refused when every free CPU is half a core",
         {"cpu": "2", "resource_spec": {"requiredCPUBindPolicy": "FullPCPUs"}}, UNSCHEDULABLE,
         "not enough cpus available to satisfy request", topo=TOPO_104, taken=("0-51",)),
    Case("104 CPUs: preferred FullPCPUs takes the half cores that are left",
         {"cpu": "8"}, OK, topo=TOPO_104, taken=("0-51",), bind=("FullPCPUs", False)),
    Case("104 CPUs: required SpreadByPCPUs needs as many cores with a free thread",
         {"cpu": "45", "resource_spec": {"requiredCPUBindPolicy": "SpreadByPCPUs"}}, UNSCHEDULABLE,
         "not enough cpus available to satisfy request", topo=TOPO_104, taken=("0-25,52-60",)),
    Case("104 CPUs: preferred SpreadByPCPUs may double threads for the same request",
         {"cpu": "45", "resource_spec": {"preferredCPUBindPolicy": "SpreadByPCPUs"}}, OK, topo=TOPO_104,
         taken=("0-25,52-60",), bind=("SpreadByPCPUs", False)),
    Case("104 CPUs: required FullPCPUs on a SMT node needs an even count",
         {"cpu": "5", "resource_spec": {"requiredCPUBindPolicy": "FullPCPUs"}}, UNRESOLVABLE,
         "node(s) requested cpus not multiple cpus per core", topo=TOPO_104),
    Case("104 CPUs: SingleNUMANode fits in the NUMA node that still has room",
         {"cpu": "40", "numa_policy": "SingleNUMANode"}, OK, topo=TOPO_104, taken=("0-9",)),
    Case("104 CPUs: SingleNUMANode larger than any NUMA node's free CPUs is not aligned",
         {"cpu": "50", "numa_policy": "SingleNUMANode"}, UNSCHEDULABLE,
         "Unaligned NUMA Hint cause cpu prefer [11] among [11]", topo=TOPO_104, taken=("0-9", "26-35")),
    Case("104 CPUs: Restricted spans both NUMA nodes when neither holds the pod",
         {"cpu": "80", "numa_policy": "Restricted"}, OK, topo=TOPO_104, taken=("0-4,26-30",)),
    Case("104 CPUs: Restricted with fewer free CPUs than asked is unsatisfied",
         {"cpu": "90", "numa_policy": "Restricted"}, UNSCHEDULABLE, "Unsatisfied NUMA cpu", topo=TOPO_104,
         taken=("0-9", "26-35")),
    Case("an unknown preferredCPUBindPolicy is refused, naming it (Koordinator ignores it)",
         {"cpu": "2", "resource_spec": {"preferredCPUBindPolicy": "Fastest"}}, UNRESOLVABLE,
         "invalid pod request: resource-spec: unknown preferredCPUBindPolicy 'Fastest'"),
]


def _state(case: Case) -> ClusterState:
    objs: list[dict[str, Any]] = [node("n", labels=case.labels, annotations=case.annotations)]
    if case.topo is not None:
        objs.append(nrt("n", format_cpu_topology(case.topo), annotations=case.nrt_annotations,
                        policies=case.policies))
    elif case.nrt_annotations or case.policies != ("None",):
        doc = nrt("n", "{}", annotations=case.nrt_annotations, policies=case.policies)
        del doc["metadata"]["annotations"]["node.koordinator.sh/cpu-topology"]
        objs.append(doc)
    for i, cpuset in enumerate(case.taken):
        objs.append(pod(f"placed-{i}", cpu="1", node_name="n", annotations={RS: json.dumps({"cpuset": cpuset})}))
    state = ClusterState()
    load_objects(state, objs)
    return state


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.description)
def test_admission_rule(case: Case) -> None:
    state = _state(case)
    ns = state.nodes["n"]
    req = parse_pod(pod("new", **case.pod))
    with state.lock:
        verdict = evaluate(ns, req, ExtenderConfig())
        need = needs(ns, req)
    got = OK if verdict.ok else (UNRESOLVABLE if verdict.unresolvable else UNSCHEDULABLE)
    assert (got, verdict.reason if not verdict.ok else "") == (case.expect, case.reason)
    if case.bind is not None:
        assert not isinstance(need, str)
        assert (need.bind_policy, need.required) == case.bind
