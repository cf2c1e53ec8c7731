"""packaging/crds/nodeslo.yaml against what koord_formats/nodeslo.py reads: every NodeSLO field
name in ``koord_formats.keys.SLO`` has a typed place in the CRD's schema, at the nesting the
parser reads it, so the API server keeps it (tests/e2e/test_e2e_nodeslo.py round-trips a spec
through the real one)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from koord_formats.keys import SLO

CRD = Path(__file__).resolve().parents[2] / "packaging" / "crds" / "nodeslo.yaml"
CLASSES = (SLO.LSR_CLASS, SLO.LS_CLASS, SLO.BE_CLASS, SLO.SYSTEM_CLASS, SLO.CGROUP_ROOT)
THRESHOLDS = (
    SLO.ENABLE, SLO.CPU_SUPPRESS_THRESHOLD_PERCENT, SLO.CPU_SUPPRESS_POLICY, SLO.CPU_SUPPRESS_MIN_PERCENT,
    SLO.MEMORY_EVICT_THRESHOLD_PERCENT, SLO.MEMORY_EVICT_LOWER_PERCENT,
    SLO.CPU_EVICT_BE_SATISFACTION_LOWER_PERCENT, SLO.CPU_EVICT_BE_SATISFACTION_UPPER_PERCENT,
    SLO.CPU_EVICT_BE_USAGE_THRESHOLD_PERCENT, SLO.CPU_EVICT_TIME_WINDOW_SECONDS, SLO.CPU_EVICT_POLICY,
    SLO.EVICT_ENABLED_PRIORITY_THRESHOLD,
)  # fmt: skip
BURST = (SLO.POLICY, SLO.CPU_BURST_PERCENT, SLO.CFS_QUOTA_BURST_PERCENT, SLO.CFS_QUOTA_BURST_PERIOD_SECONDS,
         SLO.SHARE_POOL_THRESHOLD_PERCENT)  # fmt: skip
CPU_QOS = (SLO.ENABLE, SLO.GROUP_IDENTITY, SLO.SCHED_IDLE, SLO.CORE_EXPELLER)
RESCTRL_QOS = (SLO.ENABLE, SLO.CAT_RANGE_START_PERCENT, SLO.CAT_RANGE_END_PERCENT, SLO.MBA_PERCENT)
MEMORY_QOS = (SLO.ENABLE, SLO.MIN_LIMIT_PERCENT, SLO.LOW_LIMIT_PERCENT, SLO.THROTTLING_PERCENT, SLO.WMARK_RATIO,
              SLO.WMARK_SCALE_PERMILL, SLO.WMARK_MIN_ADJ, SLO.PRIORITY_ENABLE, SLO.PRIORITY, SLO.OOM_KILL_GROUP)
HOST_APP = (SLO.NAME, SLO.QOS, SLO.PRIORITY)
CGROUP_PATH = (SLO.BASE, SLO.PARENT_DIR, SLO.RELATIVE_PATH)


def _crd() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(CRD.read_text())
    return doc


def _spec_schema() -> dict[str, Any]:
    (version,) = _crd()["spec"]["versions"]
    spec: dict[str, Any] = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    return spec


def _at(schema: dict[str, Any], *path: str) -> dict[str, Any]:
    node = schema
    for step in path:
        node = node["items"] if step == "[]" else node["properties"][step]
    return node


def _paths() -> list[tuple[str, ...]]:
    rq, burst, used = SLO.RESOURCE_QOS_STRATEGY, SLO.CPU_BURST_STRATEGY, SLO.RESOURCE_USED_THRESHOLD_WITH_BE
    paths: list[tuple[str, ...]] = [(used, k) for k in THRESHOLDS]
    paths.append((rq, SLO.POLICIES, SLO.CPU_POLICY))
    for cls in CLASSES:
        paths += [(rq, cls, SLO.CPU_QOS, k) for k in CPU_QOS]
        paths += [(rq, cls, SLO.RESCTRL_QOS, k) for k in RESCTRL_QOS]
        paths += [(rq, cls, SLO.MEMORY_QOS, k) for k in MEMORY_QOS]
    paths += [(burst, k) for k in BURST]
    paths += [(SLO.HOST_APPLICATIONS, "[]", k) for k in HOST_APP]
    paths += [(SLO.HOST_APPLICATIONS, "[]", SLO.CGROUP_PATH, k) for k in CGROUP_PATH]
    return paths


def test_the_crd_is_koordinators_kind() -> None:
    crd = _crd()
    assert crd["metadata"]["name"] == "nodeslos.slo.koordinator.sh"
    spec = crd["spec"]
    assert (spec["group"], spec["scope"], spec["names"]["kind"], spec["names"]["plural"]) == (
        "slo.koordinator.sh", "Cluster", "NodeSLO", "nodeslos")  # fmt: skip
    assert [v["name"] for v in spec["versions"]] == ["v1alpha1"]


def test_every_field_the_parser_reads_is_typed_where_it_reads_it() -> None:
    schema = _spec_schema()
    for path in _paths():
        leaf = _at(schema, *path)
        assert leaf.get("type") in ("integer", "string", "boolean"), path


def test_every_nodeslo_key_has_a_place() -> None:
    """A new key in ``SLO`` fails here until the CRD (and ``_paths``) has it."""
    placed = {step for path in _paths() for step in path}
    keys = {v for k, v in vars(SLO).items() if k.isupper() and isinstance(v, str)}
    assert keys - placed == set()


def test_unknown_fields_are_kept() -> None:
    """Koordinator's fields we do not read survive a write (no pruning anywhere in spec)."""

    def objects(node: dict[str, Any]) -> list[dict[str, Any]]:
        found = [node] if node.get("type") == "object" else []
        for child in node.get("properties", {}).values():
            found += objects(child)
        if "items" in node:
            found += objects(node["items"])
        return found

    spec = _spec_schema()
    assert all(o.get("x-kubernetes-preserve-unknown-fields") is True for o in objects(spec))
