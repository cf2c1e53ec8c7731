"""Frozen inputs handed to every plugin: what we know about a pod, a container and the node.

The proxy (``runtime_proxy.engine.intercept``) builds these values once per CRI call from the decoded
request and its store, and the planner (``runtime-proxy plan``) builds them from a JSON document.
Plugins only read them. Nothing here does I/O, so every plugin stays a pure function.

The kernel's CPU list format ("0-3,8") appears only at the edges, through the single
``parse_cpu_list`` / ``format_cpu_list`` pair; inside the code a CPU set is a ``frozenset[int]``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from fractions import Fraction
from types import MappingProxyType
from typing import Any

__all__ = [
    "ANNOTATION_DEVICE_ALLOCATED",
    "ANNOTATION_EXTENDED_RESOURCE_SPEC",
    "ANNOTATION_POD_CPU_BURST",
    "ANNOTATION_POD_CPU_QOS",
    "ANNOTATION_POD_RESCTRL",
    "ANNOTATION_RESOURCE_STATUS",
    "CFS_PERIOD_US",
    "CPUQOS",
    "CPU_BURST_POLICIES",
    "DEFAULT_GROUP_IDENTITY",
    "DEFAULT_RESCTRL",
    "HOST_APP_BASES",
    "KOORD_QOS_CLASSES",
    "KUBE_QOS_DIRS",
    "LABEL_QOS_CLASS",
    "LABEL_SKIP_HOOKSERVER",
    "MAX_SHARES",
    "MIN_QUOTA_US",
    "MIN_SHARES",
    "NODE_ANNOTATION_BE_CPU_SHARED_POOLS",
    "NODE_ANNOTATION_CPU_NORMALIZATION_RATIO",
    "NODE_ANNOTATION_CPU_SHARED_POOLS",
    "NODE_ANNOTATION_CPU_TOPOLOGY",
    "NODE_ANNOTATION_KUBELET_CPU_MANAGER_POLICY",
    "NODE_ANNOTATION_POD_CPU_ALLOCS",
    "NODE_ANNOTATION_RESERVATION",
    "NODE_ANNOTATION_SYSTEM_QOS_RESOURCE",
    "RESOURCE_BATCH_CPU",
    "RESOURCE_BATCH_MEMORY",
    "SLO_CLASS_KEYS",
    "CPUBurstConfig",
    "CPUInfo",
    "CPUSharePool",
    "CPUTopology",
    "CgroupInfo",
    "ContainerFacts",
    "NUMANodeResource",
    "NodeFacts",
    "PodFacts",
    "ResctrlFacts",
    "ResctrlQOS",
    "ResourceStatus",
    "Resources",
    "all_share_pool_cpus",
    "cgroup_path_of_parent",
    "class_bvt_value",
    "compute_share_pools",
    "container_cgroup_path",
    "format_cpu_list",
    "frozen_map",
    "group_identity_enabled",
    "host_app_cgroup_path",
    "is_safe_path_part",
    "kube_qos_cgroup_path",
    "kube_qos_from_cgroup_parent",
    "kubelet_cpu_manager_policy",
    "load_json_annotation",
    "milli_cpu_to_quota",
    "milli_cpu_to_shares",
    "parse_cpu_list",
    "parse_quantity",
    "parse_resource_status",
    "parse_share_pools",
    "pod_cgroup_path",
    "resolve_qos_class",
    "share_pools",
    "slo_cpu_burst",
    "slo_cpu_policy",
    "slo_cpu_qos",
    "slo_resctrl_qos",
    "system_qos_cpuset",
    "with_bound_pods",
]

LABEL_QOS_CLASS = "koordinator.sh/qosClass"
LABEL_SKIP_HOOKSERVER = "runtimeproxy.koordinator.sh/skip-hookserver"
KOORD_QOS_CLASSES = ("LSE", "LSR", "LS", "BE", "SYSTEM")

# Upper bound for CPU ids we accept from any input. Real machines stay far below it; the bound
# stops a hostile "0-99999999" from allocating a huge set.
MAX_CPU_ID = 16383

_EMPTY: Mapping[str, str] = MappingProxyType({})


def frozen_map(value: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """Return a read-only copy of ``value`` (an empty one for ``None``)."""
    if not value:
        return _EMPTY
    return MappingProxyType(dict(value))


def parse_cpu_list(text: str, *, limit: int = MAX_CPU_ID) -> frozenset[int]:
    """Parse the kernel's CPU list format ("0-3,8,10-11") into a set of CPU ids.

    An empty or blank string is the empty set. Raises ``ValueError`` with the offending part for
    anything else that is not a list of non-negative ids and ascending ranges no larger than
    ``limit`` ("0-", "3-1", "a", "-1" are all rejected).
    """
    text = text.strip()
    if not text:
        return frozenset()
    out: set[int] = set()
    for raw in text.split(","):
        part = raw.strip()
        if not part:
            raise ValueError(f"empty element in CPU list {text!r}")
        lo_s, sep, hi_s = part.partition("-")
        if not lo_s.isdigit() or (sep and not hi_s.isdigit()):
            raise ValueError(f"bad CPU list element {part!r}")
        lo = int(lo_s)
        hi = int(hi_s) if sep else lo
        if hi < lo:
            raise ValueError(f"descending range {part!r}")
        if hi > limit:
            raise ValueError(f"CPU id {hi} in {part!r} is above the limit {limit}")
        out.update(range(lo, hi + 1))
    return frozenset(out)


def format_cpu_list(cpus: Iterable[int]) -> str:
    """Format CPU ids in the kernel's list format, ranges collapsed, ascending ("0-3,8")."""
    ids = sorted(set(cpus))
    parts: list[str] = []
    i = 0
    while i < len(ids):
        j = i
        while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
            j += 1
        parts.append(str(ids[i]) if i == j else f"{ids[i]}-{ids[j]}")
        i = j + 1
    return ",".join(parts)


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
    hugepage_limits: tuple[tuple[str, int], ...] = ()

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> Resources:
        """Build from a mapping with the CRI field names; unknown keys raise ``ValueError``."""
        if not data:
            return cls()
        known = set(cls.field_names())
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown resource fields: {sorted(unknown)}")
        kwargs: dict[str, Any] = {}
        for name, value in data.items():
            if name == "unified":
                if not isinstance(value, Mapping):
                    raise ValueError("resources.unified must be a map")
                kwargs[name] = frozen_map({str(k): str(v) for k, v in value.items()})
            elif name == "hugepage_limits":
                kwargs[name] = tuple(
                    (str(item["page_size"]), int(item["limit"])) for item in value or ()
                )
            elif name in ("cpuset_cpus", "cpuset_mems"):
                if not isinstance(value, str):
                    raise ValueError(f"resources.{name} must be a string")
                kwargs[name] = value
            else:
                if isinstance(value, bool) or not isinstance(value, int):
                    raise ValueError(f"resources.{name} must be an integer")
                kwargs[name] = value
        return cls(**kwargs)

    def to_dict(self) -> dict[str, Any]:
        """All fields, with the CRI names; maps and lists as plain JSON values."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "unified":
                value = dict(value)
            elif f.name == "hugepage_limits":
                value = [{"page_size": p, "limit": lim} for p, lim in value]
            out[f.name] = value
        return out

    def with_changes(self, changes: Mapping[str, Any]) -> Resources:
        """A copy with the given fields replaced (used to show a plan's effect)."""
        merged = self.to_dict()
        merged.update(changes)
        return Resources.from_dict(merged)


def kube_qos_from_cgroup_parent(cgroup_parent: str) -> str:
    """Kubernetes QoS class implied by a pod's cgroup parent, as kubelet lays it out.

    Works for the cgroupfs form (``/kubepods/burstable/pod<uid>``) and the systemd form
    (``kubepods-burstable-pod<uid>.slice``). Returns "" when the parent is not a kubelet pod path.
    """
    lowered = cgroup_parent.lower()
    if "besteffort" in lowered:
        return "BestEffort"
    if "burstable" in lowered:
        return "Burstable"
    if "kubepods" in lowered:
        return "Guaranteed"
    return ""


def resolve_qos_class(labels: Mapping[str, str], kube_qos: str) -> str:
    """Koordinator QoS class of a pod: the ``koordinator.sh/qosClass`` label when it is one of
    LSE, LSR, LS, BE, SYSTEM; otherwise derived from the Kubernetes QoS class (Guaranteed -> LSR,
    Burstable -> LS, BestEffort -> BE); "" when neither is known.
    """
    label = labels.get(LABEL_QOS_CLASS, "")
    if label in KOORD_QOS_CLASSES:
        return label
    return {"Guaranteed": "LSR", "Burstable": "LS", "BestEffort": "BE"}.get(kube_qos, "")


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

    @property
    def qos_label(self) -> str:
        """The raw ``koordinator.sh/qosClass`` label if valid, else "" (no fallback)."""
        value = self.labels.get(LABEL_QOS_CLASS, "")
        return value if value in KOORD_QOS_CLASSES else ""

    @property
    def qos_class(self) -> str:
        """Koordinator QoS class with the fallback from the Kubernetes QoS class."""
        return resolve_qos_class(self.labels, self.kube_qos or kube_qos_from_cgroup_parent(self.cgroup_parent))

    @property
    def effective_kube_qos(self) -> str:
        return self.kube_qos or kube_qos_from_cgroup_parent(self.cgroup_parent)

    @property
    def skips_hooks(self) -> bool:
        """True for pods labelled ``runtimeproxy.koordinator.sh/skip-hookserver=true``."""
        return self.labels.get(LABEL_SKIP_HOOKSERVER, "") == "true"

    def replace(self, **changes: Any) -> PodFacts:
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

    def replace(self, **changes: Any) -> ContainerFacts:
        return replace(self, **changes)


@dataclass(frozen=True)
class CPUInfo:
    """One logical CPU in the ``node.koordinator.sh/cpu-topology`` shape."""

    id: int
    core: int
    socket: int
    node: int


@dataclass(frozen=True)
class CPUTopology:
    """The node's logical CPUs. Built from sysfs by the proxy or from the annotation."""

    cpus: tuple[CPUInfo, ...] = ()

    @property
    def all_cpus(self) -> frozenset[int]:
        return frozenset(c.id for c in self.cpus)

    def cpus_in_numa_node(self, node: int) -> frozenset[int]:
        return frozenset(c.id for c in self.cpus if c.node == node)

    def numa_nodes(self) -> tuple[int, ...]:
        return tuple(sorted({c.node for c in self.cpus}))

    def socket_of_numa_node(self, node: int) -> int:
        for c in self.cpus:
            if c.node == node:
                return c.socket
        return 0

    @classmethod
    def from_annotation(cls, data: Any) -> CPUTopology:
        """Parse ``{"detail":[{"id":0,"core":0,"socket":0,"node":0},...]}``; ValueError if bad."""
        if not isinstance(data, Mapping) or not isinstance(data.get("detail"), list):
            raise ValueError("cpu topology must be an object with a 'detail' list")
        cpus: list[CPUInfo] = []
        for item in data["detail"]:
            if not isinstance(item, Mapping):
                raise ValueError("cpu topology entries must be objects")
            values = [item.get(k, 0) for k in ("id", "core", "socket", "node")]
            if any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in values):
                raise ValueError(f"bad cpu topology entry {dict(item)!r}")
            if values[0] > MAX_CPU_ID:
                raise ValueError(f"cpu id {values[0]} out of range")
            cpus.append(CPUInfo(*values))
        return cls(tuple(sorted(cpus, key=lambda c: c.id)))

    def to_annotation(self) -> dict[str, Any]:
        return {"detail": [{"id": c.id, "core": c.core, "socket": c.socket, "node": c.node} for c in self.cpus]}


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


