"""The views of a node the admission rules read, and the reservation a bind allocates from.

Who calls this: ``scheduler_ext.decide`` (filter, prioritize, preempt and bind through
``place_on``). Reads ``scheduler_ext.state`` values under the cluster lock; returns values.

- ``node_facts``: the admission view (``admission.NodeFacts``) of a cached ``NodeState``:
  its free CPUs, exclusive holdings, NUMA zones (``_zones``, from the NRT with withheld CPUs
  removed, or from the CPU topology) and what placed pods and active reservations booked.
  Rebuilt only when the node changed (``NodeState.version``; zones with ``static_version``).
- ``matched_reservations`` and ``restore``: the reservations on the node the pod may use, and the views of
  the node they give back to it (``RestoreReservation``): one per matched reservation that
  reserved a cpuset or NUMA amounts, the node outside them, and the view hints read.
- ``nominate``: the reservation bind allocates from among those the pod can be placed with
  (``reservation-order``, else the reservation plugin's score), recorded in
  ``reservation-allocated``.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import structlog

from koord_formats import keys
from koord_formats.quantity import parse_bytes, parse_cpu_milli
from scheduler_ext import numa
from scheduler_ext.accumulator import ExclusiveUse
from scheduler_ext.admission import NodeFacts, Restore, restored
from scheduler_ext.pods import PodRequest
from scheduler_ext.reservations import NodeReservation, fits_restricted, pod_may_use
from scheduler_ext.state import NodeState

__all__ = ["Restored", "matched_reservations", "node_facts", "nominate", "restore", "zone_amount"]

log = structlog.get_logger("scheduler_ext.views")

_NO_EXCLUSIVE = ExclusiveUse()
# node name -> (NodeState.version, the NodeState, its admission view)
_FACTS: dict[str, tuple[int, NodeState, NodeFacts]] = {}
# node name -> (NodeState.static_version, the NodeState, its NUMA zones): zones change only with
# the Node and NRT objects, not with the pods placed on the node
_ZONES: dict[str, tuple[int, NodeState, numa.Zones]] = {}


def node_facts(ns: NodeState) -> NodeFacts:
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


def zone_amount(name: str, value: object) -> int:
    """One NRT zone amount: CPU in milli-cores, anything else in bytes (``numa.parse_nrt_zones``)."""
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
        zones = numa.parse_nrt_zones(ns.nrt_zones, zone_amount)
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


def matched_reservations(ns: NodeState, pod: PodRequest) -> list[NodeReservation]:
    """The reservations on ``ns`` the pod may use (caller refreshed ``ns``), in name order; none
    for a reservation's reserve pod. A Restricted one whose CPU or memory left is less than the
    pod asks is not among them (``fits_restricted``): its CPUs stay booked and the pod is placed
    outside it, as Koordinator's reservation filter refuses it for that pod."""
    if not ns.reserved or pod.reserve:
        return []
    return [
        nr
        for nr in ns.reserved
        if pod_may_use(nr, pod.identity, pod.reservation_affinity, ns.node_labels)
        and fits_restricted(nr, pod.cpu_milli, pod.memory)
    ]


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
class Restored:
    """What ``restore`` answers: the ``Restore`` and each matched reservation's view."""

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


def restore(ns: NodeState, facts: NodeFacts, matched: Sequence[NodeReservation], required: bool) -> Restored | None:
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
    plain_match = False  # a matched reservation that reserved nothing this allocates
    for nr in ns.reserved:
        if not nr.r.active or not nr.r.available or (nr.r.allocate_once and nr.assigned):
            continue
        if nr.r.uid in mine:
            if nr.restorable:
                tries.append(nr)
                _plus(matched_whole, nr.numa)
            else:
                plain_match = True
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
    # A pod that requires a reservation is placed outside the restorable ones when it matched one
    # that reserved no cpuset or NUMA amounts: bind can nominate that one and take the node's CPUs
    # (place_on), so filter falls back to the node too (filter passes exactly when bind allocates).
    restore = Restore(tuple(views[nr.r.uid] for nr in tries), node_view, hint_view, required and not plain_match)
    return Restored(restore, views)


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


def nominate(
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


