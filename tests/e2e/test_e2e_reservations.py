"""Issue 38 items 1 and 2 on the real cluster: kube-scheduler -> ``scheduler-ext`` (its
reservation controller, ``scheduler_ext/reserver.py``) -> kube-apiserver, with Koordinator's
Reservation CRD (``packaging/crds/reservation.yaml``) and the RBAC of
``packaging/scheduler/rbac.yaml`` (``reservations`` patch, ``reservations/status`` update).

- A Reservation becomes Available on the node with the reserved cpuset in its
  ``resource-status`` annotation; an owner pod lands in it with exactly that cpuset and
  ``reservation-allocated``, the reservation's ``currentOwners`` follows; a non-owner pod gets
  none of its CPUs.
- A reservation that expires (``spec.expires``) becomes Failed (Ready False, Expired) and what it
  held is free: a pod that could not be placed while it held the node's CPUs is placed after.
- A GPU reservation holds a card (its ``device-allocated``) that only its owner gets.

Counting is checked on API-only nodes (``tests/e2e/extenderlib.py``).
"""

from __future__ import annotations

import datetime
import json
import time
from typing import Any

import pytest

from koord_formats.cpulist import parse_cpu_list
from tests.e2e.conftest import REPO, Stack, pod_manifest
from tests.e2e.extenderlib import (
    API_ONLY_LABEL,
    RESERVATION_ALLOCATED,
    STATUS,
    annotations_of,
    api_call,
    api_only_node,
    lsr,
    on_node,
    one_runtime,
    wait_bound,
    wait_event,
)

CRD = REPO / "packaging" / "crds" / "reservation.yaml"


@pytest.fixture(autouse=True)
def _containerd_21_only(stack: Stack) -> None:
    one_runtime(stack)


def _install_crd(stack: Stack) -> None:
    stack.cluster.apply(CRD.read_text())
    stack.cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                          "crd/reservations.scheduling.koordinator.sh")  # fmt: skip


def _reservation(name: str, node: str, cpus: int, owner_label: str, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "template": {
            "metadata": {"labels": {"koordinator.sh/qosClass": "LSR"}},
            "spec": {
                "priorityClassName": "koord-prod",
                "nodeSelector": {API_ONLY_LABEL: node},
                "tolerations": [{"operator": "Exists"}],
                "containers": [{"name": "r", "resources": {
                    "requests": {"cpu": str(cpus), "memory": "32Mi"},
                    "limits": {"cpu": str(cpus), "memory": "32Mi"}}}],
            },
        },
        "owners": [{"labelSelector": {"matchLabels": {"rhp-e2e/owner": owner_label}}}],
        "allocateOnce": False,
    }
    body.update(spec)
    if "expires" not in body:
        body["ttl"] = "1h"
    return {"apiVersion": "scheduling.koordinator.sh/v1alpha1", "kind": "Reservation",
            "metadata": {"name": name}, "spec": body}  # fmt: skip


def _wait_phase(stack: Stack, name: str, phase: str, timeout: float = 90.0) -> dict[str, Any]:
    def reached() -> dict[str, Any] | None:
        r = stack.cluster.get_json("reservation.scheduling.koordinator.sh", name)
        return r if r is not None and (r.get("status") or {}).get("phase") == phase else None

    try:
        return stack.cluster.wait_for(reached, what=f"Reservation {name} {phase}", timeout=timeout,
                                      log="scheduler-ext")  # fmt: skip
    except Exception:
        print(stack.cluster.kubectl("get", "reservation", name, "-o", "json", check=False).stdout)
        raise


def _reserved(r: dict[str, Any]) -> frozenset[int]:
    return parse_cpu_list(json.loads(r["metadata"]["annotations"][STATUS]).get("cpuset", ""))


def _cpuset(pod: dict[str, Any]) -> frozenset[int]:
    text = annotations_of(pod).get(STATUS)
    return parse_cpu_list(json.loads(text).get("cpuset", "")) if text else frozenset()


def _delete_reservation(stack: Stack, name: str) -> None:
    stack.cluster.kubectl("delete", "reservation.scheduling.koordinator.sh", name, "--ignore-not-found",
                          "--wait=false", check=False)  # fmt: skip