@dataclass(frozen=True)
class NodeFacts:
    """The node: its labels and annotations, NodeSLO spec, topology and what the proxy knows
    about pods already bound to CPUs. Rebuilt whenever the node config changes."""

    name: str = ""
    labels: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    # Node annotations merged with the NodeResourceTopology annotations (NRT wins).
    annotations: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    # The NodeSLO ``spec`` object as JSON (camelCase keys, as Koordinator defines them).
    node_slo: Mapping[str, Any] = field(default_factory=lambda: _EMPTY)
    cpu_topology: CPUTopology | None = None
    resctrl: ResctrlFacts = field(default_factory=ResctrlFacts)
    cgroup: CgroupInfo = field(default_factory=CgroupInfo)
    # cpusets that the proxy knows are bound to pods (pod uid -> CPUs, from resource-status).
    bound_cpusets: Mapping[str, frozenset[int]] = field(default_factory=lambda: MappingProxyType({}))
    # Pod uids of the bound cpusets above whose QoS class is LSE (their CPUs leave the BE pool).
    lse_pods: frozenset[str] = frozenset()

    def replace(self, **changes: Any) -> NodeFacts:
        return replace(self, **changes)


# ---- helpers shared by the built-in plugins and the proxy (pure; added for issues 4 and 5) ----
#
# Annotation and label keys, as Koordinator spells them.
ANNOTATION_RESOURCE_STATUS = "scheduling.koordinator.sh/resource-status"
ANNOTATION_DEVICE_ALLOCATED = "scheduling.koordinator.sh/device-allocated"
ANNOTATION_EXTENDED_RESOURCE_SPEC = "node.koordinator.sh/extended-resource-spec"
ANNOTATION_POD_RESCTRL = "node.koordinator.sh/resctrl"
ANNOTATION_POD_CPU_QOS = "koordinator.sh/cpuQOS"
ANNOTATION_POD_CPU_BURST = "koordinator.sh/cpuBurst"
NODE_ANNOTATION_CPU_TOPOLOGY = "node.koordinator.sh/cpu-topology"
NODE_ANNOTATION_CPU_SHARED_POOLS = "node.koordinator.sh/cpu-shared-pools"
NODE_ANNOTATION_BE_CPU_SHARED_POOLS = "node.koordinator.sh/be-cpu-shared-pools"
NODE_ANNOTATION_POD_CPU_ALLOCS = "node.koordinator.sh/pod-cpu-allocs"
NODE_ANNOTATION_KUBELET_CPU_MANAGER_POLICY = "kubelet.koordinator.sh/cpu-manager-policy"
NODE_ANNOTATION_SYSTEM_QOS_RESOURCE = "node.koordinator.sh/system-qos-resource"
NODE_ANNOTATION_RESERVATION = "node.koordinator.sh/reservation"
NODE_ANNOTATION_CPU_NORMALIZATION_RATIO = "node.koordinator.sh/cpu-normalization-ratio"
RESOURCE_BATCH_CPU = "kubernetes.io/batch-cpu"
RESOURCE_BATCH_MEMORY = "kubernetes.io/batch-memory"

