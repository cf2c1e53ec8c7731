"""Reservations placed and consumed (issue 38): the reservation controller
(``scheduler_ext/reserver.py``) over the rules of ``scheduler_ext/reserve.py`` and the formats of
``koord_formats/reservation_spec.py``, each row against Koordinator's semantics (the reservation
controller's ``syncStatus`` and ``isReservationNeedExpiration``, ``NewReservePod``,
kube-scheduler's default filters).

The controller runs here on the real cache, decisions and binder, with an in-memory API (the
objects it writes are fed back as the watch would); ``tests/e2e/test_e2e_reservations.py`` shows
the same on the real cluster.
"""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from koord_formats.cpulist import parse_cpu_list
from koord_formats.errors import FormatError
from koord_formats.reservation_spec import (
    HostPort,
    NodeFacts,
    Taint,
    parse_lifetime,
    parse_node,
    parse_pod_constraints,
    parse_ttl,
)
from scheduler_ext.binder import Binder
from scheduler_ext.decide import DEFAULT_CONFIG, evaluate, plan
from scheduler_ext.errors import ConflictError, NotFoundError
from scheduler_ext.guard import decode_pod
from scheduler_ext.reserve import (
    available_status,
    expired_status,
    node_fit,
    owners_status,
    reserve_request,
    unschedulable_status,
)
from scheduler_ext.reserver import ReservationStore, Reserver
from scheduler_ext.state import ClusterState, load_objects
from tests.scheduler_ext.builders import cluster, pod

RS = "scheduling.koordinator.sh/resource-status"
RA = "scheduling.koordinator.sh/reservation-allocated"
T0 = 1_780_000_000.0  # 2026-05-28T20:26:40Z
CREATED = "2026-05-28T20:26:40Z"


# -- lifetime: isReservationNeedExpiration ---------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "now", "expired"),
    [
        ({"ttl": "1h"}, T0 + 3599, False),
        ({"ttl": "1h"}, T0 + 3601, True),
        ({"ttl": "0s"}, T0 + 10**9, False),  # a ttl of 0 turns expiry off
        ({"ttl": "0s", "expires": "2026-05-28T20:26:41Z"}, T0 + 10, False),  # even with expires
        ({"expires": "2026-05-28T20:27:40Z"}, T0 + 59, False),
        ({"expires": "2026-05-28T20:27:40Z"}, T0 + 61, True),
        ({"ttl": "24h", "expires": "2026-05-28T20:27:40Z"}, T0 + 61, True),  # expires is checked first
        ({"ttl": "1m", "expires": "2026-05-29T20:26:40Z"}, T0 + 120, False),  # and wins over ttl
        ({}, T0 + 10**9, False),  # neither: the CRD defaults ttl, nothing expires here
        ({"ttl": "1h30m"}, T0 + 5399, False),
        ({"ttl": "1h30m"}, T0 + 5401, True),
    ],
)
def test_lifetime_follows_koordinator(spec: dict[str, Any], now: float, expired: bool) -> None:
    obj = {"metadata": {"name": "r", "creationTimestamp": CREATED}, "spec": spec}
    assert parse_lifetime(obj).expired(now) is expired


@pytest.mark.parametrize("ttl", ["", "24", "1d", "-1h", "h", "9" * 80, "1h" * 40, 5, None, "1e3s"])
def test_bad_ttl_is_refused(ttl: object) -> None:
    with pytest.raises(FormatError):
        parse_ttl(ttl)


# -- node_fit: kube-scheduler's default filters on the reserve pod --------------------------------


def _template(**spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"containers": [{"name": "c", "resources": {"requests": {"cpu": "2", "memory": "1Gi"}}}]}
    base.update(spec)
    return base


NODE = NodeFacts(
    "n1",
    labels={"zone": "a", "rank": "5"},
    taints=(Taint("dedicated", "db", "NoSchedule"), Taint("soft", "", "PreferNoSchedule")),
    allocatable={"cpu": Fraction(8), "memory": Fraction(16 << 30), "pods": Fraction(110)},
)
DB = [{"key": "dedicated", "operator": "Equal", "value": "db", "effect": "NoSchedule"}]


