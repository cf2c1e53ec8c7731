"""Koordinator's node QoS rules through the proxy, on real containerd and runc and the real
cgroup v1 filesystem.

The test plays kubelet: it sends RunPodSandbox, CreateContainer, StartContainer,
UpdateContainerResources and the removals through an in-process proxy running the built-in
plugins ``cpuset``, ``numa`` and ``batch_resource``, with Koordinator's pod labels and
annotations (``koordinator.sh/qosClass``, ``scheduling.koordinator.sh/resource-status``,
``node.koordinator.sh/extended-resource-spec`` with ``kubernetes.io/batch-cpu`` and
``batch-memory``) and kubelet-like cgroup parents and resources. The node config file gives the
NodeResourceTopology annotations (CPU topology, kubelet CPU manager policy ``none``, share pools
when a test wants them) and the NodeSLO. Every assertion reads the files under /sys/fs/cgroup
(and what containerd itself reports), never the proxy's own state.

This machine has CPUs 0-1 and NUMA node 0: LSR pods are bound to CPU 1, so the LS share pool is
0-1 without them and 0 with them.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from rhp_devenv.cri import CriClient, PodHandle, linux_resources

from cri_protos import api_pb2
from hooks.facts import format_cpu_list
from runtime_proxy.config import ProxyConfig
from runtime_proxy.state.sysfs import read_cpu_topology
from tests.integration import qos_helpers as q
from tests.integration.harness import ProxyThread, proxy_options

pytestmark = pytest.mark.integration

TRANSPORTS = os.environ.get("RHP_TRANSPORTS", "relay,grpc").split(",")
BUILTINS = ("cpuset", "numa", "batch_resource")
TOPO = read_cpu_topology()
ALL_CPUS = format_cpu_list(TOPO.cpus)
LSR_CPU = str(max(TOPO.cpus))  # the bound CPU; the rest is the share pool
LS_POOL_WITH_LSR = format_cpu_list(TOPO.cpus - {max(TOPO.cpus)})
MiB = 1024**2


@pytest.fixture(autouse=True)
def _two_cpus_one_numa_node() -> None:
    # the expectations bind one CPU and share the others, all on NUMA node 0
    if len(TOPO.cpus) < 2 or TOPO.numa_nodes != (0,):
        pytest.skip(f"needs 2+ CPUs on one NUMA node 0; this machine has {ALL_CPUS} on {TOPO.numa_nodes}")


ProxyFactory = Callable[..., tuple[ProxyThread, CriClient]]


@pytest.fixture(params=TRANSPORTS)
def transport(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def qos_proxy(containerd: Any, tmp_path: Path, cri_client: Any, transport: str) -> Iterator[ProxyFactory]:
    """``qos_proxy(reconcile=False, nrt=None)``: a proxy with the QoS built-ins in front of
    ``containerd``, reading the node config file ``tmp_path/node.json``; returns the proxy and
    a CRI client on its socket. ``proxy.__exit__(None, None, None)`` stops one early."""
    started: list[ProxyThread] = []

    def start(*, reconcile: bool = False, nrt: dict[str, str] | None = None) -> tuple[ProxyThread, CriClient]:
        node_file = q.write_node_config(tmp_path / "node.json", nrt=nrt)
        # A long period: pool changes must come from the store and node-config triggers.
        config = ProxyConfig(nodeConfigFile=str(node_file), reconcilePeriodSeconds=30.0)
        opts = proxy_options(containerd, tmp_path, transport, builtins=BUILTINS, reconcile=reconcile, config=config)
        proxy = ProxyThread(opts).__enter__()
        started.append(proxy)
        return proxy, cri_client(opts.listen)

    try:
        yield start
    finally:
        for proxy in started:
            if not proxy.loop.is_closed():  # a test may have stopped it already
                proxy.__exit__(None, None, None)


def _uid() -> str:
    return str(uuid.uuid4())


def run_lsr_pod(containerd: Any, client: CriClient, *, cpuset: str = LSR_CPU) -> tuple[PodHandle, str]:
    """A Guaranteed pod (1 CPU, 256 MiB) labelled LSR and bound by the scheduler to ``cpuset``,
    its kubelet-made pod cgroup capped at 1 CPU; one running container."""
    uid = _uid()
    parent = containerd.new_cgroup_parent("guaranteed", uid=uid)
    q.kubelet_pod_cgroup(parent, {"cpu.cfs_quota_us": 100_000, "cpu.shares": 1024})
    pod = client.run_pod(
        cgroup_parent=parent,
        uid=uid,
        labels={q.LABEL_QOS: "LSR"},
        annotations={q.RESOURCE_STATUS: q.resource_status(cpuset, {0: {"cpu": "1", "memory": "256Mi"}})},
    )
    cid = client.run_container(
        pod,
        name="lsr-app",
        resources=linux_resources(cpu_shares=1024, cpu_quota=100_000, memory_limit_in_bytes=256 * MiB),
    )
    return pod, cid


def run_ls_pod(
    containerd: Any, client: CriClient, *, annotations: dict[str, str] | None = None
) -> tuple[PodHandle, str]:
    """A Burstable pod labelled LS (request 0.5 CPU, limit 1 CPU); one running container."""
    uid = _uid()
    parent = containerd.new_cgroup_parent("burstable", uid=uid)
    pod = client.run_pod(cgroup_parent=parent, uid=uid, labels={q.LABEL_QOS: "LS"}, annotations=annotations)
    cid = client.run_container(pod, name="ls-app", resources=linux_resources(cpu_shares=512, cpu_quota=100_000))
    return pod, cid


def _status_linux(direct: CriClient, cid: str) -> api_pb2.LinuxContainerResources:
    """The resources containerd itself reports for the container (asked directly, not through
    the proxy)."""
    status = direct.container_status(cid)
    assert status.state == api_pb2.CONTAINER_RUNNING
    return status.resources.linux


# ---- cpuset per QoS class --------------------------------------------------------------------


def test_lsr_pod_bound_to_its_cpus_with_cfs_quota_unset(qos_proxy: ProxyFactory, containerd: Any) -> None:
    """LSR: the container's cpuset.cpus is the resource-status cpuset, its cpu.cfs_quota_us
    and the pod's are -1 (kubelet asked 100000 for both), cpu.shares stays as kubelet asked."""
    _, client = qos_proxy()
    pod, cid = run_lsr_pod(containerd, client)
    parent = pod.cgroup_parent
    assert q.read_container_file(parent, cid, "cpuset.cpus") == LSR_CPU
    assert q.read_container_file(parent, cid, "cpu.cfs_quota_us") == "-1"
    assert q.read_pod_file(parent, "cpu.cfs_quota_us") == "-1"
    assert q.read_container_file(parent, cid, "cpu.shares") == "1024"
    assert q.read_container_file(parent, cid, "memory.limit_in_bytes") == str(256 * MiB)
    linux = _status_linux(containerd.cri_client(), cid)
    assert (linux.cpuset_cpus, linux.cpu_quota) == (LSR_CPU, -1)
    # kubelet updates the container (a resize, or its CPU manager's reconcile): still bound.
    client.update_container_resources(cid, linux_resources(cpu_shares=2048, cpu_quota=200_000, cpuset_cpus=ALL_CPUS))
    assert q.read_container_file(parent, cid, "cpuset.cpus") == LSR_CPU
    assert q.read_container_file(parent, cid, "cpu.cfs_quota_us") == "-1"
    assert q.read_container_file(parent, cid, "cpu.shares") == "2048"


