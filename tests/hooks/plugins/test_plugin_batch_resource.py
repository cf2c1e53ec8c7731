"""batch_resource plugin: BE batch-cpu/batch-memory to shares, quota and memory limits."""

from __future__ import annotations

import json
from fractions import Fraction
from typing import Any

import pytest

from hooks.plugins import batch_resource
from koord_formats.pod import ContainerResourceSpec, parse_pod_batch_resources
from tests.hooks.plugins.factories import call, container, node, pod, writes

SPEC = "node.koordinator.sh/extended-resource-spec"


def spec(**containers: dict[str, dict[str, str]]) -> dict[str, str]:
    return {SPEC: json.dumps({"containers": containers})}


C1_FULL = {"requests": {"kubernetes.io/batch-cpu": "1000"},
           "limits": {"kubernetes.io/batch-cpu": "2000", "kubernetes.io/batch-memory": "4Gi"}}
SUPPRESS = {"resourceUsedThresholdWithBE": {"enable": True, "cpuSuppressPolicy": "cfsQuota"}}
RATIO = {"node.koordinator.sh/cpu-normalization-ratio": "1.5"}


@pytest.mark.parametrize(
    ("the_pod", "the_node", "expected"),
    [
        pytest.param(pod("BE", kube="BestEffort", annotations=spec(c1=C1_FULL)), node(),
                     {"cpu_shares": 1024, "cpu_quota": 200000, "memory_limit_in_bytes": 4 << 30},
                     id="BE container gets shares, quota and memory from batch resources"),
        pytest.param(pod("BE", kube="BestEffort",
                         annotations=spec(c1={"requests": {"kubernetes.io/batch-cpu": "500"}})), node(),
                     {"cpu_shares": 512, "cpu_quota": -1, "memory_limit_in_bytes": -1},
                     id="no limits give unlimited quota and memory"),
        pytest.param(pod("BE", kube="BestEffort", annotations=spec(c1={"limits": {"kubernetes.io/batch-cpu": "1"}})),
                     node(), {"cpu_quota": 1000, "memory_limit_in_bytes": -1},
                     id="tiny limit is raised to the minimum quota and shares are left alone without a request"),
        pytest.param(pod("BE", kube="BestEffort", annotations=spec(c1=C1_FULL)), node(slo=SUPPRESS),
                     {"cpu_shares": 1024, "cpu_quota": -1, "memory_limit_in_bytes": 4 << 30},
                     id="cpu suppress by cfsQuota forces quota -1"),
        pytest.param(pod("BE", kube="BestEffort", annotations=spec(c1=C1_FULL)), node(annotations=RATIO),
                     {"cpu_shares": 1024, "cpu_quota": 133334, "memory_limit_in_bytes": 4 << 30},
                     id="cpu normalization ratio divides the quota rounding up"),
        pytest.param(pod("LS", annotations=spec(c1=C1_FULL)), node(), {}, id="LS pod is left alone"),
        pytest.param(pod(None, kube="BestEffort", annotations=spec(c1=C1_FULL)), node(), {},
                     id="label-less BestEffort pod is left alone (raw label)"),
        pytest.param(pod("BE", kube="BestEffort", annotations=spec(other=C1_FULL)), node(), {},
                     id="container not in the spec is left alone"),
        pytest.param(pod("BE", kube="BestEffort"), node(), {}, id="no annotation, no change"),
    ],
)
def test_container_resources(the_pod: Any, the_node: Any, expected: dict[str, int]) -> None:
    for hook in ("rhp_pre_create_container", "rhp_pre_update_container_resources", "rhp_reconcile_container"):
        plan = call(batch_resource, hook, pod=the_pod, container=container("c1"), node=the_node)
        assert plan.resources == expected, hook


