"""cpu_normalization plugin: the normalized quota at each stage, the leveled write order of a
ratio change through the reconciler (on a cgroup tree that refuses what cgroup v1 refuses), and
the composition with CPU burst (cfs_burst_us, the cfsQuotaBurst loop's base and ceiling)."""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from types import MappingProxyType
from typing import Any, cast

import pytest

from cri_protos import api_pb2, nri_pb2
from hooks.facts import ContainerFacts, NodeFacts, PodFacts, container_cpu_quota, normalize_cpu_quota
from hooks.manager import make_plugin_manager, plugin_order
from hooks.plan import Plan
from hooks.plugins import BUILTIN_PLUGINS, batch_resource, cpu_burst, cpu_normalization
from runtime_proxy.cri.door import CriInterceptor
from runtime_proxy.engine.lifecycle import StaticNode
from runtime_proxy.engine.pipeline import Pipeline, plugin_steps
from runtime_proxy.host.apply import FileApplier, apply_files
from runtime_proxy.host.cgroups import CgroupError, Cgroups, WriteResult
from runtime_proxy.loops.burst import CPUBurstLoop
from runtime_proxy.loops.reconciler import Reconciler
from runtime_proxy.nri.adapter import NriEngine
from runtime_proxy.runtime.client import RuntimeClient
from runtime_proxy.state.store import Store
from tests.cgroup_files import make_files, read_file
from tests.hooks.plugins.factories import call, container, node, pod, status, writes

RATIO = "node.koordinator.sh/cpu-normalization-ratio"
RECORD = "runtimeproxy.koordinator.sh/cpu-quota-normalization"
POD = "kubepods/burstable/poduid-1"
RUN = "/runtime.v1.RuntimeService/RunPodSandbox"
CREATE = "/runtime.v1.RuntimeService/CreateContainer"
UPDATE = "/runtime.v1.RuntimeService/UpdateContainerResources"


def ratio(value: str | None) -> NodeFacts:
    return node(annotations={} if value is None else {RATIO: value})


def recorded(quota: int, record: str | None, cid: str = "cid", name: str = "c1") -> ContainerFacts:
    c = container(name, cid, cpu_quota=quota, cpu_period=100000)
    return c if record is None else c.replace(annotations=MappingProxyType({RECORD: record}))


# ---- the formula at creation ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("the_pod", "quota", "value", "want_quota", "want_record"),
    [
        pytest.param(pod("LS"), 200000, "1.25", 160000, "200000/160000",
                     id="an LS container's quota is divided by 1.25"),
        pytest.param(pod("LS"), 110000, "1.10", 100000, "110000/100000",
                     id="exact arithmetic gives 100000 for 110000 over 1.10, not 100001"),
        pytest.param(pod("LS"), 100000, "1.5", 66667, "100000/66667", id="the division rounds up"),
        pytest.param(pod(None), 200000, "2.00", 100000, "200000/100000", id="a label-less pod is normalized"),
        pytest.param(pod("LS"), 200000, "1.00", None, "200000/200000",
                     id="ratio 1.00 is off: the quota stays and is recorded"),
        pytest.param(pod("LS"), 200000, None, None, "200000/200000",
                     id="a missing ratio is off: the quota stays and is recorded"),
        pytest.param(pod("LS"), 200000, "5.01", None, "200000/200000",
                     id="an invalid ratio is a logged skip: the quota stays and is recorded"),
        pytest.param(pod("LSR"), 200000, "1.25", None, None, id="LSR pods are left alone"),
        pytest.param(pod("LSE"), 200000, "1.25", None, None, id="LSE pods are left alone"),
        pytest.param(pod("BE"), 200000, "1.25", None, None, id="BE pods are left to batch_resource"),
        pytest.param(pod("SYSTEM"), 200000, "1.25", None, None, id="SYSTEM pods are left alone"),
        pytest.param(pod("LS", annotations={"scheduling.koordinator.sh/resource-status": status("2-3")}),
                     200000, "1.25", 160000, "200000/160000",
                     id="an LS pod cannot hold a cpuset: its resource-status cpuset is ignored and it is normalized"),
        pytest.param(pod(None, annotations={"scheduling.koordinator.sh/resource-status": status("2-3")}),
                     200000, "1.25", 160000, "200000/160000",
                     id="a label-less pod cannot hold a cpuset either: normalized"),
        pytest.param(pod("LS"), -1, "1.25", None, None, id="an unlimited container is left alone"),
        pytest.param(pod("LS"), 0, "1.25", None, None, id="a container without a quota is left alone"),
    ],
)
def test_create_normalizes_and_records(
    the_pod: PodFacts, quota: int, value: str | None, want_quota: int | None, want_record: str | None
) -> None:
    plan = call(cpu_normalization, "rhp_pre_create_container", pod=the_pod,
                container=container(cpu_quota=quota, cpu_period=100000), node=ratio(value))
    assert plan.resources.get("cpu_quota") == want_quota
    assert plan.annotations.get(RECORD) == want_record
    assert plan.writes == []
    assert bool(plan.skipped) == (value == "5.01")


