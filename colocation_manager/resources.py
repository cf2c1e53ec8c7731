"""Batch and mid resources of one node: Koordinator's formulas as pure functions.

Who calls this: ``colocation_manager.controller`` for every node it reconciles, with the
node, its pods and its NodeMetric already decoded (``colocation_manager.objects``); the
benchmark ``benchmarks/manager_update.py``. Nothing here does I/O or reads a clock: ``now`` is
an argument.

Sources (koordinator-sh/koordinator): ``pkg/slo-controller/noderesource/plugins/batchresource/``
(``plugin.go``, ``util.go``), ``plugins/midresource/plugin.go``, ``plugins/util/util.go``;
the fact sheet ``koordinator-manager.md`` sections 3 and 4. CPU is in milli-cores and memory
in bytes throughout, as integers.

Batch (``batch_resources``), per resource, each result clamped at 0:

- Cap = ``status.capacity``; Margin = Cap x (100 - reclaim%) / 100 (truncated);
- Reserved = max(capacity - allocatable, the node reservation annotation);
- Sys = NodeMetric ``systemUsage`` + usage of host applications of priority prod or mid;
- HP pods = Running or Pending pods whose priority class is neither koord-batch nor
  koord-free. Each adds its request to HPReq; with a metric it adds its usage to HPUsed (an LSE
  pod: its CPU request, its memory usage) and max(request, usage) to HPMaxUsedReq; without a
  metric it adds its request to HPUsed and nothing to HPMaxUsedReq;
- dangling metrics (podsMetric entries of no listed Running/Pending pod) add their usage to
  HPUsed and HPMaxUsedReq unless their priority is koord-batch or koord-free;
- usage policy: Cap - Margin - max(Sys, Reserved) - HPUsed;
  request policy (memory only): Cap - Margin - Reserved - HPReq;
  maxUsageRequest policy: Cap - Margin - max(Sys, Reserved) - HPMaxUsedReq;
  CPU knows only usage and maxUsageRequest;
- ``batch*ThresholdPercent`` caps the result at Cap x pct / 100;
- a CPU normalization ratio above 1 multiplies batch CPU (rounded up).

NUMA zones (``zone_batch_resources``): the same per zone of the node's NodeResourceTopology (see
its docstring); a reset sets them to 0 there.

Reset (the resources are removed from the node, not set to 0): co-location disabled for the
node, no NodeMetric, no ``updateTime``, a metric older than ``degradeTimeMinutes`` or stamped more
than ``koord_formats.nodemetric.CLOCK_SKEW_SECONDS`` in the future, a node that
could not be decoded (``Metrics.problem`` / ``NodeInfo.problem``), or ``pod_problem`` (the
controller passes one only for a pod it could not even estimate: ``objects.pod_view`` estimates
every pod it cannot decode in full, ``PodInfo.estimated``). Succeeded and Failed pods hold
nothing.

Mid (``mid_resources``), same reset rules:

- static mode: min(Cap x midStatic*Reserved%, Cap x mid*Threshold%);
- otherwise: min(max(min(prodReclaimable, Cap - nodeUsage), 0) + Unallocated x
  midUnallocated%, Cap x mid*Threshold%), Unallocated = max(Cap - max(Reserved, systemUsage +
  prod host applications) - requests of Running/Pending pods that are not mid, batch or free, 0);
  a missing prodReclaimable counts 0.

Writing (``needs_write``): when the last write is older than ``updateTimeThresholdSeconds``
(or there is none) any change is written; otherwise only a change above
``resourceDiffThreshold`` of the old value (a resource that appears or disappears counts).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from types import MappingProxyType

from koord_formats import keys
from koord_formats.colocation import (
    CALCULATE_MAX_USAGE_REQUEST,
    CALCULATE_REQUEST,
    MID_RECLAIM_STATIC,
    ColocationStrategy,
)
from koord_formats.nodemetric import is_from_the_future

__all__ = [
    "BATCH_RESOURCES",
    "MID_RESOURCES",
    "Amount",
    "Metrics",
    "NodeInfo",
    "PodInfo",
    "PodUsage",
    "Result",
    "batch_resources",
    "is_degraded",
    "mid_resources",
    "needs_write",
    "zone_batch_resources",
]

BATCH_RESOURCES = (keys.RESOURCE_BATCH_CPU, keys.RESOURCE_BATCH_MEMORY)
MID_RESOURCES = (keys.RESOURCE_MID_CPU, keys.RESOURCE_MID_MEMORY)
_RUNNING_OR_PENDING = frozenset({"Running", "Pending"})
_LOW_PRIORITY = frozenset({keys.PRIORITY_BATCH, keys.PRIORITY_FREE})
_NOT_PROD = frozenset({keys.PRIORITY_MID, keys.PRIORITY_BATCH, keys.PRIORITY_FREE})
_ABOVE_BATCH = frozenset({keys.PRIORITY_PROD, keys.PRIORITY_MID})


@dataclass(frozen=True, slots=True)
class Amount:
    """CPU in milli-cores and memory in bytes."""

    cpu: int = 0
    memory: int = 0

    def __add__(self, other: Amount) -> Amount:
        return Amount(self.cpu + other.cpu, self.memory + other.memory)

    def __sub__(self, other: Amount) -> Amount:
        return Amount(self.cpu - other.cpu, self.memory - other.memory)

    def max(self, other: Amount) -> Amount:
        return Amount(max(self.cpu, other.cpu), max(self.memory, other.memory))

    def clamp(self) -> Amount:
        return Amount(max(self.cpu, 0), max(self.memory, 0))


ZERO = Amount()


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """What the formulas read of a Node."""

    name: str
    capacity: Amount
    allocatable: Amount
    reservation: Amount = ZERO  # node.koordinator.sh/reservation
    cpu_normalization_ratio: Fraction | None = None  # node.koordinator.sh/cpu-normalization-ratio
    problem: str = ""  # why the node's own fields could not be read; "" when they could


@dataclass(frozen=True, slots=True)
class PodInfo:
    """What the formulas read of a Pod bound to the node."""

    namespace: str
    name: str
    phase: str
    priority_class: str  # koord_formats.qos.priority_class of the pod
    qos: str  # Koordinator QoS class of the pod (label, else from the Kubernetes QoS class)
    request: Amount  # Kubernetes' effective pod request (containers, init containers, overhead)
    numa_nodes: tuple[int, ...] = ()  # NUMA nodes of its resource-status; () when it names none
    # why the pod was estimated (``objects.pod_view``) instead of decoded; "" when it was decoded
    estimated: str = ""


@dataclass(frozen=True, slots=True)
class PodUsage:
    """One ``podsMetric`` entry."""

    usage: Amount
    priority_class: str = ""


@dataclass(frozen=True, slots=True)
class Metrics:
    """A node's NodeMetric status, decoded. ``None`` for a node without a NodeMetric."""

    update_time: float | None  # seconds since the epoch; None when the status has none
    node_usage: Amount = ZERO
    system_usage: Amount = ZERO
    pods: Mapping[tuple[str, str], PodUsage] = field(default_factory=lambda: MappingProxyType({}))
    host_apps: tuple[PodUsage, ...] = ()  # usage and priority class of each host application
    prod_reclaimable: Amount | None = None
    problem: str = ""  # why the status could not be read; "" when it could


