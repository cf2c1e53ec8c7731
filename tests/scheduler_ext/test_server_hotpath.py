"""The fast paths added for the scale benchmarks keep their semantics: the HA ledger's
optimistic Lease creation, connection reuse on the bind path, the filter memo's invalidation,
the raw ASGI front of the verbs, and Binding annotations in the fake API server."""

from __future__ import annotations

import json

import httpx
import kubernetes
import pytest

from scheduler_ext.annotations import Allocation
from scheduler_ext.errors import APIError, ConflictError, NotFoundError
from scheduler_ext.extender import DEFAULT_CONFIG, filter_nodes, prioritize_nodes
from scheduler_ext.ledger import LEDGER_ANNOTATION, LeaseLedger
from scheduler_ext.pods import parse_pod
from scheduler_ext.state import ClusterState, load_objects
from tests.fakeapi import FakeAPIServer
from tests.scheduler_ext.builders import cluster, cpus, pod
from tests.scheduler_ext.conftest import Extender, bind_client

NS = "kube-system"


async def test_ledger_creates_a_missing_lease_in_one_call(api: FakeAPIServer) -> None:
    client = bind_client(api.url)
    ledger = LeaseLedger(client, NS, identity="a")
    before = dict(api.counts)
    assert await ledger.entries("n1", fresh=False) == {}
    await ledger.commit("n1", "uid-1", Allocation(cpus=cpus("0-1")))
    assert api.counts.get("GET", 0) == before.get("GET", 0)  # no read of a Lease never seen
    assert api.counts.get("POST", 0) == before.get("POST", 0) + 1
    lease = api.get("Lease", "scheduler-ext-n1", NS)
    assert lease is not None and "uid-1" in json.loads(lease["metadata"]["annotations"][LEDGER_ANNOTATION])
    await ledger.commit("n1", "uid-2", Allocation(cpus=cpus("2-3")))  # known now: one PUT
    assert api.counts.get("PUT", 0) == before.get("PUT", 0) + 1
    await client.aclose()


async def test_a_replica_that_assumed_no_lease_conflicts_then_sees_the_other_commit(
    api: FakeAPIServer,
) -> None:
    ca, cb = bind_client(api.url), bind_client(api.url)
    a = LeaseLedger(ca, NS, identity="a")
    b = LeaseLedger(cb, NS, identity="b")
    await a.commit("n1", "uid-a", Allocation(cpus=cpus("0-1")))
    assert await b.entries("n1", fresh=False) == {}  # optimistic: b has never seen the Lease
    with pytest.raises(ConflictError):
        await b.commit("n1", "uid-b", Allocation(cpus=cpus("0-1")))  # would double-allocate: refused
    assert await b.entries("n1", fresh=True) == {"uid-a": Allocation(cpus=cpus("0-1"))}
    await b.commit("n1", "uid-b", Allocation(cpus=cpus("2-3")))
    assert set(await a.entries("n1", fresh=True)) == {"uid-a", "uid-b"}
    await ca.aclose()
    await cb.aclose()


async def test_a_deleted_lease_reads_as_a_conflict_and_is_recreated(api: FakeAPIServer) -> None:
    client = bind_client(api.url)
    ledger = LeaseLedger(client, NS, identity="a")
    await ledger.commit("n1", "uid-1", Allocation(cpus=cpus("0-1")))
    api.delete("Lease", "scheduler-ext-n1", NS)
    with pytest.raises(ConflictError):
        await ledger.commit("n1", "uid-2", Allocation(cpus=cpus("2-3")))
    assert await ledger.entries("n1", fresh=True) == {}
    await ledger.commit("n1", "uid-2", Allocation(cpus=cpus("2-3")))
    assert api.get("Lease", "scheduler-ext-n1", NS) is not None
    await client.aclose()


async def test_bind_path_calls_share_one_keep_alive_connection(api: FakeAPIServer) -> None:
    client = bind_client(api.url)
    before = api.connections
    for i in range(5):
        api.create(pod(f"p{i}", namespace="ns"))
        await client.bind_pod("ns", f"p{i}", "", "n1", {}, "")  # the Binding reply is never decoded
        await client.get_pod("ns", f"p{i}")
    assert api.connections == before + 1
    await client.aclose()


async def test_bind_path_errors_are_typed(api: FakeAPIServer) -> None:
    client = bind_client(api.url)
    with pytest.raises(NotFoundError):
        await client.get_pod("ns", "missing")
    api.create(pod("p", namespace="ns"))
    await client.bind_pod("ns", "p", "", "n1", {}, "")
    with pytest.raises(ConflictError):
        await client.bind_pod("ns", "p", "", "n2", {}, "")  # already bound
    await client.aclose()
    dead = bind_client("http://127.0.0.1:9")  # nothing listens on the discard port
    with pytest.raises(APIError) as info:
        await dead.get_pod("ns", "p")
    assert info.value.status == 0 and "unreachable" in str(info.value)
    await dead.aclose()


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


class _Clock:
    """A stand-in for ``time.perf_counter`` that only the judged nodes move."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(
    ("per_node", "nodes", "most_between_yields"),
    [
        pytest.param(0.000_002, 500, None, id="500 cheap verdicts are judged without a yield"),
        pytest.param(0.001, 500, 0.02 + 0.005,
                     id="costly verdicts yield to the loop about every 20 ms"),
        pytest.param(0.040, 5, 0.040, id="a node that alone costs 40 ms is judged one at a time"),
    ],
)
async def test_verbs_judge_nodes_in_slices_that_yield_by_time(
    monkeypatch: pytest.MonkeyPatch, per_node: float, nodes: int, most_between_yields: float | None
) -> None:
    from scheduler_ext import server

    clock = _Clock()
    held: list[float] = [0.0]  # loop time between yields
    judged: list[str] = []

    async def yielded(_: float) -> None:
        held.append(0.0)

    def judge(part: list[str]) -> None:
        judged.extend(part)
        clock.now += per_node * len(part)
        held[-1] += per_node * len(part)

    monkeypatch.setattr(server.time, "perf_counter", clock)
    monkeypatch.setattr(server.asyncio, "sleep", yielded)
    names = [f"n{i}" for i in range(nodes)]
    await server._sliced(names, judge)
    assert judged == names
    if most_between_yields is None:
        assert len(held) == 1
    else:
        assert len(held) > 1 and max(held) <= most_between_yields + 1e-9
