"""slo-controller-config's ``colocation-config``: the cluster's co-location strategy, its
per-node overrides, and the NodeMetric collect policy it gives each node.

Sources (koordinator-sh/koordinator): ``apis/configuration/slo_controller_config.go``
(``ColocationCfg``, ``ColocationStrategy``, field names and ranges), ``pkg/util/sloconfig/
colocation_config.go`` (``DefaultColocationStrategy``, ``IsColocationStrategyValid``,
``GetNodeColocationStrategy``), ``apis/slo/v1alpha1/nodemetric_types.go`` (the collect policy).

How a node's strategy is made (``ColocationConfig.for_node``), each step a JSON overlay
(``overlay``: non-null fields of the upper document win, objects merge, lists are replaced):

1. cluster = defaults ⊕ the top-level fields of ``colocation-config``; when that is not a valid
   strategy the whole text is refused (``FormatError``) and the caller keeps its previous
   config, as koord-manager does;
2. the first ``nodeConfigs`` entry (list order) whose ``nodeSelector`` matches the node's labels:
   cluster ⊕ entry; an entry that is invalid (no ``matchLabels``, a bad selector, nothing set,
   or an invalid merged strategy) stands for the cluster strategy;
3. ⊕ the node annotation ``node.koordinator.sh/colocation-strategy`` (JSON); when the result is
   not valid, the annotation is ignored (koord-manager does not re-validate here; we refuse to
   let one node's annotation produce values the formulas cannot use);
4. the node labels ``node.koordinator.sh/cpu-reclaim-ratio`` and friends override the
   percentages (ratio x 100, truncated; invalid or negative ignored).

Durations (``metricAggregatePolicy.durations``) are Go duration strings
(``koord_formats.nodemetric`` parses and writes them); a strategy accepts whole seconds from 1 s
to a day, as the NodeMetric spec does, and the NodeMetric spec gets them as Go prints them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from koord_formats.bounded import MAX_JSON_DEPTH, load_json, read_list, read_object, read_str
from koord_formats.errors import FormatError
from koord_formats.nodemetric import MAX_SECONDS, format_go_duration, parse_whole_seconds
from koord_formats.selector import MATCH_LABELS, LabelSelector, parse_label_selector

__all__ = [
    "ANNOTATION_NODE_COLOCATION_STRATEGY",
    "CALCULATE_MAX_USAGE_REQUEST",
    "CALCULATE_REQUEST",
    "CALCULATE_USAGE",
    "CONFIG_KEY_COLOCATION",
    "CONFIG_MAP_NAME",
    "CONFIG_MAP_NAMESPACE",
    "DEFAULT_STRATEGY",
    "LABEL_CPU_RECLAIM_RATIO",
    "LABEL_MEMORY_RECLAIM_RATIO",
    "LABEL_MID_STATIC_CPU_RESERVED_RATIO",
    "LABEL_MID_STATIC_MEMORY_RESERVED_RATIO",
    "MAX_CONFIG_CHARS",
    "MEMORY_COLLECT_POLICIES",
    "MID_RECLAIM_STATIC",
    "ColocationConfig",
    "ColocationStrategy",
    "NodeColocation",
    "default_strategy_doc",
    "metric_collect_spec",
    "overlay",
    "parse_colocation_config",
    "strategy_from_doc",
]

# The ConfigMap koord-manager reads (flags --config-namespace, --slo-config-name).
CONFIG_MAP_NAMESPACE = "koordinator-system"
CONFIG_MAP_NAME = "slo-controller-config"
CONFIG_KEY_COLOCATION = "colocation-config"
ANNOTATION_NODE_COLOCATION_STRATEGY = "node.koordinator.sh/colocation-strategy"
LABEL_CPU_RECLAIM_RATIO = "node.koordinator.sh/cpu-reclaim-ratio"
LABEL_MEMORY_RECLAIM_RATIO = "node.koordinator.sh/memory-reclaim-ratio"
LABEL_MID_STATIC_CPU_RESERVED_RATIO = "node.koordinator.sh/mid-static-cpu-reserved-ratio"
LABEL_MID_STATIC_MEMORY_RESERVED_RATIO = "node.koordinator.sh/mid-static-memory-reserved-ratio"

CALCULATE_USAGE = "usage"
CALCULATE_REQUEST = "request"
CALCULATE_MAX_USAGE_REQUEST = "maxUsageRequest"
MID_RECLAIM_STATIC = "static"
MEMORY_COLLECT_POLICIES = ("usageWithoutPageCache", "usageWithHotPageCache", "usageWithPageCache")

# A ConfigMap holds at most 1 MiB in all; one key of it can't be larger.
MAX_CONFIG_CHARS = 1024 * 1024
_MAX_NODE_CONFIGS = 256
_MAX_DURATIONS = 16
_INT64 = 2**63

# JSON field names of ColocationStrategy (and its NodeMetric spec counterparts).
_ENABLE = "enable"
_AGG_SECONDS = "metricAggregateDurationSeconds"
_REPORT_SECONDS = "metricReportIntervalSeconds"
_AGG_POLICY = "metricAggregatePolicy"
_DURATIONS = "durations"
_MEM_COLLECT = "metricMemoryCollectPolicy"
_CPU_RECLAIM = "cpuReclaimThresholdPercent"
_CPU_POLICY = "cpuCalculatePolicy"
_MEM_RECLAIM = "memoryReclaimThresholdPercent"
_MEM_POLICY = "memoryCalculatePolicy"
_DEGRADE = "degradeTimeMinutes"
_UPDATE_SECONDS = "updateTimeThresholdSeconds"
_DIFF = "resourceDiffThreshold"
_MID_MODE = "midReclaimMode"
_MID_CPU = "midCPUThresholdPercent"
_MID_MEM = "midMemoryThresholdPercent"
_MID_UNALLOC = "midUnallocatedPercent"
_MID_STATIC_CPU = "midStaticCPUReservedPercent"
_MID_STATIC_MEM = "midStaticMemoryReservedPercent"
_BATCH_CPU = "batchCPUThresholdPercent"
_BATCH_MEM = "batchMemoryThresholdPercent"
_NODE_CONFIGS = "nodeConfigs"
_NAME = "name"
_NODE_SELECTOR = "nodeSelector"
# NodeMetric spec.metricCollectPolicy
_COLLECT_POLICY = "metricCollectPolicy"
_NM_AGG_SECONDS = "aggregateDurationSeconds"
_NM_REPORT_SECONDS = "reportIntervalSeconds"
_NM_AGG_POLICY = "nodeAggregatePolicy"
_NM_MEM_POLICY = "nodeMemoryCollectPolicy"


def default_strategy_doc() -> dict[str, Any]:
    """``DefaultColocationStrategy`` as its JSON document (a fresh copy)."""
    return {
        _ENABLE: False,
        _AGG_SECONDS: 300,
        _REPORT_SECONDS: 60,
        _AGG_POLICY: {_DURATIONS: ["5m0s", "10m0s", "30m0s"]},
        _MEM_COLLECT: MEMORY_COLLECT_POLICIES[0],
        _CPU_RECLAIM: 60,
        _CPU_POLICY: CALCULATE_USAGE,
        _MID_STATIC_CPU: 0,
        _MID_STATIC_MEM: 0,
        _MEM_RECLAIM: 65,
        _MEM_POLICY: CALCULATE_USAGE,
        _DEGRADE: 15,
        _UPDATE_SECONDS: 300,
        _DIFF: 0.1,
        _MID_CPU: 100,
        _MID_MEM: 100,
        _MID_UNALLOC: 0,
    }


def overlay(base: Mapping[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` ⊕ ``top`` (Koordinator's ``MergeCfg``): a new document where every non-null
    field of ``top`` wins, objects merge field by field and anything else (lists too) is
    replaced. Neither argument is changed."""
    out = dict(base)
    for key, value in top.items():
        if value is None:
            continue
        old = out.get(key)
        if isinstance(value, Mapping) and isinstance(old, Mapping):
            out[key] = overlay(old, value)
        else:
            out[key] = value
    return out