@pytest.mark.parametrize(
    ("containers", "expected"),
    [
        pytest.param({"a": C1_FULL, "b": {"requests": {"kubernetes.io/batch-cpu": "500"},
                                          "limits": {"kubernetes.io/batch-cpu": "1000",
                                                     "kubernetes.io/batch-memory": "1073741824"}}},
                     {"cpu.shares": "1536", "cpu.cfs_quota_us": "300000", "memory.limit_in_bytes": str(5 << 30)},
                     id="pod gets the sums of requests and limits"),
        pytest.param({"a": C1_FULL, "b": {"requests": {"kubernetes.io/batch-cpu": "500"}}},
                     {"cpu.shares": "1536", "cpu.cfs_quota_us": "-1", "memory.limit_in_bytes": "-1"},
                     id="one unlimited container makes the pod unlimited"),
    ],
)
def test_pod_level_writes(containers: dict[str, Any], expected: dict[str, str]) -> None:
    the_pod = pod("BE", kube="BestEffort", uid="b1", annotations=spec(**containers))
    plan = call(batch_resource, "rhp_pre_run_pod_sandbox", pod=the_pod, node=node())
    assert {f: v for _, _, f, v in writes(plan)} == expected
    assert {(lvl, path) for lvl, path, _, _ in writes(plan)} == {("pod", "kubepods/besteffort/podb1")}


def test_idle_be_pods_keep_their_pod_shares() -> None:
    core_sched = {"resourceQOSStrategy": {"policies": {"cpuPolicy": "coreSched"},
                                          "beClass": {"cpuQOS": {"enable": True, "schedIdle": 1}}}}
    the_pod = pod("BE", kube="BestEffort", uid="b1", annotations=spec(a=C1_FULL))
    plan = call(batch_resource, "rhp_reconcile_pod", pod=the_pod, node=node(slo=core_sched))
    assert {f for _, _, f, _ in writes(plan)} == {"cpu.cfs_quota_us", "memory.limit_in_bytes"}
    assert any("SCHED_IDLE" in s.reason for s in plan.skipped)


@pytest.mark.parametrize(
    "annotation",
    [
        pytest.param("{oops", id="bad JSON"),
        pytest.param('{"containers": []}', id="containers of the wrong type"),
        pytest.param('{"containers": {"c1": {"limits": {"kubernetes.io/batch-cpu": "lots"}}}}', id="bad quantity"),
        pytest.param('{"containers": {"c1": {"limits": {"kubernetes.io/batch-cpu": true}}}}', id="boolean quantity"),
    ],
)
def test_malformed_spec_is_skipped(annotation: str) -> None:
    the_pod = pod("BE", kube="BestEffort", annotations={SPEC: annotation})
    plan = call(batch_resource, "rhp_pre_create_container", pod=the_pod, container=container("c1"), node=node())
    assert plan.resources == {}
    assert plan.skipped and SPEC in plan.skipped[0].reason
    pod_plan = call(batch_resource, "rhp_pre_run_pod_sandbox", pod=the_pod, node=node())
    assert pod_plan.writes == []


# ---- batch resources from the pod spec (PodFacts.batch_resources, the node agent's pod watch) ----

CPU, MEM = "kubernetes.io/batch-cpu", "kubernetes.io/batch-memory"


def from_spec(**containers: dict[str, dict[str, str]]) -> dict[str, Any]:
    """``PodFacts.batch_resources`` as the pod watch gives it: the Pod object's containers parsed
    by ``koord_formats.pod.parse_pod_batch_resources``."""
    obj = {"metadata": {"uid": "b1", "namespace": "ns", "name": "p"},
           "spec": {"containers": [{"name": n, "resources": r} for n, r in containers.items()]}}
    return dict(parse_pod_batch_resources(obj).containers)


ISSUE_36 = {"requests": {CPU: "500", MEM: "64Mi"}, "limits": {CPU: "500", MEM: "64Mi"}}


