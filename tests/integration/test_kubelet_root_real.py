"""kubelet's ``--cgroup-root`` on real containerd and runc, through an in-process proxy
(``runtime-proxy serve``): pods are made as a kubelet with ``cgroupRoot: /rhp-root-<random>``
makes them (``<root>/kubepods/besteffort/pod<uid>``, the QoS dirs created first, as kubelet's
container manager does), and CPU suppress's BE kube-QoS quota, a QoS-level write, lands in
``<root>/kubepods/besteffort``: learned from the pods' cgroup parents, or from
``kubeletCgroupRoot``, which then wins over a pod under another root. The NRI plugin's
counterpart is ``test_kubelet_root_nri_real.py``.

The test drives the usage loop's rounds itself; node CPU comes from a prepared ``/proc/stat``
that never moves (``test_cpu_suppress_real.prepared_proc``)."""

from __future__ import annotations

import json
import secrets
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY
from rhp_devenv.cgroupfs import CGROUP_ROOT
from rhp_devenv.cri import CriClient, PodHandle

from koord_formats.topology import format_cpu_topology
from runtime_proxy.config import ProxyConfig
from runtime_proxy.host.cgroups import v1_controller
from runtime_proxy.loops.qos import UsageLoop
from runtime_proxy.state.sysfs import read_cpu_topology
from tests.integration import qos_helpers as q
from tests.integration.harness import ProxyThread, proxy_options
from tests.integration.test_cpu_suppress_real import prepared_proc

pytestmark = pytest.mark.integration

TOPO = read_cpu_topology()
FULL = len(TOPO.cpus) * 100_000  # the whole node's CFS quota
BUILTINS = ("cpuset", "batch_resource", "cpu_suppress")
SLO = {"enable": True, "cpuSuppressPolicy": "cfsQuota", "cpuSuppressThresholdPercent": 100}
OUTLIERS = "rhp_kubelet_cgroup_root_outliers_total"


def qos_file(path: str, file: str) -> str:
    return (CGROUP_ROOT / v1_controller(file) / path.strip("/") / file).read_text().strip()


class Node:
    """A kubelet root of this test's own, the pods made below it, and cleanup."""

    def __init__(self, root: str, socket: Path) -> None:
        self.root = root
        self.socket = socket
        self.pods: list[PodHandle] = []

    def run_pod(self, client: CriClient, qos: str, kube: str, parent: str = "") -> PodHandle:
        uid = str(uuid.uuid4())
        tier = "" if kube == "guaranteed" else f"/{kube}"
        pod = client.run_pod(cgroup_parent=parent or f"{self.root}/kubepods{tier}/pod{uid}", uid=uid,
                             labels={q.LABEL_QOS: qos})
        self.pods.append(pod)
        return pod


@pytest.fixture
def node(containerd: Any) -> Iterator[Node]:
    root = f"/rhp-root-{secrets.token_hex(4)}"
    with q.kubelet_qos_tree(root):
        made = Node(root, containerd.socket)
        try:
            yield made
        finally:
            with CriClient(containerd.socket) as client:
                for pod in made.pods:
                    client.remove_pod(pod)


def start_proxy(containerd: Any, tmp_path: Path, transport: str, **config: Any) -> tuple[ProxyThread, UsageLoop]:
    node_file = tmp_path / "node.json"
    node_file.write_text(json.dumps({
        "name": "rhp-root-node",
        "nodeResourceTopology": {"annotations": {q.CPU_TOPOLOGY: format_cpu_topology(TOPO)}},
        "nodeSLO": {"resourceUsedThresholdWithBE": SLO},
    }))
    cfg = ProxyConfig(
        nodeConfigFile=str(node_file), reconcilePeriodSeconds=30.0,
        usageLoop={"enable": True, "intervalSeconds": 60.0, "procRoot": str(prepared_proc(tmp_path))},
        **config,
    )
    opts = proxy_options(containerd, tmp_path, transport, builtins=BUILTINS, reconcile=True, config=cfg)
    proxy = ProxyThread(opts).__enter__()
    assert proxy.proxy is not None and proxy.proxy.reconciler is not None
    loop = proxy.proxy.reconciler.usage
    assert loop is not None
    deadline = time.monotonic() + 20
    while loop.rounds < 1:  # the loop's own first round (the sampler's baseline)
        assert time.monotonic() < deadline, "the usage loop never ran"
        time.sleep(0.02)
    return proxy, loop


def rounds(proxy: ProxyThread, loop: UsageLoop, count: int = 2) -> None:
    for _ in range(count):
        time.sleep(0.3)
        assert proxy.call(loop.step()).failures == []


def test_serve_learns_the_root_from_the_pods_and_suppresses_be_below_it(
    containerd: Any, tmp_path: Path, cri_client: Any, node: Node
) -> None:
    proxy, loop = start_proxy(containerd, tmp_path, "relay")
    try:
        client = cri_client(proxy.opts.listen)
        be_dir = f"{node.root}/kubepods/besteffort"
        assert qos_file(be_dir, "cpu.cfs_quota_us") == "-1", "kubelet leaves the BE QoS dir unlimited"
        ls = node.run_pod(client, "LS", "burstable")
        client.run_container(ls, name="idle")
        be = node.run_pod(client, "BE", "besteffort")
        client.run_container(be, name="batch")
        rounds(proxy, loop)
        quota = int(qos_file(be_dir, "cpu.cfs_quota_us"))
        assert 0 < quota <= FULL, f"the BE quota below {node.root} is {quota}"
        assert proxy.proxy is not None
        assert proxy.proxy.interceptor.node().cgroup.kubelet_root == node.root
    finally:
        proxy.__exit__(None, None, None)


def test_serve_with_kubelet_cgroup_root_set_keeps_it_over_a_pod_under_another_root(
    containerd: Any, tmp_path: Path, cri_client: Any, node: Node
) -> None:
    before = REGISTRY.get_sample_value(OUTLIERS, {"reason": "other-root"}) or 0.0
    proxy, loop = start_proxy(containerd, tmp_path, "grpc", kubeletCgroupRoot=node.root)
    try:
        client = cri_client(proxy.opts.listen)
        # Two BE pods under the session's private top (another kubelet root) and one under ours:
        # learning would follow the two; the configured root does not.
        strays = [node.run_pod(client, "BE", "besteffort", parent=containerd.new_cgroup_parent("besteffort"))
                  for _ in range(2)]
        be = node.run_pod(client, "BE", "besteffort")
        client.run_container(be, name="batch")
        rounds(proxy, loop)
        quota = int(qos_file(f"{node.root}/kubepods/besteffort", "cpu.cfs_quota_us"))
        assert 0 < quota <= FULL, f"the BE quota below {node.root} is {quota}"
        assert qos_file(f"{containerd.cgroup_top}/kubepods/besteffort", "cpu.cfs_quota_us") == "-1", \
            "the other root's BE dir is left alone"
        seen = REGISTRY.get_sample_value(OUTLIERS, {"reason": "other-root"}) or 0.0
        assert seen >= before + len(strays), "the pods under another root are counted"
        rounds(proxy, loop)
        again = REGISTRY.get_sample_value(OUTLIERS, {"reason": "other-root"}) or 0.0
        assert again == seen, "each is counted once, not once a round"
    finally:
        proxy.__exit__(None, None, None)
