"""The NodeMetric object (``slo.koordinator.sh/v1alpha1``, kind ``NodeMetric``, cluster-scoped,
one per node named like the node): its spec's collect policy, and its status (what a node agent
reports and what a manager or scheduler reads).

Shapes (koordinator-sh/koordinator ``apis/slo/v1alpha1/nodemetric_types.go``):

- ``spec.metricCollectPolicy``: ``aggregateDurationSeconds``, ``reportIntervalSeconds``,
  ``nodeAggregatePolicy.durations`` (Go duration strings such as ``"5m0s"``) and
  ``nodeMemoryCollectPolicy``. Absent fields take koordlet's defaults
  (``states_nodemetric.go`` ``defaultNodeMetricSpec``): 300, 60, [5m, 10m, 30m],
  ``usageWithoutPageCache``.
- ``status``: ``updateTime`` (RFC 3339), ``nodeMetric`` {``nodeUsage``,
  ``aggregatedNodeUsages``, ``systemUsage``, ``aggregatedSystemUsages``}, ``podsMetric``
  [{``name``, ``namespace``, ``podUsage``, ``priority``, ``qos``}], ``hostApplicationMetric``
  [{``name``, ``usage``, ``priority``, ``qos``}].
- A resource map is ``{"resources": {"cpu": "1500m", "memory": "1Gi"}}``; an empty one (no
  samples yet, or an aggregation still in its cold start) is ``{}``. An aggregated usage is
  ``{"usage": {"p50": map, "p90": map, "p95": map, "p99": map}, "duration": "5m0s"}``.
- CPU is written in milli-cores (``format_milli_cpu``), memory in bytes (``format_bytes``).

``parse_collect_policy`` reads a spec, ``format_node_metric_status`` writes a status and
``parse_node_metric_status`` reads one back; the two are each other's inverse
(``tests/formats/test_format_nodemetric.py``). Every parser is total and bounded.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from types import MappingProxyType
from typing import Any

from koord_formats.bounded import MAX_NAME_CHARS, read_int, read_list, read_object, read_str
from koord_formats.errors import FormatError
from koord_formats.quantity import format_bytes, format_milli_cpu, parse_bytes, parse_cpu_milli

__all__ = [
    "AGGREGATIONS",
    "API_GROUP",
    "API_VERSION",
    "CLOCK_SKEW_SECONDS",
    "DEFAULT_COLLECT_POLICY",
    "KIND",
    "MAX_DURATIONS",
    "MAX_METRIC_ENTRIES",
    "MEMORY_POLICIES",
    "MIN_REPORT_INTERVAL_SECONDS",
    "PLURAL",
    "AggregatedUsage",
    "CollectPolicy",
    "HostAppMetric",
    "NodeMetricStatus",
    "PodMetric",
    "Usage",
    "format_go_duration",
    "format_node_metric_status",
    "is_from_the_future",
    "parse_collect_policy",
    "parse_go_duration",
    "parse_node_metric_status",
    "parse_prod_reclaimable",
    "parse_update_time",
    "parse_whole_seconds",
]

API_GROUP = "slo.koordinator.sh"
API_VERSION = "v1alpha1"
KIND = "NodeMetric"
PLURAL = "nodemetrics"

MEMORY_WITHOUT_PAGE_CACHE = "usageWithoutPageCache"
MEMORY_WITH_PAGE_CACHE = "usageWithPageCache"
MEMORY_WITH_HOT_PAGE_CACHE = "usageWithHotPageCache"
MEMORY_POLICIES = (MEMORY_WITHOUT_PAGE_CACHE, MEMORY_WITH_PAGE_CACHE, MEMORY_WITH_HOT_PAGE_CACHE)
# koordlet's aggregated entries (``collectNodeAggregateMetric``): these four, never avg or max.
AGGREGATIONS = ("p50", "p90", "p95", "p99")
_ALL_AGGREGATIONS = ("avg", *AGGREGATIONS)
# koordlet reports at most this often (``minReportIntervalSeconds``).
MIN_REPORT_INTERVAL_SECONDS = 30

# Bounds: a spec names a handful of durations; a node runs at most a few hundred pods (kubelet's
# default maxPods is 110), so 4096 pod entries leave room; a duration or interval longer than a
# day is no collect policy.
MAX_DURATIONS = 16
MAX_METRIC_ENTRIES = 4096
MAX_SECONDS = 86400
_MAX_DURATION_CHARS = 32
# How far ahead of the reader's clock an ``updateTime`` may be (clocks of the writing node and
# the reader differ a little); a report further ahead is not believed (``is_from_the_future``).
CLOCK_SKEW_SECONDS = 60.0
_MAX_TIME_CHARS = 64
_DURATION_PARTS = {
    digits: re.compile(rf"([0-9]{{1,{digits}}}(?:\.[0-9]{{1,9}})?)(ns|us|µs|ms|s|m|h)", re.ASCII) for digits in (9, 12)
}
_UNIT_SECONDS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_go_duration(
    text: object,
    what: str = "duration",
    *,
    max_seconds: float = MAX_SECONDS,
    max_chars: int = _MAX_DURATION_CHARS,
    max_digits: int = 9,
) -> float:
    """A Go ``time.Duration`` string (``"5m0s"``, ``"300s"``, ``"1h30m"``, ``"1.5m"``) in
    seconds; ``FormatError`` for anything else, a negative value or one above ``max_seconds``
    (a day unless told). The one Go duration parser: a Reservation's ``spec.ttl`` reads with it
    too, with a century, longer text and 12-digit numbers (``max_digits``: 9 or 12)."""
    raw = read_str(text, what, max_chars)
    if raw == "0":
        return 0.0
    part = _DURATION_PARTS[max_digits]
    pos, total = 0, 0.0
    while pos < len(raw):
        m = part.match(raw, pos)
        if m is None:
            raise FormatError(f"{what}: {raw[:64]!r} is not a Go duration")
        total += float(m.group(1)) * _UNIT_SECONDS[m.group(2)]
        pos = m.end()
    if not raw or total > max_seconds:
        raise FormatError(f"{what}: {raw[:64]!r} is empty or longer than {max_seconds:.0f} s")
    return total


def format_go_duration(seconds: int) -> str:
    """Whole seconds as Go's ``Duration.String()`` writes them: ``300`` -> ``"5m0s"``,
    ``30`` -> ``"30s"``, ``3600`` -> ``"1h0m0s"``, ``0`` -> ``"0s"``."""
    if seconds < 0:
        raise ValueError("a negative duration")
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes}m{secs}s"
    if minutes:
        return f"{minutes}m{secs}s"
    return f"{secs}s"


# ---- spec ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CollectPolicy:
    """``spec.metricCollectPolicy`` with koordlet's defaults filled in."""

    aggregate_duration_seconds: int = 300
    report_interval_seconds: int = 60
    durations: tuple[int, ...] = (300, 600, 1800)  # seconds, in the spec's order
    memory_policy: str = MEMORY_WITHOUT_PAGE_CACHE

    @property
    def report_every_seconds(self) -> int:
        """How often koordlet reports: ``reportIntervalSeconds``, at least 30."""
        return max(self.report_interval_seconds, MIN_REPORT_INTERVAL_SECONDS)


