"""Memory eviction on real containerd, through the proxy: BE pods that really fill memory,
node memory from a prepared ``/proc/meminfo`` (the usage loop's ``procRoot``), and the
``memory_evict`` plugin's victims evicted

- with ``evictBy: api`` through the fake API server's Eviction subresource, Koordinator's
  victims (the requests of one round go side by side); a PodDisruptionBudget answers 429 for
  the first victim until it allows the eviction, the loop asks again every round and meanwhile
  takes the next victims in its place;
- with ``evictBy: runtime`` by stopping the victim's containers through containerd.

The test plays kubelet's part: when a pod leaves the API server it removes the pod's sandbox and
lowers the prepared node memory by what the pod used. Eviction goes through CRI calls every
containerd version shares, so one version is enough.
"""

from __future__ import annotations

import json
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from rhp_devenv.cri import CriClient, PodHandle

from cri_protos import api_pb2
from runtime_proxy.config import ProxyConfig
from tests.fakeapi import FakeAPIServer
from tests.integration import qos_helpers as q
from tests.integration.harness import ProxyThread, proxy_options

# What this checks does not depend on the containerd version.
pytestmark = [pytest.mark.integration, pytest.mark.one_containerd]

T = TypeVar("T")
MiB = 1 << 20
TOTAL = 512 * MiB  # the prepared node's MemTotal: 1% is 5.12 MiB
FILLS = {"be-a": 48, "be-b": 24, "be-c": 8, "ls-l": 64}  # MiB each pod's container holds
SLO = {**q.NODE_SLO, "resourceUsedThresholdWithBE": {"enable": True}}  # threshold 70%, lower 68%


def fill_command(mib: int) -> list[str]:
    """busybox awk holding a string of ``mib`` MiB (anonymous memory) while it sleeps."""
    return ["awk", f'BEGIN{{s=sprintf("%{mib * MiB}s", ""); system("sleep 3600")}}']


def write_meminfo(proc: Path, used: int) -> None:
    text = f"MemTotal:       {TOTAL // 1024} kB\nMemFree:        0 kB\nMemAvailable:   {(TOTAL - used) // 1024} kB\n"
    tmp = proc / "meminfo.tmp"
    tmp.write_text(text)
    tmp.replace(proc / "meminfo")


def poll(read: Callable[[], T | None], *, what: str, timeout: float = 20.0) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = read()
        if value is not None and value is not False:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout} s")
        time.sleep(0.05)


class Node:
    """The proxy with the usage loop and ``memory_evict`` in front of containerd, and the pods."""

    def __init__(self, containerd: Any, tmp_path: Path, cri_client: Callable[..., CriClient], evict_by: str) -> None:
        self.containerd = containerd
        self.proc = tmp_path / "proc"
        self.proc.mkdir()
        shutil.copyfile("/proc/stat", self.proc / "stat")
        write_meminfo(self.proc, 0)
        node_file = tmp_path / "node.json"
        node_file.write_text(json.dumps({
            "name": "rhp-qos-node",
            "nodeResourceTopology": {"annotations": q.node_topology_annotations()},
            "nodeSLO": SLO,
        }))
        config = ProxyConfig.model_validate({
            "nodeConfigFile": str(node_file),
            "reconcilePeriodSeconds": 60.0,
            "usageLoop": {"enable": True, "intervalSeconds": 0.5, "procRoot": str(self.proc), "evictBy": evict_by},
        })
        opts = proxy_options(containerd, tmp_path, "relay", builtins=("memory_evict",), reconcile=True, config=config)
        self.proxy = ProxyThread(opts).__enter__()
        self.client = cri_client(opts.listen)
        self.direct = containerd.cri_client()
        self.pods: dict[str, tuple[PodHandle, str, str]] = {}  # name -> (handle, uid, container id)

    def close(self) -> None:
        self.proxy.__exit__(None, None, None)

    def run(self, name: str, qos: str) -> str:
        uid = str(uuid.uuid4())
        parent = self.containerd.new_cgroup_parent("besteffort" if qos == "BE" else "burstable", uid=uid)
        pod = self.client.run_pod(cgroup_parent=parent, uid=uid, name=name, labels={q.LABEL_QOS: qos})
        cid = self.client.run_container(pod, name="fill", command=fill_command(FILLS[name]))
        self.pods[name] = (pod, uid, cid)
        return uid

    def sampled(self) -> dict[str, int] | None:
        """Each pod's memory as the usage loop last sampled it, once every pod holds its fill."""
        assert self.proxy.proxy is not None and self.proxy.proxy.reconciler is not None
        loop = self.proxy.proxy.reconciler.usage
        last = loop.last_round if loop is not None else None
        if last is None or last.sample is None:
            return None
        seen = {name: last.sample.pods.get(uid) for name, (_, uid, _) in self.pods.items()}
        if any(u is None or u.memory_bytes < FILLS[name] * MiB * 0.95 for name, u in seen.items()):
            return None
        return {name: u.memory_bytes for name, u in seen.items() if u is not None}

    def running(self, name: str) -> bool:
        return bool(self.direct.container_status(self.pods[name][2]).state == api_pb2.CONTAINER_RUNNING)


@pytest.fixture
def make_node(containerd: Any, tmp_path: Path, cri_client: Any) -> Iterator[Callable[[str], Node]]:
    made: list[Node] = []

    def make(evict_by: str) -> Node:
        made.append(Node(containerd, tmp_path, cri_client, evict_by))
        return made[-1]

    try:
        yield make
    finally:
        for node in made:
            node.close()


