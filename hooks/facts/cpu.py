"""CPU math on facts: kubelet's CFS conversions (shares and quota from milli-CPUs), CPU
normalization (the node's ratio, the normalized quota, ``container_cpu_quota``: the one place an
LS container's CFS quota is decided) and the pod's CPU burst configuration, which the
``cpu_normalization`` and ``cpu_burst`` plugins and the cfsQuotaBurst loop share. Import the
names from ``hooks.facts``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

from hooks.facts.types import ContainerFacts, NodeFacts, PodFacts
from koord_formats import keys, node, nodeslo
from koord_formats.nodeslo import CPUBurstConfig

# ---- kubelet's cgroup conversions (pkg/kubelet/cm/cgroup_manager_linux.go, CFS helpers) -----

CFS_PERIOD_US = 100000
MIN_SHARES = 2
MAX_SHARES = 262144
MIN_QUOTA_US = 1000


def milli_cpu_to_shares(milli: int) -> int:
    """Koordinator/kubelet: shares = milliCPU x 1024 / 1000, clamped to [2, 262144] (0 -> 2)."""
    if milli <= 0:
        return MIN_SHARES
    return max(MIN_SHARES, min(MAX_SHARES, milli * 1024 // 1000))


def milli_cpu_to_quota(milli: int, period: int = CFS_PERIOD_US) -> int:
    """Koordinator/kubelet: quota = milliCPU x period / 1000; <= 0 -> -1 (unlimited); min 1000."""
    if milli <= 0:
        return -1
    return max(MIN_QUOTA_US, milli * period // 1000)


# ---- the CFS quota of LS containers: CPU normalization, then CPU burst on top ------------------
#
# The one place that decides an LS (or label-less) container's CFS quota. Plugin
# ``cpu_normalization`` gives the runtime ``container_cpu_quota(...).quota``; plugin ``cpu_burst``
# derives ``cpu.cfs_burst_us`` from the same value, and the cfsQuotaBurst loop
# (``runtime_proxy.loops.burst``) scales the quota between that value and its ceiling. So the
# normalized quota is the base of both, and neither undoes the other.


def cpu_normalization_ratio(node_facts: NodeFacts) -> Fraction:
    """The node's ``node.koordinator.sh/cpu-normalization-ratio``; 1 (normalization off) when the
    annotation is missing or empty; ``FormatError`` when it is malformed or outside 1 to 5."""
    raw = node_facts.annotations.get(keys.NODE_ANNOTATION_CPU_NORMALIZATION_RATIO)
    if raw is None or raw == "":
        return Fraction(1)
    return node.parse_cpu_normalization_ratio(raw)


def normalize_cpu_quota(quota: int, ratio: Fraction) -> int:
    """Koordinator's normalized quota: ceil(quota / ratio) when ratio > 1 and quota > 0, else
    ``quota`` unchanged (exact arithmetic: 110000 / 1.1 is 100000, not 100001)."""
    if quota > 0 and ratio > 1:
        return math.ceil(quota / ratio)
    return quota


def cpu_normalization_applies(pod_facts: PodFacts) -> bool:
    """CPU normalization covers LS pods and pods without a valid QoS label. Koordinator leaves
    out such a pod when it has a resource-status cpuset; here neither class may hold one (see
    ``cpuset_claim_refusal``), so its cpuset is ignored and the pod is normalized."""
    return pod_facts.qos_label in (keys.QOS_LS, "")


def pod_cpu_burst_config(
    pod_facts: PodFacts, node_facts: NodeFacts, problems: list[str] | None = None
) -> CPUBurstConfig:
    """The NodeSLO ``cpuBurstStrategy`` merged with the pod's ``koordinator.sh/cpuBurst``;
    malformed parts are left at their defaults and described in ``problems``."""
    found: list[str] = [] if problems is None else problems
    cfg = node_facts.rules.cpu_burst.read(found)
    return nodeslo.cpu_burst_from_pod(cfg, pod_facts.annotations.get(keys.ANNOTATION_POD_CPU_BURST), found)


def _normalized_by_some_ratio(original: int, quota: int) -> bool:
    """Whether ``quota`` is ceil(original / r) for a valid ratio r (1.00 to 5.00, two decimals)."""
    if quota <= 0 or quota > original:
        return False
    # ceil(original x 100 / k) falls as k grows; the smallest k that brings it to quota or
    # below is the only candidate.
    k = max(100, -(-original * 100 // quota))
    return k <= 500 and -(-original * 100 // k) == quota


@dataclass(frozen=True)
class CPUQuota:
    """``container_cpu_quota``'s answer. ``quota`` is the CFS quota the container should have
    (its base before CPU burst); ``original`` is kubelet's quota it was derived from. When
    ``reason`` is set, normalization does not decide this container's quota: ``quota`` is the
    container's quota as it stands and ``original`` is 0."""

    quota: int
    original: int = 0
    reason: str = ""

    @property
    def decided(self) -> bool:
        return not self.reason


def container_cpu_quota(
    pod_facts: PodFacts, container: ContainerFacts, node_facts: NodeFacts, *, stage: str = "running"
) -> CPUQuota:
    """The container's CFS quota with CPU normalization applied.

    ``stage`` says what ``container.resources.cpu_quota`` holds:

    - ``"create"`` (PreCreateContainer): kubelet's quota, the original.
    - ``"update"`` (PreUpdateContainerResources, resources of the request over the stored
      ones): a new kubelet quota unless it is the quota the runtime already holds, that is the
      applied quota of the container's ``runtimeproxy.koordinator.sh/cpu-quota-normalization``
      record or the normalized original at the current ratio.
    - ``"running"`` (reconcile, PostStartContainer, the burst loop): the runtime's quota, which
      must come from the record's original (the applied quota, the original itself, or the
      original normalized by some valid ratio); otherwise the quota changed in a way the
      record does not explain (an update before the proxy restarted) and is left alone.

    A container without the record (created before this plugin ran) is left alone outside
    ``"create"``: its quota may already be normalized. ``FormatError`` when the ratio, the
    record or the pod's resource-status is malformed.
    """
    current = container.resources.cpu_quota
    if not cpu_normalization_applies(pod_facts):
        return CPUQuota(current, reason="not an LS or label-less pod without a cpuset")
    ratio = cpu_normalization_ratio(node_facts)
    if stage == "create":
        if current <= 0:
            return CPUQuota(current, reason="no CFS quota")
        return CPUQuota(normalize_cpu_quota(current, ratio), current)
    raw = container.annotations.get(keys.ANNOTATION_CPU_QUOTA_NORMALIZATION)
    if not raw:
        return CPUQuota(current, reason="no record of the quota kubelet asked for")
    original, applied = node.parse_cpu_quota_record(raw)
    target = normalize_cpu_quota(original, ratio)
    held = current in (applied, target)
    if stage == "update":
        if held:
            return CPUQuota(target, original)
        if current <= 0:
            return CPUQuota(current, reason="no CFS quota")
        return CPUQuota(normalize_cpu_quota(current, ratio), current)
    if held or current == original or _normalized_by_some_ratio(original, current):
        return CPUQuota(target, original)
    return CPUQuota(current, reason=f"quota {current} does not derive from the recorded {original}")
