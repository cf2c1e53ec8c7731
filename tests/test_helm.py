"""The Helm chart ``packaging/helm/runtime-hook-proxy``: ``helm lint`` passes and ``helm template``
renders, for the defaults and for every switch, objects that load as the kubernetes client's
models without losing a key; values the schema refuses are refused; the pods' commands parse with
our CLIs and their probes name their ports; RBAC grants eviction only with eviction, reporting
rights only with reporting; the node config is the host package's; and each kustomize overlay
renders the same node config, RBAC and containers as the chart with the matching values (the
overlays stay in step with the chart: docs/helm.md).

helm comes from ``scripts/build-helm.sh`` (``scripts/install-deps.sh`` runs it); without it these
tests skip, unless ``RHP_REQUIRE_HELM=1``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml
from rhp_devenv.kube import NEWEST_KUBE_VERSION

from tests.image_refs import image_refs
from tests.test_packaging import HOST_CONFIG, _policies, render

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "packaging" / "helm" / "runtime-hook-proxy"
CRDS = REPO / "packaging" / "crds"
RELEASE, NAMESPACE = "rhp", "kube-system"
FULL = f"{RELEASE}-runtime-hook-proxy"
EVICTION_PLUGINS = {"memory_evict", "cpu_evict"}


def helm_binary() -> Path | None:
    """The helm that scripts/build-helm.sh built (or would build), else one on PATH."""
    proc = subprocess.run(["bash", str(REPO / "scripts" / "build-helm.sh"), "--print-path"], capture_output=True,
                          text=True, timeout=60, check=False)  # fmt: skip
    built = Path(proc.stdout.strip()) if proc.returncode == 0 and proc.stdout.strip() else None
    if built is not None and built.is_file():
        return built
    found = shutil.which("helm")
    return Path(found) if found else None


HELM = helm_binary()


def _helm() -> Path:
    if HELM is None:
        reason = "helm is not built: run scripts/build-helm.sh (scripts/install-deps.sh does)"
        if os.environ.get("RHP_REQUIRE_HELM", "") not in ("", "0"):
            pytest.fail(reason + " (RHP_REQUIRE_HELM is set)")
        pytest.skip(reason)
    return HELM


def run_helm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(_helm()), *args], capture_output=True, text=True, timeout=120, check=False)


_rendered: dict[str, list[dict[str, Any]]] = {}


def template(values: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """``helm template`` of the chart with *values* (a values file), as objects."""
    key = json.dumps(values or {}, sort_keys=True)
    if key not in _rendered:
        args = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE]
        if values:
            args += ["--values", "-"]
        proc = subprocess.run([str(_helm()), *args], input=yaml.safe_dump(dict(values or {})), capture_output=True,
                              text=True, timeout=120, check=False)  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        _rendered[key] = [d for d in yaml.safe_load_all(proc.stdout) if d]
    return _rendered[key]


def kinds(values: Mapping[str, Any] | None = None) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for doc in template(values):
        out.setdefault(doc["kind"], []).append(doc)
    return out


def one(values: Mapping[str, Any] | None, kind: str, name: str) -> dict[str, Any]:
    (found,) = [d for d in kinds(values).get(kind, []) if d["metadata"]["name"] == name]
    return found


def containers(doc: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in doc["spec"]["template"]["spec"]["containers"]}


def node_config(values: Mapping[str, Any] | None = None) -> dict[str, Any]:
    config: dict[str, Any] = yaml.safe_load(one(values, "ConfigMap", f"{FULL}-node")["data"]["config.yaml"])
    return config


def granted(role: Mapping[str, Any]) -> set[tuple[str, str, str]]:
    return {(group, res, verb) for rule in role["rules"] for group in rule["apiGroups"]
            for res in rule["resources"] for verb in rule["verbs"]}  # fmt: skip


def cluster_roles(values: Mapping[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    return {r["metadata"]["name"]: r for r in kinds(values).get("ClusterRole", [])}


EVERYTHING: dict[str, Any] = {"podMonitors": {"enabled": True},
                              "apiServer": {"host": "127.0.0.1", "port": 6443}, "hostNetwork": True}
KOORDINATOR: dict[str, Any] = {"koordinator": {"present": True}}
# What the chart did before koordinator.present: no manager, webhook, reports, PriorityClasses or hook.
BARE: dict[str, Any] = {"manager": {"enabled": False}, "node": {"report": {"enabled": False}},
                        "priorityClasses": {"install": False}, "leaseCleanup": {"enabled": False}}
VARIANTS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "everything": EVERYTHING,
    "hook-server": {"node": {"mode": "hook-server"}},
    "no-eviction": {"node": {"eviction": {"enabled": False}}},
    "evict-by-api": {"node": {"eviction": {"by": "api"}}},
    "no-crds-no-scheduler": {"crds": {"install": False}, "scheduler": {"enabled": False}},
    "koordinator-present": KOORDINATOR,
    "bare": BARE,
    "no-webhook": {"webhook": {"enabled": False}},
    "webhook-cert-manager": {"webhook": {"certificate": {"source": "cert-manager"}}},
    "webhook-url": {"webhook": {"url": "https://127.0.0.1:9443/mutate-pod"}, "hostNetwork": True},
    "local-images": {"image": {"registry": "", "pullPolicy": "Never",
                               "node": {"repository": "localhost/runtime-hook-proxy-node", "tag": "0.1.0"},
                               "cluster": {"repository": "localhost/runtime-hook-proxy-cluster", "tag": "0.1.0"}}},
}


def test_helm_lint_passes_strictly() -> None:
    proc = run_helm("lint", "--strict", str(CHART))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = run_helm("lint", "--strict", str(CHART), "--set", "manager.enabled=true,podMonitors.enabled=true,"
                    "node.mode=hook-server,node.report.enabled=true")  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_rendered_object_loads_as_a_kubernetes_model_without_losing_a_key(variant: str) -> None:
    from kubernetes import client

    api = client.ApiClient()
    for doc in template(VARIANTS[variant]):
        labels = doc["metadata"].get("labels", {})
        assert labels.get("app.kubernetes.io/instance") == RELEASE, f"{doc['kind']}/{doc['metadata']['name']}"
        if doc["kind"] in ("CustomResourceDefinition", "PodMonitor", "Issuer", "Certificate"):
            continue  # CRDs: tests/formats/test_crds.py; the others: no model in the client
        model = api.deserialize(json.dumps(doc), f"V1{doc['kind']}", "application/json")
        assert api.sanitize_for_serialization(model) == doc, f"{doc['kind']}/{doc['metadata']['name']}: a key " \
            "the model does not know was dropped"


@pytest.mark.parametrize(("values", "error"), [
    ({"node": {"mode": "proxy"}}, "/node/mode"),
    ({"node": {"plugins": [{"name": "cpuset", "policy": "Sometimes"}]}}, "/node/plugins/0/policy"),
    ({"apiServer": {"host": "127.0.0.1", "port": ""}}, "/apiServer/port"),
    ({"apiServer": {"host": "", "port": 6443}}, "/apiServer/port"),
    ({"scheduler": {"extender": {"port": 0}}}, "/scheduler/extender/port"),
    ({"scheduler": {"schedulerName": "Not A Name"}}, "/scheduler/schedulerName"),
    ({"node": {"typo": True}}, "typo"),
    ({"image": {"pullPolicy": "Sometimes"}}, "/image/pullPolicy"),
    ({"node": {"nri": {"runtimeSocketPath": "containerd.sock"}}}, "/node/nri/runtimeSocketPath"),
])  # fmt: skip
def test_the_schema_refuses_values_that_cannot_work(values: dict[str, Any], error: str) -> None:
    proc = subprocess.run([str(_helm()), "template", RELEASE, str(CHART), "--values", "-"],
                          input=yaml.safe_dump(values), capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode != 0
    assert "schema" in proc.stderr and error in proc.stderr, proc.stderr


def test_the_defaults_install_the_node_agent_our_scheduler_the_manager_and_the_crds() -> None:
    k = kinds()
    assert [d["metadata"]["name"] for d in k["DaemonSet"]] == [f"{FULL}-node"]
    assert sorted(d["metadata"]["name"] for d in k["Deployment"]) == [f"{FULL}-manager", f"{FULL}-scheduler"]
    assert "PodMonitor" not in k
    crds = {c["metadata"]["name"] for c in k["CustomResourceDefinition"]}
    assert crds == {yaml.safe_load(p.read_text())["metadata"]["name"] for p in CRDS.glob("*.yaml")
                    if p.name != "kustomization.yaml"}  # fmt: skip
    assert not kinds({"crds": {"install": False}}).get("CustomResourceDefinition")
    for doc in template():
        for container in doc.get("spec", {}).get("template", {}).get("spec", {}).get("containers", []):
            if container["name"] != "kube-scheduler":
                assert container["image"] in image_refs().values()  # what packaging/image/build.sh names
            env = {e["name"] for e in container.get("env", [])}
            assert "KUBERNETES_SERVICE_HOST" not in env, "the pod's own API address unless apiServer is set"


def _kube_scheduler_image(kube_version: str, values: Mapping[str, Any] | None = None) -> str:
    proc = subprocess.run([str(_helm()), "template", RELEASE, str(CHART), "--namespace", NAMESPACE,
                           f"--kube-version={kube_version}", "--values", "-"],
                          input=yaml.safe_dump(dict(values or {})), capture_output=True, text=True, timeout=120,
                          check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (deployment,) = [d for d in yaml.safe_load_all(proc.stdout)
                     if d and d["kind"] == "Deployment" and d["metadata"]["name"] == f"{FULL}-scheduler"]
    return str(containers(deployment)["kube-scheduler"]["image"])


@pytest.mark.parametrize(
    ("kube_version", "values", "expected"),
    [
        pytest.param("v1.35.1", None, "v1.35.1", id="the cluster's own release"),
        pytest.param("v1.34.0", None, "v1.34.0", id="the oldest supported minor"),
        pytest.param("v1.38.2", None, "v1.38.2", id="a newer cluster gets its own release"),
        pytest.param("v1.33.9", None, NEWEST_KUBE_VERSION, id="below the supported range: the newest tested"),
        pytest.param("v1.36.0", {"scheduler": {"kubeScheduler": {"image": {"tag": "v1.34.4"}}}}, "v1.34.4",
                     id="a tag set by the user wins"),
    ],
)
def test_kube_scheduler_follows_the_clusters_version(kube_version: str, values: Mapping[str, Any] | None,
                                                     expected: str) -> None:
    """Without a tag, kube-scheduler's image is the cluster's own release (helm's
    Capabilities.KubeVersion at install, --kube-version offline), so upstream's version skew
    policy holds; on the old main it was v1.34.4 whatever the cluster ran."""
    assert _kube_scheduler_image(kube_version, values) == f"registry.k8s.io/kube-scheduler:{expected}"


def test_the_images_are_the_built_ones_and_the_upstream_kube_scheduler() -> None:
    daemonset = one(None, "DaemonSet", f"{FULL}-node")
    assert containers(daemonset)["node-agent"]["image"] == image_refs()["node"]
    scheduler = containers(one(None, "Deployment", f"{FULL}-scheduler"))
    # offline (helm's own default version, below 1.34): the newest release the harness tests
    assert scheduler["kube-scheduler"]["image"] == f"registry.k8s.io/kube-scheduler:{NEWEST_KUBE_VERSION}"
    assert scheduler["kube-scheduler"]["command"][0] == "kube-scheduler"
    assert scheduler["scheduler-ext"]["image"] == image_refs()["cluster"]
    local = VARIANTS["local-images"]
    daemonset = one(local, "DaemonSet", f"{FULL}-node")
    assert containers(daemonset)["node-agent"]["image"] == "localhost/runtime-hook-proxy-node:0.1.0"
    assert containers(daemonset)["node-agent"]["imagePullPolicy"] == "Never"


def test_api_server_and_host_network_values_reach_every_pod() -> None:
    for doc in kinds(EVERYTHING)["DaemonSet"] + kinds(EVERYTHING)["Deployment"]:
        spec = doc["spec"]["template"]["spec"]
        assert spec["hostNetwork"] is True and spec["dnsPolicy"] == "ClusterFirstWithHostNet"
        if doc["kind"] == "Deployment":
            # The new pod's host ports are the old pod's: it could never start beside it.
            assert doc["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
        for container in spec["containers"]:
            env = {e["name"]: e.get("value") for e in container["env"]}
            assert env["KUBERNETES_SERVICE_HOST"] == "127.0.0.1" and env["KUBERNETES_SERVICE_PORT"] == "6443"


def test_the_scheduler_pod_runs_kube_scheduler_with_the_extender_on_loopback() -> None:
    from scheduler_ext.cli import build_parser

    config_map = one(None, "ConfigMap", f"{FULL}-scheduler")
    config = yaml.safe_load(config_map["data"]["config.yaml"])
    assert config["kind"] == "KubeSchedulerConfiguration"
    assert config["profiles"] == [{"schedulerName": "runtime-hook-proxy-scheduler"}]
    assert "clientConnection" not in config, "the pod's service account"
    (extender,) = config["extenders"]
    deployment = one(None, "Deployment", f"{FULL}-scheduler")
    pod = containers(deployment)
    args = build_parser().parse_args(pod["scheduler-ext"]["command"][1:])
    assert args.command == "serve" and args.in_cluster and not args.signing_key_file
    assert args.key_secret == f"{FULL}-signing-key" and args.public_keys_configmap == f"{FULL}-public-keys"
    assert args.listen.startswith("127.0.0.1:") and not args.tls_cert and not args.insecure
    assert extender["urlPrefix"] == f"http://{args.listen}"
    assert extender["bindVerb"] == "bind" and extender["nodeCacheCapable"] is True and extender["ignorable"] is False
    assert args.ledger_namespace == NAMESPACE
    health = int(args.health_listen.rsplit(":", 1)[1])
    assert pod["scheduler-ext"]["ports"] == [{"name": "metrics", "containerPort": health}]
    assert pod["scheduler-ext"]["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert pod["scheduler-ext"]["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    kube = pod["kube-scheduler"]
    assert "--config=/etc/kube-scheduler/config.yaml" in kube["command"]
    assert kube["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
    for container in pod.values():
        assert container["securityContext"]["runAsNonRoot"] is True
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert volumes["config"]["configMap"]["name"] == config_map["metadata"]["name"]
    assert set(volumes) == {"config", "scheduler-tmp"}, "no key is mounted: the extender reads its Secret"
    mine = kinds({**BARE, "scheduler": {"signingKey": {"secretName": "my-key", "publicKeysConfigMap": "my-public"}}})
    (deployment,) = mine["Deployment"]
    args = build_parser().parse_args(containers(deployment)["scheduler-ext"]["command"][1:])
    assert (args.key_secret, args.public_keys_configmap) == ("my-key", "my-public")
    (role,) = [r for r in mine["Role"] if r["metadata"]["name"].endswith("-signing-keys")]
    assert {n for rule in role["rules"] for n in rule.get("resourceNames", [])} == {"my-key", "my-public"}
    (ds,) = mine["DaemonSet"]
    keys_volume = {v["name"]: v for v in ds["spec"]["template"]["spec"]["volumes"]}["public-keys"]
    assert keys_volume["configMap"] == {"name": "my-public", "optional": True}


def test_no_key_material_is_made_in_a_template_and_two_renders_are_the_same() -> None:
    """Issue 37 item 2: the chart made its seal key with lookup and randAlphaNum, so every
    ``helm template`` (GitOps, docs/helm.md) and every reinstall rendered a new key. Now nothing
    secret is rendered: two renders are byte-identical and hold no Secret; the extender keeps
    its key in a Secret it creates itself, outside the release."""
    args = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE]
    first, second = run_helm(*args), run_helm(*args)
    assert first.returncode == 0 and first.stdout == second.stdout
    docs = [d for d in yaml.safe_load_all(first.stdout) if d]
    assert not [d["metadata"]["name"] for d in docs if d["kind"] == "Secret" and (d.get("data") or d.get("stringData"))]
    templates = "".join(p.read_text() for p in (CHART / "templates").iterdir())
    for maker in ("randAlphaNum", "randAscii", "genPrivateKey", "genCA", "genSelfSignedCert"):
        assert maker not in templates, maker
    (ds,) = [d for d in docs if d["kind"] == "DaemonSet"]
    config = node_config({})
    assert config["allocationTrust"] == {"publicKeyFiles": ["/etc/runtime-hook-proxy-keys/public-keys"],
                                         "acceptUnsigned": False}  # fmt: skip
    (agent,) = ds["spec"]["template"]["spec"]["containers"]
    mounts = {m["name"]: m["mountPath"] for m in agent["volumeMounts"]}
    assert mounts["public-keys"] == "/etc/runtime-hook-proxy-keys"
    beside_koord = node_config({"scheduler": {"enabled": False}})
    assert "allocationTrust" not in beside_koord, "without our scheduler, unsigned cpusets count (Koordinator's)"


def test_the_scheduler_service_account_has_kube_schedulers_roles_and_the_extenders_rights() -> None:
    bindings = {b["metadata"]["name"]: b for b in kinds()["ClusterRoleBinding"]}
    sa = {"kind": "ServiceAccount", "name": f"{FULL}-scheduler", "namespace": NAMESPACE}
    refs = {b["roleRef"]["name"] for b in bindings.values() if b["subjects"] == [sa]}
    assert refs == {"system:kube-scheduler", "system:volume-scheduler", f"{FULL}-scheduler-extender"}
    packaged = yaml.safe_load_all((REPO / "packaging" / "scheduler" / "rbac.yaml").read_text())
    (ours,) = [d for d in packaged if d["kind"] == "ClusterRole"]
    load_aware: dict[str, Any] = {"scheduler": {"extender": {"config": {"loadAware": {}}}}}
    extender = granted(cluster_roles(load_aware)[f"{FULL}-scheduler-extender"])
    assert extender == granted(ours), "the same rights as packaging/scheduler/rbac.yaml"
    node_metrics = {("slo.koordinator.sh", "nodemetrics", verb) for verb in ("get", "list", "watch")}
    assert granted(cluster_roles()[f"{FULL}-scheduler-extender"]) == extender - node_metrics, \
        "NodeMetrics only for load-aware scheduling"
    (deployment,) = kinds({**BARE, **load_aware})["Deployment"]
    (config_map,) = [c for c in kinds(load_aware)["ConfigMap"] if c["metadata"]["name"] == f"{FULL}-scheduler"]
    assert yaml.safe_load(config_map["data"]["extender.yaml"]) == {"loadAware": {}}
    assert "--config=/etc/scheduler-ext/config/extender.yaml" in containers(deployment)["scheduler-ext"]["command"]
    assert not [a for a in containers(one(None, "Deployment", f"{FULL}-scheduler"))["scheduler-ext"]["command"]
                if a.startswith("--config")]  # fmt: skip
    (lease_role,) = [r for r in kinds(BARE)["Role"] if r["metadata"]["name"].endswith("-leases")]
    assert lease_role["metadata"]["namespace"] == NAMESPACE
    assert granted(lease_role) == {("coordination.k8s.io", "leases", v) for v in ("get", "create", "update")}


def test_the_nri_node_agent_command_parses_and_serves_probes_on_its_metrics_port() -> None:
    from runtime_proxy.commands.nri import add_parser

    daemonset = one(None, "DaemonSet", f"{FULL}-node")
    container = containers(daemonset)["node-agent"]
    assert container["command"][:2] == ["runtime-proxy", "nri"]
    assert "--no-entry-points" not in container["command"]
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(container["command"][1:])
    assert args.metrics_addr == "0.0.0.0:9464" and args.hook_server_dir is None
    assert container["ports"] == [{"name": "metrics", "containerPort": 9464}]
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    spec = daemonset["spec"]["template"]["spec"]
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes[mounts[str(Path(args.nri_socket).parent)]]["hostPath"] == {"path": "/var/run/nri",
                                                                             "type": "DirectoryOrCreate"}  # fmt: skip
    host_paths = {v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    kubelet = {"/var/lib/kubelet/config.yaml", "/var/lib/kubelet/cpu_manager_state"}  # the reports', read-only
    assert volumes[mounts["/run/containerd"]]["hostPath"] == {"path": "/run/containerd", "type": "DirectoryOrCreate"}
    assert {m["mountPath"]: m.get("readOnly") for m in container["volumeMounts"]}["/run/containerd"] is True
    assert args.backend == "/run/containerd/containerd.sock"
    assert host_paths == {"/var/run/nri", "/run/containerd", "/sys/fs/cgroup"} | kubelet, "nothing else of the host"
    assert not spec.get("hostNetwork") and not spec.get("hostPID") and not spec.get("hostIPC")
    ctx = container["securityContext"]
    assert ctx.get("privileged") is not True and ctx["allowPrivilegeEscalation"] is False
    assert ctx["capabilities"] == {"drop": ["ALL"]} and ctx["readOnlyRootFilesystem"] is True
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]
    # Other hook servers: only where asked for, read-only.
    calls = one({"node": {"hookServerDir": "/etc/runtime/hookserver.d"}}, "DaemonSet", f"{FULL}-node")
    assert "--hook-server-dir=/etc/runtime/hookserver.d" in containers(calls)["node-agent"]["command"]


@pytest.mark.parametrize(("socket", "backend", "mounted"), [
    pytest.param("", None, set(), id="empty: no --backend, containerd's directory not mounted"),
    pytest.param("/var/run/nri/containerd.sock", "/var/run/nri/containerd.sock", {"/var/run/nri"},
                 id="in the NRI socket's directory: mounted once"),
    pytest.param("/run/k3s/containerd/containerd.sock", "/run/k3s/containerd/containerd.sock",
                 {"/var/run/nri", "/run/k3s/containerd"}, id="elsewhere: its directory, read-only"),
])  # fmt: skip
def test_the_nri_node_agent_reaches_containerds_cri_only_where_the_values_say(
    socket: str, backend: str | None, mounted: set[str]
) -> None:
    """``node.nri.runtimeSocketPath``: where updates no NRI reply carried go (docs/nri.md)."""
    from runtime_proxy.commands.nri import add_parser

    daemonset = one({"node": {"nri": {"runtimeSocketPath": socket}}}, "DaemonSet", f"{FULL}-node")
    container = containers(daemonset)["node-agent"]
    expected = [f"--backend={backend}"] if backend else []
    assert [a for a in container["command"] if a.startswith("--backend")] == expected
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers(dest="command"))
    parser.parse_args(container["command"][1:])
    candidates = ("/var/run/nri", "/run/k3s/containerd", "/run/containerd")
    sockets = {m["mountPath"] for m in container["volumeMounts"] if m["mountPath"] in candidates}
    assert sockets == mounted | {"/var/run/nri"}
    assert all(m.get("readOnly") for m in container["volumeMounts"] if m["mountPath"] in sockets)


def test_the_hook_server_node_agent_command_parses_and_registers_its_host_path() -> None:
    from runtime_proxy.commands import hook_server

    values = VARIANTS["hook-server"]
    daemonset = one(values, "DaemonSet", f"{FULL}-node")
    container = containers(daemonset)["node-agent"]
    assert container["command"][:2] == ["runtime-proxy", "hook-server"]
    parser = argparse.ArgumentParser()
    hook_server.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(container["command"][1:])
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in daemonset["spec"]["template"]["spec"]["volumes"]}
    socket_dir = str(Path(args.listen).parent)
    assert volumes[mounts[socket_dir]]["hostPath"]["path"] == socket_dir, "the registered endpoint is the host's path"
    assert volumes[mounts[args.register_dir]]["hostPath"]["path"] == "/etc/runtime/hookserver.d"
    # Metrics and probes that ask the server itself (/readyz: its hook socket accepts).
    assert args.metrics_addr == "0.0.0.0:9464"
    assert container["ports"] == [{"name": "metrics", "containerPort": 9464}]
    for probe, path in (("startupProbe", "/readyz"), ("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        assert container[probe]["httpGet"] == {"path": path, "port": "metrics"}, probe
    assert [p for p in kinds({**values, "podMonitors": {"enabled": True}})["PodMonitor"]
            if p["metadata"]["name"].endswith("-node")], "the hook server's metrics are scraped too"


@pytest.mark.parametrize("variant", ["defaults", "hook-server", "everything"])
def test_the_node_config_is_valid_and_runs_the_host_packages_plugins(variant: str, tmp_path: Path) -> None:
    from runtime_proxy.config import load_config

    config = node_config(VARIANTS[variant])
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    assert load_config(str(path)).fromCluster is True
    assert _policies(config) == _policies(yaml.safe_load(HOST_CONFIG.read_text()))
    assert "cgroupDriver" not in config, "detected at start"


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_the_eviction_grant_goes_with_the_eviction_plugins(variant: str) -> None:
    values = VARIANTS[variant]
    config = node_config(values)
    evicts = bool({p["name"] for p in config["plugins"]} & EVICTION_PLUGINS)
    by = config.get("usageLoop", {}).get("evictBy")
    grants = {g for role in cluster_roles(values).values() for g in granted(role)}
    assert (("", "pods/eviction", "create") in grants) == (evicts and by == "api")
    assert (("", "pods", "delete") in grants) == (evicts and by == "delete")
    assert evicts == (variant != "no-eviction")
    assert by == (None if not evicts else "api" if variant == "evict-by-api" else "delete"), \
        "the chart evicts by delete unless told otherwise: only a delete can be held to the node"


def test_reporting_rights_and_mounts_only_with_reporting(tmp_path: Path) -> None:
    from runtime_proxy.config import load_config
    from tests.test_packaging_report import REPORT_RIGHTS

    for off in (BARE, KOORDINATOR):
        assert f"{FULL}-node-report" not in cluster_roles(off)
        assert "report" not in node_config(off)
    roles = cluster_roles(EVERYTHING)
    assert granted(roles[f"{FULL}-node-report"]) == REPORT_RIGHTS
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(node_config(EVERYTHING)))
    config = load_config(str(path))
    assert config.report.enable and not config.report.createNodeMetric
    daemonset = one(EVERYTHING, "DaemonSet", f"{FULL}-node")
    mounts = {m["mountPath"]: m for m in containers(daemonset)["node-agent"]["volumeMounts"]}
    assert mounts[config.report.kubeletConfigFile]["readOnly"] is True
    assert mounts[config.report.kubeletCPUManagerStateFile]["readOnly"] is True


def test_the_manager_runs_with_the_rights_it_uses() -> None:
    from scheduler_ext.cli import build_parser

    no_webhook = {"webhook": {"enabled": False}}
    deployment = one(no_webhook, "Deployment", f"{FULL}-manager")
    container = containers(deployment)["manager"]
    args = build_parser().parse_args(container["command"][1:])
    assert args.command == "manager" and args.in_cluster and not args.webhook_listen
    assert (args.config_namespace, args.lease_namespace, args.lease_name) == (NAMESPACE, NAMESPACE, f"{FULL}-manager")
    assert container["ports"] == [{"name": "metrics", "containerPort": int(args.metrics_listen.rsplit(":", 1)[1])}]
    role = cluster_roles(no_webhook)[f"{FULL}-manager"]
    writes = {(res, verb) for _, res, verb in granted(role) if verb in ("create", "update", "patch", "delete")}
    assert writes == {("nodes/status", "patch"), ("nodes", "patch"), ("noderesourcetopologies", "patch")} | {
        (kind, verb) for kind in ("nodemetrics", "nodeslos") for verb in ("create", "patch", "delete")}
    assert not {res for _, res, _ in granted(role)} & {"clustercolocationprofiles", "namespaces", "priorityclasses"}, \
        "the webhook's reads only with the webhook"
    assert "MutatingWebhookConfiguration" not in kinds(no_webhook)


def test_pod_monitors_scrape_each_part_with_metrics() -> None:
    monitors = {m["metadata"]["name"]: m for m in kinds(EVERYTHING)["PodMonitor"]}
    assert set(monitors) == {f"{FULL}-{part}" for part in ("node", "scheduler", "manager")}
    for name, monitor in monitors.items():
        part = name.rsplit("-", 1)[1]
        assert monitor["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] == part
        assert monitor["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"


# ---- the kustomize overlays stay in step with the chart ------------------------------------------


def _normalized_container(container: Mapping[str, Any]) -> dict[str, Any]:
    """What both renderings must agree on: the command, ports, probes, resources, security and
    the mounts; not the image (set per overlay) or names."""
    keep = ("ports", "livenessProbe", "readinessProbe", "startupProbe", "resources", "securityContext")
    out = {k: container.get(k) for k in keep}
    out["command"] = [*container["command"][:2], *sorted(container["command"][2:])]
    out["mounts"] = sorted((m["mountPath"], bool(m.get("readOnly"))) for m in container.get("volumeMounts", [])
                           if m["mountPath"] != "/tmp")  # fmt: skip
    return out


def _config_model(config_map: Mapping[str, Any]) -> dict[str, Any]:
    from runtime_proxy.config import ProxyConfig

    dumped: dict[str, Any] = ProxyConfig.model_validate(yaml.safe_load(config_map["data"]["config.yaml"])).model_dump()
    return dumped


def _host_paths(doc: Mapping[str, Any]) -> set[tuple[str, str]]:
    return {(v["hostPath"]["path"], v["hostPath"].get("type", "")) for v in doc["spec"]["template"]["spec"]["volumes"]
            if "hostPath" in v}  # fmt: skip


def _grants_by_role(docs: Sequence[Mapping[str, Any]], prefix: str) -> dict[str, set[tuple[str, str, str]]]:
    return {d["metadata"]["name"].removeprefix(prefix): granted(d) for d in docs if d["kind"] == "ClusterRole"}


_BY_API = {"eviction": {"enabled": True, "by": "api"}}  # the overlays' eviction component


@pytest.mark.parametrize(("overlay", "values"), [
    ("node", {"node": {"report": {"enabled": False}, **_BY_API}}),
    ("node-hook-server", {"node": {"mode": "hook-server", "report": {"enabled": False}, **_BY_API}}),
    ("node-colocation", {"node": _BY_API}),
])  # fmt: skip
def test_each_node_overlay_renders_what_the_chart_renders(overlay: str, values: dict[str, Any]) -> None:
    # the overlays have no scheduler of their own: their node agents verify no signature unless
    # given public keys (docs/signing.md), as the chart's do without its scheduler
    values = {**values, "scheduler": {"enabled": False}}
    ours = [d for d in template(values) if d["metadata"].get("labels", {}).get("app.kubernetes.io/component")
            in ("node", None) or d["kind"] == "CustomResourceDefinition"]  # fmt: skip
    theirs = render(overlay)
    (chart_config,) = [d for d in ours if d["kind"] == "ConfigMap"]
    (kustomize_config,) = [d for d in theirs if d["kind"] == "ConfigMap"]
    assert _config_model(chart_config) == _config_model(kustomize_config)
    assert _grants_by_role(ours, f"{FULL}-") == _grants_by_role(theirs, "runtime-hook-proxy-")
    (chart_ds,) = [d for d in ours if d["kind"] == "DaemonSet"]
    (kustomize_ds,) = [d for d in theirs if d["kind"] == "DaemonSet"]
    (chart_container,) = chart_ds["spec"]["template"]["spec"]["containers"]
    (kustomize_container,) = kustomize_ds["spec"]["template"]["spec"]["containers"]
    assert _normalized_container(chart_container) == _normalized_container(kustomize_container)
    assert _host_paths(chart_ds) == _host_paths(kustomize_ds)
    chart_crds = {d["metadata"]["name"] for d in ours if d["kind"] == "CustomResourceDefinition"}
    kustomize_crds = {d["metadata"]["name"] for d in theirs if d["kind"] == "CustomResourceDefinition"}
    assert kustomize_crds <= chart_crds


def test_the_manager_overlay_renders_what_the_chart_renders() -> None:
    chart = containers(one({"webhook": {"enabled": False}}, "Deployment", f"{FULL}-manager"))["manager"]
    (kustomize_deployment,) = [d for d in render("manager") if d["kind"] == "Deployment"]
    (theirs,) = kustomize_deployment["spec"]["template"]["spec"]["containers"]
    assert chart["command"][:3] == theirs["command"][:3] == ["scheduler-ext", "manager", "--in-cluster"]
    assert chart["resources"] == theirs["resources"]
    (role,) = [d for d in render("manager") if d["kind"] == "ClusterRole"]
    webhook_reads = {g for g in granted(role) if g[1] in ("clustercolocationprofiles", "namespaces", "priorityclasses")}
    assert granted(cluster_roles({"webhook": {"enabled": False}})[f"{FULL}-manager"]) == granted(role) - webhook_reads


# ---- koordinator.present, the webhook, the PriorityClasses, the requests -------------------------


def test_koordinator_present_leaves_the_manager_webhook_reports_and_priority_classes_to_koordinator() -> None:
    k = kinds()
    assert {d["metadata"]["name"]: d["value"] for d in k["PriorityClass"]} == {
        "koord-prod": 9000, "koord-mid": 7000, "koord-batch": 5000, "koord-free": 3000}
    assert all(d["globalDefault"] is False for d in k["PriorityClass"])
    assert [d["metadata"]["name"] for d in k["MutatingWebhookConfiguration"]] == [FULL]
    assert node_config()["report"]["enable"] is True
    present = kinds(KOORDINATOR)
    assert [d["metadata"]["name"] for d in present["Deployment"]] == [f"{FULL}-scheduler"]
    for kind in ("PriorityClass", "MutatingWebhookConfiguration", "Service"):
        assert kind not in present
    assert "report" not in node_config(KOORDINATOR)
    # Their own switches cannot turn them back on beside Koordinator.
    forced = kinds({**KOORDINATOR, "manager": {"enabled": True}, "node": {"report": {"enabled": True}},
                    "priorityClasses": {"install": True}})  # fmt: skip
    assert "PriorityClass" not in forced and len(forced["Deployment"]) == 1


def _manager_args(values: Mapping[str, Any] | None) -> argparse.Namespace:
    from scheduler_ext.cli import build_parser

    container = containers(one(values, "Deployment", f"{FULL}-manager"))["manager"]
    return build_parser().parse_args(container["command"][1:])


def test_the_webhook_without_cert_manager_is_issued_by_the_manager_and_reached_through_a_service() -> None:
    args = _manager_args(None)
    assert args.webhook_listen == "0.0.0.0:9443" and args.webhook_max_inflight == 32
    assert args.webhook_cert_secret == f"{FULL}-webhook-cert" and args.webhook_cert_namespace == NAMESPACE
    assert args.webhook_dns_name == [f"{FULL}-webhook.{NAMESPACE}.svc"] and args.webhook_configuration == [FULL]
    (hook,) = one(None, "MutatingWebhookConfiguration", FULL)["webhooks"]
    assert hook["failurePolicy"] == "Ignore" and hook["sideEffects"] == "None"
    assert hook["rules"] == [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                              "resources": ["pods"], "scope": "Namespaced"}]  # fmt: skip
    (expression,) = hook["namespaceSelector"]["matchExpressions"]
    assert expression["operator"] == "NotIn"
    assert set(expression["values"]) == {"kube-system", "kube-public", "kube-node-lease", NAMESPACE}
    assert hook["clientConfig"]["service"] == {"name": f"{FULL}-webhook", "namespace": NAMESPACE,
                                               "path": "/mutate-pod", "port": 443}  # fmt: skip
    assert "caBundle" not in hook["clientConfig"], "the manager writes it; helm upgrades leave it"
    service = one(None, "Service", f"{FULL}-webhook")
    assert service["spec"]["selector"]["app.kubernetes.io/component"] == "manager"
    assert service["spec"]["ports"][0]["targetPort"] == "webhook"
    secret = one(None, "Secret", f"{FULL}-webhook-cert")
    assert not secret.get("data"), "empty until the manager issues (upgrades keep what it wrote: lookup)"
    role = one(None, "Role", f"{FULL}-manager-webhook-cert")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["secrets"], "resourceNames": [f"{FULL}-webhook-cert"],
                              "verbs": ["get", "update"]}]  # fmt: skip
    manager_role = cluster_roles()[f"{FULL}-manager"]
    (own,) = [r for r in manager_role["rules"] if "mutatingwebhookconfigurations" in r["resources"]]
    assert own["resourceNames"] == [FULL] and set(own["verbs"]) == {"get", "patch"}
    assert {("", "namespaces", "watch"), ("config.koordinator.sh", "clustercolocationprofiles", "watch"),
            ("scheduling.k8s.io", "priorityclasses", "watch")} <= granted(manager_role)
    container = containers(one(None, "Deployment", f"{FULL}-manager"))["manager"]
    assert container["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "webhook", "scheme": "HTTPS"}
    assert {"name": "webhook", "containerPort": 9443} in container["ports"]


def test_the_webhook_with_cert_manager_or_a_url() -> None:
    values = VARIANTS["webhook-cert-manager"]
    args = _manager_args(values)
    assert not args.webhook_cert_secret and args.webhook_cert == "/etc/runtime-hook-proxy/webhook/tls.crt"
    config = one(values, "MutatingWebhookConfiguration", FULL)
    assert config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == f"{NAMESPACE}/{FULL}-webhook"
    certificate = one(values, "Certificate", f"{FULL}-webhook")
    assert certificate["spec"]["dnsNames"] == [f"{FULL}-webhook.{NAMESPACE}.svc"]
    assert certificate["spec"]["secretName"] == f"{FULL}-webhook-tls"
    volumes = one(values, "Deployment", f"{FULL}-manager")["spec"]["template"]["spec"]["volumes"]
    assert {"name": "webhook-cert", "secret": {"secretName": f"{FULL}-webhook-tls"}} in volumes
    assert "mutatingwebhookconfigurations" not in {r for _, r, _ in granted(cluster_roles(values)[f"{FULL}-manager"])}
    url = VARIANTS["webhook-url"]
    assert _manager_args(url).webhook_ip == ["127.0.0.1"]
    (hook,) = one(url, "MutatingWebhookConfiguration", FULL)["webhooks"]
    assert hook["clientConfig"] == {"url": "https://127.0.0.1:9443/mutate-pod"}
    assert "Service" not in kinds(url)


def _cpu_milli(value: str) -> int:
    return int(value[:-1]) if value.endswith("m") else int(float(value) * 1000)


def test_the_default_release_fits_a_two_cpu_node_beside_user_pods() -> None:
    """Issue 36: the old defaults requested 650 m (1,050 m with the manager), and a 2-CPU node
    kept for kubelet and the system could not fit a 100 m pod beside them."""
    total = 0
    for doc in kinds().get("DaemonSet", []) + kinds()["Deployment"]:
        replicas = doc["spec"].get("replicas", 1)
        for container in doc["spec"]["template"]["spec"]["containers"]:
            total += replicas * _cpu_milli(container["resources"]["requests"]["cpu"])
    assert total <= 250, f"{total} m requested by one node's share of the release"


def test_the_chart_has_no_symbolic_link_and_its_crds_are_packaging_crds() -> None:
    """helm warned about files/crds (a link to packaging/crds) at every command."""
    links = [p for p in CHART.rglob("*") if p.is_symlink()]
    assert links == []
    ours = {p.name: p.read_text() for p in (CHART / "files" / "crds").glob("*.yaml")}
    assert ours == {p.name: p.read_text() for p in CRDS.glob("*.yaml") if p.name != "kustomization.yaml"}, \
        "copy packaging/crds/*.yaml (not kustomization.yaml) to the chart's files/crds"
    proc = run_helm("template", RELEASE, str(CHART))
    assert proc.returncode == 0 and "symbolic link" not in proc.stderr, proc.stderr


@pytest.mark.parametrize(("values", "will", "wont"), [
    ({}, ["Manager: Deployment", "Pod webhook: MutatingWebhookConfiguration", "PriorityClasses koord-prod",
          "reports each node as koordlet does"], ["No manager", "No pod webhook", "No node reports"]),
    (KOORDINATOR, ["Koordinator is in the cluster", "No manager", "No pod webhook", "No node reports"],
     ["Manager: Deployment", "PriorityClasses koord-prod"]),
])  # fmt: skip
def test_notes_say_what_the_release_will_and_will_not_do(values: dict[str, Any], will: list[str],
                                                         wont: list[str], tmp_path: Path) -> None:
    # helm template leaves NOTES.txt out: render a copy of the chart with it as a template.
    chart = tmp_path / "chart"
    shutil.copytree(CHART, chart)
    text = (chart / "templates" / "NOTES.txt").read_text()
    (chart / "templates" / "_notes.tpl").write_text('{{- define "test.notes" -}}' + text + "{{- end -}}")
    (chart / "templates" / "notes.yaml").write_text('notes: {{ include "test.notes" . | toJson }}\n')
    proc = subprocess.run([str(_helm()), "template", RELEASE, str(chart), "-n", NAMESPACE, "--show-only",
                           "templates/notes.yaml", "--values", "-"], input=yaml.safe_dump(values),
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    notes = yaml.safe_load(proc.stdout)["notes"]
    for line in will:
        assert line in notes, notes
    for line in wont:
        assert line not in notes, notes


def test_uninstall_removes_the_release_leases_by_a_post_delete_hook() -> None:
    from scheduler_ext.cli import build_parser

    job = one(None, "Job", f"{FULL}-lease-cleanup")
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "post-delete"
    (container,) = job["spec"]["template"]["spec"]["containers"]
    args = build_parser().parse_args(container["command"][1:])
    assert args.command == "remove-leases" and args.in_cluster and args.namespace == NAMESPACE
    # kube-scheduler's Lease (scheduler-config), the manager's (--lease-name), the extenders' ledger
    # and their reservation controller's election (serve's --reservation-lease, left at its default).
    config = yaml.safe_load(one(None, "ConfigMap", f"{FULL}-scheduler")["data"]["config.yaml"])
    manager = _manager_args(None)
    reservations = build_parser().parse_args(["serve"]).reservation_lease
    assert set(args.name) == {config["leaderElection"]["resourceName"], manager.lease_name, reservations}
    assert args.prefix == ["scheduler-ext-"]
    assert args.wait_pods.startswith(f"app.kubernetes.io/instance={RELEASE},")
    role = one(None, "Role", f"{FULL}-lease-cleanup")
    assert granted(role) == {("coordination.k8s.io", "leases", "list"), ("coordination.k8s.io", "leases", "delete"),
                             ("", "pods", "list")}  # fmt: skip
    assert "Job" not in kinds({"leaseCleanup": {"enabled": False}})


# ---- issue 37: CRDs that stay, and a node agent held to its own node ---------------------------------

_WRITES = {"create", "update", "patch", "delete", "deletecollection"}
# What the own-node policy cannot judge: an Eviction names a pod, not its node (docs/helm.md).
_NOT_NODE_BOUND = {("", "pods/eviction")}


def test_every_crd_is_kept_by_helm_on_upgrade_and_uninstall() -> None:
    """``helm upgrade --set crds.install=false`` and ``helm uninstall`` keep the CRDs and every
    object of their kinds (helm.sh/resource-policy: keep); ``kubectl delete crd`` removes them."""
    crds = kinds().get("CustomResourceDefinition", [])
    assert len(crds) == len([p for p in CRDS.glob("*.yaml") if p.name != "kustomization.yaml"])
    for crd in crds:
        assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep", crd["metadata"]["name"]


def _policy_rules(policy: Mapping[str, Any]) -> set[tuple[str, str, str]]:
    return {(group, res, op.lower()) for rule in policy["spec"]["matchConstraints"]["resourceRules"]
            for group in rule["apiGroups"] for res in rule["resources"] for op in rule["operations"]}  # fmt: skip


def _covers(rules: set[tuple[str, str, str]], group: str, resource: str, verb: str) -> bool:
    op = {"create": "create", "update": "update", "patch": "update", "delete": "delete",
          "deletecollection": "delete"}[verb]  # fmt: skip
    return (group, resource, op) in rules


@pytest.mark.parametrize("variant", ["defaults", "everything", "hook-server"])
def test_every_write_the_node_agent_is_granted_is_held_to_its_node_by_the_admission_policy(variant: str) -> None:
    values = VARIANTS[variant]
    name = f"{FULL}-node"
    policy = one(values, "ValidatingAdmissionPolicy", f"{name}-own-node")
    binding = one(values, "ValidatingAdmissionPolicyBinding", f"{name}-own-node")
    assert binding["spec"] == {"policyName": f"{name}-own-node", "validationActions": ["Deny"]}
    assert policy["spec"]["failurePolicy"] == "Fail"
    (condition,) = policy["spec"]["matchConditions"]
    assert condition["expression"] == f'request.userInfo.username == "system:serviceaccount:{NAMESPACE}:{name}"'
    rules = _policy_rules(policy)
    writes = {g for role, doc in cluster_roles(values).items() if role.startswith(name) for g in granted(doc)
              if g[2] in _WRITES}  # fmt: skip
    assert writes, "the node agent writes something"
    uncovered = {w for w in writes if (w[0], w[1]) not in _NOT_NODE_BOUND and not _covers(rules, *w)}
    assert uncovered == set(), "a write of the node agent's RBAC that the own-node policy does not judge"


def test_without_the_node_agent_there_is_no_own_node_policy() -> None:
    assert "ValidatingAdmissionPolicy" not in kinds({"node": {"enabled": False}})


@pytest.mark.parametrize("overlay", ["node", "node-hook-server", "node-colocation"])
def test_each_node_overlay_ships_the_charts_own_node_policy(overlay: str) -> None:
    chart = one(EVERYTHING, "ValidatingAdmissionPolicy", f"{FULL}-node-own-node")
    (theirs,) = [d for d in render(overlay) if d["kind"] == "ValidatingAdmissionPolicy"]
    (binding,) = [d for d in render(overlay) if d["kind"] == "ValidatingAdmissionPolicyBinding"]
    assert binding["spec"] == {"policyName": theirs["metadata"]["name"], "validationActions": ["Deny"]}
    for key in ("failurePolicy", "matchConstraints", "variables", "validations"):
        assert theirs["spec"][key] == chart["spec"][key], key
    (condition,) = theirs["spec"]["matchConditions"]
    assert ":runtime-hook-proxy-node" in condition["expression"]
