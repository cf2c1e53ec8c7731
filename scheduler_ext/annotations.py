"""The ``Allocation`` value, and the Koordinator annotations that record it, both directions.

Who calls this: ``scheduler_ext.decide`` builds the device-allocated annotation a bind writes
with ``gpu_device_allocated`` (resource-status with ``koord_formats.pod.format_resource_status``);
``scheduler_ext.state`` rebuilds each placed pod's allocation with ``parse_allocation``, which is
how the cache is rebuilt after a restart. Pure functions only.

The formats themselves (``scheduling.koordinator.sh/resource-status`` and
``scheduling.koordinator.sh/device-allocated``) are parsed and formatted by ``koord_formats.pod``
only; this module maps them to and from the extender's values.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction

from koord_formats import keys
from koord_formats.pod import (
    DeviceAllocation,
    format_device_allocated,
    parse_device_allocated,
    parse_resource_status,
)
from scheduler_ext.allocator import GPUGrant
from scheduler_ext.topology import DEVICE_TYPE_GPU, GPUDevice

__all__ = [
    "EMPTY",
    "Allocation",
    "gpu_device_allocated",
    "parse_allocation",
]

_CPU = "cpu"
_MEMORY = "memory"


@dataclass(frozen=True, slots=True)
class Allocation:
    """What one pod holds on its node."""

    cpus: frozenset[int] = frozenset()  # exclusive cpuset, empty for shared pods
    numa: Mapping[int, int] = field(default_factory=dict)  # NUMA node -> milli-CPU booked
    numa_memory: Mapping[int, int] = field(default_factory=dict)  # NUMA node -> bytes booked
    gpus: tuple[GPUGrant, ...] = ()
    exclusive: str = keys.EXCLUSIVE_POLICY_NONE  # the pod's CPU exclusive policy, for later pods to avoid
    reservation: str = ""  # UID of the reservation the pod was allocated from ("" when none)

    @property
    def empty(self) -> bool:
        return not self.cpus and not self.numa and not self.numa_memory and not self.gpus and not self.reservation


EMPTY = Allocation()


def gpu_device_allocated(grants: Sequence[GPUGrant], gpus: Mapping[int, GPUDevice]) -> str | None:
    """The device-allocated JSON for GPU grants (with each GPU's id when the Device object
    gives one), or ``None`` without GPUs."""
    if not grants:
        return None
    entries = []
    for g in grants:
        dev = gpus.get(g.minor)
        entries.append(
            DeviceAllocation(
                minor=g.minor,
                resources={
                    keys.RESOURCE_GPU_CORE: Fraction(g.core),
                    keys.RESOURCE_GPU_MEMORY: Fraction(g.memory),
                    keys.RESOURCE_GPU_MEMORY_RATIO: Fraction(g.ratio),
                },
                id=dev.id if dev is not None else "",
            )
        )
    return format_device_allocated({DEVICE_TYPE_GPU: entries})


def _status(text: str) -> tuple[frozenset[int], dict[int, int], dict[int, int]]:
    status = parse_resource_status(text)
    numa: dict[int, int] = {}
    memory: dict[int, int] = {}
    for entry in status.numa_node_resources:
        cpu = entry.resources.get(_CPU)
        if cpu is not None:
            numa[entry.node] = numa.get(entry.node, 0) + math.ceil(cpu * 1000)
        mem = entry.resources.get(_MEMORY)
        if mem is not None:
            memory[entry.node] = memory.get(entry.node, 0) + math.ceil(mem)
    return status.cpuset, numa, memory


def _grants(text: str) -> tuple[GPUGrant, ...]:
    out: list[GPUGrant] = []
    for dev in parse_device_allocated(text).get(DEVICE_TYPE_GPU, ()):
        res = dev.resources
        out.append(
            GPUGrant(
                minor=dev.minor,
                core=math.floor(res.get(keys.RESOURCE_GPU_CORE, 0)),
                ratio=math.floor(res.get(keys.RESOURCE_GPU_MEMORY_RATIO, 0)),
                memory=math.ceil(res.get(keys.RESOURCE_GPU_MEMORY, 0)),
            )
        )
    return tuple(out)


def parse_allocation(
    status: str | None,
    devices: str | None,
    exclusive: str = keys.EXCLUSIVE_POLICY_NONE,
    reservation: str = "",
) -> Allocation:
    """Rebuild an allocation from a placed pod's resource-status and device-allocated
    annotations (``None`` or "" when absent); raises ``koord_formats.FormatError`` only.

    ``numaNodeResources`` is the pod's per-NUMA CPU and memory booking, with or without a
    cpuset: zone accounting (``scheduler_ext.numa``) counts both, as koord-scheduler does.
    ``reservation`` is the UID from the pod's ``reservation-allocated`` (read by the caller).
    """
    cpus: frozenset[int] = frozenset()
    numa: dict[int, int] = {}
    memory: dict[int, int] = {}
    if status:
        cpus, numa, memory = _status(status)
    grants = _grants(devices) if devices else ()
    if not cpus and not numa and not memory and not grants and not reservation:
        return EMPTY
    return Allocation(
        cpus=cpus, numa=numa, numa_memory=memory, gpus=grants, exclusive=exclusive, reservation=reservation
    )
