"""The reconciler and the cfsQuotaBurst loop with a fake backend: convergence after node-config
changes and pool changes, hand-made drift, dry run, RDT on a resctrl-shaped tree; host apps and
CPU burst on the real cgroup filesystem (root only)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest
from structlog.testing import capture_logs

from hooks.facts import CgroupInfo, ContainerFacts, CPUTopology, NodeFacts, PodFacts, Resources
from hooks.manager import make_plugin_manager
from hooks.plan import CgroupWrite, Plan
from hooks.plugins.cpu_burst import DOWN, UP
from hooks.spec import STAGES, hookimpl
from hooks.usage import BurstDecision, BurstRound, BurstState
from runtime_proxy.engine.pipeline import Pipeline, plugin_steps
from runtime_proxy.host.apply import FileApplier, RecordingApplier, apply_files
from runtime_proxy.host.cgroups import Cgroups
from runtime_proxy.host.resctrl import Resctrl
from runtime_proxy.loops.burst import CPUBurstLoop, SharePoolLoad
from runtime_proxy.loops.reconciler import RECONCILE_DRIFT, Reconciler
from runtime_proxy.state.nodeconfig import NodeConfig
from tests.cgroup_files import make_files, make_resctrl, read_file
from tests.runtime_proxy.fake_backend import FakeBackend
from tests.topologies import SINGLE_SOCKET_HT, THIS_VM

RS = "scheduling.koordinator.sh/resource-status"
GI_ON = {"resourceQOSStrategy": {"lsClass": {"cpuQOS": {"enable": True, "groupIdentity": 2}},
                                 "beClass": {"cpuQOS": {"enable": True, "groupIdentity": -1}}}}


def make_pod(uid: str, qos: str, *, kube: str = "burstable", annotations: dict[str, str] | None = None,
             parent: str | None = None) -> PodFacts:
    return PodFacts(
        name=uid, namespace="ns", uid=uid, sandbox_id=f"sb-{uid}",
        labels=MappingProxyType({"koordinator.sh/qosClass": qos}),
        annotations=MappingProxyType(annotations or {}),
        cgroup_parent=parent if parent is not None else f"/kubepods/{kube}/pod{uid}",
    )


def tree(root: Path, paths: list[str], files: dict[str, str]) -> None:
    """A cgroup v1-shaped tree: every path gets every file."""
    for path in paths:
        make_files(root, path, files)


def reconciler(backend: FakeBackend, root: Path, **kwargs: Any) -> Reconciler:
    return Reconciler(backend, pm=make_plugin_manager(entry_points=False), cgroups=Cgroups(root, version=1),
                      **kwargs)


async def test_ls_cpuset_shrinks_when_an_lsr_pod_arrives_and_grows_back(tmp_path: Path) -> None:
    ls = make_pod("ls", "LS")
    c = ContainerFacts(name="app", id="c-ls", resources=Resources(cpuset_cpus="0-7"))
    backend = FakeBackend(NodeFacts(cpu_topology=SINGLE_SOCKET_HT), [ls], [(ls, c)])
    r = reconciler(backend, tmp_path)
    await r.reconcile_once()
    assert backend.updates == []
    lsr = make_pod("lsr", "LSR", kube="", annotations={RS: '{"cpuset":"2-3"}'}, parent="/kubepods/podlsr")
    backend.pod_list.append(lsr)
    report = await r.reconcile_once("store")
    assert backend.updates == [("c-ls", {"cpuset_cpus": "0-1,4-7"})]
    assert any("cpuset_cpus" in d for d in report.drift)
    backend.pod_list.remove(lsr)
    await r.reconcile_once("store")
    assert backend.updates[-1] == ("c-ls", {"cpuset_cpus": "0-7"})


async def test_store_changes_wake_the_reconciler_by_urgency(tmp_path: Path) -> None:
    """A change of the bound cpusets starts a round after the debounce; other store changes
    are gathered into one round ``store_delay`` later."""
    backend = FakeBackend(NodeFacts(cpu_topology=SINGLE_SOCKET_HT), [], [])
    r = reconciler(backend, tmp_path, period=60, debounce=0.01, store_delay=0.3)
    await r.start()
    try:
        async def rounds_after(seconds: float) -> int:
            await asyncio.sleep(seconds)
            return r.rounds

        start = await rounds_after(0.1)
        for _ in range(5):
            r.store_changed(pools_changed=False)
        assert await rounds_after(0.15) == start
        assert await rounds_after(0.35) == start + 1
        r.store_changed(pools_changed=True)
        assert await rounds_after(0.1) == start + 2
    finally:
        await r.stop()


async def test_hand_changed_cgroup_file_is_found_and_fixed(tmp_path: Path) -> None:
    ls = make_pod("ls", "LS")
    c = ContainerFacts(name="app", id="c1", resources=Resources(cpuset_cpus="0-7"))
    tree(tmp_path, ["kubepods/burstable/podls/c1"], {"cpuset.cpus": "0-7"})
    tree(tmp_path, ["kubepods", "kubepods/burstable", "kubepods/besteffort", "kubepods/burstable/podls"],
         {"cpu.bvt_warp_ns": "0"})
    backend = FakeBackend(NodeFacts(cpu_topology=SINGLE_SOCKET_HT, node_slo=MappingProxyType(GI_ON)), [ls], [(ls, c)])
    r = reconciler(backend, tmp_path)
    first = await r.reconcile_once("start")
    assert read_file(tmp_path, "kubepods/burstable/podls", "cpu.bvt_warp_ns") == "2"
    assert read_file(tmp_path, "kubepods/besteffort", "cpu.bvt_warp_ns") == "-1"
    assert len(first.drift) == 3  # pod, burstable dir, besteffort dir
    (tmp_path / "cpu/kubepods/burstable/podls/cpu.bvt_warp_ns").write_text("0\n")
    (tmp_path / "cpuset/kubepods/burstable/podls/c1/cpuset.cpus").write_text("3\n")
    before = RECONCILE_DRIFT.labels("pod", "cpu.bvt_warp_ns")._value.get()
    second = await r.reconcile_once("start")
    assert read_file(tmp_path, "kubepods/burstable/podls", "cpu.bvt_warp_ns") == "2"
    assert backend.updates == [("c1", {"cpuset_cpus": "0-7"})]  # the runtime rewrites the file
    assert RECONCILE_DRIFT.labels("pod", "cpu.bvt_warp_ns")._value.get() - before == 1
    assert len(second.drift) == 2
    third = await r.reconcile_once()
    assert third.drift == [] or third.drift == ["container c1 cpuset_cpus=0-7"]


async def test_dry_run_counts_drift_and_changes_nothing(tmp_path: Path) -> None:
    ls = make_pod("ls", "LS")
    tree(tmp_path, ["kubepods", "kubepods/burstable", "kubepods/besteffort", "kubepods/burstable/podls"],
         {"cpu.bvt_warp_ns": "0"})
    c = ContainerFacts(name="app", id="c1", resources=Resources(cpuset_cpus="1"))
    backend = FakeBackend(NodeFacts(cpu_topology=SINGLE_SOCKET_HT, node_slo=MappingProxyType(GI_ON)), [ls], [(ls, c)])
    report = await reconciler(backend, tmp_path, applier=RecordingApplier(cgroups=Cgroups(tmp_path, version=1))
                              ).reconcile_once()
    assert len(report.drift) == 4
    assert report.updates == {"c1": {"cpuset_cpus": "0-7"}}
    assert backend.updates == []
    assert read_file(tmp_path, "kubepods/burstable/podls", "cpu.bvt_warp_ns") == "0"


async def test_missing_kube_qos_dirs_are_logged_once_until_they_appear(tmp_path: Path) -> None:
    """kubepods/besteffort does not exist: its write is skipped and logged once (not every
    round), not an error; once it appeared, a later disappearance is logged again."""
    ls = make_pod("ls", "LS")
    tree(tmp_path, ["kubepods", "kubepods/burstable", "kubepods/burstable/podls"], {"cpu.bvt_warp_ns": "0"})
    backend = FakeBackend(NodeFacts(cpu_topology=SINGLE_SOCKET_HT, node_slo=MappingProxyType(GI_ON)), [ls])
    r = reconciler(backend, tmp_path)

    def missing_logged(logs: list[dict[str, Any]]) -> list[str]:
        return sorted(e["path"] for e in logs if e["event"].startswith("cgroup directory missing"))

    def levels(logs: list[dict[str, Any]]) -> dict[str, str]:
        return {e["path"]: e["log_level"] for e in logs if e["event"].startswith("cgroup directory missing")}

    with capture_logs() as logs:
        first = await r.reconcile_once()
        second = await r.reconcile_once()
        third = await r.reconcile_once()
    # (the sandbox's own cgroup is missing too: the cpuset plugin plans its cpuset.cpus)
    assert missing_logged(logs) == ["kubepods/besteffort", "kubepods/burstable/podls/sb-ls"]
    assert sorted(first.missing) == ["kubeqos kubepods/besteffort", "sandbox kubepods/burstable/podls/sb-ls"]
    assert first.missing == second.missing == third.missing
    # a kube-QoS directory is the node's set-up (warning); a pod's is a moment of its lifecycle
    assert levels(logs) == {"kubepods/besteffort": "warning", "kubepods/burstable/podls/sb-ls": "debug"}
    assert first.errors == second.errors == third.errors == []
    assert not any(e["event"] == "apply failed" for e in logs)
    assert read_file(tmp_path, "kubepods/burstable/podls", "cpu.bvt_warp_ns") == "2"
    # it appears: written, nothing missing; it goes away again: logged once more
    tree(tmp_path, ["kubepods/besteffort"], {"cpu.bvt_warp_ns": "0"})
    with capture_logs() as logs:
        back = await r.reconcile_once()
        assert back.missing == ["sandbox kubepods/burstable/podls/sb-ls"]
        assert read_file(tmp_path, "kubepods/besteffort", "cpu.bvt_warp_ns") == "-1"
        (tmp_path / "cpu/kubepods/besteffort/cpu.bvt_warp_ns").unlink()
        (tmp_path / "cpu/kubepods/besteffort").rmdir()
        await r.reconcile_once()
        await r.reconcile_once()
    assert missing_logged(logs) == ["kubepods/besteffort"]  # the sandbox is still missing: not again


async def test_nodeslo_change_converges_within_one_period(tmp_path: Path) -> None:
    pods = [make_pod(f"p{i}", "LS") for i in range(3)] + [make_pod("b", "BE", kube="besteffort")]
    tree(tmp_path, ["kubepods", "kubepods/burstable", "kubepods/besteffort"] +
         [p.cgroup_parent.strip("/") for p in pods], {"cpu.bvt_warp_ns": "0"})
    cfg_file = tmp_path / "node.yaml"
    cfg_file.write_text(json.dumps({"nodeSLO": {}}))
    node_config = NodeConfig(path=cfg_file, topology=THIS_VM, poll_interval=0.02)
    backend = FakeBackend(NodeFacts(), pods, node_config=node_config)
    # a period far longer than the wait below: converging in time shows the change itself, not
    # the periodic pass, drove the reconcile (a 0.3 s period was a timed assert on a loaded machine)
    r = reconciler(backend, tmp_path, period=120, node_changes=node_config.changes())
    await node_config.start()
    await r.start()
    try:
        await asyncio.sleep(0.1)
        generation = node_config.generation
        cfg_file.write_text(json.dumps({"nodeSLO": GI_ON}))
        # The file is parsed in a child process, which takes its own time; the clock starts when
        # the new config is in use.
        deadline = time.monotonic() + 60
        while node_config.generation == generation:
            assert time.monotonic() < deadline, "the node config file was not taken"
            await asyncio.sleep(0.01)
        changed_at = time.monotonic()
        want = {p.uid: "-1" if p.uid == "b" else "2" for p in pods}
        while not all(read_file(tmp_path, p.cgroup_parent.strip("/"), "cpu.bvt_warp_ns") == want[p.uid] for p in pods):
            assert time.monotonic() - changed_at < r.period / 2, "the change did not drive a reconcile"
            await asyncio.sleep(0.01)
    finally:
        await r.stop()
        await node_config.stop()


@pytest.fixture
def resctrl_tree(tmp_path: Path) -> Path:
    return make_resctrl(tmp_path / "resctrl", cbm_mask="7ff", schemata="    L3:0=7ff;1=7ff\n    MB:0=100;1=100\n",
                        tasks="1\n2\n")


async def test_rdt_groups_schemata_moves_and_cleanup(tmp_path: Path, resctrl_tree: Path) -> None:
    rc = Resctrl(resctrl_tree, vendor="intel")
    cg = Cgroups(tmp_path / "cg", version=1)
    facts = rc.facts()
    assert facts.cbm_mask == "7ff" and facts.cache_ids == (0, 1)
    slo = {"resourceQOSStrategy": {k: {"resctrlQOS": {"enable": True}} for k in ("lsrClass", "lsClass", "beClass")}}
    node = NodeFacts(node_slo=MappingProxyType(slo), resctrl=facts)
    pm = make_plugin_manager(builtins=["rdt"], entry_points=False)
    order = ["rdt"]
    pod_ann = {"node.koordinator.sh/resctrl": '{"llc":{"schemata":{"range":[0,50]}},"mb":{"schemata":{"percent":50}}}'}
    pod_level = make_pod("u1", "LS", annotations=pod_ann)
    be = make_pod("u2", "BE", kube="besteffort")
    tree(tmp_path / "cg", ["kubepods/burstable/podu1/c1", "kubepods/besteffort/podu2/c2"], {"tasks": ""})
    (tmp_path / "cg/cpu/kubepods/burstable/podu1/c1/tasks").write_text("101\n102\n")
    (tmp_path / "cg/cpu/kubepods/besteffort/podu2/c2/tasks").write_text("201\n")

    pipeline = Pipeline(plugin_steps(pm, [("rdt", "Ignore", 2.0)]))
    stage_of = {hook: stage for stage, hook in STAGES.items()}

    async def run(hook: str, *, pod: PodFacts | None = None, container: ContainerFacts | None = None) -> Any:
        result = await pipeline.run(stage_of[hook], pod or PodFacts(), container, node)
        report = apply_files(result.plan, cgroups=cg, resctrl=rc)
        assert report.ok, report.errors
        return report

    await run("rhp_reconcile_node")
    assert (resctrl_tree / "BE" / "schemata").read_text() == "L3:0=f;1=f;\nMB:0=100;1=100;\n"
    assert (resctrl_tree / "LS" / "schemata").read_text() == "L3:0=7ff;1=7ff;\nMB:0=100;1=100;\n"
    await run("rhp_pre_run_pod_sandbox", pod=pod_level)
    assert (resctrl_tree / "koordlet-u1" / "schemata").read_text() == "L3:0=3f;1=3f;\nMB:0=50;1=50;\n"
    await run("rhp_post_start_container", pod=pod_level, container=ContainerFacts(name="a", id="c1"))
    await run("rhp_post_start_container", pod=be, container=ContainerFacts(name="b", id="c2"))
    assert rc.tasks("koordlet-u1") == {101, 102} and rc.tasks("BE") == {201}
    # a new thread appears; the reconciler's container plan moves only it
    (tmp_path / "cg/cpu/kubepods/besteffort/podu2/c2/tasks").write_text("201\n202\n")
    moved = await run("rhp_reconcile_container", pod=be, container=ContainerFacts(name="b", id="c2"))
    assert [n for _, n in moved.moved] == [1] and rc.tasks("BE") == {201, 202}
    await run("rhp_post_remove_pod_sandbox", pod=pod_level)
    assert not (resctrl_tree / "koordlet-u1").exists()
    # a group left behind by a pod the proxy no longer knows is collected by the reconciler
    rc.ensure_group("koordlet-gone")
    backend = FakeBackend(node, [be])
    r = Reconciler(backend, pm=pm, order=order, cgroups=cg, resctrl=rc)
    report = await r.reconcile_once()
    assert report.removed_groups == ["koordlet-gone"] and (resctrl_tree / "BE").exists()


class Sweeper:
    """A plugin that removes its own resctrl groups and sees what the stage gives it."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.seen: list[tuple[tuple[str, ...], tuple[str, ...]]] = []

    @hookimpl
    def rhp_reconcile_resctrl_groups(self, pods: tuple[PodFacts, ...], resctrl_groups: tuple[str, ...]) -> Plan:
        self.seen.append((tuple(p.uid for p in pods), resctrl_groups))
        self.release.wait(30)
        return Plan().remove("resctrl", "sweeper-old") if "sweeper-old" in resctrl_groups else Plan()


