"""The manager's CPU per node update, with 5,000 nodes and 50,000 pods (issue 28), pure core and
the reconcile path against an in-memory API (no network): speed is reported here, never asserted.

Rows (CPU time of this process, ``time.process_time``):

- decode: one Node, one Pod, one NodeMetric (10 pod metrics) event into the cache;
- list: the whole initial list (5,000 Nodes, 50,000 Pods, 5,000 NodeMetrics) into the cache;
- node update, pure: strategy, NodeMetric spec, NodeSLO spec and its merge patch, batch
  resources and the write decision for one node;
- webhook: one AdmissionReview of a pod CREATE against 20 profiles, mutated and validated;
- reconcile, first round: every node through ``Reconciler.reconcile_node`` (creates and status
  patches to the in-memory API); reconcile, steady state: every node again with nothing to write
  (what each resync costs), and the longest single node (the event loop is held at most that
  long between yields).

    python benchmarks/manager_update.py [--nodes 5000] [--pods-per-node 10]

There is no baseline: the manager is new (``/work/baseline`` has none).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from colocation_manager.controller import Cache, Reconciler, merge_patch  # noqa: E402
from colocation_manager.resources import PodInfo, batch_resources, needs_write  # noqa: E402
from colocation_manager.webhook import WebhookState, review  # noqa: E402
from koord_formats import keys, sloconfig  # noqa: E402
from koord_formats.colocation import metric_collect_spec  # noqa: E402
from rhp_ops import logs  # noqa: E402

NOW = time.time()
CONFIG = {
    "colocation-config": json.dumps({"enable": True, "nodeConfigs": [
        {"name": "big", "nodeSelector": {"matchLabels": {"pool": "big"}}, "cpuReclaimThresholdPercent": 70}]}),
    "resource-threshold-config": json.dumps({"clusterStrategy": {"enable": True}}),
    "cpu-burst-config": json.dumps({"clusterStrategy": {"policy": "auto"}}),
}


T = TypeVar("T")


class Leading:
    """A fence that always leads and lets every write through (``rhp_kube.lease.Elector.write``
    adds a clock read and a timeout per write)."""

    def is_leader(self) -> bool:
        return True

    async def write(self, call: Awaitable[T]) -> T:
        return await call

def node(i: int) -> dict[str, Any]:
    return {"metadata": {"name": f"node-{i}", "resourceVersion": str(i),
                         "labels": {"pool": "big" if i % 2 else "small", "kubernetes.io/hostname": f"node-{i}"},
                         "annotations": {keys.NODE_ANNOTATION_RESERVATION: '{"resources":{"cpu":"1"}}'}},
            "status": {"capacity": {"cpu": "64", "memory": "256Gi", "pods": "110"},
                       "allocatable": {"cpu": "63", "memory": "250Gi", "pods": "110"}}}


def pod(i: int, j: int) -> dict[str, Any]:
    be = j % 3 == 0
    res = {keys.RESOURCE_BATCH_CPU: "1000", keys.RESOURCE_BATCH_MEMORY: "1Gi"} if be else \
        {"cpu": "2", "memory": "4Gi"}
    return {"metadata": {"namespace": "bench", "name": f"p-{i}-{j}", "resourceVersion": "1",
                         "labels": {keys.LABEL_QOS_CLASS: "BE" if be else "LS", "app": f"a{j}"}},
            "spec": {"nodeName": f"node-{i}", "priority": 5500 if be else 9500,
                     "containers": [{"name": "c", "resources": {"requests": res, "limits": res}}]},
            "status": {"phase": "Running", "qosClass": "BestEffort" if be else "Guaranteed"}}


def node_metric(i: int, pods: int) -> dict[str, Any]:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(NOW - 30))
    return {"metadata": {"name": f"node-{i}", "uid": f"u-{i}", "resourceVersion": "1"},
            "spec": {},
            "status": {"updateTime": stamp,
                       "nodeMetric": {"nodeUsage": {"resources": {"cpu": "20", "memory": "100Gi"}},
                                      "systemUsage": {"resources": {"cpu": "2", "memory": "8Gi"}}},
                       "podsMetric": [{"namespace": "bench", "name": f"p-{i}-{j}", "priority": "koord-prod",
                                       "podUsage": {"resources": {"cpu": "1500m", "memory": "3Gi"}}}
                                      for j in range(pods)]}}


class MemoryAPI:
    """Answers every write at once; records none (the writes' cost is the API server's)."""

    def __init__(self) -> None:
        self.calls = 0

    async def _ok(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        self.calls += 1
        return {}

    create_object = patch_object = delete_object = patch_node_status = _ok


def cpu_us(fn: Callable[[], Any], rounds: int) -> float:
    start = time.process_time()
    for _ in range(rounds):
        fn()
    return (time.process_time() - start) / rounds * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods-per-node", type=int, default=10)
    args = parser.parse_args()
    logs.configure("console", "warning")  # one info line per written node would time the terminal
    n, per = args.nodes, args.pods_per_node
    nodes = [node(i) for i in range(n)]
    pods = [pod(i, j) for i in range(n) for j in range(per)]
    metrics = [node_metric(i, per) for i in range(n)]

    cache = Cache()
    cache.replace("configmaps", [{"metadata": {"name": "slo-controller-config"}, "data": CONFIG}])
    rows: list[tuple[str, str]] = []
    rows.append(("decode one Node event", f"{cpu_us(lambda: cache.apply('nodes', 'MODIFIED', nodes[1]), 2000):.1f} us"))
    rows.append(("decode one Pod event", f"{cpu_us(lambda: cache.apply('pods', 'MODIFIED', pods[1]), 2000):.1f} us"))
    rows.append(("decode one NodeMetric event (10 pods)",
                 f"{cpu_us(lambda: cache.apply('nodemetrics', 'MODIFIED', metrics[1]), 2000):.1f} us"))

    start = time.process_time()
    for kind, items in (("nodes", nodes), ("pods", pods), ("nodemetrics", metrics), ("nodeslos", [])):
        cache.replace(kind, items)
    rows.append((f"list {n} Nodes, {n * per} Pods, {n} NodeMetrics into the cache",
                 f"{time.process_time() - start:.2f} s"))

    entry = cache.nodes["node-1"]
    infos = [p for p in cache.pods["node-1"].values() if isinstance(p, PodInfo)]
    owned, m = cache.metrics["node-1"]

    def pure_update() -> None:
        strategy = cache.colocation.for_node(entry.labels, entry.annotations)
        merge_patch(owned.spec, metric_collect_spec(strategy))
        merge_patch({}, sloconfig.render_node_slo(cache.slo, entry.labels))
        result = batch_resources(strategy, entry.info, infos, m, NOW)
        needs_write(entry.current, result.values, strategy, None, NOW)

    rows.append(("node update, pure (strategy, NodeMetric and NodeSLO specs, batch, write decision)",
                 f"{cpu_us(pure_update, 2000):.1f} us"))

    api = MemoryAPI()
    reconciler = Reconciler(cache, api, Leading(), clock=lambda: NOW)  # type: ignore[arg-type]

    async def every_node() -> float:
        longest = 0.0
        for i in range(n):
            started = time.process_time()
            await reconciler.reconcile_node(f"node-{i}")
            longest = max(longest, time.process_time() - started)
        return longest

    start = time.process_time()
    asyncio.run(every_node())
    first = time.process_time() - start
    rows.append((f"reconcile, first round ({api.calls} writes to the in-memory API)",
                 f"{first:.2f} s, {first / n * 1e6:.0f} us a node"))
    # steady state: what the writes would have made the cache hold
    slo_specs = {name: sloconfig.render_node_slo(cache.slo, e.labels) for name, e in cache.nodes.items()}
    for i in range(n):
        name = f"node-{i}"
        e = cache.nodes[name]
        strategy = cache.colocation.for_node(e.labels, e.annotations)
        owned_m, metric = cache.metrics[name]
        cache.metrics[name] = (type(owned_m)(owned_m.uid, metric_collect_spec(strategy)), metric)
        cache.nodeslos[name] = type(owned_m)(f"s-{i}", slo_specs[name])
        infos_i = [p for p in cache.pods[name].values() if isinstance(p, PodInfo)]
        e.current.update(batch_resources(strategy, e.info, infos_i, metric, NOW).values)
    api.calls = 0
    start = time.process_time()
    longest = asyncio.run(every_node())
    steady = time.process_time() - start
    rows.append((f"reconcile, steady state ({api.calls} writes)", f"{steady:.2f} s, {steady / n * 1e6:.0f} us a node"))
    rows.append(("longest single node in the steady round", f"{longest * 1e3:.2f} ms"))

    state = WebhookState()
    state.replace("priorityclasses", [{"metadata": {"name": "koord-batch"}, "value": 5000}])
    state.replace("clustercolocationprofiles", [{"metadata": {"name": f"p{k}"}, "spec": {
        "selector": {"matchLabels": {"app": f"a{k}"}}, "qosClass": "BE", "priorityClassName": "koord-batch"}}
        for k in range(20)])
    body = json.dumps({"request": {"uid": "u", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                                   "namespace": "bench", "operation": "CREATE",
                                   "object": pod(0, 1) | {"metadata": {"namespace": "bench", "labels": {"app": "a1"}}}}
                       }).encode()
    rows.append(("webhook: one pod CREATE review, 20 profiles (mutate)",
                 f"{cpu_us(lambda: review(body, 'mutate', state, lambda: 0), 2000):.1f} us"))
    rows.append(("webhook: the same review (validate)",
                 f"{cpu_us(lambda: review(body, 'validate', state, lambda: 0), 2000):.1f} us"))

    width = max(len(r[0]) for r in rows)
    print(f"manager update cost, {n} nodes, {n * per} pods (CPU time of one process)")
    for label, value in rows:
        print(f"  {label:<{width}}  {value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