# kubelet's cgroup conversions (pkg/kubelet/cm/cgroup_manager_linux.go, CFS helpers).
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


_QUANTITY_RE = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)([a-zA-Z]*)$")
_QUANTITY_SUFFIX: dict[str, Fraction | int] = {
    "": 1, "n": Fraction(1, 10**9), "u": Fraction(1, 10**6), "m": Fraction(1, 1000),
    "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
    "P": 10**15, "E": 10**18, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
}


def parse_quantity(value: Any) -> Fraction:
    """Parse a Kubernetes quantity ("4", "500m", "4Gi", 1000) into an exact ``Fraction``.

    Raises ``ValueError`` for anything else (booleans, negative numbers, unknown suffixes)."""
    if isinstance(value, bool):
        raise ValueError(f"bad quantity {value!r}")
    if isinstance(value, int | float):
        number = Fraction(value)
    elif isinstance(value, str):
        m = _QUANTITY_RE.match(value.strip())
        if not m or m.group(2) not in _QUANTITY_SUFFIX:
            raise ValueError(f"bad quantity {value!r}")
        try:
            number = Fraction(m.group(1)) * _QUANTITY_SUFFIX[m.group(2)]
        except (ValueError, ZeroDivisionError) as exc:
            raise ValueError(f"bad quantity {value!r}") from exc
    else:
        raise ValueError(f"bad quantity {value!r}")
    if number < 0:
        raise ValueError(f"negative quantity {value!r}")
    return number


