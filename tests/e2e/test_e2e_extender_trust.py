"""Issue 23 items 1 and 2 on the real cluster: kube-scheduler (packaging/scheduler's
configuration) -> ``scheduler-ext`` -> kube-apiserver, and kubelet -> ``runtime-proxy serve``.

- A tenant's forged ``resource-status`` (and ``device-allocated``, ``reservation-allocated``) is
  gone after bind (LS) or replaced by the extender's own allocation (LSR), and the forged CPUs
  are not counted; a pod created with ``spec.nodeName`` and a forged cpuset is not counted and,
  on the node, does not get CPUs an older pod holds (its real cgroup).
- Annotations a replica wrote for another node (with a signature that verifies there) are replaced
  at bind by the extender's own for the node it binds to.
- kube-apiserver's Binding subresource does what the extender relies on (and the fake API server
  imitates): the Binding's annotations land on the pod with ``spec.nodeName``, a second Binding
  is refused with 409, and so is a Binding whose resourceVersion or UID precondition is stale.

Counting is checked on API-only nodes (a Node and a NodeResourceTopology with no kubelet:
``tests/e2e/extenderlib.py``), cgroups on the real node ``127.0.0.1`` (2 CPUs here).
"""

from __future__ import annotations

import json

import pytest
from rhp_devenv.kube import NODE_NAME

from hooks.facts import format_cpu_list, parse_cpu_list
from runtime_proxy.state.sysfs import read_cpu_topology
from scheduler_ext.trust import OWNED, SIGNATURE_ANNOTATION
from tests.e2e.conftest import Stack, container_id, pod_cgroup, pod_manifest
from tests.e2e.extenderlib import (
    DEVICE_ALLOCATED,
    RESERVATION_ALLOCATED,
    STATUS,
    annotations_of,
    api_call,
    api_only_node,
    assert_signed_by_extender,
    lsr,
    on_node,
    one_runtime,
    trust,
    wait_bound,
    wait_event,
)
from tests.integration import qos_helpers as q

TOPO = read_cpu_topology()
FORGED_DEVICE = json.dumps({"gpu": [{"minor": 0, "resources": {"koordinator.sh/gpu-core": "100"}}]})
FORGED_RESERVATION = json.dumps({"name": "not-yours", "uid": "00000000-0000-0000-0000-000000000001"})


@pytest.fixture(autouse=True)
def _containerd_21_only(stack: Stack) -> None:
    one_runtime(stack)


def forged(cpuset: str) -> dict[str, str]:
    return {STATUS: json.dumps({"cpuset": cpuset}), DEVICE_ALLOCATED: FORGED_DEVICE,
            RESERVATION_ALLOCATED: FORGED_RESERVATION}  # fmt: skip


def test_forged_allocations_are_dropped_at_bind_and_never_counted(stack: Stack, ns: str) -> None:
    """On an API-only node of 4 CPUs: a tenant's LS pod forging all 4, a pod created with
    spec.nodeName forging all 4, and an LSR pod of 4 forging 2 of them; the LS pod is bound with
    none of the owned annotations, the LSR pod with the extender's cpuset of all 4 (nothing forged
    was counted), and a further LSR pod stays Pending: the extender's own allocation counts."""
    cluster = stack.cluster
    with api_only_node(cluster, cores=2) as node:
        tenant = on_node(pod_manifest("tenant-ls", ns, qos="LS", annotations=forged("0-3"),
                                      requests={"cpu": "100m"}), node)  # fmt: skip
        cluster.apply(tenant)
        bypass = pod_manifest("bypass", ns, qos="LSR", annotations=forged("0-3"), node_name=node)
        bypass["spec"]["tolerations"] = [{"operator": "Exists"}]
        cluster.apply(bypass)
        ls_pod = wait_bound(cluster, ns, "tenant-ls")
        assert ls_pod["spec"]["nodeName"] == node
        ann = annotations_of(ls_pod)
        assert not set(OWNED) & set(ann), f"forged annotations survived bind: {ann}"
        assert_signed_by_extender(cluster, ls_pod)

        cluster.apply(on_node(lsr("lsr4", ns, 4, annotations={STATUS: json.dumps({"cpuset": "0-1"})}), node))
        lsr_pod = wait_bound(cluster, ns, "lsr4")
        status = json.loads(annotations_of(lsr_pod)[STATUS])
        assert parse_cpu_list(status["cpuset"]) == {0, 1, 2, 3}, status
        assert_signed_by_extender(cluster, lsr_pod)
        assert RESERVATION_ALLOCATED not in annotations_of(lsr_pod)

        cluster.apply(on_node(lsr("lsr1", ns, 1), node))
        event = wait_event(cluster, ns, "lsr1", "not enough cpus available to satisfy request")
        assert event["type"] == "Warning"
        pending = cluster.get_json("pod", "lsr1", namespace=ns)
        assert pending is not None and not pending["spec"].get("nodeName")


