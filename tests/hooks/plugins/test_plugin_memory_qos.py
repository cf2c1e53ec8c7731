"""memory_qos: koordlet's memory.min / memory.low / memory.high formulas by QoS class at
container, pod and kube-QoS level, cgroup v2 only, and nothing while the NodeSLO never names
memory QoS."""

from __future__ import annotations

import json
from dataclasses import replace
from fractions import Fraction
from types import MappingProxyType
from typing import Any

import pytest

from hooks.facts import CgroupInfo, NodeFacts, PodFacts
from hooks.plugins import memory_qos
from hooks.usage import Usage, UsageSample
from koord_formats import nodeslo
from koord_formats.pod import ContainerResourceSpec
from tests.hooks.plugins.factories import call, container, node, pod, writes

MiB = 1 << 20
GiB = 1 << 30
EXT = "node.koordinator.sh/extended-resource-spec"


def slo(**classes: dict[str, Any]) -> dict[str, Any]:
    return {"resourceQOSStrategy": {k: {"memoryQOS": v} for k, v in classes.items()}}


ON = {"enable": True, "minLimitPercent": 50, "lowLimitPercent": 80, "throttlingPercent": 90}


def v2(slo_spec: dict[str, Any], driver: str = "cgroupfs") -> NodeFacts:
    n = node(slo=slo_spec, driver=driver)
    return replace(n, cgroup=CgroupInfo(version=2, driver=driver))


def spec_pod(qos: str | None, kube: str, uid: str, containers: dict[str, tuple[int, int]], *,
             batch: bool = False, cids: bool = True) -> PodFacts:
    name = "kubernetes.io/batch-memory" if batch else "memory"
    specs = {c: ContainerResourceSpec(
        requests=MappingProxyType({name: Fraction(r)} if r else {}),
        limits=MappingProxyType({name: Fraction(lim)} if lim else {})) for c, (r, lim) in containers.items()}
    cs = tuple(container(c, f"{uid}-{c}" if cids else "") for c in containers)
    return replace(pod(qos, kube=kube, uid=uid, containers=cs), batch_resources=MappingProxyType(specs))


def usage(total: int = 8 * GiB) -> Usage:
    return Usage(samples=(UsageSample(at=1.0, node_memory_total_bytes=total),))


def run(n: NodeFacts, *pods: PodFacts, total: int = 8 * GiB) -> list[tuple[str, str, str, str]]:
    return writes(call(memory_qos, "rhp_reconcile_usage", node=n, pods=pods, usage=usage(total)))


def test_nothing_while_the_node_slo_names_no_memory_qos() -> None:
    p = spec_pod("LS", "Burstable", "u1", {"c": (256 * MiB, 512 * MiB)})
    assert memory_qos.rhp_reconcile_usage(node=v2({}), pods=(p,), usage=usage()) is None
    other = {"resourceQOSStrategy": {"lsClass": {"cpuQOS": {"enable": True}}}}
    assert memory_qos.rhp_reconcile_usage(node=v2(other), pods=(p,), usage=usage()) is None


def test_cgroup_v1_writes_nothing_and_says_why() -> None:
    """v1 (this host's kernel): memory.min/low/high do not exist in the v1 memory controller."""
    p = spec_pod("LS", "Burstable", "u1", {"c": (256 * MiB, 512 * MiB)})
    plan = call(memory_qos, "rhp_reconcile_usage", node=node(slo=slo(lsClass=ON)), pods=(p,), usage=usage())
    assert plan.writes == []
    assert [s.reason for s in plan.skipped] == [memory_qos.V1_SKIP]


@pytest.mark.parametrize(
    ("request_", "limit", "cfg", "expected"),
    [
        pytest.param(256 * MiB, 512 * MiB, ON, (134217728, 214748364, 510025728),
                     id="min 50%, low 80%, high request + 90% of the headroom, page-aligned"),
        pytest.param(256 * MiB, 0, ON, (134217728, 214748364, 7757783040),
                     id="no limit: the node's 8 GiB is the limit"),
        pytest.param(256 * MiB, 512 * MiB, {**ON, "throttlingPercent": 0}, (134217728, 214748364, None),
                     id="throttling 0 resets memory.high to max"),
        pytest.param(256 * MiB, 512 * MiB, {"enable": True, "minLimitPercent": 100, "lowLimitPercent": 10},
                     (256 * MiB, 256 * MiB, None), id="memory.low below memory.min is raised to it"),
        pytest.param(0, 512 * MiB, ON, (0, 0, 483180544), id="no request: nothing protected"),
        pytest.param(256 * MiB, 512 * MiB, {**ON, "enable": False}, (0, 0, None),
                     id="a disabled class takes the close values"),
    ],
)
def test_container_values(request_: int, limit: int, cfg: dict[str, Any],
                          expected: tuple[int, int, int | None]) -> None:
    mq = nodeslo.memory_qos(slo(lsClass=cfg), "lsClass")
    assert memory_qos.container_values(memory_qos.ContainerMemory(request_, limit), mq, 8 * GiB) == expected