def test_ls_pod_gets_the_share_pool_without_the_bound_cpus(qos_proxy: ProxyFactory, containerd: Any) -> None:
    """LS: alone, the container gets the whole share pool (0-1); created while an LSR pod holds
    CPU 1, it gets the rest (0). Its CFS quota is kubelet's (LS pods are not bound)."""
    _, client = qos_proxy()
    first, first_cid = run_ls_pod(containerd, client)
    assert q.read_container_file(first.cgroup_parent, first_cid, "cpuset.cpus") == ALL_CPUS
    run_lsr_pod(containerd, client)
    second, second_cid = run_ls_pod(containerd, client)
    assert q.read_container_file(second.cgroup_parent, second_cid, "cpuset.cpus") == LS_POOL_WITH_LSR
    assert q.read_container_file(second.cgroup_parent, second_cid, "cpu.cfs_quota_us") == "100000"
    assert q.read_container_file(second.cgroup_parent, second_cid, "cpu.shares") == "512"
    assert _status_linux(containerd.cri_client(), second_cid).cpuset_cpus == LS_POOL_WITH_LSR


def test_ls_pod_follows_the_nrt_share_pool_annotation(qos_proxy: ProxyFactory, containerd: Any,
                                                      tmp_path: Path) -> None:
    """With ``node.koordinator.sh/cpu-shared-pools`` in the NodeResourceTopology, LS takes that
    pool; when koordlet rewrites it, the reconciler moves the running container to the new one."""
    _, client = qos_proxy(reconcile=True, nrt=q.nrt_with_share_pool(LS_POOL_WITH_LSR))
    pod, cid = run_ls_pod(containerd, client)
    assert q.read_container_file(pod.cgroup_parent, cid, "cpuset.cpus") == LS_POOL_WITH_LSR
    q.write_node_config(tmp_path / "node.json", nrt=q.nrt_with_share_pool(ALL_CPUS))
    q.wait_for(lambda: q.read_container_file(pod.cgroup_parent, cid, "cpuset.cpus"), ALL_CPUS,
               what="LS cpuset after the NRT share pool grew")
    assert _status_linux(containerd.cri_client(), cid).cpuset_cpus == ALL_CPUS


