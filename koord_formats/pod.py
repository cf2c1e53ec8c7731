"""Pod annotations the scheduler and the webhook write: resource-status, resource-spec,
numa-topology-spec, device-allocated and the batch extended-resource-spec.

Each parser takes the raw annotation text and returns a frozen value or raises
``FormatError``; the formatters write exactly what Koordinator's scheduler writes.

Formats (koordinator-sh/koordinator ``apis/extension/numa_aware.go``, ``device_share.go``,
``resource.go``):

- ``scheduling.koordinator.sh/resource-status``:
  ``{"cpuset":"2,54","numaNodeResources":[{"node":0,"resources":{"cpu":"4","memory":"8Gi"}}]}``
- ``scheduling.koordinator.sh/resource-spec``:
  ``{"requiredCPUBindPolicy":"FullPCPUs","preferredCPUBindPolicy":"SpreadByPCPUs","preferredCPUExclusivePolicy":"PCPULevel"}``
- ``scheduling.koordinator.sh/numa-topology-spec``:
  ``{"numaTopologyPolicy":"SingleNUMANode","singleNUMANodeExclusive":"Required"}``
- ``scheduling.koordinator.sh/device-allocated``:
  ``{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":"100",...},"id":"GPU-..."}]}``
- ``node.koordinator.sh/extended-resource-spec``:
  ``{"containers":{"c1":{"requests":{"kubernetes.io/batch-cpu":"1000"},"limits":{...}}}}``
- ``koordinator.sh/cpuQOS``: ``{"enable":true,"groupIdentity":-1}``
- ``koordinator.sh/eviction-policy``: ``["BEMemoryEvict","BECPUEvict"]``
- ``node.koordinator.sh/resctrl``: ``{"llc":{"schemata":{"range":[20,80]},
  "schemataPerCache":[{"cacheID":0,"range":[20,50]}]},"mb":{"schemata":{"percent":20}}}``

And one part of a Pod object itself (``parse_pod_batch_resources``): the batch resources its
containers ask for in ``spec.containers[].resources``, which the node agent reads from the
cluster when no ``extended-resource-spec`` annotation carries them (CRI does not carry extended
resources).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from types import MappingProxyType
from typing import Any

from koord_formats import keys
from koord_formats.bounded import (
    MAX_NAME_CHARS,
    load_json,
    memo_by_text,
    read_bool,
    read_int,
    read_list,
    read_object,
    read_str,
)
from koord_formats.cpulist import MAX_CPU_LIST_CHARS, format_cpu_list, parse_cpu_list
from koord_formats.errors import FormatError
from koord_formats.quantity import format_quantity, parse_quantity

__all__ = [
    "MAX_BATCH_MEMORY_BYTES",
    "MAX_BATCH_MILLI_CPU",
    "MAX_EVICTION_POLICY_CHARS",
    "MAX_NUMA_NODE_ID",
    "MAX_POD_CONTAINERS",
    "MAX_RESOURCES",
    "ContainerResourceSpec",
    "DeviceAllocation",
    "NUMANodeResource",
    "NUMATopologySpec",
    "PodBatchResources",
    "PodCPUQOS",
    "PodResctrl",
    "ResctrlSchemata",
    "ResourceSpec",
    "ResourceStatus",
    "batch_amounts",
    "eviction_allowed",
    "format_device_allocated",
    "format_extended_resource_spec",
    "format_resource_status",
    "parse_device_allocated",
    "parse_eviction_policy",
    "parse_extended_resource_spec",
    "parse_numa_topology_spec",
    "parse_pod_batch_resources",
    "parse_pod_cpu_qos",
    "parse_pod_resctrl",
    "parse_resource_spec",
    "parse_resource_status",
    "read_resource_list",
]

MAX_NUMA_NODE_ID = 1023
_MAX_CHARS = MAX_CPU_LIST_CHARS + 16 * 1024
_MAX_NUMA_ENTRIES = 64
MAX_RESOURCES = 64
_MAX_DEVICE_TYPES = 16
_MAX_DEVICES = 256
_MAX_CONTAINERS = 256
_MAX_MINOR = 65535


def read_resource_list(value: object, what: str) -> Mapping[str, Fraction]:
    """A Kubernetes ResourceList (name -> quantity), at most ``MAX_RESOURCES`` entries; ``{}``
    for null."""
    if value is None:
        return MappingProxyType({})
    doc = read_object(value, what)
    if len(doc) > MAX_RESOURCES:
        raise FormatError(f"{what}: more than {MAX_RESOURCES} resources")
    out: dict[str, Fraction] = {}
    for name, amount in doc.items():
        read_str(name, f"{what} name")
        try:
            out[name] = parse_quantity(amount)
        except FormatError as exc:
            raise FormatError(f"{what} {name[:64]}: {exc}") from None
    return MappingProxyType(out)


# ---- resource-status -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NUMANodeResource:
    """One entry of ``numaNodeResources``: a NUMA node and what the pod got there."""

    node: int
    # Resource name -> quantity in base units (cpu in cores, memory in bytes).
    resources: Mapping[str, Fraction] = field(default_factory=lambda: MappingProxyType({}))

    def has_cpu(self) -> bool:
        """True when the pod got CPU (or batch CPU) on this node."""
        return bool(self.resources.get("cpu", 0)) or bool(self.resources.get(keys.RESOURCE_BATCH_CPU, 0))


@dataclass(frozen=True, slots=True)
class ResourceStatus:
    """``scheduling.koordinator.sh/resource-status``: the scheduler's CPU and NUMA decision."""

    cpuset: frozenset[int] = frozenset()
    numa_node_resources: tuple[NUMANodeResource, ...] = ()