@pytest.mark.parametrize(
    "value",
    [
        pytest.param("1" * 100_000, id="a hundred-kilobyte ratio"),
        pytest.param("1e400", id="an exponent past a float's range"),
        pytest.param("NaN", id="not a number"),
        pytest.param("inf", id="infinity"),
        pytest.param("\u0661.25", id="an Arabic-Indic digit"),
        pytest.param("\uff11.25", id="a full-width digit"),
        pytest.param("5.01", id="just above five"),
        pytest.param("0.99", id="just below one"),
        pytest.param("0", id="zero"),
        pytest.param("-1.25", id="a negative ratio"),
        pytest.param("1.255", id="three decimals"),
    ],
)
def test_a_hostile_ratio_only_ever_gives_a_skip(value: str) -> None:
    the_node = ratio(value)
    live = recorded(160000, "200000/160000")
    full = pod("LS", containers=(live,))
    plans = [
        call(cpu_normalization, "rhp_pre_create_container", pod=full, container=container(cpu_quota=200000),
             node=the_node),
        call(cpu_normalization, "rhp_pre_update_container_resources", pod=full, container=live, node=the_node),
        call(cpu_normalization, "rhp_reconcile_container", pod=full, container=live, node=the_node),
        call(cpu_normalization, "rhp_reconcile_pod", pod=full, node=the_node),
        call(cpu_normalization, "rhp_pre_run_pod_sandbox", pod=full, node=the_node),
    ]
    for plan in plans:
        assert plan.resources == {} and plan.writes == []
    assert all(s.reason for p in plans[:3] for s in p.skipped)
    assert batch_resource.batch_quota(2000, the_node, Plan()) == 200000


# ---- update and reconcile ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("quota", "record", "value", "want_quota", "want_record"),
    [
        pytest.param(300000, "200000/160000", "1.25", 240000, "300000/240000",
                     id="kubelet resizes to 3 cores: the new quota is normalized and recorded"),
        pytest.param(100000, "200000/160000", "1.25", 80000, "100000/80000",
                     id="kubelet halves the limit: the new quota is normalized, not mistaken for a stored one"),
        pytest.param(160000, "200000/160000", "1.25", None, "200000/160000",
                     id="a cpuset-only update keeps the applied quota"),
        pytest.param(160000, "200000/160000", "2.00", 100000, "200000/100000",
                     id="a cpuset-only update right after a ratio change gets the new ratio, from the original"),
        pytest.param(160000, None, "1.25", None, None,
                     id="a container without a record is left alone: its quota may be normalized already"),
        pytest.param(-1, "200000/160000", "1.25", None, None,
                     id="kubelet removes the limit: nothing to normalize"),
    ],
)
def test_update(quota: int, record: str | None, value: str, want_quota: int | None, want_record: str | None) -> None:
    c = recorded(quota, record)
    plan = call(cpu_normalization, "rhp_pre_update_container_resources", pod=pod("LS"), container=c, node=ratio(value))
    assert plan.resources.get("cpu_quota") == want_quota
    assert plan.annotations.get(RECORD) == want_record


AUTO_QUOTA_BURST = {"cpuBurstStrategy": {"policy": "auto"}}


