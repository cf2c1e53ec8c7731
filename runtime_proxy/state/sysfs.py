"""The machine as sysfs and procfs describe it: CPU topology, NUMA nodes, RDT support.

Called by ``runtime_proxy.wiring.node_source`` when it builds the node config (the topology is
read once at start; CPUs do not come and go under a running proxy). Roots are parameters so
tests use a fake tree.
"""

from __future__ import annotations

from pathlib import Path

import structlog
from prometheus_client import Gauge

from koord_formats.cpulist import parse_cpu_list
from koord_formats.topology import CPUInfo, CPUTopology

__all__ = ["RdtSupport", "detect_rdt", "read_cpu_topology", "read_numa_nodes"]

log = structlog.get_logger("runtime_proxy.state.sysfs")
RDT_SUPPORTED = Gauge("rhp_rdt_cpu_supported", "1 when the CPU and kernel offer RDT (L3 CAT or MBA)", ["feature"])


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def read_numa_nodes(sys_root: str | Path = "/sys") -> dict[int, frozenset[int]]:
    """NUMA node id -> its CPUs (``devices/system/node/node<N>/cpulist``); empty when the
    kernel has no NUMA directory."""
    base = Path(sys_root) / "devices" / "system" / "node"
    out: dict[int, frozenset[int]] = {}
    if not base.is_dir():
        return out
    for entry in base.iterdir():
        name = entry.name
        if name.startswith("node") and name[4:].isdigit():
            text = _read(entry / "cpulist")
            if text is not None:
                try:
                    out[int(name[4:])] = parse_cpu_list(text)
                except ValueError:
                    log.warning("bad NUMA cpulist", node=name, text=text)
    return dict(sorted(out.items()))


def read_cpu_topology(sys_root: str | Path = "/sys") -> CPUTopology:
    """Online CPUs with their core, socket (physical package) and NUMA node.

    Core ids are made unique per machine, as in Koordinator's ``cpu-topology`` annotation
    (sysfs ``core_id`` repeats across sockets): the cores are numbered by (socket, core_id)
    in order of their first CPU.
    """
    cpu_base = Path(sys_root) / "devices" / "system" / "cpu"
    online_text = _read(cpu_base / "online")
    if online_text is None:
        ids = sorted(int(p.name[3:]) for p in cpu_base.glob("cpu[0-9]*") if p.name[3:].isdigit())
    else:
        ids = sorted(parse_cpu_list(online_text))
    numa = read_numa_nodes(sys_root)
    node_of = {cpu: node for node, cpus in numa.items() for cpu in cpus}
    raw: list[tuple[int, int, int, int]] = []
    for cpu in ids:
        topo = cpu_base / f"cpu{cpu}" / "topology"
        socket = int(_read(topo / "physical_package_id") or 0)
        core = int(_read(topo / "core_id") or cpu)
        raw.append((cpu, max(socket, 0), core, node_of.get(cpu, 0)))
    core_ids: dict[tuple[int, int], int] = {}
    cpus: list[CPUInfo] = []
    for cpu, socket, core, node in raw:
        key = (socket, core)
        if key not in core_ids:
            core_ids[key] = len(core_ids)
        cpus.append(CPUInfo(id=cpu, core=core_ids[key], socket=socket, node=node))
    return CPUTopology(cpus)


class RdtSupport:
    """What the CPU and kernel say about RDT."""

    def __init__(self, l3_cat: bool, mba: bool, mounted: bool, vendor: str) -> None:
        self.l3_cat = l3_cat
        self.mba = mba
        self.mounted = mounted
        self.vendor = vendor

    @property
    def supported(self) -> bool:
        return self.l3_cat or self.mba

    def __repr__(self) -> str:
        return f"RdtSupport(l3_cat={self.l3_cat}, mba={self.mba}, mounted={self.mounted}, vendor={self.vendor!r})"


def detect_rdt(proc_root: str | Path = "/proc") -> RdtSupport:
    """RDT support as koordlet checks it: CPU flags ``cat_l3`` and ``mba``; on Intel also the
    kernel command line must not disable them (``rdt=!l3cat``); whether resctrl is mounted.
    Logs the result and sets ``rhp_rdt_cpu_supported``."""
    proc = Path(proc_root)
    cpuinfo = _read(proc / "cpuinfo") or ""
    flags: set[str] = set()
    vendor = "intel"
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags" and not flags:
            flags = set(value.split())
        elif key.strip() == "vendor_id" and "AMD" in value:
            vendor = "amd"
    cmdline = _read(proc / "cmdline") or ""
    l3 = "cat_l3" in flags and "!l3cat" not in cmdline
    mba = "mba" in flags and "!mba" not in cmdline
    mounts = _read(proc / "mounts") or ""
    mounted = any(len(p := line.split()) > 2 and p[2] == "resctrl" for line in mounts.splitlines())
    result = RdtSupport(l3, mba, mounted, vendor)
    RDT_SUPPORTED.labels("l3cat").set(int(l3))
    RDT_SUPPORTED.labels("mba").set(int(mba))
    log.info("rdt support", l3_cat=l3, mba=mba, resctrl_mounted=mounted, vendor=vendor)
    return result