def _status_weight(status: ResourceStatus) -> int:
    return len(status.cpuset) + len(status.numa_node_resources)


@memo_by_text(maxsize=1024, weigh=_status_weight, max_weight=1024, large_chars=4 * _MAX_CHARS)
def parse_resource_status(text: str) -> ResourceStatus:
    """Parse ``scheduling.koordinator.sh/resource-status``."""
    what = "resource-status"
    doc = read_object(load_json(text, what, max_chars=_MAX_CHARS), what)
    cpuset_text = doc.get("cpuset")
    cpuset = (
        frozenset()
        if cpuset_text is None
        else parse_cpu_list(read_str(cpuset_text, f"{what} cpuset", MAX_CPU_LIST_CHARS))
    )
    raw = doc.get("numaNodeResources")
    numa: list[NUMANodeResource] = []
    for entry in [] if raw is None else read_list(raw, f"{what} numaNodeResources", _MAX_NUMA_ENTRIES):
        item = read_object(entry, f"{what} numaNodeResources entry")
        numa.append(
            NUMANodeResource(
                node=read_int(item.get("node", 0), f"{what} NUMA node", 0, MAX_NUMA_NODE_ID),
                resources=read_resource_list(item.get("resources"), f"{what} resources"),
            )
        )
    return ResourceStatus(cpuset, tuple(numa))


def format_resource_status(cpus: frozenset[int], numa: Mapping[int, Mapping[str, str]]) -> str | None:
    """The resource-status JSON the scheduler writes at bind, or ``None`` when there is nothing
    to write. ``numa`` maps a NUMA node to formatted quantities (``{"cpu":"4","memory":"8Gi"}``)."""
    doc: dict[str, Any] = {}
    if cpus:
        doc["cpuset"] = format_cpu_list(cpus)
    if numa:
        doc["numaNodeResources"] = [{"node": n, "resources": dict(numa[n])} for n in sorted(numa)]
    return json.dumps(doc, separators=(",", ":")) if doc else None


# ---- resource-spec and numa-topology-spec -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ResourceSpec:
    """``scheduling.koordinator.sh/resource-spec``: the pod's CPU bind and exclusive policies.

    Empty strings mean "not given"; ``keys.BIND_POLICY_DEFAULT`` is kept as written (the
    scheduler resolves it to its configured default, FullPCPUs in
    ``pkg/scheduler/apis/config/v1/defaults.go``).
    """

    required_cpu_bind_policy: str = ""
    preferred_cpu_bind_policy: str = ""
    preferred_cpu_exclusive_policy: str = ""


def _enum(doc: Mapping[str, Any], key: str, allowed: tuple[str, ...], what: str) -> str:
    value = doc.get(key)
    if value is None:
        return ""
    text = read_str(value, f"{what} {key}", 64)
    if text and text not in allowed:
        raise FormatError(f"{what}: unknown {key} {text!r}")
    return text


