"""``runtime-proxy nri`` reports too: with ``report.enable`` the NRI plugin (against the fake
runtime of tests/runtime_proxy/nri) writes the node's NodeResourceTopology to an API server (the
fake of tests/fakeapi.py, reached through a kubeconfig), and the LS share pool it reports leaves
out the CPU of an LSR pod the runtime sent at Synchronize (the NRI store's pods)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from cri_protos import nri_pb2
from koord_formats import keys
from koord_formats.node import parse_share_pools
from runtime_proxy.commands.nri import NriOptions, run
from runtime_proxy.config import ProxyConfig
from runtime_proxy.state.sysfs import read_cpu_topology
from tests.fakeapi import FakeAPIServer
from tests.integration import qos_helpers as q
from tests.runtime_proxy.nri.fake_runtime import FakeRuntime

TOPO = read_cpu_topology()
NODE = "nri-node"


@pytest.fixture
def api() -> Iterator[FakeAPIServer]:
    with FakeAPIServer() as server:
        server.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
        yield server


def _kubeconfig(path: Path, url: str) -> Path:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "fake",
        "clusters": [{"name": "fake", "cluster": {"server": url}}],
        "users": [{"name": "fake", "user": {"token": "x"}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
    }))  # fmt: skip
    path.chmod(0o600)
    return path


@pytest.mark.skipif(len(TOPO.cpus) < 2, reason="needs 2+ CPUs: one bound to the LSR pod, the rest shared")
async def test_nri_mode_reports_the_nrt_with_the_pods_it_was_sent(api: FakeAPIServer, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBECONFIG", str(_kubeconfig(tmp_path / "kubeconfig", api.url)))
    lsr_cpu = max(TOPO.cpus)
    runtime = await FakeRuntime(tmp_path / "nri.sock").start()
    config = ProxyConfig.model_validate({
        "hookServerDir": str(tmp_path / "hooks"), "cgroupRoot": str(tmp_path / "cgroup"), "cgroupDriver": "cgroupfs",
        "nodeConfigFile": str(q.write_node_config(tmp_path / "node.json")), "nodeName": NODE,
        "report": {"enable": True, "intervalSeconds": 1, "kubeletConfigFile": ""},
    })  # fmt: skip
    stop = asyncio.Event()
    task = asyncio.create_task(run(NriOptions(socket=str(runtime.path), config=config, entry_points=False,
                                              builtins=("cpuset",), hook_servers=False), stop))
    try:
        session = await runtime.next_session()
        await asyncio.wait_for(session.registered.wait(), 5)
        await session.call("Configure", nri_pb2.ConfigureRequest(runtime_name="fake", runtime_version="1"))
        pod = nri_pb2.PodSandbox(id="lsr", name="lsr", uid="uid-lsr", namespace="default",
                                 labels={q.LABEL_QOS: "LSR"},
                                 annotations={q.RESOURCE_STATUS: json.dumps({"cpuset": str(lsr_cpu)})})
        pod.linux.cgroup_parent = "/kubepods/podlsr"
        container = nri_pb2.Container(id="c1", pod_sandbox_id="lsr", name="c1", state=nri_pb2.CONTAINER_RUNNING)
        await session.call("Synchronize", nri_pb2.SynchronizeRequest(pods=[pod], containers=[container]))

        def shared() -> frozenset[int] | None:
            nrt = api.get("NodeResourceTopology", NODE)
            if nrt is None:
                return None
            pools = parse_share_pools(nrt["metadata"]["annotations"][keys.NODE_ANNOTATION_CPU_SHARED_POOLS])
            cpus = frozenset().union(*(p.cpus for p in pools))
            return cpus if lsr_cpu not in cpus else None

        deadline = asyncio.get_running_loop().time() + 60
        while (got := shared()) is None and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
        assert got == TOPO.cpus - {lsr_cpu}
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
        await runtime.stop()
