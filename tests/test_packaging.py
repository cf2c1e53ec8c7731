"""The deploy files: the kustomize tree under ``packaging/kustomize/`` renders offline with
``kubectl kustomize`` and every rendered object loads as the kubernetes client's model without
losing a key; the pods carry probes, requests and a security context that grants only what the
node part needs; their commands parse with our CLIs; the ``Containerfile`` copies only what
exists and installs extras and console scripts that exist."""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.image_refs import image_refs

REPO = Path(__file__).resolve().parents[1]
KUSTOMIZE = REPO / "packaging" / "kustomize"
OVERLAYS = sorted(p.name for p in (KUSTOMIZE / "overlays").iterdir() if (p / "kustomization.yaml").exists())
KUBECTL = shutil.which("kubectl")
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def test_there_are_extender_and_node_overlays() -> None:
    assert {"extender", "node", "node-hook-server"} <= set(OVERLAYS)


_rendered: dict[str, list[dict[str, Any]]] = {}


def render(overlay: str) -> list[dict[str, Any]]:
    if KUBECTL is None:
        pytest.skip("kubectl is not installed: `kubectl kustomize` renders the overlays offline")
    if overlay not in _rendered:
        proc = subprocess.run([KUBECTL, "kustomize", str(KUSTOMIZE / "overlays" / overlay)], capture_output=True,
                              text=True, timeout=120, check=False)
        assert proc.returncode == 0, proc.stderr
        _rendered[overlay] = [d for d in yaml.safe_load_all(proc.stdout) if d]
    return _rendered[overlay]


def _kinds(overlay: str) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for doc in render(overlay):
        out.setdefault(doc["kind"], []).append(doc)
    return out


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_rendered_object_loads_as_a_kubernetes_model_without_losing_a_key(overlay: str) -> None:
    from kubernetes import client  # the dev install pulls the [cluster] extra

    api = client.ApiClient()
    for doc in render(overlay):
        model = api.deserialize(json.dumps(doc), f"V1{doc['kind']}", "application/json")
        assert api.sanitize_for_serialization(model) == doc, f"{doc['kind']}/{doc['metadata']['name']}: a key " \
            "the model does not know was dropped"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_image_is_the_built_one_with_a_registry_and_tag(overlay: str) -> None:
    for doc in render(overlay):
        for container in _pod_spec(doc).get("containers", []):
            # The node DaemonSets run the node image; the extender (and the manager) the cluster
            # image (packaging/image/build.sh).
            flavour = "cluster" if overlay in ("extender", "manager") else "node"
            # named as the chart's values say, as packaging/image/build.sh names what it builds
            assert container["image"] == image_refs()[flavour]


def _pod_spec(doc: dict[str, Any]) -> dict[str, Any]:
    if doc["kind"] in ("Deployment", "DaemonSet"):
        spec: dict[str, Any] = doc["spec"]["template"]["spec"]
        return spec
    return {}