def test_a_reservation_is_placed_and_its_owner_lands_in_it(stack: Stack, ns: str) -> None:
    _install_crd(stack)
    cluster = stack.cluster
    with api_only_node(cluster, cores=2) as node:  # 4 CPUs
        try:
            cluster.apply(_reservation("rhp-e2e-r1", node, 2, ns))
            r = _wait_phase(stack, "rhp-e2e-r1", "Available")
            assert r["status"]["nodeName"] == node
            reserved = _reserved(r)
            assert len(reserved) == 2, r["metadata"]["annotations"]
            conditions = {c["type"]: (c["status"], c["reason"]) for c in r["status"]["conditions"]}
            assert conditions == {"Scheduled": ("True", "Scheduled"), "Ready": ("True", "Available")}

            cluster.apply(on_node(lsr("stranger", ns, 2), node))
            stranger = wait_bound(cluster, ns, "stranger")
            assert not _cpuset(stranger) & reserved and RESERVATION_ALLOCATED not in annotations_of(stranger)

            owner = on_node(lsr("owner", ns, 2), node)
            owner["metadata"].setdefault("labels", {})["rhp-e2e/owner"] = ns
            cluster.apply(owner)
            placed = wait_bound(cluster, ns, "owner")
            assert _cpuset(placed) == reserved
            assert json.loads(annotations_of(placed)[RESERVATION_ALLOCATED])["uid"] == r["metadata"]["uid"]

            def owned() -> dict[str, Any] | None:
                got = cluster.get_json("reservation.scheduling.koordinator.sh", "rhp-e2e-r1")
                owners = ((got or {}).get("status") or {}).get("currentOwners") or []
                return got if [o.get("name") for o in owners] == ["owner"] else None

            got = cluster.wait_for(owned, what="currentOwners of rhp-e2e-r1", timeout=60, log="scheduler-ext")
            assert got["status"]["allocated"].get("cpu") == "2"
        finally:
            _delete_reservation(stack, "rhp-e2e-r1")


def _placed_soon(stack: Stack, ns: str, node: str) -> dict[str, Any]:
    """An LSR pod of 2 CPUs bound to ``node``: made again (a fresh pod is scheduled at once)
    while the extender's cache may not have seen the reservation fail yet."""
    cluster = stack.cluster
    deadline = time.monotonic() + 120
    attempt = 0
    while True:
        attempt += 1
        name = f"after-{attempt}"
        cluster.apply(on_node(lsr(name, ns, 2), node))
        try:
            return wait_bound(cluster, ns, name, timeout=15)
        except Exception:
            if time.monotonic() > deadline:
                raise
            cluster.kubectl("delete", "pod", name, "-n", ns, "--wait=false", check=False)


def test_an_expired_reservation_releases_what_it_held(stack: Stack, ns: str) -> None:
    _install_crd(stack)
    cluster = stack.cluster
    with api_only_node(cluster, cores=1) as node:  # 2 CPUs
        try:
            expires = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=40)
            cluster.apply(_reservation("rhp-e2e-r2", node, 2, ns,
                                       expires=expires.strftime("%Y-%m-%dT%H:%M:%SZ")))  # fmt: skip
            r = _wait_phase(stack, "rhp-e2e-r2", "Available")
            held = _reserved(r)
            assert len(held) == 2
            cluster.apply(on_node(lsr("before", ns, 2), node))
            wait_event(cluster, ns, "before", "not enough cpus")  # its CPUs are the reservation's
            cluster.kubectl("delete", "pod", "before", "-n", ns, "--wait=false")
            left = (expires - datetime.datetime.now(datetime.UTC)).total_seconds()
            r = _wait_phase(stack, "rhp-e2e-r2", "Failed", timeout=max(left, 0) + 90)
            ready = [(c["status"], c["reason"]) for c in r["status"]["conditions"] if c["type"] == "Ready"]
            assert ready == [("False", "Expired")]
            assert _cpuset(_placed_soon(stack, ns, node)) == held
        finally:
            _delete_reservation(stack, "rhp-e2e-r2")


