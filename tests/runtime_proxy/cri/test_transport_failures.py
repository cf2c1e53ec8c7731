"""The shared correctness suite, part 2: backends that are missing, die or misbehave, clients that
send garbage, and the transport's own lifecycle (socket file, graceful stop).

Every test runs once per transport. Retry loops are bounded in count and time.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import stat
import time

import grpc
import pytest
from conftest import ProxyEnv

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


async def _call_until_ok(env: ProxyEnv, channel: grpc.aio.Channel, attempts: int = 60) -> float:
    """Call Unary until it works; returns the seconds it took. Bounded: ~``attempts`` x 0.1 s."""
    start = time.monotonic()
    call = channel.unary_unary("/test.Echo/Unary")
    last: Exception | None = None
    for _ in range(attempts):
        try:
            assert await call(b"back", timeout=2) == b"back"
            return time.monotonic() - start
        except grpc.aio.AioRpcError as exc:
            last = exc
            await asyncio.sleep(0.1)
    raise AssertionError(f"backend never came back: {last}")


async def test_backend_missing_gives_unavailable_quickly_then_recovers(bare_env: ProxyEnv) -> None:
    env = bare_env
    await env.start_proxy()
    channel = env.channel()
    call = channel.unary_unary("/test.Echo/Unary")
    for _ in range(3):  # and keeps doing so
        start = time.monotonic()
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call(b"x", timeout=10)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        assert time.monotonic() - start < 2.5
    await env.start_backend()
    assert await _call_until_ok(env, channel) < 6


async def test_backend_killed_mid_call_gives_unavailable_then_restart_works(bare_env: ProxyEnv) -> None:
    env = bare_env
    await env.start_backend_process()
    await env.start_proxy()
    channel = env.channel()
    assert await channel.unary_unary("/test.Echo/Unary")(b"warm", timeout=10) == b"warm"
    pending = asyncio.ensure_future(
        channel.unary_unary("/test.Echo/Slow")(b"s", metadata=(("x-sleep", "30"),), timeout=30)
    )
    hooked = asyncio.ensure_future(
        channel.unary_unary("/test.Hooked/Slow")(b"s", metadata=(("x-sleep", "30"),), timeout=30)
    )
    await asyncio.sleep(0.3)
    start = time.monotonic()
    await env.kill_backend_process()
    for fut in (pending, hooked):
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await asyncio.wait_for(fut, timeout=10)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert time.monotonic() - start < 5
    with pytest.raises(grpc.aio.AioRpcError) as again:
        await channel.unary_unary("/test.Echo/Unary")(b"x", timeout=10)
    assert again.value.code() == grpc.StatusCode.UNAVAILABLE
    await env.start_backend_process()
    assert await _call_until_ok(env, channel) < 6


async def _garbage_backend(path: str, reply: bytes) -> asyncio.AbstractServer:
    """A backend that answers the client preface with ``reply`` and then reads forever."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(Exception):
            await reader.readexactly(len(PREFACE))
            writer.write(reply)
            await writer.drain()
            while await reader.read(65536):
                pass
        writer.close()

    return await asyncio.start_unix_server(handle, path)


@pytest.mark.parametrize(
    "reply",
    [
        pytest.param(b"\x00\x00\x03\x06\x00\x00\x00\x00\x00abc", id="ping-of-wrong-length"),
        pytest.param(
            b"\x00\x00\x00\x04\x00\x00\x00\x00\x00" + b"\x00\x00\x06\x04\x00\x00\x00\x00\x01" + b"\x00" * 6,
            id="settings-on-a-stream",
        ),
        pytest.param(b"HTTP/1.1 400 Bad Request\r\n\r\n" + b"\xff" * 64, id="not-http2-at-all"),
    ],
)
async def test_malformed_frames_from_the_backend_end_that_connection_only(bare_env: ProxyEnv, reply: bytes) -> None:
    env = bare_env
    garbage = await _garbage_backend(env.backend_path, reply)
    try:
        await env.start_proxy()
        channel = env.channel()
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await channel.unary_unary("/test.Echo/Unary")(b"x", timeout=5)
        assert info.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INTERNAL)
    finally:
        garbage.close()
        await garbage.wait_closed()
    with contextlib.suppress(FileNotFoundError):
        os.unlink(env.backend_path)
    await env.start_backend()
    assert await _call_until_ok(env, channel) < 6