async def test_stale_resctrl_groups_are_a_stage_under_the_plugins_policy(tmp_path: Path, resctrl_tree: Path) -> None:
    """The groups left behind are the ``ReconcileResctrlGroups`` stage's: rdt removes the pod
    groups of pods that are gone, another plugin its own groups; a step past its timeout removes
    nothing; dry run counts the drift and removes nothing."""
    rc = Resctrl(resctrl_tree, vendor="intel")
    for group in ("koordlet-gone", "koordlet-u1", "sweeper-old", "LS"):
        rc.ensure_group(group)
    node = NodeFacts(resctrl=rc.facts())
    backend = FakeBackend(node, [make_pod("u1", "LS")])
    pm = make_plugin_manager(builtins=["rdt"], entry_points=False)
    sweeper = Sweeper()
    pm.register(sweeper, name="sweeper")
    steps = plugin_steps(pm, [("sweeper", "Ignore", 0.1), ("rdt", "Ignore", 30.0)])
    cg = Cgroups(tmp_path / "cg", version=1)
    dry = Reconciler(backend, pm=pm, pipeline=Pipeline(steps), cgroups=cg, resctrl=rc,
                     applier=RecordingApplier(cgroups=cg, resctrl=rc))
    report = await dry.reconcile_once()
    assert "stale resctrl group koordlet-gone" in report.drift and report.removed_groups == []
    assert (resctrl_tree / "koordlet-gone").is_dir()
    assert sweeper.seen == [(("u1",), ("LS", "koordlet-gone", "koordlet-u1", "sweeper-old"))]
    r = Reconciler(backend, pm=pm, pipeline=Pipeline(steps), cgroups=cg, resctrl=rc)
    report = await r.reconcile_once()
    assert report.removed_groups == ["koordlet-gone"], "the sweeper ran past its timeout: its plan is left out"
    assert (resctrl_tree / "sweeper-old").is_dir() and (resctrl_tree / "koordlet-u1").is_dir()
    sweeper.release.set()
    r.pipeline = Pipeline(plugin_steps(pm, [("sweeper", "Ignore", 30.0), ("rdt", "Ignore", 30.0)]))
    report = await r.reconcile_once()
    assert report.removed_groups == ["sweeper-old"] and (resctrl_tree / "LS").is_dir()


