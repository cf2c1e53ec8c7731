"""``scheduler-ext manager`` under attack: every watched object (Node, Pod, NodeMetric,
NodeResourceTopology, the ConfigMap) and every webhook object (namespace, profile,
PriorityClass) with a hostile value in each hole goes through the manager's cache and a reconcile
of every node; nothing escapes, no call runs away, and one bad object costs only itself: the
other node keeps its batch resources, a bad ConfigMap keeps the previous config."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Mapping
from typing import Any

import pytest

from colocation_manager.controller import Cache, Reconciler
from colocation_manager.webhook import WebhookState
from koord_formats import FormatError, keys
from koord_formats.colocation import parse_colocation_config
from koord_formats.cpunormalization import parse_cpu_basic_info
from tests.colocation_manager.test_shell import Always
from tests.formats.hostile import FRAGMENTS, fill

NOW = time.time()
STAMP = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(NOW - 10))

NODE = ('{"metadata":{"name":"NAME","resourceVersion":"1","labels":{"a":"b"},"annotations":{}},'
        '"status":{"capacity":{"cpu":"8","memory":"8Gi"},"allocatable":{"cpu":"8","memory":"8Gi"}}}')
POD = ('{"metadata":{"namespace":"ns","name":"p-NAME","resourceVersion":"1"},'
       '"spec":{"nodeName":"NAME","containers":[{"name":"c","resources":{"requests":{"cpu":"1"}}}]},'
       '"status":{"phase":"Running"}}')
METRIC = ('{"metadata":{"name":"NAME","uid":"u","resourceVersion":"1"},"spec":{},'
          '"status":{"updateTime":"' + STAMP + '","nodeMetric":{"systemUsage":{"resources":{"cpu":"500m"}}}}}')
GOOD_INFO = json.dumps({"cpuModel": "M", "hyperThreadEnabled": True})
NRT = ('{"metadata":{"name":"NAME","resourceVersion":"1","annotations":{"' + keys.NODE_ANNOTATION_CPU_BASIC_INFO
       + '":' + json.dumps(GOOD_INFO) + '}},"zones":[{"name":"node-0","type":"Node","resources":'
       '[{"name":"cpu","capacity":"8","allocatable":"8","available":"8"},'
       '{"name":"memory","capacity":"8Gi","allocatable":"8Gi","available":"8Gi"}]}]}')
NORM_CONFIG = '{"enable":true,"ratioModel":{"M":{"hyperThreadEnabledRatio":1.5}}}'
HOLES = {
    "nodes": [NODE.replace('"labels":{"a":"b"}', '"labels":HOLE'),
              NODE.replace('"cpu":"8","memory":"8Gi"},"allocatable"', '"cpu":HOLE,"memory":"8Gi"},"allocatable"'),
              NODE.replace('"annotations":{}', '"annotations":{"' + keys.NODE_ANNOTATION_RESERVATION + '":HOLE}'),
              NODE.replace('"status":{', '"status":HOLE,"x":{')],
    "pods": [POD.replace('{"cpu":"1"}', '{"cpu":HOLE}'), POD.replace('"containers":[', '"containers":HOLE,"y":['),
             POD.replace('"phase":"Running"', '"phase":HOLE'), POD.replace('"nodeName":"NAME"', '"nodeName":HOLE')],
    "nodemetrics": [METRIC.replace('{"cpu":"500m"}', '{"cpu":HOLE}'),
                    METRIC.replace('"updateTime":"' + STAMP + '"', '"updateTime":HOLE'),
                    METRIC.replace('"nodeMetric":{', '"podsMetric":HOLE,"nodeMetric":{')],
    "noderesourcetopologies": [NRT.replace('"zones":[', '"zones":HOLE,"z":['),
                               NRT.replace('"allocatable":"8"', '"allocatable":HOLE'),
                               NRT.replace(json.dumps(GOOD_INFO), "HOLE")],
}


class NoAPI:
    """Accepts every write; counts node status writes per node."""

    def __init__(self) -> None:
        self.status: dict[str, Mapping[str, Any]] = {}
        self.ratio: dict[str, str] = {}

    async def create_object(self, *args: Any) -> dict[str, Any]:
        return {}

    async def patch_object(self, *args: Any) -> dict[str, Any]:
        return {}

    async def delete_object(self, *args: Any) -> None:
        return None

    async def patch_node_status(self, name: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        self.status[name] = patch["status"]["allocatable"]
        return {}

    async def patch_node(self, name: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        self.ratio[name] = patch["metadata"]["annotations"][keys.NODE_ANNOTATION_CPU_NORMALIZATION_RATIO]
        return {}


def cluster(kind: str, hostile: str) -> tuple[Cache, NoAPI]:
    """Two nodes, "good" and "bad"; ``hostile`` replaces the "bad" node's object of ``kind``."""
    cache = Cache()
    cache.replace("configmaps", [{"metadata": {"name": "c"}, "data": {"colocation-config": '{"enable":true}',
                                                                      "cpu-normalization-config": NORM_CONFIG}}])
    objects = {"nodes": NODE, "pods": POD, "nodemetrics": METRIC, "noderesourcetopologies": NRT}
    for k, template in objects.items():
        items = [json.loads(template.replace("NAME", "good"))]
        if k == kind:
            try:
                bad = json.loads(hostile.replace("NAME", "bad"))
            except (ValueError, RecursionError):
                bad = None
            if isinstance(bad, dict):
                items.append(bad)
        else:
            items.append(json.loads(template.replace("NAME", "bad")))
        cache.replace(k, items)
    cache.replace("nodeslos", [])
    return cache, NoAPI()