def test_be_pod_cpuset_cleared_and_batch_resources_applied(qos_proxy: ProxyFactory, containerd: Any) -> None:
    """BE: the cpuset kubelet sent is cleared (the container inherits the whole machine);
    cpu.shares from the batch-cpu request, cfs quota from the batch-cpu limit and the memory
    limit from batch-memory, at container and pod level; an update from kubelet is rewritten
    the same way."""
    _, client = qos_proxy()
    uid = _uid()
    parent = containerd.new_cgroup_parent("besteffort", uid=uid)
    q.kubelet_pod_cgroup(parent, {"cpu.shares": 2})
    spec = q.extended_resource_spec({
        "be-app": {
            "requests": {"kubernetes.io/batch-cpu": "500", "kubernetes.io/batch-memory": "128Mi"},
            "limits": {"kubernetes.io/batch-cpu": "1000", "kubernetes.io/batch-memory": "256Mi"},
        }
    })
    pod = client.run_pod(cgroup_parent=parent, uid=uid, labels={q.LABEL_QOS: "BE"},
                         annotations={q.EXTENDED_RESOURCE_SPEC: spec})
    # kubelet's request for a BestEffort container (shares 2), with a cpuset as kubelet's
    # static CPU manager would send for a shared container.
    cid = client.run_container(pod, name="be-app", resources=linux_resources(cpu_shares=2, cpuset_cpus="1"))
    expect = {"cpu.shares": "512", "cpu.cfs_quota_us": "100000", "cpu.cfs_period_us": "100000",
              "memory.limit_in_bytes": str(256 * MiB)}
    assert {f: q.read_container_file(parent, cid, f) for f in expect} == expect
    assert q.read_container_file(parent, cid, "cpuset.cpus") == ALL_CPUS
    pod_expect = {"cpu.shares": "512", "cpu.cfs_quota_us": "100000", "memory.limit_in_bytes": str(256 * MiB)}
    assert {f: q.read_pod_file(parent, f) for f in pod_expect} == pod_expect
    linux = _status_linux(containerd.cri_client(), cid)
    assert (linux.cpuset_cpus, linux.cpu_shares, linux.cpu_quota) == ("", 512, 100_000)
    # kubelet resizes the container back to BestEffort values; the plugin keeps the batch ones.
    client.update_container_resources(cid, linux_resources(cpu_shares=2, cpu_quota=50_000))
    assert {f: q.read_container_file(parent, cid, f) for f in expect} == expect


def test_forged_cpusets_on_be_and_ls_pods_are_ignored(qos_proxy: ProxyFactory, containerd: Any) -> None:
    """While an LSR pod holds CPU 1, a BE pod created with a forged resource-status cpuset "1"
    keeps its CFS quota (from batch-cpu) at pod and container level and does not get CPU 1: its
    cpuset is cleared as any BE pod's. An LS pod with a forged cpuset of every CPU gets the LS
    share pool without CPU 1 and keeps kubelet's quota. Neither pod counts as bound: a later LS
    pod still gets the same pool (the forged claims took no CPU out of it)."""
    _, client = qos_proxy()
    run_lsr_pod(containerd, client)
    uid = _uid()
    parent = containerd.new_cgroup_parent("besteffort", uid=uid)
    q.kubelet_pod_cgroup(parent, {"cpu.shares": 2})
    spec = q.extended_resource_spec({"be-app": {"limits": {"kubernetes.io/batch-cpu": "1000"}}})
    forged = q.resource_status(LSR_CPU)
    be = client.run_pod(cgroup_parent=parent, uid=uid, labels={q.LABEL_QOS: "BE"},
                        annotations={q.EXTENDED_RESOURCE_SPEC: spec, q.RESOURCE_STATUS: forged})
    be_cid = client.run_container(be, name="be-app", resources=linux_resources(cpu_shares=2))
    assert q.read_container_file(parent, be_cid, "cpuset.cpus") == ALL_CPUS
    assert q.read_container_file(parent, be_cid, "cpu.cfs_quota_us") == "100000"
    assert q.read_pod_file(parent, "cpu.cfs_quota_us") == "100000"
    linux = _status_linux(containerd.cri_client(), be_cid)
    assert (linux.cpuset_cpus, linux.cpu_quota) == ("", 100_000)
    ls, ls_cid = run_ls_pod(containerd, client, annotations={q.RESOURCE_STATUS: q.resource_status(ALL_CPUS, {})})
    assert q.read_container_file(ls.cgroup_parent, ls_cid, "cpuset.cpus") == LS_POOL_WITH_LSR
    assert q.read_container_file(ls.cgroup_parent, ls_cid, "cpu.cfs_quota_us") == "100000"
    linux = _status_linux(containerd.cri_client(), ls_cid)
    assert (linux.cpuset_cpus, linux.cpu_quota) == (LS_POOL_WITH_LSR, 100_000)
    later, later_cid = run_ls_pod(containerd, client)
    assert q.read_container_file(later.cgroup_parent, later_cid, "cpuset.cpus") == LS_POOL_WITH_LSR


