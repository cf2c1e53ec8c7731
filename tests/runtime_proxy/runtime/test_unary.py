"""``runtime_proxy.runtime.unary`` against an in-process HTTP/2 server on a unix socket
(``h2_server``): answers well formed, refused, oversized, cut, reset, malformed or never sent."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import h2.errors
import pytest
from hyperframe.frame import GoAwayFrame

from runtime_proxy.cri.relay._intercept import resume_coro
from runtime_proxy.runtime.unary import RpcError, StatusCode, UnaryChannel
from tests.runtime_proxy.runtime.h2_server import Handler, Server, Stream

pytestmark = pytest.mark.timeout(60)


async def echo(s: Stream) -> None:
    await s.answer(s.request[5:])


class Env:
    def __init__(self, tmp: Path) -> None:
        self.path = str(tmp / "rt.sock")
        self.handler: Handler = echo
        self.server = Server(self.path, self._handle)
        self.channel = UnaryChannel(self.path, max_answer=1 << 20)

    async def _handle(self, s: Stream) -> None:
        await self.handler(s)

    async def call(self, request: bytes = b"ping", timeout: float = 5.0) -> bytes:
        return await self.channel.call("/t.S/M", request, timeout=timeout)

    async def fails(self, code: StatusCode, request: bytes = b"ping", timeout: float = 5.0) -> RpcError:
        with pytest.raises(RpcError) as info:
            await self.call(request, timeout)
        assert info.value.code == code, info.value
        return info.value


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    e = Env(tmp_path)
    await e.server.start()
    yield e
    await e.channel.close()
    await e.server.stop()


async def test_answer_and_request_headers(env: Env) -> None:
    seen: list[Stream] = []

    async def handler(s: Stream) -> None:
        seen.append(s)
        await echo(s)

    env.handler = handler
    assert await env.call(b"hello", timeout=3) == b"hello"
    h = seen[0].headers
    assert seen[0].path == "/t.S/M"
    assert h[b"content-type"] == b"application/grpc" and h[b"te"] == b"trailers"
    assert h[b"grpc-timeout"] == b"3000m"
    assert seen[0].request == b"\0\0\0\0\5hello"
    assert await env.call(b"") == b""


async def test_error_status_and_percent_encoded_message(env: Env) -> None:
    async def handler(s: Stream) -> None:
        s.headers_out()
        s.trailers(5, b"container %22x%22 not found")

    env.handler = handler
    err = await env.fails(StatusCode.NOT_FOUND)
    assert err.message == 'container "x" not found'
    assert str(err) == 'NOT_FOUND: container "x" not found'


async def test_trailers_only_answer(env: Env) -> None:
    async def handler(s: Stream) -> None:
        s.headers_out(end=True, extra=((b"grpc-status", b"12"), (b"grpc-message", b"unknown method")))

    env.handler = handler
    err = await env.fails(StatusCode.UNIMPLEMENTED)
    assert err.message == "unknown method"


@pytest.mark.parametrize("status", [b"99", b"-1", b"x", b"1" * 5000])
async def test_unreadable_status_is_unknown(env: Env, status: bytes) -> None:
    async def handler(s: Stream) -> None:
        s.headers_out()
        await s.data(b"\0\0\0\0\0")
        s.conn.send_headers(s.stream_id, [(b"grpc-status", status)], end_stream=True)
        s.flush()

    env.handler = handler
    await env.fails(StatusCode.UNKNOWN)


async def test_missing_trailers(env: Env) -> None:
    async def handler(s: Stream) -> None:
        s.headers_out()
        await s.data(b"\0\0\0\0\2ok", end=True)

    env.handler = handler
    err = await env.fails(StatusCode.INTERNAL)
    assert "grpc-status" in err.message


async def test_cut_message(env: Env) -> None:
    async def handler(s: Stream) -> None:
        s.headers_out()
        await s.data(b"\0\0\0\0\x09ok")
        s.trailers(0)

    env.handler = handler
    await env.fails(StatusCode.INTERNAL)


@pytest.mark.parametrize(("status", "code"), [(b"503", StatusCode.UNAVAILABLE), (b"404", StatusCode.UNIMPLEMENTED),
                                              (b"418", StatusCode.UNKNOWN)])
async def test_http_error_status(env: Env, status: bytes, code: StatusCode) -> None:
    async def handler(s: Stream) -> None:
        s.headers_out(status=status, end=True)

    env.handler = handler
    await env.fails(code)


async def test_not_grpc_content_type(env: Env) -> None:
    async def handler(s: Stream) -> None:
        s.conn.send_headers(s.stream_id, [(b":status", b"200"), (b"content-type", b"text/html")], end_stream=True)
        s.flush()

    env.handler = handler
    await env.fails(StatusCode.UNKNOWN)


async def test_compressed_answer_refused(env: Env) -> None:
    async def handler(s: Stream) -> None:
        s.headers_out()
        await s.data(b"\1\0\0\0\2ok")
        s.trailers(0)

    env.handler = handler
    await env.fails(StatusCode.INTERNAL)


async def test_large_answer_passes_flow_control(env: Env) -> None:
    big = bytes(range(256)) * 4000  # about 1 MiB, 16 times the default window
    env.channel = UnaryChannel(env.path, max_answer=2 << 20)
    assert await env.call(big, timeout=30) == big


async def test_oversized_answer_is_refused_by_its_prefix(env: Env) -> None:
    sent = asyncio.Event()

    async def handler(s: Stream) -> None:
        if s.request[5:] == b"big":
            s.headers_out()
            await s.data(b"\0" + (2 << 20).to_bytes(4, "big") + b"x" * 100)
            sent.set()
            return
        await echo(s)

    env.handler = handler
    err = await env.fails(StatusCode.RESOURCE_EXHAUSTED, b"big")
    assert str(1 << 20) in err.message
    assert await env.call(b"next") == b"next"  # the connection is still good
    assert len(env.server.sessions) == 1
    await asyncio.sleep(0.05)
    assert env.server.sessions[0].resets == [1]


async def test_more_data_than_the_prefix_says(env: Env) -> None:
    async def handler(s: Stream) -> None:
        s.headers_out()
        await s.data(b"\0\0\0\0\2ok" + b"x" * 100_000)
        s.trailers(0)

    env.handler = handler
    await env.fails(StatusCode.INTERNAL)


async def test_oversized_header_block(env: Env) -> None:
    async def handler(s: Stream) -> None:
        if s.request[5:] == b"big":
            s.headers_out(extra=tuple((f"x-h{i}".encode(), b"v" * 1000) for i in range(100)))
            return
        await echo(s)

    env.handler = handler
    await env.fails(StatusCode.INTERNAL, b"big")
    assert await env.call(b"after") == b"after"  # a new connection
    assert len(env.server.sessions) == 2


@pytest.mark.parametrize(("error", "code"), [(h2.errors.ErrorCodes.CANCEL, StatusCode.CANCELLED),
                                             (h2.errors.ErrorCodes.INTERNAL_ERROR, StatusCode.INTERNAL),
                                             (h2.errors.ErrorCodes.REFUSED_STREAM, StatusCode.UNAVAILABLE)])
async def test_rst_stream(env: Env, error: h2.errors.ErrorCodes, code: StatusCode) -> None:
    async def handler(s: Stream) -> None:
        if s.request[5:] == b"reset":
            s.headers_out()
            await s.data(b"\0\0\0\0\x09abc")
            s.conn.reset_stream(s.stream_id, error)
            s.flush()
            return
        await echo(s)

    env.handler = handler
    await env.fails(code, b"reset")
    assert await env.call(b"next") == b"next"


async def test_goaway_ends_calls_in_flight(env: Env) -> None:
    held: list[Stream] = []

    async def handler(s: Stream) -> None:
        held.append(s)
        if len(held) == 3:
            s.conn.close_connection(h2.errors.ErrorCodes.ENHANCE_YOUR_CALM)
            s.flush()

    env.handler = handler
    results = await asyncio.gather(*(env.call(timeout=5) for _ in range(3)), return_exceptions=True)
    assert all(isinstance(r, RpcError) and r.code == StatusCode.UNAVAILABLE for r in results), results
    env.handler = echo
    assert await env.call(b"again") == b"again"
    assert len(env.server.sessions) == 2


async def test_graceful_goaway_also_ends_older_streams(env: Env) -> None:
    held: list[Stream] = []

    async def handler(s: Stream) -> None:
        held.append(s)
        if len(held) < 2:
            return
        goaway = GoAwayFrame(0)  # raw: h2 sends nothing more after its own GOAWAY
        goaway.last_stream_id, goaway.error_code = 1, 0
        s.raw(goaway.serialize())
        await held[0].answer(b"first")

    env.handler = handler
    first = asyncio.ensure_future(env.call())
    await asyncio.sleep(0.05)
    await env.fails(StatusCode.UNAVAILABLE)
    with pytest.raises(RpcError) as info:
        await first
    assert info.value.code == StatusCode.UNAVAILABLE
    env.handler = echo
    assert await env.call(b"again") == b"again"


async def test_silent_server_meets_the_deadline(env: Env) -> None:
    async def handler(s: Stream) -> None:
        await asyncio.sleep(30)

    env.handler = handler
    loop = asyncio.get_running_loop()
    started = loop.time()
    err = await env.fails(StatusCode.DEADLINE_EXCEEDED, timeout=0.3)
    assert 0.3 <= loop.time() - started < 2
    assert "0.3" in err.message
    await asyncio.sleep(0.05)
    assert env.server.sessions[0].resets == [1]  # the stream was cancelled


async def test_connection_dropped_mid_answer(env: Env) -> None:
    async def handler(s: Stream) -> None:
        s.headers_out()
        await s.data(b"\0\0\0\1\0" + b"x" * 100)
        await asyncio.sleep(0.05)
        s.server.writer.close()

    env.handler = handler
    await env.fails(StatusCode.UNAVAILABLE)
    env.handler = echo
    assert await env.call(b"back") == b"back"


@pytest.mark.parametrize("garbage", [
    b"\xff" * 64,  # not a frame
    b"\0\0\4\x08\0\0\0\0\0\0\0\0\0",  # WINDOW_UPDATE of increment 0 on the connection
    b"\0\0\x05\0\0\0\0\0\0hello",  # DATA on stream 0
    b"\x01\0\0\1\4\0\0\0\1",  # HEADERS frame longer than the frame size
])
async def test_malformed_frames(env: Env, garbage: bytes) -> None:
    async def handler(s: Stream) -> None:
        if s.request[5:] == b"bad":
            s.raw(garbage)
            return
        await echo(s)

    env.handler = handler
    err = await env.fails(StatusCode.INTERNAL, b"bad")
    assert "protocol error" in err.message
    assert await env.call(b"fine") == b"fine"


async def test_many_concurrent_calls_share_one_connection(env: Env) -> None:
    async def handler(s: Stream) -> None:
        await asyncio.sleep(0.01 * (s.stream_id % 7))
        await echo(s)

    env.handler = handler
    requests = [f"call-{i}".encode() * (i % 50 + 1) for i in range(300)]
    answers = await asyncio.gather(*(env.call(r, timeout=30) for r in requests))
    assert answers == requests
    assert len(env.server.sessions) == 1


async def test_reconnects_after_the_server_restarts(env: Env) -> None:
    assert await env.call(b"one") == b"one"
    await env.server.stop()
    Path(env.path).unlink()
    await env.fails(StatusCode.UNAVAILABLE)
    await env.fails(StatusCode.UNAVAILABLE)
    env.server = Server(env.path, echo)
    await env.server.start()
    assert await env.call(b"two", timeout=3) == b"two"  # waits out the back-off (at most 1 s)


async def test_refused_within_the_back_off_fails_by_the_deadline(env: Env) -> None:
    await env.server.stop()
    Path(env.path).unlink()
    for _ in range(5):  # the back-off grows to 1 s
        with contextlib.suppress(RpcError):
            await env.call(timeout=2)
    loop = asyncio.get_running_loop()
    started = loop.time()
    await env.fails(StatusCode.UNAVAILABLE, timeout=0.05)
    assert loop.time() - started < 0.5  # no wait for a retry it could not make in time


async def test_close_ends_calls_in_flight(env: Env) -> None:
    async def handler(s: Stream) -> None:
        await asyncio.sleep(30)

    env.handler = handler
    pending = asyncio.ensure_future(env.call(timeout=10))
    await asyncio.sleep(0.05)
    await env.channel.close()
    with pytest.raises(RpcError) as info:
        await pending
    assert info.value.code == StatusCode.CANCELLED
    await env.fails(StatusCode.CANCELLED)


async def test_caller_cancelled_resets_its_stream(env: Env) -> None:
    async def handler(s: Stream) -> None:
        if s.request[5:] == b"slow":
            await asyncio.sleep(30)
        await echo(s)

    env.handler = handler
    slow = asyncio.ensure_future(env.call(b"slow"))
    await asyncio.sleep(0.05)
    slow.cancel()
    with pytest.raises(asyncio.CancelledError):
        await slow
    assert await env.call(b"quick") == b"quick"
    assert env.server.sessions[0].resets == [1]


async def test_a_call_started_outside_any_task(env: Env) -> None:
    """The relay runs a hook's coroutine at once until it first waits, outside any task
    (``_start_eager``), then resumes it in one: a runtime call made there works."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[bytes] = loop.create_future()
    tasks: list[asyncio.Task[None]] = []

    async def hook() -> None:
        try:
            done.set_result(await env.call(b"eager", timeout=5))
        except BaseException as exc:  # handed to the test
            done.set_exception(exc)

    def start() -> None:
        assert asyncio.current_task() is None
        coro = hook()
        try:
            first = coro.send(None)
        except StopIteration:
            return
        tasks.append(loop.create_task(resume_coro(coro, first)))

    loop.call_soon(start)
    assert await asyncio.wait_for(done, 10) == b"eager"
