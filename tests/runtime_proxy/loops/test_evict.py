"""The evictors: ``ApiEvictor`` against the fake API server (the official client, the Eviction
subresource, PodDisruptionBudgets, Events) and ``RuntimeEvictor`` against a fake CRI stub."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import kubernetes
import pytest

from cri_protos import api_pb2
from hooks.plan import Eviction
from rhp_kube.events import EventRecorder, KubeEventsApi
from runtime_proxy.loops.evict import ApiEvictor, DeleteEvictor, RuntimeEvictor, event_message, evictor_for
from tests.fake_clock import Clock
from tests.fakeapi import FakeAPIServer


@pytest.fixture
def api() -> Iterator[FakeAPIServer]:
    with FakeAPIServer() as server:
        yield server


def official(api: FakeAPIServer) -> kubernetes.client.ApiClient:
    conf = kubernetes.client.Configuration()
    conf.host = api.url
    return kubernetes.client.ApiClient(conf)


def events(api: FakeAPIServer, evictor: ApiEvictor) -> list[dict[str, Any]]:
    """The Events on the API server once the evictor's recorder has sent what it queued."""
    recorder = evictor._events
    assert isinstance(recorder, EventRecorder)
    done = threading.Event()
    for _ in range(6000):
        if recorder.idle():
            break
        done.wait(0.01)
    return api.objects("Event")


def add_pod(api: FakeAPIServer, name: str, labels: dict[str, str] | None = None, phase: str = "Running") -> str:
    pod = api.create({"kind": "Pod", "metadata": {"name": name, "namespace": "ns", "labels": labels or {}},
                      "spec": {"nodeName": "node-1"}, "status": {"phase": phase}})
    return str(pod["metadata"]["uid"])


def add_pdb(api: FakeAPIServer, name: str, allowed: int, selector: dict[str, Any]) -> None:
    api.create({"kind": "PodDisruptionBudget", "metadata": {"name": name, "namespace": "ns"},
                "spec": {"selector": selector, "minAvailable": 1},
                "status": {"disruptionsAllowed": allowed, "currentHealthy": 1, "desiredHealthy": 1}})


def eviction(name: str, uid: str, feature: str = "BEMemoryEvict") -> Eviction:
    return Eviction(uid, "ns", name, feature, "node memory usage 80% >= threshold 70%")


def evict(evictor: ApiEvictor | RuntimeEvictor, *evictions: Eviction) -> list[tuple[str, str]]:
    results = asyncio.run(evictor.evict(list(evictions)))
    return [(r.eviction.name, r.status) for r in results]


# ---- the fake API server's Eviction subresource, through the official client --------------------


def _evict_raw(api: FakeAPIServer, name: str, uid: str | None) -> int:
    core = kubernetes.client.CoreV1Api(official(api))
    options = kubernetes.client.V1DeleteOptions(preconditions=kubernetes.client.V1Preconditions(uid=uid))
    body = kubernetes.client.V1Eviction(metadata=kubernetes.client.V1ObjectMeta(name=name, namespace="ns"),
                                        delete_options=options)
    try:
        core.create_namespaced_pod_eviction(name, "ns", body)
    except kubernetes.client.rest.ApiException as exc:
        return int(exc.status)
    return 201


@pytest.mark.parametrize(
    ("pdbs", "labels", "phase", "precondition", "code", "deleted"),
    [
        pytest.param([], {}, "Running", "uid", 201, True, id="no budget: 201 and the pod is deleted"),
        pytest.param([], {}, "Running", "other", 409, False, id="a UID precondition naming another pod: 409"),
        pytest.param([], {}, "Running", None, 201, True, id="no precondition: evicted"),
        pytest.param([("pdb", 0, {"matchLabels": {"app": "x"}})], {"app": "x"}, "Running", "uid", 429, False,
                     id="a matching budget that allows no disruption: 429"),
        pytest.param([("pdb", 0, {"matchLabels": {"app": "y"}})], {"app": "x"}, "Running", "uid", 201, True,
                     id="a budget that does not match the pod does not count"),
        pytest.param([("pdb", 1, {"matchExpressions": [{"key": "app", "operator": "In", "values": ["x"]}]})],
                     {"app": "x"}, "Running", "uid", 201, True, id="a matching budget that allows one: evicted"),
        pytest.param([("pdb", 0, {})], {"app": "x"}, "Succeeded", "uid", 201, True,
                     id="a finished pod is evicted without a budget check"),
        pytest.param([("pdb", 0, {})], {"app": "x"}, "Pending", "uid", 201, True,
                     id="a Pending pod is evicted without a budget check, as kube-apiserver"),
        pytest.param([("a", 1, {}), ("b", 1, {})], {"app": "x"}, "Running", "uid", 500, False,
                     id="two matching budgets: 500 as kube-apiserver"),
    ],
)
def test_fake_eviction_subresource(api: FakeAPIServer, pdbs: list[tuple[str, int, dict[str, Any]]],
                                   labels: dict[str, str], phase: str, precondition: str | None, code: int,
                                   deleted: bool) -> None:
    uid = add_pod(api, "p", labels, phase)
    for name, allowed, selector in pdbs:
        add_pdb(api, name, allowed, selector)
    want = {"uid": uid, "other": "someone-else", None: None}[precondition]
    assert _evict_raw(api, "p", want) == code
    assert (api.get("Pod", "p", "ns") is None) is deleted


