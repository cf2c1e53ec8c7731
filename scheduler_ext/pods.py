"""What a pod asks for, decoded once from its JSON into a frozen ``PodRequest``.

Who calls this: ``scheduler_ext.server`` decodes (``guard.decode_pod``) the ``Pod`` of every filter, prioritize and
preempt call here, and ``scheduler_ext.state`` decodes pending pods from the watch (bind only
carries names). Nothing here looks at nodes. ``parse_pod`` is total: malformed input of any
shape becomes ``PodRequest.error``, which the filter reports on every node instead of failing
the HTTP call; inside, every problem is a ``koord_formats.FormatError``.

Koordinator semantics (``koordinator.md`` 3, 4.1 and 4.4); the formats are parsed by
``koord_formats`` (quantities, QoS and priority classes, resource-spec, numa-topology-spec):

- QoS from the pod's QoS label only; priority class from the priority-class label or the
  ``spec.priority`` range, defaulting by QoS (``koord_formats.qos.priority_class``).
- A pod wants a cpuset when it is LSE or LSR, its priority class is koord-prod and its CPU
  request is a whole number of cores. A node's cpu-bind-policy label can force binding for
  other integer requests (decided in ``extender``, since it depends on the node).
- resource-spec gives bind and exclusive policies; the default bind policy is FullPCPUs
  (preferred), as in koord-scheduler's defaults.
- GPU requests are validated and normalised as koord-scheduler's deviceshare plugin does
  (``parse_gpu_request``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from koord_formats import keys
from koord_formats.bounded import read_list, read_object, read_str
from koord_formats.errors import FormatError
from koord_formats.pod import parse_numa_topology_spec, parse_resource_spec
from koord_formats.qos import priority_class, qos_label
from koord_formats.quantity import parse_quantity
from koord_formats.reservation import (
    ReservationAffinity,
    parse_reservation_affinity,
    read_labels,
    read_owner_references,
)
from scheduler_ext.reservations import PodIdentity

__all__ = [
    "MAX_CONTAINERS",
    "GPURequest",
    "PodRequest",
    "exclusive_policy_of",
    "parse_gpu_request",
    "parse_pod",
    "quantity",
]

# Containers (and, separately, init containers) one pod may list here; real pods have a few.
MAX_CONTAINERS = 1024
# Resource names one container's requests or limits may list.
MAX_RESOURCE_NAMES = 256

NVIDIA_GPU = keys.RESOURCE_NVIDIA_GPU
KOORD_GPU = keys.RESOURCE_GPU
GPU_SHARED = keys.RESOURCE_GPU_SHARED
GPU_CORE = keys.RESOURCE_GPU_CORE
GPU_MEMORY = keys.RESOURCE_GPU_MEMORY
GPU_MEMORY_RATIO = keys.RESOURCE_GPU_MEMORY_RATIO
_CPU = "cpu"
_MEMORY = "memory"
_WANTED = (_CPU, _MEMORY, *keys.GPU_RESOURCE_NAMES)


@dataclass(frozen=True, slots=True)
class GPURequest:
    """A normalised GPU request: ``count`` GPUs, each needing the per-GPU amounts below."""

    count: int
    core: int  # per GPU, percent of the card's compute
    ratio: int  # per GPU, percent of the card's memory; 0 when ``memory`` is given instead
    memory: int  # per GPU, bytes; 0 when ``ratio`` is given instead

    @property
    def exclusive(self) -> bool:
        """Whole cards: every chosen GPU must be completely free."""
        return self.core >= 100 and self.ratio >= 100

    @property
    def key(self) -> tuple[int, int, int, int]:
        return (self.count, self.core, self.ratio, self.memory)


@dataclass(frozen=True, slots=True)
class PodRequest:
    """The scheduling-relevant content of one pod; fields never change after parsing."""

    uid: str
    namespace: str
    name: str
    qos: str  # koordinator.sh/qosClass value, "" when absent or unknown
    priority_class: str  # koord-prod | koord-mid | koord-batch | koord-free
    cpu_milli: int  # effective pod CPU request
    memory: int  # effective pod memory request, bytes
    bind_policy: str  # FullPCPUs | SpreadByPCPUs | ConstrainedBurst ("Default" resolved)
    bind_required: bool  # from requiredCPUBindPolicy
    exclusive_policy: str  # None | PCPULevel | NUMANodeLevel
    numa_policy: str  # "" when the pod does not say
    numa_exclusive: str  # singleNUMANodeExclusive as written: Required | Preferred | ""
    gpu: GPURequest | None
    error: str  # "" when valid; otherwise why the pod cannot be placed anywhere
    # what reservation owners match against (labels, owner references, apiVersion)
    identity: PodIdentity = field(default_factory=PodIdentity)
    # the pod's required reservation affinity (``reservation-affinity``), None when it has none
    reservation_affinity: ReservationAffinity | None = None
    # the reserve pod of a Reservation being placed (``scheduler_ext.reserve``): it is never
    # placed into another reservation (koord-scheduler skips reserve pods in its reservation plugin)
    reserve: bool = False

    @property
    def full_name(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def integer_cpu(self) -> bool:
        return self.cpu_milli > 0 and self.cpu_milli % 1000 == 0

    @property
    def cpus(self) -> int:
        return self.cpu_milli // 1000

    @property
    def koord_wants_cpuset(self) -> bool:
        """LSE/LSR, koord-prod and a whole number of cores (``AllowUseCPUSet``)."""
        return (
            self.qos in (keys.QOS_LSE, keys.QOS_LSR)
            and self.priority_class == keys.PRIORITY_PROD
            and self.integer_cpu
            and self.bind_policy != keys.BIND_POLICY_CONSTRAINED_BURST
        )

    @property
    def key(self) -> tuple[object, ...]:
        """Everything that decides feasibility and score on a node (cache key)."""
        return (
            self.qos,
            self.priority_class,
            self.cpu_milli,
            self.memory,  # NUMA zones and the node's allocatable count memory
            self.bind_policy,
            self.bind_required,
            self.exclusive_policy,
            self.numa_policy,
            self.numa_exclusive,
            self.gpu.key if self.gpu else None,
            self.error,
            self.reservation_affinity is not None,
            self.reserve,
        )


def _object(value: object, what: str) -> Mapping[str, Any]:
    """A JSON object, an absent one (``None``) read as empty; ``FormatError`` otherwise."""
    return {} if value is None else read_object(value, what)


def _container_amounts(container: object, what: str) -> dict[str, Any]:
    resources = _object(read_object(container, what).get("resources"), f"{what} resources")
    requests = dict(_object(resources.get("requests"), f"{what} requests"))
    limits = _object(resources.get("limits"), f"{what} limits")
    if len(requests) > MAX_RESOURCE_NAMES or len(limits) > MAX_RESOURCE_NAMES:
        raise FormatError(f"{what}: more than {MAX_RESOURCE_NAMES} resource names")
    for name, value in limits.items():
        requests.setdefault(name, value)  # the API server defaults requests from limits
    return requests


def _pod_amounts(spec: Mapping[str, Any]) -> dict[str, Fraction]:
    """Effective pod request per wanted name: max(sum of containers, largest init container)."""
    total: dict[str, Fraction] = {}
    for c in read_list(spec.get("containers") or [], "containers", MAX_CONTAINERS):
        for name, value in _container_amounts(c, "container").items():
            if name in _WANTED:
                total[name] = total.get(name, Fraction(0)) + _quantity(name, value)
    for c in read_list(spec.get("initContainers") or [], "initContainers", MAX_CONTAINERS):
        for name, value in _container_amounts(c, "init container").items():
            if name in _WANTED:
                total[name] = max(total.get(name, Fraction(0)), _quantity(name, value))
    return total


@functools.lru_cache(maxsize=1024)
def _quantity_text(text: str) -> Fraction:
    return parse_quantity(text)


def quantity(value: object) -> Fraction:
    """``koord_formats.quantity.parse_quantity``, memoised for strings: requests and Device
    capacities repeat a handful of texts ("4", "8Gi", "100") across thousands of objects."""
    if isinstance(value, str):
        return _quantity_text(value)
    return parse_quantity(value)


def _quantity(name: str, value: object) -> Fraction:
    try:
        return quantity(value)
    except FormatError as exc:
        raise FormatError(f"{name}: {exc}") from None


def _percent(name: str, value: Fraction) -> int:
    if value.denominator != 1 or value < 0:
        raise FormatError(f"{name} must be a whole percentage, got {float(value):g}")
    n = int(value)
    if n > 100 and n % 100 != 0:
        raise FormatError(f"{name}={n}: percentages above 100 must be multiples of 100")
    return n


def parse_gpu_request(amounts: Mapping[str, Fraction]) -> GPURequest | None:
    """Validate and normalise the GPU part of a pod's request (``None`` when it has none);
    ``FormatError`` for a combination koord-scheduler refuses.

    Valid combinations: a whole-card name alone, gpu-memory alone, gpu-memory-ratio alone,
    gpu-core with gpu-memory or gpu-memory-ratio, optionally with gpu.shared as the GPU count.
    """
    present = {k for k, v in amounts.items() if v > 0}
    if not present:
        return None
    full = present & {NVIDIA_GPU, KOORD_GPU}
    if full:
        if len(present) > 1:
            raise FormatError(f"invalid resource device requests: {sorted(present)}")
        if NVIDIA_GPU in full:
            n = amounts[NVIDIA_GPU]
            if n.denominator != 1:
                raise FormatError(f"{NVIDIA_GPU} must be a whole number of GPUs")
            return GPURequest(count=int(n), core=100, ratio=100, memory=0)
        pct = _percent(KOORD_GPU, amounts[KOORD_GPU])
        count = max(1, pct // 100)
        return GPURequest(count=count, core=pct // count, ratio=pct // count, memory=0)
    core = _percent(GPU_CORE, amounts[GPU_CORE]) if GPU_CORE in present else 0
    ratio = _percent(GPU_MEMORY_RATIO, amounts[GPU_MEMORY_RATIO]) if GPU_MEMORY_RATIO in present else 0
    memory = math.ceil(amounts[GPU_MEMORY]) if GPU_MEMORY in present else 0
    if not ratio and not memory:
        raise FormatError("invalid resource device requests: gpu-core needs gpu-memory or gpu-memory-ratio")
    if ratio and memory:
        raise FormatError("invalid resource device requests: gpu-memory and gpu-memory-ratio together")
    if GPU_SHARED in present:
        shared = amounts[GPU_SHARED]
        if shared.denominator != 1:
            raise FormatError(f"{GPU_SHARED} must be a whole number of GPUs")
        count = int(shared)
    elif ratio > 100:
        count = ratio // 100
    elif core > 100:
        count = core // 100
    else:
        count = 1
    if core % count or ratio % count or memory % count:
        raise FormatError(f"GPU request does not split evenly over {count} GPUs")
    per_core, per_ratio, per_mem = core // count, ratio // count, memory // count
    if per_core > 100 or per_ratio > 100:
        raise FormatError("a GPU cannot give more than 100% of its core or memory")
    return GPURequest(count=count, core=per_core, ratio=per_ratio, memory=per_mem)


def _annotation_text(annotations: Mapping[str, Any], key: str) -> str:
    """The annotation's text, "" when absent; ``FormatError`` when it is not a string."""
    value = annotations.get(key)
    if value is None:
        return ""
    return read_str(value, key, 1 << 20)


