"""The CRI runtime client: the few ``runtime.v1`` calls the node agent makes of the runtime
itself (listing and inspecting pods and containers for the store's rebuild, updating a running
container's resources for the loops, the version for ``doctor``). Messages are built and read
by ``runtime_proxy.codecs.cri``."""

from __future__ import annotations

from cri_protos import api_pb2
from hooks.facts import Resources
from hooks.plan import ResourceChanges
from runtime_proxy.codecs.cri import fill_resources_pb, set_linux_resources

__all__ = ["RUNTIME_CHANNEL_OPTIONS", "RuntimeClient"]


# Options of every gRPC channel to the runtime (this client's, the grpc transport's): messages of
# any size pass (CRI image lists and exec output can be large); reconnect quickly once the
# runtime is back instead of grpc's default back-off of up to two minutes.
RUNTIME_CHANNEL_OPTIONS: list[tuple[str, int]] = [
    ("grpc.max_receive_message_length", -1),
    ("grpc.max_send_message_length", -1),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.enable_retries", 0),
]


class RuntimeClient:
    """Decoded CRI calls to the runtime, for the store and the reconciler (never for forwarding)."""

    def __init__(self, backend: str, *, timeout: float = 10.0) -> None:
        # gRPC is imported here, not with the module: the NRI plugin uses the store without a
        # runtime client, and the gRPC library is about 10 MiB of its memory.
        import grpc

        from cri_protos import api_pb2_grpc

        self.channel = grpc.aio.insecure_channel(f"unix://{backend}", options=RUNTIME_CHANNEL_OPTIONS)
        self.runtime = api_pb2_grpc.RuntimeServiceStub(self.channel)
        self.timeout = timeout

    async def close(self) -> None:
        await self.channel.close()

    # The generated stub (``api_pb2_grpc``) is untyped; each answer gets its message type here.
    async def version(self) -> api_pb2.VersionResponse:
        resp: api_pb2.VersionResponse = await self.runtime.Version(api_pb2.VersionRequest(), timeout=self.timeout)
        return resp

    async def list_sandboxes(self) -> list[api_pb2.PodSandbox]:
        resp: api_pb2.ListPodSandboxResponse = await self.runtime.ListPodSandbox(
            api_pb2.ListPodSandboxRequest(), timeout=self.timeout
        )
        return list(resp.items)

    async def list_containers(self) -> list[api_pb2.Container]:
        resp: api_pb2.ListContainersResponse = await self.runtime.ListContainers(
            api_pb2.ListContainersRequest(), timeout=self.timeout
        )
        return list(resp.containers)

    async def sandbox_status(self, sandbox_id: str) -> api_pb2.PodSandboxStatusResponse:
        resp: api_pb2.PodSandboxStatusResponse = await self.runtime.PodSandboxStatus(
            api_pb2.PodSandboxStatusRequest(pod_sandbox_id=sandbox_id, verbose=True), timeout=self.timeout
        )
        return resp

    async def container_status(self, container_id: str) -> api_pb2.ContainerStatusResponse:
        resp: api_pb2.ContainerStatusResponse = await self.runtime.ContainerStatus(
            api_pb2.ContainerStatusRequest(container_id=container_id, verbose=True), timeout=self.timeout
        )
        return resp

    async def update_container_resources(self, container_id: str, resources: Resources) -> None:
        linux = api_pb2.LinuxContainerResources()
        fill_resources_pb(linux, resources)
        await self.runtime.UpdateContainerResources(
            api_pb2.UpdateContainerResourcesRequest(container_id=container_id, linux=linux), timeout=self.timeout
        )

    async def update_changed_resources(self, container_id: str, changes: ResourceChanges) -> None:
        """UpdateContainerResources with only the fields of ``changes`` set (the runtime keeps
        the rest)."""
        linux = api_pb2.LinuxContainerResources()
        set_linux_resources(linux, changes)
        await self.runtime.UpdateContainerResources(
            api_pb2.UpdateContainerResourcesRequest(container_id=container_id, linux=linux), timeout=self.timeout
        )