def test_a_forged_cpuset_gives_no_cpus_on_the_node(stack: Stack, ns: str) -> None:
    """On the real node: an LS pod forging every CPU is bound without it and keeps its CFS quota;
    an LSR pod then gets its CPU from the extender (the forged ones were not counted) and runs
    on it; an LSR pod created with spec.nodeName forging that CPU runs without it."""
    cluster = stack.cluster
    every = format_cpu_list(TOPO.cpus)
    small = {"cpu": "200m", "memory": "32Mi"}
    cluster.apply(pod_manifest("tenant-ls", ns, qos="LS", annotations=forged(every), requests=small, limits=small))
    ls_pod = cluster.wait_pod_running(ns, "tenant-ls")
    assert not set(OWNED) & set(annotations_of(ls_pod))
    assert q.read_container_file(pod_cgroup(ls_pod), container_id(ls_pod), "cpu.cfs_quota_us") == "20000"

    cluster.apply(lsr("lsr", ns, 1))
    lsr_pod = cluster.wait_pod_running(ns, "lsr")
    assert lsr_pod["spec"]["nodeName"] == NODE_NAME
    cpu = parse_cpu_list(json.loads(annotations_of(lsr_pod)[STATUS])["cpuset"])
    assert len(cpu) == 1
    assert q.read_container_file(pod_cgroup(lsr_pod), container_id(lsr_pod), "cpuset.cpus") == format_cpu_list(cpu)

    half = {"cpu": "500m", "memory": "32Mi"}
    forged_cpu = {STATUS: json.dumps({"cpuset": format_cpu_list(cpu)})}
    cluster.apply(pod_manifest("bypass", ns, qos="LSR", annotations=forged_cpu, requests=half, limits=half,
                               node_name=NODE_NAME))  # fmt: skip
    bypass = cluster.wait_pod_running(ns, "bypass")
    got = parse_cpu_list(q.read_container_file(pod_cgroup(bypass), container_id(bypass), "cpuset.cpus"))
    assert got and not got & cpu, f"the pod created with spec.nodeName runs on {got}, held by {cpu}"
    assert q.read_container_file(pod_cgroup(bypass), container_id(bypass), "cpu.cfs_quota_us") == "50000"