@memo_by_text(maxsize=1024)
def parse_resource_spec(text: str) -> ResourceSpec:
    """Parse ``scheduling.koordinator.sh/resource-spec``; unknown policy names are refused."""
    what = "resource-spec"
    doc = read_object(load_json(text, what, max_chars=16 * 1024), what)
    return ResourceSpec(
        required_cpu_bind_policy=_enum(doc, "requiredCPUBindPolicy", keys.BIND_POLICIES, what),
        preferred_cpu_bind_policy=_enum(doc, "preferredCPUBindPolicy", keys.BIND_POLICIES, what),
        preferred_cpu_exclusive_policy=_enum(doc, "preferredCPUExclusivePolicy", keys.EXCLUSIVE_POLICIES, what),
    )


@dataclass(frozen=True, slots=True)
class NUMATopologySpec:
    """``scheduling.koordinator.sh/numa-topology-spec``: a pod-level NUMA policy."""

    numa_topology_policy: str = ""  # one of keys.NUMA_POLICIES, "" when not given
    single_numa_node_exclusive: str = ""  # one of keys.NUMA_EXCLUSIVE_POLICIES, "" when not given


@memo_by_text(maxsize=1024)
def parse_numa_topology_spec(text: str) -> NUMATopologySpec:
    """Parse ``scheduling.koordinator.sh/numa-topology-spec``."""
    what = "numa-topology-spec"
    doc = read_object(load_json(text, what, max_chars=16 * 1024), what)
    return NUMATopologySpec(
        numa_topology_policy=_enum(doc, "numaTopologyPolicy", keys.NUMA_POLICIES, what),
        single_numa_node_exclusive=_enum(doc, "singleNUMANodeExclusive", keys.NUMA_EXCLUSIVE_POLICIES, what),
    )


# ---- device-allocated ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DeviceAllocation:
    """One device of ``device-allocated``: its minor number, what the pod got of it, its id."""

    minor: int
    # Resource name -> quantity (gpu-core and gpu-memory-ratio in percent, gpu-memory in bytes).
    resources: Mapping[str, Fraction] = field(default_factory=lambda: MappingProxyType({}))
    id: str = ""


@memo_by_text(maxsize=1024)
def parse_device_allocated(text: str) -> Mapping[str, tuple[DeviceAllocation, ...]]:
    """Parse ``scheduling.koordinator.sh/device-allocated``: device type ("gpu", "rdma", ...) ->
    its allocations. Entries' ``extension`` parts are not read."""
    what = "device-allocated"
    doc = read_object(load_json(text, what, max_chars=_MAX_CHARS), what)
    if len(doc) > _MAX_DEVICE_TYPES:
        raise FormatError(f"{what}: more than {_MAX_DEVICE_TYPES} device types")
    out: dict[str, tuple[DeviceAllocation, ...]] = {}
    for kind, entries in doc.items():
        read_str(kind, f"{what} device type", 64)
        devices: list[DeviceAllocation] = []
        for entry in read_list(entries, f"{what} {kind}", _MAX_DEVICES):
            item = read_object(entry, f"{what} {kind} entry")
            dev_id = item.get("id")
            devices.append(
                DeviceAllocation(
                    minor=read_int(item.get("minor"), f"{what} {kind} minor", 0, _MAX_MINOR),
                    resources=read_resource_list(item.get("resources"), f"{what} {kind} resources"),
                    id="" if dev_id is None else read_str(dev_id, f"{what} {kind} id", MAX_NAME_CHARS),
                )
            )
        out[kind] = tuple(devices)
    return MappingProxyType(out)


_BYTE_RESOURCES = frozenset({keys.RESOURCE_GPU_MEMORY})


def format_device_allocated(devices: Mapping[str, Sequence[DeviceAllocation]]) -> str | None:
    """The device-allocated JSON for ``devices`` (device type -> allocations), or ``None`` when
    no type has an allocation. Quantities are written as strings, memory with a binary suffix."""
    doc: dict[str, list[dict[str, Any]]] = {}
    for kind, allocs in devices.items():
        if not allocs:
            continue
        entries: list[dict[str, Any]] = []
        for a in allocs:
            entry: dict[str, Any] = {
                "minor": a.minor,
                "resources": {
                    name: format_quantity(value, binary=name in _BYTE_RESOURCES) for name, value in a.resources.items()
                },
            }
            if a.id:
                entry["id"] = a.id
            entries.append(entry)
        doc[kind] = entries
    return json.dumps(doc, separators=(",", ":")) if doc else None


