"""The node agent's own work over a pod lifecycle, in process: the CRI door (``CriInterceptor``)
with every built-in plugin, driven with encoded requests and a runtime that answers at once, so
nothing but the engine is timed (decoding, facts, the store, the stages and their plugins, the
bookkeeping after the call). Speed is reported here, never asserted in tests.

    .venv/bin/python benchmarks/engine_lifecycle.py [--lifecycles 400] [--rounds 5] [--lsr]
    .venv/bin/python benchmarks/engine_lifecycle.py --baseline old=/path/to/tree   # interleaved

One lifecycle: RunPodSandbox, CreateContainer, StartContainer, StopContainer, RemoveContainer,
StopPodSandbox, RemovePodSandbox of an LS pod (``--lsr``: an LSR pod bound to CPUs 0-1 by its
resource-status, as in ``nri_overhead.py``) with one container of 512 CPU shares, the pod as
``proxy_overhead.py`` makes it. The applier is the file applier over a private cgroup root in a
temporary directory (the plans of these pods write no file at these calls). Each round is one
child process per arm (``--baseline NAME=TREE``: the same child with TREE's product code,
``benchmarks/baseline.py``), in alternating order; a child warms up with 20 lifecycles, then
reports per call the median time through the door, per hooked stage the median time of the
stage run (``Pipeline.run``: the hand-off to the plugins' worker thread, the plugins, recording
their plans) and the mean of the plugins' own time (the ``rhp_plugin_duration_seconds``
histogram), and the process CPU per lifecycle.

``--nri`` drives the NRI door (``NriEngine``) instead, with the NRI events of the same
lifecycle (RunPodSandbox, CreateContainer, PostCreateContainer, StartContainer,
PostStartContainer, StopContainer, RemoveContainer, StopPodSandbox, RemovePodSandbox) of an LSR
pod bound to CPU 0 (``nri_overhead.py``'s pod); per event the median time and the process CPU
per lifecycle.

``--stages`` times the three hooked stages of that lifecycle (PreRunPodSandbox,
PreCreateContainer, PostStartContainer) in a tight loop instead, one stage at a time with the
facts the door builds: the plugins' hook functions called directly, recording their plans
(``_StageRun.record``, as the worker job does), and ``Pipeline.run`` as a whole (the hand-off to
the worker thread and back included; its p10 and p50 over ``--lifecycles`` x 4 runs).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, cast

CALLS = ("RunPodSandbox", "CreateContainer", "StartContainer", "StopContainer", "RemoveContainer",
         "StopPodSandbox", "RemovePodSandbox")
PREFIX = "/runtime.v1.RuntimeService/"


async def _child(lifecycles: int, lsr: bool) -> dict[str, Any]:
    """One arm's figures (run with the tree's code on ``sys.path``)."""
    from cri_protos import api_pb2
    from runtime_proxy import compose, logs, metrics
    from runtime_proxy.config import ProxyConfig
    from runtime_proxy.cri.door import CriInterceptor
    from runtime_proxy.engine import pipeline as pipeline_module
    from runtime_proxy.state.store import Store
    from tests.runtime_proxy.fake_cri import FakeCri

    logs.configure("json", os.environ.get("RHP_LOG_LEVEL", "warning"), stream=open(os.devnull, "w"))  # noqa: SIM115
    root = tempfile.mkdtemp(prefix="rhp-engine-")
    parts = compose.build(ProxyConfig(cgroupRoot=root, cgroupDriver="cgroupfs"), entry_points=False)
    door = CriInterceptor(store=Store(), pipeline=parts.pipeline, client=cast(Any, FakeCri()),
                          node_source=parts.node_source, applier=parts.applier, kubelet_root=parts.kubelet_root,
                          events=parts.events, pod_specs=parts.pod_specs)
    calls: dict[str, list[float]] = {c: [] for c in CALLS}
    stages: dict[str, list[float]] = {}
    real_run = pipeline_module.Pipeline.run

    async def timed_run(self: Any, stage: str, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return await real_run(self, stage, *args, **kwargs)
        finally:
            stages.setdefault(stage, []).append(time.perf_counter() - start)

    pipeline_module.Pipeline.run = timed_run  # type: ignore[method-assign]

    async def call(name: str, request: Any, response: Any) -> None:
        start = time.perf_counter()
        intercepted = await door.before(PREFIX + name, request.SerializeToString())
        await intercepted.after(response.SerializeToString())
        calls[name].append(time.perf_counter() - start)

    async def lifecycle(i: int) -> None:
        uid = str(uuid.UUID(int=i))
        sandbox, cid = f"sb{i:08d}", f"c{i:08d}"
        for sub in ("cpu", "cpuset", "memory", "cpuacct"):
            Path(root, sub, "kubepods", "burstable", f"pod{uid}", cid).mkdir(parents=True, exist_ok=True)
        config = api_pb2.PodSandboxConfig()
        config.metadata.name, config.metadata.uid, config.metadata.namespace = f"bench-{i}", uid, "default"
        config.labels["koordinator.sh/qosClass"] = "LSR" if lsr else "LS"
        if lsr:
            config.annotations["scheduling.koordinator.sh/resource-status"] = json.dumps({"cpuset": "0-1"})
        config.linux.cgroup_parent = f"/kubepods/burstable/pod{uid}"
        create = api_pb2.CreateContainerRequest(pod_sandbox_id=sandbox, sandbox_config=config)
        create.config.metadata.name = "app"
        create.config.image.image = "pause"
        create.config.linux.resources.cpu_shares = 512
        steps: list[tuple[str, Any, Any]] = [
            ("RunPodSandbox", api_pb2.RunPodSandboxRequest(config=config),
             api_pb2.RunPodSandboxResponse(pod_sandbox_id=sandbox)),
            ("CreateContainer", create, api_pb2.CreateContainerResponse(container_id=cid)),
            ("StartContainer", api_pb2.StartContainerRequest(container_id=cid), api_pb2.StartContainerResponse()),
            ("StopContainer", api_pb2.StopContainerRequest(container_id=cid), api_pb2.StopContainerResponse()),
            ("RemoveContainer", api_pb2.RemoveContainerRequest(container_id=cid), api_pb2.RemoveContainerResponse()),
            ("StopPodSandbox", api_pb2.StopPodSandboxRequest(pod_sandbox_id=sandbox),
             api_pb2.StopPodSandboxResponse()),
            ("RemovePodSandbox", api_pb2.RemovePodSandboxRequest(pod_sandbox_id=sandbox),
             api_pb2.RemovePodSandboxResponse()),
        ]
        for name, request, response in steps:
            await call(name, request, response)

    def plugin_sums() -> dict[str, float]:
        sums: dict[str, float] = {}
        for family in metrics.PLUGIN_LATENCY.collect():
            for sample in family.samples:
                if sample.name.endswith("_sum"):
                    stage = sample.labels["stage"]
                    sums[stage] = sums.get(stage, 0.0) + sample.value
        return sums

    for i in range(20):
        await lifecycle(i)
    for values in (*calls.values(), *stages.values()):
        values.clear()
    before = plugin_sums()
    cpu = time.process_time()
    for i in range(20, 20 + lifecycles):
        await lifecycle(i)
    cpu = time.process_time() - cpu
    after = plugin_sums()
    return {
        "calls": {name: statistics.median(v) * 1e6 for name, v in calls.items()},
        "stages": {name: statistics.median(v) * 1e6 for name, v in stages.items()},
        "plugins": {name: (after[name] - before.get(name, 0.0)) / lifecycles * 1e6 for name in after
                    if after[name] > before.get(name, 0.0)},
        "cpu": cpu / lifecycles * 1e6,
    }


async def _nri_child(lifecycles: int) -> dict[str, Any]:
    """The NRI door's figures: per event the median time, and the CPU per lifecycle."""
    from cri_protos import nri_pb2
    from runtime_proxy import compose, logs
    from runtime_proxy.config import ProxyConfig
    from runtime_proxy.nri.adapter import NriEngine

    logs.configure("json", "warning", stream=open(os.devnull, "w"))  # noqa: SIM115
    root = tempfile.mkdtemp(prefix="rhp-engine-")
    parts = compose.build(ProxyConfig(cgroupRoot=root, cgroupDriver="cgroupfs"), entry_points=False)
    engine = NriEngine(parts.pipeline, node_source=parts.node_source, applier=parts.applier,
                       kubelet_root=parts.kubelet_root, pod_specs=parts.pod_specs)
    event = nri_pb2.Event
    times: dict[str, list[float]] = {}

    async def timed(name: str, call: Awaitable[object]) -> None:
        start = time.perf_counter()
        await call
        times.setdefault(name, []).append(time.perf_counter() - start)

    async def lifecycle(i: int) -> None:
        uid, sandbox, cid = str(uuid.UUID(int=i)), f"sb{i:08d}", f"c{i:08d}"
        for sub in ("cpu", "cpuset", "memory", "cpuacct"):
            Path(root, sub, "kubepods", "burstable", f"pod{uid}", cid).mkdir(parents=True, exist_ok=True)
        pod = nri_pb2.PodSandbox(id=sandbox, name=f"bench-{i}", uid=uid, namespace="default")
        pod.labels["koordinator.sh/qosClass"] = "LSR"
        pod.annotations["scheduling.koordinator.sh/resource-status"] = json.dumps({"cpuset": "0"})
        pod.linux.cgroup_parent = f"/kubepods/burstable/pod{uid}"
        container = nri_pb2.Container(id=cid, name="app", pod_sandbox_id=sandbox)
        container.linux.resources.cpu.shares.value = 512
        await timed("RunPodSandbox", engine.state_change(event.RUN_POD_SANDBOX, pod, None))
        await timed("CreateContainer", engine.create_container(pod, container))
        for name, which in (("PostCreateContainer", event.POST_CREATE_CONTAINER),
                            ("StartContainer", event.START_CONTAINER),
                            ("PostStartContainer", event.POST_START_CONTAINER)):
            await timed(name, engine.state_change(which, pod, container))
        await timed("StopContainer", engine.stop_container(pod, container))
        await timed("RemoveContainer", engine.state_change(event.REMOVE_CONTAINER, pod, container))
        await timed("StopPodSandbox", engine.state_change(event.STOP_POD_SANDBOX, pod, None))
        await timed("RemovePodSandbox", engine.state_change(event.REMOVE_POD_SANDBOX, pod, None))

    for i in range(20):
        await lifecycle(i)
    times.clear()
    cpu = time.process_time()
    for i in range(20, 20 + lifecycles):
        await lifecycle(i)
    cpu = time.process_time() - cpu
    return {"calls": {name: statistics.median(v) * 1e6 for name, v in times.items()}, "stages": {}, "plugins": {},
            "cpu": cpu / lifecycles * 1e6}