# ---- Go durations (parsed and written by koord_formats.nodemetric) -------------------------------


def _duration_seconds(value: object, what: str) -> int:
    """A Go duration of whole seconds, at least 1 and at most a day; ``FormatError`` otherwise."""
    try:
        return parse_whole_seconds(value)
    except FormatError as exc:
        raise FormatError(f"{what}: {exc}") from None


# ---- the typed strategy --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ColocationStrategy:
    """A node's merged, validated co-location strategy (defaults: ``DefaultColocationStrategy``)."""

    enable: bool = False
    metric_aggregate_duration_seconds: int = 300
    metric_report_interval_seconds: int = 60
    metric_aggregate_durations: tuple[int, ...] = (300, 600, 1800)  # seconds
    metric_memory_collect_policy: str = MEMORY_COLLECT_POLICIES[0]
    cpu_reclaim_threshold_percent: int = 60
    cpu_calculate_policy: str = CALCULATE_USAGE  # usage | maxUsageRequest (others read as usage)
    memory_reclaim_threshold_percent: int = 65
    memory_calculate_policy: str = CALCULATE_USAGE  # usage | request | maxUsageRequest
    degrade_time_minutes: int = 15
    update_time_threshold_seconds: int = 300
    resource_diff_threshold: float = 0.1  # (0, 1]
    mid_reclaim_mode: str = ""  # "" or "static"
    mid_cpu_threshold_percent: int = 100
    mid_memory_threshold_percent: int = 100
    mid_unallocated_percent: int = 0
    mid_static_cpu_reserved_percent: int = 0
    mid_static_memory_reserved_percent: int = 0
    batch_cpu_threshold_percent: int | None = None
    batch_memory_threshold_percent: int | None = None


