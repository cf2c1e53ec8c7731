"""What a pod asks for, decoded once from its JSON into a frozen ``PodRequest``.

Who calls this: ``scheduler_ext.extender`` decodes the ``Pod`` of every filter, prioritize and
preempt call here, and ``scheduler_ext.state`` decodes pending pods from the watch (bind only
carries names). Nothing here looks at nodes; malformed input becomes ``PodRequest.error``, which
the filter reports on every node instead of failing the HTTP call.

Koordinator semantics (``koordinator.md`` 3, 4.1 and 4.4):

- QoS from the label ``koordinator.sh/qosClass`` only; priority class from
  ``koordinator.sh/priority-class`` or the ``spec.priority`` range, defaulting by QoS
  (LSE/LSR/LS/SYSTEM -> koord-prod, BE -> koord-batch) when the value falls in no range.
- A pod wants a cpuset when it is LSE or LSR, its priority class is koord-prod and its CPU
  request is a whole number of cores. A node's ``cpu-bind-policy`` label can force binding
  for other integer requests (decided in ``extender``, since it depends on the node).
- ``scheduling.koordinator.sh/resource-spec`` gives bind and exclusive policies; the default
  bind policy is FullPCPUs (preferred), as in koord-scheduler's defaults.
- GPU requests are validated and normalised as koord-scheduler's deviceshare plugin does.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from scheduler_ext.quantity import parse_cpu_milli, parse_quantity

__all__ = [
    "ANN_NUMA_TOPOLOGY_SPEC",
    "ANN_RESOURCE_SPEC",
    "BIND_POLICIES",
    "EXCLUSIVE_POLICIES",
    "GPU_RESOURCE_NAMES",
    "LABEL_QOS",
    "NUMA_POLICIES",
    "GPURequest",
    "PodRequest",
    "parse_gpu_request",
    "parse_pod",
    "priority_class",
]

LABEL_QOS = "koordinator.sh/qosClass"
LABEL_PRIORITY_CLASS = "koordinator.sh/priority-class"
ANN_RESOURCE_SPEC = "scheduling.koordinator.sh/resource-spec"
ANN_NUMA_TOPOLOGY_SPEC = "scheduling.koordinator.sh/numa-topology-spec"

BIND_POLICIES = ("Default", "FullPCPUs", "SpreadByPCPUs", "ConstrainedBurst")
EXCLUSIVE_POLICIES = ("None", "PCPULevel", "NUMANodeLevel")
NUMA_POLICIES = ("None", "BestEffort", "Restricted", "SingleNUMANode")

NVIDIA_GPU = "nvidia.com/gpu"
KOORD_GPU = "koordinator.sh/gpu"
GPU_SHARED = "koordinator.sh/gpu.shared"
GPU_CORE = "koordinator.sh/gpu-core"
GPU_MEMORY = "koordinator.sh/gpu-memory"
GPU_MEMORY_RATIO = "koordinator.sh/gpu-memory-ratio"
GPU_RESOURCE_NAMES = (NVIDIA_GPU, KOORD_GPU, GPU_SHARED, GPU_CORE, GPU_MEMORY, GPU_MEMORY_RATIO)

_PRIORITY_RANGES = (
    ("koord-prod", 9000, 9999),
    ("koord-mid", 7000, 7999),
    ("koord-batch", 5000, 5999),
    ("koord-free", 3000, 3999),
)


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
    gpu: GPURequest | None
    error: str  # "" when valid; otherwise why the pod cannot be placed anywhere

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
            self.qos in ("LSE", "LSR")
            and self.priority_class == "koord-prod"
            and self.integer_cpu
            and self.bind_policy != "ConstrainedBurst"
        )

    @property
    def key(self) -> tuple[object, ...]:
        """Everything that decides feasibility and score on a node (cache key)."""
        return (
            self.qos,
            self.priority_class,
            self.cpu_milli,
            self.bind_policy,
            self.bind_required,
            self.exclusive_policy,
            self.numa_policy,
            self.gpu.key if self.gpu else None,
            self.error,
        )


def priority_class(labels: Mapping[str, str], priority: object, qos: str) -> str:
    """Koordinator's priority class with its QoS-derived default."""
    override = labels.get(LABEL_PRIORITY_CLASS, "")
    if override in {name for name, _, _ in _PRIORITY_RANGES}:
        return override
    if isinstance(priority, int) and not isinstance(priority, bool):
        for name, lo, hi in _PRIORITY_RANGES:
            if lo <= priority <= hi:
                return name
    return "koord-batch" if qos == "BE" else "koord-prod"


def _container_amounts(container: Mapping[str, Any]) -> dict[str, Any]:
    resources = container.get("resources") or {}
    requests = dict(resources.get("requests") or {})
    for name, value in (resources.get("limits") or {}).items():
        requests.setdefault(name, value)  # the API server defaults requests from limits
    return requests


def _pod_amounts(spec: Mapping[str, Any], names: tuple[str, ...]) -> dict[str, Decimal]:
    """Effective pod request per name: max(sum of containers, largest init container)."""
    total: dict[str, Decimal] = {}
    for c in spec.get("containers") or []:
        for name, value in _container_amounts(c).items():
            if name in names:
                total[name] = total.get(name, Decimal(0)) + parse_quantity(value)
    for c in spec.get("initContainers") or []:
        for name, value in _container_amounts(c).items():
            if name in names:
                total[name] = max(total.get(name, Decimal(0)), parse_quantity(value))
    return total


def _percent(name: str, value: Decimal) -> int:
    if value != value.to_integral_value() or value < 0:
        raise ValueError(f"{name} must be a whole percentage, got {value}")
    n = int(value)
    if n > 100 and n % 100 != 0:
        raise ValueError(f"{name}={n}: percentages above 100 must be multiples of 100")
    return n


