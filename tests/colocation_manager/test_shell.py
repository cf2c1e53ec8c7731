"""The manager's shell parts that decide without I/O: the NodeSLO merge patch, the reconciler's
writes (through a fence; the election itself is tests/rhp_kube/test_kube_lease.py), and the cache's
handling of hostile objects (each costs only itself)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

import pytest

from colocation_manager.controller import Cache, merge_patch, metrics_of
from colocation_manager.resources import Amount, PodInfo
from koord_formats import keys
from rhp_kube.lease import NotLeader

T = TypeVar("T")


class Always:
    """A fence that always leads (the election is tested in tests/rhp_kube/test_kube_lease.py)."""

    def __init__(self, leader: Callable[[], bool] = lambda: True) -> None:
        self.leader = leader

    def is_leader(self) -> bool:
        return self.leader()

    async def write(self, call: Awaitable[T]) -> T:
        if not self.leader():
            call.close()  # type: ignore[attr-defined]
            raise NotLeader("not leading")
        return await call


def test_merge_patch_removes_what_is_gone() -> None:
    old = {"a": {"x": 1, "y": 2}, "b": 1, "c": [1]}
    new = {"a": {"x": 1}, "c": [2], "d": {}}
    assert merge_patch(old, new) == {"a": {"y": None}, "b": None, "c": [2], "d": {}}
    assert merge_patch(new, new) == {}


def node(name: str, **status: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": "1"},
            "status": {"capacity": {"cpu": "8", "memory": "8Gi"}, "allocatable": {"cpu": "8", "memory": "8Gi"},
                       **status}}


def pod(name: str, node_name: str, cpu: object = "1") -> dict[str, Any]:
    return {"metadata": {"namespace": "ns", "name": name, "resourceVersion": "1"},
            "spec": {"nodeName": node_name, "containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]},
            "status": {"phase": "Running"}}


def test_a_hostile_pod_costs_only_its_own_node() -> None:
    cache = Cache()
    cache.replace("nodes", [node("n1"), node("n2")])
    cache.replace("pods", [pod("good", "n1"), pod("bad", "n2", cpu={"nested": 1}), {"metadata": 5}])
    assert isinstance(cache.pods["n1"][("ns", "good")], PodInfo)
    bad = cache.pods["n2"][("ns", "bad")]
    assert isinstance(bad, PodInfo) and bad.estimated, "estimated (objects.pod_view), not a problem of its node"
    assert bad.request.cpu == 250, "its unreadable container at the estimator's default"
    cache.apply("pods", "MODIFIED", pod("bad", "n2"))
    fixed = cache.pods["n2"][("ns", "bad")]
    assert isinstance(fixed, PodInfo) and not fixed.estimated, "decoded in full by its next event"


def test_a_hostile_node_and_node_metric_cost_only_themselves() -> None:
    cache = Cache()
    cache.replace("nodes", [node("n1"), node("n2", capacity={"cpu": "1e999"})])
    assert not cache.nodes["n1"].info.problem
    assert cache.nodes["n2"].info.problem
    assert metrics_of({"status": {"updateTime": "yesterday"}}).problem
    assert metrics_of({"status": {"podsMetric": [{}] * 5000}}).problem
    good = metrics_of({"status": {"updateTime": "2026-11-27T08:00:00Z",
                                  "nodeMetric": {"systemUsage": {"resources": {"cpu": "500m"}}}}})
    assert not good.problem and good.system_usage.cpu == 500


def test_published_values_are_read_from_allocatable() -> None:
    cache = Cache()
    cache.replace("nodes", [node("n1", allocatable={keys.RESOURCE_BATCH_CPU: "4000", "cpu": "8"})])
    assert cache.nodes["n1"].current[keys.RESOURCE_BATCH_CPU] == 4000
    assert cache.nodes["n1"].current[keys.RESOURCE_BATCH_MEMORY] is None


def test_a_bad_colocation_config_keeps_the_previous_one() -> None:
    cache = Cache()
    cache.replace("configmaps", [{"metadata": {"name": "slo-controller-config"},
                                  "data": {"colocation-config": '{"enable":true}'}}])
    assert cache.colocation.cluster.enable
    cache.apply("configmaps", "MODIFIED", {"metadata": {"name": "slo-controller-config"},
                                           "data": {"colocation-config": '{"enable":"yes"}'}})
    assert cache.colocation.cluster.enable
    cache.apply("configmaps", "DELETED", {"metadata": {"name": "slo-controller-config"}})
    assert not cache.colocation.cluster.enable, "no ConfigMap: the defaults"


class RecordingAPI:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    async def create_object(self, kind: str, body: Mapping[str, Any]) -> dict[str, Any]:
        self.calls.append(("create", kind))
        return {}

    async def patch_object(self, kind: str, name: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        self.calls.append(("patch", kind))
        return {}

    async def delete_object(self, kind: str, name: str, uid: str = "") -> None:
        self.calls.append(("delete", kind))

    async def patch_node_status(self, name: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        self.calls.append(("status", name))
        return {}

    async def patch_node(self, name: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        self.calls.append(("node", name))
        return {}


def test_kinds_whose_crd_is_missing_are_not_written() -> None:
    """A cluster without the NodeMetric CRD: no create per node and resync (each would be a 404),
    and without a NodeMetric the node's batch resources stay unpublished."""
    from colocation_manager.controller import Reconciler

    cache = Cache()
    cache.replace("nodes", [node("n1")])
    cache.replace("nodemetrics", [], absent=True)
    cache.replace("nodeslos", [])
    api = RecordingAPI()
    reconciler = Reconciler(cache, api, Always())  # type: ignore[arg-type]
    asyncio.run(reconciler.reconcile_node("n1"))
    assert api.calls == [("create", "nodeslos"), ("node", "n1")], "and the ratio 1.00 (normalization off)"
    cache.replace("nodemetrics", [])  # the CRD got installed
    asyncio.run(reconciler.reconcile_node("n1"))
    assert ("create", "nodemetrics") in api.calls


