"""Filter, prioritize, preempt and bind decisions; bind is the one place that writes.

Who calls this: ``scheduler_ext.server`` (HTTP verbs) and ``scheduler_ext.cli simulate``. The
decision functions (``evaluate``, ``plan``, ``filter_nodes``, ``prioritize_nodes``,
``preempt_nodes``) read ``scheduler_ext.state`` and return values. ``Binder.bind`` is the
imperative shell: hold the allocation, commit it to the HA ledger, remove any scheduler-owned
annotation the pending pod carries (``scheduler_ext.trust.OWNED``, forged or stale), and create
the Binding carrying the new ones and their seal under the pod's resourceVersion (kube-apiserver
sets them with ``spec.nodeName`` in one write); roll back the hold and the ledger on failure.
It is a coroutine on the server's event loop: its API calls await, so the next pod's filter
runs while a bind waits for the API server, and the cluster lock is only held around the
(synchronous) planning, never across an await.

What a pod needs on a node follows koord-scheduler's NodeNUMAResource plugin
(``scheduler_ext.admission``: PreFilter/Filter rules with Koordinator's status and reason;
``scheduler_ext.numa``: NUMA zones, hints, merge and even split; ``scheduler_ext.accumulator``:
the CPU choice), plus GPUs when it requests any GPU resource (``scheduler_ext.allocator``).
Reservations on a node (``scheduler_ext.reservations``) are matched per pod: ``_restore``
builds the views of the node they give back, bind allocates from the nominated one
(``_nominate``) and records it in ``reservation-allocated``.

Filter and prioritize only count the CPUs each rule may take (``admission.place`` without
``exact``; ``_facts`` keeps one admission view per node version) and memoise the verdict per
pod kind and node in one dictionary (``ClusterState.memo``, emptied for a node by each of its
changes), so 500 candidates cost 500 lookups in one table when nothing changed. Bind chooses
the exact CPUs with the accumulator and ``allocator.take_gpus`` under the cluster lock, so two
binds on one node never receive the same CPU.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import itertools
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import structlog
from prometheus_client import Counter

from koord_formats import keys
from koord_formats.pod import format_resource_status
from koord_formats.quantity import format_bytes, format_milli_cpu, parse_bytes, parse_cpu_milli
from koord_formats.reservation import format_reservation_allocated
from scheduler_ext import numa
from scheduler_ext.accumulator import ExclusiveUse
from scheduler_ext.admission import (
    ERR_INVALID_REQUESTED_CPUS,
    ERR_NO_NOMINATED_RESERVATION,
    ERR_RESERVATION_AFFINITY,
    UNSCHEDULABLE,
    Intent,
    NodeFacts,
    Placed,
    Refusal,
    Restore,
    bind_policy_of,
    merge_numa_policy,
    node_cpu_bind_policy,
    node_numa_policy,
    place,
    pre_filter,
    restored,
)
from scheduler_ext.admission import PLAIN as PLAIN_PLACED
from scheduler_ext.allocator import (
    AllocationError,
    GPUGrant,
    GPUUsage,
    gpu_fits,
    gpu_hints,
    take_gpus,
)
from scheduler_ext.annotations import Allocation, gpu_device_allocated
from scheduler_ext.errors import APIError, ConflictError
from scheduler_ext.guard import decode_pod
from scheduler_ext.pods import GPURequest, PodRequest
from scheduler_ext.reservations import NodeReservation, pod_may_use
from scheduler_ext.state import ClusterState, NodeState
from scheduler_ext.trust import OWNED, SEAL_ANNOTATION

__all__ = [
    "DEFAULT_CONFIG",
    "BindAPI",
    "Binder",
    "ExtenderConfig",
    "Needs",
    "Placement",
    "Verdict",
    "evaluate",
    "filter_nodes",
    "needs",
    "plan",
    "preempt_nodes",
    "prioritize_nodes",
]

log = structlog.get_logger("scheduler_ext.extender")

BIND_CONFLICTS = Counter(
    "scheduler_ext_bind_conflicts_total",
    "Optimistic-concurrency conflicts met while binding, by step.",
    ["step"],
)
BIND_ROLLBACKS = Counter("scheduler_ext_bind_rollbacks_total", "Binds rolled back after a failure.")

MAX_SCORE = 10
STRATEGIES = (keys.LEAST_ALLOCATED, keys.MOST_ALLOCATED)
# NUMA policies under which GPUs must share the CPUs' NUMA affinity
_STRICT_NUMA = (keys.NUMA_POLICY_RESTRICTED, keys.NUMA_POLICY_SINGLE_NUMA_NODE)


@dataclass(frozen=True, slots=True)
class ExtenderConfig:
    """Cluster-wide scoring choices (flags of ``scheduler-ext serve``)."""

    score_strategy: str = keys.LEAST_ALLOCATED  # node CPU score
    gpu_strategy: str = keys.LEAST_ALLOCATED  # node GPU score and the GPU order inside a node


@dataclass(frozen=True, slots=True)
class Needs:
    """What a pod needs from one node."""

    cpuset: bool
    bind_policy: str
    required: bool
    numa_policy: str  # "" when no alignment is asked for
    gpu: GPURequest | None

    @property
    def anything(self) -> bool:
        return self.cpuset or self.gpu is not None or bool(self.numa_policy)


@dataclass(frozen=True, slots=True)
class Verdict:
    """A node's answer for a pod."""

    ok: bool
    unresolvable: bool = False
    reason: str = ""
    score: int = 0


@dataclass(frozen=True, slots=True)
class Placement:
    """The exact allocation on one node and the annotations a bind writes for it."""

    allocation: Allocation
    annotations: Mapping[str, str]
    affinity: frozenset[int] | None


