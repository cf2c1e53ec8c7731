"""The Helm chart (``packaging/helm/runtime-hook-proxy``) installed, upgraded and uninstalled on
the real one-node cluster, as a user would (docs/helm.md, "End to end").

The session's node is moved to NRI mode first (kubelet on containerd 2.1 directly, the session's
proxy stopped; put back afterwards). The images of ``packaging/image/build.sh`` (node and
cluster) and an upstream kube-scheduler image made from the harness's own Kubernetes binary are
imported into that containerd; the chart runs them with ``pullPolicy: Never``. Every pod is on
the host network (there is no CNI) and reaches the API server on 127.0.0.1 through
``apiServer.host``/``port`` (the Service range is a blackhole here); every listen port is a free
loopback port.

Checked through the API server and on the node: the node agent's DaemonSet pod runs the node
image in NRI mode and is ready (connected to containerd's NRI); the scheduler pod runs
kube-scheduler and scheduler-ext from their images; the manager (koordinator.present=false, the
default) serves the pod webhook with the certificate it issued itself and wrote its CA into the
webhook's caBundle, and a BE pod with batch requests gets Koordinator's extended-resource-spec
from the real API server; Koordinator's four PriorityClasses are installed; an LSR pod with
``schedulerName`` = ours is bound by our extender and its container's ``cpuset.cpus`` is the CPU
the extender wrote;
``helm upgrade`` rolls the scheduler with a new value and keeps the signing key; ``helm uninstall``
leaves no object with the release's label but the chart's CRDs (kept, with their objects:
helm.sh/resource-policy keep), no Lease in the release namespace (the post-delete hook), and
nothing new on the host paths the chart mounts.

Signed allocations (issue 37 items 1 and 2): the extender makes its signing key Secret and the
public-key ConfigMap itself (no release label); the node agent loads the public key from the
mounted ConfigMap; a tenant's LSR pod created with ``spec.nodeName`` and a forged cpuset of every
CPU gets none (its CFS quota stays) while the signed LSR pod runs on its CPU (on the old main the
forgery, older, held the CPUs and the signed pod was refused them). Two ``helm template`` runs
render the same and no key; uninstall and reinstall with the signed pod running keep the key, and
a new LSR pod gets a CPU the running one does not hold (on the old main the reinstall made a new
key and handed the running pod's CPU out again).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from rhp_devenv.kube import KUBE_VERSION, NODE_NAME, free_port
from rhp_devenv.product_image import import_archive, kube_scheduler_image, product_images

from hooks.facts import format_cpu_list, parse_cpu_list
from hooks.signatures import AllocationKeys, verify_allocation
from koord_formats.signature import parse_public_keys
from tests.e2e.conftest import NRT_CRD, Stack, container_id, http_get, node_topology, pod_cgroup, pod_manifest
from tests.integration import qos_helpers as q
from tests.integration.harness import REPO
from tests.test_helm import helm_binary

CHART = REPO / "packaging" / "helm" / "runtime-hook-proxy"
CRDS = REPO / "packaging" / "crds"
RELEASE = "rhp-e2e"
NAMESPACE = "rhp-system"
FULL = f"{RELEASE}-runtime-hook-proxy"
SCHEDULER_NAME = "rhp-e2e-scheduler"
INSTANCE = f"app.kubernetes.io/instance={RELEASE}"
KEY_SECRET, PUBLIC_KEYS = f"{FULL}-signing-key", f"{FULL}-public-keys"
PRIORITY_CLASSES = {"koord-prod": 9000, "koord-mid": 7000, "koord-batch": 5000, "koord-free": 3000}

pytestmark = pytest.mark.timeout(1800)  # a cold image build takes minutes before the cluster work


def _crd_names() -> list[str]:
    return [yaml.safe_load(p.read_text())["metadata"]["name"] for p in sorted(CRDS.glob("*.yaml"))
            if p.name != "kustomization.yaml"]  # fmt: skip


@dataclass
class Helm:
    """helm against the harness's API server, with its own config and cache directories."""

    binary: Path
    stack: Stack
    home: Path

    def __call__(self, *args: str, timeout: float = 600.0, check: bool = True) -> subprocess.CompletedProcess[str]:
        env = {**self.stack.cluster.kubectl_env(), "KUBECONFIG": str(self.stack.cluster.admin_kubeconfig),
               "HELM_CONFIG_HOME": str(self.home / "config"), "HELM_CACHE_HOME": str(self.home / "cache"),
               "HELM_DATA_HOME": str(self.home / "data"), "HOME": str(self.home)}  # fmt: skip
        proc = subprocess.run([str(self.binary), *args], capture_output=True, text=True, timeout=timeout, env=env,
                              check=False, stdin=subprocess.DEVNULL)  # fmt: skip
        assert proc.returncode == 0 or not check, f"helm {' '.join(args)}: {proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        return proc