@pytest.fixture
def api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeAPIServer]:
    """The fake API server, reachable through a kubeconfig the proxy's evictor loads."""
    with FakeAPIServer() as server:
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(
            "apiVersion: v1\nkind: Config\ncurrent-context: fake\n"
            f"clusters: [{{name: fake, cluster: {{server: '{server.url}'}}}}]\n"
            "users: [{name: fake, user: {}}]\n"
            "contexts: [{name: fake, context: {cluster: fake, user: fake}}]\n"
        )
        monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
        monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
        yield server


def test_memory_eviction_through_the_eviction_api_honours_a_disruption_budget(
    make_node: Callable[[str], Node], api: FakeAPIServer
) -> None:
    node = make_node("api")
    for name, qos in (("be-a", "BE"), ("be-b", "BE"), ("be-c", "BE"), ("ls-l", "LS")):
        uid = node.run(name, qos)
        labels = {q.LABEL_QOS: qos, "app": name}
        api.create({"kind": "Pod", "metadata": {"name": name, "namespace": "default", "uid": uid, "labels": labels},
                    "spec": {"nodeName": "rhp-qos-node"}, "status": {"phase": "Running"}})
    api.create({"kind": "PodDisruptionBudget", "metadata": {"name": "keep-a", "namespace": "default"},
                "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "be-a"}}},
                "status": {"disruptionsAllowed": 0, "currentHealthy": 1, "desiredHealthy": 1}})
    used = poll(node.sampled, what="the usage loop sees every pod's memory")
    # Node memory such that freeing down to 68% needs more than be-a (the largest BE pod) but
    # no more than be-a and be-b. be-a's budget holds it, so be-b goes, then (the need still
    # above what is left) be-c; the LS pod never.
    percent = 68 + (used["be-a"] + used["be-b"]) * 100 // TOTAL
    node_used = TOTAL * percent // 100
    write_meminfo(node.proc, node_used)

    def kubelet() -> None:
        """Remove the sandboxes of pods the API server deleted; lower node memory by their use."""
        nonlocal node_used
        for name in ("be-a", "be-b", "be-c", "ls-l"):
            handle = node.pods[name][0]
            if api.get("Pod", name, "default") is None and handle.pod_id:
                node.client.remove_pod(handle.pod_id)
                handle.pod_id = ""
                node_used -= used[name]
                write_meminfo(node.proc, node_used)

    def refused_twice() -> bool:
        kubelet()
        return api.evictions.count(("default", "be-a", 429)) >= 2 and api.get("Pod", "be-c", "default") is None

    poll(refused_twice, what="be-a refused by its budget and tried again, be-c taken in its place")
    assert api.get("Pod", "be-b", "default") is None, "be-b went while the budget held be-a"
    api.patch_direct("PodDisruptionBudget", "keep-a", {"status": {"disruptionsAllowed": 1}}, "default")

    def a_gone() -> bool:
        kubelet()
        return api.get("Pod", "be-a", "default") is None

    poll(a_gone, what="be-a evicted once its budget allows it")
    order = [(name, code) for _, name, code in api.evictions]
    # The evictions of one round run side by side, so only their outcomes are fixed, not the
    # order of their requests.
    assert order[-1] == ("be-a", 201), order
    assert set(order[:-1]) == {("be-a", 429), ("be-b", 201), ("be-c", 201)}, order
    assert order.count(("be-a", 429)) >= 2 and order.count(("be-b", 201)) == order.count(("be-c", 201)) == 1, order
    time.sleep(1.0)  # a few more rounds: node memory is below the threshold now
    assert len(api.evictions) == len(order)
    assert api.get("Pod", "ls-l", "default") is not None and node.running("ls-l")
    events = {(e["involvedObject"]["name"], e["reason"]) for e in api.objects("Event")}
    assert {("be-a", "evictPodFail"), ("be-a", "evictPodSuccess"), ("be-b", "evictPodSuccess"),
            ("be-c", "evictPodSuccess")} <= events
    messages = [e["message"] for e in api.objects("Event") if e["reason"] == "evictPodSuccess"]
    prefix = "trigger by runtime-hook-proxy feature BEMemoryEvict, evict pod: default/"
    assert messages and all(m.startswith(prefix) for m in messages)


def test_memory_eviction_by_the_runtime_stops_the_victims_containers(make_node: Callable[[str], Node]) -> None:
    node = make_node("runtime")
    for name, qos in (("be-a", "BE"), ("be-b", "BE"), ("be-c", "BE"), ("ls-l", "LS")):
        node.run(name, qos)
    used = poll(node.sampled, what="the usage loop sees every pod's memory")
    # Freeing down to 68% needs be-a and be-b, not be-c.
    percent = 68 + (used["be-a"] + used["be-b"]) * 100 // TOTAL
    write_meminfo(node.proc, TOTAL * percent // 100)
    poll(lambda: not node.running("be-a") and not node.running("be-b"), what="be-a and be-b stopped")
    write_meminfo(node.proc, 0)  # their memory is free now
    assert node.running("be-c") and node.running("ls-l")
    status = node.direct.container_status(node.pods["be-a"][2])
    assert status.state == api_pb2.CONTAINER_EXITED
