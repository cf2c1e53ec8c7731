"""The extender over real HTTP (httpx), with the JSON kube-scheduler sends, against the fake
API server through the official client."""

from __future__ import annotations

import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from koord_formats.topology import format_cpu_topology
from tests.fakeapi import FakeAPIServer
from tests.scheduler_ext.builders import TOPO_QUAD_NUMA, TOPO_SMALL, cluster, cpus, device, node, pod
from tests.scheduler_ext.conftest import Extender, start_extender, wait_for

RS = "scheduling.koordinator.sh/resource-status"
DA = "scheduling.koordinator.sh/device-allocated"


def bind(ext: Extender, p: dict[str, Any], node_name: str) -> str:
    body = {"PodName": p["metadata"]["name"], "PodNamespace": p["metadata"]["namespace"],
            "PodUID": p["metadata"]["uid"], "Node": node_name}
    reply = httpx.post(f"{ext.url}/bind", json=body, timeout=10).json()
    assert set(reply) == {"Error"}
    return str(reply["Error"])


def test_filter_with_node_names_reports_precise_reasons(
    api: FakeAPIServer, serve: Callable[..., Extender]
) -> None:
    full = [pod(f"f{i}", cpu="4", node_name="busy", annotations={RS: json.dumps({"cpuset": c})})
            for i, c in enumerate(["0-1,8-9", "2-3,10-11", "4-5,12-13", "6-7,14-15"])]
    ext = serve([*cluster(["busy", "free"]), node("bare"), *full])
    wait_for(lambda: len(ext.state.pods) == 4)
    p = pod("new", cpu="4")
    reply = httpx.post(f"{ext.url}/filter", json={"Pod": p, "Nodes": None,
                                                   "NodeNames": ["busy", "free", "bare"]}).json()
    assert reply == {
        "Nodes": None,
        "NodeNames": ["free"],
        "FailedNodes": {"busy": "not enough cpus available to satisfy request"},
        "FailedAndUnresolvableNodes": {"bare": "node(s) invalid CPU Topology"},
        "Error": "",
    }


def test_filter_with_node_objects_returns_the_survivors(serve: Callable[..., Extender]) -> None:
    ext = serve(cluster(["a", "b"]))
    items = [node("a"), node("b")]
    p = pod("new", cpu="20")  # more than the 16 CPUs of either node
    reply = httpx.post(f"{ext.url}/filter", json={"Pod": p, "Nodes": {"items": items}, "NodeNames": None}).json()
    assert reply["Nodes"] == {"items": []}
    assert reply["NodeNames"] is None
    assert reply["FailedNodes"] == {"a": "not enough cpus available to satisfy request",
                                    "b": "not enough cpus available to satisfy request"}
    assert not reply["FailedAndUnresolvableNodes"]
    plain = pod("plain", cpu="500m", qos="LS")
    reply = httpx.post(f"{ext.url}/filter", json={"Pod": plain, "Nodes": {"items": items}}).json()
    assert [n["metadata"]["name"] for n in reply["Nodes"]["items"]] == ["a", "b"]


@pytest.mark.parametrize(
    ("strategy", "winner"),
    [("LeastAllocated", "empty"), ("MostAllocated", "half")],
    ids=["least-allocated-prefers-the-empty-node", "most-allocated-packs-the-busy-node"],
)
def test_prioritize_scores_by_strategy(
    serve: Callable[..., Extender], strategy: str, winner: str
) -> None:
    from scheduler_ext.extender import ExtenderConfig

    placed = pod("old", cpu="8", node_name="half", annotations={RS: json.dumps({"cpuset": "0-3,8-11"})})
    ext = serve([*cluster(["empty", "half"]), placed], cfg=ExtenderConfig(score_strategy=strategy))
    wait_for(lambda: len(ext.state.pods) == 1)
    reply = httpx.post(f"{ext.url}/prioritize", json={"Pod": pod("new", cpu="2"),
                                                      "NodeNames": ["empty", "half"]}).json()
    assert all(set(r) == {"Host", "Score"} and 0 <= r["Score"] <= 10 for r in reply)
    assert max(reply, key=lambda r: r["Score"])["Host"] == winner


def test_bind_writes_the_annotations_in_the_binding(api: FakeAPIServer, serve: Callable[..., Extender]) -> None:
    p = pod("web", cpu="4", numa_policy="SingleNUMANode")
    ext = serve([*cluster(["n1"]), p])
    wait_for(lambda: ext.state.pending(p["metadata"]["uid"]) is not None)
    assert bind(ext, p, "n1") == ""
    got = api.get("pods", "web", "default")
    assert got is not None and got["spec"]["nodeName"] == "n1"
    status = json.loads(got["metadata"]["annotations"][RS])
    # the NRT reports no zones, so the NUMA nodes of the CPU topology are the zones (CPU only)
    assert status == {"cpuset": "0-1,8-9", "numaNodeResources": [{"node": 0, "resources": {"cpu": "4"}}]}
    wait_for(lambda: ext.state.held_count() == 0)  # the watch confirmed the hold