def test_fake_eviction_of_a_pod_being_deleted_skips_the_budget(api: FakeAPIServer) -> None:
    """As kube-apiserver: a pod that already has a deletionTimestamp is deleted without a budget check."""
    api.create({"kind": "Pod", "metadata": {"name": "p", "namespace": "ns", "labels": {"app": "x"},
                                            "deletionTimestamp": "2026-01-01T00:00:00Z"},
                "spec": {"nodeName": "node-1"}, "status": {"phase": "Running"}})
    add_pdb(api, "pdb", 0, {"matchLabels": {"app": "x"}})
    assert _evict_raw(api, "p", None) == 201
    assert api.get("Pod", "p", "ns") is None


def test_fake_eviction_spends_the_budget(api: FakeAPIServer) -> None:
    add_pdb(api, "pdb", 1, {"matchLabels": {"app": "x"}})
    add_pod(api, "a", {"app": "x"})
    add_pod(api, "b", {"app": "x"})
    assert _evict_raw(api, "a", None) == 201
    assert _evict_raw(api, "b", None) == 429
    pdb = api.get("PodDisruptionBudget", "pdb", "ns")
    assert pdb is not None and pdb["status"]["disruptionsAllowed"] == 0 and "a" in pdb["status"]["disruptedPods"]
    assert _evict_raw(api, "gone", None) == 404


# ---- ApiEvictor ---------------------------------------------------------------------------------


def test_api_evictor_evicts_with_the_uid_and_records_an_event(api: FakeAPIServer) -> None:
    uid = add_pod(api, "p")
    evictor = ApiEvictor(official(api), node_name="node-1")
    e = eviction("p", uid)
    assert evict(evictor, e) == [("p", "evicted")]
    assert api.get("Pod", "p", "ns") is None
    (event,) = events(api, evictor)
    assert event["involvedObject"] == {"apiVersion": "v1", "kind": "Pod", "name": "p", "namespace": "ns", "uid": uid}
    assert event["type"] == "Warning" and event["reason"] == "evictPodSuccess"
    assert event["message"] == event_message(e)
    assert event["message"].startswith("trigger by runtime-hook-proxy feature BEMemoryEvict, evict pod: ns/p")
    assert event["source"] == {"component": "runtime-hook-proxy", "host": "node-1"}


def test_api_evictor_counts_a_replaced_or_missing_pod_as_gone(api: FakeAPIServer) -> None:
    add_pod(api, "p")
    evictor = ApiEvictor(official(api))
    assert evict(evictor, eviction("p", "old-uid"), eviction("missing", "uid-m")) == [
        ("p", "evicted"), ("missing", "evicted")]
    assert api.get("Pod", "p", "ns") is not None, "the pod now under that name is not the one meant"
    assert events(api, evictor) == []


def test_api_evictor_retries_after_a_budget_refusal_with_backoff(api: FakeAPIServer) -> None:
    clock = Clock()
    uid = add_pod(api, "p", {"app": "x"})
    add_pdb(api, "pdb", 0, {"matchLabels": {"app": "x"}})
    evictor = ApiEvictor(official(api), backoff_initial=1.0, backoff_max=4.0, clock=clock)
    e = eviction("p", uid)
    assert evict(evictor, e) == [("p", "refused")]
    posts = len(api.evictions)
    assert evict(evictor, e) == [("p", "refused")]
    assert len(api.evictions) == posts, "within the backoff the API is not asked again"
    clock.now += 1.0
    assert evict(evictor, e) == [("p", "refused")]  # asked again, refused again: backoff doubles
    clock.now += 1.5
    posts = len(api.evictions)
    assert evict(evictor, e) == [("p", "refused")]
    assert len(api.evictions) == posts
    api.patch_direct("PodDisruptionBudget", "pdb", {"status": {"disruptionsAllowed": 1}}, "ns")
    clock.now += 1.0
    assert evict(evictor, e) == [("p", "evicted")]
    assert api.get("Pod", "p", "ns") is None
    reasons = sorted(ev["reason"] for ev in events(api, evictor))
    assert reasons == ["evictPodFail", "evictPodSuccess"], "one refusal event per pod, then the success"


