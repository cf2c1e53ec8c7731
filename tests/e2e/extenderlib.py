"""Helpers of the extender's end-to-end tests (``test_e2e_extender_*.py``): API-only nodes with a
NodeResourceTopology of our choosing (no kubelet: pods bound there never run, so CPU accounting
can be checked past this machine's 2 CPUs), raw API calls, events, and the extender's signature."""

from __future__ import annotations

import datetime
import http.client
import json
import secrets
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import pytest
from rhp_devenv.kube import Cluster

from koord_formats.topology import format_cpu_topology
from scheduler_ext.topology import synthetic_topology
from scheduler_ext.trust import SIGNATURE_ANNOTATION, SIGNED, Signer, Trust
from tests.e2e.conftest import Stack, pod_manifest, signing_key_path
from tests.integration import qos_helpers as q

API_ONLY_LABEL = "rhp-e2e/api-only"
STATUS = "scheduling.koordinator.sh/resource-status"
DEVICE_ALLOCATED = "scheduling.koordinator.sh/device-allocated"
RESERVATION_ALLOCATED = "scheduling.koordinator.sh/reservation-allocated"


def one_runtime(stack: Stack) -> None:
    """The extender's tests do not depend on the runtime: run them on containerd 2.1 only."""
    if stack.ctrd.binaries.version != "2.1":
        pytest.skip("the extender does not depend on the runtime: checked on the containerd-2.1 stack only")


def nrt_of(name: str, *, cores: int, threads: int = 2) -> dict[str, Any]:
    """A NodeResourceTopology with one socket, one NUMA node and ``cores x threads`` CPUs."""
    topo = synthetic_topology(1, 1, cores, threads)
    return {
        "apiVersion": "topology.node.k8s.io/v1alpha1",
        "kind": "NodeResourceTopology",
        "metadata": {"name": name, "annotations": {q.CPU_TOPOLOGY: format_cpu_topology(topo)}},
        "topologyPolicies": ["None"],
        "zones": [],
    }


@contextmanager
def api_only_node(cluster: Cluster, *, cores: int | None, threads: int = 2) -> Iterator[str]:
    """A Node object with no kubelet (64 CPUs allocatable to kube-scheduler) and, unless
    ``cores`` is None, its NodeResourceTopology; both deleted afterwards. Pods reach it with
    :func:`on_node` (a node selector and a toleration of every taint). A thread renews the
    node's Lease in ``kube-node-lease`` as kubelet would, so kube-controller-manager keeps it
    Ready and changes nothing on it: a Node change would requeue every pod the extender
    refused, which tests of requeueing must not depend on."""
    name = f"rhp-api-{secrets.token_hex(3)}"
    capacity = {"cpu": "64", "memory": "256Gi", "pods": "110"}
    cluster.kubectl("create", "-f", "-", input=json.dumps({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {API_ONLY_LABEL: name, "kubernetes.io/hostname": name}},
        "status": {"capacity": capacity, "allocatable": capacity,
                   "conditions": [{"type": "Ready", "status": "True", "reason": "ApiOnly", "message": "no kubelet"}]},
    }))  # fmt: skip
    stop = threading.Event()
    beat = threading.Thread(target=_heartbeat, args=(cluster, name, stop), name=f"lease-{name}", daemon=True)
    beat.start()
    try:
        if cores is not None:
            cluster.apply(nrt_of(name, cores=cores, threads=threads))
        yield name
    finally:
        stop.set()
        beat.join(30)
        api_call(cluster, "DELETE", f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{name}")
        cluster.kubectl("delete", "noderesourcetopology", name, "--ignore-not-found", "--wait=false", check=False)
        cluster.kubectl("delete", "node", name, "--ignore-not-found", "--wait=false", check=False)


def _heartbeat(cluster: Cluster, node: str, stop: threading.Event, every: float = 5.0) -> None:
    """Renew ``node``'s Lease every ``every`` seconds until ``stop`` (kubelet's heartbeat)."""
    path = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases"

    def now() -> str:
        return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")

    lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
             "metadata": {"name": node, "namespace": "kube-node-lease"},
             "spec": {"holderIdentity": node, "leaseDurationSeconds": 40, "renewTime": now()}}  # fmt: skip
    while not stop.is_set():
        try:
            status, _ = api_call(cluster, "PATCH", f"{path}/{node}", {"spec": {"renewTime": now()}},
                                 content_type="application/merge-patch+json")  # fmt: skip
            if status == 404:
                api_call(cluster, "POST", path, lease)
        except OSError:
            pass  # the next beat tries again
        stop.wait(every)