@pytest.mark.parametrize("kind", list(HOLES))
def test_hostile_watched_objects_cost_only_their_node(kind: str) -> None:
    for template in HOLES[kind]:
        for fragment in FRAGMENTS:
            cache, api = cluster(kind, fill(template, fragment))
            reconciler = Reconciler(cache, api, Always(), clock=lambda: NOW)  # type: ignore[arg-type]
            start = time.thread_time()
            for name in ("good", "bad"):
                asyncio.run(reconciler.reconcile_node(name))
            assert time.thread_time() - start < 1.0, (template, fragment[:40])
            assert api.status["good"][keys.RESOURCE_BATCH_CPU] == str(8000 * 60 // 100 - 1000 - 500), \
                (template, fragment[:40])
            assert cache.basic_info["good"] == parse_cpu_basic_info(GOOD_INFO)
            assert api.ratio["good"] == "1.50", (template, fragment[:40])


def test_a_hostile_config_map_keeps_the_previous_config() -> None:
    cache = Cache()
    good = {"metadata": {"name": "c"}, "data": {"colocation-config": '{"enable":true,"cpuReclaimThresholdPercent":50}',
                                                "cpu-burst-config": '{"clusterStrategy":{"policy":"auto"}}'}}
    cache.replace("configmaps", [good])
    for fragment in FRAGMENTS:
        for key in ("colocation-config", "cpu-burst-config", "resource-qos-config", "host-application-config"):
            bad = {"metadata": {"name": "c"}, "data": {**good["data"], key: fragment}}
            cache.apply("configmaps", "MODIFIED", bad)
            want = 50  # a refused colocation-config keeps the previous one; a valid one (even "{}") replaces it
            if key == "colocation-config":
                with contextlib.suppress(FormatError):
                    want = parse_colocation_config(fragment).cluster.cpu_reclaim_threshold_percent
            assert cache.colocation.cluster.cpu_reclaim_threshold_percent == want, (key, fragment[:40])
            cache.apply("configmaps", "MODIFIED", good)
        cache.apply("configmaps", "MODIFIED", {"metadata": {"name": "c"}, "data": fragment})
        cache.apply("configmaps", "MODIFIED", good)


@pytest.mark.parametrize("kind", ["namespaces", "clustercolocationprofiles", "priorityclasses"])
def test_hostile_webhook_objects_are_left_out(kind: str) -> None:
    state = WebhookState()
    templates = {
        "namespaces": '{"metadata":{"name":"n","labels":HOLE}}',
        "clustercolocationprofiles": '{"metadata":{"name":"p"},"spec":{"selector":HOLE,"labels":HOLE}}',
        "priorityclasses": '{"metadata":{"name":"c"},"value":HOLE,"preemptionPolicy":HOLE}',
    }
    for fragment in FRAGMENTS:
        try:
            obj = json.loads(fill(templates[kind], fragment))
        except (ValueError, RecursionError):
            continue
        state.apply(kind, "ADDED", obj)
        state.snapshot()


def _pod_on_bad(phase: str = "Running", containers: Any = None, **extra: Any) -> dict[str, Any]:
    """A pod on node "bad" the API server accepts but ``pod_info`` cannot decode in full."""
    pod: dict[str, Any] = {
        "metadata": {"namespace": "ns", "name": "big", "resourceVersion": "1",
                     "labels": {f"l{i}": "v" for i in range(4097)}},
        "spec": {"nodeName": "bad", "containers": containers if containers is not None else
                 [{"name": "c", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}]},
        "status": {"phase": phase},
    }  # fmt: skip
    for path, value in extra.items():
        *parents, leaf = path.split("__")
        doc = pod
        for p in parents:
            doc = doc[p]
        doc[leaf] = value
    return pod


def _extended(n: int) -> dict[str, str]:
    return {"cpu": "1", **{f"example.com/r{i}": "1" for i in range(n)}}


_C = {"name": "c", "resources": {"requests": {"cpu": "1m"}}}
# (pod on node "bad" beside its 1-CPU pod, the milli-CPU it is counted by)
UNDECODABLE = [
    pytest.param(_pod_on_bad(), 1000, id="4,097 labels, Running: counted by its readable 1-CPU request"),
    pytest.param(_pod_on_bad("Pending"), 1000, id="4,097 labels, Pending: counted"),
    pytest.param(_pod_on_bad("Failed"), 0, id="4,097 labels, Failed: holds nothing"),
    pytest.param(_pod_on_bad("Succeeded"), 0, id="4,097 labels, Succeeded: holds nothing"),
    pytest.param(_pod_on_bad(metadata__labels={}, containers=[{"name": "c", "resources": {"requests": _extended(65)}}]),
                 1000, id="65 extended resources: its cpu still counts"),
    pytest.param(_pod_on_bad(metadata__labels={}, containers=[_C] * 1025), 1024 + 250,
                 id="1,025 containers: 1,024 read, the one beyond the bound at the default 250m"),
    pytest.param(_pod_on_bad("Failed", metadata__labels={}, containers=[_C] * 1025), 0,
                 id="1,025 containers, Failed: holds nothing"),
    pytest.param(_pod_on_bad(containers=[_C, "not a container"]), 1 + 250,
                 id="a container that is no object: the default"),
    pytest.param(_pod_on_bad(containers=[{"name": "c", "resources": {"requests": {"cpu": "lots"}}}]), 250,
                 id="a cpu that is no quantity: the default"),
    pytest.param(_pod_on_bad(containers="many"), 250, id="containers that are no list: the default"),
    pytest.param(_pod_on_bad(status__phase=7), 1000, id="a phase that is no string: counted as running"),
    pytest.param(_pod_on_bad(spec__initContainers=[{"resources": {"requests": {"cpu": "3"}}}]), 3000,
                 id="a larger init container: counted as Kubernetes counts it"),
    pytest.param(_pod_on_bad(spec__overhead={"cpu": "100m"}), 1100, id="its overhead: added"),
    pytest.param(_pod_on_bad(metadata__labels={**{f"l{i}": "v" for i in range(4097)},
                                               keys.LABEL_PRIORITY_CLASS: keys.PRIORITY_BATCH}), 0,
                 id="a readable koord-batch priority label: not a high-priority pod"),
]


@pytest.mark.parametrize(("pod", "counted"), UNDECODABLE)
def test_a_pod_the_manager_cannot_decode_is_estimated_and_never_resets_its_node(pod: dict[str, Any],
                                                                                counted: int) -> None:
    cache, api = cluster("pods", POD)
    cache.apply("pods", "ADDED", pod)
    reconciler = Reconciler(cache, api, Always(), clock=lambda: NOW)  # type: ignore[arg-type]
    asyncio.run(reconciler.reconcile_node("bad"))
    batch = api.status["bad"]
    assert batch[keys.RESOURCE_BATCH_CPU] == str(8000 * 60 // 100 - 500 - 1000 - counted)
    assert batch[keys.RESOURCE_BATCH_MEMORY] is not None
