"""Frozen inputs handed to every plugin: what we know about a pod, a container and the node.

The proxy (``runtime_proxy.cri.door``) builds these values once per CRI call from the decoded
request and its store, and the planner (``runtime-proxy plan``) builds them from a JSON document.
Plugins only read them. Nothing here does I/O, so every plugin stays a pure function.

Koordinator's keys and formats live in ``koord_formats``; the helpers here combine those parsers
with the facts (share pools of a node, the resource-status of a pod, cgroup paths). Every
helper that reads an annotation raises only ``koord_formats.FormatError`` (a ``ValueError``)
when it is malformed, so a plugin catches one type and records a skip for that pod alone.

The kernel's CPU list format ("0-3,8") appears only at the edges, through the single
``parse_cpu_list`` / ``format_cpu_list`` pair; inside the code a CPU set is a ``frozenset[int]``.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from fractions import Fraction
from functools import lru_cache
from types import MappingProxyType
from typing import Any, Never, TypedDict, TypeVar, Unpack

from hooks.signatures import ACCEPT_UNSIGNED, BAD, SIGNED, UNSIGNED, AllocationKeys, verify_allocation
from koord_formats import keys, node, nodeslo, pod, qos
from koord_formats import signature as signature_format
from koord_formats.bounded import load_json
from koord_formats.cpulist import format_cpu_list, parse_cpu_list
from koord_formats.errors import FormatError
from koord_formats.node import CPUSharePool
from koord_formats.nodeslo import CPUBurstConfig
from koord_formats.pod import ContainerResourceSpec, ResourceStatus
from koord_formats.topology import CPUInfo, CPUTopology

__all__ = [
    "CFS_PERIOD_US",
    "CPUSET_QOS_CLASSES",
    "BoundClaims",
    "CPUInfo",
    "CPUQuota",
    "CPUSharePool",
    "CPUTopology",
    "CgroupInfo",
    "ContainerFacts",
    "ContainerResourceSpec",
    "KubeletPodParent",
    "KubeletRootChoice",
    "NodeFacts",
    "PodFacts",
    "ResctrlFacts",
    "ResourceStatus",
    "Resources",
    "all_share_pool_cpus",
    "allocation_refusal",
    "cgroup_path_of_parent",
    "choose_kubelet_root",
    "compute_share_pools",
    "container_cgroup_path",
    "container_cpu_quota",
    "cpu_normalization_applies",
    "cpu_normalization_ratio",
    "cpuset_claim_refusal",
    "format_cpu_list",
    "frozen_map",
    "host_app_cgroup_path",
    "kube_qos_cgroup_path",
    "kubelet_cpu_manager_policy",
    "kubelet_root_key",
    "load_json_annotation",
    "milli_cpu_to_quota",
    "milli_cpu_to_shares",
    "node_cpus",
    "normalize_cpu_quota",
    "parse_cpu_list",
    "parse_kubelet_cgroup_root",
    "parse_kubelet_pod_parent",
    "pod_cgroup_path",
    "pod_cpu_burst_config",
    "pod_resource_status",
    "resolve_cpuset_claims",
    "share_pools",
    "system_qos_cpuset",
    "trusted_cpuset",
    "with_bound_pods",
]

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
        known = set(cls.field_names())
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown resource fields: {sorted(unknown)}")
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


def kube_qos_from_cgroup_parent(cgroup_parent: str) -> str:
    """Kubernetes QoS class implied by a pod's cgroup parent, as kubelet lays it out.

    Works for the cgroupfs form (``/kubepods/burstable/pod<uid>``) and the systemd form
    (``kubepods-burstable-pod<uid>.slice``), under any kubelet cgroup root: the words
    ``besteffort`` or ``burstable`` after the last ``kubepods``, else ``kubepods`` itself.
    Returns "" when none is there.
    """
    lowered = cgroup_parent.lower()
    # Only what follows the last "kubepods" names the tier (a root may hold the words too).
    lowered = lowered[max(lowered.rfind(_KUBEPODS), 0):]
    if "besteffort" in lowered:
        return "BestEffort"
    if "burstable" in lowered:
        return "Burstable"
    if "kubepods" in lowered:
        return "Guaranteed"
    return ""


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
class CgroupInfo:
    """How the node's cgroups are laid out."""

    version: int = 1  # 1 or 2
    driver: str = "cgroupfs"  # "cgroupfs" or "systemd"
    # kubelet's cgroup root (``cgroupRoot``, ``--cgroup-root``) in kubelet's own form, the
    # cgroupfs one whatever the driver: "/" (kubelet's default) or "/custom". The QoS-level
    # directories sit below it (``kube_qos_cgroup_path``). Normalised when the value is made;
    # ``ValueError`` for one kubelet could not use (``parse_kubelet_cgroup_root``).
    kubelet_root: str = "/"

    def __post_init__(self) -> None:
        object.__setattr__(self, "kubelet_root", parse_kubelet_cgroup_root(self.kubelet_root))


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

    def replace(self, **changes: Unpack[NodeChanges]) -> NodeFacts:
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