def topology(name: str, zones: list[dict[str, Any]]) -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": "9"}, "zones": zones}


def zone(i: int, cpu: str = "4", memory: str = "4Gi", extra: list[dict[str, str]] | None = None) -> dict[str, Any]:
    res = [{"name": "cpu", "capacity": cpu, "allocatable": cpu, "available": cpu},
           {"name": "memory", "capacity": memory, "allocatable": memory, "available": memory}, *(extra or [])]
    return {"name": f"node-{i}", "type": "Node", "resources": res}


def test_numa_zones_get_batch_values_and_keep_what_others_wrote() -> None:
    from colocation_manager.controller import Reconciler

    cache = Cache()
    cache.replace("configmaps", [{"metadata": {"name": "c"}, "data": {"colocation-config": '{"enable":true}'}}])
    cache.replace("nodes", [node("n1")])
    cache.replace("nodemetrics", [{"metadata": {"name": "n1", "uid": "u"}, "spec": {}, "status": {
        "updateTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "nodeMetric": {"systemUsage": {"resources": {"cpu": "0", "memory": "0"}}}}}])
    cache.replace("nodeslos", [])
    gpu = {"name": "nvidia.com/gpu", "capacity": "1", "allocatable": "1", "available": "1"}
    cache.replace("noderesourcetopologies", [topology("n1", [zone(0, extra=[gpu]), zone(1)])])
    patches: list[Mapping[str, Any]] = []

    class API(RecordingAPI):
        async def patch_object(self, kind: str, name: str, patch: Mapping[str, Any]) -> dict[str, Any]:
            if kind == "noderesourcetopologies":
                patches.append(patch)
            return {}

    asyncio.run(Reconciler(cache, API(), Always()).reconcile_node("n1"))  # type: ignore[arg-type]
    (patch,) = patches
    assert patch["metadata"]["resourceVersion"] == "9", "guarded by the version read"
    zone0 = {r["name"]: r for r in patch["zones"][0]["resources"]}
    assert set(zone0) == {"cpu", "memory", "nvidia.com/gpu", keys.RESOURCE_BATCH_CPU, keys.RESOURCE_BATCH_MEMORY}
    assert zone0[keys.RESOURCE_BATCH_CPU]["allocatable"] == str(4000 * 60 // 100)
    assert zone0[keys.RESOURCE_BATCH_CPU]["capacity"] == zone0[keys.RESOURCE_BATCH_CPU]["available"]


@pytest.mark.parametrize(
    "zones",
    [
        pytest.param([zone(0), {"name": "node-1", "type": "Node", "resources": []}], id="a zone without cpu"),
        pytest.param([zone(1)], id="NUMA ids not starting at 0"),
        pytest.param([zone(0), zone(0)], id="a NUMA id twice"),
        pytest.param([{"name": "node-\u00b2", "type": "Node", "resources": []}], id="a non-ASCII digit"),
    ],
)
def test_unusable_numa_zones_get_nothing(zones: list[dict[str, Any]]) -> None:
    cache = Cache()
    cache.replace("noderesourcetopologies", [topology("n1", zones)])
    assert cache.topologies["n1"].numa == ()


def test_unreadable_zones_cost_only_their_node() -> None:
    cache = Cache()
    cache.replace("noderesourcetopologies", [topology("n1", [zone(0)]), topology("n2", "zones")])  # type: ignore[arg-type]
    assert set(cache.topologies) == {"n1"}


def test_prod_reclaimable_is_read_for_mid_resources() -> None:
    status = {"updateTime": "2026-11-27T08:00:00Z",
              "prodReclaimableMetric": {"resource": {"resources": {"cpu": "2", "memory": "1Gi"}}}}
    assert metrics_of({"status": status}).prod_reclaimable == Amount(2000, 2**30)
    assert metrics_of({"status": {"updateTime": "2026-11-27T08:00:00Z"}}).prod_reclaimable is None
    assert metrics_of({"status": {"prodReclaimableMetric": {"resource": []}}}).problem


def _ready_cache(nodes: int) -> Cache:
    cache = Cache()
    cache.replace("configmaps", [])
    cache.replace("nodes", [node(f"n{i}") for i in range(nodes)])
    cache.replace("pods", [])
    cache.replace("nodemetrics", [])
    cache.replace("nodeslos", [])
    cache.replace("noderesourcetopologies", [])
    return cache


def test_a_round_overlaps_api_calls_a_few_nodes_at_a_time() -> None:
    from colocation_manager.controller import Reconciler

    in_flight, most = [0], [0]

    class SlowAPI(RecordingAPI):
        async def create_object(self, kind: str, body: Mapping[str, Any]) -> dict[str, Any]:
            in_flight[0] += 1
            most[0] = max(most[0], in_flight[0])
            await asyncio.sleep(0.001)
            in_flight[0] -= 1
            return {}

    cache = _ready_cache(20)
    asyncio.run(Reconciler(cache, SlowAPI(), Always(), concurrency=8).round())  # type: ignore[arg-type]
    assert most[0] == 8


def test_a_replica_whose_term_ends_mid_batch_writes_nothing_after() -> None:
    """The fence is asked at every write, not once per batch: the term ends after the sixth
    write, in the middle of the first batch of four nodes, and no seventh write is made."""
    from colocation_manager.controller import Reconciler

    cache = _ready_cache(20)
    api = RecordingAPI()
    leading = [True]

    class EndsAfterSix(Always):
        async def write(self, call: Awaitable[T]) -> T:
            result = await super().write(call)
            leading[0] = len(api.calls) < 6
            return result

    asyncio.run(Reconciler(cache, api, EndsAfterSix(lambda: leading[0]), concurrency=4).round())  # type: ignore[arg-type]
    assert len(api.calls) == 6, api.calls
    done = {n for n in (f"n{i}" for i in range(20)) if n not in cache.dirty}
    assert len(done) < 4, "every node not finished is left for the next leader"


def test_an_empty_holder_identity_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    from scheduler_ext import cli

    assert cli.main(["manager", "--identity", ""]) == cli.EXIT_USAGE
    _, err = capsys.readouterr()
    assert "--identity" in err and "Traceback" not in err


def _norm_config(enable: bool, ratio: float = 1.2, model: str = "M") -> dict[str, Any]:
    text = json.dumps({"enable": enable, "ratioModel": {model: {"hyperThreadEnabledRatio": ratio}},
                       "nodeConfigs": [{"name": "off", "nodeSelector": {"matchLabels": {"norm": "off"}},
                                        "enable": False}]})
    return {"metadata": {"name": "slo-controller-config"}, "data": {"cpu-normalization-config": text}}


def _nrt_with_info(name: str, info: str | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "resourceVersion": "9"}
    if info is not None:
        meta["annotations"] = {keys.NODE_ANNOTATION_CPU_BASIC_INFO: info}
    return {"metadata": meta, "zones": [zone(0)]}


def test_the_ratio_annotation_follows_the_config_and_the_basic_info() -> None:
    """cpu-normalization-config and the NRT's cpu-basic-info give each Node its ratio (one merge
    patch of that annotation, through the fence); a config change moves it, a disabled config
    gives 1.00, a node selector chooses per node, and an unknown model leaves it as it is."""
    from colocation_manager.controller import Reconciler

    class API(RecordingAPI):
        def __init__(self) -> None:
            super().__init__()
            self.ratios: list[tuple[str, str]] = []

        async def patch_node(self, name: str, patch: Mapping[str, Any]) -> dict[str, Any]:
            assert set(patch) == {"metadata"} and set(patch["metadata"]) == {"annotations"}
            (value,) = patch["metadata"]["annotations"].values()
            self.ratios.append((name, value))
            return {}

    cache = _ready_cache(0)
    cache.replace("nodes", [node("n1"), {**node("off"), "metadata": {"name": "off", "resourceVersion": "1",
                                                                       "labels": {"norm": "off"}}}])
    info = json.dumps({"cpuModel": "M", "hyperThreadEnabled": True})
    cache.replace("noderesourcetopologies", [_nrt_with_info("n1", info), _nrt_with_info("off", info)])
    cache.replace("configmaps", [_norm_config(True)])
    api = API()
    reconciler = Reconciler(cache, api, Always())  # type: ignore[arg-type]

    def run(*names: str) -> list[tuple[str, str]]:
        api.ratios.clear()
        for name in names:
            asyncio.run(reconciler.reconcile_node(name))
        return list(api.ratios)

    def annotate(name: str, ratio: str, labels: dict[str, str] | None = None) -> None:
        obj = node(name)
        obj["metadata"]["annotations"] = {keys.NODE_ANNOTATION_CPU_NORMALIZATION_RATIO: ratio}
        obj["metadata"]["labels"] = labels or {}
        cache.apply("nodes", "MODIFIED", obj)

    assert run("n1", "off") == [("n1", "1.20"), ("off", "1.00")], "enabled by the cluster, disabled by selector"
    annotate("n1", "1.2")
    assert run("n1") == [], "the same ratio (less than 0.01 apart) is not written again"
    cache.apply("configmaps", "MODIFIED", _norm_config(True, ratio=1.5))
    assert run("n1") == [("n1", "1.50")], "a config change moves the ratio"
    annotate("n1", "1.50")
    cache.apply("configmaps", "MODIFIED", _norm_config(False))
    assert run("n1") == [("n1", "1.00")], "disabled: 1.00, as koord-manager writes it"
    annotate("n1", "1.50", {keys.LABEL_CPU_NORMALIZATION_ENABLED: "true"})
    assert run("n1") == [("n1", "1.20")], "the node's label enables over the config"
    annotate("n1", "1.50")
    cache.apply("configmaps", "MODIFIED", _norm_config(True, model="Other"))
    assert run("n1") == [], "a model the config does not name: the annotation is left as it is"
    cache.apply("configmaps", "MODIFIED", _norm_config(True))
    cache.apply("noderesourcetopologies", "MODIFIED", _nrt_with_info("n1", "{not json"))
    assert run("n1") == [], "unreadable basic info: left as it is"
    cache.apply("noderesourcetopologies", "DELETED", _nrt_with_info("n1", None))
    assert run("n1") == [], "no NodeResourceTopology: left as it is"
    cache.apply("configmaps", "MODIFIED", {"metadata": {"name": "slo-controller-config"},
                                           "data": {"cpu-normalization-config": '{"enable":"yes"}'}})
    assert cache.cpu_norm.cluster.enable is True, "a refused config keeps the previous one"


def test_a_deposed_manager_writes_no_ratio() -> None:
    from colocation_manager.controller import Reconciler

    cache = _ready_cache(1)
    cache.replace("configmaps", [_norm_config(False)])
    api = RecordingAPI()
    with pytest.raises(NotLeader):
        asyncio.run(Reconciler(cache, api, Always(lambda: False)).reconcile_node("n0"))  # type: ignore[arg-type]
    assert ("node", "n0") not in api.calls
