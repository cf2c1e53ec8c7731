"""A pod with a hostile resource-status annotation costs only itself.

Three levels, each with a poisoned pod next to healthy pods:

- the interceptor with the real pipeline and the built-in plugins, calls made directly
  (``before``/``after``) against an in-memory store: the poisoned pod's calls go through with a
  logged skip, every healthy pod's calls get their plans, and the node facts (bound cpusets,
  share pools) keep working;
- the reconciler with a fake backend: every round completes and the healthy pods converge;
- real containerd through both transports (root only): the healthy pods' calls succeed with
  their hooks applied, and a pass-through ``Version`` made while the poisoned pods are created
  answers within 100 ms of the same call made straight to containerd (at most one call in 20,
  or one, over that; none over a second).
"""

from __future__ import annotations

import gc
import json
import os
import threading
import time
import uuid
from pathlib import Path
from types import MappingProxyType
from typing import Any, cast

import grpc
import pytest

from cri_protos import api_pb2
from hooks.facts import CgroupInfo, ContainerFacts, NodeFacts, PodFacts, Resources
from hooks.manager import make_plugin_manager, plugin_order
from runtime_proxy.cri.door import CriInterceptor
from runtime_proxy.engine.lifecycle import StaticNode
from runtime_proxy.engine.pipeline import Pipeline, plugin_steps
from runtime_proxy.host.cgroups import Cgroups
from runtime_proxy.loops.reconciler import Reconciler
from runtime_proxy.runtime.client import RuntimeClient
from runtime_proxy.state.store import Store
from tests.cgroup_files import make_files
from tests.integration import conftest as _real
from tests.topologies import SINGLE_SOCKET_HT, cpus

RS = "scheduling.koordinator.sh/resource-status"
QOS = "koordinator.sh/qosClass"
RUN = "/runtime.v1.RuntimeService/RunPodSandbox"
CREATE = "/runtime.v1.RuntimeService/CreateContainer"


def _numa_cpu(value: Any) -> str:
    return json.dumps({"cpuset": "1", "numaNodeResources": [{"node": 0, "resources": {"cpu": value}}]})


# Each row: a hostile resource-status value and what it provokes in a naive parser.
POISONS = [
    pytest.param("[" * 3000, id="three thousand open brackets exhaust the recursion limit"),
    pytest.param('{"cpuset":"1","numaNodeResources":[{"node":0,"resources":{"cpu":Infinity}}]}',
                 id="an Infinity quantity overflows"),
    pytest.param('{"a":' * 5000 + "1" + "}" * 5000, id="five thousand nested objects"),
    pytest.param(json.dumps({"cpuset": ",".join(["0-16383"] * 20000)}), id="a valid 160 KB cpuset"),
    pytest.param(_numa_cpu("1e9999999"), id="a quantity with a ten-million-digit exponent"),
]


def _pb_sandbox(uid: str, *, qos: str, annotations: dict[str, str]) -> api_pb2.PodSandboxConfig:
    config = api_pb2.PodSandboxConfig()
    config.metadata.name = f"pod-{uid}"
    config.metadata.namespace = "hostile"
    config.metadata.uid = uid
    config.labels[QOS] = qos
    config.annotations.update(annotations)
    config.linux.cgroup_parent = f"/kubepods/burstable/pod{uid}"
    return config


class Calls:
    """Drive an interceptor the way a transport does, against a store only (no runtime)."""

    def __init__(self, interceptor: CriInterceptor) -> None:
        self.icpt = interceptor

    async def run_pod(self, uid: str, *, qos: str = "LS", annotations: dict[str, str] | None = None) -> str:
        config = _pb_sandbox(uid, qos=qos, annotations=annotations or {})
        request = api_pb2.RunPodSandboxRequest(config=config).SerializeToString()
        call = await self.icpt.before(RUN, request)
        sandbox_id = f"sb-{uid}"
        await call.after(api_pb2.RunPodSandboxResponse(pod_sandbox_id=sandbox_id).SerializeToString())
        return sandbox_id

    async def create(self, sandbox_id: str, uid: str, *, qos: str = "LS") -> api_pb2.CreateContainerRequest:
        """CreateContainer as sent on to the runtime (after the hooks)."""
        req = api_pb2.CreateContainerRequest(pod_sandbox_id=sandbox_id)
        req.config.metadata.name = "main"
        req.config.linux.resources.cpu_shares = 512
        req.sandbox_config.CopyFrom(_pb_sandbox(uid, qos=qos, annotations={}))
        call = await self.icpt.before(CREATE, req.SerializeToString())
        response = api_pb2.CreateContainerResponse(container_id=f"c-{uid}").SerializeToString()
        await call.after(response)
        return api_pb2.CreateContainerRequest.FromString(call.request)


def _node() -> NodeFacts:
    return NodeFacts(name="n1", cpu_topology=SINGLE_SOCKET_HT, cgroup=CgroupInfo(1, "cgroupfs"))