def test_unsupported_resctrl_is_reported(tmp_path: Path) -> None:
    assert Resctrl(tmp_path / "none").facts().supported is False


# ---- cfsQuotaBurst loop with a fake cgroup tree --------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def burst_setup(tmp_path: Path, policy: str = "auto") -> tuple[FakeBackend, Path]:
    pod = make_pod("b1", "LS")
    c = ContainerFacts(name="app", id="c1", resources=Resources(cpu_quota=20000, cpu_period=100000))
    tree(tmp_path, ["kubepods/burstable/podb1"], {"cpu.cfs_quota_us": "40000"})
    tree(tmp_path, ["kubepods/burstable/podb1/c1"], {"cpu.cfs_quota_us": "20000",
                                                     "cpu.stat": "nr_periods 0\nnr_throttled 0"})
    slo = {"cpuBurstStrategy": {"policy": policy}}
    return FakeBackend(NodeFacts(node_slo=MappingProxyType(slo)), [pod], [(pod, c)]), tmp_path


def burst_loop(backend: FakeBackend, cgroups: Cgroups, **kwargs: Any) -> CPUBurstLoop:
    """The CPU burst loop with the cpu_burst plugin in its own hook runner."""
    pm = make_plugin_manager(builtins=["cpu_burst"], entry_points=False)
    pipeline = Pipeline(plugin_steps(pm, [("cpu_burst", "Ignore", 30.0)]))
    return CPUBurstLoop(backend, pipeline=pipeline, applier=FileApplier(cgroups=cgroups), cgroups=cgroups, **kwargs)


