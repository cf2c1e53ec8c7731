"""The host package's config as it ships (``packaging/proxy-config.yaml``) runs CPU suppress and
memory eviction on real containerd and the real cgroup v1 tree as soon as the NodeSLO enables
them: no ``usageLoop.enable``, no plugin list of the test's own.

The proxy runs in process with the packaged config, changed only where the test stands in for
the node: the node config file (the NodeSLO the operator would write into
``/etc/runtime-hook-proxy/node.yaml``) and the usage loop's ``procRoot`` (a prepared
``/proc/meminfo`` whose node memory the test raises; ``stat`` never moves, so other work on this
shared machine does not count). Every built-in plugin is installed and the config picks them;
``rdt`` is left out because this machine has no resctrl. The loop runs on its own, every
packaged interval (1 s); the test waits for what it must see:

1. the BE kube-QoS ``cpu.cfs_quota_us`` of kubelet's tree (``/kubepods/besteffort``) gets CPU
   suppress's quota (it starts unlimited);
2. with node memory above ``memoryEvictThresholdPercent``, the BE pod's container is stopped
   (``evictBy: runtime``, as packaged) and the LS pod's keeps running.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from rhp_devenv.cgroupfs import CGROUP_ROOT, cgroup_hierarchies, remove_cgroup_tree
from rhp_devenv.cri import CriClient, PodHandle

from cri_protos import api_pb2
from koord_formats.topology import format_cpu_topology
from runtime_proxy.config import load_config
from runtime_proxy.host.cgroups import v1_controller
from runtime_proxy.state.sysfs import read_cpu_topology
from tests.integration.harness import ProxyThread, proxy_options

pytestmark = [pytest.mark.integration, pytest.mark.one_containerd]

REPO = Path(__file__).resolve().parents[2]
PACKAGED = REPO / "packaging" / "proxy-config.yaml"
QOS = "koordinator.sh/qosClass"
TOPOLOGY = "node.koordinator.sh/cpu-topology"
KUBELET_POLICY = "kubelet.koordinator.sh/cpu-manager-policy"
GiB = 1 << 30
SLO = {"resourceUsedThresholdWithBE": {
    "enable": True,
    "cpuSuppressPolicy": "cfsQuota",
    "cpuSuppressThresholdPercent": 100,
    "memoryEvictThresholdPercent": 70,
}}
T = TypeVar("T")


def poll(read: Callable[[], T | None], *, what: str, timeout: float = 60.0) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = read()
        if value is not None and value is not False:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout} s")
        time.sleep(0.1)


def write_meminfo(proc: Path, used: int, total: int = 8 * GiB) -> None:
    tmp = proc / "meminfo.tmp"
    tmp.write_text(f"MemTotal: {total // 1024} kB\nMemFree: 0 kB\nMemAvailable: {(total - used) // 1024} kB\n")
    tmp.replace(proc / "meminfo")


@pytest.fixture
def kubelet_pods(containerd: Any) -> Iterator[list[PodHandle]]:
    """Pods in kubelet's own cgroup layout (``/kubepods/...``); skipped when a ``kubepods`` tree
    exists already (a real kubelet or another run owns it); removed afterwards with the tree."""
    if any((h / "kubepods").exists() for h in cgroup_hierarchies()):
        pytest.skip("a kubepods cgroup tree exists on this machine; this test creates and removes its own")
    pods: list[PodHandle] = []
    try:
        yield pods
    finally:
        with CriClient(containerd.socket) as client:
            for pod in pods:
                client.remove_pod(pod)
        for pod in pods:
            remove_cgroup_tree(pod.cgroup_parent, kill=True)
        for qos in ("/kubepods/besteffort", "/kubepods/burstable", "/kubepods"):
            remove_cgroup_tree(qos)


def test_cpu_suppress_and_eviction_run_with_the_packaged_config(
    containerd: Any, tmp_path: Path, cri_client: Any, kubelet_pods: list[PodHandle]
) -> None:
    packaged = load_config(str(PACKAGED))
    assert packaged.usageLoop.enable is None, "the packaged config does not force the loop on"
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "stat").write_text("cpu  100 0 100 1000 0 0 0 0 0 0\ncpu0 100 0 100 1000 0 0 0 0 0 0\n")
    write_meminfo(proc, 2 * GiB)
    node_file = tmp_path / "node.yaml"
    node_file.write_text(json.dumps({
        "name": "rhp-packaged-node",
        "nodeResourceTopology": {"annotations": {TOPOLOGY: format_cpu_topology(read_cpu_topology()),
                                                 KUBELET_POLICY: json.dumps({"policy": "none"})}},
        "nodeSLO": SLO,
    }))
    config = packaged.model_copy(update={
        "nodeConfigFile": str(node_file),
        "usageLoop": packaged.usageLoop.model_copy(update={"procRoot": str(proc)}),
    })
    opts = proxy_options(containerd, tmp_path, "relay", builtins=None, reconcile=True, config=config)
    with ProxyThread(opts) as proxy:
        assert proxy.proxy is not None
        steps = [step.name for step in proxy.proxy.pipeline.steps]
        assert "cpu_suppress" in steps and "memory_evict" in steps and "rdt" not in steps
        client, direct = cri_client(opts.listen), containerd.cri_client()
        pods = {}
        for qos, kube in (("LS", "burstable"), ("BE", "besteffort")):
            uid = str(uuid.uuid4())
            pod = client.run_pod(cgroup_parent=f"/kubepods/{kube}/pod{uid}", uid=uid, labels={QOS: qos})
            kubelet_pods.append(pod)
            pods[qos] = client.run_container(pod, name="app")
        loops = proxy.proxy.reconciler
        assert loops is not None and loops.usage is not None, "the usage loop runs without usageLoop.enable"

        quota_file = CGROUP_ROOT / v1_controller("cpu.cfs_quota_us") / "kubepods" / "besteffort" / "cpu.cfs_quota_us"

        def suppressed() -> int | None:
            quota = int(quota_file.read_text())
            return quota if quota > 0 else None

        quota = poll(suppressed, what="CPU suppress writes the BE kube-QoS quota")
        assert quota <= len(read_cpu_topology().cpus) * 100_000

        assert direct.container_status(pods["BE"]).state == api_pb2.CONTAINER_RUNNING
        write_meminfo(proc, 7 * GiB)  # 87% >= 70%: memory_evict's victims are the BE pods

        def be_stopped() -> bool:
            return bool(direct.container_status(pods["BE"]).state == api_pb2.CONTAINER_EXITED)

        poll(be_stopped, what="the BE pod's container stopped by memory eviction")
        assert direct.container_status(pods["LS"]).state == api_pb2.CONTAINER_RUNNING, "LS pods are never victims"