def _interceptor() -> CriInterceptor:
    pm = make_plugin_manager(entry_points=False)
    names = plugin_order(pm)
    pipeline = Pipeline(plugin_steps(pm, [(n, "Ignore", 2.0) for n in names]))
    store = Store()
    # No call in these tests names a pod or container the store does not know, so the runtime
    # client is never used.
    client = cast(RuntimeClient, None)
    return CriInterceptor(store=store, pipeline=pipeline, client=client, node_source=StaticNode(_node()),
                          on_store_change=lambda _changed: None)


@pytest.mark.parametrize("poison", POISONS)
async def test_poisoned_pod_costs_only_itself_in_the_interceptor(poison: str) -> None:
    icpt = _interceptor()
    calls = Calls(icpt)
    bound_before = await calls.run_pod("lsr-a", qos="LSR", annotations={RS: json.dumps({"cpuset": "2-3"})})

    poisoned = await calls.run_pod("poisoned", qos="LSR", annotations={RS: poison})
    sent = await calls.create(poisoned, "poisoned", qos="LSR")
    assert sent.config.linux.resources.cpu_shares == 512  # forwarded; its own plugins skipped it

    bound_after = await calls.run_pod("lsr-b", qos="LSR", annotations={RS: json.dumps({"cpuset": "4-5"})})
    ls_pod = await calls.run_pod("ls-c")
    assert (await calls.create(bound_before, "lsr-a", qos="LSR")).config.linux.resources.cpuset_cpus == "2-3"
    assert (await calls.create(bound_after, "lsr-b", qos="LSR")).config.linux.resources.cpuset_cpus == "4-5"
    # The LS pod runs on the share pool: every CPU but the healthy pods' bound ones.
    shared = (await calls.create(ls_pod, "ls-c")).config.linux.resources.cpuset_cpus
    assert cpus(shared) == SINGLE_SOCKET_HT.cpus - cpus("2-5")

    node = icpt.node()
    assert dict(node.bound_cpusets) == {"lsr-a": cpus("2-3"), "lsr-b": cpus("4-5")}
    assert icpt.store.pod(poisoned) is not None


def _pod(uid: str, qos: str, annotations: dict[str, str]) -> PodFacts:
    return PodFacts(name=uid, namespace="hostile", uid=uid, sandbox_id=f"sb-{uid}",
                    labels=MappingProxyType({QOS: qos}), annotations=MappingProxyType(annotations),
                    cgroup_parent=f"/kubepods/burstable/pod{uid}")


class _Backend:
    def __init__(self, pods: list[PodFacts], containers: list[tuple[PodFacts, ContainerFacts]]) -> None:
        self.pod_list = pods
        self.container_list = containers
        self.updates: list[tuple[str, dict[str, Any]]] = []

    def node(self) -> NodeFacts:
        return _node()

    def pods(self) -> list[PodFacts]:
        return list(self.pod_list)

    def containers(self) -> list[tuple[PodFacts, ContainerFacts]]:
        return list(self.container_list)

    async def update_container_resources(self, container_id: str, changes: dict[str, Any]) -> None:
        self.updates.append((container_id, changes))


@pytest.mark.parametrize("poison", POISONS)
async def test_reconciler_rounds_go_on_with_a_poisoned_pod(poison: str, tmp_path: Path) -> None:
    healthy = _pod("lsr-a", "LSR", {RS: json.dumps({"cpuset": "2-3"})})
    ls_pod = _pod("ls-c", "LS", {})
    poisoned = _pod("poisoned", "LSR", {RS: poison})
    pods = [healthy, poisoned, ls_pod]
    containers = [(p, ContainerFacts(name="main", id=f"c-{p.uid}", resources=Resources(cpu_shares=512)))
                  for p in pods]
    for p in pods:
        for path in (f"kubepods/burstable/pod{p.uid}", f"kubepods/burstable/pod{p.uid}/c-{p.uid}"):
            make_files(tmp_path, path, {"cpuset.cpus": "", "cpu.cfs_quota_us": "-1", "cpu.shares": "2"})
    backend = _Backend(pods, containers)
    pm = make_plugin_manager(entry_points=False)
    rec = Reconciler(backend, pm=pm, cgroups=Cgroups(str(tmp_path), version=1))
    for _ in range(2):
        report = await rec.reconcile_once("test")
        assert rec.last_report is report
    updates = dict(backend.updates)
    assert updates["c-lsr-a"]["cpuset_cpus"] == "2-3"
    assert cpus(updates["c-ls-c"]["cpuset_cpus"]) == SINGLE_SOCKET_HT.cpus - cpus("2-3")


# ---- real containerd, both transports (root only) ---------------------------------------------

# The real-containerd fixtures of tests/integration (one private containerd per version).
containerd_env = _real.containerd_env
containerd = _real.containerd
cri_client = _real.cri_client
TRANSPORTS = os.environ.get("RHP_TRANSPORTS", "relay,grpc").split(",")


