"""Placement invariants through the HTTP verbs, 500 examples each.

Each example builds a node (Node + NodeResourceTopology), serves the real ASGI app of
``scheduler_ext.server.create_app`` in process (no socket: the test drives the ASGI calls) and
schedules a sequence of pods as kube-scheduler does: ``POST /filter``, ``POST /prioritize``,
then ``POST /bind`` when the node passed. The bind talks to ``FakeBindAPI`` below; the pod it
bound is then fed back as the watch event that confirms it, so the next pod sees the
allocation as rebuilt from the annotations the bind wrote. Every check reads those written
annotations (``resource-status``, ``reservation-allocated``), never the extender's internals:

- no CPU is allocated twice, and none outside the bindable CPUs;
- no NUMA zone is booked past its allocatable (CPU and memory);
- FullPCPUs takes whole cores only: always when required, and when preferred whenever the
  request is whole cores and the free whole cores can hold it;
- SpreadByPCPUs never takes two threads of one core: never when required; when preferred, a
  core's second thread only once every core of that NUMA node with a free CPU gave one
  (Koordinator keeps the request on one NUMA node before spreading over the machine);
- when every NUMA node the pod was split over had room for an even share, the shares differ
  by at most one core (``tryBestToDistributeEvenly``);
- under Required NUMA exclusivity (``singleNUMANodeExclusive``, the default when the pod names a
  policy) a Restricted or SingleNUMANode pod booked on several NUMA nodes uses none that only
  one-node cpusets used, and a SingleNUMANode pod's one NUMA node held no spanning cpuset;
- with a Reservation on the node (any cpuset, owners by label or controller reference, allocate
  policy, allocate-once or not; fed as a watch event), pods that match it, require it through
  ``reservation-affinity`` or do neither: still no CPU twice and none outside the bindable CPUs,
  and a pod given CPUs of the reservation's cpuset carries ``reservation-allocated`` naming it
  (no other pod gets them);
- with a Reservation booking NUMA amounts (and maybe a cpuset inside them): per NUMA node, the
  pods outside it plus the larger of the reservation and the pods allocated from it (by their
  ``reservation-allocated``) never pass the zone's allocatable (CPU and memory), as
  "Deliberate differences" in ``scheduler_ext/README.md`` states.

Filter and bind must also agree: a node that passes filter is bound without error.

Topologies are small (up to 2 sockets x 2 NUMA x 4 cores x 2 threads), with one 104-CPU
two-socket machine among them except under a Reservation; each topology's annotation text is
built once.
"""

from __future__ import annotations

import asyncio
import functools
import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import orjson
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from koord_formats import keys
from koord_formats.cpulist import format_cpu_list
from koord_formats.pod import parse_resource_status
from koord_formats.quantity import parse_cpu_milli
from koord_formats.reservation import ReservationAllocated, parse_reservation_allocated
from koord_formats.topology import CPUTopology, format_cpu_topology
from scheduler_ext.errors import ConflictError, NotFoundError
from scheduler_ext.extender import Binder, ExtenderConfig
from scheduler_ext.ledger import LeaseLedger
from scheduler_ext.numa import numa_node_states
from scheduler_ext.server import create_app
from scheduler_ext.state import KINDS, ClusterState, load_objects
from scheduler_ext.topology import synthetic_topology
from scheduler_ext.trust import TRUST_ALL, Signer, Trust
from tests.scheduler_ext.builders import GiB, node, nrt, pod, reservation

SETTINGS = settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
CFG = ExtenderConfig()
NODE = "n"

# (sockets, NUMA nodes per socket, cores per NUMA node, threads per core); the last one is the
# two-socket machine of 104 CPUs
SHAPES = [
    (s, n, c, t) for s in (1, 2) for n in (1, 2) for c in (1, 2, 3, 4) for t in (1, 2)
] + [(2, 1, 26, 2)]


@functools.cache
def machine(shape: tuple[int, int, int, int]) -> tuple[CPUTopology, str]:
    topo = synthetic_topology(*shape)
    return topo, format_cpu_topology(topo)


shapes = st.sampled_from(SHAPES)
multi_numa_shapes = st.sampled_from([s for s in SHAPES if s[0] * s[1] > 1])