@pytest.fixture
def nri_node(stack: Stack, tmp_path: Path) -> Iterator[Stack]:
    """The node in NRI mode with the chart's images imported and no CRD of ours installed (the
    release owns them); afterwards the proxy, kubelet's endpoint and the session's NRT are back."""
    if stack.ctrd.version != "2.1":
        pytest.skip("the chart's node agent runs in NRI mode, on containerd 2.1 here")
    helm = helm_binary()
    if helm is None:
        pytest.skip("helm is not built: run scripts/build-helm.sh (scripts/install-deps.sh does)")
    cluster = stack.cluster
    images = product_images()
    scheduler_image = kube_scheduler_image(cluster.binary, KUBE_VERSION, tmp_path / "images")
    for archive in (images["node"].archive, images["cluster"].archive, scheduler_image.archive):
        import_archive(stack.ctrd.binaries.ctr, stack.ctrd.socket, archive)
    cluster.kubectl("delete", "crd", "--ignore-not-found", "--wait=true", *_crd_names())
    try:
        stack.kubelet_on_containerd()
        yield stack
    finally:
        stack.kubelet_on_proxy()
        # helm uninstall keeps the chart's CRDs; the session had only the NRT's, which goes back.
        cluster.kubectl("delete", "crd", "--ignore-not-found", "--wait=true", *_crd_names(), check=False)
        cluster.apply(NRT_CRD.read_text())
        cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                        "crd/noderesourcetopologies.topology.node.k8s.io")  # fmt: skip
        cluster.apply(node_topology())


@pytest.fixture
def helm(nri_node: Stack, tmp_path: Path) -> Iterator[Helm]:
    """helm for the test; afterwards the release (if the test stopped before uninstalling it)
    and its namespace are gone."""
    binary = helm_binary()
    assert binary is not None
    tool = Helm(binary, nri_node, tmp_path / "helm")
    try:
        yield tool
    finally:
        tool("uninstall", RELEASE, "-n", NAMESPACE, "--ignore-not-found", "--wait", "--timeout", "5m", check=False)
        nri_node.cluster.kubectl("delete", "namespace", NAMESPACE, "--ignore-not-found", "--wait=false", check=False)


def _values(stack: Stack) -> dict[str, Any]:
    webhook_port = free_port()
    return {
        "image": {"registry": "", "pullPolicy": "Never",
                  "node": {"repository": "localhost/runtime-hook-proxy-node", "tag": "0.1.0"},
                  "cluster": {"repository": "localhost/runtime-hook-proxy-cluster", "tag": "0.1.0"}},
        "apiServer": {"host": "127.0.0.1", "port": stack.cluster.ports["apiserver"]},
        "hostNetwork": True,
        "listenAddress": "127.0.0.1",
        # no CPU requests of the chart's pods (null removes the chart's): two LSR pods of one CPU
        # fill this 2-CPU node. The reports stay off: this test gives the extender its own NRT.
        "node": {"nri": {"socketPath": str(stack.ctrd.nri_socket), "runtimeSocketPath": str(stack.ctrd.socket)},
                 "metricsPort": free_port(),
                 "report": {"enabled": False},
                 "resources": {"requests": {"cpu": None, "memory": "64Mi"}, "limits": {"memory": "256Mi"}}},
        # One replica: on the host network a second one needs a second node. The API server runs
        # on the node: it reaches the webhook on loopback (no Service routing here).
        "manager": {"replicas": 1, "metricsPort": free_port(), "resources": {"requests": {"cpu": None}}},
        "webhook": {"port": webhook_port, "url": f"https://127.0.0.1:{webhook_port}/mutate-pod"},
        "scheduler": {
            "schedulerName": SCHEDULER_NAME,
            "kubeScheduler": {"image": {"repository": "localhost/kube-scheduler", "tag": KUBE_VERSION,
                                        "pullPolicy": "Never"},
                              "command": ["/usr/local/bin/kube", "kube-scheduler"], "securePort": free_port(),
                              "resources": {"requests": {"cpu": None, "memory": "64Mi"}}},
            "extender": {"port": free_port(), "healthPort": free_port(),
                         "resources": {"requests": {"cpu": None, "memory": "128Mi"}}},
        },
    }  # fmt: skip


