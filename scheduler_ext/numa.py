"""NUMA placement as koord-scheduler does it: zone accounting, hints, policy merge, even split.

Who calls this: ``scheduler_ext.admission`` and ``scheduler_ext.views`` (``parse_nrt_zones``); the functions
here take plain values (zone amounts, a topology, sets of CPUs) and return values.

Terms:

- *zone*: one NUMA node's allocatable amounts from the NodeResourceTopology (``zones`` of type
  ``Node`` named ``node-<id>``; CPU in milli-cores, memory in bytes), minus the CPUs the node
  withholds from binding (kubelet and node reservations, exclusive system-QoS CPUs), as
  ``nodenumaresource/topology_options.go`` computes it.
- *booked*: the ``numaNodeResources`` of the pods already placed, per NUMA node.
- *available*: zone minus booked, never below zero. A placement never books more than this,
  so no zone is ever pushed past its allocatable.
- *mask*: a set of NUMA node ids, iterated as Koordinator's ``bitmask.IterateBitMasks`` does:
  by size, then in lexicographic order.
- *hint*: a mask with ``preferred`` and a ``score``; a mask becomes a hint only when the whole
  pod can actually be placed inside it (``resource_manager.go`` ``generateResourceHints``).

The even split (``distribute_evenly``, ``tryBestToDistributeEvenly``) walks the hinted NUMA
nodes from the one with the least available to the most and gives each ``left / nodes left``
(whole cores for required FullPCPUs, whole CPUs for other cpusets, milli-cores otherwise),
capped by what the node has; the remainder rolls on to the next node.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from koord_formats import keys, nrt
from koord_formats.errors import FormatError

__all__ = [
    "CPU",
    "MEMORY",
    "Hint",
    "Merged",
    "Zones",
    "distribute_evenly",
    "exclusive_allows",
    "iterate_masks",
    "mask_text",
    "merge_hints",
    "numa_node_states",
    "parse_nrt_zones",
    "split_quantity",
    "zone_available",
]

CPU = "cpu"
MEMORY = "memory"
NUMA_RESOURCES = (CPU, MEMORY)


UNSATISFIED = "Unsatisfied NUMA {}"
UNALIGNED = "Unaligned NUMA Hint cause {}"

_ZONE_NAME = re.compile(r"node-([0-9]{1,4})", re.ASCII)

Zones = Mapping[int, Mapping[str, int]]  # NUMA node -> resource -> amount (cpu in milli)


class ZoneError(ValueError):
    """The NodeResourceTopology's ``zones`` cannot be used; the message says why."""


def parse_nrt_zones(zones: object, parse_amount: Callable[[str, object], int]) -> dict[int, dict[str, int]]:
    """NUMA zones of a NodeResourceTopology: ``{node: {"cpu": milli, "memory": bytes}}``.

    The ``zones`` value is read by the format's one parser, ``koord_formats.nrt.parse_zones``
    (bounds, structure, every quantity). Of what it gives, only zones of type ``Node`` whose
    name is ``node-<id>`` count (other zones are skipped, as Koordinator skips them); only
    ``cpu`` and ``memory`` are read (the extender books nothing else per NUMA node).
    ``parse_amount(name, value)`` turns one allocatable quantity into an int (milli-cores for
    cpu) and raises ``ValueError`` for bad input. Raises ``ZoneError``.
    """
    try:
        parsed = nrt.parse_zones(zones)
    except FormatError as exc:
        raise ZoneError(str(exc)) from None
    out: dict[int, dict[str, int]] = {}
    for zone in parsed:
        if zone.type != nrt.ZONE_TYPE_NODE:
            continue
        match = _ZONE_NAME.fullmatch(zone.name)
        if match is None:
            continue
        amounts: dict[str, int] = {}
        for res in zone.resources:
            if res.name not in NUMA_RESOURCES:
                continue
            try:
                amounts[res.name] = max(0, parse_amount(res.name, res.allocatable))
            except ValueError as exc:
                raise ZoneError(f"zone {zone.name}: {res.name}: {exc}") from None
        out[int(match.group(1))] = amounts
    return out


def zone_available(zones: Zones, booked: Mapping[int, Mapping[str, int]]) -> dict[int, dict[str, int]]:
    """Zone allocatable minus what placed pods booked, per NUMA node, never below zero."""
    out: dict[int, dict[str, int]] = {}
    for node, amounts in zones.items():
        used = booked.get(node, {})
        out[node] = {r: max(0, v - used.get(r, 0)) for r, v in amounts.items()}
    return out


def iterate_masks(nodes: Sequence[int]) -> Iterator[frozenset[int]]:
    """Every non-empty subset of ``nodes``: smaller first, then lexicographic by id."""
    ordered = sorted(nodes)
    for size in range(1, len(ordered) + 1):
        for combo in itertools.combinations(ordered, size):
            yield frozenset(combo)