@dataclass(frozen=True, slots=True)
class Result:
    """Resource name -> value to publish (None: remove it from the node), and why."""

    values: Mapping[str, int | None]
    reason: str


def is_degraded(strategy: ColocationStrategy, metrics: Metrics | None, now: float) -> str:
    """Why the node's resources must be reset, or "" when they can be computed."""
    if not strategy.enable:
        return "co-location is not enabled for the node"
    if metrics is None:
        return "the node has no NodeMetric"
    if metrics.problem:
        return f"its NodeMetric is unreadable: {metrics.problem}"
    if metrics.update_time is None:
        return "its NodeMetric has no updateTime"
    if is_from_the_future(metrics.update_time, now):
        return "its NodeMetric's updateTime is in the future"
    if now > metrics.update_time + strategy.degrade_time_minutes * 60:
        return f"its NodeMetric is older than degradeTimeMinutes={strategy.degrade_time_minutes}"
    return ""


def _percent_of(value: int, percent: int) -> int:
    """``value`` x ``percent`` / 100, truncated toward 0 as Go's int64 conversion does."""
    return int(Fraction(value * percent, 100))


def _reserved(node: NodeInfo) -> Amount:
    return (node.capacity - node.allocatable).clamp().max(node.reservation)


def _host_app_usage(metrics: Metrics, priorities: frozenset[str]) -> Amount:
    total = ZERO
    for app in metrics.host_apps:
        if app.priority_class in priorities:
            total = total + app.usage
    return total


