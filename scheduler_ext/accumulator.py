"""Koordinator's CPU choice for one pod on one node: the accumulator and the required-policy checks.

Who calls this: ``scheduler_ext.admission`` through ``allocate_cpuset`` (once per node, the
pod's share of each hinted NUMA node taken inside that node). Everything here is pure: a
topology value, sets of CPU ids and strings in, a ``frozenset`` out or ``AllocationError``.

The order follows koord-scheduler's ``nodenumaresource/cpu_accumulator.go`` and
``resource_manager.go`` (``allocateCPUSet``), rule for rule:

1. A *required* policy first narrows what may be taken: FullPCPUs keeps only cores whose every
   thread is free; SpreadByPCPUs keeps one CPU per core, the lowest free thread.
2. FullPCPUs (and any policy on a machine without SMT) takes whole free cores: from the first
   NUMA node, in strategy order, whose free cores hold the whole request (first skipping NUMA
   nodes a NUMANodeLevel-exclusive pod already uses, then not), else from the first socket that
   holds it, else from the sockets with the most free cores first, and finally core by core
   from the sockets with the fewest free cores.
3. Any other policy (and FullPCPUs that found no whole cores) takes CPUs spread one per core
   from the first NUMA node that holds the whole request, else from the first socket (each
   time first avoiding exclusive cores and NUMA nodes, then not).
4. What is still missing comes one CPU at a time, spread over cores, from cores ordered by:
   sockets already used by this pod first, then socket and NUMA node free counts by strategy,
   then cores with fewer free threads, then socket id, then core id.

Strategy order ("MostAllocated" packs, anything else spreads, as Koordinator reads the node's
``node.koordinator.sh/numa-allocate-strategy``): NUMA nodes and sockets with the fewest free
CPUs first under MostAllocated, the most free first otherwise; ties by socket free count, then
by id. Every sort here is total (the last key is an id), so the answer never depends on the
order of a set.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from koord_formats import keys
from koord_formats.topology import CPUTopology

__all__ = [
    "AllocationError",
    "ExclusiveUse",
    "allocate_cpuset",
    "filter_required",
    "satisfies_required",
]

NOT_ENOUGH = "not enough cpus available to satisfy request"
FAILED = "failed to allocate cpus"


class AllocationError(Exception):
    """The request cannot be met; the message is Koordinator's reason where it has one."""


@dataclass(frozen=True, slots=True)
class ExclusiveUse:
    """What pods already placed with an exclusive policy hold on the node."""

    cores: frozenset[int] = frozenset()  # core indexes holding a PCPULevel pod's CPU
    numa_nodes: frozenset[int] = frozenset()  # NUMA nodes holding a NUMANodeLevel pod's CPU


NO_EXCLUSIVE = ExclusiveUse()


def _per(total: int, parts: int) -> int:
    return total // parts if parts else 0