def test_bind_failure_rolls_back_everything(api: FakeAPIServer, serve: Callable[..., Extender]) -> None:
    p = pod("web", cpu="4")
    ext = serve([*cluster(["n1"]), p])
    wait_for(lambda: ext.state.pending(p["metadata"]["uid"]) is not None)
    api.inject("POST", r"/pods/web/binding$", 500, message="etcd is down")
    error = bind(ext, p, "n1")
    assert "failed at binding, rolled back" in error and "etcd is down" in error
    got = api.get("pods", "web", "default")
    assert got is not None
    assert "nodeName" not in got["spec"] and RS not in got["metadata"]["annotations"]
    assert ext.state.held_count() == 0
    wait_for(lambda: ext.state.pending(p["metadata"]["uid"]) is not None
             and RS not in (api.get("pods", "web", "default") or {})["metadata"]["annotations"])
    assert bind(ext, p, "n1") == ""  # the same CPUs are free again


def test_a_binding_whose_reply_is_lost_but_which_landed_keeps_its_allocation(
    api: FakeAPIServer, serve: Callable[..., Extender]
) -> None:
    p = pod("web", cpu="4")
    ext = serve([*cluster(["n1"]), p])
    wait_for(lambda: ext.state.pending(p["metadata"]["uid"]) is not None)
    api.inject("POST", r"/pods/web/binding$", 504, reason="Timeout", message="reply lost", after=True)
    assert bind(ext, p, "n1") == ""  # the pod is bound with our annotations: a success
    got = api.get("pods", "web", "default")
    assert got is not None and got["spec"]["nodeName"] == "n1"
    cpuset = json.loads(got["metadata"]["annotations"][RS])["cpuset"]
    wait_for(lambda: ext.state.held_count() == 0)  # confirmed by the watch, never released
    other = pod("other", cpu="4")
    api.create(other)
    wait_for(lambda: ext.state.pending(other["metadata"]["uid"]) is not None)
    assert bind(ext, other, "n1") == ""
    theirs = json.loads((api.get("pods", "other", "default") or {})["metadata"]["annotations"][RS])["cpuset"]
    assert not cpus(cpuset) & cpus(theirs)


def test_bind_retries_a_stale_resource_version(api: FakeAPIServer, serve: Callable[..., Extender]) -> None:
    p = pod("web", cpu="2")
    ext = serve([*cluster(["n1"]), p])
    wait_for(lambda: ext.state.pending(p["metadata"]["uid"]) is not None)
    api.inject("POST", r"/pods/web/binding$", 409, reason="Conflict", message="the object has been modified")
    assert bind(ext, p, "n1") == ""
    got = api.get("pods", "web", "default")
    assert got is not None and got["spec"]["nodeName"] == "n1" and RS in got["metadata"]["annotations"]


def test_gpu_bind_writes_device_and_cpu_annotations_in_the_binding_alone(
    api: FakeAPIServer, serve: Callable[..., Extender]
) -> None:
    p = pod("train", cpu="4", numa_policy="SingleNUMANode", extra={"nvidia.com/gpu": "2"})
    ext = serve([*cluster(["g1"], format_cpu_topology(TOPO_SMALL), gpus=4), p])
    wait_for(lambda: ext.state.pending(p["metadata"]["uid"]) is not None)
    patches, posts = api.counts.get("PATCH", 0), api.counts.get("POST", 0)
    assert bind(ext, p, "g1") == ""
    assert api.counts.get("PATCH", 0) == patches  # nothing stale to clear: the Binding is the one write
    assert api.counts.get("POST", 0) == posts + 1
    ann = (api.get("pods", "train", "default") or {})["metadata"]["annotations"]
    gpus = json.loads(ann[DA])["gpu"]
    assert [(g["minor"], g["id"], g["resources"]["koordinator.sh/gpu-core"]) for g in gpus] == [
        (0, "GPU-g1-0", "100"), (1, "GPU-g1-1", "100")]
    assert json.loads(ann[RS])["cpuset"] == "0-1,8-9"  # NUMA 0, where GPUs 0 and 1 sit


