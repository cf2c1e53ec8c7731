"""The cluster's view of this node's pods (``runtime_proxy.state.podspecs``): a BE pod's batch
resources from its pod spec reach the batch_resource plugin through both doors (CRI proxy and
NRI) and the reconciler, without the ``extended-resource-spec`` annotation (issue 36: after a
Helm install such a pod got quota -1, shares 2 and no memory limit). The annotation still wins.
The pod watch itself runs against the in-process fake API server here, and against the real
cluster in ``tests/e2e/test_e2e_colocation_defaults.py``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest

from cri_protos import api_pb2, nri_pb2
from hooks.facts import CgroupInfo, ContainerFacts, NodeFacts, PodFacts, Resources
from hooks.manager import make_plugin_manager, plugin_order
from runtime_proxy.cri.door import CriInterceptor
from runtime_proxy.engine.pipeline import Pipeline, plugin_steps
from runtime_proxy.host.cgroups import Cgroups
from runtime_proxy.loops.reconciler import Reconciler
from runtime_proxy.nri.adapter import NriEngine
from runtime_proxy.runtime.client import RuntimeClient
from runtime_proxy.state.podspecs import ClusterPods, NoPodSpecs
from runtime_proxy.state.store import Store
from tests.cgroup_files import make_files, read_file
from tests.runtime_proxy.fake_backend import FakeBackend
from tests.runtime_proxy.fake_cri import FakeCri

CREATE = "/runtime.v1.RuntimeService/CreateContainer"
RUN = "/runtime.v1.RuntimeService/RunPodSandbox"
CPU, MEM = "kubernetes.io/batch-cpu", "kubernetes.io/batch-memory"
SPEC = "node.koordinator.sh/extended-resource-spec"
UID = "u-be"
PARENT = f"/kubepods/besteffort/pod{UID}"
ISSUE_36 = {"requests": {CPU: "500", MEM: "64Mi"}, "limits": {CPU: "500", MEM: "64Mi"}}
# What issue 36 measured with the annotation: quota 50000, shares 512, 64 MiB.
EXPECTED = {"cpu_quota": 50000, "cpu_shares": 512, "memory_limit_in_bytes": 64 << 20}


def pod_object(uid: str = UID, *, node: str = "n1", name: str = "be", resources: Any = None,
               containers: int = 1) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"uid": uid, "name": name, "namespace": "default",
                         "labels": {"koordinator.sh/qosClass": "BE"}},
            "spec": {"nodeName": node, "containers": [
                {"name": "app" if i == 0 else f"c{i}", "image": "busybox",
                 "resources": ISSUE_36 if resources is None else resources} for i in range(containers)]}}


def added(obj: dict[str, Any], etype: str = "ADDED") -> dict[str, Any]:
    return {"type": etype, "object": obj}


def known_pods(*objs: dict[str, Any]) -> ClusterPods:
    pods = ClusterPods("n1", api_client=object())
    for obj in objs:
        pods.handle_event(added(obj))
    return pods


def be_pipeline() -> Pipeline:
    pm = make_plugin_manager(builtins=("batch_resource",), entry_points=False)
    return Pipeline(plugin_steps(pm, [(name, "Ignore", 2.0) for name in plugin_order(pm)]))  # type: ignore[misc]


def cri_request(annotations: dict[str, str] | None = None) -> bytes:
    req = api_pb2.CreateContainerRequest(pod_sandbox_id="sb1")
    req.config.metadata.name = "app"
    req.config.linux.resources.cpu_shares = 2
    meta = req.sandbox_config.metadata
    meta.name, meta.uid, meta.namespace = "be", UID, "default"
    req.sandbox_config.labels["koordinator.sh/qosClass"] = "BE"
    for key, value in (annotations or {}).items():
        req.sandbox_config.annotations[key] = value
    req.sandbox_config.linux.cgroup_parent = PARENT
    return req.SerializeToString()


def nri_pod(annotations: dict[str, str] | None = None) -> nri_pb2.PodSandbox:
    pod = nri_pb2.PodSandbox(id="sb1", name="be", uid=UID, namespace="default")
    pod.labels["koordinator.sh/qosClass"] = "BE"
    for key, value in (annotations or {}).items():
        pod.annotations[key] = value
    pod.linux.cgroup_parent = PARENT
    return pod


async def via_cri(pod_specs: Any, annotations: dict[str, str] | None = None) -> dict[str, int]:
    door = CriInterceptor(store=Store(), pipeline=be_pipeline(), client=cast(RuntimeClient, FakeCri()),
                          pod_specs=pod_specs)
    sent = api_pb2.CreateContainerRequest.FromString((await door.before(CREATE, cri_request(annotations))).request)
    r = sent.config.linux.resources
    return {"cpu_quota": r.cpu_quota, "cpu_shares": r.cpu_shares, "memory_limit_in_bytes": r.memory_limit_in_bytes}


async def via_nri(pod_specs: Any, annotations: dict[str, str] | None = None) -> dict[str, int]:
    engine = NriEngine(be_pipeline(), pod_specs=pod_specs)
    reply = await engine.create_container(nri_pod(annotations), nri_pb2.Container(id="c1", name="app"))
    cpu, memory = reply.adjust.linux.resources.cpu, reply.adjust.linux.resources.memory
    return {"cpu_quota": cpu.quota.value, "cpu_shares": cpu.shares.value, "memory_limit_in_bytes": memory.limit.value}


DOORS = [pytest.param(via_cri, id="CRI proxy"), pytest.param(via_nri, id="NRI")]


@pytest.mark.parametrize("door", DOORS)
async def test_a_be_pod_gets_its_limits_from_its_pod_spec_at_both_doors(door: Any) -> None:
    """Fails on the old main: the doors knew no pod spec, so the container kept kubelet's values."""
    assert await door(known_pods(pod_object())) == EXPECTED