@dataclass(slots=True)
class _HP:
    request: Amount = ZERO
    used: Amount = ZERO
    max_used_request: Amount = ZERO


def _hp_usage(pods: Iterable[PodInfo], metrics: Metrics) -> tuple[list[tuple[PodInfo, Amount | None]], list[Amount]]:
    """The pods that count as HP (running or pending, not of a batch or free priority), each
    with its usage (None without a metric; an LSE pod's CPU is its request), and the usage of
    the HP pods' metrics whose pod is not in the list (dangling)."""
    counted: list[tuple[PodInfo, Amount | None]] = []
    known: set[tuple[str, str]] = set()
    for pod in pods:
        if pod.phase not in _RUNNING_OR_PENDING:
            continue
        key = (pod.namespace, pod.name)
        known.add(key)
        if pod.priority_class in _LOW_PRIORITY:
            continue
        metric = metrics.pods.get(key)
        if metric is None:
            counted.append((pod, None))
        else:
            counted.append((pod, Amount(pod.request.cpu, metric.usage.memory) if pod.qos == keys.QOS_LSE
                            else metric.usage))  # fmt: skip
    dangling = [metric.usage for key, metric in metrics.pods.items()
                if key not in known and metric.priority_class not in _LOW_PRIORITY]  # fmt: skip
    return counted, dangling


def _hp_sums(pods: Iterable[PodInfo], metrics: Metrics) -> _HP:
    hp = _HP()
    counted, dangling = _hp_usage(pods, metrics)
    for pod, used in counted:
        hp.request = hp.request + pod.request
        if used is None:  # no metric: its request is its usage, and it adds nothing to max(used, request)
            hp.used = hp.used + pod.request
            continue
        hp.used = hp.used + used
        hp.max_used_request = hp.max_used_request + pod.request.max(used)
    for usage in dangling:
        hp.used = hp.used + usage
        hp.max_used_request = hp.max_used_request + usage
    return hp


def _by_policy(strategy: ColocationStrategy, cap: Amount, reserved: Amount, system: Amount, hp: _HP) -> tuple[int, int]:
    """(batch CPU, batch memory) of a node or a NUMA zone of capacity ``cap``, by the
    strategy's policies (the module docstring's formulas), each clamped at 0."""
    margin = Amount(
        _percent_of(cap.cpu, 100 - strategy.cpu_reclaim_threshold_percent),
        _percent_of(cap.memory, 100 - strategy.memory_reclaim_threshold_percent),
    )
    base = cap - margin
    by_usage = (base - system.max(reserved) - hp.used).clamp()
    by_request = (base - reserved - hp.request).clamp()
    by_max = (base - system.max(reserved) - hp.max_used_request).clamp()
    cpu = by_max.cpu if strategy.cpu_calculate_policy == CALCULATE_MAX_USAGE_REQUEST else by_usage.cpu
    memory = {
        CALCULATE_REQUEST: by_request.memory,
        CALCULATE_MAX_USAGE_REQUEST: by_max.memory,
    }.get(strategy.memory_calculate_policy, by_usage.memory)
    return cpu, memory