DEFAULT_COLLECT_POLICY = CollectPolicy()


def parse_collect_policy(spec: object) -> CollectPolicy:
    """A NodeMetric's ``spec`` (decoded JSON) as a ``CollectPolicy``: each absent field keeps
    its default, as koordlet overlays the spec on its defaults. ``FormatError`` when a present
    field is malformed (not an object, an integer outside 1..86400, an unknown memory policy,
    more than ``MAX_DURATIONS`` durations, a duration that is not whole seconds in 1..86400)."""
    if spec is None:
        return DEFAULT_COLLECT_POLICY
    raw = read_object(spec, "NodeMetric spec").get("metricCollectPolicy")
    if raw is None:
        return DEFAULT_COLLECT_POLICY
    doc = read_object(raw, "metricCollectPolicy")
    d = DEFAULT_COLLECT_POLICY
    aggregate = doc.get("aggregateDurationSeconds")
    report = doc.get("reportIntervalSeconds")
    memory = doc.get("nodeMemoryCollectPolicy")
    durations = d.durations
    policy = doc.get("nodeAggregatePolicy")
    if policy is not None:
        listed = read_object(policy, "nodeAggregatePolicy").get("durations")
        if listed is not None:
            items = read_list(listed, "nodeAggregatePolicy durations", MAX_DURATIONS)
            durations = tuple(parse_whole_seconds(item) for item in items)
    if memory is not None and read_str(memory, "nodeMemoryCollectPolicy", 64) not in MEMORY_POLICIES:
        raise FormatError(f"nodeMemoryCollectPolicy: {memory!r} is not one of {', '.join(MEMORY_POLICIES)}")
    return CollectPolicy(
        aggregate_duration_seconds=d.aggregate_duration_seconds if aggregate is None
        else read_int(aggregate, "aggregateDurationSeconds", 1, MAX_SECONDS),
        report_interval_seconds=d.report_interval_seconds if report is None
        else read_int(report, "reportIntervalSeconds", 1, MAX_SECONDS),
        durations=durations,
        memory_policy=d.memory_policy if memory is None else str(memory),
    )


