"""Load-aware scheduling's settings: koord-scheduler's ``LoadAwareSchedulingArgs`` (the plugin
args, here the ``loadAware`` section of the extender's config file) and the node annotation
``scheduling.koordinator.sh/usage-thresholds`` that overrides its thresholds per node.

Field names, defaults and meaning follow koordinator-sh/koordinator
``pkg/scheduler/apis/config/v1/types.go`` and ``defaults.go`` (``SetDefaults_LoadAwareSchedulingArgs``)
and ``apis/extension`` (``CustomUsageThresholds``):

- ``filterExpiredNodeMetrics`` true, ``nodeMetricExpirationSeconds`` 180,
  ``enableScheduleWhenNodeMetricsExpired`` false;
- ``resourceWeights`` {cpu: 1, memory: 1} when absent or empty and ``dominantResourceWeight``
  is 0 (its default; 0..100, the weight of the lowest resource score, Dominant Resource
  Fairness); ``usageThresholds`` {cpu: 65, memory: 95} when absent or empty;
  ``prodUsageThresholds`` none; ``scoreAccordingProdUsage`` false; ``prodUsageIncludeSys`` false;
- ``estimatedScalingFactors`` {cpu: 85, memory: 70}, a key left out keeps its default;
- ``allowCustomizeEstimation`` false: with it, a pod's annotation
  ``scheduling.koordinator.sh/load-estimated-scaling-factors`` ({"cpu": 100}) overrides the
  factors it names;
- ``estimatedSecondsAfterPodScheduled`` and ``estimatedSecondsAfterInitialized`` (unset): a pod
  counts by its estimate until that long after it was scheduled (or initialized), even when a
  report shows it;
- ``aggregated``: ``usageThresholds``, ``usageAggregationType``, ``usageAggregatedDuration``,
  ``scoreAggregationType``, ``scoreAggregatedDuration`` (Go durations; absent or 0 means the
  longest duration the NodeMetric reports). Filtering by aggregation needs both thresholds and
  a type; scoring by aggregation needs a score type.

Only ``cpu`` and ``memory`` are accepted as resource names (a NodeMetric reports nothing else);
percentages are integers in 0..100 (0: no threshold), weights in 0..100. Both parsers are total
and bounded: anything else is one ``FormatError``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from koord_formats.bounded import load_json, read_bool, read_int, read_object, read_str
from koord_formats.errors import FormatError
from koord_formats.nodemetric import parse_go_duration

__all__ = [
    "AGGREGATION_TYPES",
    "ANNOTATION_CUSTOM_SCALING_FACTORS",
    "ANNOTATION_CUSTOM_USAGE_THRESHOLDS",
    "ANNOTATION_RAW_ALLOCATABLE",
    "CPU",
    "DEFAULT_ARGS",
    "DEFAULT_CPU_MILLI",
    "DEFAULT_MEMORY_BYTES",
    "MEMORY",
    "RESOURCES",
    "AggregatedArgs",
    "CustomThresholds",
    "LoadAwareArgs",
    "parse_custom_scaling_factors",
    "parse_custom_usage_thresholds",
    "parse_load_aware_args",
]

ANNOTATION_CUSTOM_USAGE_THRESHOLDS = "scheduling.koordinator.sh/usage-thresholds"
# a Node's allocatable before amplification, which load-aware scheduling divides by
ANNOTATION_RAW_ALLOCATABLE = "node.koordinator.sh/raw-allocatable"
# a pod's own estimatedScalingFactors, read with allowCustomizeEstimation
ANNOTATION_CUSTOM_SCALING_FACTORS = "scheduling.koordinator.sh/load-estimated-scaling-factors"
CPU = "cpu"
MEMORY = "memory"
RESOURCES = (CPU, MEMORY)
# koord-scheduler's estimator defaults for a pod that names no amount (estimator/default_estimator.go);
# the manager counts such a container the same way (colocation_manager.objects)
DEFAULT_CPU_MILLI = 250
DEFAULT_MEMORY_BYTES = 200 * 1024 * 1024
AGGREGATION_TYPES = ("avg", "p50", "p90", "p95", "p99")
MAX_EXPIRATION_SECONDS = 86400
_MAX_ANNOTATION_CHARS = 4096


def _frozen(values: Mapping[str, int]) -> Mapping[str, int]:
    return MappingProxyType(dict(values))


@dataclass(frozen=True, slots=True)
class AggregatedArgs:
    """``aggregated``: thresholds on a percentile of usage over a duration (seconds, 0 = the
    longest one reported)."""

    usage_thresholds: Mapping[str, int] = field(default_factory=lambda: _frozen({}))
    usage_type: str = ""
    usage_duration: int = 0
    score_type: str = ""
    score_duration: int = 0

    @property
    def filters(self) -> bool:
        """Filtering uses the aggregated usage (thresholds and a type are both set)."""
        return bool(self.usage_thresholds) and bool(self.usage_type)

    @property
    def scores(self) -> bool:
        """Scoring uses the aggregated usage (a score type is set)."""
        return bool(self.score_type)


@dataclass(frozen=True, slots=True)
class LoadAwareArgs:
    """``LoadAwareSchedulingArgs`` with Koordinator's defaults filled in."""

    filter_expired: bool = True
    expiration_seconds: int = 180
    schedule_when_expired: bool = False
    resource_weights: Mapping[str, int] = field(default_factory=lambda: _frozen({CPU: 1, MEMORY: 1}))
    usage_thresholds: Mapping[str, int] = field(default_factory=lambda: _frozen({CPU: 65, MEMORY: 95}))
    prod_usage_thresholds: Mapping[str, int] = field(default_factory=lambda: _frozen({}))
    score_according_prod_usage: bool = False
    prod_usage_include_sys: bool = False
    scaling_factors: Mapping[str, int] = field(default_factory=lambda: _frozen({CPU: 85, MEMORY: 70}))
    seconds_after_scheduled: int = 0  # estimatedSecondsAfterPodScheduled (0: unset)
    seconds_after_initialized: int = 0  # estimatedSecondsAfterInitialized (0: unset)
    dominant_weight: int = 0  # dominantResourceWeight: weight of the most used resource's score
    allow_customize: bool = False  # allowCustomizeEstimation: pods' own scaling factors count
    aggregated: AggregatedArgs = field(default_factory=AggregatedArgs)