def load_json_annotation(annotations: Mapping[str, str], key: str) -> Any:
    """The JSON value of an annotation, ``None`` when absent; ``ValueError`` when malformed."""
    raw = annotations.get(key)
    if raw is None or raw == "":
        return None
    try:
        return json.loads(raw)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"annotation {key} is not valid JSON: {exc}") from exc


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


KUBE_QOS_DIRS = {
    "cgroupfs": {"Guaranteed": "kubepods", "Burstable": "kubepods/burstable", "BestEffort": "kubepods/besteffort"},
    "systemd": {
        "Guaranteed": "kubepods.slice",
        "Burstable": "kubepods.slice/kubepods-burstable.slice",
        "BestEffort": "kubepods.slice/kubepods-besteffort.slice",
    },
}


def kube_qos_cgroup_path(kube_qos: str, driver: str = "cgroupfs") -> str:
    """kubelet's QoS directory ("Guaranteed" is the kubepods root itself)."""
    return KUBE_QOS_DIRS["systemd" if driver == "systemd" else "cgroupfs"][kube_qos]


# ---- pod annotations the scheduler writes ------------------------------------------------------


@dataclass(frozen=True)
class NUMANodeResource:
    """One entry of resource-status ``numaNodeResources``: a NUMA node and what the pod got."""

    node: int
    # Resource name -> quantity (exact fraction; cpu in cores, memory in bytes).
    resources: Mapping[str, Fraction] = field(default_factory=lambda: MappingProxyType({}))

    def has_cpu(self) -> bool:
        return bool(self.resources.get("cpu", 0)) or bool(self.resources.get(RESOURCE_BATCH_CPU, 0))