def parse_whole_seconds(text: object) -> int:
    """A Go duration (``parse_go_duration``) of whole seconds, at least 1; ``FormatError``
    otherwise."""
    seconds = parse_go_duration(text)
    whole = round(seconds)
    if whole < 1 or abs(whole - seconds) > 1e-6:
        raise FormatError(f"duration: {text!r} is not a whole number of seconds of at least 1")
    return whole


# ---- status --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Usage:
    """One resource map: CPU in milli-cores and memory in bytes; ``None`` when absent (an
    empty map, ``{}``, has both ``None``)."""

    cpu_milli: int | None = None
    memory_bytes: int | None = None

    @property
    def empty(self) -> bool:
        return self.cpu_milli is None and self.memory_bytes is None


EMPTY_USAGE = Usage()


@dataclass(frozen=True, slots=True)
class AggregatedUsage:
    """One entry of ``aggregatedNodeUsages`` / ``aggregatedSystemUsages``."""

    duration_seconds: int
    usage: Mapping[str, Usage] = field(default_factory=lambda: MappingProxyType({}))  # "p50".. -> map


@dataclass(frozen=True, slots=True)
class PodMetric:
    """One entry of ``podsMetric``."""

    namespace: str
    name: str
    usage: Usage
    priority: str = ""
    qos: str = ""


@dataclass(frozen=True, slots=True)
class HostAppMetric:
    """One entry of ``hostApplicationMetric``."""

    name: str
    usage: Usage
    priority: str = ""
    qos: str = ""


@dataclass(frozen=True, slots=True)
class NodeMetricStatus:
    """A NodeMetric's ``status``."""

    update_time: str = ""
    node_usage: Usage = EMPTY_USAGE
    aggregated_node_usages: tuple[AggregatedUsage, ...] = ()
    system_usage: Usage = EMPTY_USAGE
    aggregated_system_usages: tuple[AggregatedUsage, ...] = ()
    pods: tuple[PodMetric, ...] = ()
    host_apps: tuple[HostAppMetric, ...] = ()


def _format_usage(usage: Usage) -> dict[str, Any]:
    resources: dict[str, str] = {}
    if usage.cpu_milli is not None:
        resources["cpu"] = format_milli_cpu(usage.cpu_milli)
    if usage.memory_bytes is not None:
        resources["memory"] = format_bytes(usage.memory_bytes)
    return {"resources": resources} if resources else {}


def _format_aggregated(entries: Sequence[AggregatedUsage]) -> list[dict[str, Any]]:
    return [
        {"usage": {k: _format_usage(v) for k, v in e.usage.items()}, "duration": format_go_duration(e.duration_seconds)}
        for e in entries
    ]


def format_node_metric_status(status: NodeMetricStatus) -> dict[str, Any]:
    """The status as the JSON object to send (``UpdateStatus``), fields as Koordinator names
    them; empty lists and the empty ``updateTime`` are left out as Go's ``omitempty`` does."""
    node: dict[str, Any] = {"nodeUsage": _format_usage(status.node_usage),
                            "systemUsage": _format_usage(status.system_usage)}
    if status.aggregated_node_usages:
        node["aggregatedNodeUsages"] = _format_aggregated(status.aggregated_node_usages)
    if status.aggregated_system_usages:
        node["aggregatedSystemUsages"] = _format_aggregated(status.aggregated_system_usages)
    out: dict[str, Any] = {}
    if status.update_time:
        out["updateTime"] = status.update_time
    out["nodeMetric"] = node
    if status.pods:
        out["podsMetric"] = [
            {"namespace": p.namespace, "name": p.name, "podUsage": _format_usage(p.usage),
             "priority": p.priority, "qos": p.qos}
            for p in status.pods
        ]
    if status.host_apps:
        out["hostApplicationMetric"] = [
            {"name": a.name, "usage": _format_usage(a.usage), "priority": a.priority, "qos": a.qos}
            for a in status.host_apps
        ]
    return out


def _usage(value: object, what: str) -> Usage:
    if value is None:
        return EMPTY_USAGE
    raw = read_object(value, what).get("resources")
    if raw is None:
        return EMPTY_USAGE
    res = read_object(raw, f"{what} resources")
    cpu, memory = res.get("cpu"), res.get("memory")
    return Usage(
        cpu_milli=None if cpu is None else parse_cpu_milli(cpu),
        memory_bytes=None if memory is None else parse_bytes(memory),
    )


