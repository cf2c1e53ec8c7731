"""Hostile Reservation objects against the reservation controller (``scheduler_ext/reserver.py``):
anyone who may create a Reservation controls its template, owners, times and annotations. Each
bad one costs only itself (it stays Pending with the reason, or is left alone), never the round
or the other reservations, and never reserves CPUs it was not given."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from koord_formats.cpulist import parse_cpu_list
from scheduler_ext.reserver import ReservationStore
from tests.scheduler_ext.test_reservation_placing import RS, Rig, reservation_obj


def _template_spec(obj: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = obj["spec"]["template"]["spec"]
    return spec


def _bad(kind: str) -> dict[str, Any]:
    obj = reservation_obj("bad", cpu="2")
    if kind == "containers not a list":
        _template_spec(obj)["containers"] = {"c": 1}
    elif kind == "request of 1e500000":
        _template_spec(obj)["containers"][0]["resources"]["requests"]["cpu"] = "1e500000"
    elif kind == "a million containers":
        _template_spec(obj)["containers"] = [{"name": "c"}] * 1_000_000
    elif kind == "a huge label":
        obj["spec"]["template"]["metadata"]["labels"]["x"] = "v" * (1 << 20)
    elif kind == "bad affinity operator":
        _template_spec(obj)["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [{"key": "k", "operator": "Near"}]}]}}}
    elif kind == "a host port of 70000":
        _template_spec(obj)["containers"][0]["ports"] = [{"containerPort": 1, "hostPort": 70000}]
    elif kind == "ttl of ten thousand years":
        obj["spec"]["ttl"] = "87600000h"
    elif kind == "ttl not a string":
        obj["spec"]["ttl"] = {"h": 1}
    elif kind == "expires not a time":
        obj["spec"]["expires"] = "tomorrow"
    elif kind == "template not an object":
        obj["spec"]["template"] = ["x"]
    elif kind == "owners not a list":
        obj["spec"]["owners"] = "everyone"
    elif kind == "unknown allocatePolicy":
        obj["spec"]["allocatePolicy"] = "Greedy"
    elif kind == "resource-spec garbage":
        obj["spec"]["template"]["metadata"]["annotations"]["scheduling.koordinator.sh/resource-spec"] = "{" * 5000
    else:  # pragma: no cover
        raise AssertionError(kind)
    return obj


KINDS = [
    "containers not a list",
    "request of 1e500000",
    "a million containers",
    "a huge label",
    "bad affinity operator",
    "a host port of 70000",
    "ttl of ten thousand years",
    "ttl not a string",
    "expires not a time",
    "template not an object",
    "owners not a list",
    "unknown allocatePolicy",
    "resource-spec garbage",
]


@pytest.mark.parametrize("kind", KINDS)
def test_a_hostile_reservation_costs_only_itself(kind: str) -> None:
    rig = Rig()
    rig.add(_bad(kind))
    rig.add(reservation_obj("good", cpu="2"))
    rig.round()
    bad = rig.get("bad")["status"]
    assert bad.get("phase") == "Pending" and not bad.get("nodeName")
    (cond,) = bad["conditions"]
    assert cond["reason"] == "Unschedulable" and len(cond["message"]) <= 1024
    assert RS not in rig.get("bad")["metadata"]["annotations"]  # reserved nothing
    assert rig.get("good")["status"]["phase"] == "Available"


def test_a_forged_resource_status_is_replaced_by_what_was_reserved() -> None:
    """A creator writes the resource-status annotation itself (on the reservation and on its
    template) claiming every CPU: it is not counted while Pending, and placing it overwrites it."""
    rig = Rig()
    forged = json.dumps({"cpuset": "0-15"})
    obj = reservation_obj("r", cpu="2", template_annotations={RS: forged})
    obj["metadata"]["annotations"][RS] = forged
    rig.add(obj)
    ns = rig.state.node("n1")
    assert ns is not None
    ns.refresh()
    assert len(ns.free) == 16  # pending: its annotation holds nothing
    rig.round()
    got = parse_cpu_list(json.loads(rig.get("r")["metadata"]["annotations"][RS])["cpuset"])
    assert len(got) == 2
    ns.refresh()
    assert len(ns.free) == 14


def test_a_forged_status_of_a_reservation_that_needs_no_cpuset_is_cleared() -> None:
    rig = Rig()
    obj = reservation_obj("ls", cpu="1500m", qos="LS")  # no cpuset: nothing to reserve exactly
    obj["metadata"]["annotations"][RS] = json.dumps({"cpuset": "0-15"})
    rig.add(obj)
    rig.round()
    assert json.loads(rig.get("ls")["metadata"]["annotations"][RS]) == {}
    ns = rig.state.node("n1")
    assert ns is not None
    ns.refresh()
    assert len(ns.free) == 16


@pytest.mark.parametrize("owners", [[{"uid": "u"}] * 5000, "x", [["nested"]]])
def test_a_hostile_current_owners_is_left_alone(owners: object) -> None:
    rig = Rig()
    rig.add(reservation_obj("r", cpu="2", allocate_once=False))
    rig.round()
    rig.get("r")["status"]["currentOwners"] = owners
    rig.sync()
    rig.round()  # no exception, nothing rewritten from garbage
    assert rig.get("r")["status"]["phase"] == "Available"


def test_store_ignores_objects_without_a_uid() -> None:
    store = ReservationStore()
    store.replace([{"metadata": {"name": "x"}}, {"metadata": {"uid": "u" * 300}}, {"metadata": "x"}])  # type: ignore[list-item]
    store.apply("ADDED", {"metadata": {"name": "y", "uid": 5}})
    assert store.snapshot() == []


def test_a_stale_write_does_not_undo_a_newer_one() -> None:
    """The status is written under the resourceVersion read: a reservation changed since
    (here by its owner) answers 409 and is looked at again with the next event."""
    rig = Rig()
    rig.add(reservation_obj("r", cpu="2"))
    stale = copy.deepcopy(rig.get("r"))
    rig.get("r")["metadata"]["resourceVersion"] = "7"
    rig.store.replace([stale])
    rig.round()
    assert "phase" not in rig.get("r").get("status", {})
    ns = rig.state.node("n1")
    assert ns is not None and not ns.held  # the hold was rolled back


# -- the reservation's devices (GPU reservations) and its conditions (garbage collection) ----------

DA = "scheduling.koordinator.sh/device-allocated"


def test_a_forged_device_allocated_is_replaced_by_what_was_reserved() -> None:
    """A creator claims every GPU in the Reservation's own device-allocated and its template's:
    nothing is booked while it is Pending, and placing it writes the GPUs it was given."""
    from tests.scheduler_ext.test_reservation_gpus import GPURig, gpu_reservation, minors

    rig = GPURig(gpus=2)
    forged = json.dumps({"gpu": [{"minor": m, "resources": {"koordinator.sh/gpu-core": "100"}} for m in range(2)]})
    obj = gpu_reservation("r", "1", template_annotations={DA: forged})
    obj["metadata"]["annotations"][DA] = forged
    rig.add(obj)
    ns = rig.state.node("n1")
    assert ns is not None
    ns.refresh()
    assert not ns.gpu_usage  # pending: its annotation holds nothing
    rig.round()
    assert len(rig.reserved_minors("r")) == 1
    ns.refresh()
    assert sum(u.core for u in ns.gpu_usage.values()) == 100
    plain = reservation_obj("plain", cpu="1", qos="LS")
    plain["metadata"]["annotations"][DA] = forged
    rig.add(plain)
    rig.round()
    assert minors(rig.get("plain")["metadata"]["annotations"]) == frozenset()  # "{}": reserved none


@pytest.mark.parametrize(
    "devices",
    [
        "{" * 5000,
        "x" * (2 << 20),
        json.dumps({"gpu": [{"minor": 10**9, "resources": {}}]}),
        json.dumps({"gpu": [{"minor": -1, "resources": {}}]}),
        json.dumps({"gpu": [{"minor": 0, "resources": {"koordinator.sh/gpu-core": "1e500000"}}]}),
        json.dumps({"gpu": [{"minor": 0}] * 100_000}),
        json.dumps({"gpu": "all"}),
        json.dumps({f"t{i}": [] for i in range(1000)}),
    ],
)
def test_a_hostile_device_allocated_on_an_available_reservation_costs_only_it(devices: str) -> None:
    """An Available reservation whose device-allocated someone rewrote with garbage is not
    read (the cache logs it and keeps the version it last read, as with a garbage
    resource-status); the round goes on, the other reservations are still placed and a GPU pod
    is still placed, outside both."""
    from tests.scheduler_ext.test_reservation_gpus import GPURig, gpu_pod, gpu_reservation, minors

    rig = GPURig(gpus=3)
    rig.add(gpu_reservation("r", "1"))
    rig.round()
    held = rig.reserved_minors("r")
    rig.get("r")["metadata"]["annotations"][DA] = devices
    rig.sync()  # the cache keeps the reservation as it last read it
    rig.add(gpu_reservation("next", "1"))
    rig.round()
    assert rig.get("next")["status"]["phase"] == "Available" and not rig.reserved_minors("next") & held
    placed = rig.bind(gpu_pod("stranger", app="other"))
    assert len(minors(placed["metadata"]["annotations"]) - held - rig.reserved_minors("next")) == 1


@pytest.mark.parametrize(
    "conditions",
    [
        "all of them",
        [{"type": "Ready", "reason": "Expired", "lastTransitionTime": "the dawn of time"}],
        [{"type": "Ready", "reason": "Expired", "lastTransitionTime": "1" * 10_000}],
        [{"type": "Ready", "reason": "Expired", "lastTransitionTime": 5}],
        [{"type": "Ready", "reason": "Expired", "lastTransitionTime": "2026-05-28T20:26:40"}],  # no zone
        [{"type": "Ready", "reason": "Expired"}] * 100_000,
        [["nested"]],
        [{"type": "x" * (1 << 20), "reason": "Expired", "lastTransitionTime": "2000-01-01T00:00:00Z"}],
    ],
)
def test_hostile_conditions_keep_a_finished_reservation_and_cost_only_it(conditions: object) -> None:
    """Garbage collection reads a Failed or Succeeded reservation's conditions: unreadable ones
    keep it (no deletion on a guess), and another one past its retention is still deleted."""
    rig = Rig()
    for name in ("bad", "old"):
        obj = reservation_obj(name, cpu="1")
        obj["status"] = {"phase": "Failed", "conditions": [
            {"type": "Ready", "status": "False", "reason": "Expired",
             "lastTransitionTime": "2000-01-01T00:00:00Z", "lastProbeTime": "2000-01-01T00:00:00Z"}]}  # fmt: skip
        rig.add(obj)
    rig.get("bad")["status"]["conditions"] = conditions
    rig.sync()
    rig.round()
    assert "bad" in rig.api.reservations and "old" not in rig.api.reservations


def test_a_transition_time_in_the_future_is_not_collected() -> None:
    rig = Rig()
    obj = reservation_obj("r", cpu="1")
    obj["status"] = {"phase": "Failed", "conditions": [
        {"type": "Ready", "status": "False", "reason": "Expired", "lastTransitionTime": "9999-12-31T23:59:59Z"}]}
    rig.add(obj)
    rig.round()
    assert "r" in rig.api.reservations


# -- bound pods' requests and the Node's allocatable (a reservation's plain cpu and memory) --------


@pytest.mark.parametrize(
    "resources",
    [
        {"requests": {"cpu": "1e500000"}},
        {"requests": {"cpu": "lots"}},
        {"requests": ["cpu"]},
        {"requests": {f"r{i}": "1" for i in range(100_000)}},
    ],
)
def test_a_bound_pod_with_unreadable_requests_counts_nothing_and_costs_only_itself(resources: object) -> None:
    """The cache reads every bound pod's requests once (to count reservations against other
    pods): one it cannot read counts 0 (kube-scheduler still counts it), and the watch goes on."""
    from tests.scheduler_ext.builders import pod
    from tests.scheduler_ext.test_reservation_plain import ls_pod, ls_reservation

    rig = Rig(cpu="16")
    rig.add(ls_reservation("r", "10"))
    rig.round()
    bad = pod("bad", cpu="1", memory="1Gi", qos="LS", node_name="n1")
    bad["spec"]["containers"][0]["resources"] = resources
    good = pod("good", cpu="2", memory="1Gi", qos="LS", node_name="n1")
    rig.api.pods += [bad, good]
    rig.sync()
    ns = rig.state.node("n1")
    assert ns is not None and ns.requested_total == (2000, 1 << 30)
    from scheduler_ext.decide import DEFAULT_CONFIG, evaluate
    from scheduler_ext.guard import decode_pod

    with rig.state.lock:
        assert evaluate(ns, decode_pod(ls_pod("fits", "4", owner=False)), DEFAULT_CONFIG).ok  # 16 - 2 - 10
        assert not evaluate(ns, decode_pod(ls_pod("over", "5", owner=False)), DEFAULT_CONFIG).ok


@pytest.mark.parametrize("allocatable", [{"cpu": "1e500000", "memory": "1Gi"}, "all", {"cpu": "16"}, None])
def test_a_node_with_unreadable_allocatable_is_left_to_kube_scheduler(allocatable: object) -> None:
    from tests.scheduler_ext.test_reservation_plain import ls_reservation

    rig = Rig(cpu="16")
    rig.add(ls_reservation("r", "10"))
    rig.round()
    node = copy.deepcopy(rig.api.nodes["n1"])
    node["status"]["allocatable"] = allocatable
    rig.state.apply("nodes", "MODIFIED", node)
    ns = rig.state.node("n1")
    assert ns is not None and ns.allocatable is None and ns.node_seen
