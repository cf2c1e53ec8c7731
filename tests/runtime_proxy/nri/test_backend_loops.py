"""The periodic loops in NRI mode: container updates go in the next reply that can carry them
(or, opted in, as unsolicited ``UpdateContainers`` calls outside every handler), the engine
tells the reconciler when the share pools' input changed, and ``runtime-proxy nri`` runs the
reconciler so that a running LS container follows the share pool when an LSR pod arrives and
leaves (against the fake runtime)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY

from cri_protos import nri_pb2
from hooks.facts import format_cpu_list
from hooks.manager import make_plugin_manager
from runtime_proxy.commands.nri import NriOptions, run
from runtime_proxy.config import ProxyConfig
from runtime_proxy.engine.pipeline import Pipeline
from runtime_proxy.host.apply import RecordingApplier
from runtime_proxy.nri.adapter import NriEngine
from runtime_proxy.nri.backend import NriBackend, UpdateRefused
from runtime_proxy.nri.plugin import NriPlugin, PluginIdentity
from runtime_proxy.nri.updates import PendingUpdates
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
    await asyncio.wait_for(session.registered.wait(), 60)  # generous: a loaded 2-core machine
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
    await asyncio.wait_for(task, 60)


async def test_an_update_leaves_as_unsolicited_update_containers_naming_the_container(
    runtime: FakeRuntime, engine_session: tuple[NriEngine, NriPlugin, Session]
) -> None:
    engine, plugin, session = engine_session
    await NriBackend(engine, plugin, unsolicited=True).update_container_resources(
        "c1", {"cpuset_cpus": "1", "cpu_shares": 2})
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
        await NriBackend(engine, plugin, unsolicited=True).update_container_resources("c1", {"cpuset_cpus": "1"})
    found = engine.store.container("c1")
    assert found is not None and found[1].resources.cpuset_cpus == "0"


async def test_without_a_session_an_update_is_a_connection_error() -> None:
    class NoSession:
        connection = None

    with pytest.raises(ConnectionError):
        await NriBackend(NriEngine(Pipeline([])), NoSession(), unsolicited=True).update_container_resources(
            "c1", {"cpu_shares": 2})


async def test_by_default_an_update_waits_for_the_next_reply_that_can_carry_it(
    runtime: FakeRuntime, engine_session: tuple[NriEngine, NriPlugin, Session]
) -> None:
    engine, plugin, session = engine_session
    await NriBackend(engine, plugin).update_container_resources("c1", {"cpuset_cpus": "1"})
    await NriBackend(engine, plugin).update_container_resources("c1", {"cpu_shares": 2})
    assert session.update_requests == []  # nothing sent on its own
    reply = await session.call("CreateContainer", nri_pb2.CreateContainerRequest(
        pod=_pod("ls"), container=_container("c3", "ls", "0")))
    [update] = nri_pb2.CreateContainerResponse.FromString(reply.payload).update
    assert (update.container_id, update.linux.resources.cpu.cpus, update.linux.resources.cpu.shares.value,
            update.ignore_failure) == ("c1", "1", 2, True)
    found = engine.store.container("c1")
    assert found is not None and found[1].resources.cpuset_cpus == "1"
    reply = await session.call("CreateContainer", nri_pb2.CreateContainerRequest(
        pod=_pod("ls"), container=_container("c4", "ls", "0")))
    assert not nri_pb2.CreateContainerResponse.FromString(reply.payload).update  # sent once


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


def _updates(reply: Any, response: Any) -> list[tuple[str, str]]:
    assert not reply.HasField("status"), reply.status
    return [(u.container_id, u.linux.resources.cpu.cpus) for u in response.FromString(reply.payload).update]


async def _stop(session: Session, pod: Any, container: Any) -> list[tuple[str, str]]:
    reply = await session.call("StopContainer", nri_pb2.StopContainerRequest(pod=pod, container=container))
    return _updates(reply, nri_pb2.StopContainerResponse)


async def _create(session: Session, pod: Any, container: Any) -> list[tuple[str, str]]:
    reply = await session.call("CreateContainer", nri_pb2.CreateContainerRequest(pod=pod, container=container))
    return _updates(reply, nri_pb2.CreateContainerResponse)


@pytest.fixture
async def pools_session(runtime: FakeRuntime, tmp_path: Path) -> AsyncIterator[Session]:
    """``runtime-proxy nri`` with the cpuset plugin and its reconciler behind the fake runtime,
    synchronized with one LS pod whose container ``c1`` runs on every CPU."""
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
        yield session
        assert session.update_requests == []  # never an unsolicited call
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


needs_two_cpus = pytest.mark.skipif(len(TOPO.cpus) < 2,
                                    reason="needs 2+ CPUs: one bound to the LSR pod, the rest shared")


@needs_two_cpus
async def test_a_running_ls_container_follows_the_share_pool_when_an_lsr_pod_arrives_and_leaves(
    pools_session: Session,
) -> None:
    session = pools_session
    lsr = _pod("lsr", qos="LSR", cpuset=LSR_CPU)
    await session.call("StateChange", nri_pb2.StateChangeEvent(event=E.RUN_POD_SANDBOX, pod=lsr))
    # The LSR pod's own create carries the LS container's new cpuset.
    reply = await session.call("CreateContainer", nri_pb2.CreateContainerRequest(
        pod=lsr, container=_container("c2", "lsr", ALL_CPUS)))
    created = nri_pb2.CreateContainerResponse.FromString(reply.payload)
    assert created.adjust.linux.resources.cpu.cpus == LSR_CPU
    assert _updates(reply, nri_pb2.CreateContainerResponse) == [("c1", LS_POOL_WITH_LSR)]
    # The stop of the LSR pod's last container gives the pool back in its own reply.
    assert await _stop(session, lsr, _container("c2", "lsr", LSR_CPU)) == [("c1", ALL_CPUS)]
    await session.call("StateChange", nri_pb2.StateChangeEvent(event=E.STOP_POD_SANDBOX, pod=lsr))
    await session.call("StateChange", nri_pb2.StateChangeEvent(
        event=E.REMOVE_CONTAINER, pod=lsr, container=_container("c2", "lsr", LSR_CPU)))
    await session.call("StateChange", nri_pb2.StateChangeEvent(event=E.REMOVE_POD_SANDBOX, pod=lsr))
    # Nothing is left for the next reply.
    assert await _create(session, _pod("ls"), _container("c3", "ls", ALL_CPUS)) == []


@needs_two_cpus
async def test_the_pool_grows_back_only_when_the_last_container_of_the_lsr_pod_stops(
    pools_session: Session,
) -> None:
    session = pools_session
    lsr = _pod("lsr", qos="LSR", cpuset=LSR_CPU)
    await session.call("StateChange", nri_pb2.StateChangeEvent(event=E.RUN_POD_SANDBOX, pod=lsr))
    assert await _create(session, lsr, _container("a", "lsr", ALL_CPUS)) == [("c1", LS_POOL_WITH_LSR)]
    assert await _create(session, lsr, _container("b", "lsr", ALL_CPUS)) == []
    # The LS container's own stop, and the first of the LSR pod's two, give nothing back.
    assert await _stop(session, lsr, _container("a", "lsr", LSR_CPU)) == []
    assert await _stop(session, _pod("ls"), _container("other", "ls", ALL_CPUS)) == []
    assert await _stop(session, lsr, _container("b", "lsr", LSR_CPU)) == [("c1", ALL_CPUS)]


@needs_two_cpus
async def test_a_restarted_lsr_container_takes_its_cpus_back_in_its_own_create_reply(
    pools_session: Session,
) -> None:
    session = pools_session
    lsr = _pod("lsr", qos="LSR", cpuset=LSR_CPU)
    await session.call("StateChange", nri_pb2.StateChangeEvent(event=E.RUN_POD_SANDBOX, pod=lsr))
    assert await _create(session, lsr, _container("a", "lsr", ALL_CPUS)) == [("c1", LS_POOL_WITH_LSR)]
    assert await _stop(session, lsr, _container("a", "lsr", LSR_CPU)) == [("c1", ALL_CPUS)]
    # kubelet starts the pod's container again: the LS container leaves the bound CPU at once.
    assert await _create(session, lsr, _container("a2", "lsr", ALL_CPUS)) == [("c1", LS_POOL_WITH_LSR)]


@needs_two_cpus
async def test_late_stop_and_remove_events_of_a_removed_lsr_pod_leave_the_ls_containers_the_whole_pool(
    pools_session: Session,
) -> None:
    """containerd may deliver a pod's Stop and Remove events again after RemovePodSandbox: they
    must not bring the pod back, where it would hold its bound CPUs until the next Synchronize."""
    session = pools_session
    lsr = _pod("lsr", qos="LSR", cpuset=LSR_CPU)
    await session.call("StateChange", nri_pb2.StateChangeEvent(event=E.RUN_POD_SANDBOX, pod=lsr))
    assert await _create(session, lsr, _container("a", "lsr", ALL_CPUS)) == [("c1", LS_POOL_WITH_LSR)]
    assert await _stop(session, lsr, _container("a", "lsr", LSR_CPU)) == [("c1", ALL_CPUS)]
    await session.call("StateChange", nri_pb2.StateChangeEvent(
        event=E.REMOVE_CONTAINER, pod=lsr, container=_container("a", "lsr", LSR_CPU)))
    await session.call("StateChange", nri_pb2.StateChangeEvent(event=E.STOP_POD_SANDBOX, pod=lsr))
    await session.call("StateChange", nri_pb2.StateChangeEvent(event=E.REMOVE_POD_SANDBOX, pod=lsr))
    # The same events once more, after the pod is gone, through both kinds of method.
    await session.call("StopPodSandbox", nri_pb2.StopPodSandboxRequest(pod=lsr))
    await session.call("StateChange", nri_pb2.StateChangeEvent(event=E.STOP_POD_SANDBOX, pod=lsr))
    assert await _stop(session, lsr, _container("a", "lsr", LSR_CPU)) == []
    await session.call("RemoveContainer", nri_pb2.RemoveContainerRequest(
        pod=lsr, container=_container("a", "lsr", LSR_CPU)))
    await session.call("RemovePodSandbox", nri_pb2.RemovePodSandboxRequest(pod=lsr))
    # A new LS container gets the whole pool and the running one is not squeezed.
    reply = await session.call("CreateContainer", nri_pb2.CreateContainerRequest(
        pod=_pod("ls"), container=_container("c3", "ls", ALL_CPUS)))
    assert _updates(reply, nri_pb2.CreateContainerResponse) == []
    created = nri_pb2.CreateContainerResponse.FromString(reply.payload)
    assert created.adjust.linux.resources.cpu.cpus in ("", ALL_CPUS)


GHOST_EVENTS = [
    pytest.param(E.STOP_POD_SANDBOX, False, id="StopPodSandbox"),
    pytest.param(E.REMOVE_POD_SANDBOX, False, id="RemovePodSandbox"),
    pytest.param(E.STOP_CONTAINER, True, id="StopContainer"),
    pytest.param(E.REMOVE_CONTAINER, True, id="RemoveContainer"),
    pytest.param(E.POST_CREATE_CONTAINER, True, id="PostCreateContainer"),
    pytest.param(E.START_CONTAINER, True, id="StartContainer"),
    pytest.param(E.POST_START_CONTAINER, True, id="PostStartContainer"),
    pytest.param(E.POST_UPDATE_CONTAINER, True, id="PostUpdateContainer"),
]


@pytest.mark.parametrize(("event", "with_container"), GHOST_EVENTS)
async def test_an_event_for_a_removed_pod_does_not_bring_it_back(event: int, with_container: bool) -> None:
    engine = NriEngine(Pipeline([]))
    lsr = _pod("lsr", qos="LSR", cpuset="0")
    await engine.state_change(E.RUN_POD_SANDBOX, lsr, None)
    await engine.create_container(lsr, _container("a", "lsr", "0"))
    await engine.stop_container(lsr, _container("a", "lsr", "0"))
    for each, container in ((E.REMOVE_CONTAINER, _container("a", "lsr", "0")), (E.STOP_POD_SANDBOX, None),
                            (E.REMOVE_POD_SANDBOX, None)):
        await engine.state_change(each, lsr, container)
    assert engine.store.pods() == []
    ghost = _container("a", "lsr", "0") if with_container else None
    if event == E.STOP_CONTAINER:
        assert await engine.stop_container(lsr, ghost) == []
    else:
        await engine.state_change(event, lsr, ghost)
    assert engine.store.pods() == [] and engine.holding_pods() == []
    assert engine.node().bound_cpusets == {} and engine.stopped == set()


async def test_an_update_for_a_pod_not_in_the_store_is_answered_with_no_change_and_stores_nothing() -> None:
    engine = NriEngine(Pipeline([]))
    lsr = _pod("lsr", qos="LSR", cpuset="0")
    resources = nri_pb2.LinuxResources()
    resources.cpu.cpus = "0"
    assert await engine.update_container(lsr, _container("a", "lsr", "0"), resources) == []
    assert engine.store.pods() == [] and engine.store.container("a") is None
    assert engine.node().bound_cpusets == {}


async def test_only_creating_events_add_a_pod() -> None:
    def ignored() -> float:
        return REGISTRY.get_sample_value("rhp_nri_events_ignored_total", {"event": "stop_pod_sandbox"}) or 0.0

    engine = NriEngine(Pipeline([]))
    await engine.state_change(E.RUN_POD_SANDBOX, _pod("run"), None)
    await engine.create_container(_pod("create"), _container("c", "create", "0"))
    before = ignored()
    await engine.state_change(E.STOP_POD_SANDBOX, _pod("stop"), None)
    assert sorted(p.sandbox_id for p in engine.store.pods()) == ["create", "run"]
    assert ignored() == before + 1
    await engine.synchronize([_pod("synced")], [])
    assert [p.sandbox_id for p in engine.store.pods()] == ["synced"]


async def test_a_stop_in_dry_run_or_without_loops_is_answered_with_no_updates() -> None:
    for engine in (NriEngine(Pipeline([]), applier=RecordingApplier()), NriEngine(Pipeline([]))):
        await engine.state_change(E.RUN_POD_SANDBOX, _pod("lsr", qos="LSR", cpuset="0"), None)
        await engine.create_container(_pod("lsr", qos="LSR", cpuset="0"), _container("a", "lsr", "0"))
        engine.queue_update("a", {"cpuset_cpus": "0"})
        assert await engine.stop_container(_pod("lsr", qos="LSR", cpuset="0"), _container("a", "lsr", "0")) == []
        assert engine.stopped == {"a"}


async def test_a_pod_whose_containers_were_all_stopped_no_longer_holds_its_cpus() -> None:
    engine = NriEngine(Pipeline([]))
    lsr = _pod("lsr", qos="LSR", cpuset="0")
    await engine.state_change(E.RUN_POD_SANDBOX, lsr, None)
    assert [p.sandbox_id for p in engine.holding_pods()] == ["lsr"]  # no container yet: it holds them
    await engine.create_container(lsr, _container("a", "lsr", "0"))
    await engine.create_container(lsr, _container("b", "lsr", "0"))
    await engine.stop_container(lsr, _container("a", "lsr", "0"))
    assert [p.sandbox_id for p in engine.holding_pods()] == ["lsr"]
    await engine.stop_container(lsr, _container("b", "lsr", "0"))
    assert engine.holding_pods() == []
    assert engine.node().bound_cpusets == {}
    # Removing the stopped containers does not make the pod hold its CPUs again ...
    await engine.state_change(E.REMOVE_CONTAINER, lsr, _container("a", "lsr", "0"))
    await engine.state_change(E.REMOVE_CONTAINER, lsr, _container("b", "lsr", "0"))
    assert engine.holding_pods() == []
    # ... a new container does.
    await engine.create_container(lsr, _container("c", "lsr", "0"))
    assert [p.sandbox_id for p in engine.holding_pods()] == ["lsr"]


async def test_a_whole_lsr_pod_lifecycle_changes_the_share_pools_input_twice() -> None:
    seen: list[bool] = []
    engine = NriEngine(Pipeline([]), on_store_change=seen.append)
    lsr = _pod("lsr", qos="LSR", cpuset="0")
    await engine.state_change(E.RUN_POD_SANDBOX, lsr, None)
    await engine.create_container(lsr, _container("a", "lsr", "0"))
    await engine.state_change(E.START_CONTAINER, lsr, _container("a", "lsr", "0"))
    await engine.stop_container(lsr, _container("a", "lsr", "0"))
    await engine.state_change(E.REMOVE_CONTAINER, lsr, _container("a", "lsr", "0"))
    await engine.state_change(E.STOP_POD_SANDBOX, lsr, None)
    await engine.state_change(E.REMOVE_POD_SANDBOX, lsr, None)
    # arrives (holds), container created (same), stopped (releases), removed, sandbox stopped, pod removed
    assert seen == [True, False, True, False, False, False]


async def test_with_settle_a_pools_change_asks_only_for_the_routine_round_and_settles_in_a_reply() -> None:
    seen: list[bool] = []
    rounds: list[str] = []

    async def settle() -> None:
        rounds.append("settle")

    engine = NriEngine(Pipeline([]), on_store_change=seen.append)
    engine.settle = settle
    ls, lsr = _pod("ls"), _pod("lsr", qos="LSR", cpuset="0")
    await engine.state_change(E.RUN_POD_SANDBOX, lsr, None)
    # No other container runs: nothing could ride on this reply, so no round is waited for.
    await engine.create_container(lsr, _container("a", "lsr", "0"))
    assert rounds == [] and engine.pools_dirty
    await engine.state_change(E.RUN_POD_SANDBOX, ls, None)
    await engine.create_container(ls, _container("b", "ls", "1"))
    assert rounds == ["settle"] and not engine.pools_dirty
    assert seen == [False, False, False, False]


async def test_nri_mode_gets_the_usage_loop_from_the_same_wiring_when_the_config_enables_it(tmp_path: Path) -> None:
    from runtime_proxy import wiring

    config = ProxyConfig(cgroupRoot=str(tmp_path / "cgroup"), usageLoop={"enable": True})  # type: ignore[arg-type]
    pm = make_plugin_manager(builtins=(), entry_points=False)
    engine = NriEngine(Pipeline([]))

    class NoSession:
        connection = None

    node_source, _ = wiring.node_source(config)
    ready = asyncio.Event()
    loops = wiring.loops(config, NriBackend(engine, NoSession()), pm=pm, pipeline=engine.pipeline,
                         applier=wiring.applier(config), node_source=node_source, ready=ready)
    try:
        assert loops.usage is not None and isinstance(loops.usage.backend, NriBackend)
    finally:
        await loops.stop()


class FakeCri:
    """The runtime's CRI as ``NriBackend``'s fallback uses it: records each update."""

    def __init__(self) -> None:
        self.updates: list[tuple[str, dict[str, object]]] = []

    async def update_changed_resources(self, container_id: str, changes: Any) -> None:
        self.updates.append((container_id, dict(changes)))


async def test_an_update_no_reply_carried_goes_by_cri_once_it_waited_carry_wait(
    runtime: FakeRuntime, engine_session: tuple[NriEngine, NriPlugin, Session]
) -> None:
    """A quiet node (no container event whose reply could carry the reconciler's update) or a
    CreateContainer reply the runtime gave up on: the update goes through the runtime's CRI once
    it has waited ``carry_wait``, found by the reconciler's next round (the old behaviour: it
    waited for a reply for ever, so an LSR container stayed on the whole machine)."""
    engine, plugin, session = engine_session
    now = [100.0]
    engine.pending_updates = PendingUpdates(clock=lambda: now[0])
    cri = FakeCri()
    backend = NriBackend(engine, plugin, runtime=lambda: cri, carry_wait=2.0)
    await backend.update_container_resources("c1", {"cpuset_cpus": "1"})  # a round queues it
    now[0] += 1.0
    await backend.update_container_resources("c1", {"cpuset_cpus": "1"})  # too early to give up on a reply
    await backend.drain()
    assert cri.updates == []
    now[0] += 1.0
    await backend.update_container_resources("c1", {"cpuset_cpus": "1"})  # the round after carry_wait
    await backend.drain()
    assert cri.updates == [("c1", {"cpuset_cpus": "1"})]
    found = engine.store.container("c1")
    assert found is not None and found[1].resources.cpuset_cpus == "1"  # recorded as sent
    assert session.update_requests == []  # never an unsolicited NRI UpdateContainers
    reply = await session.call("CreateContainer", nri_pb2.CreateContainerRequest(
        pod=_pod("ls"), container=_container("c3", "ls", "0")))
    assert not nri_pb2.CreateContainerResponse.FromString(reply.payload).update  # not sent twice


async def test_an_update_a_reply_carried_in_time_never_goes_by_cri(
    runtime: FakeRuntime, engine_session: tuple[NriEngine, NriPlugin, Session]
) -> None:
    engine, plugin, session = engine_session
    now = [100.0]
    engine.pending_updates = PendingUpdates(clock=lambda: now[0])
    cri = FakeCri()
    backend = NriBackend(engine, plugin, runtime=lambda: cri, carry_wait=2.0)
    await backend.update_container_resources("c1", {"cpuset_cpus": "1"})
    await session.call("CreateContainer", nri_pb2.CreateContainerRequest(
        pod=_pod("ls"), container=_container("c3", "ls", "0")))
    now[0] += 5.0
    await backend.update_container_resources("c2", {"cpuset_cpus": "1"})  # a stopped container: never sent
    now[0] += 5.0
    await backend.update_container_resources("c2", {"cpuset_cpus": "1"})
    await backend.drain()
    assert cri.updates == []


async def test_without_the_runtimes_cri_socket_an_overdue_update_still_waits_for_a_reply(
    runtime: FakeRuntime, engine_session: tuple[NriEngine, NriPlugin, Session]
) -> None:
    """The chart's NRI DaemonSet mounts only the NRI socket: no client is made, and the update
    rides on the next reply as before."""
    engine, plugin, session = engine_session
    now = [100.0]
    engine.pending_updates = PendingUpdates(clock=lambda: now[0])
    backend = NriBackend(engine, plugin, runtime=lambda: None, carry_wait=2.0)
    await backend.update_container_resources("c1", {"cpuset_cpus": "1"})
    now[0] += 5.0
    await backend.update_container_resources("c1", {"cpuset_cpus": "1"})
    assert backend.runtime_client is None
    reply = await session.call("CreateContainer", nri_pb2.CreateContainerRequest(
        pod=_pod("ls"), container=_container("c3", "ls", "0")))
    [update] = nri_pb2.CreateContainerResponse.FromString(reply.payload).update
    assert (update.container_id, update.linux.resources.cpu.cpus) == ("c1", "1")
