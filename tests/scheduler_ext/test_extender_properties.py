"""Property tests: random topologies and request sequences against the cache and allocator.

Invariants checked after every step:

- filter and bind agree: a node that passes ``evaluate`` gets an exact allocation from
  ``plan``, and a node that fails it makes ``plan`` refuse;
- CPUs are bindable, exactly as many as asked, and never overlap another pod's;
- the bind policy holds (required FullPCPUs = whole cores; required SpreadByPCPUs = one CPU per
  core; preferred SpreadByPCPUs takes a core's second thread only once every core of that NUMA
  node gave one, as Koordinator keeps the request on one NUMA node first) and the NUMA policy
  holds (SingleNUMANode = one node; Restricted and SingleNUMANode stay inside the merged hint);
- GPU shares never pass 100% of core or memory ratio, nor the card's memory; unhealthy GPUs
  are never given; under Restricted/SingleNUMANode the CPUs and GPUs share the NUMA affinity.
"""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import dataclass
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from koord_formats.topology import CPUTopology, format_cpu_topology
from scheduler_ext.allocator import AllocationError
from scheduler_ext.extender import ExtenderConfig, evaluate, needs, plan
from scheduler_ext.pods import parse_pod
from scheduler_ext.state import ClusterState, load_objects
from scheduler_ext.topology import synthetic_topology
from tests.scheduler_ext.builders import device, node, nrt, pod

