"""NRI-mode overhead on real containerd: the pod lifecycle with and without `runtime-proxy nri`
on the same containerd, in interleaved rounds, reported as p50/p90 and plugin/direct ratios.

    .venv/bin/python benchmarks/nri_overhead.py [--containerd 2.1] [--rounds 10] [--per-round 4] \
        [--containers 200] [--per-pod 10] [--floors] [--node-venv]

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

With ``--floors`` each round also runs two do-nothing plugins built on the same protocol stack
(``runtime_proxy.nri.plugin``): "empty" registers and subscribes to no event, and "idle"
subscribes to the events the real plugin subscribes to and answers each with no change. The
first shows what containerd itself spends on a lifecycle once any plugin is registered, the
second adds the round trips; what is left between "idle" and "plugin" is the plugins' own work.

Memory: after the rounds, ``--containers`` running containers (``--per-pod`` per LS pod, one
pod in ten LSR, all on the pause image) are created while a plugin is registered; the plugin's
RSS (``VmRSS``) and peak (``VmHWM``) are read from /proc once a reconcile round has seen them
all, and again for a plugin started afterwards (its first Synchronize carries all of them).
``--node-venv`` repeats that with the plugin on the node package's venv (``benchmarks/node_venv.py``:
what a node runs; the development venv's dev extra brings rich into structlog's import).
Target: <= 64 MiB. Nothing here is a test.

``--baseline NAME=TREE`` (benchmarks/baseline.py) adds the mode NAME: ``runtime-proxy nri`` of
source tree TREE, started the same way, timed in the same rounds (whose order alternates), and a
table of the per-round ratios plugin / NAME of the lifecycle and of each step (each round's
figure is the median of its lifecycles).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import structlog

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "devenv"))

from rhp_devenv import PrivateContainerd, pod_cgroup_parent, remove_cgroup_tree  # noqa: E402
from rhp_devenv.cri import CriClient, linux_resources  # noqa: E402

from benchmarks import baseline as baseline_arm  # noqa: E402
from cri_protos import nri_pb2  # noqa: E402
from runtime_proxy.nri.plugin import NriPlugin, PluginIdentity  # noqa: E402
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
           per_pod: int, python: str = sys.executable, name: str = "memory") -> list[tuple[str, int, int]]:
    """(situation, RSS KiB, peak KiB) of the plugin, run by ``python``, with ``containers``
    containers."""
    out: list[tuple[str, int, int]] = []
    plugin = NriPluginProcess(ctrd.nri_socket, Path(tmp) / name, python=python).start()
    assert plugin.proc is not None
    try:
        out.append(("registered, no containers", _rss_kib(plugin.proc.pid), _status_kib(plugin.proc.pid, "VmHWM")))
        pods = many_containers(client, top, cpu, containers, per_pod)
        time.sleep(12)  # one reconcile period over all of them (reconcilePeriodSeconds, default 10)
        out.append((f"{containers} containers created while registered", _rss_kib(plugin.proc.pid),
                    _status_kib(plugin.proc.pid, "VmHWM")))
    finally:
        plugin.stop()
    again = NriPluginProcess(ctrd.nri_socket, Path(tmp) / f"{name}-again", python=python).start()
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


class _NoChanges:
    """NRI events answered with no change (the "empty" and "idle" floors)."""

    def __init__(self, events: tuple[int, ...]) -> None:
        self.events = events

    def wanted_events(self) -> tuple[int, ...]:
        return self.events

    async def configure(self, request: Any) -> None:
        return None

    async def synchronize(self, pods: list[Any], containers: list[Any]) -> list[Any]:
        return []

    async def create_container(self, pod: Any, container: Any) -> Any:
        return nri_pb2.CreateContainerResponse()

    async def update_container(self, pod: Any, container: Any, resources: Any) -> list[Any]:
        return []

    async def stop_container(self, pod: Any, container: Any) -> list[Any]:
        return []

    async def state_change(self, event: int, pod: Any, container: Any | None) -> None:
        return None

    def session_ended(self) -> None:
        return None


def real_plugin_events() -> tuple[int, ...]:
    """The events ``runtime-proxy nri`` subscribes to with every built-in plugin."""
    from runtime_proxy.config import ProxyConfig
    try:
        from runtime_proxy.commands.nri import NriOptions, build
    except ImportError:  # a checkout from before runtime_proxy/commands/ (the session-start tree)
        from runtime_proxy.nri.cli import NriOptions, build  # type: ignore[no-redef]

    opts = NriOptions(socket="", identity=PluginIdentity("rhp-bench", "10"), config=ProxyConfig(),
                      entry_points=False)
    return build(opts).engine.wanted_events()


async def _serve_floor(socket: str, kind: str) -> None:
    events = () if kind == "empty" else real_plugin_events()
    plugin = NriPlugin(PluginIdentity(f"rhp-floor-{kind}", "10"), _NoChanges(events), socket_path=socket)
    running = asyncio.create_task(plugin.run())
    await plugin.synchronized.wait()
    print("synchronized", flush=True)
    await running


class FloorPlugin:
    """A do-nothing plugin (``--floor-plugin``) as a child process, stopped by its PID."""

    def __init__(self, socket: Path, kind: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--floor-plugin", kind, "--nri-socket", str(socket)],
            stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'devenv'}"})

    def start(self) -> FloorPlugin:
        assert self.proc.stdout is not None
        # its log lines (a reconnect while containerd's NRI socket comes up) may come first
        for _ in range(100):
            line = self.proc.stdout.readline()
            if line.strip() == b"synchronized":
                return self
            if not line:
                break
            print(f"do-nothing plugin: {line.decode(errors='replace').rstrip()}", file=sys.stderr)
        self.stop()
        raise RuntimeError("the do-nothing plugin did not come up")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--containerd", default="2.1", choices=("1.7", "2.1"))
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--per-round", type=int, default=4)
    parser.add_argument("--containers", type=int, default=200, help="containers for the memory figure (0: skip)")
    parser.add_argument("--per-pod", type=int, default=10)
    parser.add_argument("--floors", action="store_true", help="also time the do-nothing plugins (see above)")
    parser.add_argument("--node-venv", action="store_true",
                        help="also measure the memory figure with the node package's venv (benchmarks/node_venv.py), "
                             "which leaves out the dev extra's packages")  # fmt: skip
    parser.add_argument("--floor-plugin", choices=("empty", "idle"), help=argparse.SUPPRESS)
    parser.add_argument("--nri-socket", help=argparse.SUPPRESS)
    baseline_arm.add_option(parser)
    args = parser.parse_args()
    if args.floor_plugin:
        # The child process of FloorPlugin: serve until terminated.
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
        asyncio.run(_serve_floor(args.nri_socket, args.floor_plugin))
        return 0
    node_python: str | None = None
    if args.node_venv and args.containers > 0:
        sys.path.insert(0, str(REPO / "benchmarks"))
        import node_venv  # type: ignore[import-not-found]  # benchmarks/node_venv.py

        node_python = str(node_venv.ensure())
    modes: tuple[str, ...] = ("direct", "empty", "idle", "plugin") if args.floors else ("direct", "plugin")
    other = args.baseline
    if other is not None:
        other.check("runtime_proxy")
        if other.name in modes:
            parser.error(f"--baseline: NAME must not be one of {', '.join(modes)}")
        modes += (other.name,)
    # Per round and mode, each step's median.
    by_step: dict[str, dict[str, list[float]]] = {mode: {} for mode in modes}
    cpu = str(max(os.sched_getaffinity(0)))
    top = f"/rhpbench-nri-{os.getpid()}"
    samples: dict[str, dict[str, list[float]]] = {mode: {} for mode in modes}
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
                for round_no, order in baseline_arm.orders(modes, args.rounds):
                    paired.append({mode: [] for mode in modes})
                    for mode in order:
                        plugin: NriPluginProcess | FloorPlugin | None = None
                        if mode == "plugin":
                            plugin = NriPluginProcess(ctrd.nri_socket, Path(tmp) / f"r{round_no}").start()
                        elif other is not None and mode == other.name:
                            plugin = NriPluginProcess(ctrd.nri_socket, Path(tmp) / f"{mode}-r{round_no}")
                            plugin.args[:0] = other.wrapper()
                            plugin.start()
                        elif mode != "direct":
                            plugin = FloorPlugin(ctrd.nri_socket, mode).start()
                        try:
                            this_round: dict[str, list[float]] = {}
                            for _ in range(args.per_round):
                                for step, value in lifecycle(client, top, cpu).items():
                                    samples[mode].setdefault(step, []).append(value)
                                    this_round.setdefault(step, []).append(value)
                                paired[-1][mode].append(samples[mode]["lifecycle"][-1])
                            for step, values in this_round.items():
                                by_step[mode].setdefault(step, []).append(statistics.median(values) * 1000)
                            if isinstance(plugin, NriPluginProcess) and plugin.proc is not None:
                                rss = max(rss, _rss_kib(plugin.proc.pid))
                        finally:
                            if plugin is not None:
                                plugin.stop()
                load_after = _load()
                if args.containers > 0:
                    mem = memory(ctrd, client, top, cpu, tmp, args.containers, args.per_pod)
                    if node_python is not None:
                        mem += [(f"{situation}, node venv", now, peak) for situation, now, peak in
                                memory(ctrd, client, top, cpu, tmp, args.containers, args.per_pod,
                                       python=node_python, name="memory-node")]  # fmt: skip
        finally:
            ctrd.stop()
    print(f"containerd {args.containerd}, {args.rounds} interleaved rounds x {args.per_round} lifecycles per mode; "
          f"{os.cpu_count()} CPUs, load average {load_before} before, {load_after} after the rounds")
    floors = [mode for mode in modes if mode not in ("direct", "plugin")]  # and the baseline, if any
    print(f"{'step':<18}{'direct p50':>12}" + "".join(f"{mode + ' p50':>12}" for mode in floors)
          + f"{'plugin p50':>12}{'ratio':>8}{'direct p90':>12}{'plugin p90':>12}")
    for step in (*STEPS, "lifecycle"):
        d, p = samples["direct"][step], samples["plugin"][step]
        d50, p50 = statistics.median(d), statistics.median(p)
        d90, p90 = statistics.quantiles(d, n=10)[-1], statistics.quantiles(p, n=10)[-1]
        between = "".join(f"{statistics.median(samples[mode][step]) * 1000:>10.1f}ms" for mode in floors)
        print(f"{step:<18}{d50 * 1000:>10.1f}ms{between}{p50 * 1000:>10.1f}ms{p50 / d50:>8.3f}{d90 * 1000:>10.1f}ms"
              f"{p90 * 1000:>10.1f}ms")
    for mode in modes[1:]:
        low, high = bootstrap_ratio(samples["direct"]["lifecycle"], samples[mode]["lifecycle"])
        by_round = [statistics.median(r[mode]) / statistics.median(r["direct"]) for r in paired]
        mine, base = statistics.median(samples[mode]["lifecycle"]), statistics.median(samples["direct"]["lifecycle"])
        print(f"{mode:<7} lifecycle {mine * 1000:.1f} ms, / direct {mine / base:.3f} (90% bootstrap {low:.3f} .. "
              f"{high:.3f}); round by round median {statistics.median(by_round):.3f}: "
              f"{' '.join(f'{r:.3f}' for r in by_round)}")
    print(f"plugin RSS during the rounds (max seen): {rss / 1024:.1f} MiB   target: lifecycle ratio <= 1.05")
    if other is not None:
        baseline_arm.ratio_table(other.name, "plugin", {
            f"{step} p50, ms": (by_step["plugin"][step], by_step[other.name][step]) for step in ("lifecycle", *STEPS)})
    for situation, now, peak in mem:
        print(f"plugin RSS, {situation}: {now / 1024:.1f} MiB (peak {peak / 1024:.1f} MiB)   target: <= 64 MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
