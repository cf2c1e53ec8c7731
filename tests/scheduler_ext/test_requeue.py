"""A pod refused for a node's missing CPU topology is requeued (an annotation patch kube-scheduler
reacts to) once the topology appears: the bounded waiting list, the rate limit, and the whole
path against the fake API server."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator, Mapping
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from koord_formats.topology import format_cpu_topology
from scheduler_ext.admission import ERR_INVALID_CPU_TOPOLOGY
from scheduler_ext.errors import ConflictError, NotFoundError
from scheduler_ext.requeue import (
    REQUEUE_ANNOTATION,
    REQUEUES,
    STALE_CACHE,
    FairQueue,
    Requeuer,
    TopologyWaiters,
    Waiter,
    topology_refusals,
)
from tests.fakeapi import FakeAPIServer
from tests.scheduler_ext.builders import TOPO_SMALL, cluster, node, nrt, pod
from tests.scheduler_ext.conftest import Extender, start_extender, wait_for


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


# -- refused while the cache was stale (issue 32) ------------------------------------------------


def test_a_pod_refused_while_the_cache_was_stale_is_patched_once_it_is_fresh() -> None:
    api = StubAPI({"p": pending("p")})
    fresh = [False]
    # every node "has a topology": the stale pseudo-node must still wait for fresh()
    req = Requeuer(api, lambda nodes: list(nodes), wall=lambda: 1.5, fresh=lambda: fresh[0])
    req.refused_while_stale(pending("p"))
    asyncio.run(req.tick(0.0))
    assert api.patches == [] and len(req.waiters) == 1
    fresh[0] = True
    asyncio.run(req.tick(0.0))
    assert api.patches == [("p", {REQUEUE_ANNOTATION: f"{STALE_CACHE} 1500"}, "7")]
    assert len(req.waiters) == 0 and len(req.queue) == 0


def test_a_pod_refused_from_a_stale_cache_is_requeued_once_the_cache_caught_up(api: FakeAPIServer) -> None:
    """After an API server outage: the pods watch is silent (stale past 2 s; the idle timeout
    cuts it at 8 s), a pod holding every CPU is deleted meanwhile, and filter refuses a new pod
    from what the cache still shows. Once the relist brings the cache up to date, the refused
    pod gets the requeue annotation, so kube-scheduler retries it at once rather than at its
    5 minute flush (on main nothing was written)."""
    rs = "scheduling.koordinator.sh/resource-status"
    hog = pod("hog", cpu="16", node_name="n1", annotations={rs: json.dumps({"cpuset": "0-15"})})
    web = pod("web", cpu="4")
    for obj in (*cluster(["n1"]), hog, web):
        api.create(obj)
    ext = start_extender(api.url, watch_timeout=1, idle_timeout=8, stale_after=2, requeue_rate=50.0)
    try:
        wait_for(lambda: ext.state.pending(web["metadata"]["uid"]) is not None, timeout=30)
        assert "n1" in _filter(ext, web)["FailedNodes"]  # the node is full
        api.freeze_watches("pods")
        wait_for(lambda: httpx.get(f"{ext.url}/readyz", timeout=5).status_code == 503, timeout=30)
        api.delete("pods", "hog", "default")
        assert "n1" in _filter(ext, web)["FailedNodes"]  # the stale cache still has hog there
        value = _wait(lambda: (api.get("pods", "web", "default") or {})["metadata"]["annotations"]
                      .get(REQUEUE_ANNOTATION), timeout=60)  # fmt: skip
        assert value.startswith(f"{STALE_CACHE} ")
        assert httpx.get(f"{ext.url}/readyz", timeout=5).status_code == 200
        assert _filter(ext, web)["NodeNames"] == ["n1"]
    finally:
        ext.stop()


# -- fair per namespace (issue 32, item 5) ----------------------------------------------------------


def wn(namespace: str, name: str) -> Waiter:
    return Waiter(namespace, name, f"uid-{namespace}-{name}")


@pytest.mark.parametrize(
    ("queued", "first_patches"),
    [
        pytest.param({"big": 100, "small": 1}, ["big", "small", "big", "big"],
                     id="one pod of a small tenant waits one turn behind a tenant with a hundred"),
        pytest.param({"a": 3, "b": 3, "c": 1}, ["a", "b", "c", "a", "b", "a", "b"],
                     id="namespaces take turns in the order they first queued"),
        pytest.param({"only": 4}, ["only"] * 4, id="a single namespace is served in order"),
    ],
)
def test_the_patch_queue_serves_namespaces_round_robin(queued: dict[str, int], first_patches: list[str]) -> None:
    """On the old main the queue was one FIFO: the small tenant's pod came after all hundred."""
    pods = {f"{ns}-{i}": {**pending(f"{ns}-{i}"), "metadata": {**pending(f"{ns}-{i}")["metadata"], "namespace": ns}}
            for ns, n in queued.items() for i in range(n)}
    api = StubAPI(pods)
    req = Requeuer(api, lambda nodes: list(nodes), rate=1000.0, interval=1.0)
    for obj in pods.values():
        req.refused(obj, ["n1"])

    async def tick() -> None:
        await req.tick(0.0)

    asyncio.run(tick())
    assert [name.rsplit("-", 1)[0] for name, _, _ in api.patches][: len(first_patches)] == first_patches