class _Accumulator:
    """Builds one answer. ``take`` is the only method that changes the fields."""

    __slots__ = (
        "cpus_per_core",
        "cpus_per_node",
        "cpus_per_socket",
        "excl_cores",
        "excl_numa",
        "exclusive_policy",
        "free",
        "most",
        "needed",
        "result",
        "topo",
    )

    def __init__(
        self,
        topo: CPUTopology,
        available: Iterable[int],
        needed: int,
        exclusive_policy: str,
        strategy: str,
        used: ExclusiveUse,
    ) -> None:
        self.topo = topo  # never changes
        total = len(topo.cpus)
        self.cpus_per_core = max(topo.cpus_per_core, 1)  # never changes
        self.cpus_per_node = _per(total, len(topo.numa_nodes))  # never changes
        self.cpus_per_socket = _per(total, len(topo.sockets))  # never changes
        self.exclusive_policy = exclusive_policy  # never changes
        self.most = strategy == keys.MOST_ALLOCATED  # never changes
        self.free = {c for c in available if c in topo.details}  # shrinks
        self.needed = needed  # counts down
        self.result: set[int] = set()  # grows
        self.excl_cores = set(used.cores)  # grows when this pod is PCPULevel
        self.excl_numa = set(used.numa_nodes)  # grows when this pod is NUMANodeLevel

    # -- the one mutator ----------------------------------------------------------------------
    def take(self, cpus: Iterable[int]) -> None:
        cpus = list(cpus)
        for c in cpus:
            self.result.add(c)
            self.free.discard(c)
            if self.exclusive_policy == keys.EXCLUSIVE_POLICY_PCPU_LEVEL:
                self.excl_cores.add(self.topo.core_of[c])
            elif self.exclusive_policy == keys.EXCLUSIVE_POLICY_NUMA_NODE_LEVEL:
                self.excl_numa.add(self.topo.details[c].node)
        self.needed -= len(cpus)

    # -- predicates ---------------------------------------------------------------------------
    def needs(self, n: int) -> bool:
        return self.needed >= n

    def is_satisfied(self) -> bool:
        return self.needed < 1

    def is_failed(self) -> bool:
        return self.needed > len(self.free)

    def _pcpu_taken(self, c: int) -> bool:
        return self.exclusive_policy == keys.EXCLUSIVE_POLICY_PCPU_LEVEL and self.topo.core_of[c] in self.excl_cores

    def _numa_taken(self, c: int) -> bool:
        return (
            self.exclusive_policy == keys.EXCLUSIVE_POLICY_NUMA_NODE_LEVEL
            and self.topo.details[c].node in self.excl_numa
        )

    # -- orderings ----------------------------------------------------------------------------
    def _by_free(self, count: int) -> int:
        """Sort key for a free count: fewest first when packing, most first otherwise."""
        return count if self.most else -count

    def _cores_of(self, cpus: Iterable[int]) -> dict[int, list[int]]:
        out: dict[int, list[int]] = {}
        for c in sorted(cpus):
            out.setdefault(self.topo.core_of[c], []).append(c)
        return out

    def free_cores_in_node(self, skip_exclusive: bool) -> list[list[int]]:
        """Whole free cores per NUMA node (each node's CPUs core by core), nodes in strategy order."""
        details = self.topo.details
        cpus = [c for c in self.free if not (skip_exclusive and self._numa_taken(c))]
        socket_free: dict[int, int] = {}
        for c in cpus:
            socket_free[details[c].socket] = socket_free.get(details[c].socket, 0) + 1
        per_node: dict[int, list[int]] = {}
        for _core, members in sorted(self._cores_of(cpus).items()):
            if len(members) == self.cpus_per_core:
                per_node.setdefault(details[members[0]].node, []).extend(members)
        order = sorted(
            per_node,
            key=lambda n: (
                self._by_free(len(per_node[n])),
                self._by_free(socket_free.get(details[per_node[n][0]].socket, 0)),
                n,
            ),
        )
        return [per_node[n] for n in order]

    def free_cores_in_socket(self) -> list[list[int]]:
        """Whole free cores per socket, sockets in strategy order."""
        details = self.topo.details
        per_socket: dict[int, list[int]] = {}
        for _core, members in sorted(self._cores_of(self.free).items()):
            if len(members) == self.cpus_per_core:
                per_socket.setdefault(details[members[0]].socket, []).extend(members)
        order = sorted(per_socket, key=lambda s: (self._by_free(len(per_socket[s])), s))
        return [per_socket[s] for s in order]

    def _one_per_core(self, cpus: list[int]) -> list[int]:
        seen: set[int] = set()
        out: list[int] = []
        for c in cpus:
            core = self.topo.core_of[c]
            if core not in seen:
                seen.add(core)
                out.append(c)
        return out

    def free_cpus_in_node(self, skip_exclusive: bool) -> list[list[int]]:
        """Free CPUs per NUMA node, ascending (one per core when skipping exclusive ones)."""
        details = self.topo.details
        per_node: dict[int, list[int]] = {}
        node_free: dict[int, int] = {}
        socket_free: dict[int, int] = {}
        for c in sorted(self.free):
            if skip_exclusive and (self._pcpu_taken(c) or self._numa_taken(c)):
                continue
            info = details[c]
            per_node.setdefault(info.node, []).append(c)
            node_free[info.node] = node_free.get(info.node, 0) + 1
            socket_free[info.socket] = socket_free.get(info.socket, 0) + 1
        if skip_exclusive:
            per_node = {n: self._one_per_core(cpus) for n, cpus in per_node.items()}
        order = sorted(
            per_node,
            key=lambda n: (
                self._by_free(node_free[n]),
                self._by_free(socket_free[details[per_node[n][0]].socket]),
                n,
            ),
        )
        return [per_node[n] for n in order]

    def free_cpus_in_socket(self, skip_exclusive: bool) -> list[list[int]]:
        """Free CPUs per socket, ascending (one per core when skipping exclusive cores)."""
        details = self.topo.details
        per_socket: dict[int, list[int]] = {}
        for c in sorted(self.free):
            if skip_exclusive and self._pcpu_taken(c):
                continue
            per_socket.setdefault(details[c].socket, []).append(c)
        if skip_exclusive:
            per_socket = {s: self._one_per_core(cpus) for s, cpus in per_socket.items()}
        order = sorted(per_socket, key=lambda s: (self._by_free(len(per_socket[s])), s))
        return [per_socket[s] for s in order]

    def free_cpus(self, skip_exclusive: bool) -> list[int]:
        """Every free CPU, core by core, in the order step 4 of the module docstring gives."""
        topo = self.topo
        details = topo.details
        cores: dict[int, list[int]] = {}
        node_free: dict[int, int] = {}
        socket_free: dict[int, int] = {}
        for c in sorted(self.free):
            if skip_exclusive and (self._pcpu_taken(c) or self._numa_taken(c)):
                continue
            info = details[c]
            cores.setdefault(topo.core_of[c], []).append(c)
            node_free[info.node] = node_free.get(info.node, 0) + 1
            socket_free[info.socket] = socket_free.get(info.socket, 0) + 1
        colo = {s: len(topo.socket_cpus[s] & self.result) for s in socket_free}

        def key(core: int) -> tuple[int, int, int, int, int, int]:
            info = details[cores[core][0]]
            return (
                -colo[info.socket],
                self._by_free(socket_free[info.socket]),
                self._by_free(node_free[info.node]),
                len(cores[core]),
                info.socket,
                core,
            )

        out: list[int] = []
        for core in sorted(cores, key=key):
            out.extend(cores[core])
        return out

    def spread(self, cpus: list[int]) -> list[int]:
        """Reorder so that each pass takes one CPU of every core before any core's second."""
        if len(cpus) <= self.cpus_per_core:
            return cpus
        out: list[int] = []
        pending = cpus
        while pending:
            seen: set[int] = set()
            later: list[int] = []
            for c in pending:
                core = self.topo.core_of[c]
                if core in seen:
                    later.append(c)
                else:
                    seen.add(core)
                    out.append(c)
            pending = later
        return out