def test_api_evictor_never_evicts_a_uid_twice(api: FakeAPIServer) -> None:
    uid = add_pod(api, "p")
    evictor = ApiEvictor(official(api))
    assert evict(evictor, eviction("p", uid)) == [("p", "evicted")]
    posts = len(api.evictions)
    assert evict(evictor, eviction("p", uid, "BECPUEvict")) == [("p", "evicted")]
    assert len(api.evictions) == posts


def test_api_evictor_reports_server_errors_per_pod(api: FakeAPIServer) -> None:
    a, b = add_pod(api, "a"), add_pod(api, "b")
    api.inject("POST", r"/pods/a/eviction$", 500)
    evictor = ApiEvictor(official(api))
    assert evict(evictor, eviction("a", a), eviction("b", b)) == [("a", "failed"), ("b", "evicted")]


def test_api_evictor_without_credentials_fails_every_eviction(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    monkeypatch.setenv("HOME", str(tmp_path))
    results = asyncio.run(ApiEvictor().evict([eviction("p", "u")]))
    assert [r.status for r in results] == ["failed"] and "usageLoop.evictBy: runtime" in results[0].message


# ---- RuntimeEvictor -----------------------------------------------------------------------------


class FakeRuntime:
    """The three CRI calls the runtime evictor makes, over a fixed set of sandboxes."""

    def __init__(self, pods: dict[str, list[str]], fail: str = "") -> None:
        self.pods = pods  # uid -> running container ids
        self.stopped: list[tuple[str, int]] = []
        self.fail = fail

    async def ListPodSandbox(self, req: Any, timeout: float) -> Any:
        return SimpleNamespace(items=[SimpleNamespace(id=f"sb-{uid}", metadata=SimpleNamespace(uid=uid))
                                      for uid in self.pods])

    async def ListContainers(self, req: api_pb2.ListContainersRequest, timeout: float) -> Any:
        assert req.filter.state.state == api_pb2.CONTAINER_RUNNING
        uid = req.filter.pod_sandbox_id.removeprefix("sb-")
        return SimpleNamespace(containers=[SimpleNamespace(id=c) for c in self.pods[uid]])

    async def StopContainer(self, req: api_pb2.StopContainerRequest, timeout: float) -> Any:
        if req.container_id == self.fail:
            raise RuntimeError("runtime said no")
        self.stopped.append((req.container_id, req.timeout))
        return SimpleNamespace()


def test_runtime_evictor_stops_the_pods_containers_at_once() -> None:
    runtime = FakeRuntime({"u1": ["c1", "c2"], "u2": ["c3"], "u3": []})
    evictor = RuntimeEvictor(SimpleNamespace(runtime=runtime, timeout=5.0))
    assert evict(evictor, eviction("a", "u1"), eviction("c", "u3")) == [("a", "evicted"), ("c", "evicted")]
    assert runtime.stopped == [("c1", 0), ("c2", 0)]
    assert evict(evictor, eviction("a", "u1")) == [("a", "evicted")]
    assert runtime.stopped == [("c1", 0), ("c2", 0)], "a pod evicted recently is not stopped twice"


def test_runtime_evictor_failure_costs_only_that_pod() -> None:
    runtime = FakeRuntime({"u1": ["bad"], "u2": ["c3"]}, fail="bad")
    evictor = RuntimeEvictor(SimpleNamespace(runtime=runtime, timeout=5.0))
    assert evict(evictor, eviction("a", "u1"), eviction("b", "u2")) == [("a", "failed"), ("b", "evicted")]
    assert runtime.stopped == [("c3", 0)]


def test_evictor_for_follows_evict_by() -> None:
    runtime = SimpleNamespace(runtime=FakeRuntime({}), timeout=1.0)
    assert isinstance(evictor_for("api", runtime=runtime, node_name="n"), ApiEvictor)
    assert isinstance(evictor_for("runtime", runtime=runtime), RuntimeEvictor)
    with pytest.raises(ValueError, match="evictBy"):
        evictor_for("kill", runtime=runtime)


def test_eviction_events_go_through_the_nodes_one_recorder_and_its_cap(api: FakeAPIServer) -> None:
    """The node's recorder (rhp_kube.events) is handed to the evictor, so eviction Events count
    against the same node-wide cap as the hook-failure Events: with room for one write, the
    second eviction's Event is held back."""
    client = official(api)
    recorder = EventRecorder(lambda: KubeEventsApi(client), host="node-1", node_burst=1, node_qps=1e-9)
    wired = evictor_for("api", runtime=None, node_name="node-1", events=recorder)
    assert isinstance(wired, ApiEvictor) and wired._events is recorder
    evictor = ApiEvictor(client, node_name="node-1", events=recorder)
    a, b = add_pod(api, "a"), add_pod(api, "b")
    assert evict(evictor, eviction("a", a), eviction("b", b)) == [("a", "evicted"), ("b", "evicted")]
    sent = events(api, evictor)
    assert [ev["involvedObject"]["name"] for ev in sent] == ["a"]
    recorder.close()


# ---- DeleteEvictor (evictBy: delete) --------------------------------------------------------------


def test_delete_evictor_deletes_the_pod_with_its_uid_and_records_an_event(api: FakeAPIServer) -> None:
    uid = add_pod(api, "p", {"app": "x"})
    add_pdb(api, "pdb", 0, {"matchLabels": {"app": "x"}})
    evictor = DeleteEvictor(official(api), node_name="node-1")
    assert evictor.method == "delete"
    assert evict(evictor, eviction("p", uid)) == [("p", "evicted")]
    assert api.get("Pod", "p", "ns") is None, "deleted as kubelet's node-pressure eviction: no budget consulted"
    assert api.evictions == [], "no Eviction request"
    (event,) = events(api, evictor)
    assert event["reason"] == "evictPodSuccess" and event["source"] == {"component": "runtime-hook-proxy",
                                                                          "host": "node-1"}


def test_delete_evictor_never_deletes_a_pod_replaced_under_the_same_name(api: FakeAPIServer) -> None:
    add_pod(api, "p")
    evictor = DeleteEvictor(official(api))
    assert evict(evictor, eviction("p", "old-uid"), eviction("missing", "uid-m")) == [
        ("p", "evicted"), ("missing", "evicted")]
    assert api.get("Pod", "p", "ns") is not None, "the pod now under that name is not the one meant"
    assert events(api, evictor) == []


def test_evictor_for_names_each_method() -> None:
    assert type(evictor_for("delete", runtime=None)) is DeleteEvictor
    assert type(evictor_for("api", runtime=None)) is ApiEvictor
    with pytest.raises(ValueError, match="api, delete or runtime"):
        evictor_for("kill", runtime=None)


# ---- the transport: rhp_kube.http, the one client family (issue 32) -----------------------------


def test_evictions_and_deletes_go_through_the_one_transport(api: FakeAPIServer,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The Eviction POST and the delete with a UID precondition go through ``rhp_kube.http`` on
    the fake API server, with the same outcomes: evicted, 429 refused, 409 (another UID) and 404
    gone, 500 failed. The generated client's CoreV1Api is made unusable: on the old main every
    eviction went through it."""

    def no_generated_client(*args: object, **kwargs: object) -> None:
        raise AssertionError("an eviction went through the generated client")

    monkeypatch.setattr(kubernetes.client, "CoreV1Api", no_generated_client)
    fine, held, broken = add_pod(api, "fine"), add_pod(api, "held", {"app": "x"}), add_pod(api, "broken")
    add_pdb(api, "pdb", 0, {"matchLabels": {"app": "x"}})
    api.inject("POST", r"/pods/broken/eviction$", 500)
    evictor = ApiEvictor(official(api), node_name="node-1")
    assert evict(evictor, eviction("fine", fine), eviction("held", held), eviction("broken", broken),
                 eviction("missing", "uid-m")) == [
        ("fine", "evicted"), ("held", "refused"), ("broken", "failed"), ("missing", "evicted")]
    assert api.get("Pod", "fine", "ns") is None and api.get("Pod", "held", "ns") is not None
    assert ("ns", "fine", 201) in api.evictions and ("ns", "held", 429) in api.evictions
    assert sorted(ev["reason"] for ev in events(api, evictor)) == ["evictPodFail", "evictPodSuccess"]

    gone = add_pod(api, "gone")
    deleter = DeleteEvictor(official(api), node_name="node-1")
    assert evict(deleter, eviction("gone", "old-uid"), eviction("held", held)) == [
        ("gone", "evicted"), ("held", "evicted")]
    assert api.get("Pod", "gone", "ns") is not None, "a UID precondition naming another pod deletes nothing"
    assert api.get("Pod", "held", "ns") is None and gone