DEFAULT_ARGS = LoadAwareArgs()


@dataclass(frozen=True, slots=True)
class CustomThresholds:
    """The node annotation ``scheduling.koordinator.sh/usage-thresholds`` (empty maps: not set;
    ``aggregated`` None: not set or incomplete, which Koordinator treats as not set)."""

    usage_thresholds: Mapping[str, int] = field(default_factory=lambda: _frozen({}))
    prod_usage_thresholds: Mapping[str, int] = field(default_factory=lambda: _frozen({}))
    aggregated: AggregatedArgs | None = None


def _percents(value: object, what: str, hi: int = 100) -> Mapping[str, int]:
    if value is None:
        return _frozen({})
    doc = read_object(value, what)
    out: dict[str, int] = {}
    for name, amount in doc.items():
        if name not in RESOURCES:
            raise FormatError(f"{what}: {str(name)[:64]!r} is not one of {', '.join(RESOURCES)}")
        out[name] = read_int(amount, f"{what} {name}", 0, hi)
    return _frozen(out)


def _duration(value: object, what: str) -> int:
    if value is None:
        return 0
    seconds = parse_go_duration(value)
    whole = round(seconds)
    if abs(whole - seconds) > 1e-6:
        raise FormatError(f"{what}: {seconds} s is not a whole number of seconds")
    return whole


def _aggregation_type(value: object, what: str) -> str:
    if value is None:
        return ""
    text = read_str(value, what, 16)
    if text and text not in AGGREGATION_TYPES:
        raise FormatError(f"{what}: {text!r} is not one of {', '.join(AGGREGATION_TYPES)}")
    return text


def _aggregated(value: object, what: str) -> AggregatedArgs:
    doc = read_object(value, what)
    return AggregatedArgs(
        usage_thresholds=_percents(doc.get("usageThresholds"), f"{what} usageThresholds"),
        usage_type=_aggregation_type(doc.get("usageAggregationType"), f"{what} usageAggregationType"),
        usage_duration=_duration(doc.get("usageAggregatedDuration"), f"{what} usageAggregatedDuration"),
        score_type=_aggregation_type(doc.get("scoreAggregationType"), f"{what} scoreAggregationType"),
        score_duration=_duration(doc.get("scoreAggregatedDuration"), f"{what} scoreAggregatedDuration"),
    )


def _flag(doc: Mapping[str, Any], key: str, default: bool) -> bool:
    value = doc.get(key)
    return default if value is None else read_bool(value, key)


_ARGS_KEYS = frozenset({
    "apiVersion", "kind", "filterExpiredNodeMetrics", "nodeMetricExpirationSeconds",
    "enableScheduleWhenNodeMetricsExpired", "resourceWeights", "usageThresholds", "prodUsageThresholds",
    "scoreAccordingProdUsage", "prodUsageIncludeSys", "estimatedScalingFactors", "aggregated",
    "estimatedSecondsAfterPodScheduled", "estimatedSecondsAfterInitialized", "dominantResourceWeight",
    "allowCustomizeEstimation",
})  # fmt: skip


