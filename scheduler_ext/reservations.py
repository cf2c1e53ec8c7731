"""Which Reservations a pod may use on a node, and what each one gives back to it.

Who calls this: ``scheduler_ext.state`` keeps each node's active reservations
(``koord_formats.reservation.Reservation``) and folds the pods allocated from them into
``NodeReservation`` values (``fold``); ``scheduler_ext.views`` asks ``pod_may_use`` per pod and
node and builds the admission variants from the result. Pure functions only.

Koordinator's rules (``pkg/scheduler/plugins/reservation`` ``transformer.go`` / ``plugin.go``,
``pkg/util/reservation``, ``nodenumaresource/reservation.go``):

- A reservation counts on its node while it is active: valid (template, owners, ttl or
  expires), ``status.nodeName`` set and phase Available or Waiting. Its resource-status cpuset
  and NUMA amounts are then booked like a pod's, for every pod.
- A pod may use it when it is Available, not ``spec.unschedulable``, not an allocate-once
  reservation that already has a pod, one of ``spec.owners`` matches the pod (object
  reference, controller reference, label selector: the parts of one owner ANDed, the owners
  ORed) and the pod's ``reservation-affinity`` (if any) accepts it: its name, its
  ``reservationSelector`` and ``reservationSelectorTerms`` over the node's labels overlaid by
  the reservation's (``metadata.name`` is the reservation's name), and its NoSchedule and
  NoExecute taints tolerated.
- Pods allocated from a reservation carry ``reservation-allocated`` with its UID.
- GPUs (``deviceshare/reservation.go``): a reservation's own ``device-allocated`` lists the GPU
  minors and amounts it reserved. Every pod but its owners sees them as used except what its
  own pods hold of them (``gpu_remained``: reserved minus held, per minor, never below 0); an
  owner placed into it takes its GPUs among the reserved minors only (``scheduler_ext.decide``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from koord_formats import keys
from koord_formats.pod import ResourceStatus
from koord_formats.reservation import (
    LabelSelector,
    OwnerRef,
    Reservation,
    ReservationAffinity,
    ReservationOwner,
)

__all__ = [
    "NodeReservation",
    "PodIdentity",
    "affinity_matches",
    "fits_restricted",
    "fold",
    "numa_amounts",
    "owners_match",
    "pod_may_use",
    "reserved_gpus",
]

CPU = "cpu"
MEMORY = "memory"
_HARD_EFFECTS = ("NoSchedule", "NoExecute")

Amounts = dict[int, dict[str, int]]  # NUMA node -> {"cpu": milli, "memory": bytes}
GPUAmounts = Mapping[int, tuple[int, int, int]]  # GPU minor -> (core %, memory-ratio %, memory bytes)


@dataclass(frozen=True, slots=True)
class PodIdentity:
    """What owner matching reads of a pod."""

    uid: str = ""
    name: str = ""
    namespace: str = "default"
    api_version: str = ""
    labels: tuple[tuple[str, str], ...] = ()
    owner_refs: tuple[OwnerRef, ...] = ()


def numa_amounts(status: ResourceStatus) -> Amounts:
    """A resource-status' ``numaNodeResources`` as milli-CPU and bytes per NUMA node."""
    out: Amounts = {}
    for entry in status.numa_node_resources:
        cpu = entry.resources.get(CPU)
        mem = entry.resources.get(MEMORY)
        if cpu is None and mem is None:
            continue
        slot = out.setdefault(entry.node, {})
        if cpu is not None:
            slot[CPU] = slot.get(CPU, 0) + math.ceil(cpu * 1000)
        if mem is not None:
            slot[MEMORY] = slot.get(MEMORY, 0) + math.ceil(mem)
    return out


def _add(into: Amounts, more: Mapping[int, Mapping[str, int]]) -> None:
    for n, amounts in more.items():
        slot = into.setdefault(n, {})
        for r, v in amounts.items():
            slot[r] = slot.get(r, 0) + v


