"""The node's CPU share pools and the cpusets bound to pods: a pod's resource-status, the LS and
BE share pools as koordlet computes them (or as the NodeResourceTopology says), the system-QoS
and kubelet-static CPUs, and the one rule for which resource-status cpusets the node trusts
(signature, QoS class, CPUs on the node, no overlap with an older claim). Every helper that
reads an annotation raises only ``koord_formats.FormatError``. Import the names from
``hooks.facts``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from types import MappingProxyType

from hooks.facts.types import NodeFacts, PodFacts
from hooks.signatures import ACCEPT_UNSIGNED, BAD, SIGNED, UNSIGNED, AllocationKeys, verify_allocation
from koord_formats import keys, node, pod
from koord_formats import signature as signature_format
from koord_formats.cpulist import format_cpu_list
from koord_formats.errors import FormatError
from koord_formats.node import CPUSharePool
from koord_formats.pod import ResourceStatus

# ---- the pod's scheduler decision and the node's share pools ----------------------------------


def pod_resource_status(annotations: Mapping[str, str]) -> ResourceStatus | None:
    """The pod's ``scheduling.koordinator.sh/resource-status``; ``None`` when absent or empty,
    ``FormatError`` when malformed (memoised by the annotation text)."""
    raw = annotations.get(keys.ANNOTATION_RESOURCE_STATUS)
    if not raw:
        return None
    return pod.parse_resource_status(raw)


def system_qos_cpuset(node_facts: NodeFacts) -> frozenset[int]:
    """CPUs of ``node.koordinator.sh/system-qos-resource`` for SYSTEM pods, exclusive or not
    (``FormatError`` when malformed)."""
    raw = node_facts.annotations.get(keys.NODE_ANNOTATION_SYSTEM_QOS_RESOURCE)
    return node.parse_system_qos_resource(raw).cpuset if raw else frozenset()


def _exclusive_system_cpus(node_facts: NodeFacts) -> frozenset[int]:
    raw = node_facts.annotations.get(keys.NODE_ANNOTATION_SYSTEM_QOS_RESOURCE)
    return node.parse_system_qos_resource(raw).exclusive_cpus if raw else frozenset()


def _reserved_cpus(node_facts: NodeFacts) -> frozenset[int]:
    raw = node_facts.annotations.get(keys.NODE_ANNOTATION_RESERVATION)
    return node.parse_node_reservation(raw).reserved_cpus if raw else frozenset()


def kubelet_cpu_manager_policy(node_facts: NodeFacts) -> str:
    """kubelet's CPU manager policy from the NRT annotation ("none" when unknown or malformed)."""
    raw = node_facts.annotations.get(keys.NODE_ANNOTATION_KUBELET_CPU_MANAGER_POLICY)
    if not raw:
        return "none"
    try:
        return node.parse_kubelet_cpu_manager_policy(raw).policy
    except FormatError:
        return "none"


def _kubelet_allocated_cpus(node_facts: NodeFacts) -> frozenset[int]:
    raw = node_facts.annotations.get(keys.NODE_ANNOTATION_POD_CPU_ALLOCS)
    if not raw:
        return frozenset()
    out: set[int] = set()
    for alloc in node.parse_pod_cpu_allocs(raw):
        if alloc.managed_by_kubelet:
            out |= alloc.cpus
    return frozenset(out)


def compute_share_pools(node_facts: NodeFacts, *, be: bool = False) -> tuple[CPUSharePool, ...]:
    """Share pools computed as koordlet does (``calCPUSharePools``), from ``node.cpu_topology``.

    LS pool: all CPUs minus every bound cpuset (LSE and LSR) and kubelet-static allocations.
    BE pool: all CPUs minus the LSE cpusets only (LSR cores are lent to BE).
    Both minus the reservation's ``reservedCPUs`` and the system-QoS CPUs when they are
    exclusive (the default), grouped per (socket, NUMA node). Empty when the topology is
    unknown. ``FormatError`` on malformed annotations.
    """
    topo = node_facts.cpu_topology
    if topo is None or not topo.cpus:
        return ()
    taken: set[int] = set()
    for uid, cpus in node_facts.bound_cpusets.items():
        if not be or uid in node_facts.lse_pods:
            taken |= cpus
    if not be:
        taken |= _kubelet_allocated_cpus(node_facts)
    taken |= _reserved_cpus(node_facts)
    taken |= _exclusive_system_cpus(node_facts)
    groups: dict[tuple[int, int], set[int]] = {}
    for c in topo.infos:
        if c.id not in taken:
            groups.setdefault((c.socket, c.node), set()).add(c.id)
    return tuple(CPUSharePool(s, n, frozenset(cpus)) for (s, n), cpus in sorted(groups.items()))