def mask_value(mask: frozenset[int]) -> int:
    return sum(1 << n for n in mask)


def mask_text(mask: frozenset[int]) -> str:
    """A mask as Koordinator prints it in reasons: binary, padded to an even width (``01``)."""
    value = mask_value(mask)
    width = 2
    while value >= 1 << width:
        width += 2
    return format(value, f"0{width}b")


def is_narrower(a: frozenset[int], b: frozenset[int]) -> bool:
    """Fewer NUMA nodes, or as many with a lower bitmask value (kubelet's ``IsNarrowerThan``)."""
    if len(a) != len(b):
        return len(a) < len(b)
    return mask_value(a) < mask_value(b)


@dataclass(frozen=True, slots=True)
class Hint:
    """A NUMA affinity (``None`` = any node) from one hint provider for one resource."""

    affinity: frozenset[int] | None
    preferred: bool
    score: int = 0
    unsatisfied: bool = False


@dataclass(frozen=True, slots=True)
class Merged:
    """The merged affinity of every provider, whether the policy admits it, and why not."""

    affinity: frozenset[int] | None  # None: no NUMA preference (SingleNUMANode on "any")
    preferred: bool
    admit: bool
    reasons: tuple[str, ...] = ()
    unsatisfied: bool = False
    score: int = field(default=0, compare=False)


# A provider answers per resource name: ``None`` for a resource means "no preference", an empty
# list "cannot be satisfied"; an empty mapping means the provider has no preference at all.
ProviderHints = Mapping[str, Sequence[Hint] | None]


def _summary(resource: str, hints: Sequence[Hint]) -> str:
    preferred = [mask_text(h.affinity) for h in hints if not h.unsatisfied and h.preferred and h.affinity is not None]
    possible = [mask_text(h.affinity) for h in hints if not h.unsatisfied and h.affinity is not None]
    return f"{resource} prefer [{' '.join(preferred)}] among [{' '.join(possible)}]"


def _filter(providers: Sequence[ProviderHints]) -> tuple[list[list[Hint]], list[str], list[str]]:
    lists: list[list[Hint]] = []
    reasons: list[str] = []
    summary: list[str] = []
    for provider in providers:
        if not provider:
            lists.append([Hint(None, True)])
            continue
        for resource in sorted(provider):
            hints = provider[resource]
            if hints is None:
                lists.append([Hint(None, True)])
            elif not hints:
                lists.append([Hint(None, False, unsatisfied=True)])
                reasons.append(UNSATISFIED.format(resource))
            else:
                summary.append(_summary(resource, hints))
                lists.append(list(hints))
    summary.sort()
    return lists, reasons, summary


def _merge_permutation(all_nodes: frozenset[int], perm: Sequence[Hint]) -> Hint:
    preferred = True
    satisfied = True
    affinities = [h.affinity for h in perm if h.affinity is not None]
    merged = all_nodes
    for a in affinities:
        merged = merged & a
    if affinities and any(a != affinities[0] for a in affinities):
        preferred = False
    for h in perm:
        if not h.preferred:
            preferred = False
        if h.unsatisfied:
            satisfied = False
    widest = max((len(a) for a in affinities), default=0)
    satisfied = satisfied and (not affinities or widest == len(merged))
    return Hint(merged, preferred, 0, not satisfied)


def numa_node_states(cpusets: Iterable[frozenset[int]], numa_cpus: Mapping[int, frozenset[int]]) -> dict[int, str]:
    """Each NUMA node's state by the placed cpusets (``NodeAllocation.NUMANodeSharedStatus``).

    A cpuset whose CPUs lie on several NUMA nodes makes each of them "shared"; one that lies on
    a single NUMA node makes it "single" unless a spanning cpuset also uses it. NUMA nodes no
    cpuset uses are idle and left out. ``numa_cpus`` maps a NUMA node to its CPUs (CPUs on no
    listed node are skipped).
    """
    states: dict[int, str] = {}
    for cpus in cpusets:
        if not cpus:
            continue
        nodes = [n for n, on_node in numa_cpus.items() if not cpus.isdisjoint(on_node)]
        if len(nodes) > 1:
            for n in nodes:
                states[n] = keys.NUMA_NODE_SHARED
        elif nodes:
            (n,) = nodes
            states.setdefault(n, keys.NUMA_NODE_SINGLE)
    return states