@pytest.mark.parametrize(
    ("annotations", "batch", "expected"),
    [
        pytest.param({}, from_spec(c1=ISSUE_36),
                     {"cpu_shares": 512, "cpu_quota": 50000, "memory_limit_in_bytes": 64 << 20},
                     id="issue 36: the pod spec's 500 and 64Mi give 512 shares, quota 50000 and 64 MiB"),
        pytest.param({}, from_spec(c1={"limits": {CPU: "2000", MEM: "1Gi"}}),
                     {"cpu_shares": 2048, "cpu_quota": 200000, "memory_limit_in_bytes": 1 << 30},
                     id="limits alone give the requests (the API server's defaulting)"),
        pytest.param(spec(c1=C1_FULL), from_spec(c1=ISSUE_36),
                     {"cpu_shares": 1024, "cpu_quota": 200000, "memory_limit_in_bytes": 4 << 30},
                     id="the annotation wins over the pod spec"),
        pytest.param(spec(other=C1_FULL), from_spec(c1=ISSUE_36), {},
                     id="an annotation that does not list the container still wins"),
        pytest.param({}, from_spec(other=ISSUE_36), {}, id="container matched by name"),
        pytest.param({}, from_spec(c1={"requests": {"cpu": "1"}, "limits": {"cpu": "1"}}), {},
                     id="no batch resources in the spec: left alone"),
        pytest.param({}, None, {}, id="pod unknown to the watch: left alone"),
        pytest.param({}, from_spec(c1={"limits": {CPU: "100000000", MEM: "4Ei"}}),
                     {"cpu_shares": 262144, "cpu_quota": 10**10, "memory_limit_in_bytes": 4 << 60},
                     id="the largest amounts taken"),
    ],
)
def test_batch_resources_from_the_pod_spec(annotations: dict[str, str], batch: dict[str, Any] | None,
                                           expected: dict[str, int]) -> None:
    the_pod = pod("BE", kube="BestEffort", annotations=annotations).replace(batch_resources=batch)
    for hook in ("rhp_pre_create_container", "rhp_pre_update_container_resources", "rhp_reconcile_container"):
        plan = call(batch_resource, hook, pod=the_pod, container=container("c1"), node=node())
        assert plan.resources == expected, hook


def test_pod_spec_batch_resources_give_the_pod_sums() -> None:
    batch = from_spec(a=ISSUE_36, b={"limits": {CPU: "1500", MEM: "1Gi"}})
    the_pod = pod("BE", kube="BestEffort", uid="b1").replace(batch_resources=batch)
    for hook in ("rhp_pre_run_pod_sandbox", "rhp_reconcile_pod"):
        plan = call(batch_resource, hook, pod=the_pod, node=node())
        assert {f: v for _, _, f, v in writes(plan)} == {
            "cpu.shares": "2048", "cpu.cfs_quota_us": "200000", "memory.limit_in_bytes": str((64 << 20) + (1 << 30))}


def test_an_ls_pod_with_batch_resources_in_its_spec_is_left_alone() -> None:
    the_pod = pod("LS").replace(batch_resources=from_spec(c1=ISSUE_36))
    plan = call(batch_resource, "rhp_pre_create_container", pod=the_pod, container=container("c1"), node=node())
    assert plan.resources == {}


@pytest.mark.parametrize(
    ("source", "amounts"),
    [
        pytest.param("annotation", {CPU: "100000001"}, id="annotation batch-cpu above 10^8 milli"),
        pytest.param("annotation", {MEM: "8Ei"}, id="annotation batch-memory above 4 EiB"),
        pytest.param("spec", {CPU: "100000001"}, id="pod spec batch-cpu above 10^8 milli"),
        pytest.param("spec", {MEM: "9223372036854775807"}, id="pod spec batch-memory near int64"),
    ],
)
def test_huge_amounts_are_skipped_from_either_source(source: str, amounts: dict[str, str]) -> None:
    the_pod = pod("BE", kube="BestEffort")
    if source == "annotation":
        the_pod = the_pod.replace(annotations={SPEC: json.dumps({"containers": {"c1": {"limits": amounts}}})})
    else:
        # The pod watch refuses such a pod; a fact built another way (the planner, a test) is checked too.
        limits = {k: Fraction(int(v)) for k, v in amounts.items()}
        the_pod = the_pod.replace(batch_resources={"c1": ContainerResourceSpec(limits=limits)})
    plan = call(batch_resource, "rhp_pre_create_container", pod=the_pod, container=container("c1"), node=node())
    assert plan.resources == {}
    assert plan.skipped and "above" in plan.skipped[0].reason
    assert call(batch_resource, "rhp_pre_run_pod_sandbox", pod=the_pod, node=node()).writes == []