DEFAULT_CONFIG = ExtenderConfig()
PLAIN = Verdict(True)
_IDLE = GPUUsage()
_NO_EXCLUSIVE = ExclusiveUse()
# node name -> (NodeState.version, the NodeState, its admission view)
_FACTS: dict[str, tuple[int, NodeState, NodeFacts]] = {}
# node name -> (NodeState.static_version, the NodeState, its NUMA zones): zones change only with
# the Node and NRT objects, not with the pods placed on the node
_ZONES: dict[str, tuple[int, NodeState, numa.Zones]] = {}


def needs(ns: NodeState, pod: PodRequest) -> Needs | str:
    """What ``pod`` needs on ``ns`` by Koordinator's rules, or the reason the node can never
    take it (``scheduler_ext.admission`` rules 1 to 8, without choosing CPUs)."""
    intent = pre_filter(pod)
    if isinstance(intent, Refusal):
        return intent.reason
    if intent.skip:
        return Needs(False, "", False, "", pod.gpu)
    policy = merge_numa_policy(node_numa_policy(ns.node_labels, ns.nrt_policies), intent.numa_policy)
    if isinstance(policy, Refusal):
        return policy.reason
    node_bind = node_cpu_bind_policy(ns.node_labels, ns.nrt_annotations)
    cpuset = intent.request_cpu_bind or (intent.cpu_milli > 0 and bool(node_bind))
    if cpuset and intent.cpu_milli % 1000:
        return ERR_INVALID_REQUESTED_CPUS
    bind_policy, required = bind_policy_of(intent, node_bind) if cpuset else ("", False)
    return Needs(cpuset, bind_policy, required, policy, pod.gpu)


def _facts(ns: NodeState) -> NodeFacts:
    """The admission view of ``ns`` (caller refreshed it), rebuilt only when the node changed."""
    cached = _FACTS.get(ns.name)
    if cached is not None and cached[0] == ns.version and cached[1] is ns:
        return cached[2]
    topo = ns.topo
    cached_zones = _ZONES.get(ns.name)
    if cached_zones is not None and cached_zones[0] == ns.static_version and cached_zones[1] is ns:
        zones = cached_zones[2]
    else:
        zones = _zones(ns)
        if len(_ZONES) > 65536:
            _ZONES.clear()
        _ZONES[ns.name] = (ns.static_version, ns, zones)
    booked: dict[int, dict[str, int]] = {}
    pinned: dict[int, int] = {}
    cpusets: list[frozenset[int]] = []
    for nr in ns.reserved:  # an active reservation books its cpuset and NUMA amounts like a pod
        if not nr.r.active:
            continue
        if nr.cpus:
            cpusets.append(nr.cpus)
        for n, amounts in nr.numa.items():
            entry = booked.setdefault(n, {})
            for r, v in amounts.items():
                entry[r] = entry.get(r, 0) + v
        if nr.numa and nr.cpus and topo is not None:
            for c in nr.cpus:
                info = topo.details.get(c)
                if info is not None:
                    pinned[info.node] = pinned.get(info.node, 0) + 1
    for alloc in ns.allocs.values():
        if alloc.cpus:
            cpusets.append(alloc.cpus)
        for n, milli in alloc.numa.items():
            entry = booked.setdefault(n, {})
            entry[numa.CPU] = entry.get(numa.CPU, 0) + milli
        for n, amount in alloc.numa_memory.items():
            entry = booked.setdefault(n, {})
            entry[numa.MEMORY] = entry.get(numa.MEMORY, 0) + amount
        if alloc.numa and alloc.cpus and topo is not None:
            for c in alloc.cpus:
                info = topo.details.get(c)
                if info is not None:
                    pinned[info.node] = pinned.get(info.node, 0) + 1
    used = ExclusiveUse(ns.avoid_cores, ns.avoid_numa) if ns.avoid_cores or ns.avoid_numa else _NO_EXCLUSIVE
    facts = NodeFacts(
        name=ns.name,
        labels=ns.node_labels,
        annotations=ns.node_annotations,
        nrt_annotations=ns.nrt_annotations,
        nrt_policies=ns.nrt_policies,
        topo=topo,
        topo_error=ns.topo_error,
        bindable=ns.bindable,
        free=ns.free,
        used=used,
        zones=zones,
        booked=booked,
        booked_cpusets=pinned,
        cpusets=cpusets,
    )
    if len(_FACTS) > 65536:
        _FACTS.clear()
    _FACTS[ns.name] = (ns.version, ns, facts)
    return facts


def _zone_amount(name: str, value: object) -> int:
    if not isinstance(value, str | int | float) or isinstance(value, bool):
        raise ValueError(f"quantity {value!r} is not a string or number")
    return parse_cpu_milli(value) if name == numa.CPU else parse_bytes(value)


def _zones(ns: NodeState) -> dict[int, dict[str, int]]:
    """NUMA zones from the NRT with withheld CPUs removed, or from the CPU topology.

    Without ``Node`` zones in the NRT every NUMA node of the CPU topology is a zone holding its
    bindable CPUs (and no memory), see ``scheduler_ext/README.md``.
    """
    topo = ns.topo
    try:
        zones = numa.parse_nrt_zones(ns.nrt_zones, _zone_amount)
    except numa.ZoneError as exc:
        log.warning("bad NodeResourceTopology zones", node=ns.name, error=str(exc))
        zones = {}
    if topo is None:
        return zones
    if not zones:
        return {n: {numa.CPU: len(ns.bindable & topo.numa_cpus[n]) * 1000} for n in topo.numa_nodes}
    withheld = topo.cpus - ns.bindable
    for n, amounts in zones.items():
        if amounts.get(numa.CPU):
            held = len(withheld & topo.numa_cpus.get(n, frozenset()))
            amounts[numa.CPU] = max(0, amounts[numa.CPU] - held * 1000)
    return zones


