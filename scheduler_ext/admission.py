"""koord-scheduler's NodeNUMAResource PreFilter and Filter rules, and the placement they imply.

Who calls this: ``scheduler_ext.decide`` takes a ``NodeFacts`` (``scheduler_ext.views``) of a cached ``NodeState``
and asks ``pre_filter`` (once per pod) and ``place`` (per node: filter, prioritize and bind all
use the same answer). Pure: values in, a ``Placed`` or a ``Refusal`` out; the CPU choice is
``scheduler_ext.accumulator``, the NUMA hints, merge and even split are ``scheduler_ext.numa``.

Rules, in Koordinator's order (``nodenumaresource/plugin.go`` ``PreFilter`` and ``Filter``,
``util.go``), each with Koordinator's status and reason:

PreFilter (the pod alone):

1. A pod that requests nothing is skipped.
2. An LSE/LSR pod of koord-prod priority binds CPUs when its effective bind policy is FullPCPUs
   or SpreadByPCPUs: ``requiredCPUBindPolicy`` if set, else ``preferredCPUBindPolicy``, where
   "" and ``Default`` mean the scheduler's default (FullPCPUs). A CPU request that is not a
   whole number of CPUs is then refused everywhere: UnschedulableAndUnresolvable, "the
   requested CPUs must be integer".

Filter (the pod on one node):

3. NUMA policy: the node label ``node.koordinator.sh/numa-topology-policy`` if set, else
   kubelet's Topology Manager policy from the NRT (BestEffort, Restricted,
   SingleNUMANodePodLevel); a pod policy that differs from a node policy is
   UnschedulableAndUnresolvable, "node(s) NUMA Topology policy not match"; otherwise the pod's
   policy, else the node's.
4. The node's bind policy (label ``node.koordinator.sh/cpu-bind-policy`` FullPCPUsOnly or
   SpreadByPCPUs, or kubelet's static policy with ``full-pcpus-only``) makes every pod with a
   CPU request bind CPUs; a request that is not whole CPUs is UnschedulableAndUnresolvable,
   "the requested CPUs must be integer".
5. A node CPU amplification ratio (``node.koordinator.sh/resource-amplification-ratio``) that
   cannot be read is UnschedulableAndUnresolvable, "node(s) invalid CPU amplification ratio".
6. Binding CPUs needs a valid CPU topology: UnschedulableAndUnresolvable, "node(s) invalid CPU
   Topology".
7. The node's policy becomes the required policy; a pod that requires another one is
   UnschedulableAndUnresolvable, "node(s) cpu bind policy conflicts with pod's required cpu
   bind policy".
8. Required FullPCPUs needs a multiple of the threads per core: UnschedulableAndUnresolvable,
   "node(s) requested cpus not multiple cpus per core".
9. Then the CPUs are chosen (no NUMA policy) or the NUMA topology manager admits the pod
   (``scheduler_ext.numa``); a node without NUMA zones is UnschedulableAndUnresolvable,
   "node(s) missing NUMA resources"; a choice that fails is Unschedulable with Koordinator's
   reason ("not enough cpus available to satisfy request", "Insufficient NUMA cpu",
   "Unsatisfied NUMA cpu", "Unaligned NUMA Hint cause ...").
10. ``singleNUMANodeExclusive`` from the pod's ``numa-topology-spec`` (Required when the pod
   names a NUMA policy and leaves it out; ``Filter``): under Required a NUMA set is not
   preferred when it is one NUMA node that a several-node cpuset uses ("shared") or several
   NUMA nodes one of which only one-node cpusets use ("single") (``numa.exclusive_allows``).
   Restricted and SingleNUMANode then refuse the node when no preferred set is left
   (Unschedulable, "Unaligned NUMA Hint cause ..."); BestEffort takes the narrowest other set.
   Preferred changes nothing: koord-scheduler's merge checks only Required.
11. Reservations (``Restore``, built by ``scheduler_ext.views``): the node's matched
   reservations are tried in turn, each as a view of the node that gives back its CPUs (taken
   first) and NUMA amounts; Restricted must fit in them ("not enough cpus available to satisfy
   request" otherwise); then the node outside them, unless the pod requires a reservation
   (its reasons prefixed "Reservation(s) "; ``nodenumaresource/reservation.go``).

The deliberate differences from Koordinator are listed in ``scheduler_ext/README.md``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from koord_formats import keys
from koord_formats.bounded import load_json
from koord_formats.errors import FormatError
from koord_formats.node import parse_kubelet_cpu_manager_policy
from koord_formats.topology import CPUTopology
from scheduler_ext import numa
from scheduler_ext.accumulator import (
    NOT_ENOUGH,
    AllocationError,
    ExclusiveUse,
    allocate_cpuset,
    filter_required,
)
from scheduler_ext.pods import PodRequest

__all__ = [
    "ERR_CPU_BIND_POLICY_CONFLICT",
    "ERR_INVALID_AMPLIFICATION_RATIO",
    "ERR_INVALID_CPU_TOPOLOGY",
    "ERR_INVALID_REQUESTED_CPUS",
    "ERR_MISSING_NUMA_RESOURCES",
    "ERR_NOT_MATCH_NUMA_TOPOLOGY",
    "ERR_NO_NOMINATED_RESERVATION",
    "ERR_RESERVATION_AFFINITY",
    "ERR_SMT_ALIGNMENT",
    "UNRESOLVABLE",
    "UNSCHEDULABLE",
    "Intent",
    "NodeFacts",
    "Placed",
    "Refusal",
    "Restore",
    "amplification_ratio",
    "bind_policy_of",
    "merge_numa_policy",
    "node_cpu_bind_policy",
    "node_numa_policy",
    "place",
    "pre_filter",
    "restored",
]

UNSCHEDULABLE = "Unschedulable"
UNRESOLVABLE = "UnschedulableAndUnresolvable"

ERR_NOT_MATCH_NUMA_TOPOLOGY = "node(s) NUMA Topology policy not match"
ERR_INVALID_REQUESTED_CPUS = "the requested CPUs must be integer"
ERR_INVALID_CPU_TOPOLOGY = "node(s) invalid CPU Topology"
ERR_SMT_ALIGNMENT = "node(s) requested cpus not multiple cpus per core"
ERR_CPU_BIND_POLICY_CONFLICT = "node(s) cpu bind policy conflicts with pod's required cpu bind policy"
ERR_INVALID_AMPLIFICATION_RATIO = "node(s) invalid CPU amplification ratio"
ERR_MISSING_NUMA_RESOURCES = "node(s) missing NUMA resources"
# the reservation plugin and nodenumaresource/reservation.go
ERR_RESERVATION_AFFINITY = "node(s) no reservations match reservation affinity"
ERR_NO_NOMINATED_RESERVATION = "no nominated reservation"
RESERVATION_REASON_PREFIX = "Reservation(s) "
RESTRICTED_POLICY = keys.RESERVATION_ALLOCATE_POLICY_RESTRICTED

DEFAULT_BIND_POLICY = keys.BIND_POLICY_FULL_PCPUS  # koord-scheduler's ``defaultCPUBindPolicy``
# the NUMA policies a node label may name (None names none)
NUMA_POLICIES = (keys.NUMA_POLICY_BEST_EFFORT, keys.NUMA_POLICY_RESTRICTED, keys.NUMA_POLICY_SINGLE_NUMA_NODE)
# kubelet Topology Manager policies in an NRT's ``topologyPolicies`` that Koordinator honours
_NRT_POLICIES = {
    keys.NUMA_POLICY_BEST_EFFORT: keys.NUMA_POLICY_BEST_EFFORT,
    keys.NUMA_POLICY_RESTRICTED: keys.NUMA_POLICY_RESTRICTED,
    keys.NRT_POLICY_SINGLE_NUMA_NODE_POD_LEVEL: keys.NUMA_POLICY_SINGLE_NUMA_NODE,
}
DEFAULT_NUMA_ALLOCATE_STRATEGY = keys.LEAST_ALLOCATED  # koord-scheduler's default NUMA scoring

_MAX_ANNOTATION_CHARS = 64 * 1024
_STATES = "numa-states"  # key of the NUMA node states in ``NodeFacts.views`` (no policy is named so)


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a node cannot take the pod, with Koordinator's status code."""

    code: str  # UNSCHEDULABLE or UNRESOLVABLE
    reason: str

    @property
    def unresolvable(self) -> bool:
        return self.code == UNRESOLVABLE