def on_node(manifest: dict[str, Any], node: str) -> dict[str, Any]:
    """``manifest`` scheduled only to the API-only ``node`` (and tolerating its taints)."""
    spec = manifest["spec"]
    spec["nodeSelector"] = {API_ONLY_LABEL: node}
    spec["tolerations"] = [{"operator": "Exists"}]
    return manifest


def lsr(name: str, ns: str, cpus: int, **kw: Any) -> dict[str, Any]:
    """An LSR pod of ``cpus`` whole CPUs (Guaranteed)."""
    res = {"cpu": str(cpus), "memory": "32Mi"}
    return pod_manifest(name, ns, qos="LSR", requests=res, limits=res, **kw)


def wait_bound(cluster: Cluster, ns: str, name: str, timeout: float = 90.0) -> dict[str, Any]:
    """Wait until the pod has a node; return it."""

    def bound() -> dict[str, Any] | None:
        pod = cluster.get_json("pod", name, namespace=ns)
        return pod if pod is not None and pod["spec"].get("nodeName") else None

    try:
        return cluster.wait_for(bound, what=f"pod {ns}/{name} bound", timeout=timeout, log="scheduler-ext")
    except Exception:
        print(cluster.kubectl("get", "events", "-n", ns, check=False).stdout)
        raise


def scheduling_events(cluster: Cluster, ns: str, name: str) -> list[dict[str, Any]]:
    """The FailedScheduling Events of the pod (events.k8s.io objects read through core/v1)."""
    out = cluster.kubectl("get", "events", "-n", ns, "--field-selector",
                          f"involvedObject.name={name},reason=FailedScheduling", "-o", "json").stdout  # fmt: skip
    items: list[dict[str, Any]] = json.loads(out).get("items", [])
    return items


def wait_event(cluster: Cluster, ns: str, name: str, text: str, timeout: float = 60.0) -> dict[str, Any]:
    """Wait for a FailedScheduling Event of the pod whose message contains ``text``."""

    def found() -> dict[str, Any] | None:
        return next((e for e in scheduling_events(cluster, ns, name) if text in e.get("message", "")), None)

    try:
        return cluster.wait_for(found, what=f"a FailedScheduling event of {ns}/{name} saying {text!r}",
                                timeout=timeout, log="scheduler-ext")  # fmt: skip
    except Exception as exc:
        seen = [e.get("message") for e in scheduling_events(cluster, ns, name)]
        pod = cluster.get_json("pod", name, namespace=ns)
        raise AssertionError(f"{exc}\nFailedScheduling messages: {seen}\npod: {json.dumps(pod)[:3000]}") from None


def annotations_of(pod: Mapping[str, Any]) -> dict[str, str]:
    return dict(pod["metadata"].get("annotations") or {})


def trust(cluster: Cluster) -> Trust:
    """The extender's signing key, as every replica of the stack reads it."""
    return Trust.of(Signer.from_pem(signing_key_path(cluster).read_bytes()), [])


def assert_signed_by_extender(cluster: Cluster, pod: Mapping[str, Any]) -> None:
    """The pod's owned annotations are exactly what a bind on its node wrote: the signature covers
    its UID, namespace, name, node and each owned annotation's value or absence."""
    ann = annotations_of(pod)
    assert SIGNATURE_ANNOTATION in ann, ann
    meta = pod["metadata"]
    verdict = trust(cluster).judge(meta["uid"], meta["namespace"], meta["name"], pod["spec"]["nodeName"], "", ann)
    assert verdict == SIGNED, f"the signature does not verify for {pod['spec']['nodeName']}: {ann}"


def api_call(
    cluster: Cluster, method: str, path: str, body: Any = None, *, content_type: str = "application/json"
) -> tuple[int, dict[str, Any]]:
    """One call to kube-apiserver as the admin user: (status, JSON body)."""
    port = int(cluster.server.rsplit(":", 1)[1])
    conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=30, context=cluster.admin_tls())
    try:
        data = json.dumps(body).encode() if body is not None else None
        conn.request(method, path, body=data, headers={"Content-Type": content_type, "Accept": "application/json"})
        resp = conn.getresponse()
        raw = resp.read()
        return resp.status, (json.loads(raw) if raw else {})
    finally:
        conn.close()


def seconds_since(start: float) -> float:
    return time.monotonic() - start
