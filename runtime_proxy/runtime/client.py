"""The CRI runtime client: the few ``runtime.v1`` calls the node agent makes of the runtime
itself (listing and inspecting pods and containers for the store's rebuild, updating a running
container's resources for the loops, the version for ``doctor``). Messages are built and read
by ``runtime_proxy.codecs.cri``.

The calls go over ``runtime_proxy.runtime.unary`` (HTTP/2 by ``h2``), not the gRPC library, so
the default ``serve`` path and the NRI plugin never load grpcio (about 9 MiB of their memory); a
failed call raises ``RpcError`` with the gRPC status code and message."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import TYPE_CHECKING, TypeVar

from google.protobuf.message import DecodeError, Message

from cri_protos import api_pb2
from hooks.facts import Resources
from hooks.plan import ResourceChanges
from runtime_proxy.codecs.cri import fill_resources_pb, set_linux_resources
from runtime_proxy.runtime.errors import MAX_ANSWER, RpcError, StatusCode

if TYPE_CHECKING:
    from runtime_proxy.runtime.unary import UnaryChannel

__all__ = ["RUNTIME_CHANNEL_OPTIONS", "CriStub", "RpcError", "RuntimeClient", "StatusCode"]


# Options of the grpc transport's gRPC channel to the runtime (this client's ``UnaryChannel``
# has the same back-off): messages of
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


_SERVICE = "/runtime.v1.RuntimeService/"
_Answer = TypeVar("_Answer", bound=Message)
_Item = TypeVar("_Item")
_SLICE = 512 << 10  # bytes of an answer decoded between two turns of the event loop
_LIST_SLICE = 2000  # items of a listing turned into a list between two turns


def _varint(data: memoryview, at: int) -> tuple[int, int]:
    """The varint at ``at`` and the offset after it (``DecodeError`` past 10 bytes or the end)."""
    value = shift = 0
    for end in range(at, min(at + 10, len(data))):
        byte = data[end]
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, end + 1
        shift += 7
    raise DecodeError("truncated or overlong varint")


def _field_end(data: memoryview, at: int, step: int) -> int:
    """The end of the first top-level field of ``data`` (a serialized message) that ends
    ``step`` bytes or more after ``at``, or ``len(data)``: the message parsed slice by slice
    merges to the same message (protobuf's merge of concatenated encodings)."""
    size, mark = len(data), at + step
    while at < size:
        tag, at = _varint(data, at)
        wire = tag & 7
        if wire == 0:
            _, at = _varint(data, at)
        elif wire == 2:
            length, at = _varint(data, at)
            at += length
        elif wire in (1, 5):
            at += 8 if wire == 1 else 4
        else:
            raise DecodeError(f"wire type {wire} at the top level")
        if at > size:
            raise DecodeError("field past the end of the message")
        if at >= mark:
            return at
    return size


async def decode(answer: type[_Answer], data: bytes) -> _Answer:
    """``data`` decoded as ``answer``, a slice of about 512 KiB at a time (found and merged) with
    a turn of the event loop between: a 16 MiB ListContainers decoded at once holds the loop
    for about 200 ms."""
    if len(data) <= _SLICE:
        return answer.FromString(data)
    view = memoryview(data)
    message = answer()
    start = 0
    while start < len(view):
        end = _field_end(view, start, _SLICE)
        message.MergeFromString(bytes(view[start:end]))
        start = end
        await asyncio.sleep(0)
    return message


async def _listed(items: Iterable[_Item]) -> list[_Item]:
    """``items`` as a list, a slice at a time between turns of the event loop."""
    out: list[_Item] = []
    for n, item in enumerate(items, 1):
        out.append(item)
        if n % _LIST_SLICE == 0:
            await asyncio.sleep(0)
    return out


class CriStub:
    """The ``runtime.v1.RuntimeService`` calls the node agent makes, typed, named as the gRPC
    library's generated stub names them (``RuntimeClient.runtime``)."""

    def __init__(self, channel: UnaryChannel) -> None:
        self.channel = channel

    async def _call(self, method: str, request: Message, answer: type[_Answer], timeout: float) -> _Answer:
        data = await self.channel.call(_SERVICE + method, request.SerializeToString(), timeout=timeout)
        try:
            return await decode(answer, data)
        except DecodeError as exc:
            raise RpcError(StatusCode.INTERNAL, f"{method}: undecodable answer: {exc}") from None

    async def Version(self, request: api_pb2.VersionRequest, *, timeout: float) -> api_pb2.VersionResponse:
        return await self._call("Version", request, api_pb2.VersionResponse, timeout)

    async def ListPodSandbox(self, request: api_pb2.ListPodSandboxRequest,
                             *, timeout: float) -> api_pb2.ListPodSandboxResponse:
        return await self._call("ListPodSandbox", request, api_pb2.ListPodSandboxResponse, timeout)

    async def ListContainers(self, request: api_pb2.ListContainersRequest,
                             *, timeout: float) -> api_pb2.ListContainersResponse:
        return await self._call("ListContainers", request, api_pb2.ListContainersResponse, timeout)

    async def PodSandboxStatus(self, request: api_pb2.PodSandboxStatusRequest,
                               *, timeout: float) -> api_pb2.PodSandboxStatusResponse:
        return await self._call("PodSandboxStatus", request, api_pb2.PodSandboxStatusResponse, timeout)

    async def ContainerStatus(self, request: api_pb2.ContainerStatusRequest,
                              *, timeout: float) -> api_pb2.ContainerStatusResponse:
        return await self._call("ContainerStatus", request, api_pb2.ContainerStatusResponse, timeout)

    async def UpdateContainerResources(self, request: api_pb2.UpdateContainerResourcesRequest,
                                       *, timeout: float) -> api_pb2.UpdateContainerResourcesResponse:
        return await self._call("UpdateContainerResources", request, api_pb2.UpdateContainerResourcesResponse,
                                timeout)

    async def StopContainer(self, request: api_pb2.StopContainerRequest,
                            *, timeout: float) -> api_pb2.StopContainerResponse:
        return await self._call("StopContainer", request, api_pb2.StopContainerResponse, timeout)


class RuntimeClient:
    """Decoded CRI calls to the runtime, for the store and the reconciler (never for forwarding)."""

    def __init__(self, backend: str, *, timeout: float = 10.0, max_answer: int = MAX_ANSWER) -> None:
        # The HTTP/2 client is imported here, not with the module: every command's parser
        # imports this module, and only the commands that call the runtime need h2 (0.7 MiB).
        from runtime_proxy.runtime.unary import UnaryChannel

        self.channel = UnaryChannel(backend, max_answer=max_answer)
        self.runtime = CriStub(self.channel)
        self.timeout = timeout

    async def close(self) -> None:
        await self.channel.close()

    async def version(self) -> api_pb2.VersionResponse:
        return await self.runtime.Version(api_pb2.VersionRequest(), timeout=self.timeout)

    async def list_sandboxes(self) -> list[api_pb2.PodSandbox]:
        resp = await self.runtime.ListPodSandbox(api_pb2.ListPodSandboxRequest(), timeout=self.timeout)
        return await _listed(resp.items)

    async def list_containers(self) -> list[api_pb2.Container]:
        resp = await self.runtime.ListContainers(api_pb2.ListContainersRequest(), timeout=self.timeout)
        return await _listed(resp.containers)

    async def sandbox_status(self, sandbox_id: str) -> api_pb2.PodSandboxStatusResponse:
        return await self.runtime.PodSandboxStatus(
            api_pb2.PodSandboxStatusRequest(pod_sandbox_id=sandbox_id, verbose=True), timeout=self.timeout
        )

    async def container_status(self, container_id: str) -> api_pb2.ContainerStatusResponse:
        return await self.runtime.ContainerStatus(
            api_pb2.ContainerStatusRequest(container_id=container_id, verbose=True), timeout=self.timeout
        )

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