def parse_gpu_request(amounts: Mapping[str, Decimal]) -> GPURequest | None:
    """Validate and normalise the GPU part of a pod's request (``None`` when it has none).

    Valid combinations: a whole-card name alone, gpu-memory alone, gpu-memory-ratio alone,
    gpu-core with gpu-memory or gpu-memory-ratio, optionally with gpu.shared as the GPU count.
    """
    present = {k for k, v in amounts.items() if v > 0}
    if not present:
        return None
    full = present & {NVIDIA_GPU, KOORD_GPU}
    if full:
        if len(present) > 1:
            raise ValueError(f"invalid resource device requests: {sorted(present)}")
        if NVIDIA_GPU in full:
            n = amounts[NVIDIA_GPU]
            if n != n.to_integral_value():
                raise ValueError(f"{NVIDIA_GPU} must be a whole number of GPUs")
            return GPURequest(count=int(n), core=100, ratio=100, memory=0)
        pct = _percent(KOORD_GPU, amounts[KOORD_GPU])
        count = max(1, pct // 100)
        return GPURequest(count=count, core=pct // count, ratio=pct // count, memory=0)
    core = _percent(GPU_CORE, amounts[GPU_CORE]) if GPU_CORE in present else 0
    ratio = _percent(GPU_MEMORY_RATIO, amounts[GPU_MEMORY_RATIO]) if GPU_MEMORY_RATIO in present else 0
    memory = int(amounts[GPU_MEMORY]) if GPU_MEMORY in present else 0
    if not ratio and not memory:
        raise ValueError("invalid resource device requests: gpu-core needs gpu-memory or gpu-memory-ratio")
    if ratio and memory:
        raise ValueError("invalid resource device requests: gpu-memory and gpu-memory-ratio together")
    if GPU_SHARED in present:
        shared = amounts[GPU_SHARED]
        if shared != shared.to_integral_value():
            raise ValueError(f"{GPU_SHARED} must be a whole number of GPUs")
        count = int(shared)
    elif ratio > 100:
        count = ratio // 100
    elif core > 100:
        count = core // 100
    else:
        count = 1
    if core % count or ratio % count or memory % count:
        raise ValueError(f"GPU request does not split evenly over {count} GPUs")
    per_core, per_ratio, per_mem = core // count, ratio // count, memory // count
    if per_core > 100 or per_ratio > 100:
        raise ValueError("a GPU cannot give more than 100% of its core or memory")
    return GPURequest(count=count, core=per_core, ratio=per_ratio, memory=per_mem)


def _json_annotation(annotations: Mapping[str, str], key: str) -> dict[str, Any]:
    raw = annotations.get(key)
    if not raw:
        return {}
    doc = json.loads(raw)
    if not isinstance(doc, dict):
        raise ValueError(f"{key} must be a JSON object")
    return doc


def parse_pod(pod: Mapping[str, Any]) -> PodRequest:
    """Decode a v1.Pod (API JSON). Never raises for bad content: see ``PodRequest.error``."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    labels: Mapping[str, str] = meta.get("labels") or {}
    annotations: Mapping[str, str] = meta.get("annotations") or {}
    qos = labels.get(LABEL_QOS, "")
    if qos not in ("LSE", "LSR", "LS", "BE", "SYSTEM"):
        qos = ""
    error = ""
    cpu_milli = memory = 0
    gpu: GPURequest | None = None
    bind_policy, bind_required, exclusive, numa_policy = "FullPCPUs", False, "None", ""
    try:
        amounts = _pod_amounts(spec, ("cpu", "memory", *GPU_RESOURCE_NAMES))
        cpu_milli = parse_cpu_milli(amounts["cpu"]) if "cpu" in amounts else 0
        memory = int(amounts.get("memory", Decimal(0)))
        res_spec = _json_annotation(annotations, ANN_RESOURCE_SPEC)
        required = res_spec.get("requiredCPUBindPolicy") or ""
        preferred = res_spec.get("preferredCPUBindPolicy") or ""
        for value in (required, preferred):
            if value and value not in BIND_POLICIES:
                raise ValueError(f"{ANN_RESOURCE_SPEC}: unknown CPU bind policy {value!r}")
        chosen = required or preferred
        bind_policy = "FullPCPUs" if chosen in ("", "Default") else chosen
        bind_required = bool(required)  # "Default" too: the default policy, required
        exclusive = res_spec.get("preferredCPUExclusivePolicy") or "None"
        if exclusive not in EXCLUSIVE_POLICIES:
            raise ValueError(f"{ANN_RESOURCE_SPEC}: unknown CPU exclusive policy {exclusive!r}")
        numa_spec = _json_annotation(annotations, ANN_NUMA_TOPOLOGY_SPEC)
        numa_policy = numa_spec.get("numaTopologyPolicy") or ""
        if numa_policy and numa_policy not in NUMA_POLICIES:
            raise ValueError(f"{ANN_NUMA_TOPOLOGY_SPEC}: unknown NUMA topology policy {numa_policy!r}")
        gpu = parse_gpu_request({k: v for k, v in amounts.items() if k in GPU_RESOURCE_NAMES})
    except (ValueError, TypeError) as exc:
        error = f"invalid pod request: {exc}"
    return PodRequest(
        uid=str(meta.get("uid") or ""),
        namespace=str(meta.get("namespace") or "default"),
        name=str(meta.get("name") or ""),
        qos=qos,
        priority_class=priority_class(labels, spec.get("priority"), qos),
        cpu_milli=cpu_milli,
        memory=memory,
        bind_policy=bind_policy,
        bind_required=bind_required,
        exclusive_policy=exclusive,
        numa_policy=numa_policy,
        gpu=gpu,
        error=error,
    )
