"""An in-memory runtime for the store and the proxy's loops (no containerd): the part of
``runtime_proxy.runtime.client.RuntimeClient`` they call, and a driver that makes CRI calls through
a ``CriInterceptor`` the way a transport does (``before``, the runtime, ``after``)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from google.protobuf.message import Message

from cri_protos import api_pb2
from runtime_proxy.cri.door import CriInterceptor
from runtime_proxy.runtime.errors import RpcError, StatusCode

QOS = "koordinator.sh/qosClass"
RS = "scheduling.koordinator.sh/resource-status"
SERVICE = "/runtime.v1.RuntimeService/"


def sandbox_config(uid: str, *, qos: str, cpuset: str = "") -> api_pb2.PodSandboxConfig:
    """A pod's sandbox config as kubelet sends it: labelled ``qos``, with a resource-status
    cpuset when given, in a Burstable cgroup parent named after ``uid``."""
    config = api_pb2.PodSandboxConfig()
    config.metadata.name = f"pod-{uid}"
    config.metadata.namespace = "ns"
    config.metadata.uid = uid
    config.labels[QOS] = qos
    if cpuset:
        config.annotations[RS] = json.dumps({"cpuset": cpuset})
    config.linux.cgroup_parent = f"/kubepods/burstable/pod{uid}"
    return config


def _not_found(what: str) -> RpcError:
    return RpcError(StatusCode.NOT_FOUND, f"{what} not found")


@dataclass
class FakeCri:
    """Sandboxes and containers in memory; ``UpdateContainerResources`` is recorded in
    ``updates`` (``runtime`` and ``timeout`` are what ``runtime_proxy.commands.serve.StoreBackend``
    uses of a client)."""

    sandboxes: dict[str, tuple[api_pb2.PodSandboxConfig, int]] = field(default_factory=dict)
    container_list: dict[str, tuple[str, int]] = field(default_factory=dict)
    updates: list[tuple[str, api_pb2.LinuxContainerResources]] = field(default_factory=list)
    timeout: float = 1.0

    @property
    def runtime(self) -> FakeCri:
        return self

    def add_sandbox(self, sandbox_id: str, config: api_pb2.PodSandboxConfig, *, ready: bool = True) -> None:
        self.sandboxes[sandbox_id] = (config, api_pb2.SANDBOX_READY if ready else api_pb2.SANDBOX_NOTREADY)

    def add_container(self, container_id: str, sandbox_id: str, *, exited: bool = False) -> None:
        self.container_list[container_id] = (
            sandbox_id, api_pb2.CONTAINER_EXITED if exited else api_pb2.CONTAINER_RUNNING)

    async def list_sandboxes(self) -> list[Any]:
        return [api_pb2.PodSandbox(id=sid, metadata=config.metadata, state=state, created_at=n)
                for n, (sid, (config, state)) in enumerate(self.sandboxes.items())]

    async def list_containers(self) -> list[Any]:
        return [api_pb2.Container(id=cid, pod_sandbox_id=sid, state=state)
                for cid, (sid, state) in self.container_list.items()]

    async def sandbox_status(self, sandbox_id: str) -> Any:
        if sandbox_id not in self.sandboxes:
            raise _not_found(f"sandbox {sandbox_id}")
        config, state = self.sandboxes[sandbox_id]
        status = api_pb2.PodSandboxStatus(id=sandbox_id, metadata=config.metadata, state=state,
                                          labels=config.labels, annotations=config.annotations)
        info = {"info": json.dumps({"config": {"metadata": {"name": config.metadata.name,
                                                            "namespace": config.metadata.namespace,
                                                            "uid": config.metadata.uid},
                                               "labels": dict(config.labels),
                                               "annotations": dict(config.annotations),
                                               "linux": {"cgroup_parent": config.linux.cgroup_parent}}})}
        return api_pb2.PodSandboxStatusResponse(status=status, info=info)

    async def container_status(self, container_id: str) -> Any:
        if container_id not in self.container_list:
            raise _not_found(f"container {container_id}")
        sandbox_id, state = self.container_list[container_id]
        status = api_pb2.ContainerStatus(id=container_id, state=state)
        status.metadata.name = "app"
        return api_pb2.ContainerStatusResponse(status=status, info={"info": json.dumps({"sandboxID": sandbox_id})})

    async def UpdateContainerResources(self, request: Any, timeout: float | None = None) -> Any:
        self.updates.append((request.container_id, request.linux))
        return api_pb2.UpdateContainerResourcesResponse()


class Calls:
    """CRI calls through ``interceptor`` to ``runtime``, as a transport makes them."""

    def __init__(self, interceptor: CriInterceptor, runtime: FakeCri) -> None:
        self.icpt = interceptor
        self.runtime = runtime

    async def call(self, method: str, request: Message, response: Message) -> bytes:
        """``method`` with ``request`` (the runtime answers ``response``); the request as the
        runtime got it."""
        call = await self.icpt.before(SERVICE + method, request.SerializeToString())
        await call.after(response.SerializeToString())
        return call.request

    async def run_pod(self, uid: str, *, qos: str = "LS", cpuset: str = "") -> str:
        config = sandbox_config(uid, qos=qos, cpuset=cpuset)
        sandbox_id = f"sb-{uid}"
        self.runtime.add_sandbox(sandbox_id, config)
        await self.call("RunPodSandbox", api_pb2.RunPodSandboxRequest(config=config),
                        api_pb2.RunPodSandboxResponse(pod_sandbox_id=sandbox_id))
        return sandbox_id

    async def create(self, sandbox_id: str, container_id: str) -> api_pb2.CreateContainerRequest:
        """CreateContainer for a container named ``app`` (cpu.shares 512); the request as the
        runtime got it (after the hooks)."""
        config, _ = self.runtime.sandboxes[sandbox_id]
        request = api_pb2.CreateContainerRequest(pod_sandbox_id=sandbox_id, sandbox_config=config)
        request.config.metadata.name = "app"
        request.config.linux.resources.cpu_shares = 512
        self.runtime.add_container(container_id, sandbox_id)
        sent = await self.call("CreateContainer", request, api_pb2.CreateContainerResponse(container_id=container_id))
        return api_pb2.CreateContainerRequest.FromString(sent)

    async def stop_container(self, container_id: str) -> None:
        sandbox_id, _ = self.runtime.container_list[container_id]
        self.runtime.add_container(container_id, sandbox_id, exited=True)
        await self.call("StopContainer", api_pb2.StopContainerRequest(container_id=container_id),
                        api_pb2.StopContainerResponse())

    async def remove_container(self, container_id: str) -> None:
        await self.call("RemoveContainer", api_pb2.RemoveContainerRequest(container_id=container_id),
                        api_pb2.RemoveContainerResponse())
        self.runtime.container_list.pop(container_id, None)

    async def stop_pod(self, sandbox_id: str) -> None:
        config, _ = self.runtime.sandboxes[sandbox_id]
        self.runtime.add_sandbox(sandbox_id, config, ready=False)
        for cid, (sid, _) in list(self.runtime.container_list.items()):
            if sid == sandbox_id:
                self.runtime.add_container(cid, sid, exited=True)
        await self.call("StopPodSandbox", api_pb2.StopPodSandboxRequest(pod_sandbox_id=sandbox_id),
                        api_pb2.StopPodSandboxResponse())

    async def update(self, container_id: str, cpuset: str) -> None:
        request = api_pb2.UpdateContainerResourcesRequest(container_id=container_id)
        request.linux.cpuset_cpus = cpuset
        await self.call("UpdateContainerResources", request, api_pb2.UpdateContainerResourcesResponse())
