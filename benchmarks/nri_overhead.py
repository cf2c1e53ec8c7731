"""NRI-mode overhead on real containerd: the pod lifecycle with and without `runtime-proxy nri`
on the same containerd, in interleaved rounds, reported as p50/p90 and plugin/direct ratios.

    .venv/bin/python benchmarks/nri_overhead.py [--containerd 2.1] [--rounds 10] [--per-round 4] \
        [--containers 200] [--per-pod 10]

One lifecycle is RunPodSandbox, CreateContainer, StartContainer, StopContainer, RemoveContainer,
StopPodSandbox and RemovePodSandbox of an LSR pod (so the built-in plugins have work). In a
"plugin" round a `runtime-proxy nri` child process with every built-in plugin is registered on
the private NRI socket; in a "direct" round no plugin is. Target: plugin/direct
<= 1.05 for the whole lifecycle. The machine's load average is printed before and after, since
the ratio depends on it.

A lifecycle takes about 250 ms, nearly all of it containerd and runc, and its spread between
lifecycles is larger than the plugin's cost; so besides the ratio of the medians the table
gives its 90 % bootstrap interval (lifecycles resampled within each mode) and the ratios of
the two modes' medians round by round (each pair of modes runs back to back, so a change of
the machine's load during the run moves both sides of a pair alike).

Memory: after the rounds, ``--containers`` running containers (``--per-pod`` per LS pod, one
pod in ten LSR, all on the pause image) are created while a plugin is registered; the plugin's
RSS (``VmRSS``) and peak (``VmHWM``) are read from /proc once a reconcile round has seen them
all, and again for a plugin started afterwards (its first Synchronize carries all of them).
Target: <= 64 MiB. Nothing here is a test.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "devenv"))

from rhp_devenv import PrivateContainerd, pod_cgroup_parent, remove_cgroup_tree  # noqa: E402
from rhp_devenv.cri import CriClient, linux_resources  # noqa: E402

from tests.integration.test_nri_real import NriPluginProcess  # noqa: E402

STEPS = ("RunPodSandbox", "CreateContainer", "StartContainer", "StopContainer", "RemoveContainer",
         "StopPodSandbox", "RemovePodSandbox")


def lifecycle(client: CriClient, top: str, cpu: str) -> dict[str, float]:
    times: dict[str, float] = {}
    parent = pod_cgroup_parent(top, "burstable", os.urandom(8).hex())
    annotations = {"scheduling.koordinator.sh/resource-status": json.dumps({"cpuset": cpu})}
    t = time.perf_counter()
    pod = client.run_pod(cgroup_parent=parent, labels={"koordinator.sh/qosClass": "LSR"}, annotations=annotations)
    times["RunPodSandbox"] = time.perf_counter() - t
    t = time.perf_counter()
    cid = client.run_container(pod, resources=linux_resources(cpu_shares=1024, cpu_quota=50_000), start=False)
    times["CreateContainer"] = time.perf_counter() - t
    for step, call in (("StartContainer", client.start_container), ("StopContainer", client.stop_container),
                       ("RemoveContainer", client.remove_container)):
        t = time.perf_counter()
        call(cid)
        times[step] = time.perf_counter() - t
    t = time.perf_counter()
    client.stop_pod_sandbox(pod.pod_id)
    times["StopPodSandbox"] = time.perf_counter() - t
    t = time.perf_counter()
    client.remove_pod_sandbox(pod.pod_id)
    times["RemovePodSandbox"] = time.perf_counter() - t
    times["lifecycle"] = sum(times[s] for s in STEPS)
    remove_cgroup_tree(parent, kill=True)
    return times


def _status_kib(pid: int, field: str = "VmRSS") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    return 0


def _rss_kib(pid: int) -> int:
    return _status_kib(pid, "VmRSS")


def _load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def many_containers(client: CriClient, top: str, cpu: str, containers: int, per_pod: int) -> list[str]:
    """``containers`` running containers, ``per_pod`` per pod; every tenth pod LSR bound to
    ``cpu``, the others LS. Returns the pod ids."""
    pods: list[str] = []
    made = 0
    while made < containers:
        lsr = len(pods) % 10 == 9
        annotations = {"scheduling.koordinator.sh/resource-status": json.dumps({"cpuset": cpu})} if lsr else {}
        parent = pod_cgroup_parent(top, "burstable", os.urandom(8).hex())
        pod = client.run_pod(cgroup_parent=parent, labels={"koordinator.sh/qosClass": "LSR" if lsr else "LS"},
                             annotations=annotations)
        pods.append(pod.pod_id)
        for _ in range(min(per_pod, containers - made)):
            client.run_container(pod, resources=linux_resources(cpu_shares=256, cpu_quota=50_000))
            made += 1
    return pods


def memory(ctrd: PrivateContainerd, client: CriClient, top: str, cpu: str, tmp: str, containers: int,
           per_pod: int) -> list[tuple[str, int, int]]:
    """(situation, RSS KiB, peak KiB) of the plugin with ``containers`` containers."""
    out: list[tuple[str, int, int]] = []
    plugin = NriPluginProcess(ctrd.nri_socket, Path(tmp) / "memory").start()
    assert plugin.proc is not None
    try:
        out.append(("registered, no containers", _rss_kib(plugin.proc.pid), _status_kib(plugin.proc.pid, "VmHWM")))
        pods = many_containers(client, top, cpu, containers, per_pod)
        time.sleep(12)  # one reconcile period over all of them (reconcilePeriodSeconds, default 10)
        out.append((f"{containers} containers created while registered", _rss_kib(plugin.proc.pid),
                    _status_kib(plugin.proc.pid, "VmHWM")))
    finally:
        plugin.stop()
    again = NriPluginProcess(ctrd.nri_socket, Path(tmp) / "memory-again").start()
    assert again.proc is not None
    try:
        time.sleep(12)
        out.append((f"started with {containers} containers (one Synchronize)", _rss_kib(again.proc.pid),
                    _status_kib(again.proc.pid, "VmHWM")))
    finally:
        again.stop()
    for pod_id in pods:
        client.remove_pod(pod_id)
    return out


def bootstrap_ratio(direct: list[float], plugin: list[float], rounds: int = 2000) -> tuple[float, float]:
    """The 5th and 95th percentiles of median(plugin) / median(direct) over resamples of each."""
    rng = random.Random(1)
    ratios = sorted(
        statistics.median(rng.choices(plugin, k=len(plugin))) / statistics.median(rng.choices(direct, k=len(direct)))
        for _ in range(rounds)
    )
    return ratios[int(0.05 * rounds)], ratios[int(0.95 * rounds) - 1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--containerd", default="2.1", choices=("1.7", "2.1"))
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--per-round", type=int, default=4)
    parser.add_argument("--containers", type=int, default=200, help="containers for the memory figure (0: skip)")
    parser.add_argument("--per-pod", type=int, default=10)
    args = parser.parse_args()
    cpu = str(max(os.sched_getaffinity(0)))
    top = f"/rhpbench-nri-{os.getpid()}"
    samples: dict[str, dict[str, list[float]]] = {"direct": {}, "plugin": {}}
    # Per round, the lifecycle times of each mode.
    paired: list[dict[str, list[float]]] = []
    rss = 0
    mem: list[tuple[str, int, int]] = []
    load_before = _load()
    with tempfile.TemporaryDirectory(prefix="rhp-nri-bench-") as tmp:
        ctrd = PrivateContainerd(args.containerd, nri=True).start()
        ctrd.track_cgroup_parent(top)
        try:
            with CriClient(ctrd.socket) as client:
                lifecycle(client, top, cpu)  # warm-up
                for round_no in range(args.rounds):
                    paired.append({"direct": [], "plugin": []})
                    for mode in (("direct", "plugin") if round_no % 2 == 0 else ("plugin", "direct")):
                        plugin = None
                        if mode == "plugin":
                            plugin = NriPluginProcess(ctrd.nri_socket, Path(tmp) / f"r{round_no}").start()
                        try:
                            for _ in range(args.per_round):
                                for step, value in lifecycle(client, top, cpu).items():
                                    samples[mode].setdefault(step, []).append(value)
                                paired[-1][mode].append(samples[mode]["lifecycle"][-1])
                            if plugin is not None and plugin.proc is not None:
                                rss = max(rss, _rss_kib(plugin.proc.pid))
                        finally:
                            if plugin is not None:
                                plugin.stop()
                load_after = _load()
                if args.containers > 0:
                    mem = memory(ctrd, client, top, cpu, tmp, args.containers, args.per_pod)
        finally:
            ctrd.stop()
    print(f"containerd {args.containerd}, {args.rounds} interleaved rounds x {args.per_round} lifecycles per mode; "
          f"{os.cpu_count()} CPUs, load average {load_before} before, {load_after} after the rounds")
    print(f"{'step':<18}{'direct p50':>12}{'plugin p50':>12}{'ratio':>8}{'direct p90':>12}{'plugin p90':>12}")
    for step in (*STEPS, "lifecycle"):
        d, p = samples["direct"][step], samples["plugin"][step]
        d50, p50 = statistics.median(d), statistics.median(p)
        d90, p90 = statistics.quantiles(d, n=10)[-1], statistics.quantiles(p, n=10)[-1]
        print(f"{step:<18}{d50 * 1000:>10.1f}ms{p50 * 1000:>10.1f}ms{p50 / d50:>8.3f}{d90 * 1000:>10.1f}ms"
              f"{p90 * 1000:>10.1f}ms")
    low, high = bootstrap_ratio(samples["direct"]["lifecycle"], samples["plugin"]["lifecycle"])
    by_round = [statistics.median(r["plugin"]) / statistics.median(r["direct"]) for r in paired]
    print(f"lifecycle ratio of medians, 90% bootstrap interval: {low:.3f} .. {high:.3f}")
    print(f"lifecycle ratio round by round: median {statistics.median(by_round):.3f}, "
          f"{' '.join(f'{r:.3f}' for r in by_round)}")
    print(f"plugin RSS during the rounds (max seen): {rss / 1024:.1f} MiB   target: lifecycle ratio <= 1.05")
    for situation, now, peak in mem:
        print(f"plugin RSS, {situation}: {now / 1024:.1f} MiB (peak {peak / 1024:.1f} MiB)   target: <= 64 MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
