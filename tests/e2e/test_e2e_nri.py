"""kubelet → containerd 2.1 with NRI → ``runtime-proxy nri`` in the real one-node cluster, and a
live node switched between that and kubelet → ``runtime-proxy serve`` → containerd.

The session's containerd has NRI enabled on its private socket (``tests/e2e/conftest.py``); with
no plugin connected NRI changes nothing. :func:`nri_mode` moves the node as an operator would,
without a kubelet change other than its endpoint: the NRI plugin starts (with the proxy's own
config file), kubelet restarts with containerd's socket, the proxy stops; on leaving, the proxy
starts, kubelet restarts with the proxy's socket, the plugin stops.

What is checked is real: the pods' cgroup files, ``/proc`` inside the container (through
``kubectl exec``), and the API's Pod objects (UIDs, container IDs, restart counts), plus the
runtime's own sandbox IDs.
"""

from __future__ import annotations

import contextlib
import json
import secrets
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
from rhp_devenv.kube import NODE_NAME

from cri_protos import api_pb2
from hooks.facts import format_cpu_list
from runtime_proxy.state.sysfs import read_cpu_topology
from tests.e2e.conftest import (
    SWITCH_TIMEOUT,
    NriPlugin,
    Stack,
    container_id,
    pod_cgroup,
    pod_manifest,
    sandboxes,
)
from tests.integration import qos_helpers as q

TOPO = read_cpu_topology()
ALL_CPUS = format_cpu_list(TOPO.cpus)
LSR_CPU = str(max(TOPO.cpus))
LS_POOL_WITH_LSR = format_cpu_list(TOPO.cpus - {max(TOPO.cpus)})
MiB = 1024**2
NRI_CONTAINERD = "2.1"
BATCH = {"kubernetes.io/batch-cpu": "1000", "kubernetes.io/batch-memory": "1Gi"}
BE_RESOURCES = {"kubernetes.io/batch-cpu": "500", "kubernetes.io/batch-memory": "128Mi"}

# What the plugins decide for each pod (container level; the pod level where marked).
LSR_EXPECT = {"cpuset.cpus": LSR_CPU, "cpu.cfs_quota_us": "-1", "memory.limit_in_bytes": str(64 * MiB)}
LSR_POD_EXPECT = {"cpu.cfs_quota_us": "-1"}
LS_EXPECT = {"cpuset.cpus": LS_POOL_WITH_LSR, "cpu.cfs_quota_us": "100000"}
BE_EXPECT = {"cpu.shares": "512", "cpu.cfs_quota_us": "50000", "memory.limit_in_bytes": str(128 * MiB)}
BE_POD_EXPECT = BE_EXPECT


@pytest.fixture(autouse=True)
def _two_cpus_one_numa_node_containerd_21(stack: Stack) -> None:
    if len(TOPO.cpus) < 2 or TOPO.numa_nodes != (0,):
        pytest.skip(f"needs 2+ CPUs on one NUMA node 0; this machine has {ALL_CPUS} on {TOPO.numa_nodes}")
    if stack.ctrd.version != NRI_CONTAINERD:
        pytest.skip(f"NRI mode runs on containerd {NRI_CONTAINERD} here (tests/integration/test_nri_real.py "
                    "covers the plugin on 1.7)")  # fmt: skip


def _kubelet_endpoint(stack: Stack) -> str:
    config = json.loads((stack.cluster.work_dir / "kubelet-config.json").read_text())
    return str(config["containerRuntimeEndpoint"])


@contextlib.contextmanager
def nri_mode(stack: Stack) -> Iterator[NriPlugin]:
    """Switch the live node to kubelet → containerd + ``runtime-proxy nri``; back to the proxy on exit."""
    work = stack.work / f"nri-{secrets.token_hex(3)}"
    plugin = NriPlugin(stack.ctrd.nri_socket, work, "--config", str(stack.work / "proxy-config.yaml"))
    plugin.start()
    try:
        stack.kubelet_on_containerd()
        assert _kubelet_endpoint(stack) == f"unix://{stack.ctrd.socket}"
        yield plugin
    finally:
        stack.kubelet_on_proxy()
        plugin.stop()


def _lsr(name: str, ns: str) -> dict[str, Any]:
    return pod_manifest(
        name, ns, qos="LSR", node_name=NODE_NAME, annotations={q.RESOURCE_STATUS: q.resource_status(LSR_CPU)},
        requests={"cpu": "1", "memory": "64Mi"}, limits={"cpu": "1", "memory": "64Mi"},
    )  # fmt: skip


def _ls(name: str, ns: str) -> dict[str, Any]:
    return pod_manifest(name, ns, qos="LS", requests={"cpu": "100m", "memory": "32Mi"}, limits={"cpu": "1"})


def _be(name: str, ns: str) -> dict[str, Any]:
    spec = q.extended_resource_spec({"app": {"requests": BE_RESOURCES, "limits": BE_RESOURCES}})
    return pod_manifest(name, ns, qos="BE", annotations={q.EXTENDED_RESOURCE_SPEC: spec},
                        requests=BE_RESOURCES, limits=BE_RESOURCES)  # fmt: skip


def _publish_batch(stack: Stack) -> None:
    """What koord-manager does: batch resources on the Node (kubelet keeps them in its status)."""
    stack.cluster.kubectl("patch", "node", NODE_NAME, "--subresource=status", "--type=merge",
                          "-p", json.dumps({"status": {"capacity": BATCH, "allocatable": BATCH}}))  # fmt: skip


def _files(pod: Mapping[str, Any], names: Mapping[str, str], *, pod_level: bool = False) -> dict[str, str]:
    if pod_level:
        return {f: q.read_pod_file(pod_cgroup(pod), f) for f in names}
    return {f: q.read_container_file(pod_cgroup(pod), container_id(pod), f) for f in names}