class FakeBindAPI:
    """The API calls of a bind, against a dictionary of pods (``extender.BindAPI``)."""

    def __init__(self) -> None:
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.rv = 0

    def add(self, obj: dict[str, Any]) -> None:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        self.pods[(obj["metadata"]["namespace"], obj["metadata"]["name"])] = obj

    async def get_pod(self, namespace: str, name: str) -> dict[str, Any]:
        found = self.pods.get((namespace, name))
        if found is None:
            raise NotFoundError(404, f"pod {namespace}/{name} not found")
        return found

    async def patch_pod_annotations(
        self, namespace: str, name: str, annotations: Mapping[str, str | None], resource_version: str
    ) -> dict[str, Any]:
        obj = await self.get_pod(namespace, name)
        meta = obj["metadata"]
        assert meta["resourceVersion"] == resource_version
        merged = dict(meta.get("annotations") or {})
        for k, v in annotations.items():
            if v is None:
                merged.pop(k, None)
            else:
                merged[k] = v
        meta["annotations"] = merged
        self.rv += 1
        meta["resourceVersion"] = str(self.rv)
        return obj

    async def bind_pod(
        self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str], resource_version: str
    ) -> None:
        """As kube-apiserver's BindingREST: UID and resourceVersion preconditions, then the node
        and the Binding's annotations in one write."""
        obj = await self.get_pod(namespace, name)
        assert obj["metadata"]["uid"] == uid
        if resource_version and resource_version != obj["metadata"]["resourceVersion"]:
            raise ConflictError(409, "the object has been modified")
        assert not obj["spec"].get("nodeName")
        obj["spec"]["nodeName"] = node
        obj["metadata"]["annotations"] = {**(obj["metadata"].get("annotations") or {}), **annotations}
        obj["status"]["phase"] = "Running"
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)

    async def aclose(self) -> None:
        return None


@dataclass(frozen=True)
class Bound:
    """What one bind wrote: the cpuset and the NUMA split (node -> cpu milli, memory bytes)."""

    cpus: frozenset[int]
    numa_cpu: Mapping[int, int]
    numa_memory: Mapping[int, int]
    reservation: ReservationAllocated | None = None  # its written ``reservation-allocated``


def _milli(value: Fraction) -> int:
    return int(value * 1000)


class Cluster:
    """One node served by the extender's ASGI app; ``schedule`` runs a pod through the verbs."""

    def __init__(self, objects: list[dict[str, Any]], trust: Trust = TRUST_ALL) -> None:
        self.state = ClusterState(trust)
        assert load_objects(self.state, objects) == []
        self.api = FakeBindAPI()
        self.app = create_app(self.state, Binder(self.state, self.api, CFG), CFG)
        self.bound: list[Bound] = []

    async def post(self, path: str, body: Mapping[str, Any]) -> Any:
        return await _post(self.app, path, body)

    async def schedule(self, obj: dict[str, Any]) -> Bound | None:
        """filter, prioritize and (when the node passed) bind; ``None`` when filtered out."""
        self.api.add(obj)
        ask = {"Pod": obj, "NodeNames": [NODE]}
        verdict = await self.post("/filter", ask)
        assert verdict["Error"] == ""
        scores = await self.post("/prioritize", ask)
        assert [s["Host"] for s in scores] == [NODE] and 0 <= scores[0]["Score"] <= 10
        if NODE not in (verdict["NodeNames"] or []):
            reasons = {**verdict["FailedNodes"], **verdict["FailedAndUnresolvableNodes"]}
            assert reasons.get(NODE), verdict
            return None
        meta = obj["metadata"]
        reply = await self.post(
            "/bind", {"PodName": meta["name"], "PodNamespace": meta["namespace"], "PodUID": meta["uid"], "Node": NODE}
        )
        assert reply["Error"] == "", f"filter passed but bind failed: {reply['Error']}"
        assert self.state.apply("pods", "MODIFIED", obj)  # the watch confirms the bind
        written = obj["metadata"]["annotations"]
        text = written.get(keys.ANNOTATION_RESOURCE_STATUS)
        allocated = written.get(keys.ANNOTATION_RESERVATION_ALLOCATED)
        from_reservation = parse_reservation_allocated(allocated) if allocated else None
        if not text:
            out = Bound(frozenset(), {}, {}, from_reservation)
        else:
            status = parse_resource_status(text)
            out = Bound(
                status.cpuset,
                {r.node: _milli(r.resources["cpu"]) for r in status.numa_node_resources if r.resources.get("cpu")},
                {r.node: int(r.resources["memory"]) for r in status.numa_node_resources if r.resources.get("memory")},
                from_reservation,
            )
        self.bound.append(out)
        return out

    def taken(self) -> frozenset[int]:
        out: frozenset[int] = frozenset()
        for b in self.bound:
            out |= b.cpus
        return out


def run(cluster: Cluster, pods: list[dict[str, Any]], check: Any) -> None:
    """Schedule ``pods`` in order; ``check(obj, before, bound)`` after each successful bind,
    with the CPUs taken before it."""

    async def scenario() -> None:
        for obj in pods:
            before = cluster.taken()
            got = await cluster.schedule(obj)
            if got is not None:
                check(obj, before, got)

    asyncio.run(scenario())


def _kubelet_reserved(reserved: frozenset[int]) -> dict[str, str]:
    if not reserved:
        return {}
    return {"kubelet.koordinator.sh/cpu-manager-policy": json.dumps(
        {"policy": "static", "reservedCPUs": format_cpu_list(reserved)})}


def _zones(
    topo: CPUTopology, cpu_quarters: list[int], mem_gib: list[int]
) -> tuple[list[dict[str, Any]], dict[int, tuple[int, int]]]:
    zones: list[dict[str, Any]] = []
    limits: dict[int, tuple[int, int]] = {}
    for i, n in enumerate(topo.numa_nodes):
        cpu_milli = len(topo.numa_cpus[n]) * 1000 * cpu_quarters[i] // 4
        limits[n] = (cpu_milli, mem_gib[i] * GiB)
        zones.append({"name": f"node-{n}", "type": "Node", "resources": [
            {"name": "cpu", "allocatable": f"{cpu_milli}m"}, {"name": "memory", "allocatable": f"{mem_gib[i]}Gi"}]})
    return zones, limits