def test_a_tenant_filling_the_waiting_list_leaves_room_for_the_others() -> None:
    """On the old main ``big`` took every slot and the other namespaces' refusals were dropped."""
    waiters = TopologyWaiters(limit=10, per_namespace=8)
    dropped = sum(waiters.add(wn("big", f"p{i}"), ["n1"], now=float(i)) for i in range(20))
    assert dropped == 12 and waiters.held_by("big") == 8  # its own bound
    assert waiters.add(wn("small", "p"), ["n1"], now=30.0) == 0
    assert waiters.add(wn("other", "p"), ["n1"], now=30.0) == 0
    assert len(waiters) == 10
    assert waiters.add(wn("small", "q"), ["n2"], now=31.0) == 1  # full: big's oldest refusal gave way
    assert (waiters.held_by("big"), waiters.held_by("small"), waiters.held_by("other")) == (7, 2, 1)
    taken = {w.name for _, w in waiters.take(["n1", "n2"], now=32.0) if w.namespace == "big"}
    assert "p0" not in taken and "p1" in taken  # the oldest went first
    assert len(waiters) == 0 and waiters.held_by("big") == 0


def test_the_patch_queue_is_bounded_per_namespace() -> None:
    queue = FairQueue(limit=5, per_namespace=3)
    assert [queue.push(("n1", wn("big", f"p{i}"))) for i in range(4)] == [True, True, True, False]
    assert queue.push(("n1", wn("small", "p"))) and queue.push(("n1", wn("small", "q")))
    assert not queue.push(("n1", wn("third", "p")))  # the whole queue holds 5
    assert [queue.pop()[1].namespace for _ in range(5)] == ["big", "small", "big", "small", "big"]
    assert not queue and len(queue) == 0


_NAMESPACES = st.sampled_from(["a", "b", "c", "d"])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(_NAMESPACES, st.integers(0, 5)), max_size=80))
def test_property_the_waiting_list_is_max_min_fair(refusals: list[tuple[str, int]]) -> None:
    """Whatever the refusals: the bounds hold, and a refusal dropped for want of room is only
    dropped while no namespace holds two pairs more than its own."""
    waiters = TopologyWaiters(limit=12, per_pod=3, per_namespace=7)
    for i, (ns, at) in enumerate(refusals):
        before = {n: waiters.held_by(n) for n in "abcd"}
        kept_before = waiters.held_by(ns)
        waiters.add(wn(ns, f"p{i}"), [f"n{at}"], now=float(i))
        assert len(waiters) <= 12
        assert all(waiters.held_by(n) <= 7 for n in "abcd")
        assert len(waiters) == sum(waiters.held_by(n) for n in "abcd")
        if waiters.held_by(ns) == kept_before and kept_before < 7:  # refused although under its bound
            assert max(before.values()) <= kept_before + 1
    taken = waiters.take([f"n{i}" for i in range(6)], now=float(len(refusals)))
    assert len(taken) == len({w.uid for _, w in taken})
    assert len(waiters) == 0


@settings(max_examples=300, deadline=None)
@given(st.lists(_NAMESPACES, max_size=60))
def test_property_the_patch_queue_serves_round_robin(pushes: list[str]) -> None:
    """Popping everything queued: at every point, a namespace that still has items queued has
    been served at most once less than any other, and each namespace's items come in order."""
    queue = FairQueue(limit=1000, per_namespace=1000)
    for i, ns in enumerate(pushes):
        assert queue.push((f"n{i}", wn(ns, f"{i:03d}")))
    total = {ns: pushes.count(ns) for ns in set(pushes)}
    served: dict[str, list[str]] = {ns: [] for ns in total}
    while queue:
        _, waiter = queue.pop()
        served[waiter.namespace].append(waiter.name)
        for ns, items in served.items():
            if len(items) < total[ns]:  # still waiting: nobody got two turns more
                assert all(len(other) <= len(items) + 1 for other in served.values())
    assert all(items == sorted(items) and len(items) == total[ns] for ns, items in served.items())