CFG = ExtenderConfig()
# SCHED_EXAMPLES=2000 for a deeper run; 500 by default, as every placement property test
SETTINGS = settings(
    max_examples=int(os.environ.get("SCHED_EXAMPLES", "500")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@st.composite
def topologies(draw: st.DrawFn) -> CPUTopology:
    return synthetic_topology(
        draw(st.integers(1, 2)), draw(st.integers(1, 2)), draw(st.integers(1, 5)), draw(st.integers(1, 2))
    )


@dataclass(frozen=True)
class CPUOp:
    cpus: int
    policy: str
    required: bool
    numa: str
    exclusive: str


cpu_ops = st.builds(
    CPUOp,
    cpus=st.integers(1, 9),
    policy=st.sampled_from(["FullPCPUs", "SpreadByPCPUs"]),
    required=st.booleans(),
    numa=st.sampled_from(["", "BestEffort", "Restricted", "SingleNUMANode"]),
    exclusive=st.sampled_from(["None", "PCPULevel", "NUMANodeLevel"]),
)


def _state(topo: CPUTopology, reserved: frozenset[int], extra: list[dict[str, Any]] = ()) -> ClusterState:  # type: ignore[assignment]
    from koord_formats.cpulist import format_cpu_list

    ann = {"kubelet.koordinator.sh/cpu-manager-policy": json.dumps(
        {"policy": "static", "reservedCPUs": format_cpu_list(reserved)})}
    state = ClusterState()
    load_objects(state, [node("n"), nrt("n", format_cpu_topology(topo), annotations=ann), *extra])
    return state


def _cpu_pod(op: CPUOp) -> dict[str, Any]:
    spec = {"requiredCPUBindPolicy" if op.required else "preferredCPUBindPolicy": op.policy,
            "preferredCPUExclusivePolicy": op.exclusive}
    return pod(f"p-{uuid.uuid4().hex[:6]}", cpu=str(op.cpus), resource_spec=spec,
               numa_policy=op.numa or None)


@SETTINGS
@given(
    topo=topologies(),
    reserve=st.integers(0, 2),
    ops=st.lists(st.one_of(cpu_ops, st.integers(0, 30)), min_size=1, max_size=25),
)
def test_cpu_allocations_respect_policy_and_never_overlap(
    topo: CPUTopology, reserve: int, ops: list[CPUOp | int]
) -> None:
    reserved = frozenset(sorted(topo.cpus)[:reserve])
    state = _state(topo, reserved)
    ns = state.nodes["n"]
    held: list[str] = []
    for op in ops:
        if isinstance(op, int):  # release an earlier pod
            if held:
                state.release(held.pop(op % len(held)), "n")
            continue
        p = _cpu_pod(op)
        req = parse_pod(p)
        with state.lock:
            verdict = evaluate(ns, req, CFG)
            need = needs(ns, req)
            assert not isinstance(need, str)
            free_before = frozenset(ns.free)
            try:
                placement = plan(ns, req, CFG)
            except AllocationError as exc:
                assert not verdict.ok, f"filter passed but bind failed: {exc}"
                continue
            assert verdict.ok, f"filter failed ({verdict.reason}) but bind succeeded"
            got = placement.allocation.cpus
            uid = p["metadata"]["uid"]
            assert len(got) == op.cpus
            assert got <= free_before and not got & reserved
            numa_used = {topo.details[c].node for c in got}
            if need.bind_policy == "FullPCPUs" and need.required:
                assert all(topo.core_cpus[topo.core_of[c]] <= got for c in got)
            if op.numa == "SingleNUMANode":
                assert len(numa_used) == 1
            if op.numa in ("Restricted", "SingleNUMANode") and placement.affinity is not None:
                assert numa_used <= placement.affinity
            if need.bind_policy == "SpreadByPCPUs" and need.required:
                assert len({topo.core_of[c] for c in got}) == len(got)
            elif op.policy == "SpreadByPCPUs" and not op.numa and op.exclusive == "None":
                # a second thread of a core only once every core of its NUMA node gave one
                for c in got:
                    siblings = topo.core_cpus[topo.core_of[c]] & got
                    if len(siblings) > 1:
                        node = topo.details[c].node
                        node_cores = {topo.core_of[x] for x in free_before if topo.details[x].node == node}
                        assert node_cores <= {topo.core_of[x] for x in got}
            state.hold(uid, "n", placement.allocation)
            held.append(uid)
            ns.refresh()
            union: frozenset[int] = frozenset()
            total = 0
            for alloc in ns.allocs.values():
                union |= alloc.cpus
                total += len(alloc.cpus)
            assert len(union) == total, "two pods share a CPU"


@dataclass(frozen=True)
class GPUOp:
    resources: tuple[tuple[str, str], ...]
    cpus: int
    numa: str


gpu_resources = st.one_of(
    st.integers(1, 3).map(lambda n: (("nvidia.com/gpu", str(n)),)),
    st.sampled_from([25, 50, 100, 200]).map(lambda p: (("koordinator.sh/gpu", str(p)),)),
    st.tuples(st.integers(1, 100), st.integers(1, 100)).map(
        lambda cr: (("koordinator.sh/gpu-core", str(cr[0])), ("koordinator.sh/gpu-memory-ratio", str(cr[1])))),
    st.integers(1, 16).map(lambda g: (("koordinator.sh/gpu-core", "20"), ("koordinator.sh/gpu-memory", f"{g}Gi"))),
)
gpu_ops = st.builds(
    GPUOp,
    resources=gpu_resources,
    cpus=st.integers(0, 4),
    numa=st.sampled_from(["", "BestEffort", "Restricted", "SingleNUMANode"]),
)


@SETTINGS
@given(
    gpus=st.integers(1, 8),
    numa_of=st.lists(st.integers(0, 1), min_size=8, max_size=8),
    unhealthy=st.sets(st.integers(0, 7), max_size=2),
    ops=st.lists(gpu_ops, min_size=1, max_size=20),
)
def test_gpu_shares_stay_within_cards_and_numa_policy(
    gpus: int, numa_of: list[int], unhealthy: set[int], ops: list[GPUOp]
) -> None:
    topo = synthetic_topology(2, 1, 4, 2)
    dev = device("n", gpus, numa_of=numa_of[:gpus], unhealthy=sorted(unhealthy), memory="16Gi")
    state = _state(topo, frozenset(), [dev])
    ns = state.nodes["n"]
    for op in ops:
        p = pod(f"g-{uuid.uuid4().hex[:6]}", cpu=str(op.cpus) if op.cpus else "100m",
                qos="LSR" if op.cpus else "LS", extra=dict(op.resources), numa_policy=op.numa or None)
        req = parse_pod(p)
        if req.error:
            continue
        with state.lock:
            verdict = evaluate(ns, req, CFG)
            try:
                placement = plan(ns, req, CFG)
            except AllocationError as exc:
                assert not verdict.ok, f"filter passed but bind failed: {exc}"
                continue
            assert verdict.ok
            alloc = placement.allocation
            assert req.gpu is not None and len(alloc.gpus) == req.gpu.count
            assert len({g.minor for g in alloc.gpus}) == req.gpu.count
            assert not {g.minor for g in alloc.gpus} & unhealthy
            gpu_numa = {numa_of[g.minor] for g in alloc.gpus}
            cpu_numa = {topo.details[c].node for c in alloc.cpus} | set(alloc.numa)
            if op.numa in ("Restricted", "SingleNUMANode"):
                assert placement.affinity is not None
                assert gpu_numa | cpu_numa <= placement.affinity
            if op.numa == "SingleNUMANode":
                assert len(gpu_numa | cpu_numa) == 1
            state.hold(p["metadata"]["uid"], "n", alloc)
            ns.refresh()
            for g in ns.gpus:
                used = ns.gpu_usage.get(g.minor)
                if used is None:
                    continue
                assert used.core <= 100 and used.ratio <= 100 and used.memory <= g.memory
