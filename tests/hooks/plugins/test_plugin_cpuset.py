"""cpuset plugin: Koordinator's decision order, quota unset and malformed input, as tables."""

from __future__ import annotations

import json
from typing import Any

import pytest

from hooks.facts import compute_share_pools, format_cpu_list, share_pools
from hooks.plugins import cpuset
from koord_formats import keys
from tests.hooks.plugins.factories import call, container, node, pod, status, writes
from tests.topologies import DUAL_SOCKET_HT, SINGLE_SOCKET_HT, cpus

RS = keys.ANNOTATION_RESOURCE_STATUS
POOLS = keys.NODE_ANNOTATION_CPU_SHARED_POOLS
SYSTEM_QOS = keys.NODE_ANNOTATION_SYSTEM_QOS_RESOURCE
# DUAL_SOCKET_HT with an LSR pod bound to 4-5: LS pools 0-3,8-11 (node 0) and 6-7,12-15 (node 1).
NODE = node(DUAL_SOCKET_HT, bound={"lsr-pod": "4-5"})
ALL_POOLS = "0-3,6-15"
STATIC = json.dumps({"policy": "static", "options": {"full-pcpus-only": "true"}})

CASES = [
    pytest.param(pod("LSR", kube="Guaranteed", annotations={RS: status("2-3")}), NODE,
                 {"cpuset_cpus": "2-3", "cpu_quota": -1}, id="LSR pod gets its resource-status cpuset and no quota"),
    pytest.param(pod("LSE", kube="Guaranteed", annotations={RS: status("8,10")}), NODE,
                 {"cpuset_cpus": "8,10", "cpu_quota": -1}, id="LSE pod gets its cpuset verbatim"),
    pytest.param(pod("LS", annotations={RS: status(numa=[{"node": 1, "resources": {"cpu": "4"}}])}), NODE,
                 {"cpuset_cpus": "6-7,12-15"}, id="numaNodeResources give that NUMA node's LS share pool"),
    pytest.param(pod("BE", kube="BestEffort",
                     annotations={RS: status(numa=[{"node": 0, "resources": {"kubernetes.io/batch-cpu": "2000"}}])}),
                 NODE, {"cpuset_cpus": "0-3,8-11"}, id="BE with numaNodeResources gets the LS pool (BECPUManager off)"),
    pytest.param(pod("LS", annotations={RS: status(numa=[{"node": 1, "resources": {"cpu": "0"}}])}), NODE,
                 {"cpuset_cpus": ALL_POOLS}, id="numaNodeResources without cpu fall through to all pools"),
    pytest.param(pod("SYSTEM", annotations={}),
                 node(DUAL_SOCKET_HT, annotations={"node.koordinator.sh/system-qos-resource": '{"cpuset":"0-1"}'}),
                 {"cpuset_cpus": "0-1"}, id="SYSTEM pod gets the system-qos cpuset"),
    pytest.param(pod("SYSTEM"), NODE, {"cpuset_cpus": ALL_POOLS},
                 id="SYSTEM pod without system-qos cpuset falls back to the share pools"),
    pytest.param(pod("LS"), NODE, {"cpuset_cpus": ALL_POOLS}, id="LS pod gets all LS share pools"),
    pytest.param(pod("LS", kube="Guaranteed"), node(DUAL_SOCKET_HT, annotations={
        "kubelet.koordinator.sh/cpu-manager-policy": STATIC}), {"cpuset_cpus": "0-15"},
                 id="LS pod gets the pools even under kubelet static policy"),
    pytest.param(pod("BE", kube="BestEffort"), NODE, {"cpuset_cpus": ""}, id="BE pod gets an empty cpuset"),
    pytest.param(pod(None, kube="BestEffort"), NODE, {"cpuset_cpus": ""},
                 id="label-less BestEffort pod gets an empty cpuset"),
    pytest.param(pod(None, kube="Guaranteed"), node(DUAL_SOCKET_HT, annotations={
        "kubelet.koordinator.sh/cpu-manager-policy": STATIC}), {},
                 id="label-less Guaranteed pod under kubelet static policy is left alone"),
    pytest.param(pod(None, kube="Guaranteed"), NODE, {"cpuset_cpus": ALL_POOLS},
                 id="label-less pod under policy none gets the share pools"),
    pytest.param(pod("LS"), node(DUAL_SOCKET_HT, annotations={POOLS: '[{"socket":0,"node":0,"cpuset":"1-3"}]'}),
                 {"cpuset_cpus": "1-3"}, id="NRT cpu-shared-pools annotation wins over computed pools"),
    pytest.param(pod("LS"), node(DUAL_SOCKET_HT, bound={"lsr": "4-5"},
                                 annotations={"node.koordinator.sh/reservation": '{"reservedCPUs":"0-1"}'}),
                 {"cpuset_cpus": "2-3,6-15"}, id="reserved CPUs leave the pools"),
    pytest.param(pod("LS"), node(DUAL_SOCKET_HT, annotations={
        "node.koordinator.sh/system-qos-resource": '{"cpuset":"0-1","cpusetExclusive":true}'}),
                 {"cpuset_cpus": "2-15"}, id="exclusive system-qos CPUs leave the pools"),
    pytest.param(pod("LS"), node(DUAL_SOCKET_HT, annotations={SYSTEM_QOS: '{"cpuset":"0-1"}'}),
                 {"cpuset_cpus": "2-15"},
                 id="system-qos CPUs without cpusetExclusive leave the pools, exclusive by default like the extender"),
    pytest.param(pod("LS"), node(DUAL_SOCKET_HT, annotations={SYSTEM_QOS: '{"cpuset":"0-1","cpusetExclusive":false}'}),
                 {"cpuset_cpus": "0-15"}, id="system-qos CPUs marked not exclusive stay in the pools"),
    pytest.param(pod("LS"), node(DUAL_SOCKET_HT, bound={"lse": "4-5"}, lse=("lse",),
                                 annotations={SYSTEM_QOS: '{"cpuset":"0-1"}'}),
                 {"cpuset_cpus": "2-3,6-15"}, id="default-exclusive system-qos CPUs and bound CPUs both leave"),
    pytest.param(pod("LS"), node(DUAL_SOCKET_HT, annotations={
        "node.koordinator.sh/pod-cpu-allocs": '[{"uid":"k","cpuset":"14-15","managedByKubelet":true}]'}),
                 {"cpuset_cpus": "0-13"}, id="kubelet static allocations leave the LS pools"),
    pytest.param(pod("XYZ", kube="BestEffort"), NODE, {"cpuset_cpus": ""},
                 id="unknown QoS label is ignored and kube QoS decides"),
]