def share_pools(node_facts: NodeFacts, *, be: bool = False) -> tuple[CPUSharePool, ...]:
    """The node's LS (or BE) share pools: the NodeResourceTopology annotation when present,
    else ``compute_share_pools``. ``FormatError`` when an annotation is malformed."""
    key = keys.NODE_ANNOTATION_BE_CPU_SHARED_POOLS if be else keys.NODE_ANNOTATION_CPU_SHARED_POOLS
    raw = node_facts.annotations.get(key)
    if raw:
        return node.parse_share_pools(raw)
    return compute_share_pools(node_facts, be=be)


def all_share_pool_cpus(pools: Iterable[CPUSharePool]) -> frozenset[int]:
    """Every CPU of ``pools``."""
    out: set[int] = set()
    for p in pools:
        out |= p.cpus
    return frozenset(out)


# ---- which resource-status cpusets the node trusts ---------------------------------------------
#
# The one rule for the node side of a scheduler-owned CPU allocation. The annotation is written
# by whoever creates or binds the pod, so the node trusts a ``cpuset`` in
# ``scheduling.koordinator.sh/resource-status`` only when (0) the claim is proven
# (``allocation_refusal``: with public keys in ``NodeFacts.allocation_keys``, the pod's allocation
# signature verifies for this pod on this node and the cpuset has no more CPUs than the CPU
# request it states; without keys, or with ``acceptUnsigned``, an unsigned claim passes, one
# whose signature a held key refutes does not), (1) the pod's raw QoS label is LSE or
# LSR (Koordinator's scheduler binds CPUs for no other class: ``AllowUseCPUSet`` in
# ``nodenumaresource``), (2) every CPU is one of the node's CPUs (when the topology is known) and
# (3) no CPU is held by another pod whose claim the node accepted before (the older pod keeps
# them). An untrusted cpuset is ignored: the pod is pinned and its quota decided as if it had no
# cpuset (LS, BE and label-less pods always keep their quota). Pods created with
# ``spec.nodeName`` are judged alike: the node cannot tell how a pod was placed.

# The raw QoS labels whose pods may hold a resource-status cpuset.
CPUSET_QOS_CLASSES = frozenset({keys.QOS_LSE, keys.QOS_LSR})


def _verify(
    keys_: AllocationKeys, uid: str, namespace: str, name: str, node_name: str, signed: tuple[tuple[str, str], ...]
) -> tuple[str, int | None, str]:
    v = verify_allocation(keys_, uid=uid, namespace=namespace, name=name, node=node_name, annotations=dict(signed))
    return v.kind, v.cpu_milli, v.reason


# ``_verify`` once per distinct input (the stages and loops ask again and again), for inputs of
# at most ``_CACHED_CHARS`` characters: a hostile pod's huge annotation is verified each time
# (its own cost) instead of being kept alive by the cache.
_verdict = lru_cache(maxsize=4096)(_verify)
_CACHED_CHARS = 8192
_SIGNATURE_INPUTS = (keys.ANNOTATION_ALLOCATION_SIGNATURE, *signature_format.SIGNED_ANNOTATIONS)


def allocation_refusal(pod_facts: PodFacts, cpus: frozenset[int], keys_: AllocationKeys, node_name: str) -> str:
    """Why ``pod_facts``'s claim of ``cpus`` on the node ``node_name`` is not proven (rule 0 of the
    section above), "" when it is: a signature that verifies with ``keys_`` and states a CPU
    request of at least ``cpus`` CPUs; or, when ``keys_`` accepts unsigned claims, no signature
    that a held key refutes."""
    if keys_.accept_unsigned and not keys_.public_keys:
        return ""
    signed = tuple((k, pod_facts.annotations[k]) for k in _SIGNATURE_INPUTS if k in pod_facts.annotations)
    verify = _verdict if sum(len(v) for _, v in signed) <= _CACHED_CHARS else _verify
    kind, milli, why = verify(keys_, pod_facts.uid, pod_facts.namespace, pod_facts.name, node_name, signed)
    if kind == SIGNED:
        if milli is not None and len(cpus) * 1000 > milli:
            return f"{len(cpus)} CPUs are more than the pod's CPU request of {milli}m"
        return ""
    if keys_.accept_unsigned and kind != BAD:
        return ""
    if kind == UNSIGNED:
        return "not signed (no allocation signature)"
    return f"not signed by a trusted key ({kind}: {why})"


def cpuset_claim_refusal(
    pod_facts: PodFacts,
    cpus: frozenset[int],
    node_cpus: frozenset[int] | None,
    *,
    keys_: AllocationKeys = ACCEPT_UNSIGNED,
    node_name: str = "",
) -> str:
    """Why ``pod_facts`` may not hold ``cpus`` on a node with ``node_cpus`` (rules 0, 1 and 2 of
    the section above; ``None`` or empty when the node's CPUs are unknown; rule 0 with
    ``keys_`` for the node ``node_name``), "" when it may."""
    if pod_facts.qos_label not in CPUSET_QOS_CLASSES:
        return f"QoS class {pod_facts.qos_label or 'none'} may not hold a cpuset (only LSE and LSR)"
    if node_cpus and not cpus <= node_cpus:
        return f"CPUs {format_cpu_list(cpus - node_cpus)} are not on this node"
    return allocation_refusal(pod_facts, cpus, keys_, node_name)