@dataclass(frozen=True, slots=True)
class Intent:
    """What PreFilter decided about the pod (``preFilterState``)."""

    skip: bool  # requests nothing: no rule applies
    request_cpu_bind: bool  # binds CPUs whatever the node says
    required: str  # required bind policy ("" when none)
    preferred: str  # effective bind policy when binding
    exclusive: str  # preferred CPU exclusive policy ("None" when none)
    numa_policy: str  # the pod's NUMA topology policy ("" when none)
    cpu_milli: int
    memory: int
    numa_exclusive: str = ""  # singleNUMANodeExclusive in force: Required | Preferred | ""

    @property
    def num_cpus(self) -> int:
        return self.cpu_milli // 1000


def pre_filter(pod: PodRequest, default_policy: str = DEFAULT_BIND_POLICY) -> Intent | Refusal:
    """Rules 1 and 2 of the module docstring."""
    numa_policy = "" if pod.numa_policy == keys.NUMA_POLICY_NONE else pod.numa_policy
    numa_exclusive = pod.numa_exclusive
    if not numa_exclusive and numa_policy:
        numa_exclusive = keys.NUMA_EXCLUSIVE_REQUIRED
    skip = pod.cpu_milli <= 0 and pod.memory <= 0 and pod.gpu is None
    intent = Intent(
        skip, False, "", "", keys.EXCLUSIVE_POLICY_NONE, numa_policy, pod.cpu_milli, pod.memory, numa_exclusive
    )
    if skip:
        return intent
    allow_cpuset = pod.qos in (keys.QOS_LSE, keys.QOS_LSR) and pod.priority_class == keys.PRIORITY_PROD
    policy = default_policy if pod.bind_policy in ("", keys.BIND_POLICY_DEFAULT) else pod.bind_policy
    if allow_cpuset and policy in (keys.BIND_POLICY_FULL_PCPUS, keys.BIND_POLICY_SPREAD_BY_PCPUS):
        if pod.cpu_milli % 1000:
            return Refusal(UNRESOLVABLE, ERR_INVALID_REQUESTED_CPUS)
        if pod.cpu_milli > 0:
            return Intent(
                False,
                True,
                policy if pod.bind_required else "",
                policy,
                pod.exclusive_policy or keys.EXCLUSIVE_POLICY_NONE,
                numa_policy,
                pod.cpu_milli,
                pod.memory,
                numa_exclusive,
            )
    return intent