def test_the_extender_overlay_holds_its_deployment_service_rbac_and_scheduler_config() -> None:
    kinds = _kinds("extender")
    assert {"Deployment", "Service", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
            "NetworkPolicy", "ConfigMap"} <= set(kinds)
    (config_map,) = kinds["ConfigMap"]
    scheduler_config = yaml.safe_load(config_map["data"]["config.yaml"])
    assert scheduler_config["kind"] == "KubeSchedulerConfiguration"
    (deployment,) = kinds["Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["command"][0] in PYPROJECT["project"]["scripts"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["securityContext"]["runAsNonRoot"] is True


@pytest.mark.parametrize("overlay", ["node", "node-hook-server"])
def test_the_node_daemonset_grants_only_what_the_node_part_needs(overlay: str) -> None:
    kinds = _kinds(overlay)
    (daemonset,) = kinds["DaemonSet"]
    spec = _pod_spec(daemonset)
    assert not spec.get("hostNetwork") and not spec.get("hostPID") and not spec.get("hostIPC")
    (container,) = spec["containers"]
    ctx = container["securityContext"]
    assert ctx.get("privileged") is not True and ctx["allowPrivilegeEscalation"] is False
    assert ctx["capabilities"] == {"drop": ["ALL"]} and ctx["readOnlyRootFilesystem"] is True
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]
    assert container.get("livenessProbe")
    host_paths = {v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    # /run/containerd: containerd's CRI socket, where NRI updates no reply carried go (docs/nri.md)
    assert host_paths <= {"/sys/fs/cgroup", "/var/run/nri", "/run/containerd", "/etc/runtime/hookserver.d",
                          "/var/run/runtime-hook-proxy"}
    # fromCluster: the service account may read its Node, NodeSLO and NRT and the pods (their
    # batch resources) and write nothing but Events on pods whose hooks failed (create, and patch
    # to count repeats).
    assert spec["serviceAccountName"] == "runtime-hook-proxy-node"
    roles = {role["metadata"]["name"]: role for role in kinds["ClusterRole"]}
    assert set(roles) == {"runtime-hook-proxy-node", "runtime-hook-proxy-node-evict"}

    def granted(name: str) -> set[tuple[str, str, str]]:
        return {(group, res, verb) for rule in roles[name]["rules"] for group in rule["apiGroups"]
                for res in rule["resources"] for verb in rule["verbs"]}

    assert granted("runtime-hook-proxy-node") == {
        (group, res, verb) for group, res in (("", "nodes"), ("", "pods"), ("slo.koordinator.sh", "nodeslos"),
                                              ("topology.node.k8s.io", "noderesourcetopologies"))
        for verb in ("get", "list", "watch")
    } | {("", "events", "create"), ("", "events", "patch")}
    # evictBy: api only: an Eviction and an Event, nothing else written.
    assert granted("runtime-hook-proxy-node-evict") == {("", "pods/eviction", "create"), ("", "events", "create")}


def test_the_node_config_map_is_a_valid_config(tmp_path: Path) -> None:
    from runtime_proxy.config import load_config

    (config_map,) = _kinds("node")["ConfigMap"]
    path = tmp_path / "config.yaml"
    path.write_text(config_map["data"]["config.yaml"])
    assert load_config(str(path)).fromCluster is True


def test_the_nri_daemonset_command_parses_and_serves_probes_on_its_metrics_port() -> None:
    from runtime_proxy.commands.nri import add_parser

    (daemonset,) = _kinds("node")["DaemonSet"]
    (container,) = _pod_spec(daemonset)["containers"]
    assert container["command"][:2] == ["runtime-proxy", "nri"]
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(container["command"][1:])
    assert args.metrics_addr.startswith("0.0.0.0:")  # kubelet probes the pod's address
    (port,) = container["ports"]
    assert port["containerPort"] == int(args.metrics_addr.rsplit(":", 1)[1])
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": port["name"]}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": port["name"]}


def test_the_hook_server_daemonset_command_parses_and_registers_its_host_path() -> None:
    from runtime_proxy.commands import hook_server

    (daemonset,) = _kinds("node-hook-server")["DaemonSet"]
    (container,) = _pod_spec(daemonset)["containers"]
    assert container["command"][:2] == ["runtime-proxy", "hook-server"]
    parser = argparse.ArgumentParser()
    hook_server.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(container["command"][1:])
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in _pod_spec(daemonset)["volumes"]}
    socket_dir = str(Path(args.listen).parent)
    assert volumes[mounts[socket_dir]]["hostPath"]["path"] == socket_dir, "the registered endpoint is the host's path"
    assert volumes[mounts[args.register_dir]]["hostPath"]["path"] == "/etc/runtime/hookserver.d"
    assert args.metrics_addr == "0.0.0.0:9464"
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}


# ---- the Containerfile (no image builder runs here: its inputs are checked) ----------------------


