"""Load-aware scheduling: filter and score nodes by the usage their NodeMetric reports, as
koord-scheduler's LoadAwareScheduling plugin does (``pkg/scheduler/plugins/loadaware``), with
its args (``koord_formats.loadaware.LoadAwareArgs``, off unless the extender's config file has a
``loadAware`` section).

Pure functions (no clock, no cache: the caller passes ``now`` and the node's facts):

- ``estimate``: the estimator. A pod's amount is max(request, limit) of cpu and memory (of
  ``kubernetes.io/batch-*`` for koord-batch pods and ``kubernetes.io/mid-*`` for koord-mid ones);
  none gives 250m CPU and 200 MiB; otherwise amount x scaling factor / 100, rounded, at most
  the limit when there is one.
- ``estimated_used``: what the node uses with the pod on it. The reported usage (node usage,
  or the aggregated percentile the thresholds ask for) plus, for each pod assigned to the node
  that the report cannot yet show in full (not in ``podsMetric``, assigned after the report,
  or less than one report interval before it), max(0, estimate - reported usage), plus the
  incoming pod's estimate. Without a reported usage, the full estimates of the assigned pods.
  For a koord-prod pod under ``prodUsageThresholds``: the usage of the prod pods reported (plus
  system usage with ``prodUsageIncludeSys``) and the prod pods' deltas.
- ``filter_reason``: "" when the node passes, else Koordinator's reason text: ``node(s)
  nodeMetric expired``, ``node(s) cpu usage exceed threshold``, ``node(s) memory aggregated
  usage exceed threshold``. A NodeMetric stamped more than a minute in the future counts as
  expired (``expired``). round(used / allocatable x 100) above a non-zero threshold
  refuses. DaemonSet pods and nodes without a NodeMetric pass.
- ``score``: 0..100, the weighted mean over ``resourceWeights`` of (allocatable - used) x
  100 / allocatable (0 when used is above allocatable), the lowest of them weighted once more
  by ``dominantResourceWeight``; 0 for a node without a NodeMetric or with an expired one.

Decoding (total, each raising only ``FormatError``): ``read_pod_load`` (a Pod object's
requests, limits, priority, DaemonSet owner and PodScheduled time), ``read_node_load`` (a Node's
allocatable, ``node.koordinator.sh/raw-allocatable`` over it, and the usage-thresholds
annotation), ``read_node_metric`` (a NodeMetric object through ``koord_formats.nodemetric``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from types import MappingProxyType
from typing import Any

from koord_formats import keys, qos
from koord_formats.bounded import MAX_NAME_CHARS, load_json, read_list, read_object, read_str
from koord_formats.errors import FormatError
from koord_formats.loadaware import (
    ANNOTATION_CUSTOM_SCALING_FACTORS,
    ANNOTATION_CUSTOM_USAGE_THRESHOLDS,
    ANNOTATION_RAW_ALLOCATABLE,
    CPU,
    DEFAULT_CPU_MILLI,
    DEFAULT_MEMORY_BYTES,
    MEMORY,
    RESOURCES,
    CustomThresholds,
    LoadAwareArgs,
    parse_custom_scaling_factors,
    parse_custom_usage_thresholds,
)
from koord_formats.nodemetric import (
    NodeMetricStatus,
    Usage,
    is_from_the_future,
    parse_collect_policy,
    parse_node_metric_status,
    parse_update_time,
)
from koord_formats.pod import read_resource_list

__all__ = [
    "DEFAULT_CPU_MILLI",
    "DEFAULT_MEMORY_BYTES",
    "MAX_LOAD_SCORE",
    "REASON_AGGREGATED_USAGE",
    "REASON_EXPIRED",
    "REASON_USAGE",
    "NodeLoad",
    "NodeMetricView",
    "PodLoad",
    "estimate",
    "estimated_used",
    "existing_used",
    "expired",
    "filter_reason",
    "read_node_load",
    "read_node_metric",
    "read_pod_load",
    "score",
]

REASON_EXPIRED = "node(s) nodeMetric expired"
REASON_USAGE = "node(s) {} usage exceed threshold"
REASON_AGGREGATED_USAGE = "node(s) {} aggregated usage exceed threshold"
_MAX_RESOURCE_ANNOTATION_CHARS = 16 * 1024
_MAX_CONTAINERS = 1024
_MAX_CONDITIONS = 64
_MAX_OWNERS = 64
# what an amount of each priority class is read from (TranslateResourceNameByPriorityClass)
_NAMES = {
    keys.PRIORITY_BATCH: (keys.RESOURCE_BATCH_CPU, keys.RESOURCE_BATCH_MEMORY),
    keys.PRIORITY_MID: (keys.RESOURCE_MID_CPU, keys.RESOURCE_MID_MEMORY),
}


@dataclass(frozen=True, slots=True)
class PodLoad:
    """What load-aware scheduling reads of a pod: amounts already taken from the resource names
    of its priority class (CPU in milli-cores, memory in bytes)."""

    namespace: str = ""
    name: str = ""
    cpu_request: int = 0
    cpu_limit: int = 0
    memory_request: int = 0
    memory_limit: int = 0
    prod: bool = False  # priority class koord-prod
    daemonset: bool = False  # owned by a DaemonSet
    scheduled_at: float | None = None  # PodScheduled=True lastTransitionTime, epoch seconds
    initialized_at: float | None = None  # Initialized=True lastTransitionTime, epoch seconds
    # its ``load-estimated-scaling-factors`` annotation (None: absent or unreadable)
    factors: Mapping[str, int] | None = None


@dataclass(frozen=True, slots=True)
class NodeLoad:
    """A Node's allocatable (``raw-allocatable`` entries over ``status.allocatable``) and its
    usage-thresholds annotation (None: absent or unreadable, the args apply)."""

    cpu_milli: int = 0
    memory_bytes: int = 0
    custom: CustomThresholds | None = None
    custom_error: str = ""


@dataclass(frozen=True, slots=True)
class NodeMetricView:
    """A NodeMetric as load-aware scheduling reads it."""

    update_time: float | None  # None: no ``status.updateTime``
    report_interval: int  # ``spec.metricCollectPolicy.reportIntervalSeconds`` (60 by default)
    status: NodeMetricStatus = field(default_factory=NodeMetricStatus)


# ---- estimator ------------------------------------------------------------------------------------


def _estimate_one(request: int, limit: int, factor: int, default: int) -> int:
    amount = max(request, limit)
    if amount <= 0:
        return default
    used = (amount * factor * 2 + 100) // 200  # amount x factor / 100, halves rounded up
    return min(used, limit) if limit > 0 else used


def _factors(args: LoadAwareArgs, pod: PodLoad) -> Mapping[str, int]:
    """The scaling factors of ``pod``: its own over the args' with ``allowCustomizeEstimation``."""
    if args.allow_customize and pod.factors:
        return {**args.scaling_factors, **pod.factors}
    return args.scaling_factors


