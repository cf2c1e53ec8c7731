"""Filter and bind give the same answer: a node that passes filter is always allocatable at bind.

Filter and prioritize decide feasibility without choosing CPUs; bind chooses them. Both go
through one function at each level, and these properties check that its two modes agree on
many generated nodes and pods:

- ``accumulator.allocate_cpuset`` counting (``choose=False``, filter) and choosing (bind): both
  succeed, or both raise ``AllocationError`` with the same reason, for any topology, free and
  preferred CPUs, bind and exclusive policy, strategy and NUMA shares;
- ``decide.place_on`` on a cached node (placed pods, kubelet-reserved CPUs, node bind and NUMA
  policy labels, NUMA zones, an amplification ratio, reservations): filter's verdict
  (``evaluate``) passes exactly when bind's exact placement succeeds, with the same reason and
  status when both refuse outside reservations (with one, bind's reason names the nominated
  reservation; ``plan`` answers filter's reason first), and ``plan`` then gives the pod
  exactly its CPUs.
"""

from __future__ import annotations

import functools
import json
import os
import uuid
from dataclasses import dataclass
from typing import Any

from hypothesis import HealthCheck, currently_in_test_context, event, given, settings
from hypothesis import strategies as st

from koord_formats import keys
from koord_formats.cpulist import format_cpu_list
from koord_formats.topology import CPUTopology, format_cpu_topology
from scheduler_ext.accumulator import AllocationError, ExclusiveUse, allocate_cpuset
from scheduler_ext.admission import Placed, Refusal, pre_filter
from scheduler_ext.decide import ExtenderConfig, evaluate, place_on, plan
from scheduler_ext.pods import parse_pod
from scheduler_ext.state import ClusterState, load_objects
from scheduler_ext.topology import synthetic_topology
from scheduler_ext.views import matched_reservations
from tests.scheduler_ext.builders import node, nrt, pod, reservation

