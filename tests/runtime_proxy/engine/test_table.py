"""The lifecycle table (``runtime_proxy.engine.table``): every lifecycle stage once, every wire
name real, and each door doing, per row, the store change, then the ``Pre*`` plan's files, then
the ``Post*`` stage; and what UpdateContainerResources does at each door (``UPDATES``: the
facts its ``Pre*`` stage sees, what the store records and when, the files, the ``Post*`` stage's
facts), each door driven through one update. These fail on the main before the rule moved into
the table (the CRI and NRI doors merged the facts themselves; ``UPDATES`` did not exist)."""

from __future__ import annotations

from typing import Any, cast

import pytest

from cri_protos import api_pb2, hookserver_pb2, nri_pb2
from hooks.facts import ContainerFacts, NodeFacts, PodFacts, Resources
from hooks.manager import make_plugin_manager, plugin_order
from hooks.plan import Plan, ResourceChanges
from hooks.spec import STAGES, hookimpl
from runtime_proxy.codecs.cri import resources_from_pb
from runtime_proxy.codecs.hook import container_facts_from_request
from runtime_proxy.codecs.nri import container_facts as nri_container_facts
from runtime_proxy.codecs.nri import resources_from_nri
from runtime_proxy.cri.door import CriInterceptor
from runtime_proxy.cri.methods import INTERCEPTED
from runtime_proxy.engine.lifecycle import Lifecycle, StaticNode
from runtime_proxy.engine.pipeline import Pipeline, StageResult, plugin_steps
from runtime_proxy.engine.table import (
    BY_CRI,
    BY_HOOK,
    BY_NRI,
    BY_STAGE,
    EVENTS,
    UPDATES,
    At,
    Door,
    Event,
    Files,
    Records,
    Sees,
    StoreChange,
    carried,
    record_sent,
    update_facts,
    updated,
)
from runtime_proxy.engine.walk import finish
from runtime_proxy.hookserver.door import HookService
from runtime_proxy.host.apply import RecordingApplier
from runtime_proxy.nri.adapter import NriEngine
from runtime_proxy.runtime.client import RuntimeClient
from runtime_proxy.state.store import Store

LIFECYCLE_STAGES = [s for s in STAGES if s.startswith(("Pre", "Post"))]
POD = PodFacts(name="web", namespace="default", uid="u1", sandbox_id="sb1", cgroup_parent="/kubepods/podu1")
CONTAINER = ContainerFacts(name="app", id="c1")


def test_every_lifecycle_stage_is_in_one_row_once() -> None:
    stages = [s for e in EVENTS for s in (e.pre, e.post) if s is not None]
    assert sorted(stages) == sorted(LIFECYCLE_STAGES)
    assert all(BY_STAGE[s].pre == s or BY_STAGE[s].post == s for s in LIFECYCLE_STAGES)


def test_every_wire_name_exists_at_its_door() -> None:
    assert set(BY_CRI) == set(INTERCEPTED.values())
    assert set(BY_NRI) <= set(nri_pb2.Event.keys())
    service = hookserver_pb2.DESCRIPTOR.services_by_name["RuntimeHookService"]
    assert set(BY_HOOK) == {m.name for m in service.methods}
    assert all(stage.startswith(method.removesuffix("Hook")[:3]) for method, (_, stage) in BY_HOOK.items())


def test_only_create_container_waits_for_its_container_to_start() -> None:
    assert [e.name for e in EVENTS if e.files is Files.AT_START] == ["CreateContainer"]


class _Every:
    """Plans one pod write at every lifecycle stage, named after the stage."""

    def __init__(self) -> None:
        for stage, hook in STAGES.items():
            if stage in LIFECYCLE_STAGES:
                setattr(self, hook, hookimpl(specname=hook)(self._planner(stage)))

    @staticmethod
    def _planner(stage: str) -> Any:
        def plan(pod: PodFacts, node: NodeFacts, container: ContainerFacts | None = None) -> Plan:
            return Plan().write("pod", "kubepods/podu1", "note", stage)
        return plan


def _pipeline() -> Pipeline:
    pm = make_plugin_manager(builtins=(), entry_points=False, extra=[_Every()])
    return Pipeline(plugin_steps(pm, [(name, "Ignore", 2.0) for name in plugin_order(pm)]))