def estimate(pod: PodLoad, factors: Mapping[str, int]) -> dict[str, int]:
    """The estimated usage of ``pod``: resource -> amount (CPU milli-cores, memory bytes)."""
    return {
        CPU: _estimate_one(pod.cpu_request, pod.cpu_limit, factors.get(CPU, 100), DEFAULT_CPU_MILLI),
        MEMORY: _estimate_one(pod.memory_request, pod.memory_limit, factors.get(MEMORY, 100), DEFAULT_MEMORY_BYTES),
    }


# ---- usage ----------------------------------------------------------------------------------------


def _amounts(usage: Usage) -> dict[str, int]:
    out: dict[str, int] = {}
    if usage.cpu_milli is not None:
        out[CPU] = usage.cpu_milli
    if usage.memory_bytes is not None:
        out[MEMORY] = usage.memory_bytes
    return out


def aggregated_usage(status: NodeMetricStatus, kind: str, duration: int) -> dict[str, int] | None:
    """The aggregated node usage of ``kind`` ("p95", ...) over ``duration`` seconds; with
    duration 0 the longest duration that has one, else the node usage. None when absent."""
    entries = status.aggregated_node_usages
    if not entries:
        return None
    if duration == 0:
        best: dict[str, int] | None = None
        longest = 0
        for e in entries:
            u = e.usage.get(kind)
            if u is not None and not u.empty and e.duration_seconds > longest:
                longest, best = e.duration_seconds, _amounts(u)
        if best is not None:
            return best
        return None if status.node_usage.empty else _amounts(status.node_usage)
    for e in entries:
        u = e.usage.get(kind)
        if e.duration_seconds == duration and u is not None and not u.empty:
            return _amounts(u)
    return None


