"""The node reports its node on the real cluster (``report.enable``, runtime_proxy/report/):
every CRD of packaging/crds/ applied to the real API server; ``runtime-proxy serve`` restarted
with reporting on, under the identity and RBAC of packaging/kustomize (base/node and
components/report), with a prepared sysfs (this machine's CPUs and NUMA nodes, and one NVIDIA
GPU with the driver's files); the session's hand-written NodeResourceTopology deleted first.

Read back through the API server: the NodeResourceTopology our node wrote (this machine's CPU
topology, zones, kubelet's policy), the Device with the GPU, and the NodeMetric status (the
NodeMetric created here, as the manager would). Then an LSR pod is scheduled by the real
kube-scheduler and scheduler-ext, which allocates its exact CPU from the topology our node
reported, and runs on it. Afterwards the session's proxy, NRT and objects are put back.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from rhp_devenv.kube import NODE_NAME

from hooks.facts import format_cpu_list, parse_cpu_list
from koord_formats import keys
from koord_formats.nodemetric import parse_node_metric_status
from koord_formats.topology import parse_cpu_topology
from runtime_proxy.state.sysfs import read_cpu_topology
from scheduler_ext.topology import parse_gpu_devices
from tests.e2e.conftest import Stack, container_id, node_topology, pod_cgroup, pod_manifest
from tests.fake_sysfs import add_nvidia_gpu, copy_machine
from tests.integration import qos_helpers as q
from tests.integration.harness import REPO

CRDS = REPO / "packaging" / "crds"
NODE_RBAC = REPO / "packaging" / "kustomize" / "base" / "node" / "rbac.yaml"
REPORT_RBAC = REPO / "packaging" / "kustomize" / "components" / "report" / "rbac.yaml"
NODE_USER = "system:serviceaccount:kube-system:runtime-hook-proxy-node"
GPU_UUID = "GPU-6c3f3a0e-94a1-4e0b-b3a4-0d6a7e1f2b3c"
GiB = 1 << 30


def _crd_names() -> list[str]:
    return [yaml.safe_load(p.read_text())["metadata"]["name"] for p in sorted(CRDS.glob("*.yaml"))
            if p.name != "kustomization.yaml"]  # fmt: skip


@pytest.fixture
def reporting(stack: Stack, tmp_path: Path) -> Iterator[Stack]:
    if stack.ctrd.version != "2.1":
        pytest.skip("reporting does not depend on the runtime: checked on containerd 2.1")
    cluster = stack.cluster
    cluster.apply(*(p.read_text() for p in sorted(CRDS.glob("*.yaml")) if p.name != "kustomization.yaml"))
    for name in _crd_names():
        cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", f"crd/{name}")
    cluster.apply(NODE_RBAC.read_text(), REPORT_RBAC.read_text())
    kubeconfig = cluster.kubeconfig_for("rhp-node-report", user=NODE_USER, groups=("system:serviceaccounts",))
    sys_root, proc_root = tmp_path / "sys", tmp_path / "proc"
    copy_machine(sys_root)
    add_nvidia_gpu(sys_root, proc_root, "0000:3b:00.0", minor=0, uuid=GPU_UUID, numa=0)
    # The manager's part: the NodeMetric with its collect policy (the node only writes status).
    cluster.apply({"apiVersion": "slo.koordinator.sh/v1alpha1", "kind": "NodeMetric", "metadata": {"name": NODE_NAME},
                   "spec": {"metricCollectPolicy": {"aggregateDurationSeconds": 60, "reportIntervalSeconds": 5,
                                                    "nodeAggregatePolicy": {"durations": ["1m0s"]}}}})
    cluster.kubectl("delete", "noderesourcetopology", NODE_NAME, "--ignore-not-found")
    config = yaml.safe_load((stack.work / "proxy-config.yaml").read_text())
    config["nodeName"] = NODE_NAME
    config["report"] = {"enable": True, "sysRoot": str(sys_root), "procRoot": str(proc_root), "kubeletConfigFile": "",
                        "intervalSeconds": 2, "nodeMetricMinIntervalSeconds": 3, "gpuMemoryBytes": 16 * GiB}
    path = tmp_path / "report-config.yaml"
    path.write_text(yaml.safe_dump(config))
    args = list(stack.proxy_args)
    args[args.index("--config") + 1] = str(path)
    try:
        stack.restart_proxy(args=args, env={"KUBECONFIG": str(kubeconfig)})
        yield stack
    finally:
        stack.restart_proxy()
        for kind in ("device", "nodemetric"):
            cluster.kubectl("delete", kind, NODE_NAME, "--ignore-not-found", check=False)
        cluster.kubectl("delete", "noderesourcetopology", NODE_NAME, "--ignore-not-found", check=False)
        cluster.apply(node_topology())


def _reported_nrt(stack: Stack) -> dict[str, Any] | None:
    nrt = stack.cluster.get_json("noderesourcetopology", NODE_NAME)
    if nrt is None or keys.NODE_ANNOTATION_CPU_TOPOLOGY not in nrt["metadata"].get("annotations", {}):
        return None
    return nrt


def test_the_node_reports_topology_gpus_and_metrics_and_the_extender_binds_from_them(reporting: Stack,
                                                                                     ns: str) -> None:
    cluster = reporting.cluster
    nrt = cluster.wait_for(lambda: _reported_nrt(reporting), what="the NodeResourceTopology our node reports",
                           timeout=90)
    annotations = nrt["metadata"]["annotations"]
    topo = read_cpu_topology()
    assert parse_cpu_topology(annotations[keys.NODE_ANNOTATION_CPU_TOPOLOGY]) == topo
    assert json.loads(annotations[keys.NODE_ANNOTATION_KUBELET_CPU_MANAGER_POLICY]) == {"policy": "none"}
    assert nrt["topologyPolicies"] == ["None"]
    assert [z["name"] for z in nrt["zones"]] == [f"node-{n}" for n in topo.numa_nodes]
    node = cluster.get_json("node", NODE_NAME)
    assert node is not None
    assert nrt["metadata"]["ownerReferences"][0]["uid"] == node["metadata"]["uid"]

    device = cluster.wait_for(lambda: cluster.get_json("device", NODE_NAME), what="the Device with the GPU", timeout=60)
    (gpu,) = parse_gpu_devices(device["spec"])
    assert (gpu.minor, gpu.id, gpu.memory, gpu.numa, gpu.pcie, gpu.bus_id) == (
        0, GPU_UUID, 16 * GiB, 0, "pci0000:3a", "0000:3b:00.0")

    def reported_metric() -> Any:
        obj = cluster.get_json("nodemetric", NODE_NAME) or {}
        status = parse_node_metric_status(obj.get("status"))
        return status if status.node_usage.cpu_milli is not None else None

    status = cluster.wait_for(reported_metric, what="the NodeMetric status", timeout=90)
    assert status.update_time and status.node_usage.memory_bytes
    assert [a.duration_seconds for a in status.aggregated_node_usages] == [60]

    # The extender allocates from the topology our node reported (no hand-written NRT).
    cluster.apply(pod_manifest("lsr", ns, qos="LSR", requests={"cpu": "1", "memory": "32Mi"},
                               limits={"cpu": "1", "memory": "32Mi"}))  # fmt: skip
    pod = cluster.wait_pod_running(ns, "lsr")
    assert pod["spec"]["nodeName"] == NODE_NAME
    bound = parse_cpu_list(json.loads(pod["metadata"]["annotations"][q.RESOURCE_STATUS])["cpuset"])
    assert len(bound) == 1 and bound <= topo.cpus
    assert q.read_container_file(pod_cgroup(pod), container_id(pod), "cpuset.cpus") == format_cpu_list(bound)

    # The bound LSR CPU leaves the LS share pool our node reports.
    def pool_without_it() -> bool:
        current = _reported_nrt(reporting) or {}
        pools = json.loads(current.get("metadata", {}).get("annotations", {}).get(
            keys.NODE_ANNOTATION_CPU_SHARED_POOLS, "[]"))
        shared = set().union(*(parse_cpu_list(p["cpuset"]) for p in pools)) if pools else set()
        return bool(shared) and not (bound & shared)

    cluster.wait_for(pool_without_it, what="the LS share pool without the bound CPU", timeout=60)