# ---- extended-resource-spec --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ContainerResourceSpec:
    """One container of ``extended-resource-spec``: its extended requests and limits."""

    requests: Mapping[str, Fraction] = field(default_factory=lambda: MappingProxyType({}))
    limits: Mapping[str, Fraction] = field(default_factory=lambda: MappingProxyType({}))


@memo_by_text(maxsize=1024)
def parse_extended_resource_spec(text: str) -> Mapping[str, ContainerResourceSpec]:
    """Parse ``node.koordinator.sh/extended-resource-spec``: container name -> its spec."""
    what = "extended-resource-spec"
    doc = read_object(load_json(text, what, max_chars=64 * 1024), what)
    raw = doc.get("containers")
    containers = read_object({} if raw is None else raw, f"{what} containers")
    if len(containers) > _MAX_CONTAINERS:
        raise FormatError(f"{what}: more than {_MAX_CONTAINERS} containers")
    out: dict[str, ContainerResourceSpec] = {}
    for name, spec in containers.items():
        read_str(name, f"{what} container name")
        item = read_object(spec, f"{what} container {name[:64]}")
        out[name] = ContainerResourceSpec(
            requests=read_resource_list(item.get("requests"), f"{what} {name[:64]} requests"),
            limits=read_resource_list(item.get("limits"), f"{what} {name[:64]} limits"),
        )
    return MappingProxyType(out)


def format_extended_resource_spec(containers: Mapping[str, Mapping[str, Mapping[str, str]]]) -> str:
    """``node.koordinator.sh/extended-resource-spec`` from container name -> {"requests": {...},
    "limits": {...}} (quantities as strings), in the form ``parse_extended_resource_spec`` reads."""
    doc = {"containers": {name: {part: dict(spec.get(part, {})) for part in ("requests", "limits")}
                          for name, spec in containers.items()}}
    return json.dumps(doc, separators=(",", ":"), sort_keys=True)


# ---- a Pod object's batch resources -----------------------------------------------------------

# A pod of more containers than this is refused (kubelet runs nowhere near as many; the
# manager's pod decoder has the same bound, colocation_manager.objects.MAX_CONTAINERS).
MAX_POD_CONTAINERS = 1024
# The largest batch amounts taken, from either source (annotation or pod spec): 100,000 cores
# (a quota of 10^10 us, below the kernel's largest CFS quota) and 4 EiB. Above: a malformed pod.
MAX_BATCH_MILLI_CPU = 10**8
MAX_BATCH_MEMORY_BYTES = 2**62
_BATCH_RESOURCES = (keys.RESOURCE_BATCH_CPU, keys.RESOURCE_BATCH_MEMORY)
_BATCH_BOUNDS = {keys.RESOURCE_BATCH_CPU: MAX_BATCH_MILLI_CPU, keys.RESOURCE_BATCH_MEMORY: MAX_BATCH_MEMORY_BYTES}