def _gpu_provider(ns: NodeState, gpu: GPURequest) -> numa.ProviderHints:
    hints = gpu_hints(ns.gpus, ns.gpu_usage, gpu)
    if hints is None:
        return {"gpu": None}
    return {"gpu": [numa.Hint(h.affinity, h.preferred) for h in hints]}


def _matched(ns: NodeState, pod: PodRequest) -> list[NodeReservation]:
    """The reservations on ``ns`` the pod may use (caller refreshed ``ns``), in name order."""
    if not ns.reserved:
        return []
    return [nr for nr in ns.reserved if pod_may_use(nr, pod.identity, pod.reservation_affinity, ns.node_labels)]


def _plus(into: dict[int, dict[str, int]], more: Mapping[int, Mapping[str, int]]) -> None:
    for n, amounts in more.items():
        slot = into.setdefault(n, {})
        for r, v in amounts.items():
            slot[r] = slot.get(r, 0) + v


def _frozen(amounts: Mapping[int, Mapping[str, int]]) -> tuple[tuple[int, tuple[tuple[str, int], ...]], ...]:
    return tuple(sorted((n, tuple(sorted(a.items()))) for n, a in amounts.items()))


def _minus(into: dict[int, dict[str, int]], less: Mapping[int, Mapping[str, int]]) -> None:
    for n, amounts in less.items():
        slot = into.setdefault(n, {})
        for r, v in amounts.items():
            slot[r] = slot.get(r, 0) - v


@dataclass(frozen=True, slots=True)
class _Restored:
    restore: Restore
    # reservation uid -> (builder of its view, its key), for the restorable matched ones
    views: Mapping[str, tuple[Callable[[], NodeFacts], object]]


def _exclusive_without(ns: NodeState, nr: NodeReservation, given: frozenset[int]) -> ExclusiveUse:
    """The node's exclusive holdings once ``nr`` gave back ``given`` (its CPUs no longer
    count for it there, as in ``getAvailableCPUs``)."""
    topo = ns.topo
    if topo is None:
        return _NO_EXCLUSIVE
    cores: set[int] = set()
    nodes: set[int] = set()

    def hold(cpus: frozenset[int], policy: str) -> None:
        if policy == keys.EXCLUSIVE_POLICY_PCPU_LEVEL:
            cores.update(topo.core_of[c] for c in cpus if c in topo.core_of)
        elif policy == keys.EXCLUSIVE_POLICY_NUMA_NODE_LEVEL:
            nodes.update(topo.details[c].node for c in cpus if c in topo.details)

    for alloc in ns.allocs.values():
        hold(alloc.cpus, alloc.exclusive)
    for other in ns.reserved:
        if other.r.active:
            hold(other.cpus - given if other is nr else other.cpus, other.r.exclusive_policy)
    return ExclusiveUse(frozenset(cores), frozenset(nodes)) if cores or nodes else _NO_EXCLUSIVE


def _view(
    ns: NodeState,
    facts: NodeFacts,
    nr: NodeReservation,
    given: frozenset[int],
    preferred: frozenset[int],
    others_used: Mapping[int, Mapping[str, int]],
) -> NodeFacts:
    """The node as ``nr`` restores it for a pod that matches it."""
    # what its pods booked plus what it has left is all it reserved; the other matched
    # reservations give back what their pods booked of them
    reusable = {n: dict(a) for n, a in others_used.items()}
    _minus(reusable, nr.used)
    _plus(reusable, nr.numa)
    view = restored(
        facts,
        free=facts.free | given,
        reusable=reusable,
        preferred=preferred,
        reservation=nr.r.uid,
        reservation_name=nr.r.name,
        allocate_policy=nr.r.allocate_policy,
        reserved_cpus=len(preferred),
        remained=nr.remained if nr.numa else None,
    )
    if given and nr.r.exclusive_policy != keys.EXCLUSIVE_POLICY_NONE:
        view = dataclasses.replace(view, used=_exclusive_without(ns, nr, given))
    return view


def _restore(ns: NodeState, facts: NodeFacts, matched: Sequence[NodeReservation], required: bool) -> _Restored | None:
    """The views of ``ns`` the pod's matched reservations give it (``RestoreReservation``):

    - a matched reservation that reserved a cpuset or NUMA amounts gives back its CPUs no pod
      of it holds (taken first) and its NUMA amounts left, plus what the pods of every
      available reservation booked of it (counted twice otherwise: by the reservation and the
      pod; ``NodeReservation.used``);
    - outside the reservations the node gives back only what the pods of the unmatched ones
      booked; hint generation reads the node with every matched reservation given back whole.
    """
    if not ns.reserved:
        return None
    mine = {nr.r.uid for nr in matched}
    unmatched_used: dict[int, dict[str, int]] = {}
    matched_whole: dict[int, dict[str, int]] = {}
    tries: list[NodeReservation] = []
    for nr in ns.reserved:
        if not nr.r.active or not nr.r.available or (nr.r.allocate_once and nr.assigned):
            continue
        if nr.r.uid in mine:
            if nr.restorable:
                tries.append(nr)
                _plus(matched_whole, nr.numa)
        elif nr.assigned and nr.restorable:
            _plus(unmatched_used, nr.used)
    if not tries and not unmatched_used:
        return None
    held: dict[int, int] = {}  # CPU -> how many holders (pods and active reservations)
    for alloc in ns.allocs.values():
        for c in alloc.cpus:
            held[c] = held.get(c, 0) + 1
    for nr in ns.reserved:
        if nr.r.active:
            for c in nr.cpus:
                held[c] = held.get(c, 0) + 1
    views: dict[str, tuple[Callable[[], NodeFacts], object]] = {}
    extra_all: set[int] = set()
    others_used = {n: dict(a) for n, a in unmatched_used.items()}  # plus every matched one's pods
    for nr in tries:
        _plus(others_used, nr.used)
    topo_cpus = facts.topo.cpus if facts.topo is not None else None
    for nr in tries:
        # a reserved CPU no pod of the reservation holds is free for the pod unless some other
        # pod or reservation holds it too (``getAvailableCPUs`` with the preferred CPUs)
        preferred = nr.preferred & topo_cpus if topo_cpus is not None else nr.preferred
        given = frozenset(c for c in preferred if held.get(c, 0) <= 1 and c in ns.bindable)
        extra_all |= given
        key = (given, preferred, nr.r.allocate_policy, _frozen(nr.used), _frozen(nr.numa))
        views[nr.r.uid] = (functools.partial(_view, ns, facts, nr, given, preferred, others_used), key)
    node_view = restored(facts, free=facts.free, reusable=unmatched_used)
    hint_reusable = {n: dict(a) for n, a in unmatched_used.items()}
    _plus(hint_reusable, matched_whole)
    hint_view = restored(facts, free=facts.free | extra_all, reusable=hint_reusable)
    restore = Restore(tuple(views[nr.r.uid] for nr in tries), node_view, hint_view, required)
    return _Restored(restore, views)