@dataclass(frozen=True)
class ResourceStatus:
    """``scheduling.koordinator.sh/resource-status``: the scheduler's CPU binding decision."""

    cpuset: frozenset[int] = frozenset()
    numa_node_resources: tuple[NUMANodeResource, ...] = ()


def parse_resource_status(annotations: Mapping[str, str]) -> ResourceStatus | None:
    """Decode the resource-status annotation; ``None`` when absent, ``ValueError`` when bad."""
    data = load_json_annotation(annotations, ANNOTATION_RESOURCE_STATUS)
    if data is None:
        return None
    if not isinstance(data, Mapping):
        raise ValueError("resource-status must be a JSON object")
    cpuset_text = data.get("cpuset", "")
    if not isinstance(cpuset_text, str):
        raise ValueError("resource-status cpuset must be a string")
    cpuset = parse_cpu_list(cpuset_text)
    numa: list[NUMANodeResource] = []
    raw_numa = data.get("numaNodeResources") or []
    if not isinstance(raw_numa, list):
        raise ValueError("resource-status numaNodeResources must be a list")
    for item in raw_numa:
        if not isinstance(item, Mapping):
            raise ValueError("numaNodeResources entries must be objects")
        node_id = item.get("node", 0)
        if isinstance(node_id, bool) or not isinstance(node_id, int) or not 0 <= node_id <= 1023:
            raise ValueError(f"bad NUMA node {node_id!r}")
        res = item.get("resources") or {}
        if not isinstance(res, Mapping):
            raise ValueError("numaNodeResources resources must be an object")
        numa.append(NUMANodeResource(node_id, frozen_map({str(k): parse_quantity(v) for k, v in res.items()})))
    return ResourceStatus(cpuset, tuple(numa))


# ---- CPU share pools -------------------------------------------------------------------------


@dataclass(frozen=True)
class CPUSharePool:
    """One entry of ``node.koordinator.sh/cpu-shared-pools``: the shared CPUs of a NUMA node."""

    socket: int
    node: int
    cpus: frozenset[int]

    def to_json(self) -> dict[str, Any]:
        return {"socket": self.socket, "node": self.node, "cpuset": format_cpu_list(self.cpus)}


def parse_share_pools(data: Any) -> tuple[CPUSharePool, ...]:
    """Decode ``[{"socket":0,"node":0,"cpuset":"1-5"}, ...]`` (``ValueError`` when bad)."""
    if not isinstance(data, list):
        raise ValueError("cpu share pools must be a JSON list")
    pools: list[CPUSharePool] = []
    for item in data:
        if not isinstance(item, Mapping):
            raise ValueError("cpu share pool entries must be objects")
        socket, node = item.get("socket", 0), item.get("node", 0)
        if any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in (socket, node)):
            raise ValueError(f"bad cpu share pool entry {dict(item)!r}")
        text = item.get("cpuset", "")
        if not isinstance(text, str):
            raise ValueError("cpu share pool cpuset must be a string")
        pools.append(CPUSharePool(socket, node, parse_cpu_list(text)))
    return tuple(pools)


def _cpuset_from_annotation(node: NodeFacts, key: str, field_name: str, *, exclusive_only: bool) -> frozenset[int]:
    data = load_json_annotation(node.annotations, key)
    if data is None:
        return frozenset()
    if not isinstance(data, Mapping):
        raise ValueError(f"annotation {key} must be a JSON object")
    if exclusive_only and data.get("cpusetExclusive") is not True:
        return frozenset()
    text = data.get(field_name, "")
    if not isinstance(text, str):
        raise ValueError(f"annotation {key} {field_name} must be a string")
    return parse_cpu_list(text)


def system_qos_cpuset(node: NodeFacts) -> frozenset[int]:
    """CPUs of ``node.koordinator.sh/system-qos-resource`` (``ValueError`` when malformed)."""
    return _cpuset_from_annotation(node, NODE_ANNOTATION_SYSTEM_QOS_RESOURCE, "cpuset", exclusive_only=False)