# -- node facts ------------------------------------------------------------------------------


def _json_object(text: str | None) -> object:
    """The annotation's JSON through ``koord_formats``' bounded loader; ``None`` when absent,
    the ``FormatError`` itself when unreadable."""
    if not text:
        return None
    try:
        return load_json(text, "annotation", max_chars=_MAX_ANNOTATION_CHARS)
    except FormatError as exc:
        return exc


def node_cpu_bind_policy(labels: Mapping[str, str], nrt_annotations: Mapping[str, str]) -> str:
    """FullPCPUsOnly, SpreadByPCPUs or "" (``GetNodeCPUBindPolicy``)."""
    label = labels.get(keys.LABEL_CPU_BIND_POLICY, "")
    if label == keys.NODE_CPU_BIND_POLICY_FULL_PCPUS_ONLY:
        return keys.NODE_CPU_BIND_POLICY_FULL_PCPUS_ONLY
    text = nrt_annotations.get(keys.NODE_ANNOTATION_KUBELET_CPU_MANAGER_POLICY)
    if text:
        try:
            kubelet = parse_kubelet_cpu_manager_policy(text)
        except FormatError:  # unreadable: no kubelet option applies
            kubelet = None
        if kubelet is not None and kubelet.policy == "static" and kubelet.options.get("full-pcpus-only") == "true":
            return keys.NODE_CPU_BIND_POLICY_FULL_PCPUS_ONLY
    spread = keys.NODE_CPU_BIND_POLICY_SPREAD_BY_PCPUS
    return spread if label == spread else ""