@dataclass(frozen=True, slots=True)
class NodeReservation:
    """An active reservation on its node, with the pods allocated from it folded in."""

    r: Reservation
    cpus: frozenset[int]  # the cpuset it reserved
    numa: Amounts  # the NUMA amounts it reserved (empty: none)
    assigned: int = 0  # pods allocated from it on this node
    assigned_cpus: frozenset[int] = frozenset()
    assigned_numa: Amounts = field(default_factory=dict)  # what those pods booked, where it reserved NUMA
    gpus: GPUAmounts = field(default_factory=dict)  # the GPUs it reserved (its device-allocated)
    assigned_gpus: GPUAmounts = field(default_factory=dict)  # what its pods hold of those minors

    @property
    def gpu_remained(self) -> dict[int, tuple[int, int, int]]:
        """What it reserved of each GPU that its pods do not hold (never below 0)."""
        out: dict[int, tuple[int, int, int]] = {}
        for minor, amounts in self.gpus.items():
            held = self.assigned_gpus.get(minor, (0, 0, 0))
            left = tuple(max(0, a - b) for a, b in zip(amounts, held, strict=True))
            if any(left):
                out[minor] = (left[0], left[1], left[2])
        return out

    @property
    def preferred(self) -> frozenset[int]:
        """The reserved CPUs no pod of the reservation holds yet (``reservedCPUs``)."""
        return self.cpus - self.assigned_cpus

    @property
    def restorable(self) -> bool:
        """It reserved a cpuset or NUMA amounts (``RestoreReservation`` keeps only those)."""
        return bool(self.numa) or bool(self.preferred)

    @property
    def remained(self) -> Amounts:
        """NUMA amounts left: reserved minus what its pods booked (may go negative)."""
        out: Amounts = {n: dict(a) for n, a in self.numa.items()}
        for n, amounts in self.assigned_numa.items():
            slot = out.setdefault(n, {})
            for r, v in amounts.items():
                slot[r] = slot.get(r, 0) - v
        return out

    @property
    def used(self) -> Amounts:
        """What its pods booked of what it reserved: per NUMA node and resource the smaller of
        the two, so a reservation and its pods together count as the larger of the two (see
        "Deliberate differences" in ``scheduler_ext/README.md``)."""
        out: Amounts = {}
        for n, amounts in self.assigned_numa.items():
            reserved = self.numa.get(n, {})
            out[n] = {r: max(0, min(v, reserved.get(r, 0))) for r, v in amounts.items()}
        return out


def reserved_gpus(r: Reservation) -> dict[int, tuple[int, int, int]]:
    """The GPUs a reservation's ``device-allocated`` lists, per minor (amounts read as a pod's:
    core and memory-ratio rounded down, memory up)."""
    out: dict[int, tuple[int, int, int]] = {}
    for dev in r.devices.get(keys.DEVICE_TYPE_GPU, ()):
        res = dev.resources
        core, ratio, memory = out.get(dev.minor, (0, 0, 0))
        out[dev.minor] = (core + math.floor(res.get(keys.RESOURCE_GPU_CORE, 0)),
                          ratio + math.floor(res.get(keys.RESOURCE_GPU_MEMORY_RATIO, 0)),
                          memory + math.ceil(res.get(keys.RESOURCE_GPU_MEMORY, 0)))  # fmt: skip
    return out


# a pod allocated from a reservation: (reservation uid, cpus, NUMA milli-CPU, NUMA bytes, GPUs as
# (minor, core, ratio, memory))
Member = tuple[str, frozenset[int], Mapping[int, int], Mapping[int, int], Iterable[tuple[int, int, int, int]]]


def fold(reservations: Iterable[Reservation], pods: Iterable[Member]) -> tuple[NodeReservation, ...]:
    """Active reservations of one node (sorted by name) with their pods (``Member`` each)."""
    by_uid: dict[str, list[Any]] = {}
    for uid, cpus, numa_cpu, numa_mem, p_gpus in pods:
        by_uid.setdefault(uid, []).append((cpus, numa_cpu, numa_mem, p_gpus))
    out: list[NodeReservation] = []
    for r in sorted(reservations, key=lambda x: (x.name, x.uid)):
        numa = numa_amounts(r.status)
        gpus = reserved_gpus(r)
        members = by_uid.get(r.uid, [])
        held: set[int] = set()
        booked: Amounts = {}
        on_gpus: dict[int, tuple[int, int, int]] = {}
        for p_cpus, p_cpu, p_mem, p_gpus in members:
            held |= p_cpus
            if numa:
                _add(booked, {n: {CPU: v} for n, v in p_cpu.items()})
                _add(booked, {n: {MEMORY: v} for n, v in p_mem.items()})
            for minor, core, ratio, memory in p_gpus:
                if minor in gpus:
                    c, q, m = on_gpus.get(minor, (0, 0, 0))
                    on_gpus[minor] = (c + core, q + ratio, m + memory)
        out.append(NodeReservation(r, r.status.cpuset, numa, len(members), frozenset(held), booked, gpus, on_gpus))
    return tuple(out)