def test_be_pod_without_batch_resources_keeps_kubelet_values(qos_proxy: ProxyFactory, containerd: Any) -> None:
    """A BE pod without extended-resource-spec: shares and quota stay as kubelet sent them."""
    _, client = qos_proxy()
    parent = containerd.new_cgroup_parent("besteffort")
    pod = client.run_pod(cgroup_parent=parent, labels={q.LABEL_QOS: "BE"})
    cid = client.run_container(pod, name="be-app", resources=linux_resources(cpu_shares=2))
    assert q.read_container_file(parent, cid, "cpu.shares") == "2"
    assert q.read_container_file(parent, cid, "cpu.cfs_quota_us") == "-1"


# ---- cpuset.mems -----------------------------------------------------------------------------


def test_numa_aligned_pods_get_cpuset_mems(qos_proxy: ProxyFactory, containerd: Any) -> None:
    """Pods placed on NUMA node 0 (resource-status numaNodeResources) get cpuset.mems 0 through
    CRI: an LSR pod, and an LS pod, whose cpuset is then the share pool of that node without
    the LSR pod's CPU; an LS pod without numaNodeResources gets no cpuset.mems from us."""
    _, client = qos_proxy()
    direct = containerd.cri_client()
    lsr, lsr_cid = run_lsr_pod(containerd, client)
    assert q.read_container_file(lsr.cgroup_parent, lsr_cid, "cpuset.mems") == "0"
    assert _status_linux(direct, lsr_cid).cpuset_mems == "0"
    annotations = {q.RESOURCE_STATUS: q.resource_status(numa={0: {"cpu": "500m", "memory": "1Gi"}})}
    pod, cid = run_ls_pod(containerd, client, annotations=annotations)
    assert q.read_container_file(pod.cgroup_parent, cid, "cpuset.mems") == "0"
    assert q.read_container_file(pod.cgroup_parent, cid, "cpuset.cpus") == LS_POOL_WITH_LSR
    linux = _status_linux(direct, cid)
    assert (linux.cpuset_mems, linux.cpuset_cpus) == ("0", LS_POOL_WITH_LSR)
    _, plain_cid = run_ls_pod(containerd, client)
    assert _status_linux(direct, plain_cid).cpuset_mems == ""


# ---- the reconciler: running LS containers follow the share pool ---------------------------------


