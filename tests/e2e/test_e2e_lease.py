"""The one leader election (``rhp_kube.lease``, issue 32 items 1 and 5) against the real API
server: two electors through the manager's aiohttp client (``ManagerAPI``, ``LeaseCalls``) share a
Lease; each writes a ConfigMap through its fence as fast as it can. Then the first one's Lease calls
fail (a partition between it and the API server, made in its client: its writes still get
through, so only the fence can stop them). The second takes the Lease over once it ran out, and
every write of the first was committed before that takeover: its last write's resourceVersion
is below the takeover's (etcd's revision orders every write of the cluster). Checked on
containerd 2.1 only: nothing here depends on the runtime.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from colocation_manager.kubeio import LeaseCalls, ManagerAPI
from rhp_kube import credentials
from rhp_kube.http import json_object
from rhp_kube.lease import Elector, NotLeader
from scheduler_ext.kube import MERGE_PATCH
from tests.e2e.conftest import Stack

LEASE = "rhp-e2e-fence"


class Cut(LeaseCalls):
    """``LeaseCalls`` that fail while ``cut`` is set, and remember the resourceVersion of every
    Lease this elector wrote as holder."""

    def __init__(self, api: ManagerAPI, me: str) -> None:
        super().__init__(api)
        self.me, self.cut = me, False
        self.held_versions: list[int] = []

    def _check(self) -> None:
        if self.cut:
            raise OSError("partitioned from the API server (test)")

    def _note(self, lease: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
        if lease is not None and lease.get("spec", {}).get("holderIdentity") == self.me:
            self.held_versions.append(int(lease["metadata"]["resourceVersion"]))
        return lease

    async def get_lease(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        self._check()
        return await super().get_lease(namespace, name)

    async def create_lease(self, namespace: str, body: Mapping[str, Any]) -> Mapping[str, Any] | None:
        self._check()
        return self._note(await super().create_lease(namespace, body))

    async def replace_lease(self, namespace: str, name: str, body: Mapping[str, Any]) -> Mapping[str, Any] | None:
        self._check()
        return self._note(await super().replace_lease(namespace, name, body))


async def _until(check: Callable[[], bool], what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


def test_a_partitioned_leader_writes_nothing_after_the_takeover(stack: Stack, ns: str) -> None:
    if stack.ctrd.version != "2.1":
        pytest.skip("leader election does not depend on the runtime: checked on containerd 2.1")
    cluster = stack.cluster
    cluster.kubectl("create", "configmap", "fenced", "-n", ns)
    kubeconfig = str(cluster.admin_kubeconfig)
    path = f"/api/v1/namespaces/{ns}/configmaps/fenced"
    written: dict[str, list[int]] = {"a": [], "b": []}
    refused: dict[str, int] = {"a": 0, "b": 0}

    async def scenario() -> None:
        apis = {n: ManagerAPI(credentials.load(kubeconfig, None, False), timeout=5.0) for n in ("a", "b")}
        calls = {n: Cut(apis[n], n) for n in ("a", "b")}
        electors = {n: Elector(calls[n], ns, LEASE, n, lease_seconds=4, renew_deadline=2.0, retry_period=0.3)
                    for n in ("a", "b")}
        stop = asyncio.Event()
        running = [asyncio.create_task(electors["a"].run(stop))]
        await _until(electors["a"].is_leader, "a leading")
        running.append(asyncio.create_task(electors["b"].run(stop)))

        async def writer(name: str) -> None:
            n = 0
            while not stop.is_set():
                n += 1
                call = apis[name].request("PATCH", path, {"data": {name: str(n)}}, MERGE_PATCH)
                try:
                    reply = json_object(await electors[name].write(call))
                    written[name].append(int(reply["metadata"]["resourceVersion"]))
                except NotLeader:
                    refused[name] += 1
                await asyncio.sleep(0.02)

        running += [asyncio.create_task(writer("a")), asyncio.create_task(writer("b"))]
        await _until(lambda: len(written["a"]) >= 5, "a's first writes")
        calls["a"].cut = True
        await _until(lambda: len(written["b"]) >= 5, "b's writes after taking over")
        stop.set()
        await asyncio.gather(*running)
        takeover = min(calls["b"].held_versions)
        assert written["a"] and max(written["a"]) < takeover, (max(written["a"]), takeover)
        assert min(written["b"]) > takeover
        assert refused["a"] > 0, "a kept trying after its term, and its fence refused"
        for api in apis.values():
            await api.aclose()

    asyncio.run(scenario())
    lease = cluster.get_json("lease", LEASE, namespace=ns) or {}
    assert lease.get("spec", {}).get("holderIdentity") == "", "b handed the Lease back when it stopped"
    assert lease.get("spec", {}).get("leaseTransitions") == 1