def _estimate_deadline(args: LoadAwareArgs, pod: PodLoad) -> float | None:
    """Until when the pod counts by its estimate whatever the report says
    (``estimatedSecondsAfterInitialized`` after its Initialized time, else
    ``estimatedSecondsAfterPodScheduled`` after its PodScheduled time); None: no such time."""
    if args.seconds_after_initialized > 0 and pod.initialized_at is not None:
        return pod.initialized_at + args.seconds_after_initialized
    if args.seconds_after_scheduled > 0 and pod.scheduled_at is not None:
        return pod.scheduled_at + args.seconds_after_scheduled
    return None


def _needs_estimate(args: LoadAwareArgs, pod: PodLoad, reported: Usage | None, metric: NodeMetricView) -> bool:
    """The report cannot show this pod in full yet: it is missing from ``podsMetric``, or was
    assigned after the report, or less than one report interval before it, or its forced
    estimation lasts past the report (``_estimate_deadline``)."""
    if reported is None or reported.empty:
        return True
    if pod.scheduled_at is None or metric.update_time is None:
        return True
    deadline = _estimate_deadline(args, pod)
    if deadline is not None and deadline > metric.update_time:
        return True
    if pod.scheduled_at > metric.update_time:
        return True
    return metric.update_time - pod.scheduled_at < metric.report_interval


# (reported or aggregated usage chosen by the caller, prod) -> what the node uses without the pod
Existing = Callable[[Mapping[str, int] | None, bool], Mapping[str, int]]


def estimated_used(
    args: LoadAwareArgs,
    pod: PodLoad,
    metric: NodeMetricView,
    assigned: Iterable[PodLoad],
    base: Mapping[str, int] | None,
    *,
    prod: bool,
) -> dict[str, int]:
    """What the node would use with ``pod`` on it (see the module docstring); ``base`` is the
    reported usage chosen by the caller (ignored for ``prod``)."""
    used = estimate(pod, _factors(args, pod))
    for r, v in existing_used(args, metric, assigned, base, prod=prod).items():
        used[r] += v
    return used


def existing_used(
    args: LoadAwareArgs,
    metric: NodeMetricView,
    assigned: Iterable[PodLoad],
    base: Mapping[str, int] | None,
    *,
    prod: bool,
) -> dict[str, int]:
    """What the node uses before the pod being scheduled: ``estimated_used`` without it (the
    part the extender can remember per node, since it does not depend on that pod)."""
    status = metric.status
    reported: dict[tuple[str, str], Usage] = {}
    for p in status.pods:
        if not prod or p.priority == keys.PRIORITY_PROD:
            reported[(p.namespace, p.name)] = p.usage
    used = dict.fromkeys(RESOURCES, 0)
    delta = dict.fromkeys(RESOURCES, 0)
    full = dict.fromkeys(RESOURCES, 0)
    for a in assigned:
        if prod and not a.prod:
            continue
        est = estimate(a, _factors(args, a))
        for r in RESOURCES:
            full[r] += est[r]
        got = reported.get((a.namespace, a.name))
        if _needs_estimate(args, a, got, metric):
            have = _amounts(got) if got is not None else {}
            for r in RESOURCES:
                delta[r] += max(0, est[r] - have.get(r, 0))
    if prod:
        for u in reported.values():
            for r, v in _amounts(u).items():
                used[r] += v
        if args.prod_usage_include_sys:
            for r, v in _amounts(status.system_usage).items():
                used[r] += v
        add = delta
    elif base is not None:
        for r, v in base.items():
            used[r] += v
        add = delta
    else:
        add = full
    for r in RESOURCES:
        used[r] += add[r]
    return used