def bump_stat(root: Path, periods: int, throttled: int) -> None:
    (root / "cpu/kubepods/burstable/podb1/c1/cpu.stat").write_text(f"nr_periods {periods}\nnr_throttled {throttled}\n")


@pytest.mark.parametrize(
    ("load", "throttled", "expected_op", "expected_quota", "expected_pod"),
    [
        pytest.param(0.1, 5, UP, 24000, 44000, id="throttled with an idle pool scales up, pod first"),
        pytest.param(0.1, 0, "remain", 20000, 40000, id="not throttled remains"),
        pytest.param(0.47, 5, "remain", 20000, 40000, id="cooling pool holds"),
        pytest.param(0.9, 5, DOWN, 20000, 40000, id="loaded pool never goes below the base"),
    ],
)
async def test_burst_loop_decisions(tmp_path: Path, load: float, throttled: int, expected_op: str, expected_quota: int,
                              expected_pod: int) -> None:
    backend, root = burst_setup(tmp_path)
    clock = Clock()
    loop = burst_loop(backend, Cgroups(root, version=1), pool_load=lambda: load, interval=1.0, clock=clock)
    await loop.step()
    clock.now += 1.0
    bump_stat(root, 10, throttled)
    (change,) = await loop.step()
    assert (change.op, change.new) == (expected_op, expected_quota)
    assert read_file(root, "kubepods/burstable/podb1/c1", "cpu.cfs_quota_us") == str(expected_quota)
    assert read_file(root, "kubepods/burstable/podb1", "cpu.cfs_quota_us") == str(expected_pod)


