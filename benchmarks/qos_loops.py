"""CPU cost of the periodic loops with 200 containers, as a share of one core, against a baseline
tree in the same run (speed is reported here, never asserted in tests).

Each measurement is the process CPU time (``time.process_time``: every thread, the loops' worker
threads included) of a fixed number of rounds, run back to back, divided by the rounds; the
share of one core is that time over the loop's interval (Koordinator's: 1 s for the usage loop,
whose CPU suppress and evictions koordlet runs every second, and for the CPU burst loop; 10 s
for the reconciler, ``reconcilePeriodSeconds``, as koordlet's runtime-hooks reconciler). What
is measured, in one child process per tree:

1. the floor: reading the sampler's files (each pod's and container's ``cpuacct.usage`` and
   ``memory.stat``, the BE files, ``/proc/stat`` and ``/proc/meminfo``) with plain
   ``open().read()`` and no parsing;
2. sampling: ``runtime_proxy.loops.usage.UsageSampler.sample`` over the same pods;
3. the usage loop: ``runtime_proxy.loops.qos.UsageLoop.step`` with every built-in plugin (CPU
   suppress under the ``cfsQuota`` policy, memory and BE CPU eviction enabled in NodeSLO);
4. the CPU burst loop (``runtime_proxy.loops.burst.CPUBurstLoop.step``, ``cpuBurstStrategy``
   ``auto``; every LS container has a 2-CPU quota): **steady**, nothing throttled (every
   container's quota stays: the common round); **scaling**, every LS container throttled in
   half of its periods and the share pool alternating between idle and overloaded, so every
   round scales every quota up or down and writes it with its pod's (the worst round). The
   throttling is the benchmark's: ``cpu.stat`` is read from the real file and its
   ``nr_periods``/``nr_throttled`` replaced by the benchmark's counters;
5. the reconciler: ``runtime_proxy.loops.reconciler.Reconciler.reconcile_once`` (every stage,
   every built-in plugin; nothing to repair after the first round).

The pods (100 LS, 100 BE, one container and one sandbox each) live in a real cgroup v1 tree when
this machine has one (``/sys/fs/cgroup/{cpu,cpuacct,cpuset,memory}``, root needed): kubelet's
cgroup root is ``/rhp-qos-bench-<pid>`` below each controller (``CgroupInfo.kubelet_root``),
removed at the end. ``--tmpfs`` (or a machine without cgroup v1) uses files in a temporary
directory instead. ``/proc`` is the real one. Logs go through the proxy's own set-up (JSON
lines) to ``/dev/null``.

With ``--baseline DIR`` (a checkout of the tree to compare with, such as
``git worktree add /tmp/bench-base <commit>``) the two trees run in alternating child processes,
``--batches`` times each, the order swapped every batch; the table gives each tree's median and
spread (min-max) and the median of the per-batch ratios (this tree / baseline).

    python benchmarks/qos_loops.py [--baseline DIR] [--pods 100] [--rounds 20] [--batches 5] [--tmpfs]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import MappingProxyType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

BE_QOS = "kubepods/besteffort"
NODE_SLO = {
    "resourceUsedThresholdWithBE": {
        "enable": True,
        "cpuSuppressThresholdPercent": 65,
        "cpuSuppressPolicy": "cfsQuota",
        "memoryEvictThresholdPercent": 99,
        "cpuEvictBESatisfactionLowerPercent": 1,
        "cpuEvictBESatisfactionUpperPercent": 2,
        "cpuEvictTimeWindowSeconds": 60,
    },
    "cpuBurstStrategy": {"policy": "auto"},
}
# A cgroup v1 memory.stat as a kernel writes it (the tmpfs tree; a real tree has the kernel's).
MEMORY_STAT = "".join(f"{k} {v}\n" for k, v in (
    ("cache", 1048576), ("rss", 4096), ("rss_huge", 0), ("shmem", 0), ("mapped_file", 0), ("dirty", 0),
    ("writeback", 0), ("pgpgin", 300), ("pgpgout", 40), ("pgfault", 900), ("pgmajfault", 0),
    ("inactive_anon", 2048), ("active_anon", 2048), ("inactive_file", 524288), ("active_file", 524288),
    ("unevictable", 0), ("hierarchical_memory_limit", 9223372036854771712),
    ("hierarchical_memsw_limit", 9223372036854771712), ("total_cache", 1048576), ("total_rss", 4096),
    ("total_rss_huge", 0), ("total_shmem", 0), ("total_mapped_file", 0), ("total_dirty", 0),
    ("total_writeback", 0), ("total_pgpgin", 300), ("total_pgpgout", 40), ("total_pgfault", 900),
    ("total_pgmajfault", 0), ("total_inactive_anon", 2048), ("total_active_anon", 2048),
    ("total_inactive_file", 524288), ("total_active_file", 524288), ("total_unevictable", 0),
))
CONTROLLERS = ("cpu", "cpuacct", "cpuset", "memory")
MEASURES = ("floor", "sampling", "usage", "burst_steady", "burst_scaling", "reconcile")
# Seconds between rounds (Koordinator's intervals; the reconciler's is reconcilePeriodSeconds).
INTERVALS = {"floor": 1.0, "sampling": 1.0, "usage": 1.0, "burst_steady": 1.0, "burst_scaling": 1.0,
             "reconcile": 10.0}


def real_cgroup_v1(root: Path = Path("/sys/fs/cgroup")) -> bool:
    """True when ``root`` holds writable cgroup v1 hierarchies of the four controllers."""
    if (root / "cgroup.controllers").exists() or not os.access(root / "cpu", os.W_OK):
        return False
    return all((root / c / "tasks").exists() for c in CONTROLLERS)


class Tree:
    """The pods' cgroup directories and files: real (under a kubelet root of its own in each v1
    controller) or in a temporary directory."""

    def __init__(self, base: Path, kubelet_root: str, real: bool) -> None:
        self.base, self.kubelet_root, self.real = base, kubelet_root, real
        self.dirs: list[tuple[str, Path]] = []

    def path(self, controller: str, rel: str) -> Path:
        return self.base / controller / self.kubelet_root.strip("/") / rel if self.kubelet_root != "/" else \
            self.base / controller / rel

    def mkdir(self, rel: str) -> None:
        for c in CONTROLLERS:
            d = self.path(c, rel)
            if self.real:
                if not d.exists():
                    d.mkdir()
                    self.dirs.append((c, d))
                if c == "cpuset":
                    for f in ("cpuset.cpus", "cpuset.mems"):
                        (d / f).write_text((d.parent / f).read_text())
            else:
                d.mkdir(parents=True, exist_ok=True)

    def write(self, controller: str, rel: str, file: str, text: str) -> Path:
        f = self.path(controller, rel) / file
        if self.real and file in ("cpuacct.usage", "memory.stat", "cpu.stat"):
            return f  # the kernel's
        f.write_text(text)
        return f

    def remove(self) -> None:
        if self.real:
            for _, d in sorted(self.dirs, key=lambda cd: -len(cd[1].parts)):
                os.rmdir(d)
        else:
            shutil.rmtree(self.base, ignore_errors=True)


def prepare(root: Path, pods_per_class: int, tree: Tree | None = None) -> tuple[Any, list[Path]]:
    """The tree, the backend and the list of files a sampler reads (for the floor). ``tree``:
    where the files go (default: a temporary tree under ``root``)."""
    from hooks.facts import CgroupInfo, ContainerFacts, CPUInfo, CPUTopology, NodeFacts, PodFacts, Resources

    tree = tree or Tree(root, "/", real=False)
    top = "" if tree.kubelet_root == "/" else tree.kubelet_root
    if tree.real:
        tree.mkdir("")
    files: list[Path] = []
    pods: list[PodFacts] = []
    containers: list[tuple[PodFacts, ContainerFacts]] = []
    for rel in ("kubepods", "kubepods/burstable", BE_QOS):
        tree.mkdir(rel)
    for qos, kube in (("LS", "burstable"), ("BE", "besteffort")):
        for i in range(pods_per_class):
            uid = f"{qos.lower()}-{i:04d}-0000-0000-000000000000"
            cid = f"{i:04d}{qos.lower()}" + "c" * 58
            sid = f"{i:04d}{qos.lower()}" + "s" * 58
            pod = PodFacts(name=f"{qos.lower()}-{i}", namespace="bench", uid=uid, sandbox_id=sid,
                           labels=MappingProxyType({"koordinator.sh/qosClass": qos}),
                           cgroup_parent=f"{top}/kubepods/{kube}/pod{uid}")
            limit = Resources(cpu_period=100000, cpu_quota=200000) if qos == "LS" else Resources()
            container = ContainerFacts(name="app", id=cid, resources=limit)
            pods.append(pod)
            containers.append((pod, container))
            pod_dir = f"kubepods/{kube}/pod{uid}"
            for path in (pod_dir, f"{pod_dir}/{cid}", f"{pod_dir}/{sid}"):
                tree.mkdir(path)
                quota = "200000\n" if qos == "LS" and path != f"{pod_dir}/{sid}" else "-1\n"
                tree.write("cpu", path, "cpu.cfs_period_us", "100000\n")
                tree.write("cpu", path, "cpu.cfs_quota_us", quota)
                tree.write("cpu", path, "cpu.stat", "nr_periods 0\nnr_throttled 0\nthrottled_time 0\n")
                tree.write("cpuset", path, "cpuset.cpus", "0-1\n")
                if path != f"{pod_dir}/{sid}":
                    files.append(tree.write("cpuacct", path, "cpuacct.usage", f"{i * 1000003}\n"))
                    files.append(tree.write("memory", path, "memory.stat", MEMORY_STAT))
    files.append(tree.write("cpuacct", BE_QOS, "cpuacct.usage", "0\n"))
    files.append(tree.write("memory", BE_QOS, "memory.stat", MEMORY_STAT))
    tree.write("cpu", BE_QOS, "cpu.cfs_quota_us", "-1\n")
    tree.write("cpu", BE_QOS, "cpu.cfs_period_us", "100000\n")
    tree.write("cpuset", BE_QOS, "cpuset.cpus", "0-1\n")
    files += [Path("/proc/stat"), Path("/proc/meminfo")]
    topology = CPUTopology(CPUInfo(id=i, core=i, socket=0, node=0) for i in range(2))
    node = NodeFacts(node_slo=MappingProxyType(NODE_SLO), cpu_topology=topology,
                     cgroup=CgroupInfo(version=1, kubelet_root=tree.kubelet_root))
    return Backend(node, pods, containers), files


class Backend:
    def __init__(self, node: Any, pods: list[Any], containers: list[tuple[Any, Any]]):
        self._node, self._pods, self._containers = node, pods, containers
        self.updates = 0

    def node(self) -> Any:
        return self._node

    def pods(self) -> list[Any]:
        return list(self._pods)

    def containers(self) -> list[tuple[Any, Any]]:
        return list(self._containers)

    async def update_container_resources(self, container_id: str, changes: Any) -> None:
        """Record the update as the proxy's store does (the runtime accepted it)."""
        self.updates += 1
        self._containers = [(p, c.replace(resources=c.resources.with_changes(changes)) if c.id == container_id else c)
                            for p, c in self._containers]


