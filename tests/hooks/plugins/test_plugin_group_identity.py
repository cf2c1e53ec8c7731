"""group_identity plugin: Koordinator's bvt values per QoS class, defaults and overrides."""

from __future__ import annotations

from typing import Any

import pytest

from hooks.plugins import group_identity
from tests.hooks.plugins.factories import call, node, pod, slo_class, writes

ALL_ON = {"resourceQOSStrategy": {k: {"cpuQOS": {"enable": True}} for k in ("lsrClass", "lsClass", "beClass")}}
CPUQOS = "koordinator.sh/cpuQOS"


def bvt(plan: Any) -> list[str]:
    return [w.value for w in plan.writes if w.file == "cpu.bvt_warp_ns"]


@pytest.mark.parametrize(
    ("the_pod", "slo", "expected"),
    [
        pytest.param(pod("LSR", kube="Guaranteed"), ALL_ON, ["2"], id="LSR defaults to 2"),
        pytest.param(pod("LSE", kube="Guaranteed"), ALL_ON, ["2"], id="LSE takes the LSR value"),
        pytest.param(pod("LS"), ALL_ON, ["2"], id="LS defaults to 2"),
        pytest.param(pod("BE", kube="BestEffort"), ALL_ON, ["-1"], id="BE defaults to -1"),
        pytest.param(pod("SYSTEM"), ALL_ON, ["0"], id="SYSTEM defaults to 0"),
        pytest.param(pod("LS"), {}, [], id="nothing at sandbox start while every class is disabled"),
        pytest.param(pod("LS"), slo_class("beClass", enable=True), ["0"], id="a class that is not enabled gets 0"),
        pytest.param(pod("LS"), {"resourceQOSStrategy": {"lsClass": {"cpuQOS": {"enable": True, "groupIdentity": 1}}}},
                     ["1"], id="configured groupIdentity is used"),
        pytest.param(pod(None, kube="Guaranteed"), ALL_ON, ["2"], id="label-less Guaranteed takes LSR when enabled"),
        pytest.param(pod(None, kube="Guaranteed"),
                     {"resourceQOSStrategy": {"lsClass": {"cpuQOS": {"enable": True, "groupIdentity": 1}}}},
                     ["1"], id="label-less Guaranteed takes LS when LSR is disabled"),
        pytest.param(pod(None, kube="Burstable"), ALL_ON, ["2"], id="label-less Burstable takes LS"),
        pytest.param(pod(None, kube="BestEffort"), ALL_ON, ["-1"], id="label-less BestEffort takes BE"),
        pytest.param(pod("LS", annotations={CPUQOS: '{"enable":true,"groupIdentity":-1}'}), ALL_ON, ["-1"],
                     id="cpuQOS annotation overrides for LS"),
        pytest.param(pod("LS", annotations={CPUQOS: '{"enable":false}'}), ALL_ON, ["0"],
                     id="cpuQOS annotation with enable false gives 0"),
        pytest.param(pod("BE", kube="BestEffort", annotations={CPUQOS: '{"enable":true,"groupIdentity":2}'}), ALL_ON,
                     ["-1"], id="cpuQOS annotation is ignored for BE"),
        pytest.param(pod("LS"), {"resourceQOSStrategy": {"policies": {"cpuPolicy": "coreSched"}, **ALL_ON[
            "resourceQOSStrategy"]}}, [], id="coreSched policy turns group identity off"),
    ],
)
def test_pod_bvt(the_pod: Any, slo: dict[str, Any], expected: list[str]) -> None:
    plan = call(group_identity, "rhp_pre_run_pod_sandbox", pod=the_pod, node=node(slo=slo))
    assert bvt(plan) == expected
    assert all(w.level == "pod" and w.path == the_pod.cgroup_parent.strip("/") for w in plan.writes)


@pytest.mark.parametrize(
    ("annotation", "reason"),
    [
        pytest.param("{bad", "not valid JSON", id="bad JSON in cpuQOS"),
        pytest.param('{"enable":"yes"}', "bad koordinator.sh/cpuQOS", id="wrong type of enable"),
        pytest.param('{"enable":true,"groupIdentity":7}', "bad koordinator.sh/cpuQOS", id="out of range value"),
    ],
)
def test_malformed_cpuqos_annotation_falls_back_to_ls_value(annotation: str, reason: str) -> None:
    plan = call(group_identity, "rhp_pre_run_pod_sandbox", pod=pod("LS", annotations={CPUQOS: annotation}),
                node=node(slo=ALL_ON))
    assert bvt(plan) == ["2"]
    assert any(reason in s.reason for s in plan.skipped)


def test_malformed_nodeslo_value_uses_the_default() -> None:
    slo = {"resourceQOSStrategy": {"lsClass": {"cpuQOS": {"enable": True, "groupIdentity": "high"}}}}
    plan = call(group_identity, "rhp_pre_run_pod_sandbox", pod=pod("LS"), node=node(slo=slo))
    assert bvt(plan) == ["2"]


def test_reconcile_pod_resets_to_zero_when_disabled() -> None:
    plan = call(group_identity, "rhp_reconcile_pod", pod=pod("BE", kube="BestEffort"), node=node(slo={}))
    assert bvt(plan) == ["0"]


@pytest.mark.parametrize(
    ("slo", "driver", "expected"),
    [
        pytest.param(ALL_ON, "cgroupfs",
                     [("kubepods", "0"), ("kubepods/burstable", "2"), ("kubepods/besteffort", "-1")],
                     id="kube-QoS dirs get 0, LS and BE values"),
        pytest.param({}, "cgroupfs", [("kubepods", "0"), ("kubepods/burstable", "0"), ("kubepods/besteffort", "0")],
                     id="disabled resets kube-QoS dirs to 0"),
        pytest.param(ALL_ON, "systemd", [("kubepods.slice", "0"), ("kubepods.slice/kubepods-burstable.slice", "2"),
                                         ("kubepods.slice/kubepods-besteffort.slice", "-1")],
                     id="systemd kube-QoS slices"),
    ],
)
def test_reconcile_node_kube_qos_dirs(slo: dict[str, Any], driver: str, expected: list[tuple[str, str]]) -> None:
    plan = call(group_identity, "rhp_reconcile_node", node=node(slo=slo, driver=driver))
    assert [(level, path, value) for level, path, _, value in writes(plan)] == [("kubeqos", p, v) for p, v in expected]


@pytest.mark.parametrize(
    ("the_pod", "expected"),
    [
        pytest.param(pod("BE", kube="BestEffort"), [("cpu.idle", "1")], id="BE pod gets cpu.idle 1 under coreSched"),
        pytest.param(pod("LS"), [("cpu.idle", "0")], id="LS pod gets cpu.idle 0 under coreSched"),
        pytest.param(pod("LSR", kube="Guaranteed"), [], id="classes without cpuQOS enabled are left alone"),
    ],
)
def test_cpu_idle_alternative(the_pod: Any, expected: list[tuple[str, str]]) -> None:
    slo = {"resourceQOSStrategy": {"policies": {"cpuPolicy": "coreSched"},
                                   "beClass": {"cpuQOS": {"enable": True, "schedIdle": 1}},
                                   "lsClass": {"cpuQOS": {"enable": True}}}}
    plan = call(group_identity, "rhp_pre_run_pod_sandbox", pod=the_pod, node=node(slo=slo))
    assert [(w.file, w.value) for w in plan.writes] == expected
    node_plan = call(group_identity, "rhp_reconcile_node", node=node(slo=slo))
    assert node_plan.writes == []