DEVICE_CRD = REPO / "packaging" / "crds" / "device.yaml"
DEVICE_ALLOCATED = "scheduling.koordinator.sh/device-allocated"


def _gpu_minors(obj: dict[str, Any]) -> frozenset[int]:
    text = annotations_of(obj).get(DEVICE_ALLOCATED)
    return frozenset(d["minor"] for d in json.loads(text).get("gpu", [])) if text else frozenset()


def _gpu_pod(name: str, ns: str, node: str, owner: str | None) -> dict[str, Any]:
    res = {"cpu": "100m", "memory": "32Mi", "nvidia.com/gpu": "1"}
    pod = on_node(pod_manifest(name, ns, qos="LS", requests=res, limits=res), node)
    if owner is not None:
        pod["metadata"].setdefault("labels", {})["rhp-e2e/owner"] = owner
    return pod


def test_a_gpu_reservation_holds_its_card_for_its_owner(stack: Stack, ns: str) -> None:
    """Issue 38: a GPU reservation on an API-only node with two GPUs (a Device CR, and
    ``nvidia.com/gpu`` in the Node's allocatable as a device plugin would report it) becomes
    Available holding one minor in its ``device-allocated``; a non-owner gets the other card, an
    owner gets the reserved one."""
    _install_crd(stack)
    cluster = stack.cluster
    cluster.apply(DEVICE_CRD.read_text())
    cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                    "crd/devices.scheduling.koordinator.sh")  # fmt: skip
    with api_only_node(cluster, cores=1) as node:
        gpus = {"nvidia.com/gpu": "2"}
        code, _ = api_call(cluster, "PATCH", f"/api/v1/nodes/{node}/status",
                           {"status": {"capacity": gpus, "allocatable": gpus}},
                           content_type="application/merge-patch+json")  # fmt: skip
        assert code == 200
        cluster.apply({"apiVersion": "scheduling.koordinator.sh/v1alpha1", "kind": "Device",
                       "metadata": {"name": node}, "spec": {"devices": [
                           {"type": "gpu", "id": f"GPU-{node}-{m}", "minor": m, "health": True,
                            "resources": {"koordinator.sh/gpu-core": "100", "koordinator.sh/gpu-memory": "16Gi",
                                          "koordinator.sh/gpu-memory-ratio": "100"},
                            "topology": {"socketID": 0, "nodeID": 0, "pcieID": "pci0", "busID": f"0000:0{m}:00.0"}}
                           for m in (0, 1)]}})  # fmt: skip
        try:
            r = _reservation("rhp-e2e-gpu", node, 1, ns)
            res = {"cpu": "100m", "memory": "32Mi", "nvidia.com/gpu": "1"}
            r["spec"]["template"]["metadata"]["labels"]["koordinator.sh/qosClass"] = "LS"
            r["spec"]["template"]["spec"]["containers"][0]["resources"] = {"requests": res, "limits": res}
            cluster.apply(r)
            placed = _wait_phase(stack, "rhp-e2e-gpu", "Available", timeout=180)  # the Device may come late
            reserved = _gpu_minors(placed)
            assert len(reserved) == 1, placed["metadata"]["annotations"]

            cluster.apply(_gpu_pod("stranger", ns, node, None))
            stranger = wait_bound(cluster, ns, "stranger")
            assert len(_gpu_minors(stranger)) == 1 and not _gpu_minors(stranger) & reserved
            assert RESERVATION_ALLOCATED not in annotations_of(stranger)

            cluster.apply(_gpu_pod("owner", ns, node, ns))
            owner = wait_bound(cluster, ns, "owner")
            assert _gpu_minors(owner) == reserved
            assert json.loads(annotations_of(owner)[RESERVATION_ALLOCATED])["uid"] == placed["metadata"]["uid"]
        finally:
            _delete_reservation(stack, "rhp-e2e-gpu")
            cluster.kubectl("delete", "device.scheduling.koordinator.sh", node, "--ignore-not-found",
                            "--wait=false", check=False)  # fmt: skip
