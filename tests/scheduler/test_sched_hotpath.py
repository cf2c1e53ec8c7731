"""The fast paths added for the scale benchmarks keep their semantics: the HA ledger's
optimistic Lease creation, connection reuse in the API client, the filter memo's invalidation,
the raw ASGI front of the verbs, and Binding annotations in the fake API server."""

from __future__ import annotations

import json

import httpx
import kubernetes
import pytest

from scheduler_ext.annotations import Allocation
from scheduler_ext.errors import ConflictError
from scheduler_ext.extender import DEFAULT_CONFIG, filter_nodes, prioritize_nodes
from scheduler_ext.ledger import LEDGER_ANNOTATION, LeaseLedger
from scheduler_ext.pods import parse_pod
from scheduler_ext.state import ClusterState, load_objects
from tests.fakeapi import FakeAPIServer
from tests.scheduler.builders import cluster, cpus, pod
from tests.scheduler.conftest import Extender, kube_client

NS = "kube-system"


def test_ledger_creates_a_missing_lease_in_one_call(api: FakeAPIServer) -> None:
    ledger = LeaseLedger(kube_client(api.url), NS, identity="a")
    before = dict(api.counts)
    assert ledger.entries("n1", fresh=False) == {}
    ledger.commit("n1", "uid-1", Allocation(cpus=cpus("0-1")))
    assert api.counts.get("GET", 0) == before.get("GET", 0)  # no read of a Lease never seen
    assert api.counts.get("POST", 0) == before.get("POST", 0) + 1
    lease = api.get("Lease", "scheduler-ext-n1", NS)
    assert lease is not None and "uid-1" in json.loads(lease["metadata"]["annotations"][LEDGER_ANNOTATION])
    ledger.commit("n1", "uid-2", Allocation(cpus=cpus("2-3")))  # known now: one PUT
    assert api.counts.get("PUT", 0) == before.get("PUT", 0) + 1


def test_a_replica_that_assumed_no_lease_conflicts_then_sees_the_other_commit(api: FakeAPIServer) -> None:
    a = LeaseLedger(kube_client(api.url), NS, identity="a")
    b = LeaseLedger(kube_client(api.url), NS, identity="b")
    a.commit("n1", "uid-a", Allocation(cpus=cpus("0-1")))
    assert b.entries("n1", fresh=False) == {}  # optimistic: b has never seen the Lease
    with pytest.raises(ConflictError):
        b.commit("n1", "uid-b", Allocation(cpus=cpus("0-1")))  # would double-allocate: refused
    assert b.entries("n1", fresh=True) == {"uid-a": Allocation(cpus=cpus("0-1"))}
    b.commit("n1", "uid-b", Allocation(cpus=cpus("2-3")))
    assert set(a.entries("n1", fresh=True)) == {"uid-a", "uid-b"}


def test_a_deleted_lease_reads_as_a_conflict_and_is_recreated(api: FakeAPIServer) -> None:
    ledger = LeaseLedger(kube_client(api.url), NS, identity="a")
    ledger.commit("n1", "uid-1", Allocation(cpus=cpus("0-1")))
    api.delete("Lease", "scheduler-ext-n1", NS)
    with pytest.raises(ConflictError):
        ledger.commit("n1", "uid-2", Allocation(cpus=cpus("2-3")))
    assert ledger.entries("n1", fresh=True) == {}
    ledger.commit("n1", "uid-2", Allocation(cpus=cpus("2-3")))
    assert api.get("Lease", "scheduler-ext-n1", NS) is not None


def test_calls_whose_body_is_not_needed_still_return_the_connection(api: FakeAPIServer) -> None:
    kube = kube_client(api.url)
    for i in range(5):
        api.create(pod(f"p{i}", namespace="ns"))
        kube.bind_pod("ns", f"p{i}", "", "n1")  # the Binding reply is never decoded
    pool = kube.api_client.rest_client.pool_manager.connection_from_url(api.url)
    assert pool.num_connections == 1


def test_binding_annotations_merge_into_the_pod_like_kube_apiserver(
    api: FakeAPIServer, official: kubernetes.client.ApiClient
) -> None:
    api.create(pod("p", namespace="ns", annotations={"keep": "1"}))
    body = {"apiVersion": "v1", "kind": "Binding",
            "metadata": {"name": "p", "namespace": "ns", "annotations": {"added": "2"}},
            "target": {"apiVersion": "v1", "kind": "Node", "name": "n1"}}
    kubernetes.client.CoreV1Api(official).create_namespaced_pod_binding("p", "ns", body, _preload_content=False)
    got = api.get("pods", "p", "ns")
    assert got is not None and got["spec"]["nodeName"] == "n1"
    assert got["metadata"]["annotations"] == {"keep": "1", "added": "2"}


def test_filter_memo_follows_every_change_of_a_node() -> None:
    state = ClusterState()
    load_objects(state, cluster(["n1", "n2"]))
    req = parse_pod(pod("new", cpu="8"))
    assert filter_nodes(state, req, ["n1", "n2"], DEFAULT_CONFIG).passed == ["n1", "n2"]
    state.hold("other", "n1", Allocation(cpus=cpus("0-11")))  # 16 CPUs: 4 left on n1
    result = filter_nodes(state, req, ["n1", "n2"], DEFAULT_CONFIG)
    assert result.passed == ["n2"] and "n1" in result.failed
    assert dict(prioritize_nodes(state, req, ["n1", "n2"], DEFAULT_CONFIG))["n1"] == 0
    state.release("other", "n1")
    assert filter_nodes(state, req, ["n1", "n2"], DEFAULT_CONFIG).passed == ["n1", "n2"]


def test_verbs_answer_only_post(extender: Extender) -> None:
    assert httpx.get(f"{extender.url}/filter").status_code == 405
    assert httpx.post(f"{extender.url}/nope", json={}).status_code == 404
    reply = httpx.post(f"{extender.url}/filter", content=b"{not json")
    assert reply.status_code == 200 and reply.json()["Error"].startswith("request body is not JSON")
    assert httpx.post(f"{extender.url}/prioritize", content=b"[]").status_code == 400
    assert httpx.get(f"{extender.url}/healthz").text == "ok"
