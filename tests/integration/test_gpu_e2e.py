"""GPU end to end: the scheduler extender binds a GPU pod through the fake API server, and the
proxy, in front of real containerd, turns the written ``device-allocated`` annotation into the
container's ``NVIDIA_VISIBLE_DEVICES``.

kubelet's part is played by the test: it reads the bound pod with the official client and sends
RunPodSandbox and CreateContainer through the proxy with the pod's labels and annotations, as
kubelet does (pod annotations reach the sandbox config unchanged).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import kubernetes
import pytest
from rhp_devenv.cri import container_config

from cri_protos import api_pb2
from koord_formats.topology import format_cpu_topology
from tests.fakeapi import FakeAPIServer
from tests.integration.harness import ProxyThread, proxy_options
from tests.scheduler_ext.builders import TOPO_SMALL, cluster, pod
from tests.scheduler_ext.conftest import Extender, start_extender

pytestmark = pytest.mark.integration

DEVICE_ALLOCATED = "scheduling.koordinator.sh/device-allocated"
NODE = "gpu-node"


def _wait(cond: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.02)


@pytest.fixture
def cluster_api() -> Iterator[tuple[FakeAPIServer, Extender]]:
    """A fake API server holding one node with 4 GPUs, and an extender watching it."""
    api = FakeAPIServer().start()
    for obj in cluster([NODE], format_cpu_topology(TOPO_SMALL), gpus=4):
        api.create(obj)
    ext = start_extender(api.url)
    yield api, ext
    ext.stop()
    api.stop()


def _schedule(api: FakeAPIServer, ext: Extender, manifest: dict[str, Any]) -> None:
    """What kube-scheduler does with an extender: filter, then bind through it."""
    api.create(manifest)
    uid = manifest["metadata"]["uid"]
    _wait(lambda: ext.state.pending(uid) is not None, "the extender to see the pod")
    filtered = httpx.post(f"{ext.url}/filter", json={"Pod": manifest, "NodeNames": [NODE]}, timeout=10).json()
    assert filtered.get("NodeNames") == [NODE], filtered
    bind = {"PodName": manifest["metadata"]["name"], "PodNamespace": "default", "PodUID": uid, "Node": NODE}
    assert httpx.post(f"{ext.url}/bind", json=bind, timeout=10).json() == {"Error": ""}


def _kubelet_sandbox(bound: kubernetes.client.V1Pod, cgroup_parent: str) -> api_pb2.PodSandboxConfig:
    meta = bound.metadata
    labels = dict(meta.labels or {})
    labels.update({"io.kubernetes.pod.name": meta.name, "io.kubernetes.pod.namespace": meta.namespace,
                   "io.kubernetes.pod.uid": meta.uid})
    return api_pb2.PodSandboxConfig(
        metadata=api_pb2.PodSandboxMetadata(name=meta.name, namespace=meta.namespace, uid=meta.uid),
        labels=labels,
        annotations=dict(meta.annotations or {}),
        linux=api_pb2.LinuxPodSandboxConfig(
            cgroup_parent=cgroup_parent,
            security_context=api_pb2.LinuxSandboxSecurityContext(
                namespace_options=api_pb2.NamespaceOption(network=api_pb2.NODE)
            ),
        ),
    )


def test_extender_bind_reaches_the_container_env(
    cluster_api: tuple[FakeAPIServer, Extender], containerd: Any, cri_client: Any, tmp_path: Path
) -> None:
    api, extender = cluster_api
    # A first pod takes a GPU, so the second one's minors are not simply "0,1".
    _schedule(api, extender, pod("warm", cpu="2", qos="LS", extra={"nvidia.com/gpu": "1"}))
    _schedule(api, extender, pod("train", cpu="2", qos="LS", extra={"nvidia.com/gpu": "2"}))

    conf = kubernetes.client.Configuration()
    conf.host = api.url
    core = kubernetes.client.CoreV1Api(kubernetes.client.ApiClient(conf))
    warm = core.read_namespaced_pod("warm", "default")
    bound = core.read_namespaced_pod("train", "default")
    assert bound.spec.node_name == NODE
    taken = [g["minor"] for g in json.loads(warm.metadata.annotations[DEVICE_ALLOCATED])["gpu"]]
    minors = [g["minor"] for g in json.loads(bound.metadata.annotations[DEVICE_ALLOCATED])["gpu"]]
    assert len(minors) == 2 and not set(minors) & set(taken)

    opts = proxy_options(containerd, tmp_path, "relay", builtins=("gpu_env",))
    with ProxyThread(opts) as proxy:
        client = cri_client(proxy.opts.listen)
        sandbox = _kubelet_sandbox(bound, containerd.new_cgroup_parent())
        pod_id = client.run_pod_sandbox(sandbox)
        config = container_config(name="main", labels={"io.kubernetes.container.name": "main"})
        cid = client.create_container(pod_id, config, sandbox)
        client.start_container(cid)
        out = client.runtime.ExecSync(
            api_pb2.ExecSyncRequest(container_id=cid, cmd=["cat", "/proc/1/environ"], timeout=10), timeout=20
        )
    assert out.exit_code == 0, out.stderr
    env = dict(item.split("=", 1) for item in out.stdout.decode().split("\0") if "=" in item)
    assert env["NVIDIA_VISIBLE_DEVICES"] == ",".join(str(m) for m in minors)