def node_numa_policy(labels: Mapping[str, str], nrt_policies: Sequence[str]) -> str:
    """The node label if it names a policy, else kubelet's from the NRT, else ""."""
    label = labels.get(keys.LABEL_NUMA_TOPOLOGY_POLICY, "")
    if label in NUMA_POLICIES:
        return label
    for p in nrt_policies:
        mapped = _NRT_POLICIES.get(p)
        if mapped:
            return mapped
    return ""


def merge_numa_policy(node_policy: str, pod_policy: str) -> str | Refusal:
    """The pod's policy over the node's; two different ones are a refusal (rule 3)."""
    if node_policy and pod_policy and node_policy != pod_policy:
        return Refusal(UNRESOLVABLE, ERR_NOT_MATCH_NUMA_TOPOLOGY)
    return pod_policy or node_policy


def amplification_ratio(annotations: Mapping[str, str]) -> float | Refusal:
    """The node's CPU amplification ratio (1.0 when absent), or rule 5's refusal."""
    doc = _json_object(annotations.get(keys.NODE_ANNOTATION_RESOURCE_AMPLIFICATION_RATIO))
    if doc is None:
        return 1.0
    if not isinstance(doc, dict):
        return Refusal(UNRESOLVABLE, ERR_INVALID_AMPLIFICATION_RATIO)
    value = doc.get("cpu")
    if value is None:
        return 1.0
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return Refusal(UNRESOLVABLE, ERR_INVALID_AMPLIFICATION_RATIO)
    return float(value)


def amplify(amount: int, ratio: float) -> int:
    """``extension.Amplify``: ceil(amount x ratio) when the ratio is above 1."""
    return amount if ratio <= 1 else math.ceil(amount * ratio)


@dataclass(frozen=True, slots=True)
class NodeFacts:
    """What the rules read about one node (built by ``scheduler_ext.views`` from the cache)."""

    name: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    nrt_annotations: Mapping[str, str]
    nrt_policies: Sequence[str]
    topo: CPUTopology | None
    topo_error: str
    bindable: frozenset[int]  # every CPU minus those withheld from binding
    free: frozenset[int]  # bindable minus the CPUs placed pods hold
    used: ExclusiveUse  # cores and NUMA nodes held by exclusive pods
    zones: numa.Zones  # NUMA node -> allocatable (cpu milli, memory bytes), withheld CPUs removed
    booked: Mapping[int, Mapping[str, int]]  # NUMA node -> what placed pods booked
    booked_cpusets: Mapping[int, int] = field(default_factory=dict)  # NUMA node -> CPUs of cpusets booked there
    cpusets: Sequence[frozenset[int]] = ()  # the cpusets of the pods placed (or held) on the node
    # required policy -> what it may take of ``free`` (``filter_required``), filled on first use:
    # a NodeFacts stands for one version of its node, so the view is computed once per version
    views: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    # -- the node as one reservation restores it for a pod (``restored``); defaults: no reservation
    reusable: Mapping[int, Mapping[str, int]] = field(default_factory=dict)  # taken off ``booked``
    preferred: frozenset[int] = frozenset()  # CPUs taken first (the reservation's, free of its pods)
    reservation: str = ""  # UID of the reservation this view allocates from
    reservation_name: str = ""
    allocate_policy: str = ""  # its spec.allocatePolicy
    reserved_cpus: int = 0  # how many CPUs it still reserves (``reservedCPUs.Size()``)
    remained: Mapping[int, Mapping[str, int]] | None = None  # its NUMA amounts left, None: none

    def eligible(self, policy: str) -> frozenset[int]:
        """``filter_required(topo, policy, free)``, memoised on this value."""
        view = self.views.get(policy)
        if view is None:
            view = filter_required(self.topo, policy, self.free) if self.topo is not None else self.free
            if len(self.views) < 8:
                self.views[policy] = view
        return view

    @property
    def numa_states(self) -> Mapping[int, str]:
        """NUMA node -> ``keys.NUMA_NODE_SINGLE`` or ``keys.NUMA_NODE_SHARED`` by ``cpusets``
        (``numa.numa_node_states``; a NUMA node not listed is idle), computed on first use."""
        states = self.views.get(_STATES)
        if states is None:
            if self.topo is None:
                return {}
            states = numa.numa_node_states(self.cpusets, self.topo.numa_cpus)
            self.views[_STATES] = states
        return states

    @property
    def strategy(self) -> str:
        return self.labels.get(keys.LABEL_NUMA_ALLOCATE_STRATEGY) or DEFAULT_NUMA_ALLOCATE_STRATEGY