def batch_amounts(section: Mapping[str, Fraction], what: str) -> Mapping[str, int]:
    """The batch resources of one requests or limits list as whole numbers (batch-cpu in
    milli-cores, batch-memory in bytes, rounded up); ``FormatError`` above ``MAX_BATCH_MILLI_CPU``
    or ``MAX_BATCH_MEMORY_BYTES``. Other resources are left out."""
    out: dict[str, int] = {}
    for name in _BATCH_RESOURCES:
        if name in section:
            amount = -(-section[name].numerator // section[name].denominator)
            if amount > _BATCH_BOUNDS[name]:
                raise FormatError(f"{what} {name}: {amount} is above {_BATCH_BOUNDS[name]}")
            out[name] = amount
    return MappingProxyType(out)


def _memory_amount(section: Mapping[str, Fraction], what: str) -> Mapping[str, int]:
    """The plain ``memory`` of one requests or limits list in bytes (rounded up), for the
    ``memory_qos`` plugin; ``FormatError`` above ``MAX_BATCH_MEMORY_BYTES``."""
    if keys.RESOURCE_MEMORY not in section:
        return {}
    value = section[keys.RESOURCE_MEMORY]
    amount = -(-value.numerator // value.denominator)
    if amount > MAX_BATCH_MEMORY_BYTES:
        raise FormatError(f"{what} memory: {amount} is above {MAX_BATCH_MEMORY_BYTES}")
    return {keys.RESOURCE_MEMORY: amount}


@dataclass(frozen=True, slots=True)
class PodBatchResources:
    """What a Pod object says of its batch resources: its identity and, for each container of
    ``spec.containers`` that asks for any, its batch requests and limits, and its plain
    ``memory`` request and limit (the ``memory_qos`` plugin's input; CRI does not carry the
    request). A limit without a request gives the request (the API server's defaulting)."""

    uid: str
    namespace: str
    name: str
    containers: Mapping[str, ContainerResourceSpec]


def _present(value: object, default: object) -> object:
    """``value``, or ``default`` for an absent (null) one; a present value of the wrong type stays
    so its reader refuses it."""
    return default if value is None else value


def parse_pod_batch_resources(obj: object) -> PodBatchResources:
    """The batch resources of a Pod object as decoded JSON (a watch event's ``object``).
    Total: ``FormatError`` for a pod without a uid, with more than ``MAX_POD_CONTAINERS``
    containers, a repeated container name, a resource list that is not one, or a batch amount
    above its bound. Only metadata and ``spec.containers`` are read."""
    pod = read_object(obj, "pod")
    meta = read_object(_present(pod.get("metadata"), {}), "pod metadata")
    uid = read_str(meta.get("uid"), "pod metadata.uid", 128)
    if not uid:
        raise FormatError("pod metadata.uid: empty")
    namespace = read_str(meta.get("namespace", ""), "pod metadata.namespace")
    name = read_str(meta.get("name", ""), "pod metadata.name")
    what = f"pod {namespace[:64]}/{name[:64]}"
    spec = read_object(_present(pod.get("spec"), {}), f"{what} spec")
    containers = read_list(_present(spec.get("containers"), []), f"{what} containers", MAX_POD_CONTAINERS)
    seen: set[str] = set()
    out: dict[str, ContainerResourceSpec] = {}
    for item in containers:
        container = read_object(item, f"{what} container")
        cname = read_str(container.get("name"), f"{what} container name")
        if cname in seen:
            raise FormatError(f"{what}: container {cname[:64]!r} twice")
        seen.add(cname)
        resources = read_object(_present(container.get("resources"), {}), f"{what} {cname[:64]} resources")
        where = f"{what} {cname[:64]}"
        limit_list = read_resource_list(resources.get("limits"), f"{where} limits")
        request_list = read_resource_list(resources.get("requests"), f"{where} requests")
        limits = {**batch_amounts(limit_list, f"{where} limits"), **_memory_amount(limit_list, f"{where} limits")}
        requests = {**limits, **batch_amounts(request_list, f"{where} requests"),
                    **_memory_amount(request_list, f"{where} requests")}
        if requests or limits:
            out[cname] = ContainerResourceSpec(
                requests=MappingProxyType({k: Fraction(v) for k, v in requests.items()}),
                limits=MappingProxyType({k: Fraction(v) for k, v in limits.items()}),
            )
    return PodBatchResources(uid, namespace, name, MappingProxyType(out))


# ---- pod-level QoS overrides: cpuQOS and resctrl ------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PodCPUQOS:
    """``koordinator.sh/cpuQOS`` (apis/slo/v1alpha1/pod.go ``CPUQOSCfg``), which koordlet honours
    for LS pods only."""

    enable: bool = False  # absent means disabled: the pod's cpu.bvt_warp_ns is 0
    group_identity: int | None = None  # -1..2; None: the LS class value


@memo_by_text(maxsize=1024)
def parse_pod_cpu_qos(text: str) -> PodCPUQOS:
    """Parse ``koordinator.sh/cpuQOS`` (``{"enable":true,"groupIdentity":-1}``)."""
    what = "cpuQOS"
    doc = read_object(load_json(text, what, max_chars=4096), what)
    enable = doc.get("enable")
    gi = doc.get("groupIdentity")
    return PodCPUQOS(
        enable=False if enable is None else read_bool(enable, f"{what} enable"),
        group_identity=None if gi is None else read_int(gi, f"{what} groupIdentity", -1, 2),
    )


@dataclass(frozen=True, slots=True)
class ResctrlSchemata:
    """One resource (``llc`` or ``mb``) of ``node.koordinator.sh/resctrl``: a default for every
    cache id and overrides per cache id. For ``llc`` the values are ``(start, end)`` percent
    ranges, for ``mb`` bandwidth percentages."""

    default: tuple[int, int] | int | None = None
    per_cache: Mapping[int, tuple[int, int] | int] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True, slots=True)
class PodResctrl:
    """``node.koordinator.sh/resctrl`` (apis/extension/resctrl.go ``ResctrlConfig``)."""

    llc: ResctrlSchemata | None = None
    mb: ResctrlSchemata | None = None


_MAX_CACHES = 256


def _schemata(value: object, what: str, *, ranges: bool) -> ResctrlSchemata:
    doc = read_object(value, what)

    def one(entry: Mapping[str, Any], where: str) -> tuple[int, int] | int | None:
        if ranges:
            raw = entry.get("range")
            if raw is None:
                return None
            pair = read_list(raw, f"{where} range", 2)
            if len(pair) != 2:
                raise FormatError(f"{where} range: expected [start, end]")
            return (read_int(pair[0], f"{where} range start", 0, 100), read_int(pair[1], f"{where} range end", 0, 100))
        raw = entry.get("percent")
        return None if raw is None else read_int(raw, f"{where} percent", 0, 100)

    base = doc.get("schemata")
    default = None if base is None else one(read_object(base, f"{what} schemata"), f"{what} schemata")
    per_cache: dict[int, tuple[int, int] | int] = {}
    raw_list = doc.get("schemataPerCache")
    for entry in [] if raw_list is None else read_list(raw_list, f"{what} schemataPerCache", _MAX_CACHES):
        item = read_object(entry, f"{what} schemataPerCache entry")
        cache_id = read_int(item.get("cacheID", 0), f"{what} cacheID", 0, 4095)
        value_ = one(item, f"{what} cache {cache_id}")
        if value_ is not None:
            per_cache[cache_id] = value_
    return ResctrlSchemata(default, MappingProxyType(per_cache))


@memo_by_text(maxsize=1024)
def parse_pod_resctrl(text: str) -> PodResctrl:
    """Parse ``node.koordinator.sh/resctrl``; ``FormatError`` also when it has neither ``llc``
    nor ``mb``."""
    what = "resctrl"
    doc = read_object(load_json(text, what, max_chars=64 * 1024), what)
    llc, mb = doc.get("llc"), doc.get("mb")
    if llc is None and mb is None:
        raise FormatError(f"{what}: neither llc nor mb is given")
    return PodResctrl(
        llc=None if llc is None else _schemata(llc, f"{what} llc", ranges=True),
        mb=None if mb is None else _schemata(mb, f"{what} mb", ranges=False),
    )


# ---- eviction-policy ----------------------------------------------------------------------------------

MAX_EVICTION_POLICY_CHARS = 4096
_MAX_EVICTION_FEATURES = 32


@memo_by_text(maxsize=256)
def parse_eviction_policy(text: str) -> frozenset[str]:
    """Parse ``koordinator.sh/eviction-policy``: a JSON list of eviction feature names
    (``["BEMemoryEvict","BECPUEvict"]``), the features allowed to evict the pod. Names are kept
    as given (unknown ones allow nothing); at most 32 names of at most 253 characters."""
    what = "eviction-policy"
    items = read_list(load_json(text, what, max_chars=MAX_EVICTION_POLICY_CHARS), what, _MAX_EVICTION_FEATURES)
    return frozenset(read_str(item, f"{what} feature") for item in items)


def eviction_allowed(annotations: Mapping[str, str], feature: str) -> bool:
    """True when the pod's ``koordinator.sh/eviction-policy`` lets ``feature`` evict it: the
    annotation is absent (every feature may) or lists ``feature``. ``FormatError`` when it is
    malformed."""
    raw = annotations.get(keys.ANNOTATION_EVICTION_POLICY)
    if raw is None:
        return True
    return feature in parse_eviction_policy(raw)
