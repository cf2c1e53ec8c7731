"""One lifecycle core for the three doors (``runtime_proxy.engine.lifecycle``): the CRI door, the
NRI door and the hook server run every stage through ``Lifecycle.run`` and hand every plan to one
``Applier``; dry-run is the recording applier (plans recorded and logged, replies unchanged,
nothing applied) and a ``Fail``-policy refusal is the same code at every door."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, cast

import pytest

from cri_protos import api_pb2, hookserver_pb2, nri_pb2
from hooks.facts import ContainerFacts, NodeFacts, PodFacts
from hooks.manager import make_plugin_manager, plugin_order
from hooks.plan import Plan
from hooks.spec import hookimpl
from runtime_proxy.cri.door import CriInterceptor
from runtime_proxy.cri.transport import HookRejected
from runtime_proxy.engine.lifecycle import FAILED_PRECONDITION, Lifecycle, StaticNode
from runtime_proxy.engine.pipeline import Pipeline, plugin_steps
from runtime_proxy.hookserver.door import HookService
from runtime_proxy.host.apply import RecordingApplier
from runtime_proxy.nri.adapter import NriEngine
from runtime_proxy.nri.connection import RpcError
from runtime_proxy.runtime.client import RuntimeClient
from runtime_proxy.state.store import Store
from tests.runtime_proxy.fake_cri import FakeCri

ROOT = Path(__file__).resolve().parents[3]
CREATE = "/runtime.v1.RuntimeService/CreateContainer"
PARENT = "/kubepods/burstable/podu1"


class Shares:
    """Sets the CPU shares and writes one file at PreCreateContainer."""

    @hookimpl
    def rhp_pre_create_container(self, pod: PodFacts, container: ContainerFacts, node: NodeFacts) -> Plan:
        return Plan().set_resource("cpu_shares", 7).write("pod", pod.cgroup_parent.strip("/"), "cpu.shares", 7)


class Refuses:
    @hookimpl
    def rhp_pre_create_container(self, pod: PodFacts, container: ContainerFacts, node: NodeFacts) -> Plan:
        raise RuntimeError("no")


def _pipeline(plugin: object, policy: str = "Ignore") -> Pipeline:
    pm = make_plugin_manager(builtins=(), entry_points=False, extra=[plugin])
    return Pipeline(plugin_steps(pm, [(name, policy, 2.0) for name in plugin_order(pm)]))  # type: ignore[misc]


def _cri_request() -> bytes:
    req = api_pb2.CreateContainerRequest(pod_sandbox_id="sb1")
    req.config.metadata.name = "app"
    req.config.linux.resources.cpu_shares = 2
    req.sandbox_config.metadata.name, req.sandbox_config.metadata.uid = "web", "u1"
    req.sandbox_config.metadata.namespace = "default"
    req.sandbox_config.linux.cgroup_parent = PARENT
    return req.SerializeToString()


def _nri_pod() -> nri_pb2.PodSandbox:
    pod = nri_pb2.PodSandbox(id="sb1", name="web", uid="u1", namespace="default")
    pod.linux.cgroup_parent = PARENT
    return pod


def _hook_request() -> hookserver_pb2.ContainerResourceHookRequest:
    req = hookserver_pb2.ContainerResourceHookRequest(pod_cgroup_parent=PARENT)
    req.pod_meta.name, req.pod_meta.uid, req.pod_meta.namespace = "web", "u1", "default"
    req.container_meta.name, req.container_meta.id = "app", "c1"
    req.container_resources.cpu_shares = 2
    return req


class _Context:
    async def abort(self, code: object, message: str) -> None:
        raise AbortedError(code, message)


class AbortedError(Exception):
    pass


def _cri(pipeline: Pipeline, applier: RecordingApplier | None = None) -> CriInterceptor:
    return CriInterceptor(store=Store(), pipeline=pipeline, client=cast(RuntimeClient, FakeCri()), applier=applier)


async def test_every_door_runs_its_stage_through_the_one_core(monkeypatch: pytest.MonkeyPatch) -> None:
    ran: list[tuple[str, str]] = []
    real = Lifecycle.run

    async def recording(self: Lifecycle, stage: str, pod: PodFacts, container: ContainerFacts | None) -> Any:
        ran.append((self.where, stage))
        return await real(self, stage, pod, container)

    monkeypatch.setattr(Lifecycle, "run", recording)
    pipeline = _pipeline(Shares())
    sent = api_pb2.CreateContainerRequest.FromString((await _cri(pipeline).before(CREATE, _cri_request())).request)
    reply = await NriEngine(pipeline).create_container(_nri_pod(), nri_pb2.Container(id="c1", name="app"))
    answer = await HookService(pipeline, StaticNode(), None).handle("PreCreateContainer", _hook_request(),
                                                                    cast(Any, _Context()))
    assert ran == [("interceptor", "PreCreateContainer"), ("nri", "PreCreateContainer"),
                   ("hook-server", "PreCreateContainer")]
    assert sent.config.linux.resources.cpu_shares == 7
    assert reply.adjust.linux.resources.cpu.shares.value == 7
    assert answer.container_resources.cpu_shares == 7


async def test_dry_run_is_the_recording_applier_at_every_door() -> None:
    pipeline = _pipeline(Shares())
    request = _cri_request()
    cri_applier, nri_applier, hook_applier = RecordingApplier(), RecordingApplier(), RecordingApplier()
    call = await _cri(pipeline, cri_applier).before(CREATE, request)
    await call.after(api_pb2.CreateContainerResponse(container_id="c1").SerializeToString())
    reply = await NriEngine(pipeline, applier=nri_applier).create_container(
        _nri_pod(), nri_pb2.Container(id="c1", name="app"))
    answer = await HookService(pipeline, StaticNode(), hook_applier).handle(
        "PreCreateContainer", _hook_request(), cast(Any, _Context()))
    assert call.request == request  # forwarded as kubelet sent it
    assert reply == nri_pb2.CreateContainerResponse()
    assert answer.container_resources.cpu_shares == 2  # the request echoed unchanged
    for applier in (cri_applier, nri_applier, hook_applier):
        assert [(stage, plan.resources) for stage, plan in applier.plans] == [("PreCreateContainer",
                                                                               {"cpu_shares": 7})]


async def test_a_fail_policy_refusal_is_failed_precondition_at_every_door() -> None:
    pipeline = _pipeline(Refuses(), policy="Fail")
    with pytest.raises(HookRejected) as cri:
        await _cri(pipeline).before(CREATE, _cri_request())
    with pytest.raises(RpcError) as nri:
        await NriEngine(pipeline).create_container(_nri_pod(), nri_pb2.Container(id="c1", name="app"))
    with pytest.raises(AbortedError) as hook:
        await HookService(pipeline, StaticNode(), None).handle("PreCreateContainer", _hook_request(),
                                                               cast(Any, _Context()))
    assert cri.value.code == nri.value.code == FAILED_PRECONDITION == 9
    assert cri.value.message == nri.value.message
    assert cri.value.message.startswith("runtime-hook-proxy: ") and cri.value.message.endswith("(policy Fail)")
    assert hook.value.args[1].startswith("runtime-hook-proxy hook server: ")


def test_the_shared_pieces_exist_once() -> None:
    sources = {p: p.read_text() for p in (ROOT / "runtime_proxy").rglob("*.py")}
    assert [p.name for p, text in sources.items() if re.search(r"^FAILED_PRECONDITION = ", text, re.M)] \
        == ["lifecycle.py"]
    doors = ("cri", "nri", "hookserver")
    assert not [p for p, text in sources.items() if set(doors) & set(p.parts) and "pipeline.run" in text]
    assert not [p for p, text in sources.items() if set(doors) & set(p.parts) and "applier.apply(" in text]
    assert not [p for p, text in sources.items() if "_pending: dict[bytes" in text]
