"""Poisoned watch objects: each is logged, counted and skipped; the watch's resourceVersion moves
past it, readiness holds, and the pods around it are still allocated exactly."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import time
from typing import Any

import pytest

from koord_formats.topology import format_cpu_topology
from rhp_kube import credentials
from rhp_kube.http import KubeHTTP
from rhp_kube.watch import Informer, Resource, WatchOptions
from scheduler_ext.guard import BAD_OBJECTS
from scheduler_ext.kube import CacheSink
from scheduler_ext.state import KINDS, ClusterState
from tests.rhp_kube.scripted import Scripted
from tests.scheduler_ext.builders import TOPO_SMALL, cluster, cpus, device, node, nrt, pod

RS = "scheduling.koordinator.sh/resource-status"
DA = "scheduling.koordinator.sh/device-allocated"
SPEC = "scheduling.koordinator.sh/resource-spec"
TOPO = format_cpu_topology(TOPO_SMALL)


def bad_count(kind: str, reason: str) -> float:
    return BAD_OBJECTS.labels(kind, reason)._value.get()  # type: ignore[attr-defined,no-any-return]


def bound(name: str, annotations: dict[str, Any], node_name: str = "n1") -> dict[str, Any]:
    return pod(name, cpu="4", node_name=node_name, annotations=annotations)


def with_meta(obj: dict[str, Any], **fields: Any) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    out["metadata"].update(fields)
    return out


POISONED_PODS = [
    pytest.param(bound("p", {DA: '{"gpu":[5]}'}), "allocation",
                 id="device-allocated with a number where a GPU entry belongs"),
    pytest.param(bound("p", {DA: '{"gpu":[{"minor":1e400}]}'}), "allocation",
                 id="device-allocated with a minor that overflows"),
    pytest.param(bound("p", {RS: '{"cpuset":5}'}), "allocation", id="resource-status with a numeric cpuset"),
    pytest.param(bound("p", {RS: "[" * 3000}), "allocation", id="resource-status nested 3000 deep"),
    pytest.param(bound("p", {RS: '{"cpuset":"0-3"}', SPEC: "[" * 3000}), None,
                 id="resource-spec nested 3000 deep next to a valid cpuset"),
    pytest.param(pod("p", annotations={SPEC: "[[[" * 1000}), "request",
                 id="a pending pod whose resource-spec is deep garbage"),
    pytest.param(with_meta(pod("p", node_name="n1"), annotations={RS: {"cpuset": "0"}}), "object",
                 id="annotations whose value is an object"),
    pytest.param(with_meta(pod("p", node_name="n1"), labels=["x"]), None, id="labels that are a list"),
    pytest.param({**pod("p", node_name="n1"), "spec": ["x"]}, "object", id="a spec that is a list"),
    pytest.param({**pod("p"), "metadata": 5}, "object", id="metadata that is a number"),
    pytest.param({**pod("p", node_name="n1"), "status": "Running"}, "object", id="a status that is a string"),
]


@pytest.mark.parametrize(("poison", "reason"), POISONED_PODS)
def test_a_poisoned_pod_costs_only_itself(poison: dict[str, Any], reason: str | None) -> None:
    state = ClusterState()
    state.replace("nodes", [node("n1")])
    state.replace("noderesourcetopologies", [nrt("n1", TOPO)])
    state.replace("devices", [])
    state.replace("reservations", [])
    good = pod("good", cpu="4", node_name="n1", annotations={RS: json.dumps({"cpuset": "4-5,12-13"})})
    state.replace("pods", [good])
    before = bad_count("pods", reason) if reason else 0.0
    for event in ("ADDED", "MODIFIED"):
        state.apply("pods", event, poison)  # never raises
    later = pod("later", cpu="4", node_name="n1", annotations={RS: json.dumps({"cpuset": "6-7,14-15"})})
    state.apply("pods", "ADDED", later)
    if reason:
        assert bad_count("pods", reason) > before
    assert state.ready
    ns = state.nodes["n1"]
    ns.refresh()
    taken = cpus("4-7,12-15")
    assert not ns.free & taken  # both good pods hold their CPUs
    poisoned_uid = poison["metadata"]["uid"] if isinstance(poison.get("metadata"), dict) else None
    held_by_poison = ns.allocs.get(poisoned_uid, None) if poisoned_uid else None
    if held_by_poison is not None:  # only a readable part may count: here the valid cpuset
        assert held_by_poison.cpus == cpus("0-3")
    state.apply("pods", "DELETED", good)
    ns.refresh()
    assert cpus("4-5,12-13") <= ns.free  # deletion of another pod is still seen


def test_a_bound_pod_whose_annotations_turn_unreadable_keeps_what_it_was_proven_to_hold() -> None:
    state = ClusterState()
    state.replace("nodes", [node("n1")])
    state.replace("noderesourcetopologies", [nrt("n1", TOPO)])
    p = pod("p", cpu="4", node_name="n1", annotations={RS: json.dumps({"cpuset": "0-1,8-9"})})
    state.apply("pods", "ADDED", p)
    spoiled = with_meta(p, annotations={RS: '{"cpuset":5}'})
    state.apply("pods", "MODIFIED", spoiled)
    ns = state.nodes["n1"]
    ns.refresh()
    assert not ns.free & cpus("0-1,8-9")
    assert state.pods[p["metadata"]["uid"]].bad


@pytest.mark.parametrize(
    ("kind", "poison", "effect"),
    [
        pytest.param("nodes", with_meta(node("n2"), labels=["x"]), "unknown",
                     id="a Node whose labels are a list is skipped"),
        pytest.param("nodes", node("n2", annotations={"node.koordinator.sh/cpu-topology": "[" * 3000}),
                     "no-topology", id="a Node whose cpu-topology is nested 3000 deep has no topology"),
        pytest.param("noderesourcetopologies",
                     nrt("n2", TOPO, annotations={"kubelet.koordinator.sh/cpu-manager-policy": '{"reservedCPUs":5}'}),
                     "no-topology", id="an NRT whose reserved CPUs are a number offers no CPUs"),
        pytest.param("noderesourcetopologies", {**nrt("n2", TOPO), "topologyPolicies": 7}, "unknown",
                     id="an NRT whose topologyPolicies is a number is skipped"),
        pytest.param("devices", {**device("n2", 2), "spec": {"devices": [{"type": "gpu", "minor": 0,
                                                                           "resources": [1]}]}},
                     "no-gpus", id="a Device whose GPU resources are a list offers no GPUs"),
        pytest.param("devices", {**device("n2", 2), "spec": "x"}, "unknown",
                     id="a Device whose spec is a string is skipped"),
    ],
)
def test_a_poisoned_node_object_costs_only_its_node(kind: str, poison: dict[str, Any], effect: str) -> None:
    state = ClusterState()
    for k in KINDS:
        state.replace(k, [o for o in cluster(["n1"], TOPO, gpus=2) if o["kind"] == {
            "nodes": "Node", "pods": "Pod", "noderesourcetopologies": "NodeResourceTopology",
            "devices": "Device", "reservations": "Reservation"}[k]])
    state.apply(kind, "ADDED", poison)
    assert state.ready
    n1 = state.nodes["n1"]
    assert n1.topo is not None and len(n1.gpus) == 2  # the healthy node is untouched
    n2 = state.nodes.get("n2")
    if effect == "no-topology":
        assert n2 is not None and n2.topo is None and n2.topo_error
    elif effect == "no-gpus":
        assert n2 is not None and n2.gpus == () and n2.gpu_error
    else:
        assert n2 is None or not (n2.node_seen or n2.nrt_annotations or n2.device_spec)


def test_a_list_with_poisoned_objects_still_makes_the_cache_ready() -> None:
    state = ClusterState()
    state.replace("nodes", [node("n1"), 5, {"metadata": []}, with_meta(node("n2"), labels=["x"])])  # type: ignore[list-item]
    state.replace("noderesourcetopologies", [nrt("n1", TOPO)])
    state.replace("devices", [{"metadata": {"name": "n1"}, "spec": 3}])
    state.replace("reservations", [{"metadata": {"name": "r"}}, {"metadata": {"uid": "u", "name": "r2"}, "spec": 3}])
    good = pod("good", cpu="4", node_name="n1", annotations={RS: json.dumps({"cpuset": "0-1,8-9"})})
    state.replace("pods", [bound("bad", {DA: '{"gpu":[5]}'}), good, {"metadata": {"uid": 9}}])
    assert state.ready
    ns = state.nodes["n1"]
    ns.refresh()
    assert ns.free == cpus("0-15") - cpus("0-1,8-9")


async def test_the_watch_moves_its_resource_version_past_a_poisoned_event() -> None:
    """Events whose objects the cache must skip (wrong types, unreadable annotations) move the
    watch on: the next stream starts after them, not before the poison (retrying would meet it
    forever), and the good pod after them counts."""
    server = await Scripted(path="/api/v1/pods").start()
    state = ClusterState()
    for kind in KINDS:
        if kind != "pods":
            state.replace(kind, {"nodes": [node("n1")], "noderesourcetopologies": [nrt("n1", TOPO)]}.get(kind, []))
    informer = Informer(KubeHTTP(credentials.plain(server.url)), [Resource("pods", server.path)], CacheSink(state),
                        component="test", options=WatchOptions(watch_timeout=1, read_deadline=5, backoff_initial=0.01))
    task = asyncio.create_task(informer.run())
    try:
        deadline = time.monotonic() + 30
        while not state.ready:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        await server.emit("ADDED", with_meta(bound("bad", {DA: '{"gpu":[5]}'})), "bad")
        await server.emit("ADDED", with_meta(pod("w", node_name="n1"), labels=["x"]), "w")
        good = pod("good", cpu="4", node_name="n1", annotations={RS: '{"cpuset":"0-1,8-9"}'})
        last = await server.emit("ADDED", good, "good")
        while last not in server.watched_from:  # the stream ends at timeoutSeconds; the next resumes
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
    finally:
        informer._stopping = True
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await server.stop()
    assert informer.kinds["pods"].restarts == 0 and informer.kinds["pods"].synced
    assert good["metadata"]["uid"] in state.pods
    ns = state.nodes["n1"]
    ns.refresh()
    assert not ns.free & cpus("0-1,8-9")