@pytest.mark.parametrize(
    ("quota", "record", "value", "slo", "want"),
    [
        pytest.param(160000, "200000/160000", "2.00", {}, 100000,
                     id="the ratio rises to 2.00: the quota shrinks from the original"),
        pytest.param(100000, "200000/100000", "1.25", {}, 160000,
                     id="the ratio falls to 1.25: the quota grows from the original"),
        pytest.param(100000, "200000/160000", "1.00", {}, 200000,
                     id="the ratio goes back to 1.00: kubelet's quota comes back"),
        pytest.param(100000, "200000/160000", None, {}, 200000,
                     id="the ratio is removed: kubelet's quota comes back"),
        pytest.param(160000, "200000/160000", "1.25", {}, 160000,
                     id="steady state with a ratio: the quota is kept (drift is repaired)"),
        pytest.param(200000, "200000/200000", None, {}, None, id="steady state without a ratio: nothing to do"),
        pytest.param(160000, "200000/160000", "1.25", AUTO_QUOTA_BURST, None,
                     id="steady state under cfsQuotaBurst: the burst loop owns the scaled quota"),
        pytest.param(160000, "200000/160000", "2.00", AUTO_QUOTA_BURST, 100000,
                     id="a ratio change under cfsQuotaBurst still moves the base"),
        pytest.param(134, "200000/200000", "2.00", {}, None,
                     id="a quota the record does not explain (an update before a restart) is left alone"),
        pytest.param(300000, "200000/160000", "1.25", {}, None,
                     id="a quota above the recorded original is left alone"),
        pytest.param(100000, "200000/160000", "1.25", {}, 160000,
                     id="after a restart a quota normalized by an earlier ratio is still recognized"),
        pytest.param(160000, None, "1.25", {}, None, id="no record: left alone"),
    ],
)
def test_reconcile_container(quota: int, record: str | None, value: str | None, slo: dict[str, Any],
                             want: int | None) -> None:
    the_node = ratio(value).replace(node_slo=MappingProxyType(slo))
    plan = call(cpu_normalization, "rhp_reconcile_container", pod=pod("LS"), container=recorded(quota, record),
                node=the_node)
    assert plan.resources.get("cpu_quota") == want
    expected = [] if want is None else [("container", f"{POD}/cid", "cpu.cfs_quota_us", str(want))]
    assert writes(plan) == expected


def test_a_malformed_record_is_a_skip() -> None:
    plan = call(cpu_normalization, "rhp_reconcile_container", pod=pod("LS"), container=recorded(1, "1e9/1"),
                node=ratio("1.25"))
    assert plan.resources == {} and plan.writes == [] and plan.skipped


@pytest.mark.parametrize(
    ("containers", "value", "want"),
    [
        pytest.param((recorded(160000, "200000/160000", "a"), recorded(80000, "100000/80000", "b")), "1.25",
                     240000, id="the pod's quota is the sum of its containers' normalized quotas"),
        pytest.param((recorded(50001, "100001/50001", "a"), recorded(50001, "100001/50001", "b")), "2.00",
                     100002, id="the sum, not the ceil of the sum, so no container and no burst exceeds the pod"),
        pytest.param((recorded(160000, "200000/160000", "a"), recorded(-1, None, "b")), "1.25", None,
                     id="a container without a limit makes the pod unlimited: left alone"),
        pytest.param((recorded(160000, "200000/160000", "a"), recorded(80000, None, "b")), "1.25", None,
                     id="a container without a record leaves the pod at kubelet's quota"),
        pytest.param((recorded(200000, "200000/200000", "a"),), None, None,
                     id="without a ratio and nothing to restore the pod keeps kubelet's quota"),
        pytest.param((recorded(160000, "200000/160000", "a"),), "1.00", 200000,
                     id="going back to 1.00 restores the pod with its containers"),
        pytest.param((), "1.25", None, id="a pod whose containers are unknown is left alone"),
    ],
)
def test_reconcile_pod(containers: tuple[ContainerFacts, ...], value: str | None, want: int | None) -> None:
    plan = call(cpu_normalization, "rhp_reconcile_pod", pod=pod("LS", containers=containers), node=ratio(value))
    assert writes(plan) == ([] if want is None else [("pod", POD, "cpu.cfs_quota_us", str(want))])