async def test_burst_loop_scales_to_the_ceiling_then_back_down(tmp_path: Path) -> None:
    backend, root = burst_setup(tmp_path)
    clock = Clock()
    load = {"value": 0.1}
    loop = burst_loop(backend, Cgroups(root, version=1), pool_load=lambda: load["value"], clock=clock)
    quotas = []
    for i in range(1, 10):
        clock.now += 1.0
        bump_stat(root, 10 * i, 5 * i)
        await loop.step()
        quotas.append(int(read_file(root, "kubepods/burstable/podb1/c1", "cpu.cfs_quota_us")))
    assert quotas[-1] == 60000 and quotas == sorted(quotas)  # ceiling = 300% of the base
    load["value"] = 0.8
    for i in range(10, 20):
        clock.now += 1.0
        bump_stat(root, 10 * i, 5 * i)
        await loop.step()
    assert read_file(root, "kubepods/burstable/podb1/c1", "cpu.cfs_quota_us") == "20000"
    assert read_file(root, "kubepods/burstable/podb1", "cpu.cfs_quota_us") == "40000"


async def test_burst_loop_resets_when_the_policy_is_off(tmp_path: Path) -> None:
    backend, root = burst_setup(tmp_path, policy="cpuBurstOnly")
    (root / "cpu/kubepods/burstable/podb1/c1/cpu.cfs_quota_us").write_text("50000\n")
    loop = burst_loop(backend, Cgroups(root, version=1), pool_load=lambda: 0.1, clock=Clock())
    (change,) = await loop.step()
    assert change.op == "reset" and read_file(root, "kubepods/burstable/podb1/c1", "cpu.cfs_quota_us") == "20000"


