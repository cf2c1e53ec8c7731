"""Sampled usage: what the node, its pods and its host applications consumed, as frozen data.

The usage-driven decisions (CPU suppress, eviction by memory and by BE CPU satisfaction) are
pure functions over a ``Usage`` window and the node and pod facts; they run at the
``ReconcileUsage`` stage (``hooks.spec.rhp_reconcile_usage``). The sampler that fills these
types from ``/proc`` and the cgroup files lives in the proxy (``runtime_proxy/loops/usage.py``);
``runtime-proxy plan`` takes the same shape as its ``usage`` input.

The CPU burst loop's stage (``hooks.spec.rhp_reconcile_cpu_burst``) takes a ``BurstRound``: what
that loop read from the containers' cgroups this round, and each container's ``BurstState`` as
the plugin reported it the round before.

The records those decisions report beside their plans (``hooks.plan.Record``) live here too, so
the loop that runs a stage reads them without importing a plugin: ``SuppressDecision`` (the usage
loop's ``rhp_cpu_suppress_target_cores``) and ``BurstDecision`` (one container's new CFS quota,
its writes and its state for the next round).

Units: CPU in millicores (1000 = one CPU busy for the whole interval), memory in bytes, times
in seconds. Memory usage of a pod or container excludes page cache (anon + unevictable), as
Koordinator counts it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from hooks.facts import CFS_PERIOD_US
from hooks.plan import CgroupWrite, Record
from koord_formats import keys

__all__ = [
    "EVICTION_MEMORY_SECONDS",
    "MAX_SAMPLES",
    "BEState",
    "BurstDecision",
    "BurstRound",
    "BurstState",
    "ContainerCPU",
    "EvictionRecord",
    "ResourceUsage",
    "SuppressAmount",
    "SuppressDecision",
    "Usage",
    "UsageSample",
]

# The longest window any decision looks at (cpuEvictTimeWindowSeconds is bounded by this, at
# one sample per second).
MAX_SAMPLES = 600
# How long the usage loop remembers a pod it evicted (Koordinator's evictor caches the uid for
# two minutes so a terminating pod is not chosen again).
EVICTION_MEMORY_SECONDS = 120.0


@dataclass(frozen=True, slots=True)
class ResourceUsage:
    """CPU and memory used by one pod, container or host application over one interval."""

    cpu_milli: int = 0
    memory_bytes: int = 0


@dataclass(frozen=True, slots=True)
class BEState:
    """What the BE kube-QoS cgroup (``kubepods/besteffort`` below kubelet's cgroup root) holds now: its CFS quota
    (``-1`` = unlimited) and period, and its cpuset. The suppress decision needs these to apply
    Koordinator's step limits (growth capped per round, shrink at once)."""

    cfs_quota_us: int = -1
    cfs_period_us: int = 100000
    cpuset: frozenset[int] = frozenset()


def _empty() -> Mapping[str, ResourceUsage]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class UsageSample:
    """One sampling round. ``pods`` is keyed by pod uid, ``containers`` by container id,
    ``host_apps`` by the host application's name in NodeSLO ``hostApplications``. The usage
    loop keeps these three maps only in the newest few samples of its window
    (``DETAILED_SAMPLES`` in ``runtime_proxy/loops/usage.py``); older samples carry the node
    and BE readings. ``containers`` is empty while every ``ReconcileUsage`` step is a built-in
    plugin that reads no container usage (``runtime_proxy.loops.qos.POD_LEVEL_PLUGINS``)."""

    at: float
    node_cpu_milli: int = 0
    node_memory_used_bytes: int = 0  # MemTotal - MemAvailable
    node_memory_total_bytes: int = 0
    be_cpu_milli: int = 0  # the BE kube-QoS cgroup's CPU usage
    pods: Mapping[str, ResourceUsage] = field(default_factory=_empty)
    containers: Mapping[str, ResourceUsage] = field(default_factory=_empty)
    host_apps: Mapping[str, ResourceUsage] = field(default_factory=_empty)
    be: BEState = field(default_factory=BEState)


@dataclass(frozen=True, slots=True)
class EvictionRecord:
    """An eviction the usage loop performed (or asked the API server for) at ``at`` (the
    samples' clock): decisions use it for their cool-down and to leave a terminating pod out."""

    uid: str
    feature: str
    at: float


@dataclass(frozen=True, slots=True)
class Usage:
    """A window of samples, oldest first, at most ``MAX_SAMPLES`` long.

    ``interval`` is the seconds between two samples as configured (the sampler's period);
    ``recent_evictions`` the evictions of the last ``EVICTION_MEMORY_SECONDS``, oldest first;
    ``refused_uids`` the pods whose last eviction was refused for now (a PodDisruptionBudget,
    HTTP 429): a decision still plans them, so they are asked for again, but counts nothing
    freed by them and goes on to the next victim, as koordlet does with an eviction that fails."""

    samples: tuple[UsageSample, ...] = ()
    interval: float = 1.0
    recent_evictions: tuple[EvictionRecord, ...] = ()
    refused_uids: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if len(self.samples) > MAX_SAMPLES:
            object.__setattr__(self, "samples", self.samples[-MAX_SAMPLES:])

    @property
    def latest(self) -> UsageSample | None:
        return self.samples[-1] if self.samples else None

    def since(self, at: float) -> tuple[UsageSample, ...]:
        """The samples taken at or after ``at``."""
        return tuple(s for s in self.samples if s.at >= at)

    def last_eviction(self, feature: str) -> float | None:
        """When ``feature`` last evicted a pod (``None``: not within the remembered time)."""
        times = [e.at for e in self.recent_evictions if e.feature == feature]
        return max(times) if times else None

    @property
    def evicted_uids(self) -> frozenset[str]:
        """Pods evicted within the remembered time (they may still be terminating)."""
        return frozenset(e.uid for e in self.recent_evictions)


# ---- records of the ReconcileUsage decisions ----------------------------------------------------


@dataclass(frozen=True, slots=True)
class SuppressAmount:
    """The terms of the CPU suppress formula, in millicores (``hooks.plugins.cpu_suppress``)."""

    capacity: int
    threshold: int  # capacity x cpuSuppressThresholdPercent / 100
    pods_non_be: int
    host_apps_non_be: int
    system: int  # max(node - all pods - all host apps, 0, reserved)
    reserved: int
    minimum: int | None  # capacity x cpuSuppressMinPercent / 100
    suppress: int  # the BE share; may be negative when there is no minimum


@dataclass(frozen=True, slots=True)
class SuppressDecision(Record):
    """What one CPU suppress round decided (reported by ``hooks.plugins.cpu_suppress`` in its
    plan's ``records``): ``policy`` is "cpuset", "cfsQuota" or "disabled"; ``cfs_quota_us`` is
    the BE kube-QoS quota written this round (None: left as it is); ``cpuset`` is the BE cpuset
    target (the full BE pool under cfsQuota or when disabled); ``reason`` says why the round
    wrote less than usual ("" when it wrote everything)."""

    policy: str
    amount: SuppressAmount | None = None
    cfs_quota_us: int | None = None
    cpuset: frozenset[int] = frozenset()
    reason: str = ""

    @property
    def target_cores(self) -> float | None:
        """The BE share this round enforces, in cores, for the suppress-target metric: the
        quota over the period under cfsQuota, the cpuset size under cpuset; None otherwise."""
        if self.policy == keys.CPU_SUPPRESS_POLICY_CFS_QUOTA:
            return None if self.cfs_quota_us is None else self.cfs_quota_us / CFS_PERIOD_US
        if self.policy == keys.CPU_SUPPRESS_POLICY_CPUSET and self.cpuset:
            return float(len(self.cpuset))
        return None


# ---- the ReconcileCpuBurst stage ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ContainerCPU:
    """What the CPU burst loop read from one container's cgroup this round: its CFS quota now
    (``-1``: unlimited), ``nr_periods`` and ``nr_throttled`` of ``cpu.stat``, its CPU time
    (``cpuacct.usage``, ns; None when unreadable or not asked for, see ``BurstState``) and
    ``draw``, a uniform random number in [0, 1) drawn for this container this round (a decision
    that needs chance uses it, so the decision itself stays a pure function)."""

    cfs_quota_us: int
    nr_periods: int = 0
    nr_throttled: int = 0
    usage_ns: int | None = None
    draw: float = 0.0


@dataclass(frozen=True, slots=True)
class BurstState:
    """One container's burst state from one round to the next, as the plugin reported it:
    ``throttle`` the last ``(nr_periods, nr_throttled, at)`` sample, ``usage`` the last
    ``(cpuacct.usage ns, at)``, ``bucket`` the token bucket ``(capacity, tokens, last update)``
    (None: none); ``read_usage``: the loop reads the container's ``cpuacct.usage`` next round
    (it always does for a container without a state)."""

    throttle: tuple[int, int, float] | None = None
    usage: tuple[int, float] | None = None
    bucket: tuple[float, float, float] | None = None
    read_usage: bool = True


def _no_containers() -> Mapping[str, ContainerCPU]:
    return MappingProxyType({})


def _no_quotas() -> Mapping[str, int]:
    return MappingProxyType({})


def _no_states() -> Mapping[str, BurstState]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class BurstRound:
    """One round of the CPU burst loop: when (``at``, the loop's monotonic clock), its interval in
    seconds, the share pool's usage ratio (None: not known yet), what it read per container
    id (``containers``: the running containers with a CFS quota, CRI ``cpu_quota`` above 0,
    of pods that call hooks, whose quota file could be read) and per pod cgroup path
    (``pod_quotas``: the pod's ``cpu.cfs_quota_us``), and the states the plugin reported
    last round, by container id (``states``; a container it decided nothing for has none)."""

    at: float
    interval: float = 1.0
    share_pool_ratio: float | None = None
    containers: Mapping[str, ContainerCPU] = field(default_factory=_no_containers)
    pod_quotas: Mapping[str, int] = field(default_factory=_no_quotas)
    states: Mapping[str, BurstState] = field(default_factory=_no_states)


@dataclass(frozen=True, slots=True)
class BurstDecision(Record):
    """What the ``ReconcileCpuBurst`` stage decided for one container (``container_id``): its
    quota ``old`` and ``new``, the operation (``up``, ``remain``, ``down``, ``reset``), the
    throttled ratio it saw (None: no data), the share pool's state (``overload``, ``cooling``,
    ``idle``), its ``state`` for the next round and ``writes``, the container's (and its pod's)
    quota writes, also in the plan's ``writes``: the loop applies each decision's writes as one
    all-or-nothing group (empty when nothing changes)."""

    container_id: str
    old: int
    new: int
    op: str
    throttled: float | None
    node_state: str
    state: BurstState = field(default_factory=BurstState)
    writes: tuple[CgroupWrite, ...] = ()

    @property
    def key(self) -> str:
        return f"BurstDecision:{self.container_id}"
