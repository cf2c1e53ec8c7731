"""``runtime_proxy.state.store.Store``: which pods hold the CPUs of their resource-status cpuset
(the released-pods rule both doors follow), and a store rebuilt from the runtime after a restart
keeps what the runtime stopped released."""

from __future__ import annotations

from typing import cast

from hooks.facts import CgroupInfo, ContainerFacts, NodeFacts, PodFacts, format_cpu_list
from runtime_proxy.commands.serve import StoreBackend
from runtime_proxy.cri.door import CriInterceptor
from runtime_proxy.engine.lifecycle import StaticNode
from runtime_proxy.engine.pipeline import Pipeline
from runtime_proxy.runtime.client import RuntimeClient
from runtime_proxy.state.store import Store
from tests.runtime_proxy.fake_cri import FakeCri, sandbox_config
from tests.topologies import SINGLE_SOCKET_HT


def _pod(sandbox_id: str) -> PodFacts:
    return PodFacts(name=sandbox_id, namespace="ns", uid=sandbox_id, sandbox_id=sandbox_id)


def _holding(store: Store) -> list[str]:
    return [p.sandbox_id for p in store.holding_pods()]


def test_a_pod_holds_its_cpus_until_its_sandbox_or_all_its_containers_stop() -> None:
    store = Store()
    for sid in ("a", "b", "c"):
        store.put_pod(_pod(sid))
    assert _holding(store) == ["a", "b", "c"], "a pod with no container yet holds them"
    store.add_container("a", ContainerFacts(id="a1"))
    store.add_container("a", ContainerFacts(id="a2"))
    store.add_container("b", ContainerFacts(id="b1"))
    assert store.stop_container("a1") and not store.stop_container("a1") and not store.stop_container("nope")
    assert _holding(store) == ["a", "b", "c"], "one of its containers still runs"
    version = store.version
    store.stop_container("a2")
    assert _holding(store) == ["b", "c"] and store.version > version
    store.drop_container("a1")
    store.drop_container("a2")
    assert _holding(store) == ["b", "c"], "removing the stopped containers keeps it released"
    store.add_container("a", ContainerFacts(id="a3"))
    assert _holding(store) == ["a", "b", "c"], "a new container takes them back"
    assert store.stop_pod("c") and not store.stop_pod("c") and not store.stop_pod("nope")
    assert _holding(store) == ["a", "b"] and [p.sandbox_id for p in store.live_pods()] == ["a", "b"]
    store.add_container("c", ContainerFacts(id="c1"))
    assert _holding(store) == ["a", "b"], "a stopped sandbox is released for good"
    assert store.stop_pod("b") and store.is_stopped("b1") and store.running_containers() == [
        (store.pod("a"), ContainerFacts(id="a3"))]
    store.drop_pod("b")
    store.drop_pod("c")
    assert store.released == frozenset() and store.stopped == frozenset()
    assert _holding(store) == ["a"]


async def test_a_store_rebuilt_from_the_runtime_keeps_what_the_runtime_stopped_released() -> None:
    """A proxy restarted while kubelet had stopped pods it has not removed yet: NotReady
    sandboxes and pods whose containers all exited do not hold their CPUs, so an LS container
    gets them and a new LSR pod may be bound to them."""
    runtime = FakeCri()
    for sid, cpuset, ready in (("running", "2", True), ("notready", "3", False), ("exited", "4", True),
                               ("fresh", "5", True)):
        runtime.add_sandbox(sid, sandbox_config(sid, qos="LSR", cpuset=cpuset), ready=ready)
    runtime.add_container("c-running", "running")
    runtime.add_container("c-notready", "notready", exited=True)
    runtime.add_container("c-exited", "exited", exited=True)
    store = Store()
    await store.rebuild(cast(RuntimeClient, runtime))
    node = NodeFacts(name="n1", cpu_topology=SINGLE_SOCKET_HT, cgroup=CgroupInfo(1, "cgroupfs"))
    icpt = CriInterceptor(store=store, pipeline=Pipeline([]), client=cast(RuntimeClient, runtime),
                          node_source=StaticNode(node))
    bound = {uid: format_cpu_list(c) for uid, c in icpt.node().bound_cpusets.items()}
    assert bound == {"running": "2", "fresh": "5"}
    backend = StoreBackend(store, icpt, cast(RuntimeClient, runtime))
    assert [p.sandbox_id for p in backend.pods()] == ["running", "exited", "fresh"]
    assert [p.sandbox_id for p in backend.bound_pods()] == ["running", "fresh"]
    assert [c.id for _, c in backend.containers()] == ["c-running"]
    assert (store.stopped, store.released) == ({"c-notready", "c-exited"}, {"notready", "exited"})
