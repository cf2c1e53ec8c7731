"""memory_evict: evict BE pods when node memory usage crosses the NodeSLO threshold
(Koordinator's BEMemoryEvict).

Stage
    ``reconcile_usage`` (the usage loop, every sampling round).
Inputs
    NodeSLO ``resourceUsedThresholdWithBE``: ``enable`` (off: nothing happens),
    ``memoryEvictThresholdPercent`` (default 70) and ``memoryEvictLowerPercent`` (default the
    threshold minus 2), read by ``koord_formats.nodeslo.eviction``. The latest usage sample:
    node memory used (MemTotal - MemAvailable) and total, each pod's memory (anon +
    unevictable, no page cache). The pods: BE by the raw label ``koordinator.sh/qosClass: BE``,
    allowed by ``koordinator.sh/eviction-policy`` (a JSON list of features; absent allows every
    feature), ``pod.priority`` (None counts as 0). ``usage.recent_evictions``: pods evicted in
    the last two minutes are left out (they may still be terminating), and nothing is evicted
    within ``COOL_DOWN_SECONDS`` of this feature's last eviction (koordlet's
    ``memory-evict-cool-time``).
Decision
    When ``int(used x 100 / total) >= threshold``, free ``total x (usage% - lower%) / 100``
    bytes: victims in the order priority ascending, memory used descending (pods without usage
    last), name descending, each freeing its memory usage, until the amount is reached. A pod
    whose eviction was refused for now (``usage.refused_uids``: a PodDisruptionBudget) is
    planned again but frees nothing, so the next victim is taken too.
Outputs
    ``Plan.evict(uid, namespace, name, "BEMemoryEvict", reason)`` per victim, in eviction order;
    the usage loop hands them to its evictor (``runtime_proxy/loops/evict.py``).
Leaves alone
    every pod that is not labelled BE, pods whose eviction-policy does not list BEMemoryEvict (a
    malformed annotation allows nothing and is recorded as a skip).
"""

from __future__ import annotations

from collections.abc import Iterable

from hooks.facts import NodeFacts, PodFacts
from hooks.plan import Plan
from hooks.spec import hookimpl
from hooks.usage import Usage
from koord_formats import FormatError, keys
from koord_formats.pod import eviction_allowed

__all__ = ["COOL_DOWN_SECONDS", "FEATURE", "Victim", "memory_to_free", "order_victims", "rhp_reconcile_usage"]

FEATURE = keys.FEATURE_BE_MEMORY_EVICT
COOL_DOWN_SECONDS = 4.0

Victim = tuple[PodFacts, int]  # a pod and the bytes its eviction frees


def memory_to_free(used: int, total: int, threshold: int, lower: int) -> int:
    """Bytes to free: 0 below the threshold, else ``total x (usage% - lower%) / 100`` with the
    usage percentage truncated to an integer, as koordlet computes it."""
    if total <= 0 or used <= 0:
        return 0
    percent = used * 100 // total
    if percent < threshold:
        return 0
    return max(total * (percent - lower) // 100, 0)


def order_victims(candidates: Iterable[Victim]) -> list[Victim]:
    """Koordinator's order: priority ascending (None as 0), memory used descending (pods
    without usage last), name descending."""
    by_name = sorted(candidates, key=lambda v: v[0].name, reverse=True)
    return sorted(by_name, key=lambda v: (v[0].priority or 0, -v[1]))


def _candidates(pods: Iterable[PodFacts], usage: Usage, plan: Plan) -> list[Victim]:
    latest = usage.latest
    assert latest is not None
    gone = usage.evicted_uids
    out: list[Victim] = []
    for pod in pods:
        if pod.qos_label != keys.QOS_BE or not pod.uid or pod.uid in gone:
            continue
        try:
            allowed = eviction_allowed(pod.annotations, FEATURE)
        except FormatError as exc:
            plan.skip(f"pod {pod.namespace}/{pod.name}: bad {keys.ANNOTATION_EVICTION_POLICY}, not evicted: {exc}")
            continue
        if allowed:
            used = latest.pods.get(pod.uid)
            out.append((pod, max(used.memory_bytes, 0) if used is not None else 0))
    return out


@hookimpl
def rhp_reconcile_usage(node: NodeFacts, pods: tuple[PodFacts, ...], usage: Usage) -> Plan | None:
    """Plan the evictions that bring node memory back under the lower percentage."""
    problems: list[str] = []
    cfg = node.rules.eviction.read(problems)
    latest = usage.latest
    if not cfg.enable or latest is None:
        return None
    last = usage.last_eviction(FEATURE)
    if last is not None and latest.at - last < COOL_DOWN_SECONDS:
        return None
    total, used = latest.node_memory_total_bytes, latest.node_memory_used_bytes
    need = memory_to_free(used, total, cfg.memory_evict_threshold_percent, cfg.memory_evict_lower_percent)
    if need <= 0:
        return None
    plan = Plan()
    for problem in problems:
        plan.skip(problem)
    percent = used * 100 // total
    freed = 0
    for pod, pod_used in order_victims(_candidates(pods, usage, plan)):
        if freed >= need:
            break
        plan.evict(
            pod.uid,
            pod.namespace,
            pod.name,
            FEATURE,
            f"node memory usage {percent}% >= threshold {cfg.memory_evict_threshold_percent}%, "
            f"releasing {need} bytes to reach {cfg.memory_evict_lower_percent}%; the pod uses {pod_used} bytes",
        )
        if pod.uid not in usage.refused_uids:
            freed += pod_used
    if freed < need:
        plan.skip(f"{FEATURE}: BE pods free {freed} of the {need} bytes needed")
    return plan
