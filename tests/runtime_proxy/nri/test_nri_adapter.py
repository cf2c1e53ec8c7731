"""NRI events through the real pipeline and built-in plugins: facts in, NRI replies and applier
writes out."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from cri_protos import nri_pb2
from hooks.facts import ContainerFacts, NodeFacts, PodFacts
from hooks.manager import make_plugin_manager, plugin_order
from hooks.plan import Plan
from hooks.spec import hookimpl
from runtime_proxy.codecs.nri import adjustment, container_facts, linux_resources, pod_facts
from runtime_proxy.engine.lifecycle import StaticNode
from runtime_proxy.engine.pipeline import Pipeline, plugin_steps
from runtime_proxy.host.apply import FileApplier
from runtime_proxy.host.apply import RecordingApplier as DryRun
from runtime_proxy.host.cgroups import Cgroups
from runtime_proxy.nri.adapter import NriEngine
from runtime_proxy.nri.connection import RpcError
from tests.cgroup_files import make_files, read_file
from tests.hooks.plugins.factories import node
from tests.topologies import DUAL_SOCKET_HT

E = nri_pb2.Event
PARENT = "/kubepods/burstable/podu1"


class RecordingApplier:
    def __init__(self) -> None:
        self.applied: list[tuple[str, Plan]] = []

    def carries(self, plan: Plan, *, stage: str) -> bool:
        return True

    async def apply(self, plan: Plan, *, stage: str) -> None:
        self.applied.append((stage, plan))

    def writes(self) -> list[tuple[str, str, str, str]]:
        return [(stage, w.path, w.file, w.value) for stage, plan in self.applied for w in plan.writes]


def _engine(*extra: object, builtins: tuple[str, ...] = (), policy: str = "Ignore",
            dry_run: bool = False) -> tuple[NriEngine, RecordingApplier]:
    pm = make_plugin_manager(builtins=builtins, entry_points=False, extra=extra)
    names = plugin_order(pm)
    pipeline = Pipeline(plugin_steps(pm, [(name, policy, 2.0) for name in names]))  # type: ignore[misc]
    applier = RecordingApplier()
    # Dry-run is the recording applier: the engine holds it, the test's recorder sees nothing.
    held = DryRun() if dry_run else applier
    return NriEngine(pipeline, applier=held), applier


def _pod(annotations: dict[str, str] | None = None, labels: dict[str, str] | None = None) -> Any:
    pod = nri_pb2.PodSandbox(id="sb1", name="web", uid="u1", namespace="default",
                             labels=labels or {}, annotations=annotations or {})
    pod.linux.cgroup_parent = PARENT
    return pod


def _container(cid: str = "c1", env: tuple[str, ...] = ()) -> Any:
    container = nri_pb2.Container(id=cid, pod_sandbox_id="sb1", name="app", env=list(env))
    container.linux.resources.cpu.shares.value = 1024
    container.linux.resources.cpu.quota.value = 50000
    container.linux.resources.cpu.period.value = 100000
    container.linux.resources.cpu.cpus = "0-3"
    container.linux.resources.memory.limit.value = 1 << 30
    return container


LSR = {"scheduling.koordinator.sh/resource-status": json.dumps({"cpuset": "2"})}
LSR_LABELS = {"koordinator.sh/qosClass": "LSR"}


class Everything:
    """A plugin that sets every field NRI can carry at create and update."""

    @hookimpl
    def rhp_pre_create_container(self, pod: PodFacts, container: ContainerFacts, node: NodeFacts) -> Plan:
        plan = Plan()
        for name, value in (("cpuset_cpus", "1"), ("cpuset_mems", "0"), ("cpu_shares", 2),
                            ("cpu_quota", -1), ("cpu_period", 100000), ("memory_limit_in_bytes", 1 << 28)):
            plan.set_resource(name, value)
        plan.set_env("FROM_PLUGIN", "yes").set_annotation("rhp/seen", container.id)
        plan.write("container", f"{pod.cgroup_parent.strip('/')}/{container.id}", "cpu.cfs_burst_us", 0)
        return plan

    @hookimpl
    def rhp_pre_update_container_resources(self, pod: PodFacts, container: ContainerFacts,
                                           node: NodeFacts) -> Plan:
        return Plan().set_resource("cpu_shares", 4).set_resource("cpuset_cpus", "3")


class Rejects:
    @hookimpl
    def rhp_pre_create_container(self, pod: PodFacts, container: ContainerFacts, node: NodeFacts) -> Plan:
        raise RuntimeError("no")


def test_facts_from_nri_messages() -> None:
    pod = pod_facts(_pod(LSR, LSR_LABELS))
    assert (pod.sandbox_id, pod.uid, pod.name, pod.namespace, pod.cgroup_parent) == ("sb1", "u1", "web", "default",
                                                                                     PARENT)
    assert pod.qos_label == "LSR" and pod.effective_kube_qos == "Burstable"
    container = container_facts(_container(env=("A=1", "B=x=y", "NOEQUALS", "=novalue")))
    assert container.envs == {"A": "1", "B": "x=y"}
    res = container.resources
    assert (res.cpu_shares, res.cpu_quota, res.cpu_period, res.cpuset_cpus, res.memory_limit_in_bytes) == (
        1024, 50000, 100000, "0-3", 1 << 30)


@pytest.mark.parametrize(
    ("changes", "expected", "skipped"),
    [
        pytest.param({"cpu_quota": -1}, {"cpu": {"quota": {"value": "-1"}}}, [], id="an unlimited quota is carried"),
        pytest.param({"cpuset_cpus": "1-2", "cpuset_mems": "0"}, {"cpu": {"cpus": "1-2", "mems": "0"}}, [],
                     id="cpuset cpus and mems are carried"),
        pytest.param({"cpu_shares": 2, "cpu_period": 100000},
                     {"cpu": {"shares": {"value": "2"}, "period": {"value": "100000"}}}, [],
                     id="shares and period are carried"),
        pytest.param({"memory_limit_in_bytes": 1024}, {"memory": {"limit": {"value": "1024"}}}, [],
                     id="a memory limit is carried"),
        pytest.param({"cpuset_cpus": ""}, {}, ["cpuset_cpus"], id="an empty cpuset cannot be said in NRI"),
        pytest.param({"oom_score_adj": 5}, {}, ["oom_score_adj"], id="oom_score_adj is not a resource"),
    ],
)
def test_linux_resources_from_plan_changes(changes: dict[str, Any], expected: dict[str, Any],
                                           skipped: list[str]) -> None:
    from google.protobuf.json_format import MessageToDict

    res, not_carried = linux_resources(changes)
    assert MessageToDict(res, preserving_proto_field_name=True) == expected
    assert not_carried == skipped


def test_adjustment_carries_env_annotations_and_oom_score_adj() -> None:
    plan = Plan().set_env("K", "V").set_annotation("a", "b").set_resource("oom_score_adj", 3)
    plan.set_cgroup_parent("/elsewhere")
    adjust, skipped = adjustment(plan)
    assert [(kv.key, kv.value) for kv in adjust.env] == [("K", "V")]
    assert dict(adjust.annotations) == {"a": "b"}
    assert adjust.linux.oom_score_adj.value == 3
    assert skipped == ["cgroup_parent"]


async def test_lsr_pod_gets_its_cpuset_and_unlimited_quota_from_the_builtin_plugin() -> None:
    engine, applier = _engine(builtins=("cpuset",))
    await engine.state_change(E.RUN_POD_SANDBOX, _pod(LSR, LSR_LABELS), None)
    assert ("PreRunPodSandbox", PARENT.strip("/"), "cpu.cfs_quota_us", "-1") in applier.writes()
    reply = await engine.create_container(_pod(LSR, LSR_LABELS), _container())
    cpu = reply.adjust.linux.resources.cpu
    assert cpu.cpus == "2" and cpu.quota.value == -1


async def test_create_reply_writes_wait_for_start_and_update_names_the_container() -> None:
    engine, applier = _engine(Everything())
    reply = await engine.create_container(_pod(), _container("c7"))
    adjust = reply.adjust
    assert {kv.key: kv.value for kv in adjust.env} == {"FROM_PLUGIN": "yes"}
    assert dict(adjust.annotations) == {"rhp/seen": "c7"}
    res = adjust.linux.resources
    assert (res.cpu.cpus, res.cpu.mems, res.cpu.shares.value, res.cpu.quota.value, res.cpu.period.value,
            res.memory.limit.value) == ("1", "0", 2, -1, 100000, 1 << 28)
    assert applier.applied == []  # the container's cgroup does not exist yet
    await engine.state_change(E.START_CONTAINER, _pod(), _container("c7"))
    assert applier.writes() == [("PreCreateContainer", f"{PARENT.strip('/')}/c7", "cpu.cfs_burst_us", "0")]

    updates = await engine.update_container(_pod(), _container("c7"), nri_pb2.LinuxResources())
    assert [u.container_id for u in updates] == ["c7"]
    assert updates[0].linux.resources.cpu.shares.value == 4
    assert updates[0].linux.resources.cpu.cpus == "3"


async def test_fail_policy_rejects_the_create_with_an_error_status() -> None:
    engine, _ = _engine(Rejects(), policy="Fail")
    with pytest.raises(RpcError) as info:
        await engine.create_container(_pod(), _container())
    assert info.value.code == 9


async def test_ignore_policy_lets_the_create_through_unchanged() -> None:
    engine, _ = _engine(Rejects())
    reply = await engine.create_container(_pod(), _container())
    assert reply == nri_pb2.CreateContainerResponse()


async def test_dry_run_answers_with_no_changes_and_applies_nothing() -> None:
    engine, applier = _engine(Everything(), dry_run=True)
    reply = await engine.create_container(_pod(), _container())
    await engine.state_change(E.START_CONTAINER, _pod(), _container())
    assert reply == nri_pb2.CreateContainerResponse()
    assert await engine.update_container(_pod(), _container(), nri_pb2.LinuxResources()) == []
    assert applier.applied == []


async def test_skip_label_bypasses_every_hook() -> None:
    engine, _ = _engine(Everything())
    pod = _pod(labels={"runtimeproxy.koordinator.sh/skip-hookserver": "true"})
    reply = await engine.create_container(pod, _container())
    assert reply == nri_pb2.CreateContainerResponse()


@pytest.mark.parametrize(
    ("state", "dry_run", "expected"),
    [
        pytest.param(nri_pb2.CONTAINER_RUNNING, False, [("c1", "2", -1, True)],
                     id="a running LSR container gets its bound cpuset back in the reply"),
        pytest.param(nri_pb2.CONTAINER_CREATED, False, [], id="a container that is not running is left alone"),
        pytest.param(nri_pb2.CONTAINER_RUNNING, True, [], id="dry-run sends no updates"),
    ],
)
async def test_synchronize_reconciles_running_containers(state: int, dry_run: bool,
                                                         expected: list[tuple[str, str, int, bool]]) -> None:
    engine, applier = _engine(builtins=("cpuset",), dry_run=dry_run)
    container = _container()
    container.state = state
    updates = await engine.synchronize([_pod(LSR, LSR_LABELS)], [container])
    got = [(u.container_id, u.linux.resources.cpu.cpus, u.linux.resources.cpu.quota.value, u.ignore_failure)
           for u in updates]
    assert got == expected
    quota = ("ReconcilePod", PARENT.strip("/"), "cpu.cfs_quota_us", "-1")
    assert (quota in applier.writes()) is not dry_run


async def test_synchronize_rebuilds_the_store_and_bound_cpusets_reach_the_node() -> None:
    engine, _ = _engine()
    lsr = _pod(LSR, LSR_LABELS)
    assert await engine.synchronize([lsr], [_container()]) == []
    assert [p.sandbox_id for p in engine.store.pods()] == ["sb1"]
    assert dict(engine.node().bound_cpusets) == {"u1": frozenset({2})}
    await engine.state_change(E.REMOVE_POD_SANDBOX, lsr, None)
    assert engine.store.pods() == []


def _lsr_pod(sandbox_id: str, uid: str, cpuset: str, *, pid: int) -> Any:
    pod = nri_pb2.PodSandbox(id=sandbox_id, name=sandbox_id, uid=uid, namespace="default", labels=LSR_LABELS,
                             annotations={"scheduling.koordinator.sh/resource-status": json.dumps({"cpuset": cpuset})},
                             pid=pid)
    pod.linux.cgroup_parent = f"/kubepods/pod{uid}"
    return pod


async def test_a_notready_sandbox_at_synchronize_is_not_planned_and_holds_no_cpus(tmp_path: Path) -> None:
    """After a plugin restart, containerd's Synchronize lists the NotReady sandboxes of pods
    deleted meanwhile (kept until kubelet's garbage collection removes them), with no pid, no
    container and no cgroup left: they are neither planned nor applied (no "applying plan
    failed") and their CPUs go back to the share pools."""
    make_files(tmp_path, "kubepods/podlive", {"cpu.cfs_quota_us": "100000"})
    make_files(tmp_path, "kubepods/podlive/live", {"cpuset.cpus": "0-3"})  # its sandbox's cgroup
    pm = make_plugin_manager(builtins=("cpuset",), entry_points=False)
    applier = FileApplier(cgroups=Cgroups(str(tmp_path), version=1))
    engine = NriEngine(Pipeline(plugin_steps(pm, [("cpuset", "Ignore", 2.0)])), applier=applier,
                       node_source=StaticNode(node(DUAL_SOCKET_HT)))
    live, gone = _lsr_pod("live", "live", "2", pid=4242), _lsr_pod("gone", "gone", "3", pid=0)
    with capture_logs() as logs:
        await engine.synchronize([gone, live], [])
    assert [e["event"] for e in logs if e["log_level"] == "error"] == []
    assert read_file(tmp_path, "kubepods/podlive", "cpu.cfs_quota_us") == "-1"
    assert read_file(tmp_path, "kubepods/podlive/live", "cpuset.cpus") == "2"
    assert not (tmp_path / "cpu" / "kubepods" / "podgone").exists()
    assert dict(engine.node().bound_cpusets) == {"live": frozenset({2})}
    assert [p.sandbox_id for p in engine.holding_pods()] == ["live"]


async def test_without_any_pid_at_synchronize_no_sandbox_counts_as_stopped() -> None:
    """A runtime that reports no sandbox pid at all cannot be read for stopped sandboxes: every
    pod keeps its CPUs, as before."""
    engine, _ = _engine()
    await engine.synchronize([_lsr_pod("a", "a", "2", pid=0), _lsr_pod("b", "b", "3", pid=0)], [])
    assert dict(engine.node().bound_cpusets) == {"a": frozenset({2}), "b": frozenset({3})}


async def test_a_sandbox_with_a_running_container_is_not_stopped_whatever_its_pid() -> None:
    engine, _ = _engine()
    running = _container("c1")
    running.state = nri_pb2.CONTAINER_RUNNING
    await engine.synchronize([_lsr_pod("sb1", "a", "2", pid=0), _lsr_pod("b", "b", "3", pid=7)], [running])
    assert dict(engine.node().bound_cpusets) == {"a": frozenset({2}), "b": frozenset({3})}


async def test_stop_pod_sandbox_releases_the_cpus_of_a_pod_without_containers_for_good() -> None:
    """StopPodSandbox releases the pod's CPUs, also when it never had a container; a late
    CreateContainer for the stopped sandbox (containerd refuses one) does not bind them again."""
    engine, _ = _engine()
    lsr = _lsr_pod("lsr", "lsr", "2", pid=7)
    await engine.state_change(E.RUN_POD_SANDBOX, lsr, None)
    assert dict(engine.node().bound_cpusets) == {"lsr": frozenset({2})}
    await engine.state_change(E.STOP_POD_SANDBOX, lsr, None)
    assert engine.node().bound_cpusets == {} and engine.holding_pods() == []
    late = _container("late")
    late.pod_sandbox_id = "lsr"
    await engine.create_container(lsr, late)
    assert engine.node().bound_cpusets == {} and engine.holding_pods() == []


# -- subscribed events and background processing ---------------------------------------------------


class PostStart:
    @hookimpl
    def rhp_post_start_container(self, pod: PodFacts, container: ContainerFacts, node: NodeFacts) -> Plan:
        return Plan()


@pytest.mark.parametrize(
    ("plugins", "more"),
    [
        pytest.param((), set(), id="with no plugin only the events the store needs are wanted"),
        pytest.param((Everything(),), {E.START_CONTAINER},
                     id="a create plan with file writes wants StartContainer, where they are applied"),
        pytest.param((PostStart(),), {E.POST_START_CONTAINER}, id="a PostStartContainer hook wants its event"),
        pytest.param((Everything(), PostStart()), {E.POST_START_CONTAINER},
                     id="create-time file writes ride on PostStartContainer when that is wanted anyway"),
    ],
)
def test_wanted_events_follow_the_pipeline(plugins: tuple[object, ...], more: set[int]) -> None:
    engine, _ = _engine(*plugins)
    always = {E.RUN_POD_SANDBOX, E.STOP_POD_SANDBOX, E.REMOVE_POD_SANDBOX, E.CREATE_CONTAINER, E.UPDATE_CONTAINER,
              E.STOP_CONTAINER, E.REMOVE_CONTAINER}
    assert set(engine.wanted_events()) == always | more


async def test_background_events_are_answered_at_once_and_a_create_sees_them_applied_in_order() -> None:
    engine, applier = _engine(builtins=("cpuset",))
    engine.background = True
    await engine.state_change(E.RUN_POD_SANDBOX, _pod(LSR, LSR_LABELS), None)
    assert applier.writes() == []  # queued, not yet processed
    reply = await engine.create_container(_pod(LSR, LSR_LABELS), _container())
    assert ("PreRunPodSandbox", PARENT.strip("/"), "cpu.cfs_quota_us", "-1") in applier.writes()
    assert reply.adjust.linux.resources.cpu.cpus == "2"
    await engine.stop_container(_pod(LSR, LSR_LABELS), _container())
    await engine.state_change(E.REMOVE_CONTAINER, _pod(LSR, LSR_LABELS), _container())
    await engine.close()
    assert engine.store.container("c1") is None and engine.stopped == set()


async def test_a_failing_background_event_does_not_stop_the_ones_after_it() -> None:
    class Boom:
        @hookimpl
        def rhp_pre_start_container(self, pod: PodFacts, container: ContainerFacts, node: NodeFacts) -> Plan:
            raise RuntimeError("boom")

    # Under the Fail policy the StartContainer's processing itself raises (in the worker).
    engine, _ = _engine(Boom(), policy="Fail")
    engine.background = True
    await engine.state_change(E.RUN_POD_SANDBOX, _pod(), None)
    await engine.state_change(E.START_CONTAINER, _pod(), _container())
    await engine.state_change(E.REMOVE_POD_SANDBOX, _pod(), None)
    await asyncio.wait_for(engine.drain(), 10)  # every queued event was taken off the queue
    await engine.close()
    assert engine.store.pod("sb1") is None


async def test_create_time_writes_are_applied_at_post_start_when_start_is_not_subscribed() -> None:
    engine, applier = _engine(Everything())
    await engine.create_container(_pod(), _container())
    await engine.state_change(E.POST_START_CONTAINER, _pod(), _container())
    assert applier.writes() == [("PreCreateContainer", "kubepods/burstable/podu1/c1", "cpu.cfs_burst_us", "0")]
    await engine.state_change(E.START_CONTAINER, _pod(), _container())
    assert len(applier.writes()) == 1  # applied once


async def test_a_claim_off_the_node_is_not_bound_node_wide() -> None:
    """The NRI plugin judges bound cpusets with the node's CPUs, as the proxy does: an LSR pod
    whose resource-status names CPUs the node lacks binds nothing node-wide (its CPUs stay in
    the share pools of every other pod)."""
    pm = make_plugin_manager(builtins=(), entry_points=False, extra=())
    engine = NriEngine(Pipeline(plugin_steps(pm, [])), applier=RecordingApplier(),
                       node_source=StaticNode(node(DUAL_SOCKET_HT)))
    far = _pod({"scheduling.koordinator.sh/resource-status": json.dumps({"cpuset": "2,400"})}, LSR_LABELS)
    assert await engine.synchronize([far], [_container()]) == []
    assert dict(engine.node().bound_cpusets) == {}


class SlowCpuset:
    """Pins every container to CPU 1, slowly (a loaded node: the plan outlasts the runtime's time)."""

    def __init__(self, delay: float) -> None:
        self.delay = delay

    @hookimpl
    def rhp_pre_create_container(self, pod: PodFacts, container: ContainerFacts, node: NodeFacts) -> Plan:
        time.sleep(self.delay)
        return Plan().set_resource("cpuset_cpus", "1")


async def test_a_create_whose_reply_was_given_up_leaves_the_container_in_the_store_as_the_runtime_made_it() -> None:
    """containerd waits 2 s for a CreateContainer reply and the connection answers "no changes"
    at 80 % of that (``runtime_proxy.nri.connection``), so a slow plan never reaches the
    container. The store must hold the container as the runtime created it (kubelet's cpuset
    "0-3", not the plan's "1"), so the reconciler sees the plan missing and sends it. Before,
    the cancelled handler never recorded the container: no loop ever saw it, and a guest's LSR
    container under emulation ran on the whole machine (docs/v2-node.md)."""
    engine, _ = _engine(SlowCpuset(0.3))
    await engine.state_change(E.RUN_POD_SANDBOX, _pod(), None)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(engine.create_container(_pod(), _container("c1")), 0.05)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        found = engine.store.container("c1")
        if found is not None and found[1].resources.cpuset_cpus == "0-3":
            break
        await asyncio.sleep(0.02)
    found = engine.store.container("c1")
    assert found is not None and found[1].resources.cpuset_cpus == "0-3"
    assert [c.id for _, c in engine.store.running_containers()] == ["c1"]
