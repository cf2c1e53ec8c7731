"""Koordinator Reservations in the extender: which pods match a reservation
(``scheduler_ext/reservations.py``) and the CPUs and NUMA amounts a matched one gives back
(``scheduler_ext/views.py`` ``restore``, ``scheduler_ext/admission.py`` ``Restore``).

Topologies as in ``tests/scheduler_ext/test_accumulator_cpu_choice.py``: ``TOPO_SMALL`` is 16 CPUs on two
sockets (NUMA 0 = CPUs 0-3,8-11; NUMA 1 = CPUs 4-7,12-15); ``TOPO_104`` is 104 CPUs on two
sockets (NUMA 0 = CPUs 0-25,52-77; NUMA 1 = CPUs 26-51,78-103).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import kubernetes
import pytest

from koord_formats.reservation import parse_reservation, parse_reservation_allocated
from koord_formats.topology import CPUTopology, format_cpu_topology
from scheduler_ext.extender import DEFAULT_CONFIG, evaluate, filter_nodes, plan
from scheduler_ext.guard import decode_pod
from scheduler_ext.pods import parse_pod
from scheduler_ext.reservations import fold, pod_may_use
from scheduler_ext.state import ClusterState, load_objects
from scheduler_ext.topology import synthetic_topology
from tests.fakeapi import FakeAPIServer
from tests.scheduler_ext.builders import TOPO_SMALL, cluster, cpus, node, nrt, pod, reservation
from tests.scheduler_ext.conftest import Extender

TOPO_104 = synthetic_topology(2, 1, 26, 2)
RS = "scheduling.koordinator.sh/resource-status"
RA = "scheduling.koordinator.sh/reservation-allocated"
AFFINITY = "scheduling.koordinator.sh/reservation-affinity"
FULL = {"requiredCPUBindPolicy": "FullPCPUs"}


def web_pod(name: str = "web", *, labels: Mapping[str, str] | None = None, **kw: Any) -> dict[str, Any]:
    """A pod labelled ``app: web`` (the builders' default reservation owner)."""
    p = pod(name, **kw)
    p["metadata"]["labels"].update({"app": "web"} if labels is None else labels)
    return p


# -- matching ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MatchRow:
    description: str
    reservation: dict[str, Any]
    pod: dict[str, Any]
    expected: bool
    node_labels: Mapping[str, str] = field(default_factory=dict)
    assigned: int = 0  # pods already allocated from the reservation


def _with_owner_refs(p: dict[str, Any], refs: list[dict[str, Any]]) -> dict[str, Any]:
    p["metadata"]["ownerReferences"] = refs
    return p


def _affinity(doc: Mapping[str, Any]) -> dict[str, str]:
    return {AFFINITY: json.dumps(doc)}


RS_REF = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-7d9", "uid": "rs-1", "controller": True}

MATCH_ROWS = [
    MatchRow("a label-selector owner matches a pod with the label", reservation("r", "n"), web_pod(), True),
    MatchRow("a label-selector owner does not match a pod without the label", reservation("r", "n"), pod("x"),
             False),
    MatchRow("matchExpressions NotIn excludes the listed value",
             reservation("r", "n", owners=[{"labelSelector": {"matchExpressions": [
                 {"key": "app", "operator": "NotIn", "values": ["web"]}]}}]), web_pod(), False),
    MatchRow("an object reference matches by name and namespace",
             reservation("r", "n", owners=[{"object": {"name": "web", "namespace": "default"}}]), pod("web"), True),
    MatchRow("an object reference in another namespace does not match",
             reservation("r", "n", owners=[{"object": {"name": "web", "namespace": "prod"}}]), pod("web"), False),
    MatchRow("a controller reference matches one of the pod's owner references",
             reservation("r", "n", owners=[{"controller": {"kind": "ReplicaSet", "name": "web-7d9"}}]),
             _with_owner_refs(pod("x"), [RS_REF]), True),
    MatchRow("a controller reference asking controller=true needs a controlling owner",
             reservation("r", "n", owners=[{"controller": {"uid": "rs-1", "controller": True}}]),
             _with_owner_refs(pod("x"), [{**RS_REF, "controller": False}]), False),
    MatchRow("a controller reference with another namespace does not match",
             reservation("r", "n", owners=[{"controller": {"uid": "rs-1", "namespace": "prod"}}]),
             _with_owner_refs(pod("x"), [RS_REF]), False),
    MatchRow("the parts of one owner are ANDed",
             reservation("r", "n", owners=[{"object": {"name": "other"}, "labelSelector": {"matchLabels": {
                 "app": "web"}}}]), web_pod(), False),
    MatchRow("the owners are ORed", reservation("r", "n", owners=[{"object": {"name": "other"}}, {
        "labelSelector": {"matchLabels": {"app": "web"}}}]), web_pod(), True),
    MatchRow("an owner with no parts matches every pod", reservation("r", "n", owners=[{}]), pod("x"), True),
    MatchRow("a Waiting reservation counts but cannot be used", reservation("r", "n", phase="Waiting"), web_pod(),
             False),
    MatchRow("an unschedulable reservation cannot be used", reservation("r", "n", unschedulable=True), web_pod(),
             False),
    MatchRow("an allocate-once reservation with a pod is used up", reservation("r", "n"), web_pod(), False,
             assigned=1),
    MatchRow("a reservation that is not allocate-once takes more pods", reservation("r", "n", allocate_once=False),
             web_pod(), True, assigned=1),
    MatchRow("an affinity naming the reservation matches it", reservation("r", "n"),
             web_pod(annotations=_affinity({"name": "r"})), True),
    MatchRow("an affinity naming another reservation does not", reservation("r", "n"),
             web_pod(annotations=_affinity({"name": "s"})), False),
    MatchRow("an affinity selector reads the reservation's labels", reservation("r", "n", labels={"pool": "a"}),
             web_pod(annotations=_affinity({"reservationSelector": {"pool": "a"}})), True),
    MatchRow("an affinity selector also reads the node's labels", reservation("r", "n"),
             web_pod(annotations=_affinity({"reservationSelector": {"zone": "z1"}})), True,
             node_labels={"zone": "z1"}),
    MatchRow("the reservation's labels win over the node's", reservation("r", "n", labels={"zone": "z2"}),
             web_pod(annotations=_affinity({"reservationSelector": {"zone": "z1"}})), False,
             node_labels={"zone": "z1"}),
    MatchRow("selector terms match metadata.name as a field", reservation("r", "n"),
             web_pod(annotations=_affinity({"requiredDuringSchedulingIgnoredDuringExecution": {
                 "reservationSelectorTerms": [{"matchFields": [
                     {"key": "metadata.name", "operator": "In", "values": ["r"]}]}]}})), True),
    MatchRow("selector terms with Gt compare integers", reservation("r", "n", labels={"size": "8"}),
             web_pod(annotations=_affinity({"requiredDuringSchedulingIgnoredDuringExecution": {
                 "reservationSelectorTerms": [{"matchExpressions": [
                     {"key": "size", "operator": "Gt", "values": ["4"]}]}]}})), True),
    MatchRow("an empty selector term list selects nothing", reservation("r", "n"),
             web_pod(annotations=_affinity({"requiredDuringSchedulingIgnoredDuringExecution": {
                 "reservationSelectorTerms": []}})), False),
    MatchRow("a NoSchedule taint needs a toleration in the affinity",
             reservation("r", "n", taints=[{"key": "dedicated", "value": "x", "effect": "NoSchedule"}]),
             web_pod(annotations=_affinity({})), False),
    MatchRow("a tolerated taint lets the pod use the reservation",
             reservation("r", "n", taints=[{"key": "dedicated", "value": "x", "effect": "NoSchedule"}]),
             web_pod(annotations=_affinity({"tolerations": [{"key": "dedicated", "operator": "Exists"}]})), True),
    MatchRow("without an affinity taints are not checked",
             reservation("r", "n", taints=[{"key": "dedicated", "value": "x", "effect": "NoSchedule"}]),
             web_pod(), True),
]


@pytest.mark.parametrize("row", [pytest.param(r, id=r.description) for r in MATCH_ROWS])
def test_which_pods_may_use_a_reservation(row: MatchRow) -> None:
    r = parse_reservation(row.reservation)
    req = parse_pod(row.pod)
    assert not req.error
    members = [(r.uid, frozenset(), {}, {}, ())] * row.assigned
    (nr,) = fold([r], members)
    assert pod_may_use(nr, req.identity, req.reservation_affinity, row.node_labels) is row.expected


# -- CPU choice ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CPURow:
    description: str
    topo: CPUTopology
    taken: str  # CPUs other pods hold
    reserved: str  # the reservation's cpuset ("" for no reservation)
    n: int  # CPUs the pod asks for
    expected: str  # its CPUs, or "!" + the refusal reason
    matches: bool = True
    policy: str | None = None  # allocatePolicy
    in_reservation: str = ""  # CPUs of a pod already allocated from the reservation
    allocated: bool = True  # reservation-allocated written
    affinity: bool = False
    resource_spec: Mapping[str, str] = field(default_factory=lambda: FULL)


NOT_ENOUGH = "not enough cpus available to satisfy request"

CPU_ROWS = [
    CPURow("16 CPUs: a matching pod takes the reservation's CPUs instead of the first free cores",
           TOPO_SMALL, "", "4-5,12-13", 4, "4-5,12-13"),
    CPURow("16 CPUs: a pod that does not match goes to the NUMA node the reservation leaves whole",
           TOPO_SMALL, "", "0-1,8-9", 4, "4-5,12-13", matches=False, allocated=False),
    CPURow("16 CPUs: reserved CPUs are the only room left for a matching pod", TOPO_SMALL, "0-3,6-11,14-15",
           "4-5,12-13", 4, "4-5,12-13"),
    CPURow("16 CPUs: the same node refuses a pod that does not match", TOPO_SMALL, "0-3,6-11,14-15",
           "4-5,12-13", 4, "!" + NOT_ENOUGH, matches=False),
    CPURow("16 CPUs: Default takes the reservation first, then whole cores outside", TOPO_SMALL, "",
           "4-5,12-13", 6, "0,4-5,8,12-13"),
    CPURow("16 CPUs: Aligned also takes outside CPUs when the reservation is short", TOPO_SMALL, "",
           "4-5,12-13", 6, "0,4-5,8,12-13", policy="Aligned"),
    CPURow("16 CPUs: Restricted that does not fit falls back to the node outside the reservation", TOPO_SMALL,
           "", "4-5,12-13", 6, "0-2,8-10", policy="Restricted"),
    CPURow("16 CPUs: Restricted with a required reservation refuses what does not fit", TOPO_SMALL, "",
           "4-5,12-13", 6, "!Reservation(s) " + NOT_ENOUGH, policy="Restricted", affinity=True),
    CPURow("16 CPUs: Restricted that fits stays inside the reservation", TOPO_SMALL, "", "4-7,12-15", 4,
           "4-5,12-13", policy="Restricted"),
    CPURow("16 CPUs: required FullPCPUs refuses a required reservation whose one CPU leaves its sibling outside",
           TOPO_SMALL, "", "4", 2, "!Reservation(s) insufficient CPUs to satisfy required cpu bind policy FullPCPUs",
           affinity=True),
    CPURow("16 CPUs: required FullPCPUs goes around a reservation whose one CPU leaves its sibling outside",
           TOPO_SMALL, "", "4", 2, "0,8"),
    CPURow("16 CPUs: CPUs a pod of the reservation holds are not given again", TOPO_SMALL, "", "4-7,12-15", 4,
           "6-7,14-15", in_reservation="4-5,12-13"),
    CPURow("16 CPUs: a required reservation that is absent refuses the node", TOPO_SMALL, "", "", 4,
           "!node(s) no reservations match reservation affinity", affinity=True),
    CPURow("16 CPUs: preferred SpreadByPCPUs spreads inside the reservation first", TOPO_SMALL, "",
           "4-7,12-15", 2, "4-5", resource_spec={"preferredCPUBindPolicy": "SpreadByPCPUs"}),
    CPURow("104 CPUs: a matching pod takes reserved CPUs on the other NUMA node", TOPO_104, "",
           "26-27,78-79", 4, "26-27,78-79"),
    CPURow("104 CPUs: beyond the reservation the rest comes from the NUMA node with most free CPUs",
           TOPO_104, "", "26-27,78-79", 8, "0-1,26-27,52-53,78-79"),
    CPURow("104 CPUs: a pod that does not match goes around the reservation", TOPO_104, "0-25,52-77",
           "26-29,78-81", 4, "30-31,82-83", matches=False, allocated=False),
    CPURow("104 CPUs: a required reservation holds a pod larger than the free cores", TOPO_104,
           "0-25,30-77,82-103", "26-29,78-81", 8, "26-29,78-81", affinity=True),
]


def _bound(name: str, cpu_text: str, *, reservation_uid: str = "") -> dict[str, Any]:
    ann = {RS: json.dumps({"cpuset": cpu_text})}
    if reservation_uid:
        ann[RA] = json.dumps({"name": "r", "uid": reservation_uid})
    return pod(name, cpu=str(len(cpus(cpu_text))), node_name="n", annotations=ann)


def _state(topo: CPUTopology, objects: Sequence[dict[str, Any]], *, labels: Mapping[str, str] | None = None,
           nrt_annotations: Mapping[str, str] | None = None, zones: list[dict[str, Any]] | None = None,
           policies: Sequence[str] = ("None",)) -> ClusterState:
    doc = nrt("n", format_cpu_topology(topo), annotations=nrt_annotations, policies=policies)
    if zones is not None:
        doc["zones"] = zones
    state = ClusterState()
    assert load_objects(state, [node("n", labels=labels), doc, *objects]) == []
    return state


@pytest.mark.parametrize("row", [pytest.param(r, id=r.description) for r in CPU_ROWS])
def test_cpu_choice_with_reservations(row: CPURow) -> None:
    objects: list[dict[str, Any]] = []
    if row.taken:
        objects.append(_bound("other", row.taken))
    if row.reserved:
        objects.append(reservation("r", "n", cpuset=row.reserved, policy=row.policy,
                                   allocate_once=not row.in_reservation))
    if row.in_reservation:
        objects.append(_bound("member", row.in_reservation, reservation_uid="uid-r"))
    state = _state(row.topo, objects)
    ann = _affinity({}) if row.affinity else {}
    p = (web_pod if row.matches else pod)("p", cpu=str(row.n), resource_spec=row.resource_spec, annotations=ann)
    req = decode_pod(p)
    ns = state.nodes["n"]
    with state.lock:
        verdict = evaluate(ns, req, DEFAULT_CONFIG)
        if row.expected.startswith("!"):
            assert not verdict.ok
            assert verdict.reason == row.expected[1:]
            return
        assert verdict.ok, verdict.reason
        placement = plan(ns, req, DEFAULT_CONFIG)
    assert placement.allocation.cpus == cpus(row.expected)
    assert json.loads(placement.annotations[RS])["cpuset"] == row.expected
    if row.allocated:
        assert parse_reservation_allocated(placement.annotations[RA]).uid == "uid-r"
        assert placement.allocation.reservation == "uid-r"
    else:
        assert RA not in placement.annotations


def test_an_allocate_once_reservation_serves_one_pod_then_holds_nothing_for_others() -> None:
    state = _state(TOPO_SMALL, [reservation("r", "n", cpuset="4-7,12-15")])
    ns = state.nodes["n"]
    first, second = web_pod("a", cpu="4", resource_spec=FULL), web_pod("b", cpu="4", resource_spec=FULL)
    with state.lock:
        placement = plan(ns, decode_pod(first), DEFAULT_CONFIG)
        state.hold(first["metadata"]["uid"], "n", placement.allocation)
        ns.refresh()
        second_plan = plan(ns, decode_pod(second), DEFAULT_CONFIG)
    assert placement.allocation.cpus == cpus("4-5,12-13")
    # used up: the reservation still holds its CPUs, and the second pod goes around them
    assert second_plan.allocation.cpus == cpus("0-1,8-9")
    assert RA not in second_plan.annotations


def test_a_pcpu_level_reservation_gives_its_cores_back_to_its_own_pod() -> None:
    spec = {"preferredCPUBindPolicy": "SpreadByPCPUs", "preferredCPUExclusivePolicy": "PCPULevel"}
    state = _state(TOPO_SMALL, [
        reservation("r", "n", cpuset="4-7,12-15",
                    annotations={"scheduling.koordinator.sh/resource-spec": json.dumps(spec)}),
    ])
    ns = state.nodes["n"]
    with state.lock:
        ns.refresh()
        assert ns.avoid_cores == frozenset({4, 5, 6, 7})  # held exclusively for everyone else
        mine = plan(ns, decode_pod(web_pod("a", cpu="2", resource_spec=spec)), DEFAULT_CONFIG)
        other = plan(ns, decode_pod(pod("b", cpu="2", resource_spec=spec)), DEFAULT_CONFIG)
    assert mine.allocation.cpus == cpus("4-5")
    assert other.allocation.cpus == cpus("0-1")


def test_the_lowest_reservation_order_is_nominated() -> None:
    state = _state(TOPO_SMALL, [
        reservation("a", "n", cpuset="0-1,8-9", labels={"scheduling.koordinator.sh/reservation-order": "5"}),
        reservation("b", "n", cpuset="4-5,12-13", labels={"scheduling.koordinator.sh/reservation-order": "2"}),
    ])
    ns = state.nodes["n"]
    with state.lock:
        placement = plan(ns, decode_pod(web_pod(cpu="4", resource_spec=FULL)), DEFAULT_CONFIG)
    assert placement.allocation.cpus == cpus("4-5,12-13")
    assert parse_reservation_allocated(placement.annotations[RA]).name == "b"


def test_a_pod_that_requires_a_reservation_is_refused_on_nodes_without_one() -> None:
    state = ClusterState()
    load_objects(state, [node("n"), nrt("n", format_cpu_topology(TOPO_SMALL)), node("m"),
                         nrt("m", format_cpu_topology(TOPO_SMALL)), reservation("r", "m", cpuset="0-1,8-9")])
    req = decode_pod(web_pod(cpu="2", resource_spec=FULL, annotations=_affinity({})))
    result = filter_nodes(state, req, ["n", "m", "unknown"], DEFAULT_CONFIG)
    assert result.passed == ["m"]
    assert result.unresolvable == {"n": "node(s) no reservations match reservation affinity"}
    assert "unknown" in result.failed


def test_a_pod_asking_for_no_cpus_still_records_its_reservation() -> None:
    state = _state(TOPO_SMALL, [reservation("r", "n")])
    with state.lock:
        placement = plan(state.nodes["n"], decode_pod(web_pod(cpu=None, memory="1Gi", qos=None)), DEFAULT_CONFIG)
    assert placement.allocation.cpus == frozenset()
    assert parse_reservation_allocated(placement.annotations[RA]).uid == "uid-r"


# -- NUMA ------------------------------------------------------------------------------------------------

ZONES = [
    {"name": f"node-{n}", "type": "Node", "resources": [{"name": "cpu", "allocatable": "8"},
                                                         {"name": "memory", "allocatable": "16Gi"}]}
    for n in (0, 1)
]


@pytest.mark.parametrize(
    ("matches", "expected"),
    [
        pytest.param(True, "4-5,12-13", id="a matching pod reuses the NUMA amounts its reservation booked"),
        pytest.param(False, "!Unsatisfied NUMA cpu", id="a pod that does not match finds both zones full"),
    ],
)
def test_numa_amounts_of_a_reservation(matches: bool, expected: str) -> None:
    # NUMA 0 is booked whole by a pod, NUMA 1 whole by the reservation (4 CPUs of it pinned)
    busy = pod("busy", cpu="8", node_name="n", annotations={RS: json.dumps(
        {"cpuset": "0-3,8-11", "numaNodeResources": [{"node": 0, "resources": {"cpu": "8"}}]})})
    state = _state(TOPO_SMALL, [busy, reservation("r", "n", cpuset="4-5,12-13", numa={1: {"cpu": "8"}})],
                   labels={"node.koordinator.sh/numa-topology-policy": "SingleNUMANode"}, zones=ZONES)
    req = decode_pod((web_pod if matches else pod)("p", cpu="4", memory=None, resource_spec=FULL))
    ns = state.nodes["n"]
    with state.lock:
        verdict = evaluate(ns, req, DEFAULT_CONFIG)
        if expected.startswith("!"):
            assert not verdict.ok and verdict.reason.startswith(expected[1:])
            return
        assert verdict.ok, verdict.reason
        placement = plan(ns, req, DEFAULT_CONFIG)
    assert placement.allocation.cpus == cpus(expected)
    assert placement.allocation.numa == {1: 4000}


# -- watched through the API ------------------------------------------------------------------------


def test_the_official_client_lists_and_watches_reservations_on_the_fake_api_server(
    official: kubernetes.client.ApiClient, api: FakeAPIServer
) -> None:
    custom = kubernetes.client.CustomObjectsApi(official)
    created = custom.create_cluster_custom_object(
        "scheduling.koordinator.sh", "v1alpha1", "reservations", reservation("r", "n1", cpuset="0-1,8-9")
    )
    listed = custom.list_cluster_custom_object("scheduling.koordinator.sh", "v1alpha1", "reservations")
    assert [i["metadata"]["name"] for i in listed["items"]] == ["r"]
    rv = listed["metadata"]["resourceVersion"]
    custom.delete_cluster_custom_object("scheduling.koordinator.sh", "v1alpha1", "reservations", "r")
    resp = custom.list_cluster_custom_object("scheduling.koordinator.sh", "v1alpha1", "reservations", watch=True,
                                             resource_version=rv, timeout_seconds=5, _preload_content=False)
    try:
        for line in resp:
            event = json.loads(line)
            if event["type"] != "BOOKMARK":
                break
    finally:
        resp.close()
    assert (event["type"], event["object"]["metadata"]["uid"]) == ("DELETED", created["metadata"]["uid"])


def test_the_extender_watches_a_reservation_come_and_go(api: FakeAPIServer, extender: Extender) -> None:
    for obj in cluster(["n1"]):
        api.create(obj)
    created = api.create(reservation("r", "n1", cpuset="0-3,8-11"))
    uid = created["metadata"]["uid"]

    def free() -> frozenset[int]:
        with extender.state.lock:
            ns = extender.state.nodes.get("n1")
            if ns is None:
                return frozenset()
            ns.refresh()
            return ns.free

    _wait(lambda: uid in extender.state.reservations and free() == cpus("4-7,12-15"))
    api.patch_direct("reservations", "r", {"status": {"phase": "Succeeded"}})
    _wait(lambda: uid not in extender.state.reservations and free() == cpus("0-15"))
    api.delete("reservations", "r")
    _wait(lambda: uid not in extender.state.reservations)


def _wait(cond: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met"
        time.sleep(0.02)


@pytest.mark.parametrize(
    ("matches", "expected"),
    [
        pytest.param(True, 8, id="a matching pod scores the node as if its reservation's CPUs were free"),
        pytest.param(False, 5, id="for any other pod the reserved CPUs are taken"),
    ],
)
def test_the_node_score_counts_a_matched_reservation_as_room(matches: bool, expected: int) -> None:
    state = _state(TOPO_SMALL, [reservation("r", "n", cpuset="4-5,12-13")])
    req = decode_pod((web_pod if matches else pod)("p", cpu="4", resource_spec=FULL))
    with state.lock:
        verdict = evaluate(state.nodes["n"], req, DEFAULT_CONFIG)
    assert verdict.ok and verdict.score == expected
