"""What happened to my pod (issue 27 item 5): a hook that fails under ``Ignore`` when a pod is
created leaves the pod running and records a ``RuntimeHookFailed`` Event on it, read back from
the real API server. The proxy runs with ``fromCluster: true`` as the node's ServiceAccount under
packaging/kustomize/base/node/rbac.yaml (which the chart's node role mirrors), so the test also
shows that the packaged RBAC lets the node record Events. Checked on containerd 2.1 only: nothing
here depends on the runtime.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from rhp_devenv.kube import NODE_NAME

from tests.e2e.conftest import REPO, Stack, pod_manifest
from tests.e2e.failing_plugin import LABEL

NODE_RBAC = REPO / "packaging" / "kustomize" / "base" / "node" / "rbac.yaml"
NODESLO_CRD = REPO / "packaging" / "crds" / "nodeslo.yaml"
NODE_USER = "system:serviceaccount:kube-system:runtime-hook-proxy-node"
PLUGIN = "tests.e2e.failing_plugin"


@pytest.fixture(scope="module")
def failing(stack: Stack) -> Iterator[Stack]:
    """The proxy restarted with the failing plugin under ``Ignore`` and cluster credentials."""
    if stack.ctrd.version != "2.1":
        pytest.skip("Events do not depend on the runtime: checked on containerd 2.1")
    cluster = stack.cluster
    cluster.apply(NODESLO_CRD.read_text(), NODE_RBAC.read_text())
    groups = ("system:serviceaccounts", "system:serviceaccounts:kube-system")
    kubeconfig = cluster.kubeconfig_for("runtime-hook-proxy-node", user=NODE_USER, groups=groups)
    hooks = stack.work / "hookserver-events.d"
    hooks.mkdir(exist_ok=True)
    config = {
        "plugins": [{"name": "cpuset"}, {"name": PLUGIN, "policy": "Ignore"}],
        "pluginModules": [PLUGIN],
        "fromCluster": True,
        "nodeName": NODE_NAME,
        "hookServerDir": str(hooks),
        "cgroupDriver": "cgroupfs",
    }
    stack.restart_proxy_with_config(config, "events", env={"KUBECONFIG": str(kubeconfig)})
    try:
        yield stack
    finally:
        stack.restart_proxy()


def _events(stack: Stack, ns: str, pod: str) -> list[dict[str, Any]]:
    out = stack.cluster.kubectl("get", "events", "-n", ns, "-o", "json",
                                f"--field-selector=involvedObject.name={pod},reason=RuntimeHookFailed").stdout
    items: list[dict[str, Any]] = json.loads(out)["items"]
    return items


def test_a_hook_that_fails_under_ignore_leaves_an_event_on_the_pod(failing: Stack, ns: str) -> None:
    cluster = failing.cluster
    manifest = pod_manifest("victim", ns, node_name=NODE_NAME)
    manifest["metadata"]["labels"][LABEL] = "true"
    cluster.apply(manifest)
    cluster.wait_pod_running(ns, "victim")  # Ignore: the pod runs without the hook
    pod = cluster.get_json("pod", "victim", namespace=ns)
    assert pod is not None
    found: list[dict[str, Any]] = []

    def recorded() -> bool:
        found[:] = _events(failing, ns, "victim")
        return bool(found)

    cluster.wait_for(recorded, what="a RuntimeHookFailed Event on the pod", timeout=60)
    event = found[0]
    assert event["involvedObject"]["kind"] == "Pod"
    assert event["involvedObject"]["uid"] == pod["metadata"]["uid"]
    assert event["type"] == "Warning" and event["count"] >= 1
    assert event["source"] == {"component": "runtime-hook-proxy", "host": NODE_NAME}
    assert event["reportingComponent"] == "runtime-hook-proxy"
    assert PLUGIN in event["message"] and "fails for" in event["message"] and "container app" in event["message"]


def test_repeats_on_the_same_pod_count_up_one_event(failing: Stack, ns: str) -> None:
    """A container that keeps exiting is created again and again: its hook fails each time, and
    the one Event's count grows (the recorder patches it) instead of a new Event per failure."""
    cluster = failing.cluster
    manifest = pod_manifest("crashing", ns, node_name=NODE_NAME, command=("sh", "-c", "exit 1"))
    manifest["metadata"]["labels"][LABEL] = "true"
    cluster.apply(manifest)
    found: list[dict[str, Any]] = []

    def counted() -> bool:
        found[:] = _events(failing, ns, "crashing")
        return any(int(event.get("count") or 0) >= 2 for event in found)

    cluster.wait_for(counted, what="the pod's RuntimeHookFailed Event counted twice", timeout=120)
    assert len(found) == 1, [event["metadata"]["name"] for event in found]