@dataclass(frozen=True, slots=True)
class Placed:
    """The node takes the pod: its CPUs, its NUMA booking and the merged NUMA affinity."""

    cpus: frozenset[int] = frozenset()
    numa: Mapping[int, Mapping[str, int]] = field(default_factory=dict)  # NUMA node -> booked
    affinity: frozenset[int] | None = None  # None: no NUMA alignment
    numa_policy: str = ""
    bind_policy: str = ""  # the policy the CPUs were chosen with ("" when no cpuset)
    required: bool = False
    reservation: str = ""  # UID of the reservation the placement allocates from ("" when none)
    given: int = 0  # CPUs that reservation gave back to the pod (free for it, held for others)


@dataclass(frozen=True, slots=True)
class Restore:
    """The node as koord-scheduler restores it for one pod's matched reservations
    (``nodenumaresource/reservation.go``): ``tries`` are (builder, key) of the views of the
    matched reservations that reserved a cpuset or NUMA amounts (``tryAllocateFromReservation``;
    a view is built only when tried, and one whose key equals that of a view that failed is not
    tried again: it fails the same way), ``node`` is the view for allocating outside them
    (``tryAllocateFromNode``), ``hints`` the view hint generation reads, and ``required``
    whether the pod requires a reservation (reservation affinity)."""

    tries: tuple[tuple[Callable[[], NodeFacts], object], ...]
    node: NodeFacts
    hints: NodeFacts
    required: bool


def restored(
    node: NodeFacts,
    *,
    free: frozenset[int],
    reusable: Mapping[int, Mapping[str, int]],
    preferred: frozenset[int] = frozenset(),
    reservation: str = "",
    reservation_name: str = "",
    allocate_policy: str = "",
    reserved_cpus: int = 0,
    remained: Mapping[int, Mapping[str, int]] | None = None,
) -> NodeFacts:
    """``node`` with some CPUs and NUMA amounts given back for one pod."""
    return dataclasses.replace(
        node,
        free=free,
        views={},
        reusable=reusable,
        preferred=preferred,
        reservation=reservation,
        reservation_name=reservation_name,
        allocate_policy=allocate_policy,
        reserved_cpus=reserved_cpus,
        remained=remained,
    )


def _reservation_reasons(reasons: Sequence[str]) -> str:
    """Koordinator's ``makeReasonsByReservation``: each reason prefixed "Reservation(s) "."""
    parts = [p for r in reasons for p in r.split("; ") if p]
    return "; ".join(f"{RESERVATION_REASON_PREFIX}{p}" for p in parts)