def _reservation_score(nr: NodeReservation, pod: PodRequest) -> int:
    """The reservation plugin's ``ScoreReservation``: MostAllocated over the reservation's
    ``status.allocatable`` after the pod (its requests plus ``status.allocated``)."""
    capacity = {k: v for k, v in nr.r.allocatable.items() if v}
    if not capacity:
        return 0
    request = {"cpu": pod.cpu_milli, "memory": pod.memory * 1000}  # milli-units, as MilliValue()
    total = 0
    for name, cap in capacity.items():
        cap_milli = int(cap * 1000)
        req = request.get(name, 0) + int(nr.r.allocated.get(name, 0) * 1000)
        if cap_milli > 0 and req <= cap_milli:
            total += 100 * req // cap_milli
    return total // len(capacity)


def _order(nr: NodeReservation) -> int:
    text = nr.r.labels.get(keys.LABEL_RESERVATION_ORDER, "")
    try:
        return int(text) if text and len(text) <= 19 else 0
    except ValueError:
        return 0


def _nominate(
    candidates: Sequence[NodeReservation], pod: PodRequest
) -> NodeReservation | None:
    """The reservation the nominator picks among those that pass: the lowest non-zero
    ``reservation-order`` label, else the highest ``_reservation_score``, ties by name."""
    if not candidates:
        return None
    ordered = [(o, nr) for nr in candidates if (o := _order(nr)) != 0]
    if ordered:
        return min(ordered, key=lambda x: (x[0], x[1].r.name))[1]
    return min(candidates, key=lambda nr: (-_reservation_score(nr, pod), nr.r.name, nr.r.uid))


def _place(
    ns: NodeState, pod: PodRequest, intent: Intent, *, exact: bool, matched: Sequence[NodeReservation] = ()
) -> tuple[Placed | Refusal, NodeReservation | None]:
    """The placement on ``ns`` and, with ``exact``, the reservation nominated for it."""
    facts = _facts(ns)
    extra: list[numa.ProviderHints] = []
    if pod.gpu is not None and not ns.gpu_error:
        extra.append(_gpu_provider(ns, pod.gpu))
    required = pod.reservation_affinity is not None
    got = _restore(ns, facts, matched, required) if ns.reserved else None
    if got is None:
        if exact and matched:  # matched reservations reserving nothing we allocate
            return place(intent, facts, extra=extra, exact=exact), _nominate(matched, pod)
        return place(intent, facts, extra=extra, exact=exact), None
    full = got.restore
    if not exact:
        return place(intent, facts, extra=extra, exact=False, restore=full), None
    # Reserve: only the nominated reservation (a pod that requires one: among those it fits)
    passing = [
        nr
        for nr in matched
        if not required
        or nr.r.uid not in got.views
        or isinstance(
            place(intent, facts, extra=extra, exact=False,
                  restore=dataclasses.replace(full, tries=(got.views[nr.r.uid],))),
            Placed,
        )
    ]
    nominated = _nominate(passing, pod)
    if nominated is None and required:
        return Refusal(UNSCHEDULABLE, ERR_NO_NOMINATED_RESERVATION), None
    view = got.views.get(nominated.r.uid) if nominated is not None else None
    final = dataclasses.replace(full, tries=(view,) if view is not None else ())
    return place(intent, facts, extra=extra, exact=True, restore=full, final=final), nominated


def _linear(free_after: float, total: float, strategy: str) -> float:
    if total <= 0:
        return 0.0
    frac = min(max(free_after / total, 0.0), 1.0)
    return MAX_SCORE * (frac if strategy == keys.LEAST_ALLOCATED else 1.0 - frac)


def _score(ns: NodeState, pod: PodRequest, placed: Placed, cfg: ExtenderConfig) -> int:
    parts: list[float] = []
    if placed.bind_policy:
        # a reservation's CPUs it gives back count as free for the pod that matches it
        parts.append(_linear(len(ns.free) + placed.given - pod.cpus, len(ns.bindable), cfg.score_strategy))
    if pod.gpu is not None:
        total = sum(g.core for g in ns.gpus if g.healthy)
        used = sum(u.core for m, u in ns.gpu_usage.items() if m in ns.gpu_by_minor)
        parts.append(_linear(total - used - pod.gpu.core * pod.gpu.count, total, cfg.gpu_strategy))
    if not parts:
        return 0
    return round(sum(parts) / len(parts))


