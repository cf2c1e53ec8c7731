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
            assert container["image"] == "registry.example.com/runtime-hook-proxy:0.1.0"


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
    assert host_paths <= {"/sys/fs/cgroup", "/var/run/nri", "/etc/runtime/hookserver.d", "/var/run/runtime-hook-proxy"}
    # fromCluster: the service account may read its Node, NodeSLO and NRT and write nothing.
    assert spec["serviceAccountName"] == "runtime-hook-proxy-node"
    roles = {role["metadata"]["name"]: role for role in kinds["ClusterRole"]}
    assert set(roles) == {"runtime-hook-proxy-node", "runtime-hook-proxy-node-evict"}

    def granted(name: str) -> set[tuple[str, str, str]]:
        return {(group, res, verb) for rule in roles[name]["rules"] for group in rule["apiGroups"]
                for res in rule["resources"] for verb in rule["verbs"]}

    assert granted("runtime-hook-proxy-node") == {
        (group, res, verb) for group, res in (("", "nodes"), ("slo.koordinator.sh", "nodeslos"),
                                              ("topology.node.k8s.io", "noderesourcetopologies"))
        for verb in ("get", "list", "watch")
    }
    # evictBy: api only: an Eviction and an Event, nothing else written.
    assert granted("runtime-hook-proxy-node-evict") == {("", "pods/eviction", "create"), ("", "events", "create")}


def test_the_node_config_map_is_a_valid_config(tmp_path: Path) -> None:
    from runtime_proxy.config import load_config

    (config_map,) = _kinds("node")["ConfigMap"]
    path = tmp_path / "config.yaml"
    path.write_text(config_map["data"]["config.yaml"])
    assert load_config(str(path)).fromCluster is True


def test_the_nri_daemonset_command_parses_and_serves_probes_on_its_metrics_port() -> None:
    from runtime_proxy.nri.cli import add_parser

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
    from runtime_proxy.engine import hook_service

    (daemonset,) = _kinds("node-hook-server")["DaemonSet"]
    (container,) = _pod_spec(daemonset)["containers"]
    assert container["command"][:2] == ["runtime-proxy", "hook-server"]
    args = hook_service._parser().parse_args(container["command"][2:])
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in _pod_spec(daemonset)["volumes"]}
    socket_dir = str(Path(args.listen).parent)
    assert volumes[mounts[socket_dir]]["hostPath"]["path"] == socket_dir, "the registered endpoint is the host's path"
    assert volumes[mounts[args.register_dir]]["hostPath"]["path"] == "/etc/runtime/hookserver.d"


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
    (extras,) = [words[1].split("=", 1)[1] for words in _containerfile() if words[:1] == ["ARG"]
                 and words[1].startswith("EXTRAS=")]
    assert set(extras.split(",")) <= set(PYPROJECT["project"]["optional-dependencies"])
    (cmd,) = [line for line in (REPO / "Containerfile").read_text().splitlines() if line.startswith("CMD ")]
    assert json.loads(cmd.removeprefix("CMD "))[0] in PYPROJECT["project"]["scripts"]
