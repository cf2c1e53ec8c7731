"""cpu_evict: evict BE pods when BE CPU satisfaction stays too low (Koordinator's BECPUEvict).

Stage
    ``reconcile_usage`` (the usage loop, every sampling round).
Inputs
    NodeSLO ``resourceUsedThresholdWithBE`` (``koord_formats.nodeslo.eviction``): ``enable``,
    ``cpuEvictBESatisfactionLowerPercent`` and ``UpperPercent`` (no defaults: off until both are
    set and valid), ``cpuEvictBEUsageThresholdPercent`` (default 90),
    ``cpuEvictTimeWindowSeconds`` (default one sampling interval), ``cpuEvictPolicy`` (only
    ``evictByRealLimit``: the node's allocatable batch-cpu that ``evictByAllocatable`` divides
    by is not known to the proxy, so that policy is recorded as a skip and nothing is evicted).
    The usage window: per sample the BE kube-QoS cgroup's CPU usage (``be_cpu_milli``), quota,
    period and cpuset (``be``), and each pod's CPU usage. The pods: BE by the raw label
    ``koordinator.sh/qosClass: BE``, their batch-cpu requests from
    ``node.koordinator.sh/extended-resource-spec``, ``koordinator.sh/eviction-policy``,
    ``pod.priority`` (None counts as 0). ``usage.recent_evictions``: pods evicted in the last
    two minutes are left out, and nothing is evicted within ``COOL_DOWN_SECONDS`` of this
    feature's last eviction nor of the window's first sample (koordlet's
    ``cpu-evict-cool-time``, which also runs from its start).
Decision
    realLimit = min(#BE cpuset CPUs x 1000, quota x 1000 / period when quota != -1) (the node's
    CPU count when the BE cpuset is unknown); request = sum of the BE pods' batch-cpu requests;
    satisfaction = realLimit / request. The window (``max(interval, cpuEvictTimeWindowSeconds)``)
    is valid when samples x interval >= window / 3. With satisfaction <= lower% and BE usage /
    realLimit >= the usage threshold (always true when realLimit < 1000m), release = request x
    (upper% - satisfaction), computed on the window's average and on the latest sample; the
    smaller is released. Victims: priority ascending, then CPU usage / request descending, each
    freeing its batch-cpu request; pods without a batch-cpu request free nothing and are not
    evicted. A pod whose eviction was refused for now (``usage.refused_uids``) is planned again
    but frees nothing, so the next victim is taken too.
Outputs
    ``Plan.evict(uid, namespace, name, "BECPUEvict", reason)`` per victim, in eviction order.
Leaves alone
    every pod that is not labelled BE; pods whose eviction-policy does not list BECPUEvict or
    whose annotations are malformed (recorded as skips).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fractions import Fraction

from hooks.facts import NodeFacts, PodFacts
from hooks.plan import Plan
from hooks.spec import hookimpl
from hooks.usage import Usage, UsageSample
from koord_formats import FormatError, keys
from koord_formats.pod import eviction_allowed, parse_extended_resource_spec

__all__ = [
    "COOL_DOWN_SECONDS",
    "FEATURE",
    "BEPoint",
    "Candidate",
    "batch_cpu_request",
    "be_point",
    "milli_to_release",
    "order_victims",
    "rhp_reconcile_usage",
    "window_valid",
]

FEATURE = keys.FEATURE_BE_CPU_EVICT
COOL_DOWN_SECONDS = 20.0


@dataclass(frozen=True)
class BEPoint:
    """The BE share at one moment (or averaged over the window), in millicores."""

    real_limit: Fraction
    used: Fraction


@dataclass(frozen=True)
class Candidate:
    """A BE pod that may be evicted: its batch-cpu request and CPU usage (millicores)."""

    pod: PodFacts
    request: int
    used: int


def batch_cpu_request(pod: PodFacts) -> int:
    """The pod's batch-cpu request in millicores: the sum over the containers of
    ``node.koordinator.sh/extended-resource-spec`` (0 without it; ``FormatError`` when it is
    malformed)."""
    raw = pod.annotations.get(keys.ANNOTATION_EXTENDED_RESOURCE_SPEC)
    if not raw:
        return 0
    zero = Fraction(0)
    specs = parse_extended_resource_spec(raw).values()
    total = sum((max(spec.requests.get(keys.RESOURCE_BATCH_CPU, zero), zero) for spec in specs), zero)
    return max(math.ceil(total), 0)


def be_point(sample: UsageSample, node_cpus: int) -> BEPoint | None:
    """realLimit and usage of the BE share in one sample; ``None`` when neither the BE cpuset
    nor the node's CPU count is known."""
    cpus = len(sample.be.cpuset) or node_cpus
    if cpus <= 0:
        return None
    limit = Fraction(cpus * 1000)
    quota, period = sample.be.cfs_quota_us, sample.be.cfs_period_us
    if quota != -1 and quota >= 0 and period > 0:
        limit = min(limit, Fraction(quota * 1000, period))
    return BEPoint(limit, Fraction(max(sample.be_cpu_milli, 0)))