def _first_fit(acc: _Accumulator, groups: list[list[int]], shape: Callable[[list[int]], list[int]]) -> bool:
    """Take the request from the first group that holds it whole; True when it did."""
    for cpus in groups:
        if len(cpus) >= acc.needed:
            acc.take(shape(cpus)[: acc.needed])
            return True
    return False


def _whole_cores(acc: _Accumulator) -> bool:
    """Step 2 of the module docstring; True when the request is met."""
    if acc.needed <= acc.cpus_per_node:
        for skip in (True, False):
            if _first_fit(acc, acc.free_cores_in_node(skip), list):
                return True
    if acc.needed <= acc.cpus_per_socket and _first_fit(acc, acc.free_cores_in_socket(), list):
        return True
    groups = sorted(acc.free_cores_in_socket(), key=lambda g: -len(g))  # stable: ties keep order
    left_over: list[list[int]] = []
    for cpus in groups:
        if not acc.needs(len(cpus)):
            left_over.append(cpus)
            continue
        acc.take(cpus)
        if acc.is_satisfied():
            return True
    step = acc.cpus_per_core
    if acc.needs(step):
        for cpus in sorted(left_over, key=len):
            for i in range(0, len(cpus), step):
                acc.take(cpus[i : i + step])
                if acc.is_satisfied():
                    return True
                if not acc.needs(step):
                    break
    return False