def _raw_exchange(path: str, payload: bytes, timeout: float = 5.0) -> bytes:
    """Send raw bytes to the transport and read until it closes (bounded by ``timeout``)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    got = bytearray()
    deadline = time.monotonic() + timeout
    try:
        sock.connect(path)
        sock.sendall(payload)
        while time.monotonic() < deadline:
            try:
                chunk = sock.recv(65536)
            except (ConnectionResetError, TimeoutError):
                break
            if not chunk:
                break
            got += chunk
    finally:
        sock.close()
    return bytes(got)


def _frame_types(data: bytes) -> list[int]:
    types = []
    pos = 0
    while len(data) - pos >= 9:
        length = int.from_bytes(data[pos : pos + 3], "big")
        types.append(data[pos + 3])
        pos += 9 + length
    return types


@pytest.mark.parametrize(
    "garbage",
    [
        pytest.param(
            PREFACE + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00" + b"\x00\x00\x03\x06\x00\x00\x00\x00\x00abc",
            id="ping-of-wrong-length",
        ),
        pytest.param(
            PREFACE + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00" + b"\x00\x00\x04\x01\x05\x00\x00\x00\x01\xff\xff\xff\xff",
            id="undecodable-header-block",
        ),
        pytest.param(
            PREFACE + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00" + b"\x00\x00\x03\x08\x00\x00\x00\x00\x00\x00\x00\x01",
            id="window-update-of-wrong-length",
        ),
        pytest.param(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + b"\x00" * 40, id="http1-request"),
    ],
)
async def test_malformed_frames_from_a_client_end_that_connection_only(env: ProxyEnv, garbage: bytes) -> None:
    start = time.monotonic()
    got = await asyncio.to_thread(_raw_exchange, env.listen_path, garbage)
    if env.kind == "relay":  # grpcio's own HTTP/2 server may answer differently (no GOAWAY)
        assert time.monotonic() - start < 4, "the relay kept a broken connection open"
        if got.startswith(b"\x00"):
            assert 7 in _frame_types(got), f"no GOAWAY in {got[:80]!r}"
    # The transport still serves everyone else.
    assert await env.channel().unary_unary("/test.Echo/Unary")(b"still here", timeout=10) == b"still here"


async def test_stop_drains_in_flight_calls(env: ProxyEnv) -> None:
    channel = env.channel()
    call = channel.unary_unary("/test.Echo/Slow")
    slow = asyncio.ensure_future(call(b"drain", metadata=(("x-sleep", "0.5"),), timeout=10))
    await asyncio.wait_for(env.record.started_event("Slow").wait(), timeout=10)
    assert env.transport is not None
    start = time.monotonic()
    await env.transport.stop(5)
    assert await slow == b"drain"
    assert time.monotonic() - start < 4
    assert not os.path.exists(env.listen_path)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await env.channel().unary_unary("/test.Echo/Unary")(b"x", timeout=3)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_stop_gives_up_after_grace(env: ProxyEnv) -> None:
    call = env.channel().unary_unary("/test.Echo/Slow")
    slow = asyncio.ensure_future(call(b"late", metadata=(("x-sleep", "30"),), timeout=30))
    await asyncio.wait_for(env.record.started_event("Slow").wait(), timeout=10)
    assert env.transport is not None
    start = time.monotonic()
    await env.transport.stop(0.3)
    assert time.monotonic() - start < 3
    with pytest.raises(grpc.aio.AioRpcError):
        await asyncio.wait_for(slow, timeout=5)


async def test_listen_socket_is_0660_and_a_stale_socket_is_replaced(bare_env: ProxyEnv) -> None:
    env = bare_env
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(env.listen_path)
    stale.close()  # leaves the socket file behind, with nobody listening
    await env.start_backend()
    await env.start_proxy()
    assert stat.S_IMODE(os.stat(env.listen_path).st_mode) == 0o660
    assert await env.channel().unary_unary("/test.Echo/Unary")(b"ok", timeout=10) == b"ok"