def kubelet_cpu_manager_policy(node: NodeFacts) -> str:
    """kubelet's CPU manager policy from the NRT annotation ("none" when unknown)."""
    try:
        data = load_json_annotation(node.annotations, NODE_ANNOTATION_KUBELET_CPU_MANAGER_POLICY)
    except ValueError:
        return "none"
    if isinstance(data, Mapping) and isinstance(data.get("policy"), str) and data["policy"]:
        return str(data["policy"])
    return "none"


def _kubelet_allocated_cpus(node: NodeFacts) -> frozenset[int]:
    data = load_json_annotation(node.annotations, NODE_ANNOTATION_POD_CPU_ALLOCS)
    if data is None:
        return frozenset()
    if not isinstance(data, list):
        raise ValueError(f"annotation {NODE_ANNOTATION_POD_CPU_ALLOCS} must be a JSON list")
    out: set[int] = set()
    for item in data:
        if isinstance(item, Mapping) and item.get("managedByKubelet") is True:
            text = item.get("cpuset", "")
            if not isinstance(text, str):
                raise ValueError("pod-cpu-allocs cpuset must be a string")
            out |= parse_cpu_list(text)
    return frozenset(out)


def compute_share_pools(node: NodeFacts, *, be: bool = False) -> tuple[CPUSharePool, ...]:
    """Share pools computed as koordlet does (``calCPUSharePools``), from ``node.cpu_topology``.

    LS pool: all CPUs minus every bound cpuset (LSE and LSR) and kubelet-static allocations.
    BE pool: all CPUs minus the LSE cpusets only (LSR cores are lent to BE).
    Both minus the reservation's ``reservedCPUs`` and exclusive system-QoS CPUs, grouped per
    (socket, NUMA node). Empty when the topology is unknown. ``ValueError`` on bad annotations.
    """
    topo = node.cpu_topology
    if topo is None or not topo.cpus:
        return ()
    taken: set[int] = set()
    for uid, cpus in node.bound_cpusets.items():
        if not be or uid in node.lse_pods:
            taken |= cpus
    if not be:
        taken |= _kubelet_allocated_cpus(node)
    taken |= _cpuset_from_annotation(node, NODE_ANNOTATION_RESERVATION, "reservedCPUs", exclusive_only=False)
    taken |= _cpuset_from_annotation(node, NODE_ANNOTATION_SYSTEM_QOS_RESOURCE, "cpuset", exclusive_only=True)
    groups: dict[tuple[int, int], set[int]] = {}
    for c in topo.cpus:
        if c.id not in taken:
            groups.setdefault((c.socket, c.node), set()).add(c.id)
    return tuple(CPUSharePool(s, n, frozenset(cpus)) for (s, n), cpus in sorted(groups.items()))


def share_pools(node: NodeFacts, *, be: bool = False) -> tuple[CPUSharePool, ...]:
    """The node's LS (or BE) share pools: the NodeResourceTopology annotation when present,
    else ``compute_share_pools``. ``ValueError`` when the annotation is malformed."""
    key = NODE_ANNOTATION_BE_CPU_SHARED_POOLS if be else NODE_ANNOTATION_CPU_SHARED_POOLS
    data = load_json_annotation(node.annotations, key)
    if data is not None:
        return parse_share_pools(data)
    return compute_share_pools(node, be=be)


def all_share_pool_cpus(pools: Iterable[CPUSharePool]) -> frozenset[int]:
    out: set[int] = set()
    for p in pools:
        out |= p.cpus
    return frozenset(out)


def with_bound_pods(node: NodeFacts, pods: Iterable[PodFacts]) -> NodeFacts:
    """``node`` with ``bound_cpusets``/``lse_pods`` rebuilt from the pods' resource-status
    cpusets (pods with a malformed annotation are left out)."""
    bound: dict[str, frozenset[int]] = {}
    lse: set[str] = set()
    for pod in pods:
        try:
            status = parse_resource_status(pod.annotations)
        except ValueError:
            continue
        if status is not None and status.cpuset:
            bound[pod.uid] = status.cpuset
            if pod.qos_label == "LSE":
                lse.add(pod.uid)
    return node.replace(bound_cpusets=MappingProxyType(bound), lse_pods=frozenset(lse))


# ---- NodeSLO accessors with Koordinator's defaults (pkg/util/sloconfig/nodeslo_config.go) -----

SLO_CLASS_KEYS = {"LSE": "lsrClass", "LSR": "lsrClass", "LS": "lsClass", "BE": "beClass", "SYSTEM": "systemClass"}
DEFAULT_GROUP_IDENTITY = {"lsrClass": 2, "lsClass": 2, "beClass": -1, "systemClass": 0}
DEFAULT_RESCTRL = {"lsrClass": (0, 100, 100), "lsClass": (0, 100, 100), "beClass": (0, 30, 100)}