def window_valid(samples: int, interval: float, window: float) -> bool:
    """Koordinator's check that the window holds enough samples: samples x interval >= window / 3."""
    return samples > 0 and samples * interval >= window / 3


def milli_to_release(point: BEPoint, request: int, lower: int, upper: int, usage_threshold: int) -> int:
    """Millicores of batch-cpu request to release for one point: 0 unless the satisfaction
    (realLimit / request) is at most ``lower``% and the BE share is busy (usage / realLimit at
    least ``usage_threshold``%, or realLimit below one CPU); else request x (upper% -
    satisfaction), rounded down."""
    if request <= 0:
        return 0
    satisfaction = point.real_limit / request
    if satisfaction > Fraction(lower, 100):
        return 0
    busy = point.real_limit < 1000 or point.used >= point.real_limit * Fraction(usage_threshold, 100)
    if not busy:
        return 0
    return max(math.floor(request * (Fraction(upper, 100) - satisfaction)), 0)


def order_victims(candidates: Iterable[Candidate]) -> list[Candidate]:
    """Priority ascending (None as 0), then CPU usage / request descending."""
    return sorted(candidates, key=lambda c: (c.pod.priority or 0, -Fraction(c.used, max(c.request, 1))))


def _average(points: Sequence[BEPoint]) -> BEPoint:
    n = len(points)
    return BEPoint(sum((p.real_limit for p in points), Fraction(0)) / n, sum((p.used for p in points), Fraction(0)) / n)


def _node_cpus(node: NodeFacts) -> int:
    topo = node.cpu_topology
    return len(topo.cpus) if topo is not None else 0


@hookimpl
def rhp_reconcile_usage(node: NodeFacts, pods: tuple[PodFacts, ...], usage: Usage) -> Plan | None:
    """Plan the evictions that bring BE CPU satisfaction back to the upper percentage."""
    problems: list[str] = []
    cfg = node.rules.eviction.read(problems)
    latest = usage.latest
    lower, upper = cfg.cpu_evict_be_satisfaction_lower_percent, cfg.cpu_evict_be_satisfaction_upper_percent
    if not cfg.enable or latest is None or lower is None or upper is None:
        return None
    if cfg.cpu_evict_policy != keys.CPU_EVICT_POLICY_REAL_LIMIT:
        return Plan().skip(f"{FEATURE}: {keys.SLO.CPU_EVICT_POLICY} {cfg.cpu_evict_policy} needs the node's "
                           "allocatable batch-cpu, which the proxy does not know; nothing evicted")
    last = usage.last_eviction(FEATURE)
    started = usage.samples[0].at
    if latest.at - started < COOL_DOWN_SECONDS or (last is not None and latest.at - last < COOL_DOWN_SECONDS):
        return None
    plan = Plan()
    for problem in problems:
        plan.skip(problem)
    gone = usage.evicted_uids
    candidates: list[Candidate] = []
    request = 0
    for pod in pods:
        if pod.qos_label != keys.QOS_BE:
            continue
        try:
            pod_request = batch_cpu_request(pod)
            allowed = eviction_allowed(pod.annotations, FEATURE)
        except FormatError as exc:
            plan.skip(f"pod {pod.namespace}/{pod.name}: not evicted by {FEATURE}: {exc}")
            continue
        if pod.uid in gone:
            continue
        request += pod_request
        if allowed and pod_request > 0 and pod.uid:
            used = latest.pods.get(pod.uid)
            candidates.append(Candidate(pod, pod_request, max(used.cpu_milli, 0) if used is not None else 0))
    if request <= 0:
        return plan if plan.skipped else None
    interval = usage.interval if usage.interval > 0 else 1.0
    window = max(interval, float(cfg.cpu_evict_time_window_seconds or 0))
    samples = [s for s in usage.samples if s.at > latest.at - window]
    node_cpus = _node_cpus(node)
    points = [p for s in samples if (p := be_point(s, node_cpus)) is not None]
    if not window_valid(len(points), interval, window):
        plan.skip(f"{FEATURE}: {len(points)} samples do not cover a third of the {window:g} s window")
        return plan
    last_point = be_point(latest, node_cpus)
    if last_point is None:
        return plan if plan.skipped else None
    threshold = cfg.cpu_evict_be_usage_threshold_percent
    release = min(
        milli_to_release(_average(points), request, lower, upper, threshold),
        milli_to_release(last_point, request, lower, upper, threshold),
    )
    if release <= 0:
        return plan if plan.skipped else None
    satisfaction = float(last_point.real_limit / request)
    freed = 0
    for c in order_victims(candidates):
        if freed >= release:
            break
        plan.evict(
            c.pod.uid,
            c.pod.namespace,
            c.pod.name,
            FEATURE,
            f"BE CPU satisfaction {satisfaction:.2f} <= {lower}%, releasing {release}m of batch-cpu request "
            f"to reach {upper}%; the pod requests {c.request}m",
        )
        if c.pod.uid not in usage.refused_uids:
            freed += c.request
    return plan
