"""A smoke subset on the oldest Kubernetes the product supports (v1.34.4; the rest of tests/e2e
runs on the newest the harness builds, ``rhp_devenv.kube.KUBE_VERSION``): the same stack as the
``stack`` fixture (kubelet → ``runtime-proxy serve`` → containerd 2.1, kube-scheduler with
``scheduler-ext`` over mutual TLS) on v1.34.4's binaries. kubelet, kube-scheduler and the API
server all report v1.34.4, and two LSR pods created without a node are bound by the extender to
one CPU each, different ones, and run on exactly those CPUs.

It opens its own stack, so it runs before any session stack of the process (``FIRST_MODULES``
in conftest.py), once: the suite is not run again on the oldest version.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator

import pytest
from rhp_devenv.kube import NODE_NAME, OLDEST_KUBE_VERSION

from hooks.facts import format_cpu_list, parse_cpu_list
from runtime_proxy.state.sysfs import read_cpu_topology
from tests.e2e.conftest import Stack, container_id, namespace_in, open_stack, pod_cgroup, pod_manifest
from tests.integration import qos_helpers as q

TOPO = read_cpu_topology()
CONTAINERD = "2.1"


@pytest.fixture(scope="module")
def oldest() -> Iterator[Stack]:
    with open_stack(CONTAINERD, OLDEST_KUBE_VERSION) as stack:
        yield stack


def test_every_component_is_the_oldest_supported_version(oldest: Stack) -> None:
    """The node is Ready through the proxy; kubelet (its Node), the API server (its /version) and
    the multi-call binary kube-scheduler runs from are v1.34.4."""
    cluster = oldest.cluster
    node = cluster.get_json("node", NODE_NAME)
    assert node is not None
    assert {c["type"]: c["status"] for c in node["status"]["conditions"]}["Ready"] == "True"
    assert node["status"]["nodeInfo"]["kubeletVersion"] == OLDEST_KUBE_VERSION
    versions = json.loads(cluster.kubectl("version", "-o", "json").stdout)
    assert versions["serverVersion"]["gitVersion"] == OLDEST_KUBE_VERSION
    scheduler = subprocess.run([str(cluster.binary), "kube-scheduler", "--version"], capture_output=True,
                               text=True, timeout=60, check=True)  # fmt: skip
    assert scheduler.stdout.strip() == f"Kubernetes {OLDEST_KUBE_VERSION}"


def test_lsr_pods_run_on_the_distinct_cpus_the_extender_bound(oldest: Stack) -> None:
    """Two LSR pods of 1 CPU without a node: kube-scheduler v1.34.4 asks the extender, whose bind
    writes each pod's resource-status cpuset; kubelet v1.34.4 starts them through the proxy, and
    each container's cgroup and /proc hold exactly its cpuset, the two disjoint."""
    if len(TOPO.cpus) < 2:
        pytest.skip(f"needs 2+ CPUs; this machine has {format_cpu_list(TOPO.cpus)}")
    cluster = oldest.cluster
    with namespace_in(oldest) as ns:
        names = ("lsr-a", "lsr-b")
        for name in names:
            cluster.apply(pod_manifest(name, ns, qos="LSR", requests={"cpu": "1", "memory": "32Mi"},
                                       limits={"cpu": "1", "memory": "32Mi"}))  # fmt: skip
        bound: dict[str, frozenset[int]] = {}
        for name in names:
            pod = cluster.wait_pod_running(ns, name)
            assert pod["spec"]["nodeName"] == NODE_NAME
            cpus = frozenset(parse_cpu_list(json.loads(pod["metadata"]["annotations"][q.RESOURCE_STATUS])["cpuset"]))
            assert len(cpus) == 1 and cpus <= TOPO.cpus
            cpuset = format_cpu_list(cpus)
            assert q.read_container_file(pod_cgroup(pod), container_id(pod), "cpuset.cpus") == cpuset
            out = cluster.kubectl("exec", "-n", ns, name, "--", "cat", "/proc/1/status").stdout
            allowed = [line.split(":", 1)[1].strip() for line in out.splitlines()
                       if line.startswith("Cpus_allowed_list:")]  # fmt: skip
            assert allowed == [cpuset], name
            bound[name] = cpus
        assert not bound["lsr-a"] & bound["lsr-b"], bound