# ---- kubelet's cgroup conversions (pkg/kubelet/cm/cgroup_manager_linux.go, CFS helpers) -----

CFS_PERIOD_US = 100000
MIN_SHARES = 2
MAX_SHARES = 262144
MIN_QUOTA_US = 1000


def milli_cpu_to_shares(milli: int) -> int:
    """Koordinator/kubelet: shares = milliCPU x 1024 / 1000, clamped to [2, 262144] (0 -> 2)."""
    if milli <= 0:
        return MIN_SHARES
    return max(MIN_SHARES, min(MAX_SHARES, milli * 1024 // 1000))


def milli_cpu_to_quota(milli: int, period: int = CFS_PERIOD_US) -> int:
    """Koordinator/kubelet: quota = milliCPU x period / 1000; <= 0 -> -1 (unlimited); min 1000."""
    if milli <= 0:
        return -1
    return max(MIN_QUOTA_US, milli * period // 1000)


# ---- cgroup paths ------------------------------------------------------------------------------


def is_safe_path_part(part: str) -> bool:
    """True for a relative path that stays below its root: no "..", no NUL, not absolute."""
    if not part or "\x00" in part or part.startswith("/"):
        return False
    return all(p not in ("..",) for p in part.split("/"))


def _expand_systemd_slice(name: str) -> str:
    # kubelet's cgroupManager: "a-b-c.slice" lives at "a.slice/a-b.slice/a-b-c.slice".
    if not name.endswith(".slice"):
        raise ValueError(f"{name!r} is not a systemd slice name")
    stem = name[: -len(".slice")]
    if stem in ("", "-"):
        return ""
    if "/" in stem or stem.startswith("-") or stem.endswith("-") or "--" in stem:
        raise ValueError(f"bad systemd slice name {name!r}")
    words = stem.split("-")
    return "/".join("-".join(words[: i + 1]) + ".slice" for i in range(len(words)))


def cgroup_path_of_parent(cgroup_parent: str) -> str:
    """The filesystem path, relative to a controller's root, of a kubelet cgroup parent.

    ``/kubepods/burstable/pod<uid>`` (cgroupfs) -> ``kubepods/burstable/pod<uid>``;
    ``kubepods-burstable-pod<uid>.slice`` (systemd) ->
    ``kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice``.
    Raises ``ValueError`` for a parent that would leave the root ("..", NUL, empty parts).
    """
    text = cgroup_parent.strip()
    if "\x00" in text:
        raise ValueError("cgroup parent contains NUL")
    path = _expand_systemd_slice(text) if text.endswith(".slice") and "/" not in text else text.strip("/")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if any(p == ".." for p in parts):
        raise ValueError(f"cgroup parent {cgroup_parent!r} contains '..'")
    if not parts:
        raise ValueError(f"empty cgroup parent {cgroup_parent!r}")
    return "/".join(parts)


def _check_id(kind: str, value: str) -> str:
    if not value or "/" in value or "\x00" in value or value in (".", ".."):
        raise ValueError(f"bad {kind} {value!r}")
    return value


def pod_cgroup_path(pod: PodFacts) -> str:
    """The pod's cgroup directory relative to the cgroup root (``ValueError`` if unsafe)."""
    return cgroup_path_of_parent(pod.cgroup_parent)


def container_cgroup_path(pod: PodFacts, container_id: str, driver: str = "cgroupfs") -> str:
    """Where containerd puts a container (or sandbox) of ``pod``: ``<pod>/<id>`` with cgroupfs,
    ``<pod slice>/cri-containerd-<id>.scope`` with systemd."""
    base = pod_cgroup_path(pod)
    cid = _check_id("container id", container_id)
    if driver == "systemd" or base.endswith(".slice"):
        return f"{base}/cri-containerd-{cid}.scope"
    return f"{base}/{cid}"


# ---- kubelet's cgroup root and its QoS directories ---------------------------------------------
#
# kubelet names a cgroup by a list of names (pkg/kubelet/cm). container_manager_linux.go reads
# ``cgroupRoot`` (always written in the cgroupfs form, "/a/b" -> ["a", "b"]) and appends
# "kubepods"; qos_container_manager_linux.go appends "burstable" or "besteffort" for those two
# tiers (Guaranteed pods sit in kubepods itself); a pod adds "pod<uid>". cgroup_manager_linux.go
# lays a name out for the cgroupfs driver as "/" + "/".join(names), and for the systemd driver
# (``ToSystemd``) replaces "-" by "_" in every name, joins the names with "-", adds ".slice" and
# expands the slice: ["custom", "kubepods", "burstable"] lives at
# custom.slice/custom-kubepods.slice/custom-kubepods-burstable.slice. The pod's cgroup parent
# that kubelet sends (RunPodSandbox, NRI) is its pod name laid out the same way. The functions
# below are the product's one copy of that rule: the QoS-level paths come from the root, and the
# root can be read back from a pod's cgroup parent.

KUBELET_ROOT_MAX_BYTES = 255
KUBELET_ROOT_MAX_NAMES = 8
# A cgroup parent longer than PATH_MAX is not one kubelet could have made.
CGROUP_PARENT_MAX_BYTES = 4096
_KUBEPODS = "kubepods"
_QOS_TIERS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {"Guaranteed": (), "Burstable": ("burstable",), "BestEffort": ("besteffort",)}
)
_TIER_QOS: Mapping[str, str] = MappingProxyType({"burstable": "Burstable", "besteffort": "BestEffort"})


def _shown(text: str) -> str:
    """``text`` for an error message: quoted, and cut when long (input may be hostile)."""
    return repr(text) if len(text) <= 80 else repr(text[:77]) + "..."


_CONTROL = re.compile("[\x00-\x1f\x7f]")


def _check_text(text: str, what: str) -> None:
    if "\x00" in text:
        raise ValueError(f"{what} contains NUL")
    found = _CONTROL.search(text)
    if found is not None:
        raise ValueError(f"{what}: a control character ({found.group()!r}) in {_shown(text)}")


def _check_names(names: Sequence[str], what: str) -> None:
    for name in names:
        if name in (".", ".."):
            raise ValueError(f"{what}: {name!r} is not a cgroup name")


def parse_kubelet_cgroup_root(text: str) -> str:
    """kubelet's ``cgroupRoot`` normalised: "/" or "/a/b" (one leading slash, no empty names).

    Accepts what kubelet's ``ParseCgroupfsToCgroupName`` reads ("custom", "/custom/" are
    "/custom"; "" is "/"). ``ValueError`` for a value that is not a string, is longer than
    ``KUBELET_ROOT_MAX_BYTES`` bytes or ``KUBELET_ROOT_MAX_NAMES`` names, holds NUL or another
    control character, or a "." or ".." name: nothing derived from it can leave the cgroup mount.
    """
    if not isinstance(text, str):
        raise ValueError(f"kubelet cgroup root must be a string, not {type(text).__name__}")
    if len(text) > KUBELET_ROOT_MAX_BYTES or len(text.encode("utf-8", "surrogatepass")) > KUBELET_ROOT_MAX_BYTES:
        raise ValueError(f"kubelet cgroup root longer than {KUBELET_ROOT_MAX_BYTES} bytes")
    _check_text(text, "kubelet cgroup root")
    names = [n for n in text.split("/") if n]
    if len(names) > KUBELET_ROOT_MAX_NAMES:
        raise ValueError(f"kubelet cgroup root deeper than {KUBELET_ROOT_MAX_NAMES} names")
    _check_names(names, "kubelet cgroup root")
    return "/" + "/".join(names)


def _layout(names: Sequence[str], driver: str) -> str:
    """A kubelet cgroup name as a path relative to a controller's root (see above)."""
    if driver == "systemd":
        escaped = [n.replace("-", "_") for n in names]
        return "/".join("-".join(escaped[: i + 1]) + ".slice" for i in range(len(escaped)))
    return "/".join(names)


@lru_cache(maxsize=256)
def _qos_path(kube_qos: str, driver: str, root: str) -> str:
    names = [n for n in root.split("/") if n]
    return _layout([*names, _KUBEPODS, *_QOS_TIERS[kube_qos]], driver)


def _cgroup_info(cgroup: CgroupInfo | str) -> CgroupInfo:
    return cgroup if isinstance(cgroup, CgroupInfo) else CgroupInfo(driver=cgroup)


def kube_qos_cgroup_path(kube_qos: str, cgroup: CgroupInfo | str = "cgroupfs") -> str:
    """kubelet's QoS directory relative to a controller's root ("Guaranteed" is the kubepods
    directory itself), below the node's kubelet cgroup root: ``node.cgroup`` (a ``CgroupInfo``);
    a bare driver name ("cgroupfs", "systemd") means kubelet's default root "/".

    ``kube_qos_cgroup_path("BestEffort", CgroupInfo(driver="systemd", kubelet_root="/custom"))``
    is ``custom.slice/custom-kubepods.slice/custom-kubepods-besteffort.slice``."""
    info = _cgroup_info(cgroup)
    return _qos_path(kube_qos, "systemd" if info.driver == "systemd" else "cgroupfs", info.kubelet_root)


def kubelet_root_key(root: str, driver: str) -> str:
    """What two kubelet cgroup roots are compared by: the kubepods directory each gives under
    ``driver`` (under systemd "/a-b" and "/a_b" are the same directory)."""
    return _qos_path("Guaranteed", "systemd" if driver == "systemd" else "cgroupfs", root)


@dataclass(frozen=True)
class KubeletPodParent:
    """What a kubelet pod cgroup parent says: kubelet's cgroup root (``parse_kubelet_cgroup_root``
    form), the driver whose layout the parent has, and the pod's Kubernetes QoS class."""

    root: str
    driver: str
    kube_qos: str


def _pod_names(names: Sequence[str]) -> tuple[Sequence[str], str]:
    """Split kubelet's pod cgroup name into (root names, QoS class), reading from the end."""
    if not names or len(names[-1]) <= len("pod") or not names[-1].startswith("pod"):
        raise ValueError("not a kubelet pod cgroup: the last name is not pod<uid>")
    if len(names) >= 2 and names[-2] == _KUBEPODS:
        return names[:-2], "Guaranteed"
    if len(names) >= 3 and names[-2] in _TIER_QOS and names[-3] == _KUBEPODS:
        return names[:-3], _TIER_QOS[names[-2]]
    raise ValueError("not a kubelet pod cgroup: no kubepods[/burstable|/besteffort] above the pod")


def parse_kubelet_pod_parent(cgroup_parent: str) -> KubeletPodParent:
    """Read a pod's cgroup parent as kubelet makes it: cgroupfs ``/custom/kubepods/burstable/pod<uid>``
    or systemd ``/custom.slice/custom-kubepods.slice/custom-kubepods-burstable.slice/
    custom-kubepods-burstable-pod<uid_>.slice`` (or that last name alone), giving root "/custom".

    Total and bounded: ``ValueError`` for anything else (empty, longer than
    ``CGROUP_PARENT_MAX_BYTES``, NUL or control characters, "." or "..", a systemd path whose
    directories are not the expansion of its last name, no ``kubepods`` above ``pod<uid>``, a
    root ``parse_kubelet_cgroup_root`` refuses)."""
    if not isinstance(cgroup_parent, str) or not cgroup_parent.strip("/"):
        raise ValueError("empty cgroup parent")
    if len(cgroup_parent) > CGROUP_PARENT_MAX_BYTES:
        raise ValueError(f"cgroup parent longer than {CGROUP_PARENT_MAX_BYTES} bytes")
    _check_text(cgroup_parent, "cgroup parent")
    dirs = [n for n in cgroup_parent.split("/") if n]
    _check_names(dirs, "cgroup parent")
    if dirs[-1].endswith(".slice"):
        driver = "systemd"
        escaped = dirs[-1][: -len(".slice")].split("-")
        if "" in escaped:
            raise ValueError(f"bad systemd slice name {_shown(dirs[-1])}")
        if len(dirs) > 1 and "/".join(dirs) != _layout(escaped, "systemd"):
            raise ValueError(f"systemd cgroup parent {_shown(cgroup_parent)} is not the expansion of its last slice")
        # kubelet's ParseSystemdToCgroupName: "_" was "-" in the name.
        names: Sequence[str] = [n.replace("_", "-") for n in escaped]
    else:
        driver, names = "cgroupfs", dirs
    root_names, kube_qos = _pod_names(names)
    return KubeletPodParent(parse_kubelet_cgroup_root("/" + "/".join(root_names)), driver, kube_qos)


@dataclass(frozen=True)
class KubeletRootChoice:
    """``choose_kubelet_root``'s answer: the root in use, where it came from (``config``, ``pods``
    or ``default``), and the pods left out of it with why (``other-root``: the parent is under
    another root; ``other-driver``: it has the other driver's layout; ``not-kubelet``: it is not
    a kubelet pod cgroup; the text says more), for the caller to log."""

    root: str
    source: str
    outliers: tuple[tuple[PodFacts, str, str], ...] = ()


def choose_kubelet_root(
    configured: str,
    driver: str,
    pods: Iterable[PodFacts],
    parse: Callable[[str], KubeletPodParent] = parse_kubelet_pod_parent,
) -> KubeletRootChoice:
    """kubelet's cgroup root for the QoS-level paths, by one rule:

    1. ``configured`` (the proxy config's ``kubeletCgroupRoot``), when not empty, is the root;
    2. else the root that most pods' cgroup parents show (``parse_kubelet_pod_parent``, in
       ``driver``'s layout), ties going to the smaller text (so "/" before "/custom");
    3. else "/", kubelet's default.

    A pod whose parent names another root, has the other driver's layout or is not a kubelet pod
    cgroup is an outlier: it never moves the root. Pods without a cgroup parent are left out
    silently. ``parse`` is ``parse_kubelet_pod_parent`` or a memo of it (the caller's, so a
    round over many pods parses only the new parents). ``ValueError`` only when ``configured``
    is not a valid root."""
    want = "systemd" if driver == "systemd" else "cgroupfs"
    fixed = parse_kubelet_cgroup_root(configured) if configured else ""
    outliers: list[tuple[PodFacts, str, str]] = []
    seen: list[tuple[PodFacts, KubeletPodParent]] = []
    for p in pods:
        if not p.cgroup_parent:
            continue
        try:
            parsed = parse(p.cgroup_parent)
        except ValueError as exc:
            outliers.append((p, "not-kubelet", str(exc)))
            continue
        if parsed.driver != want:
            outliers.append((p, "other-driver", f"cgroup parent in the {parsed.driver} layout, {want} configured"))
            continue
        seen.append((p, parsed))
    if fixed:
        root, source = fixed, "config"
    else:
        votes = Counter(kubelet_root_key(parsed.root, want) for _, parsed in seen)
        roots = {kubelet_root_key(parsed.root, want): parsed.root for _, parsed in reversed(seen)}
        if votes:
            best = min(votes, key=lambda k: (-votes[k], roots[k]))
            root, source = roots[best], "pods"
        else:
            root, source = "/", "default"
    key = kubelet_root_key(root, want)
    for p, parsed in seen:
        if kubelet_root_key(parsed.root, want) != key:
            outliers.append((p, "other-root", f"cgroup parent under kubelet cgroup root {parsed.root}, {root} in use"))
    return KubeletRootChoice(root, source, tuple(outliers))


def host_app_cgroup_path(
    app: nodeslo.HostApplication | Mapping[str, Any], cgroup: CgroupInfo | str = "cgroupfs"  # Any: JSON, decoded here
) -> str:
    """Koordinator's ``GetHostAppCgroupRelativePath``: base dir / parentDir / relativePath, or
    ``host-latency-sensitive/<name>`` (LSE/LSR/LS) / ``host-best-effort/<name>`` (BE) when no
    ``cgroupPath`` is given. The ``Kubepods*`` bases are kubelet's QoS directories below the
    node's kubelet cgroup root (``kube_qos_cgroup_path``; ``cgroup`` as there). ``ValueError``
    for a path that would leave the cgroup root; a mapping is decoded first (``FormatError``
    when it is not a host application)."""
    if not isinstance(app, nodeslo.HostApplication):
        app = nodeslo.host_application(app)
    cgp = app.cgroup_path
    if cgp is None:
        if app.qos in (keys.QOS_LSE, keys.QOS_LSR, keys.QOS_LS):
            parts = ["host-latency-sensitive", app.name]
        elif app.qos == keys.QOS_BE:
            parts = ["host-best-effort", app.name]
        else:
            parts = []
    else:
        base_dir = {
            keys.HOST_APP_BASE_CGROUP_ROOT: "",
            keys.HOST_APP_BASE_KUBEPODS: kube_qos_cgroup_path("Guaranteed", cgroup),
            keys.HOST_APP_BASE_KUBEPODS_BURSTABLE: kube_qos_cgroup_path("Burstable", cgroup),
            keys.HOST_APP_BASE_KUBEPODS_BESTEFFORT: kube_qos_cgroup_path("BestEffort", cgroup),
        }[cgp.base]
        parts = [base_dir, cgp.parent_dir, cgp.relative_path]
    pieces: list[str] = []
    for part in parts:
        if "\x00" in part:
            raise ValueError("host application path contains NUL")
        for piece in part.split("/"):
            if piece in ("", "."):
                continue
            if piece == "..":
                raise ValueError(f"host application path {'/'.join(parts)!r} escapes the cgroup root")
            pieces.append(piece)
    return "/".join(pieces)


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


# ---- the CFS quota of LS containers: CPU normalization, then CPU burst on top ------------------
#
# The one place that decides an LS (or label-less) container's CFS quota. Plugin
# ``cpu_normalization`` gives the runtime ``container_cpu_quota(...).quota``; plugin ``cpu_burst``
# derives ``cpu.cfs_burst_us`` from the same value, and the cfsQuotaBurst loop
# (``runtime_proxy.loops.burst``) scales the quota between that value and its ceiling. So the
# normalized quota is the base of both, and neither undoes the other.


def cpu_normalization_ratio(node_facts: NodeFacts) -> Fraction:
    """The node's ``node.koordinator.sh/cpu-normalization-ratio``; 1 (normalization off) when the
    annotation is missing or empty; ``FormatError`` when it is malformed or outside 1 to 5."""
    raw = node_facts.annotations.get(keys.NODE_ANNOTATION_CPU_NORMALIZATION_RATIO)
    if raw is None or raw == "":
        return Fraction(1)
    return node.parse_cpu_normalization_ratio(raw)


def normalize_cpu_quota(quota: int, ratio: Fraction) -> int:
    """Koordinator's normalized quota: ceil(quota / ratio) when ratio > 1 and quota > 0, else
    ``quota`` unchanged (exact arithmetic: 110000 / 1.1 is 100000, not 100001)."""
    if quota > 0 and ratio > 1:
        return math.ceil(quota / ratio)
    return quota


def cpu_normalization_applies(pod_facts: PodFacts) -> bool:
    """CPU normalization covers LS pods and pods without a valid QoS label. Koordinator leaves
    out such a pod when it has a resource-status cpuset; here neither class may hold one (see
    ``cpuset_claim_refusal``), so its cpuset is ignored and the pod is normalized."""
    return pod_facts.qos_label in (keys.QOS_LS, "")


def pod_cpu_burst_config(
    pod_facts: PodFacts, node_facts: NodeFacts, problems: list[str] | None = None
) -> CPUBurstConfig:
    """The NodeSLO ``cpuBurstStrategy`` merged with the pod's ``koordinator.sh/cpuBurst``;
    malformed parts are left at their defaults and described in ``problems``."""
    found: list[str] = [] if problems is None else problems
    cfg = nodeslo.cpu_burst(node_facts.node_slo, found)
    return nodeslo.cpu_burst_from_pod(cfg, pod_facts.annotations.get(keys.ANNOTATION_POD_CPU_BURST), found)


def _normalized_by_some_ratio(original: int, quota: int) -> bool:
    """Whether ``quota`` is ceil(original / r) for a valid ratio r (1.00 to 5.00, two decimals)."""
    if quota <= 0 or quota > original:
        return False
    # ceil(original x 100 / k) falls as k grows; the smallest k that brings it to quota or
    # below is the only candidate.
    k = max(100, -(-original * 100 // quota))
    return k <= 500 and -(-original * 100 // k) == quota


@dataclass(frozen=True)
class CPUQuota:
    """``container_cpu_quota``'s answer. ``quota`` is the CFS quota the container should have
    (its base before CPU burst); ``original`` is kubelet's quota it was derived from. When
    ``reason`` is set, normalization does not decide this container's quota: ``quota`` is the
    container's quota as it stands and ``original`` is 0."""

    quota: int
    original: int = 0
    reason: str = ""

    @property
    def decided(self) -> bool:
        return not self.reason


def container_cpu_quota(
    pod_facts: PodFacts, container: ContainerFacts, node_facts: NodeFacts, *, stage: str = "running"
) -> CPUQuota:
    """The container's CFS quota with CPU normalization applied.

    ``stage`` says what ``container.resources.cpu_quota`` holds:

    - ``"create"`` (PreCreateContainer): kubelet's quota, the original.
    - ``"update"`` (PreUpdateContainerResources, resources of the request over the stored
      ones): a new kubelet quota unless it is the quota the runtime already holds, that is the
      applied quota of the container's ``runtimeproxy.koordinator.sh/cpu-quota-normalization``
      record or the normalized original at the current ratio.
    - ``"running"`` (reconcile, PostStartContainer, the burst loop): the runtime's quota, which
      must come from the record's original (the applied quota, the original itself, or the
      original normalized by some valid ratio); otherwise the quota changed in a way the
      record does not explain (an update before the proxy restarted) and is left alone.

    A container without the record (created before this plugin ran) is left alone outside
    ``"create"``: its quota may already be normalized. ``FormatError`` when the ratio, the
    record or the pod's resource-status is malformed.
    """
    current = container.resources.cpu_quota
    if not cpu_normalization_applies(pod_facts):
        return CPUQuota(current, reason="not an LS or label-less pod without a cpuset")
    ratio = cpu_normalization_ratio(node_facts)
    if stage == "create":
        if current <= 0:
            return CPUQuota(current, reason="no CFS quota")
        return CPUQuota(normalize_cpu_quota(current, ratio), current)
    raw = container.annotations.get(keys.ANNOTATION_CPU_QUOTA_NORMALIZATION)
    if not raw:
        return CPUQuota(current, reason="no record of the quota kubelet asked for")
    original, applied = node.parse_cpu_quota_record(raw)
    target = normalize_cpu_quota(original, ratio)
    held = current in (applied, target)
    if stage == "update":
        if held:
            return CPUQuota(target, original)
        if current <= 0:
            return CPUQuota(current, reason="no CFS quota")
        return CPUQuota(normalize_cpu_quota(current, ratio), current)
    if held or current == original or _normalized_by_some_ratio(original, current):
        return CPUQuota(target, original)
    return CPUQuota(current, reason=f"quota {current} does not derive from the recorded {original}")
