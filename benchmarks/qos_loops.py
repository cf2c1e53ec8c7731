"""CPU cost of usage sampling and of the usage loop with 200 containers, as a share of one core
(speed is reported here, never asserted in tests).

Three measurements in one process, each the CPU time (``time.process_time``: every thread of
the process) per round over ``--rounds`` rounds, the median of five batches:

1. the floor: reading the same files (each pod's and container's CPU and memory file, the BE
   files, ``/proc/stat`` and ``/proc/meminfo``) with plain ``open().read()`` and no parsing;
2. sampling: ``runtime_proxy.loops.usage.UsageSampler.sample`` over the same pods;
3. the loop: one ``runtime_proxy.loops.qos.UsageLoop.step`` with every built-in plugin (CPU
   suppress under the ``cfsQuota`` policy, memory and BE CPU eviction enabled in NodeSLO), its
   writes applied to the prepared tree;
4. the cfsQuotaBurst loop: one ``runtime_proxy.loops.burst.CPUBurstLoop.step`` (its readings,
   the ``ReconcileCpuBurst`` stage through the same hook runner, the quota writes) over the same
   node (``cpuBurstStrategy.policy: auto``; every LS container has a 2-CPU quota and is
   throttled in every round, so each round decides a quota for each of them; the benchmark's
   own ``cpu.stat`` writes that fake the throttling are measured alone and subtracted).

The pods (100 LS, 100 BE, one container each, so 200 pod and 200 container cgroups) live in a
prepared cgroup v1 tree under a temporary directory; ``/proc`` is the real one. At one round
per second (Koordinator's interval) the CPU per round in seconds is the share of one core.
Targets: sampling 200 containers <= 2% of one core; the loops with their sampling together
(usage loop + burst loop) <= 5%. The reconciler's periodic round is not included: it runs once
per ``reconcilePeriodSeconds`` (default 60), not every second.

    python benchmarks/qos_loops.py [--pods 100] [--rounds 50]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import MappingProxyType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hooks.facts import ContainerFacts, CPUInfo, CPUTopology, NodeFacts, PodFacts, Resources  # noqa: E402
from hooks.manager import make_plugin_manager, plugin_order  # noqa: E402
from runtime_proxy.engine.pipeline import Pipeline, plugin_steps  # noqa: E402
from runtime_proxy.host.apply import FileApplier  # noqa: E402
from runtime_proxy.host.cgroups import Cgroups  # noqa: E402
from runtime_proxy.loops.burst import CPUBurstLoop  # noqa: E402
from runtime_proxy.loops.qos import UsageLoop  # noqa: E402
from runtime_proxy.loops.usage import UsageSampler  # noqa: E402

BE_DIR = "kubepods/besteffort"
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
MEMORY_STAT = (
    "cache 1048576\nrss 4096\ntotal_cache 1048576\ntotal_rss 4096\ntotal_inactive_anon 2048\n"
    "total_active_anon 2048\ntotal_inactive_file 524288\ntotal_active_file 524288\ntotal_unevictable 0\n"
)


class Backend:
    def __init__(self, node: NodeFacts, pods: list[PodFacts], containers: list[tuple[PodFacts, ContainerFacts]]):
        self._node, self._pods, self._containers = node, pods, containers

    def node(self) -> NodeFacts:
        return self._node

    def pods(self) -> list[PodFacts]:
        return list(self._pods)

    def containers(self) -> list[tuple[PodFacts, ContainerFacts]]:
        return list(self._containers)


def write(root: Path, controller: str, path: str, file: str, text: str) -> Path:
    d = root / controller / path
    d.mkdir(parents=True, exist_ok=True)
    (d / file).write_text(text)
    return d / file


def prepare(root: Path, pods_per_class: int) -> tuple[Backend, list[Path]]:
    """The tree, the backend and the list of files a sampler reads (for the floor)."""
    files: list[Path] = []
    pods: list[PodFacts] = []
    containers: list[tuple[PodFacts, ContainerFacts]] = []
    for qos, kube in (("LS", "burstable"), ("BE", "besteffort")):
        for i in range(pods_per_class):
            uid = f"{qos.lower()}-{i:04d}-0000-0000-000000000000"
            cid = f"{i:04d}{qos.lower()}" + "c" * 58
            pod = PodFacts(name=f"{qos.lower()}-{i}", namespace="bench", uid=uid, sandbox_id=f"sb-{uid}",
                           labels=MappingProxyType({"koordinator.sh/qosClass": qos}),
                           cgroup_parent=f"/kubepods/{kube}/pod{uid}")
            limit = Resources(cpu_period=100000, cpu_quota=200000) if qos == "LS" else Resources()
            container = ContainerFacts(name="app", id=cid, resources=limit)
            pods.append(pod)
            containers.append((pod, container))
            for path in (f"kubepods/{kube}/pod{uid}", f"kubepods/{kube}/pod{uid}/{cid}"):
                files.append(write(root, "cpuacct", path, "cpuacct.usage", f"{i * 1000003}\n"))
                files.append(write(root, "memory", path, "memory.stat", MEMORY_STAT))
                write(root, "cpu", path, "cpu.cfs_quota_us", "200000\n" if qos == "LS" else "-1\n")
                write(root, "cpu", path, "cpu.cfs_period_us", "100000\n")
                write(root, "cpu", path, "cpu.stat", "nr_periods 0\nnr_throttled 0\nthrottled_time 0\n")
                write(root, "cpuset", path, "cpuset.cpus", "0-1\n")
    files.append(write(root, "cpuacct", BE_DIR, "cpuacct.usage", "0\n"))
    files.append(write(root, "memory", BE_DIR, "memory.stat", MEMORY_STAT))
    files.append(write(root, "cpu", BE_DIR, "cpu.cfs_quota_us", "-1\n"))
    files.append(write(root, "cpu", BE_DIR, "cpu.cfs_period_us", "100000\n"))
    files.append(write(root, "cpuset", BE_DIR, "cpuset.cpus", "0-1\n"))
    files += [Path("/proc/stat"), Path("/proc/meminfo")]
    topology = CPUTopology(CPUInfo(id=i, core=i, socket=0, node=0) for i in range(2))
    node = NodeFacts(node_slo=MappingProxyType(NODE_SLO), cpu_topology=topology)
    return Backend(node, pods, containers), files


def cpu_per_round(fn: Callable[[], Any], rounds: int) -> float:
    """Median over five batches of the process CPU seconds per call."""
    batches = []
    for _ in range(5):
        start = time.process_time()
        for _ in range(rounds):
            fn()
        batches.append((time.process_time() - start) / rounds)
    return statistics.median(batches)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--pods", type=int, default=100, help="pods per class (LS and BE), one container each")
    parser.add_argument("--rounds", type=int, default=50)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="rhp-qos-bench-") as tmp:
        root = Path(tmp)
        backend, files = prepare(root, args.pods)
        containers = len(backend.containers())
        cgroups = Cgroups(root, version=1)

        def floor() -> None:
            for f in files:
                with open(f, "rb") as fh:
                    fh.read()

        sampler = UsageSampler(cgroups)
        node = backend.node()
        pods = [p.replace(containers=(c,)) for p, c in backend.containers()]
        sampler.sample(node, pods)
        floor_s = cpu_per_round(floor, args.rounds)
        sample_s = cpu_per_round(lambda: sampler.sample(node, pods), args.rounds)

        pm = make_plugin_manager(entry_points=False)
        names = plugin_order(pm)
        pipeline = Pipeline(plugin_steps(pm, [(n, "Ignore", 5.0) for n in names]))
        loop = UsageLoop(backend, pipeline=pipeline, cgroups=cgroups, sampler=UsageSampler(cgroups))
        async def rounds(n: int) -> None:
            for _ in range(n):
                await loop.step()

        with asyncio.Runner() as runner:
            runner.run(rounds(2))
            loop_s = cpu_per_round(lambda: runner.run(rounds(args.rounds)), 1) / args.rounds
        last = loop.last_round

        burst = CPUBurstLoop(backend, pipeline=pipeline, applier=FileApplier(cgroups=cgroups), cgroups=cgroups,
                             pool_load=lambda: 0.1)
        burst_runner = asyncio.Runner()
        stats = [root / "cpu" / f"kubepods/burstable/pod{p.uid}/{c.id}" / "cpu.stat"
                 for p, c in backend.containers() if p.qos_label == "LS"]
        periods = [0]

        def throttle() -> None:
            # Every LS container throttled in half of its periods since the last round.
            periods[0] += 10
            text = f"nr_periods {periods[0]}\nnr_throttled {periods[0] // 2}\nthrottled_time 0\n"
            for f in stats:
                f.write_text(text)

        def burst_round() -> None:
            throttle()
            burst_runner.run(burst.step())

        with burst_runner:
            burst_round()
            # The benchmark's own cpu.stat writes are measured alone and taken out.
            burst_s = cpu_per_round(burst_round, args.rounds) - cpu_per_round(throttle, args.rounds)

    usage_plugins = [n for n in names if pipeline.steps and any(
        s.name == n and s.handles("ReconcileUsage") for s in pipeline.steps)]
    print(f"containers: {containers} (+{containers} pod cgroups), rounds: {args.rounds} x 5")
    print(f"ReconcileUsage plugins: {', '.join(usage_plugins)}")
    if last is not None and last.plan is not None:
        tried = len(last.applied.results) if last.applied is not None else 0
        print(f"last round: {len(last.plan.writes)} writes planned, {tried} tried (the rest already in place), "
              f"{len(last.plan.evictions)} evictions, {len(last.failures)} plugin failures")
    print(f"floor (open+read, no parsing): {floor_s * 1e3:8.2f} ms/round  "
          f"{floor_s / containers * 1e6:6.1f} us/container")
    print(f"sampling:                      {sample_s * 1e3:8.2f} ms/round  "
          f"{sample_s / containers * 1e6:6.1f} us/container  = {sample_s / floor_s:4.2f}x the floor")
    print(f"loop (sampling + plugins + writes): {loop_s * 1e3:8.2f} ms/round")
    print(f"burst loop (throttling read, decision, quota writes; {len(stats)} LS containers): "
          f"{burst_s * 1e3:8.2f} ms/round")
    print(f"share of one core at 1 round/s: sampling {sample_s * 100:.2f}% (target <= 2%), "
          f"usage loop {loop_s * 100:.2f}%, burst loop {burst_s * 100:.2f}%, "
          f"both loops {(loop_s + burst_s) * 100:.2f}% (target <= 5%)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
