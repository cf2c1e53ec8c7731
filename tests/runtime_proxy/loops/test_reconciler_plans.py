"""The reconciler's remembered plans: a stage's plan for the same node, pod, container and steps
is reused, every file is still compared with it, and any change of those facts (NodeSLO, a
pod's labels, the steps), a failed step or a pod that left makes the next round plan anew."""

from __future__ import annotations

from pathlib import Path
from types import MappingProxyType

from hooks.facts import ContainerFacts, NodeFacts, PodFacts, Resources, pod_cgroup_path
from hooks.manager import make_plugin_manager
from hooks.plan import Plan
from hooks.spec import hookimpl
from runtime_proxy.engine.pipeline import Pipeline, plugin_steps
from runtime_proxy.host.cgroups import Cgroups
from runtime_proxy.loops.reconciler import Reconciler
from tests.cgroup_files import make_files, read_file
from tests.runtime_proxy.fake_backend import FakeBackend
from tests.topologies import SINGLE_SOCKET_HT

GI = "cpu.bvt_warp_ns"


def gi_slo(ls: int) -> MappingProxyType[str, object]:
    return MappingProxyType({"resourceQOSStrategy": {
        "lsClass": {"cpuQOS": {"enable": True, "groupIdentity": ls}},
        "beClass": {"cpuQOS": {"enable": True, "groupIdentity": -1}}}})


class Counting:
    """Writes ``cpu.shares`` = the pod's label ``shares`` at ReconcilePod, counting its calls;
    fails while ``failing``."""

    def __init__(self) -> None:
        self.calls = 0
        self.failing = False

    @hookimpl
    def rhp_reconcile_pod(self, pod: PodFacts, node: NodeFacts) -> Plan | None:
        self.calls += 1
        if self.failing:
            raise RuntimeError("a plugin's bad day")
        return Plan().write("pod", pod_cgroup_path(pod), "cpu.shares", pod.labels.get("shares", "2"))


def pod(uid: str, qos: str = "LS", shares: str = "2") -> PodFacts:
    kube = "besteffort" if qos == "BE" else "burstable"
    return PodFacts(name=uid, namespace="ns", uid=uid, sandbox_id=f"sb-{uid}",
                    labels=MappingProxyType({"koordinator.sh/qosClass": qos, "shares": shares}),
                    cgroup_parent=f"/kubepods/{kube}/pod{uid}")


def setup(tmp_path: Path) -> tuple[Reconciler, FakeBackend, Counting]:
    for path in ("kubepods", "kubepods/burstable", "kubepods/besteffort", "kubepods/burstable/poda",
                 "kubepods/besteffort/poda"):
        make_files(tmp_path, path, {GI: "0", "cpu.shares": "1024"})
    make_files(tmp_path, "kubepods/burstable/poda/c1", {GI: "0", "cpuset.cpus": "0-7"})
    a = pod("a")
    backend = FakeBackend(NodeFacts(cpu_topology=SINGLE_SOCKET_HT, node_slo=gi_slo(2)), [a],
                          [(a, ContainerFacts(name="app", id="c1", resources=Resources(cpuset_cpus="0-7")))])
    counting = Counting()
    pm = make_plugin_manager(entry_points=False)
    pm.register(counting, name="counting")
    r = Reconciler(backend, pm=pm, cgroups=Cgroups(tmp_path, version=1))
    return r, backend, counting


async def test_a_plan_is_reused_for_the_same_facts_and_a_file_changed_by_hand_is_still_put_back(
    tmp_path: Path,
) -> None:
    r, _, counting = setup(tmp_path)
    await r.reconcile_once("start")
    assert counting.calls == 1 and read_file(tmp_path, "kubepods/burstable/poda", "cpu.shares") == "2"
    (tmp_path / "cpu/kubepods/burstable/poda/cpu.shares").write_text("7\n")
    report = await r.reconcile_once("period")
    assert counting.calls == 1, "the same facts: the plan of the first round"
    assert read_file(tmp_path, "kubepods/burstable/poda", "cpu.shares") == "2"
    assert any("cpu.shares=2" in d for d in report.drift)


async def test_a_nodeslo_change_takes_effect_on_the_next_round(tmp_path: Path) -> None:
    r, backend, counting = setup(tmp_path)
    await r.reconcile_once("start")
    assert read_file(tmp_path, "kubepods/burstable/poda", GI) == "2"
    backend.node_facts = backend.node_facts.replace(node_slo=gi_slo(0))
    await r.reconcile_once("node-config")
    assert read_file(tmp_path, "kubepods/burstable/poda", GI) == "0"
    assert counting.calls == 2


async def test_a_pods_changed_facts_take_effect_on_the_next_round(tmp_path: Path) -> None:
    r, backend, counting = setup(tmp_path)
    await r.reconcile_once("start")
    changed = pod("a", shares="64")
    backend.pod_list = [changed]
    backend.container_list = [(changed, c) for _, c in backend.container_list]
    await r.reconcile_once("store")
    assert counting.calls == 2
    assert read_file(tmp_path, "kubepods/burstable/poda", "cpu.shares") == "64"
    # Only that pod is planned anew: the next round reuses the new plan.
    await r.reconcile_once("period")
    assert counting.calls == 2


async def test_a_failed_step_is_not_remembered(tmp_path: Path) -> None:
    r, _, counting = setup(tmp_path)
    counting.failing = True
    await r.reconcile_once("start")
    counting.failing = False
    await r.reconcile_once("period")
    assert counting.calls == 2 and read_file(tmp_path, "kubepods/burstable/poda", "cpu.shares") == "2"
    await r.reconcile_once("period")
    assert counting.calls == 2


async def test_new_steps_plan_anew(tmp_path: Path) -> None:
    r, _, counting = setup(tmp_path)
    await r.reconcile_once("start")
    r.pipeline.set_steps(plugin_steps(r.pm, [(n, "Ignore", 2.0) for n in r.order]))
    await r.reconcile_once("period")
    assert counting.calls == 2


async def test_a_hook_server_step_is_never_remembered(tmp_path: Path) -> None:
    """A step that is not an in-process plugin may answer differently for the same facts."""
    r, _, counting = setup(tmp_path)

    class Remote:
        name, policy, timeout = "remote", "Ignore", 2.0

        def handles(self, stage: str) -> bool:
            return False

        async def call(self, *args: object) -> None:
            return None

    r.pipeline = Pipeline(r.pipeline.steps)
    r.pipeline.set_remote_steps([Remote()])  # type: ignore[list-item]
    await r.reconcile_once("start")
    await r.reconcile_once("period")
    assert counting.calls == 2


async def test_a_pod_that_left_is_forgotten_and_planned_anew_when_it_comes_back(tmp_path: Path) -> None:
    r, backend, counting = setup(tmp_path)
    await r.reconcile_once("start")
    assert any(key[1] == "a" for key in r._plans)
    kept = (backend.pod_list, backend.container_list)
    backend.pod_list, backend.container_list = [], []
    await r.reconcile_once("store")
    assert not any(key[1] == "a" for key in r._plans)
    backend.pod_list, backend.container_list = kept
    (tmp_path / "cpu/kubepods/burstable/poda/cpu.shares").write_text("9\n")
    await r.reconcile_once("store")
    assert counting.calls == 2 and read_file(tmp_path, "kubepods/burstable/poda", "cpu.shares") == "2"
