"""Property tests of Koordinator's placement rules, 500 examples each.

- no CPU is ever given twice (pods placed one after another through ``extender.plan``);
- no NUMA zone is ever booked past its allocatable (CPU and memory, through ``extender.plan``);
- FullPCPUs takes whole cores only: always when required, and when preferred whenever the whole
  free cores can hold the request;
- SpreadByPCPUs never takes two threads of one core: never when required; when preferred, a
  core's second thread only once every core of that NUMA node with a free CPU gave one
  (Koordinator keeps the request on one NUMA node before spreading over the machine);
- when every NUMA node of a hint has room for an even share, the shares differ by at most one
  core (``tryBestToDistributeEvenly``);
- with a Reservation on the node (any cpuset, NUMA amounts, allocate policy, pods that match it
  or not, require it or not): still no CPU twice, only pods allocated from the reservation take
  its CPUs, and per NUMA node the pods outside it plus the larger of the reservation and its
  pods never pass the zone's allocatable.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from koord_formats.cpulist import format_cpu_list, parse_cpu_list
from koord_formats.quantity import parse_cpu_milli
from koord_formats.topology import CPUTopology, format_cpu_topology
from scheduler_ext.accumulator import AllocationError, allocate_cpuset
from scheduler_ext.extender import ExtenderConfig, plan
from scheduler_ext.numa import distribute_evenly
from scheduler_ext.pods import parse_pod
from scheduler_ext.state import ClusterState, load_objects
from scheduler_ext.topology import synthetic_topology
from tests.scheduler_ext.builders import GiB, node, nrt, pod, reservation

SETTINGS = settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
CFG = ExtenderConfig()


@st.composite
def topologies(draw: st.DrawFn) -> CPUTopology:
    return synthetic_topology(draw(st.integers(1, 2)), draw(st.integers(1, 2)), draw(st.integers(1, 4)),
                              draw(st.integers(1, 2)))


@st.composite
def machines(draw: st.DrawFn) -> tuple[CPUTopology, frozenset[int]]:
    """A topology and the CPUs still free on it."""
    topo = draw(topologies())
    taken = draw(st.sets(st.sampled_from(sorted(topo.cpus)), max_size=len(topo.cpus) // 2))
    return topo, topo.cpus - frozenset(taken)


def _whole_cores(topo: CPUTopology, cpus: frozenset[int]) -> bool:
    return all(topo.core_cpus[topo.core_of[c]] <= cpus for c in cpus)


@SETTINGS
@given(machine=machines(), cores=st.integers(1, 8), required=st.booleans(),
       strategy=st.sampled_from(["LeastAllocated", "MostAllocated"]))
def test_full_pcpus_takes_whole_cores_only(
    machine: tuple[CPUTopology, frozenset[int]], cores: int, required: bool, strategy: str
) -> None:
    topo, free = machine
    n = cores * topo.cpus_per_core
    whole = frozenset(c for c in free if topo.core_cpus[topo.core_of[c]] <= free)
    try:
        got = allocate_cpuset(topo, free, n, bind_policy="FullPCPUs", required=required, strategy=strategy)
    except AllocationError:
        assert len(whole) < n if required else len(free) < n
        return
    assert len(got) == n and got <= free
    if required or len(whole) >= n:
        assert _whole_cores(topo, got)


@SETTINGS
@given(machine=machines(), n=st.integers(1, 12), required=st.booleans(),
       strategy=st.sampled_from(["LeastAllocated", "MostAllocated"]))
def test_spread_by_pcpus_never_doubles_a_core_while_one_is_free(
    machine: tuple[CPUTopology, frozenset[int]], n: int, required: bool, strategy: str
) -> None:
    topo, free = machine
    try:
        got = allocate_cpuset(topo, free, n, bind_policy="SpreadByPCPUs", required=required, strategy=strategy)
    except AllocationError:
        cores_with_free = {topo.core_of[c] for c in free}
        assert (len(cores_with_free) if required else len(free)) < n
        return
    assert len(got) == n and got <= free
    got_cores = {topo.core_of[c] for c in got}
    if required:
        assert len(got_cores) == n
        return
    for c in got:
        if len(topo.core_cpus[topo.core_of[c]] & got) > 1:
            node_id = topo.details[c].node
            assert {topo.core_of[x] for x in free if topo.details[x].node == node_id} <= got_cores


@SETTINGS
@given(nodes=st.integers(2, 4), per_core=st.integers(1, 2), cores=st.integers(1, 24),
       full=st.booleans(), slack=st.lists(st.integers(0, 6), min_size=4, max_size=4))
def test_even_split_differs_by_at_most_one_core(
    nodes: int, per_core: int, cores: int, full: bool, slack: list[int]
) -> None:
    cpus = cores * per_core if full else cores
    unit = per_core if full else 1
    share = -(-cpus // nodes)  # the even share, rounded up to whole cores when required
    share = -(-share // unit) * unit
    available = {n: {"cpu": (share + slack[n] * unit) * 1000} for n in range(nodes)}
    split = distribute_evenly({"cpu": cpus * 1000}, available, frozenset(range(nodes)), cpu_bind=True,
                              full_cores=per_core if full else 0)
    assert not split.reasons
    shares = [split.per_node.get(n, {}).get("cpu", 0) // 1000 for n in range(nodes)]
    assert sum(shares) == cpus
    assert max(shares) - min(shares) <= per_core
    assert all(s % unit == 0 for s in shares)


def _cluster(topo: CPUTopology, zones: list[dict[str, Any]] | None, *extra: dict[str, Any]) -> ClusterState:
    doc = nrt("n", format_cpu_topology(topo))
    if zones is not None:
        doc["zones"] = zones
    state = ClusterState()
    assert load_objects(state, [node("n"), doc, *extra]) == []
    return state


pod_ops = st.tuples(
    st.integers(1, 6),  # CPUs (whole) or tenths of a CPU for shared pods
    st.sampled_from(["LSR", "LS"]),
    st.sampled_from(["", "BestEffort", "Restricted", "SingleNUMANode"]),
    st.sampled_from(["FullPCPUs", "SpreadByPCPUs"]),
    st.booleans(),  # required
    st.integers(0, 6),  # memory GiB
)


def _pod(op: tuple[int, str, str, str, bool, int]) -> dict[str, Any]:
    amount, qos, numa_policy, policy, required, mem = op
    spec = {"requiredCPUBindPolicy" if required else "preferredCPUBindPolicy": policy}
    cpu = str(amount) if qos == "LSR" else f"{amount * 300}m"
    return pod(f"p-{uuid.uuid4().hex[:8]}", cpu=cpu, memory=f"{mem}Gi" if mem else None, qos=qos,
               resource_spec=spec, numa_policy=numa_policy or None)


@SETTINGS
@given(topo=topologies(), ops=st.lists(pod_ops, min_size=1, max_size=6))
def test_no_cpu_is_given_twice(topo: CPUTopology, ops: list[tuple[int, str, str, str, bool, int]]) -> None:
    state = _cluster(topo, None)
    ns = state.nodes["n"]
    for op in ops:
        p = _pod(op)
        with state.lock:
            try:
                placement = plan(ns, parse_pod(p), CFG)
            except AllocationError:
                continue
            state.hold(p["metadata"]["uid"], "n", placement.allocation)
            ns.refresh()
            seen: set[int] = set()
            for alloc in ns.allocs.values():
                assert not alloc.cpus & seen, "two pods share a CPU"
                seen |= alloc.cpus
            assert seen <= ns.bindable


@SETTINGS
@given(topo=topologies(), cpu_frac=st.lists(st.integers(1, 4), min_size=4, max_size=4),
       mem=st.lists(st.integers(1, 12), min_size=4, max_size=4), ops=st.lists(pod_ops, min_size=1, max_size=6))
def test_no_numa_zone_is_booked_past_its_allocatable(
    topo: CPUTopology, cpu_frac: list[int], mem: list[int], ops: list[tuple[int, str, str, str, bool, int]]
) -> None:
    zones = []
    limit: dict[int, tuple[int, int]] = {}
    for i, n in enumerate(topo.numa_nodes):
        cpu_milli = len(topo.numa_cpus[n]) * 1000 * cpu_frac[i] // 4
        limit[n] = (cpu_milli, mem[i] * GiB)
        zones.append({"name": f"node-{n}", "type": "Node", "resources": [
            {"name": "cpu", "allocatable": f"{cpu_milli}m"}, {"name": "memory", "allocatable": f"{mem[i]}Gi"}]})
    state = _cluster(topo, zones)
    ns = state.nodes["n"]
    for op in ops:
        p = _pod(op)
        with state.lock:
            try:
                placement = plan(ns, parse_pod(p), CFG)
            except AllocationError:
                continue
            state.hold(p["metadata"]["uid"], "n", placement.allocation)
            ns.refresh()
            cpu: dict[int, int] = {}
            memory: dict[int, int] = {}
            for alloc in ns.allocs.values():
                for n, v in alloc.numa.items():
                    cpu[n] = cpu.get(n, 0) + v
                for n, v in alloc.numa_memory.items():
                    memory[n] = memory.get(n, 0) + v
            for n, (cpu_limit, mem_limit) in limit.items():
                assert cpu.get(n, 0) <= cpu_limit, json.dumps(cpu)
                assert memory.get(n, 0) <= mem_limit, json.dumps(memory)


# -- the same invariants with a Reservation on the node --------------------------------------------

RESERVATION_UID = "uid-r"


@st.composite
def reservations(draw: st.DrawFn, topo: CPUTopology) -> dict[str, Any]:
    """A Reservation on node "n" holding some of ``topo``'s CPUs (as a whole-or-partial cpuset)
    under any allocate policy, allocate-once or not."""
    reserved = draw(st.sets(st.sampled_from(sorted(topo.cpus)), max_size=max(1, len(topo.cpus) // 2)))
    return reservation(
        "r", "n", cpuset=format_cpu_list(frozenset(reserved)) if reserved else None,
        policy=draw(st.sampled_from(["", "Aligned", "Restricted"])), allocate_once=draw(st.booleans()),
        uid=RESERVATION_UID,
    )


reservation_ops = st.tuples(pod_ops, st.booleans(), st.booleans())  # the pod, matches, requires a reservation


def _reservation_pod(op: tuple[tuple[int, str, str, str, bool, int], bool, bool]) -> dict[str, Any]:
    base, matches, requires = op
    p = _pod(base)
    if matches:
        p["metadata"]["labels"]["app"] = "web"
    if requires:
        p["metadata"]["annotations"]["scheduling.koordinator.sh/reservation-affinity"] = "{}"
    return p


def _place_all(state: ClusterState, ops: list[Any], check: Any) -> None:
    ns = state.nodes["n"]
    for op in ops:
        p = _reservation_pod(op)
        with state.lock:
            try:
                placement = plan(ns, parse_pod(p), CFG)
            except AllocationError:
                continue
            state.hold(p["metadata"]["uid"], "n", placement.allocation)
            ns.refresh()
            check(ns)


@SETTINGS
@given(data=st.data(), topo=topologies(), ops=st.lists(reservation_ops, min_size=1, max_size=6))
def test_no_cpu_is_given_twice_with_a_reservation(data: st.DataObject, topo: CPUTopology, ops: list[Any]) -> None:
    resv = data.draw(reservations(topo))
    reserved = cpus_of(resv)
    state = _cluster(topo, None, resv)

    def check(ns: Any) -> None:
        seen: set[int] = set()
        for alloc in ns.allocs.values():
            assert not alloc.cpus & seen, "two pods share a CPU"
            seen |= alloc.cpus
            if alloc.cpus & reserved:  # only a pod allocated from the reservation takes its CPUs
                assert alloc.reservation == RESERVATION_UID
        assert seen <= ns.bindable

    _place_all(state, ops, check)


@SETTINGS
@given(data=st.data(), topo=topologies(), cpu_frac=st.lists(st.integers(1, 4), min_size=4, max_size=4),
       mem=st.lists(st.integers(1, 12), min_size=4, max_size=4), ops=st.lists(reservation_ops, min_size=1, max_size=6))
def test_no_numa_zone_is_booked_past_its_allocatable_with_a_reservation(
    data: st.DataObject, topo: CPUTopology, cpu_frac: list[int], mem: list[int], ops: list[Any]
) -> None:
    """A reservation and the pods allocated from it count as the larger of the two per NUMA node."""
    zones = []
    limit: dict[int, tuple[int, int]] = {}
    numa: dict[int, dict[str, str]] = {}
    for i, n in enumerate(topo.numa_nodes):
        cpu_milli = len(topo.numa_cpus[n]) * 1000 * cpu_frac[i] // 4
        limit[n] = (cpu_milli, mem[i] * GiB)
        zones.append({"name": f"node-{n}", "type": "Node", "resources": [
            {"name": "cpu", "allocatable": f"{cpu_milli}m"}, {"name": "memory", "allocatable": f"{mem[i]}Gi"}]})
        share = data.draw(st.integers(0, 4))
        mem_share = data.draw(st.integers(0, mem[i]))
        if share or mem_share:
            numa[n] = {"cpu": f"{cpu_milli * share // 4}m", "memory": f"{mem_share}Gi"}
    resv = reservation("r", "n", numa=numa, policy=data.draw(st.sampled_from(["", "Aligned", "Restricted"])),
                       allocate_once=data.draw(st.booleans()), uid=RESERVATION_UID)
    reserved = {n: (parse_cpu_milli(a["cpu"]), int(a["memory"][:-2]) * GiB) for n, a in numa.items()}
    state = _cluster(topo, zones, resv)

    def check(ns: Any) -> None:
        outside: dict[int, list[int]] = {}
        inside: dict[int, list[int]] = {}
        for alloc in ns.allocs.values():
            into = inside if alloc.reservation == RESERVATION_UID else outside
            for n, v in alloc.numa.items():
                into.setdefault(n, [0, 0])[0] += v
            for n, v in alloc.numa_memory.items():
                into.setdefault(n, [0, 0])[1] += v
        for n, (cpu_limit, mem_limit) in limit.items():
            r_cpu, r_mem = reserved.get(n, (0, 0))
            in_cpu, in_mem = inside.get(n, [0, 0])
            out_cpu, out_mem = outside.get(n, [0, 0])
            assert out_cpu + max(in_cpu, r_cpu) <= cpu_limit
            assert out_mem + max(in_mem, r_mem) <= mem_limit

    _place_all(state, ops, check)


def cpus_of(resv: dict[str, Any]) -> frozenset[int]:
    text = resv["metadata"]["annotations"].get("scheduling.koordinator.sh/resource-status")
    return parse_cpu_list(json.loads(text).get("cpuset", "")) if text else frozenset()
