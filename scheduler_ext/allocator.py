"""Pure allocation: GPU hints and GPU choice for one pod; CPU choice lives in
``scheduler_ext.accumulator``.

Who calls this: ``scheduler_ext.decide`` asks for GPU hints while filtering (they join the
NUMA merge of ``scheduler_ext.numa``) and for exact GPUs while binding and simulating. Every
function takes values and returns values; nothing here knows about nodes, pods or the API.

Terms:

- *affinity*: a set of NUMA node ids; ``None`` means "any".
- *hint*: an affinity plus ``preferred``, as in kubelet's Topology Manager: the GPU provider
  returns every affinity with enough GPUs that fit the request now; ``preferred`` marks those
  as narrow as the smallest set of NUMA nodes whose GPUs could ever hold it.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from koord_formats import keys
from scheduler_ext.accumulator import AllocationError
from scheduler_ext.pods import GPURequest
from scheduler_ext.topology import GPUDevice

__all__ = [
    "AllocationError",
    "GPUGrant",
    "GPUUsage",
    "Hint",
    "gpu_fits",
    "gpu_hints",
    "numa_masks",
    "take_gpus",
]


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


def _gpu_order_key(
    gpu: GPUDevice, used: GPUUsage, strategy: str, in_affinity: bool
) -> tuple[int, int, int, int]:
    free_core = gpu.core - used.core
    return (
        0 if in_affinity else 1,
        1 if used.idle else 0,  # partially used GPUs first: keep whole GPUs free
        -free_core if strategy == keys.LEAST_ALLOCATED else free_core,
        gpu.minor,
    )


def take_gpus(
    gpus: Sequence[GPUDevice],
    usage: Mapping[int, GPUUsage],
    req: GPURequest,
    *,
    affinity: frozenset[int] | None = None,
    strict: bool = False,
    strategy: str = keys.LEAST_ALLOCATED,
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
