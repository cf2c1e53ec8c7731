"""cpu_burst: Koordinator's CPU Burst for LS and label-less pods.

Stages
    ``post_start_container`` and ``pre_update_container_resources`` (container
    ``cpu.cfs_burst_us``, once the container's cgroup exists: containerd creates it at
    StartContainer, not at CreateContainer), ``reconcile_container`` (the same, and 0
    when the policy is off), ``reconcile_pod`` (pod ``cpu.cfs_burst_us`` = sum over
    ``pod.containers``).
Inputs
    NodeSLO ``cpuBurstStrategy`` (``policy`` none | cpuBurstOnly | cfsQuotaBurstOnly | auto,
    ``cpuBurstPercent`` 1000, ``cfsQuotaBurstPercent`` 300, ``cfsQuotaBurstPeriodSeconds`` -1,
    ``sharePoolThresholdPercent`` 50) merged with the pod annotation ``koordinator.sh/cpuBurst``;
    pod label ``koordinator.sh/qosClass`` (LSR, LSE and BE pods are not eligible); the
    container's CPU limit (CRI ``cpu_quota`` / ``cpu_period``) as CPU normalization leaves it
    (``base_quota``: ``hooks.facts.container_cpu_quota``, the quota plugin
    ``cpu_normalization`` gives the runtime), so burst is computed on the normalized quota.
Outputs
    writes ``container``/``cpu.cfs_burst_us`` and ``pod``/``cpu.cfs_burst_us`` (v2:
    ``cpu.max.burst``): limit cores x cpuBurstPercent/100 x 100000, 0 without a limit. Mainline
    kernels refuse a burst above the quota (EINVAL), so the value is capped at the container's
    quota and the cap is recorded as a skip.
cfsQuotaBurst (stage ``reconcile_cpu_burst``, run by the CPU burst loop every second)
    for each eligible container with a quota, from the loop's readings
    (``hooks.usage.BurstRound``: ``cpu.stat``, ``cpuacct.usage``, the quotas, the share pool's
    usage) and the container's state of the last round: ``share_pool_state``,
    ``throttled_ratio``, the token bucket ``BurstLimiter`` (``cfsQuotaBurstPeriodSeconds >= 0``),
    ``decide_operation`` and ``next_quota`` give the new quota within [base, base x
    cfsQuotaBurstPercent/100] (``reset`` to the base when cfsQuotaBurst is off). Writes the
    container's ``cpu.cfs_quota_us`` and moves the pod's by the same delta unless it is
    unlimited; reports a ``hooks.usage.BurstDecision`` per container (its writes and its state
    for the next round).
Leaves alone
    ``cpu.cfs_quota_us`` outside ``reconcile_cpu_burst``, LSR/LSE/BE pods, containers without
    an id.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from dataclasses import dataclass

from hooks.facts import (
    CFS_PERIOD_US,
    ContainerFacts,
    NodeFacts,
    PodFacts,
    container_cgroup_path,
    container_cpu_quota,
    pod_cgroup_path,
    pod_cpu_burst_config,
)
from hooks.plan import CgroupWrite, Plan
from hooks.spec import hookimpl
from hooks.usage import BurstDecision, BurstRound, BurstState, ContainerCPU
from koord_formats import FormatError, keys
from koord_formats.nodeslo import CPUBurstConfig

BURST_FILE = "cpu.cfs_burst_us"
SCALE_UP_RATIO = 1.2
SCALE_DOWN_RATIO = 0.8
COOLING_FACTOR = 0.9
INELIGIBLE = (keys.QOS_LSR, keys.QOS_LSE, keys.QOS_BE)


def is_eligible(pod: PodFacts) -> bool:
    """CPU Burst covers LS and label-less pods (not LSR, LSE, BE)."""
    return pod.qos_label not in INELIGIBLE


def pod_burst_config(pod: PodFacts, node: NodeFacts, plan: Plan | None = None) -> CPUBurstConfig:
    problems: list[str] = []
    cfg = pod_cpu_burst_config(pod, node, problems)
    if plan is not None:
        for p in problems:
            plan.skip(f"pod {pod.namespace}/{pod.name}: {p}")
    return cfg


def base_quota(pod: PodFacts, container: ContainerFacts, node: NodeFacts, stage: str = "running") -> int:
    """The container's CFS quota before any burst: the normalized quota when CPU normalization
    decides it (``hooks.facts.container_cpu_quota``), else the container's own."""
    try:
        return container_cpu_quota(pod, container, node, stage=stage).quota
    except FormatError:
        return container.resources.cpu_quota


