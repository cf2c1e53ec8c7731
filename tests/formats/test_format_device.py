"""koord_formats/device.py: the Device GPU entries koordlet writes, read back by the extender's
own parser (scheduler_ext.topology.parse_gpu_devices)."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from koord_formats.device import GPUInfo, format_gpu_devices
from scheduler_ext.topology import parse_gpu_devices


def test_wire_form() -> None:
    (entry,) = format_gpu_devices([GPUInfo(0, "GPU-a", "0000:3b:00.0", 1, "pci0000:3a", 16 * 1024**3)])
    assert entry == {
        "type": "gpu", "id": "GPU-a", "minor": 0, "health": True,
        "resources": {"koordinator.sh/gpu-core": "100", "koordinator.sh/gpu-memory": "16Gi",
                      "koordinator.sh/gpu-memory-ratio": "100"},
        "topology": {"socketID": -1, "nodeID": 1, "pcieID": "pci0000:3a", "busID": "0000:3b:00.0"},
    }  # fmt: skip


def test_unknown_memory_and_topology_are_left_out() -> None:
    (entry,) = format_gpu_devices([GPUInfo(3, "GPU-b")])
    assert "topology" not in entry
    assert "koordinator.sh/gpu-memory" not in entry["resources"]


def test_sorted_by_minor() -> None:
    assert [e["minor"] for e in format_gpu_devices([GPUInfo(2, "c"), GPUInfo(0, "a"), GPUInfo(1, "b")])] == [0, 1, 2]


gpus = st.builds(
    GPUInfo,
    minor=st.integers(0, 65535),
    uuid=st.text("GPU-0123456789abcdef", min_size=1, max_size=40),
    bus_id=st.sampled_from(["", "0000:3b:00.0", "0000:af:00.0"]),
    numa_node=st.integers(-1, 7),
    pcie_root=st.sampled_from(["", "pci0000:3a"]),
    memory_bytes=st.none() | st.integers(0, 2**40),
    healthy=st.booleans(),
)


@given(st.lists(gpus, max_size=8, unique_by=lambda g: g.minor))
def test_round_trip_through_the_extenders_parser(listed: list[GPUInfo]) -> None:
    spec = json.loads(json.dumps({"devices": format_gpu_devices(listed)}))
    parsed = parse_gpu_devices(spec)
    assert [p.minor for p in parsed] == sorted(g.minor for g in listed)
    for g, p in zip(sorted(listed, key=lambda g: g.minor), parsed, strict=True):
        topo = g.numa_node >= 0 and bool(g.pcie_root) and bool(g.bus_id)
        assert (p.id, p.healthy, p.core, p.ratio) == (g.uuid, g.healthy, 100, 100)
        assert p.memory == (g.memory_bytes or 0)
        assert (p.numa, p.pcie, p.bus_id) == ((g.numa_node, g.pcie_root, g.bus_id) if topo else (-1, "", ""))
