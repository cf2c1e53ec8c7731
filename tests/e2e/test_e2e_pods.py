"""kubelet → ``runtime-proxy serve`` → containerd (2.1 and 1.7) in a real one-node cluster: the
node is Ready through the proxy, LSR, LS and BE pods created through the API run, and their real
cgroup files (and ``/proc`` inside the container) show what the proxy's plugins decided;
``kubectl logs``, ``exec``, ``attach`` and ``port-forward`` work through the proxy.

The machine has CPUs 0-1 on NUMA node 0: the LSR pod is bound to the highest CPU, so the LS share
pool is the others. The LSR pod carries the resource-status cpuset as the extender writes it and
is placed with ``nodeName`` (kube-scheduler would have the extender bind it anew); the LS and BE
pods go through kube-scheduler and the extender. BE pods request ``kubernetes.io/batch-cpu`` and
``batch-memory``, which koord-manager publishes on the Node; the test publishes them itself.
"""

from __future__ import annotations

import json
import subprocess
import threading
from typing import Any

import pytest
from rhp_devenv.kube import KUBE_VERSION, NODE_NAME, free_port

from cri_protos import api_pb2
from hooks.facts import format_cpu_list
from runtime_proxy.state.sysfs import read_cpu_topology
from tests.e2e.conftest import Stack, container_id, http_get, pod_cgroup, pod_manifest, sandboxes
from tests.integration import qos_helpers as q

TOPO = read_cpu_topology()
ALL_CPUS = format_cpu_list(TOPO.cpus)
LSR_CPU = str(max(TOPO.cpus))
LS_POOL_WITH_LSR = format_cpu_list(TOPO.cpus - {max(TOPO.cpus)})
MiB = 1024**2


@pytest.fixture(autouse=True)
def _two_cpus_one_numa_node() -> None:
    if len(TOPO.cpus) < 2 or TOPO.numa_nodes != (0,):
        pytest.skip(f"needs 2+ CPUs on one NUMA node 0; this machine has {ALL_CPUS} on {TOPO.numa_nodes}")


def test_the_node_is_ready_through_the_proxy(stack: Stack) -> None:
    """kubelet registered node 127.0.0.1 (InternalIP 127.0.0.1) and reports the containerd
    version, which it asked through the proxy's socket."""

    def ready() -> dict[str, Any] | None:  # an earlier module may have just restarted kubelet
        node = stack.cluster.get_json("node", NODE_NAME)
        if node is None:
            return None
        conditions = {c["type"]: c["status"] for c in node["status"]["conditions"]}
        return node if conditions.get("Ready") == "True" else None

    node = stack.cluster.wait_for(ready, what=f"node {NODE_NAME} Ready", timeout=180)
    assert {"type": "InternalIP", "address": "127.0.0.1"} in node["status"]["addresses"]
    info = node["status"]["nodeInfo"]
    assert info["kubeletVersion"] == KUBE_VERSION
    assert info["containerRuntimeVersion"].startswith(f"containerd://{stack.ctrd.version}.")
    config = json.loads((stack.cluster.work_dir / "kubelet-config.json").read_text())
    assert config["containerRuntimeEndpoint"] == f"unix://{stack.proxy_socket}"


def _cgroup(pod: dict[str, object], file: str) -> str:
    return q.read_container_file(pod_cgroup(pod), container_id(pod), file)


def _pod_file(pod: dict[str, object], file: str) -> str:
    return q.read_pod_file(pod_cgroup(pod), file)