def expired(metric: NodeMetricView, args: LoadAwareArgs, now: float) -> bool:
    """No ``updateTime``, one at least ``nodeMetricExpirationSeconds`` old, or one in the future
    beyond ``koord_formats.nodemetric.CLOCK_SKEW_SECONDS`` (a forged report is not believed)."""
    return (metric.update_time is None or now - metric.update_time >= args.expiration_seconds
            or is_from_the_future(metric.update_time, now))


def _allocatable(node: NodeLoad, resource: str) -> int:
    return node.cpu_milli if resource == CPU else node.memory_bytes


# ---- filter ---------------------------------------------------------------------------------------


def _existing_from(args: LoadAwareArgs, metric: NodeMetricView, assigned: Sequence[PodLoad]) -> Existing:
    return lambda base, prod: existing_used(args, metric, assigned, base, prod=prod)


def _with_pod(args: LoadAwareArgs, pod: PodLoad, existing: Mapping[str, int]) -> dict[str, int]:
    used = estimate(pod, _factors(args, pod))
    for r, v in existing.items():
        used[r] += v
    return used


def filter_reason(
    args: LoadAwareArgs,
    pod: PodLoad,
    node: NodeLoad,
    metric: NodeMetricView | None,
    assigned: Sequence[PodLoad],
    now: float,
    *,
    existing: Existing | None = None,
) -> str:
    """"" when load-aware filtering lets ``pod`` onto the node, else the reason (Unschedulable).
    ``existing`` (optional) answers ``existing_used`` for the node (a caller's memo); without it
    the usage is computed from ``assigned``."""
    if pod.daemonset or metric is None:
        return ""
    if args.filter_expired and expired(metric, args, now):
        return "" if args.schedule_when_expired else REASON_EXPIRED
    custom = node.custom or CustomThresholds()
    usage_thresholds = custom.usage_thresholds or args.usage_thresholds
    prod_thresholds = custom.prod_usage_thresholds or args.prod_usage_thresholds
    aggregated = custom.aggregated if custom.aggregated is not None else (
        args.aggregated if args.aggregated.filters else None)
    prod = bool(prod_thresholds) and pod.prod
    base: dict[str, int] | None = None
    if prod:
        thresholds = prod_thresholds
    elif aggregated is not None:
        base = aggregated_usage(metric.status, aggregated.usage_type, aggregated.usage_duration)
        thresholds = aggregated.usage_thresholds
    else:
        base = None if metric.status.node_usage.empty else _amounts(metric.status.node_usage)
        thresholds = usage_thresholds
    used = _with_pod(args, pod, (existing or _existing_from(args, metric, assigned))(base, prod))
    for r in RESOURCES:
        limit = thresholds.get(r, 0)
        total = _allocatable(node, r)
        if limit == 0 or total <= 0:
            continue
        if (used[r] * 200 + total) // (2 * total) > limit:  # round(used / total x 100), halves up
            text = REASON_AGGREGATED_USAGE if not prod and aggregated is not None else REASON_USAGE
            return text.format(r)
    return ""


# ---- score ----------------------------------------------------------------------------------------

MAX_LOAD_SCORE = 100


def _least_used(used: int, capacity: int) -> int:
    if capacity <= 0 or used > capacity:
        return 0
    return (capacity - used) * MAX_LOAD_SCORE // capacity


