"""The node config from the cluster: NodeSLO (packaging/crds/nodeslo.yaml) and
NodeResourceTopology (packaging/crds/noderesourcetopology.yaml) as real custom resources, read
by ``runtime-proxy serve`` with ``fromCluster: true`` under the identity and RBAC of
packaging/kustomize/base/node/rbac.yaml and packaging/kustomize/components/eviction/rbac.yaml;
a NodeSLO change changes the node's cgroups; a BE pod's batch requests, read from its pod spec
through the node part's pod watch (no extended-resource-spec annotation), give its cgroups their
quota, shares and memory limit; the usage loop's evictions go through the real
Eviction API, where a real PodDisruptionBudget holds. Nothing here depends on the runtime: it
runs on the containerd 2.1 stack only.

For this module the session's proxy is restarted with no node config file: everything it knows
of the node comes from the API server (the NodeResourceTopology the extender fixture created,
and the NodeSLO made here). The session's proxy comes back afterwards.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
import yaml
from rhp_devenv.kube import NODE_NAME, Cluster

from tests.e2e.batchpods import be_pod, publish_batch, unpublish_batch, wait_batch_limits
from tests.e2e.conftest import REPO, Stack, container_id, pod_cgroup, pod_manifest, wait_deleted
from tests.integration import qos_helpers as q

NODESLO_CRD = REPO / "packaging" / "crds" / "nodeslo.yaml"
NODE_RBAC = REPO / "packaging" / "kustomize" / "base" / "node" / "rbac.yaml"
EVICT_RBAC = REPO / "packaging" / "kustomize" / "components" / "eviction" / "rbac.yaml"
NODESLO_EXAMPLE = REPO / "packaging" / "examples" / "nodeslo.yaml"
NODE_USER = "system:serviceaccount:kube-system:runtime-hook-proxy-node"
PLUGINS = ("cpuset", "numa", "batch_resource", "cpu_burst", "memory_evict")
BURST = {"policy": "cpuBurstOnly", "cpuBurstPercent": 50}
EVICT_OFF = {"enable": False}
# Acts whenever node memory use is at least 1 % and wants it at 0 %: every BE pod is a victim.
EVICT_ALL = {"enable": True, "memoryEvictThresholdPercent": 1, "memoryEvictLowerPercent": 0}


def node_slo(spec: Mapping[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "slo.koordinator.sh/v1alpha1", "kind": "NodeSLO", "metadata": {"name": NODE_NAME},
            "spec": dict(spec)}  # fmt: skip


def patch_slo(cluster: Cluster, spec: Mapping[str, Any]) -> None:
    cluster.kubectl("patch", "nodeslo", NODE_NAME, "--type=merge", "-p", json.dumps({"spec": spec}))


@pytest.fixture(scope="module")
def from_cluster(stack: Stack) -> Iterator[Stack]:
    """The CRD, the node part's RBAC and this node's NodeSLO in the cluster, and the proxy
    restarted with ``fromCluster: true`` as the ``runtime-hook-proxy-node`` ServiceAccount."""
    if stack.ctrd.version != "2.1":
        pytest.skip("the node config from the cluster does not depend on the runtime: checked on containerd 2.1")
    cluster = stack.cluster
    cluster.apply(NODESLO_CRD.read_text(), NODE_RBAC.read_text(), EVICT_RBAC.read_text())
    cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd/nodeslos.slo.koordinator.sh")
    cluster.apply(node_slo({"cpuBurstStrategy": BURST, "resourceUsedThresholdWithBE": EVICT_OFF}))
    groups = ("system:serviceaccounts", "system:serviceaccounts:kube-system")
    kubeconfig = cluster.kubeconfig_for("runtime-hook-proxy-node", user=NODE_USER, groups=groups)
    hooks = stack.work / "hookserver-from-cluster.d"
    hooks.mkdir(exist_ok=True)
    config = {
        "plugins": [{"name": name} for name in PLUGINS],
        "fromCluster": True,
        "nodeName": NODE_NAME,
        "hookServerDir": str(hooks),
        "cgroupDriver": "cgroupfs",
        "reconcilePeriodSeconds": 2,
        "usageLoop": {"enable": True, "intervalSeconds": 1, "evictBy": "api"},
    }
    stack.restart_proxy_with_config(config, "from-cluster", env={"KUBECONFIG": str(kubeconfig)})
    try:
        yield stack
    finally:
        stack.restart_proxy()
        cluster.kubectl("delete", "nodeslo", NODE_NAME, "--ignore-not-found", check=False)


def test_the_api_server_keeps_a_koordinator_nodeslo_as_written(from_cluster: Stack) -> None:
    """packaging/examples/nodeslo.yaml's spec, written through our CRD, reads back unchanged:
    nothing the parser reads (or Koordinator defines) is pruned or converted."""
    cluster = from_cluster.cluster
    spec = yaml.safe_load(NODESLO_EXAMPLE.read_text())["nodeSLO"]
    obj = node_slo(spec)
    obj["metadata"]["name"] = "example-node"
    cluster.apply(obj)
    try:
        got = cluster.get_json("nodeslo", "example-node")
        assert got is not None and got["spec"] == spec
    finally:
        cluster.kubectl("delete", "nodeslo", "example-node", check=False)


def _burst(pod: Mapping[str, Any]) -> str:
    return q.read_container_file(pod_cgroup(pod), container_id(pod), "cpu.cfs_burst_us")


def test_a_nodeslo_change_changes_the_cgroups_on_the_node(from_cluster: Stack, ns: str) -> None:
    """An LS pod of 1 CPU gets ``cpu.cfs_burst_us`` from the cluster's NodeSLO
    (cpuBurstPercent 50: half its quota); patching cpuBurstPercent to 80 rewrites it, and
    turning the policy off writes 0."""
    cluster = from_cluster.cluster
    cluster.apply(pod_manifest("ls", ns, qos="LS", requests={"cpu": "100m", "memory": "32Mi"}, limits={"cpu": "1"}))
    pod = cluster.wait_pod_running(ns, "ls")
    q.wait_for(lambda: _burst(pod), "50000", what="cpu.cfs_burst_us from cpuBurstPercent 50", timeout=60)
    try:
        patch_slo(cluster, {"cpuBurstStrategy": {"cpuBurstPercent": 80}})
        q.wait_for(lambda: _burst(pod), "80000", what="cpu.cfs_burst_us from cpuBurstPercent 80", timeout=60)
        patch_slo(cluster, {"cpuBurstStrategy": {"policy": "none"}})
        q.wait_for(lambda: _burst(pod), "0", what="cpu.cfs_burst_us with the policy off", timeout=60)
    finally:
        patch_slo(cluster, {"cpuBurstStrategy": BURST})


def test_a_be_pod_gets_its_batch_limits_from_its_pod_spec_at_the_cri_door(from_cluster: Stack, ns: str) -> None:
    """Issue 36 through ``serve`` (the CRI door) on the real cluster: a BE pod asking for
    batch-cpu 500 and batch-memory 64Mi, without the webhook's annotation, runs with quota 50000,
    shares 512 and 64 MiB in its container's and its pod's cgroups. Fails on the old main (quota
    -1, shares 2, no memory limit: the node part read only the annotation)."""
    cluster = from_cluster.cluster
    publish_batch(cluster)  # what the manager does from the NodeMetric (test_e2e_manager.py)
    try:
        cluster.apply(be_pod("be", ns))
        pod = cluster.wait_pod_running(ns, "be", timeout=120)
        assert q.EXTENDED_RESOURCE_SPEC not in pod["metadata"].get("annotations", {})
        wait_batch_limits(pod)
    finally:
        cluster.kubectl("delete", "pod", "-n", ns, "be", "--wait=true", "--timeout=120s", check=False)
        unpublish_batch(cluster)


def _events(cluster: Cluster, ns: str, name: str, reason: str) -> list[dict[str, Any]]:
    out = cluster.kubectl("get", "events", "-n", ns, "-o", "json", "--field-selector",
                          f"involvedObject.name={name},reason={reason}").stdout  # fmt: skip
    items: list[dict[str, Any]] = json.loads(out)["items"]
    return items


def test_usage_loop_evictions_go_through_the_eviction_api_and_a_pdb_holds(from_cluster: Stack, ns: str) -> None:
    """Two BE pods; a PodDisruptionBudget with minAvailable 1 covers one of them. With
    memory_evict acting at 1 % node memory, the uncovered pod is evicted (gone from the API,
    with an ``evictPodSuccess`` Event), while the covered pod's eviction is refused by the API
    server (an ``evictPodFail`` Event) and the pod keeps running: same UID, Running, not being
    deleted, and the budget still at its minimum."""
    cluster = from_cluster.cluster
    guarded = pod_manifest("guarded", ns, qos="BE", node_name=NODE_NAME)
    guarded["metadata"]["labels"]["app"] = "guarded"
    cluster.apply(guarded, pod_manifest("free", ns, qos="BE", node_name=NODE_NAME))
    guarded_uid = cluster.wait_pod_running(ns, "guarded")["metadata"]["uid"]
    cluster.wait_pod_running(ns, "free")
    cluster.apply({
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "guarded", "namespace": ns},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "guarded"}}},
    })  # fmt: skip

    def budget_observed() -> dict[str, Any] | None:
        pdb = cluster.get_json("pdb", "guarded", namespace=ns) or {}
        status = pdb.get("status", {})
        done = status.get("observedGeneration") == pdb.get("metadata", {}).get("generation")
        return status if done and status.get("currentHealthy") == 1 else None

    cluster.wait_for(budget_observed, what="the disruption controller's PDB status", timeout=120)
    try:
        patch_slo(cluster, {"resourceUsedThresholdWithBE": EVICT_ALL})
        wait_deleted(cluster, "pod", "free", ns, timeout=120)
        cluster.wait_for(lambda: _events(cluster, ns, "guarded", "evictPodFail"),
                         what="the refused eviction's Event", timeout=120)  # fmt: skip
        # Events are sent by the node's recorder thread (rhp_kube.events), in their own time
        cluster.wait_for(lambda: _events(cluster, ns, "free", "evictPodSuccess"),
                         what="the eviction's Event", timeout=120)  # fmt: skip
        deadline = time.monotonic() + 5  # rounds go on every second: the refusal stays a refusal
        while time.monotonic() < deadline:
            pod = cluster.get_json("pod", "guarded", namespace=ns)
            assert pod is not None and pod["metadata"]["uid"] == guarded_uid
            assert "deletionTimestamp" not in pod["metadata"]
            assert pod["status"]["phase"] == "Running"
            time.sleep(0.5)
        pdb = cluster.get_json("pdb", "guarded", namespace=ns)
        assert pdb is not None
        assert (pdb["status"]["currentHealthy"], pdb["status"]["disruptionsAllowed"]) == (1, 0)
    finally:
        patch_slo(cluster, {"resourceUsedThresholdWithBE": EVICT_OFF})


# ---- the Eviction API: the real one and tests/fakeapi.py answer alike ------------------------------


def _evict_codes(api_client: Any, ns: str, cases: Mapping[str, str | None]) -> dict[str, int]:
    """POST an Eviction (with the UID precondition given, as ApiEvictor does) for each pod of
    *cases* through the official client; the HTTP code of each answer."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    core = client.CoreV1Api(api_client)
    codes: dict[str, int] = {}
    for name, uid in cases.items():
        body = client.V1Eviction(
            metadata=client.V1ObjectMeta(name=name, namespace=ns),
            delete_options=client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=uid)),
        )
        try:
            core.create_namespaced_pod_eviction(name, ns, body, _request_timeout=30)
            codes[name] = 201
        except ApiException as exc:
            codes[name] = int(exc.status or 0)
    return codes


