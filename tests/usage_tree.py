"""Prepared ``/proc`` and cgroup trees for the usage sampler (``runtime_proxy.loops.usage``):
plain files under a test's ``tmp_path`` in the cgroup v1 (one directory per controller) or v2
(unified) layout, with counters a test moves forward between samples."""

from __future__ import annotations

from pathlib import Path

from runtime_proxy.host.cgroups import Cgroups

BE = "kubepods/besteffort"


def proc_stat(busy: int, idle: int = 1000, *, iowait: int = 7, steal: int = 3) -> str:
    """A ``/proc/stat`` whose aggregate line has ``busy`` ticks split over user, system, irq,
    softirq and nice (plus idle, iowait and steal, which are not usage)."""
    nice = irq = softirq = 1 if busy >= 3 else 0
    user = (busy - 3 * nice) // 2
    system = busy - 3 * nice - user
    return (
        f"cpu  {user} {nice} {system} {idle} {iowait} {irq} {softirq} {steal} 0 0\n"
        f"cpu0 {user} {nice} {system} {idle} {iowait} {irq} {softirq} {steal} 0 0\n"
        "intr 12345 " + " ".join("0" for _ in range(200)) + "\nctxt 99\n"
    )


def meminfo(total_kb: int, available_kb: int) -> str:
    return (
        f"MemTotal:       {total_kb} kB\nMemFree:        1000 kB\n"
        f"MemAvailable:   {available_kb} kB\nBuffers:        10 kB\nCached:         20 kB\n"
    )


def memory_stat(anon_bytes: int, version: int, *, cache: int = 1 << 30) -> str:
    """A ``memory.stat`` with ``anon_bytes`` spread over inactive/active anon and unevictable,
    and a large page cache that must not count."""
    unevictable = min(4096, anon_bytes)
    inactive = (anon_bytes - unevictable) // 2
    active = anon_bytes - unevictable - inactive
    if version == 2:
        return (
            f"anon {inactive + active}\nfile {cache}\ninactive_anon {inactive}\nactive_anon {active}\n"
            f"inactive_file {cache}\nunevictable {unevictable}\n"
        )
    return (
        f"cache {cache}\nrss {inactive + active}\ninactive_anon {inactive}\nactive_anon {active}\n"
        f"unevictable {unevictable}\ntotal_cache {cache}\ntotal_inactive_anon {inactive}\n"
        f"total_active_anon {active}\ntotal_inactive_file {cache}\ntotal_unevictable {unevictable}\n"
    )


class Tree:
    """A proc root and a cgroup root of one version under ``base``."""

    def __init__(self, base: Path, version: int) -> None:
        self.version = version
        self.proc = base / "proc"
        self.root = base / "cgroup"
        self.proc.mkdir(parents=True, exist_ok=True)
        self.root.mkdir(parents=True, exist_ok=True)
        if version == 2:
            (self.root / "cgroup.controllers").write_text("cpuset cpu io memory hugetlb pids rdma misc\n")
        self.node(busy=0)

    def cgroups(self) -> Cgroups:
        return Cgroups(self.root, version=self.version)

    def node(self, busy: int, total_kb: int = 8 << 20, available_kb: int = 6 << 20) -> None:
        (self.proc / "stat").write_text(proc_stat(busy))
        (self.proc / "meminfo").write_text(meminfo(total_kb, available_kb))

    def _dir(self, controller: str, path: str) -> Path:
        d = (self.root / path) if self.version == 2 else (self.root / controller / path)
        d.mkdir(parents=True, exist_ok=True)
        return d

    def write(self, controller: str, path: str, file: str, text: str) -> Path:
        target = self._dir(controller, path) / file
        target.write_text(text)
        return target

    def cgroup(self, path: str, *, cpu_ns: int, memory: int) -> None:
        """CPU time (ns) and memory (bytes without cache) of cgroup ``path``."""
        if self.version == 2:
            # every key the 6.1 kernel writes (seen in the v2 node, tests/v2/), not just the one read
            self.write("cpu", path, "cpu.stat", f"usage_usec {cpu_ns // 1000}\nuser_usec 1\nsystem_usec 1\n"
                       "nr_periods 0\nnr_throttled 0\nthrottled_usec 0\nnr_bursts 0\nburst_usec 0\n")
        else:
            self.write("cpuacct", path, "cpuacct.usage", f"{cpu_ns}\n")
        self.write("memory", path, "memory.stat", memory_stat(memory, self.version))

    def be_limits(self, quota: int, cpus: str, period: int = 100000, *, effective: str = "") -> None:
        if self.version == 2:
            self.write("cpu", BE, "cpu.max", f"{'max' if quota < 0 else quota} {period}\n")
            self.write("cpuset", BE, "cpuset.cpus", f"{cpus}\n")
            self.write("cpuset", BE, "cpuset.cpus.effective", f"{effective}\n")
        else:
            self.write("cpu", BE, "cpu.cfs_quota_us", f"{quota}\n")
            self.write("cpu", BE, "cpu.cfs_period_us", f"{period}\n")
            self.write("cpuset", BE, "cpuset.cpus", f"{cpus}\n")

    def cpu_file(self, path: str) -> Path:
        if self.version == 2:
            return self._dir("cpu", path) / "cpu.stat"
        return self._dir("cpuacct", path) / "cpuacct.usage"

    def memory_file(self, path: str) -> Path:
        return self._dir("memory", path) / "memory.stat"