def test_the_sandbox_stage_writes_the_pod_when_the_containers_are_known() -> None:
    the_pod = pod("LS", containers=(container("a", cpu_quota=200000), container("b", cpu_quota=100000)))
    plan = call(cpu_normalization, "rhp_pre_run_pod_sandbox", pod=the_pod, node=ratio("1.25"))
    assert writes(plan) == [("pod", POD, "cpu.cfs_quota_us", "240000")]
    assert writes(call(cpu_normalization, "rhp_pre_run_pod_sandbox", pod=pod("LS"), node=ratio("1.25"))) == []


@pytest.mark.parametrize(
    ("milli", "value", "want"),
    [
        pytest.param(2000, "1.25", 160000, id="BE batch quota divided by the same ratio"),
        pytest.param(1100, "1.10", 100000, id="BE batch quota with the same exact arithmetic"),
        pytest.param(2000, None, 200000, id="BE batch quota without a ratio"),
    ],
)
def test_batch_resource_agrees(milli: int, value: str | None, want: int) -> None:
    assert batch_resource.batch_quota(milli, ratio(value), Plan()) == want
    assert normalize_cpu_quota(milli * 100, Fraction(value or "1")) == want


def test_registered_after_batch_resource_and_before_cpu_burst() -> None:
    order = list(BUILTIN_PLUGINS)
    assert order.index("cpuset") < order.index("batch_resource") < order.index("cpu_normalization")
    assert order.index("cpu_normalization") < order.index("cpu_burst")


# ---- composition with CPU burst -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("quota", "record", "value", "percent", "want"),
    [
        pytest.param(160000, "200000/160000", "1.25", 50, "80000",
                     id="cfs_burst_us is a share of the normalized quota"),
        pytest.param(160000, "200000/160000", "2.00", 1000, "100000",
                     id="in the round of a ratio change the burst follows the new quota (capped at it)"),
        pytest.param(160000, None, "2.00", 50, "80000", id="without a record the burst uses the runtime's quota"),
    ],
)
def test_cpu_burst_uses_the_normalized_quota(quota: int, record: str | None, value: str, percent: int,
                                             want: str) -> None:
    the_node = ratio(value).replace(
        node_slo=MappingProxyType({"cpuBurstStrategy": {"policy": "cpuBurstOnly", "cpuBurstPercent": percent}}))
    plan = call(cpu_burst, "rhp_reconcile_container", pod=pod("LS"), container=recorded(quota, record), node=the_node)
    assert writes(plan) == [("container", f"{POD}/cid", "cpu.cfs_burst_us", want)]


class KernelV1(Cgroups):
    """A cgroup tree of plain files that refuses what cgroup v1 refuses: a CFS quota above its
    parent's or below a child's, and a burst above the quota (EINVAL); it logs every write."""

    def __init__(self, root: Path) -> None:
        super().__init__(root, version=1)
        self.log: list[tuple[str, str, str]] = []

    def _quota(self, path: str) -> float:
        v = self.read_int(path, "cpu.cfs_quota_us")
        return float("inf") if v is None or v < 0 else float(v)

    def write(self, path: str, file: str, value: str | int, *, compare_only: bool = False) -> WriteResult:
        if file == "cpu.cfs_quota_us" and not compare_only:
            new = float("inf") if int(value) < 0 else float(value)
            parent = path.rsplit("/", 1)[0]
            children = [p.name for p in self.directory(path).iterdir() if p.is_dir()]
            if new > self._quota(parent) or any(new < self._quota(f"{path}/{c}") for c in children):
                raise CgroupError(f"write {path}/{file}: invalid argument")
            if int(value) > 0 and (self.read_int(path, "cpu.cfs_burst_us") or 0) > int(value):
                raise CgroupError(f"write {path}/{file}: invalid argument (burst above quota)")
        if file == "cpu.cfs_burst_us" and not compare_only and int(value) > self._quota(path):
            raise CgroupError(f"write {path}/{file}: invalid argument")
        result = super().write(path, file, value, compare_only=compare_only)
        if result.status == "written":
            self.log.append((path, file, str(value)))
        return result