@pytest.mark.parametrize("door", DOORS)
async def test_the_annotation_wins_over_the_pod_spec(door: Any) -> None:
    annotation = {SPEC: '{"containers":{"app":{"requests":{"kubernetes.io/batch-cpu":"1000"},'
                        '"limits":{"kubernetes.io/batch-cpu":"2000","kubernetes.io/batch-memory":"1Gi"}}}}'}
    got = await door(known_pods(pod_object()), annotation)
    assert got == {"cpu_quota": 200000, "cpu_shares": 1024, "memory_limit_in_bytes": 1 << 30}


@pytest.mark.parametrize("door", DOORS)
async def test_without_cluster_access_only_the_annotation_gives_limits(door: Any) -> None:
    assert await door(NoPodSpecs()) == {"cpu_quota": 0, "cpu_shares": 0 if door is via_nri else 2,
                                        "memory_limit_in_bytes": 0}
    annotation = {SPEC: '{"containers":{"app":{"requests":{"kubernetes.io/batch-cpu":"500"},"limits":'
                        '{"kubernetes.io/batch-cpu":"500","kubernetes.io/batch-memory":"64Mi"}}}}'}
    assert await door(NoPodSpecs(), annotation) == EXPECTED


@pytest.mark.parametrize("door", DOORS)
async def test_a_call_for_a_be_pod_not_seen_yet_waits_for_the_watch(door: Any) -> None:
    pods = ClusterPods("n1", api_client=object(), wait_seconds=30)
    pods.connected = True

    async def arrives() -> None:
        await asyncio.sleep(0.2)
        pods.handle_event(added(pod_object()))

    task = asyncio.create_task(arrives())
    assert await door(pods) == EXPECTED
    await task


async def test_a_call_waits_only_while_connected_and_only_up_to_its_bound() -> None:
    pods = ClusterPods("n1", api_client=object(), wait_seconds=0.3)
    be = PodFacts(uid=UID, labels={"koordinator.sh/qosClass": "BE"})
    started = time.monotonic()
    assert (await pods.wait(be)).batch_resources is None  # not connected: no wait
    assert time.monotonic() - started < 0.25
    pods.connected = True
    assert (await pods.wait(be.replace(labels={"koordinator.sh/qosClass": "LS"}))).batch_resources is None
    assert time.monotonic() - started < 0.25  # not BE: no wait
    assert (await pods.wait(be)).batch_resources is None  # BE, never arrives: waited its bound, then on
    assert time.monotonic() - started >= 0.3


@pytest.mark.parametrize(
    ("events", "known", "changes"),
    [
        pytest.param([added(pod_object())], {UID: {"app"}}, [True], id="added"),
        pytest.param([added(pod_object()), added(pod_object(), "MODIFIED")], {UID: {"app"}}, [True, False],
                     id="modified without a change of batch resources"),
        pytest.param([added(pod_object()), added(pod_object(resources={"limits": {CPU: "1"}}), "MODIFIED")],
                     {UID: {"app"}}, [True, True], id="modified batch resources"),
        pytest.param([added(pod_object()), added(pod_object(), "DELETED")], {}, [True, True], id="deleted"),
        pytest.param([added(pod_object(resources={"limits": {"cpu": "1"}}))], {UID: set()}, [True],
                     id="a pod without batch resources is known, with none"),
        pytest.param([added(pod_object()), added(pod_object(containers=1025), "MODIFIED")], {}, [True, True],
                     id="a pod that turns malformed is forgotten"),
        pytest.param([added(pod_object(resources={"limits": {CPU: "1e30"}}))], {}, [False],
                     id="a malformed pod is never known"),
        pytest.param([{"type": "BOOKMARK", "object": pod_object()}, {"type": "ADDED", "object": "x"}], {},
                     [False, False], id="other events are ignored"),
    ],
)
def test_watch_events(events: list[dict[str, Any]], known: dict[str, set[str]], changes: list[bool]) -> None:
    pods = ClusterPods("n1", api_client=object())
    assert [pods.handle_event(e) for e in events] == changes
    assert {uid: set(pods.known(uid) or {}) for uid in known} == known
    if not known:
        assert pods.known(UID) is None