DEFAULT_STRATEGY = ColocationStrategy()


def _int(doc: Mapping[str, Any], key: str, lo: int, hi: int = _INT64 - 1) -> int | None:
    value = doc.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise FormatError(f"colocation {key}: expected an integer, got {type(value).__name__}")
    if not lo <= value <= hi:
        raise FormatError(f"colocation {key}: {value} is outside {lo}..{hi}")
    return value


def _need(value: int | None, key: str) -> int:
    if value is None:
        raise FormatError(f"colocation {key}: missing")
    return value


def _text(doc: Mapping[str, Any], key: str, default: str) -> str:
    value = doc.get(key)
    return default if value is None else read_str(value, f"colocation {key}", 64)


def strategy_from_doc(doc: Mapping[str, Any]) -> ColocationStrategy:
    """The merged strategy document (defaults already overlaid) as a typed value;
    ``FormatError`` when a field has the wrong type or breaks ``IsColocationStrategyValid``
    (and the field ranges of ``slo_controller_config.go``)."""
    enable = doc.get(_ENABLE)
    if not isinstance(enable, bool):
        raise FormatError(f"colocation {_ENABLE}: expected true or false")
    policy = doc.get(_AGG_POLICY)
    raw_durations = read_object(policy, f"colocation {_AGG_POLICY}").get(_DURATIONS) if policy is not None else None
    durations = tuple(
        _duration_seconds(d, f"colocation {_DURATIONS}")
        for d in read_list([] if raw_durations is None else raw_durations, f"colocation {_DURATIONS}", _MAX_DURATIONS)
    )
    mem_collect = _text(doc, _MEM_COLLECT, MEMORY_COLLECT_POLICIES[0])
    if not mem_collect:
        raise FormatError(f"colocation {_MEM_COLLECT}: empty")
    diff = doc.get(_DIFF)
    if isinstance(diff, bool) or not isinstance(diff, int | float) or not 0 < diff <= 1:
        raise FormatError(f"colocation {_DIFF}: expected a number in (0, 1]")
    mode = _text(doc, _MID_MODE, "")
    if mode not in ("", MID_RECLAIM_STATIC):
        raise FormatError(f"colocation {_MID_MODE}: unknown mode {mode[:64]!r}")
    return ColocationStrategy(
        enable=enable,
        metric_aggregate_duration_seconds=_need(_int(doc, _AGG_SECONDS, 1, MAX_SECONDS), _AGG_SECONDS),
        metric_report_interval_seconds=_need(_int(doc, _REPORT_SECONDS, 1, MAX_SECONDS), _REPORT_SECONDS),
        metric_aggregate_durations=durations,
        metric_memory_collect_policy=mem_collect,
        cpu_reclaim_threshold_percent=_need(_int(doc, _CPU_RECLAIM, 0), _CPU_RECLAIM),
        cpu_calculate_policy=_text(doc, _CPU_POLICY, CALCULATE_USAGE),
        memory_reclaim_threshold_percent=_need(_int(doc, _MEM_RECLAIM, 0), _MEM_RECLAIM),
        memory_calculate_policy=_text(doc, _MEM_POLICY, CALCULATE_USAGE),
        degrade_time_minutes=_need(_int(doc, _DEGRADE, 1, 10**9), _DEGRADE),
        update_time_threshold_seconds=_need(_int(doc, _UPDATE_SECONDS, 1, 10**12), _UPDATE_SECONDS),
        resource_diff_threshold=float(diff),
        mid_reclaim_mode=mode,
        mid_cpu_threshold_percent=_need(_int(doc, _MID_CPU, 0, 100), _MID_CPU),
        mid_memory_threshold_percent=_need(_int(doc, _MID_MEM, 0, 100), _MID_MEM),
        mid_unallocated_percent=_need(_int(doc, _MID_UNALLOC, 0, 100), _MID_UNALLOC),
        mid_static_cpu_reserved_percent=_need(_int(doc, _MID_STATIC_CPU, 0), _MID_STATIC_CPU),
        mid_static_memory_reserved_percent=_need(_int(doc, _MID_STATIC_MEM, 0), _MID_STATIC_MEM),
        batch_cpu_threshold_percent=_int(doc, _BATCH_CPU, 0),
        batch_memory_threshold_percent=_int(doc, _BATCH_MEM, 0),
    )