class _Carrying(RecordingApplier):
    def carries(self, plan: Plan, *, stage: str) -> bool:
        return True

    async def apply(self, plan: Plan, *, stage: str) -> None:
        self.plans.append((stage, plan))


def _store() -> Store:
    store = Store()
    store.put_pod(POD)
    store.add_container("sb1", CONTAINER)
    return store


@pytest.mark.parametrize("event", EVENTS, ids=lambda e: e.name)
async def test_finish_changes_the_store_then_applies_the_pre_files_then_runs_post(event: Event) -> None:
    applier = _Carrying()
    store = Store() if event.store is StoreChange.PUT_POD else _store()
    core = Lifecycle(_pipeline(), store=store, applier=applier, where="test")
    assert event.pre is not None
    pre = StageResult(plan=Plan().write("pod", "kubepods/podu1", "note", event.pre), pod=POD,
                      container=CONTAINER if event.container else None)
    await finish(core, event, pre, sandbox_id="sb1", container_id="c1" if event.container else "",
                 pod=POD, container=CONTAINER)
    assert [stage for stage, _ in applier.plans] == [event.pre, event.post]
    if event.store is StoreChange.PUT_POD:
        assert store.pod("sb1") == POD
    if event.store is StoreChange.DROP_POD:
        assert store.pod("sb1") is None
    if event.store is StoreChange.DROP_CONTAINER:
        assert store.container("c1") is None
    if event.store is StoreChange.STOP_POD:
        assert "sb1" in store.released
    if event.store is StoreChange.STOP_CONTAINER:
        assert store.is_stopped("c1")


_NRI_CASES = [(name, row, stages) for name, (row, stages) in BY_NRI.items()
              if name not in ("CREATE_CONTAINER", "UPDATE_CONTAINER")]


@pytest.mark.parametrize(("name", "row", "stages"), _NRI_CASES, ids=[c[0] for c in _NRI_CASES])
async def test_each_nri_event_runs_the_stages_of_its_row(name: str, row: Event, stages: tuple[str, ...]) -> None:
    applier = _Carrying()
    engine = NriEngine(_pipeline(), applier=applier)
    pod = nri_pb2.PodSandbox(id="sb1", name="web", uid="u1", namespace="default")
    pod.linux.cgroup_parent = "/kubepods/podu1"
    container = nri_pb2.Container(id="c1", name="app", pod_sandbox_id="sb1")
    if name != "RUN_POD_SANDBOX":
        await engine.state_change(nri_pb2.Event.RUN_POD_SANDBOX, pod, None)
        await engine.create_container(pod, container)
    applier.plans.clear()
    await engine.state_change(nri_pb2.Event.Value(name), pod, container if row.container else None)
    ran = [stage for stage, _ in applier.plans]
    if name in ("START_CONTAINER", "POST_START_CONTAINER"):
        assert ran == ["PreCreateContainer", *stages]  # the held file part goes first
    else:
        assert ran == list(stages)
    if name == row.nri_store and row.store is StoreChange.DROP_POD:
        assert engine.store.pod("sb1") is None
    if name == row.nri_store and row.store is StoreChange.STOP_CONTAINER:
        assert engine.store.is_stopped("c1")


def test_the_nri_door_subscribes_to_what_the_table_names() -> None:
    engine = NriEngine(_pipeline())
    assert {nri_pb2.Event.Name(e) for e in engine.wanted_events()} == set(BY_NRI)


# -- UpdateContainerResources at each door (``UPDATES``) ----------------------------------------

UPDATE = BY_CRI["UpdateContainerResources"]
STORED = ContainerFacts(name="app", id="c1", resources=Resources(cpu_quota=100000, cpu_shares=1024,
                                                                 unified={"memory.high": "1"}))
ASKED = Resources(cpu_quota=50000, cpuset_cpus="0-1", unified={"memory.low": "2"}, hugepage_limits=(("2MB", 4),))