def test_a_list_forgets_pods_it_does_not_hold_and_the_count_is_bounded() -> None:
    pods = ClusterPods("n1", api_client=object(), max_pods=3)
    changes: list[int] = []
    pods._on_change = lambda: changes.append(1)
    pods.replace("pods", [pod_object("a"), pod_object("b")], absent=False)
    assert pods.known("a") is not None and pods.known("b") is not None and changes == [1]
    pods.replace("pods", [pod_object("a")], absent=False)  # b's DELETED was missed: the next list holds only a
    assert pods.known("b") is None and pods.known("a") is not None and changes == [1, 1]
    for uid in ("c", "d", "e"):
        pods.apply("pods", "ADDED", pod_object(uid))
    assert [uid for uid in "acde" if pods.known(uid) is not None] == ["c", "d", "e"]  # the oldest seen went


async def test_the_reconciler_gives_running_be_pods_their_pod_spec_limits(tmp_path: Path) -> None:
    """A pod the doors saw before the watch did is corrected by the reconciler's round, which a
    change of the pod watch triggers."""
    pod = PodFacts(name="be", namespace="default", uid=UID, labels={"koordinator.sh/qosClass": "BE"},
                   cgroup_parent=PARENT, sandbox_id="sb1")
    container = ContainerFacts(name="app", id="c1", resources=Resources(cpu_shares=2, cpu_quota=-1))
    make_files(tmp_path, f"kubepods/besteffort/pod{UID}",
               {"cpu.shares": "2", "cpu.cfs_quota_us": "-1", "memory.limit_in_bytes": "9223372036854771712"})
    make_files(tmp_path, f"kubepods/besteffort/pod{UID}/c1",
               {"cpu.shares": "2", "cpu.cfs_quota_us": "-1", "memory.limit_in_bytes": "9223372036854771712"})
    backend = FakeBackend(node_facts=NodeFacts(cgroup=CgroupInfo()), pod_list=[pod], container_list=[(pod, container)])
    pods = ClusterPods("n1", api_client=object())
    triggers: list[str] = []
    pm = make_plugin_manager(builtins=("batch_resource",), entry_points=False)
    reconciler = Reconciler(backend, pm=pm, cgroups=Cgroups(tmp_path), pod_specs=pods)
    reconciler.trigger = triggers.append  # type: ignore[method-assign]
    await reconciler.reconcile_once()
    assert backend.updates == []  # nothing known yet: kubelet's values stay
    pods.handle_event(added(pod_object()))
    pods._notify()  # what the watch thread has the event loop do after a change
    assert triggers == ["pod-spec"]
    await reconciler.reconcile_once("pod-spec")
    assert backend.updates == [("c1", {"cpu_shares": 512, "cpu_quota": 50000, "memory_limit_in_bytes": 64 << 20})]
    pod_dir = f"kubepods/besteffort/pod{UID}"
    assert [read_file(tmp_path, pod_dir, f) for f in ("cpu.shares", "cpu.cfs_quota_us", "memory.limit_in_bytes")] \
        == ["512", "50000", str(64 << 20)]


async def wait_for(check: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


async def test_the_pod_watch_against_the_fake_api_server() -> None:
    import kubernetes

    from tests.fakeapi import FakeAPIServer

    with FakeAPIServer() as api:
        api.create(pod_object("here"))
        api.create(pod_object("elsewhere", node="n2", name="other"))
        conf = kubernetes.client.Configuration()
        conf.host = api.url
        pods = ClusterPods("n1", api_client=kubernetes.client.ApiClient(conf), watch_timeout=5)
        changes: list[int] = []
        pods.subscribe(lambda: changes.append(1))
        await pods.start()
        try:
            await wait_for(lambda: pods.known("here") is not None and bool(changes))
            assert pods.known("elsewhere") is None  # only this node's pods (spec.nodeName)
            api.create(pod_object("late", name="late", resources={"limits": {CPU: "2000"}}))
            await wait_for(lambda: pods.known("late") is not None)
            assert int(dict(pods.known("late") or {})["app"].limits[CPU]) == 2000
            api.delete("Pod", "be", namespace="default")
            await wait_for(lambda: pods.known("here") is None)
        finally:
            await pods.stop()
