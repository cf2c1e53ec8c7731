"""On real containerd: the reconciler of a real ``runtime-proxy serve``
process keeps running pods at the node config.

- Rewrite the node config file (NodeSLO ``cpuBurstStrategy.cpuBurstPercent``,
  ``resourceUsedThresholdWithBE.cpuSuppressPolicy`` and the NodeResourceTopology share pool)
  while LS and BE pods run: every affected pod and container cgroup file converges within one
  reconcile period, and the round after that finds nothing left to change.
- Change values by hand while the proxy is down (``kill -9``): the next proxy fixes them.

Only files this kernel has are asserted (``cpu.bvt_warp_ns`` is absent here; ``group_identity``
still runs and must not turn that into errors).
"""

from __future__ import annotations

import json
import os
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from rhp_devenv.cri import CriClient, PodHandle, linux_resources
from rhp_devenv.kube import free_port

from runtime_proxy.host.cgroups import v1_controller
from tests.integration.harness import ProxyProcess

pytestmark = pytest.mark.integration

CGROUP_ROOT = Path("/sys/fs/cgroup")
PERIOD = 3.0  # reconcilePeriodSeconds
MARGIN = 2.0  # a busy 2-core machine; the node config file itself is polled every second
PLUGINS = ("group_identity", "cpu_burst", "batch_resource", "cpuset")
TRANSPORTS = os.environ.get("RHP_RECONCILE_TRANSPORTS", "relay,grpc").split(",")

QOS = "koordinator.sh/qosClass"
EXTENDED_RESOURCE_SPEC = "node.koordinator.sh/extended-resource-spec"
SHARED_POOLS = "node.koordinator.sh/cpu-shared-pools"
BE_SPEC = {"containers": {"app": {
    "requests": {"kubernetes.io/batch-cpu": "500"},
    "limits": {"kubernetes.io/batch-cpu": "1000", "kubernetes.io/batch-memory": "256Mi"},
}}}
LS_QUOTA = 50000  # an LS container's limit: 0.5 CPU


@dataclass(frozen=True)
class Setting:
    """What the test varies in the node config."""

    burst_percent: int  # cpuBurstStrategy.cpuBurstPercent
    suppress: bool  # resourceUsedThresholdWithBE: CPU suppress by cfsQuota (batch quotas -1)
    pool: str  # the LS share pool (NodeResourceTopology cpu-shared-pools)

    def node_config(self) -> dict[str, Any]:
        return {
            "name": "rhp-reconcile-node",
            "nodeResourceTopology": {
                "annotations": {SHARED_POOLS: json.dumps([{"socket": 0, "node": 0, "cpuset": self.pool}])}
            },
            "nodeSLO": {
                "resourceQOSStrategy": {"lsClass": {"cpuQOS": {"enable": True}},
                                        "beClass": {"cpuQOS": {"enable": True}}},
                "cpuBurstStrategy": {"policy": "cpuBurstOnly", "cpuBurstPercent": self.burst_percent},
                "resourceUsedThresholdWithBE": {"enable": self.suppress, "cpuSuppressPolicy": "cfsQuota"},
            },
        }


def write_json(path: Path, doc: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1))
    tmp.replace(path)


def cgroup_file(cgroup: str, file: str) -> Path:
    return CGROUP_ROOT / v1_controller(file) / cgroup.strip("/") / file


def read(cgroup: str, file: str) -> str:
    return cgroup_file(cgroup, file).read_text().strip()


def wait_until(expected: Callable[[], dict[str, str]], deadline_s: float, what: str) -> float:
    """Poll until every ``(cgroup file -> wanted value)`` of ``expected()`` holds; the seconds it
    took. Fails with the files that still differ."""
    started = time.monotonic()
    while True:
        wrong = {}
        for key, want in expected().items():
            cgroup, _, file = key.rpartition(":")
            have = read(cgroup, file)
            if have != want:
                wrong[key] = f"{have} (want {want})"
        if not wrong:
            return time.monotonic() - started
        if time.monotonic() - started > deadline_s:
            pytest.fail(f"{what}: not converged after {deadline_s:.1f}s: {wrong}")
        time.sleep(0.05)