def exclusive_allows(mask: frozenset[int], exclusive: str, states: Mapping[int, str]) -> bool:
    """Whether ``mask`` may stay preferred under ``exclusive`` (``checkExclusivePolicy``).

    Only Required restricts: a one-node mask must not be "shared", a wider mask must hold no
    "single" NUMA node.
    """
    if exclusive != keys.NUMA_EXCLUSIVE_REQUIRED or not states:
        return True
    if len(mask) == 1:
        return all(states.get(n) != keys.NUMA_NODE_SHARED for n in mask)
    return all(states.get(n) != keys.NUMA_NODE_SINGLE for n in mask)


def _best(
    all_nodes: frozenset[int],
    lists: list[list[Hint]],
    exclusive: str = "",
    states: Mapping[int, str] = MappingProxyType({}),
) -> Hint:
    best = Hint(all_nodes, False)
    for perm in itertools.product(*lists):
        merged = _merge_permutation(all_nodes, perm)
        mask = merged.affinity or frozenset()
        if not mask:
            continue
        score = sum(h.score for h in perm if h.affinity is not None and h.affinity == mask)
        preferred = merged.preferred and exclusive_allows(mask, exclusive, states)
        merged = Hint(mask, preferred, score, merged.unsatisfied)
        best_mask = best.affinity or frozenset()
        if merged.preferred and not best.preferred:
            best = merged
            continue
        if best.preferred and not merged.preferred:
            continue
        if not is_narrower(mask, best_mask):
            if len(mask) == len(best_mask) and merged.score > best.score:
                best = merged
            continue
        best = merged
    return best


def merge_hints(
    policy: str,
    nodes: Sequence[int],
    providers: Sequence[ProviderHints],
    *,
    exclusive: str = "",
    states: Mapping[int, str] = MappingProxyType({}),
) -> Merged:
    """Koordinator's topology-manager merge for ``policy`` over every provider's hints.

    ``exclusive`` is the pod's ``singleNUMANodeExclusive`` in force and ``states`` the NUMA
    node states (``numa_node_states``): a merged mask that ``exclusive_allows`` refuses is not
    preferred, so it loses to any preferred one and is not admitted by Restricted or
    SingleNUMANode.

    BestEffort always admits (an unsatisfiable best hint becomes "all NUMA nodes");
    Restricted admits only a preferred merged hint; SingleNUMANode first keeps only preferred
    single-node hints (and "any"), and admits only a preferred result. A merged hint is
    preferred only when every provider's hint in it is preferred and they name the same mask.
    Refusals carry Koordinator's reasons ("Unsatisfied NUMA cpu", "Unaligned NUMA Hint cause
    ...").
    """
    all_nodes = frozenset(nodes)
    lists, reasons, summary = _filter(providers)
    if policy == keys.NUMA_POLICY_SINGLE_NUMA_NODE:
        if reasons:
            return Merged(None, False, False, tuple(reasons))
        single = [
            [h for h in hs if h.preferred and (h.affinity is None or len(h.affinity) == 1)] for hs in lists
        ]
        best = _best(all_nodes, single, exclusive, states)
        affinity: frozenset[int] | None = best.affinity
        if affinity == all_nodes:
            affinity = None
        if not best.preferred:
            return Merged(affinity, False, False, (UNALIGNED.format(",".join(summary)),))
        return Merged(affinity, True, True, score=best.score)
    if policy == keys.NUMA_POLICY_RESTRICTED:
        if reasons:
            return Merged(all_nodes, False, False, tuple(reasons))
        best = _best(all_nodes, lists, exclusive, states)
        if not best.preferred:
            return Merged(best.affinity, False, False, (UNALIGNED.format(" & ".join(summary)),))
        return Merged(best.affinity, True, True, score=best.score)
    best = _best(all_nodes, lists, exclusive, states)
    if best.unsatisfied:
        return Merged(all_nodes, False, True, unsatisfied=True)
    return Merged(best.affinity, best.preferred, True, score=best.score)


