"""The decisions: what a pod needs on a node, its verdict and score, and the exact placement.

Who calls this: ``scheduler_ext.verbs`` (filter, prioritize, preempt), ``scheduler_ext.binder``
(``plan`` under the cluster lock) and ``scheduler_ext.cli simulate``. Everything reads
``scheduler_ext.state`` values under the cluster lock and returns values.

What a pod needs on a node follows koord-scheduler's NodeNUMAResource plugin
(``scheduler_ext.admission``: PreFilter/Filter rules with Koordinator's status and reason;
``scheduler_ext.numa``: NUMA zones, hints, merge and even split; ``scheduler_ext.accumulator``:
the CPU choice), plus GPUs when it requests any GPU resource (``scheduler_ext.allocator``).
``place_on`` runs the rules on the views ``scheduler_ext.views`` gives (the node, and the views
its matched reservations give back); filter and bind both go through it, filter counting the
CPUs and bind choosing them (``accumulator.allocate_cpuset``, one function for both).

Filter and prioritize memoise the verdict per pod kind and node in one dictionary
(``ClusterState.memo``, emptied for a node by each of its changes; ``memo_verdict``), so 500
candidates cost 500 lookups in one table when nothing changed. ``plan`` chooses the exact CPUs
and ``allocator.take_gpus`` under the cluster lock, so two binds on one node never receive the
same CPU.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

from koord_formats import keys
from koord_formats.pod import format_resource_status
from koord_formats.quantity import format_bytes, format_milli_cpu
from koord_formats.reservation import format_reservation_allocated
from scheduler_ext import numa
from scheduler_ext.admission import (
    ERR_INVALID_REQUESTED_CPUS,
    ERR_NO_NOMINATED_RESERVATION,
    ERR_RESERVATION_AFFINITY,
    UNSCHEDULABLE,
    Intent,
    Placed,
    Refusal,
    Restore,
    bind_policy_of,
    merge_numa_policy,
    node_cpu_bind_policy,
    node_numa_policy,
    place,
    pre_filter,
)
from scheduler_ext.admission import PLAIN as PLAIN_PLACED
from scheduler_ext.allocator import AllocationError, GPUGrant, GPUUsage, gpu_fits, gpu_hints, take_gpus
from scheduler_ext.annotations import Allocation, gpu_device_allocated
from scheduler_ext.pods import GPURequest, PodRequest
from scheduler_ext.reservations import NodeReservation
from scheduler_ext.state import NodeState
from scheduler_ext.topology import GPUDevice
from scheduler_ext.views import matched_reservations, node_facts, nominate, restore

__all__ = [
    "DEFAULT_CONFIG",
    "MAX_SCORE",
    "PLAIN",
    "STRATEGIES",
    "ExtenderConfig",
    "Needs",
    "Placement",
    "Verdict",
    "evaluate",
    "gpu_matched",
    "gpu_view",
    "held_for_others",
    "key_id",
    "memo_verdict",
    "needs",
    "place_on",
    "plain_shortage",
    "plan",
    "verdict_of",
]

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


def gpu_view(ns: NodeState, nr: NodeReservation | None) -> tuple[tuple[GPUDevice, ...], Mapping[int, GPUUsage]]:
    """The GPUs a pod may take and their usage as it sees them: the node's for a pod outside
    any reservation that reserved GPUs (what reservations reserved counts as used, see
    ``ClusterState``'s refresh); for an owner placed into ``nr``, only the minors ``nr`` reserved,
    with what ``nr`` holds of them for its pods given back. Koordinator's owner allocates
    from the reserved minors as preferred ones and, with the Default and Aligned policies, may
    add the node's free GPUs; here a pod placed into a reservation that reserved GPUs takes
    only reserved ones (see "Deliberate differences" in ``scheduler_ext/README.md``)."""
    if nr is None or not nr.gpus:
        return ns.gpus, ns.gpu_usage
    usage = dict(ns.gpu_usage)
    for minor, (core, ratio, memory) in nr.gpu_remained.items():
        usage[minor] = usage.get(minor, _IDLE).minus(core, ratio, memory)
    return tuple(g for g in ns.gpus if g.minor in nr.gpus), usage


def _gpus_fit(gpus: Sequence[GPUDevice], usage: Mapping[int, GPUUsage], req: GPURequest,
              affinity: frozenset[int] | None = None) -> int:  # fmt: skip
    """How many of ``gpus`` have room for one share of ``req`` (inside ``affinity`` when given)."""
    return sum(1 for g in gpus if gpu_fits(g, usage.get(g.minor, _IDLE), req)
               and (affinity is None or g.numa in affinity))  # fmt: skip


def gpu_matched(ns: NodeState, pod: PodRequest, matched: Sequence[NodeReservation]) -> list[NodeReservation]:
    """The matched reservations a GPU pod can be placed into: one that reserved GPUs when its
    reserved GPUs hold the request; one that reserved none when the node's GPUs outside every
    reservation do (Koordinator's reservation filter runs the device plugin on each)."""
    if pod.gpu is None or ns.gpu_error:
        return list(matched)
    node_fits = _gpus_fit(ns.gpus, ns.gpu_usage, pod.gpu) >= pod.gpu.count
    out = []
    for nr in matched:
        if nr.gpus:
            gpus, usage = gpu_view(ns, nr)
            if _gpus_fit(gpus, usage, pod.gpu) >= pod.gpu.count:
                out.append(nr)
        elif node_fits:
            out.append(nr)
    return out


def held_for_others(ns: NodeState, matched: Sequence[NodeReservation]) -> tuple[int, int]:
    """The CPU (milli) and memory (bytes) the node's active reservations other than ``matched``
    hold for their owners: ``status.allocatable`` minus what its owners use (``status.allocated``,
    or the requests of the pods the cache counts as allocated from it when more), never below 0.
    Koordinator counts each reservation's reserve pod on its node with those requests, so a pod
    that does not match it never gets them (``pkg/scheduler/plugins/reservation``)."""
    mine = {nr.r.uid for nr in matched}
    others = {nr.r.uid: nr.r for nr in ns.reserved if nr.r.active and nr.r.uid not in mine}
    if not others:
        return 0, 0
    # what the pods the cache counts as allocated from each one request: its status.allocated
    # follows them only after the controller's next round
    used: dict[str, tuple[int, int]] = {}
    for uid, alloc in ns.allocs.items():
        if alloc.reservation in others:
            c, m = ns.requested.get(uid, (0, 0))
            old = used.get(alloc.reservation, (0, 0))
            used[alloc.reservation] = (old[0] + c, old[1] + m)
    cpu = memory = 0
    zero = Fraction(0)
    for r_uid, r in others.items():
        own_cpu, own_memory = used.get(r_uid, (0, 0))
        cpu += max(0, math.ceil(r.allocatable.get("cpu", zero) * 1000)
                   - max(own_cpu, math.ceil(r.allocated.get("cpu", zero) * 1000)))  # fmt: skip
        memory += max(0, math.ceil(r.allocatable.get("memory", zero))
                      - max(own_memory, math.ceil(r.allocated.get("memory", zero))))  # fmt: skip
    return cpu, memory


def plain_shortage(ns: NodeState, pod: PodRequest, matched: Sequence[NodeReservation]) -> str:
    """kube-scheduler's "Insufficient cpu"/"Insufficient memory" once what the reservations the
    pod does not match hold is counted: kube-scheduler counts the node's pods only, so this is
    the extender's to add. "" on a node without such reservations or whose Node allocatable the
    cache could not read (kube-scheduler's own check stands)."""
    if not ns.reserved or ns.allocatable is None:
        return ""
    held_cpu, held_memory = held_for_others(ns, matched)
    if not held_cpu and not held_memory:
        return ""
    (alloc_cpu, alloc_memory), (used_cpu, used_memory) = ns.allocatable, ns.requested_total
    short = []
    if held_cpu and pod.cpu_milli > 0 and pod.cpu_milli > alloc_cpu - used_cpu - held_cpu:
        short.append("Insufficient cpu")
    if held_memory and pod.memory > 0 and pod.memory > alloc_memory - used_memory - held_memory:
        short.append("Insufficient memory")
    return ", ".join(short)


def _gpu_provider(ns: NodeState, gpu: GPURequest) -> numa.ProviderHints:
    hints = gpu_hints(ns.gpus, ns.gpu_usage, gpu)
    if hints is None:
        return {"gpu": None}
    return {"gpu": [numa.Hint(h.affinity, h.preferred) for h in hints]}


def place_on(
    ns: NodeState, pod: PodRequest, intent: Intent, *, exact: bool, matched: Sequence[NodeReservation] = ()
) -> tuple[Placed | Refusal, NodeReservation | None]:
    """The placement on ``ns`` and, with ``exact``, the reservation nominated for it."""
    facts = node_facts(ns)
    extra: list[numa.ProviderHints] = []
    if pod.gpu is not None and not ns.gpu_error:
        extra.append(_gpu_provider(ns, pod.gpu))
    required = pod.reservation_affinity is not None
    got = restore(ns, facts, matched, required) if ns.reserved else None
    if got is None:
        if exact and matched:  # matched reservations reserving nothing we allocate
            return place(intent, facts, extra=extra, exact=exact), nominate(matched, pod)
        return place(intent, facts, extra=extra, exact=exact), None
    full = got.restore
    if not exact:
        return place(intent, facts, extra=extra, exact=False, restore=full), None
    # Reserve: allocate from the nominated reservation only, nominated among those the pod can
    # be placed with (as Koordinator's nominator runs the reservation filters first), each
    # checked by counting exactly as bind then chooses: a node filter passes always has one

    def final_for(nr: NodeReservation) -> Restore:
        view = got.views.get(nr.r.uid)
        return dataclasses.replace(full, tries=(view,) if view is not None else ())

    passing = [
        nr
        for nr in matched
        if isinstance(place(intent, facts, extra=extra, exact=False, restore=full, final=final_for(nr)), Placed)
    ]
    nominated = nominate(passing, pod)
    if nominated is None and required:
        return Refusal(UNSCHEDULABLE, ERR_NO_NOMINATED_RESERVATION), None
    final = final_for(nominated) if nominated is not None else dataclasses.replace(full, tries=())
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


def verdict_of(ns: NodeState, pod: PodRequest, cfg: ExtenderConfig) -> Verdict:
    intent = pre_filter(pod)
    if isinstance(intent, Refusal):
        return Verdict(False, True, intent.reason)
    if intent.skip and pod.reservation_affinity is None:
        return PLAIN
    if not ns.node_seen:
        return Verdict(False, False, f"node {ns.name} is not in the extender's cache yet")
    matched = gpu_matched(ns, pod, matched_reservations(ns, pod))
    if pod.reservation_affinity is not None and not matched:
        return Verdict(False, True, ERR_RESERVATION_AFFINITY)
    short = plain_shortage(ns, pod, matched)
    if short:
        return Verdict(False, False, short)
    if intent.skip:
        return PLAIN
    placed, _ = place_on(ns, pod, intent, exact=False, matched=matched)
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
        fits = _gpus_fit(ns.gpus, ns.gpu_usage, req, placed.affinity if strict else None)
        for nr in matched:  # or inside a matched reservation that reserved GPUs
            if nr.gpus and fits < req.count:
                gpus, usage = gpu_view(ns, nr)
                fits = max(fits, _gpus_fit(gpus, usage, req, placed.affinity if strict else None))
        if fits < req.count:
            return Verdict(
                False, False, f"insufficient GPU capacity: {fits} GPU(s) fit, pod asks {req.count}"
            )
    if placed is PLAIN_PLACED and pod.gpu is None:
        return PLAIN
    return Verdict(True, score=_score(ns, pod, placed, cfg))


_KEY_IDS: dict[tuple[object, ...], int] = {}
_NEXT_KEY_ID = itertools.count(1)


def key_id(pod: PodRequest, cfg: ExtenderConfig) -> int:
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


def memo_verdict(ns: NodeState, pod: PodRequest, cfg: ExtenderConfig, kid: int) -> Verdict:
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
    verdict = verdict_of(ns, pod, cfg)
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
    return memo_verdict(ns, pod, cfg, key_id(pod, cfg))


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
    matched = gpu_matched(ns, pod, matched_reservations(ns, pod))
    if intent.skip:
        nominated = nominate(matched, pod)
        if nominated is None:
            return Placement(Allocation(), {}, None)
        return Placement(
            Allocation(reservation=nominated.r.uid),
            {keys.ANNOTATION_RESERVATION_ALLOCATED: format_reservation_allocated(nominated.r.name, nominated.r.uid)},
            None,
        )
    placed, nominated = place_on(ns, pod, intent, exact=True, matched=matched)
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
        gpus, usage = gpu_view(ns, nominated)  # placed into a reservation: its reserved GPUs only
        grants = take_gpus(
            gpus,
            usage,
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


