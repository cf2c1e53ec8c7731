"""The ``Allocation`` value and its exact Koordinator annotation formats, both directions.

Who calls this: ``scheduler_ext.extender`` formats the annotations a bind writes;
``scheduler_ext.state`` parses them back from every placed pod, which is how the cache is
rebuilt after a restart. Pure functions only.

Formats (``koordinator.md`` 4.1):

- ``scheduling.koordinator.sh/resource-status``:
  ``{"cpuset":"2,54","numaNodeResources":[{"node":0,"resources":{"cpu":"4","memory":"8Gi"}}]}``
- ``scheduling.koordinator.sh/device-allocated``:
  ``{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":"100",...},"id":"GPU-..."}]}``
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hooks.facts import format_cpu_list, parse_cpu_list
from scheduler_ext.allocator import GPUGrant
from scheduler_ext.quantity import format_bytes, format_milli_cpu, parse_cpu_milli, parse_quantity
from scheduler_ext.topology import GPUDevice

__all__ = [
    "ANN_DEVICE_ALLOCATED",
    "ANN_RESOURCE_STATUS",
    "EMPTY",
    "Allocation",
    "format_device_allocated",
    "format_resource_status",
    "parse_allocation",
]

ANN_RESOURCE_STATUS = "scheduling.koordinator.sh/resource-status"
ANN_DEVICE_ALLOCATED = "scheduling.koordinator.sh/device-allocated"
GPU_CORE = "koordinator.sh/gpu-core"
GPU_MEMORY = "koordinator.sh/gpu-memory"
GPU_MEMORY_RATIO = "koordinator.sh/gpu-memory-ratio"


@dataclass(frozen=True, slots=True)
class Allocation:
    """What one pod holds on its node."""

    cpus: frozenset[int] = frozenset()  # exclusive cpuset, empty for shared pods
    numa: Mapping[int, int] = field(default_factory=dict)  # NUMA node -> milli-CPU booked
    numa_memory: Mapping[int, int] = field(default_factory=dict)  # NUMA node -> bytes booked
    gpus: tuple[GPUGrant, ...] = ()
    exclusive: str = "None"  # the pod's CPU exclusive policy, for later pods to avoid

    @property
    def empty(self) -> bool:
        return not self.cpus and not self.numa and not self.numa_memory and not self.gpus


EMPTY = Allocation()


def format_resource_status(
    cpus: frozenset[int], numa: Mapping[int, Mapping[str, str]]
) -> str | None:
    """The resource-status JSON, or ``None`` when there is nothing to write."""
    doc: dict[str, Any] = {}
    if cpus:
        doc["cpuset"] = format_cpu_list(cpus)
    if numa:
        doc["numaNodeResources"] = [
            {"node": n, "resources": dict(numa[n])} for n in sorted(numa)
        ]
    return json.dumps(doc, separators=(",", ":")) if doc else None


def format_device_allocated(grants: Sequence[GPUGrant], gpus: Mapping[int, GPUDevice]) -> str | None:
    """The device-allocated JSON for GPU grants, or ``None`` without GPUs."""
    if not grants:
        return None
    entries = []
    for g in grants:
        entry: dict[str, Any] = {
            "minor": g.minor,
            "resources": {
                GPU_CORE: str(g.core),
                GPU_MEMORY: format_bytes(g.memory),
                GPU_MEMORY_RATIO: str(g.ratio),
            },
        }
        dev = gpus.get(g.minor)
        if dev is not None and dev.id:
            entry["id"] = dev.id
        entries.append(entry)
    return json.dumps({"gpu": entries}, separators=(",", ":"))


def _parse_status(text: str) -> tuple[frozenset[int], dict[int, int], dict[int, int]]:
    doc = json.loads(text)
    if not isinstance(doc, dict):
        raise ValueError("resource-status is not an object")
    cpus = parse_cpu_list(doc.get("cpuset") or "")
    numa: dict[int, int] = {}
    memory: dict[int, int] = {}
    for entry in doc.get("numaNodeResources") or []:
        node = entry.get("node")
        resources = entry.get("resources") or {}
        cpu = resources.get("cpu")
        mem = resources.get("memory")
        if isinstance(node, int) and cpu is not None:
            numa[node] = numa.get(node, 0) + parse_cpu_milli(cpu)
        if isinstance(node, int) and mem is not None:
            memory[node] = memory.get(node, 0) + int(parse_quantity(mem))
    return cpus, numa, memory


def _parse_devices(text: str) -> tuple[GPUGrant, ...]:
    doc = json.loads(text)
    if not isinstance(doc, dict):
        raise ValueError("device-allocated is not an object")
    out: list[GPUGrant] = []
    for entry in doc.get("gpu") or []:
        res = entry.get("resources") or {}
        out.append(
            GPUGrant(
                minor=int(entry["minor"]),
                core=int(parse_quantity(res.get(GPU_CORE, 0))),
                ratio=int(parse_quantity(res.get(GPU_MEMORY_RATIO, 0))),
                memory=int(parse_quantity(res.get(GPU_MEMORY, 0))),
            )
        )
    return tuple(out)


def parse_allocation(
    status: str | None, devices: str | None, exclusive: str = "None"
) -> Allocation:
    """Rebuild an allocation from a placed pod's annotations; raises ``ValueError``.

    ``numaNodeResources`` is the pod's per-NUMA CPU booking, with or without a cpuset: zone
    accounting (``scheduler_ext.numa``) counts both, as koord-scheduler does.
    """
    cpus: frozenset[int] = frozenset()
    numa: dict[int, int] = {}
    memory: dict[int, int] = {}
    if status:
        cpus, numa, memory = _parse_status(status)
    grants = _parse_devices(devices) if devices else ()
    if not cpus and not numa and not memory and not grants:
        return EMPTY
    return Allocation(cpus=cpus, numa=numa, numa_memory=memory, gpus=grants, exclusive=exclusive)


def numa_resources(
    per_node_milli: Mapping[int, int], memory: int
) -> dict[int, dict[str, str]]:
    """``numaNodeResources`` values: CPU per node, memory split in proportion to CPU."""
    total = sum(per_node_milli.values())
    out: dict[int, dict[str, str]] = {}
    left = memory
    nodes = sorted(per_node_milli)
    for i, n in enumerate(nodes):
        res = {"cpu": format_milli_cpu(per_node_milli[n])}
        if memory:
            share = left if i == len(nodes) - 1 else memory * per_node_milli[n] // max(total, 1)
            left -= share
            res["memory"] = format_bytes(share)
        out[n] = res
    return out