def _stages_child(n: int, lsr: bool) -> dict[str, Any]:
    """Per hooked stage: the plugins' own time, recording their plans, and ``Pipeline.run``."""
    from hooks.facts import ContainerFacts, PodFacts, Resources
    from runtime_proxy import compose, logs
    from runtime_proxy.config import ProxyConfig
    from runtime_proxy.engine import pipeline as pipeline_module
    from runtime_proxy.engine.lifecycle import Lifecycle

    logs.configure("json", "warning", stream=open(os.devnull, "w"))  # noqa: SIM115
    parts = compose.build(ProxyConfig(cgroupRoot=tempfile.mkdtemp(prefix="rhp-engine-"), cgroupDriver="cgroupfs"),
                          entry_points=False)
    core = Lifecycle(parts.pipeline, node_source=parts.node_source, kubelet_root=parts.kubelet_root)
    uid = str(uuid.UUID(int=1))
    annotations = {"scheduling.koordinator.sh/resource-status": json.dumps({"cpuset": "0-1"})} if lsr else {}
    labels = {"koordinator.sh/qosClass": "LSR" if lsr else "LS"}
    pod = PodFacts(name="bench", namespace="default", uid=uid, labels=labels, annotations=annotations,
                   cgroup_parent=f"/kubepods/burstable/pod{uid}", sandbox_id="sb1")
    core.store.put_pod(pod)
    asyncio.run(core.refresh())
    node, container = core.node(), ContainerFacts(name="app", resources=Resources(cpu_shares=512))

    def best(fn: Callable[[], object]) -> float:
        times = []
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(n):
                fn()
            times.append((time.perf_counter() - start) / n * 1e6)
        return min(times)

    out: dict[str, Any] = {}
    for stage, facts in (("PreRunPodSandbox", None), ("PreCreateContainer", container),
                         ("PostStartContainer", container)):
        steps = [s for s in parts.pipeline.steps if s.handles(stage)]
        raws = [(s, s.invoke(stage, pod, facts, node, None)) for s in steps]

        def plugins(steps: list[Any] = steps, stage: str = stage, facts: Any = facts) -> None:
            for s in steps:
                s.invoke(stage, pod, facts, node, None)

        def record(raws: list[Any] = raws, stage: str = stage, facts: Any = facts) -> None:
            run = pipeline_module._StageRun(stage, pod, facts, node, None)
            for s, raw in raws:
                run.record(s, raw, None, 0.0)
            run.finish()

        async def whole(stage: str = stage, facts: Any = facts) -> list[float]:
            times = []
            for _ in range(n * 4):
                start = time.perf_counter()
                await parts.pipeline.run(stage, pod, facts, node)
                times.append((time.perf_counter() - start) * 1e6)
            return sorted(times)

        runs = asyncio.run(whole())
        out[stage] = {"plugins": best(plugins), "record": best(record), "run p10": runs[len(runs) // 10],
                      "run p50": runs[len(runs) // 2]}
    return out


def _stages_table(results: dict[str, list[dict[str, Any]]], other: str | None) -> None:
    head = "| stage: measure, µs | ours, median [min, max] |" + (
        f" {other} | ours / {other} per round |" if other else "")
    print(head)
    print("|---" * (head.count("|") - 1) + "|")
    for stage in ("PreRunPodSandbox", "PreCreateContainer", "PostStartContainer"):
        for measure, label in (("plugins", "the plugins' hook functions"), ("record", "recording their plans"),
                               ("run p10", "Pipeline.run p10"), ("run p50", "Pipeline.run p50")):
            ours = [r[stage][measure] for r in results["ours"]]
            print(_row(f"{stage}: {label}", ours, [r[stage][measure] for r in results[other]] if other else None))


def _run_child(tree: Path | None, args: argparse.Namespace) -> dict[str, Any]:
    env = dict(os.environ)
    if tree is not None:
        env.update({"PYTHONPATH": f"{tree}:{tree / 'devenv'}", "PYTHONSAFEPATH": "1"})
    else:
        root = Path(__file__).resolve().parents[1]
        env["PYTHONPATH"] = f"{root}:{root / 'devenv'}"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--lifecycles", str(args.lifecycles)]
    cmd += [flag for flag, on in (("--lsr", args.lsr), ("--stages", args.stages), ("--nri", args.nri)) if on]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False, stdin=subprocess.DEVNULL)
    if out.returncode != 0:
        sys.exit(f"child failed:\n{out.stderr}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def _row(label: str, ours: list[float], base: list[float] | None) -> str:
    cell = f"{statistics.median(ours):.0f} [{min(ours):.0f}, {max(ours):.0f}]"
    if base is None:
        return f"| {label} | {cell} |"
    ratios = [m / t for m, t in zip(ours, base, strict=True) if t]
    return (f"| {label} | {cell} | {statistics.median(base):.0f} [{min(base):.0f}, {max(base):.0f}] | "
            f"{statistics.median(ratios):.3f} [{min(ratios):.3f}, {max(ratios):.3f}] |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lifecycles", type=int, default=400, help="timed lifecycles per child")
    parser.add_argument("--rounds", type=int, default=5, help="children per arm, in alternating order")
    parser.add_argument("--lsr", action="store_true", help="an LSR pod bound to CPUs 0-1 instead of an LS pod")
    parser.add_argument("--nri", action="store_true", help="the NRI door's events instead (see above)")
    parser.add_argument("--stages", action="store_true", help="time the hooked stages in a tight loop (see above)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from benchmarks import baseline as baseline_arm

    baseline_arm.add_option(parser)
    args = parser.parse_args()
    if args.child:
        if args.stages:
            print(json.dumps(_stages_child(args.lifecycles, args.lsr)))
            return
        run: Callable[[], Awaitable[dict[str, Any]]] = (
            (lambda: _nri_child(args.lifecycles)) if args.nri else (lambda: _child(args.lifecycles, args.lsr)))
        print(json.dumps(asyncio.run(run())))
        return
    base = args.baseline
    if base is not None:
        base.check("runtime_proxy")
    arms: list[tuple[str, Path | None]] = [("ours", None)] + ([(base.name, base.tree)] if base is not None else [])
    what = "NRI door, LSR pod" if args.nri else f"CRI door, {'LSR' if args.lsr else 'LS'} pod"
    print(f"{args.rounds} rounds, {args.lifecycles} lifecycles per child, {what}, "
          f"arms {', '.join(a for a, _ in arms)}; load average {os.getloadavg()[0]:.1f}")
    results: dict[str, list[dict[str, Any]]] = {a: [] for a, _ in arms}
    for rnd, order in baseline_arm.orders(arms, args.rounds):
        for name, tree in order:
            results[name].append(_run_child(tree, args))
        if args.stages:
            print(f"round {rnd + 1}: " + "; ".join(
                f"{a} PreCreateContainer run p50 {results[a][-1]['PreCreateContainer']['run p50']:.0f} us"
                for a, _ in arms))
            continue
        print(f"round {rnd + 1}: " + "; ".join(
            f"{a} CreateContainer {results[a][-1]['calls']['CreateContainer']:.0f} us, "
            f"CPU per lifecycle {results[a][-1]['cpu']:.0f} us" for a, _ in arms))
    print(f"load average at the end {os.getloadavg()[0]:.1f}\n")
    other = base.name if base is not None else None
    if args.stages:
        _stages_table(results, other)
        return
    head = "| measure, µs | ours, median [min, max] |" + (f" {other} | ours / {other} per round |" if other else "")
    print(head)
    print("|---" * (head.count("|") - 1) + "|")

    def series(arm: str, key: str, name: str) -> list[float]:
        return [float(r[key].get(name, 0.0)) for r in results[arm]]

    rows: list[tuple[str, str, str]] = [(f"{c} p50", "calls", c) for c in results["ours"][0]["calls"]]
    stage_names = sorted({s for r in results["ours"] for s in r["stages"]})
    rows += [(f"stage {s} p50", "stages", s) for s in stage_names]
    rows += [(f"plugins' own time at {s}, mean", "plugins", s) for s in stage_names]
    for label, key, name in rows:
        print(_row(label, series("ours", key, name), series(other, key, name) if other else None))
    print(_row("process CPU per lifecycle", [r["cpu"] for r in results["ours"]],
               [r["cpu"] for r in results[other]] if other else None))


if __name__ == "__main__":
    main()