def _wait_files(pod: Mapping[str, Any], expect: Mapping[str, str], *, pod_level: bool = False) -> None:
    """The cgroup files hold *expect* (waited for: a reconciler round may still be due)."""
    q.wait_for(lambda: _files(pod, expect, pod_level=pod_level), dict(expect),
               what=f"{'pod' if pod_level else 'container'} cgroup of {pod['metadata']['name']}",
               timeout=60)  # fmt: skip


def _check_configured(pods: Mapping[str, Mapping[str, Any]]) -> None:
    _wait_files(pods["lsr"], LSR_EXPECT)
    _wait_files(pods["lsr"], LSR_POD_EXPECT, pod_level=True)
    _wait_files(pods["ls"], LS_EXPECT)
    _wait_files(pods["be"], BE_EXPECT)
    _wait_files(pods["be"], BE_POD_EXPECT, pod_level=True)


def _cpus_allowed(stack: Stack, ns: str, name: str) -> str:
    out = stack.cluster.kubectl("exec", "-n", ns, name, "--", "cat", "/proc/1/status").stdout
    (allowed,) = [line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Cpus_allowed_list:")]
    return allowed


def _start_pods(stack: Stack, ns: str) -> dict[str, dict[str, Any]]:
    cluster = stack.cluster
    cluster.apply(_lsr("lsr", ns))
    pods = {"lsr": cluster.wait_pod_running(ns, "lsr")}
    cluster.apply(_ls("ls", ns))
    pods["ls"] = cluster.wait_pod_running(ns, "ls")
    _publish_batch(stack)
    cluster.apply(_be("be", ns))
    pods["be"] = cluster.wait_pod_running(ns, "be")
    return pods


def test_nri_plugin_under_kubelet_configures_lsr_ls_and_be_pods(stack: Stack, ns: str) -> None:
    """With kubelet on containerd directly and no proxy running, the node is Ready and the NRI
    plugin gives LSR, LS and BE pods created through the API what the plugins decide: the LSR
    pod's resource-status cpuset (also in the container's /proc) and no CFS quota, the LS share
    pool without the LSR CPU, and the BE pod's batch-cpu and batch-memory as shares, quota and
    memory limit at container and pod level."""
    with nri_mode(stack):
        assert stack.proxy.proc is not None and stack.proxy.proc.poll() is not None, "the proxy still runs"
        node = stack.cluster.get_json("node", NODE_NAME)
        assert node is not None
        assert node["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://2.1.")
        pods = _start_pods(stack, ns)
        assert [pods[n]["status"]["qosClass"] for n in ("lsr", "ls", "be")] == ["Guaranteed", "Burstable",
                                                                               "BestEffort"]  # fmt: skip
        _check_configured(pods)
        assert _cpus_allowed(stack, ns, "lsr") == LSR_CPU
        assert _files(pods["be"], {"cpuset.cpus": ""}) == {"cpuset.cpus": ALL_CPUS}


def _identity(stack: Stack, ns: str, name: str) -> tuple[str, str, int, str]:
    """(pod UID, container ID, restart count, phase) as the API shows them now."""
    pod = stack.cluster.get_json("pod", name, namespace=ns)
    assert pod is not None, f"pod {ns}/{name} is gone"
    (status,) = pod["status"]["containerStatuses"]
    return pod["metadata"]["uid"], container_id(pod), int(status["restartCount"]), pod["status"]["phase"]


def _runtime_sandboxes(stack: Stack, ns: str) -> dict[str, str]:
    """Pod name → sandbox ID, of the runtime's ready sandboxes of *ns* (asked of containerd)."""
    ready = [b for b in sandboxes(stack, ns) if b.state == api_pb2.SANDBOX_READY]
    return {b.metadata.name: b.id for b in ready}


def test_switching_a_live_node_between_proxy_and_nri_keeps_its_pods(stack: Stack, ns: str) -> None:
    """LSR, LS and BE pods started through the proxy keep running, with the same UIDs, container
    IDs, sandboxes and no restart, and keep their cgroup values, when the node moves to the NRI
    plugin and back; a pod started in each mode runs (kubelet works on the new endpoint)."""
    cluster = stack.cluster
    assert _kubelet_endpoint(stack) == f"unix://{stack.proxy_socket}"
    pods = _start_pods(stack, ns)
    _check_configured(pods)
    before = {name: _identity(stack, ns, name) for name in pods}
    assert all(identity[2:] == (0, "Running") for identity in before.values())
    boxes = _runtime_sandboxes(stack, ns)
    assert set(boxes) == set(pods)

    with nri_mode(stack):
        cluster.apply(pod_manifest("probe-nri", ns, node_name=NODE_NAME))
        cluster.wait_pod_running(ns, "probe-nri", timeout=SWITCH_TIMEOUT)
        assert {name: _identity(stack, ns, name) for name in pods} == before
        assert {k: v for k, v in _runtime_sandboxes(stack, ns).items() if k in pods} == boxes
        _check_configured(pods)
        assert _cpus_allowed(stack, ns, "lsr") == LSR_CPU

    cluster.apply(pod_manifest("probe-proxy", ns, node_name=NODE_NAME))
    cluster.wait_pod_running(ns, "probe-proxy", timeout=SWITCH_TIMEOUT)
    assert {name: _identity(stack, ns, name) for name in pods} == before
    assert {k: v for k, v in _runtime_sandboxes(stack, ns).items() if k in pods} == boxes
    _check_configured(pods)
    assert _cpus_allowed(stack, ns, "lsr") == LSR_CPU