def _normalized(cpu: int, ratio: Fraction | None) -> int:
    return math.ceil(cpu * ratio) if ratio is not None and ratio > 1 else cpu


def _reset(names: tuple[str, ...], reason: str) -> Result:
    return Result(MappingProxyType(dict.fromkeys(names)), reason)


def batch_resources(
    strategy: ColocationStrategy,
    node: NodeInfo,
    pods: Iterable[PodInfo],
    metrics: Metrics | None,
    now: float,
    pod_problem: str = "",
) -> Result:
    """``kubernetes.io/batch-cpu`` (milli-cores) and ``batch-memory`` (bytes) of ``node``, or
    their removal with the reason. ``pod_problem`` names a pod of the node that could not be
    decoded: its usage is unknown, so the node's batch resources are reset."""
    reason = is_degraded(strategy, metrics, now) or node.problem or pod_problem
    if reason or metrics is None:
        return _reset(BATCH_RESOURCES, reason)
    cap = node.capacity
    reserved = _reserved(node)
    system = metrics.system_usage + _host_app_usage(metrics, _ABOVE_BATCH)
    cpu, memory = _by_policy(strategy, cap, reserved, system, _hp_sums(pods, metrics))
    if strategy.batch_cpu_threshold_percent is not None:
        cpu = min(cpu, _percent_of(cap.cpu, strategy.batch_cpu_threshold_percent))
    if strategy.batch_memory_threshold_percent is not None:
        memory = min(memory, _percent_of(cap.memory, strategy.batch_memory_threshold_percent))
    cpu = _normalized(cpu, node.cpu_normalization_ratio)
    return Result(
        MappingProxyType({keys.RESOURCE_BATCH_CPU: cpu, keys.RESOURCE_BATCH_MEMORY: memory}),
        f"cpu by {strategy.cpu_calculate_policy}, memory by {strategy.memory_calculate_policy}",
    )


def mid_resources(
    strategy: ColocationStrategy,
    node: NodeInfo,
    pods: Iterable[PodInfo],
    metrics: Metrics | None,
    now: float,
    pod_problem: str = "",
) -> Result:
    """``kubernetes.io/mid-cpu`` (milli-cores) and ``mid-memory`` (bytes) of ``node``, or
    their removal with the reason."""
    reason = is_degraded(strategy, metrics, now) or node.problem or pod_problem
    if reason or metrics is None:
        return _reset(MID_RESOURCES, reason)
    cap = node.capacity
    limit = Amount(
        _percent_of(cap.cpu, strategy.mid_cpu_threshold_percent),
        _percent_of(cap.memory, strategy.mid_memory_threshold_percent),
    )
    if strategy.mid_reclaim_mode == MID_RECLAIM_STATIC:
        static = Amount(
            _percent_of(cap.cpu, strategy.mid_static_cpu_reserved_percent),
            _percent_of(cap.memory, strategy.mid_static_memory_reserved_percent),
        )
        out = Amount(min(static.cpu, limit.cpu), min(static.memory, limit.memory))
        reason = "static"
    else:
        reclaimable = metrics.prod_reclaimable or ZERO
        unused = cap - metrics.node_usage
        lendable = Amount(min(reclaimable.cpu, unused.cpu), min(reclaimable.memory, unused.memory)).clamp()
        prod_requests = ZERO
        for pod in pods:
            if pod.phase in _RUNNING_OR_PENDING and pod.priority_class not in _NOT_PROD:
                prod_requests = prod_requests + pod.request
        system = metrics.system_usage + _host_app_usage(metrics, frozenset({keys.PRIORITY_PROD}))
        unallocated = (cap - _reserved(node).max(system) - prod_requests).clamp()
        grown = lendable + Amount(
            _percent_of(unallocated.cpu, strategy.mid_unallocated_percent),
            _percent_of(unallocated.memory, strategy.mid_unallocated_percent),
        )
        out = Amount(min(grown.cpu, limit.cpu), min(grown.memory, limit.memory))
        reason = "reclaimable and unallocated"
    out = out.clamp()
    return Result(MappingProxyType({keys.RESOURCE_MID_CPU: out.cpu, keys.RESOURCE_MID_MEMORY: out.memory}), reason)


