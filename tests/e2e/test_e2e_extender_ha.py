"""Issue 23 item 3 on the real API server: two ``scheduler-ext`` replicas sharing the HA ledger
(one Lease per node) never give a CPU twice, also while one replica's pod watch is frozen.

The replicas are driven over HTTP as kube-scheduler drives an extender (``/filter`` then
``/bind`` of each pod), not through kube-scheduler: only one extender of a scheduler may bind, so
two binding replicas under kube-scheduler would need two schedulers splitting the pods by
``schedulerName``, and the test could not choose which replica binds which pod, nor bind through
a replica at the moment its watch is frozen. The pods name a scheduler that does not run, so
nothing else binds them.

Replica A talks to kube-apiserver directly; replica B through :class:`tests.e2e.apiproxy.ApiProxy`,
which freezes B's cluster-wide pod list and watch (a half-open stream: no bytes, no end) while
its binds, pod reads and Lease calls pass. Both run with a short watch timeout (5 s), idle timeout
(8 s, so stale after 23 s) and the shortest ledger TTL ``serve`` accepts with it (38 s).
"""

from __future__ import annotations

import http.client
import json
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from rhp_devenv.kube import Cluster, free_port

from hooks.facts import parse_cpu_list
from tests.e2e.apiproxy import ApiProxy
from tests.e2e.conftest import EXTENDER_USER, Stack, http_get, signing_key_path
from tests.e2e.extenderlib import STATUS, annotations_of, api_only_node, assert_signed_by_extender, lsr, one_runtime
from tests.integration.harness import REPO

WATCH_TIMEOUT, IDLE_TIMEOUT, LEDGER_TTL = 5, 8.0, 38.0
SCHEDULER = "rhp-e2e-nobody"


@pytest.fixture(autouse=True)
def _containerd_21_only(stack: Stack) -> None:
    one_runtime(stack)