def _with_reservations(
    restore: Restore | None, base: NodeFacts, attempt: Callable[[NodeFacts], Placed | Refusal]
) -> Placed | Refusal:
    """The matched reservations in turn, then the node (``tryAllocateFromReservation`` then
    ``tryAllocateFromNode``); a pod that requires a reservation gets no node fallback."""
    if restore is None:
        return attempt(base)
    reasons: list[str] = []
    failed: dict[object, str] = {}  # a view equal to one that failed fails the same way
    for build, key in restore.tries:
        if key in failed:
            reasons.append(failed[key])
            continue
        got = attempt(build())
        if isinstance(got, Placed):
            return got
        reasons.append(got.reason)
        failed[key] = got.reason
    if restore.tries and restore.required:
        return Refusal(UNSCHEDULABLE, _reservation_reasons(reasons))
    return attempt(restore.node)


PLAIN = Placed()


def bind_policy_of(intent: Intent, node_policy: str) -> tuple[str, bool]:
    """The policy CPUs are chosen with and whether it is required (``getCPUBindPolicy``)."""
    if intent.required:
        return intent.required, True
    by_node = _node_required(node_policy)
    if by_node:
        return by_node, True
    return intent.preferred, False


def _node_required(node_policy: str) -> str:
    """The bind policy a node's ``node_cpu_bind_policy`` requires of every pod ("" when none)."""
    if node_policy == keys.NODE_CPU_BIND_POLICY_FULL_PCPUS_ONLY:
        return keys.BIND_POLICY_FULL_PCPUS
    if node_policy == keys.NODE_CPU_BIND_POLICY_SPREAD_BY_PCPUS:
        return keys.BIND_POLICY_SPREAD_BY_PCPUS
    return ""


def _amplified_zones(node: NodeFacts, ratio: float) -> tuple[numa.Zones, dict[int, dict[str, int]]]:
    zones, booked = _amplified(node, ratio)
    if node.reusable:  # ``getAvailableNUMANodeResources``: booked minus reusable, never below zero
        for n, amounts in booked.items():
            back = node.reusable.get(n)
            if back:
                booked[n] = {r: max(0, v - back.get(r, 0)) for r, v in amounts.items()}
    return zones, booked


def _amplified(node: NodeFacts, ratio: float) -> tuple[numa.Zones, dict[int, dict[str, int]]]:
    if ratio <= 1:
        return node.zones, {n: dict(v) for n, v in node.booked.items()}
    zones = {n: {r: (amplify(v, ratio) if r == numa.CPU else v) for r, v in z.items()} for n, z in node.zones.items()}
    booked: dict[int, dict[str, int]] = {}
    for n, amounts in node.booked.items():
        b = dict(amounts)
        pinned = node.booked_cpusets.get(n, 0) * 1000
        if numa.CPU in b and pinned:
            b[numa.CPU] = b[numa.CPU] - pinned + amplify(pinned, ratio)
        booked[n] = b
    return zones, booked


