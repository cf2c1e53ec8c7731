"""The usage sampler on real containerd and runc, through the proxy: a pod created through the
proxy runs a container that holds 32 MiB of anonymous memory and burns CPU; the usage loop's
samples (real ``/proc``, the real cgroup tree) show that pod's and container's CPU and memory
(a plugin that is not built in handles ``ReconcileUsage``, so the loop reads containers too)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hooks.facts import NodeFacts, PodFacts
from hooks.plan import Plan
from hooks.spec import hookimpl
from hooks.usage import ResourceUsage, Usage
from runtime_proxy.config import ProxyConfig
from tests.integration.harness import ProxyThread, proxy_options

# What this checks does not depend on the containerd version.
pytestmark = [pytest.mark.integration, pytest.mark.one_containerd]

MiB = 1 << 20
HOLD = 32  # MiB the container holds
# busybox awk: a string of HOLD MiB (anonymous memory), then a busy loop.
COMMAND = ["awk", f'BEGIN{{s=sprintf("%{HOLD * MiB}s", ""); while (1) {{ n++ }}}}']


class ReadsContainerUsage:
    """A ``ReconcileUsage`` plugin that is not built in: the loop cannot know it leaves
    container usage alone, so it reads every container's files for it."""

    @hookimpl
    def rhp_reconcile_usage(self, node: NodeFacts, pods: tuple[PodFacts, ...], usage: Usage) -> Plan | None:
        return None


def test_the_usage_loop_samples_a_real_containers_cpu_and_memory(
    containerd: Any, tmp_path: Path, cri_client: Callable[..., Any]
) -> None:
    config = ProxyConfig.model_validate({"usageLoop": {"enable": True, "intervalSeconds": 0.3}})
    opts = proxy_options(containerd, tmp_path, "relay", reconcile=True, config=config,
                         extra_plugins=(ReadsContainerUsage(),))
    with ProxyThread(opts) as proxy:
        client = cri_client(opts.listen)
        uid = str(uuid.uuid4())
        pod = client.run_pod(cgroup_parent=containerd.new_cgroup_parent("burstable", uid=uid), uid=uid,
                             name="sampled", labels={"koordinator.sh/qosClass": "LS"})
        cid = client.run_container(pod, name="burn", command=COMMAND)
        assert proxy.proxy is not None and proxy.proxy.reconciler is not None
        loop = proxy.proxy.reconciler.usage
        assert loop is not None

        def sampled() -> tuple[ResourceUsage, ResourceUsage] | None:
            last = loop.last_round
            if last is None or last.sample is None:
                return None
            p, c = last.sample.pods.get(uid), last.sample.containers.get(cid)
            if p is None or c is None or c.cpu_milli < 50:
                return None
            # The pod's cgroup is read just before its container's, so while awk is still
            # building its string the pod can trail the container by what it allocated in
            # between: wait until both show the whole hold.
            if min(p.memory_bytes, c.memory_bytes) < HOLD * MiB * 0.9:
                return None
            return p, c

        deadline = time.monotonic() + 30
        got = sampled()
        while got is None:
            assert time.monotonic() < deadline, f"no sample shows the container: {loop.last_round}"
            time.sleep(0.1)
            got = sampled()
        pod_usage, container_usage = got
        # Pages may still move between the two reads; the pod holds its container within 3 %.
        assert pod_usage.memory_bytes >= container_usage.memory_bytes * 0.97, "the pod holds its container"
        assert pod_usage.cpu_milli >= 50
        assert container_usage.cpu_milli <= 1000 * 64
        last = loop.last_round
        assert last is not None and last.sample is not None
        assert last.sample.node_cpu_milli > 0
        assert 0 < last.sample.node_memory_used_bytes < last.sample.node_memory_total_bytes
