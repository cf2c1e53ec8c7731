"""The manager's shell parts that decide without I/O: the Lease rules (``lease.decide``,
``lease_body``, ``Elector`` against an in-memory Lease store), the NodeSLO merge patch, and the
cache's handling of hostile objects (each costs only itself)."""

from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import Mapping
from typing import Any

import pytest

from koord_formats import keys
from scheduler_ext.errors import ConflictError, NotFoundError
from scheduler_ext.manager.controller import Cache, merge_patch, metrics_of
from scheduler_ext.manager.lease import Elector, Observed, decide, lease_body
from scheduler_ext.manager.resources import Amount, PodInfo


def lease(holder: str, renew: str = "t1") -> dict[str, Any]:
    return {"metadata": {"resourceVersion": "7"}, "spec": {"holderIdentity": holder, "renewTime": renew,
                                                         "leaseDurationSeconds": 15}}


@pytest.mark.parametrize(
    ("description", "doc", "observed", "now", "action"),
    [
        ("no Lease: create it", None, None, 100.0, "create"),
        ("ours: renew it", lease("me"), None, 100.0, "renew"),
        ("empty holder: take it", lease(""), None, 100.0, "acquire"),
        ("another holder seen for the first time: wait", lease("other"), None, 100.0, "wait"),
        ("another holder renewing: wait", lease("other", "t2"), Observed("other", "t1", 50.0), 100.0, "wait"),
        ("another holder silent for less than the lease: wait", lease("other"), Observed("other", "t1", 90.0),
         100.0, "wait"),
        ("another holder silent for the whole lease, by our clock: take it", lease("other"),
         Observed("other", "t1", 85.0), 100.0, "acquire"),
    ],
)
def test_decide(description: str, doc: dict[str, Any] | None, observed: Observed | None, now: float,
                action: str) -> None:
    assert decide(doc, "me", observed, now, 15).action == action, description


def test_lease_body_guards_the_write_and_counts_transitions() -> None:
    body = lease_body("rhp-manager", "ns", "me", 15, 0.0, lease("other"))
    assert body["metadata"]["resourceVersion"] == "7"
    assert body["spec"]["holderIdentity"] == "me"
    assert body["spec"]["leaseTransitions"] == 1
    assert body["spec"]["renewTime"] == "1970-01-01T00:00:00.000000Z"
    renewed = lease_body("rhp-manager", "ns", "me", 15, 1.0, body)
    assert renewed["spec"]["leaseTransitions"] == 1
    assert renewed["spec"]["acquireTime"] == body["spec"]["acquireTime"]


class FakeLeases:
    """One Lease store with resourceVersion checks, shared by two electors."""

    def __init__(self) -> None:
        self.doc: dict[str, Any] | None = None
        self.version = 0

    async def get_lease(self, namespace: str, name: str) -> dict[str, Any]:
        if self.doc is None:
            raise NotFoundError(404, "not found")
        return copy.deepcopy(self.doc)

    async def create_lease(self, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]:
        if self.doc is not None:
            raise ConflictError(409, "exists")
        return self._store(body)

    async def replace_lease(self, namespace: str, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        if self.doc is None or body["metadata"].get("resourceVersion") != self.doc["metadata"]["resourceVersion"]:
            raise ConflictError(409, "changed")
        return self._store(body)

    def _store(self, body: Mapping[str, Any]) -> dict[str, Any]:
        self.version += 1
        self.doc = copy.deepcopy(dict(body))
        self.doc["metadata"]["resourceVersion"] = str(self.version)
        return copy.deepcopy(self.doc)


def test_two_electors_never_lead_at_once_and_the_second_takes_over_a_silent_first() -> None:
    store = FakeLeases()
    clock = [0.0]
    a = Elector(store, "ns", "l", "a", clock=lambda: clock[0], wall=lambda: clock[0])
    b = Elector(store, "ns", "l", "b", clock=lambda: clock[0], wall=lambda: clock[0])

    async def rounds() -> None:
        last_renewal = 0.0
        for _ in range(20):  # both running: a got it first and keeps it
            assert await a.try_once()
            last_renewal = clock[0]
            assert not await b.try_once()
            assert not (a.is_leader() and b.is_leader())
            clock[0] += 2
        assert a.is_leader() and not b.is_leader()
        # a stops renewing: it stops leading after the renew deadline, b takes over only after the lease
        stopped = last_renewal
        while not b.is_leader():
            await b.try_once()
            assert not (a.is_leader() and b.is_leader()), "two leaders"
            if b.is_leader():
                assert clock[0] - stopped >= 15, "taken over before the lease ran out"
            clock[0] += 1
        assert not a.is_leader()

    asyncio.run(rounds())


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


def test_kinds_whose_crd_is_missing_are_not_written() -> None:
    """A cluster without the NodeMetric CRD: no create per node and resync (each would be a 404),
    and without a NodeMetric the node's batch resources stay unpublished."""
    from scheduler_ext.manager.controller import Reconciler

    cache = Cache()
    cache.replace("nodes", [node("n1")])
    cache.replace("nodemetrics", [], absent=True)
    cache.replace("nodeslos", [])
    api = RecordingAPI()
    reconciler = Reconciler(cache, api, lambda: True)  # type: ignore[arg-type]
    asyncio.run(reconciler.reconcile_node("n1"))
    assert api.calls == [("create", "nodeslos")]
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
    from scheduler_ext.manager.controller import Reconciler

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

    asyncio.run(Reconciler(cache, API(), lambda: True).reconcile_node("n1"))  # type: ignore[arg-type]
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
    from scheduler_ext.manager.controller import Reconciler

    in_flight, most = [0], [0]

    class SlowAPI(RecordingAPI):
        async def create_object(self, kind: str, body: Mapping[str, Any]) -> dict[str, Any]:
            in_flight[0] += 1
            most[0] = max(most[0], in_flight[0])
            await asyncio.sleep(0.001)
            in_flight[0] -= 1
            return {}

    cache = _ready_cache(20)
    asyncio.run(Reconciler(cache, SlowAPI(), lambda: True, concurrency=8).round())  # type: ignore[arg-type]
    assert most[0] == 8


def test_a_replica_that_loses_the_lease_mid_round_stops_writing() -> None:
    from scheduler_ext.manager.controller import Reconciler

    cache = _ready_cache(20)
    api = RecordingAPI()
    calls = [0]

    def leader() -> bool:  # leads for the readiness check and the first batch only
        calls[0] += 1
        return calls[0] <= 2

    asyncio.run(Reconciler(cache, api, leader, concurrency=4).round())  # type: ignore[arg-type]
    written = {kind for _, kind in api.calls}
    assert len([c for c in api.calls if c[0] == "create" and c[1] == "nodemetrics"]) == 4, written
    assert len(cache.dirty) == 16, "the rest waits for the next round"