def place(
    intent: Intent,
    node: NodeFacts,
    *,
    extra: Sequence[numa.ProviderHints] = (),
    exact: bool = True,
    restore: Restore | None = None,
    final: Restore | None = None,
) -> Placed | Refusal:
    """Rules 3 to 9 on one node; with ``exact`` the answer is the placement a bind writes.

    ``restore`` holds the views of the node the pod's matched reservations give it (tried in
    order, then the node itself; see ``Restore``); ``final``, when given, replaces it for the
    allocation itself once the NUMA hint is chosen (bind allocates from the nominated
    reservation only, Filter from any matched one). ``extra`` holds other hint providers'
    answers (GPUs) for the NUMA merge. Without
    ``exact`` (filter and prioritize) the CPUs are counted, not chosen, by the same function
    bind chooses them with (``accumulator.allocate_cpuset`` with ``choose=False``: same checks,
    same reasons), so the verdict is bind's answer.
    """
    if intent.skip:
        return PLAIN
    node_numa = node_numa_policy(node.labels, node.nrt_policies)
    policy = merge_numa_policy(node_numa, intent.numa_policy)
    if isinstance(policy, Refusal):
        return policy
    node_bind = node_cpu_bind_policy(node.labels, node.nrt_annotations)
    cpu_bind = intent.request_cpu_bind
    if not cpu_bind and intent.cpu_milli > 0 and node_bind:
        if intent.cpu_milli % 1000:
            return Refusal(UNRESOLVABLE, ERR_INVALID_REQUESTED_CPUS)
        cpu_bind = True
    ratio = amplification_ratio(node.annotations) if intent.cpu_milli > 0 else 1.0
    if isinstance(ratio, Refusal):
        return ratio
    topo = node.topo
    bind_policy, required = "", False
    if cpu_bind:
        if topo is None:
            return Refusal(UNRESOLVABLE, ERR_INVALID_CPU_TOPOLOGY)
        bind_policy, required = bind_policy_of(intent, node_bind)
        if node_bind and intent.required and intent.required != _node_required(node_bind):
            return Refusal(UNRESOLVABLE, ERR_CPU_BIND_POLICY_CONFLICT)
        if required and bind_policy == keys.BIND_POLICY_FULL_PCPUS and intent.num_cpus % max(topo.cpus_per_core, 1):
            return Refusal(UNRESOLVABLE, ERR_SMT_ALIGNMENT)
    if not policy:
        if not cpu_bind or topo is None:
            return PLAIN

        def cpus_only(view: NodeFacts) -> Placed | Refusal:
            try:
                cpus = _cpuset(intent, view, topo, bind_policy, required, None, exact)
            except AllocationError as exc:
                return Refusal(UNSCHEDULABLE, str(exc))
            if view.allocate_policy == RESTRICTED_POLICY and intent.num_cpus > view.reserved_cpus:
                return Refusal(UNSCHEDULABLE, NOT_ENOUGH)
            return Placed(cpus, {}, None, "", bind_policy, required, view.reservation,
                          len(view.free) - len(node.free))

        return _with_reservations(final if final is not None else restore, node, cpus_only)
    return _place_numa(intent, node, policy, cpu_bind, bind_policy, required, ratio, extra, exact, restore, final)


def _cpuset(
    intent: Intent,
    node: NodeFacts,
    topo: CPUTopology,
    bind_policy: str,
    required: bool,
    numa_cpus: dict[int, int] | None,
    exact: bool,
) -> frozenset[int]:
    """The pod's CPUs on ``node`` (``exact``), or ``frozenset()`` once counting shows the choice
    would succeed: one function, ``accumulator.allocate_cpuset``, for filter and bind."""
    return allocate_cpuset(
        topo,
        node.free,
        intent.num_cpus,
        bind_policy=bind_policy,
        required=required,
        exclusive_policy=intent.exclusive,
        strategy=node.strategy,
        used=node.used,
        numa_cpus=numa_cpus,
        preferred=node.preferred,
        eligible=node.eligible(bind_policy) if required else node.free,
        choose=exact,
    )