@dataclass
class Runtime:
    """The reconciler's backend: an UpdateContainerResources writes the container's quota file as
    runc does, through the same refusing tree."""

    cgroups: KernelV1
    node_facts: NodeFacts
    pod_list: list[PodFacts]
    container_list: list[tuple[PodFacts, ContainerFacts]]
    updates: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def node(self) -> NodeFacts:
        return self.node_facts

    def pods(self) -> list[PodFacts]:
        return list(self.pod_list)

    def containers(self) -> list[tuple[PodFacts, ContainerFacts]]:
        return list(self.container_list)

    async def update_container_resources(self, container_id: str, changes: dict[str, Any]) -> None:
        for i, (p, c) in enumerate(self.container_list):
            if c.id == container_id:
                if "cpu_quota" in changes:
                    self.cgroups.write(f"{POD}/{c.id}", "cpu.cfs_quota_us", changes["cpu_quota"])
                self.container_list[i] = (p, c.replace(resources=c.resources.with_changes(changes)))
        self.updates.append((container_id, changes))


def _setup(root: Path, ratio_value: str, quotas: dict[str, int], slo: dict[str, Any] | None = None) -> Runtime:
    the_pod = pod("LS", sandbox_id="sb")
    make_files(root, "kubepods", {"cpu.cfs_quota_us": "-1"})
    make_files(root, "kubepods/burstable", {"cpu.cfs_quota_us": "-1"})
    make_files(root, POD, {"cpu.cfs_quota_us": str(sum(quotas.values())), "cpu.cfs_burst_us": "0"})
    containers = []
    for cid, q in quotas.items():
        make_files(root, f"{POD}/{cid}", {"cpu.cfs_quota_us": str(q), "cpu.cfs_burst_us": "0"})
        containers.append((the_pod, recorded(q, f"200000/{q}", cid, cid)))
    the_node = ratio(ratio_value).replace(node_slo=MappingProxyType(slo or {}))
    return Runtime(KernelV1(root), the_node, [the_pod], containers)


@pytest.mark.parametrize(
    ("before", "after", "want", "order"),
    [
        pytest.param("1.25", "2.00", 100000, ["a", "b", "pod"],
                     id="a rising ratio shrinks the containers first, then the pod"),
        pytest.param("2.00", "1.25", 160000, ["pod", "a", "b"],
                     id="a falling ratio grows the pod first, then the containers"),
        pytest.param("2.00", "1.00", 200000, ["pod", "a", "b"],
                     id="going back to 1.00 grows the pod first, then the containers"),
    ],
)
async def test_a_ratio_change_rewrites_in_leveled_order(
    tmp_path: Path, before: str, after: str, want: int, order: list[str]
) -> None:
    start = normalize_cpu_quota(200000, Fraction(before))
    rt = _setup(tmp_path, before, {"a": start, "b": start})
    r = Reconciler(rt, pm=make_plugin_manager(entry_points=False), cgroups=rt.cgroups)
    rt.node_facts = ratio(after)
    report = await r.reconcile_once("node-config")
    assert report.errors == []
    quota_writes = [p.rsplit("/", 1)[1] for p, f, _ in rt.cgroups.log if f == "cpu.cfs_quota_us"]
    firsts = [w if w in ("a", "b") else "pod" for w in dict.fromkeys(quota_writes)]
    assert firsts == order
    assert read_file(tmp_path, f"{POD}/a", "cpu.cfs_quota_us") == str(want)
    assert read_file(tmp_path, POD, "cpu.cfs_quota_us") == str(2 * want)
    assert [c.resources.cpu_quota for _, c in rt.container_list] == [want, want]
    updates = len(rt.updates)
    again = await r.reconcile_once("period")
    assert again.errors == [] and again.drift == [] and len(rt.updates) == updates


