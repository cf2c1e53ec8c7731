"""Issue 26 item 4 on the real cluster (kube-scheduler with packaging/scheduler's configuration
-> ``scheduler-ext`` -> kube-apiserver): a pod that cannot fit stays Pending with the extender's
reason in its FailedScheduling Event; ``/readyz`` names the kinds whose CRD is missing; and a pod
refused before its node's NodeResourceTopology existed is bound within seconds of it appearing
(the extender's requeue annotation, ``scheduler_ext/requeue.py``), not after kube-scheduler's
5-minute flush."""

from __future__ import annotations

import json
import time

import pytest

from scheduler_ext.requeue import REQUEUE_ANNOTATION
from tests.e2e.conftest import Stack, http_get
from tests.e2e.extenderlib import (
    STATUS,
    annotations_of,
    api_only_node,
    assert_signed_by_extender,
    lsr,
    nrt_of,
    on_node,
    one_runtime,
    wait_bound,
    wait_event,
)

FLUSH = 300.0
"""kube-scheduler's flush of its unschedulable pods (podMaxInUnschedulablePodsDuration, 5 min)."""


@pytest.fixture(autouse=True)
def _containerd_21_only(stack: Stack) -> None:
    one_runtime(stack)


OPTIONAL_CRDS = ("devices.scheduling.koordinator.sh", "reservations.scheduling.koordinator.sh")


def test_readyz_names_the_kinds_it_cannot_watch(stack: Stack) -> None:
    """The cluster has no Device and no Reservation CRD: the extender is ready and says so.

    Modules before this one may leave those CRDs installed (the chart keeps its CRDs on
    uninstall, and the Reservation and normalization modules install them), so they are removed
    here first; the extender's watches see them go at their next list (polled, not assumed)."""
    stack.cluster.kubectl("delete", "crd", "--ignore-not-found", "--wait=true", *OPTIONAL_CRDS)

    def says_so() -> str | None:
        status, body = http_get(f"{stack.extender_health}/readyz")
        text = body.decode()
        assert status == 200, text
        if "devices: not installed" in text and "reservations: not installed" in text:
            return text
        return None

    text = stack.cluster.wait_for(says_so, what="/readyz naming the two missing CRDs", timeout=180)
    assert "noderesourcetopologies" not in text and "pods" not in text, text


def test_a_pod_that_cannot_fit_stays_pending_with_the_extenders_reason(stack: Stack, ns: str) -> None:
    """An LSR pod of 8 CPUs on an API-only node whose topology has 4 (kube-scheduler sees 64
    allocatable): Pending, with "not enough cpus available" in its FailedScheduling Event and
    the Unschedulable condition."""
    cluster = stack.cluster
    with api_only_node(cluster, cores=2) as node:
        cluster.apply(on_node(lsr("big", ns, 8), node))
        event = wait_event(cluster, ns, "big", "not enough cpus available to satisfy request")
        assert event["type"] == "Warning" and event["involvedObject"]["name"] == "big"
        pod = cluster.get_json("pod", "big", namespace=ns)
        assert pod is not None and not pod["spec"].get("nodeName")
        condition = next(c for c in pod["status"]["conditions"] if c["type"] == "PodScheduled")
        assert condition["status"] == "False" and condition["reason"] == "Unschedulable", condition


def test_a_pod_refused_for_missing_topology_is_bound_soon_after_it_appears(stack: Stack, ns: str) -> None:
    """An API-only node without a NodeResourceTopology: an LSR pod is refused there with "invalid
    CPU Topology" (its Event says so). Once the NRT is created the pod is bound to the node with
    the extender's cpuset and carries the requeue annotation, well before kube-scheduler's own
    flush would have retried it (the bound is generous: no speed is asserted)."""
    cluster = stack.cluster
    with api_only_node(cluster, cores=None) as node:
        cluster.apply(on_node(lsr("waits", ns, 2), node))
        wait_event(cluster, ns, "waits", "invalid CPU Topology")
        pod = cluster.get_json("pod", "waits", namespace=ns)
        assert pod is not None and not pod["spec"].get("nodeName")
        appeared = time.monotonic()
        cluster.apply(nrt_of(node, cores=2))
        bound = wait_bound(cluster, ns, "waits", timeout=60.0)
        took = time.monotonic() - appeared
        print(f"bound {took:.1f} s after its node's topology appeared")
        assert took < FLUSH / 5, f"bound {took:.0f} s after the topology appeared"
        assert bound["spec"]["nodeName"] == node
        ann = annotations_of(bound)
        assert ann[REQUEUE_ANNOTATION].startswith(f"{node} "), ann
        assert len(json.loads(ann[STATUS])["cpuset"].split(",")) >= 1
        assert_signed_by_extender(cluster, bound)
