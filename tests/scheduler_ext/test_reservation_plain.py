"""A reservation's plain cpu and memory against pods that do not own it (issue 38): Koordinator
counts each Available reservation's reserve pod on its node with ``status.allocatable`` minus
``status.allocated`` (what its owners do not use yet), so a pod that does not match it sees
those as taken and kube-scheduler's NodeResourcesFit says "Insufficient cpu". kube-scheduler
with this extender counts pods only: the extender's filter adds the reservations' share.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from scheduler_ext.decide import DEFAULT_CONFIG, evaluate
from scheduler_ext.guard import decode_pod
from tests.scheduler_ext.builders import pod
from tests.scheduler_ext.test_reservation_placing import Rig, reservation_obj, web


def ls_reservation(name: str, cpu: str, memory: str = "1Gi", **kw: Any) -> dict[str, Any]:
    """An LS template: plain requests, no cpuset (only its plain cpu and memory hold anything)."""
    obj = reservation_obj(name, cpu=cpu, qos="LS", allocate_once=False, **kw)
    res = obj["spec"]["template"]["spec"]["containers"][0]["resources"]
    res["requests"]["memory"] = res["limits"]["memory"] = memory
    return obj


def ls_pod(name: str, cpu: str, memory: str = "1Gi", *, owner: bool) -> dict[str, Any]:
    p = web(name, cpu, labels={"app": "web" if owner else "other"})
    p["metadata"]["labels"]["koordinator.sh/qosClass"] = "LS"
    res = p["spec"]["containers"][0]["resources"]
    res["requests"]["memory"] = res["limits"]["memory"] = memory
    return p


@dataclass(frozen=True)
class Row:
    description: str
    reserved_cpu: str  # the reservation's template cpu (node: 16 CPUs, 512Gi)
    pod_cpu: str
    owner: bool
    expected: str  # "" fits, else the reason
    before: list[tuple[str, bool]] = field(default_factory=list)  # (cpu, owner) of pods bound first
    reserved_memory: str = "1Gi"
    pod_memory: str = "1Gi"
    policy: str | None = None


ROWS = [
    Row("a non-owner does not get the reserved cpu", "10", "8", False, "Insufficient cpu"),
    Row("a non-owner gets what is left beside it", "10", "6", False, ""),
    Row("an owner gets the reserved cpu", "10", "8", True, ""),
    Row("an owner may add the node's cpu beside it (Default)", "10", "16", True, ""),
    Row("other pods count too", "10", "4", False, "Insufficient cpu", before=[("3", False)]),
    Row("an owner's pod uses the reservation up: nothing more is held", "10", "6", False, "",
        before=[("10", True)]),
    Row("what an owner uses is not counted twice", "10", "6", False, "", before=[("2", True)]),  # 16 - 2 - 8
    Row("...and what it leaves is still held", "10", "7", False, "Insufficient cpu", before=[("2", True)]),
    Row("memory likewise", "1", "1", False, "Insufficient memory", reserved_memory="500Gi", pod_memory="20Gi"),
    Row("both", "10", "8", False, "Insufficient cpu, Insufficient memory", reserved_memory="500Gi",
        pod_memory="20Gi"),
    Row("a Restricted reservation the owner does not fit in holds for it as for any other", "4", "8", True,
        "Insufficient cpu", before=[("6", False)], policy="Restricted"),
]


@pytest.mark.parametrize("row", [pytest.param(r, id=r.description) for r in ROWS])
def test_a_reservations_plain_requests_against_other_pods(row: Row) -> None:
    rig = Rig(cpu="16")
    rig.add(ls_reservation("r", row.reserved_cpu, row.reserved_memory, policy=row.policy))
    rig.round()
    assert rig.get("r")["status"]["phase"] == "Available"
    for i, (cpu, owner) in enumerate(row.before):
        rig.bind(ls_pod(f"before-{i}", cpu, owner=owner))
    rig.round()  # status.allocated follows the owners
    with rig.state.lock:
        ns = rig.state.node("n1")
        assert ns is not None
        verdict = evaluate(ns, decode_pod(ls_pod("p", row.pod_cpu, row.pod_memory, owner=row.owner)), DEFAULT_CONFIG)
    assert (verdict.ok, verdict.reason) == (not row.expected, row.expected)


def test_an_expired_reservation_holds_nothing_more() -> None:
    rig = Rig(cpu="16")
    rig.add(ls_reservation("r", "10", ttl="1m"))
    rig.round()
    rig.now += 61
    rig.round()
    assert rig.get("r")["status"]["phase"] == "Failed"
    with rig.state.lock:
        ns = rig.state.node("n1")
        assert ns is not None
        assert evaluate(ns, decode_pod(ls_pod("p", "16", owner=False)), DEFAULT_CONFIG).ok


def test_a_node_whose_allocatable_cannot_be_read_is_left_to_kube_scheduler() -> None:
    rig = Rig(cpu="16")
    rig.add(ls_reservation("r", "10"))
    rig.round()
    node = rig.api.nodes["n1"]
    node["status"]["allocatable"] = {"cpu": "lots"}
    rig.state.apply("nodes", "MODIFIED", node)
    with rig.state.lock:
        ns = rig.state.node("n1")
        assert ns is not None and ns.allocatable is None
        assert evaluate(ns, decode_pod(ls_pod("p", "16", owner=False)), DEFAULT_CONFIG).ok


def test_a_deleted_pod_gives_back_its_requests() -> None:
    rig = Rig(cpu="16")
    rig.add(ls_reservation("r", "10"))
    rig.round()
    p = rig.bind(pod("x", cpu="4", memory="1Gi", qos="LS"))
    with rig.state.lock:
        ns = rig.state.node("n1")
        assert ns is not None and ns.requested_total == (4000, 1 << 30)
    rig.api.pods.remove(p)
    rig.sync()
    with rig.state.lock:
        assert ns.requested_total == (0, 0)
        assert evaluate(ns, decode_pod(ls_pod("q", "6", owner=False)), DEFAULT_CONFIG).ok


def test_an_owner_counts_at_once_before_the_status_follows() -> None:
    """The owners' use is read from the cache's pods too: between an owner's bind and the
    controller's next round (``status.allocated`` still empty) the node is not counted twice."""
    rig = Rig(cpu="16")
    rig.add(ls_reservation("r", "10"))
    rig.round()
    rig.bind(ls_pod("web-0", "8", owner=True))
    assert not rig.get("r")["status"]["allocated"]  # no round yet
    with rig.state.lock:
        ns = rig.state.node("n1")
        assert ns is not None
        assert evaluate(ns, decode_pod(ls_pod("p", "6", owner=False)), DEFAULT_CONFIG).ok  # 16 - 8 - 2
        verdict = evaluate(ns, decode_pod(ls_pod("q", "7", owner=False)), DEFAULT_CONFIG)
        assert verdict.reason == "Insufficient cpu"