def test_the_update_row_of_each_door_names_its_events_as_the_lifecycle_table_does() -> None:
    assert set(UPDATES) == set(Door)
    assert all(door is rule.door for door, rule in UPDATES.items())
    assert UPDATES[Door.CRI].pre_event == UPDATES[Door.CRI].post_event == UPDATE.name
    assert (UPDATES[Door.NRI].pre_event, UPDATES[Door.NRI].post_event) == (UPDATE.nri_pre, UPDATE.nri_post)
    assert (UPDATES[Door.HOOK].pre_event, UPDATES[Door.HOOK].post_event) == (UPDATE.hook_pre, UPDATE.hook_post)
    assert BY_NRI[UPDATES[Door.NRI].pre_event] == (UPDATE, (UPDATE.pre,))
    assert BY_NRI[UPDATES[Door.NRI].post_event or ""] == (UPDATE, (UPDATE.post,))
    assert BY_HOOK[UPDATES[Door.HOOK].pre_event] == (UPDATE, UPDATE.pre)
    # A door without a Post event runs no Post stage; a door that keeps no store records nothing.
    assert all((rule.post_event is None) == (rule.post_sees is Sees.NOTHING) for rule in UPDATES.values())
    assert all((rule.records is Records.NOTHING) == (rule.store_at is At.NEVER) for rule in UPDATES.values())


def test_what_each_door_lays_over_the_container_its_pre_stage_sees() -> None:
    cri = update_facts(UPDATES[Door.CRI], STORED, ASKED)
    assert cri.resources == Resources(cpu_quota=50000, cpu_shares=1024, cpuset_cpus="0-1",
                                      unified={"memory.high": "1", "memory.low": "2"},
                                      hugepage_limits=(("2MB", 4),))
    nri = update_facts(UPDATES[Door.NRI], STORED, ASKED)  # NRI reads only the numbers and cpusets
    assert nri.resources == Resources(cpu_quota=50000, cpu_shares=1024, cpuset_cpus="0-1",
                                      unified={"memory.high": "1"})
    assert update_facts(UPDATES[Door.HOOK], STORED, ASKED) == STORED  # the request is the container
    assert update_facts(UPDATES[Door.CRI], STORED, None) == STORED


def test_what_each_door_records_of_the_updated_container() -> None:
    plan = Plan(resources=ResourceChanges.parse({"cpu_shares": 512, "cpuset_mems": "0"}), annotations={"note": "x"})
    result = StageResult(plan=plan, pod=POD, container=STORED)
    cri = updated(UPDATES[Door.CRI], STORED, result, sent=Resources(cpu_shares=512, cpu_quota=50000))
    assert cri is not None and cri.annotations == {"note": "x"}
    assert cri.resources == STORED.resources.with_changes({"cpu_shares": 512, "cpu_quota": 50000})
    assert updated(UPDATES[Door.CRI], STORED, None, sent=None) is None  # nothing sent, nothing noted
    nri = updated(UPDATES[Door.NRI], STORED, result, not_carried=["cpuset_mems"])
    assert nri is not None and nri.annotations == {"note": "x"}
    assert nri.resources == STORED.resources.with_changes({"cpu_shares": 512})
    assert updated(UPDATES[Door.NRI], STORED, None) == STORED
    assert updated(UPDATES[Door.HOOK], STORED, result) is None


SHARES = ResourceChanges.parse({"cpu_shares": 512})


def test_what_was_sent_is_recorded_over_the_stored_container_only() -> None:
    store = _store()
    record_sent(store, "c1", {"cpu_shares": 512})
    assert store.container("c1") == (POD, CONTAINER.replace(resources=Resources(cpu_shares=512)))
    version = store.version
    record_sent(store, "gone", {"cpu_shares": 512})  # a container the store does not hold
    assert store.version == version and store.container("gone") is None


class _Updater:
    """Plans at PreUpdateContainerResources and keeps the container each update stage saw."""

    def __init__(self) -> None:
        self.seen: dict[str, ContainerFacts] = {}

    @hookimpl
    def rhp_pre_update_container_resources(self, container: ContainerFacts) -> Plan:
        self.seen["Pre"] = container
        return Plan(resources=SHARES, annotations={"note": "x"}).write("pod", "kubepods/podu1", "f", "1")

    @hookimpl
    def rhp_post_update_container_resources(self, container: ContainerFacts) -> None:
        self.seen["Post"] = container


