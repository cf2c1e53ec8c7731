"""The real kube-scheduler with ``scheduler-ext`` (packaging/scheduler's configuration, mutual
TLS with harness-made certificates, packaging/scheduler/rbac.yaml's ServiceAccount identity) in
front of the real API server, and kubelet → ``runtime-proxy serve`` → containerd behind it:
scheduler to cgroup in one test."""

from __future__ import annotations

import json

from rhp_devenv.kube import NODE_NAME

from hooks.facts import format_cpu_list, parse_cpu_list
from runtime_proxy.state.sysfs import read_cpu_topology
from tests.e2e.conftest import Stack, container_id, pod_cgroup, pod_manifest
from tests.integration import qos_helpers as q

TOPO = read_cpu_topology()


def test_lsr_pod_runs_on_the_cpus_the_extender_bound(stack: Stack, ns: str) -> None:
    """An LSR pod of 1 CPU without a node: kube-scheduler asks the extender, whose bind writes
    the resource-status cpuset and binds the pod to 127.0.0.1; kubelet starts it through the
    proxy, and the container's cgroup and its /proc hold exactly that cpuset."""
    cluster = stack.cluster
    cluster.apply(pod_manifest("lsr", ns, qos="LSR", requests={"cpu": "1", "memory": "32Mi"},
                               limits={"cpu": "1", "memory": "32Mi"}))  # fmt: skip
    pod = cluster.wait_pod_running(ns, "lsr")
    assert pod["spec"]["nodeName"] == NODE_NAME
    status = json.loads(pod["metadata"]["annotations"][q.RESOURCE_STATUS])
    bound = parse_cpu_list(status["cpuset"])
    assert len(bound) == 1 and bound <= TOPO.cpus
    cpuset = format_cpu_list(bound)
    assert q.read_container_file(pod_cgroup(pod), container_id(pod), "cpuset.cpus") == cpuset
    out = cluster.kubectl("exec", "-n", ns, "lsr", "--", "cat", "/proc/1/status").stdout
    allowed = [line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Cpus_allowed_list:")]
    assert allowed == [cpuset]
