"""cpu_suppress: Koordinator's BE CPU suppress, the BE share shrinking as LS and system load grow.

Stage
    ``reconcile_usage`` (run by the usage loop, ``runtime_proxy/loops/qos.py``, after each
    sampling round; the loop runs whenever this plugin is enabled). Everything here is a pure function of
    the facts and the sampled window.
Inputs
    NodeSLO ``resourceUsedThresholdWithBE``: ``enable`` (false), ``cpuSuppressThresholdPercent``
    (65), ``cpuSuppressMinPercent`` (none), ``cpuSuppressPolicy`` (cpuset | cfsQuota); node
    annotations ``node.koordinator.sh/reservation`` (``reservedCPUs`` or ``resources.cpu``),
    ``node.koordinator.sh/system-qos-resource`` (exclusive CPUs),
    ``kubelet.koordinator.sh/cpu-manager-policy`` (``policy``, ``reservedCPUs``); NodeSLO
    ``hostApplications``; pod label ``koordinator.sh/qosClass`` (raw) and the kube QoS of the
    cgroup parent; pod annotation ``scheduling.koordinator.sh/resource-status`` (cpusets of LSE
    and LSR pods); ``node.cpu_topology``; the newest sample of ``usage`` (node, pod and host-app
    CPU, the BE kube-QoS dir's quota and cpuset).
Amount (``suppress_amount``)
    capacity x threshold/100 - sum(non-BE pod usage) - sum(non-BE host-app usage) - systemUsed,
    systemUsed = max(node usage - sum(all pod usage) - sum(all host-app usage), 0, reserved),
    reserved = max(kubelet reserved CPUs, the node reservation); floored at capacity x
    min/100 when ``cpuSuppressMinPercent`` is set. Capacity is the node's logical CPUs.
Outputs (writes, in the order they must happen)
    cfsQuota: ``kubeqos``/``kubepods/besteffort`` ``cpu.cfs_quota_us`` =
    max(suppress x 100, 2000), with Koordinator's steps (``next_cfs_quota``), and every BE dir
    back on the full BE pool. cpuset: ``cpuset.cpus`` of the BE kube-QoS dir, BE pods, their
    sandboxes and containers = ``choose_be_cpus`` (``be_cpuset_size`` CPUs), quota back to -1.
    Disabled or no NodeSLO: the full BE pool on every BE dir and quota -1.
Write order (``cpuset_writes``)
    kubelet ``none``: every BE dir gets union(current, target) top-down, then its target
    bottom-up, so no child ever holds a CPU its parent lacks. kubelet ``static``: the kube-QoS
    and pod dirs keep the full BE pool and only containers and sandboxes get the suppressed set,
    so kubelet's own container cpuset writes and new BE containers still fit in their pod.
Decision record
    ``decide`` returns a ``hooks.usage.SuppressDecision`` (policy, amount, target quota or
    cpuset, why a round wrote less) next to the plan; the hook reports it in the plan's
    ``records`` and the usage loop turns its ``target_cores`` into the metric
    ``rhp_cpu_suppress_target_cores``.
Leaves alone
    everything when the topology or the usage sample is missing or a node annotation the
    decision needs is malformed (recorded as a skip; the next round tries again). On cgroup v1
    the kernel refuses a BE kube-QoS quota below a BE pod's own quota; ``batch_resource`` sets
    BE quotas to -1 while the cfsQuota policy is on, so the next round succeeds.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction

from hooks.facts import (
    CFS_PERIOD_US,
    CgroupInfo,
    CPUInfo,
    NodeFacts,
    PodFacts,
    all_share_pool_cpus,
    compute_share_pools,
    container_cgroup_path,
    format_cpu_list,
    kube_qos_cgroup_path,
    kubelet_cpu_manager_policy,
    pod_cgroup_path,
    pod_resource_status,
    with_bound_pods,
)
from hooks.plan import Plan
from hooks.spec import hookimpl
from hooks.usage import SuppressAmount, SuppressDecision, Usage, UsageSample
from koord_formats import FormatError, keys, nodeslo
from koord_formats import node as node_formats

__all__ = [
    "BE_MAX_INCREASE_RATIO",
    "BE_MIN_CPUSET_CPUS",
    "BE_MIN_QUOTA",
    "DISABLED",
    "QUOTA_BYPASS_RATIO",
    "BEDir",
    "SuppressAmount",
    "SuppressDecision",
    "be_cpuset_size",
    "be_dirs",
    "choose_be_cpus",
    "cpuset_writes",
    "decide",
    "next_cfs_quota",
    "pick_cpus",
    "rhp_reconcile_usage",
    "suppress_amount",
]

# Koordinator's constants (pkg/koordlet/qosmanager/plugins/cpusuppress/cpu_suppress.go).
BE_MIN_CPUSET_CPUS = 2
BE_MIN_QUOTA = 2000
BE_MAX_INCREASE_RATIO = 0.1  # growth per round: 10% of the node
QUOTA_BYPASS_RATIO = 0.01  # quota changes below 1% of the node are not written
UNLIMITED = -1
DISABLED = "disabled"
CPUSET_FILE = "cpuset.cpus"
QUOTA_FILE = "cpu.cfs_quota_us"
_BE_KUBE_QOS = "BestEffort"


@dataclass(frozen=True, slots=True)
class BEDir:
    """One cgroup directory of the BE tree: its plan level, path and depth (0 kube-QoS,
    1 pod, 2 container or sandbox)."""

    level: str
    path: str
    depth: int


@dataclass
class _Facts:
    """What a round reads from the node annotations, once."""

    reservation: node_formats.NodeReservation = field(default_factory=node_formats.NodeReservation)
    kubelet: node_formats.KubeletCPUManagerPolicy = field(default_factory=node_formats.KubeletCPUManagerPolicy)


def _node_facts(node_facts: NodeFacts) -> _Facts:
    """The reservation and kubelet policy annotations; ``FormatError`` when one is malformed."""
    out = _Facts()
    raw = node_facts.annotations.get(keys.NODE_ANNOTATION_RESERVATION)
    if raw:
        out.reservation = node_formats.parse_node_reservation(raw)
    raw = node_facts.annotations.get(keys.NODE_ANNOTATION_KUBELET_CPU_MANAGER_POLICY)
    if raw:
        out.kubelet = node_formats.parse_kubelet_cpu_manager_policy(raw)
    return out


def _reserved_milli(facts: _Facts) -> int:
    """max(kubelet's reserved CPUs, the node reservation); the reservation counts its
    ``reservedCPUs`` when given, else its ``resources.cpu``."""
    res = facts.reservation
    if res.reserved_cpus:
        anno = len(res.reserved_cpus) * 1000
    else:
        cpu = res.resources.get("cpu", Fraction(0))
        anno = max(0, math.floor(cpu * 1000))
    return max(len(facts.kubelet.reserved_cpus) * 1000, anno)


def _is_non_be(pod: PodFacts) -> bool:
    return pod.qos_label != keys.QOS_BE and pod.effective_kube_qos != _BE_KUBE_QOS


def _is_non_be_host_app(app: nodeslo.HostApplication) -> bool:
    # A host application is BE only with QoS BE and a cgroup under the kube BestEffort dir.
    return not (
        app.qos == keys.QOS_BE
        and app.cgroup_path is not None
        and app.cgroup_path.base == keys.HOST_APP_BASE_KUBEPODS_BESTEFFORT
    )


def suppress_amount(
    *,
    capacity_milli: int,
    threshold_percent: int,
    min_percent: int | None,
    sample: UsageSample,
    pods: Mapping[str, PodFacts],
    host_apps: Sequence[nodeslo.HostApplication],
    reserved_milli: int,
) -> SuppressAmount:
    """Koordinator's BE share (see module docstring). A pod with usage but unknown to ``pods``
    counts as non-BE; a host application without usage counts nowhere."""
    all_pods = non_be_pods = 0
    for uid, used in sample.pods.items():
        all_pods += used.cpu_milli
        known = pods.get(uid)
        if known is None or _is_non_be(known):
            non_be_pods += used.cpu_milli
    all_apps = non_be_apps = 0
    for app in host_apps:
        app_used = sample.host_apps.get(app.name)
        if app_used is None:
            continue
        all_apps += app_used.cpu_milli
        if _is_non_be_host_app(app):
            non_be_apps += app_used.cpu_milli
    system = max(sample.node_cpu_milli - all_pods - all_apps, 0, reserved_milli)
    threshold = capacity_milli * threshold_percent // 100
    suppress = threshold - non_be_pods - non_be_apps - system
    minimum = None if min_percent is None else capacity_milli * min_percent // 100
    if minimum is not None and suppress < minimum:
        suppress = minimum
    return SuppressAmount(
        capacity=capacity_milli,
        threshold=threshold,
        pods_non_be=non_be_pods,
        host_apps_non_be=non_be_apps,
        system=system,
        reserved=reserved_milli,
        minimum=minimum,
        suppress=suppress,
    )


# ---- cfsQuota -----------------------------------------------------------------------------------


def next_cfs_quota(suppress_milli: int, current_quota: int, cores: int) -> int | None:
    """The BE kube-QoS quota for a suppress amount, or None to leave it as it is.

    target = max(suppress x period / 1000, 2000); skipped when it differs from the current
    quota by less than 1% of the node (``cores`` x period x 0.01), unless it is the 2000
    floor; growth is capped at 10% of the node per round once a quota is set (current != -1);
    a shrink is written at once.
    """
    target = max(suppress_milli * CFS_PERIOD_US // 1000, BE_MIN_QUOTA)
    if abs(target - current_quota) < cores * CFS_PERIOD_US * QUOTA_BYPASS_RATIO and target != BE_MIN_QUOTA:
        return None
    max_increase = int(cores * CFS_PERIOD_US * BE_MAX_INCREASE_RATIO)
    if current_quota != UNLIMITED and target - current_quota > max_increase:
        target = current_quota + max_increase
    return target


# ---- cpuset: how many CPUs, and which ----------------------------------------------------------


def be_cpuset_size(suppress_milli: int, current_size: int, node_cpus: int, pool_size: int) -> int:
    """ceil(suppress / 1000), at least 2, at most ``current_size`` + ceil(10% of the node's
    CPUs); never more than the pool (Koordinator would pick nothing from a pool too small)."""
    want = max(math.ceil(suppress_milli / 1000), BE_MIN_CPUSET_CPUS)
    max_increase = math.ceil(node_cpus * BE_MAX_INCREASE_RATIO)
    if want - current_size > max_increase:
        want = current_size + max_increase
    return min(want, pool_size)


def pick_cpus(count: int, infos: Iterable[CPUInfo]) -> list[int]:
    """Koordinator's BE CPU choice from ``infos``: bucket by (NUMA node, socket), each bucket
    sorted by (core, CPU id), buckets by size descending (then lowest CPU first); visit the
    buckets round-robin taking one pair of hyper-thread siblings per visit while two or more
    CPUs are wanted and some bucket has a pair, then one CPU per visit. Empty when ``infos``
    has fewer than ``count`` CPUs."""
    rows = list(infos)
    if count <= 0 or len(rows) < count:
        return []
    groups: dict[tuple[int, int], list[CPUInfo]] = {}
    for info in rows:
        groups.setdefault((info.node, info.socket), []).append(info)
    buckets = [sorted(g, key=lambda c: (c.core, c.id)) for g in groups.values()]
    buckets.sort(key=lambda b: (-len(b), b[0].id))
    chosen: list[int] = []
    used: set[int] = set()
    need = count
    n = len(buckets)
    i = 0
    progress_mark = -1
    while need > 1:
        if i == 0:
            if progress_mark == need:
                break
            progress_mark = need
        bucket = buckets[i]
        for j in range(len(bucket) - 1):
            if bucket[j].id in used:
                continue
            if bucket[j].core == bucket[j + 1].core:
                chosen += [bucket[j].id, bucket[j + 1].id]
                used.update((bucket[j].id, bucket[j + 1].id))
                need -= 2
                break
        i = (i + 1) % n
    start = i
    progress_mark = -1
    while need > 0:
        if i == start:
            if progress_mark == need:
                break
            progress_mark = need
        for info in buckets[i]:
            if info.id not in used:
                chosen.append(info.id)
                used.add(info.id)
                need -= 1
                break
        i = (i + 1) % n
    return chosen


def choose_be_cpus(count: int, lsr: Iterable[CPUInfo], ls: Iterable[CPUInfo]) -> frozenset[int]:
    """``count`` CPUs for BE: floor(count x |LSR| / (|LSR| + |LS|)) picked from the LSR CPUs,
    the rest from the LS CPUs (``pick_cpus`` on each)."""
    lsr_rows, ls_rows = list(lsr), list(ls)
    total = len(lsr_rows) + len(ls_rows)
    if total == 0 or count <= 0:
        return frozenset()
    from_lsr = count * len(lsr_rows) // total
    out = pick_cpus(from_lsr, lsr_rows) if from_lsr > 0 else []
    if count - from_lsr > 0:
        out += pick_cpus(count - from_lsr, ls_rows)
    return frozenset(out)


# ---- the BE tree and the safe write order ------------------------------------------------------


def be_dirs(pods: Iterable[PodFacts], cgroup: CgroupInfo | str, plan: Plan | None = None) -> list[BEDir]:
    """The BE kube-QoS dir (below the node's kubelet cgroup root, ``cgroup`` as in
    ``kube_qos_cgroup_path``), then the dirs of the pods directly under it, then their sandboxes
    and containers (those with an id). A pod whose cgroup parent is unsafe is left out (and
    recorded in ``plan``)."""
    qos_dir = kube_qos_cgroup_path(_BE_KUBE_QOS, cgroup)
    driver = cgroup if isinstance(cgroup, str) else cgroup.driver
    out = [BEDir("kubeqos", qos_dir, 0)]
    children: list[BEDir] = []
    for p in sorted(pods, key=lambda p: p.uid):
        try:
            path = pod_cgroup_path(p)
        except ValueError as exc:
            if plan is not None and p.effective_kube_qos == _BE_KUBE_QOS:
                plan.skip(f"pod {p.namespace}/{p.name}: {exc}")
            continue
        if path.rsplit("/", 1)[0] != qos_dir:
            continue
        out.append(BEDir("pod", path, 1))
        try:
            if p.sandbox_id:
                children.append(BEDir("sandbox", container_cgroup_path(p, p.sandbox_id, driver), 2))
            for c in p.containers:
                if c.id:
                    children.append(BEDir("container", container_cgroup_path(p, c.id, driver), 2))
        except ValueError as exc:
            if plan is not None:
                plan.skip(f"pod {p.namespace}/{p.name}: {exc}")
    return out + children


def cpuset_writes(
    plan: Plan, dirs: Sequence[BEDir], current: frozenset[int], targets: Mapping[int, frozenset[int]]
) -> Plan:
    """Append the two-pass cpuset writes to ``plan``: each dir, parents first, gets
    union(``current``, its depth's target); then, children first, its target where that
    differs from the union. ``targets`` maps depth to cpuset and must not grow with depth;
    ``current`` is the BE kube-QoS dir's cpuset, a superset of every dir below it."""
    ordered = sorted(dirs, key=lambda d: d.depth)
    # A few distinct values for many dirs: format each once.
    union = {depth: format_cpu_list(current | target) for depth, target in targets.items()}
    final = {depth: format_cpu_list(target) for depth, target in targets.items() if target != current | target}
    for d in ordered:
        plan.write(d.level, d.path, CPUSET_FILE, union[d.depth])
    for d in reversed(ordered):
        if d.depth in final:
            plan.write(d.level, d.path, CPUSET_FILE, final[d.depth])
    return plan


# ---- one round ---------------------------------------------------------------------------------


def _lsr_cpus(node_facts: NodeFacts, pods: Iterable[PodFacts], plan: Plan) -> frozenset[int]:
    """The CPUs bound to LSR pods under the node's trust rules (``hooks.facts.with_bound_pods``:
    a cpuset on another class, off the node or held by an older pod does not count)."""
    pods = list(pods)
    for p in pods:
        try:
            pod_resource_status(p.annotations)
        except FormatError as exc:
            plan.skip(f"pod {p.namespace}/{p.name}: bad resource-status: {exc}")
    bound = with_bound_pods(node_facts, pods)
    out: set[int] = set()
    for uid, cpus in bound.bound_cpusets.items():
        if uid not in bound.lse_pods:
            out |= cpus
    return frozenset(out)


def _restore(plan: Plan, dirs: Sequence[BEDir], current: frozenset[int], pool: frozenset[int]) -> None:
    cpuset_writes(plan, dirs, current, {0: pool, 1: pool, 2: pool})


def decide(node_facts: NodeFacts, pods: Sequence[PodFacts], usage: Usage) -> tuple[SuppressDecision, Plan]:
    """One suppress round: the decision record and the plan (see module docstring)."""
    return _decide(node_facts, pods, usage)


def _decide(node_facts: NodeFacts, pods: Sequence[PodFacts], usage: Usage) -> tuple[SuppressDecision, Plan]:
    plan = Plan()
    problems: list[str] = []
    cfg = node_facts.rules.cpu_suppress.read(problems)
    for problem in problems:
        plan.skip(problem)
    policy = cfg.cpu_suppress_policy if cfg.enable else DISABLED
    topo = node_facts.cpu_topology
    if topo is None or not topo.cpus:
        plan.skip("cpu suppress: the CPU topology is unknown")
        return SuppressDecision(policy, reason="no CPU topology"), plan
    sample = usage.latest
    try:
        facts = _node_facts(node_facts)
        pool = all_share_pool_cpus(compute_share_pools(with_bound_pods(node_facts, pods), be=True))
    except FormatError as exc:
        plan.skip(f"cpu suppress: bad node annotation: {exc}")
        return SuppressDecision(policy, reason="bad node annotation"), plan
    qos_dir = kube_qos_cgroup_path(_BE_KUBE_QOS, node_facts.cgroup)
    dirs = be_dirs(pods, node_facts.cgroup, plan)
    # The BE kube-QoS cpuset bounds every dir below it; when it was not sampled, every CPU does.
    current = sample.be.cpuset if sample is not None and sample.be.cpuset else topo.cpus
    if not pool:
        plan.skip("cpu suppress: the BE pool is empty (every CPU is reserved, system or LSE)")
        return SuppressDecision(policy, reason="empty BE pool"), plan
    if policy == DISABLED:
        plan.write("kubeqos", qos_dir, QUOTA_FILE, UNLIMITED)
        _restore(plan, dirs, current, pool)
        return SuppressDecision(DISABLED, cfs_quota_us=UNLIMITED, cpuset=pool), plan
    if sample is None:
        plan.skip("cpu suppress: no usage sample yet")
        return SuppressDecision(policy, reason="no usage sample"), plan
    by_uid = {p.uid: p for p in pods}
    amount = suppress_amount(
        capacity_milli=len(topo.cpus) * 1000,
        threshold_percent=cfg.cpu_suppress_threshold_percent,
        min_percent=cfg.cpu_suppress_min_percent,
        sample=sample,
        pods=by_uid,
        host_apps=node_facts.rules.host_applications.value,
        reserved_milli=_reserved_milli(facts),
    )
    if policy == keys.CPU_SUPPRESS_POLICY_CFS_QUOTA:
        quota = next_cfs_quota(amount.suppress, sample.be.cfs_quota_us, len(topo.cpus))
        reason = ""
        if quota is None:
            reason = "quota change below 1% of the node"
        else:
            plan.write("kubeqos", qos_dir, QUOTA_FILE, quota)
        _restore(plan, dirs, current, pool)
        return SuppressDecision(policy, amount, quota, pool, reason), plan
    # cpuset policy: the BE kube-QoS cpuset must be known for the growth cap.
    if not sample.be.cpuset:
        plan.skip("cpu suppress: the BE kube-QoS cpuset was not sampled")
        return SuppressDecision(policy, amount, reason="BE cpuset unknown"), plan
    lsr_cpus = _lsr_cpus(node_facts, pods, plan)
    size = be_cpuset_size(amount.suppress, len(sample.be.cpuset), len(topo.cpus), len(pool))
    lsr_rows = [i for i in topo.infos if i.id in pool and i.id in lsr_cpus]
    ls_rows = [i for i in topo.infos if i.id in pool and i.id not in lsr_cpus]
    chosen = choose_be_cpus(size, lsr_rows, ls_rows)
    plan.write("kubeqos", qos_dir, QUOTA_FILE, UNLIMITED)
    if not chosen:
        plan.skip(f"cpu suppress: no {size} CPUs to choose from the BE pool")
        return SuppressDecision(policy, amount, UNLIMITED, reason="no CPUs to choose"), plan
    if kubelet_cpu_manager_policy(node_facts) == "static":
        targets = {0: pool, 1: pool, 2: chosen}
    else:
        targets = {0: chosen, 1: chosen, 2: chosen}
    cpuset_writes(plan, dirs, current, targets)
    return SuppressDecision(policy, amount, UNLIMITED, chosen), plan


@hookimpl
def rhp_reconcile_usage(node: NodeFacts, pods: tuple[PodFacts, ...], usage: Usage) -> Plan | None:
    decision, plan = decide(node, pods, usage)
    return plan.report(decision)