def _spread_whole(acc: _Accumulator) -> bool:
    """Step 3 of the module docstring; True when the request is met."""
    if acc.needed <= acc.cpus_per_node:
        for skip in (True, False):
            if _first_fit(acc, acc.free_cpus_in_node(skip), acc.spread):
                return True
    if acc.needed <= acc.cpus_per_socket:
        for skip in (True, False):
            if _first_fit(acc, acc.free_cpus_in_socket(skip), acc.spread):
                return True
    return False


def _take_cpus(
    topo: CPUTopology,
    available: Iterable[int],
    n: int,
    *,
    bind_policy: str = keys.BIND_POLICY_FULL_PCPUS,
    exclusive_policy: str = keys.EXCLUSIVE_POLICY_NONE,
    strategy: str = keys.MOST_ALLOCATED,
    used: ExclusiveUse = NO_EXCLUSIVE,
) -> frozenset[int]:
    """Exactly ``n`` CPUs of ``available`` chosen as Koordinator's ``takeCPUs``, or
    ``AllocationError``. ``used`` says which cores and NUMA nodes exclusive pods hold."""
    acc = _Accumulator(topo, available, n, exclusive_policy, strategy, used)
    if acc.is_satisfied():
        return frozenset()
    if acc.is_failed():
        raise AllocationError(NOT_ENOUGH)
    full = bind_policy == keys.BIND_POLICY_FULL_PCPUS
    if (full or acc.cpus_per_core == 1) and _whole_cores(acc):
        return frozenset(acc.result)
    if not full and _spread_whole(acc):
        return frozenset(acc.result)
    for skip in (True, False):
        for c in acc.spread(acc.free_cpus(skip)):
            if acc.needs(1):
                acc.take((c,))
            if acc.is_satisfied():
                return frozenset(acc.result)
    raise AllocationError(FAILED)


def _take_preferred_cpus(
    topo: CPUTopology,
    available: frozenset[int],
    preferred: frozenset[int],
    n: int,
    *,
    bind_policy: str = keys.BIND_POLICY_FULL_PCPUS,
    exclusive_policy: str = keys.EXCLUSIVE_POLICY_NONE,
    strategy: str = keys.MOST_ALLOCATED,
    used: ExclusiveUse = NO_EXCLUSIVE,
) -> frozenset[int]:
    """``_take_cpus`` that first takes what it can of ``preferred`` (a reservation's CPUs), by the
    same rules inside it, and only the rest from the other available CPUs
    (``takePreferredCPUs``)."""
    inside = available & preferred
    if not inside:
        return _take_cpus(topo, available, n, bind_policy=bind_policy, exclusive_policy=exclusive_policy,
                         strategy=strategy, used=used)
    result = _take_cpus(topo, inside, min(n, len(inside)), bind_policy=bind_policy,
                       exclusive_policy=exclusive_policy, strategy=strategy, used=used)
    if n > len(result):
        result |= _take_cpus(topo, available - result, n - len(result), bind_policy=bind_policy,
                            exclusive_policy=exclusive_policy, strategy=strategy, used=used)
    return result


def filter_required(topo: CPUTopology, policy: str, available: frozenset[int]) -> frozenset[int]:
    """What a required ``policy`` may take: whole free cores (FullPCPUs) or the lowest free
    thread of every core (SpreadByPCPUs); any other policy leaves ``available`` as it is."""
    if policy not in (keys.BIND_POLICY_FULL_PCPUS, keys.BIND_POLICY_SPREAD_BY_PCPUS):
        return available
    cores: dict[int, list[int]] = {}
    for c in sorted(available):
        core = topo.core_of.get(c)
        if core is not None:
            cores.setdefault(core, []).append(c)
    out: set[int] = set()
    per_core = max(topo.cpus_per_core, 1)
    for members in cores.values():
        if policy == keys.BIND_POLICY_SPREAD_BY_PCPUS:
            out.add(members[0])
        elif len(members) == per_core:
            out.update(members)
    return frozenset(out)