def _evaluate(ns: NodeState, pod: PodRequest, cfg: ExtenderConfig) -> Verdict:
    intent = pre_filter(pod)
    if isinstance(intent, Refusal):
        return Verdict(False, True, intent.reason)
    if intent.skip and pod.reservation_affinity is None:
        return PLAIN
    if not ns.node_seen:
        return Verdict(False, False, f"node {ns.name} is not in the extender's cache yet")
    matched = _matched(ns, pod)
    if pod.reservation_affinity is not None and not matched:
        return Verdict(False, True, ERR_RESERVATION_AFFINITY)
    if intent.skip:
        return PLAIN
    placed, _ = _place(ns, pod, intent, exact=False, matched=matched)
    if isinstance(placed, Refusal):
        return Verdict(False, placed.unresolvable, placed.reason)
    if pod.gpu is not None:
        req = pod.gpu
        if ns.gpu_error:
            return Verdict(False, True, f"bad Device object: {ns.gpu_error}")
        healthy = sum(1 for g in ns.gpus if g.healthy)
        if healthy < req.count:
            return Verdict(False, True, f"pod asks {req.count} GPU(s), node has {healthy} healthy")
        strict = placed.numa_policy in _STRICT_NUMA and placed.affinity is not None
        fits = sum(
            1
            for g in ns.gpus
            if gpu_fits(g, ns.gpu_usage.get(g.minor, _IDLE), req)
            and (not strict or placed.affinity is None or g.numa in placed.affinity)
        )
        if fits < req.count:
            return Verdict(
                False, False, f"insufficient GPU capacity: {fits} GPU(s) fit, pod asks {req.count}"
            )
    if placed is PLAIN_PLACED and pod.gpu is None:
        return PLAIN
    return Verdict(True, score=_score(ns, pod, placed, cfg))


_KEY_IDS: dict[tuple[object, ...], int] = {}
_NEXT_KEY_ID = itertools.count(1)


def _key_id(pod: PodRequest, cfg: ExtenderConfig) -> int:
    """A small int standing for ``(pod.key, cfg)``: the per-node memo key.

    Hashing the full tuple (and the config dataclass) for each of 500 candidates was a third
    of the filter's time; one lookup per request is enough. Ids are never reused (a counter),
    so dropping the table when it grows only costs memo misses, never a wrong hit.
    """
    key = (pod.key, cfg)
    kid = _KEY_IDS.get(key)
    if kid is None:
        if len(_KEY_IDS) > 4096:
            _KEY_IDS.clear()
        kid = _KEY_IDS[key] = next(_NEXT_KEY_ID)
    return kid


_VERDICTS: dict[Verdict, Verdict] = {}


def _memo(ns: NodeState, pod: PodRequest, cfg: ExtenderConfig, kid: int) -> Verdict:
    """``evaluate`` without the per-call key work (``pod.error`` already checked)."""
    verdicts = ns.memo.get(kid)
    if verdicts is None:
        if len(ns.memo) >= 64:  # many pod kinds seen: start over rather than grow
            ns.memo.clear()
        verdicts = ns.memo[kid] = {}
    else:
        hit: Verdict | None = verdicts.get(ns.name)
        if hit is not None:
            return hit
    ns.refresh()
    verdict = _evaluate(ns, pod, cfg)
    # equal verdicts share one object (most are "fits, score s"), which keeps them in cache
    if len(_VERDICTS) > 10_000:
        _VERDICTS.clear()
    verdict = _VERDICTS.setdefault(verdict, verdict)
    if not ns.reservations:  # with reservations the verdict depends on which ones the pod matches
        verdicts[ns.name] = verdict
    return verdict


def evaluate(ns: NodeState, pod: PodRequest, cfg: ExtenderConfig) -> Verdict:
    """Feasibility and score of ``pod`` on ``ns`` (caller holds the state lock)."""
    if pod.error:
        return Verdict(False, True, pod.error)
    return _memo(ns, pod, cfg, _key_id(pod, cfg))


def _numa_annotation(booked: Mapping[int, Mapping[str, int]]) -> dict[int, dict[str, str]]:
    out: dict[int, dict[str, str]] = {}
    for n in sorted(booked):
        res: dict[str, str] = {}
        if booked[n].get(numa.CPU):
            res["cpu"] = format_milli_cpu(booked[n][numa.CPU])
        if booked[n].get(numa.MEMORY):
            res["memory"] = format_bytes(booked[n][numa.MEMORY])
        if res:
            out[n] = res
    return out


def plan(ns: NodeState, pod: PodRequest, cfg: ExtenderConfig) -> Placement:
    """The exact allocation for ``pod`` on ``ns`` now; raises ``AllocationError``.

    Caller holds the state lock from ``plan`` until the allocation is held.
    """
    verdict = evaluate(ns, pod, cfg)
    if not verdict.ok:
        raise AllocationError(verdict.reason)
    ns.refresh()  # a memo hit skips it; the exact plan needs the derived sets current
    intent = pre_filter(pod)
    if isinstance(intent, Refusal) or not ns.node_seen:
        return Placement(Allocation(), {}, None)
    matched = _matched(ns, pod)
    if intent.skip:
        nominated = _nominate(matched, pod)
        if nominated is None:
            return Placement(Allocation(), {}, None)
        return Placement(
            Allocation(reservation=nominated.r.uid),
            {keys.ANNOTATION_RESERVATION_ALLOCATED: format_reservation_allocated(nominated.r.name, nominated.r.uid)},
            None,
        )
    placed, nominated = _place(ns, pod, intent, exact=True, matched=matched)
    if isinstance(placed, Refusal):
        raise AllocationError(placed.reason)
    cpus = placed.cpus
    affinity = placed.affinity
    strict = placed.numa_policy in _STRICT_NUMA
    topo = ns.topo
    grants: tuple[GPUGrant, ...] = ()
    if pod.gpu is not None:
        gpu_aff = affinity
        if gpu_aff is None and cpus and topo is not None:
            gpu_aff = frozenset(topo.details[c].node for c in cpus)  # prefer, never require
        grants = take_gpus(
            ns.gpus,
            ns.gpu_usage,
            pod.gpu,
            affinity=gpu_aff,
            strict=strict and affinity is not None,
            strategy=cfg.gpu_strategy,
        )
    annotations: dict[str, str] = {}
    status = format_resource_status(cpus, _numa_annotation(placed.numa))
    if status:
        annotations[keys.ANNOTATION_RESOURCE_STATUS] = status
    devices = gpu_device_allocated(grants, ns.gpu_by_minor)
    if devices:
        annotations[keys.ANNOTATION_DEVICE_ALLOCATED] = devices
    if nominated is not None:
        annotations[keys.ANNOTATION_RESERVATION_ALLOCATED] = format_reservation_allocated(
            nominated.r.name, nominated.r.uid
        )
    alloc = Allocation(
        cpus=cpus,
        numa={n: a[numa.CPU] for n, a in placed.numa.items() if a.get(numa.CPU)},
        numa_memory={n: a[numa.MEMORY] for n, a in placed.numa.items() if a.get(numa.MEMORY)},
        gpus=grants,
        exclusive=pod.exclusive_policy if cpus else keys.EXCLUSIVE_POLICY_NONE,
        reservation=nominated.r.uid if nominated is not None else "",
    )
    return Placement(alloc, annotations, affinity)