def exclusive_policy_of(annotations: Mapping[str, Any]) -> str:
    """The preferred CPU exclusive policy of a placed pod's resource-spec, for later pods to
    avoid. ``None`` when absent or unreadable: the CPUs the pod holds come from its
    resource-status, so a bad resource-spec only loses this preference, never the CPUs."""
    try:
        text = _annotation_text(annotations, keys.ANNOTATION_RESOURCE_SPEC)
        policy = parse_resource_spec(text).preferred_cpu_exclusive_policy if text else ""
    except FormatError:
        return keys.EXCLUSIVE_POLICY_NONE
    return policy or keys.EXCLUSIVE_POLICY_NONE


def _identity(meta: Mapping[str, Any], key: str, default: str) -> str:
    value = meta.get(key)
    return default if value is None or value == "" else read_str(value, f"metadata.{key}")


def parse_pod(pod: object) -> PodRequest:
    """Decode a v1.Pod (API JSON). Never raises, whatever the input: see ``PodRequest.error``."""
    error = ""
    uid, namespace, name = "", "default", ""
    qos, prio_class = "", keys.PRIORITY_PROD
    cpu_milli = memory = 0
    gpu: GPURequest | None = None
    bind_policy, bind_required = keys.BIND_POLICY_FULL_PCPUS, False
    exclusive, numa_policy, numa_exclusive = keys.EXCLUSIVE_POLICY_NONE, "", ""
    identity = PodIdentity()
    affinity: ReservationAffinity | None = None
    try:
        doc = read_object(pod, "pod")
        meta = _object(doc.get("metadata"), "metadata")
        spec = _object(doc.get("spec"), "spec")
        uid = _identity(meta, "uid", "")
        namespace = _identity(meta, "namespace", "default")
        name = _identity(meta, "name", "")
        labels = _object(meta.get("labels"), "labels")
        annotations = _object(meta.get("annotations"), "annotations")
        qos = qos_label(labels)
        prio_class = priority_class(labels, spec.get("priority"), qos)
        amounts = _pod_amounts(spec)
        cpu_milli = math.ceil(amounts[_CPU] * 1000) if _CPU in amounts else 0
        memory = math.ceil(amounts.get(_MEMORY, Fraction(0)))
        text = _annotation_text(annotations, keys.ANNOTATION_RESOURCE_SPEC)
        if text:
            res_spec = parse_resource_spec(text)
            required = res_spec.required_cpu_bind_policy
            chosen = required or res_spec.preferred_cpu_bind_policy
            bind_policy = keys.BIND_POLICY_FULL_PCPUS if chosen in ("", keys.BIND_POLICY_DEFAULT) else chosen
            bind_required = bool(required)  # "Default" too: the default policy, required
            exclusive = res_spec.preferred_cpu_exclusive_policy or keys.EXCLUSIVE_POLICY_NONE
        text = _annotation_text(annotations, keys.ANNOTATION_NUMA_TOPOLOGY_SPEC)
        if text:
            numa_spec = parse_numa_topology_spec(text)
            numa_policy, numa_exclusive = numa_spec.numa_topology_policy, numa_spec.single_numa_node_exclusive
        gpu = parse_gpu_request({k: v for k, v in amounts.items() if k in keys.GPU_RESOURCE_NAMES})
        if keys.ANNOTATION_RESERVATION_AFFINITY in annotations:
            affinity = parse_reservation_affinity(_annotation_text(annotations, keys.ANNOTATION_RESERVATION_AFFINITY))
        api_version = doc.get("apiVersion")
        identity = PodIdentity(
            uid=uid,
            name=name,
            namespace=namespace,
            api_version="" if api_version is None else read_str(api_version, "apiVersion", 64),
            labels=tuple(sorted(read_labels(labels, "labels").items())),
            owner_refs=read_owner_references(meta.get("ownerReferences"), "ownerReferences"),
        )
    except FormatError as exc:
        error = f"invalid pod request: {exc}"
    return PodRequest(
        uid=uid,
        namespace=namespace,
        name=name,
        qos=qos,
        priority_class=prio_class,
        cpu_milli=cpu_milli,
        memory=memory,
        bind_policy=bind_policy,
        bind_required=bind_required,
        exclusive_policy=exclusive,
        numa_policy=numa_policy,
        numa_exclusive=numa_exclusive,
        gpu=gpu,
        error=error,
        identity=identity,
        reservation_affinity=affinity,
    )