@pytest.mark.parametrize(
    ("verb", "body", "status", "check"),
    [
        ("filter", b"{not json", 200, lambda r: r.json()["Error"].startswith("request body is not JSON")),
        ("filter", b'{"NodeNames": ["a"]}', 200, lambda r: r.json()["Error"] == "Pod is missing"),
        ("filter", b'{"Pod": {}, "NodeNames": [1]}', 200, lambda r: "list of strings" in r.json()["Error"]),
        ("bind", b'{"PodName": "x"}', 200, lambda r: "required" in r.json()["Error"]),
        ("prioritize", b"[]", 400, lambda r: "object" in r.text),
        ("preempt", b'{"Pod": {}, "NodeNameToMetaVictims": {"a": 3}}', 400, lambda r: "bad preempt" in r.text),
    ],
    ids=["filter-garbage-is-an-error", "filter-without-pod", "filter-bad-names", "bind-without-names",
         "prioritize-garbage-is-400", "preempt-garbage-is-400"],
)
def test_garbage_requests_get_clear_errors(
    extender: Extender, verb: str, body: bytes, status: int, check: Callable[[httpx.Response], bool]
) -> None:
    r = httpx.post(f"{extender.url}/{verb}", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == status
    assert check(r)


def test_invalid_pod_request_makes_every_node_unresolvable(serve: Callable[..., Extender]) -> None:
    ext = serve(cluster(["a"]))
    p = pod("bad", extra={"koordinator.sh/gpu-core": "50"})
    reply = httpx.post(f"{ext.url}/filter", json={"Pod": p, "NodeNames": ["a", "ghost"]}).json()
    assert reply["NodeNames"] == []
    assert set(reply["FailedAndUnresolvableNodes"]) == {"a", "ghost"}
    assert "gpu-core needs gpu-memory" in reply["FailedAndUnresolvableNodes"]["a"]


def test_preempt_keeps_nodes_where_victims_make_room(serve: Callable[..., Extender]) -> None:
    victim = pod("victim", cpu="16", node_name="n1", annotations={RS: json.dumps({"cpuset": "0-15"})})
    other = pod("other", cpu="16", node_name="n2", annotations={RS: json.dumps({"cpuset": "0-15"})})
    ext = serve([*cluster(["n1", "n2"]), victim, other])
    wait_for(lambda: len(ext.state.pods) == 2)
    body = {"Pod": pod("new", cpu="8"), "NodeNameToMetaVictims": {
        "n1": {"Pods": [{"UID": victim["metadata"]["uid"]}], "NumPDBViolations": 1},
        "n2": {"Pods": [{"UID": "not-on-this-node"}], "NumPDBViolations": 0},
    }}
    reply = httpx.post(f"{ext.url}/preempt", json=body).json()
    assert reply == {"NodeNameToMetaVictims": {
        "n1": {"Pods": [{"UID": victim["metadata"]["uid"]}], "NumPDBViolations": 1}}}


def test_health_readiness_and_metrics(extender: Extender) -> None:
    assert httpx.get(f"{extender.url}/healthz").text == "ok"
    assert httpx.get(f"{extender.url}/readyz").status_code == 200
    httpx.post(f"{extender.url}/filter", json={"Pod": pod("p"), "NodeNames": []})
    text = httpx.get(f"{extender.url}/metrics").text
    for name in ("scheduler_ext_verb_duration_seconds_bucket", "scheduler_ext_nodes",
                 "scheduler_ext_gpu_fragmentation_ratio", "scheduler_ext_held_allocations"):
        assert name in text


@pytest.mark.parametrize(
    ("replicas", "ledger"),
    [(1, False), (1, True), (2, True)],
    ids=["one-replica", "one-replica-with-ledger", "two-replicas-behind-one-service"],
)
def test_parallel_binds_on_one_node_get_disjoint_cpusets(
    api: FakeAPIServer, serve: Callable[..., Extender], replicas: int, ledger: bool
) -> None:
    pods = [pod(f"p{i}", cpu="2") for i in range(20)]  # 40 CPUs asked, 32 exist
    for obj in [*cluster(["n1"], format_cpu_topology(TOPO_QUAD_NUMA)), *pods]:
        api.create(obj)
    exts = [start_extender(api.url, ledger=ledger, identity=f"r{i}") for i in range(replicas)]
    try:
        for ext in exts:
            state = ext.state
            wait_for(lambda: all(state.pending(p["metadata"]["uid"]) for p in pods))  # noqa: B023
        with ThreadPoolExecutor(16) as pool:
            errors = list(pool.map(lambda ip: bind(exts[ip[0] % replicas], ip[1], "n1"), enumerate(pods)))
    finally:
        for ext in exts:
            ext.stop()
    bound = [p for p in api.objects("pods") if p["spec"].get("nodeName") == "n1"]
    sets = [cpus(json.loads(p["metadata"]["annotations"][RS])["cpuset"]) for p in bound]
    assert len(bound) == 16 and sum(1 for e in errors if e) == 4
    assert all(len(s) == 2 for s in sets)
    assert len(frozenset().union(*sets)) == 32  # pairwise disjoint
    unbound = [p for p in api.objects("pods") if not p["spec"].get("nodeName")]
    assert all(RS not in p["metadata"]["annotations"] for p in unbound)  # nothing half-done


def test_device_objects_feed_the_gpu_inventory(api: FakeAPIServer, serve: Callable[..., Extender]) -> None:
    ext = serve([*cluster(["g"]), device("g", 2, unhealthy=[1])])
    wait_for(lambda: bool(ext.state.nodes["g"].gpus))
    reply = httpx.post(f"{ext.url}/filter", json={"Pod": pod("p", extra={"nvidia.com/gpu": "2"}),
                                                   "NodeNames": ["g"]}).json()
    assert reply["FailedAndUnresolvableNodes"] == {"g": "pod asks 2 GPU(s), node has 1 healthy"}
