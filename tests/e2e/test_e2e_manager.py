"""``scheduler-ext manager`` on the real cluster: two replicas (one Lease, one writer) read
slo-controller-config, create the node's NodeMetric with its collect policy and its NodeSLO,
and, from a NodeMetric status written here (the node agent's job), publish
``kubernetes.io/batch-cpu`` and ``batch-memory`` in the Node's status; a BE pod requesting them
is scheduled by the real kube-scheduler and started by kubelet with the batch cgroup values.
When the leader stops, the other replica takes the Lease and, once the metric is stale,
removes the batch resources (degrade); a NUMA zone of the node's NodeResourceTopology gets its
batch values beside what the node agent wrote there. The pod webhook, registered with the real API server on
127.0.0.1: a pod created in a namespace it serves and matching a ClusterColocationProfile
becomes a BE pod with batch resources and runs; a pod with batch resources but no QoS BE is
refused.

Runs on the containerd 2.1 stack only (nothing here depends on the runtime), under the identity
and RBAC of packaging/kustomize/base/manager/rbac.yaml.
"""

from __future__ import annotations

import base64
import json
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from rhp_devenv.kube import NODE_NAME, Cluster, Pki, free_port

from tests.e2e.conftest import Stack, container_id, pod_cgroup, pod_manifest
from tests.integration import qos_helpers as q
from tests.integration.harness import REPO

NODESLO_CRD = REPO / "packaging" / "crds" / "nodeslo.yaml"
NODEMETRIC_CRD = REPO / "packaging" / "crds" / "nodemetric.yaml"
PROFILE_CRD = REPO / "packaging" / "crds" / "clustercolocationprofile.yaml"
MANAGER_RBAC = REPO / "packaging" / "kustomize" / "base" / "manager" / "rbac.yaml"
MANAGER_USER = "system:serviceaccount:koordinator-system:rhp-manager"
NAMESPACE = "koordinator-system"
LEASE = "rhp-manager"
REPLICAS = ("manager-a", "manager-b")
BATCH_CPU, BATCH_MEMORY = "kubernetes.io/batch-cpu", "kubernetes.io/batch-memory"
MiB = 1 << 20

# Used when packaging/crds has no NodeMetric manifest yet: group, kind, scope and the status
# subresource as Koordinator's CRD has them.
FALLBACK_NODEMETRIC_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "nodemetrics.slo.koordinator.sh"},
    "spec": {
        "group": "slo.koordinator.sh",
        "scope": "Cluster",
        "names": {"plural": "nodemetrics", "singular": "nodemetric", "kind": "NodeMetric",
                  "listKind": "NodeMetricList"},
        "versions": [{
            "name": "v1alpha1", "served": True, "storage": True, "subresources": {"status": {}},
            "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
        }],
    },
}  # fmt: skip

FALLBACK_PROFILE_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "clustercolocationprofiles.config.koordinator.sh"},
    "spec": {
        "group": "config.koordinator.sh",
        "scope": "Cluster",
        "names": {"plural": "clustercolocationprofiles", "singular": "clustercolocationprofile",
                  "kind": "ClusterColocationProfile", "listKind": "ClusterColocationProfileList"},
        "versions": [{
            "name": "v1alpha1", "served": True, "storage": True, "subresources": {"status": {}},
            "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
        }],
    },
}  # fmt: skip
# Only pods of namespaces with this label go through the webhook (the other tests' do not).
SERVED = {"rhp-e2e-colocation": "on"}
WEBHOOK = "colocation.rhp-e2e.runtime-hook-proxy.io"

CONFIG = {
    "apiVersion": "v1",
    "kind": "ConfigMap",
    "metadata": {"name": "slo-controller-config", "namespace": NAMESPACE},
    "data": {
        "colocation-config": json.dumps({"enable": True, "metricReportIntervalSeconds": 30}),
        "resource-threshold-config": json.dumps({"clusterStrategy": {"enable": True,
                                                                     "cpuSuppressThresholdPercent": 55}}),
    },
}