# ---- the whole colocation-config ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NodeColocation:
    """One ``nodeConfigs`` entry: its selector (None when invalid: matches no node) and the
    merged strategy document for the nodes it matches (the cluster's when it is invalid)."""

    name: str
    selector: LabelSelector | None
    doc: Mapping[str, Any]
    strategy: ColocationStrategy | None = None  # None: the cluster strategy
    problem: str = ""  # why the entry stands for the cluster strategy, "" when valid


@dataclass(frozen=True, slots=True)
class ColocationConfig:
    """``colocation-config`` parsed: the cluster strategy (document and typed) and its entries."""

    cluster_doc: Mapping[str, Any] = field(default_factory=default_strategy_doc)
    cluster: ColocationStrategy = DEFAULT_STRATEGY
    node_configs: tuple[NodeColocation, ...] = ()

    def for_node(self, labels: Mapping[str, str], annotations: Mapping[str, str]) -> ColocationStrategy:
        """The node's strategy (steps 2 to 4 of the module docstring); never raises."""
        doc: Mapping[str, Any] = self.cluster_doc
        strategy = self.cluster
        for entry in self.node_configs:
            if entry.selector is not None and entry.selector.matches(labels):
                if entry.strategy is not None:
                    doc, strategy = entry.doc, entry.strategy
                break
        text = annotations.get(ANNOTATION_NODE_COLOCATION_STRATEGY)
        if text is not None:
            try:
                top = read_object(load_json(text, ANNOTATION_NODE_COLOCATION_STRATEGY, max_chars=64 * 1024),
                                  ANNOTATION_NODE_COLOCATION_STRATEGY)
                merged = overlay(doc, top)
                strategy = strategy_from_doc(merged)
            except FormatError:
                pass
        return _with_label_ratios(strategy, labels)


def _label_percent(labels: Mapping[str, str], key: str) -> int | None:
    """A ratio label ("0.6") as a percentage, truncated like Koordinator's ``int64(v*100)``;
    None when absent, not a plain decimal, negative or absurdly large."""
    text = labels.get(key)
    if text is None or len(text) > 32:
        return None
    try:
        ratio = float(text)
    except ValueError:
        return None
    if not math.isfinite(ratio) or ratio < 0 or ratio > 10**6:
        return None
    return int(ratio * 100)


