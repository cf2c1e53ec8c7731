"""Issue 36's BE pod on the real cluster: it asks for ``kubernetes.io/batch-cpu: 500`` and
``batch-memory: 64Mi`` and must run with the quota, shares and memory limit they imply (50000,
512, 64 MiB), read back from the real cgroup files of its container and of its pod. Used by
``test_e2e_nodeslo.py`` (the CRI door, ``serve`` with ``fromCluster``) and
``test_e2e_colocation_defaults.py`` (the chart's NRI node agent, webhook off and on)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from rhp_devenv.kube import NODE_NAME, Cluster

from hooks.facts import milli_cpu_to_quota, milli_cpu_to_shares
from tests.e2e.conftest import container_id, pod_cgroup, pod_manifest
from tests.integration import qos_helpers as q

BATCH_CPU, BATCH_MEMORY = "kubernetes.io/batch-cpu", "kubernetes.io/batch-memory"
ISSUE_36_CPU = 500  # milli-cores
MEMORY = "64Mi"


def expected(milli_cpu: int = ISSUE_36_CPU) -> dict[str, str]:
    """What the batch requests imply (hooks/plugins/batch_resource.py, kubelet's conversions): 500
    milli-cores are a quota of 50000 us per 100000 us period and 500 x 1024 / 1000 = 512 shares;
    the memory limit is the batch-memory."""
    return {"cpu.cfs_quota_us": str(milli_cpu_to_quota(milli_cpu)), "cpu.shares": str(milli_cpu_to_shares(milli_cpu)),
            "memory.limit_in_bytes": str(64 << 20)}


def be_pod(name: str, namespace: str, *, milli_cpu: int = ISSUE_36_CPU, annotations: Mapping[str, str] | None = None,
           scheduler: str | None = None) -> dict[str, Any]:
    """A BE pod (label ``koordinator.sh/qosClass: BE``) whose one container asks for ``milli_cpu``
    of batch-cpu and 64Mi of batch-memory."""
    batch = {BATCH_CPU: str(milli_cpu), BATCH_MEMORY: MEMORY}
    pod = pod_manifest(name, namespace, qos="BE", annotations=annotations, requests=batch, limits=batch)
    if scheduler:
        pod["spec"]["schedulerName"] = scheduler
    return pod


def cgroup_values(pod: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    """The three files of the pod's container and of the pod itself."""
    parent, cid = pod_cgroup(pod), container_id(pod)
    files = ("cpu.cfs_quota_us", "cpu.shares", "memory.limit_in_bytes")
    return {"container": {f: q.read_container_file(parent, cid, f) for f in files},
            "pod": {f: q.read_pod_file(parent, f) for f in files}}


def wait_batch_limits(pod: Mapping[str, Any], *, milli_cpu: int = ISSUE_36_CPU, timeout: float = 90.0) -> None:
    """Poll the real cgroup files until the container and the pod have ``expected(milli_cpu)``
    (fails with the last values read: the old main left quota -1, shares 2 and no memory limit)."""
    want = expected(milli_cpu)
    q.wait_for(lambda: cgroup_values(pod), {"container": want, "pod": want},
               what="the BE pod's batch limits in its cgroups", timeout=timeout)


def publish_batch(cluster: Cluster, cpu: str = "1000", memory: str = "1Gi") -> None:
    """Batch resources in the Node's status, as the manager (or koord-manager) writes them."""
    values = {BATCH_CPU: cpu, BATCH_MEMORY: memory}
    cluster.kubectl("patch", "node", NODE_NAME, "--subresource=status", "--type=merge", "-p",
                    json.dumps({"status": {"capacity": values, "allocatable": values}}))


def unpublish_batch(cluster: Cluster) -> None:
    """Batch resources out of the Node's status again."""
    ops = [{"op": "remove", "path": f"/status/{part}/{name.replace('/', '~1')}"}
           for part in ("capacity", "allocatable") for name in (BATCH_CPU, BATCH_MEMORY)]
    cluster.kubectl("patch", "node", NODE_NAME, "--subresource=status", "--type=json", "-p", json.dumps(ops),
                    check=False)