class QuotaStub:
    """A ``ReconcileCpuBurst`` plugin: a quota one above the current one for every container,
    counting its rounds in the state it reports; ``release`` unset makes it hang."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.release.set()
        self.seen: list[dict[str, BurstState]] = []

    @hookimpl
    def rhp_reconcile_cpu_burst(self, pods: tuple[PodFacts, ...], burst: BurstRound) -> Plan:
        self.release.wait(30)
        self.seen.append(dict(burst.states))
        plan = Plan()
        for pod in pods:
            for c in pod.containers:
                old = burst.containers[c.id].cfs_quota_us
                rounds = (burst.states.get(c.id) or BurstState((0, 0, 0.0))).throttle or (0, 0, 0.0)
                w = CgroupWrite("container", f"kubepods/burstable/pod{pod.uid}/{c.id}", "cpu.cfs_quota_us",
                                str(old + 1))
                plan.write(w.level, w.path, w.file, w.value)
                plan.report(BurstDecision(c.id, old, old + 1, "up", None, "idle",
                                          BurstState((rounds[0] + 1, 0, burst.at)), (w,)))
        return plan


async def test_the_burst_stage_runs_under_the_plugins_timeout_and_hands_its_state_back(tmp_path: Path) -> None:
    """Any plugin may implement ``ReconcileCpuBurst``: its writes are applied, its state comes
    back in the next round, and a round where it runs past its timeout writes nothing and keeps
    the state; without a plugin for the stage the loop reads nothing."""
    backend, root = burst_setup(tmp_path)
    cg = Cgroups(root, version=1)
    pm = make_plugin_manager(builtins=[], entry_points=False)
    stub = QuotaStub()
    pm.register(stub, name="stub")
    loop = CPUBurstLoop(backend, pipeline=Pipeline(plugin_steps(pm, [("stub", "Ignore", 0.2)])),
                        applier=FileApplier(cgroups=cg), cgroups=cg, pool_load=lambda: 0.1, clock=Clock())
    (change,) = await loop.step()
    assert (change.old, change.new, change.applied) == (20000, 20001, True)
    assert read_file(root, "kubepods/burstable/podb1/c1", "cpu.cfs_quota_us") == "20001"
    stub.release.clear()
    assert await loop.step() == [], "past its timeout: no decision, nothing written"
    assert read_file(root, "kubepods/burstable/podb1/c1", "cpu.cfs_quota_us") == "20001"
    stub.release.set()
    loop.pipeline = Pipeline(plugin_steps(pm, [("stub", "Ignore", 30.0)]))
    await loop.step()
    assert stub.seen[-1]["c1"].throttle == (1, 0, 100.0), "the state of the first round came back"
    assert read_file(root, "kubepods/burstable/podb1/c1", "cpu.cfs_quota_us") == "20002"
    idle = CPUBurstLoop(backend, pipeline=Pipeline(), applier=FileApplier(cgroups=cg), cgroups=cg,
                        pool_load=lambda: pytest.fail("a loop without a plugin reads nothing"))
    assert await idle.step() == []


# ---- real cgroups: host applications and a throttled busy loop (root only) ------------------------

REAL = Path("/sys/fs/cgroup")
needs_real_v1 = pytest.mark.skipif(
    os.geteuid() != 0 or not (REAL / "cpu" / "cpu.cfs_quota_us").exists() or not (REAL / "cpuset").is_dir()
    or not (REAL / "cpuacct").is_dir(),
    reason="needs root and cgroup v1 cpu, cpuacct and cpuset hierarchies",
)


@pytest.fixture
def real_base() -> Iterator[str]:
    name = f"rhp-test-recon-{uuid.uuid4().hex[:8]}"
    yield name
    for ctrl in ("cpu", "cpuacct", "cpuset"):
        base = REAL / ctrl / name
        if base.exists():
            for d in sorted((p for p in base.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
                for pid in (d / "cgroup.procs").read_text().split():
                    (REAL / ctrl / "cgroup.procs").write_text(pid)
                d.rmdir()
            for pid in (base / "cgroup.procs").read_text().split():
                (REAL / ctrl / "cgroup.procs").write_text(pid)
            base.rmdir()


@needs_real_v1
@pytest.mark.requires_root
async def test_host_apps_on_real_cgroups(real_base: str) -> None:
    for ctrl in ("cpu", "cpuset"):
        (REAL / ctrl / real_base / "nginx").mkdir(parents=True)
    for d in (REAL / "cpuset" / real_base, REAL / "cpuset" / real_base / "nginx"):
        (d / "cpuset.mems").write_text((REAL / "cpuset/cpuset.mems").read_text())
        (d / "cpuset.cpus").write_text((REAL / "cpuset/cpuset.cpus").read_text())
    apps = [
        {"name": "nginx", "qos": "LS", "cgroupPath": {"base": "CgroupRoot", "parentDir": real_base,
                                                      "relativePath": "nginx"}},
        {"name": "evil", "qos": "LS", "cgroupPath": {"base": "CgroupRoot", "parentDir": real_base,
                                                     "relativePath": "../../../tmp"}},
    ]
    slo = {"hostApplications": apps,
           "resourceQOSStrategy": {"policies": {"cpuPolicy": "coreSched"},
                                   "lsClass": {"cpuQOS": {"enable": True, "schedIdle": 1}}}}
    topo = CPUTopology.from_annotation({"detail": [{"id": 0, "core": 0, "socket": 0, "node": 0},
                                                   {"id": 1, "core": 1, "socket": 0, "node": 0}]})
    lsr = make_pod("lsr", "LSR", annotations={RS: '{"cpuset":"1"}'}, parent="/kubepods/podlsr")
    backend = FakeBackend(NodeFacts(node_slo=MappingProxyType(slo), cpu_topology=topo, cgroup=CgroupInfo()), [lsr])
    r = Reconciler(backend, pm=make_plugin_manager(builtins=["host_app_qos"], entry_points=False),
                   cgroups=Cgroups(REAL, version=1))
    report = await r.reconcile_once()
    assert (REAL / "cpu" / real_base / "nginx" / "cpu.idle").read_text().strip() == "1"
    assert (REAL / "cpuset" / real_base / "nginx" / "cpuset.cpus").read_text().strip() == "0"
    assert any("evil" in s and "escapes" in s for s in report.skipped)
    # group identity instead: this kernel has no cpu.bvt_warp_ns, reported as unsupported, not an error
    backend.node_facts = backend.node_facts.replace(node_slo=MappingProxyType(
        {"hostApplications": apps[:1], "resourceQOSStrategy": {"lsClass": {"cpuQOS": {"enable": True}}}}))
    report = await r.reconcile_once()
    assert report.errors == []


BURNER = "import time\nwhile True:\n    pass\n"


@needs_real_v1
@pytest.mark.requires_root
async def test_real_busy_loop_is_throttled_then_burst_then_lowered(real_base: str) -> None:
    if (os.cpu_count() or 1) < 2:
        pytest.skip("needs two CPUs")
    pod_dir, cont = f"{real_base}/podb1", f"{real_base}/podb1/c1"
    for ctrl in ("cpu", "cpuacct"):
        (REAL / ctrl / cont).mkdir(parents=True)
    (REAL / "cpu" / cont / "cpu.cfs_quota_us").write_text("20000")
    # The most CPU weight there is for the test's tree, so on a loaded machine the burner still
    # gets enough CPU to be throttled at every quota up to the ceiling (0.6 CPU).
    (REAL / "cpu" / real_base / "cpu.shares").write_text("262144")
    pod = make_pod("b1", "LS", parent=f"/{pod_dir}")
    c = ContainerFacts(name="app", id="c1", resources=Resources(cpu_quota=20000, cpu_period=100000))
    # Phase 1 must not depend on what else runs on this shared machine, so the pool is reported
    # idle; phase 2 measures the real pool (/proc/stat) while a second busy loop loads it.
    slo = {"cpuBurstStrategy": {"policy": "auto", "sharePoolThresholdPercent": 40}}
    backend = FakeBackend(NodeFacts(node_slo=MappingProxyType(slo), cpu_topology=THIS_VM), [pod], [(pod, c)])
    cg = Cgroups(REAL, version=1)
    burner = subprocess.Popen([sys.executable, "-c", BURNER])
    loader: subprocess.Popen[bytes] | None = None
    try:
        for ctrl in ("cpu", "cpuacct"):
            (REAL / ctrl / cont / "cgroup.procs").write_text(str(burner.pid))
        real = SharePoolLoad(backend, cg)
        measured: list[float | None] = []
        loaded = False

        def pool_load() -> float | None:
            if not loaded:
                return 0.0
            measured.append(real())
            return measured[-1]

        # interval 1 s: two samples up to 2 s apart still count (rounds are slow on a loaded machine)
        loop = burst_loop(backend, cg, interval=1.0, pool_load=pool_load)
        deadline = time.monotonic() + 6  # a bound for a loaded machine; the loop ends at the ceiling
        seen: list[int] = []
        while time.monotonic() < deadline and (not seen or seen[-1] < 60000):
            await loop.step()
            seen.append(cg.read_int(cont, "cpu.cfs_quota_us") or 0)
            await asyncio.sleep(0.15)
        assert cg.read_stat(cont).get("nr_throttled", 0) > 0
        # raised within bounds: above the base, never above 300% of it (on a busy machine the
        # burner may get too little CPU to stay throttled all the way to the ceiling)
        assert seen[-1] >= 41472 and max(seen) <= 60000
        loader = subprocess.Popen([sys.executable, "-c", BURNER])
        loaded = True
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and seen[-1] > 20000:
            await asyncio.sleep(0.15)
            await loop.step()
            seen.append(cg.read_int(cont, "cpu.cfs_quota_us") or 0)
        assert seen[-1] == 20000  # back to the base, never below
        assert min(seen) >= 20000
        assert max(m for m in measured if m is not None) >= 0.4
    finally:
        for proc in (burner, loader):
            if proc is not None:
                proc.kill()
                proc.wait()