def _split(amount: Amount, parts: int) -> Amount:
    """``amount`` / ``parts``, each resource rounded up (Koordinator's ``divideResourceList``)."""
    return Amount(-(-amount.cpu // parts), -(-amount.memory // parts))


def _zone_shares(amount: Amount, numa_nodes: tuple[int, ...], zones: int) -> list[Amount]:
    """A pod's amount per zone: split over its resource-status NUMA nodes that exist here, else
    evenly over every zone."""
    mine = sorted({n for n in numa_nodes if 0 <= n < zones})
    if not mine:
        return [_split(amount, zones)] * zones
    share = _split(amount, len(mine))
    return [share if i in mine else ZERO for i in range(zones)]


def zone_batch_resources(
    strategy: ColocationStrategy,
    node: NodeInfo,
    zones: Sequence[Amount],
    pods: Iterable[PodInfo],
    metrics: Metrics | None,
    now: float,
    pod_problem: str = "",
) -> list[dict[str, int]]:
    """Batch CPU and memory of each NUMA zone (``zones``: the allocatable of NUMA node 0, 1, ...
    from the node's NodeResourceTopology), as Koordinator's NUMA-level calculation: per zone
    Cap = the zone's allocatable, system usage and the node's reservation divided evenly over
    the zones (rounded up), each HP pod's request and usage split over the NUMA nodes of its
    resource-status (else evenly), dangling metrics evenly; the node's policies and its CPU
    normalization. Every zone gets 0 where the node is reset (degrade)."""
    n = len(zones)
    if not n:
        return []
    reason = is_degraded(strategy, metrics, now) or node.problem or pod_problem
    if reason or metrics is None:
        return [{keys.RESOURCE_BATCH_CPU: 0, keys.RESOURCE_BATCH_MEMORY: 0} for _ in zones]
    per_zone = [_HP() for _ in zones]
    counted, dangling = _hp_usage(pods, metrics)
    for pod, used in counted:
        requests = _zone_shares(pod.request, pod.numa_nodes, n)
        usages = _zone_shares(pod.request if used is None else used, pod.numa_nodes, n)
        for hp, req, use in zip(per_zone, requests, usages, strict=True):
            hp.request = hp.request + req
            hp.used = hp.used + use
            hp.max_used_request = hp.max_used_request + req.max(use)
    for usage in dangling:
        share = _split(usage, n)
        for hp in per_zone:
            hp.used = hp.used + share
            hp.max_used_request = hp.max_used_request + share
    reserved = _split(_reserved(node), n)
    system = _split(metrics.system_usage + _host_app_usage(metrics, _ABOVE_BATCH), n)
    out = []
    for cap, hp in zip(zones, per_zone, strict=True):
        cpu, memory = _by_policy(strategy, cap, reserved, system, hp)
        out.append({keys.RESOURCE_BATCH_CPU: _normalized(cpu, node.cpu_normalization_ratio),
                    keys.RESOURCE_BATCH_MEMORY: memory})
    return out


def needs_write(
    old: Mapping[str, int | None],
    new: Mapping[str, int | None],
    strategy: ColocationStrategy,
    last_write: float | None,
    now: float,
) -> bool:
    """True when ``new`` should be written over ``old`` (the node's current values; None for
    absent): any change once the last write is older than ``updateTimeThresholdSeconds``,
    otherwise a change above ``resourceDiffThreshold`` or a resource that appears or goes."""
    changed = [name for name, value in new.items() if old.get(name) != value]
    if not changed:
        return False
    if last_write is None or now - last_write >= strategy.update_time_threshold_seconds:
        return True
    for name in changed:
        before, after = old.get(name), new[name]
        if before is None or after is None:
            return True
        if abs(after - before) > before * strategy.resource_diff_threshold:
            return True
    return False
