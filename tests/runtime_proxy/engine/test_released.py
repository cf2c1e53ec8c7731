"""Released pods in proxy mode (``runtime_proxy.state.store``, the rule both doors follow): a
pod's StopPodSandbox, or the StopContainer of its last running container, gives the CPUs of its
resource-status cpuset back to the share pools at once, not at RemovePodSandbox (which kubelet's
garbage collection sends up to a minute after the pod was deleted). The interceptor's node facts,
the share pools of new containers, the reconciler and a restarted proxy's store all see it; a late
call for the stopped pod does not bind the CPUs again.

Calls go through a ``CriInterceptor`` with the built-in plugins (``before``, an in-memory
runtime, ``after``), as a transport makes them."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import cast

import pytest

from cri_protos import api_pb2
from hooks.facts import CgroupInfo, NodeFacts, format_cpu_list
from hooks.manager import make_plugin_manager, plugin_order
from runtime_proxy.commands.serve import StoreBackend
from runtime_proxy.cri.door import CriInterceptor
from runtime_proxy.engine.lifecycle import StaticNode
from runtime_proxy.engine.pipeline import Pipeline, plugin_steps
from runtime_proxy.host.cgroups import Cgroups
from runtime_proxy.loops.reconciler import Reconciler
from runtime_proxy.runtime.client import RuntimeClient
from runtime_proxy.state.store import Store
from tests.cgroup_files import make_files
from tests.runtime_proxy.fake_cri import Calls, FakeCri, sandbox_config
from tests.topologies import SINGLE_SOCKET_HT, cpus

ALL = format_cpu_list(SINGLE_SOCKET_HT.cpus)
POOL_WITHOUT_2_3 = format_cpu_list(SINGLE_SOCKET_HT.cpus - cpus("2-3"))


def _node() -> NodeFacts:
    return NodeFacts(name="n1", cpu_topology=SINGLE_SOCKET_HT, cgroup=CgroupInfo(1, "cgroupfs"))


class Proxy:
    """An interceptor with the built-in plugins over a store and an in-memory runtime; what it
    told ``on_store_change``."""

    def __init__(self, store: Store | None = None, runtime: FakeCri | None = None) -> None:
        pm = make_plugin_manager(entry_points=False)
        self.pipeline = Pipeline(plugin_steps(pm, [(n, "Ignore", 2.0) for n in plugin_order(pm)]))
        self.pm = pm
        self.runtime = runtime or FakeCri()
        self.store = store or Store()
        self.told: list[bool] = []
        self.icpt = CriInterceptor(store=self.store, pipeline=self.pipeline,
                                   client=cast(RuntimeClient, self.runtime), node_source=StaticNode(_node()),
                                   on_store_change=self.told.append)
        self.calls = Calls(self.icpt, self.runtime)

    def bound(self) -> dict[str, str]:
        return {uid: format_cpu_list(c) for uid, c in self.icpt.node().bound_cpusets.items()}


async def _stop_pod(proxy: Proxy, sandbox_id: str, container_id: str) -> None:
    await proxy.calls.stop_pod(sandbox_id)


async def _stop_last_container(proxy: Proxy, sandbox_id: str, container_id: str) -> None:
    await proxy.calls.stop_container(container_id)


async def _kubelet_kill(proxy: Proxy, sandbox_id: str, container_id: str) -> None:
    await proxy.calls.stop_container(container_id)
    await proxy.calls.stop_pod(sandbox_id)


STOPS = [
    pytest.param(_kubelet_kill, id="kubelet kills the pod: StopContainer, then StopPodSandbox"),
    pytest.param(_stop_pod, id="StopPodSandbox alone"),
    pytest.param(_stop_last_container, id="the StopContainer of its last running container"),
]


@pytest.mark.parametrize("stop", STOPS)
async def test_a_stopped_lsr_pod_gives_its_cpus_to_the_next_lsr_pod_before_it_is_removed(
    stop: Callable[[Proxy, str, str], Awaitable[None]],
) -> None:
    """The end-to-end case: the scheduler gives CPUs 2-3 to a new LSR pod right after the pod
    that held them was deleted; kubelet stopped the old one but has not removed it yet."""
    proxy = Proxy()
    old = await proxy.calls.run_pod("old", qos="LSR", cpuset="2-3")
    assert (await proxy.calls.create(old, "c-old")).config.linux.resources.cpuset_cpus == "2-3"
    ls = await proxy.calls.run_pod("ls")
    assert (await proxy.calls.create(ls, "c-ls")).config.linux.resources.cpuset_cpus == POOL_WITHOUT_2_3
    proxy.told.clear()
    await stop(proxy, old, "c-old")
    assert proxy.bound() == {}
    assert True in proxy.told, "the reconciler hears that the share pools moved"
    assert proxy.store.pod(old) is not None, "not removed"
    new = await proxy.calls.run_pod("new", qos="LSR", cpuset="2-3")
    assert (await proxy.calls.create(new, "c-new")).config.linux.resources.cpuset_cpus == "2-3"
    assert proxy.bound() == {"new": "2-3"}


async def test_a_new_container_of_a_pod_whose_containers_stopped_takes_its_cpus_back() -> None:
    proxy = Proxy()
    lsr = await proxy.calls.run_pod("lsr", qos="LSR", cpuset="2-3")
    await proxy.calls.create(lsr, "a")
    await proxy.calls.create(lsr, "b")
    await proxy.calls.stop_container("a")
    assert proxy.bound() == {"lsr": "2-3"}, "one container still runs"
    await proxy.calls.stop_container("b")
    assert proxy.bound() == {}
    await proxy.calls.remove_container("a")
    await proxy.calls.remove_container("b")
    assert proxy.bound() == {}, "removing the stopped containers does not bind the CPUs again"
    proxy.told.clear()
    await proxy.calls.create(lsr, "a2")  # kubelet restarts the container
    assert proxy.bound() == {"lsr": "2-3"}
    assert proxy.told == [True]


async def test_late_calls_for_a_stopped_pod_do_not_bind_its_cpus_again() -> None:
    proxy = Proxy()
    lsr = await proxy.calls.run_pod("lsr", qos="LSR", cpuset="2-3")
    await proxy.calls.create(lsr, "a")
    await proxy.calls.stop_pod(lsr)
    assert proxy.bound() == {}
    await proxy.calls.stop_pod(lsr)
    await proxy.calls.stop_container("a")
    await proxy.calls.update("a", "2-3")
    # An exited container of the pod that the store never saw (looked up in the runtime).
    proxy.runtime.add_container("ghost", lsr, exited=True)
    await proxy.calls.stop_container("ghost")
    await proxy.calls.remove_container("a")
    assert proxy.bound() == {}
    # Even a container recorded as created in the stopped sandbox (a runtime refuses one).
    proxy.store.add_container(lsr, proxy.store.container("ghost")[1])  # type: ignore[index]
    assert proxy.bound() == {}
    assert [p.sandbox_id for p in proxy.store.live_pods()] == []


async def test_a_notready_sandbox_the_store_does_not_know_is_loaded_released() -> None:
    """A call naming a sandbox the store has not seen (kubelet's garbage collection stops it
    again) loads it from the runtime: NotReady, so released and not planned."""
    runtime = FakeCri()
    runtime.add_sandbox("sb-lsr", sandbox_config("lsr", qos="LSR", cpuset="2-3"), ready=False)
    proxy = Proxy(runtime=runtime)
    await proxy.calls.call("StopPodSandbox", api_pb2.StopPodSandboxRequest(pod_sandbox_id="sb-lsr"),
                           api_pb2.StopPodSandboxResponse())
    assert proxy.store.pod("sb-lsr") is not None
    assert proxy.bound() == {}
    assert proxy.store.released == {"sb-lsr"} and proxy.store.live_pods() == []


async def test_the_reconciler_gives_the_cpus_of_a_stopped_pod_back_to_running_ls_containers(tmp_path: Path) -> None:
    proxy = Proxy()
    lsr = await proxy.calls.run_pod("lsr", qos="LSR", cpuset="2-3")
    await proxy.calls.create(lsr, "c-lsr")
    ls = await proxy.calls.run_pod("ls")
    await proxy.calls.create(ls, "c-ls")
    for path in ("kubepods/burstable/podls", "kubepods/burstable/podls/c-ls", "kubepods/burstable/podls/sb-ls"):
        make_files(tmp_path, path, {"cpuset.cpus": POOL_WITHOUT_2_3, "cpu.shares": "512"})
    backend = StoreBackend(proxy.store, proxy.icpt, cast(RuntimeClient, proxy.runtime))
    reconciler = Reconciler(backend, pm=proxy.pm, cgroups=Cgroups(str(tmp_path), version=1), pipeline=proxy.pipeline)
    report = await reconciler.reconcile_once("test")
    assert "c-ls" not in report.updates
    await proxy.calls.stop_pod(lsr)
    report = await reconciler.reconcile_once("test")
    assert report.updates == {"c-ls": {"cpuset_cpus": ALL}}
    assert [(cid, linux.cpuset_cpus) for cid, linux in proxy.runtime.updates] == [("c-ls", ALL)]
    # The stopped pod is not planned (its cgroups are gone) and its exited container is left alone.
    assert [p.sandbox_id for p in backend.pods()] == [ls]
    assert [c.id for _, c in backend.containers()] == ["c-ls"]
    assert not any("podlsr" in m for m in report.missing)
