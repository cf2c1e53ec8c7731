"""The co-location install (packaging/kustomize/overlays/node-colocation): the NRI node part with
reporting on, exactly the rights reporting needs, and the CRDs; the other node overlays neither
report nor hold those rights."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tests.test_packaging import KUSTOMIZE, _kinds, _node_config, _policies

REPORT_RIGHTS = {
    ("topology.node.k8s.io", "noderesourcetopologies", "create"),
    ("topology.node.k8s.io", "noderesourcetopologies", "update"),
    ("scheduling.koordinator.sh", "devices", "get"),
    ("scheduling.koordinator.sh", "devices", "create"),
    ("scheduling.koordinator.sh", "devices", "update"),
    ("slo.koordinator.sh", "nodemetrics", "get"),
    ("slo.koordinator.sh", "nodemetrics/status", "update"),
}


def _granted(role: dict[str, Any]) -> set[tuple[str, str, str]]:
    return {(group, res, verb) for rule in role["rules"] for group in rule["apiGroups"]
            for res in rule["resources"] for verb in rule["verbs"]}  # fmt: skip


def test_the_colocation_overlay_reports_with_exactly_the_rights_it_needs(tmp_path: Path) -> None:
    from runtime_proxy.config import load_config

    kinds = _kinds("node-colocation")
    roles = {r["metadata"]["name"]: r for r in kinds["ClusterRole"]}
    assert set(roles) == {"runtime-hook-proxy-node", "runtime-hook-proxy-node-evict", "runtime-hook-proxy-node-report"}
    assert _granted(roles["runtime-hook-proxy-node-report"]) == REPORT_RIGHTS
    bindings = {b["roleRef"]["name"]: b["subjects"] for b in kinds["ClusterRoleBinding"]}
    assert bindings["runtime-hook-proxy-node-report"] == [
        {"kind": "ServiceAccount", "name": "runtime-hook-proxy-node", "namespace": "kube-system"}]
    (config_map,) = kinds["ConfigMap"]
    path = tmp_path / "config.yaml"
    path.write_text(config_map["data"]["config.yaml"])
    config = load_config(str(path))
    assert config.report.enable and not config.report.createNodeMetric
    assert _policies(_node_config("node-colocation")) == _policies(_node_config("node")), "the same plugins"
    without = dict(yaml.safe_load(config_map["data"]["config.yaml"]))
    del without["report"]
    assert without == _node_config("node"), "the base config, report.enable added"
    (daemonset,) = kinds["DaemonSet"]
    spec = daemonset["spec"]["template"]["spec"]
    mounts = {m["mountPath"]: m for m in spec["containers"][0]["volumeMounts"]}
    assert mounts[config.report.kubeletConfigFile]["readOnly"] is True
    assert mounts[config.report.kubeletCPUManagerStateFile]["readOnly"] is True


def test_the_colocation_overlay_installs_every_crd() -> None:
    crds = {c["metadata"]["name"] for c in _kinds("node-colocation")["CustomResourceDefinition"]}
    assert crds == {"noderesourcetopologies.topology.node.k8s.io", "nodeslos.slo.koordinator.sh",
                    "nodemetrics.slo.koordinator.sh", "devices.scheduling.koordinator.sh",
                    "reservations.scheduling.koordinator.sh", "clustercolocationprofiles.config.koordinator.sh"}


def test_the_other_node_overlays_do_not_report() -> None:
    for overlay in ("node", "node-hook-server"):
        assert "report" not in _node_config(overlay)
        assert all(r["metadata"]["name"] != "runtime-hook-proxy-node-report" for r in _kinds(overlay)["ClusterRole"])


def test_the_report_component_is_a_component() -> None:
    doc = yaml.safe_load((KUSTOMIZE / "components" / "report" / "kustomization.yaml").read_text())
    assert doc["kind"] == "Component"