def _containerfile() -> list[list[str]]:
    text = (REPO / "Containerfile").read_text().replace("\\\n", " ")
    return [shlex.split(line) for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def test_every_copy_source_of_the_containerfile_exists() -> None:
    copies = [words[1:] for words in _containerfile() if words[0] == "COPY"]
    assert copies
    for args in copies:
        if any(a.startswith("--from=") for a in args):
            continue
        for source in args[:-1]:
            assert (REPO / source).exists(), f"COPY {source}: no such file in the repository"


def test_the_containerfile_copies_every_shipped_package_and_installs_existing_extras() -> None:
    copied = {words[1] for words in _containerfile() if words[0] == "COPY"}
    shipped = PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]
    assert {name.rstrip("*") for name in shipped} <= copied
    # The pinned requirement files it installs exist (the same ones packaging/image/build.sh uses).
    sources = [w for words in _containerfile() if words[0] == "COPY" and not words[1].startswith("--from")
               for w in words[1:-1]]
    assert [src for src in sources if not (REPO / src).exists()] == []
    cmds = [line for line in (REPO / "Containerfile").read_text().splitlines() if line.startswith("CMD ")]
    assert cmds and all(json.loads(cmd.removeprefix("CMD "))[0] in PYPROJECT["project"]["scripts"] for cmd in cmds)


# ---- the packaged defaults do what they say ------------------------------------------------------

HOST_CONFIG = REPO / "packaging" / "proxy-config.yaml"
EVICTION_PLUGINS = {"memory_evict", "cpu_evict"}


def _node_config(overlay: str) -> dict[str, Any]:
    (config_map,) = _kinds(overlay)["ConfigMap"]
    config: dict[str, Any] = yaml.safe_load(config_map["data"]["config.yaml"])
    return config


def _policies(config: dict[str, Any]) -> dict[str, Any]:
    """What decides which plugins run and how a fault counts: the same on the host and in pods."""
    from runtime_proxy.config import ProxyConfig

    model = ProxyConfig.model_validate(config)
    return {
        "plugins": [p.model_dump() for p in model.plugins or ()],
        "defaultPolicy": model.defaultPolicy,
        "defaultTimeout": model.defaultTimeout,
        "hookServerTimeout": model.hookServerTimeout,
        "usageLoop.enable": model.usageLoop.enable,
    }


@pytest.mark.parametrize("overlay", ["node", "node-hook-server"])
def test_the_host_config_and_the_node_config_map_run_the_same_plugins_with_the_same_policies(overlay: str) -> None:
    from hooks.plugins import BUILTIN_PLUGINS

    host = yaml.safe_load(HOST_CONFIG.read_text())
    assert _policies(_node_config(overlay)) == _policies(host)
    assert [p["name"] for p in host["plugins"]] == list(BUILTIN_PLUGINS), "every built-in, eviction included"


@pytest.mark.parametrize("overlay", ["node", "node-hook-server"])
def test_the_eviction_grant_goes_with_the_eviction_plugins(overlay: str) -> None:
    """`create pods/eviction` is granted exactly where the config enables an eviction plugin that
    evicts through the API."""
    config = _node_config(overlay)
    evicts = bool({p["name"] for p in config["plugins"] if p.get("enabled", True)} & EVICTION_PLUGINS) and \
        config.get("usageLoop", {}).get("evictBy", "api") == "api"
    granted = any("pods/eviction" in rule["resources"] and "create" in rule["verbs"]
                  for role in _kinds(overlay).get("ClusterRole", []) for rule in role["rules"])
    assert granted == evicts
    assert evicts, "the packaged node overlays enable evictions"


def test_the_eviction_rights_are_a_component_of_their_own() -> None:
    base = (KUSTOMIZE / "base" / "node" / "rbac.yaml").read_text()
    assert "pods/eviction" not in base
    component = yaml.safe_load((KUSTOMIZE / "components" / "eviction" / "kustomization.yaml").read_text())
    assert component["kind"] == "Component"


def test_no_packaged_config_pins_the_cgroup_driver() -> None:
    """kubelet's driver is detected at start (runtime_proxy.wiring.cgroup_driver) unless set."""
    assert "cgroupDriver" not in yaml.safe_load(HOST_CONFIG.read_text())
    assert "cgroupDriver" not in _node_config("node")