@pytest.mark.parametrize("qos", ["LS", "LSR"])
def test_annotations_signed_for_another_node_are_replaced_at_bind(stack: Stack, ns: str, qos: str) -> None:
    """A pod held by a scheduling gate gets owned annotations and a signature that verifies for
    another node (what a replica that died mid-bind under the old design left); once the gate is
    removed, kube-scheduler and the extender bind it with only the extender's own, signed for the
    node it is bound to."""
    cluster = stack.cluster
    with api_only_node(cluster, cores=2) as node:
        manifest = on_node(lsr("p", ns, 2) if qos == "LSR" else pod_manifest("p", ns, qos="LS"), node)
        manifest["spec"]["schedulingGates"] = [{"name": "rhp-e2e/hold"}]
        cluster.apply(manifest)
        held = cluster.get_json("pod", "p", namespace=ns)
        assert held is not None
        stale = {STATUS: json.dumps({"cpuset": "0-1,8-9"})}
        stale[SIGNATURE_ANNOTATION] = trust(cluster).sign(held["metadata"]["uid"], ns, "p", "rhp-other-node", 2000,
                                                          stale) or ""  # fmt: skip
        cluster.kubectl("annotate", "-n", ns, "pod", "p", *(f"{k}={v}" for k, v in stale.items()))
        cluster.kubectl("patch", "-n", ns, "pod", "p", "--type=json",
                        "-p", '[{"op": "remove", "path": "/spec/schedulingGates"}]')  # fmt: skip
        pod = wait_bound(cluster, ns, "p")
        ann = annotations_of(pod)
        assert pod["spec"]["nodeName"] == node
        assert ann[SIGNATURE_ANNOTATION] != stale[SIGNATURE_ANNOTATION]
        assert_signed_by_extender(cluster, pod)
        if qos == "LS":
            assert STATUS not in ann
        else:
            assert parse_cpu_list(json.loads(ann[STATUS])["cpuset"]) <= {0, 1, 2, 3}
            assert json.loads(ann[STATUS])["cpuset"] != "0-1,8-9"


def test_the_binding_subresource_is_atomic_and_takes_preconditions(stack: Stack, ns: str) -> None:
    """kube-apiserver's pods/binding, called directly (the pod names a scheduler that does not
    run): a stale resourceVersion and a wrong UID are refused with 409 and change nothing; a
    Binding with the current ones sets spec.nodeName and copies its annotations onto the pod
    in the same write; a second Binding is refused with 409."""
    cluster = stack.cluster
    manifest = pod_manifest("p", ns, qos="LS")
    manifest["spec"]["schedulerName"] = "rhp-e2e-nobody"
    manifest["spec"]["tolerations"] = [{"operator": "Exists"}]
    cluster.apply(manifest)
    path = f"/api/v1/namespaces/{ns}/pods/p"
    status, pod = api_call(cluster, "GET", path)
    assert status == 200
    uid, rv = pod["metadata"]["uid"], pod["metadata"]["resourceVersion"]
    cluster.kubectl("annotate", "-n", ns, "pod", "p", "touched=1")  # the pod moves past rv
    _, now = api_call(cluster, "GET", path)
    current = now["metadata"]["resourceVersion"]
    assert current != rv

    def binding(uid_: str, rv_: str, value: str) -> dict[str, object]:
        return {"apiVersion": "v1", "kind": "Binding",
                "metadata": {"name": "p", "uid": uid_, "resourceVersion": rv_, "annotations": {"rhp-e2e/bound": value}},
                "target": {"apiVersion": "v1", "kind": "Node", "name": NODE_NAME}}  # fmt: skip

    for uid_, rv_, why in ((uid, rv, "stale resourceVersion"),
                           ("00000000-0000-0000-0000-000000000000", current, "wrong UID")):  # fmt: skip
        status, body = api_call(cluster, "POST", f"{path}/binding", binding(uid_, rv_, why))
        assert status == 409, f"{why}: {status} {body}"
        _, after = api_call(cluster, "GET", path)
        assert not after["spec"].get("nodeName") and "rhp-e2e/bound" not in annotations_of(after), why

    status, body = api_call(cluster, "POST", f"{path}/binding", binding(uid, current, "first"))
    assert status == 201, body
    _, bound = api_call(cluster, "GET", path)
    assert bound["spec"]["nodeName"] == NODE_NAME
    assert annotations_of(bound)["rhp-e2e/bound"] == "first"
    assert annotations_of(bound)["touched"] == "1"  # merged, not replaced

    status, body = api_call(cluster, "POST", f"{path}/binding",
                            binding(uid, bound["metadata"]["resourceVersion"], "second"))  # fmt: skip
    assert status == 409, body
    _, final = api_call(cluster, "GET", path)
    assert annotations_of(final)["rhp-e2e/bound"] == "first"