def test_high_is_page_aligned_and_never_below_min() -> None:
    mq = nodeslo.memory_qos(slo(lsClass={"enable": True, "minLimitPercent": 100, "throttlingPercent": 1}), "lsClass")
    low_min, _, high = memory_qos.container_values(memory_qos.ContainerMemory(100 * MiB + 7, 100 * MiB + 9), mq, 0)
    assert high == low_min  # request + 1% of 2 bytes, page-rounded below min, raised to min
    mq = nodeslo.memory_qos(slo(lsClass={"enable": True, "throttlingPercent": 50}), "lsClass")
    _, _, high = memory_qos.container_values(memory_qos.ContainerMemory(MiB, MiB + 3 * 4096 + 5), mq, 0)
    assert high is not None and high % 4096 == 0


def test_ls_and_be_pods_and_the_kube_qos_parents_on_systemd() -> None:
    """LS takes lsClass from its plain memory request; BE takes beClass from batch-memory; the
    burstable and besteffort slices take their pods' sums and kubepods.slice every pod's."""
    spec = slo(lsClass={"enable": True, "minLimitPercent": 100, "lowLimitPercent": 100, "throttlingPercent": 0},
               beClass={"enable": True, "minLimitPercent": 0, "lowLimitPercent": 0, "throttlingPercent": 50})
    ls = spec_pod("LS", "Burstable", "u-ls", {"app": (300 * MiB, 600 * MiB), "side": (100 * MiB, 0)})
    be = spec_pod("BE", "BestEffort", "u-be", {"hog": (0, 400 * MiB)}, batch=True)
    n = v2(spec, driver="systemd")
    got = run(n, ls, be)
    qos = [w for w in got if w[0] == "kubeqos"]
    assert qos == [
        ("kubeqos", "kubepods.slice", "memory.min", str(400 * MiB)),
        ("kubeqos", "kubepods.slice", "memory.low", str(400 * MiB)),
        ("kubeqos", "kubepods.slice/kubepods-burstable.slice", "memory.min", str(400 * MiB)),
        ("kubeqos", "kubepods.slice/kubepods-burstable.slice", "memory.low", str(400 * MiB)),
        ("kubeqos", "kubepods.slice/kubepods-besteffort.slice", "memory.min", "0"),
        ("kubeqos", "kubepods.slice/kubepods-besteffort.slice", "memory.low", "0"),
    ]
    pods = {(w[1].rsplit("/", 1)[-1], w[2]): w[3] for w in got if w[0] == "pod"}
    assert pods[("podu-ls", "memory.min")] == str(400 * MiB)
    assert pods[("podu-be", "memory.low")] == "0"
    cont = {(w[1].rsplit("/", 1)[-1], w[2]): w[3] for w in got if w[0] == "container"}
    assert cont[("cri-containerd-u-ls-app.scope", "memory.min")] == str(300 * MiB)
    assert cont[("cri-containerd-u-ls-app.scope", "memory.high")] == "max"
    assert cont[("cri-containerd-u-ls-side.scope", "memory.low")] == str(100 * MiB)
    assert cont[("cri-containerd-u-be-hog.scope", "memory.min")] == "0"
    assert cont[("cri-containerd-u-be-hog.scope", "memory.high")] == str(200 * MiB)
    # written top-down: kube-QoS, then pods, then containers
    levels = [w[0] for w in got]
    assert levels == sorted(levels, key=["kubeqos", "pod", "container"].index)


def test_guaranteed_pods_count_in_kubepods_only() -> None:
    spec = slo(lsrClass={"enable": True, "minLimitPercent": 100})
    lsr = spec_pod("LSR", "Guaranteed", "u-g", {"c": (1 * GiB, 1 * GiB)})
    got = run(v2(spec), lsr)
    assert [w for w in got if w[0] == "kubeqos"] == [
        ("kubeqos", "kubepods", "memory.min", str(GiB)),
        ("kubeqos", "kubepods", "memory.low", "0"),
    ]


def test_lse_reads_the_lsr_section_and_unlabelled_pods_their_kube_qos() -> None:
    spec = slo(lsrClass={"enable": True, "minLimitPercent": 100}, lsClass={"enable": True, "minLimitPercent": 10})
    lse = spec_pod("LSE", "Guaranteed", "u-e", {"c": (100 * MiB, 100 * MiB)})
    plain = spec_pod(None, "Burstable", "u-b", {"c": (100 * MiB, 0)})
    got = {(w[1], w[2]): w[3] for w in run(v2(spec), lse, plain) if w[0] == "container"}
    assert got[("kubepods/podu-e/u-e-c", "memory.min")] == str(100 * MiB)
    assert got[("kubepods/burstable/podu-b/u-b-c", "memory.min")] == str(10 * MiB)


