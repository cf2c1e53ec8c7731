"""batch_resource plugin: BE batch-cpu/batch-memory to shares, quota and memory limits."""

from __future__ import annotations

import json
from typing import Any

import pytest

from hooks.plugins import batch_resource
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