def limit_quota(container: ContainerFacts, quota: int | None = None) -> int:
    """The container's CFS quota (``quota`` when given) scaled to the 100 ms base period; 0
    without a limit."""
    q = container.resources.cpu_quota if quota is None else quota
    if q <= 0:
        return 0
    period = container.resources.cpu_period or CFS_PERIOD_US
    return q * CFS_PERIOD_US // period


def container_burst_us(
    container: ContainerFacts, cfg: CPUBurstConfig, quota: int | None = None
) -> tuple[int, int | None]:
    """``(value, uncapped)``: Koordinator's burst for the container (with the quota ``quota``
    when given), capped at that quota; ``uncapped`` is the value before the cap when the cap
    applied."""
    cap = container.resources.cpu_quota if quota is None else quota
    quota = limit_quota(container, cap)
    if quota <= 0 or not cfg.cpu_burst_enabled:
        return 0, None
    value = quota * cfg.cpu_burst_percent // 100
    if value > cap:
        return cap, value
    return value, None


def _container_plan(
    pod: PodFacts, container: ContainerFacts, node: NodeFacts, *, reconcile: bool, stage: str = "running"
) -> Plan:
    plan = Plan()
    if not is_eligible(pod) or not container.id:
        return plan
    cfg = pod_burst_config(pod, node, plan)
    if not cfg.cpu_burst_enabled and not reconcile:
        return plan
    value, uncapped = container_burst_us(container, cfg, base_quota(pod, container, node, stage))
    if uncapped is not None:
        plan.skip(f"{BURST_FILE} {uncapped} capped at the quota {value} (the kernel refuses a burst above the quota)")
    try:
        path = container_cgroup_path(pod, container.id, node.cgroup.driver)
    except ValueError as exc:
        return plan.skip(f"pod {pod.namespace}/{pod.name}: {exc}")
    plan.write("container", path, BURST_FILE, value)
    return plan


@hookimpl
def rhp_post_start_container(pod: PodFacts, container: ContainerFacts, node: NodeFacts) -> Plan | None:
    return _container_plan(pod, container, node, reconcile=False)


@hookimpl
def rhp_pre_update_container_resources(pod: PodFacts, container: ContainerFacts, node: NodeFacts) -> Plan | None:
    return _container_plan(pod, container, node, reconcile=False, stage="update")


@hookimpl
def rhp_reconcile_container(pod: PodFacts, container: ContainerFacts, node: NodeFacts) -> Plan | None:
    return _container_plan(pod, container, node, reconcile=True)


@hookimpl
def rhp_reconcile_pod(pod: PodFacts, node: NodeFacts) -> Plan | None:
    plan = Plan()
    if not is_eligible(pod) or not pod.containers:
        return plan
    cfg = pod_burst_config(pod, node, plan)
    try:
        path = pod_cgroup_path(pod)
    except ValueError as exc:
        return plan.skip(f"pod {pod.namespace}/{pod.name}: {exc}")
    total = sum(container_burst_us(c, cfg, base_quota(pod, c, node))[0] for c in pod.containers)
    plan.write("pod", path, BURST_FILE, total)
    return plan


# ---- cfsQuotaBurst: the reconcile_cpu_burst stage ------------------------------------------------