def test_annotation_wins_over_the_pod_spec() -> None:
    spec = slo(lsClass={"enable": True, "minLimitPercent": 100})
    p = spec_pod("LS", "Burstable", "u1", {"c": (100 * MiB, 0)})
    doc = {"containers": {"c": {"requests": {"memory": "50Mi"}}}}
    p = p.replace(annotations=MappingProxyType({EXT: json.dumps(doc)}))
    got = {(w[0], w[2]): w[3] for w in run(v2(spec), p)}
    assert got[("container", "memory.min")] == str(50 * MiB)


def test_unknown_requests_and_containers_without_an_id_are_left_alone() -> None:
    spec = slo(lsClass=ON)
    unknown = pod("LS", uid="u0", containers=(container("c", "cid0"),))
    no_id = spec_pod("LS", "Burstable", "u1", {"c": (100 * MiB, 0)}, cids=False)
    plan = call(memory_qos, "rhp_reconcile_usage", node=v2(spec), pods=(unknown, no_id), usage=usage())
    assert not [w for w in plan.writes if w.level == "container"]
    assert any("memory requests unknown" in s.reason for s in plan.skipped)
    assert [w.path for w in plan.writes if w.level == "pod"] == ["kubepods/burstable/podu1"] * 2


def test_no_node_memory_and_no_limit_leaves_memory_high_alone() -> None:
    spec = slo(lsClass=ON)
    p = spec_pod("LS", "Burstable", "u1", {"c": (100 * MiB, 0)})
    got = run(v2(spec), p, total=0)
    assert not [w for w in got if w[2] == "memory.high"]
    # the CRI limit is taken when the spec has none
    p2 = replace(p, containers=(container("c", "u1-c", memory_limit_in_bytes=200 * MiB),))
    high = [w[3] for w in run(v2(spec), p2, total=0) if w[2] == "memory.high"]
    assert high == [str((100 * MiB + 100 * MiB * 90 // 100) // 4096 * 4096)]


POD_MEMORY_QOS = "koordinator.sh/memoryQOS"


def annotated(p: PodFacts, text: str) -> PodFacts:
    return p.replace(annotations=MappingProxyType({**p.annotations, POD_MEMORY_QOS: text}))


@pytest.mark.parametrize(
    ("ls_class", "annotation", "expected"),
    [
        pytest.param(ON, '{"policy":"none"}', ("0", "0", "max"), id="none on an enabled class: all off"),
        pytest.param(ON, '{"policy":"default","minLimitPercent":100,"throttlingPercent":0}',
                     (str(256 * MiB), str(256 * MiB), "max"),
                     id="default: the pod's minLimitPercent and throttlingPercent (low raised to min)"),
        pytest.param({"enable": False}, '{"policy":"auto","lowLimitPercent":50}',
                     ("0", str(128 * MiB), "max"), id="auto on a disabled class: defaults, then the pod's fields"),
        pytest.param({"enable": False}, '{"policy":"auto"}', ("0", "0", "max"), id="auto alone: the defaults (0 %)"),
        pytest.param(ON, '{"policy":"sometimes"}', ("134217728", "214748364", "510025728"),
                     id="malformed: the class values"),
    ],
)
def test_pod_annotation_over_the_class_values(ls_class: dict[str, Any], annotation: str,
                                              expected: tuple[str, str, str]) -> None:
    """koordinator.sh/memoryQOS: the pod's fields > its policy's template > the NodeSLO's class;
    the kube-QoS parents sum what each pod got."""
    p = annotated(spec_pod("LS", "Burstable", "u1", {"c": (256 * MiB, 512 * MiB)}), annotation)
    other = spec_pod("LS", "Burstable", "u2", {"c": (100 * MiB, 0)})
    plan = call(memory_qos, "rhp_reconcile_usage", node=v2(slo(lsClass=ls_class)), pods=(p, other), usage=usage())
    got = {(w[1], w[2]): w[3] for w in writes(plan)}
    c = "kubepods/burstable/podu1/u1-c"
    assert (got[(c, "memory.min")], got[(c, "memory.low")], got[(c, "memory.high")]) == expected
    # the other pod keeps its class values, and the burstable parent is the sum of both pods
    other_min = 100 * MiB * (50 if ls_class.get("enable") else 0) // 100
    assert got[("kubepods/burstable/podu2/u2-c", "memory.min")] == str(other_min)
    assert got[("kubepods/burstable", "memory.min")] == str(int(expected[0]) + other_min)
    malformed = [s.reason for s in plan.skipped if POD_MEMORY_QOS in s.reason]
    assert bool(malformed) == ("sometimes" in annotation), malformed


def test_pod_annotation_alone_does_not_make_the_plugin_plan() -> None:
    """A NodeSLO without any memoryQOS section: kubelet's and the runtime's values stay, whatever
    a pod asks."""
    p = annotated(spec_pod("LS", "Burstable", "u1", {"c": (256 * MiB, 512 * MiB)}), '{"policy":"auto"}')
    assert memory_qos.rhp_reconcile_usage(node=v2({}), pods=(p,), usage=usage()) is None