async def test_a_rising_ratio_with_cpu_burst_lowers_the_burst_before_the_quota(tmp_path: Path) -> None:
    slo = {"cpuBurstStrategy": {"policy": "cpuBurstOnly", "cpuBurstPercent": 1000}}
    rt = _setup(tmp_path, "1.25", {"a": 160000}, slo)
    r = Reconciler(rt, pm=make_plugin_manager(entry_points=False), cgroups=rt.cgroups)
    assert (await r.reconcile_once("start")).errors == []
    assert read_file(tmp_path, f"{POD}/a", "cpu.cfs_burst_us") == "160000"
    rt.node_facts = ratio("2.00").replace(node_slo=MappingProxyType(slo))
    report = await r.reconcile_once("node-config")
    assert report.errors == []
    assert read_file(tmp_path, f"{POD}/a", "cpu.cfs_quota_us") == "100000"
    assert read_file(tmp_path, f"{POD}/a", "cpu.cfs_burst_us") == "100000"
    assert read_file(tmp_path, POD, "cpu.cfs_burst_us") == "100000"
    rt.node_facts = ratio("1.25").replace(node_slo=MappingProxyType(slo))
    assert (await r.reconcile_once("node-config")).errors == []
    assert read_file(tmp_path, f"{POD}/a", "cpu.cfs_burst_us") == "160000"
    assert read_file(tmp_path, POD, "cpu.cfs_quota_us") == "160000"


def test_the_applier_orders_burst_and_quota_inside_one_container(tmp_path: Path) -> None:
    rt = _setup(tmp_path, "1.25", {"a": 160000})
    rt.cgroups.write(f"{POD}/a", "cpu.cfs_burst_us", 160000)
    plan = Plan().write("container", f"{POD}/a", "cpu.cfs_quota_us", 100000)
    plan.write("container", f"{POD}/a", "cpu.cfs_burst_us", 100000)
    assert apply_files(plan, cgroups=rt.cgroups).errors == []
    assert rt.cgroups.log[-2:] == [(f"{POD}/a", "cpu.cfs_burst_us", "100000"),
                                   (f"{POD}/a", "cpu.cfs_quota_us", "100000")]


async def test_the_burst_loop_scales_from_the_normalized_base(tmp_path: Path) -> None:
    slo = {"cpuBurstStrategy": {"policy": "cfsQuotaBurstOnly", "cfsQuotaBurstPercent": 150}}
    rt = _setup(tmp_path, "2.00", {"a": 160000}, slo)
    make_files(tmp_path, f"{POD}/a", {"cpu.stat": "nr_periods 10\nnr_throttled 0\nthrottled_time 0"})
    pipeline = Pipeline(plugin_steps(make_plugin_manager(builtins=["cpu_burst"], entry_points=False),
                                     [("cpu_burst", "Ignore", 30.0)]))
    loop = CPUBurstLoop(rt, pipeline=pipeline, applier=FileApplier(cgroups=rt.cgroups), cgroups=rt.cgroups,
                        pool_load=lambda: 0.0, clock=iter(range(100)).__next__)
    first = await loop.step()
    # The ratio moved to 2.00 before the reconciler ran: the loop's base is already 100000, so its
    # ceiling is 1.5 x 100000 (with the runtime's 160000 as base it would have been 240000).
    assert [(c.old, c.new) for c in first] == [(160000, 150000)]
    assert read_file(tmp_path, POD, "cpu.cfs_quota_us") == "150000"
    make_files(tmp_path, f"{POD}/a", {"cpu.stat": "nr_periods 20\nnr_throttled 10\nthrottled_time 5"})
    for _ in range(5):
        await loop.step()
    assert read_file(tmp_path, f"{POD}/a", "cpu.cfs_quota_us") == "150000"  # the ceiling: 1.5 x 100000
    decided = container_cpu_quota(rt.pod_list[0], rt.container_list[0][1], rt.node_facts)
    assert decided.quota == 100000 and decided.original == 200000


# ---- through the interceptor: the record follows kubelet's updates -------------------------------


