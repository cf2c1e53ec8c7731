"""runtime_proxy/report/loop.py against the in-process fake API server (tests/fakeapi.py) with
the real writer: objects created and kept up to date, unchanged values never written, writes
rate-limited, the NodeMetric status from the sampler, and one bad object costing only itself."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from types import MappingProxyType
from typing import Any

import kubernetes
import pytest

from hooks.facts import ContainerFacts, NodeFacts, PodFacts
from hooks.usage import ResourceUsage, UsageSample
from koord_formats import keys
from koord_formats.nodemetric import parse_node_metric_status
from koord_formats.topology import parse_cpu_topology
from runtime_proxy.host.cgroups import Cgroups
from runtime_proxy.report.config import ReportConfig
from runtime_proxy.report.loop import NRT, WRITES, Reporter
from runtime_proxy.report.writer import KubeObjects
from scheduler_ext import numa
from scheduler_ext.topology import parse_gpu_devices
from scheduler_ext.views import zone_amount
from tests.fake_clock import Clock
from tests.fake_sysfs import add_nvidia_gpu, write_topology
from tests.fakeapi import FakeAPIServer
from tests.topologies import DUAL_SOCKET_HT

NODE = "n1"


class Backend:
    def __init__(self) -> None:
        self.pod_list: list[PodFacts] = []

    def node(self) -> NodeFacts:
        return NodeFacts(name=NODE)

    def pods(self) -> list[PodFacts]:
        return list(self.pod_list)

    def containers(self) -> list[tuple[PodFacts, ContainerFacts]]:
        return []


class Sampler:
    """A usage sampler's window (the usage loop's, when it runs)."""

    def __init__(self) -> None:
        self.samples: tuple[UsageSample, ...] = ()

    def add(self, at: float, cpu: int, pods: dict[str, tuple[int, int]] | None = None) -> None:
        pods_map = MappingProxyType({k: ResourceUsage(*v) for k, v in (pods or {}).items()})
        self.samples = (*self.samples, UsageSample(at=at, node_cpu_milli=cpu, node_memory_used_bytes=1 << 30,
                                                   pods=pods_map))


@pytest.fixture
def api() -> Iterator[FakeAPIServer]:
    with FakeAPIServer() as server:
        server.register("slo.koordinator.sh", "v1alpha1", "nodemetrics", "NodeMetric", False)
        server.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
        yield server


def _reporter(api: FakeAPIServer, tmp_path: Path, clock: Clock, sampler: Sampler | None = None,
              **config: Any) -> tuple[Reporter, Backend]:
    conf = kubernetes.client.Configuration()
    conf.host = api.url
    sys_root, proc = tmp_path / "sys", tmp_path / "proc"
    write_topology(sys_root, DUAL_SOCKET_HT, {0: 1024, 1: 2048})
    backend = Backend()
    rep = Reporter(
        ReportConfig(enable=True, sysRoot=str(sys_root), procRoot=str(proc), kubeletConfigFile="", **config),
        backend, node_name=NODE, topology=DUAL_SOCKET_HT, cgroups=Cgroups(str(tmp_path / "cg")),
        sampler=sampler,  # type: ignore[arg-type]
        objects=KubeObjects(kubernetes.client.ApiClient(conf)), clock=clock, wall=lambda: 1.7e9,
    )  # fmt: skip
    return rep, backend


def _count(kind: str, result: str) -> float:
    return WRITES.labels(kind, result)._value.get()


def test_nrt_created_owned_by_the_node_and_readable_by_the_extender(api: FakeAPIServer, tmp_path: Path) -> None:
    rep, _ = _reporter(api, tmp_path, Clock())
    rep.topology_round()
    nrt = api.get("NodeResourceTopology", NODE)
    assert nrt is not None
    node = api.get("Node", NODE)
    assert node is not None
    assert nrt["metadata"]["ownerReferences"] == [{"apiVersion": "v1", "kind": "Node", "name": NODE,
                                                   "uid": node["metadata"]["uid"]}]
    assert parse_cpu_topology(nrt["metadata"]["annotations"][keys.NODE_ANNOTATION_CPU_TOPOLOGY]) == DUAL_SOCKET_HT
    assert numa.parse_nrt_zones(nrt["zones"], zone_amount) == {0: {"cpu": 8000, "memory": 1 << 20},
                                                                1: {"cpu": 8000, "memory": 2 << 20}}
    assert api.get("Device", NODE) is None, "no GPU, no Device"


def test_unchanged_values_are_neither_read_nor_written_until_the_resync(api: FakeAPIServer, tmp_path: Path) -> None:
    clock = Clock()
    rep, backend = _reporter(api, tmp_path, clock)
    rep.topology_round()
    version = api.get("NodeResourceTopology", NODE)["metadata"]["resourceVersion"]  # type: ignore[index]
    before = dict(api.counts)
    for _ in range(5):
        clock.now += 10
        rep.topology_round()
    assert api.get("NodeResourceTopology", NODE)["metadata"]["resourceVersion"] == version  # type: ignore[index]
    assert dict(api.counts) == before, "no request at all while nothing changed"
    clock.now += 400  # past resyncSeconds: read back, found equal, not written
    unchanged = _count("NodeResourceTopology", "unchanged")
    rep.topology_round()
    assert _count("NodeResourceTopology", "unchanged") == unchanged + 1
    assert api.get("NodeResourceTopology", NODE)["metadata"]["resourceVersion"] == version  # type: ignore[index]
    # An LSR pod bound to CPUs changes the share pools: written at once.
    backend.pod_list = [PodFacts(name="p", namespace="ns", uid="u1", labels={keys.LABEL_QOS_CLASS: "LSR"},
                                 annotations={keys.ANNOTATION_RESOURCE_STATUS: '{"cpuset":"2"}'})]
    clock.now += 10
    rep.topology_round()
    nrt = api.get("NodeResourceTopology", NODE)
    assert nrt is not None and "2" not in nrt["metadata"]["annotations"][keys.NODE_ANNOTATION_CPU_SHARED_POOLS] \
        .split('"cpuset":"')[1].split(",")


def test_someone_elses_zone_resources_survive_and_their_change_is_put_right(api: FakeAPIServer,
                                                                           tmp_path: Path) -> None:
    clock = Clock()
    rep, _ = _reporter(api, tmp_path, clock)
    rep.topology_round()
    nrt = api.get("NodeResourceTopology", NODE)
    assert nrt is not None
    nrt["zones"][0]["resources"].append({"name": "kubernetes.io/batch-cpu", "capacity": "3000",
                                         "allocatable": "3000", "available": "3000"})
    nrt["zones"][1]["resources"][0]["allocatable"] = "1"
    rep.objects.replace(NRT, NODE, nrt)  # another writer (the manager)
    clock.now += 400
    rep.topology_round()
    nrt = api.get("NodeResourceTopology", NODE)
    assert nrt is not None
    assert nrt["zones"][1]["resources"][0]["allocatable"] == "8"
    assert nrt["zones"][0]["resources"][2]["name"] == "kubernetes.io/batch-cpu"


def test_gpus_become_a_device(api: FakeAPIServer, tmp_path: Path) -> None:
    rep, _ = _reporter(api, tmp_path, Clock(), gpuMemoryBytes=16 << 30)
    add_nvidia_gpu(tmp_path / "sys", tmp_path / "proc", "0000:3b:00.0", minor=0, uuid="GPU-aaaa", numa=0)
    add_nvidia_gpu(tmp_path / "sys", tmp_path / "proc", "0000:af:00.0", minor=1, uuid="GPU-bbbb", numa=1,
                   root="pci0000:ae")
    rep.topology_round()
    device = api.get("Device", NODE)
    assert device is not None
    gpus = parse_gpu_devices(device["spec"])
    assert [(g.minor, g.id, g.memory, g.numa, g.pcie) for g in gpus] == [
        (0, "GPU-aaaa", 16 << 30, 0, "pci0000:3a"), (1, "GPU-bbbb", 16 << 30, 1, "pci0000:ae")]


def test_writes_are_rate_limited(api: FakeAPIServer, tmp_path: Path) -> None:
    clock = Clock()
    rep, backend = _reporter(api, tmp_path, clock)
    versions = set()
    for i in range(9):  # a change every round, no time passing: the create and a burst of 4 more, then nothing
        backend.pod_list = [PodFacts(name="p", namespace="ns", uid="u1", labels={keys.LABEL_QOS_CLASS: "LSR"},
                                     annotations={keys.ANNOTATION_RESOURCE_STATUS: f'{{"cpuset":"{i}"}}'})]
        rep.topology_round()
        versions.add(api.get("NodeResourceTopology", NODE)["metadata"]["resourceVersion"])  # type: ignore[index]
    assert len(versions) == 5
    assert _count("NodeResourceTopology", "rate-limited") >= 4
    clock.now += 1  # one token back
    rep.topology_round()
    versions.add(api.get("NodeResourceTopology", NODE)["metadata"]["resourceVersion"])  # type: ignore[index]
    assert len(versions) == 6


def test_a_store_change_runs_the_topology_round_at_once(api: FakeAPIServer, tmp_path: Path) -> None:
    async def run() -> None:
        rep, backend = _reporter(api, tmp_path, Clock(), intervalSeconds=3600)
        await rep.start()
        try:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 60
            while api.get("NodeResourceTopology", NODE) is None and loop.time() < deadline:
                await asyncio.sleep(0.05)
            before = api.get("NodeResourceTopology", NODE)["metadata"]["resourceVersion"]  # type: ignore[index]
            backend.pod_list = [PodFacts(name="p", namespace="ns", uid="u1", labels={keys.LABEL_QOS_CLASS: "LSR"},
                                         annotations={keys.ANNOTATION_RESOURCE_STATUS: '{"cpuset":"3"}'})]
            rep.store_changed()
            while (api.get("NodeResourceTopology", NODE)["metadata"]["resourceVersion"]  # type: ignore[index]
                   == before and loop.time() < deadline):
                await asyncio.sleep(0.05)
            assert api.get("NodeResourceTopology", NODE)["metadata"]["resourceVersion"] != before  # type: ignore[index]
        finally:
            await rep.stop()

    asyncio.run(run())


def test_a_malformed_nrt_costs_only_itself(api: FakeAPIServer, tmp_path: Path) -> None:
    api.create({"apiVersion": "topology.node.k8s.io/v1alpha1", "kind": "NodeResourceTopology",
                "metadata": {"name": NODE}, "zones": [{"name": "node-0", "type": "Node",
                                                       "resources": [{"name": "cpu", "capacity": "-5"}]}]})
    rep, _ = _reporter(api, tmp_path, Clock())
    add_nvidia_gpu(tmp_path / "sys", tmp_path / "proc", "0000:3b:00.0", minor=0, uuid="GPU-aaaa")
    errors = _count("NodeResourceTopology", "error")
    rep.topology_round()
    assert _count("NodeResourceTopology", "error") == errors + 1
    assert api.get("Device", NODE) is not None, "the Device is still written"


def test_api_failures_are_retried_next_round(api: FakeAPIServer, tmp_path: Path) -> None:
    clock = Clock()
    rep, _ = _reporter(api, tmp_path, clock)
    api.inject("GET", r".*/noderesourcetopologies/.*", 500)
    rep.topology_round()
    assert api.get("NodeResourceTopology", NODE) is None
    clock.now += 10
    rep.topology_round()
    assert api.get("NodeResourceTopology", NODE) is not None


def _nodemetric(api: FakeAPIServer, spec: Any) -> None:
    api.create({"apiVersion": "slo.koordinator.sh/v1alpha1", "kind": "NodeMetric", "metadata": {"name": NODE},
                "spec": spec})


def test_nodemetric_status_from_the_usage_loops_sampler(api: FakeAPIServer, tmp_path: Path) -> None:
    clock, sampler = Clock(), Sampler()
    _nodemetric(api, {"metricCollectPolicy": {"aggregateDurationSeconds": 60, "reportIntervalSeconds": 30,
                                              "nodeAggregatePolicy": {"durations": ["1m0s"]}}})
    rep, backend = _reporter(api, tmp_path, clock, sampler)
    backend.pod_list = [PodFacts(name="web", namespace="default", uid="u1", kube_qos="Burstable")]
    for t in range(1, 62):
        clock.now += 1
        sampler.add(clock.now, 1000 + t, {"u1": (100, 4096)})
        if t % 3 == 0:  # the reporter polls every few samples
            rep.metrics_round()
        if t == 27:  # the first report comes report.nodeMetricMinIntervalSeconds after the start
            assert "status" not in api.get("NodeMetric", NODE)  # type: ignore[operator]
    stored = api.get("NodeMetric", NODE)
    assert stored is not None
    status = parse_node_metric_status(stored["status"])
    assert status.update_time == "2023-11-14T22:13:20Z"
    assert status.node_usage.cpu_milli is not None and status.node_usage.memory_bytes == 1 << 30
    assert [(p.name, p.usage.cpu_milli, p.qos, p.priority) for p in status.pods] == [("web", 100, "LS", "koord-prod")]
    (agg,) = status.aggregated_node_usages
    assert agg.duration_seconds == 60 and agg.usage["p99"].cpu_milli is not None
    assert stored["spec"]["metricCollectPolicy"]["aggregateDurationSeconds"] == 60, "the spec is not ours to touch"


def test_nodemetric_missing_is_skipped_or_created(api: FakeAPIServer, tmp_path: Path) -> None:
    sampler, clock = Sampler(), Clock()
    sampler.add(999, 500)
    rep, _ = _reporter(api, tmp_path, clock, sampler)
    rep2, _ = _reporter(api, tmp_path / "2", clock, sampler, createNodeMetric=True)
    clock.now += 60
    rep.metrics_round()
    assert api.get("NodeMetric", NODE) is None, "the manager creates it"
    rep2.metrics_round()
    stored = api.get("NodeMetric", NODE)
    assert stored is not None and stored["status"]["nodeMetric"]["nodeUsage"]["resources"]["cpu"] == "500m"


@pytest.mark.parametrize("spec", [{"metricCollectPolicy": {"aggregateDurationSeconds": "x"}},
                                  {"metricCollectPolicy": {"nodeAggregatePolicy": {"durations": ["forever"]}}}])
def test_a_malformed_nodemetric_spec_reports_with_the_defaults(api: FakeAPIServer, tmp_path: Path,
                                                                spec: Any) -> None:
    sampler = Sampler()
    sampler.add(999, 500)
    _nodemetric(api, spec)
    clock = Clock()
    rep, _ = _reporter(api, tmp_path, clock, sampler)
    clock.now += 60
    rep.metrics_round()
    stored = api.get("NodeMetric", NODE)
    assert stored is not None and "status" in stored
    assert [a["duration"] for a in stored["status"]["nodeMetric"]["aggregatedNodeUsages"]] == ["5m0s", "10m0s",
                                                                                               "30m0s"]


def test_own_sampler_when_the_usage_loop_does_not_run(api: FakeAPIServer, tmp_path: Path) -> None:
    """Without the usage loop the reporter samples /proc itself (the sampler's first call is its
    baseline, so the second round reports)."""
    clock = Clock()
    rep, _ = _reporter(api, tmp_path, clock, createNodeMetric=True)
    assert not rep.shared_sampler
    rep.metrics_round()
    clock.now += 60
    rep.metrics_round()
    stored = api.get("NodeMetric", NODE)
    assert stored is not None and "memory" in stored["status"]["nodeMetric"]["nodeUsage"]["resources"]


def test_start_and_stop(api: FakeAPIServer, tmp_path: Path) -> None:
    async def run() -> None:
        rep, _ = _reporter(api, tmp_path, Clock(), intervalSeconds=1)
        await rep.start()
        deadline = asyncio.get_running_loop().time() + 60
        while api.get("NodeResourceTopology", NODE) is None and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
        await rep.stop()

    asyncio.run(run())
    assert api.get("NodeResourceTopology", NODE) is not None


# -- the transport: rhp_kube.http, the one client family (issue 32) --------------------------------


def test_reports_go_through_the_one_transport(api: FakeAPIServer, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The writer's GET, POST and PUT (of an object and of its status) go through
    ``rhp_kube.http`` on the fake API server: an NRT owned by the Node is created, then a
    NodeMetric's status replaced. urllib3's pool (the official client's transport) is made
    unusable: on the old main every report went through it, and nothing was written."""
    import urllib3

    def no_urllib3(*args: object, **kwargs: object) -> None:
        raise AssertionError("a report went through the official client's urllib3 pool")

    monkeypatch.setattr(urllib3.PoolManager, "request", no_urllib3)
    monkeypatch.setattr(urllib3.PoolManager, "urlopen", no_urllib3)
    sampler, clock = Sampler(), Clock()
    sampler.add(999, 500)
    _nodemetric(api, {})
    rep, _ = _reporter(api, tmp_path, clock, sampler)
    try:
        errors = _count("NodeResourceTopology", "error")
        rep.topology_round()
        assert _count("NodeResourceTopology", "error") == errors
        nrt, node = api.get("NodeResourceTopology", NODE), api.get("Node", NODE)
        assert nrt is not None and node is not None
        assert nrt["metadata"]["ownerReferences"][0]["uid"] == node["metadata"]["uid"]
        clock.now += 60
        rep.metrics_round()
        stored = api.get("NodeMetric", NODE)
        assert stored is not None and stored["status"]["nodeMetric"]["nodeUsage"]["resources"]["cpu"] == "500m"
    finally:
        rep.objects.close()