def _cluster(text: str, *, reserved: frozenset[int] = frozenset(), zones: list[dict[str, Any]] | None = None,
             strategy: str = "", reservation: dict[str, Any] | None = None) -> Cluster:
    doc = nrt(NODE, text, annotations=_kubelet_reserved(reserved))
    if zones is not None:
        doc["zones"] = zones
    labels = {keys.LABEL_NUMA_ALLOCATE_STRATEGY: strategy} if strategy else {}
    cluster = Cluster([node(NODE, labels=labels), doc])
    if reservation is not None:  # as the Reservation watch delivers it
        assert cluster.state.apply("reservations", "ADDED", reservation)
    return cluster


@dataclass(frozen=True)
class Op:
    cpus: int
    shared: bool  # an LS pod with a fractional CPU request (no cpuset)
    policy: str
    required: bool
    numa: str
    exclusive: str
    memory_gib: int
    numa_exclusive: str = ""  # singleNUMANodeExclusive, "" to leave it out


    def pod(self, i: int) -> dict[str, Any]:
        spec = {"requiredCPUBindPolicy" if self.required else "preferredCPUBindPolicy": self.policy}
        if self.exclusive != "None":
            spec["preferredCPUExclusivePolicy"] = self.exclusive
        return pod(
            f"p{i}",
            cpu=f"{self.cpus * 300}m" if self.shared else str(self.cpus),
            memory=f"{self.memory_gib}Gi" if self.memory_gib else None,
            qos="LS" if self.shared else "LSR",
            resource_spec=spec,
            numa_policy=self.numa or None,
            annotations=self._numa_spec(),
            uid=str(uuid.uuid4()),  # never reused: the extender memoises decoded pods by UID and version
        )


    def _numa_spec(self) -> dict[str, str] | None:
        if not self.numa_exclusive:
            return None  # the builder writes the policy alone
        doc = {"numaTopologyPolicy": self.numa, "singleNUMANodeExclusive": self.numa_exclusive}
        return {keys.ANNOTATION_NUMA_TOPOLOGY_SPEC: json.dumps(doc)}


RARELY = st.sampled_from([False, False, False, True])
BOOLS = st.booleans()
SMALL = st.integers(1, 8)
NO_MEMORY = st.just(0)
NUMA_POLICIES = ["", "BestEffort", "Restricted", "SingleNUMANode"]


def ops(
    *,
    cpus: st.SearchStrategy[int] = SMALL,
    policies: tuple[str, ...] = ("FullPCPUs", "SpreadByPCPUs"),
    required: st.SearchStrategy[bool] = BOOLS,
    numa: Sequence[str] = NUMA_POLICIES,
    exclusive: Sequence[str] = ("None", "PCPULevel", "NUMANodeLevel"),
    shared: st.SearchStrategy[bool] = BOOLS,
    memory: st.SearchStrategy[int] = NO_MEMORY,
    max_size: int = 6,
    numa_exclusive: Sequence[str] = ("",),
) -> st.SearchStrategy[list[Op]]:
    op = st.builds(Op, cpus, shared, st.sampled_from(policies), required, st.sampled_from(numa),
                   st.sampled_from(exclusive), memory, numa_exclusive=st.sampled_from(numa_exclusive))
    return st.lists(op, min_size=1, max_size=max_size)


