"""Issue 28 item 3 on the real cluster: with load-aware scheduling configured (the extender's
``--config`` with a ``loadAware`` section), a NodeMetric whose status reports usage over the
threshold keeps a pod off the node: it stays Pending and kube-scheduler's FailedScheduling event
carries Koordinator's reason; once the report is below the threshold the pod is scheduled.

The session's extender runs without load-aware scheduling; this test starts its own
``scheduler-ext serve --config`` (plain HTTP on loopback) and points kube-scheduler at it, then
gives kube-scheduler the session's extender back. The NodeMetric status is written here (the
node agent's job). A NodeMetric change is no event kube-scheduler knows, so the test updates
the pending pod's annotations to have it retried (as the extender's topology requeue does).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from fractions import Fraction
from typing import Any

import pytest
from rhp_devenv.kube import NODE_NAME, Cluster, free_port

from koord_formats.quantity import parse_quantity
from tests.e2e.conftest import EXTENDER_USER, Stack, http_get, pod_manifest, signing_key_path
from tests.e2e.extenderlib import one_runtime, wait_bound, wait_event
from tests.integration.harness import REPO

NODEMETRIC_CRD = REPO / "packaging" / "crds" / "nodemetric.yaml"
EXTENDER = "scheduler-ext-loadaware"
REASON = "node(s) cpu usage exceed threshold"


def _rfc3339(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _report(cluster: Cluster, cpu_milli: int) -> None:
    """The node's NodeMetric status with node usage ``cpu_milli`` (written now)."""
    status = {"updateTime": _rfc3339(time.time()),
              "nodeMetric": {"nodeUsage": {"resources": {"cpu": f"{cpu_milli}m", "memory": "100Mi"}}}}
    cluster.kubectl("patch", "nodemetric", NODE_NAME, "--subresource=status", "--type=merge",
                    "-p", json.dumps({"status": status}))  # fmt: skip


def _allocatable_milli(cluster: Cluster) -> int:
    node = cluster.get_json("node", NODE_NAME)
    assert node is not None
    return int(parse_quantity(node["status"]["allocatable"]["cpu"]) * Fraction(1000))


@pytest.fixture
def load_aware(stack: Stack) -> Iterator[Cluster]:
    one_runtime(stack)
    cluster = stack.cluster
    cluster.apply(NODEMETRIC_CRD.read_text())
    cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd/nodemetrics.slo.koordinator.sh")
    cluster.kubectl("delete", "nodemetric", NODE_NAME, "--ignore-not-found")
    cluster.apply({"apiVersion": "slo.koordinator.sh/v1alpha1", "kind": "NodeMetric", "metadata": {"name": NODE_NAME},
                   "spec": {"metricCollectPolicy": {"reportIntervalSeconds": 60}}})  # fmt: skip
    config = cluster.work_dir / "scheduler-ext-loadaware.yaml"
    config.write_text("loadAware:\n  usageThresholds: {cpu: 65, memory: 95}\n")
    kubeconfig = cluster.kubeconfig_for("scheduler-ext", user=EXTENDER_USER, groups=("system:serviceaccounts",))
    port, health = free_port(), free_port()
    cluster.spawn(EXTENDER, [
        sys.executable, "-m", "scheduler_ext.entry", "serve", f"--listen=127.0.0.1:{port}",
        f"--health-listen=127.0.0.1:{health}", f"--kubeconfig={kubeconfig}", f"--config={config}",
        f"--signing-key-file={signing_key_path(cluster)}", "--no-ha-ledger", "--identity=scheduler-ext-loadaware",
        "--log-format=json",
    ], env={"PYTHONPATH": str(REPO)})  # fmt: skip
    session_extenders = [dict(e) for e in cluster.extenders]
    try:
        def ready() -> bool:
            cluster.check_alive(EXTENDER)
            try:
                return http_get(f"http://127.0.0.1:{health}/readyz")[0] == 200
            except OSError:
                return False

        cluster.wait_for(ready, what=f"{EXTENDER} /readyz", timeout=90, log=EXTENDER)
        ours = dict(session_extenders[0])
        ours.pop("tlsConfig", None)
        ours["urlPrefix"] = f"http://127.0.0.1:{port}"
        ours["enableHTTPS"] = False
        cluster.start_scheduler(extenders=[ours])
        yield cluster
    finally:
        cluster.start_scheduler(extenders=session_extenders)
        cluster.stop_process(EXTENDER)
        cluster.kubectl("delete", "nodemetric", NODE_NAME, "--ignore-not-found", check=False)


def test_usage_over_threshold_keeps_the_pod_off_and_below_it_schedules(load_aware: Cluster, ns: str) -> None:
    cluster = load_aware
    allocatable = _allocatable_milli(cluster)
    _report(cluster, allocatable * 90 // 100)  # 90% used: over the 65% threshold
    manifest = pod_manifest("loaded", ns, requests={"cpu": "10m", "memory": "16Mi"})
    cluster.apply(manifest)
    event = wait_event(cluster, ns, "loaded", REASON, timeout=90)
    assert REASON in event["message"]
    pod = cluster.get_json("pod", "loaded", namespace=ns)
    assert pod is not None and not pod["spec"].get("nodeName") and pod["status"]["phase"] == "Pending"

    _report(cluster, allocatable * 10 // 100)  # 10% used

    def retried_and_bound() -> dict[str, Any] | None:
        # a NodeMetric change is no event kube-scheduler knows: an update of the pod retries it
        cluster.kubectl("annotate", "pod", "loaded", "-n", ns, f"rhp-e2e/retry={time.monotonic_ns()}",
                        "--overwrite")  # fmt: skip
        got = cluster.get_json("pod", "loaded", namespace=ns)
        return got if got is not None and got["spec"].get("nodeName") else None

    cluster.wait_for(retried_and_bound, what="the pod scheduled once usage is below the threshold", timeout=120,
                     log=EXTENDER)  # fmt: skip
    bound = wait_bound(cluster, ns, "loaded")
    assert bound["spec"]["nodeName"] == NODE_NAME
