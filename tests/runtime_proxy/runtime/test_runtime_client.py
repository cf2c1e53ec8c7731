"""``runtime_proxy.runtime.client.RuntimeClient`` over ``unary`` against an in-process HTTP/2
server (``h2_server``) answering as containerd's CRI would; and the default ``serve`` path and
the NRI plugin's CRI fallback never loading the gRPC library."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from google.protobuf.message import DecodeError

from cri_protos import api_pb2
from hooks.plan import ResourceChanges
from runtime_proxy.runtime.client import _SLICE, RuntimeClient, _field_end, decode
from runtime_proxy.runtime.unary import RpcError, StatusCode
from runtime_proxy.state.store import Store
from tests.runtime_proxy.runtime.h2_server import Server, Stream

pytestmark = pytest.mark.timeout(120)


class Cri:
    """A CRI runtime of ``containers`` containers, no sandboxes; records the requests."""

    def __init__(self, containers: int = 3) -> None:
        self.containers = containers
        self.requests: list[tuple[str, bytes]] = []
        self.garbage = False

    async def __call__(self, s: Stream) -> None:
        method = s.path.rsplit("/", 1)[-1]
        self.requests.append((method, s.request[5:]))
        if self.garbage:
            await s.answer(b"\xff\xff\xff")
            return
        if method == "Version":
            await s.answer(api_pb2.VersionResponse(runtime_name="fake", runtime_api_version="v1").SerializeToString())
        elif method == "ListContainers":
            resp = api_pb2.ListContainersResponse(containers=[
                api_pb2.Container(id=f"{i:064x}", pod_sandbox_id="sb", labels={"app": "x" * 100})
                for i in range(self.containers)])
            await s.answer(resp.SerializeToString())
        elif method in ("PodSandboxStatus", "ContainerStatus"):
            s.headers_out(end=True, extra=((b"grpc-status", b"5"), (b"grpc-message", b"not found")))
        else:
            await s.answer(b"")


@pytest.fixture
async def cri(tmp_path: Path) -> AsyncIterator[tuple[Cri, RuntimeClient]]:
    fake = Cri()
    server = Server(str(tmp_path / "cri.sock"), fake)
    await server.start()
    client = RuntimeClient(server.path, timeout=5)
    yield fake, client
    await client.close()
    await server.stop()


async def test_calls_decode_their_answers(cri: tuple[Cri, RuntimeClient]) -> None:
    fake, client = cri
    assert (await client.version()).runtime_name == "fake"
    assert [c.id for c in await client.list_containers()] == [f"{i:064x}" for i in range(3)]
    assert await client.list_sandboxes() == []
    await client.update_changed_resources("c1", ResourceChanges(cpu_shares=512))
    method, body = fake.requests[-1]
    sent = api_pb2.UpdateContainerResourcesRequest.FromString(body)
    assert method == "UpdateContainerResources" and sent.container_id == "c1" and sent.linux.cpu_shares == 512


async def test_not_found_is_an_rpc_error_the_store_skips(cri: tuple[Cri, RuntimeClient]) -> None:
    _, client = cri
    with pytest.raises(RpcError) as info:
        await client.sandbox_status("sb")
    assert info.value.code == StatusCode.NOT_FOUND
    store = Store()
    assert await store.ensure_container(client, "c1") is None  # logged and skipped, not raised


async def test_undecodable_answer_is_internal(cri: tuple[Cri, RuntimeClient]) -> None:
    fake, client = cri
    fake.garbage = True
    with pytest.raises(RpcError) as info:
        await client.version()
    assert info.value.code == StatusCode.INTERNAL and "undecodable" in info.value.message


async def test_answer_over_the_bound(tmp_path: Path) -> None:
    server = Server(str(tmp_path / "cri.sock"), Cri(containers=20_000))  # about 4.4 MiB
    await server.start()
    small = RuntimeClient(server.path, timeout=30, max_answer=1 << 20)
    large = RuntimeClient(server.path, timeout=30)
    try:
        with pytest.raises(RpcError) as info:
            await small.list_containers()
        assert info.value.code == StatusCode.RESOURCE_EXHAUSTED
        assert len(await large.list_containers()) == 20_000
    finally:
        await small.close()
        await large.close()
        await server.stop()


_NO_GRPC = """
import asyncio, json, sys
from pathlib import Path
import runtime_proxy.cli
from hooks.plan import ResourceChanges
from runtime_proxy.commands import nri, serve
from runtime_proxy.config import ProxyConfig
from tests.runtime_proxy.runtime.h2_server import Server
from tests.runtime_proxy.runtime.test_runtime_client import Cri

async def main(tmp):
    runtime_proxy.cli.build_parser()  # what `runtime-proxy serve` does first
    server = Server(str(tmp / "cri.sock"), Cri())
    await server.start()
    hooks = tmp / "hooks"
    hooks.mkdir()
    config = ProxyConfig(hookServerDir=str(hooks), cgroupRoot=str(tmp), usageLoop={"enable": True})
    proxy = serve.Proxy(serve.ProxyOptions(listen=str(tmp / "p.sock"), backend=server.path, config=config,
                                           entry_points=False))
    await proxy.start()
    await asyncio.wait_for(proxy.ready.wait(), 10)  # the store rebuilt through RuntimeClient
    await serve.StoreBackend(proxy.store, proxy.interceptor, proxy.client).update_container_resources(
        "c1", ResourceChanges(cpu_shares=2))
    fallback = nri._runtime_for_updates(nri.NriOptions(socket=str(tmp / "nri.sock"), backend=server.path,
                                                       config=config, entry_points=False), None)
    client = fallback()
    await client.update_changed_resources("c1", ResourceChanges(cpu_shares=4))
    await client.close()
    loaded = sorted(m for m in sys.modules if m == "grpc" or m.startswith("grpc."))
    await proxy.stop()
    await server.stop()
    print(json.dumps(loaded))

asyncio.run(main(Path(sys.argv[1])))
"""


def test_serve_and_the_nri_fallback_never_load_the_grpc_library(tmp_path: Path) -> None:
    """The default ``serve`` (relay transport, no hook server registered) rebuilding its store
    and updating a container, and the NRI plugin's CRI fallback client, run without grpcio."""
    repo = Path(__file__).resolve().parents[3]
    out = subprocess.run([sys.executable, "-c", _NO_GRPC, str(tmp_path)], cwd=repo, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


async def test_a_large_answer_decodes_in_slices_to_the_same_message() -> None:
    whole = api_pb2.ListContainersResponse(containers=[
        api_pb2.Container(id=f"{i:064x}", labels={"k": "v" * (i % 300)}, created_at=i) for i in range(20_000)])
    data = whole.SerializeToString()
    assert len(data) > 4 * _SLICE
    assert _SLICE <= _field_end(memoryview(data), 0, _SLICE) < 2 * _SLICE
    assert await decode(api_pb2.ListContainersResponse, data) == whole


@pytest.mark.parametrize("data", [
    b"\x0a\xff\xff\xff\xff\x0f" + b"x" * (600 << 10),  # a length past the end
    b"\x0a\x05abcde" * 100_000 + b"\x0f",  # a wire type 7 tag
    b"\x0a\x05abcde" * 100_000 + b"\x08" + b"\xff" * 11,  # a varint of 11 bytes
    b"\x0a\x05abcde" * 100_000 + b"\x0a",  # a tag without its length
])
async def test_a_broken_large_answer_is_a_decode_error(data: bytes) -> None:
    with pytest.raises(DecodeError):
        await decode(api_pb2.ListContainersResponse, data)