def _section(data: Any, *keys: str) -> Mapping[str, Any]:
    for key in keys:
        if not isinstance(data, Mapping):
            return _EMPTY
        data = data.get(key)
    return data if isinstance(data, Mapping) else _EMPTY


def _typed(section: Mapping[str, Any], key: str, kind: type, default: Any, problems: list[str] | None) -> Any:
    if key not in section or section[key] is None:
        return default
    value = section[key]
    ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not ok:
        if problems is not None:
            problems.append(f"NodeSLO key {key}={value!r} is not a {kind.__name__}; using {default!r}")
        return default
    return value


@dataclass(frozen=True)
class CPUQOS:
    """``resourceQOSStrategy.<class>.cpuQOS`` after defaults."""

    enable: bool = False
    group_identity: int = 0
    sched_idle: int = 0


def slo_cpu_policy(node_slo: Mapping[str, Any]) -> str:
    """``resourceQOSStrategy.policies.cpuPolicy`` ("" when unset: group identity)."""
    value = _section(node_slo, "resourceQOSStrategy", "policies").get("cpuPolicy", "")
    return value if isinstance(value, str) else ""


def slo_cpu_qos(node_slo: Mapping[str, Any], class_key: str, problems: list[str] | None = None) -> CPUQOS:
    """cpuQOS of ``class_key`` (``lsrClass``, ``lsClass``, ``beClass``, ``systemClass``)."""
    sec = _section(node_slo, "resourceQOSStrategy", class_key, "cpuQOS")
    gi = _typed(sec, "groupIdentity", int, DEFAULT_GROUP_IDENTITY.get(class_key, 0), problems)
    if not -1 <= gi <= 2:
        if problems is not None:
            problems.append(f"groupIdentity {gi} of {class_key} is outside -1..2")
        gi = DEFAULT_GROUP_IDENTITY.get(class_key, 0)
    return CPUQOS(
        enable=_typed(sec, "enable", bool, False, problems),
        group_identity=gi,
        sched_idle=_typed(sec, "schedIdle", int, 0, problems),
    )


def group_identity_enabled(node_slo: Mapping[str, Any]) -> bool:
    """True when group identity is the CPU policy and any class enables cpuQOS."""
    if slo_cpu_policy(node_slo) not in ("", "groupIdentity"):
        return False
    return any(slo_cpu_qos(node_slo, k).enable for k in DEFAULT_GROUP_IDENTITY)


def class_bvt_value(node_slo: Mapping[str, Any], class_key: str) -> int:
    """The bvt value of a class: its groupIdentity when its cpuQOS is enabled, else 0."""
    q = slo_cpu_qos(node_slo, class_key)
    return q.group_identity if q.enable else 0


@dataclass(frozen=True)
class ResctrlQOS:
    """``resourceQOSStrategy.<class>.resctrlQOS`` after defaults."""

    enable: bool = False
    cat_range_start_percent: int = 0
    cat_range_end_percent: int = 100
    mba_percent: int = 100


def slo_resctrl_qos(node_slo: Mapping[str, Any], class_key: str, problems: list[str] | None = None) -> ResctrlQOS:
    sec = _section(node_slo, "resourceQOSStrategy", class_key, "resctrlQOS")
    start, end, mba = DEFAULT_RESCTRL.get(class_key, (0, 100, 100))
    return ResctrlQOS(
        enable=_typed(sec, "enable", bool, False, problems),
        cat_range_start_percent=_typed(sec, "catRangeStartPercent", int, start, problems),
        cat_range_end_percent=_typed(sec, "catRangeEndPercent", int, end, problems),
        mba_percent=_typed(sec, "mbaPercent", int, mba, problems),
    )


CPU_BURST_POLICIES = ("none", "cpuBurstOnly", "cfsQuotaBurstOnly", "auto")


@dataclass(frozen=True)
class CPUBurstConfig:
    """``cpuBurstStrategy`` (NodeSLO) merged with the pod's ``koordinator.sh/cpuBurst``."""

    policy: str = "none"
    cpu_burst_percent: int = 1000
    cfs_quota_burst_percent: int = 300
    cfs_quota_burst_period_seconds: int = -1
    share_pool_threshold_percent: int = 50

    @property
    def cpu_burst_enabled(self) -> bool:
        return self.policy in ("auto", "cpuBurstOnly")

    @property
    def cfs_quota_burst_enabled(self) -> bool:
        return self.policy in ("auto", "cfsQuotaBurstOnly")