def test_the_usage_loop_runs_with_the_packaged_plugins_and_no_enable_key(tmp_path: Path) -> None:
    from hooks.manager import make_plugin_manager
    from runtime_proxy import wiring
    from runtime_proxy.config import load_config
    from runtime_proxy.engine.pipeline import Pipeline, plugin_steps

    config = load_config(str(HOST_CONFIG)).model_copy(update={"resctrlRoot": str(tmp_path)})
    assert config.usageLoop.enable is None
    pm = make_plugin_manager(entry_points=False)
    pipeline = Pipeline(plugin_steps(pm, wiring.plugin_settings(config, pm, entry_points=False)))
    assert wiring.usage_loop_decision(config, pm, pipeline) == (
        True, "enabled plugins implement ReconcileUsage: cpu_suppress, memory_qos, memory_evict, cpu_evict")
    assert "rdt" not in [step.name for step in pipeline.steps], "rdt is left out where resctrl is absent"


def test_the_packaged_node_config_is_neutral_and_the_install_steps_use_it() -> None:
    from runtime_proxy.state.nodeconfig import load_document

    packaged = REPO / "packaging" / "node.yaml"
    doc = load_document(packaged.read_text())
    assert doc.model_dump(exclude_defaults=True) in ({}, {"labels": {}, "annotations": {}, "nodeSLO": {},
                                                          "nodeResourceTopology": {"annotations": {}}})
    assert not doc.labels and not doc.annotations and not doc.nodeSLO
    node_config = yaml.safe_load(HOST_CONFIG.read_text())["nodeConfigFile"]
    build = (REPO / "packaging" / "deb" / "build.sh").read_text()
    assert f'"$repo/packaging/node.yaml" "$root{node_config}"' in build
    for doc_file in ("README.md", "packaging/kubelet.md", "packaging/deb/build.sh"):
        assert "packaging/examples/nodeslo.yaml /" not in (REPO / doc_file).read_text(), doc_file


def test_the_unit_wants_containerd_without_requiring_it() -> None:
    """Requires= would restart the proxy with every containerd restart."""
    unit = (REPO / "packaging" / "runtime-proxy.service").read_text()
    directives = [line.split("=", 1) for line in unit.splitlines() if "=" in line and not line.startswith("#")]
    assert ["After", "containerd.service"] in directives and ["Wants", "containerd.service"] in directives
    assert not [d for d in directives if d[0] in ("Requires", "BindsTo", "PartOf")]


@pytest.mark.parametrize("overlay", ["node", "node-hook-server"])
def test_the_node_daemonsets_load_entry_point_plugins(overlay: str) -> None:
    """The config's plugin list is the one switch; an installed plugin it leaves out is named in a
    warning at start (runtime_proxy.wiring.plugin_settings)."""
    (daemonset,) = _kinds(overlay)["DaemonSet"]
    (container,) = _pod_spec(daemonset)["containers"]
    assert "--no-entry-points" not in container["command"]


def test_the_manager_overlay_runs_the_manager_with_the_rights_it_uses() -> None:
    """The Deployment's command parses with ``scheduler-ext``'s parser; its ServiceAccount may
    write what the manager writes (colocation_manager/kubeio.py) and nothing cluster-wide
    besides."""
    from scheduler_ext.cli import build_parser

    kinds = _kinds("manager")
    (deployment,) = kinds["Deployment"]
    (container,) = _pod_spec(deployment)["containers"]
    args = build_parser().parse_args(container["command"][1:])
    assert args.command == "manager" and args.in_cluster
    assert container["ports"][0]["containerPort"] == int(args.metrics_listen.rsplit(":", 1)[1])
    (role,) = kinds["ClusterRole"]
    writes = {(res, verb) for rule in role["rules"] for res in rule["resources"] for verb in rule["verbs"]
              if verb in ("create", "update", "patch", "delete")}
    assert writes == {("nodes/status", "patch"), ("nodes", "patch"), ("noderesourcetopologies", "patch")} | {
        (kind, verb) for kind in ("nodemetrics", "nodeslos") for verb in ("create", "patch", "delete")}