def rfc3339(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def write_metric(cluster: Cluster, update_time: float) -> None:
    """What the node agent reports: a NodeMetric status with node and system usage, no pods."""
    status = {"updateTime": rfc3339(update_time),
              "nodeMetric": {"nodeUsage": {"resources": {"cpu": "300m", "memory": "300Mi"}},
                             "systemUsage": {"resources": {"cpu": "100m", "memory": "100Mi"}}}}
    cluster.kubectl("patch", "nodemetric", NODE_NAME, "--subresource=status", "--type=merge",
                    "-p", json.dumps({"status": status}))  # fmt: skip


def published(cluster: Cluster) -> dict[str, str]:
    node = cluster.get_json("node", NODE_NAME) or {}
    alloc = node.get("status", {}).get("allocatable", {})
    cap = node.get("status", {}).get("capacity", {})
    return {k: v for k, v in alloc.items() if k in (BATCH_CPU, BATCH_MEMORY) and cap.get(k) == v}


def holder(cluster: Cluster) -> str:
    lease = cluster.get_json("lease", LEASE, namespace=NAMESPACE) or {}
    return str(lease.get("spec", {}).get("holderIdentity") or "")


@pytest.fixture(scope="module")
def managers(stack: Stack) -> Iterator[Stack]:
    if stack.ctrd.version != "2.1":
        pytest.skip("the manager does not depend on the runtime: checked on containerd 2.1")
    cluster = stack.cluster
    cluster.apply(MANAGER_RBAC.read_text(), NODESLO_CRD.read_text(),
                  NODEMETRIC_CRD.read_text() if NODEMETRIC_CRD.exists() else FALLBACK_NODEMETRIC_CRD)
    for crd in ("nodeslos", "nodemetrics"):
        cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", f"crd/{crd}.slo.koordinator.sh")
    cluster.apply(CONFIG)
    cluster.apply(PROFILE_CRD.read_text() if PROFILE_CRD.exists() else FALLBACK_PROFILE_CRD)
    cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                    "crd/clustercolocationprofiles.config.koordinator.sh")
    pki = Pki(cluster.work_dir / "manager-webhook-pki")
    ca = pki.ca("manager-webhook-ca")
    serving = pki.issue(ca, "manager-webhook", cn="rhp-manager", ips=("127.0.0.1",), server=True, client=False)
    port = free_port()
    groups = ("system:serviceaccounts", f"system:serviceaccounts:{NAMESPACE}")
    kubeconfig = cluster.kubeconfig_for("rhp-manager", user=MANAGER_USER, groups=groups)
    for name in REPLICAS:
        webhook = [f"--webhook-listen=127.0.0.1:{port}", f"--webhook-cert={serving.cert}",
                   f"--webhook-key={serving.key}"] if name == REPLICAS[0] else []
        cluster.spawn(name, [sys.executable, "-m", "scheduler_ext.entry", "manager", f"--kubeconfig={kubeconfig}",
                             f"--identity={name}", "--resync-seconds=2", "--log-format=json", *webhook],
                      env={"PYTHONPATH": str(REPO)})  # fmt: skip
    bundle = base64.b64encode(ca.cert.read_bytes()).decode()
    rules = [{"operations": ["CREATE", "UPDATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}]

    def hook(path: str) -> dict[str, Any]:
        return {"name": WEBHOOK, "clientConfig": {"url": f"https://127.0.0.1:{port}{path}", "caBundle": bundle},
                "rules": rules, "namespaceSelector": {"matchLabels": SERVED}, "admissionReviewVersions": ["v1"],
                "sideEffects": "None", "failurePolicy": "Fail", "timeoutSeconds": 10}

    cluster.apply(
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
         "metadata": {"name": WEBHOOK}, "webhooks": [hook("/mutate-pod")]},
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
         "metadata": {"name": WEBHOOK}, "webhooks": [hook("/validate-pod")]},
        {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": "koord-batch"},
         "value": 5000, "preemptionPolicy": "PreemptLowerPriority"},
    )  # fmt: skip
    try:
        yield stack
    finally:
        for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
            cluster.kubectl("delete", kind, WEBHOOK, "--ignore-not-found", check=False)
        cluster.kubectl("delete", "clustercolocationprofile", "spark-be", "--ignore-not-found", check=False)
        for name in REPLICAS:
            cluster.stop_process(name)
        for kind in ("nodemetric", "nodeslo"):
            cluster.kubectl("delete", kind, NODE_NAME, "--ignore-not-found", check=False)
        cluster.kubectl("delete", "configmap", "slo-controller-config", "-n", NAMESPACE, "--ignore-not-found",
                        check=False)  # fmt: skip
        cluster.kubectl("delete", "lease", LEASE, "-n", NAMESPACE, "--ignore-not-found", check=False)
        gone = {BATCH_CPU: None, BATCH_MEMORY: None}
        cluster.kubectl("patch", "node", NODE_NAME, "--subresource=status", "--type=merge",
                        "-p", json.dumps({"status": {"capacity": gone, "allocatable": gone}}), check=False)  # fmt: skip


def _alive(cluster: Cluster) -> None:
    for name in REPLICAS:
        cluster.check_alive(name)


def wait_batch(cluster: Cluster) -> dict[str, str]:
    def batch() -> dict[str, str] | None:
        _alive(cluster)
        values = published(cluster)
        return values if len(values) == 2 else None

    return cluster.wait_for(batch, what="batch resources on the Node", timeout=60, log=REPLICAS[0])


def test_a_pod_matching_a_colocation_profile_becomes_a_be_pod_and_runs(managers: Stack, ns: str) -> None:
    cluster = managers.cluster
    cluster.kubectl("label", "namespace", ns, *(f"{k}={v}" for k, v in SERVED.items()))
    cluster.apply({"apiVersion": "config.koordinator.sh/v1alpha1", "kind": "ClusterColocationProfile",
                   "metadata": {"name": "spark-be"},
                   "spec": {"namespaceSelector": {"matchLabels": SERVED}, "selector": {"matchLabels": {"app": "spark"}},
                            "qosClass": "BE", "priorityClassName": "koord-batch", "koordinatorPriority": 1000,
                            "labels": {"colocated-by": "rhp-e2e"}}})  # fmt: skip
    cluster.wait_for(lambda: cluster.get_json("nodemetric", NODE_NAME), what="the NodeMetric", timeout=90,
                     log=REPLICAS[0])  # fmt: skip
    write_metric(cluster, time.time())
    wait_batch(cluster)
    spark = pod_manifest("spark", ns, requests={"cpu": "500m", "memory": "128Mi"},
                         limits={"cpu": "500m", "memory": "128Mi"})  # fmt: skip
    spark["metadata"]["labels"] = {"app": "spark"}

    def mutated() -> dict[str, Any] | None:  # the webhook's watch has the profile once a dry run shows it
        _alive(cluster)
        proc = cluster.kubectl("create", "--dry-run=server", "-o", "json", "-f", "-", input=json.dumps(spark),
                               check=False)  # fmt: skip
        if proc.returncode != 0:
            return None
        obj: dict[str, Any] = json.loads(proc.stdout)
        return obj if obj["metadata"]["labels"].get("koordinator.sh/qosClass") == "BE" else None

    cluster.wait_for(mutated, what="the webhook applying the profile", timeout=60, log=REPLICAS[0])
    cluster.apply(spark)
    pod = cluster.wait_pod_running(ns, "spark")
    assert pod["metadata"]["labels"]["koordinator.sh/qosClass"] == "BE"
    assert pod["metadata"]["labels"]["koordinator.sh/priority"] == "1000"
    assert pod["metadata"]["labels"]["colocated-by"] == "rhp-e2e"
    assert (pod["spec"]["priorityClassName"], pod["spec"]["priority"]) == ("koord-batch", 5000)
    resources = pod["spec"]["containers"][0]["resources"]
    assert resources == {"requests": {BATCH_CPU: "500", BATCH_MEMORY: "128Mi"},
                         "limits": {BATCH_CPU: "500", BATCH_MEMORY: "128Mi"}}
    assert pod["status"]["qosClass"] == "BestEffort"
    expect = {"cpu.shares": "512", "cpu.cfs_quota_us": "50000", "memory.limit_in_bytes": str(128 * MiB)}
    assert {f: q.read_container_file(pod_cgroup(pod), container_id(pod), f) for f in expect} == expect

    sneaky = pod_manifest("sneaky", ns, requests={BATCH_CPU: "500"}, limits={BATCH_CPU: "500"})
    refused = cluster.kubectl("create", "-f", "-", input=json.dumps(sneaky), check=False)
    assert refused.returncode != 0
    assert "must specify koordinator QoS BE" in refused.stderr


def test_manager_publishes_batch_resources_a_be_pod_runs_on_them_and_a_stale_metric_removes_them(
    managers: Stack, ns: str
) -> None:
    cluster = managers.cluster

    def node_metric_spec() -> dict[str, Any] | None:
        _alive(cluster)
        obj = cluster.get_json("nodemetric", NODE_NAME)
        return obj.get("spec") if obj else None

    spec = cluster.wait_for(node_metric_spec, what="the NodeMetric the manager creates", timeout=90,
                            log=REPLICAS[0])  # fmt: skip
    assert spec["metricCollectPolicy"]["reportIntervalSeconds"] == 30, "the colocation-config's collect policy"
    assert spec["metricCollectPolicy"]["nodeAggregatePolicy"]["durations"] == ["5m0s", "10m0s", "30m0s"]
    slo = cluster.wait_for(lambda: cluster.get_json("nodeslo", NODE_NAME), what="the NodeSLO the manager creates")
    threshold = slo["spec"]["resourceUsedThresholdWithBE"]
    assert (threshold["enable"], threshold["cpuSuppressThresholdPercent"]) == (True, 55)
    assert slo["spec"]["cpuBurstStrategy"]["policy"] == "none", "a key the config does not set: the default"
    assert holder(cluster) in REPLICAS

    write_metric(cluster, time.time())
    values = wait_batch(cluster)
    node = cluster.get_json("node", NODE_NAME) or {}
    capacity_milli = int(float(node["status"]["capacity"]["cpu"]) * 1000)
    assert 500 <= int(values[BATCH_CPU]) <= capacity_milli * 60 // 100 - 100, values
    assert int(values[BATCH_MEMORY]) >= 128 * MiB, values

    # NUMA zones of the node's NodeResourceTopology get their batch values too (the real CRD
    # takes the manager's merge patch of zones); the shared topology's zones come back after.
    before = (cluster.get_json("noderesourcetopology", NODE_NAME) or {}).get("zones", [])
    zone = {"name": "node-0", "type": "Node", "resources": [
        {"name": "cpu", "capacity": "2", "allocatable": "2", "available": "2"},
        {"name": "memory", "capacity": "4Gi", "allocatable": "4Gi", "available": "4Gi"}]}
    cluster.kubectl("patch", "noderesourcetopology", NODE_NAME, "--type=merge", "-p", json.dumps({"zones": [zone]}))
    try:
        def zone_batch() -> dict[str, Any] | None:
            _alive(cluster)
            zones = (cluster.get_json("noderesourcetopology", NODE_NAME) or {}).get("zones", [])
            res = {r["name"]: r for z in zones if z["name"] == "node-0" for r in z.get("resources", [])}
            return res if BATCH_CPU in res and BATCH_MEMORY in res else None

        res = cluster.wait_for(zone_batch, what="batch values in the NUMA zone", timeout=60, log=REPLICAS[0])
        assert {"cpu", "memory"} <= set(res), "the node agent's resources are kept"
        cpu = res[BATCH_CPU]
        assert cpu["capacity"] == cpu["allocatable"] == cpu["available"]
        assert 0 <= int(cpu["allocatable"]) <= 2000 * 60 // 100
    finally:
        cluster.kubectl("patch", "noderesourcetopology", NODE_NAME, "--type=merge", "-p",
                        json.dumps({"zones": before}))  # fmt: skip

    be_resources = {BATCH_CPU: "500", BATCH_MEMORY: "128Mi"}
    spec_annotation = q.extended_resource_spec({"app": {"requests": be_resources, "limits": be_resources}})
    cluster.apply(pod_manifest("be", ns, qos="BE", annotations={q.EXTENDED_RESOURCE_SPEC: spec_annotation},
                               requests=be_resources, limits=be_resources))  # fmt: skip
    be_pod = cluster.wait_pod_running(ns, "be")
    assert be_pod["spec"]["nodeName"] == NODE_NAME, "scheduled by kube-scheduler"
    expect = {"cpu.shares": "512", "cpu.cfs_quota_us": "50000", "memory.limit_in_bytes": str(128 * MiB)}
    assert {f: q.read_container_file(pod_cgroup(be_pod), container_id(be_pod), f) for f in expect} == expect

    # The leader stops: the other replica takes the Lease once it ran out, and then writes.
    leader = holder(cluster)
    other = next(r for r in REPLICAS if r != leader)
    cluster.stop_process(leader)
    cluster.wait_for(lambda: holder(cluster) == other, what=f"{other} holding the Lease", timeout=60, log=other)
    write_metric(cluster, time.time() - 20 * 60)  # older than degradeTimeMinutes (15)
    cluster.wait_for(lambda: not published(cluster), what="batch resources removed after the metric went stale",
                     timeout=60, log=other)  # fmt: skip