def score(
    args: LoadAwareArgs,
    pod: PodLoad,
    node: NodeLoad,
    metric: NodeMetricView | None,
    assigned: Sequence[PodLoad],
    now: float,
    *,
    existing: Existing | None = None,
) -> int:
    """The node's load score for ``pod``, 0..100 (higher: less used); ``existing`` as for
    ``filter_reason``."""
    if metric is None or expired(metric, args, now):
        return 0
    prod = pod.prod and args.score_according_prod_usage
    base: dict[str, int] | None = None
    if not prod:
        if args.aggregated.scores:
            base = aggregated_usage(metric.status, args.aggregated.score_type, args.aggregated.score_duration)
        elif not metric.status.node_usage.empty:
            base = _amounts(metric.status.node_usage)
    used = _with_pod(args, pod, (existing or _existing_from(args, metric, assigned))(base, prod))
    total = weights = 0
    lowest = MAX_LOAD_SCORE  # the dominant (most used) resource's score
    for r in RESOURCES:  # every resource: the dominant one may have no weight of its own
        w = args.resource_weights.get(r, 0)
        one = _least_used(used.get(r, 0), _allocatable(node, r))
        total += one * w
        weights += w
        lowest = min(lowest, one)
    if args.dominant_weight:
        total += lowest * args.dominant_weight
        weights += args.dominant_weight
    return total // weights if weights else 0


# ---- decoding -------------------------------------------------------------------------------------


def _object(value: object, what: str) -> Mapping[str, Any]:
    return MappingProxyType({}) if value is None else read_object(value, what)


def _milli(amount: Fraction) -> int:
    return math.ceil(amount * 1000)


def _whole(amount: Fraction) -> int:
    return math.ceil(amount)


def _pod_amounts(spec: Mapping[str, Any], names: tuple[str, str]) -> tuple[int, int, int, int]:
    """(cpu request, cpu limit, memory request, memory limit) of the pod, as Kubernetes sums
    them: containers added up, the largest init container if larger. A request left out beside
    a limit is the limit (the API server's default)."""
    cpu_name, mem_name = names
    req: dict[str, Fraction] = {}
    lim: dict[str, Fraction] = {}

    def container(raw: object, what: str, combine: Any) -> None:
        res = _object(read_object(raw, what).get("resources"), f"{what} resources")
        limits = read_resource_list(res.get("limits"), f"{what} limits")
        requests = dict(read_resource_list(res.get("requests"), f"{what} requests"))
        for n, v in limits.items():
            requests.setdefault(n, v)
        for n in (cpu_name, mem_name):
            if n in requests:
                req[n] = combine(req.get(n, Fraction(0)), requests[n])
            if n in limits:
                lim[n] = combine(lim.get(n, Fraction(0)), limits[n])

    for c in read_list(spec.get("containers") or [], "containers", _MAX_CONTAINERS):
        container(c, "container", lambda a, b: a + b)
    for c in read_list(spec.get("initContainers") or [], "initContainers", _MAX_CONTAINERS):
        container(c, "init container", max)
    # batch and mid CPU amounts are written in milli-cores already ("500" = 500m)
    cpu = _milli if cpu_name == "cpu" else _whole
    zero = Fraction(0)
    return (cpu(req.get(cpu_name, zero)), cpu(lim.get(cpu_name, zero)),
            _whole(req.get(mem_name, zero)), _whole(lim.get(mem_name, zero)))


def _condition_time(status: Mapping[str, Any], kind: str) -> float | None:
    """When the pod's condition ``kind`` last became True; None when it is not True."""
    for raw in read_list(status.get("conditions") or [], "conditions", _MAX_CONDITIONS):
        cond = read_object(raw, "condition")
        if cond.get("type") == kind and cond.get("status") == "True":
            when = cond.get("lastTransitionTime")
            return None if when is None else parse_update_time(when)
    return None


