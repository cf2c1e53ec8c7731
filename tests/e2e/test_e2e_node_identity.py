"""The chart's node agent identity on a real API server (issue 37): the packaged chart's
ValidatingAdmissionPolicy lets a token of the node agent's ServiceAccount write only its own
node's objects, and the chart's CRDs survive ``helm upgrade --set crds.install=false`` and
``helm uninstall``.

The cheapest real cluster: :class:`rhp_devenv.kube.Cluster` without kubelet (kube-apiserver
of the harness's default version, etcd and kube-controller-manager, no machine lock, so it runs beside the session's
stack). The policy is the API server's, so no kubelet is needed: two API-only Nodes, ``node-a``
and ``node-b``, a pod object of the node agent's ServiceAccount bound to ``node-a`` (what the
DaemonSet makes there), and a token of that ServiceAccount bound to that pod through the
TokenRequest API, as kubelet asks for the token it mounts. The chart is installed with helm as
a user would (its node DaemonSet selects no node: there is no kubelet to run it).

Checked: the API server puts ``node-a`` in the token's user extra
(``authentication.kubernetes.io/node-name``); with that token the node agent's own node's
NodeMetric status, NodeResourceTopology, Device and Events pass and node B's are refused by the
policy, as is deleting (evicting, ``node.eviction.by: delete``) a pod bound to node B while a pod
of node A goes; an Eviction is not granted at all; a token bound to the Node object (a host
install's identity) is held to that node the same way; a token without a node writes nothing. Then
``helm upgrade --set crds.install=false`` keeps every CRD and the objects in them, a release
whose CRDs lack the keep policy is refused with the reason, and ``helm uninstall`` keeps them.
The kustomize node overlay's copy of the policy, applied as ``kubectl kustomize`` renders it,
holds its ServiceAccount the same way.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import pytest
import yaml
from rhp_devenv.kube import Cluster, kube_binary

from tests.integration.harness import REPO
from tests.test_helm import helm_binary

CHART = REPO / "packaging" / "helm" / "runtime-hook-proxy"
CRDS = REPO / "packaging" / "crds"
RELEASE = "rhp-id"
NAMESPACE = "rhp-system"
AGENT_SA = f"{RELEASE}-runtime-hook-proxy-node"
POLICY = f"{AGENT_SA}-own-node"
TENANT = "tenant"
NODE_NAME_KEY = "authentication.kubernetes.io/node-name"

pytestmark = pytest.mark.timeout(900)


@dataclass
class Api:
    """The cluster and helm against it."""

    cluster: Cluster
    helm_binary: Path
    home: Path

    def helm(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        env = {**self.cluster.kubectl_env(), "KUBECONFIG": str(self.cluster.admin_kubeconfig),
               "HELM_CONFIG_HOME": str(self.home / "config"), "HELM_CACHE_HOME": str(self.home / "cache"),
               "HELM_DATA_HOME": str(self.home / "data"), "HOME": str(self.home)}  # fmt: skip
        proc = subprocess.run([str(self.helm_binary), *args], capture_output=True, text=True, timeout=600, env=env,
                              check=False, stdin=subprocess.DEVNULL)  # fmt: skip
        assert proc.returncode == 0 or not check, f"helm {' '.join(args)}: {proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        return proc


def _unavailable(reason: str, switch: str) -> NoReturn:
    """Skip, or fail when scripts/test.sh requires the part (as the rest of tests/e2e does)."""
    if os.environ.get(switch, "") not in ("", "0"):
        pytest.fail(f"{reason} ({switch} is set)")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def api() -> Iterator[Api]:
    if os.geteuid() != 0:
        pytest.skip("needs root (the cluster's route and processes)")
    if kube_binary() is None:
        _unavailable("the kube binary is missing: run scripts/build-kube.sh (scripts/install-deps.sh does)",
                     "RHP_REQUIRE_KUBE")
    helm = helm_binary()
    if helm is None:
        _unavailable("helm is not built: run scripts/build-helm.sh (scripts/install-deps.sh does)", "RHP_REQUIRE_HELM")
    work = Path(tempfile.mkdtemp(prefix="rhp-e2e-identity-", dir="/tmp"))
    try:
        # API-only nodes: no not-ready taint, and no node lifecycle evicting their pods.
        cluster = Cluster(work / "no-kubelet.sock", scheduler=False, kubelet=False,
                          apiserver_args=["--disable-admission-plugins=TaintNodesByCondition"],
                          controller_manager_args=["--controllers=-nodelifecycle"])  # fmt: skip
        with cluster:
            yield Api(cluster, helm, work / "helm")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _node(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
            "status": {"capacity": {"cpu": "8", "memory": "16Gi", "pods": "110"},
                       "allocatable": {"cpu": "8", "memory": "16Gi", "pods": "110"}}}  # fmt: skip


def _pod(name: str, namespace: str, node: str, service_account: str = "default") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
            "spec": {"nodeName": node, "serviceAccountName": service_account, "automountServiceAccountToken": False,
                     "containers": [{"name": "c", "image": "localhost/none:never", "imagePullPolicy": "Never"}]}}


def _values() -> dict[str, Any]:
    # Only the node agent's parts (no kubelet runs any pod here: no manager, webhook or hook Job).
    return {"image": {"registry": "", "pullPolicy": "Never"},
            "scheduler": {"enabled": False}, "manager": {"enabled": False}, "leaseCleanup": {"enabled": False},
            "node": {"report": {"enabled": True}, "nodeSelector": {"rhp-e2e/no-such-node": "none"}}}  # fmt: skip


def _crd_names() -> list[str]:
    return [yaml.safe_load(p.read_text())["metadata"]["name"] for p in sorted(CRDS.glob("*.yaml"))
            if p.name != "kustomization.yaml"]  # fmt: skip


class Client:
    """Requests with one bearer token (no client certificate), as a pod's process sends them."""

    def __init__(self, cluster: Cluster, token: str) -> None:
        from kubernetes import client

        assert cluster.ca is not None
        cfg = client.Configuration()
        cfg.host = cluster.server
        cfg.ssl_ca_cert = str(cluster.ca.cert)
        cfg.api_key = {"authorization": token}
        cfg.api_key_prefix = {"authorization": "Bearer"}
        self.api = client.ApiClient(cfg)
        self.core = client.CoreV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)

    def call(self, fn: Any, *args: Any, **kwargs: Any) -> tuple[int, str]:
        """(HTTP status, message) of one call; (200, "") when it succeeded."""
        from kubernetes.client.exceptions import ApiException

        try:
            fn(*args, _request_timeout=30, **kwargs)
        except ApiException as exc:
            return int(exc.status or 0), str(exc.body)[:2000]
        return 200, ""


