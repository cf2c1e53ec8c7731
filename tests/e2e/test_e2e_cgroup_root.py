"""kubelet with another cgroup root (``cgroupRoot: /rhp-e2e-root-<random>``, kubelet's
``--cgroup-root``) in the real one-node cluster, through ``runtime-proxy serve`` and through
containerd 2.1 with NRI and ``runtime-proxy nri``.

The session's cluster (containerd 2.1) is reused: its kubelet restarts on the other root (the
harness makes the root in every hierarchy first, as kubelet requires) and comes back to ``/``
afterwards, so this costs two kubelet restarts, not a cluster. The proxy, or the NRI plugin,
runs with ``cpu_suppress`` and the usage loop on, under a NodeSLO whose CPU suppress always
writes the BE kube-QoS quota (threshold 100 %, ``cfsQuota``; node CPU from a prepared
``/proc/stat`` that never moves, as in ``tests/integration/test_kubelet_root_real.py``).

Checked on the real cgroup files: the node is Ready; the LSR pod (resource-status cpuset,
placed with ``nodeName``) runs on its CPU with no CFS quota and the BE pod (batch resources the
test publishes on the Node) gets its shares and memory limit and no CFS quota of its own
(batch_resource lifts it while CPU suppress's cfsQuota policy is on), both under
``<root>/kubepods``; and the QoS-level write lands in ``<root>/kubepods/besteffort`` while
``/kubepods/besteffort`` is left as it was: first with the root learned from the cgroup parents
kubelet sends, then with ``kubeletCgroupRoot`` set.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from rhp_devenv.cgroupfs import CGROUP_ROOT, pod_cgroup_parent, relative_cgroup_path, remove_cgroup_tree
from rhp_devenv.kube import NODE_NAME

from hooks.facts import format_cpu_list
from runtime_proxy.host.cgroups import v1_controller
from runtime_proxy.state.sysfs import read_cpu_topology
from tests.e2e.conftest import SWITCH_TIMEOUT, NriPlugin, Stack, container_id, pod_manifest
from tests.integration import qos_helpers as q
from tests.integration.test_cpu_suppress_real import prepared_proc

# the first test may wait for another cluster on this machine to stop (the machine's lock)
pytestmark = pytest.mark.timeout(1900)

TOPO = read_cpu_topology()
ALL_CPUS = format_cpu_list(TOPO.cpus)
LSR_CPU = str(max(TOPO.cpus))
FULL = len(TOPO.cpus) * 100_000  # the whole node's CFS quota
MiB = 1024**2
ROOT = f"/rhp-e2e-root-{secrets.token_hex(3)}"
BE_QOS = f"{ROOT}/kubepods/besteffort"
DEFAULT_BE_QOS = "/kubepods/besteffort"
PLUGINS = ("cpuset", "numa", "batch_resource", "cpu_suppress")
SUPPRESS = {"enable": True, "cpuSuppressPolicy": "cfsQuota", "cpuSuppressThresholdPercent": 100}
BATCH = {"kubernetes.io/batch-cpu": "1000", "kubernetes.io/batch-memory": "1Gi"}
BE_RESOURCES = {"kubernetes.io/batch-cpu": "500", "kubernetes.io/batch-memory": "128Mi"}
LSR_EXPECT = {"cpuset.cpus": LSR_CPU, "cpu.cfs_quota_us": "-1", "memory.limit_in_bytes": str(64 * MiB)}
LSR_POD_EXPECT = {"cpu.cfs_quota_us": "-1"}
# batch_resource lifts BE quotas while CPU suppress's cfsQuota policy bounds them at the QoS level.
BE_EXPECT = {"cpu.shares": "512", "cpu.cfs_quota_us": "-1", "memory.limit_in_bytes": str(128 * MiB)}


def qos_file(path: str, file: str) -> str | None:
    """A QoS-level cgroup file (cgroup v1: the controller follows the file), None when absent."""
    try:
        return (CGROUP_ROOT / v1_controller(file) / relative_cgroup_path(path) / file).read_text().strip()
    except FileNotFoundError:
        return None


def set_qos_file(path: str, file: str, value: str) -> None:
    (CGROUP_ROOT / v1_controller(file) / relative_cgroup_path(path) / file).write_text(value + "\n")


def reset_be_quotas() -> str | None:
    """Both BE QoS quotas back to kubelet's -1; returns the root-``/`` one as it is then (None
    when that directory is not there)."""
    for path in (BE_QOS, DEFAULT_BE_QOS):
        if qos_file(path, "cpu.cfs_quota_us") is not None:
            set_qos_file(path, "cpu.cfs_quota_us", "-1")
    return qos_file(DEFAULT_BE_QOS, "cpu.cfs_quota_us")


def be_quota_set() -> bool:
    value = qos_file(BE_QOS, "cpu.cfs_quota_us")
    return value is not None and 0 < int(value) <= FULL


@pytest.fixture(scope="module")
def rooted(stack: Stack) -> Iterator[Stack]:
    """The session's kubelet restarted with cgroup root :data:`ROOT`; back on ``/`` afterwards."""
    if len(TOPO.cpus) < 2 or TOPO.numa_nodes != (0,):
        pytest.skip(f"needs 2+ CPUs on one NUMA node 0; this machine has {ALL_CPUS} on {TOPO.numa_nodes}")
    if stack.ctrd.version != "2.1":
        pytest.skip("kubelet's cgroup root does not depend on the runtime version: checked on containerd 2.1")
    cluster = stack.cluster
    cluster.cgroup_root = ROOT
    try:
        cluster.restart_kubelet(rewrite_config=True, timeout=SWITCH_TIMEOUT)
        stack.wait_kubelet_ready()
        # The Node's Ready condition may still be the old kubelet's: wait for the new one's QoS dirs.
        cluster.wait_for(lambda: qos_file(BE_QOS, "cpu.cfs_quota_us") is not None,
                         what=f"kubelet's QoS cgroups under {ROOT}", timeout=SWITCH_TIMEOUT, log="kubelet")  # fmt: skip
        yield stack
    finally:
        reset_be_quotas()  # kubelet's value on the root-/ tree the session goes back to
        cluster.cgroup_root = "/"
        cluster.cri_socket = stack.proxy_socket
        cluster.restart_kubelet(rewrite_config=True, timeout=SWITCH_TIMEOUT)
        remove_cgroup_tree(ROOT, kill=True, timeout=10.0)  # the cluster's stop would, later


