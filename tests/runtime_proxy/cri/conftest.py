"""Fixtures for the shared transport suite: every test here runs once per transport.

``env`` is a started backend (``transport_backend``), a started transport in front of it and a
way to open client channels to the transport. The transports are imported lazily, so a missing
module skips its half of the suite instead of breaking collection.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from typing import Any, Protocol

import grpc
import pytest
from transport_backend import OPTIONS, BackendLog, RecordingInterceptor, start_backend

from runtime_proxy.cri.transport import CallInterceptor

TRANSPORTS = ["relay", "grpc"]
BACKEND_SCRIPT = os.path.join(os.path.dirname(__file__), "transport_backend.py")


class Transport(Protocol):
    async def start(self) -> None: ...

    async def stop(self, grace: float = 5.0) -> None: ...


def make_transport(kind: str, listen: str, backend: str, interceptor: CallInterceptor) -> Transport:
    if kind == "relay":
        from runtime_proxy.cri.relay import RelayTransport

        return RelayTransport(listen, backend, interceptor, connect_timeout=1.0)
    from runtime_proxy.cri import grpc_transport

    transport: Transport = grpc_transport.GrpcTransport(listen, backend, interceptor)
    return transport


class ProxyEnv:
    """A backend, a transport in front of it, and client channels to the transport."""

    def __init__(self, kind: str, directory: str, interceptor: RecordingInterceptor) -> None:
        self.kind = kind
        self.dir = directory
        self.backend_path = os.path.join(directory, "backend.sock")
        self.listen_path = os.path.join(directory, "proxy.sock")
        self.record = BackendLog()
        self.interceptor = interceptor
        self.backend: grpc.aio.Server | None = None
        self.backend_proc: asyncio.subprocess.Process | None = None
        self.transport: Transport | None = None
        self._channels: list[grpc.aio.Channel] = []

    async def start_backend(self) -> None:
        self.backend = await start_backend(self.backend_path, self.record)

    async def stop_backend(self, grace: float | None = 0) -> None:
        if self.backend is not None:
            await self.backend.stop(grace)
            self.backend = None

    async def start_backend_process(self) -> None:
        """A backend in its own process, so a test can SIGKILL it."""
        with open(os.devnull, "wb") as devnull:
            self.backend_proc = await asyncio.create_subprocess_exec(
                sys.executable,
                BACKEND_SCRIPT,
                self.backend_path,
                stdout=asyncio.subprocess.PIPE,
                stderr=devnull,
                env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
            )
        assert self.backend_proc.stdout is not None
        line = await asyncio.wait_for(self.backend_proc.stdout.readline(), timeout=20)
        assert line.strip() == b"ready", line

    async def kill_backend_process(self) -> None:
        proc, self.backend_proc = self.backend_proc, None
        if proc is not None and proc.returncode is None:
            proc.kill()
            await proc.wait()

    async def start_proxy(self) -> None:
        self.transport = make_transport(self.kind, self.listen_path, self.backend_path, self.interceptor)
        await self.transport.start()

    def channel(self, **options: Any) -> grpc.aio.Channel:
        opts = list(OPTIONS) + list(options.items())
        channel = grpc.aio.insecure_channel(f"unix:{self.listen_path}", options=opts)
        self._channels.append(channel)
        return channel

    async def close(self) -> None:
        for channel in self._channels:
            await channel.close()
        if self.transport is not None:
            await self.transport.stop(0.5)
        await self.stop_backend()
        await self.kill_backend_process()


@pytest.fixture(params=TRANSPORTS)
def transport_kind(request: pytest.FixtureRequest) -> str:
    kind: str = request.param
    return kind


@pytest.fixture
def sock_dir() -> Iterator[str]:
    # Short paths: a unix socket path must fit in 108 bytes.
    directory = tempfile.mkdtemp(prefix="rhp-t-", dir="/tmp")
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def interceptor() -> RecordingInterceptor:
    return RecordingInterceptor()


@pytest.fixture
async def bare_env(transport_kind: str, sock_dir: str, interceptor: RecordingInterceptor) -> AsyncIterator[ProxyEnv]:
    """Nothing started yet."""
    env = ProxyEnv(transport_kind, sock_dir, interceptor)
    try:
        yield env
    finally:
        await env.close()


@pytest.fixture
async def env(bare_env: ProxyEnv) -> ProxyEnv:
    """Backend and transport started."""
    await bare_env.start_backend()
    await bare_env.start_proxy()
    return bare_env
