"""kubelet's cgroup root in the node facts (``runtime_proxy.state.kubelet_root``) and everything
that follows it: the config key, the proxy's interceptor and the NRI engine, the node config
file, the planner, the usage sampler, the reconciler's QoS-level writes and the doctor."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import MappingProxyType
from typing import Any, cast

import pytest
from prometheus_client import REGISTRY
from structlog.testing import capture_logs

from hooks.facts import CgroupInfo, NodeFacts, PodFacts
from hooks.manager import make_plugin_manager
from runtime_proxy import wiring
from runtime_proxy.commands import doctor
from runtime_proxy.config import ConfigError, ProxyConfig, load_config
from runtime_proxy.cri.door import CriInterceptor
from runtime_proxy.engine.lifecycle import StaticNode
from runtime_proxy.engine.pipeline import Pipeline, plugin_steps
from runtime_proxy.engine.planner import PlanInputError, node_facts_from_json
from runtime_proxy.loops.usage import UsageSampler
from runtime_proxy.nri.adapter import NriEngine
from runtime_proxy.runtime.client import RuntimeClient
from runtime_proxy.state.kubelet_root import KubeletRoot
from runtime_proxy.state.nodeconfig import NodeConfigDocument, NodeDocument, node_facts_from_document
from runtime_proxy.state.store import Store
from tests.runtime_proxy.test_doctor import NOT_HERE, _by_name, _opts, _v1_tree
from tests.usage_tree import Tree

OUTLIERS = "rhp_kubelet_cgroup_root_outliers_total"


def pod(uid: str, parent: str) -> PodFacts:
    return PodFacts(name=f"name-{uid}", namespace="ns", uid=uid, sandbox_id=f"sb-{uid}", cgroup_parent=parent)


def outliers(reason: str) -> float:
    return REGISTRY.get_sample_value(OUTLIERS, {"reason": reason}) or 0.0


# ---- KubeletRoot ---------------------------------------------------------------------------------


def test_learns_the_root_from_the_pods_and_logs_the_change_once() -> None:
    kr = KubeletRoot()
    base = NodeFacts()
    with capture_logs() as logs:
        assert kr.node(base, []).cgroup.kubelet_root == "/"
        pods = [pod("a", "/custom/kubepods/besteffort/poda"), pod("b", "/custom/kubepods/podb")]
        assert kr.node(base, pods).cgroup.kubelet_root == "/custom"
        assert kr.node(base, pods).cgroup.kubelet_root == "/custom"
    changes = [(e["root"], e["source"]) for e in logs if e["event"] == "kubelet cgroup root in use"]
    assert changes == [("/", "default"), ("/custom", "pods")]


def test_a_configured_root_wins_and_a_disagreeing_pod_is_logged_once_with_its_identity() -> None:
    kr = KubeletRoot("/custom/")
    assert kr.configured == "/custom"
    before = outliers("other-root")
    stray = pod("s", "/kubepods/burstable/pods")
    with capture_logs() as logs:
        for _ in range(3):
            node = kr.node(NodeFacts(), [stray, pod("a", "/custom/kubepods/poda")])
            assert node.cgroup.kubelet_root == "/custom"
    warned = [e for e in logs if e["event"] == "pod cgroup parent not used for kubelet's cgroup root"]
    assert len(warned) == 1
    assert (warned[0]["pod"], warned[0]["uid"], warned[0]["sandbox_id"]) == ("ns/name-s", "s", "sb-s")
    assert warned[0]["reason"] == "other-root" and warned[0]["root"] == "/custom"
    assert outliers("other-root") == before + 1


def test_the_same_store_version_and_base_reuse_the_answer() -> None:
    kr = KubeletRoot()
    base = NodeFacts()
    first = kr.node(base, [pod("a", "/custom/kubepods/poda")], version=1)
    assert kr.node(base, [], version=1) is first, "same version and base: not recomputed"
    assert kr.node(base, [], version=2).cgroup.kubelet_root == "/"


def test_each_parent_is_parsed_once_while_its_pod_stays(monkeypatch: pytest.MonkeyPatch) -> None:
    from runtime_proxy.state import kubelet_root as module

    calls: list[str] = []
    real = module.parse_kubelet_pod_parent

    def counting(parent: str) -> Any:
        calls.append(parent)
        return real(parent)

    monkeypatch.setattr(module, "parse_kubelet_pod_parent", counting)
    kr = KubeletRoot()
    pods = [pod(str(i), f"/custom/kubepods/pod{i}") for i in range(3)] + [pod("bad", "/../x")]
    for _ in range(3):
        assert kr.node(NodeFacts(), pods).cgroup.kubelet_root == "/custom"
    assert sorted(calls) == sorted(p.cgroup_parent for p in pods), "parsed once each, errors too"
    kr.node(NodeFacts(), pods[1:])
    kr.node(NodeFacts(), pods)
    assert calls.count(pods[0].cgroup_parent) == 2, "a pod that left is forgotten"


def test_a_bad_configured_root_is_refused() -> None:
    with pytest.raises(ValueError):
        KubeletRoot("/a/../b")


# ---- the config key ------------------------------------------------------------------------------


def test_config_key_is_normalised_and_checked(tmp_path: Path) -> None:
    assert ProxyConfig().kubeletCgroupRoot == ""
    assert ProxyConfig(kubeletCgroupRoot="custom/").kubeletCgroupRoot == "/custom"
    bad = tmp_path / "proxy.yaml"
    bad.write_text("kubeletCgroupRoot: /a/../../etc\n")
    with pytest.raises(ConfigError, match=r"kubeletCgroupRoot: .*'\.\.' is not a cgroup name"):
        load_config(str(bad))


def test_wiring_puts_the_configured_root_in_the_node_facts() -> None:
    cfg = ProxyConfig(kubeletCgroupRoot="/custom")
    source, _ = wiring.node_source(cfg)
    assert source.current().cgroup.kubelet_root == "/custom"
    assert wiring.kubelet_root(cfg).configured == "/custom"


def test_the_node_config_file_cgroup_section_keeps_the_configured_root() -> None:
    doc = NodeDocument.from_model(NodeConfigDocument.model_validate({"cgroup": {"driver": "systemd"}}))
    facts = node_facts_from_document(doc, cgroup=CgroupInfo(kubelet_root="/custom"))
    assert (facts.cgroup.driver, facts.cgroup.kubelet_root) == ("systemd", "/custom")


# ---- the two entry points ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("description", "configured", "expected"),
    [
        ("learned from the stored sandboxes", "", "/custom"),
        ("the configured root wins", "/other", "/other"),
    ],
)
def test_the_interceptor_node_facts_follow_the_root(description: str, configured: str, expected: str) -> None:
    store = Store()
    store.put_pod(pod("a", "/custom/kubepods/besteffort/poda"))
    icpt = CriInterceptor(store=store, pipeline=Pipeline([]), client=cast(RuntimeClient, None),
                          node_source=StaticNode(NodeFacts()), kubelet_root=KubeletRoot(configured))
    assert icpt.node().cgroup.kubelet_root == expected, description


@pytest.mark.parametrize(
    ("description", "configured", "expected"),
    [
        ("learned from the pods NRI reported", "", "/custom"),
        ("the configured root wins", "/other", "/other"),
    ],
)
def test_the_nri_engine_node_facts_follow_the_root(description: str, configured: str, expected: str) -> None:
    engine = NriEngine(Pipeline([]), node_source=StaticNode(NodeFacts()), kubelet_root=KubeletRoot(configured))
    assert engine.node().cgroup.kubelet_root == (configured or "/")
    engine.store.put_pod(pod("a", "/custom.slice/custom-kubepods.slice/custom-kubepods-pod1.slice"))
    engine.store.put_pod(pod("b", "/custom/kubepods/burstable/podb"))
    assert engine.node().cgroup.kubelet_root == expected, description


# ---- the planner, the sampler, the reconcile writes ------------------------------------------------


def test_the_planner_takes_the_root_and_refuses_a_bad_one() -> None:
    node = node_facts_from_json({"cgroup": {"driver": "systemd", "kubeletRoot": "/custom"}})
    assert node.cgroup.kubelet_root == "/custom"
    with pytest.raises(PlanInputError, match=r"node\.cgroup\.kubeletRoot"):
        node_facts_from_json({"cgroup": {"kubeletRoot": "/.."}})


@pytest.mark.parametrize("version", [1, 2], ids=["cgroup v1", "cgroup v2"])
def test_the_sampler_reads_the_be_dir_below_the_root(tmp_path: Path, version: int) -> None:
    tree = Tree(tmp_path, version)
    be = "custom/kubepods/besteffort"
    if version == 2:
        tree.write("cpu", be, "cpu.max", "70000 100000\n")
    else:
        tree.write("cpu", be, "cpu.cfs_quota_us", "70000\n")
        tree.write("cpu", be, "cpu.cfs_period_us", "100000\n")
    tree.write("cpuset", be, "cpuset.cpus", "0-1\n")
    tree.cgroup(be, cpu_ns=0, memory=0)
    clock = [100.0]
    sampler = UsageSampler(tree.cgroups(), proc_root=tree.proc, clock=lambda: clock[0], ticks_per_second=100)
    node = NodeFacts(cgroup=CgroupInfo(version=version, kubelet_root="/custom"))
    sampler.sample(node, [])
    clock[0] += 1.0
    tree.node(busy=100)
    tree.cgroup(be, cpu_ns=500_000_000, memory=0)
    got = sampler.sample(node, [])
    assert got is not None
    assert (got.be.cfs_quota_us, got.be.cpuset, got.be_cpu_milli) == (70000, frozenset({0, 1}), 500)


def test_group_identity_writes_the_qos_dirs_below_the_root() -> None:
    from hooks.plugins import group_identity

    slo = {"resourceQOSStrategy": {"beClass": {"cpuQOS": {"enable": True, "groupIdentity": -1}}}}
    node = NodeFacts(node_slo=MappingProxyType(slo), cgroup=CgroupInfo(driver="systemd", kubelet_root="/custom"))
    plan = group_identity.rhp_reconcile_node(node=node)
    assert plan is not None
    assert [(w.path, w.value) for w in plan.writes] == [
        ("custom.slice/custom-kubepods.slice", "0"),
        ("custom.slice/custom-kubepods.slice/custom-kubepods-burstable.slice", "0"),
        ("custom.slice/custom-kubepods.slice/custom-kubepods-besteffort.slice", "-1"),
    ]


def test_cpu_suppress_writes_the_be_quota_below_the_learned_root() -> None:
    """Through the proxy's node facts: the BE pod's parent teaches the root, and the BE
    kube-QoS quota and every BE dir land below it."""
    from hooks.usage import BEState, Usage, UsageSample
    from tests.topologies import DUAL_SOCKET_HT

    store = Store()
    store.put_pod(PodFacts(name="be", namespace="ns", uid="be", sandbox_id="sb-be",
                           labels=MappingProxyType({"koordinator.sh/qosClass": "BE"}),
                           cgroup_parent="/custom/kubepods/besteffort/podbe"))
    slo = {"resourceUsedThresholdWithBE": {"enable": True, "cpuSuppressPolicy": "cfsQuota"}}
    base = NodeFacts(node_slo=MappingProxyType(slo), cpu_topology=DUAL_SOCKET_HT)
    icpt = CriInterceptor(store=store, pipeline=Pipeline([]), client=cast(RuntimeClient, None),
                          node_source=StaticNode(base))
    pm = make_plugin_manager(builtins=["cpu_suppress"], entry_points=False)
    pipeline = Pipeline(plugin_steps(pm, [("cpu_suppress", "Ignore", 2.0)]))
    usage = Usage((UsageSample(at=1.0, be=BEState(cpuset=DUAL_SOCKET_HT.cpus)),))
    result = asyncio.run(pipeline.run_usage(icpt.node(), store.pods(), usage))
    paths = {w.path for w in result.plan.writes}
    assert ("kubeqos", "custom/kubepods/besteffort", "cpu.cfs_quota_us") in {
        (w.level, w.path, w.file) for w in result.plan.writes}
    assert "custom/kubepods/besteffort/podbe" in paths
    assert not any(p.startswith("kubepods") for p in paths), paths


# ---- doctor --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("description", "made", "root", "driver", "status", "detail"),
    [
        ("cgroupfs kubepods below the configured root", "custom/kubepods", "/custom", "cgroupfs", "ok",
         "cgroupfs, as kubelet's cgroups under kubelet cgroup root /custom show"),
        ("systemd kubepods below the configured root", "custom.slice/custom-kubepods.slice", "/custom", "systemd",
         "ok", "systemd, as kubelet's cgroups under kubelet cgroup root /custom show"),
        ("the other driver below the configured root fails", "custom.slice/custom-kubepods.slice", "/custom",
         "cgroupfs", "fail", "set cgroupDriver: systemd"),
        ("unset: looked for at / and a hint given", "custom/kubepods", "", "cgroupfs", "ok",
         "if kubelet runs with --cgroup-root, set kubeletCgroupRoot"),
    ],
)
def test_doctor_finds_kubepods_below_the_root(tmp_path: Path, description: str, made: str, root: str,
                                              driver: str, status: str, detail: str) -> None:
    _v1_tree(tmp_path / "cg")
    (tmp_path / "cg" / "cpu" / made).mkdir(parents=True)
    opts = _opts(tmp_path, skip=NOT_HERE | {"resctrl"}, kubelet_cgroup_root=root, cgroup_driver=driver)
    check = _by_name(doctor.run(opts))["cgroup driver"]
    assert check.status == status and detail in check.detail, (description, check)


def test_doctor_reads_the_root_from_the_config(tmp_path: Path) -> None:
    cfg = tmp_path / "proxy.json"
    cfg.write_text(json.dumps({"kubeletCgroupRoot": "/custom"}))
    parser = doctor.argparse.ArgumentParser()
    doctor.add_arguments(parser)
    opts = doctor.options_from_args(parser.parse_args(["--config", str(cfg)]))
    assert opts.kubelet_cgroup_root == "/custom"