@dataclass(frozen=True)
class BoundClaims:
    """The resource-status cpusets of a node's pods after the trust rules: what is bound, to
    which pods, and what was refused (pod uid -> reason)."""

    bound: Mapping[str, frozenset[int]] = field(default_factory=lambda: MappingProxyType({}))
    lse: frozenset[str] = frozenset()
    refused: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))


def resolve_cpuset_claims(
    claims: Iterable[tuple[PodFacts, frozenset[int]]],
    node_cpus: frozenset[int] | None,
    *,
    keys_: AllocationKeys = ACCEPT_UNSIGNED,
    node_name: str = "",
) -> BoundClaims:
    """Apply the trust rules to the pods' cpusets, given oldest pod first: a claim that breaks
    rule 0, 1 or 2 is refused, and so is one that overlaps CPUs an earlier accepted claim of another
    pod holds. A pod uid with several claims (a sandbox and its successor) is judged once, by its
    last claim, at the place of its first."""
    # One claim per pod uid: its last (a later sandbox's), at the place of its first.
    latest: dict[str, tuple[PodFacts, frozenset[int]]] = {}
    for p, cpus in claims:
        if cpus:
            latest[p.uid] = (p, cpus)
    bound: dict[str, frozenset[int]] = {}
    lse: set[str] = set()
    refused: dict[str, str] = {}
    owner: dict[int, str] = {}
    for p, cpus in latest.values():
        reason = cpuset_claim_refusal(p, cpus, node_cpus, keys_=keys_, node_name=node_name)
        if not reason:
            held = {c: owner[c] for c in cpus if c in owner}
            if held:
                first = min(held)
                reason = f"CPUs {format_cpu_list(frozenset(held))} are held by pod {held[first]}"
        if reason:
            refused[p.uid] = reason
            continue
        bound[p.uid] = cpus
        owner.update(dict.fromkeys(cpus, p.uid))
        if p.qos_label == keys.QOS_LSE:
            lse.add(p.uid)
    return BoundClaims(MappingProxyType(bound), frozenset(lse), MappingProxyType(refused))


def node_cpus(node_facts: NodeFacts) -> frozenset[int] | None:
    """The node's CPUs from its topology, ``None`` when unknown."""
    topo = node_facts.cpu_topology
    return topo.cpus if topo is not None and topo.cpus else None


def trusted_cpuset(
    pod_facts: PodFacts, status: ResourceStatus | None, node_facts: NodeFacts
) -> tuple[frozenset[int], str]:
    """The CPUs ``pod_facts`` is bound to by ``status`` (its parsed resource-status) and, when it
    has a cpuset the node does not trust, why (the rules above; rule 3 against
    ``node_facts.bound_cpusets``, which holds the accepted claims of the other pods)."""
    if status is None or not status.cpuset:
        return frozenset(), ""
    cpus = status.cpuset
    reason = cpuset_claim_refusal(pod_facts, cpus, node_cpus(node_facts), keys_=node_facts.allocation_keys,
                                  node_name=node_facts.name)  # fmt: skip
    mine = node_facts.bound_cpusets.get(pod_facts.uid) if pod_facts.uid else None
    if not reason and mine is not None and mine != cpus:
        reason = f"the pod holds CPUs {format_cpu_list(mine)} by a later resource-status of its own"
    if not reason:
        for uid, held in node_facts.bound_cpusets.items():
            if uid != pod_facts.uid and held & cpus:
                reason = f"CPUs {format_cpu_list(held & cpus)} are held by pod {uid}"
                break
    return (frozenset(), reason) if reason else (cpus, "")


def with_bound_pods(node_facts: NodeFacts, pods: Iterable[PodFacts]) -> NodeFacts:
    """``node_facts`` with ``bound_cpusets``/``lse_pods`` rebuilt from the pods' resource-status
    cpusets, oldest pod first, under the trust rules above (a pod with a malformed annotation is
    left out; the others are unaffected)."""
    claims: list[tuple[PodFacts, frozenset[int]]] = []
    for p in pods:
        try:
            status = pod_resource_status(p.annotations)
        except FormatError:
            continue
        if status is not None and status.cpuset:
            claims.append((p, status.cpuset))
    resolved = resolve_cpuset_claims(claims, node_cpus(node_facts), keys_=node_facts.allocation_keys,
                                     node_name=node_facts.name)  # fmt: skip
    return node_facts.replace(bound_cpusets=resolved.bound, lse_pods=resolved.lse)