def _updater() -> tuple[_Updater, Pipeline]:
    plugin = _Updater()
    pm = make_plugin_manager(builtins=(), entry_points=False, extra=[plugin])
    return plugin, Pipeline(plugin_steps(pm, [(name, "Ignore", 2.0) for name in plugin_order(pm)]))


async def test_the_cri_door_updates_as_its_row_says() -> None:
    plugin, pipeline = _updater()
    applier = _Carrying()
    door = CriInterceptor(store=Store(), pipeline=pipeline, client=cast(RuntimeClient, None), applier=applier)
    door.store.put_pod(POD)
    door.store.add_container("sb1", STORED)
    req = api_pb2.UpdateContainerResourcesRequest(container_id="c1")
    req.linux.cpu_quota, req.linux.unified["memory.low"] = 50000, "2"
    call = await door.before("/runtime.v1.RuntimeService/UpdateContainerResources", req.SerializeToString())
    assert plugin.seen["Pre"] == update_facts(UPDATES[Door.CRI], STORED, resources_from_pb(req.linux))
    assert applier.plans == []  # At.AFTER_CALL: nothing before the runtime answered
    await call.after(b"")
    sent = api_pb2.UpdateContainerResourcesRequest.FromString(call.request).linux
    assert door.store.container("c1") == (POD, updated(UPDATES[Door.CRI], STORED, call.result,
                                                        sent=resources_from_pb(sent)))
    assert plugin.seen["Post"] == door.store.container("c1")[1]  # type: ignore[index]  # Sees.STORED
    assert [stage for stage, _ in applier.plans] == [UPDATE.pre]


async def test_the_nri_door_updates_as_its_row_says() -> None:
    plugin, pipeline = _updater()
    applier = _Carrying()
    engine = NriEngine(pipeline, applier=applier)
    pod = nri_pb2.PodSandbox(id="sb1", name="web", uid="u1", namespace="default")
    container = nri_pb2.Container(id="c1", name="app", pod_sandbox_id="sb1")
    container.linux.resources.cpu.quota.value = 100000
    await engine.state_change(nri_pb2.Event.RUN_POD_SANDBOX, pod, None)
    await engine.create_container(pod, container)
    resources = nri_pb2.LinuxResources()
    resources.cpu.quota.value, resources.unified["memory.low"] = 50000, "2"
    reply = await engine.update_container(pod, container, resources)
    pre = update_facts(UPDATES[Door.NRI], nri_container_facts(container), resources_from_nri(resources))
    assert plugin.seen["Pre"] == pre
    assert [u.linux.resources.cpu.shares.value for u in reply] == [512]
    stored = engine.store.container("c1")
    assert stored is not None and stored[1] == carried(pre, Plan(resources=SHARES, annotations={"note": "x"}), ())
    assert [stage for stage, _ in applier.plans] == [UPDATE.pre]  # At.BEFORE_REPLY
    await engine.state_change(nri_pb2.Event.POST_UPDATE_CONTAINER, pod, container)
    assert plugin.seen["Post"] == nri_container_facts(container)  # Sees.MESSAGE


async def test_the_hook_server_updates_as_its_row_says() -> None:
    plugin, pipeline = _updater()
    applier = _Carrying()
    service = HookService(pipeline, StaticNode(), applier)
    req = hookserver_pb2.ContainerResourceHookRequest(pod_cgroup_parent="/kubepods/podu1")
    req.pod_meta.name, req.pod_meta.uid, req.pod_meta.namespace = "web", "u1", "default"
    req.container_meta.name, req.container_meta.id = "app", "c1"
    req.container_resources.cpu_quota = 50000
    answer = await service.handle(UPDATE.pre or "", req, cast(Any, _Context()))
    assert plugin.seen["Pre"] == container_facts_from_request(req)  # Sees.MESSAGE, nothing laid over
    assert isinstance(answer, hookserver_pb2.ContainerResourceHookResponse)
    assert answer.container_resources.cpu_shares == 512
    assert [stage for stage, _ in applier.plans] == [UPDATE.pre]  # At.BEFORE_REPLY


class _Context:
    async def abort(self, code: object, message: str) -> None:
        raise AssertionError(message)