@dataclass(frozen=True)
class FitRow:
    description: str
    spec: dict[str, Any]
    expected: str  # "" fits; else the start of the reason
    used: Mapping[str, Fraction] = field(default_factory=dict)
    ports: Sequence[HostPort] = ()
    node: NodeFacts = NODE


def _aff(*terms: dict[str, Any]) -> dict[str, Any]:
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}}}


FIT_ROWS = [
    FitRow("fits with the taint tolerated", _template(tolerations=DB), ""),
    FitRow("a NoSchedule taint not tolerated", _template(), "node(s) had untolerated taint {dedicated: db}"),
    FitRow("Exists with no key tolerates everything", _template(tolerations=[{"operator": "Exists"}]), ""),
    FitRow("a toleration for another effect does not", _template(tolerations=[{**DB[0], "effect": "NoExecute"}]),
           "node(s) had untolerated taint"),
    FitRow("nodeName elsewhere", _template(tolerations=DB, nodeName="n2"), "node(s) didn't match the requested node"),
    FitRow("nodeName here", _template(tolerations=DB, nodeName="n1"), ""),
    FitRow("nodeSelector matches", _template(tolerations=DB, nodeSelector={"zone": "a"}), ""),
    FitRow("nodeSelector does not", _template(tolerations=DB, nodeSelector={"zone": "b"}),
           "node(s) didn't match Pod's node affinity/selector"),
    FitRow("affinity terms are ORed", _template(tolerations=DB, affinity=_aff(
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]},
        {"matchExpressions": [{"key": "rank", "operator": "Gt", "values": ["3"]}]})), ""),
    FitRow("expressions of a term are ANDed", _template(tolerations=DB, affinity=_aff(
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]},
                              {"key": "rank", "operator": "Lt", "values": ["3"]}]})), "node(s) didn't match Pod's"),
    FitRow("matchFields on the name", _template(tolerations=DB, affinity=_aff(
        {"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["n1"]}]})), "node(s) didn't match"),
    FitRow("an empty term selects nothing", _template(tolerations=DB, affinity=_aff({})), "node(s) didn't match"),
    FitRow("not enough cpu left", _template(tolerations=DB), "Insufficient cpu", used={"cpu": Fraction(7)}),
    FitRow("exactly enough", _template(tolerations=DB), "", used={"cpu": Fraction(6), "memory": Fraction(15 << 30)}),
    FitRow("an init container asks more than the containers",
           _template(tolerations=DB, initContainers=[{"name": "i", "resources": {"limits": {"cpu": "9"}}}]),
           "Insufficient cpu"),
    FitRow("overhead counts", _template(tolerations=DB, overhead={"memory": "16Gi"}), "Insufficient memory"),
    FitRow("an extended resource the node lacks",
           _template(tolerations=DB, containers=[{"name": "c", "resources": {"requests": {"example.com/x": "1"}}}]),
           "Insufficient example.com/x"),
    FitRow("a host port in use", _template(tolerations=DB, containers=[{"name": "c", "ports": [
        {"containerPort": 80, "hostPort": 8080}]}]), "node(s) didn't have free ports", ports=[HostPort(8080)]),
    FitRow("the same port on UDP is free", _template(tolerations=DB, containers=[{"name": "c", "ports": [
        {"containerPort": 80, "hostPort": 8080, "protocol": "UDP"}]}]), "", ports=[HostPort(8080)]),
    FitRow("two distinct host IPs do not conflict", _template(tolerations=DB, containers=[{"name": "c", "ports": [
        {"containerPort": 80, "hostPort": 8080, "hostIP": "127.0.0.2"}]}]), "",
        ports=[HostPort(8080, "TCP", "127.0.0.1")]),
    FitRow("an unschedulable node", _template(tolerations=DB), "node(s) were unschedulable",
           node=NodeFacts("n1", allocatable=NODE.allocatable, unschedulable=True)),
]


@pytest.mark.parametrize("row", FIT_ROWS, ids=lambda r: r.description)
def test_node_fit(row: FitRow) -> None:
    got = node_fit(parse_pod_constraints(row.spec), row.node, row.used, row.ports)
    assert got.startswith(row.expected) if row.expected else got == ""


def test_parse_node_reads_taints_and_allocatable() -> None:
    facts = parse_node({"metadata": {"name": "n", "labels": {"a": "b"}},
                        "spec": {"taints": [{"key": "k", "effect": "NoExecute"}], "unschedulable": True},
                        "status": {"allocatable": {"cpu": "2", "memory": "1Gi"}}})  # fmt: skip
    assert facts == NodeFacts("n", {"a": "b"}, (Taint("k", "", "NoExecute"),),
                              {"cpu": Fraction(2), "memory": Fraction(1 << 30)}, True)  # fmt: skip


# -- status: what Koordinator writes ------------------------------------------------------------------


def test_available_status() -> None:
    status = available_status({}, "n1", {"cpu": Fraction(2), "memory": Fraction(1 << 30)}, T0)
    assert status["phase"] == "Available" and status["nodeName"] == "n1"
    assert status["allocatable"] == {"cpu": "2", "memory": "1Gi"}
    assert status["allocated"] == {} and status["currentOwners"] == []
    assert [(c["type"], c["status"], c["reason"]) for c in status["conditions"]] == [
        ("Scheduled", "True", "Scheduled"), ("Ready", "True", "Available")]


def test_unschedulable_stays_pending_with_the_reason() -> None:
    status = unschedulable_status({"phase": "Pending"}, "x" * 5000, T0)
    assert status["phase"] == "Pending"
    (cond,) = status["conditions"]
    assert (cond["type"], cond["status"], cond["reason"]) == ("Scheduled", "False", "Unschedulable")
    assert len(cond["message"]) <= 1024
    again = unschedulable_status(status, "y", T0 + 60)["conditions"][0]
    assert again["lastTransitionTime"] == cond["lastTransitionTime"]  # still unschedulable


def test_expired_is_failed_with_ready_false() -> None:
    status = expired_status(available_status({}, "n1", {}, T0), T0 + 10)
    assert status["phase"] == "Failed" and status["nodeName"] == "n1"
    ready = [c for c in status["conditions"] if c["type"] == "Ready"]
    assert [(c["status"], c["reason"]) for c in ready] == [("False", "Expired")]


OWNER = ("u1", "default", "web-0", {"cpu": Fraction(1), "memory": Fraction(1 << 30), "pods": Fraction(1)})


@pytest.mark.parametrize(
    ("once", "owners", "phase", "allocated"),
    [
        (True, [OWNER], "Succeeded", {"cpu": "1"}),  # allocateOnce: the first owner consumes it
        (False, [OWNER], "Available", {"cpu": "1"}),
        (False, [OWNER, ("u2", "default", "web-1", {"cpu": Fraction(1, 2)})], "Available", {"cpu": "1500m"}),
        (True, [], "Available", {}),
    ],
)
def test_owners_status(once: bool, owners: list[Any], phase: str, allocated: dict[str, str]) -> None:
    before = available_status({}, "n1", {"cpu": Fraction(2)}, T0)
    current = (("u0", "default", "gone"),)  # a pod no longer allocated from it
    after = owners_status(before, current, owners, {"cpu": Fraction(2)}, {}, once, T0 + 1)
    assert after is not None
    assert after["phase"] == phase
    assert after["allocated"] == allocated  # masked to the names of allocatable
    assert [o["uid"] for o in after["currentOwners"]] == sorted(o[0] for o in owners)


def test_owners_status_unchanged_is_none() -> None:
    status = available_status({}, "n1", {"cpu": Fraction(2)}, T0)
    got = owners_status(status, (("u1", "default", "web-0"),), [OWNER], {"cpu": Fraction(2)},
                        {"cpu": Fraction(1)}, False, T0)  # fmt: skip
    assert got is None


# -- the reserve pod ---------------------------------------------------------------------------------


def reservation_obj(
    name: str,
    *,
    cpu: str = "2",
    qos: str = "LSR",
    owners: list[dict[str, Any]] | None = None,
    spec: Mapping[str, Any] | None = None,
    template_annotations: Mapping[str, str] | None = None,
    allocate_once: bool | None = None,
    policy: str | None = None,
    ttl: str = "24h",
    expires: str | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "template": {
            "metadata": {"labels": {"koordinator.sh/qosClass": qos}, "annotations": dict(template_annotations or {})},
            "spec": {"priorityClassName": "koord-prod", "containers": [
                {"name": "c", "resources": {"requests": {"cpu": cpu, "memory": "1Gi"},
                                            "limits": {"cpu": cpu, "memory": "1Gi"}}}]},
        },
        "owners": owners if owners is not None else [{"labelSelector": {"matchLabels": {"app": "web"}}}],
        "ttl": ttl,
    }
    if expires is not None:
        body["expires"] = expires
    if allocate_once is not None:
        body["allocateOnce"] = allocate_once
    if policy is not None:
        body["allocatePolicy"] = policy
    body.update(spec or {})
    return {
        "apiVersion": "scheduling.koordinator.sh/v1alpha1",
        "kind": "Reservation",
        "metadata": {"name": name, "uid": f"uid-{name}", "resourceVersion": "1", "creationTimestamp": CREATED,
                     "labels": {}, "annotations": {}},
        "spec": body,
    }


def test_reserve_pod_is_never_placed_into_another_reservation() -> None:
    req = reserve_request(reservation_obj("r", template_annotations={
        "scheduling.koordinator.sh/reservation-affinity": "{}", RS: '{"cpuset":"0-15"}'}))
    assert req.reserve and req.reservation_affinity is None and not req.error
    assert req.koord_wants_cpuset  # LSR, koord-prod by its class name, whole CPUs


# -- the controller on the real cache and binder ----------------------------------------------------


class FakeAPI:
    """The controller's API calls over a dict of Reservations and the cluster's pods."""

    def __init__(self, nodes: list[dict[str, Any]]) -> None:
        self.nodes = {n["metadata"]["name"]: n for n in nodes}
        self.pods: list[dict[str, Any]] = []
        self.reservations: dict[str, dict[str, Any]] = {}
        self.writes: list[str] = []

    async def get_node(self, name: str) -> dict[str, Any]:
        if name not in self.nodes:
            raise NotFoundError(404, "not found")
        return copy.deepcopy(self.nodes[name])

    async def pods_on(self, node: str) -> list[dict[str, Any]]:
        return [copy.deepcopy(p) for p in self.pods if p["spec"].get("nodeName") == node]

    def _bump(self, obj: dict[str, Any]) -> None:
        obj["metadata"]["resourceVersion"] = str(int(obj["metadata"]["resourceVersion"]) + 1)

    async def patch_annotations(self, name: str, annotations: Mapping[str, str], rv: str) -> dict[str, Any]:
        obj = self.reservations[name]
        if obj["metadata"]["resourceVersion"] != rv:
            raise ConflictError(409, "conflict")
        obj["metadata"]["annotations"].update(annotations)
        self._bump(obj)
        self.writes.append(f"annotations {name}")
        return copy.deepcopy(obj)

    async def replace_status(self, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        obj = self.reservations[name]
        if obj["metadata"]["resourceVersion"] != body["metadata"]["resourceVersion"]:
            raise ConflictError(409, "conflict")
        obj["status"] = copy.deepcopy(body["status"])
        self._bump(obj)
        self.writes.append(f"status {name} {obj['status'].get('phase')}")
        return copy.deepcopy(obj)

    async def delete(self, name: str, uid: str) -> None:
        obj = self.reservations.get(name)
        if obj is None:
            raise NotFoundError(404, "not found")
        if obj["metadata"]["uid"] != uid:
            raise ConflictError(409, "precondition failed: uid")
        del self.reservations[name]
        self.writes.append(f"delete {name}")


class Leader:
    def is_leader(self) -> bool:
        return True

    async def write(self, call: Any) -> Any:
        return await call


class Rig:
    """Cache, binder, store and controller; ``sync`` plays the watch."""

    def __init__(self, nodes: Sequence[str] = ("n1",), *, cpu: str = "16") -> None:
        objects = cluster(list(nodes))
        for o in objects:
            if o["kind"] == "Node":
                o["status"]["allocatable"]["cpu"] = cpu
        self.state = ClusterState()
        load_objects(self.state, objects)
        self.api = FakeAPI([o for o in objects if o["kind"] == "Node"])
        self.store = ReservationStore()
        self.binder = Binder(self.state, api=None)  # type: ignore[arg-type]  # reserve() makes no pod call
        self.now = T0 + 10
        self.reserver = Reserver(self.state, self.store, self.api, self.binder, Leader(), clock=lambda: self.now)

    def add(self, obj: dict[str, Any]) -> None:
        self.api.reservations[obj["metadata"]["name"]] = obj
        self.sync()

    def sync(self) -> None:
        items = [copy.deepcopy(o) for o in self.api.reservations.values()]
        self.state.replace("reservations", items)
        self.store.replace(items)
        self.state.replace("pods", [copy.deepcopy(p) for p in self.api.pods])

    def round(self) -> None:
        asyncio.run(self.reserver.round())
        self.sync()

    def get(self, name: str) -> dict[str, Any]:
        return self.api.reservations[name]

    def reserved(self, name: str) -> frozenset[int]:
        return parse_cpu_list(json.loads(self.get(name)["metadata"]["annotations"][RS]).get("cpuset", ""))

    def bind(self, p: dict[str, Any], node: str = "n1") -> dict[str, Any]:
        """Place a pod as the extender's bind does and keep it as the watch would see it."""
        req = decode_pod(p)
        with self.state.lock:
            ns = self.state.node(node)
            assert ns is not None
            placement = plan(ns, req, DEFAULT_CONFIG)
        p = copy.deepcopy(p)
        p["spec"]["nodeName"] = node
        p["spec"]["schedulerName"] = "koord-scheduler"  # counted by the cache as a trusted scheduler's
        p["metadata"]["annotations"].update(placement.annotations)
        p["status"]["phase"] = "Running"
        self.api.pods.append(p)
        self.sync()
        return p


def cpuset_of(p: Mapping[str, Any]) -> frozenset[int]:
    text = p["metadata"]["annotations"].get(RS)
    return parse_cpu_list(json.loads(text).get("cpuset", "")) if text else frozenset()


def web(name: str, cpu: str = "2", *, labels: Mapping[str, str] | None = None) -> dict[str, Any]:
    p = pod(name, cpu=cpu, memory="1Gi")
    p["metadata"]["labels"].update({"app": "web"} if labels is None else labels)
    return p


def test_a_pending_reservation_becomes_available_with_its_cpuset() -> None:
    rig = Rig()
    rig.add(reservation_obj("r1", cpu="4"))
    rig.round()
    r = rig.get("r1")
    assert r["status"]["phase"] == "Available" and r["status"]["nodeName"] == "n1"
    assert r["status"]["allocatable"] == {"cpu": "4", "memory": "1Gi"}
    assert len(rig.reserved("r1")) == 4
    ns = rig.state.node("n1")
    assert ns is not None and "uid-r1" in ns.reservations and "uid-r1" not in ns.held  # the hold gave way


def test_an_owner_lands_in_the_reserved_cpuset_and_a_non_owner_does_not() -> None:
    rig = Rig()
    rig.add(reservation_obj("r1", cpu="4", allocate_once=False))
    rig.round()
    reserved = rig.reserved("r1")
    other = rig.bind(web("batch", "4", labels={"app": "other"}))
    assert not cpuset_of(other) & reserved and RA not in other["metadata"]["annotations"]
    owner = rig.bind(web("web-0", "4"))
    assert cpuset_of(owner) == reserved
    assert json.loads(owner["metadata"]["annotations"][RA])["uid"] == "uid-r1"
    rig.round()
    status = rig.get("r1")["status"]
    assert [o["name"] for o in status["currentOwners"]] == ["web-0"]
    assert status["allocated"] == {"cpu": "4", "memory": "1Gi"} and status["phase"] == "Available"


def test_allocate_once_succeeds_with_its_first_owner_and_frees_the_rest() -> None:
    rig = Rig()
    rig.add(reservation_obj("r1", cpu="4"))
    rig.round()
    reserved = rig.reserved("r1")
    owner = rig.bind(web("web-0", "2"))
    assert cpuset_of(owner) <= reserved
    rig.round()
    assert rig.get("r1")["status"]["phase"] == "Succeeded"
    ns = rig.state.node("n1")
    assert ns is not None and "uid-r1" not in ns.reservations  # no longer counted or matched
    ns.refresh()
    assert reserved - cpuset_of(owner) <= ns.free


def test_an_expired_reservation_releases_what_it_held() -> None:
    rig = Rig()
    rig.add(reservation_obj("r1", cpu="4", ttl="1m"))
    rig.round()
    reserved = rig.reserved("r1")
    ns = rig.state.node("n1")
    assert ns is not None
    ns.refresh()
    assert not reserved & ns.free
    rig.now = T0 + 61
    rig.round()
    r = rig.get("r1")
    assert r["status"]["phase"] == "Failed"
    assert [c["reason"] for c in r["status"]["conditions"] if c["type"] == "Ready"] == ["Expired"]
    ns.refresh()
    assert reserved <= ns.free


def test_a_reservation_no_node_can_take_stays_pending_with_the_reasons() -> None:
    rig = Rig(cpu="16")
    rig.add(reservation_obj("big", cpu="64"))
    rig.round()
    status = rig.get("big")["status"]
    assert status["phase"] == "Pending" and "nodeName" not in status
    (cond,) = status["conditions"]
    assert cond["reason"] == "Unschedulable" and "node n1" in cond["message"]
    writes = len(rig.api.writes)
    rig.round()
    assert len(rig.api.writes) == writes  # the same reasons are not written again


def test_two_reservations_never_share_a_cpu_and_pods_count_with_them() -> None:
    rig = Rig()
    rig.bind(pod("lsr-0", cpu="4", memory="1Gi"))  # a pod placed before
    rig.add(reservation_obj("r1", cpu="6"))
    rig.add(reservation_obj("r2", cpu="6"))
    rig.round()
    a, b = rig.reserved("r1"), rig.reserved("r2")
    held = cpuset_of(rig.api.pods[0])
    assert len(a) == len(b) == 6 and not a & b and not (a | b) & held
    rig.add(reservation_obj("r3", cpu="2"))
    rig.round()
    assert rig.get("r3")["status"]["phase"] == "Pending"  # 16 CPUs: 4 + 6 + 6 taken


def test_node_affinity_taints_and_resources_choose_the_node() -> None:
    rig = Rig(("n1", "n2"))
    rig.api.nodes["n1"]["spec"] = {"taints": [{"key": "dedicated", "value": "db", "effect": "NoSchedule"}]}
    rig.add(reservation_obj("r1", cpu="2"))
    rig.round()
    assert rig.get("r1")["status"]["nodeName"] == "n2"
    rig.add(reservation_obj("r2", cpu="2", spec={"template": {
        **reservation_obj("x")["spec"]["template"],
        "spec": {**reservation_obj("x")["spec"]["template"]["spec"], "nodeSelector": {"nope": "1"}}}}))
    rig.round()
    assert "didn't match Pod's node affinity/selector" in rig.get("r2")["status"]["conditions"][0]["message"]


def test_restricted_reservation_keeps_its_owner_inside() -> None:
    rig = Rig()
    rig.add(reservation_obj("r1", cpu="2", policy="Restricted", allocate_once=False))
    rig.round()
    owner = rig.bind(web("web-0", "4"))  # asks more than it reserved: placed outside it
    assert RA not in owner["metadata"]["annotations"]
    assert not cpuset_of(owner) & rig.reserved("r1")


def test_unschedulable_reservation_takes_no_owner() -> None:
    rig = Rig()
    rig.add(reservation_obj("r1", cpu="2", spec={"unschedulable": True}))
    rig.round()
    assert rig.get("r1")["status"]["phase"] == "Available"
    owner = rig.bind(web("web-0", "2"))
    assert RA not in owner["metadata"]["annotations"] and not cpuset_of(owner) & rig.reserved("r1")


def test_owner_matching_by_object_and_controller() -> None:
    rig = Rig()
    rig.add(reservation_obj("r1", cpu="2", allocate_once=False, owners=[
        {"object": {"name": "exact", "namespace": "default"}},
        {"controller": {"kind": "StatefulSet", "name": "db", "uid": "ss-1", "apiVersion": "apps/v1",
                        "controller": True}}]))
    rig.round()
    reserved = rig.reserved("r1")
    by_name = rig.bind(web("exact", "1", labels={}))
    ctl = web("db-0", "1", labels={})
    ctl["metadata"]["ownerReferences"] = [{"kind": "StatefulSet", "name": "db", "uid": "ss-1",
                                           "apiVersion": "apps/v1", "controller": True}]  # fmt: skip
    by_ctl = rig.bind(ctl)
    stranger = rig.bind(web("web-0", "1", labels={}))
    assert cpuset_of(by_name) | cpuset_of(by_ctl) == reserved
    assert not cpuset_of(stranger) & reserved


def test_the_reservation_is_held_between_plan_and_watch() -> None:
    """Nothing given twice: while the reservation's write is on its way, a pod's plan already
    counts the hold (the binder's one ``plan`` and hold, as for a pod's bind)."""
    rig = Rig(cpu="16")
    obj = reservation_obj("r1", cpu="12")
    rig.add(obj)
    req = reserve_request(obj)
    asyncio.run(rig.binder.reserve(req, "uid-r1", "n1"))  # placed, not yet seen by the watch
    ns = rig.state.node("n1")
    assert ns is not None
    assert not evaluate(ns, decode_pod(pod("lsr", cpu="8", memory="1Gi")), DEFAULT_CONFIG).ok


# -- the property: a pod placed into a reservation holds only what it reserved ---------------------


@settings(max_examples=40, deadline=None)
@given(
    reserved=st.integers(1, 8),
    asked=st.integers(1, 8),
    before=st.integers(0, 6),
    policy=st.sampled_from(["", "Aligned", "Restricted"]),
    full=st.booleans(),
)
def test_a_pod_placed_into_a_reservation_holds_only_reserved_cpus(
    reserved: int, asked: int, before: int, policy: str, full: bool
) -> None:
    rig = Rig()
    if before:
        rig.bind(pod("first", cpu=str(before), memory="1Gi"))
    bind = {"scheduling.koordinator.sh/resource-spec": json.dumps({"preferredCPUBindPolicy": "FullPCPUs"})} if full \
        else {}  # fmt: skip
    rig.add(reservation_obj("r", cpu=str(reserved), policy=policy or None, allocate_once=False,
                            template_annotations=bind))  # fmt: skip
    rig.round()
    if rig.get("r")["status"].get("phase") != "Available":
        return  # did not fit: nothing reserved
    mine = rig.reserved("r")
    owner = web("w", str(asked))
    if full:
        owner["metadata"]["annotations"].update(bind)
    req = decode_pod(owner)
    with rig.state.lock:
        ns = rig.state.node("n1")
        assert ns is not None
        if not evaluate(ns, req, DEFAULT_CONFIG).ok:
            return
    placed = rig.bind(owner)
    got = cpuset_of(placed)
    if RA in placed["metadata"]["annotations"] and asked <= reserved:
        assert got <= mine  # placed into it: only what it reserved
    if RA in placed["metadata"]["annotations"] and policy == "Restricted":
        assert got <= mine
    if RA not in placed["metadata"]["annotations"]:
        assert not got & mine  # placed outside it: none of what it reserved


# -- preemption never takes a pod out of a reservation for one outside it ---------------------------


def test_preemption_keeps_a_reservations_pod_for_a_non_owner() -> None:
    from scheduler_ext.verbs import preempt_nodes

    rig = Rig()
    rig.add(reservation_obj("r1", cpu="8", allocate_once=False))
    rig.round()
    inside = rig.bind(web("web-0", "8"))
    outside = rig.bind(pod("low", cpu="8", memory="1Gi", priority=5000))
    assert cpuset_of(inside) == rig.reserved("r1")
    uids = [inside["metadata"]["uid"], outside["metadata"]["uid"]]
    stranger = decode_pod(pod("high", cpu="8", memory="1Gi"))
    kept = preempt_nodes(rig.state, stranger, {"n1": uids}, DEFAULT_CONFIG)
    assert kept == {"n1": [outside["metadata"]["uid"]]}  # the reservation's pod stays
    only_inside = preempt_nodes(rig.state, stranger, {"n1": [inside["metadata"]["uid"]]}, DEFAULT_CONFIG)
    assert only_inside == {}  # evicting it alone would not help a non-owner: not offered
    owner = decode_pod(web("web-1", "8"))
    assert preempt_nodes(rig.state, owner, {"n1": [inside["metadata"]["uid"]]}, DEFAULT_CONFIG) == {
        "n1": [inside["metadata"]["uid"]]}  # an owner may take its place


# -- the controller's loop ------------------------------------------------------------------------


def test_a_reservation_whose_node_is_gone_fails() -> None:
    rig = Rig(("n1", "n2"))
    rig.add(reservation_obj("r1", cpu="2"))
    rig.round()
    node = rig.get("r1")["status"]["nodeName"]
    rig.state.apply("nodes", "DELETED", {"metadata": {"name": node}})
    rig.round()
    status = rig.get("r1")["status"]
    assert status["phase"] == "Failed"
    (ready,) = [c for c in status["conditions"] if c["type"] == "Ready"]
    assert ready["reason"] == "Expired" and node in ready["message"]


def test_an_unschedulable_reservation_is_tried_again_when_it_changes() -> None:
    rig = Rig(cpu="16")
    rig.add(reservation_obj("big", cpu="64"))
    rig.round()
    assert rig.get("big")["status"]["phase"] == "Pending"
    obj = rig.get("big")
    obj["spec"]["template"]["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "2"}, "limits": {"cpu": "2"}}
    obj["metadata"]["resourceVersion"] = str(int(obj["metadata"]["resourceVersion"]) + 1)
    rig.sync()
    rig.round()  # changed: not held back by the retry delay
    assert rig.get("big")["status"]["phase"] == "Available"


class Follower(Leader):
    def __init__(self) -> None:
        self.leading = False

    def is_leader(self) -> bool:
        return self.leading


def test_only_the_leader_writes_and_an_event_wakes_it() -> None:
    rig = Rig()
    fence = Follower()
    rig.reserver.fence = fence
    rig.reserver.interval = 3600.0  # only events wake it
    for kind in ("nodes", "pods", "noderesourcetopologies", "devices", "reservations"):
        rig.state.heard(kind)

    async def scenario() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(rig.reserver.run(stop))
        await asyncio.sleep(0)
        rig.add(reservation_obj("r1", cpu="2"))
        for _ in range(50):
            await asyncio.sleep(0.01)
        assert "phase" not in rig.get("r1").get("status", {})  # a follower writes nothing
        fence.leading = True
        rig.store.apply("MODIFIED", copy.deepcopy(rig.get("r1")))  # the next event
        deadline = asyncio.get_running_loop().time() + 30
        while rig.get("r1").get("status", {}).get("phase") != "Available":
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.01)
        stop.set()
        rig.reserver._poke()
        await asyncio.wait_for(task, 30)

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"ttl": None}, "the reservation misses the expiration spec"),
        ({"owners": []}, "the reservation misses the owner spec"),
    ],
)
def test_an_invalid_reservation_is_not_placed(change: dict[str, Any], reason: str) -> None:
    """``ValidateReservation``: the cache would not count one without owners or a ttl or
    expires, so placing it would give its CPUs twice; it stays Pending with Koordinator's reason."""
    rig = Rig()
    obj = reservation_obj("r", cpu="2")
    for k, v in change.items():
        if v is None:
            obj["spec"].pop(k)
        else:
            obj["spec"][k] = v
    rig.add(obj)
    rig.round()
    status = rig.get("r")["status"]
    assert status["phase"] == "Pending" and status["conditions"][0]["message"] == reason
    assert RS not in rig.get("r")["metadata"]["annotations"]