@pytest.mark.parametrize(("the_pod", "the_node", "expected"), CASES)
def test_container_resources(the_pod: Any, the_node: Any, expected: dict[str, Any]) -> None:
    plan = call(cpuset, "rhp_pre_create_container", pod=the_pod, container=container(), node=the_node)
    assert plan.resources == expected
    assert plan.skipped == []
    again = call(cpuset, "rhp_pre_update_container_resources", pod=the_pod, container=container(), node=the_node)
    assert again.resources == expected


MALFORMED = [
    pytest.param(pod("LSR", annotations={RS: "{not json"}), NODE, "not valid JSON", id="bad JSON in resource-status"),
    pytest.param(pod("LSR", annotations={RS: status("0-")}), NODE, "bad CPU list", id="cpuset 0- is refused"),
    pytest.param(pod("LSR", annotations={RS: status("3-1")}), NODE, "descending", id="descending cpuset is refused"),
    pytest.param(pod("LSR", annotations={RS: '{"cpuset": 5}'}), NODE, "expected a string",
                 id="cpuset of the wrong type is refused"),
    pytest.param(pod("LS", annotations={RS: '{"numaNodeResources": {"node": 1}}'}), NODE, "expected a list",
                 id="numaNodeResources of the wrong type is refused"),
    pytest.param(pod("LS"), node(DUAL_SOCKET_HT, annotations={POOLS: "[{"}), "share pools",
                 id="bad share pool annotation"),
    pytest.param(pod("LS"), node(None), "unknown", id="no topology and no pools annotation"),
]


