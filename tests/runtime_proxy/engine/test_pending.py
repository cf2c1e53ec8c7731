"""Writes waiting for a container id (``runtime_proxy.engine.pending``): one rule at every door."""

from __future__ import annotations

from typing import Any, cast

from cri_protos import api_pb2, hookserver_pb2
from hooks.facts import ContainerFacts, NodeFacts, PodFacts, pod_cgroup_path
from hooks.manager import make_plugin_manager, plugin_order
from hooks.plan import CgroupWrite, Plan
from hooks.spec import hookimpl
from runtime_proxy.cri.door import CriInterceptor
from runtime_proxy.engine.lifecycle import StaticNode
from runtime_proxy.engine.pending import Pending, complete, lacks_id
from runtime_proxy.engine.pipeline import Pipeline, plugin_steps
from runtime_proxy.hookserver.door import HookService
from runtime_proxy.host.apply import RecordingApplier
from runtime_proxy.runtime.client import RuntimeClient
from runtime_proxy.state.store import Store
from tests.runtime_proxy.fake_cri import FakeCri

SYSTEMD_PARENT = "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podu1.slice"


class Carrying(RecordingApplier):
    """Records every plan and says it carries them, as the real applier does."""

    def carries(self, plan: Plan, *, stage: str) -> bool:
        return True

    async def apply(self, plan: Plan, *, stage: str) -> None:
        self.plans.append((stage, plan))


class Writes:
    """At PreCreateContainer: one write in the container's cgroup (with the id it was given)
    and one in the sandbox's, joined by hand as a third-party plugin or hook server does
    (``container_cgroup_path`` refuses an empty id)."""

    def __init__(self, driver: str) -> None:
        self.driver = driver

    @hookimpl
    def rhp_pre_create_container(self, pod: PodFacts, container: ContainerFacts, node: NodeFacts) -> Plan:
        return (Plan().write("container", self._path(pod, container.id), "cpu.shares", 7)
                .write("sandbox", self._path(pod, pod.sandbox_id), "cpu.shares", 9))

    def _path(self, pod: PodFacts, cid: str) -> str:
        base = pod_cgroup_path(pod)
        return f"{base}/cri-containerd-{cid}.scope" if self.driver == "systemd" else f"{base}/{cid}"


def _pipeline(plugin: object) -> Pipeline:
    pm = make_plugin_manager(builtins=(), entry_points=False, extra=[plugin])
    return Pipeline(plugin_steps(pm, [(name, "Ignore", 2.0) for name in plugin_order(pm)]))


def _written(applier: RecordingApplier) -> list[tuple[str, str, str]]:
    return [(w.level, w.path, w.value) for _, plan in applier.plans for w in plan.writes]


async def test_the_cri_door_completes_a_systemd_container_path_with_the_id() -> None:
    """Fails before: only a path ending in "/" (cgroupfs) was completed; the systemd one went to
    ``cri-containerd-.scope``, a directory no container has."""
    applier = Carrying()
    door = CriInterceptor(store=Store(), pipeline=_pipeline(Writes("systemd")),
                          client=cast(RuntimeClient, FakeCri()), applier=applier)
    req = api_pb2.CreateContainerRequest(pod_sandbox_id="sb1")
    req.config.metadata.name = "app"
    req.sandbox_config.metadata.name, req.sandbox_config.metadata.uid = "web", "u1"
    req.sandbox_config.linux.cgroup_parent = SYSTEMD_PARENT
    call = await door.before("/runtime.v1.RuntimeService/CreateContainer", req.SerializeToString())
    await call.after(api_pb2.CreateContainerResponse(container_id="c0ffee").SerializeToString())
    assert _written(applier) == [("container", f"{SYSTEMD_PARENT}/cri-containerd-c0ffee.scope", "7"),
                                 ("sandbox", f"{SYSTEMD_PARENT}/cri-containerd-sb1.scope", "9")]


class _Context:
    async def abort(self, code: object, message: str) -> None:
        raise AssertionError(message)


def _hook(container_id: str) -> hookserver_pb2.ContainerResourceHookRequest:
    req = hookserver_pb2.ContainerResourceHookRequest(pod_cgroup_parent="/kubepods/burstable/podu1")
    req.pod_meta.name, req.pod_meta.uid, req.pod_meta.namespace = "web", "u1", "default"
    req.container_meta.name, req.container_meta.id = "app", container_id
    return req


async def test_the_hook_server_gives_a_container_id_to_container_writes_only() -> None:
    """Fails before: the sandbox write (the hook protocol carries no sandbox id) waited too and
    was given the container's id, so it landed in the container's cgroup; and the held write
    went only when some hook had work at PreStartContainer (here none has)."""
    applier = Carrying()
    service = HookService(_pipeline(Writes("cgroupfs")), StaticNode(), applier)
    await service.handle("PreCreateContainer", _hook(""), cast(Any, _Context()))
    assert _written(applier) == []
    await service.handle("PreStartContainer", _hook("c1"), cast(Any, _Context()))
    assert _written(applier) == [("container", "kubepods/burstable/podu1/c1", "7")]


def test_which_writes_lack_an_id_and_which_an_id_completes() -> None:
    plan = Plan(writes=[CgroupWrite("container", "p/", "f", "1"),
                        CgroupWrite("container", "p/cri-containerd-.scope", "f", "2"),
                        CgroupWrite("container", "", "f", "3"), CgroupWrite("sandbox", "p/", "f", "4"),
                        CgroupWrite("pod", "p/", "f", "5"), CgroupWrite("container", "p/c9", "f", "6")])
    assert [lacks_id(w) for w in plan.writes] == [True, True, True, True, False, False]
    assert [w.path for w in complete(plan, "c1", "PreCreateContainer").writes] == [
        "p/c1", "p/cri-containerd-c1.scope", "c1", "p/", "p/c9"]
    assert [w.path for w in complete(plan, "", "PreCreateContainer").writes] == ["p/", "p/c9"]
    whole = Plan(writes=[CgroupWrite("pod", "p", "f", "1")])
    assert complete(whole, "c1", "PreCreateContainer") is whole


def test_waiting_plans_are_bounded_oldest_first_and_taken_once() -> None:
    pending: Pending[str] = Pending(limit=2)
    for key in ("a", "b", "c"):
        pending.hold(key, Plan(writes=[CgroupWrite("container", "p/", "f", key)]))
    pending.hold("d", Plan())  # an empty file part waits for nothing
    assert len(pending) == 2 and pending.take("a", "x") is None
    taken = pending.take("b", "cb")
    assert taken is not None and [w.path for w in taken.writes] == ["p/cb"]
    assert pending.take("b", "cb") is None
    pending.drop("c")
    assert len(pending) == 0