@pytest.fixture(params=TRANSPORTS)
def transport(request: pytest.FixtureRequest) -> str:
    return str(request.param)


class _VersionProbe:
    """Calls the pass-through ``Version`` every 20 ms from a thread, through the proxy and then
    straight to containerd, and keeps the worst time the proxy added: a proxied call's time minus
    the quicker of the direct calls around it (so a machine busy with other work, which slows
    both, is not counted against the proxy)."""

    def __init__(self, proxy_socket: str, runtime_socket: str) -> None:
        self.sockets = (proxy_socket, runtime_socket)
        self.worst = 0.0
        self.slow = 0  # calls the proxy added 100 ms or more to
        self.calls = 0
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="version-probe")

    @staticmethod
    def _timed(call: Any, request: bytes, failures: list[str]) -> float:
        started = time.monotonic()
        try:
            call(request, timeout=5)
        except grpc.RpcError as err:
            failures.append(f"{err.code().name}: {err.details()}")
        return time.monotonic() - started

    def _run(self) -> None:
        request = api_pb2.VersionRequest(version="v1").SerializeToString()
        method = "/runtime.v1.RuntimeService/Version"
        with grpc.insecure_channel(f"unix://{self.sockets[0]}") as pch, \
                grpc.insecure_channel(f"unix://{self.sockets[1]}") as dch:
            proxied, direct = pch.unary_unary(method), dch.unary_unary(method)
            proxied(request, timeout=5)  # both channels are connected before measuring
            before = self._timed(direct, request, [])
            while not self._stop.is_set():
                through = self._timed(proxied, request, self.failures)
                after = self._timed(direct, request, [])
                added = through - min(before, after)
                self.worst = max(self.worst, added)
                self.slow += added >= 0.1
                before = after
                self.calls += 1
                self._stop.wait(0.02)

    def __enter__(self) -> _VersionProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


@pytest.mark.integration
def test_poisoned_pods_on_real_containerd_cost_only_themselves(
    containerd: Any, cri_client: Any, tmp_path: Path, transport: str
) -> None:
    from runtime_proxy.config import ProxyConfig
    from runtime_proxy.state.sysfs import read_cpu_topology
    from tests.integration import qos_helpers as q
    from tests.integration.harness import proxy_options

    topo = read_cpu_topology()
    if len(topo.cpus) < 2:
        pytest.skip("needs 2+ CPUs: one is bound to the healthy LSR pod, the rest is the share pool")
    bound_cpu = max(topo.cpus)
    node_file = q.write_node_config(tmp_path / "node.json")
    config = ProxyConfig(nodeConfigFile=str(node_file))
    opts = proxy_options(containerd, tmp_path, transport, builtins=("cpuset", "numa"), config=config)
    # The proxy runs inside the test process; leave the test session's own heap out of the
    # garbage collector's full passes so that they do not pause the proxy's thread.
    gc.collect()
    gc.freeze()
    try:
        _run_poisoned_and_healthy(containerd, cri_client, opts, bound_cpu, topo.cpus)
    finally:
        gc.unfreeze()


def _run_poisoned_and_healthy(
    containerd: Any, cri_client: Any, opts: Any, bound_cpu: int, all_cpus: frozenset[int]
) -> None:
    from rhp_devenv.cri import linux_resources

    from tests.integration.harness import ProxyThread

    def run(client: Any, qos: str, annotations: dict[str, str]) -> tuple[Any, str]:
        uid = str(uuid.uuid4())
        parent = containerd.new_cgroup_parent("burstable", uid=uid)
        pod = client.run_pod(cgroup_parent=parent, uid=uid, labels={QOS: qos}, annotations=annotations)
        cid = client.run_container(pod, resources=linux_resources(cpu_shares=512))
        return pod, cid

    with ProxyThread(opts):
        client = cri_client(opts.listen)
        _, lsr_cid = run(client, "LSR", {RS: json.dumps({"cpuset": str(bound_cpu)})})
        with _VersionProbe(opts.listen, str(containerd.socket)) as probe:
            for poison in POISONS:
                run(client, "LSR", {RS: str(poison.values[0])})
        _, ls_cid = run(client, "LS", {})
        direct = containerd.cri_client()
        assert direct.container_status(lsr_cid).resources.linux.cpuset_cpus == str(bound_cpu)
        shared = direct.container_status(ls_cid).resources.linux.cpuset_cpus
        assert cpus(shared) == all_cpus - {bound_cpu}
        assert probe.failures == []
        assert probe.calls > 0
        # One call over 100 ms is a scheduler hiccup on a loaded 2-core machine (it was seen at
        # 108 ms); a poisoned pod holding the proxy would slow the call next to each poisoned pod.
        assert probe.slow <= max(1, probe.calls // 20), (
            f"{probe.slow} of {probe.calls} pass-through Version calls took 100 ms more through the proxy"
        )
        assert probe.worst < 1.0, f"the proxy held a pass-through Version for {probe.worst * 1000:.0f} ms"