def _pods(stack: Stack, component: str) -> list[dict[str, Any]]:
    out = stack.cluster.kubectl("get", "pods", "-n", NAMESPACE, "-o", "json", "-l",
                                f"{INSTANCE},app.kubernetes.io/component={component}").stdout  # fmt: skip
    pods: list[dict[str, Any]] = json.loads(out)["items"]
    return pods


def _images(pod: dict[str, Any]) -> dict[str, str]:
    return {c["name"]: c["image"] for c in pod["spec"]["containers"]}


def _ready(pod: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod.get("status", {}).get("conditions", []))


def _labelled(stack: Stack) -> list[str]:
    kinds = ("all,configmaps,secrets,serviceaccounts,roles,rolebindings,clusterroles,clusterrolebindings,crds,"
             "priorityclasses,mutatingwebhookconfigurations")
    out = stack.cluster.kubectl("get", kinds, "-A", "-l", INSTANCE, "-o", "name").stdout
    return [line for line in out.splitlines() if line.strip()]


def _host_listing(paths: list[str]) -> dict[str, list[str] | None]:
    """The names in each host directory the chart mounts (not below /sys), None when missing."""
    return {p: (sorted(os.listdir(p)) if os.path.isdir(p) else None) for p in paths if not p.startswith("/sys/")}