def _aggregated(value: object, what: str) -> tuple[AggregatedUsage, ...]:
    if value is None:
        return ()
    out: list[AggregatedUsage] = []
    for entry in read_list(value, what, MAX_DURATIONS):
        item = read_object(entry, f"{what} entry")
        raw = item.get("usage")
        usage = {} if raw is None else read_object(raw, f"{what} usage")
        maps: dict[str, Usage] = {}
        for key, val in usage.items():
            if key not in _ALL_AGGREGATIONS:
                raise FormatError(f"{what}: unknown aggregation {str(key)[:32]!r}")
            maps[key] = _usage(val, f"{what} {key}")
        duration = item.get("duration")
        seconds = 0 if duration is None else parse_whole_seconds(duration)
        out.append(AggregatedUsage(seconds, MappingProxyType(maps)))
    return tuple(out)


def _text(item: Mapping[str, Any], key: str, what: str, max_chars: int = MAX_NAME_CHARS) -> str:
    value = item.get(key)
    return "" if value is None else read_str(value, f"{what} {key}", max_chars)


def parse_node_metric_status(status: object) -> NodeMetricStatus:
    """A NodeMetric's ``status`` (decoded JSON) as a ``NodeMetricStatus``; ``FormatError`` when
    any part is malformed or over its bound (``MAX_METRIC_ENTRIES`` pods or host applications,
    ``MAX_DURATIONS`` aggregated entries, quantities as ``koord_formats.quantity`` bounds them)."""
    if status is None:
        return NodeMetricStatus()
    doc = read_object(status, "NodeMetric status")
    node_raw = doc.get("nodeMetric")
    node = {} if node_raw is None else read_object(node_raw, "nodeMetric")
    pods: list[PodMetric] = []
    raw_pods = doc.get("podsMetric")
    for entry in [] if raw_pods is None else read_list(raw_pods, "podsMetric", MAX_METRIC_ENTRIES):
        item = read_object(entry, "podsMetric entry")
        pods.append(PodMetric(
            namespace=_text(item, "namespace", "podsMetric"),
            name=_text(item, "name", "podsMetric"),
            usage=_usage(item.get("podUsage"), "podsMetric podUsage"),
            priority=_text(item, "priority", "podsMetric", 64),
            qos=_text(item, "qos", "podsMetric", 64),
        ))  # fmt: skip
    apps: list[HostAppMetric] = []
    raw_apps = doc.get("hostApplicationMetric")
    for entry in [] if raw_apps is None else read_list(raw_apps, "hostApplicationMetric", MAX_METRIC_ENTRIES):
        item = read_object(entry, "hostApplicationMetric entry")
        apps.append(HostAppMetric(
            name=_text(item, "name", "hostApplicationMetric"),
            usage=_usage(item.get("usage"), "hostApplicationMetric usage"),
            priority=_text(item, "priority", "hostApplicationMetric", 64),
            qos=_text(item, "qos", "hostApplicationMetric", 64),
        ))  # fmt: skip
    return NodeMetricStatus(
        update_time=_text(doc, "updateTime", "NodeMetric status", _MAX_TIME_CHARS),
        node_usage=_usage(node.get("nodeUsage"), "nodeUsage"),
        aggregated_node_usages=_aggregated(node.get("aggregatedNodeUsages"), "aggregatedNodeUsages"),
        system_usage=_usage(node.get("systemUsage"), "systemUsage"),
        aggregated_system_usages=_aggregated(node.get("aggregatedSystemUsages"), "aggregatedSystemUsages"),
        pods=tuple(pods),
        host_apps=tuple(apps),
    )


def parse_prod_reclaimable(status: object) -> Usage | None:
    """``status.prodReclaimableMetric.resource`` (what prod pods reserved but do not use, which
    a manager lends to mid pods), or None when absent; ``FormatError`` when malformed."""
    if status is None:
        return None
    raw = read_object(status, "NodeMetric status").get("prodReclaimableMetric")
    if raw is None:
        return None
    resource = read_object(raw, "prodReclaimableMetric").get("resource")
    return None if resource is None else _usage(resource, "prodReclaimableMetric resource")


def is_from_the_future(update_time: float, now: float) -> bool:
    """True when ``update_time`` (seconds since the epoch) is more than ``CLOCK_SKEW_SECONDS``
    after ``now``: no writer reports usage it has not measured yet, and a report stamped in 2099
    would otherwise never expire."""
    return update_time - now > CLOCK_SKEW_SECONDS


def parse_update_time(text: object) -> float:
    """``status.updateTime`` (RFC 3339, as ``"2026-11-27T08:00:00Z"``) in seconds since the
    epoch; ``FormatError`` when it is not a bounded string with a time zone."""
    raw = read_str(text, "updateTime", _MAX_TIME_CHARS)
    try:
        moment = datetime.fromisoformat(raw)
    except ValueError as exc:
        raise FormatError(f"updateTime: {exc}") from None
    if moment.tzinfo is None:
        raise FormatError("updateTime: no time zone")
    return moment.timestamp()