def test_lsr_ls_and_be_pods_get_what_the_plugins_decide(stack: Stack, ns: str) -> None:
    """LSR: bound to its resource-status cpuset, CFS quota lifted at container and pod level.
    LS: the share pool without the LSR CPU, kubelet's quota. BE: batch-cpu and batch-memory
    become cpu.shares, the CFS quota and the memory limit at container and pod level."""
    cluster = stack.cluster
    lsr = pod_manifest(
        "lsr", ns, qos="LSR", node_name=NODE_NAME,
        annotations={q.RESOURCE_STATUS: q.resource_status(LSR_CPU)},
        requests={"cpu": "1", "memory": "64Mi"}, limits={"cpu": "1", "memory": "64Mi"},
    )  # fmt: skip
    cluster.apply(lsr)
    lsr_pod = cluster.wait_pod_running(ns, "lsr")
    assert lsr_pod["status"]["qosClass"] == "Guaranteed"
    assert _cgroup(lsr_pod, "cpuset.cpus") == LSR_CPU
    assert _cgroup(lsr_pod, "cpu.cfs_quota_us") == "-1"
    assert _pod_file(lsr_pod, "cpu.cfs_quota_us") == "-1"
    assert _cgroup(lsr_pod, "memory.limit_in_bytes") == str(64 * MiB)

    ls = pod_manifest("ls", ns, qos="LS", requests={"cpu": "100m", "memory": "32Mi"}, limits={"cpu": "1"})
    cluster.apply(ls)
    ls_pod = cluster.wait_pod_running(ns, "ls")
    assert ls_pod["spec"]["nodeName"] == NODE_NAME
    assert ls_pod["status"]["qosClass"] == "Burstable"
    q.wait_for(lambda: _cgroup(ls_pod, "cpuset.cpus"), LS_POOL_WITH_LSR, what="LS container cpuset")
    assert _cgroup(ls_pod, "cpu.cfs_quota_us") == "100000"

    # koord-manager publishes batch resources on the Node; kubelet keeps them in its status.
    batch = {"kubernetes.io/batch-cpu": "1000", "kubernetes.io/batch-memory": "1Gi"}
    cluster.kubectl("patch", "node", NODE_NAME, "--subresource=status", "--type=merge",
                    "-p", json.dumps({"status": {"capacity": batch, "allocatable": batch}}))  # fmt: skip
    be_resources = {"kubernetes.io/batch-cpu": "500", "kubernetes.io/batch-memory": "128Mi"}
    spec = q.extended_resource_spec({"app": {"requests": be_resources, "limits": be_resources}})
    be = pod_manifest("be", ns, qos="BE", annotations={q.EXTENDED_RESOURCE_SPEC: spec},
                      requests=be_resources, limits=be_resources)  # fmt: skip
    cluster.apply(be)
    be_pod = cluster.wait_pod_running(ns, "be")
    assert be_pod["status"]["qosClass"] == "BestEffort"
    expect = {"cpu.shares": "512", "cpu.cfs_quota_us": "50000", "memory.limit_in_bytes": str(128 * MiB)}
    assert {f: _cgroup(be_pod, f) for f in expect} == expect
    assert {f: _pod_file(be_pod, f) for f in expect} == expect
    assert _cgroup(be_pod, "cpuset.cpus") == ALL_CPUS


def test_logs_and_exec_through_the_proxy(stack: Stack, ns: str) -> None:
    """``kubectl logs`` reads what the container printed; ``kubectl exec`` runs in the container
    (its /proc shows the LSR CPU it is bound to) through the proxy's Exec."""
    cluster = stack.cluster
    pod = pod_manifest(
        "talk", ns, qos="LSR", node_name=NODE_NAME,
        annotations={q.RESOURCE_STATUS: q.resource_status(LSR_CPU)},
        requests={"cpu": "1", "memory": "32Mi"}, limits={"cpu": "1", "memory": "32Mi"},
        command=("sh", "-c", "echo hello from e2e; exec sleep 3600"),
    )  # fmt: skip
    cluster.apply(pod)
    cluster.wait_pod_running(ns, "talk")
    cluster.wait_for(lambda: "hello from e2e" in cluster.kubectl("logs", "-n", ns, "talk").stdout,
                     what="the container's output in kubectl logs")  # fmt: skip
    out = cluster.kubectl("exec", "-n", ns, "talk", "--", "sh", "-c", "echo $((6 * 7)); cat /proc/1/status").stdout
    lines = out.splitlines()
    assert lines[0] == "42"
    allowed = [line.split(":", 1)[1].strip() for line in lines if line.startswith("Cpus_allowed_list:")]
    assert allowed == [LSR_CPU]
    failed = cluster.kubectl("exec", "-n", ns, "talk", "--", "sh", "-c", "exit 3", check=False)
    assert failed.returncode == 3


