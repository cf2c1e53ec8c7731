"""CPU suppress end to end: the usage loop (``runtime_proxy.loops.qos``) samples, runs the
``cpu_suppress`` plugin through the hook runner and applies its writes in plan order.

- On real containerd and runc and the real cgroup v1 tree, through an in-process proxy: pods in
  kubelet's own layout (``/kubepods/burstable/pod<uid>``, ``/kubepods/besteffort/pod<uid>``),
  an LS pod that starts and stops a busy loop and a BE pod. With ``cfsQuota`` the BE kube-QoS
  ``cpu.cfs_quota_us`` falls as the LS load rises and climbs back by at most 10% of the node per
  round once it stops. With ``cpuset`` on a kubelet ``static`` node (one CPU reserved, so the BE
  pool is one CPU) the BE kube-QoS dir shrinks to the pool and a BE container created
  afterwards, whose request carries kubelet's shared pool, still starts.
- On a prepared cgroup tree with the 16-CPU dual-socket topology (``tests/topologies.py``):
  with ``cpuset`` the BE cpuset of every BE dir follows the formula, the LSR/LS split and the
  growth cap, round after round.

The test drives the loop's rounds itself (``UsageLoop.step``), one sampling interval apart. Node
CPU comes from a prepared ``/proc/stat`` that never moves, so the other work on this shared
machine does not count as system usage; pod CPU is read from the real cgroups.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest
from prometheus_client import REGISTRY
from rhp_devenv.cgroupfs import CGROUP_ROOT, cgroup_hierarchies, remove_cgroup_tree
from rhp_devenv.cri import BURN_CPU_COMMAND, CriClient, PodHandle, linux_resources
from rhp_devenv.kube import take_kubepods_lock

from cri_protos import api_pb2
from hooks.facts import ContainerFacts, NodeFacts, PodFacts, format_cpu_list, parse_cpu_list
from hooks.manager import make_plugin_manager
from koord_formats.topology import format_cpu_topology, parse_cpu_topology
from runtime_proxy.config import ProxyConfig
from runtime_proxy.engine.pipeline import Pipeline, plugin_steps
from runtime_proxy.host.cgroups import Cgroups, v1_controller
from runtime_proxy.loops.qos import UsageLoop
from runtime_proxy.loops.usage import UsageSampler
from runtime_proxy.state.sysfs import read_cpu_topology
from tests.fake_clock import Clock
from tests.integration.harness import ProxyThread, proxy_options
from tests.topologies import DUAL_SOCKET_HT
from tests.usage_tree import Tree

pytestmark = pytest.mark.integration

TOPO = read_cpu_topology()
CORES = len(TOPO.cpus)
BE_DIR = "kubepods/besteffort"
ROUND = 0.4  # seconds between the rounds the test drives (the loop's sampling interval)
GROWTH = CORES * 100_000 // 10  # the cfsQuota growth cap per round: 10% of the node
# How far the BE quota must fall while the LS pod burns: a tenth of a CPU of LS usage (the busy
# loop gets less than a whole CPU on this shared machine), five times the 1% skip margin.
DROP = 10_000
BUILTINS = ("cpuset", "batch_resource", "cpu_suppress")
QOS = "koordinator.sh/qosClass"
TOPOLOGY = "node.koordinator.sh/cpu-topology"
KUBELET_POLICY = "kubelet.koordinator.sh/cpu-manager-policy"
RESERVATION = "node.koordinator.sh/reservation"
RESOURCE_STATUS = "scheduling.koordinator.sh/resource-status"
SYSTEM_QOS = "node.koordinator.sh/system-qos-resource"
TARGET_METRIC = "rhp_cpu_suppress_target_cores"


def cgroup_file(path: str, file: str) -> str:
    return (CGROUP_ROOT / v1_controller(file) / path / file).read_text().strip()


# ---- real containerd ---------------------------------------------------------------------------


@pytest.fixture
def kubelet_tree(containerd: Any) -> Iterator[list[PodHandle]]:
    """Pods in kubelet's own cgroup layout (``/kubepods/...``), which the BE kube-QoS dir of
    CPU suppress is part of. Skipped when a ``kubepods`` tree exists already (a real kubelet or
    another run owns it) or an end-to-end cluster runs (``rhp_devenv.kube``: its kubelet would
    remove these pods' cgroups as orphans); afterwards the pods the test appended and the tree go
    away."""
    lock = take_kubepods_lock(0)
    if lock is None:
        pytest.skip("a one-node cluster (rhp_devenv.kube) runs on this machine and owns /kubepods")
    if any((h / "kubepods").exists() for h in cgroup_hierarchies()):
        lock.close()
        pytest.skip("a kubepods cgroup tree exists on this machine; this test creates and removes its own")
    pods: list[PodHandle] = []
    try:
        yield pods
    finally:
        try:
            with CriClient(containerd.socket) as client:
                for pod in pods:
                    client.remove_pod(pod)
            for pod in pods:
                remove_cgroup_tree(pod.cgroup_parent, kill=True)
            for qos in ("/kubepods/besteffort", "/kubepods/burstable", "/kubepods"):
                remove_cgroup_tree(qos)
        finally:
            lock.close()


def prepared_proc(base: Path) -> Path:
    """A ``/proc`` whose ``stat`` never moves (node usage 0: only pods count) and a ``meminfo``."""
    proc = base / "proc"
    proc.mkdir()
    (proc / "stat").write_text("cpu  100 0 100 1000 0 0 0 0 0 0\ncpu0 100 0 100 1000 0 0 0 0 0 0\n")
    (proc / "meminfo").write_text("MemTotal: 8388608 kB\nMemFree: 4194304 kB\nMemAvailable: 6291456 kB\n")
    return proc


ProxyFactory = Callable[..., tuple[ProxyThread, CriClient, UsageLoop]]


@pytest.fixture
def suppress_proxy(containerd: Any, tmp_path: Path, cri_client: Any) -> Iterator[ProxyFactory]:
    """``suppress_proxy(slo, nrt)``: a proxy with ``cpuset``, ``batch_resource`` and
    ``cpu_suppress`` and the usage loop on (its own rounds 60 s apart: the test drives them)."""
    started: list[ProxyThread] = []
    proc = prepared_proc(tmp_path)

    def start(slo: dict[str, Any], nrt: dict[str, str]) -> tuple[ProxyThread, CriClient, UsageLoop]:
        node_file = tmp_path / "node.json"
        node_file.write_text(json.dumps({
            "name": "rhp-suppress-node",
            "nodeResourceTopology": {"annotations": {TOPOLOGY: format_cpu_topology(TOPO), **nrt}},
            "nodeSLO": {"resourceUsedThresholdWithBE": slo},
        }))
        config = ProxyConfig(
            nodeConfigFile=str(node_file),
            reconcilePeriodSeconds=30.0,
            usageLoop={"enable": True, "intervalSeconds": 60.0, "procRoot": str(proc)},
        )
        opts = proxy_options(containerd, tmp_path, "relay", builtins=BUILTINS, reconcile=True, config=config)
        proxy = ProxyThread(opts).__enter__()
        started.append(proxy)
        assert proxy.proxy is not None and proxy.proxy.reconciler is not None
        loop = proxy.proxy.reconciler.usage
        assert loop is not None
        deadline = time.monotonic() + 20
        while loop.rounds < 1:  # the loop's own first round (the sampler's baseline)
            assert time.monotonic() < deadline, "the usage loop never ran"
            time.sleep(0.02)
        return proxy, cri_client(opts.listen), loop

    try:
        yield start
    finally:
        for proxy in started:
            proxy.__exit__(None, None, None)


def run_pod(client: CriClient, pods: list[PodHandle], qos: str, kube: str) -> PodHandle:
    uid = str(uuid.uuid4())
    pod = client.run_pod(cgroup_parent=f"/kubepods/{kube}/pod{uid}", uid=uid, labels={QOS: qos})
    pods.append(pod)
    return pod


def step(proxy: ProxyThread, loop: UsageLoop) -> None:
    time.sleep(ROUND)
    loop_round = proxy.call(loop.step())
    assert loop_round.failures == []


def quota() -> int:
    return int(cgroup_file(BE_DIR, "cpu.cfs_quota_us"))


def test_cfs_quota_falls_with_ls_load_and_recovers_within_the_step_limit(
    suppress_proxy: ProxyFactory, kubelet_tree: list[PodHandle]
) -> None:
    """Threshold 100%: the BE quota is (capacity - LS usage) x 100, floored at 2000. It starts
    near the node's capacity, falls at once while the LS pod burns a CPU, and climbs back by at
    most 10% of the node per round after the busy loop stops."""
    proxy, client, loop = suppress_proxy(
        {"enable": True, "cpuSuppressPolicy": "cfsQuota", "cpuSuppressThresholdPercent": 100},
        {KUBELET_POLICY: json.dumps({"policy": "none"})},
    )
    ls = run_pod(client, kubelet_tree, "LS", "burstable")
    client.run_container(ls, name="idle", resources=linux_resources(cpu_shares=1024))
    be = run_pod(client, kubelet_tree, "BE", "besteffort")
    client.run_container(be, name="batch")
    full = CORES * 100_000

    step(proxy, loop)
    step(proxy, loop)
    idle = quota()
    assert full - 20_000 <= idle <= full, "an idle LS pod leaves BE nearly the whole node"
    assert cgroup_file(BE_DIR, "cpuset.cpus") == format_cpu_list(TOPO.cpus), "cfsQuota keeps the full pool"
    assert REGISTRY.get_sample_value(TARGET_METRIC, {"policy": "cfsQuota"}) == idle / 100_000

    burn = client.run_container(ls, name="burn", command=BURN_CPU_COMMAND, resources=linux_resources(cpu_shares=2048))
    low = idle
    for _ in range(25):
        step(proxy, loop)
        low = min(low, quota())
        if low <= idle - DROP:
            break
    assert low <= idle - DROP, f"the BE quota stayed at {low} while the LS pod burned a CPU"

    client.stop_container(burn)
    seen = [quota()]
    for _ in range(25):
        step(proxy, loop)
        seen.append(quota())
        if seen[-1] >= idle - 2 * GROWTH // 10:
            break
    rises = [b - a for a, b in itertools.pairwise(seen)]
    assert max(rises) <= GROWTH, f"the quota grew faster than 10% of the node per round: {seen}"
    assert seen[-1] >= idle - 2 * GROWTH // 10, f"the quota did not recover: {seen}"
    assert any(r > 0 for r in rises), seen


def test_static_policy_node_keeps_be_containers_startable(
    suppress_proxy: ProxyFactory, kubelet_tree: list[PodHandle]
) -> None:
    """cpuset policy, kubelet static, CPU 0 reserved: the BE pool is the other CPUs, the BE
    kube-QoS and pod dirs hold the pool, the containers the chosen CPUs. A BE container created
    after that, with kubelet's shared pool (every CPU) in its request, starts."""
    reserved = min(TOPO.cpus)
    pool = format_cpu_list(TOPO.cpus - {reserved})
    proxy, client, loop = suppress_proxy(
        {"enable": True, "cpuSuppressPolicy": "cpuset"},
        {
            KUBELET_POLICY: json.dumps({"policy": "static", "reservedCPUs": str(reserved)}),
            RESERVATION: json.dumps({"reservedCPUs": str(reserved)}),
        },
    )
    ls = run_pod(client, kubelet_tree, "LS", "burstable")
    client.run_container(ls, name="idle")
    be = run_pod(client, kubelet_tree, "BE", "besteffort")
    first = client.run_container(be, name="batch")
    step(proxy, loop)
    step(proxy, loop)
    assert cgroup_file(BE_DIR, "cpuset.cpus") == pool, "the BE kube-QoS dir shrank to the BE pool"
    pod_dir = be.cgroup_parent.strip("/")
    assert cgroup_file(pod_dir, "cpuset.cpus") == pool
    chosen = parse_cpu_list(cgroup_file(f"{pod_dir}/{first}", "cpuset.cpus"))
    assert chosen and chosen <= parse_cpu_list(pool)

    # kubelet's static policy puts its shared pool (all CPUs, the reserved one too) in the request.
    late = client.run_container(be, name="late", resources=linux_resources(cpuset_cpus=format_cpu_list(TOPO.cpus)))
    assert client.container_status(late).state == api_pb2.CONTAINER_RUNNING
    assert parse_cpu_list(cgroup_file(f"{pod_dir}/{late}", "cpuset.cpus")) <= parse_cpu_list(pool)
    step(proxy, loop)
    assert parse_cpu_list(cgroup_file(f"{pod_dir}/{late}", "cpuset.cpus")) == chosen


# ---- a prepared tree with a larger topology ------------------------------------------------------


class Backend:
    """The usage loop's view of the proxy: node facts and pods with their containers."""

    def __init__(self, node: NodeFacts, pods: list[PodFacts]) -> None:
        self._node, self._pods = node, pods

    def node(self) -> NodeFacts:
        return self._node

    def pods(self) -> list[PodFacts]:
        return [p.replace(containers=()) for p in self._pods]

    def containers(self) -> list[tuple[PodFacts, ContainerFacts]]:
        return [(p, c) for p in self._pods for c in p.containers]


def facts_pod(uid: str, qos: str, kube: str, cpuset: str = "", containers: tuple[str, ...] = ()) -> PodFacts:
    annotations = {RESOURCE_STATUS: json.dumps({"cpuset": cpuset})} if cpuset else {}
    return PodFacts(
        name=uid, namespace="ns", uid=uid, sandbox_id=f"sb-{uid}" if containers else "",
        labels=MappingProxyType({QOS: qos}), annotations=MappingProxyType(annotations),
        cgroup_parent=f"/kubepods/{kube}/pod{uid}",
        containers=tuple(ContainerFacts(name=c, id=c) for c in containers),
    )


def test_cpuset_policy_on_a_prepared_16_cpu_tree(tmp_path: Path) -> None:
    """LSE pod on 6-7,14-15, LSR pod on 2,10, CPUs 0,8 reserved and 1,9 exclusive to system
    pods: the BE pool is 2-5,10-13, of which 2,10 are LSR CPUs. Rounds of LS load move the BE
    cpuset of the kube-QoS dir, the BE pod, its sandbox and its container together."""
    annotations = {
        TOPOLOGY: format_cpu_topology(DUAL_SOCKET_HT),
        KUBELET_POLICY: json.dumps({"policy": "none"}),
        RESERVATION: json.dumps({"reservedCPUs": "0,8"}),
        SYSTEM_QOS: json.dumps({"cpuset": "1,9"}),
    }
    node = NodeFacts(
        name="big", annotations=MappingProxyType(annotations),
        node_slo=MappingProxyType({"resourceUsedThresholdWithBE": {"enable": True, "cpuSuppressPolicy": "cpuset"}}),
        cpu_topology=parse_cpu_topology(annotations[TOPOLOGY]),
    )
    ls = facts_pod("ls", "LS", "burstable")
    be = facts_pod("be", "BE", "besteffort", containers=("c1",))
    pods = [ls, be, facts_pod("lse", "LSE", "pod", "6-7,14-15"), facts_pod("lsr", "LSR", "pod", "2,10")]
    tree, clock = Tree(tmp_path, 1), Clock()
    tree.be_limits(-1, "0-15")
    be_dirs = [BE_DIR, f"{BE_DIR}/podbe", f"{BE_DIR}/podbe/sb-be", f"{BE_DIR}/podbe/c1"]
    for d in be_dirs:
        tree.write("cpuset", d, "cpuset.cpus", "0-15\n")
        tree.cgroup(d, cpu_ns=0, memory=0)
    ls_ns = 0
    tree.cgroup("kubepods/burstable/podls", cpu_ns=0, memory=0)
    pm = make_plugin_manager(builtins=["cpu_suppress"], entry_points=False)
    cgroups = Cgroups(tree.root, version=1)
    sampler = UsageSampler(cgroups, proc_root=tree.proc, clock=clock, ticks_per_second=100)
    loop = UsageLoop(Backend(node, pods), pipeline=Pipeline(plugin_steps(pm, [("cpu_suppress", "Ignore", 2.0)])),
                     cgroups=cgroups, sampler=sampler, clock=clock)

    def run(ls_milli: int) -> list[str]:
        """One second of ``ls_milli`` LS usage (node usage the same), then a round."""
        nonlocal ls_ns
        clock.now += 1
        ls_ns += ls_milli * 1_000_000
        tree.cgroup("kubepods/burstable/podls", cpu_ns=ls_ns, memory=0)
        tree.node(busy=ls_ns // 10_000_000)
        loop_round = asyncio.run(loop.step())
        assert loop_round.failures == [] and (loop_round.applied is None or loop_round.applied.errors == [])
        return [(tree.root / "cpuset" / d / "cpuset.cpus").read_text().strip() for d in be_dirs]

    run(0)  # the sampler's baseline
    # 16 x 65% = 10400; LS 3000; system = max(3000 - 3000, 0, reserved 2000) = 2000 -> 5400: 6 CPUs,
    # floor(6 x 2/8) = 1 from LSR (2), 5 from LS (pairs 4/12 and 3/11, then 5).
    assert run(3000) == ["2-5,11-12"] * 4
    assert REGISTRY.get_sample_value(TARGET_METRIC, {"policy": "cpuset"}) == 6
    # Heavy LS load: the two-CPU minimum, a sibling pair from the larger LS bucket.
    assert run(9000) == ["4,12"] * 4
    # Idle LS: 8400 wants 9 CPUs; from 2 the set grows by ceil(16 x 10%) = 2 per round.
    assert run(0) == ["2-4,12"] * 4
    assert run(0) == ["2-5,11-12"] * 4
    assert run(0) == ["2-5,10-13"] * 4, "the whole BE pool, at most"