# -- matching ----------------------------------------------------------------------------------


def _selector(sel: LabelSelector, labels: Mapping[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in sel.match_labels.items()) and all(
        r.matches(labels) for r in sel.match_expressions
    )


def _object_ref(owner: ReservationOwner, pod: PodIdentity) -> bool:
    ref = owner.object
    return ref is None or (
        (not ref.uid or ref.uid == pod.uid)
        and (not ref.name or ref.name == pod.name)
        and (not ref.namespace or ref.namespace == pod.namespace)
        and (not ref.api_version or ref.api_version == pod.api_version)
    )


def _controller(owner: ReservationOwner, pod: PodIdentity) -> bool:
    ctl = owner.controller
    if ctl is None:
        return True
    if ctl.namespace and ctl.namespace != pod.namespace:
        return False
    return any(
        (ctl.controller is None or (ref.controller is not None and ref.controller == ctl.controller))
        and (not ctl.uid or ctl.uid == ref.uid)
        and (not ctl.name or ctl.name == ref.name)
        and (not ctl.kind or ctl.kind == ref.kind)
        and (not ctl.api_version or ctl.api_version == ref.api_version)
        for ref in pod.owner_refs
    )


def owners_match(r: Reservation, pod: PodIdentity) -> bool:
    """One of ``spec.owners`` accepts the pod (no owners: none does)."""
    labels = dict(pod.labels)
    return any(
        _object_ref(o, pod)
        and _controller(o, pod)
        and (o.label_selector is None or _selector(o.label_selector, labels))
        for o in r.owners
    )


def affinity_matches(aff: ReservationAffinity, r: Reservation, node_labels: Mapping[str, str]) -> bool:
    """The pod's reservation affinity accepts ``r`` on a node with ``node_labels``."""
    if aff.name and aff.name != r.name:
        return False
    for taint in r.taints:
        if taint.effect in _HARD_EFFECTS and not any(t.tolerates(taint) for t in aff.tolerations):
            return False
    labels = dict(node_labels)
    labels.update(r.labels)
    if not all(labels.get(k) == v for k, v in aff.selector.items()):
        return False
    return aff.terms is None or any(t.matches(labels, r.name) for t in aff.terms)


def pod_may_use(
    nr: NodeReservation, pod: PodIdentity, affinity: ReservationAffinity | None, node_labels: Mapping[str, str]
) -> bool:
    """Koordinator's ``matched`` set: the reservation is Available, schedulable, not used up by
    allocate-once, and its owners and the pod's affinity accept each other."""
    r = nr.r
    if not r.available or r.unschedulable or (r.allocate_once and nr.assigned > 0):
        return False
    if not owners_match(r, pod):
        return False
    return affinity is None or affinity_matches(affinity, r, node_labels)


def fits_restricted(nr: NodeReservation, cpu_milli: int, memory: int) -> bool:
    """A Restricted reservation can be nominated only when the pod's CPU and memory requests
    fit in what it has left of them (``status.allocatable`` minus ``status.allocated``, for
    the names it reserves; ``fitsReservation``); the other policies let the pod take the rest
    from the node."""
    r = nr.r
    if r.allocate_policy != keys.RESERVATION_ALLOCATE_POLICY_RESTRICTED:
        return True
    for name, want in ((CPU, Fraction(cpu_milli, 1000)), (MEMORY, Fraction(memory))):
        cap = r.allocatable.get(name)
        if cap is None or want <= 0:
            continue
        if want > cap - max(r.allocated.get(name, Fraction(0)), Fraction(0)):
            return False
    return True
