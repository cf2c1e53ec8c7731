"""The fact types every plugin receives: ``PodFacts``, ``ContainerFacts``, ``NodeFacts`` (with
``ResctrlFacts`` and the CRI ``Resources``), frozen and built once per call by the doors and the
planner; and the small helpers that make them (``frozen_map``, ``resource_value``,
``load_json_annotation``). How the node's cgroups are laid out (``CgroupInfo``) is
``hooks.facts.cgroups``. Import them from ``hooks.facts``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from types import MappingProxyType
from typing import Any, Never, TypedDict, TypeVar, Unpack

from hooks.facts.cgroups import CgroupInfo, kube_qos_from_cgroup_parent
from hooks.facts.rules import EMPTY_RULES, NodeSLORules, parse_rules
from hooks.signatures import ACCEPT_UNSIGNED, AllocationKeys
from koord_formats import keys, qos
from koord_formats.bounded import load_json
from koord_formats.pod import ContainerResourceSpec
from koord_formats.topology import CPUTopology

_EMPTY: Mapping[str, Never] = MappingProxyType({})

_V = TypeVar("_V")


def frozen_map(value: Mapping[str, _V] | None) -> Mapping[str, _V]:
    """Return a read-only copy of ``value`` (an empty one for ``None``)."""
    if not value:
        return _EMPTY
    return MappingProxyType(dict(value))


def load_json_annotation(annotations: Mapping[str, str], key: str) -> Any:  # Any: JSON not yet decoded
    """The JSON value of an annotation, ``None`` when absent or empty; ``FormatError`` when it is
    malformed or larger or deeper than ``koord_formats.bounded`` allows."""
    raw = annotations.get(key)
    if raw is None or raw == "":
        return None
    return load_json(raw, key)


# One hugepage limit: (page size as the kernel names it, "2MB", limit in bytes).
HugepageLimit = tuple[str, int]

# The value of one ``LinuxContainerResources`` field, one shape per field: an ``int`` for the
# numbers, a ``str`` for the cpusets, a read-only ``Mapping[str, str]`` for ``unified`` and a
# tuple of ``HugepageLimit`` for ``hugepage_limits``.
ResourceValue = int | str | Mapping[str, str] | tuple[HugepageLimit, ...]


def _hugepage_limits(value: object) -> tuple[HugepageLimit, ...]:
    """Hugepage limits from their JSON shape (``[{"page_size": "2MB", "limit": n}]``) or as
    ``HugepageLimit`` pairs already; ``ValueError`` for anything else."""
    if value is None:
        return ()
    if not isinstance(value, list | tuple):
        raise ValueError("resources.hugepage_limits must be a list")
    out: list[HugepageLimit] = []
    for item in value:
        if isinstance(item, tuple) and len(item) == 2:
            page, limit = item
        else:
            page = item.get("page_size") if isinstance(item, Mapping) else None
            limit = item.get("limit") if isinstance(item, Mapping) else None
        if not isinstance(page, str) or isinstance(limit, bool) or not isinstance(limit, int):
            raise ValueError("resources.hugepage_limits entries need a string page_size and an integer limit")
        if not 0 <= limit < 2**63:
            raise ValueError(f"resources.hugepage_limits limit {limit} is out of range")
        out.append((page, limit))
    return tuple(out)


# The scalar fields of ``LinuxContainerResources`` (everything but ``unified`` and hugepages).
SCALAR_RESOURCE_FIELDS: tuple[str, ...] = (
    "cpu_period",
    "cpu_quota",
    "cpu_shares",
    "memory_limit_in_bytes",
    "oom_score_adj",
    "cpuset_cpus",
    "cpuset_mems",
    "memory_swap_limit_in_bytes",
)
_STRING_RESOURCE_FIELDS = frozenset({"cpuset_cpus", "cpuset_mems"})


def resource_value(name: str, value: object) -> ResourceValue:
    """``value`` checked and put in the one shape of the ``LinuxContainerResources`` field
    ``name`` (see ``ResourceValue``); ``ValueError`` for an unknown field or a value of another
    type. ``unified`` keys and values are made strings; hugepage limits are accepted in their
    JSON shape or as pairs."""
    if name == "unified":
        if not isinstance(value, Mapping):
            raise ValueError("resources.unified must be a map")
        return frozen_map({str(k): str(v) for k, v in value.items()})
    if name == "hugepage_limits":
        return _hugepage_limits(value)
    if name in _STRING_RESOURCE_FIELDS:
        if not isinstance(value, str):
            raise ValueError(f"resources.{name} must be a string")
        return value
    if name not in SCALAR_RESOURCE_FIELDS:
        raise ValueError(f"unknown resource fields: {[name]}")
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"resources.{name} must be an integer")
    return value


@dataclass(frozen=True)
class Resources:
    """CRI ``LinuxContainerResources``, field for field (the proto's snake-case names).

    Zero and empty mean "not set", as on the wire. ``cpu_quota`` -1 means unlimited.
    """

    cpu_period: int = 0
    cpu_quota: int = 0
    cpu_shares: int = 0
    memory_limit_in_bytes: int = 0
    oom_score_adj: int = 0
    cpuset_cpus: str = ""
    cpuset_mems: str = ""
    memory_swap_limit_in_bytes: int = 0
    unified: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    hugepage_limits: tuple[HugepageLimit, ...] = ()

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    @classmethod
    def from_dict(cls, data: Mapping[str, object] | None) -> Resources:
        """Build from a mapping with the CRI field names (values as ``resource_value`` takes
        them); unknown keys raise ``ValueError``."""
        if not data:
            return cls()
        if not _RESOURCE_FIELD_SET.issuperset(data):
            raise ValueError(f"unknown resource fields: {sorted(set(data) - _RESOURCE_FIELD_SET)}")
        kwargs = {name: resource_value(name, value) for name, value in data.items()}
        return cls(**kwargs)  # type: ignore[arg-type]  # each value has its field's shape (resource_value)

    def to_dict(self) -> dict[str, int | str | dict[str, str] | list[dict[str, str | int]]]:
        """All fields, with the CRI names; maps and lists as plain JSON values."""
        out: dict[str, int | str | dict[str, str] | list[dict[str, str | int]]] = {}
        for name in SCALAR_RESOURCE_FIELDS:
            out[name] = getattr(self, name)
        out["unified"] = dict(self.unified)
        out["hugepage_limits"] = [{"page_size": p, "limit": lim} for p, lim in self.hugepage_limits]
        return out

    def with_changes(self, changes: Mapping[str, object]) -> Resources:
        """A copy with the given fields replaced (used to show a plan's effect); ``changes``
        as ``from_dict`` takes them (a ``hooks.plan.ResourceChanges`` is such a mapping)."""
        merged: dict[str, object] = dict(self.to_dict())
        merged.update(changes)
        return Resources.from_dict(merged)


_RESOURCE_FIELD_SET = frozenset(Resources.field_names())


@dataclass(frozen=True)
class PodFacts:
    """A pod sandbox as the proxy knows it. Set once per call; never mutated."""

    name: str = ""
    namespace: str = ""
    uid: str = ""
    attempt: int = 0
    labels: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    annotations: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    # The sandbox's cgroup parent as kubelet sent it (driver-specific form).
    cgroup_parent: str = ""
    runtime_handler: str = ""
    # Empty before RunPodSandbox has returned.
    sandbox_id: str = ""
    # "Guaranteed", "Burstable", "BestEffort" or "" (derived from cgroup_parent unless given).
    kube_qos: str = ""
    # The pod's containers as far as the caller knows them (the reconciler fills this; CRI
    # hooks may leave it empty). Used for pod-level sums such as the pod's cpu.cfs_burst_us.
    containers: tuple[ContainerFacts, ...] = ()
    # The pod's ``spec.priority`` when known. CRI does not carry it, so the proxy's store leaves
    # it None; a caller that has the cluster's pod object (the planner's input, a test) fills
    # it. Decisions that order pods by priority (the eviction plugins) read None as 0, the
    # priority the API server gives a pod without a priority class.
    priority: int | None = None
    # The batch resources (``kubernetes.io/batch-cpu``, ``batch-memory``) its containers ask for
    # in the pod spec, by container name (``koord_formats.pod.parse_pod_batch_resources``). CRI
    # does not carry extended resources: the node agent fills this from the cluster's pod
    # (``runtime_proxy.state.podspecs``); None when it does not know the pod (no cluster access,
    # or not seen yet). The ``extended-resource-spec`` annotation, when present, wins.
    batch_resources: Mapping[str, ContainerResourceSpec] | None = None

    @property
    def qos_label(self) -> str:
        """The raw ``koordinator.sh/qosClass`` label if valid, else "" (no fallback)."""
        return qos.qos_label(self.labels)

    @property
    def qos_class(self) -> str:
        """Koordinator QoS class with the fallback from the Kubernetes QoS class."""
        return qos.qos_class(self.labels, self.effective_kube_qos)

    @property
    def effective_kube_qos(self) -> str:
        return self.kube_qos or kube_qos_from_cgroup_parent(self.cgroup_parent)

    @property
    def skips_hooks(self) -> bool:
        """True for pods labelled ``runtimeproxy.koordinator.sh/skip-hookserver=true``."""
        return self.labels.get(keys.LABEL_SKIP_HOOKSERVER, "") == "true"

    def replace(self, **changes: Unpack[PodChanges]) -> PodFacts:
        return replace(self, **changes)


@dataclass(frozen=True)
class ContainerFacts:
    """A container as the proxy knows it. Set once per call; never mutated."""

    name: str = ""
    # Empty before CreateContainer has returned.
    id: str = ""
    attempt: int = 0
    labels: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    annotations: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    resources: Resources = field(default_factory=Resources)
    # Environment as a map; later duplicates of a key win, as in the container runtime.
    envs: Mapping[str, str] = field(default_factory=lambda: _EMPTY)

    def replace(self, **changes: Unpack[ContainerChanges]) -> ContainerFacts:
        return replace(self, **changes)


@dataclass(frozen=True)
class ResctrlFacts:
    """What the node's resctrl filesystem offers (``node.resctrl`` in the planner input)."""

    # Root L3 capacity bitmask, hex as in info/L3/cbm_mask ("fff" = 12 ways).
    cbm_mask: str = ""
    cache_ids: tuple[int, ...] = ()
    vendor: str = "intel"  # "intel" or "amd"
    supported: bool = False


@dataclass(frozen=True)
class NodeFacts:
    """The node: its labels and annotations, NodeSLO spec, topology and what the proxy knows
    about pods already bound to CPUs. Rebuilt whenever the node config changes."""

    name: str = ""
    labels: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    # Node annotations merged with the NodeResourceTopology annotations (NRT wins).
    annotations: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    # The NodeSLO ``spec`` object as JSON (camelCase keys, as Koordinator defines them).
    node_slo: Mapping[str, Any] = field(default_factory=lambda: _EMPTY)  # Any: JSON, read through koord_formats
    cpu_topology: CPUTopology | None = None
    resctrl: ResctrlFacts = field(default_factory=ResctrlFacts)
    cgroup: CgroupInfo = field(default_factory=CgroupInfo)
    # cpusets that the proxy knows are bound to pods (pod uid -> CPUs, from resource-status).
    bound_cpusets: Mapping[str, frozenset[int]] = field(default_factory=lambda: MappingProxyType({}))
    # Pod uids of the bound cpusets above whose QoS class is LSE (their CPUs leave the BE pool).
    lse_pods: frozenset[str] = frozenset()
    # The public keys resource-status cpusets are verified with, and whether unsigned ones count
    # (``hooks.signatures``; the node agent's ``allocationTrust`` config). Default: no keys,
    # unsigned claims accepted (Koordinator's model).
    allocation_keys: AllocationKeys = ACCEPT_UNSIGNED
    # ``node_slo``'s strategies as typed rules (``hooks.facts.rules``), parsed once when the facts
    # are made and kept by ``replace`` while ``node_slo`` stays; plugins read these, not the raw
    # mapping. Derived: left out of equality.
    rules: NodeSLORules = field(default=EMPTY_RULES, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.rules is EMPTY_RULES and self.node_slo:
            object.__setattr__(self, "rules", parse_rules(self.node_slo))

    def replace(self, **changes: Unpack[NodeChanges]) -> NodeFacts:
        if "node_slo" in changes and "rules" not in changes:
            changes["rules"] = EMPTY_RULES  # parsed again from the new spec (__post_init__)
        return replace(self, **changes)


# The keyword arguments of the facts' ``replace`` methods: their fields, each optional (a test
# keeps the keys equal to the dataclass fields).
class PodChanges(TypedDict, total=False):
    name: str
    namespace: str
    uid: str
    attempt: int
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    cgroup_parent: str
    runtime_handler: str
    sandbox_id: str
    kube_qos: str
    containers: tuple[ContainerFacts, ...]
    priority: int | None
    batch_resources: Mapping[str, ContainerResourceSpec] | None


class ContainerChanges(TypedDict, total=False):
    name: str
    id: str
    attempt: int
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    resources: Resources
    envs: Mapping[str, str]


class NodeChanges(TypedDict, total=False):
    name: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    node_slo: Mapping[str, Any]  # Any: JSON, as NodeFacts.node_slo
    cpu_topology: CPUTopology | None
    resctrl: ResctrlFacts
    cgroup: CgroupInfo
    bound_cpusets: Mapping[str, frozenset[int]]
    lse_pods: frozenset[str]
    allocation_keys: AllocationKeys
    rules: NodeSLORules