def cpu_per_round(fn: Callable[[], Any], rounds: int) -> float:
    """Process CPU seconds per call over ``rounds`` calls."""
    start = time.process_time()
    for _ in range(rounds):
        fn()
    return (time.process_time() - start) / rounds


@contextmanager
def pod_tree(pods: int, tmpfs: bool) -> Iterator[tuple[Any, list[Path], Any, bool]]:
    from runtime_proxy.host.cgroups import Cgroups

    real = not tmpfs and real_cgroup_v1()
    with tempfile.TemporaryDirectory(prefix="rhp-qos-bench-") as tmp:
        tree = Tree(Path("/sys/fs/cgroup"), f"/rhp-qos-bench-{os.getpid()}", True) if real else \
            Tree(Path(tmp), "/", False)
        try:
            backend, files = prepare(Path(tmp), pods, tree)
            yield backend, files, Cgroups(tree.base, version=1), real
        finally:
            tree.remove()


def child(args: argparse.Namespace) -> dict[str, Any]:
    """Every measurement over one tree (``args.tree`` is first on ``sys.path``)."""
    sys.path.insert(0, args.tree)
    from hooks.manager import make_plugin_manager, plugin_order
    from rhp_ops.logs import configure
    from runtime_proxy.engine.pipeline import Pipeline, plugin_steps
    from runtime_proxy.host.apply import FileApplier
    from runtime_proxy.loops.burst import CPUBurstLoop
    from runtime_proxy.loops.qos import UsageLoop
    from runtime_proxy.loops.reconciler import Reconciler
    from runtime_proxy.loops.usage import UsageSampler

    configure("json", "info", stream=open(os.devnull, "w"))  # noqa: SIM115 - the process's life
    n = args.rounds
    out: dict[str, Any] = {}
    with pod_tree(args.pods, args.tmpfs) as (backend, files, cgroups, real):
        out["real_cgroups"] = real
        out["containers"] = len(backend.containers())

        def floor() -> None:
            for f in files:
                with open(f, "rb") as fh:
                    fh.read()

        node = backend.node()
        pods = [p.replace(containers=(c,)) for p, c in backend.containers()]
        sampler = UsageSampler(cgroups)
        sampler.sample(node, pods)
        out["floor"] = cpu_per_round(floor, n)
        out["sampling"] = cpu_per_round(lambda: sampler.sample(node, pods), n)

        pm = make_plugin_manager(entry_points=False)
        names = plugin_order(pm)
        pipeline = Pipeline(plugin_steps(pm, [(name, "Ignore", 5.0) for name in names]))
        applier = FileApplier(cgroups=cgroups)
        # Every measurement runs its rounds inside one ``Runner.run``, as the proxy's event loop
        # does: Python 3.11's ``Runner.run`` formats its main task's repr (with the previous
        # result) when it checks the SIGINT handler, which a call per round would pay.
        with asyncio.Runner() as runner:
            def measure(rounds: Callable[[int], Any], n: int) -> float:
                start = time.process_time()
                runner.run(rounds(n))
                return (time.process_time() - start) / n

            loop = UsageLoop(backend, pipeline=pipeline, cgroups=cgroups, sampler=UsageSampler(cgroups),
                             applier=applier)

            async def usage_rounds(k: int) -> None:
                for _ in range(k):
                    await loop.step()

            runner.run(usage_rounds(2))
            out["usage"] = measure(usage_rounds, n)
            last = loop.last_round
            out["usage_writes"] = len(last.plan.writes) if last is not None and last.plan is not None else 0

            load = [0.1]
            burst = CPUBurstLoop(backend, pipeline=pipeline, applier=applier, cgroups=cgroups,
                                 pool_load=lambda: load[0])

            async def steady_rounds(k: int) -> None:
                for _ in range(k):
                    await burst.step()

            runner.run(steady_rounds(1))
            out["burst_steady"] = measure(steady_rounds, n)

            # Throttling the benchmark makes: the real cpu.stat is read, its counters replaced.
            periods = [0]
            read_stat = cgroups.read_stat

            def throttled_stat(path: str, file: str = "cpu.stat") -> dict[str, int]:
                stat: dict[str, int] = read_stat(path, file)
                if file == "cpu.stat":
                    stat.update(nr_periods=periods[0], nr_throttled=periods[0] // 2)
                return stat

            cgroups.read_stat = throttled_stat
            changed = [0]

            async def scaling_rounds(k: int) -> None:
                for _ in range(k):
                    periods[0] += 10
                    load[0] = 0.9 if load[0] < 0.5 else 0.1  # overloaded (down), then idle (up)
                    changed[0] += sum(1 for c in await burst.step() if c.applied)

            runner.run(scaling_rounds(4))
            changed[0] = 0
            out["burst_scaling"] = measure(scaling_rounds, n)
            out["burst_scaling_changes"] = changed[0] / n
            cgroups.read_stat = read_stat

            reconciler = Reconciler(backend, pm=pm, cgroups=cgroups, pipeline=pipeline, applier=applier)

            async def reconcile_rounds(k: int) -> None:
                for _ in range(k):
                    await reconciler.reconcile_once("period")

            runner.run(reconcile_rounds(1))
            out["reconcile"] = measure(reconcile_rounds, max(2, n // 4))
            report = reconciler.last_report
            out["reconcile_drift"] = len(report.drift) if report is not None else -1
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--pods", type=int, default=100, help="pods per class (LS and BE), one container each")
    parser.add_argument("--rounds", type=int, default=20, help="rounds per measurement")
    parser.add_argument("--batches", type=int, default=5, help="child processes per tree")
    parser.add_argument("--baseline", help="a checkout of the tree to compare with")
    parser.add_argument("--tmpfs", action="store_true", help="files in a temporary directory, not real cgroups")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--tree", default=str(ROOT), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args)))
        return 0
    trees = [("this", str(ROOT))] + ([("baseline", str(Path(args.baseline).resolve()))] if args.baseline else [])
    results: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in trees}
    started = time.time()
    for b in range(args.batches):
        order = trees if b % 2 == 0 else trees[::-1]
        for name, tree in order:
            cmd = [sys.executable, __file__, "--child", "--tree", tree, "--pods", str(args.pods),
                   "--rounds", str(args.rounds)] + (["--tmpfs"] if args.tmpfs else [])
            done = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                print(done.stderr[-4000:], file=sys.stderr)
                return 1
            results[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(f"batch {b + 1} {name}: " + ", ".join(f"{m} {results[name][-1][m] / INTERVALS[m] * 100:.2f}%"
                                                       for m in MEASURES), flush=True)
    first = results["this"][0]
    print(f"\ncontainers: {first['containers']} (+ pod and sandbox cgroups), "
          f"{'real cgroup v1' if first['real_cgroups'] else 'tmpfs files'}, {args.rounds} rounds a measurement, "
          f"{args.batches} batches a tree, {time.time() - started:.0f} s, load {os.getloadavg()[0]:.1f}")
    print(f"usage loop writes planned a round: {first['usage_writes']}; burst scaling: "
          f"{first['burst_scaling_changes']:.0f} quotas changed a round; reconciler drift after the first round: "
          f"{first['reconcile_drift']}")
    print("share of one core (interval: 1 s, the reconciler 10 s): median [min, max]")
    header = f"{'':16}" + "".join(f"{name:>24}" for name, _ in trees) + ("   ratio (median)" if args.baseline else "")
    print(header)
    rows = [*MEASURES, "loops_steady", "loops_scaling"]
    for m in rows:
        cells = []
        per: dict[str, list[float]] = {}
        for name, _ in trees:
            vals = [_share(r, m) for r in results[name]]
            per[name] = vals
            cells.append(f"{statistics.median(vals):8.2f} [{min(vals):5.2f},{max(vals):5.2f}]%")
        line = f"{m:16}" + "".join(f"{c:>24}" for c in cells)
        if args.baseline:
            ratios = [a / b for a, b in zip(per["this"], per["baseline"], strict=True) if b > 0]
            line += f"   {statistics.median(ratios):.2f} [{min(ratios):.2f}, {max(ratios):.2f}]"
        print(line)
    print("loops_steady = usage + burst_steady + reconcile; loops_scaling = usage + burst_scaling + reconcile")
    return 0


def _share(r: dict[str, Any], m: str) -> float:
    """Percent of one core of measure ``m`` (or a sum of the loops) in result ``r``."""
    if m == "loops_steady":
        return _share(r, "usage") + _share(r, "burst_steady") + _share(r, "reconcile")
    if m == "loops_scaling":
        return _share(r, "usage") + _share(r, "burst_scaling") + _share(r, "reconcile")
    return float(r[m]) / INTERVALS[m] * 100


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