def parse_load_aware_args(section: object) -> LoadAwareArgs:
    """The ``loadAware`` section (decoded JSON or YAML) as ``LoadAwareArgs``; ``FormatError``
    for an unknown key (a misspelt setting would silently keep its default), a wrong type or a
    value out of range. ``apiVersion`` and ``kind`` are accepted and ignored, so Koordinator's
    own ``LoadAwareSchedulingArgs`` document can be pasted as it is."""
    doc = read_object(section, "loadAware")
    unknown = sorted(str(k)[:64] for k in doc if k not in _ARGS_KEYS)
    if unknown:
        raise FormatError(f"loadAware: unknown setting(s) {', '.join(unknown)}")
    d = DEFAULT_ARGS
    expiration = doc.get("nodeMetricExpirationSeconds")
    weights = _percents(doc.get("resourceWeights"), "resourceWeights")
    thresholds = _percents(doc.get("usageThresholds"), "usageThresholds")
    factors = dict(d.scaling_factors)
    factors.update(_percents(doc.get("estimatedScalingFactors"), "estimatedScalingFactors"))
    raw_dominant = doc.get("dominantResourceWeight")
    dominant = 0 if raw_dominant is None else read_int(raw_dominant, "dominantResourceWeight", 0, 100)
    if not weights and dominant == 0:
        weights = d.resource_weights
    if not any(weights.values()) and dominant == 0:
        raise FormatError("resourceWeights: at least one weight (or dominantResourceWeight) must be above 0")
    raw_aggregated = doc.get("aggregated")
    after_scheduled = doc.get("estimatedSecondsAfterPodScheduled")
    after_initialized = doc.get("estimatedSecondsAfterInitialized")
    return LoadAwareArgs(
        filter_expired=_flag(doc, "filterExpiredNodeMetrics", d.filter_expired),
        expiration_seconds=d.expiration_seconds if expiration is None
        else read_int(expiration, "nodeMetricExpirationSeconds", 1, MAX_EXPIRATION_SECONDS),
        schedule_when_expired=_flag(doc, "enableScheduleWhenNodeMetricsExpired", d.schedule_when_expired),
        resource_weights=weights,
        usage_thresholds=thresholds or d.usage_thresholds,
        prod_usage_thresholds=_percents(doc.get("prodUsageThresholds"), "prodUsageThresholds"),
        score_according_prod_usage=_flag(doc, "scoreAccordingProdUsage", d.score_according_prod_usage),
        prod_usage_include_sys=_flag(doc, "prodUsageIncludeSys", d.prod_usage_include_sys),
        scaling_factors=_frozen(factors),
        dominant_weight=dominant,
        allow_customize=_flag(doc, "allowCustomizeEstimation", d.allow_customize),
        seconds_after_scheduled=0 if after_scheduled is None
        else read_int(after_scheduled, "estimatedSecondsAfterPodScheduled", 0, MAX_EXPIRATION_SECONDS),
        seconds_after_initialized=0 if after_initialized is None
        else read_int(after_initialized, "estimatedSecondsAfterInitialized", 0, MAX_EXPIRATION_SECONDS),
        aggregated=AggregatedArgs() if raw_aggregated is None else _aggregated(raw_aggregated, "aggregated"),
    )


def parse_custom_usage_thresholds(text: object) -> CustomThresholds:
    """The node annotation's JSON text as ``CustomThresholds``; ``FormatError`` when it is not a
    bounded JSON object of the shape above. An ``aggregatedUsage`` without both thresholds and a
    type is dropped, as Koordinator drops it."""
    doc = read_object(load_json(text, ANNOTATION_CUSTOM_USAGE_THRESHOLDS, max_chars=_MAX_ANNOTATION_CHARS),
                      ANNOTATION_CUSTOM_USAGE_THRESHOLDS)
    raw = doc.get("aggregatedUsage")
    aggregated = None
    if raw is not None:
        agg = _aggregated(raw, "aggregatedUsage")
        aggregated = agg if agg.filters else None
    return CustomThresholds(
        usage_thresholds=_percents(doc.get("usageThresholds"), "usageThresholds"),
        prod_usage_thresholds=_percents(doc.get("prodUsageThresholds"), "prodUsageThresholds"),
        aggregated=aggregated,
    )


def parse_custom_scaling_factors(text: object) -> Mapping[str, int]:
    """A pod's ``load-estimated-scaling-factors`` annotation (a JSON object of cpu and memory
    percentages); ``FormatError`` when it is not a bounded object of that shape."""
    doc = load_json(text, ANNOTATION_CUSTOM_SCALING_FACTORS, max_chars=_MAX_ANNOTATION_CHARS)
    return _percents(read_object(doc, ANNOTATION_CUSTOM_SCALING_FACTORS), ANNOTATION_CUSTOM_SCALING_FACTORS)