async def test_the_interceptor_normalizes_and_keeps_the_record_through_updates() -> None:
    pm = make_plugin_manager(entry_points=False)
    pipeline = Pipeline(plugin_steps(pm, [(n, "Ignore", 2.0) for n in plugin_order(pm)]))
    icpt = CriInterceptor(store=Store(), pipeline=pipeline, client=cast(RuntimeClient, None),
                          node_source=StaticNode(ratio("1.25")), on_store_change=lambda _changed: None)
    sandbox = api_pb2.PodSandboxConfig()
    sandbox.metadata.name, sandbox.metadata.namespace, sandbox.metadata.uid = "web", "ns", "u1"
    sandbox.labels["koordinator.sh/qosClass"] = "LS"
    sandbox.linux.cgroup_parent = "/kubepods/burstable/podu1"
    run = api_pb2.RunPodSandboxRequest(config=sandbox).SerializeToString()
    await (await icpt.before(RUN, run)).after(api_pb2.RunPodSandboxResponse(pod_sandbox_id="sb").SerializeToString())

    create = api_pb2.CreateContainerRequest(pod_sandbox_id="sb", sandbox_config=sandbox)
    create.config.metadata.name = "app"
    create.config.linux.resources.cpu_quota, create.config.linux.resources.cpu_period = 200000, 100000
    create_call = await icpt.before(CREATE, create.SerializeToString())
    sent = api_pb2.CreateContainerRequest.FromString(create_call.request)
    assert sent.config.linux.resources.cpu_quota == 160000
    assert sent.config.annotations[RECORD] == "200000/160000"
    await create_call.after(api_pb2.CreateContainerResponse(container_id="c1").SerializeToString())

    async def update(quota: int, cpuset: str = "") -> api_pb2.UpdateContainerResourcesRequest:
        req = api_pb2.UpdateContainerResourcesRequest(container_id="c1")
        req.linux.cpu_quota, req.linux.cpuset_cpus = quota, cpuset
        update_call = await icpt.before(UPDATE, req.SerializeToString())
        out = update_call.request
        await update_call.after(b"")
        return api_pb2.UpdateContainerResourcesRequest.FromString(out)

    resized = await update(300000)
    assert resized.linux.cpu_quota == 240000 and resized.annotations[RECORD] == "300000/240000"
    found = icpt.store.container("c1")
    assert found is not None
    assert found[1].annotations[RECORD] == "300000/240000" and found[1].resources.cpu_quota == 240000
    cpuset_only = await update(0, "0-3")
    assert cpuset_only.linux.cpu_quota == 0  # the runtime keeps 240000; nothing is divided twice
    found = icpt.store.container("c1")
    assert found is not None and found[1].resources.cpu_quota == 240000
    assert found[1].annotations[RECORD] == "300000/240000"


async def test_nri_mode_carries_the_normalized_quota_and_keeps_the_record() -> None:
    pm = make_plugin_manager(builtins=("cpu_normalization",), entry_points=False)
    pipeline = Pipeline(plugin_steps(pm, [(n, "Ignore", 2.0) for n in plugin_order(pm)]))
    engine = NriEngine(pipeline, node_source=StaticNode(ratio("1.25")))
    nri_pod = nri_pb2.PodSandbox(id="sb", name="web", uid="u1", namespace="ns",
                                 labels={"koordinator.sh/qosClass": "LS"})
    nri_pod.linux.cgroup_parent = "/kubepods/burstable/podu1"
    nri_container = nri_pb2.Container(id="c1", pod_sandbox_id="sb", name="app")
    nri_container.linux.resources.cpu.quota.value = 200000
    nri_container.linux.resources.cpu.period.value = 100000
    reply = await engine.create_container(nri_pod, nri_container)
    assert reply.adjust.linux.resources.cpu.quota.value == 160000
    assert reply.adjust.annotations[RECORD] == "200000/160000"
    found = engine.store.container("c1")
    assert found is not None and found[1].resources.cpu_quota == 160000
    assert found[1].annotations[RECORD] == "200000/160000"

    # The runtime reports the container as created: the adjusted quota and annotations.
    nri_container.linux.resources.cpu.quota.value = 160000
    nri_container.annotations[RECORD] = "200000/160000"
    resize = nri_pb2.LinuxResources()
    resize.cpu.quota.value = 300000
    updates = await engine.update_container(nri_pod, nri_container, resize)
    assert [u.linux.resources.cpu.quota.value for u in updates] == [240000]
    found = engine.store.container("c1")
    assert found is not None and found[1].resources.cpu_quota == 240000
    assert found[1].annotations[RECORD] == "300000/240000"