def write_config(stack: Stack, name: str, **extra: Any) -> Path:
    """A proxy/plugin config with CPU suppress always writing the BE QoS quota."""
    work = stack.work / name
    work.mkdir(exist_ok=True)
    node = {
        "name": NODE_NAME,
        "labels": {"kubernetes.io/hostname": NODE_NAME},
        "nodeResourceTopology": {"annotations": q.node_topology_annotations()},
        "nodeSLO": {**q.NODE_SLO, "resourceUsedThresholdWithBE": SUPPRESS},
    }
    (work / "node.json").write_text(json.dumps(node))
    (work / "hookserver.d").mkdir(exist_ok=True)
    config = {
        "plugins": [{"name": plugin} for plugin in PLUGINS],
        "nodeConfigFile": str(work / "node.json"),
        "hookServerDir": str(work / "hookserver.d"),
        "cgroupDriver": "cgroupfs",
        "usageLoop": {"enable": True, "intervalSeconds": 1, "procRoot": str(prepared_proc(work))},
        **extra,
    }
    path = work / "proxy-config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def lsr_pod(name: str, ns: str) -> dict[str, Any]:
    return pod_manifest(
        name, ns, qos="LSR", node_name=NODE_NAME, annotations={q.RESOURCE_STATUS: q.resource_status(LSR_CPU)},
        requests={"cpu": "1", "memory": "64Mi"}, limits={"cpu": "1", "memory": "64Mi"},
    )  # fmt: skip


def be_pod(name: str, ns: str) -> dict[str, Any]:
    spec = q.extended_resource_spec({"app": {"requests": BE_RESOURCES, "limits": BE_RESOURCES}})
    return pod_manifest(name, ns, qos="BE", node_name=NODE_NAME, annotations={q.EXTENDED_RESOURCE_SPEC: spec},
                        requests=BE_RESOURCES, limits=BE_RESOURCES)  # fmt: skip


def parent(pod: Mapping[str, Any]) -> str:
    """kubelet's pod cgroup under :data:`ROOT` (cgroupfs driver)."""
    return pod_cgroup_parent(ROOT, pod["status"]["qosClass"], pod["metadata"]["uid"])


