"""A pod refused for a node's missing CPU topology is requeued (an annotation patch kube-scheduler
reacts to) once the topology appears: the bounded waiting list, the rate limit, and the whole
path against the fake API server."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator, Mapping
from typing import Any

import httpx
import pytest

from koord_formats.topology import format_cpu_topology
from scheduler_ext.admission import ERR_INVALID_CPU_TOPOLOGY
from scheduler_ext.errors import ConflictError, NotFoundError
from scheduler_ext.requeue import (
    REQUEUE_ANNOTATION,
    REQUEUES,
    Requeuer,
    TopologyWaiters,
    Waiter,
    topology_refusals,
)
from tests.fakeapi import FakeAPIServer
from tests.scheduler_ext.builders import TOPO_SMALL, node, nrt, pod
from tests.scheduler_ext.conftest import Extender, start_extender


def w(name: str) -> Waiter:
    return Waiter("ns", name, f"uid-{name}")


# -- the waiting list -----------------------------------------------------------------------------


def test_waiters_are_taken_once_when_one_of_their_nodes_is_ready() -> None:
    waiters = TopologyWaiters()
    waiters.add(w("a"), ["n1", "n2"], now=0.0)
    waiters.add(w("b"), ["n2"], now=0.0)
    assert len(waiters) == 3
    assert waiters.take(["n1"], now=1.0) == [("n1", w("a"))]
    assert sorted(waiters.nodes()) == ["n2"] and len(waiters) == 1  # a is gone from n2 too
    assert waiters.take(["n1", "n2"], now=1.0) == [("n2", w("b"))]
    assert len(waiters) == 0 and waiters.nodes() == []


def test_waiters_are_bounded_in_pairs_nodes_per_pod_and_age() -> None:
    waiters = TopologyWaiters(limit=5, per_pod=3, ttl=10.0)
    assert waiters.add(w("a"), [f"n{i}" for i in range(10)], now=0.0) == 7  # 3 kept per pod
    assert waiters.add(w("b"), ["m1", "m2", "m3"], now=5.0) == 1  # the whole list holds 5
    assert waiters.add(w("c"), ["m1"], now=5.0) == 1
    assert len(waiters) == 5
    assert waiters.add(w("a"), ["n0"], now=5.0) == 0  # known: refreshed, not added
    assert waiters.take([], now=12.0) == []  # b's refusals (5.0) live on, a's n1 and n2 (0.0) expire
    assert len(waiters) == 2 and sorted(waiters.nodes()) == ["m1", "m2"]
    assert waiters.add(w("c"), ["m1"], now=12.0) == 0  # room again


def test_a_pod_without_identity_or_with_oversized_names_is_not_remembered() -> None:
    req = Requeuer(StubAPI({}), lambda nodes: list(nodes))
    req.refused({"metadata": {"name": "p"}}, ["n1"])  # no uid
    req.refused({"metadata": "garbage"}, ["n1"])
    req.refused({"metadata": {"namespace": "ns", "name": "x" * 300, "uid": "u"}}, ["n1"])
    req.refused({"metadata": {"namespace": "ns", "name": "p", "uid": "u"}}, [])
    assert len(req.waiters) == 0


def test_only_the_missing_topology_reason_counts() -> None:
    unresolvable = {
        "n1": ERR_INVALID_CPU_TOPOLOGY,
        "n2": "node(s) NUMA Topology policy not match",
        "n3": f"node(s) NUMA Topology policy not match; {ERR_INVALID_CPU_TOPOLOGY}",
        "n4": f"{ERR_INVALID_CPU_TOPOLOGY} and more",
    }
    assert topology_refusals(unresolvable, ERR_INVALID_CPU_TOPOLOGY) == ["n1", "n3"]


# -- the shell with a stub API --------------------------------------------------------------------


class StubAPI:
    def __init__(self, pods: Mapping[str, dict[str, Any]]) -> None:
        self.pods = dict(pods)
        self.patches: list[tuple[str, Mapping[str, str | None], str]] = []
        self.fail: Exception | None = None

    async def get_pod(self, namespace: str, name: str) -> dict[str, Any]:
        if name not in self.pods:
            raise NotFoundError(404, "gone")
        return self.pods[name]

    async def patch_pod_annotations(
        self, namespace: str, name: str, annotations: Mapping[str, str | None], resource_version: str
    ) -> dict[str, Any]:
        if self.fail is not None:
            raise self.fail
        self.patches.append((name, annotations, resource_version))
        return self.pods[name]


def pending(name: str, *, node_name: str = "", uid: str = "") -> dict[str, Any]:
    return {"metadata": {"namespace": "ns", "name": name, "uid": uid or f"uid-{name}", "resourceVersion": "7"},
            "spec": {"nodeName": node_name} if node_name else {}}  # fmt: skip


def test_a_tick_patches_at_most_its_budget_and_keeps_the_rest_queued() -> None:
    api = StubAPI({f"p{i}": pending(f"p{i}") for i in range(10)})
    req = Requeuer(api, lambda nodes: [n for n in nodes if n == "n1"], rate=4.0, interval=0.5, wall=lambda: 1.5)
    for i in range(10):
        req.refused(pending(f"p{i}"), ["n1"])
    req.refused(pending("other"), ["n2"])  # its node has no topology yet

    async def ticks() -> list[int]:
        budget, seen = 0.0, []
        for _ in range(3):
            budget = await req.tick(budget)
            seen.append(len(api.patches))
        return seen

    assert asyncio.run(ticks()) == [2, 4, 6]  # 4 a second, two ticks a second
    assert len(req.queue) == 4 and len(req.waiters) == 1
    name, annotations, rv = api.patches[0]
    assert name == "p0" and annotations == {REQUEUE_ANNOTATION: "n1 1500"} and rv == "7"


@pytest.mark.parametrize(
    ("stored", "fail", "result"),
    [
        (pending("p"), None, "patched"),
        (pending("p", node_name="n9"), None, "bound"),
        (pending("p", uid="another"), None, "gone"),
        (None, None, "gone"),
        (pending("p"), ConflictError(409, "changed"), "conflict"),
        (pending("p"), NotFoundError(404, "deleted meanwhile"), "gone"),
        (pending("p"), TimeoutError(), "error"),
        (pending("p"), RuntimeError("a bug of ours"), "error"),
        ({"metadata": ["not", "a", "map"], "spec": {}}, None, "gone"),
        ({"metadata": {"uid": "uid-p"}, "spec": "not a map"}, None, "gone"),
    ],
    ids=["pending", "bound-meanwhile", "replaced", "deleted", "changed-meanwhile", "deleted-meanwhile",
         "api-unreachable", "unexpected-error", "hostile-metadata", "hostile-spec"],
)
def test_nudge_patches_only_the_same_unbound_pod(
    stored: dict[str, Any] | None, fail: Exception | None, result: str
) -> None:
    api = StubAPI({"p": stored} if stored else {})
    if isinstance(fail, TimeoutError):
        from scheduler_ext.errors import APIError

        fail = APIError(0, "API server unreachable")
    api.fail = fail
    req = Requeuer(api, lambda nodes: list(nodes))
    assert asyncio.run(req.nudge("n1", Waiter("ns", "p", "uid-p"))) == result
    assert len(api.patches) == (result == "patched")


# -- the whole path against the fake API server -----------------------------------------------------


@pytest.fixture
def requeuing(api: FakeAPIServer) -> Iterator[Extender]:
    api.create(node("n1"))
    ext = start_extender(api.url, requeue_rate=50.0)
    try:
        yield ext
    finally:
        ext.stop()


def _filter(ext: Extender, p: Mapping[str, Any]) -> dict[str, Any]:
    reply: dict[str, Any] = httpx.post(f"{ext.url}/filter", json={"Pod": p, "NodeNames": ["n1"]}, timeout=10).json()
    return reply


def _wait(check: Any, timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := check()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)
    return value


def test_a_pod_refused_for_missing_topology_is_annotated_once_the_nrt_appears(
    api: FakeAPIServer, requeuing: Extender
) -> None:
    lsr = api.create(pod("lsr", cpu="2"))
    plain = api.create(pod("plain", qos=None, cpu="1"))  # needs no cpuset: never refused
    gone = api.create(pod("gone", cpu="2"))
    bound = api.create(pod("bound", cpu="2"))
    for p in (lsr, gone, bound):
        assert _filter(requeuing, p)["FailedAndUnresolvableNodes"] == {"n1": ERR_INVALID_CPU_TOPOLOGY}
    assert _filter(requeuing, plain)["NodeNames"] == ["n1"]
    api.delete("pods", "gone", "default")
    api.patch_direct("pods", "bound", {"spec": {"nodeName": "n2"}}, "default")
    before = {r: REQUEUES.labels(r)._value.get() for r in ("patched", "gone", "bound")}
    time.sleep(0.2)  # several ticks with no topology: nothing is patched
    assert REQUEUE_ANNOTATION not in api.get("pods", "lsr", "default")["metadata"]["annotations"]  # type: ignore[index]

    api.create(nrt("n1", format_cpu_topology(TOPO_SMALL)))
    value = _wait(lambda: (api.get("pods", "lsr", "default") or {})["metadata"]["annotations"].get(REQUEUE_ANNOTATION))
    assert value.startswith("n1 ")
    _wait(lambda: REQUEUES.labels("bound")._value.get() > before["bound"])
    _wait(lambda: REQUEUES.labels("gone")._value.get() > before["gone"])
    assert REQUEUES.labels("patched")._value.get() == before["patched"] + 1
    for name in ("plain", "bound"):
        assert REQUEUE_ANNOTATION not in api.get("pods", name, "default")["metadata"]["annotations"]  # type: ignore[index]
    assert _filter(requeuing, lsr)["NodeNames"] == ["n1"]