# long: its nested helpers share one placement's inputs and zone cache (koord's NUMA filter)
def _place_numa(
    intent: Intent,
    node: NodeFacts,
    policy: str,
    cpu_bind: bool,
    bind_policy: str,
    required: bool,
    ratio: float,
    extra: Sequence[numa.ProviderHints],
    exact: bool,
    restore: Restore | None = None,
    final: Restore | None = None,
) -> Placed | Refusal:
    if not node.zones:
        return Refusal(UNRESOLVABLE, ERR_MISSING_NUMA_RESOURCES)
    topo = node.topo
    zones = _amplified_zones(node, ratio)[0]
    cache: dict[tuple[int, bool], dict[int, dict[str, int]]] = {}

    def available_in(view: NodeFacts, remained: bool = False) -> dict[int, dict[str, int]]:
        """Zone amounts ``view`` leaves (or, with ``remained``, its reservation's NUMA amounts
        left, ``requiredResources``), trimmed to the CPUs a required policy may take there."""
        key = (id(view), remained)
        got = cache.get(key)
        if got is None:
            if remained and view.remained is not None:
                got = {n: {r: max(0, v) for r, v in a.items()} for n, a in view.remained.items()}
            else:
                got = numa.zone_available(*_amplified_zones(view, ratio))
            if required and topo is not None:  # trimNUMANodeResources
                eligible = view.eligible(bind_policy)
                for n, amounts in got.items():
                    if amounts.get(numa.CPU):
                        cap = len(eligible & topo.numa_cpus.get(n, frozenset())) * 1000
                        amounts[numa.CPU] = min(amounts[numa.CPU], cap)
            cache[key] = got
        return {n: dict(a) for n, a in got.items()}

    original = numa.cpu_requests(intent.cpu_milli, intent.memory)
    hinted = dict(original)
    if cpu_bind and ratio > 1 and numa.CPU in hinted:
        hinted[numa.CPU] = amplify(hinted[numa.CPU], ratio)
    full_pcpus = required and bind_policy == keys.BIND_POLICY_FULL_PCPUS
    full_cores = max(topo.cpus_per_core, 1) if (topo is not None and full_pcpus) else 0

    def attempt_in(view: NodeFacts, mask: frozenset[int] | None, exact: bool, remained: bool) -> Placed | Refusal:
        split: Mapping[int, Mapping[str, int]] = {}
        if mask is not None:
            shares = numa.distribute_evenly(
                original if cpu_bind else hinted,
                available_in(view, remained),
                mask,
                cpu_bind=cpu_bind,
                full_cores=full_cores,
            )
            if shares.reasons:
                return Refusal(UNSCHEDULABLE, "; ".join(shares.reasons))
            split = shares.per_node
        cpus: frozenset[int] = frozenset()
        if cpu_bind and topo is not None:
            numa_cpus = {n: a.get(numa.CPU, 0) // 1000 for n, a in split.items() if a.get(numa.CPU)}
            try:
                cpus = _cpuset(intent, view, topo, bind_policy, required, numa_cpus or None, exact)
            except AllocationError as exc:
                return Refusal(UNSCHEDULABLE, str(exc))
        return Placed(cpus, split, mask, policy, bind_policy, required, view.reservation,
                      len(view.free) - len(node.free))

    def attempt_view(view: NodeFacts, mask: frozenset[int] | None, exact: bool) -> Placed | Refusal:
        got = attempt_in(view, mask, exact, False)
        if not isinstance(got, Placed) or view.allocate_policy != RESTRICTED_POLICY:
            return got
        # Restricted: the pod must fit in the reservation's CPUs and its NUMA amounts left
        if cpu_bind and intent.num_cpus > view.reserved_cpus:
            return Refusal(UNSCHEDULABLE, NOT_ENOUGH)
        if view.remained:
            return attempt_in(view, mask, exact, True)
        return got

    def attempt(mask: frozenset[int] | None, exact: bool, views: Restore | None = restore) -> Placed | Refusal:
        return _with_reservations(views, node, lambda view: attempt_view(view, mask, exact))

    hint_view = restore.hints if restore is not None else node
    hints = numa.generate_hints(
        zones,
        available_in(hint_view),
        hinted,
        policy,
        lambda m: isinstance(attempt(m, False), Placed),
        strategy=keys.LEAST_ALLOCATED,
    )
    exclusive = intent.numa_exclusive
    states = node.numa_states if exclusive == keys.NUMA_EXCLUSIVE_REQUIRED else {}
    merged = numa.merge_hints(policy, sorted(zones), [hints, *extra], exclusive=exclusive, states=states)
    if not merged.admit:
        return Refusal(UNSCHEDULABLE, "; ".join(merged.reasons) or ERR_NOT_MATCH_NUMA_TOPOLOGY)
    return attempt(merged.affinity, exact, final if final is not None else restore)