EVICTION_CASES = {
    "pending": "a Pending pod under a budget that allows no disruption: deleted without a budget check",
    "running": "a Running pod under that budget: 429",
    "other-uid": "a UID precondition naming another pod: 409",
    "missing": "no such pod: 404",
}


def test_the_fake_api_servers_eviction_answers_as_the_real_one(from_cluster: Stack, ns: str) -> None:
    """The same pods, budget and Evictions against kube-apiserver and tests/fakeapi.py give the
    same HTTP codes and leave the same pods (see ``EVICTION_CASES``)."""
    from kubernetes import client, config

    from tests.fakeapi import FakeAPIServer

    cluster = from_cluster.cluster
    held = {"app": "held"}
    pending = pod_manifest("pending", ns, node_name="rhp-no-such-node")  # no kubelet: Pending for good
    running = pod_manifest("running", ns, node_name=NODE_NAME)
    for pod in (pending, running):
        pod["metadata"]["labels"].update(held)
    cluster.apply(pending, running, pod_manifest("other-uid", ns, node_name=NODE_NAME))
    cluster.wait_pod_running(ns, "running")
    cluster.wait_pod_running(ns, "other-uid")
    pdb = {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "held", "namespace": ns},
           "spec": {"minAvailable": 2, "selector": {"matchLabels": held}}}  # fmt: skip
    cluster.apply(pdb)

    def observed() -> dict[str, Any] | None:
        got = cluster.get_json("pdb", "held", namespace=ns) or {}
        status = got.get("status", {})
        ok = status.get("observedGeneration") == got.get("metadata", {}).get("generation")
        return status if ok and status.get("currentHealthy") == 1 else None

    status = cluster.wait_for(observed, what="the budget's status", timeout=120)
    assert status["disruptionsAllowed"] == 0
    objects = {name: cluster.get_json("pod", name, namespace=ns) for name in ("pending", "running", "other-uid")}
    assert objects["pending"] is not None and objects["pending"]["status"]["phase"] == "Pending"
    uids: dict[str, str | None] = {name: obj["metadata"]["uid"] for name, obj in objects.items() if obj}
    cases: dict[str, str | None] = {"pending": uids["pending"], "running": uids["running"],
                                    "other-uid": "00000000-0000-0000-0000-000000000000", "missing": None}  # fmt: skip

    cfg = client.Configuration()
    config.load_kube_config(config_file=str(cluster.admin_kubeconfig), client_configuration=cfg)
    real = _evict_codes(client.ApiClient(cfg), ns, cases)

    def kept(get: Any) -> list[str]:
        """The pods still there and not being deleted (a bound pod evicted on the real server
        may wait for its kubelet with a deletionTimestamp; 'rhp-no-such-node' has none)."""
        return sorted(n for n in cases if (pod := get(n)) is not None and "deletionTimestamp" not in pod["metadata"])

    real_kept = kept(lambda n: cluster.get_json("pod", n, namespace=ns))

    with FakeAPIServer() as fake:
        for name in ("pending", "running", "other-uid"):
            obj = objects[name]
            assert obj is not None
            fake.create({"kind": "Pod", "metadata": {"name": name, "namespace": ns, "uid": obj["metadata"]["uid"],
                                                     "labels": obj["metadata"].get("labels", {})},
                         "spec": obj["spec"], "status": {"phase": obj["status"]["phase"]}})  # fmt: skip
        fake.create({**pdb, "status": status})
        fake_cfg = client.Configuration()
        fake_cfg.host = fake.url
        faked = _evict_codes(client.ApiClient(fake_cfg), ns, cases)
        fake_kept = kept(lambda n: fake.get("Pod", n, ns))

    assert (real, real_kept) == ({"pending": 201, "running": 429, "other-uid": 409, "missing": 404},
                                 ["other-uid", "running"]), EVICTION_CASES  # fmt: skip
    assert (faked, fake_kept) == (real, real_kept)
