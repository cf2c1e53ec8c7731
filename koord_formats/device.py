"""The Device object (``scheduling.koordinator.sh/v1alpha1``, kind ``Device``, cluster-scoped,
one per node named like the node) as a node agent writes its GPUs.

One ``spec.devices`` entry per GPU, as koordlet builds it (``states_device_linux.go``
``buildGPUDevice``): ``{"type": "gpu", "id": <UUID>, "minor": <int>, "health": <bool>,
"resources": {"koordinator.sh/gpu-core": "100", "koordinator.sh/gpu-memory": <bytes>,
"koordinator.sh/gpu-memory-ratio": "100"}, "topology": {"socketID": -1, "nodeID": <NUMA node>,
"pcieID": "pci0000:3a", "busID": "0000:3b:00.0"}}``; ``topology`` only when the NUMA node, PCIe
root and bus id are all known, ``gpu-memory`` only when the card's memory is known. Entries are
sorted by type, then minor (``updateDevice``'s sorter).

``format_gpu_devices`` writes them; the extender reads them with
``scheduler_ext.topology.parse_gpu_devices`` (the round trip: ``tests/formats/test_format_device.py``).
``split_devices`` reads a Device's ``spec`` back into its GPU entries and the others (which a
GPU writer keeps as they are), bounded.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from koord_formats import keys
from koord_formats.bounded import read_list, read_object
from koord_formats.quantity import format_bytes

__all__ = ["API_GROUP", "API_VERSION", "KIND", "MAX_DEVICES", "PLURAL", "GPUInfo", "format_gpu_devices",
           "split_devices"]

# Devices one Device object may list; real nodes have a few dozen (GPUs, RDMA NICs, VFs).
MAX_DEVICES = 1024

API_GROUP = "scheduling.koordinator.sh"
API_VERSION = "v1alpha1"
KIND = "Device"
PLURAL = "devices"


@dataclass(frozen=True, slots=True)
class GPUInfo:
    """One GPU as a node sees it."""

    minor: int
    uuid: str
    bus_id: str = ""  # domain:bus:device.function, lower case
    numa_node: int = -1  # -1: unknown
    pcie_root: str = ""  # the PCIe root complex, "pci0000:3a"
    memory_bytes: int | None = None  # None: unknown
    healthy: bool = True
    model: str = ""


def format_gpu_devices(gpus: Iterable[GPUInfo]) -> list[dict[str, Any]]:
    """``spec.devices`` entries for ``gpus``, ascending by minor."""
    out: list[dict[str, Any]] = []
    for g in sorted(gpus, key=lambda g: g.minor):
        resources = {keys.RESOURCE_GPU_CORE: "100"}
        if g.memory_bytes is not None:
            resources[keys.RESOURCE_GPU_MEMORY] = format_bytes(g.memory_bytes)
        resources[keys.RESOURCE_GPU_MEMORY_RATIO] = "100"
        entry: dict[str, Any] = {"type": keys.DEVICE_TYPE_GPU, "id": g.uuid, "minor": g.minor, "health": g.healthy,
                                 "resources": resources}
        if g.numa_node >= 0 and g.pcie_root and g.bus_id:
            entry["topology"] = {"socketID": -1, "nodeID": g.numa_node, "pcieID": g.pcie_root, "busID": g.bus_id}
        out.append(entry)
    return out


def split_devices(spec: object) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A Device's ``spec`` (decoded JSON) as (its GPU entries, every other entry), in the
    listed order; ``FormatError`` when it is not an object, ``devices`` is not a list of at most
    ``MAX_DEVICES`` objects."""
    if spec is None:
        return [], []
    raw = read_object(spec, "Device spec").get("devices")
    gpus: list[dict[str, Any]] = []
    others: list[dict[str, Any]] = []
    for entry in [] if raw is None else read_list(raw, "Device spec devices", MAX_DEVICES):
        item = dict(read_object(entry, "Device entry"))
        (gpus if item.get("type") == keys.DEVICE_TYPE_GPU else others).append(item)
    return gpus, others