@dataclass(frozen=True, slots=True)
class FilterResult:
    passed: list[str]
    failed: dict[str, str]
    unresolvable: dict[str, str]


def _verdicts(
    state: ClusterState, pod: PodRequest, names: Sequence[str], cfg: ExtenderConfig
) -> list[Verdict | None]:
    """The verdict of every candidate (``None``: not in the cache); caller holds the lock.

    Hot path (500 names per call, twice per pod): one ``map`` over the kind's memo table in C,
    then ``_memo`` only for the misses, typically the nodes changed since the last call.
    """
    kid = _key_id(pod, cfg)
    memo: Mapping[str, Verdict] = state.memo.get(kid) or {}
    out: list[Verdict | None] = list(map(memo.get, names))
    if None in out:
        get = state.nodes.get
        for i, v in enumerate(out):
            if v is None:
                ns = get(names[i])
                if ns is not None:
                    out[i] = _memo(ns, pod, cfg, kid)
    return out


def filter_nodes(
    state: ClusterState, pod: PodRequest, names: Sequence[str], cfg: ExtenderConfig
) -> FilterResult:
    """Split candidate names into passed, failed (preemption may help) and unresolvable."""
    if pod.error:
        return FilterResult([], {}, dict.fromkeys(names, pod.error))
    with state.lock:
        verdicts = _verdicts(state, pod, names, cfg)
    passed = [n for n, v in zip(names, verdicts, strict=True) if v is not None and v.ok]
    failed: dict[str, str] = {}
    unresolvable: dict[str, str] = {}
    if len(passed) == len(names):
        return FilterResult(passed, failed, unresolvable)
    plain = _plain_anywhere(pod)
    passed = []  # again, in the candidates' order
    for name, v in zip(names, verdicts, strict=True):
        if v is None:
            if plain:
                passed.append(name)  # nothing of ours to check: an unknown node cannot refuse it
            else:
                failed[name] = f"node {name} is not in the extender's cache yet"
        elif v.ok:
            passed.append(name)
        elif v.unresolvable:
            unresolvable[name] = v.reason
        else:
            failed[name] = v.reason
    return FilterResult(passed, failed, unresolvable)


def _plain_anywhere(pod: PodRequest) -> bool:
    """True when no node label could make this pod need anything from us: it requests
    nothing (a node's bind-policy label binds any CPU request, its NUMA policy label aligns
    any request)."""
    intent = pre_filter(pod)
    return isinstance(intent, Intent) and intent.skip and pod.reservation_affinity is None


def prioritize_nodes(
    state: ClusterState, pod: PodRequest, names: Sequence[str], cfg: ExtenderConfig
) -> list[tuple[str, int]]:
    """Scores 0..10 by the configured strategy; infeasible or unknown nodes score 0."""
    if pod.error:
        return [(name, 0) for name in names]
    with state.lock:
        verdicts = _verdicts(state, pod, names, cfg)
    return [(n, v.score if v is not None and v.ok else 0) for n, v in zip(names, verdicts, strict=True)]


def preempt_nodes(
    state: ClusterState,
    pod: PodRequest,
    victims: Mapping[str, Sequence[str]],
    cfg: ExtenderConfig,
) -> dict[str, list[str]]:
    """Keep the nodes where evicting the given victims (pod UIDs) lets ``pod`` fit."""
    out: dict[str, list[str]] = {}
    with state.lock:
        for name, uids in victims.items():
            ns = state.nodes.get(name)
            if not uids:
                continue  # kube-scheduler rejects a node returned without victims
            if ns is None:
                if _plain_anywhere(pod):
                    out[name] = list(uids)
                continue
            saved = {u: ns.allocs[u] for u in uids if u in ns.allocs and u not in ns.held}
            for u in saved:
                del ns.allocs[u]
            ns.touch()
            try:
                ok = _evaluate_uncached(ns, pod, cfg).ok
            finally:
                ns.allocs.update(saved)
                ns.touch()
            if ok:
                out[name] = list(uids)
    return out


def _evaluate_uncached(ns: NodeState, pod: PodRequest, cfg: ExtenderConfig) -> Verdict:
    if pod.error:
        return Verdict(False, True, pod.error)
    ns.refresh()
    return _evaluate(ns, pod, cfg)


# -- bind: the imperative shell -----------------------------------------------------------------