OVERLOAD, COOLING, IDLE = "overload", "cooling", "idle"
UP, REMAIN, DOWN, RESET = "up", "remain", "down", "reset"
QUOTA_FILE = "cpu.cfs_quota_us"


def share_pool_state(usage_ratio: float | None, threshold_percent: int) -> str:
    """Node state from the share pool's usage ratio: >= threshold -> overload; between
    0.9 x threshold and threshold, or unknown -> cooling; below -> idle."""
    if usage_ratio is None:
        return COOLING
    threshold = threshold_percent / 100
    if usage_ratio >= threshold:
        return OVERLOAD
    if usage_ratio >= COOLING_FACTOR * threshold:
        return COOLING
    return IDLE


def throttled_ratio(prev: tuple[int, int, float] | None, cur: tuple[int, int, float], max_age: float) -> float | None:
    """Δnr_throttled / Δnr_periods between two ``(nr_periods, nr_throttled, time)`` samples of
    ``cpu.stat``; None (no data) without a previous sample younger than ``max_age``."""
    if prev is None or cur[2] - prev[2] > max_age or cur[2] <= prev[2]:
        return None
    periods = cur[0] - prev[0]
    if periods <= 0:
        return 0.0
    return max(0, cur[1] - prev[1]) / periods


def decide_operation(throttled: float | None, node_state: str, limiter_ok: bool = True) -> str:
    """Koordinator's per-container decision: throttled -> up, else remain; an overloaded pool
    turns up/remain into down, a cooling one turns up into remain; an empty token bucket
    forces down."""
    op = UP if throttled is not None and throttled > 0 else REMAIN
    if node_state == OVERLOAD:
        op = DOWN
    elif node_state == COOLING and op == UP:
        op = REMAIN
    if not limiter_ok:
        op = DOWN
    return op


def quota_ceiling(base: int, cfg: CPUBurstConfig) -> int:
    return base * cfg.cfs_quota_burst_percent // 100


def next_quota(current: int, base: int, ceiling: int, op: str) -> int:
    """Scale up x1.2 or down x0.8, always within [base, ceiling]."""
    if current <= 0:
        current = base
    if op == UP:
        value = int(current * SCALE_UP_RATIO)
    elif op == DOWN:
        value = int(current * SCALE_DOWN_RATIO)
    else:
        value = current
    return max(base, min(ceiling, value))


@dataclass
class BurstLimiter:
    """Token bucket for ``cfsQuotaBurstPeriodSeconds >= 0``: capacity = period x
    (cfsQuotaBurstPercent - 100) (percent-seconds). Running at >= 100% of the limit consumes
    (usage% - 100) per second; below 60% refills (100 - usage%) per second. Tokens <= 0 force
    a scale-down. Initial tokens are random in [0, 0.5) x capacity."""

    capacity: float
    tokens: float
    last: float

    @classmethod
    def new(cls, cfg: CPUBurstConfig, now: float, rng: Callable[[], float] = random.random) -> BurstLimiter:
        capacity = float(cfg.cfs_quota_burst_period_seconds * (cfg.cfs_quota_burst_percent - 100))
        return cls(capacity, rng() * 0.5 * capacity, now)

    def update(self, usage_percent: float, now: float) -> bool:
        """Account ``usage_percent`` (of the limit) since the last update; True while tokens
        remain."""
        elapsed = max(0.0, now - self.last)
        self.last = now
        if usage_percent >= 100:
            self.tokens -= (usage_percent - 100) * elapsed
        elif usage_percent < 60:
            self.tokens += (100 - usage_percent) * elapsed
        self.tokens = max(-self.capacity, min(self.capacity, self.tokens))
        return self.tokens > 0


