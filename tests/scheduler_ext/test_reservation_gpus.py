"""GPU reservations placed and consumed (issue 38): a Reservation whose template asks for GPUs is
placed by the extender's one feasibility function, holds specific GPU minors in its own
``device-allocated`` annotation (the format of a pod's, as Koordinator's deviceshare
``PreBindReservation`` writes it on the Reservation), an owner placed into it takes its GPUs among
those minors only, and every other pod sees them as used (``deviceshare/reservation.go``: the
reserved devices of a reservation the pod does not match are not free for it).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from koord_formats.reservation import parse_reservation
from scheduler_ext.allocator import AllocationError
from scheduler_ext.binder import Binder
from scheduler_ext.decide import DEFAULT_CONFIG, evaluate
from scheduler_ext.guard import decode_pod
from scheduler_ext.reservations import fold, reserved_gpus
from scheduler_ext.reserver import ReservationStore, Reserver
from scheduler_ext.state import ClusterState, load_objects
from tests.scheduler_ext.builders import cluster, reservation
from tests.scheduler_ext.test_reservation_placing import (
    RA,
    T0,
    FakeAPI,
    Leader,
    Rig,
    cpuset_of,
    reservation_obj,
    web,
)

DA = "scheduling.koordinator.sh/device-allocated"
GPU = "nvidia.com/gpu"


class GPURig(Rig):
    """``Rig`` on nodes with ``gpus`` GPUs each (a Device CR; the Node's allocatable lists them)."""

    def __init__(self, nodes: Sequence[str] = ("n1",), *, gpus: int = 2, cpu: str = "16") -> None:
        objects = cluster(list(nodes), gpus=gpus)
        for o in objects:
            if o["kind"] == "Node":
                o["status"]["allocatable"].update({"cpu": cpu, GPU: str(gpus),
                                                   "koordinator.sh/gpu-core": str(100 * gpus),
                                                   "koordinator.sh/gpu-memory-ratio": str(100 * gpus)})  # fmt: skip
        self.state = ClusterState()
        load_objects(self.state, objects)
        self.api = FakeAPI([o for o in objects if o["kind"] == "Node"])
        self.store = ReservationStore()
        self.binder = Binder(self.state, api=None)  # type: ignore[arg-type]
        self.now = T0 + 10
        self.reserver = Reserver(self.state, self.store, self.api, self.binder, Leader(), clock=lambda: self.now)

    def reserved_minors(self, name: str) -> frozenset[int]:
        return minors(self.get(name)["metadata"]["annotations"])


def minors(annotations: dict[str, str]) -> frozenset[int]:
    text = annotations.get(DA)
    return frozenset(d["minor"] for d in json.loads(text).get("gpu", [])) if text else frozenset()


def gpu_reservation(name: str, gpus: str = "1", *, cpu: str = "1", qos: str = "LS", extra: dict[str, str] | None = None,
                    **kw: Any) -> dict[str, Any]:  # fmt: skip
    obj = reservation_obj(name, cpu=cpu, qos=qos, allocate_once=False, **kw)
    res = obj["spec"]["template"]["spec"]["containers"][0]["resources"]
    amounts = {GPU: gpus} if extra is None else extra
    res["requests"].update(amounts)
    res["limits"].update(amounts)
    return obj


def gpu_pod(name: str, gpus: str = "1", *, cpu: str = "1", app: str = "web", qos: str = "LS",
            extra: dict[str, str] | None = None) -> dict[str, Any]:  # fmt: skip
    p = web(name, cpu, labels={"app": app})
    p["metadata"]["labels"]["koordinator.sh/qosClass"] = qos
    res = p["spec"]["containers"][0]["resources"]
    amounts = {GPU: gpus} if extra is None else extra
    res["requests"].update(amounts)
    res["limits"].update(amounts)
    return p


# -- table: the GPU fields of a Reservation ----------------------------------------------------------


def _gpu_entry(minor: int, core: str, ratio: str, memory: str | None = None) -> dict[str, Any]:
    res = {"koordinator.sh/gpu-core": core, "koordinator.sh/gpu-memory-ratio": ratio}
    if memory is not None:
        res["koordinator.sh/gpu-memory"] = memory
    return {"minor": minor, "resources": res, "id": f"GPU-{minor}"}


@pytest.mark.parametrize(
    ("devices", "expected"),
    [
        ({"gpu": [_gpu_entry(0, "100", "100", "80Gi")]}, {0: (100, 100, 80 << 30)}),  # a whole card
        ({"gpu": [_gpu_entry(0, "100", "100"), _gpu_entry(3, "100", "100")]}, {0: (100, 100, 0), 3: (100, 100, 0)}),
        ({"gpu": [_gpu_entry(1, "50", "50", "40Gi")]}, {1: (50, 50, 40 << 30)}),  # a share of one card
        ({"gpu": [_gpu_entry(1, "25", "25"), _gpu_entry(1, "25", "25")]}, {1: (50, 50, 0)}),  # one minor twice: summed
        ({"rdma": [{"minor": 0, "resources": {"koordinator.sh/rdma": "100"}}]}, {}),  # not a GPU
        ({}, {}),  # "{}": reserved none (what the controller writes for a template without GPUs)
    ],
)
def test_reserved_gpus_read_the_reservations_device_allocated(
    devices: dict[str, Any], expected: dict[int, tuple[int, int, int]]
) -> None:
    r = parse_reservation(reservation("r", "n1", annotations={DA: json.dumps(devices)}))
    assert reserved_gpus(r) == expected


def test_a_template_without_device_allocated_reserves_no_gpu() -> None:
    assert reserved_gpus(parse_reservation(reservation("r", "n1"))) == {}


@pytest.mark.parametrize(
    ("reserved", "held", "remained"),
    [
        ({0: (100, 100, 0)}, [], {0: (100, 100, 0)}),  # nobody in it yet: all of it held for owners
        ({0: (100, 100, 0)}, [(0, 100, 100, 0)], {}),  # its owner holds the card: nothing more
        ({0: (100, 100, 0), 1: (100, 100, 0)}, [(1, 100, 100, 0)], {0: (100, 100, 0)}),
        ({0: (50, 50, 0)}, [(0, 20, 20, 0)], {0: (30, 30, 0)}),  # a share, partly used
        ({0: (50, 50, 0)}, [(0, 80, 80, 0)], {}),  # owners above what it reserved: never below 0
        ({0: (100, 100, 0)}, [(5, 100, 100, 0)], {0: (100, 100, 0)}),  # a minor it did not reserve is not its
    ],
)
def test_gpu_remained(reserved: dict[int, tuple[int, int, int]], held: list[tuple[int, int, int, int]],
                      remained: dict[int, tuple[int, int, int]]) -> None:  # fmt: skip
    devices = {"gpu": [_gpu_entry(m, str(c), str(q)) for m, (c, q, _) in reserved.items()]}
    r = parse_reservation(reservation("r", "n1", annotations={DA: json.dumps(devices)}))
    (nr,) = fold([r], [(r.uid, frozenset(), {}, {}, held)])
    assert nr.gpu_remained == remained


# -- the controller places it, owners consume it ------------------------------------------------------


def test_a_gpu_reservation_becomes_available_holding_specific_minors() -> None:
    rig = GPURig(gpus=2)
    rig.add(gpu_reservation("r1", "1"))
    rig.round()
    r = rig.get("r1")
    assert r["status"]["phase"] == "Available" and r["status"]["allocatable"][GPU] == "1"
    (entry,) = json.loads(r["metadata"]["annotations"][DA])["gpu"]
    assert entry["minor"] in (0, 1) and entry["id"] == f"GPU-n1-{entry['minor']}"
    assert entry["resources"]["koordinator.sh/gpu-core"] == "100"
    ns = rig.state.node("n1")
    assert ns is not None and "uid-r1" not in ns.held  # the reservation's annotation is the record now
    ns.refresh()
    assert ns.gpu_usage[entry["minor"]].core == 100  # booked for everyone else


def test_a_gpu_owner_gets_the_reserved_minor_and_a_non_owner_never_does() -> None:
    rig = GPURig(gpus=2)
    rig.add(gpu_reservation("r1", "1"))
    rig.round()
    mine = rig.reserved_minors("r1")
    other = rig.bind(gpu_pod("stranger", app="other"))
    assert not minors(other["metadata"]["annotations"]) & mine and RA not in other["metadata"]["annotations"]
    with rig.state.lock:  # the node's one free card is gone: a second stranger does not fit
        ns = rig.state.node("n1")
        assert ns is not None
        verdict = evaluate(ns, decode_pod(gpu_pod("stranger-2", app="other")), DEFAULT_CONFIG)
    assert not verdict.ok and "insufficient GPU" in verdict.reason
    owner = rig.bind(gpu_pod("web-0"))
    assert minors(owner["metadata"]["annotations"]) == mine
    assert json.loads(owner["metadata"]["annotations"][RA])["uid"] == "uid-r1"
    rig.round()
    assert rig.get("r1")["status"]["allocated"][GPU] == "1"


def test_a_gpu_reservation_that_does_not_fit_stays_pending_with_the_reason() -> None:
    rig = GPURig(gpus=1)
    rig.add(gpu_reservation("r1", "2"))
    rig.round()
    status = rig.get("r1")["status"]
    assert status["phase"] == "Pending" and "GPU" in status["conditions"][0]["message"]


def test_two_gpu_reservations_never_share_a_card() -> None:
    rig = GPURig(gpus=2)
    rig.add(gpu_reservation("a", "1"))
    rig.add(gpu_reservation("b", "1"))
    rig.round()
    assert rig.reserved_minors("a") and rig.reserved_minors("b")
    assert not rig.reserved_minors("a") & rig.reserved_minors("b")
    rig.add(gpu_reservation("c", "1"))
    rig.round()
    assert rig.get("c")["status"]["phase"] == "Pending"


def test_an_owner_asking_more_gpus_than_reserved_is_placed_outside_it() -> None:
    rig = GPURig(gpus=3)
    rig.add(gpu_reservation("r1", "1"))
    rig.round()
    mine = rig.reserved_minors("r1")
    p = rig.bind(gpu_pod("web-big", "2"))
    assert RA not in p["metadata"]["annotations"] and not minors(p["metadata"]["annotations"]) & mine


def test_a_shared_gpu_reservation_leaves_the_rest_of_the_card() -> None:
    share = {"koordinator.sh/gpu-core": "50", "koordinator.sh/gpu-memory-ratio": "50"}
    rig = GPURig(gpus=1)
    rig.add(gpu_reservation("r1", extra=share))
    rig.round()
    assert rig.get("r1")["status"]["phase"] == "Available" and rig.reserved_minors("r1") == {0}
    other = rig.bind(gpu_pod("stranger", app="other", extra=share))  # the other half
    assert minors(other["metadata"]["annotations"]) == {0} and RA not in other["metadata"]["annotations"]
    with rig.state.lock, pytest.raises(AllocationError):
        ns = rig.state.node("n1")
        assert ns is not None
        from scheduler_ext.decide import plan

        plan(ns, decode_pod(gpu_pod("stranger-2", app="other", extra=share)), DEFAULT_CONFIG)
    owner = rig.bind(gpu_pod("web-0", extra=share))  # the reserved half is the owner's
    assert json.loads(owner["metadata"]["annotations"][RA])["uid"] == "uid-r1"


def test_an_expired_gpu_reservation_frees_its_cards() -> None:
    rig = GPURig(gpus=1)
    rig.add(gpu_reservation("r1", "1", ttl="1m"))
    rig.round()
    rig.now = T0 + 61
    rig.round()
    assert rig.get("r1")["status"]["phase"] == "Failed"
    other = rig.bind(gpu_pod("stranger", app="other"))
    assert minors(other["metadata"]["annotations"]) == {0}


# -- the property -----------------------------------------------------------------------------------------


@settings(max_examples=40, deadline=None, derandomize=True)
@given(
    node_gpus=st.integers(1, 4),
    reserved_gpus_=st.integers(1, 3),
    reserved_cpus=st.integers(1, 6),
    asked_gpus=st.integers(1, 4),
    asked_cpus=st.integers(1, 6),
    before=st.integers(0, 2),
    policy=st.sampled_from(["", "Aligned", "Restricted"]),
    owner=st.booleans(),
)
def test_a_pod_placed_into_a_reservation_holds_only_what_it_reserved(
    node_gpus: int, reserved_gpus_: int, reserved_cpus: int, asked_gpus: int, asked_cpus: int, before: int,
    policy: str, owner: bool,
) -> None:  # fmt: skip
    """Whatever the sizes: a pod placed into the reservation (``reservation-allocated``) holds no
    GPU minor it did not reserve, and no CPU it did not reserve when the reservation's CPUs
    cover the pod's (Default and Aligned may add the node's CPUs beyond them, as Koordinator's
    do); a pod not placed into it holds none of its CPUs and none of its whole cards."""
    rig = GPURig(gpus=node_gpus)
    if before:
        rig.bind(gpu_pod("first", str(before), app="other", qos="LSR")) if before <= node_gpus else None
    rig.add(gpu_reservation("r", str(reserved_gpus_), cpu=str(reserved_cpus), qos="LSR", policy=policy or None))
    rig.round()
    if rig.get("r")["status"].get("phase") != "Available":
        return  # did not fit: nothing reserved
    cpus_r, gpus_r = rig.reserved("r"), rig.reserved_minors("r")
    assert len(gpus_r) == reserved_gpus_ and len(cpus_r) == reserved_cpus
    p = gpu_pod("w", str(asked_gpus), cpu=str(asked_cpus), app="web" if owner else "other", qos="LSR")
    with rig.state.lock:
        ns = rig.state.node("n1")
        assert ns is not None
        if not evaluate(ns, decode_pod(copy.deepcopy(p)), DEFAULT_CONFIG).ok:
            return
    placed = rig.bind(p)
    ann = placed["metadata"]["annotations"]
    got_cpus, got_gpus = cpuset_of(placed), minors(ann)
    assert len(got_gpus) == asked_gpus
    if RA in ann:
        assert owner
        assert got_gpus <= gpus_r
        if asked_cpus <= reserved_cpus or policy == "Restricted":
            assert got_cpus <= cpus_r
    else:
        assert not got_gpus & gpus_r and not got_cpus & cpus_r
