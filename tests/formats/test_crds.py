"""packaging/crds/: each CRD is Koordinator's kind (group, version, kind, plural, scope, status
subresource), and every field our formatters write and our parsers read has a typed place in its
schema, where they put it: a document built by our own code is walked through the schema, and a
key with no property (or only "keep unknown fields") fails. tests/e2e/test_e2e_report.py applies
them to a real API server."""

from __future__ import annotations

import json
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest
import yaml

from hooks.facts import NodeFacts
from koord_formats.device import GPUInfo
from koord_formats.nodemetric import (
    AggregatedUsage,
    HostAppMetric,
    NodeMetricStatus,
    PodMetric,
    Usage,
    format_node_metric_status,
    parse_collect_policy,
)
from koord_formats.reservation import parse_reservation
from runtime_proxy.report.build import build_nrt, new_device, new_nrt
from runtime_proxy.report.sources import KubeletConfig
from tests.topologies import DUAL_SOCKET_HT

CRDS = Path(__file__).resolve().parents[2] / "packaging" / "crds"


def _crd(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((CRDS / name).read_text())
    return doc


@pytest.mark.parametrize(("file", "group", "kind", "plural", "status"), [
    ("noderesourcetopology.yaml", "topology.node.k8s.io", "NodeResourceTopology", "noderesourcetopologies", False),
    ("nodeslo.yaml", "slo.koordinator.sh", "NodeSLO", "nodeslos", True),
    ("nodemetric.yaml", "slo.koordinator.sh", "NodeMetric", "nodemetrics", True),
    ("device.yaml", "scheduling.koordinator.sh", "Device", "devices", False),
    ("reservation.yaml", "scheduling.koordinator.sh", "Reservation", "reservations", True),
    ("clustercolocationprofile.yaml", "config.koordinator.sh", "ClusterColocationProfile",
     "clustercolocationprofiles", True),
])  # fmt: skip
def test_koordinators_kinds(file: str, group: str, kind: str, plural: str, status: bool) -> None:
    crd = _crd(file)
    spec = crd["spec"]
    assert crd["metadata"]["name"] == f"{plural}.{group}"
    assert (spec["group"], spec["names"]["kind"], spec["names"]["plural"], spec["scope"]) == (group, kind, plural,
                                                                                              "Cluster")
    (version,) = spec["versions"]
    assert version["name"] == "v1alpha1" and version["served"] and version["storage"]
    assert ("status" in version.get("subresources", {})) is status


def test_every_crd_is_installed_by_the_kustomize_base() -> None:
    listed = yaml.safe_load((CRDS / "kustomization.yaml").read_text())["resources"]
    assert sorted(listed) == sorted(p.name for p in CRDS.glob("*.yaml") if p.name != "kustomization.yaml")


def _walk(schema: dict[str, Any], doc: Any, path: str = "") -> None:
    """Every key of ``doc`` has a typed place in ``schema`` (see the module docstring)."""
    if schema.get("x-kubernetes-int-or-string"):
        assert isinstance(doc, int | str), path
        return
    kind = schema.get("type")
    if kind == "object":
        assert isinstance(doc, dict), path
        props, extra = schema.get("properties"), schema.get("additionalProperties")
        if props is None and extra is None:
            return  # metadata, a pod template, a selector: kept as sent, not ours to type
        for key, value in doc.items():
            child = (props or {}).get(key, extra)
            assert isinstance(child, dict), f"{path}.{key} has no typed place in the schema"
            _walk(child, value, f"{path}.{key}")
    elif kind == "array":
        assert isinstance(doc, list), path
        for i, item in enumerate(doc):
            _walk(schema["items"], item, f"{path}[{i}]")
    else:
        expected = {"string": str, "integer": int, "boolean": bool, "number": int | float}[kind]
        assert isinstance(doc, expected) and not (kind == "integer" and isinstance(doc, bool)), path
        if "enum" in schema:
            assert doc in schema["enum"], path


def _schema(file: str) -> dict[str, Any]:
    (version,) = _crd(file)["spec"]["versions"]
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema


def test_the_nrt_the_node_writes_is_typed() -> None:
    report = build_nrt(DUAL_SOCKET_HT, NodeFacts(), KubeletConfig("static", {"full-pcpus-only": "true"}), {0: 1})
    doc = new_nrt("n1", report, {"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "u"})
    _walk(_schema("noderesourcetopology.yaml"), json.loads(json.dumps(doc)))


def test_the_device_the_node_writes_is_typed() -> None:
    doc = new_device("n1", [GPUInfo(0, "GPU-a", "0000:3b:00.0", 0, "pci0000:3a", 1 << 34), GPUInfo(1, "GPU-b")], None)
    _walk(_schema("device.yaml"), json.loads(json.dumps(doc)))


def test_the_nodemetric_spec_and_status_are_typed() -> None:
    spec = {"metricCollectPolicy": {"aggregateDurationSeconds": 300, "reportIntervalSeconds": 60,
                                    "nodeAggregatePolicy": {"durations": ["5m0s"]},
                                    "nodeMemoryCollectPolicy": "usageWithoutPageCache"}}
    parse_collect_policy(spec)
    status = NodeMetricStatus(
        update_time="2026-11-27T08:00:00Z", node_usage=Usage(1, 2),
        aggregated_node_usages=(AggregatedUsage(300, MappingProxyType({"p50": Usage(1, 2), "p99": Usage()})),),
        system_usage=Usage(1, 2), aggregated_system_usages=(AggregatedUsage(300, MappingProxyType({"p90": Usage()})),),
        pods=(PodMetric("ns", "p", Usage(1, 2), "koord-prod", "LS"),),
        host_apps=(HostAppMetric("nginx", Usage(1, 2), "koord-prod", "LS"),),
    )  # fmt: skip
    doc = {"apiVersion": "slo.koordinator.sh/v1alpha1", "kind": "NodeMetric", "metadata": {"name": "n1"},
           "spec": spec, "status": format_node_metric_status(status)}
    _walk(_schema("nodemetric.yaml"), json.loads(json.dumps(doc)))


def test_the_reservation_fields_the_parser_reads_are_typed() -> None:
    doc = {
        "apiVersion": "scheduling.koordinator.sh/v1alpha1", "kind": "Reservation",
        "metadata": {"name": "r1", "uid": "u1"},
        "spec": {
            "template": {"metadata": {"annotations": {}}, "spec": {"containers": []}},
            "owners": [{"object": {"uid": "u", "name": "p", "namespace": "ns", "apiVersion": "v1"},
                        "controller": {"uid": "c", "name": "d", "kind": "Deployment", "apiVersion": "apps/v1",
                                       "namespace": "ns", "controller": True},
                        "labelSelector": {"matchLabels": {"app": "x"}}}],
            "ttl": "1h", "allocateOnce": False, "allocatePolicy": "Aligned", "unschedulable": False,
            "taints": [{"key": "k", "value": "v", "effect": "NoSchedule"}],
        },
        "status": {"phase": "Available", "nodeName": "n1", "allocatable": {"cpu": "2"}, "allocated": {"cpu": 1}},
    }  # fmt: skip
    parse_reservation(doc)
    _walk(_schema("reservation.yaml"), doc)


def test_the_colocation_profile_fields_are_typed() -> None:
    doc = {
        "apiVersion": "config.koordinator.sh/v1alpha1", "kind": "ClusterColocationProfile",
        "metadata": {"name": "colocation"},
        "spec": {
            "namespaceSelector": {"matchLabels": {"koordinator.sh/enable-colocation": "true"}},
            "selector": {"matchLabels": {"app": "batch"}}, "probability": "100%", "qosClass": "BE",
            "priorityClassName": "koord-batch", "koordinatorPriority": 1000, "labels": {"a": "b"},
            "annotations": {"c": "d"}, "labelKeysMapping": {"x": "y"}, "annotationKeysMapping": {"x": "y"},
            "labelSuffixes": {"x": "-s"}, "schedulerName": "koord-scheduler", "patch": {"spec": {}},
        },
    }  # fmt: skip
    _walk(_schema("clustercolocationprofile.yaml"), doc)


@pytest.mark.parametrize("file", sorted(p.name for p in CRDS.glob("*.yaml") if p.name != "kustomization.yaml"))
def test_unknown_fields_are_kept_in_spec_and_status(file: str) -> None:
    """Koordinator's fields we do not read survive a write (no pruning of spec and status)."""
    props = _schema(file)["properties"]
    for part in ("spec", "status"):
        if part in props:
            assert props[part].get("x-kubernetes-preserve-unknown-fields") is True, (file, part)
