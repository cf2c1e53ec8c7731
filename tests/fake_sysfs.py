"""A prepared sysfs and procfs for the node reports (``runtime_proxy.report``): the CPU topology
and NUMA memory copied from (or made like) a real machine, and NVIDIA GPUs as the kernel and the
driver show them. Used by the unit, hostile and end-to-end tests."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from koord_formats.topology import CPUTopology


def write_topology(sys_root: Path, topo: CPUTopology, numa_memory_kib: dict[int, int] | None = None) -> None:
    """``devices/system/cpu`` and ``devices/system/node`` for ``topo`` (core ids as sysfs
    numbers them per socket)."""
    cpu_dir = sys_root / "devices" / "system" / "cpu"
    cpu_dir.mkdir(parents=True, exist_ok=True)
    (cpu_dir / "online").write_text(",".join(str(c) for c in sorted(topo.cpus)) + "\n")
    for info in topo.infos:
        t = cpu_dir / f"cpu{info.id}" / "topology"
        t.mkdir(parents=True, exist_ok=True)
        (t / "core_id").write_text(f"{info.core}\n")
        (t / "physical_package_id").write_text(f"{info.socket}\n")
    for node, cpus in topo.numa_cpus.items():
        d = sys_root / "devices" / "system" / "node" / f"node{node}"
        d.mkdir(parents=True, exist_ok=True)
        (d / "cpulist").write_text(",".join(str(c) for c in sorted(cpus)) + "\n")
        kib = (numa_memory_kib or {}).get(node, 4 * 1024 * 1024)
        (d / "meminfo").write_text(f"Node {node} MemTotal:       {kib} kB\nNode {node} MemFree:        1 kB\n")


def copy_machine(sys_root: Path, real: Path = Path("/sys")) -> None:
    """This machine's CPU and NUMA files under ``sys_root`` (what ``read_cpu_topology`` and
    ``read_numa_memory`` read), so a fake tree reports the real topology."""
    src_cpu = real / "devices" / "system" / "cpu"
    dst_cpu = sys_root / "devices" / "system" / "cpu"
    dst_cpu.mkdir(parents=True, exist_ok=True)
    if (src_cpu / "online").exists():
        shutil.copyfile(src_cpu / "online", dst_cpu / "online")
    for entry in src_cpu.glob("cpu[0-9]*"):
        if (entry / "topology").is_dir():
            (dst_cpu / entry.name / "topology").mkdir(parents=True, exist_ok=True)
            for name in ("core_id", "physical_package_id"):
                if (entry / "topology" / name).exists():
                    shutil.copyfile(entry / "topology" / name, dst_cpu / entry.name / "topology" / name)
    for node in (real / "devices" / "system" / "node").glob("node[0-9]*"):
        d = sys_root / "devices" / "system" / "node" / node.name
        d.mkdir(parents=True, exist_ok=True)
        for name in ("cpulist", "meminfo"):
            if (node / name).exists():
                (d / name).write_bytes((node / name).read_bytes())


def add_nvidia_gpu(
    sys_root: Path, proc_root: Path, bus_id: str, *, minor: int, uuid: str, numa: int = 0,
    root: str = "pci0000:3a", model: str = "Tesla T4", driver: bool = True, vendor: str = "0x10de",
    pci_class: str = "0x030200",
) -> None:
    """One GPU: ``devices/<root>/<bridge>/<bus id>`` with its ``vendor``, ``class`` and
    ``numa_node``, the ``bus/pci/devices/<bus id>`` symlink to it, and (with ``driver``) the
    driver's ``driver/nvidia/gpus/<bus id>/information``."""
    device = sys_root / "devices" / root / f"0000:{root[-2:]}:00.0" / bus_id
    device.mkdir(parents=True, exist_ok=True)
    (device / "vendor").write_text(vendor + "\n")
    (device / "class").write_text(pci_class + "\n")
    (device / "numa_node").write_text(f"{numa}\n")
    links = sys_root / "bus" / "pci" / "devices"
    links.mkdir(parents=True, exist_ok=True)
    os.symlink(os.path.relpath(device, links), links / bus_id)
    if driver:
        info = proc_root / "driver" / "nvidia" / "gpus" / bus_id
        info.mkdir(parents=True, exist_ok=True)
        (info / "information").write_text(
            f"Model: \t\t {model}\nIRQ:   \t\t 150\nGPU UUID: \t {uuid}\nVideo BIOS: \t 90.04.96.00.01\n"
            f"Bus Type: \t PCIe\nDMA Size: \t 47 bits\nDMA Mask: \t 0x7fffffffffff\nBus Location: \t {bus_id}\n"
            f"Device Minor: \t {minor}\nGPU Excluded:\t No\n"
        )