# SCHED_EXAMPLES=5000 for a deeper run; 500 by default, as every placement property test
SETTINGS = settings(
    max_examples=int(os.environ.get("SCHED_EXAMPLES", "500")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
CFG = ExtenderConfig()
SHAPES = [(s, n, c, t) for s in (1, 2) for n in (1, 2) for c in (1, 2, 3) for t in (1, 2)]
BIND_POLICIES = (keys.BIND_POLICY_FULL_PCPUS, keys.BIND_POLICY_SPREAD_BY_PCPUS)
EXCLUSIVE = (keys.EXCLUSIVE_POLICY_NONE, keys.EXCLUSIVE_POLICY_PCPU_LEVEL, keys.EXCLUSIVE_POLICY_NUMA_NODE_LEVEL)
NUMA = ("", keys.NUMA_POLICY_BEST_EFFORT, keys.NUMA_POLICY_RESTRICTED, keys.NUMA_POLICY_SINGLE_NUMA_NODE)


@functools.cache
def machine(shape: tuple[int, int, int, int]) -> tuple[CPUTopology, str]:
    topo = synthetic_topology(*shape)
    return topo, format_cpu_topology(topo)


def _subset(data: st.DataObject, cpus: frozenset[int]) -> frozenset[int]:
    return frozenset(data.draw(st.sets(st.sampled_from(sorted(cpus))))) if cpus else frozenset()


def _answer(call: functools.partial[frozenset[int]]) -> str | frozenset[int]:
    try:
        return call()
    except AllocationError as exc:
        return f"refused: {exc}"


# -- the CPU step: one function, counted or chosen ------------------------------------------------


@SETTINGS
@given(shape=st.sampled_from(SHAPES), data=st.data(), policy=st.sampled_from(BIND_POLICIES), required=st.booleans(),
       exclusive=st.sampled_from(EXCLUSIVE), strategy=st.sampled_from([keys.MOST_ALLOCATED, keys.LEAST_ALLOCATED]))
def test_counting_and_choosing_cpus_agree(
    shape: tuple[int, int, int, int], data: st.DataObject, policy: str, required: bool, exclusive: str, strategy: str
) -> None:
    topo, _ = machine(shape)
    free = _subset(data, topo.cpus)
    preferred = _subset(data, topo.cpus) if data.draw(st.booleans()) else frozenset()
    used = ExclusiveUse(_subset(data, frozenset(topo.core_cpus)), _subset(data, frozenset(topo.numa_nodes)))
    n = data.draw(st.integers(1, len(topo.cpus) + 1))
    numa_cpus: dict[int, int] | None = None
    if data.draw(st.booleans()):
        numa_cpus = {k: data.draw(st.integers(0, len(topo.numa_cpus[k]))) for k in topo.numa_nodes}
    call = functools.partial(allocate_cpuset, topo, free, n, bind_policy=policy, required=required,
                             exclusive_policy=exclusive, strategy=strategy, used=used, numa_cpus=numa_cpus,
                             preferred=preferred)
    chosen = _answer(call)
    counted = _answer(functools.partial(call, choose=False))
    event("refused" if isinstance(chosen, str) else "allocated")
    if isinstance(chosen, str):
        assert counted == chosen
    else:
        assert counted == frozenset() and len(chosen) == n and chosen <= free


# -- a node in the cache: filter's verdict and bind's placement ------------------------------------


@dataclass(frozen=True)
class Ask:
    """One pod: whole CPUs (or a fraction for an LS pod), its policies and memory."""

    cpus: int
    shared: bool
    policy: str
    required: bool
    numa: str
    exclusive: str
    memory_gib: int
    tied: bool  # labelled for the node's reservation
    affinity: str  # its reservation-affinity annotation ("" for none)

    def pod(self, name: str) -> dict[str, Any]:
        spec = {"requiredCPUBindPolicy" if self.required else "preferredCPUBindPolicy": self.policy}
        if self.exclusive != keys.EXCLUSIVE_POLICY_NONE:
            spec["preferredCPUExclusivePolicy"] = self.exclusive
        obj = pod(name, cpu=f"{self.cpus * 300}m" if self.shared else str(self.cpus),
                  memory=f"{self.memory_gib}Gi" if self.memory_gib else None, qos="LS" if self.shared else "LSR",
                  resource_spec=spec, numa_policy=self.numa or None, uid=str(uuid.uuid4()))
        if self.tied:
            obj["metadata"]["labels"]["app"] = "web"
        if self.affinity:
            obj["metadata"]["annotations"][keys.ANNOTATION_RESERVATION_AFFINITY] = self.affinity
        return obj


asks = st.builds(
    Ask, st.integers(1, 8), st.sampled_from([False, False, True]), st.sampled_from(BIND_POLICIES), st.booleans(),
    st.sampled_from(NUMA), st.sampled_from(EXCLUSIVE), st.sampled_from([0, 0, 1, 4]),
    st.booleans(), st.sampled_from(["", "", "{}", json.dumps({"name": "r0"})]),
)


@dataclass(frozen=True)
class Resv:
    """A reservation for the pods labelled app=web: its CPUs, allocate policy and order label."""

    cpus: int
    allocate_policy: str
    order: str


@dataclass(frozen=True)
class Node:
    """The node's own inputs: labels, NUMA zones, kubelet's reserved CPUs, reservations."""

    bind_label: str
    numa_label: str
    ratio: str
    zone_quarters: tuple[int, ...] | None
    reservations: tuple[Resv, ...]


nodes = st.builds(
    Node,
    st.sampled_from(["", "", keys.NODE_CPU_BIND_POLICY_FULL_PCPUS_ONLY, keys.NODE_CPU_BIND_POLICY_SPREAD_BY_PCPUS]),
    st.sampled_from(["", "", *NUMA[1:]]),
    st.sampled_from(["", "", '{"cpu": 1.5}']),
    st.one_of(st.none(), st.tuples(st.integers(1, 4), st.integers(1, 4), st.integers(1, 4), st.integers(1, 4))),
    st.lists(st.builds(
        Resv, st.sampled_from([0, 1, 2, 4]),
        st.sampled_from(["", keys.RESERVATION_ALLOCATE_POLICY_ALIGNED, keys.RESERVATION_ALLOCATE_POLICY_RESTRICTED]),
        st.sampled_from(["", "1", "2"]),
    ), max_size=2).map(tuple),
)


def _state(topo: CPUTopology, text: str, spec: Node, reserved: frozenset[int]) -> ClusterState:
    nrt_ann = {}
    if reserved:
        nrt_ann[keys.NODE_ANNOTATION_KUBELET_CPU_MANAGER_POLICY] = json.dumps(
            {"policy": "static", "reservedCPUs": format_cpu_list(reserved)})
    doc = nrt("n", text, annotations=nrt_ann)
    if spec.zone_quarters is not None:
        doc["zones"] = [
            {"name": f"node-{k}", "type": "Node", "resources": [
                {"name": "cpu", "allocatable": f"{len(topo.numa_cpus[k]) * 250 * spec.zone_quarters[i % 4]}m"},
                {"name": "memory", "allocatable": f"{8 * spec.zone_quarters[i % 4]}Gi"}]}
            for i, k in enumerate(topo.numa_nodes)
        ]
    labels = {}
    if spec.bind_label:
        labels[keys.LABEL_CPU_BIND_POLICY] = spec.bind_label
    if spec.numa_label:
        labels[keys.LABEL_NUMA_TOPOLOGY_POLICY] = spec.numa_label
    annotations = {keys.NODE_ANNOTATION_RESOURCE_AMPLIFICATION_RATIO: spec.ratio} if spec.ratio else {}
    state = ClusterState()
    load_objects(state, [node("n", labels=labels, annotations=annotations), doc])
    bindable = sorted(topo.cpus - reserved)
    for i, resv in enumerate(spec.reservations):
        cpus = frozenset(bindable[:resv.cpus])
        bindable = bindable[resv.cpus:]
        obj = reservation(f"r{i}", "n", cpuset=format_cpu_list(cpus) if cpus else None,
                          policy=resv.allocate_policy or None,
                          labels={keys.LABEL_RESERVATION_ORDER: resv.order} if resv.order else None,
                          allocatable={"cpu": str(max(resv.cpus, 1)), "memory": "1Gi"})
        assert state.apply("reservations", "ADDED", obj)
    return state


def _check_one(state: ClusterState, obj: dict[str, Any]) -> bool:
    """Filter's verdict against bind's exact placement for one pod; places it when it fits."""
    req = parse_pod(obj)
    ns = state.nodes["n"]
    with state.lock:
        verdict = evaluate(ns, req, CFG)
        ns.refresh()
        intent = pre_filter(req)
        matched = matched_reservations(ns, req)
        compared = not isinstance(intent, Refusal) and not intent.skip and (
            req.reservation_affinity is None or bool(matched))
        if compared:
            exact, _ = place_on(ns, req, intent, exact=True, matched=matched)
            assert verdict.ok == isinstance(exact, Placed), (verdict, exact)
            if not matched and isinstance(exact, Refusal):  # with reservations bind names the nominated one
                assert (verdict.reason, verdict.unresolvable) == (exact.reason, exact.unresolvable), (verdict, exact)
        if currently_in_test_context():
            event(f"{'passed' if verdict.ok else 'refused'}{'' if compared else ', not compared'}"
                  f"{', with reservations' if matched else ''}")
        if not verdict.ok:
            return False
        placement = plan(ns, req, CFG)  # raises if bind could not allocate what filter passed
        if placement.allocation.cpus:
            assert len(placement.allocation.cpus) == req.cpus
        if not placement.allocation.empty:
            state.hold(obj["metadata"]["uid"], "n", placement.allocation)
    return True


@SETTINGS
@given(shape=st.sampled_from(SHAPES), data=st.data(), spec=nodes, plan_=st.lists(asks, min_size=1, max_size=6))
def test_filter_passes_exactly_when_bind_allocates(
    shape: tuple[int, int, int, int], data: st.DataObject, spec: Node, plan_: list[Ask]
) -> None:
    topo, text = machine(shape)
    reserved = frozenset(data.draw(st.sets(st.sampled_from(sorted(topo.cpus)), max_size=len(topo.cpus) // 4)))
    state = _state(topo, text, spec, reserved)
    for i, ask in enumerate(plan_):
        _check_one(state, ask.pod(f"p{i}"))


def test_bind_nominates_a_reservation_the_pod_fits_in() -> None:
    """Two reservations match; the one nominated by name (r0) reserves no CPU and the node has
    none left outside r1: filter passes through r1, so bind must allocate from r1, not fail."""
    topo, text = machine((1, 1, 1, 1))
    spec = Node("", "", "", None, (Resv(0, "", ""), Resv(1, "", "")))
    state = _state(topo, text, spec, frozenset())
    obj = Ask(1, False, keys.BIND_POLICY_FULL_PCPUS, False, "", keys.EXCLUSIVE_POLICY_NONE, 0, True, "").pod("p")
    assert _check_one(state, obj)
    placement = state.nodes["n"].allocs[obj["metadata"]["uid"]]
    assert (placement.cpus, placement.reservation) == (frozenset({0}), "uid-r1")


def test_a_required_pod_matching_a_reservation_that_reserved_no_cpus_passes_as_bind_places_it() -> None:
    """Found by the property above: a pod with a reservation affinity matches r0 (reserves no CPU)
    and r1 (Restricted, one CPU); it asks for 2 CPUs. Bind nominates r0 and takes the node's CPUs,
    so filter must not refuse it for r1 alone (it did: "Reservation(s) not enough cpus")."""
    topo, text = machine((1, 1, 2, 2))
    spec = Node("", "", "", None, (Resv(0, "", ""), Resv(1, keys.RESERVATION_ALLOCATE_POLICY_RESTRICTED, "")))
    state = _state(topo, text, spec, frozenset())
    obj = Ask(2, False, keys.BIND_POLICY_FULL_PCPUS, False, "", keys.EXCLUSIVE_POLICY_NONE, 0, True, "{}").pod("p")
    assert _check_one(state, obj)
    placement = state.nodes["n"].allocs[obj["metadata"]["uid"]]
    assert len(placement.cpus) == 2 and placement.reservation == "uid-r0"