@dataclass
class Replica:
    name: str
    url: str
    health: str

    def post(self, verb: str, body: dict[str, Any]) -> Any:
        port = int(self.url.rsplit(":", 1)[1])
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        try:
            conn.request("POST", f"/{verb}", body=json.dumps(body), headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            data = resp.read()
            assert resp.status == 200, f"{self.name} /{verb}: {resp.status} {data[:300]!r}"
            return json.loads(data)
        finally:
            conn.close()

    def readyz(self) -> tuple[int, str]:
        try:
            status, body = http_get(f"{self.health}/readyz")
        except OSError as exc:
            return 0, str(exc)
        return status, body.decode(errors="replace")


def _spawn(cluster: Cluster, name: str, api: list[str]) -> Replica:
    port, health = free_port(), free_port()
    cluster.spawn(name, [
        sys.executable, "-m", "scheduler_ext.entry", "serve", f"--listen=127.0.0.1:{port}",
        f"--health-listen=127.0.0.1:{health}", *api, "--ledger-namespace=kube-system", f"--identity={name}",
        f"--signing-key-file={signing_key_path(cluster)}", f"--watch-timeout={WATCH_TIMEOUT}",
        f"--watch-idle-timeout={IDLE_TIMEOUT}", f"--ledger-ttl={LEDGER_TTL}", "--log-format=json",
    ], env={"PYTHONPATH": str(REPO)})  # fmt: skip
    return Replica(name, f"http://127.0.0.1:{port}", f"http://127.0.0.1:{health}")


@pytest.fixture
def replicas(stack: Stack) -> Iterator[tuple[Replica, Replica, ApiProxy]]:
    cluster = stack.cluster
    kubeconfig = cluster.kubeconfig_for("scheduler-ext", user=EXTENDER_USER, groups=("system:serviceaccounts",))
    assert cluster.ca is not None and cluster.pki is not None
    pki = cluster.pki.directory
    proxy = ApiProxy(cluster.server, cluster.ca.cert, pki / "scheduler-ext.crt", pki / "scheduler-ext.key").start()
    a = _spawn(cluster, "scheduler-ext-ha-a", [f"--kubeconfig={kubeconfig}"])
    b = _spawn(cluster, "scheduler-ext-ha-b", [f"--api-server={proxy.url}"])
    try:
        for r in (a, b):
            cluster.wait_for(lambda r=r: r.readyz()[0] == 200, what=f"{r.name} /readyz", timeout=90, log=r.name)
        yield a, b, proxy
    finally:
        proxy.thaw()
        for r in (a, b):
            cluster.stop_process(r.name)
        proxy.stop()


def _pod(cluster: Cluster, ns: str, name: str) -> dict[str, Any]:
    pod = cluster.get_json("pod", name, namespace=ns)
    assert pod is not None
    return pod


def _filter(replica: Replica, pod: dict[str, Any], node: str) -> dict[str, Any]:
    reply: dict[str, Any] = replica.post("filter", {"Pod": pod, "NodeNames": [node]})
    return reply


def _bind(replica: Replica, pod: dict[str, Any], node: str) -> str:
    """What kube-scheduler does with a pod: filter, then bind to the node if it passed."""
    reply = _filter(replica, pod, node)
    if node not in (reply.get("NodeNames") or []):
        return f"filtered out: {reply}"
    meta = pod["metadata"]
    answer = replica.post("bind", {"PodName": meta["name"], "PodNamespace": meta["namespace"],
                                   "PodUID": meta["uid"], "Node": node})  # fmt: skip
    return str(answer["Error"])


def test_two_replicas_never_give_a_cpu_twice_even_with_a_frozen_watch(
    stack: Stack, ns: str, replicas: tuple[Replica, Replica, ApiProxy]
) -> None:
    a, b, proxy = replicas
    cluster = stack.cluster
    with api_only_node(cluster, cores=8) as node:  # 16 CPUs
        manifests = []
        for i in range(17):
            m = lsr(f"p{i}", ns, 1)
            m["spec"]["schedulerName"] = SCHEDULER
            manifests.append(m)
        cluster.apply({"apiVersion": "v1", "kind": "List", "items": manifests})
        pods = [_pod(cluster, ns, f"p{i}") for i in range(17)]
        for r in (a, b):  # both caches know the node and its topology
            cluster.wait_for(lambda r=r: node in (_filter(r, pods[0], node).get("NodeNames") or []),
                             what=f"{r.name} knows {node}", timeout=60)  # fmt: skip

        # both healthy, alternating
        for i in range(0, 6):
            assert _bind(a if i % 2 == 0 else b, pods[i], node) == "", i

        # B's cluster-wide pod list and watch freeze; A binds, B binds from the ledger alone
        proxy.freeze(lambda method, target: method == "GET" and target.startswith("/api/v1/pods"))
        for i in range(6, 10):
            assert _bind(a, pods[i], node) == "", i
        last_a = time.monotonic()
        cluster.wait_for(lambda: proxy.frozen_requests > 0, what="B's pod watch frozen", timeout=30)
        for i in range(10, 12):
            assert _bind(b, pods[i], node) == "", i

        # B goes stale: /readyz 503 naming the kind; its binds are refused, also past the TTL
        _, body = cluster.wait_for(lambda: (s := b.readyz())[0] == 503 and "pods: stale" in s[1] and s,
                                        what="B's /readyz 503 naming pods", timeout=IDLE_TIMEOUT + 60)  # fmt: skip
        assert "pods: stale" in body and a.readyz()[0] == 200
        assert "stale" in _bind(b, pods[12], node)
        cluster.wait_for(lambda: time.monotonic() > last_a + LEDGER_TTL + 2, what="the ledger TTL to pass",
                         timeout=LEDGER_TTL + 10)  # fmt: skip
        assert "stale" in _bind(b, pods[12], node)
        assert b.readyz()[0] == 503

        # thawed: B lists again and is ready; the rest alternate; the 17th fits nowhere
        proxy.thaw()
        cluster.wait_for(lambda: b.readyz()[0] == 200, what="B ready again", timeout=IDLE_TIMEOUT + 60)
        for i in range(12, 16):
            assert _bind(b if i % 2 == 0 else a, pods[i], node) == "", i
        for r in (a, b):
            reply = _filter(r, pods[16], node)
            assert "not enough cpus available" in json.dumps(reply), (r.name, reply)
            assert _bind(r, pods[16], node).startswith("filtered out")  # never bound

        held: dict[int, str] = {}
        for i in range(16):
            pod = _pod(cluster, ns, f"p{i}")
            assert pod["spec"]["nodeName"] == node, i
            assert_signed_by_extender(cluster, pod)
            for cpu in parse_cpu_list(json.loads(annotations_of(pod)[STATUS])["cpuset"]):
                assert cpu not in held, f"CPU {cpu} given to p{i} and {held[cpu]}"
                held[cpu] = f"p{i}"
        assert sorted(held) == list(range(16))
        assert not _pod(cluster, ns, "p16")["spec"].get("nodeName")