def test_the_chart_installs_schedules_an_lsr_pod_on_its_cpus_upgrades_and_uninstalls_cleanly(
        ns: str, nri_node: Stack, helm: Helm, tmp_path: Path) -> None:  # fmt: skip
    # ns first: its teardown (pods deleted, sandboxes collected through the proxy) runs last,
    # after nri_node has put the proxy back.
    stack = nri_node
    cluster = stack.cluster
    values = _values(stack)
    values_file = tmp_path / "values.yaml"
    values_file.write_text(yaml.safe_dump(values))

    rendered = [d for d in yaml.safe_load_all(helm("template", RELEASE, str(CHART), "-n", NAMESPACE, "-f",
                                                   str(values_file)).stdout) if d]  # fmt: skip
    host_paths = sorted({v["hostPath"]["path"] for d in rendered if d["kind"] in ("DaemonSet", "Deployment")
                         for v in d["spec"]["template"]["spec"]["volumes"] if "hostPath" in v})  # fmt: skip
    before = _host_listing(host_paths)

    # Koordinator's PriorityClasses belong to the release (another test may have made one).
    cluster.kubectl("delete", "priorityclass", "--ignore-not-found", *PRIORITY_CLASSES)

    # ---- install ----------------------------------------------------------------------------
    helm("install", RELEASE, str(CHART), "-n", NAMESPACE, "--create-namespace", "-f", str(values_file), "--wait",
         "--timeout", "8m")  # fmt: skip
    # helm --wait counts a DaemonSet of one node done with none ready (maxUnavailable: 1).
    (agent,) = cluster.wait_for(lambda: [p for p in _pods(stack, "node") if _ready(p)],
                                what="the node agent's pod ready", timeout=180)  # fmt: skip
    assert _images(agent) == {"node-agent": "localhost/runtime-hook-proxy-node:0.1.0"}
    assert agent["spec"]["nodeName"] == NODE_NAME
    assert agent["spec"]["containers"][0]["command"][:2] == ["runtime-proxy", "nri"]
    status, _ = http_get(f"http://127.0.0.1:{values['node']['metricsPort']}/readyz")
    assert status == 200, "the NRI plugin in the pod is connected to containerd"
    # Nor does it wait for a host-network Deployment of one replica (maxUnavailable: 1).
    (scheduler,) = cluster.wait_for(lambda: [p for p in _pods(stack, "scheduler") if _ready(p)],
                                    what="the scheduler pod ready", timeout=180)  # fmt: skip
    assert _images(scheduler) == {"kube-scheduler": f"localhost/kube-scheduler:{KUBE_VERSION}",
                                  "scheduler-ext": "localhost/runtime-hook-proxy-cluster:0.1.0"}  # fmt: skip
    crds = set(_crd_names())
    assert crds <= {line.split("/", 1)[1] for line in _labelled(stack) if line.startswith("customresourcedefinition")}
    classes = {name: (cluster.get_json("priorityclass", name) or {}).get("value") for name in PRIORITY_CLASSES}
    assert classes == PRIORITY_CLASSES

    # ---- the pod webhook, its certificate issued by the manager ---------------------------------
    (manager,) = cluster.wait_for(lambda: [p for p in _pods(stack, "manager") if _ready(p)],
                                  what="the manager's pod ready (its webhook serving)", timeout=180)  # fmt: skip
    assert _images(manager) == {"manager": "localhost/runtime-hook-proxy-cluster:0.1.0"}

    def ca_bundle() -> str | None:
        config = cluster.get_json("mutatingwebhookconfiguration", FULL) or {}
        return str(config["webhooks"][0]["clientConfig"].get("caBundle") or "") or None

    cluster.wait_for(ca_bundle, what="the manager writing its CA into the webhook's caBundle", timeout=120)
    batch = {"kubernetes.io/batch-cpu": "500", "kubernetes.io/batch-memory": "64Mi"}
    be = pod_manifest("be", ns, qos="BE", requests=batch, limits=batch)

    def mutated() -> dict[str, Any] | None:
        out = cluster.kubectl("create", "--dry-run=server", "-o", "json", "-f", "-", input=json.dumps(be)).stdout
        annotations = json.loads(out)["metadata"].get("annotations") or {}
        spec = annotations.get("node.koordinator.sh/extended-resource-spec")
        return json.loads(spec) if spec else None

    # failurePolicy Ignore: until the API server trusts the new CA, pods pass unchanged.
    spec = cluster.wait_for(mutated, what="the webhook's extended-resource-spec on a BE pod", timeout=120)
    assert spec == {"containers": {"app": {"requests": batch, "limits": batch}}}, spec

    # The node's NodeResourceTopology, as koordlet (or report.enable) would write it; then the
    # extender has seen it before the pod exists (kube-scheduler does not retry on NRT changes).
    cluster.apply(node_topology())
    health = f"http://127.0.0.1:{values['scheduler']['extender']['healthPort']}"

    cluster.wait_for(lambda: http_get(f"{health}/readyz")[0] == 200, what="the extender's /readyz", timeout=120)

    # ---- the keys: made by the extender, outside the release; the node agent loads them ----------
    secret = cluster.wait_for(lambda: cluster.get_json("secret", KEY_SECRET, namespace=NAMESPACE),
                              what="the signing key Secret", timeout=60)  # fmt: skip
    published = cluster.get_json("configmap", PUBLIC_KEYS, namespace=NAMESPACE)
    assert published is not None
    (public,) = parse_public_keys(published["data"]["public-keys"])
    for obj in (secret, published):
        assert INSTANCE.split("=")[0] not in (obj["metadata"].get("labels") or {}), "not the release's"
        assert not obj["metadata"].get("ownerReferences")
    metrics = f"http://127.0.0.1:{values['node']['metricsPort']}/metrics"
    cluster.wait_for(lambda: "rhp_allocation_public_keys 1.0" in http_get(metrics)[1].decode(),
                     what="the node agent's public key (kubelet refreshes the optional ConfigMap volume)",
                     timeout=300)  # fmt: skip

    # ---- a forged LSR cpuset bound by spec.nodeName gets nothing; the signed pod keeps its CPU -----
    every = format_cpu_list(frozenset(range(os.cpu_count() or 2)))
    half = {"cpu": "500m", "memory": "32Mi"}
    cluster.apply(pod_manifest("thief", ns, qos="LSR", requests=half, limits=half, node_name=NODE_NAME,
                               annotations={q.RESOURCE_STATUS: json.dumps({"cpuset": every})}))  # fmt: skip
    thief = cluster.wait_pod_running(ns, "thief", timeout=180)
    assert q.read_container_file(pod_cgroup(thief), container_id(thief), "cpu.cfs_quota_us") == "50000", \
        "the forged cpuset was not honoured: the pod keeps its quota"
    lsr = pod_manifest("lsr", ns, qos="LSR", requests={"cpu": "1", "memory": "32Mi"},
                       limits={"cpu": "1", "memory": "32Mi"})  # fmt: skip
    lsr["spec"]["schedulerName"] = SCHEDULER_NAME
    cluster.apply(lsr)
    pod = cluster.wait_pod_running(ns, "lsr", timeout=180)
    assert pod["spec"]["nodeName"] == NODE_NAME and pod["spec"]["schedulerName"] == SCHEDULER_NAME
    ann = pod["metadata"]["annotations"]
    bound = parse_cpu_list(json.loads(ann[q.RESOURCE_STATUS])["cpuset"])
    assert len(bound) == 1
    verdict = verify_allocation(AllocationKeys.of([public]), uid=pod["metadata"]["uid"], namespace=ns, name="lsr",
                                node=NODE_NAME, annotations=ann)  # fmt: skip
    assert verdict.signed, verdict
    q.wait_for(lambda: q.read_container_file(pod_cgroup(pod), container_id(pod), "cpuset.cpus"),
               format_cpu_list(bound), what="the signed LSR container's cpuset.cpus", timeout=60)  # fmt: skip
    q.wait_for(lambda: bound & parse_cpu_list(q.read_container_file(pod_cgroup(thief), container_id(thief),
                                                                    "cpuset.cpus")) or None,
               None, what="the forged pod off the signed pod's CPU", timeout=60)  # fmt: skip

    # ---- a cpuset changed by hand is put back with no container event: the chart's agent has ----
    # containerd's CRI socket (node.nri.runtimeSocketPath), so the reconciler's update that no NRI
    # reply carried goes by CRI UpdateContainerResources (docs/nri.md)
    parent, cid = pod_cgroup(pod), container_id(pod)
    wider = q.read_pod_file(parent, "cpuset.cpus")
    assert wider != format_cpu_list(bound), "the pod's own cpuset leaves no other value to write by hand"
    (q.pod_dir(parent, "cpuset.cpus") / cid / "cpuset.cpus").write_text(f"{wider}\n")
    q.wait_for(lambda: q.read_container_file(parent, cid, "cpuset.cpus"), format_cpu_list(bound),
               what="the LSR container's cpuset put back after a change by hand", timeout=120)  # fmt: skip

    # ---- upgrade: a new value rolls the scheduler pod; the signing key stays -----------------------
    helm("upgrade", RELEASE, str(CHART), "-n", NAMESPACE, "-f", str(values_file), "--set",
         "scheduler.extender.weight=7", "--wait", "--timeout", "8m")  # fmt: skip
    config = cluster.get_json("configmap", f"{FULL}-scheduler", namespace=NAMESPACE)
    assert config is not None
    assert yaml.safe_load(config["data"]["config.yaml"])["extenders"][0]["weight"] == 7

    def rolled() -> dict[str, Any] | None:
        pods = _pods(stack, "scheduler")
        if len(pods) == 1 and pods[0]["metadata"]["uid"] != scheduler["metadata"]["uid"] and _ready(pods[0]):
            return pods[0]
        return None

    cluster.wait_for(rolled, what="the upgraded scheduler pod ready", timeout=180)
    after = cluster.get_json("secret", KEY_SECRET, namespace=NAMESPACE)
    assert after is not None and after["data"] == secret["data"]
    history = json.loads(helm("history", RELEASE, "-n", NAMESPACE, "-o", "json").stdout)
    assert [h["status"] for h in history] == ["superseded", "deployed"]
    pod = cluster.wait_pod_running(ns, "lsr")
    assert q.read_container_file(pod_cgroup(pod), container_id(pod), "cpuset.cpus") == format_cpu_list(bound)
    cluster.kubectl("delete", "pod", "-n", ns, "thief", "--wait=true", "--timeout=120s")

    # ---- two renders are the same and hold no key -----------------------------------------------
    renders = [helm("template", RELEASE, str(CHART), "-n", NAMESPACE, "-f", str(values_file)).stdout for _ in "ab"]
    assert renders[0] == renders[1]
    # (the webhook certificate's Secret is rendered empty: the manager fills it)
    assert not [d for d in yaml.safe_load_all(renders[0]) if d and d["kind"] == "Secret" and d.get("data")]

    # ---- uninstall with the signed pod running leaves only the keys -----------------------------
    helm("uninstall", RELEASE, "-n", NAMESPACE, "--wait", "--timeout", "5m")
    _gone(stack, crds, host_paths, before)
    assert cluster.wait_pod_running(ns, "lsr")["metadata"]["uid"] == pod["metadata"]["uid"]

    # ---- reinstall: the same key; the running pod's CPU stays counted ---------------------------
    helm("install", RELEASE, str(CHART), "-n", NAMESPACE, "-f", str(values_file), "--wait", "--timeout", "8m")
    cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                    "crd/noderesourcetopologies.topology.node.k8s.io")  # fmt: skip
    cluster.apply(node_topology())  # kept with its CRD through the uninstall; the same again
    cluster.wait_for(lambda: [p for p in _pods(stack, "scheduler") if _ready(p)], what="the scheduler pod ready",
                     timeout=180)  # fmt: skip
    cluster.wait_for(lambda: http_get(f"{health}/readyz")[0] == 200, what="the extender's /readyz", timeout=120)
    again = cluster.get_json("secret", KEY_SECRET, namespace=NAMESPACE)
    assert again is not None and again["data"] == secret["data"], "the reinstall signs with the same key"
    second = pod_manifest("second", ns, qos="LSR", requests={"cpu": "1", "memory": "32Mi"},
                          limits={"cpu": "1", "memory": "32Mi"})  # fmt: skip
    second["spec"]["schedulerName"] = SCHEDULER_NAME
    cluster.apply(second)
    other = cluster.wait_pod_running(ns, "second", timeout=180)
    got = parse_cpu_list(json.loads(other["metadata"]["annotations"][q.RESOURCE_STATUS])["cpuset"])
    assert len(got) == 1 and not got & bound, f"the running pod's CPU {bound} was handed out again"
    q.wait_for(lambda: q.read_container_file(pod_cgroup(other), container_id(other), "cpuset.cpus"),
               format_cpu_list(got), what="the new LSR container's cpuset.cpus", timeout=120)  # fmt: skip
    pod = cluster.wait_pod_running(ns, "lsr")
    assert q.read_container_file(pod_cgroup(pod), container_id(pod), "cpuset.cpus") == format_cpu_list(bound)
    for name in ("lsr", "second"):
        cluster.kubectl("delete", "pod", "-n", ns, name, "--wait=true", "--timeout=120s")

    # ---- uninstall leaves nothing behind but the keys and the CRDs ------------------------------
    helm("uninstall", RELEASE, "-n", NAMESPACE, "--wait", "--timeout", "5m")
    _gone(stack, crds, host_paths, before)