def test_attach_through_the_proxy(stack: Stack, ns: str) -> None:
    """``kubectl attach -i`` sends stdin to the running container and shows what it prints
    (Attach goes through the proxy; the stream through containerd's server on 127.0.0.1)."""
    cluster = stack.cluster
    pod = pod_manifest("echo", ns, command=("sh", "-c", "while read line; do echo got:$line; done"))
    pod["spec"]["containers"][0].update({"stdin": True, "stdinOnce": True})
    pod["spec"]["restartPolicy"] = "Never"
    cluster.apply(pod)
    cluster.wait_pod_running(ns, "echo")
    out = cluster.kubectl("attach", "-i", "-n", ns, "echo", "-c", "app", input="hello\nworld\n").stdout
    assert "got:hello" in out and "got:world" in out


def test_port_forward_through_the_proxy(stack: Stack, ns: str) -> None:
    """``kubectl port-forward`` to a host-network pod's port on 127.0.0.1: an HTTP request to
    the forwarded local port reaches busybox httpd in the container (PortForward goes through
    the proxy)."""
    cluster = stack.cluster
    port = free_port()
    script = ("mkdir -p /tmp/www && echo served-by-e2e > /tmp/www/index.html && "
              f"exec httpd -f -p 127.0.0.1:{port} -h /tmp/www")  # fmt: skip
    cluster.apply(pod_manifest("web", ns, command=("sh", "-c", script)))
    cluster.wait_pod_running(ns, "web")
    forward = subprocess.Popen(
        cluster.kubectl_command("port-forward", "-n", ns, "pod/web", f":{port}", "--address=127.0.0.1"),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
        env=cluster.kubectl_env(),
    )  # fmt: skip
    try:
        lines: list[str] = []
        output = forward.stdout
        assert output is not None

        def read() -> None:
            for line in output:
                lines.append(line)

        threading.Thread(target=read, daemon=True).start()

        def local_port() -> int | None:
            for line in list(lines):
                if line.startswith("Forwarding from 127.0.0.1:"):
                    return int(line.split("127.0.0.1:", 1)[1].split()[0])
            assert forward.poll() is None, f"kubectl port-forward exited: {lines}"
            return None

        local = cluster.wait_for(local_port, what="kubectl port-forward to listen")
        status, body = http_get(f"http://127.0.0.1:{local}/index.html")
        assert (status, body.strip()) == (200, b"served-by-e2e")
    finally:
        forward.terminate()
        forward.wait(timeout=10)


def test_an_lsr_pod_gets_the_cpus_of_a_deleted_lsr_pod_once_that_pod_stopped(stack: Stack, ns: str) -> None:
    """The scheduler gives CPU 1 to a new LSR pod right after the LSR pod that held it was
    deleted. Once kubelet has stopped the old pod's sandbox (its containers are dead), the new
    pod is bound to CPU 1 when it starts, though the stopped sandbox is not removed yet (kubelet's
    garbage collection removes it within a minute; if it did before the check, the test has
    nothing to show and skips)."""
    cluster = stack.cluster

    def lsr(name: str) -> dict[str, object]:
        return pod_manifest(name, ns, qos="LSR", node_name=NODE_NAME,
                            annotations={q.RESOURCE_STATUS: q.resource_status(LSR_CPU)},
                            requests={"cpu": "1", "memory": "32Mi"}, limits={"cpu": "1", "memory": "32Mi"})  # fmt: skip

    cluster.apply(lsr("old"))
    old = cluster.wait_pod_running(ns, "old")
    assert _cgroup(old, "cpuset.cpus") == LSR_CPU
    cluster.kubectl("delete", "pod", "old", "-n", ns, "--grace-period=0", "--force")
    cluster.wait_for(lambda: all(b.state == api_pb2.SANDBOX_NOTREADY for b in sandboxes(stack, ns)),
                     what="kubelet stopped the old pod's sandbox")  # fmt: skip
    cluster.apply(lsr("new"))
    new = cluster.wait_pod_running(ns, "new")
    cpus = _cgroup(new, "cpuset.cpus")
    if not [b for b in sandboxes(stack, ns) if b.metadata.name == "old"]:
        pytest.skip("kubelet's garbage collection removed the old sandbox before the check")
    assert cpus == LSR_CPU