@pytest.mark.parametrize(("the_pod", "the_node", "reason"), MALFORMED)
def test_malformed_input_is_skipped_and_leaves_cpuset_alone(the_pod: Any, the_node: Any, reason: str) -> None:
    plan = call(cpuset, "rhp_pre_create_container", pod=the_pod, container=container(), node=the_node)
    assert "cpuset_cpus" not in plan.resources
    assert any(reason in s.reason for s in plan.skipped), plan.skipped


@pytest.mark.parametrize(
    ("the_pod", "expected"),
    [
        pytest.param(pod("LSR", kube="Guaranteed", uid="a", annotations={RS: status("2-3")}),
                     [("pod", "kubepods/poda", "cpu.cfs_quota_us", "-1")], id="bound pod gets its pod quota unset"),
        pytest.param(pod("LSR", uid="a_b", parent="kubepods-pod_a_b.slice", annotations={RS: status("2")}),
                     [("pod", "kubepods.slice/kubepods-pod_a_b.slice", "cpu.cfs_quota_us", "-1")],
                     id="systemd cgroup parent is expanded"),
        pytest.param(pod("LS"), [], id="unbound pod keeps its pod quota"),
        pytest.param(pod("LSR", parent="/kubepods/../../etc", annotations={RS: status("2")}), [],
                     id="cgroup parent with .. is skipped"),
    ],
)
def test_pre_run_pod_sandbox_unsets_pod_quota(the_pod: Any, expected: list[tuple[str, ...]]) -> None:
    plan = call(cpuset, "rhp_pre_run_pod_sandbox", pod=the_pod, node=NODE)
    assert writes(plan) == expected
    assert not plan.resources


def test_reconcile_container_does_not_clear_a_be_cpuset() -> None:
    plan = call(cpuset, "rhp_reconcile_container", pod=pod("BE", kube="BestEffort"), container=container(), node=NODE)
    assert plan.resources == {}


def test_reconcile_pod_writes_the_sandbox_cpuset() -> None:
    the_pod = pod("LS", uid="u", sandbox_id="sb1")
    plan = call(cpuset, "rhp_reconcile_pod", pod=the_pod, node=NODE)
    assert writes(plan) == [("sandbox", "kubepods/burstable/podu/sb1", "cpuset.cpus", ALL_POOLS)]


def test_ls_pool_shrinks_when_an_lsr_pod_arrives_and_grows_back() -> None:
    ls = pod("LS", uid="ls")
    before = call(cpuset, "rhp_reconcile_container", pod=ls, container=container(), node=node(SINGLE_SOCKET_HT))
    during = call(cpuset, "rhp_reconcile_container", pod=ls, container=container(),
                  node=node(SINGLE_SOCKET_HT, bound={"lsr": "2-3"}))
    assert before.resources["cpuset_cpus"] == "0-7"
    assert during.resources["cpuset_cpus"] == "0-1,4-7"


@pytest.mark.parametrize(
    ("bound", "lse", "be", "expected"),
    [
        pytest.param({"lsr": "4-5"}, (), False, [(0, 0, "0-3,8-11"), (1, 1, "6-7,12-15")], id="LS pool minus LSR"),
        pytest.param({"lsr": "4-5"}, (), True, [(0, 0, "0-3,8-11"), (1, 1, "4-7,12-15")],
                     id="BE pool keeps LSR cores (lent to BE)"),
        pytest.param({"lse": "4-7,12-15"}, ("lse",), True, [(0, 0, "0-3,8-11")], id="BE pool loses LSE cores"),
    ],
)
def test_share_pool_computation(bound: dict[str, str], lse: tuple[str, ...], be: bool,
                                expected: list[tuple[int, int, str]]) -> None:
    pools = compute_share_pools(node(DUAL_SOCKET_HT, bound=bound, lse=lse), be=be)
    assert [(p.socket, p.node, format_cpu_list(p.cpus)) for p in pools] == expected
    assert share_pools(node(DUAL_SOCKET_HT, bound=bound, lse=lse), be=be) == pools


def test_cpus_helper() -> None:
    assert cpus("0-2,8") == frozenset({0, 1, 2, 8})
