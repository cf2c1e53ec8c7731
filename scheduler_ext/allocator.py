"""Pure allocation: NUMA hints and their merging, then exact CPUs and GPUs for one pod.

Who calls this: ``scheduler_ext.extender`` asks for hints while filtering (from per-NUMA free
counts only, so the filter stays cheap) and for exact CPUs and GPUs while binding and
simulating. Every function takes values and returns values; nothing here knows about nodes,
pods or the API.

Terms:

- *available*: the CPUs a pod may be given on a node (bindable CPUs minus those already held).
- *affinity*: a set of NUMA node ids; ``None`` means "any".
- *hint*: an affinity plus ``preferred``, as in kubelet's Topology Manager. A provider (CPU,
  GPU, shared CPU) returns every affinity that could satisfy its request; ``preferred`` marks
  those as narrow as the smallest set of NUMA nodes whose capacity could hold the request.

CPU order (``take_cpus``), in the spirit of kubelet's ``takeByTopologyNUMAPacked``:

1. NUMA nodes are ordered once: nodes that alone can hold the request first, then by the
   node's ``numa-allocate-strategy`` (MostAllocated: fewest free CPUs first; LeastAllocated:
   most free first), ties by id.
2. FullPCPUs: whole free NUMA nodes while the request covers one, then whole free cores, then
   (only when not required) single CPUs from the fullest partially used cores.
3. SpreadByPCPUs: round-robin one CPU per core, fully free cores first.
4. A preferred exclusive policy first tries without the CPUs it should avoid, then with them.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from scheduler_ext.pods import GPURequest
from scheduler_ext.topology import CPUTopology, GPUDevice

__all__ = [
    "AllocationError",
    "GPUGrant",
    "GPUUsage",
    "Hint",
    "admits",
    "cpu_hints",
    "gpu_fits",
    "gpu_hints",
    "merge_hints",
    "numa_masks",
    "order_numa",
    "take_cpus",
    "take_gpus",
]

MOST_ALLOCATED = "MostAllocated"
LEAST_ALLOCATED = "LeastAllocated"


class AllocationError(Exception):
    """The request cannot be met; the message gives the numbers involved."""


@dataclass(frozen=True, slots=True)
class Hint:
    """A NUMA affinity (``None`` = any node) and whether it is as narrow as possible."""

    affinity: frozenset[int] | None
    preferred: bool


@functools.lru_cache(maxsize=64)
def numa_masks(nodes: tuple[int, ...]) -> tuple[frozenset[int], ...]:
    """Every non-empty subset of ``nodes``, smallest first, then in lexicographic order."""
    out: list[frozenset[int]] = []
    for size in range(1, len(nodes) + 1):
        out.extend(frozenset(c) for c in itertools.combinations(nodes, size))
    return tuple(out)


def _hints(
    nodes: tuple[int, ...], capacity: Mapping[int, int], free: Mapping[int, int], need: int
) -> list[Hint]:
    masks = numa_masks(nodes)
    min_size = len(nodes) + 1
    found: list[frozenset[int]] = []
    for mask in masks:
        if sum(capacity.get(n, 0) for n in mask) >= need:
            min_size = min(min_size, len(mask))
        if sum(free.get(n, 0) for n in mask) >= need:
            found.append(mask)
    return [Hint(m, len(m) == min_size) for m in found]


def cpu_hints(
    nodes: tuple[int, ...], capacity: Mapping[int, int], free: Mapping[int, int], need: int
) -> list[Hint]:
    """Hints for ``need`` units (CPUs, or milli-CPUs for shared pods) from per-NUMA counts.

    ``capacity`` is what each NUMA node could ever offer (sets "preferred"), ``free`` what it
    offers now (sets which affinities appear). An empty list means "cannot be satisfied".
    """
    return _hints(nodes, capacity, free, need)


@dataclass(frozen=True, slots=True)
class GPUUsage:
    """What is already handed out on one GPU."""

    core: int = 0
    ratio: int = 0
    memory: int = 0

    def plus(self, core: int, ratio: int, memory: int) -> GPUUsage:
        return GPUUsage(self.core + core, self.ratio + ratio, self.memory + memory)

    def minus(self, core: int, ratio: int, memory: int) -> GPUUsage:
        return GPUUsage(self.core - core, self.ratio - ratio, self.memory - memory)

    @property
    def idle(self) -> bool:
        return self.core <= 0 and self.ratio <= 0 and self.memory <= 0


@dataclass(frozen=True, slots=True)
class GPUGrant:
    """One GPU given to a pod, with both memory forms filled in."""

    minor: int
    core: int
    ratio: int
    memory: int


def grant_for(gpu: GPUDevice, req: GPURequest) -> GPUGrant:
    """The per-GPU amounts ``req`` takes on ``gpu``: ratio from bytes or bytes from ratio."""
    if req.memory:
        ratio = -(-req.memory * 100 // gpu.memory) if gpu.memory else 100
        memory = req.memory
    else:
        ratio = req.ratio
        memory = req.ratio * gpu.memory // 100
    return GPUGrant(gpu.minor, req.core, ratio, memory)


def gpu_fits(gpu: GPUDevice, used: GPUUsage, req: GPURequest) -> bool:
    """Whether one more share of ``req`` fits on ``gpu`` without passing 100%."""
    if not gpu.healthy:
        return False
    if req.exclusive:
        return used.idle
    g = grant_for(gpu, req)
    return (
        used.core + g.core <= gpu.core
        and used.ratio + g.ratio <= gpu.ratio
        and (gpu.memory == 0 or used.memory + g.memory <= gpu.memory)
    )


def gpu_hints(
    gpus: Sequence[GPUDevice], usage: Mapping[int, GPUUsage], req: GPURequest
) -> list[Hint] | None:
    """GPU hints, or ``None`` (no preference) when the inventory has no NUMA information."""
    nodes = tuple(sorted({g.numa for g in gpus if g.numa >= 0}))
    if not nodes:
        return None
    capacity: dict[int, int] = {}
    free: dict[int, int] = {}
    empty = GPUUsage()
    for g in gpus:
        if g.numa < 0 or not g.healthy:
            continue
        capacity[g.numa] = capacity.get(g.numa, 0) + 1
        if gpu_fits(g, usage.get(g.minor, empty), req):
            free[g.numa] = free.get(g.numa, 0) + 1
    return _hints(nodes, capacity, free, req.count)


def _better(candidate: Hint, best: Hint) -> bool:
    if candidate.preferred != best.preferred:
        return candidate.preferred
    cand_size = len(candidate.affinity or ())
    best_size = len(best.affinity or ())
    return cand_size < best_size


def merge_hints(
    policy: str, providers: Sequence[list[Hint] | None], nodes: tuple[int, ...]
) -> Hint:
    """Merge per-provider hints as kubelet's Topology Manager intends and return the best one.

    ``None`` from a provider means "no preference"; an empty list means "cannot be satisfied".
    Under SingleNUMANode only preferred hints of one NUMA node survive first. A candidate
    affinity must be one that *every* provider can be satisfied inside (its hint list holds
    that exact mask, hint lists being complete and monotone); it is preferred when every
    provider marks that mask preferred. Best: preferred, then narrower, then the first mask.

    This differs from kubelet's permutation AND in one way, on purpose: kubelet can merge
    {0} (CPU) with {0,1} (two GPUs, one per node) into a "preferred" {0} that the GPUs cannot
    meet, and then allocate unaligned devices. Here that pod gets {0,1}, not preferred.
    """
    all_nodes = frozenset(nodes)
    tables: list[dict[frozenset[int], bool]] = []
    for hints in providers:
        if hints is None:
            continue
        if policy == "SingleNUMANode":
            hints = [
                h for h in hints if h.preferred and (h.affinity is None or len(h.affinity) == 1)
            ]
        table: dict[frozenset[int], bool] = {}
        for h in hints:
            mask = all_nodes if h.affinity is None else h.affinity
            table[mask] = table.get(mask, False) or h.preferred
        tables.append(table)
    if not tables:
        return Hint(all_nodes, True)
    best = Hint(all_nodes, False)
    for mask in numa_masks(nodes):
        if all(mask in t for t in tables):
            candidate = Hint(mask, all(t[mask] for t in tables))
            if _better(candidate, best):
                best = candidate
    return best


def admits(policy: str, hint: Hint) -> bool:
    """Admission as in kubelet: Restricted and SingleNUMANode need a preferred hint."""
    if policy in ("Restricted", "SingleNUMANode"):
        return hint.preferred
    return True


def order_numa(
    nodes: Iterable[int], free: Mapping[int, int], need: int, strategy: str
) -> list[int]:
    """NUMA nodes that alone hold ``need`` first, then by strategy, ties by id."""
    sign = -1 if strategy == LEAST_ALLOCATED else 1
    return sorted(nodes, key=lambda n: (free.get(n, 0) < need, sign * free.get(n, 0), n))


class _Accumulator:
    """Builds one CPU answer. ``take`` is the only method that changes the fields."""

    __slots__ = ("free", "needed", "result", "topo")

    def __init__(self, topo: CPUTopology, free: frozenset[int], needed: int) -> None:
        self.topo = topo  # never changes
        self.free = set(free)  # shrinks
        self.needed = needed  # counts down
        self.result: set[int] = set()  # grows

    def take(self, cpus: Iterable[int]) -> None:
        cpus = set(cpus)
        self.result |= cpus
        self.free -= cpus
        self.needed -= len(cpus)

    def is_satisfied(self) -> bool:
        return self.needed <= 0


def _take_packed(acc: _Accumulator, order: list[int], full_cores_only: bool) -> None:
    topo = acc.topo
    for n in order:
        cpus = topo.numa_cpus[n]
        if acc.needed >= len(cpus) and cpus <= acc.free:
            acc.take(cpus)
    for n in order:
        for core in topo.cores_in_numa[n]:
            cpus = topo.core_cpus[core]
            if acc.is_satisfied():
                return
            if acc.needed >= len(cpus) and cpus <= acc.free:
                acc.take(cpus)
    if acc.is_satisfied() or full_cores_only:
        return
    rank = {n: i for i, n in enumerate(order)}
    cores = sorted(
        {topo.core_of[c] for c in acc.free},
        key=lambda k: (
            rank.get(topo.details[min(topo.core_cpus[k])].node, len(rank)),
            len(topo.core_cpus[k] & acc.free),
            k,
        ),
    )
    for core in cores:
        for cpu in sorted(topo.core_cpus[core] & acc.free):
            if acc.is_satisfied():
                return
            acc.take((cpu,))


def _take_spread(acc: _Accumulator, order: list[int]) -> None:
    topo = acc.topo
    rank = {n: i for i, n in enumerate(order)}
    cores = sorted(
        {topo.core_of[c] for c in acc.free},
        key=lambda k: (
            rank.get(topo.details[min(topo.core_cpus[k])].node, len(rank)),
            -len(topo.core_cpus[k] & acc.free),
            k,
        ),
    )
    lanes = [sorted(topo.core_cpus[k] & acc.free) for k in cores]
    depth = max((len(lane) for lane in lanes), default=0)
    for level in range(depth):
        for lane in lanes:
            if acc.is_satisfied():
                return
            if level < len(lane):
                acc.take((lane[level],))


def _take_once(
    topo: CPUTopology,
    available: frozenset[int],
    n: int,
    bind_policy: str,
    required: bool,
    strategy: str,
) -> frozenset[int] | None:
    if len(available) < n:
        return None
    free = {k: len(available & topo.numa_cpus[k]) for k in topo.numa_nodes}
    order = order_numa(topo.numa_nodes, free, n, strategy)
    acc = _Accumulator(topo, available, n)
    if bind_policy == "SpreadByPCPUs":
        _take_spread(acc, order)
    else:
        _take_packed(acc, order, full_cores_only=required)
    return frozenset(acc.result) if acc.is_satisfied() else None


def take_cpus(
    topo: CPUTopology,
    available: frozenset[int],
    n: int,
    *,
    bind_policy: str = "FullPCPUs",
    required: bool = False,
    strategy: str = MOST_ALLOCATED,
    affinity: frozenset[int] | None = None,
    strict: bool = False,
    avoid: frozenset[int] = frozenset(),
) -> frozenset[int]:
    """Exactly ``n`` CPUs from ``available``, or ``AllocationError``.

    ``required`` FullPCPUs needs ``n`` to be a multiple of the threads per core and only
    whole free cores. ``affinity`` with ``strict`` keeps every CPU inside those NUMA nodes;
    without ``strict`` it takes as many as it can inside them first (BestEffort). ``avoid``
    (a preferred exclusive policy) is honoured when possible.
    """
    if n <= 0:
        return frozenset()
    if required and bind_policy == "FullPCPUs" and n % topo.cpus_per_core:
        raise AllocationError(
            f"FullPCPUs: {n} CPUs is not a multiple of {topo.cpus_per_core} threads per core"
        )
    pools: list[frozenset[int]] = []
    if affinity is not None:
        pools.append(available & topo.cpus_in_numa(affinity))
    if affinity is None or not strict:
        pools.append(available)  # BestEffort: aligned first, then anywhere
    for pool in pools:
        for candidate in ((pool - avoid), pool) if avoid else (pool,):
            got = _take_once(topo, candidate, n, bind_policy, required, strategy)
            if got is not None:
                return got
    where = f" in NUMA {sorted(affinity)}" if affinity is not None and strict else ""
    raise AllocationError(
        f"{bind_policy}{' (required)' if required else ''}: need {n} CPUs, "
        f"{len(pools[0])} available{where}"
    )


def _gpu_order_key(
    gpu: GPUDevice, used: GPUUsage, strategy: str, in_affinity: bool
) -> tuple[int, int, int, int]:
    free_core = gpu.core - used.core
    return (
        0 if in_affinity else 1,
        1 if used.idle else 0,  # partially used GPUs first: keep whole GPUs free
        -free_core if strategy == LEAST_ALLOCATED else free_core,
        gpu.minor,
    )


def take_gpus(
    gpus: Sequence[GPUDevice],
    usage: Mapping[int, GPUUsage],
    req: GPURequest,
    *,
    affinity: frozenset[int] | None = None,
    strict: bool = False,
    strategy: str = LEAST_ALLOCATED,
) -> tuple[GPUGrant, ...]:
    """``req.count`` GPUs, each with room for one share of ``req``, or ``AllocationError``.

    Candidates outside ``affinity`` are dropped when ``strict`` and ranked last otherwise.
    Partially used GPUs come before whole free ones (fragmentation), then ``strategy`` on free
    GPU core decides, then the minor. Several GPUs come from one PCIe switch when one switch
    (the smallest that is big enough) can hold them all.
    """
    empty = GPUUsage()
    cands: list[tuple[tuple[int, int, int, int], GPUDevice]] = []
    for g in gpus:
        used = usage.get(g.minor, empty)
        if not gpu_fits(g, used, req):
            continue
        inside = affinity is None or g.numa in affinity
        if strict and not inside:
            continue
        cands.append((_gpu_order_key(g, used, strategy, inside), g))
    if len(cands) < req.count:
        raise AllocationError(
            f"GPU: need {req.count} GPU(s) with core {req.core}% "
            f"{'ratio ' + str(req.ratio) + '%' if req.ratio else 'memory ' + str(req.memory)}, "
            f"{len(cands)} fit{' in NUMA ' + str(sorted(affinity)) if affinity and strict else ''}"
        )
    cands.sort(key=lambda kg: kg[0])
    chosen: list[GPUDevice] = [g for _, g in cands[: req.count]]
    if req.count > 1:
        groups: dict[tuple[int, int, str], list[GPUDevice]] = {}
        for key, g in cands:
            if g.pcie:
                groups.setdefault((key[0], g.numa, g.pcie), []).append(g)
        fitting = [(len(v), k, v) for k, v in groups.items() if len(v) >= req.count]
        if fitting:
            fitting.sort(key=lambda t: (t[1][0], t[0], t[1]))
            chosen = fitting[0][2][: req.count]
    return tuple(grant_for(g, req) for g in sorted(chosen, key=lambda g: g.minor))