def satisfies_required(topo: CPUTopology, policy: str, cpus: frozenset[int]) -> bool:
    """FullPCPUs: only whole cores; SpreadByPCPUs: never two threads of one core."""
    cores = {topo.core_of[c] for c in cpus}
    if policy == keys.BIND_POLICY_FULL_PCPUS:
        return len(cores) * max(topo.cpus_per_core, 1) == len(cpus)
    if policy == keys.BIND_POLICY_SPREAD_BY_PCPUS:
        return len(cores) == len(cpus)
    return True


def _splits_a_core(topo: CPUTopology, cpus: frozenset[int]) -> bool:
    """Some CPU of ``cpus`` has a thread sibling outside it."""
    return any(not topo.core_cpus[topo.core_of[c]] <= cpus for c in cpus)


def allocate_cpuset(
    topo: CPUTopology,
    available: frozenset[int],
    n: int,
    *,
    bind_policy: str,
    required: bool,
    exclusive_policy: str = keys.EXCLUSIVE_POLICY_NONE,
    strategy: str = keys.MOST_ALLOCATED,
    used: ExclusiveUse = NO_EXCLUSIVE,
    numa_cpus: dict[int, int] | None = None,
    preferred: frozenset[int] = frozenset(),
    eligible: frozenset[int] | None = None,
    choose: bool = True,
) -> frozenset[int]:
    """The cpuset of a pod as Koordinator's ``allocateCPUSet`` chooses it, or ``AllocationError``.

    ``numa_cpus`` (NUMA node -> whole CPUs) is the pod's share of each hinted NUMA node from
    ``scheduler_ext.numa.distribute_evenly``: each share is taken inside its node with the bind
    policy honoured there, and the shares must add up to ``n``. ``preferred`` CPUs (those of
    the reservation the pod allocates from) are taken first (``_take_preferred_cpus``).
    ``eligible`` is what a required policy may take of ``available`` (``filter_required``),
    when the caller already knows it.

    The one feasibility rule of filter and bind: with ``choose=False`` (filter and prioritize)
    the same checks run in the same order and raise the same ``AllocationError``, and the
    answer is ``frozenset()`` where the choice would succeed. The CPUs are only counted: every
    step of the choice takes any eligible CPU it is offered, and a required policy's eligible
    CPUs already have its shape, so enough of them is enough. Where counting cannot tell,
    required FullPCPUs for a request that is not whole cores or whose preferred CPUs (taken
    first) hold part of a free core, the choice runs.
    """
    if eligible is None:
        eligible = filter_required(topo, bind_policy, available) if required else available
    if len(eligible) < n:
        raise AllocationError(NOT_ENOUGH)
    full_cores = required and bind_policy == keys.BIND_POLICY_FULL_PCPUS
    per_core = max(topo.cpus_per_core, 1)
    if not choose and not (full_cores and (n % per_core or _splits_a_core(topo, eligible & preferred))):
        if numa_cpus:
            shares = [
                min(len(eligible & topo.numa_cpus.get(node, frozenset())), numa_cpus[node]) for node in numa_cpus
            ]
            if sum(shares) != n:
                raise AllocationError(NOT_ENOUGH)
            if full_cores and any(k % per_core for k in shares):
                raise AllocationError(_unsatisfied(bind_policy))
        return frozenset()
    result: frozenset[int] = frozenset()
    needed = n
    if numa_cpus:
        for node in sorted(numa_cpus):
            inside = eligible & topo.numa_cpus.get(node, frozenset())
            count = min(len(inside), numa_cpus[node])
            result |= _take_preferred_cpus(
                topo, inside, preferred, count, bind_policy=bind_policy, exclusive_policy=exclusive_policy,
                strategy=strategy, used=used,
            )
        needed -= len(result)
        if needed != 0:
            raise AllocationError(NOT_ENOUGH)
    if needed > 0:
        result |= _take_preferred_cpus(
            topo, eligible - result, preferred, needed, bind_policy=bind_policy,
            exclusive_policy=exclusive_policy, strategy=strategy, used=used,
        )
    if required and not satisfies_required(topo, bind_policy, result):
        raise AllocationError(_unsatisfied(bind_policy))
    return result if choose else frozenset()


def _unsatisfied(bind_policy: str) -> str:
    return f"insufficient CPUs to satisfy required cpu bind policy {bind_policy}"
