"""GPU benchmark of the scheduler extender; targets live here, not in tests.

1000 nodes, each two sockets of 104 CPUs and 8 GPUs (4 per NUMA node, 2 per PCIe switch),
with a few GPU pods already placed. The same harness as ``extender_scale.py`` measures filter
and bind for CPU-only pods (LSR, 4 CPUs) and for GPU pods (LSR, 4 CPUs, SingleNUMANode, one
whole GPU or a 50% share), alternating the two kinds, and reports the ratio. Target: GPU p99 within 1.5x of CPU-only.

Run ``python benchmarks/extender_gpu.py`` (or ``--quick``: 200 nodes).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.extender_scale import TOPO_TEXT, Cluster, pct, report  # noqa: E402
from tests.scheduler_ext.builders import device, node, nrt, pod  # noqa: E402

RS = "scheduling.koordinator.sh/resource-status"
DA = "scheduling.koordinator.sh/device-allocated"


def cycle(cl: Cluster, p: dict[str, Any], names: list[str], candidates: int, rng: random.Random,
          out: dict[str, list[float]]) -> None:
    t0 = time.perf_counter()
    f = cl.client.post("/filter", {"Pod": p, "NodeNames": rng.sample(names, candidates)})
    out["filter"].append((time.perf_counter() - t0) * 1000)
    survivors = f["NodeNames"]
    if not survivors:
        return
    scores = cl.client.post("/prioritize", {"Pod": p, "NodeNames": survivors})
    best = max(scores, key=lambda s: s["Score"])["Host"]
    t1 = time.perf_counter()
    r = cl.client.post("/bind", {"PodName": p["metadata"]["name"], "PodNamespace": "bench",
                                 "PodUID": p["metadata"]["uid"], "Node": best})
    out["bind"].append((time.perf_counter() - t1) * 1000)
    if r["Error"]:
        print("bind error:", r["Error"])


def run(cl: Cluster, cpu_pods: list[dict[str, Any]], gpu_pods: list[dict[str, Any]], names: list[str],
        candidates: int, rng: random.Random) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """CPU-only and GPU cycles alternate, so both kinds meet the same machine load (the
    machine is shared: back-to-back phases compared two different noise levels)."""
    cpu: dict[str, list[float]] = {"filter": [], "bind": []}
    gpu: dict[str, list[float]] = {"filter": [], "bind": []}
    for c, g in zip(cpu_pods, gpu_pods, strict=True):
        cycle(cl, c, names, candidates, rng, cpu)
        cycle(cl, g, names, candidates, rng, gpu)
    return cpu, gpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--candidates", type=int, default=420, help="kube-scheduler's adaptive share")
    parser.add_argument("--cycles", type=int, default=600, help="pods per kind")
    args = parser.parse_args()
    if args.quick:
        args.nodes, args.cycles, args.candidates = 200, 200, 200
    rng = random.Random(7)
    names = [f"gpu-{i:04d}" for i in range(args.nodes)]
    objects: list[dict[str, Any]] = []
    for i, n in enumerate(names):
        objects += [node(n), nrt(n, TOPO_TEXT), device(n, 8)]
        if i % 2 == 0:  # some GPUs already in use: one whole card and one half card
            grants = [{"minor": 0, "resources": {"koordinator.sh/gpu-core": "100",
                                                 "koordinator.sh/gpu-memory": "80Gi",
                                                 "koordinator.sh/gpu-memory-ratio": "100"}},
                      {"minor": 5, "resources": {"koordinator.sh/gpu-core": "50",
                                                 "koordinator.sh/gpu-memory": "40Gi",
                                                 "koordinator.sh/gpu-memory-ratio": "50"}}]
            objects.append(pod(f"{n}-old", cpu="8", node_name=n, extra={"nvidia.com/gpu": "1"},
                               annotations={RS: json.dumps({"cpuset": "0-3,104-107"}),
                                            DA: json.dumps({"gpu": grants})}))
    cpu_pods = [pod(f"cpu-{i:04d}", cpu="4", namespace="bench") for i in range(args.cycles)]
    gpu_pods = [pod(f"gpu-{i:04d}", cpu="4", namespace="bench", numa_policy="SingleNUMANode",
                    extra={"nvidia.com/gpu": "1"} if i % 2 else {"koordinator.sh/gpu": "50"})
                for i in range(args.cycles)]
    cl = Cluster(objects + cpu_pods + gpu_pods, ledger=True, extra=[])
    try:
        sync = cl.wait_ready()
        warm = args.cycles // 10  # both kinds start with cold per-node caches: skip their warm-up
        cpu, gpu = run(cl, cpu_pods, gpu_pods, names, min(args.candidates, args.nodes), rng)
        frag = next((line for line in cl.client.get("/metrics")[1].splitlines()
                     if line.startswith("scheduler_ext_gpu_fragmentation_ratio")), "")
    finally:
        cl.close()
    rows = []
    for verb in ("filter", "bind"):
        c, g = pct(cpu[verb][warm:], 99), pct(gpu[verb][warm:], 99)
        rows += [(f"{verb} p99 ms CPU-only", c, None, True), (f"{verb} p99 ms GPU", g, None, True),
                 (f"{verb} p99 GPU / CPU-only", g / c, 1.5, True)]
    report("extender_gpu", rows, {"nodes": args.nodes, "GPUs per node": 8, "candidates": args.candidates,
                                  "pods per kind": args.cycles, "cache sync s": round(sync, 1),
                                  "warm-up cycles skipped": warm, "metric": frag})


if __name__ == "__main__":
    main()