def split_quantity(resource: str, left: int, nodes_left: int, *, cpu_bind: bool, full_cores: int) -> int:
    """One NUMA node's share of what is left (``splitQuantity``).

    CPU of a cpuset pod is split in whole CPUs (``left`` in milli-cores, a multiple of 1000),
    and in whole cores of ``full_cores`` threads when FullPCPUs is required (``full_cores`` > 0);
    CPU of other pods in milli-cores; anything else in its own unit.
    """
    if resource != CPU or not cpu_bind:
        return left // nodes_left
    cpus = left // 1000
    if full_cores > 0:
        return (cpus // full_cores // nodes_left) * full_cores * 1000
    return cpus // nodes_left * 1000


@dataclass(frozen=True, slots=True)
class Split:
    """A request spread over NUMA nodes, or the reasons it does not fit."""

    per_node: Mapping[int, Mapping[str, int]]
    reasons: tuple[str, ...] = ()


def distribute_evenly(
    requests: Mapping[str, int],
    available: Mapping[int, Mapping[str, int]],
    mask: frozenset[int],
    *,
    cpu_bind: bool,
    full_cores: int,
) -> Split:
    """``requests`` spread over the NUMA nodes of ``mask`` as ``tryBestToDistributeEvenly``.

    Only resources that some zone reports are spread; a node never gets more than it has
    available, and a resource that does not fit gives the reason "Insufficient NUMA <name>".
    """
    known = {r for amounts in available.values() for r in amounts}
    per_node: dict[int, dict[str, int]] = {}
    reasons: list[str] = []
    nodes = sorted(mask)
    for resource in sorted(requests):
        left = requests[resource]
        if resource not in known or left <= 0:
            continue
        order = sorted(nodes, key=lambda n: available.get(n, {}).get(resource, 0))  # stable: ids
        for i, node in enumerate(order):
            share = split_quantity(resource, left, len(order) - i, cpu_bind=cpu_bind, full_cores=full_cores)
            got = min(available.get(node, {}).get(resource, 0), share)
            if got > 0:
                per_node.setdefault(node, {})[resource] = got
                left -= got
        if left > 0:
            reasons.append(f"Insufficient NUMA {resource}")
    return Split(per_node, tuple(reasons))


def least_allocated_score(requested: Mapping[str, int], capacity: Mapping[str, int]) -> int:
    """0..100 by unused share, averaged over resources (``least_allocated.go``)."""
    total = weight = 0
    for r, req in requested.items():
        cap = capacity.get(r, 0)
        total += 0 if cap == 0 or req > cap else (cap - req) * 100 // cap
        weight += 1
    return total // weight if weight else 0


def most_allocated_score(requested: Mapping[str, int], capacity: Mapping[str, int]) -> int:
    """0..100 by used share, averaged over resources (``most_allocated.go``)."""
    total = weight = 0
    for r, req in requested.items():
        cap = capacity.get(r, 0)
        total += 0 if cap == 0 else min(req, cap) * 100 // cap
        weight += 1
    return total // weight if weight else 0


def mask_score(
    mask: frozenset[int],
    zones: Zones,
    available: Mapping[int, Mapping[str, int]],
    requests: Mapping[str, int],
    strategy: str,
) -> int:
    """How the NUMA scoring strategy ranks ``mask`` for this pod (ties between equal masks)."""
    cap: dict[str, int] = {}
    requested: dict[str, int] = {}
    for node in mask:
        for r, v in zones.get(node, {}).items():
            cap[r] = cap.get(r, 0) + v
            requested[r] = requested.get(r, 0) + max(0, v - available.get(node, {}).get(r, 0))
    for r, v in requests.items():
        if r in requested:
            requested[r] += v
    scorer = most_allocated_score if strategy == keys.MOST_ALLOCATED else least_allocated_score
    return scorer(requested, cap)


def generate_hints(
    zones: Zones,
    available: Mapping[int, Mapping[str, int]],
    requests: Mapping[str, int],
    policy: str,
    fits: Callable[[frozenset[int]], bool],
    *,
    strategy: str = keys.LEAST_ALLOCATED,
) -> dict[str, list[Hint]]:
    """The NUMA provider's hints per requested resource that the zones report.

    A mask is a hint when it holds no NUMA node without that resource available and ``fits``
    (the whole placement, cpuset included, succeeds inside it). Preferred: the narrowest such
    mask, or every mask under Restricted. A reported resource with no hint maps to ``[]``.
    """
    names = sorted(r for r in requests if requests[r] > 0 and any(r in z for z in zones.values()))
    lacking = {
        r: {n for n in zones if available.get(n, {}).get(r, 0) <= 0} for r in names
    }
    found: dict[str, list[tuple[frozenset[int], int]]] = {r: [] for r in names}
    for mask in iterate_masks(list(zones)):
        usable = [r for r in names if not (mask & lacking[r])]
        if not usable or not fits(mask):
            continue
        score = mask_score(mask, zones, available, requests, strategy)
        for r in usable:
            found[r].append((mask, score))
    out: dict[str, list[Hint]] = {}
    for r in names:
        smallest = min((len(m) for m, _ in found[r]), default=0)
        out[r] = [Hint(m, len(m) == smallest or policy == keys.NUMA_POLICY_RESTRICTED, s) for m, s in found[r]]
    return out


def cpu_requests(cpu_milli: int, memory: int) -> dict[str, Any]:
    """The per-NUMA request of a pod: CPU in milli-cores, memory in bytes (zeros dropped)."""
    out: dict[str, Any] = {}
    if cpu_milli > 0:
        out[CPU] = cpu_milli
    if memory > 0:
        out[MEMORY] = memory
    return out
