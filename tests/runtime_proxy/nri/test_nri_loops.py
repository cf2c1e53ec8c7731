"""The periodic loops in NRI mode: container updates leave as unsolicited ``UpdateContainers``
calls outside every handler, the engine tells the reconciler when the share pools' input
changed, and ``runtime-proxy nri`` runs the reconciler so that a running LS container follows
the share pool when an LSR pod arrives and leaves (against the fake runtime)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from cri_protos import nri_pb2
from hooks.facts import format_cpu_list
from runtime_proxy.config import ProxyConfig
from runtime_proxy.engine.pipeline import Pipeline
from runtime_proxy.nri.adapter import NriEngine
from runtime_proxy.nri.backend import NriBackend, UpdateRefused
from runtime_proxy.nri.cli import NriOptions, run
from runtime_proxy.nri.plugin import NriPlugin, PluginIdentity
from runtime_proxy.state.sysfs import read_cpu_topology
from tests.integration import qos_helpers as q
from tests.runtime_proxy.nri.fake_runtime import FakeRuntime, Session

E = nri_pb2.Event
TOPO = read_cpu_topology()
ALL_CPUS = format_cpu_list(TOPO.cpus)
LSR_CPU = str(max(TOPO.cpus)) if TOPO.cpus else "0"
LS_POOL_WITH_LSR = format_cpu_list(TOPO.cpus - {max(TOPO.cpus)}) if TOPO.cpus else ""


def _pod(pod_id: str, *, qos: str = "LS", cpuset: str = "") -> Any:
    annotations = {q.RESOURCE_STATUS: json.dumps({"cpuset": cpuset})} if cpuset else {}
    pod = nri_pb2.PodSandbox(id=pod_id, name=pod_id, uid=f"uid-{pod_id}", namespace="default",
                             labels={q.LABEL_QOS: qos}, annotations=annotations)
    pod.linux.cgroup_parent = f"/kubepods/burstable/pod{pod_id}"
    return pod


def _container(cid: str, pod_id: str, cpus: str, state: int = nri_pb2.CONTAINER_RUNNING) -> Any:
    container = nri_pb2.Container(id=cid, pod_sandbox_id=pod_id, name=cid, state=state)
    container.linux.resources.cpu.cpus = cpus
    container.linux.resources.cpu.shares.value = 512
    return container


@pytest.fixture
async def runtime(tmp_path: Path) -> AsyncIterator[FakeRuntime]:
    fake = await FakeRuntime(tmp_path / "nri.sock").start()
    yield fake
    await fake.stop()


async def _session(runtime: FakeRuntime) -> Session:
    session = await runtime.next_session()
    await asyncio.wait_for(session.registered.wait(), 5)
    return session


@pytest.fixture
async def engine_session(runtime: FakeRuntime) -> AsyncIterator[tuple[NriEngine, NriPlugin, Session]]:
    """An engine with no plugins behind a live session; the runtime has sent one LS pod with a
    running and a stopped container."""
    engine = NriEngine(Pipeline([]))
    plugin = NriPlugin(PluginIdentity("rhp-test", "07"), engine, socket_path=str(runtime.path), backoff=(0.05, 0.2))
    stop = asyncio.Event()
    task = asyncio.create_task(plugin.run(stop))
    session = await _session(runtime)
    await session.call("Synchronize", nri_pb2.SynchronizeRequest(
        pods=[_pod("ls")],
        containers=[_container("c1", "ls", "0"), _container("c2", "ls", "0", state=nri_pb2.CONTAINER_STOPPED)]))
    yield engine, plugin, session
    stop.set()
    await asyncio.wait_for(task, 5)


async def test_an_update_leaves_as_unsolicited_update_containers_naming_the_container(
    runtime: FakeRuntime, engine_session: tuple[NriEngine, NriPlugin, Session]
) -> None:
    engine, plugin, session = engine_session
    await NriBackend(engine, plugin).update_container_resources("c1", {"cpuset_cpus": "1", "cpu_shares": 2})
    [request] = session.update_requests
    [update] = request.update
    assert (update.container_id, update.linux.resources.cpu.cpus, update.linux.resources.cpu.shares.value) == (
        "c1", "1", 2)
    found = engine.store.container("c1")
    assert found is not None and (found[1].resources.cpuset_cpus, found[1].resources.cpu_shares) == ("1", 2)


async def test_an_update_the_runtime_lists_as_failed_raises_and_is_not_recorded(
    runtime: FakeRuntime, engine_session: tuple[NriEngine, NriPlugin, Session]
) -> None:
    engine, plugin, _ = engine_session
    runtime.refuse_updates = True
    with pytest.raises(UpdateRefused):
        await NriBackend(engine, plugin).update_container_resources("c1", {"cpuset_cpus": "1"})
    found = engine.store.container("c1")
    assert found is not None and found[1].resources.cpuset_cpus == "0"


async def test_without_a_session_an_update_is_a_connection_error() -> None:
    class NoSession:
        connection = None

    with pytest.raises(ConnectionError):
        await NriBackend(NriEngine(Pipeline([])), NoSession()).update_container_resources("c1", {"cpu_shares": 2})


async def test_the_loops_see_only_containers_the_runtime_has_not_stopped(
    engine_session: tuple[NriEngine, NriPlugin, Session]
) -> None:
    engine, plugin, session = engine_session
    backend = NriBackend(engine, plugin)
    assert [c.id for _, c in backend.containers()] == ["c1"]
    await session.call("StateChange", nri_pb2.StateChangeEvent(
        event=E.STOP_CONTAINER, pod=_pod("ls"), container=_container("c1", "ls", "0")))
    assert backend.containers() == []
    await session.call("StateChange", nri_pb2.StateChangeEvent(event=E.REMOVE_POD_SANDBOX, pod=_pod("ls")))
    assert engine.stopped == set()


async def test_the_engine_tells_whether_the_share_pools_input_changed() -> None:
    seen: list[bool] = []
    engine = NriEngine(Pipeline([]), on_store_change=seen.append)
    await engine.state_change(E.RUN_POD_SANDBOX, _pod("ls"), None)
    await engine.state_change(E.RUN_POD_SANDBOX, _pod("lsr", qos="LSR", cpuset="1"), None)
    await engine.create_container(_pod("ls"), _container("c1", "ls", "0"))
    await engine.state_change(E.REMOVE_POD_SANDBOX, _pod("lsr", qos="LSR", cpuset="1"), None)
    # An event that leaves the store as it is tells nothing.
    await engine.state_change(E.POST_START_CONTAINER, _pod("ls"), _container("c1", "ls", "0"))
    assert seen == [False, True, False, True]


@pytest.mark.skipif(len(TOPO.cpus) < 2, reason="needs 2+ CPUs: one bound to the LSR pod, the rest shared")
async def test_a_running_ls_container_follows_the_share_pool_when_an_lsr_pod_arrives_and_leaves(
    runtime: FakeRuntime, tmp_path: Path
) -> None:
    node_file = q.write_node_config(tmp_path / "node.json")
    config = ProxyConfig(hookServerDir=str(tmp_path / "hooks"), cgroupRoot=str(tmp_path / "cgroup"),
                         nodeConfigFile=str(node_file), reconcilePeriodSeconds=30.0)
    stop = asyncio.Event()
    task = asyncio.create_task(run(NriOptions(socket=str(runtime.path), config=config, entry_points=False,
                                              builtins=("cpuset",), hook_servers=False), stop))
    try:
        session = await _session(runtime)
        await session.call("Configure", nri_pb2.ConfigureRequest(runtime_name="fake", runtime_version="1"))
        reply = await session.call("Synchronize", nri_pb2.SynchronizeRequest(
            pods=[_pod("ls")], containers=[_container("c1", "ls", ALL_CPUS)]))
        assert not reply.HasField("status")

        async def next_cpus() -> str:
            await asyncio.wait_for(runtime.updated.wait(), 10)
            runtime.updated.clear()
            [update] = session.update_requests.pop().update
            assert update.container_id == "c1"
            return str(update.linux.resources.cpu.cpus)

        lsr = _pod("lsr", qos="LSR", cpuset=LSR_CPU)
        await session.call("StateChange", nri_pb2.StateChangeEvent(event=E.RUN_POD_SANDBOX, pod=lsr))
        assert await next_cpus() == LS_POOL_WITH_LSR
        await session.call("StateChange", nri_pb2.StateChangeEvent(event=E.REMOVE_POD_SANDBOX, pod=lsr))
        assert await next_cpus() == ALL_CPUS
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
