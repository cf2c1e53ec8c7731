"""``RuntimeClient`` (gRPC over h2, ``runtime_proxy/runtime/unary.py``) against real containerd
1.6, 1.7 and 2.1: every call the node agent makes, many at once on one connection, a status
error, and containerd killed and restarted (the next call succeeds)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from rhp_devenv.cri import linux_resources

from cri_protos import api_pb2
from hooks.plan import ResourceChanges
from runtime_proxy.runtime.client import RuntimeClient
from runtime_proxy.runtime.unary import RpcError, StatusCode

pytestmark = pytest.mark.integration


def test_every_call_on_real_containerd(containerd: Any) -> None:
    cri = containerd.cri_client()
    pod = cri.run_pod(cgroup_parent=containerd.new_cgroup_parent("burstable"), labels={"app": "h2"})
    cid = cri.run_container(pod, resources=linux_resources(cpu_shares=256))

    async def calls() -> None:
        client = RuntimeClient(containerd.socket, timeout=20)
        try:
            version = await client.version()
            assert version.runtime_api_version == "v1" and version.runtime_name == "containerd"
            assert pod.pod_id in {s.id for s in await client.list_sandboxes()}
            assert cid in {c.id for c in await client.list_containers()}
            status = await client.sandbox_status(pod.pod_id)
            assert status.status.labels["app"] == "h2" and status.info  # verbose
            await client.update_changed_resources(cid, ResourceChanges(cpu_shares=512))
            many = await asyncio.gather(*(client.container_status(cid) for _ in range(64)))
            assert {s.status.resources.linux.cpu_shares for s in many} == {512}
            assert all(s.status.state == api_pb2.CONTAINER_RUNNING for s in many)
            with pytest.raises(RpcError) as info:
                await client.container_status("0" * 64)
            assert info.value.code == StatusCode.NOT_FOUND, info.value
        finally:
            await client.close()

    asyncio.run(calls())


def test_next_call_succeeds_after_containerd_is_killed_and_restarted(containerd: Any) -> None:
    cri = containerd.cri_client()
    pod = cri.run_pod(cgroup_parent=containerd.new_cgroup_parent("burstable"))
    cid = cri.run_container(pod)

    # One event loop, run step by step: the daemon is restarted from this (the main) thread,
    # since it dies with the thread that started it.
    loop = asyncio.new_event_loop()
    client = RuntimeClient(containerd.socket, timeout=10)
    try:
        status = loop.run_until_complete(client.container_status(cid))
        assert status.status.state == api_pb2.CONTAINER_RUNNING
        containerd.ctrd.kill_daemon()
        with pytest.raises(RpcError) as info:
            loop.run_until_complete(client.version())
        assert info.value.code == StatusCode.UNAVAILABLE, info.value
        containerd.ctrd.restart_daemon()
        status = loop.run_until_complete(client.container_status(cid))  # the same client: it reconnects
        assert status.status.state == api_pb2.CONTAINER_RUNNING
    finally:
        loop.run_until_complete(client.close())
        loop.close()