def _reserved(data: st.DataObject, topo: CPUTopology) -> frozenset[int]:
    ids = sorted(topo.cpus)
    return frozenset(data.draw(st.sets(st.sampled_from(ids), max_size=min(4, len(ids) // 2))))


@SETTINGS
@given(shape=shapes, data=st.data(), plan=ops())
def test_verbs_never_allocate_a_cpu_twice(
    shape: tuple[int, int, int, int], data: st.DataObject, plan: list[Op]
) -> None:
    topo, text = machine(shape)
    reserved = _reserved(data, topo)
    cluster = _cluster(text, reserved=reserved)
    bindable = topo.cpus - reserved

    def check(obj: dict[str, Any], before: frozenset[int], got: Bound) -> None:
        assert not got.cpus & before, "two pods share a CPU"
        assert got.cpus <= bindable

    run(cluster, [op.pod(i) for i, op in enumerate(plan)], check)


@SETTINGS
@given(shape=shapes, cpu_quarters=st.lists(st.integers(1, 4), min_size=4, max_size=4),
       mem=st.lists(st.integers(1, 12), min_size=4, max_size=4),
       plan=ops(numa=["BestEffort", "Restricted", "SingleNUMANode", ""], memory=st.integers(0, 6)))
def test_verbs_never_book_a_numa_zone_past_its_allocatable(
    shape: tuple[int, int, int, int], cpu_quarters: list[int], mem: list[int], plan: list[Op]
) -> None:
    topo, text = machine(shape)
    zones, limits = _zones(topo, cpu_quarters, mem)
    cluster = _cluster(text, zones=zones)

    def check(obj: dict[str, Any], before: frozenset[int], got: Bound) -> None:
        for n, (cpu_limit, mem_limit) in limits.items():
            assert sum(b.numa_cpu.get(n, 0) for b in cluster.bound) <= cpu_limit
            assert sum(b.numa_memory.get(n, 0) for b in cluster.bound) <= mem_limit
        assert set(got.numa_cpu) | set(got.numa_memory) <= set(limits)

    run(cluster, [op.pod(i) for i, op in enumerate(plan)], check)


def _whole(topo: CPUTopology, cpus: frozenset[int]) -> frozenset[int]:
    return frozenset(c for c in cpus if topo.core_cpus[topo.core_of[c]] <= cpus)


@SETTINGS
@given(shape=shapes, data=st.data(), strategy=st.sampled_from(["", "LeastAllocated", "MostAllocated"]),
       plan=ops(policies=("FullPCPUs", "FullPCPUs", "SpreadByPCPUs"), numa=[""], exclusive=["None"], shared=RARELY))
def test_verbs_full_pcpus_takes_whole_cores_only(
    shape: tuple[int, int, int, int], data: st.DataObject, strategy: str, plan: list[Op]
) -> None:
    topo, text = machine(shape)
    reserved = _reserved(data, topo)
    cluster = _cluster(text, reserved=reserved, strategy=strategy)
    bindable = topo.cpus - reserved
    policies = {f"p{i}": op for i, op in enumerate(plan)}

    def check(obj: dict[str, Any], before: frozenset[int], got: Bound) -> None:
        op = policies[obj["metadata"]["name"]]
        if op.shared or op.policy != "FullPCPUs":
            return
        whole_free = _whole(topo, bindable - before)
        if op.required or (op.cpus % topo.cpus_per_core == 0 and len(whole_free) >= op.cpus):
            event("whole cores checked")
            assert _whole(topo, got.cpus) == got.cpus, f"partial core in {format_cpu_list(got.cpus)}"

    run(cluster, [op.pod(i) for i, op in enumerate(plan)], check)


@SETTINGS
@given(shape=shapes, data=st.data(), strategy=st.sampled_from(["", "LeastAllocated", "MostAllocated"]),
       plan=ops(policies=("SpreadByPCPUs", "SpreadByPCPUs", "FullPCPUs"), numa=[""], exclusive=["None"], shared=RARELY))
def test_verbs_spread_by_pcpus_never_doubles_a_core_while_one_is_free(
    shape: tuple[int, int, int, int], data: st.DataObject, strategy: str, plan: list[Op]
) -> None:
    topo, text = machine(shape)
    reserved = _reserved(data, topo)
    cluster = _cluster(text, reserved=reserved, strategy=strategy)
    bindable = topo.cpus - reserved
    policies = {f"p{i}": op for i, op in enumerate(plan)}

    def check(obj: dict[str, Any], before: frozenset[int], got: Bound) -> None:
        op = policies[obj["metadata"]["name"]]
        if op.shared or op.policy != "SpreadByPCPUs":
            return
        cores = {topo.core_of[c] for c in got.cpus}
        event("spread checked")
        if op.required:
            assert len(cores) == len(got.cpus), f"two threads of a core in {format_cpu_list(got.cpus)}"
            return
        free = bindable - before
        for c in got.cpus:
            if len(topo.core_cpus[topo.core_of[c]] & got.cpus) > 1:
                numa_node = topo.details[c].node
                assert {topo.core_of[x] for x in free if topo.details[x].node == numa_node} <= cores

    run(cluster, [op.pod(i) for i, op in enumerate(plan)], check)


@SETTINGS
@given(shape=multi_numa_shapes, cpu_quarters=st.lists(st.integers(2, 4), min_size=4, max_size=4),
       fillers=ops(cpus=st.integers(1, 4), numa=["", "BestEffort", "Restricted"], exclusive=["None"], max_size=3),
       data=st.data())
def test_verbs_split_evenly_when_every_hinted_numa_node_has_room(
    shape: tuple[int, int, int, int], cpu_quarters: list[int], fillers: list[Op], data: st.DataObject
) -> None:
    """A few small pods, then pods up to the machine's size with a NUMA policy (most span
    several NUMA nodes)."""
    topo, text = machine(shape)
    wide = data.draw(ops(cpus=st.integers(2, len(topo.cpus)), shared=RARELY, numa=["BestEffort", "Restricted"],
                         exclusive=["None"], max_size=2, numa_exclusive=["Preferred"]))
    plan = fillers[:1] + wide + fillers[1:]
    topo, text = machine(shape)
    zones, limits = _zones(topo, cpu_quarters, [64] * 4)
    cluster = _cluster(text, zones=zones)
    per_core = topo.cpus_per_core
    policies = {f"p{i}": op for i, op in enumerate(plan)}

    def check(obj: dict[str, Any], before: frozenset[int], got: Bound) -> None:
        event(f"numa nodes {len(got.numa_cpu)}")
        if len(got.numa_cpu) < 2:
            return
        op = policies[obj["metadata"]["name"]]
        request = op.cpus * 300 if op.shared else op.cpus * 1000
        unit = per_core * 1000 if (not op.shared and op.required and op.policy == "FullPCPUs") else 1000
        share = -(-request // len(got.numa_cpu))
        share = -(-share // unit) * unit
        booked = {n: sum(b.numa_cpu.get(n, 0) for b in cluster.bound[:-1]) for n in limits}
        free = topo.cpus - before
        for n in got.numa_cpu:
            room = limits[n][0] - booked[n]
            if not op.shared:
                in_node = free & topo.numa_cpus[n]
                if op.required and op.policy == "FullPCPUs":
                    in_node = _whole(topo, in_node)
                elif op.required:
                    in_node = frozenset(min(topo.core_cpus[topo.core_of[c]] & in_node) for c in in_node)
                room = min(room, len(in_node) * 1000)
            if room < share:
                event("no room")
                return  # a hinted node without room for the even share: best effort only
        event("split checked")
        shares = list(got.numa_cpu.values())
        assert sum(shares) == request
        assert max(shares) - min(shares) <= per_core * 1000, got.numa_cpu

    run(cluster, [op.pod(i) for i, op in enumerate(plan)], check)


@SETTINGS
@given(shape=multi_numa_shapes, data=st.data(),
       plan=ops(numa=["", "Restricted", "SingleNUMANode", "BestEffort"], exclusive=["None"],
                numa_exclusive=["", "", "Required", "Preferred"], max_size=5))
def test_verbs_keep_required_numa_exclusivity(
    shape: tuple[int, int, int, int], data: st.DataObject, plan: list[Op]
) -> None:
    topo, text = machine(shape)
    cluster = _cluster(text)
    ops_by_name = {f"p{i}": op for i, op in enumerate(plan)}

    def check(obj: dict[str, Any], before: frozenset[int], got: Bound) -> None:
        op = ops_by_name[obj["metadata"]["name"]]
        if op.numa not in ("Restricted", "SingleNUMANode") or op.numa_exclusive == "Preferred":
            return
        states = numa_node_states((b.cpus for b in cluster.bound[:-1]), topo.numa_cpus)
        booked = set(got.numa_cpu) | set(got.numa_memory)
        event(f"{op.numa} on {len(booked)} NUMA nodes, states {sorted(set(states.values()))}")
        if len(booked) > 1:
            assert all(states.get(n) != keys.NUMA_NODE_SINGLE for n in booked), (states, booked)
        if op.numa == "SingleNUMANode":
            assert len(booked) == 1
            assert all(states.get(n) != keys.NUMA_NODE_SHARED for n in booked), (states, booked)

    run(cluster, [op.pod(i) for i, op in enumerate(plan)], check)


# -- with a Reservation on the node ------------------------------------------------------------------

RESERVATION = "r"
RESERVATION_UID = "uid-r"
OWNER_KIND, OWNER_NAME = "ReplicaSet", "web-rs"
# who the reservation is for: pods labelled app=web, pods a ReplicaSet controls, or either
OWNERS = [
    [{"labelSelector": {"matchLabels": {"app": "web"}}}],
    [{"controller": {"kind": OWNER_KIND, "name": OWNER_NAME}}],
    [{"labelSelector": {"matchLabels": {"app": "web"}}}, {"controller": {"kind": OWNER_KIND, "name": OWNER_NAME}}],
]
# the pod's reservation-affinity: none, any reservation, this one by name, another one by name
AFFINITIES = ["", "", "{}", json.dumps({"name": RESERVATION}), json.dumps({"name": "other"})]
small_shapes = st.sampled_from(SHAPES[:-1])


@dataclass(frozen=True)
class Tie:
    """How one pod relates to the reservation."""

    labelled: bool  # carries app=web
    controlled: bool  # controlled by the ReplicaSet owner
    affinity: str  # its reservation-affinity annotation ("" for none)

    def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        meta = obj["metadata"]
        if self.labelled:
            meta["labels"]["app"] = "web"
        if self.controlled:
            meta["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": OWNER_KIND, "name": OWNER_NAME,
                                        "uid": "rs-uid", "controller": True}]
        if self.affinity:
            meta["annotations"][keys.ANNOTATION_RESERVATION_AFFINITY] = self.affinity
        return obj


ties = st.lists(st.builds(Tie, BOOLS, BOOLS, st.sampled_from(AFFINITIES)), min_size=6, max_size=6)
allocate_policies = st.sampled_from(["", "Aligned", "Restricted"])


def _reservation_pods(plan: list[Op], tied: list[Tie]) -> list[dict[str, Any]]:
    return [tie.apply(op.pod(i)) for i, (op, tie) in enumerate(zip(plan, tied, strict=False))]


def _check_allocated(got: Bound) -> bool:
    """Whether ``got`` was allocated from the reservation (its annotation names it whole)."""
    if got.reservation is None:
        return False
    assert (got.reservation.name, got.reservation.uid) == (RESERVATION, RESERVATION_UID), got.reservation
    return True


@SETTINGS
@given(shape=small_shapes, data=st.data(), policy=allocate_policies, once=BOOLS, owners=st.sampled_from(OWNERS),
       plan=ops(max_size=6), tied=ties)
def test_verbs_never_allocate_a_cpu_twice_with_a_reservation(
    shape: tuple[int, int, int, int], data: st.DataObject, policy: str, once: bool,
    owners: list[dict[str, Any]], plan: list[Op], tied: list[Tie],
) -> None:
    topo, text = machine(shape)
    reserved = _reserved(data, topo)
    bindable = topo.cpus - reserved
    held = frozenset(data.draw(st.sets(st.sampled_from(sorted(topo.cpus)), max_size=max(1, len(topo.cpus) // 2))))
    resv = reservation(RESERVATION, NODE, cpuset=format_cpu_list(held) if held else None, owners=owners,
                       policy=policy, allocate_once=once, uid=RESERVATION_UID)
    cluster = _cluster(text, reserved=reserved, reservation=resv)

    def check(obj: dict[str, Any], before: frozenset[int], got: Bound) -> None:
        assert not got.cpus & before, "two pods share a CPU"
        assert got.cpus <= bindable, f"{format_cpu_list(got.cpus - bindable)} not bindable"
        from_it = _check_allocated(got)
        event(f"allocated from the reservation: {from_it}")
        if got.cpus & held:
            assert from_it, f"{format_cpu_list(got.cpus & held)} of the reservation given to another pod"

    run(cluster, _reservation_pods(plan, tied), check)


@SETTINGS
@given(shape=small_shapes, data=st.data(), policy=allocate_policies, once=BOOLS,
       cpu_quarters=st.lists(st.integers(1, 4), min_size=4, max_size=4),
       mem=st.lists(st.integers(1, 12), min_size=4, max_size=4),
       plan=ops(numa=["BestEffort", "Restricted", "SingleNUMANode", ""], memory=st.integers(0, 6)), tied=ties)
def test_verbs_never_book_a_numa_zone_past_its_allocatable_with_a_reservation(
    shape: tuple[int, int, int, int], data: st.DataObject, policy: str, once: bool, cpu_quarters: list[int],
    mem: list[int], plan: list[Op], tied: list[Tie],
) -> None:
    """A reservation and the pods allocated from it count as the larger of the two per NUMA node."""
    topo, text = machine(shape)
    zones, limits = _zones(topo, cpu_quarters, mem)
    numa: dict[int, dict[str, str]] = {}
    pinned: set[int] = set()  # with a cpuset (an LSR reserve pod), at most its CPU amount per NUMA node
    with_cpuset = data.draw(BOOLS, label="the reservation pins CPUs")
    for n, (cpu_limit, mem_limit) in limits.items():
        share = data.draw(st.integers(0, 4), label=f"cpu quarters reserved on NUMA {n}")
        mem_share = data.draw(st.integers(0, mem_limit // GiB), label=f"GiB reserved on NUMA {n}")
        if share or mem_share:
            numa[n] = {"cpu": f"{cpu_limit * share // 4}m", "memory": f"{mem_share}Gi"}
        if with_cpuset and cpu_limit * share // 4 >= 1000:
            pinned |= data.draw(st.sets(st.sampled_from(sorted(topo.numa_cpus[n])),
                                        max_size=cpu_limit * share // 4000), label=f"CPUs pinned on NUMA {n}")
    booked = {n: (parse_cpu_milli(a["cpu"]), int(a["memory"][:-2]) * GiB) for n, a in numa.items()}
    resv = reservation(RESERVATION, NODE, numa=numa, cpuset=format_cpu_list(frozenset(pinned)) if pinned else None,
                       policy=policy, allocate_once=once, uid=RESERVATION_UID)
    cluster = _cluster(text, zones=zones, reservation=resv)

    def check(obj: dict[str, Any], before: frozenset[int], got: Bound) -> None:
        assert set(got.numa_cpu) | set(got.numa_memory) <= set(limits)
        event(f"allocated from the reservation: {_check_allocated(got)}")
        inside = [b for b in cluster.bound if _check_allocated(b)]
        outside = [b for b in cluster.bound if not _check_allocated(b)]
        for n, (cpu_limit, mem_limit) in limits.items():
            r_cpu, r_mem = booked.get(n, (0, 0))
            in_cpu = sum(b.numa_cpu.get(n, 0) for b in inside)
            in_mem = sum(b.numa_memory.get(n, 0) for b in inside)
            out_cpu = sum(b.numa_cpu.get(n, 0) for b in outside)
            out_mem = sum(b.numa_memory.get(n, 0) for b in outside)
            assert out_cpu + max(in_cpu, r_cpu) <= cpu_limit, (n, out_cpu, in_cpu, r_cpu, cpu_limit)
            assert out_mem + max(in_mem, r_mem) <= mem_limit, (n, out_mem, in_mem, r_mem, mem_limit)

    run(cluster, _reservation_pods(plan, tied), check)


# -- forged and stale allocation annotations (issue 23) ----------------------------------------------

TRUST = Trust.of(Signer.generate(), ["koord-scheduler"])
OWNED_KEYS = (keys.ANNOTATION_RESOURCE_STATUS, keys.ANNOTATION_DEVICE_ALLOCATED, keys.ANNOTATION_RESERVATION_ALLOCATED)


def _forged_annotations(data: st.DataObject, topo: CPUTopology, label: str) -> dict[str, str]:
    """Any subset of the owned annotations with content the extender never gave: a cpuset of
    the node's CPUs, GPUs, a reservation."""
    out: dict[str, str] = {}
    ids = sorted(topo.cpus)
    if data.draw(BOOLS, label=f"{label}: resource-status"):
        cpuset = data.draw(st.sets(st.sampled_from(ids), min_size=1), label=f"{label}: cpuset")
        out[keys.ANNOTATION_RESOURCE_STATUS] = json.dumps({"cpuset": format_cpu_list(frozenset(cpuset))})
    if data.draw(RARELY, label=f"{label}: device-allocated"):
        out[keys.ANNOTATION_DEVICE_ALLOCATED] = json.dumps(
            {"gpu": [{"minor": 0, "resources": {"koordinator.sh/gpu-core": "100"}}]})
    if data.draw(RARELY, label=f"{label}: reservation-allocated"):
        out[keys.ANNOTATION_RESERVATION_ALLOCATED] = json.dumps({"name": "r", "uid": "uid-r"})
    if data.draw(RARELY, label=f"{label}: a signature of nothing"):
        out[keys.ANNOTATION_ALLOCATION_SIGNATURE] = "v1.AAAA"
    return out


@SETTINGS
@given(shape=shapes, data=st.data(), plan=ops(max_size=5))
def test_verbs_never_count_or_apply_a_forged_or_stale_allocation(
    shape: tuple[int, int, int, int], data: st.DataObject, plan: list[Op]
) -> None:
    """The cluster holds pods placed with ``spec.nodeName`` by no scheduler and forged allocation
    annotations, and every pending pod carries forged or stale ones (a replica that died
    mid-bind). After each bind the pod carries exactly what the bind wrote (its signature verifies: no
    pod pinned to CPUs the extender did not give it), the CPUs given are disjoint and bindable,
    and a restarted extender counts exactly the CPUs it gave, none of the forged ones."""
    topo, text = machine(shape)
    reserved = _reserved(data, topo)
    bindable = topo.cpus - reserved
    objects = [node(NODE), nrt(NODE, text, annotations=_kubelet_reserved(reserved))]
    bypass = [
        pod(f"forged{i}", cpu="1", qos=data.draw(st.sampled_from(["LSR", "LS", "BE"]), label=f"forged{i} qos"),
            node_name=NODE, scheduler_name="default-scheduler",
            annotations=_forged_annotations(data, topo, f"forged{i}"))
        for i in range(data.draw(st.integers(0, 3), label="forged pods"))
    ]
    cluster = Cluster(objects + bypass, trust=TRUST)
    pending = []
    for i, op in enumerate(plan):
        obj = op.pod(i)
        obj["metadata"]["annotations"].update(_forged_annotations(data, topo, f"p{i}"))
        pending.append(obj)

    def check(obj: dict[str, Any], before: frozenset[int], got: Bound) -> None:
        assert not got.cpus & before, "two pods share a CPU"
        assert got.cpus <= bindable
        written = obj["metadata"]["annotations"]
        meta = obj["metadata"]
        assert TRUST.judge(meta["uid"], meta["namespace"], meta["name"], NODE, "default-scheduler", written) == "signed"
        assert keys.ANNOTATION_DEVICE_ALLOCATED not in written and keys.ANNOTATION_RESERVATION_ALLOCATED not in written
        if not got.cpus:
            event("bound without a cpuset")
            assert not got.numa_cpu or keys.ANNOTATION_RESOURCE_STATUS in written

    run(cluster, pending, check)
    restarted = ClusterState(TRUST)
    bound = [p for p in pending if p["spec"].get("nodeName")]
    assert load_objects(restarted, objects + bypass + bound) == []
    ns = restarted.nodes[NODE]
    ns.refresh()
    assert ns.free == bindable - cluster.taken()


class Leases:
    """Leases in memory with the API server's compare-and-swap (``ledger.LeaseAPI``)."""

    def __init__(self) -> None:
        self.items: dict[tuple[str, str], dict[str, Any]] = {}
        self.rv = 0

    async def get_lease(self, namespace: str, name: str) -> dict[str, Any]:
        found = self.items.get((namespace, name))
        if found is None:
            raise NotFoundError(404, f"lease {name} not found")
        return json.loads(json.dumps(found))

    def _store(self, namespace: str, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        self.rv += 1
        obj = json.loads(json.dumps(body))
        obj["metadata"]["resourceVersion"] = str(self.rv)
        self.items[(namespace, name)] = obj
        return json.loads(json.dumps(obj))

    async def create_lease(self, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]:
        name = body["metadata"]["name"]
        if (namespace, name) in self.items:
            raise ConflictError(409, "already exists")
        return self._store(namespace, name, body)

    async def replace_lease(self, namespace: str, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        found = self.items.get((namespace, name))
        if found is None:
            raise NotFoundError(404, f"lease {name} not found")
        if body["metadata"].get("resourceVersion") != found["metadata"]["resourceVersion"]:
            raise ConflictError(409, "the object has been modified")
        return self._store(namespace, name, body)


@dataclass(frozen=True)
class Step:
    replica: int  # 0 or 1: which replica kube-scheduler's call reaches
    wait: int  # seconds that pass before the pod is scheduled
    stall: bool  # replica 1's watch goes silent for good before this step


@SETTINGS
@given(shape=small_shapes, plan=ops(max_size=6),
       steps=st.lists(st.builds(Step, st.integers(0, 1), st.sampled_from([0, 1, 30, 119, 121, 300]), RARELY),
                      min_size=6, max_size=6))
def test_two_replicas_never_give_a_cpu_twice_while_one_watch_stalls_past_the_ledger_ttl(
    shape: tuple[int, int, int, int], plan: list[Op], steps: list[Step]
) -> None:
    """Two replicas share the HA ledger (TTL 120 s) and the pods; replica 0's watch confirms
    every bind, replica 1's stops for good at some step, with minutes passing between pods. A
    replica whose watch said nothing for longer than its staleness bound (105 s) refuses; the
    other binds, and no CPU is ever written into two pods' cpusets."""
    _, text = machine(shape)
    objects = [node(NODE), nrt(NODE, text)]
    now = [1000.0]
    api, leases = FakeBindAPI(), Leases()
    replicas: list[tuple[ClusterState, Any]] = []
    for i in range(2):
        state = ClusterState(TRUST)
        state.monotonic = state.wall = lambda: now[0]
        assert load_objects(state, objects) == []
        state.stale_after = 105.0
        state.heard("pods")
        for kind in ("nodes", "noderesourcetopologies", "devices", "reservations"):
            state.heard(kind)
        ledger = LeaseLedger(leases, "kube-system", identity=f"r{i}", ttl=120.0, settled=state.settled,
                             clock=lambda: now[0])
        replicas.append((state, create_app(state, Binder(state, api, CFG, ledger), CFG)))
    given: list[frozenset[int]] = []
    stalled = False

    async def scenario() -> None:
        nonlocal stalled
        for i, (op, step) in enumerate(zip(plan, steps, strict=False)):
            now[0] += step.wait
            stalled = stalled or step.stall
            for r, (state, _) in enumerate(replicas):
                if r == 0 or not stalled:  # a live watch hears the API server (streams end, bookmarks)
                    for kind in KINDS:
                        state.heard(kind)
            obj = op.pod(i)
            api.add(obj)
            state, app = replicas[step.replica]
            meta = obj["metadata"]
            reply = await _post(app, "/bind", {"PodName": meta["name"], "PodNamespace": meta["namespace"],
                                               "PodUID": meta["uid"], "Node": NODE})
            if reply["Error"]:
                event("refused: stale" if "stale" in reply["Error"] else "refused")
                continue
            event(f"bound by replica {step.replica}{' while 1 stalls' if stalled else ''}")
            for r, (other, _) in enumerate(replicas):
                if r == 0 or not stalled:
                    assert other.apply("pods", "MODIFIED", obj)  # the watch confirms the bind
            text_ = obj["metadata"]["annotations"].get(keys.ANNOTATION_RESOURCE_STATUS)
            cpuset = parse_resource_status(text_).cpuset if text_ else frozenset()
            assert not any(cpuset & g for g in given), "two pods share a CPU"
            given.append(cpuset)

    asyncio.run(scenario())


async def _post(app: Any, path: str, body: Mapping[str, Any]) -> Any:
    raw = orjson.dumps(body)
    sent: list[Mapping[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": raw, "more_body": False}

    async def send(message: Mapping[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": path,
             "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())]}
    await app(scope, receive, send)
    assert sent[0]["status"] == 200, sent[1]["body"]
    return orjson.loads(sent[1]["body"])


def test_a_pod_asking_more_memory_is_not_judged_by_the_memo_of_one_asking_less() -> None:
    """Found by ``test_verbs_never_book_a_numa_zone_past_its_allocatable``: the verdict memo's key
    (``PodRequest.key``) left out the memory request, so an LS pod asking 2 GiB on a node whose one
    NUMA zone holds 1 GiB reused the "fits" of an earlier pod asking none, passed filter and then
    failed bind ("Unsatisfied NUMA cpu; Unsatisfied NUMA memory")."""
    topo, text = machine((1, 1, 1, 1))
    zones, _ = _zones(topo, [2, 1, 1, 1], [1, 1, 1, 1])
    cluster = _cluster(text, zones=zones)
    small = Op(1, True, "FullPCPUs", False, "SingleNUMANode", "NUMANodeLevel", 0)
    large = Op(1, True, "FullPCPUs", False, "SingleNUMANode", "NUMANodeLevel", 2)
    outcomes: list[dict[str, Any]] = []
    run(cluster, [small.pod(0), large.pod(1)], lambda obj, before, got: outcomes.append(obj))
    assert [o["metadata"]["name"] for o in outcomes] == ["p0"]  # p1 is refused by filter, as bind would