def _refused(got: tuple[int, str]) -> bool:
    status, body = got
    return status in (403, 422) and POLICY in body


def _event(name: str, host: str, about: dict[str, Any]) -> dict[str, Any]:
    namespace = about.get("namespace", "default")  # a Node's Events live in "default", as kubelet's
    return {"apiVersion": "v1", "kind": "Event", "metadata": {"name": name, "namespace": namespace},
            "involvedObject": about, "reason": "RuntimeHookFailed", "message": "test", "type": "Warning",
            "source": {"component": "runtime-hook-proxy", "host": host}, "reportingComponent": "runtime-hook-proxy",
            "reportingInstance": host}  # fmt: skip


def _nrt(name: str) -> dict[str, Any]:
    return {"apiVersion": "topology.node.k8s.io/v1alpha1", "kind": "NodeResourceTopology", "metadata": {"name": name},
            "topologyPolicies": ["None"], "zones": []}


def _device(name: str) -> dict[str, Any]:
    return {"apiVersion": "scheduling.koordinator.sh/v1alpha1", "kind": "Device", "metadata": {"name": name},
            "spec": {"devices": []}}


def test_a_node_agent_token_writes_only_its_own_nodes_objects_and_crds_survive_upgrade_and_uninstall(
        api: Api, tmp_path: Path) -> None:  # fmt: skip
    cluster = api.cluster
    for name in ("node-a", "node-b"):
        cluster.apply(_node(name))
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump(_values()))
    api.helm("install", RELEASE, str(CHART), "-n", NAMESPACE, "--create-namespace", "-f", str(values))
    for crd in _crd_names():
        cluster.kubectl("wait", "--for=condition=Established", "--timeout=120s", f"crd/{crd}")
    cluster.kubectl("create", "namespace", TENANT)
    for namespace in (NAMESPACE, TENANT):
        cluster.wait_for(lambda ns=namespace: cluster.get_json("serviceaccount", "default", namespace=ns),
                         what=f"the default ServiceAccount of {namespace}", timeout=120)  # fmt: skip
    cluster.apply(_pod("agent-a", NAMESPACE, "node-a", AGENT_SA), _pod("on-a", TENANT, "node-a"),
                  _pod("on-b", TENANT, "node-b"))  # fmt: skip
    # The manager creates each node's NodeMetric; the node agent replaces its status.
    for name in ("node-a", "node-b"):
        cluster.apply({"apiVersion": "slo.koordinator.sh/v1alpha1", "kind": "NodeMetric", "metadata": {"name": name},
                       "spec": {}})  # fmt: skip
    cluster.apply(_nrt("node-b"), _device("node-b"))
    cluster.apply(_event("from-b", "node-b", {"kind": "Pod", "namespace": TENANT, "name": "on-b"}))

    # ---- the token kubelet would mount in the node agent's pod on node A -------------------------
    token = cluster.kubectl("create", "token", AGENT_SA, "-n", NAMESPACE, "--bound-object-kind", "Pod",
                            "--bound-object-name", "agent-a", "--duration", "10m").stdout.strip()  # fmt: skip
    agent = Client(cluster, token)
    from kubernetes import client

    review = client.AuthenticationV1Api(agent.api).create_self_subject_review(
        client.V1SelfSubjectReview(api_version="authentication.k8s.io/v1", kind="SelfSubjectReview"))
    user = review.status.user_info
    assert user.username == f"system:serviceaccount:{NAMESPACE}:{AGENT_SA}"
    assert user.extra[NODE_NAME_KEY] == ["node-a"], user.extra

    # The policy's informer may take a moment after install: wait until node B's write is refused.
    def metric_status(name: str) -> tuple[int, str]:
        body = cluster.get_json("nodemetric", name)
        assert body is not None
        body["status"] = {"updateTime": "2099-01-01T00:00:00Z",
                          "nodeMetric": {"nodeUsage": {"resources": {"cpu": "0", "memory": "0"}}}}  # fmt: skip
        return agent.call(agent.custom.replace_cluster_custom_object_status, "slo.koordinator.sh", "v1alpha1",
                          "nodemetrics", name, body)  # fmt: skip

    cluster.wait_for(lambda: _refused(metric_status("node-b")), what="the own-node policy in force", timeout=120)

    def custom(verb: str, plural: str, group: str, body: dict[str, Any]) -> tuple[int, str]:
        if verb == "create":
            return agent.call(agent.custom.create_cluster_custom_object, group, "v1alpha1", plural, body)
        live = cluster.get_json(f"{plural}.{group}", body["metadata"]["name"])
        assert live is not None
        return agent.call(agent.custom.replace_cluster_custom_object, group, "v1alpha1", plural,
                          body["metadata"]["name"], {**live, **{k: v for k, v in body.items() if k != "metadata"}})

    topo, dev = "topology.node.k8s.io", "scheduling.koordinator.sh"
    own = {
        "its NodeMetric status": metric_status("node-a"),
        "its NodeResourceTopology (create)": custom("create", "noderesourcetopologies", topo, _nrt("node-a")),
        "its NodeResourceTopology (update)": custom("update", "noderesourcetopologies", topo, _nrt("node-a")),
        "its Device (create)": custom("create", "devices", dev, _device("node-a")),
        "an Event about a pod on its node": agent.call(
            agent.core.create_namespaced_event, TENANT,
            _event("ok-pod", "node-a", {"kind": "Pod", "namespace": TENANT, "name": "on-a"})),
        "an Event about its Node": agent.call(agent.core.create_namespaced_event, "default",
                                              _event("ok-node", "node-a", {"kind": "Node", "name": "node-a"})),
        "a patch of its own Event": agent.call(agent.core.patch_namespaced_event, "ok-pod", TENANT, {"count": 2}),
    }  # fmt: skip
    assert {k: v for k, v in own.items() if v[0] not in (200, 201)} == {}, "own-node writes refused"

    others = {
        "node B's NodeMetric status": metric_status("node-b"),
        "node B's NodeResourceTopology (update)": custom("update", "noderesourcetopologies", topo,
                                                                 _nrt("node-b")),
        "a NodeResourceTopology named after no node of its own": agent.call(
            agent.custom.create_cluster_custom_object, topo, "v1alpha1", "noderesourcetopologies", _nrt("node-c")),
        "node B's Device": custom("update", "devices", dev, _device("node-b")),
        "an Event claiming to come from node B": agent.call(
            agent.core.create_namespaced_event, TENANT,
            _event("forged", "node-b", {"kind": "Pod", "namespace": TENANT, "name": "on-b"})),
        "an Event about Node B": agent.call(agent.core.create_namespaced_event, "default",
                                            _event("about-b", "node-a", {"kind": "Node", "name": "node-b"})),
        "a patch of node B's Event": agent.call(agent.core.patch_namespaced_event, "from-b", TENANT,
                                                {"message": "overwritten"}),
    }  # fmt: skip
    assert {k: v for k, v in others.items() if not _refused(v)} == {}, "another node's object written"

    # ---- evictions (node.eviction.by: delete): a pod of node A goes, node B's stays --------------
    def delete(name: str) -> tuple[int, str]:
        live = cluster.get_json("pod", name, namespace=TENANT)
        assert live is not None
        options = client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=live["metadata"]["uid"]))
        return agent.call(agent.core.delete_namespaced_pod, name, TENANT, body=options, _preload_content=False)

    assert _refused(delete("on-b"))
    eviction = client.V1Eviction(metadata=client.V1ObjectMeta(name="on-b", namespace=TENANT))
    status, body = agent.call(agent.core.create_namespaced_pod_eviction, "on-b", TENANT, eviction)
    assert status == 403 and "pods/eviction" in body, "no Eviction grant: an Eviction names no node"
    assert delete("on-a")[0] == 200
    gone = cluster.get_json("pod", "on-a", namespace=TENANT)  # terminating: no kubelet confirms it
    assert gone is None or gone["metadata"].get("deletionTimestamp")
    still = cluster.get_json("pod", "on-b", namespace=TENANT)
    assert still is not None and not still["metadata"].get("deletionTimestamp")

    # A host install's identity: a token bound to the Node object carries the node too.
    node_bound = Client(cluster, cluster.kubectl("create", "token", AGENT_SA, "-n", NAMESPACE, "--bound-object-kind",
                                                 "Node", "--bound-object-name", "node-b", "--duration",
                                                 "10m").stdout.strip())  # fmt: skip
    host = node_bound.call(node_bound.custom.create_cluster_custom_object, dev, "v1alpha1", "devices",
                           _device("node-a"))  # fmt: skip
    assert _refused(host), "node B's identity writes node A's Device"

    # A token without a node (not bound to a pod) writes nothing.
    unbound = Client(cluster, cluster.kubectl("create", "token", AGENT_SA, "-n", NAMESPACE, "--duration",
                                              "10m").stdout.strip())  # fmt: skip
    got = unbound.call(unbound.custom.create_cluster_custom_object, dev, "v1alpha1", "devices", _device("node-c"))
    assert _refused(got) and "carries no node" in got[1], got

    # ---- CRDs and their objects survive upgrade and uninstall ------------------------------------
    crds = _crd_names()
    for crd in crds:
        live = cluster.get_json("crd", crd)
        assert live is not None and live["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    api.helm("upgrade", RELEASE, str(CHART), "-n", NAMESPACE, "-f", str(values), "--set", "crds.install=false")
    for crd in crds:
        assert cluster.get_json("crd", crd) is not None, f"helm upgrade --set crds.install=false deleted {crd}"
    assert cluster.get_json("noderesourcetopology", "node-a") is not None
    assert cluster.get_json("nodemetric", "node-a") is not None

    # A release whose CRDs came without the keep policy (an older chart) is refused, not emptied.
    api.helm("upgrade", RELEASE, str(CHART), "-n", NAMESPACE, "-f", str(values))  # the CRDs are the release's again
    cluster.kubectl("annotate", "crd", crds[0], "helm.sh/resource-policy-")
    refused = api.helm("upgrade", RELEASE, str(CHART), "-n", NAMESPACE, "-f", str(values), "--set",
                       "crds.install=false", check=False)  # fmt: skip
    assert refused.returncode != 0 and "crds.install=false would delete CRD" in refused.stderr, refused.stderr
    assert cluster.get_json("crd", crds[0]) is not None
    api.helm("upgrade", RELEASE, str(CHART), "-n", NAMESPACE, "-f", str(values))  # marks it keep again

    api.helm("uninstall", RELEASE, "-n", NAMESPACE, "--wait", "--timeout", "5m")
    for crd in crds:
        assert cluster.get_json("crd", crd) is not None, f"helm uninstall deleted {crd}"
    assert cluster.get_json("device", "node-a") is not None
    assert cluster.get_json("validatingadmissionpolicy", POLICY) is None
    history = json.loads(api.helm("list", "-A", "-o", "json").stdout)
    assert history == []


def test_the_kustomize_overlays_policy_holds_their_node_agent_to_its_node(api: Api) -> None:
    """packaging/kustomize's copy of the policy (as ``kubectl kustomize`` renders the node
    overlay, namespace and all) holds the overlays' ServiceAccount the same way."""
    cluster = api.cluster
    for name in ("node-a", "node-b"):
        cluster.apply(_node(name))
    rendered = cluster.kubectl("kustomize", str(REPO / "packaging" / "kustomize" / "overlays" / "node")).stdout
    wanted = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding", "ServiceAccount", "ClusterRole",
              "ClusterRoleBinding")  # fmt: skip
    docs = [d for d in yaml.safe_load_all(rendered) if d and d["kind"] in wanted]
    cluster.apply(*docs)
    cluster.kubectl("create", "namespace", "kustomized", check=False)
    cluster.wait_for(lambda: cluster.get_json("serviceaccount", "default", namespace="kustomized"),
                     what="the default ServiceAccount", timeout=120)  # fmt: skip
    cluster.apply(_pod("agent-a", "kube-system", "node-a", "runtime-hook-proxy-node"))
    token = cluster.kubectl("create", "token", "runtime-hook-proxy-node", "-n", "kube-system", "--bound-object-kind",
                            "Pod", "--bound-object-name", "agent-a", "--duration", "10m").stdout.strip()  # fmt: skip
    agent = Client(cluster, token)

    def event(name: str, host: str) -> tuple[int, str]:
        body = _event(name, host, {"kind": "Pod", "namespace": "kustomized", "name": "p"})
        return agent.call(agent.core.create_namespaced_event, "kustomized", body)

    def refused(got: tuple[int, str]) -> bool:
        return got[0] in (403, 422) and "runtime-hook-proxy-node-own-node" in got[1]

    cluster.wait_for(lambda: refused(event("forged", "node-b")), what="the kustomize policy in force", timeout=120)
    assert event("own", "node-a")[0] == 200