def test_ls_cpuset_shrinks_when_an_lsr_pod_arrives_and_grows_back_when_it_leaves(
    qos_proxy: ProxyFactory, containerd: Any
) -> None:
    """The LS share pool is 0-1; an LSR pod bound to CPU 1 arrives and the reconciler shrinks
    the running LS container to 0 through containerd's UpdateContainerResources; the LSR pod is
    removed and the LS container grows back to 0-1. Sandboxes follow; then nothing drifts."""
    proxy, client = qos_proxy(reconcile=True)
    direct = containerd.cri_client()
    ls, ls_cid = run_ls_pod(containerd, client)

    def ls_cpus() -> str:
        return q.read_container_file(ls.cgroup_parent, ls_cid, "cpuset.cpus")

    assert ls_cpus() == ALL_CPUS
    lsr, lsr_cid = run_lsr_pod(containerd, client)
    q.wait_for(ls_cpus, LS_POOL_WITH_LSR, what="LS cpuset after the LSR pod arrived")
    # The change went through containerd (UpdateContainerResources), not around it.
    assert _status_linux(direct, ls_cid).cpuset_cpus == LS_POOL_WITH_LSR
    assert q.read_container_file(lsr.cgroup_parent, lsr_cid, "cpuset.cpus") == LSR_CPU
    assert q.read_container_file(ls.cgroup_parent, ls_cid, "cpu.cfs_quota_us") == "100000"
    # Sandboxes are reconciled by file writes: the LSR one onto its CPU, the LS one to the pool.
    q.wait_for(lambda: q.read_container_file(lsr.cgroup_parent, lsr.pod_id, "cpuset.cpus"), LSR_CPU,
               what="LSR sandbox cpuset")
    q.wait_for(lambda: q.read_container_file(ls.cgroup_parent, ls.pod_id, "cpuset.cpus"), LS_POOL_WITH_LSR,
               what="LS sandbox cpuset")

    client.stop_container(lsr_cid)
    client.remove_container(lsr_cid)
    client.stop_pod_sandbox(lsr.pod_id)
    client.remove_pod_sandbox(lsr.pod_id)
    q.wait_for(ls_cpus, ALL_CPUS, what="LS cpuset after the LSR pod left")
    assert _status_linux(direct, ls_cid).cpuset_cpus == ALL_CPUS
    q.wait_for(lambda: q.read_container_file(ls.cgroup_parent, ls.pod_id, "cpuset.cpus"), ALL_CPUS,
               what="LS sandbox cpuset")
    assert proxy.proxy is not None and proxy.proxy.store.pod(lsr.pod_id) is None
    # Converged: another round finds nothing to change (no update loop against containerd).
    report = proxy.call(proxy.proxy.reconciler.reconciler.reconcile_once("test"))
    assert (report.drift, report.updates, report.errors) == ([], {}, [])


def test_proxy_restart_keeps_the_lsr_cpus_out_of_the_share_pool(qos_proxy: ProxyFactory, containerd: Any) -> None:
    """After a proxy restart the store is rebuilt from containerd: an LS pod created then still
    leaves the running LSR pod's CPU alone, and grows back once that pod is removed."""
    first, client = qos_proxy()
    lsr, _ = run_lsr_pod(containerd, client)
    first.__exit__(None, None, None)
    _, client = qos_proxy(reconcile=True)
    ls, ls_cid = run_ls_pod(containerd, client)
    assert q.read_container_file(ls.cgroup_parent, ls_cid, "cpuset.cpus") == LS_POOL_WITH_LSR
    client.remove_pod(lsr)
    q.wait_for(lambda: q.read_container_file(ls.cgroup_parent, ls_cid, "cpuset.cpus"), ALL_CPUS,
               what="LS cpuset after the LSR pod left")


def test_ls_cpuset_grows_when_an_lsr_pod_is_stopped_before_it_is_removed(
    qos_proxy: ProxyFactory, containerd: Any
) -> None:
    """kubelet stops a deleted pod at once but removes its sandbox only at its garbage
    collection, up to a minute later: the LS container grows onto the stopped LSR pod's CPU as
    soon as StopPodSandbox returned (through containerd's UpdateContainerResources), and a new
    LSR pod given that CPU is bound to it while the stopped sandbox still exists."""
    _, client = qos_proxy(reconcile=True)
    direct = containerd.cri_client()
    ls, ls_cid = run_ls_pod(containerd, client)

    def ls_cpus() -> str:
        return q.read_container_file(ls.cgroup_parent, ls_cid, "cpuset.cpus")

    old, old_cid = run_lsr_pod(containerd, client)
    q.wait_for(ls_cpus, LS_POOL_WITH_LSR, what="LS cpuset after the LSR pod arrived")
    client.stop_container(old_cid)
    client.stop_pod_sandbox(old.pod_id)
    q.wait_for(ls_cpus, ALL_CPUS, what="LS cpuset after the LSR pod was stopped")
    assert _status_linux(direct, ls_cid).cpuset_cpus == ALL_CPUS
    # Stopped, not removed (containerd may set the state a moment after StopPodSandbox returns).
    q.wait_for(lambda: [s.state for s in direct.list_pod_sandboxes() if s.id == old.pod_id],
               [api_pb2.SANDBOX_NOTREADY], what="the old sandbox's state")
    new, new_cid = run_lsr_pod(containerd, client)
    assert q.read_container_file(new.cgroup_parent, new_cid, "cpuset.cpus") == LSR_CPU
    q.wait_for(ls_cpus, LS_POOL_WITH_LSR, what="LS cpuset after the new LSR pod arrived")