@dataclass
class Node:
    """The pods of one test: two LS and two BE pods, one container each."""

    ls: list[tuple[PodHandle, str]] = field(default_factory=list)
    be: list[tuple[PodHandle, str]] = field(default_factory=list)

    def container(self, pod: PodHandle, cid: str) -> str:
        return f"{pod.cgroup_parent}/{cid}"

    def expected(self, setting: Setting) -> dict[str, str]:
        """cgroup file ("<cgroup>:<file>") -> the value ``setting`` asks for."""
        burst = str(LS_QUOTA * setting.burst_percent // 100)
        be_quota = "-1" if setting.suppress else "100000"
        want: dict[str, str] = {}
        for pod, cid in self.ls:
            c = self.container(pod, cid)
            want[f"{c}:cpu.cfs_burst_us"] = burst
            want[f"{c}:cpuset.cpus"] = setting.pool
            want[f"{pod.cgroup_parent}:cpu.cfs_burst_us"] = burst
        for pod, cid in self.be:
            want[f"{self.container(pod, cid)}:cpu.cfs_quota_us"] = be_quota
            want[f"{self.container(pod, cid)}:cpu.shares"] = "512"
            want[f"{pod.cgroup_parent}:cpu.cfs_quota_us"] = be_quota
            want[f"{pod.cgroup_parent}:cpu.shares"] = "512"
        return want


@pytest.fixture(params=TRANSPORTS)
def transport(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def proxies(containerd: Any, tmp_path: Path, transport: str) -> Iterator[Callable[[str, int], ProxyProcess]]:
    """Factory ``start(name, metrics_port)``: a ``runtime-proxy serve`` process (log
    ``proxy-<name>.log``) with the plugins, node config file and reconcile period of this test;
    all are stopped at the end."""
    config = tmp_path / "proxy.yaml"
    config.write_text(json.dumps({
        "plugins": [{"name": name} for name in PLUGINS],
        "nodeConfigFile": str(tmp_path / "node.json"),
        "reconcilePeriodSeconds": PERIOD,
    }))
    listen = str(tmp_path / "proxy.sock")
    args = ["--backend", str(containerd.socket), "--config", str(config), "--transport", transport,
            "--no-entry-points", "--hook-server-dir", str(tmp_path / "hookserver.d"), "--grace", "2"]
    started: list[ProxyProcess] = []

    def start(name: str, metrics_port: int) -> ProxyProcess:
        extra = ["--metrics-addr", f"127.0.0.1:{metrics_port}"]
        proc = ProxyProcess([*args, *extra], log=tmp_path / f"proxy-{name}.log").start(listen)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.proc is not None and proc.proc.poll() is None:
            proc.terminate(timeout=10)


def run_pods(containerd: Any, client: CriClient) -> Node:
    node = Node()
    for _ in range(2):
        pod = client.run_pod(cgroup_parent=containerd.new_cgroup_parent("burstable"), labels={QOS: "LS"})
        cid = client.run_container(pod, name="app", resources=linux_resources(cpu_shares=512, cpu_quota=LS_QUOTA))
        node.ls.append((pod, cid))
    for _ in range(2):
        pod = client.run_pod(cgroup_parent=containerd.new_cgroup_parent("besteffort"), labels={QOS: "BE"},
                             annotations={EXTENDED_RESOURCE_SPEC: json.dumps(BE_SPEC)})
        cid = client.run_container(pod, name="app", resources=linux_resources(cpu_shares=2))
        node.be.append((pod, cid))
    return node


def metrics(port: int) -> dict[str, float]:
    """The proxy's reconcile metrics: rounds started (``runs``) and finished (``done``), drift
    and errors found so far (each summed over its labels)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    out = {"runs": 0.0, "done": 0.0, "drift": 0.0, "errors": 0.0}
    names = {"rhp_reconcile_runs_total": "runs", "rhp_reconcile_duration_seconds_count": "done",
             "rhp_reconcile_drift_total": "drift", "rhp_reconcile_errors_total": "errors"}
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in names:
            out[names[name]] += float(line.rsplit(" ", 1)[1])
    return out


def wait_metrics(port: int, ok: Callable[[dict[str, float]], bool], deadline_s: float, what: str) -> dict[str, float]:
    """Poll the metrics until ``ok`` holds; the metrics then."""
    started = time.monotonic()
    while True:
        found = metrics(port)
        if ok(found):
            return found
        if time.monotonic() - started > deadline_s:
            pytest.fail(f"{what}: not seen within {deadline_s:.1f}s (last: {found})")
        time.sleep(0.05)


def test_nodeslo_change_converges_within_one_period_and_restart_fixes_hand_edits(
    containerd: Any, cri_client: Any, tmp_path: Path, proxies: Callable[[str, int], ProxyProcess]
) -> None:
    node_file = tmp_path / "node.json"
    before = Setting(burst_percent=50, suppress=False, pool="0-1")
    after = Setting(burst_percent=80, suppress=True, pool="1")
    write_json(node_file, before.node_config())
    first_port = free_port()
    first = proxies("first", first_port)
    node = run_pods(containerd, cri_client(str(tmp_path / "proxy.sock")))
    # the hooks at create time and the rounds since give the "before" state
    wait_until(lambda: node.expected(before), PERIOD + MARGIN, "initial state")

    # (a) a new NodeSLO while the pods run: everything converges within one period
    write_json(node_file, after.node_config())
    took = wait_until(lambda: node.expected(after), PERIOD + MARGIN, "after the NodeSLO change")
    # ... and stays: once no round is in flight, the next (periodic) round finds nothing to change
    settled = wait_metrics(first_port, lambda m: m["runs"] == m["done"], MARGIN, "no round in flight")
    later = wait_metrics(first_port, lambda m: m["done"] > settled["done"], PERIOD + MARGIN, "the next round")
    assert later["drift"] == settled["drift"], f"drift after convergence (converged in {took:.2f}s)"
    assert later["errors"] == 0

    # (b) kill -9, change values by hand, start a new proxy: it fixes them
    first.kill9()
    (ls_pod, ls_cid), (be_pod, be_cid) = node.ls[0], node.be[0]
    hand = {
        f"{node.container(ls_pod, ls_cid)}:cpu.cfs_burst_us": "1000",
        f"{node.container(ls_pod, ls_cid)}:cpuset.cpus": "0",
        f"{ls_pod.cgroup_parent}:cpu.cfs_burst_us": "0",
        f"{be_pod.cgroup_parent}:cpu.shares": "2",
        f"{node.container(be_pod, be_cid)}:cpu.cfs_quota_us": "20000",
    }
    for key, value in hand.items():
        cgroup, _, file = key.rpartition(":")
        cgroup_file(cgroup, file).write_text(value)
        assert read(cgroup, file) == value
    proxies("second", free_port())
    wait_until(lambda: node.expected(after), PERIOD + MARGIN, "after the restart")
