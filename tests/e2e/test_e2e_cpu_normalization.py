"""CPU normalization end to end on the real cluster (issue 38 item 3): the node reports its CPU
basic info, the manager chooses the ratio, the node applies it.

- ``runtime-proxy serve`` restarted with ``fromCluster: true``, reporting on (``report.enable``,
  this machine's real ``/sys`` and ``/proc``) and the ``cpu_normalization`` plugin, under the
  identity and RBAC of packaging/kustomize (base/node and components/report); the session's
  hand-written NodeResourceTopology is deleted first, so the one read is the one our node wrote;
- ``scheduler-ext manager`` under packaging/kustomize/base/manager/rbac.yaml, reading
  slo-controller-config's ``cpu-normalization-config`` with a ratio model keyed by this
  machine's CPU model (``/proc/cpuinfo``'s ``model name``).

Read back through the API server and the cgroup files: the NodeResourceTopology carries
``node.koordinator.sh/cpu-basic-info`` with this machine's model; the Node gets
``node.koordinator.sh/cpu-normalization-ratio`` "2.00"; an LS pod limited to 1 CPU starts with
``cpu.cfs_quota_us`` 50000; changing the config to 1.25 moves the annotation and the quota to
80000, and disabling it writes "1.00" and gives the pod back kubelet's 100000. Nothing here
depends on the runtime: it runs on the containerd 2.1 stack only. Afterwards the session's
proxy, NodeResourceTopology and objects are put back.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from rhp_devenv.kube import NODE_NAME, Cluster

from koord_formats import keys
from tests.e2e.conftest import Stack, container_id, node_topology, pod_cgroup, pod_manifest
from tests.integration import qos_helpers as q
from tests.integration.harness import REPO

CRDS = REPO / "packaging" / "crds"
NODE_RBAC = REPO / "packaging" / "kustomize" / "base" / "node" / "rbac.yaml"
REPORT_RBAC = REPO / "packaging" / "kustomize" / "components" / "report" / "rbac.yaml"
MANAGER_RBAC = REPO / "packaging" / "kustomize" / "base" / "manager" / "rbac.yaml"
NODE_USER = "system:serviceaccount:kube-system:runtime-hook-proxy-node"
MANAGER_USER = "system:serviceaccount:koordinator-system:rhp-manager"
NAMESPACE = "koordinator-system"
MANAGER = "manager-norm"
LEASE = "rhp-manager"
RATIO = keys.NODE_ANNOTATION_CPU_NORMALIZATION_RATIO


def this_cpu_model() -> str:
    """The first ``model name`` of /proc/cpuinfo, read here independently of the product."""
    with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                return value.strip()
    pytest.skip("this machine's /proc/cpuinfo names no CPU model")


def slo_config(model: str, ratio: float, *, enable: bool = True) -> dict[str, Any]:
    ratios = {name: ratio for name in ("baseRatio", "hyperThreadEnabledRatio", "turboEnabledRatio",
                                       "hyperThreadTurboEnabledRatio")}
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "slo-controller-config", "namespace": NAMESPACE},
            "data": {"cpu-normalization-config": json.dumps({"enable": enable, "ratioModel": {model: ratios}})}}


def node_ratio(cluster: Cluster) -> str | None:
    node = cluster.get_json("node", NODE_NAME) or {}
    value = node.get("metadata", {}).get("annotations", {}).get(RATIO)
    return str(value) if value is not None else None


@pytest.fixture(scope="module")
def normalizing(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    if stack.ctrd.version != "2.1":
        pytest.skip("CPU normalization does not depend on the runtime: checked on containerd 2.1")
    cluster = stack.cluster
    cluster.apply(*(p.read_text() for p in sorted(CRDS.glob("*.yaml")) if p.name != "kustomization.yaml"))
    for p in sorted(CRDS.glob("*.yaml")):
        if p.name != "kustomization.yaml":
            cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                            f"crd/{yaml.safe_load(p.read_text())['metadata']['name']}")
    cluster.apply(NODE_RBAC.read_text(), REPORT_RBAC.read_text(), MANAGER_RBAC.read_text())
    cluster.kubectl("delete", "noderesourcetopology", NODE_NAME, "--ignore-not-found")
    groups = ("system:serviceaccounts", "system:serviceaccounts:kube-system")
    node_kubeconfig = cluster.kubeconfig_for("rhp-node-norm", user=NODE_USER, groups=groups)
    hooks: Path = tmp_path_factory.mktemp("hookserver-norm")
    config = {
        "plugins": [{"name": "cpu_normalization"}],
        "fromCluster": True,
        "nodeName": NODE_NAME,
        "hookServerDir": str(hooks),
        "cgroupDriver": "cgroupfs",
        "reconcilePeriodSeconds": 2,
        "report": {"enable": True, "sysRoot": "/sys", "procRoot": "/proc", "kubeletConfigFile": "",
                   "intervalSeconds": 2},
    }
    cluster.apply(slo_config(this_cpu_model(), 2.0))
    manager_groups = ("system:serviceaccounts", f"system:serviceaccounts:{NAMESPACE}")
    manager_kubeconfig = cluster.kubeconfig_for("rhp-manager-norm", user=MANAGER_USER, groups=manager_groups)
    try:
        stack.restart_proxy_with_config(config, "cpu-normalization", env={"KUBECONFIG": str(node_kubeconfig)})
        cluster.spawn(MANAGER, [sys.executable, "-m", "scheduler_ext.entry", "manager",
                                f"--kubeconfig={manager_kubeconfig}", "--identity=norm", "--resync-seconds=2",
                                "--log-format=json"], env={"PYTHONPATH": str(REPO)})  # fmt: skip
        yield stack
    finally:
        cluster.stop_process(MANAGER)
        stack.restart_proxy()
        cluster.kubectl("annotate", "node", NODE_NAME, f"{RATIO}-", check=False)
        for kind in ("nodemetric", "nodeslo", "device"):
            cluster.kubectl("delete", kind, NODE_NAME, "--ignore-not-found", check=False)
        cluster.kubectl("delete", "configmap", "slo-controller-config", "-n", NAMESPACE, "--ignore-not-found",
                        check=False)  # fmt: skip
        cluster.kubectl("delete", "lease", LEASE, "-n", NAMESPACE, "--ignore-not-found", check=False)
        cluster.kubectl("delete", "noderesourcetopology", NODE_NAME, "--ignore-not-found", check=False)
        cluster.apply(node_topology())


def test_a_config_change_moves_the_ratio_and_the_cfs_quota_of_an_ls_pod(normalizing: Stack, ns: str) -> None:
    cluster = normalizing.cluster
    model = this_cpu_model()

    def reported_info() -> dict[str, Any] | None:
        cluster.check_alive(MANAGER)
        nrt = cluster.get_json("noderesourcetopology", NODE_NAME) or {}
        text = nrt.get("metadata", {}).get("annotations", {}).get(keys.NODE_ANNOTATION_CPU_BASIC_INFO)
        return json.loads(text) if text else None

    info = cluster.wait_for(reported_info, what="cpu-basic-info in the NodeResourceTopology our node reports",
                            timeout=90)  # fmt: skip
    assert info["cpuModel"] == model
    smt = Path("/sys/devices/system/cpu/smt/active")
    if smt.exists():
        assert bool(info.get("hyperThreadEnabled")) == (smt.read_text().strip() == "1")

    def ratio_is(want: str) -> bool:
        cluster.check_alive(MANAGER)
        return node_ratio(cluster) == want

    cluster.wait_for(lambda: ratio_is("2.00"), what="the ratio 2.00 on the Node", timeout=90, log=MANAGER)
    cluster.apply(pod_manifest("ls", ns, qos="LS", requests={"cpu": "100m", "memory": "32Mi"}, limits={"cpu": "1"}))
    pod = cluster.wait_pod_running(ns, "ls")

    def quota() -> str:
        return q.read_container_file(pod_cgroup(pod), container_id(pod), "cpu.cfs_quota_us")

    q.wait_for(quota, "50000", what="the LS container's quota at ratio 2.00 (100000 / 2)", timeout=60)

    cluster.apply(slo_config(model, 1.25))
    cluster.wait_for(lambda: ratio_is("1.25"), what="the ratio 1.25 after the config change", timeout=60,
                     log=MANAGER)  # fmt: skip
    q.wait_for(quota, "80000", what="the quota at ratio 1.25 (100000 / 1.25)", timeout=60)

    cluster.apply(slo_config(model, 1.25, enable=False))
    cluster.wait_for(lambda: ratio_is("1.00"), what="the ratio 1.00 with normalization disabled", timeout=60,
                     log=MANAGER)  # fmt: skip
    q.wait_for(quota, "100000", what="kubelet's quota back with normalization off", timeout=60)