def _gone(stack: Stack, crds: set[str], host_paths: list[str], before: dict[str, list[str] | None]) -> None:
    """After uninstall: no object with the release's label but its CRDs (kept, helm.sh/resource-policy
    keep), none of its pods, nothing new on the host, and in the namespace only what Kubernetes keeps
    there and the extender's keys."""
    cluster = stack.cluster
    cluster.wait_for(lambda: all(line.startswith("customresourcedefinition") for line in _labelled(stack)) or None,
                     what="no object with the release's label but its kept CRDs", timeout=120)  # fmt: skip
    for name in crds:
        live = cluster.get_json("crd", name)
        assert live is not None and live["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep", name
    cluster.wait_for(lambda: (not _pods(stack, "node") and not _pods(stack, "scheduler")
                              and not _pods(stack, "manager")) or None,
                     what="the release's pods gone", timeout=120)  # fmt: skip
    assert _host_listing(host_paths) == before, "a file the chart wrote on the host is left"
    leftovers = cluster.kubectl("get", "all,configmaps,secrets,serviceaccounts,roles,rolebindings", "-n", NAMESPACE,
                                "-o", "name").stdout.split()  # fmt: skip
    # What Kubernetes itself keeps in any namespace, and the signing key and public keys, kept on
    # purpose (docs/signing.md).
    kept = ("configmap/kube-root-ca.crt", "serviceaccount/default", f"secret/{KEY_SECRET}", f"configmap/{PUBLIC_KEYS}")
    assert [o for o in leftovers if o not in kept] == []
    # The Leases the pods took (kube-scheduler's, the manager's, the extender's ledger): removed by
    # the post-delete hook (helm uninstall --wait waits for it).
    leases = cluster.kubectl("get", "leases", "-n", NAMESPACE, "-o", "name").stdout.split()
    assert leases == [], leases