def _burst_from(section: Mapping[str, Any], base: CPUBurstConfig, problems: list[str] | None) -> CPUBurstConfig:
    policy = _typed(section, "policy", str, base.policy, problems)
    if policy not in CPU_BURST_POLICIES:
        if problems is not None:
            problems.append(f"unknown cpu burst policy {policy!r}; using {base.policy!r}")
        policy = base.policy
    out = CPUBurstConfig(
        policy=policy,
        cpu_burst_percent=_typed(section, "cpuBurstPercent", int, base.cpu_burst_percent, problems),
        cfs_quota_burst_percent=_typed(section, "cfsQuotaBurstPercent", int, base.cfs_quota_burst_percent, problems),
        cfs_quota_burst_period_seconds=_typed(
            section, "cfsQuotaBurstPeriodSeconds", int, base.cfs_quota_burst_period_seconds, problems
        ),
        share_pool_threshold_percent=_typed(
            section, "sharePoolThresholdPercent", int, base.share_pool_threshold_percent, problems
        ),
    )
    if out.cpu_burst_percent < 0 or out.cfs_quota_burst_percent < 100 or out.share_pool_threshold_percent < 0:
        if problems is not None:
            problems.append("cpu burst percentages out of range; using the previous values")
        return base
    return out


def slo_cpu_burst(
    node_slo: Mapping[str, Any], pod_annotations: Mapping[str, str] | None = None, problems: list[str] | None = None
) -> CPUBurstConfig:
    """Node ``cpuBurstStrategy`` with Koordinator's defaults, then the pod annotation
    ``koordinator.sh/cpuBurst`` (JSON, same keys) merged over it. Malformed parts are reported
    in ``problems`` and ignored."""
    node_cfg = _burst_from(_section(node_slo, "cpuBurstStrategy"), CPUBurstConfig(), problems)
    if not pod_annotations:
        return node_cfg
    try:
        data = load_json_annotation(pod_annotations, ANNOTATION_POD_CPU_BURST)
    except ValueError as exc:
        if problems is not None:
            problems.append(str(exc))
        return node_cfg
    if data is None:
        return node_cfg
    if not isinstance(data, Mapping):
        if problems is not None:
            problems.append(f"annotation {ANNOTATION_POD_CPU_BURST} must be a JSON object")
        return node_cfg
    return _burst_from(data, node_cfg, problems)


HOST_APP_BASES = ("CgroupRoot", "Kubepods", "KubepodsBurstable", "KubepodsBesteffort")


def host_app_cgroup_path(app: Mapping[str, Any], driver: str = "cgroupfs") -> str:
    """Koordinator's ``GetHostAppCgroupRelativePath``: base dir / parentDir / relativePath, or
    ``host-latency-sensitive/<name>`` (LSE/LSR/LS) / ``host-best-effort/<name>`` (BE) when no
    ``cgroupPath`` is given. ``ValueError`` for a path that would leave the cgroup root."""
    name = app.get("name", "")
    qos = app.get("qos", "")
    if not isinstance(name, str) or not isinstance(qos, str):
        raise ValueError("host application name and qos must be strings")
    cgp = app.get("cgroupPath")
    if cgp is None:
        if qos in ("LSE", "LSR", "LS"):
            parts = ["host-latency-sensitive", name]
        elif qos == "BE":
            parts = ["host-best-effort", name]
        else:
            parts = []
    else:
        if not isinstance(cgp, Mapping):
            raise ValueError("hostApplications cgroupPath must be an object")
        base = cgp.get("base", "CgroupRoot") or "CgroupRoot"
        if base not in HOST_APP_BASES:
            raise ValueError(f"unknown cgroupPath base {base!r}")
        base_dir = {
            "CgroupRoot": "",
            "Kubepods": kube_qos_cgroup_path("Guaranteed", driver),
            "KubepodsBurstable": kube_qos_cgroup_path("Burstable", driver),
            "KubepodsBesteffort": kube_qos_cgroup_path("BestEffort", driver),
        }[base]
        parts = [base_dir]
        for key in ("parentDir", "relativePath"):
            value = cgp.get(key, "") or ""
            if not isinstance(value, str):
                raise ValueError(f"cgroupPath {key} must be a string")
            parts.append(value)
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