def read_pod_load(pod: object) -> PodLoad:
    """A Pod object (decoded JSON) as ``PodLoad``; ``FormatError`` when malformed."""
    doc = read_object(pod, "pod")
    meta = _object(doc.get("metadata"), "metadata")
    spec = _object(doc.get("spec"), "spec")
    status = _object(doc.get("status"), "status")
    labels = _object(meta.get("labels"), "labels")
    text_labels = {k: v for k, v in labels.items() if isinstance(k, str) and isinstance(v, str)}
    kube_qos = status.get("qosClass")
    kube_qos = read_str(kube_qos, "qosClass", 32) if kube_qos is not None else ""
    priority = spec.get("priority")
    if priority is not None and (isinstance(priority, bool) or not isinstance(priority, int)):
        raise FormatError("pod priority: expected an integer")
    klass = qos.priority_class(text_labels, priority, qos.qos_class(text_labels, kube_qos))
    cpu_req, cpu_lim, mem_req, mem_lim = _pod_amounts(spec, _NAMES.get(klass, (CPU, MEMORY)))
    owners = read_list(meta.get("ownerReferences") or [], "ownerReferences", _MAX_OWNERS)
    daemonset = any(read_object(o, "ownerReference").get("kind") == "DaemonSet" for o in owners)
    name, namespace = meta.get("name"), meta.get("namespace")
    annotations = _object(meta.get("annotations"), "annotations")
    factors = None
    text = annotations.get(ANNOTATION_CUSTOM_SCALING_FACTORS)
    if text is not None:
        try:
            factors = parse_custom_scaling_factors(text)
        except FormatError:
            factors = None  # as Koordinator: an unreadable annotation leaves the args' factors
    return PodLoad(
        namespace="default" if namespace is None else read_str(namespace, "namespace", MAX_NAME_CHARS),
        name="" if name is None else read_str(name, "name", MAX_NAME_CHARS),
        cpu_request=cpu_req,
        cpu_limit=cpu_lim,
        memory_request=mem_req,
        memory_limit=mem_lim,
        prod=klass == keys.PRIORITY_PROD,
        daemonset=daemonset,
        scheduled_at=_condition_time(status, "PodScheduled"),
        initialized_at=_condition_time(status, "Initialized"),
        factors=factors,
    )


def read_node_load(node: object) -> NodeLoad:
    """A Node object as ``NodeLoad``; ``FormatError`` when its allocatable or raw-allocatable
    cannot be read. An unreadable usage-thresholds annotation is kept as ``custom_error`` (the
    args apply, as in Koordinator, which logs it and goes on)."""
    doc = read_object(node, "node")
    meta = _object(doc.get("metadata"), "metadata")
    annotations = _object(meta.get("annotations"), "annotations")
    allocatable = dict(read_resource_list(_object(doc.get("status"), "status").get("allocatable"), "allocatable"))
    raw = annotations.get(ANNOTATION_RAW_ALLOCATABLE)
    if raw is not None:
        doc_raw = load_json(raw, ANNOTATION_RAW_ALLOCATABLE, max_chars=_MAX_RESOURCE_ANNOTATION_CHARS)
        allocatable.update(read_resource_list(doc_raw, ANNOTATION_RAW_ALLOCATABLE))
    custom, error = None, ""
    text = annotations.get(ANNOTATION_CUSTOM_USAGE_THRESHOLDS)
    if text is not None:
        try:
            custom = parse_custom_usage_thresholds(text)
        except FormatError as exc:
            error = str(exc)
    return NodeLoad(
        cpu_milli=_milli(allocatable.get(CPU, Fraction(0))),
        memory_bytes=_whole(allocatable.get(MEMORY, Fraction(0))),
        custom=custom,
        custom_error=error,
    )


def read_node_metric(obj: object) -> NodeMetricView:
    """A NodeMetric object as ``NodeMetricView``; ``FormatError`` when its spec or status is
    malformed or over a bound (``koord_formats.nodemetric``)."""
    doc = read_object(obj, "NodeMetric")
    policy = parse_collect_policy(doc.get("spec"))
    raw_status = doc.get("status")
    status = parse_node_metric_status(raw_status)
    update = status.update_time
    return NodeMetricView(
        update_time=parse_update_time(update) if update else None,
        report_interval=policy.report_interval_seconds,
        status=status,
    )