def _with_label_ratios(strategy: ColocationStrategy, labels: Mapping[str, str]) -> ColocationStrategy:
    changes: dict[str, int] = {}
    for key, attr in (
        (LABEL_CPU_RECLAIM_RATIO, "cpu_reclaim_threshold_percent"),
        (LABEL_MEMORY_RECLAIM_RATIO, "memory_reclaim_threshold_percent"),
        (LABEL_MID_STATIC_CPU_RESERVED_RATIO, "mid_static_cpu_reserved_percent"),
        (LABEL_MID_STATIC_MEMORY_RESERVED_RATIO, "mid_static_memory_reserved_percent"),
    ):
        pct = _label_percent(labels, key)
        if pct is not None:
            changes[attr] = pct
    return replace(strategy, **changes) if changes else strategy  # type: ignore[arg-type]


def _node_entry(raw: object, index: int, cluster_doc: Mapping[str, Any]) -> NodeColocation:
    what = f"{_NODE_CONFIGS}[{index}]"
    doc = read_object(raw, what)
    name = doc.get(_NAME)
    name = read_str(name, f"{what} {_NAME}") if name is not None else ""
    own = {k: v for k, v in doc.items() if k not in (_NAME, _NODE_SELECTOR)}
    raw_selector = doc.get(_NODE_SELECTOR)
    try:
        if raw_selector is None:
            raise FormatError(f"{what}: no {_NODE_SELECTOR}")
        selector = parse_label_selector(raw_selector, f"{what} {_NODE_SELECTOR}")
        if read_object(raw_selector, what).get(MATCH_LABELS) is None:
            # IsNodeColocationCfgValid: matchLabels must be set
            raise FormatError(f"{what}: {_NODE_SELECTOR} has no matchLabels")
    except FormatError as exc:
        return NodeColocation(name, None, cluster_doc, problem=str(exc))
    if not any(v is not None for v in own.values()):
        return NodeColocation(name, selector, cluster_doc, problem=f"{what}: sets nothing")
    merged = overlay(cluster_doc, own)
    try:
        strategy = strategy_from_doc(merged)
    except FormatError as exc:
        return NodeColocation(name, selector, cluster_doc, problem=str(exc))
    return NodeColocation(name, selector, merged, strategy)


def parse_colocation_config(text: str | None) -> ColocationConfig:
    """``colocation-config`` text (None or "" for a missing ConfigMap or key: the defaults);
    ``FormatError`` when it is not bounded JSON or its cluster strategy is invalid."""
    if not text:
        return ColocationConfig()
    doc = read_object(
        load_json(text, CONFIG_KEY_COLOCATION, max_chars=MAX_CONFIG_CHARS, max_depth=MAX_JSON_DEPTH),
        CONFIG_KEY_COLOCATION,
    )
    top = {k: v for k, v in doc.items() if k != _NODE_CONFIGS}
    cluster_doc = overlay(default_strategy_doc(), top)
    cluster = strategy_from_doc(cluster_doc)
    raw_nodes = doc.get(_NODE_CONFIGS)
    entries = read_list([] if raw_nodes is None else raw_nodes, _NODE_CONFIGS, _MAX_NODE_CONFIGS)
    nodes = tuple(_node_entry(raw, i, cluster_doc) for i, raw in enumerate(entries))
    return ColocationConfig(cluster_doc, cluster, nodes)


def metric_collect_spec(strategy: ColocationStrategy) -> dict[str, Any]:
    """The NodeMetric ``spec`` for a node with ``strategy``: its metric settings when
    co-location is enabled, else the defaults (the nodemetric controller's rule)."""
    s = strategy if strategy.enable else DEFAULT_STRATEGY
    return {
        _COLLECT_POLICY: {
            _NM_AGG_SECONDS: s.metric_aggregate_duration_seconds,
            _NM_REPORT_SECONDS: s.metric_report_interval_seconds,
            _NM_AGG_POLICY: {_DURATIONS: [format_go_duration(d) for d in s.metric_aggregate_durations]},
            _NM_MEM_POLICY: s.metric_memory_collect_policy,
        }
    }
