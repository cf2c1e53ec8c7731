"""The lifecycle table (``runtime_proxy.engine.table``): every lifecycle stage once, every wire
name real, and each door doing, per row, the store change, then the ``Pre*`` plan's files, then
the ``Post*`` stage."""

from __future__ import annotations

from typing import Any

import pytest

from cri_protos import hookserver_pb2, nri_pb2
from hooks.facts import ContainerFacts, NodeFacts, PodFacts
from hooks.manager import make_plugin_manager, plugin_order
from hooks.plan import Plan
from hooks.spec import STAGES, hookimpl
from runtime_proxy.cri.methods import INTERCEPTED
from runtime_proxy.engine.lifecycle import Lifecycle
from runtime_proxy.engine.pipeline import Pipeline, StageResult, plugin_steps
from runtime_proxy.engine.table import (
    BY_CRI,
    BY_HOOK,
    BY_NRI,
    BY_STAGE,
    EVENTS,
    Event,
    Files,
    StoreChange,
    finish,
)
from runtime_proxy.host.apply import RecordingApplier
from runtime_proxy.nri.adapter import NriEngine
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