def wait_files(pod: Mapping[str, Any], expect: Mapping[str, str], *, pod_level: bool = False) -> None:
    def read() -> dict[str, str]:
        if pod_level:
            return {f: q.read_pod_file(parent(pod), f) for f in expect}
        return {f: q.read_container_file(parent(pod), container_id(pod), f) for f in expect}

    q.wait_for(read, dict(expect), what=f"{'pod' if pod_level else 'container'} cgroup of "
               f"{pod['metadata']['name']} under {ROOT}", timeout=60)  # fmt: skip


def run_and_check_pods(stack: Stack, ns: str) -> None:
    """The LSR and BE pods run under :data:`ROOT` with what the plugins decide."""
    cluster = stack.cluster
    node = cluster.get_json("node", NODE_NAME)
    assert node is not None
    assert any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"]["conditions"])
    cluster.apply(lsr_pod("lsr", ns))
    lsr = cluster.wait_pod_running(ns, "lsr")
    cluster.kubectl("patch", "node", NODE_NAME, "--subresource=status", "--type=merge",
                    "-p", json.dumps({"status": {"capacity": BATCH, "allocatable": BATCH}}))  # fmt: skip
    cluster.apply(be_pod("be", ns))
    be = cluster.wait_pod_running(ns, "be")
    assert (lsr["status"]["qosClass"], be["status"]["qosClass"]) == ("Guaranteed", "BestEffort")
    assert (CGROUP_ROOT / "cpu" / relative_cgroup_path(parent(be)) / container_id(be)).is_dir(), \
        f"kubelet did not put the BE pod under {ROOT}"  # fmt: skip
    wait_files(lsr, LSR_EXPECT)
    wait_files(lsr, LSR_POD_EXPECT, pod_level=True)
    wait_files(be, BE_EXPECT)
    wait_files(be, BE_EXPECT, pod_level=True)


def wait_be_quota(stack: Stack, what: str) -> None:
    stack.cluster.wait_for(be_quota_set, what=f"CPU suppress's BE quota in {BE_QOS} ({what})", timeout=60)


def test_serve_mode_with_another_cgroup_root(rooted: Stack, ns: str) -> None:
    """kubelet → ``runtime-proxy serve`` → containerd 2.1 with kubelet's cgroup root elsewhere:
    pods configured under it, and the BE QoS quota written there, learned then configured.
    (Before the first pod the learning proxy uses ``/``, as docs/config.md says: the root-``/``
    dir is checked only with ``kubeletCgroupRoot`` set.)"""
    stack = rooted
    assert qos_file(BE_QOS, "cpu.cfs_quota_us") == "-1", "kubelet leaves its BE QoS dir unlimited"
    stack.restart_proxy(args=stack.serve_args(write_config(stack, "serve-learned")))
    try:
        run_and_check_pods(stack, ns)
        wait_be_quota(stack, "root learned from the pods")
        # kubeletCgroupRoot set: the quota is unset and the configured proxy writes it again.
        stack.proxy.terminate()
        default_before = reset_be_quotas()
        stack.restart_proxy(args=stack.serve_args(write_config(stack, "serve-configured", kubeletCgroupRoot=ROOT)))
        wait_be_quota(stack, "kubeletCgroupRoot set")
        assert qos_file(DEFAULT_BE_QOS, "cpu.cfs_quota_us") == default_before, "the root-/ BE dir is left alone"
    finally:
        stack.restart_proxy()


def test_nri_mode_with_another_cgroup_root(rooted: Stack, ns: str) -> None:
    """kubelet → containerd 2.1 with NRI → ``runtime-proxy nri`` (no proxy running) with
    kubelet's cgroup root elsewhere: the same checks, learned then configured."""
    stack = rooted
    reset_be_quotas()  # whatever an earlier test left
    learned = write_config(stack, "nri-learned")
    plugin = NriPlugin(stack.ctrd.nri_socket, stack.work / "nri-learned", "--config", str(learned)).start()
    try:
        stack.kubelet_on_containerd()
        run_and_check_pods(stack, ns)
        wait_be_quota(stack, "NRI, root learned from the pods")
        plugin.stop()
        default_before = reset_be_quotas()
        configured = write_config(stack, "nri-configured", kubeletCgroupRoot=ROOT)
        plugin = NriPlugin(stack.ctrd.nri_socket, stack.work / "nri-configured", "--config", str(configured)).start()
        wait_be_quota(stack, "NRI, kubeletCgroupRoot set")
        assert qos_file(DEFAULT_BE_QOS, "cpu.cfs_quota_us") == default_before, "the root-/ BE dir is left alone"
    finally:
        stack.kubelet_on_proxy()
        plugin.stop()
