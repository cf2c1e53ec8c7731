"""Issue 36's acceptance on the real one-node cluster with the packaged chart: one install, as
README documents it (its ``helm install`` line gives the release and the namespace), with the
chart's defaults (``koordinator.present: false``: node reports, manager, webhook, PriorityClasses)
and no manual step. Only the environment's values are set (images, ports, the API server's
address, kubelet's file paths, the webhook reached on loopback: this harness has no Service IPs),
as in ``test_e2e_helm.py``, whose NRI node fixture this module reuses. Then, as a user:

- an LSR pod scheduled by the chart's scheduler runs on exactly the CPU its allocation names: the
  node agent's own report wrote the NodeResourceTopology the extender allocates from;
- ``slo-controller-config`` in the release namespace (co-location on, CPU burst 50 %, then 80 %)
  reaches the node's NodeSLO (the manager) and the node (an LS pod's ``cpu.cfs_burst_us``);
- two BE pods asking for ``kubernetes.io/batch-cpu`` and ``batch-memory`` are scheduled on the
  batch resources the manager published from the node's report, and their containers' and pods'
  cgroups get the quota, shares and memory limit they imply (``tests/e2e/batchpods.py``): one
  where the webhook does not run (the release namespace), through the node agent's pod-spec path
  (``runtime_proxy/state/podspecs.py``), one in a user namespace, through the webhook's
  ``extended-resource-spec`` annotation;
- every Kubernetes manifest shown in README.md and docs/ applies as written (``doc_manifests``),
  but those whose block is marked for another install (info string ``yaml koordinator``: clusters
  where Koordinator runs; ``yaml kustomize``: the kustomize overlays, whose namespace they name),
  each listed in ``SKIPPED``;
- ``helm uninstall`` leaves no Lease the release's components took and no object of the release
  but its CRDs, which it keeps on purpose (``helm.sh/resource-policy: keep``: deleting a CRD
  deletes every object of its kind; docs/helm.md, "What uninstall leaves").

Fails on the old main: the webhook-less BE pod's cgroups kept quota -1, shares 2 and no memory
limit.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from rhp_devenv.kube import NODE_NAME, Cluster, free_port

from hooks.facts import format_cpu_list, parse_cpu_list
from tests.e2e.batchpods import BATCH_CPU, BATCH_MEMORY, ISSUE_36_CPU, be_pod, wait_batch_limits
from tests.e2e.conftest import Stack, container_id, pod_cgroup, pod_manifest
from tests.e2e.test_e2e_helm import CHART, SCHEDULER_NAME, Helm, _crd_names, _ready, _values, nri_node  # noqa: F401
from tests.integration import qos_helpers as q
from tests.integration.harness import REPO
from tests.test_helm import helm_binary

pytestmark = pytest.mark.timeout(2400)  # a cold image build, then one install with every check

SLO_CONFIG = "slo-controller-config"
# Co-location on (README's ConfigMap), with room for the BE pod on a loaded 2-CPU machine: the
# whole node may be reclaimed, memory by requests, and a published amount is rewritten only when
# it grows past double (resourceDiffThreshold 1; no periodic rewrite within the test), so the
# amount the BE pod's request is sized from never shrinks under it.
COLOCATION_CONFIG = {"enable": True, "cpuReclaimThresholdPercent": 100, "memoryReclaimThresholdPercent": 100,
                     "memoryCalculatePolicy": "request", "resourceDiffThreshold": 1,
                     "updateTimeThresholdSeconds": 3600}
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
# A manifest block whose info string has a second word is not for the documented helm install;
# the word says what it is for. Each such block is listed in SKIPPED (file and objects) with it.
MARKS = {
    "koordinator": "for clusters where Koordinator runs (koord-manager, koordlet)",
    "kustomize": "for the kustomize install (packaging/kustomize/overlays/*), whose namespace it names",
}
SKIPPED = {
    "README.md ConfigMap koordinator-system/slo-controller-config": "kustomize",
}
_FENCE = re.compile(r"^```(\w*)[ \t]*(\S*)")


@dataclass(frozen=True)
class DocManifest:
    where: str  # file:line of the block
    name: str  # file and its objects, "README.md ConfigMap ns/name"
    text: str
    mark: str  # the info string's second word, "" for none


def doc_manifests() -> list[DocManifest]:
    """Every fenced yaml block of README.md and docs/*.md that holds a Kubernetes object."""
    found: list[DocManifest] = []
    for path in DOCS:
        lines = path.read_text().splitlines()
        start: tuple[int, str, str] | None = None
        for i, line in enumerate(lines):
            m = _FENCE.match(line)
            if m is None:
                continue
            if start is None:
                start = (i, m.group(1), m.group(2))
                continue
            first, lang, mark = start
            start = None
            if lang not in ("yaml", "yml"):
                continue
            text = "\n".join(lines[first + 1:i])
            objects = [d for d in yaml.safe_load_all(text) if isinstance(d, dict) and "apiVersion" in d and "kind" in d]
            if objects:
                names = " ".join(f"{d['kind']} {_namespaced(d)}" for d in objects)
                rel = str(path.relative_to(REPO))
                found.append(DocManifest(f"{rel}:{first + 1}", f"{rel} {names}", text, mark))
    return found


def _namespaced(obj: dict[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return "/".join(part for part in (meta.get("namespace"), meta.get("name")) if part)


@dataclass(frozen=True)
class Install:
    """README's ``helm install`` line: the release and its namespace."""

    release: str
    namespace: str

    @property
    def instance(self) -> str:
        return f"app.kubernetes.io/instance={self.release}"


def documented_install() -> Install:
    text = (REPO / "README.md").read_text()
    m = re.search(r"^helm install (\S+) packaging/helm/runtime-hook-proxy\b(.*)$", text, re.MULTILINE)
    assert m is not None, "README shows no `helm install` of the chart"
    ns = re.search(r"(?:-n|--namespace)[ =](\S+)", m.group(2))
    return Install(m.group(1), ns.group(1) if ns else "default")


def test_the_documents_show_manifests_and_their_marks_are_the_listed_ones() -> None:
    """The extraction this module's install applies: at least one slo-controller-config, and the
    blocks marked as not for the documented helm install are the ones SKIPPED lists, each with a
    known reason."""
    manifests = doc_manifests()
    assert any(SLO_CONFIG in m.text for m in manifests), [m.where for m in manifests]
    assert {m.name: m.mark for m in manifests if m.mark} == SKIPPED
    assert set(SKIPPED.values()) <= set(MARKS)


@pytest.fixture
def documented(nri_node: Stack, tmp_path: Path) -> Iterator[tuple[Helm, Install]]:  # noqa: F811
    """helm and README's release; afterwards that release is gone (its namespace stays: it may
    be kube-system)."""
    binary = helm_binary()
    assert binary is not None
    tool = Helm(binary, nri_node, tmp_path / "helm")
    install = documented_install()
    try:
        yield tool, install
    finally:
        tool("uninstall", install.release, "-n", install.namespace, "--ignore-not-found", "--wait", "--timeout", "5m",
             check=False)  # fmt: skip
        cluster = nri_node.cluster
        cluster.kubectl("delete", "configmap", "-n", install.namespace, SLO_CONFIG, "--ignore-not-found", check=False)
        for manifest in doc_manifests():  # what the documents made, namespaces aside (it may be kube-system)
            objects = [d for d in yaml.safe_load_all(manifest.text)
                       if isinstance(d, dict) and d.get("kind") != "Namespace"]
            if objects:
                cluster.kubectl("delete", "-f", "-", "--ignore-not-found", "--wait=false",
                                input=yaml.safe_dump_all(objects), check=False)  # fmt: skip


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _install_values(stack: Stack) -> dict[str, Any]:
    cluster = stack.cluster
    webhook = free_port()
    environment = {
        # kubelet's files where this harness keeps them
        "node": {"report": {"kubeletConfigFile": str(cluster.kubelet_config_path),
                            "kubeletCPUManagerStateFile": str(cluster.work_dir / "kubelet" / "cpu_manager_state")}},
        # one node on the host network: one replica (two would share the ports)
        "manager": {"replicas": 1, "metricsPort": free_port()},
        # no Service IPs here: the API server, on this node, calls the webhook on loopback
        "webhook": {"port": webhook, "url": f"https://127.0.0.1:{webhook}/mutate-pod"},
    }
    values = _merge(_values(stack), environment)
    # test_e2e_helm's values hold more than the environment: its reports off (it writes the NRT
    # itself) and its own requests. The chart's defaults for those, as a user gets them.
    del values["node"]["report"]["enabled"]
    for part in (values["node"], values["manager"], values["scheduler"]["kubeScheduler"],
                 values["scheduler"]["extender"]):
        part.pop("resources", None)
    return values


def _pods(cluster: Cluster, install: Install, component: str) -> list[dict[str, Any]]:
    out = cluster.kubectl("get", "pods", "-n", install.namespace, "-o", "json", "-l",
                          f"{install.instance},app.kubernetes.io/component={component}").stdout  # fmt: skip
    pods: list[dict[str, Any]] = json.loads(out)["items"]
    return pods


def _labelled(cluster: Cluster, install: Install) -> list[str]:
    kinds = "all,configmaps,secrets,serviceaccounts,roles,rolebindings,clusterroles,clusterrolebindings,crds"
    out = cluster.kubectl("get", kinds, "-A", "-l", install.instance, "-o", "name").stdout
    return [line for line in out.splitlines() if line.strip()]


def _leases(cluster: Cluster, namespace: str) -> set[str]:
    out = cluster.kubectl("get", "leases", "-n", namespace, "-o", "name", check=False).stdout
    return {line for line in out.splitlines() if line.strip()}


def _slo_config(cluster: Cluster, namespace: str, burst_percent: int) -> None:
    data = {"colocation-config": json.dumps(COLOCATION_CONFIG),
            "cpu-burst-config": json.dumps({"clusterStrategy": {"policy": "cpuBurstOnly",
                                                                "cpuBurstPercent": burst_percent}})}
    cluster.apply({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": SLO_CONFIG, "namespace": namespace},
                   "data": data})


def test_after_the_documented_install_manifests_lsr_slo_config_and_be_work_and_uninstall_leaves_nothing(
        ns: str, nri_node: Stack, documented: tuple[Helm, Install], tmp_path: Path) -> None:  # noqa: F811  # fmt: skip
    # ns first: its teardown (pods deleted, sandboxes collected) runs after the proxy is back.
    stack = nri_node
    cluster = stack.cluster
    helm, install = documented
    leases_before = _leases(cluster, install.namespace)
    values_file = tmp_path / "values.yaml"
    values_file.write_text(yaml.safe_dump(_install_values(stack)))
    helm("install", install.release, str(CHART), "-n", install.namespace, "--create-namespace", "-f",
         str(values_file), "--wait", "--timeout", "8m")  # fmt: skip
    for component in ("node", "scheduler", "manager"):
        cluster.wait_for(lambda c=component: [p for p in _pods(cluster, install, c) if _ready(p)],  # type: ignore[misc]
                         what=f"the {component} pod ready", timeout=180)  # fmt: skip
    try:
        _as_a_user(stack, helm, install, ns, leases_before)
    except Exception as exc:  # what each part said, for whoever reads the failure
        raise AssertionError(f"{exc}\n{_last_lines(cluster, install)}") from exc


def _last_lines(cluster: Cluster, install: Install) -> str:
    out = []
    for component in ("node", "manager", "scheduler"):
        for pod in _pods(cluster, install, component):
            name = pod["metadata"]["name"]
            logs = cluster.kubectl("logs", "-n", install.namespace, name, "--all-containers", "--tail=40",
                                   check=False).stdout  # fmt: skip
            out.append(f"---- {name}:\n{logs[-5000:]}")
    return "\n".join(out) or "no pod of the release"


def _as_a_user(stack: Stack, helm: Helm, install: Install, ns: str, leases_before: set[str]) -> None:
    """Everything after the install, as a user (the module docstring), then the uninstall."""
    cluster = stack.cluster

    # ---- an LSR pod on exactly its CPU, from the topology the node agent reported ----------------
    nrt = cluster.wait_for(lambda: cluster.get_json("noderesourcetopology", NODE_NAME),
                           what="the NodeResourceTopology the node agent reports", timeout=180)  # fmt: skip
    assert q.CPU_TOPOLOGY in nrt["metadata"].get("annotations", {}), "reported by the node agent, not by the test"
    lsr = pod_manifest("lsr", ns, qos="LSR", requests={"cpu": "1", "memory": "32Mi"},
                       limits={"cpu": "1", "memory": "32Mi"})  # fmt: skip
    lsr["spec"]["schedulerName"] = SCHEDULER_NAME
    cluster.apply(lsr)
    pod = cluster.wait_pod_running(ns, "lsr", timeout=180)
    bound = parse_cpu_list(json.loads(pod["metadata"]["annotations"][q.RESOURCE_STATUS])["cpuset"])
    assert len(bound) == 1
    # The node agent trusts the allocation once it holds the extender's public key, which reaches
    # it through a ConfigMap volume: kubelet refreshes those at its pod sync (about a minute).
    q.wait_for(lambda: q.read_container_file(pod_cgroup(pod), container_id(pod), "cpuset.cpus"),
               format_cpu_list(bound), what="the LSR container's cpuset.cpus", timeout=240)  # fmt: skip
    cluster.kubectl("delete", "pod", "-n", ns, "lsr", "--wait=true", "--timeout=120s")

    # ---- slo-controller-config: co-location on, CPU burst 50 %; then 80 % ------------------------
    _slo_config(cluster, install.namespace, 50)

    def node_slo_burst() -> int | None:
        slo = cluster.get_json("nodeslo", NODE_NAME) or {}
        percent = slo.get("spec", {}).get("cpuBurstStrategy", {}).get("cpuBurstPercent")
        return int(percent) if percent is not None else None

    q.wait_for(node_slo_burst, 50, what="the NodeSLO the manager renders from slo-controller-config", timeout=120)
    cluster.apply(pod_manifest("ls", ns, qos="LS", requests={"cpu": "100m", "memory": "32Mi"}, limits={"cpu": "1"}))
    ls = cluster.wait_pod_running(ns, "ls", timeout=180)

    def burst() -> str:
        return q.read_container_file(pod_cgroup(ls), container_id(ls), "cpu.cfs_burst_us")

    q.wait_for(burst, "50000", what="the LS container's cpu.cfs_burst_us from cpuBurstPercent 50", timeout=120)
    _slo_config(cluster, install.namespace, 80)
    q.wait_for(node_slo_burst, 80, what="the NodeSLO after the ConfigMap changed", timeout=120)
    q.wait_for(burst, "80000", what="cpu.cfs_burst_us after the ConfigMap changed", timeout=120)

    # ---- BE pods with batch requests: webhook off (the release namespace, which it never serves:
    # the node agent reads the pod spec) and on (a user namespace: the webhook's annotation) -------
    def published() -> int | None:
        allocatable = (cluster.get_json("node", NODE_NAME) or {}).get("status", {}).get("allocatable", {})
        if BATCH_CPU not in allocatable or BATCH_MEMORY not in allocatable:
            return None
        return int(allocatable[BATCH_CPU]) // 2 or None

    # The manager computes batch-cpu from the machine's usage (other work on this 2-CPU machine
    # counts as system usage): each pod asks for issue 36's 500 milli-cores, or less when less
    # was published, and its limits follow from what it asked for.
    half = cluster.wait_for(published, what="batch resources the manager publishes from the node's NodeMetric",
                            timeout=300)  # fmt: skip
    milli = min(ISSUE_36_CPU, half)
    be_pods = {"node side": (install.namespace, "rhp-e2e-be-no-webhook"), "webhook": (ns, "be")}
    for namespace, name in be_pods.values():
        cluster.apply(be_pod(name, namespace, milli_cpu=milli))
    try:
        for path, (namespace, name) in be_pods.items():
            be = cluster.wait_pod_running(namespace, name, timeout=300)
            annotated = q.EXTENDED_RESOURCE_SPEC in be["metadata"].get("annotations", {})
            assert annotated == (path == "webhook"), f"{path} path: extended-resource-spec annotation {annotated}"
            wait_batch_limits(be, milli_cpu=milli)
    finally:
        for namespace, name in be_pods.values():
            cluster.kubectl("delete", "pod", "-n", namespace, name, "--wait=true", "--timeout=120s", check=False)
    cluster.kubectl("delete", "pod", "-n", ns, "ls", "--wait=true", "--timeout=120s")

    # ---- every manifest of README and docs applies as written (checked after the uninstall's) -----
    failed: dict[str, str] = {}
    for manifest in doc_manifests():
        if manifest.mark:  # not for this install (SKIPPED says why)
            continue
        proc = cluster.kubectl("apply", "-f", "-", input=manifest.text, check=False)
        if proc.returncode != 0:
            failed[manifest.where] = (proc.stderr or proc.stdout).strip()[-400:]

    # ---- uninstall: no Lease the release took; the CRDs only, kept on purpose --------------------
    helm("uninstall", install.release, "-n", install.namespace, "--wait", "--timeout", "5m")
    cluster.wait_for(lambda: all(line.startswith("customresourcedefinition") for line in _labelled(cluster, install))
                     or None, what="no object with the release's label but its kept CRDs", timeout=120)  # fmt: skip
    for crd in _crd_names():  # kept with their objects (helm.sh/resource-policy: keep; docs/helm.md)
        live = cluster.get_json("crd", crd)
        assert live is not None and live["metadata"]["annotations"].get("helm.sh/resource-policy") == "keep", crd
    cluster.wait_for(lambda: _leases(cluster, install.namespace) <= leases_before or None,
                     what=f"no Lease of the release left in {install.namespace}", timeout=120)  # fmt: skip
    assert failed == {}, "manifests of the documents that do not apply after the documented install"
