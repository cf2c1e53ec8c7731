"""Pods outlive their node agents: kubelet restarted, ``runtime-proxy serve`` killed with SIGKILL
and started again, and ``runtime-proxy kubelet-switch`` moving the live kubelet to containerd and
back leave every pod running (same containers, no restarts) with the cgroup values the plugins
gave them, and the node keeps working: a pod created afterwards is configured like the first
ones."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest
from rhp_devenv.kube import NODE_NAME

from hooks.facts import format_cpu_list
from runtime_proxy.state.sysfs import read_cpu_topology
from tests.e2e.conftest import Stack, container_id, pod_cgroup, pod_manifest
from tests.integration import qos_helpers as q
from tests.integration.harness import REPO

TOPO = read_cpu_topology()
LSR_CPU = str(max(TOPO.cpus))
LS_POOL_WITH_LSR = format_cpu_list(TOPO.cpus - {max(TOPO.cpus)})


@pytest.fixture(autouse=True)
def _two_cpus_one_numa_node() -> None:
    if len(TOPO.cpus) < 2 or TOPO.numa_nodes != (0,):
        pytest.skip(f"needs 2+ CPUs on one NUMA node 0; this machine has {TOPO.cpus} on {TOPO.numa_nodes}")


def _state(stack: Stack, ns: str, name: str) -> tuple[str, int, str, str]:
    """(container id, restart count, phase, cpuset.cpus of the container's cgroup)."""
    pod = stack.cluster.get_json("pod", name, namespace=ns)
    assert pod is not None
    (status,) = pod["status"]["containerStatuses"]
    cid = container_id(pod)
    cpus = q.read_container_file(pod_cgroup(pod), cid, "cpuset.cpus")
    return cid, status["restartCount"], pod["status"]["phase"], cpus


def _pods(stack: Stack, ns: str) -> dict[str, Any]:
    cluster = stack.cluster
    cluster.apply(pod_manifest(
        "lsr", ns, qos="LSR", node_name=NODE_NAME, annotations={q.RESOURCE_STATUS: q.resource_status(LSR_CPU)},
        requests={"cpu": "1", "memory": "32Mi"}, limits={"cpu": "1", "memory": "32Mi"},
    ))  # fmt: skip
    cluster.wait_pod_running(ns, "lsr")
    cluster.apply(pod_manifest("ls", ns, qos="LS", requests={"cpu": "100m"}, limits={"cpu": "1"}))
    cluster.wait_pod_running(ns, "ls")
    q.wait_for(lambda: _state(stack, ns, "ls")[3], LS_POOL_WITH_LSR, what="LS cpuset")
    return {name: _state(stack, ns, name) for name in ("lsr", "ls")}


def _still_running_and_configured(stack: Stack, ns: str, before: dict[str, Any]) -> None:
    after = {name: _state(stack, ns, name) for name in before}
    assert after == before
    assert before["lsr"][1:] == (0, "Running", LSR_CPU)
    assert before["ls"][1:] == (0, "Running", LS_POOL_WITH_LSR)
    lsr = stack.cluster.get_json("pod", "lsr", namespace=ns)
    assert lsr is not None
    assert q.read_container_file(pod_cgroup(lsr), container_id(lsr), "cpu.cfs_quota_us") == "-1"


def _a_new_pod_is_configured(stack: Stack, ns: str) -> None:
    stack.cluster.apply(pod_manifest("ls2", ns, qos="LS", requests={"cpu": "100m"}, limits={"cpu": "1"}))
    stack.cluster.wait_pod_running(ns, "ls2")
    q.wait_for(lambda: _state(stack, ns, "ls2")[3], LS_POOL_WITH_LSR, what="the new LS pod's cpuset")


def test_pods_survive_a_kubelet_restart(stack: Stack, ns: str) -> None:
    before = _pods(stack, ns)
    stack.cluster.restart_kubelet()
    _still_running_and_configured(stack, ns, before)
    _a_new_pod_is_configured(stack, ns)
    assert stack.cluster.kubectl("exec", "-n", ns, "lsr", "--", "echo", "ok").stdout.strip() == "ok"


def test_pods_survive_the_proxy_killed_and_started_again(stack: Stack, ns: str) -> None:
    before = _pods(stack, ns)
    stack.restart_proxy(kill9=True)
    _still_running_and_configured(stack, ns, before)
    _a_new_pod_is_configured(stack, ns)
    assert stack.cluster.kubectl("exec", "-n", ns, "lsr", "--", "echo", "ok").stdout.strip() == "ok"
    node = stack.cluster.get_json("node", NODE_NAME)
    assert node is not None
    assert {c["type"]: c["status"] for c in node["status"]["conditions"]}["Ready"] == "True"


def _kubelet_switch(stack: Stack, *args: str) -> subprocess.CompletedProcess[str]:
    """``runtime-proxy kubelet-switch --kubelet-config <kubelet's file> --no-restart ARGS...``
    (the test restarts kubelet itself: it is this process's child, not a systemd unit)."""
    return subprocess.run(
        [sys.executable, "-m", "runtime_proxy.cli", "kubelet-switch", "--kubelet-config",
         str(stack.cluster.kubelet_config_path), "--no-restart", *args],
        capture_output=True, text=True, timeout=120, check=False, stdin=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip


def _endpoint(stack: Stack) -> str:
    return str(json.loads(stack.cluster.kubelet_config_path.read_text())["containerRuntimeEndpoint"])


def test_kubelet_switch_moves_a_live_kubelet_to_containerd_and_back(stack: Stack, ns: str) -> None:
    """``runtime-proxy kubelet-switch --to containerd`` edits the live kubelet's config to name
    containerd's socket; after the restart the pods run on, and a new pod starts without the
    plugins (its cpuset is kubelet's, the whole machine). ``--to proxy`` passes doctor and the
    proxy's /readyz, names the proxy again; after the restart the pods still run and a new pod
    gets the plugins' cpuset again."""
    cluster = stack.cluster
    before = _pods(stack, ns)
    try:
        done = _kubelet_switch(stack, "--to", "containerd", f"--containerd-endpoint=unix://{stack.ctrd.socket}")
        assert done.returncode == 0, done.stdout + done.stderr
        assert _endpoint(stack) == f"unix://{stack.ctrd.socket}"
        cluster.restart_kubelet()
        _still_running_and_configured(stack, ns, before)
        cluster.apply(pod_manifest("direct", ns, qos="LS", requests={"cpu": "100m"}, limits={"cpu": "1"}))
        cluster.wait_pod_running(ns, "direct")
        assert _state(stack, ns, "direct")[3] == format_cpu_list(TOPO.cpus)

        done = _kubelet_switch(
            stack, "--to", "proxy", f"--proxy-endpoint=unix://{stack.proxy_socket}", f"--readyz={stack.proxy_readyz}",
            f"--listen={stack.proxy_socket}", f"--backend={stack.ctrd.socket}",
            "--config", stack.proxy_args[stack.proxy_args.index("--config") + 1],
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        assert _endpoint(stack) == f"unix://{stack.proxy_socket}"
        cluster.restart_kubelet()
        _still_running_and_configured(stack, ns, before)
        _a_new_pod_is_configured(stack, ns)
    finally:
        if _endpoint(stack) != f"unix://{stack.proxy_socket}":  # leave the session's kubelet on the proxy
            cluster.cri_socket = stack.proxy_socket
            cluster.restart_kubelet(rewrite_config=True)