class BindAPI(Protocol):
    """The API calls a bind makes (``scheduler_ext.kube.BindClient`` implements it)."""

    async def get_pod(self, namespace: str, name: str) -> dict[str, Any]: ...

    async def patch_pod_annotations(
        self, namespace: str, name: str, annotations: Mapping[str, str | None], resource_version: str
    ) -> dict[str, Any]: ...

    async def bind_pod(
        self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str], resource_version: str
    ) -> None: ...

    async def aclose(self) -> None: ...


class Ledger(Protocol):
    """The HA ledger (``scheduler_ext.ledger.LeaseLedger``)."""

    async def entries(self, node: str, *, fresh: bool) -> Mapping[str, Allocation]: ...

    async def commit(self, node: str, uid: str, alloc: Allocation) -> None: ...

    async def remove(self, node: str, uid: str) -> None: ...


# every annotation a bind writes or removes: the scheduler-owned ones and the seal
_CLEARED: Mapping[str, None] = dict.fromkeys((*OWNED, SEAL_ANNOTATION))


@dataclass
class Binder:
    """Runs the bind verb: plan, hold, ledger commit, clear stale owned annotations, Binding
    carrying the new ones; undo on failure."""

    state: ClusterState
    api: BindAPI
    cfg: ExtenderConfig = DEFAULT_CONFIG
    ledger: Ledger | None = None
    attempts: int = 8

    def __post_init__(self) -> None:
        self._locks: dict[str, asyncio.Lock] = {}

    def _node_lock(self, node: str) -> asyncio.Lock:
        """Serialises this replica's ledger commits per node (other replicas meet the CAS)."""
        lock = self._locks.get(node)
        if lock is None:
            lock = self._locks[node] = asyncio.Lock()
        return lock

    async def aclose(self) -> None:
        await self.api.aclose()

    async def bind(self, namespace: str, name: str, uid: str, node: str) -> str:
        """Bind the pod; returns "" on success or the reason, with nothing left half-done.

        Runs to its end even when the caller goes away: an ASGI server does not cancel a
        request's task on disconnect, and ``shield`` keeps a cancelled caller from cutting a
        bind between its writes and its rollback.
        """
        return await asyncio.shield(self._guarded(namespace, name, uid, node))

    async def _guarded(self, namespace: str, name: str, uid: str, node: str) -> str:
        try:
            return await self._bind(namespace, name, uid, node)
        except APIError as exc:
            return f"bind {namespace}/{name} to {node}: API error {exc}"

    async def _pod(self, namespace: str, name: str, uid: str) -> tuple[PodRequest, str, str, bool]:
        """(request, resourceVersion, node it is bound to or "", whether it carries any owned
        annotation or a seal), from the cache when it knows the pending pod, else a GET."""
        entry = self.state.pending(uid)
        if entry is not None and entry.request is not None and entry.name == name:
            return entry.request, entry.rv, "", entry.owned
        pod = await self.api.get_pod(namespace, name)
        meta, spec = pod.get("metadata"), pod.get("spec")
        meta = meta if isinstance(meta, dict) else {}
        spec = spec if isinstance(spec, dict) else {}
        if uid and meta.get("uid") != uid:
            raise AllocationError(f"pod {namespace}/{name} has UID {str(meta.get('uid'))[:64]}, not {uid}")
        annotations = meta.get("annotations")
        return (
            decode_pod(pod),
            str(meta.get("resourceVersion") or ""),
            str(spec.get("nodeName") or ""),
            isinstance(annotations, dict) and any(k in annotations for k in _CLEARED),
        )

    async def _place(self, req: PodRequest, uid: str, node: str) -> Placement:
        """Plan and hold, serialised with the other replicas through the ledger."""
        if self.ledger is None:
            return await self._place_once(req, uid, node)
        async with self._node_lock(node):
            return await self._place_once(req, uid, node)

    async def _place_once(self, req: PodRequest, uid: str, node: str) -> Placement:
        for attempt in range(self.attempts):
            if self.ledger is not None:
                foreign = await self.ledger.entries(node, fresh=attempt > 0)
                self._absorb(node, uid, foreign)
            with self.state.lock:
                ns = self.state.node(node)
                if ns is None:
                    raise AllocationError(f"node {node} is not in the extender's cache")
                placement = plan(ns, req, self.cfg)
                if not placement.allocation.empty:
                    self.state.hold(uid, node, placement.allocation)
            if self.ledger is None or placement.allocation.empty:
                return placement
            try:
                await self.ledger.commit(node, uid, placement.allocation)
                return placement
            except ConflictError:
                BIND_CONFLICTS.labels("ledger").inc()
                self.state.release(uid, node)
        raise AllocationError(f"node {node}: ledger stayed contended for {self.attempts} attempts")

    def _absorb(self, node: str, own: str, foreign: Mapping[str, Allocation]) -> None:
        with self.state.lock:
            ns = self.state.node(node)
            if ns is None:
                return
            for uid in list(ns.foreign):
                if uid not in foreign:
                    self.state.release(uid, node)
            for uid, alloc in foreign.items():
                if uid == own or self.state.recently_deleted(uid):
                    continue
                if uid in ns.allocs and uid not in ns.foreign:
                    continue  # our own hold or confirmed by the watch
                self.state.hold(uid, node, alloc, foreign=True)

    def _written(self, uid: str, node: str, placement: Placement) -> dict[str, str]:
        """What the Binding carries: the owned annotations of this placement and their seal."""
        annotations = dict(placement.annotations)
        seal = self.state.trust.seal(uid, node, annotations)
        if seal is not None:
            annotations[SEAL_ANNOTATION] = seal
        return annotations

    async def _bind(self, namespace: str, name: str, uid: str, node: str) -> str:
        started = time.monotonic()
        stale = self.state.stale_kinds()
        if stale:
            return (f"cannot bind {namespace}/{name}: the extender's cache of {', '.join(stale)} is stale "
                    "(no word from the API server's watch); refusing to allocate from it")
        try:
            req, rv, bound_to, owned = await self._pod(namespace, name, uid)
        except AllocationError as exc:
            return str(exc)
        if bound_to:
            return "" if bound_to == node else f"pod {namespace}/{name} is already bound to {bound_to}"
        if req.error:
            return req.error
        try:
            placement = await self._place(req, uid, node)
        except AllocationError as exc:
            return f"cannot allocate on {node}: {exc}"
        written = self._written(uid, node, placement)
        step = "clear"
        try:
            for attempt in range(3):
                if owned:
                    step = "clear"
                    rv = await self._clear(namespace, name, uid, rv)
                step = "binding"
                try:
                    await self.api.bind_pod(namespace, name, uid, node, written, rv)
                    break
                except ConflictError:
                    # the pod changed since ``rv`` (or was bound or replaced): read it again
                    BIND_CONFLICTS.labels("binding").inc()
                    if attempt == 2:
                        raise
                    rv, owned = await self._reread(namespace, name, uid, node, written)
                    if not rv:
                        return ""  # bound by this very bind (a retried Binding that had landed)
        except (APIError, AllocationError) as exc:
            if step == "binding" and isinstance(exc, APIError) and await self._landed(
                namespace, name, uid, node, written
            ):
                log.warning("binding reply lost, but the pod is bound with this allocation",
                            pod=f"{namespace}/{name}", node=node, error=str(exc))
                return ""
            BIND_ROLLBACKS.inc()
            await self._rollback(uid, node, placement)
            log.warning("bind failed", pod=f"{namespace}/{name}", node=node, step=step, error=str(exc))
            return f"bind {namespace}/{name} to {node} failed at {step}, rolled back: {exc}"
        log.debug(
            "bound",
            pod=f"{namespace}/{name}",
            node=node,
            ms=round((time.monotonic() - started) * 1000, 2),
            **placement.annotations,
        )
        return ""

    async def _reread(
        self, namespace: str, name: str, uid: str, node: str, written: Mapping[str, str]
    ) -> tuple[str, bool]:
        """After a Binding conflict: the pod's current (resourceVersion, carries owned
        annotations), or ("", False) when this bind's Binding is what bound it; raises
        ``AllocationError`` when it was replaced or bound otherwise."""
        fresh = await self.api.get_pod(namespace, name)
        meta = fresh.get("metadata") or {}
        if uid and meta.get("uid") != uid:
            raise AllocationError(f"pod {namespace}/{name} was replaced")
        if (fresh.get("spec") or {}).get("nodeName"):
            if self._is_ours(fresh, uid, node, written):
                return "", False
            raise AllocationError(f"pod {namespace}/{name} was bound meanwhile")
        annotations = meta.get("annotations")
        owned = isinstance(annotations, dict) and any(k in annotations for k in _CLEARED)
        return str(meta.get("resourceVersion") or ""), owned

    @staticmethod
    def _is_ours(pod: Mapping[str, Any], uid: str, node: str, written: Mapping[str, str]) -> bool:
        """Bound to ``node`` with exactly this bind's annotations (and nothing owned besides)."""
        meta = pod.get("metadata") or {}
        ann = meta.get("annotations") or {}
        return (
            (pod.get("spec") or {}).get("nodeName") == node
            and (not uid or meta.get("uid") == uid)
            and all(ann.get(k) == written.get(k) for k in _CLEARED)
        )

    async def _landed(self, namespace: str, name: str, uid: str, node: str, written: Mapping[str, str]) -> bool:
        """After a failed Binding call, did it land anyway (a reply lost to a timeout or a reset)?

        Only when the pod is bound to ``node`` and carries exactly this bind's annotations: then
        the hold stays (the watch confirms it) and rolling back would strip a live allocation.
        A pod bound elsewhere, or by another replica with other CPUs, is not ours.
        """
        try:
            pod = await self.api.get_pod(namespace, name)
        except APIError:
            return False
        return self._is_ours(pod, uid, node, written)

    async def _clear(self, namespace: str, name: str, uid: str, rv: str) -> str:
        """Remove every owned annotation and any seal from the unbound pod (a merge patch with
        the resourceVersion precondition; on a stale version, re-read once); returns the new
        resourceVersion, the precondition of the Binding that follows.

        Harmless when the bind fails later: an unbound pod's owned annotations count nowhere,
        and whoever binds it next clears or writes them again.
        """
        for attempt in range(2):
            try:
                pod = await self.api.patch_pod_annotations(namespace, name, _CLEARED, rv)
                return str((pod.get("metadata") or {}).get("resourceVersion") or "")
            except ConflictError:
                BIND_CONFLICTS.labels("patch").inc()
                if attempt:
                    raise
                fresh = await self.api.get_pod(namespace, name)
                meta = fresh.get("metadata") or {}
                if meta.get("uid") != uid:
                    raise AllocationError(f"pod {namespace}/{name} was replaced") from None
                if (fresh.get("spec") or {}).get("nodeName"):
                    raise AllocationError(f"pod {namespace}/{name} was bound meanwhile") from None
                rv = str(meta.get("resourceVersion") or "")
        raise AssertionError("unreachable")

    async def _rollback(self, uid: str, node: str, placement: Placement) -> None:
        """Undo a failed bind: the ledger entry and the hold. The pod carries nothing to undo:
        the new annotations travel only in the Binding, which did not land."""
        if self.ledger is not None and not placement.allocation.empty:
            try:
                await self.ledger.remove(node, uid)
            except APIError as exc:
                log.warning("ledger cleanup failed; entry expires", node=node, error=str(exc))
        self.state.release(uid, node)
