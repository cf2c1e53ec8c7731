"""CPU normalization through the proxy, on real containerd and runc and the real cgroup v1
filesystem.

The test plays kubelet: it makes the pod cgroup with the sum of the limits (as kubelet's pod
container manager does), then sends RunPodSandbox, CreateContainer and StartContainer for an LS
pod with two containers (2 CPUs and 1 CPU) through an in-process proxy running the built-ins
``cpu_normalization`` and ``cpu_burst`` with its reconciler. The node config file carries the
node annotation ``node.koordinator.sh/cpu-normalization-ratio`` and a NodeSLO with CPU burst
(``cpuBurstOnly``, 50%).

- At 1.25 the containers' ``cpu.cfs_quota_us`` are divided at creation (containerd reports the
  divided quota too) and the reconciler levels the pod to their sum; ``cpu.cfs_burst_us`` is
  50% of the divided quota.
- Rewriting the ratio to 2.00 (quotas shrink) and then to 1.00 (kubelet's quotas come back)
  rewrites containers and pod in a safe order: the reconciler counts no error, and every
  container stays within its pod at the end. The cfsQuotaBurst loop (which also takes the
  normalized quota as its base) runs in one variant and is stopped in the other, so the
  reconciler alone must level the writes (the kernel refuses a pod quota below a container's).

Every assertion reads /sys/fs/cgroup or asks containerd directly, never the proxy's state.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rhp_devenv.cri import CriClient, PodHandle, linux_resources

from runtime_proxy.config import ProxyConfig
from runtime_proxy.loops.reconciler import RECONCILE_ERRORS
from tests.integration import qos_helpers as q
from tests.integration.harness import ProxyThread, proxy_options

pytestmark = pytest.mark.integration

TRANSPORT = os.environ.get("RHP_NORMALIZATION_TRANSPORT", "relay")
RATIO = "node.koordinator.sh/cpu-normalization-ratio"
LIMITS = {"big": 200_000, "small": 100_000}  # kubelet's CFS quotas: 2 CPUs and 1 CPU
BURST_PERCENT = 50


def write_node(path: Path, ratio: str) -> None:
    doc = {
        "name": "rhp-normalization-node",
        "annotations": {RATIO: ratio},
        "nodeResourceTopology": {"annotations": q.node_topology_annotations()},
        "nodeSLO": {**q.NODE_SLO, "cpuBurstStrategy": {"policy": "cpuBurstOnly", "cpuBurstPercent": BURST_PERCENT}},
    }
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc))
    tmp.replace(path)


def errors() -> float:
    return sum(m.value for metric in RECONCILE_ERRORS.collect() for m in metric.samples if m.name.endswith("_total"))


@pytest.fixture
def proxy(containerd: Any, tmp_path: Path, cri_client: Any) -> Iterator[tuple[ProxyThread, CriClient]]:
    write_node(tmp_path / "node.json", "1.25")
    # A long period: every round here comes from the store and node-config triggers.
    config = ProxyConfig(nodeConfigFile=str(tmp_path / "node.json"), reconcilePeriodSeconds=30.0)
    opts = proxy_options(containerd, tmp_path, TRANSPORT, builtins=("cpu_normalization", "cpu_burst"),
                         reconcile=True, config=config)
    with ProxyThread(opts) as running:
        yield running, cri_client(opts.listen)


def run_ls_pod(containerd: Any, client: CriClient) -> tuple[PodHandle, dict[str, str]]:
    uid = str(uuid.uuid4())
    parent = containerd.new_cgroup_parent("burstable", uid=uid)
    q.kubelet_pod_cgroup(parent, {"cpu.cfs_quota_us": sum(LIMITS.values())})
    pod = client.run_pod(cgroup_parent=parent, uid=uid, labels={q.LABEL_QOS: "LS"})
    ids = {
        name: client.run_container(pod, name=name, resources=linux_resources(cpu_shares=512, cpu_quota=quota))
        for name, quota in LIMITS.items()
    }
    return pod, ids


def expected(parent: str, ids: dict[str, str], divided: dict[str, int]) -> dict[tuple[str, str], str]:
    """(cgroup dir, file) -> value, for quotas ``divided`` (container name -> quota)."""
    want: dict[tuple[str, str], str] = {}
    for name, cid in ids.items():
        want[(f"{parent}/{cid}", "cpu.cfs_quota_us")] = str(divided[name])
        want[(f"{parent}/{cid}", "cpu.cfs_burst_us")] = str(divided[name] * BURST_PERCENT // 100)
    want[(parent, "cpu.cfs_quota_us")] = str(sum(divided.values()))
    want[(parent, "cpu.cfs_burst_us")] = str(sum(d * BURST_PERCENT // 100 for d in divided.values()))
    return want


def read_all(parent: str, ids: dict[str, str], keys: list[tuple[str, str]]) -> dict[tuple[str, str], str]:
    out = {}
    for directory, file in keys:
        cid = directory.rsplit("/", 1)[1] if directory != parent else None
        out[(directory, file)] = (
            q.read_pod_file(parent, file) if cid is None else q.read_container_file(parent, cid, file)
        )
    return out


def converge(parent: str, ids: dict[str, str], divided: dict[str, int], what: str) -> None:
    want = expected(parent, ids, divided)
    q.wait_for(lambda: read_all(parent, ids, list(want)), want, what=what, timeout=20.0)


@pytest.mark.parametrize(
    "burst_loop",
    [
        pytest.param(True, id="with the cfsQuotaBurst loop running"),
        pytest.param(False, id="with the reconciler alone"),
    ],
)
def test_normalized_quotas_follow_the_ratio_in_a_safe_order(
    proxy: tuple[ProxyThread, CriClient], containerd: Any, tmp_path: Path, burst_loop: bool
) -> None:
    running, client = proxy
    if not burst_loop:
        assert running.proxy is not None and running.proxy.reconciler is not None
        running.call(running.proxy.reconciler.burst.stop())
    errors_before = errors()
    pod, ids = run_ls_pod(containerd, client)
    parent = pod.cgroup_parent
    direct = containerd.cri_client()

    # 1.25 at creation: 200000 -> 160000 and 100000 -> 80000; the pod is leveled to their sum.
    assert q.read_container_file(parent, ids["big"], "cpu.cfs_quota_us") == "160000"
    assert q.read_container_file(parent, ids["small"], "cpu.cfs_quota_us") == "80000"
    assert direct.container_status(ids["big"]).resources.linux.cpu_quota == 160000
    converge(parent, ids, {"big": 160000, "small": 80000}, "quotas and bursts at ratio 1.25")

    # A faster node model: 2.00. Containers shrink before their pod.
    write_node(tmp_path / "node.json", "2.00")
    converge(parent, ids, {"big": 100000, "small": 50000}, "quotas and bursts at ratio 2.00")
    q.wait_for(lambda: direct.container_status(ids["small"]).resources.linux.cpu_quota, 50000,
               what="containerd's view of the small container at 2.00")

    # Normalization off again: kubelet's quotas come back, the pod grows before its containers.
    write_node(tmp_path / "node.json", "1.00")
    converge(parent, ids, {"big": 200000, "small": 100000}, "kubelet's quotas at ratio 1.00")
    q.wait_for(lambda: direct.container_status(ids["big"]).resources.linux.cpu_quota, 200000,
               what="containerd's view of the big container at 1.00")

    pod_quota = int(q.read_pod_file(parent, "cpu.cfs_quota_us"))
    for cid in ids.values():
        assert int(q.read_container_file(parent, cid, "cpu.cfs_quota_us")) <= pod_quota
        quota = int(q.read_container_file(parent, cid, "cpu.cfs_quota_us"))
        assert int(q.read_container_file(parent, cid, "cpu.cfs_burst_us")) <= quota
    assert errors() == errors_before, "a reconcile round failed to write (a child above its parent?)"