def _bucket_ok(
    prev: BurstState, sample: ContainerCPU, container: ContainerFacts, base: int, cfg: CPUBurstConfig,
    burst: BurstRound,
) -> tuple[bool, tuple[int, float] | None, tuple[float, float, float] | None]:
    """Whether the token bucket lets the container burst on, with its new usage sample and
    bucket (``cfsQuotaBurstPeriodSeconds < 0``: no bucket, always True)."""
    period_s, now = cfg.cfs_quota_burst_period_seconds, burst.at
    if period_s < 0:
        return True, prev.usage, None
    usage = (sample.usage_ns, now) if sample.usage_ns is not None else prev.usage
    bucket = prev.bucket
    if bucket is None or now - bucket[2] > 2 * max(period_s, burst.interval):
        limiter = BurstLimiter.new(cfg, now, lambda: sample.draw)
    else:
        limiter = BurstLimiter(*bucket)
    if prev.usage is None or sample.usage_ns is None or now <= prev.usage[1]:
        ok = limiter.tokens > 0
    else:
        limit_cores = base / (container.resources.cpu_period or CFS_PERIOD_US)
        usage_percent = (sample.usage_ns - prev.usage[0]) / 1e9 / (now - prev.usage[1]) / limit_cores * 100
        ok = limiter.update(usage_percent, now)
    return ok, usage, (limiter.capacity, limiter.tokens, limiter.last)


def quota_decision(
    pod: PodFacts, container: ContainerFacts, node: NodeFacts, burst: BurstRound, pod_quota: int | None
) -> BurstDecision | None:
    """One container's cfsQuotaBurst decision (None: not eligible, no quota, not read this
    round); ``pod_quota`` is its pod's quota as the decisions before it in this round left it."""
    sample = burst.containers.get(container.id) if container.id else None
    if sample is None or not is_eligible(pod):
        return None
    base = base_quota(pod, container, node)
    if base <= 0:
        return None
    try:
        path = container_cgroup_path(pod, container.id, node.cgroup.driver)
        pod_path = pod_cgroup_path(pod)
    except ValueError:
        return None
    prev = burst.states.get(container.id, BurstState())
    cfg = pod_burst_config(pod, node)
    current = sample.cfs_quota_us
    node_state = share_pool_state(burst.share_pool_ratio, cfg.share_pool_threshold_percent)
    throttled: float | None = None
    # cpuacct.usage is read again only while a token bucket needs it
    state = dataclasses.replace(prev, read_usage=False)
    if not cfg.cfs_quota_burst_enabled:
        op, target = RESET, base
    else:
        cur = (sample.nr_periods, sample.nr_throttled, burst.at)
        throttled = throttled_ratio(prev.throttle, cur, 2 * burst.interval)
        ok, usage, bucket = _bucket_ok(prev, sample, container, base, cfg, burst)
        state = BurstState(cur, usage, bucket, read_usage=bucket is not None)
        op = decide_operation(throttled, node_state, ok)
        target = next_quota(current, base, quota_ceiling(base, cfg), op)
    writes: tuple[CgroupWrite, ...] = ()
    if target != current and not (op == RESET and current == base):
        writes = (CgroupWrite("container", path, QUOTA_FILE, str(target)),)
        if pod_quota is not None and pod_quota > 0:
            writes += (CgroupWrite("pod", pod_path, QUOTA_FILE, str(max(1000, pod_quota + target - current))),)
    return BurstDecision(container.id, current, target, op, throttled, node_state, state, writes)


@hookimpl
def rhp_reconcile_cpu_burst(node: NodeFacts, pods: tuple[PodFacts, ...], burst: BurstRound) -> Plan | None:
    plan = Plan()
    pod_quotas = dict(burst.pod_quotas)
    for pod in pods:
        for container in pod.containers:
            try:
                pod_path = pod_cgroup_path(pod)
            except ValueError:
                break
            decision = quota_decision(pod, container, node, burst, pod_quotas.get(pod_path))
            if decision is None:
                continue
            for w in decision.writes:
                plan.write(w.level, w.path, w.file, w.value)
                if w.level == "pod":
                    pod_quotas[pod_path] = int(w.value)
            plan.report(decision)
    return plan
