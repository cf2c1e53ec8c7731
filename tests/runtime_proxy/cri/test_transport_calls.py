"""The shared correctness suite, part 1: what a caller sees through a transport.

Every test runs once per transport (``relay`` and ``grpc``, see ``conftest.py``). Loops are
bounded in count and every wait has a timeout.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import time
from collections.abc import AsyncIterator

import grpc
import pytest
from conftest import ProxyEnv
from transport_backend import STATUS_DETAILS, RecordingInterceptor, expected

MiB = 1024 * 1024


def _method(env: ProxyEnv, name: str, service: str = "test.Echo") -> str:
    return f"/{service}/{name}"


# --- statuses, metadata, deadlines --------------------------------------------------------------
async def test_unary_echo_passes_bytes_unchanged(env: ProxyEnv) -> None:
    call = env.channel().unary_unary("/test.Echo/Unary")
    payload = bytes(range(256)) * 10
    assert await call(payload, timeout=10) == payload
    assert env.record.calls == [("Unary", payload)]


@pytest.mark.parametrize(
    ("code", "message"),
    [
        pytest.param("NOT_FOUND", "container abc not found", id="not-found-with-message"),
        pytest.param("INVALID_ARGUMENT", "bad value: ünïcödé % 100%", id="invalid-argument-with-unicode-and-percent"),
        pytest.param("FAILED_PRECONDITION", "", id="failed-precondition-with-empty-message"),
        pytest.param("RESOURCE_EXHAUSTED", "too much\nnewline", id="resource-exhausted-with-newline"),
        pytest.param("UNAVAILABLE", "down", id="unavailable-from-backend"),
        pytest.param("INTERNAL", "x" * 2000, id="internal-with-long-message"),
    ],
)
async def test_status_code_message_details_and_trailers_reach_the_caller(
    env: ProxyEnv, code: str, message: str
) -> None:
    call = env.channel().unary_unary("/test.Echo/Error")
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call(b"q", metadata=(("x-code", code), ("x-message-bin", message.encode())), timeout=10)
    err = info.value
    assert err.code() == grpc.StatusCode[code]
    assert err.details() == message
    trailing = dict(err.trailing_metadata() or ())
    assert trailing["x-trailer"] == "t-value"
    assert trailing["x-trailer-bin"] == b"\x00\xff\x10"
    assert trailing["grpc-status-details-bin"] == STATUS_DETAILS


async def test_custom_metadata_goes_both_ways(env: ProxyEnv) -> None:
    call = env.channel().unary_unary("/test.Echo/Unary")
    md = (("x-plain", "value-1"), ("x-utf", "spaces and symbols !#$"), ("x-blob-bin", b"\x00\x01\xfe\xff"))
    c = call(b"m", metadata=md, timeout=10)
    assert await c == b"m"
    initial = dict(await c.initial_metadata())
    trailing = dict(await c.trailing_metadata())
    for key, value in md:
        assert initial[key] == value
        assert trailing["x-t-" + key[2:]] == value


async def test_metadata_seen_by_the_backend(env: ProxyEnv) -> None:
    call = env.channel().unary_unary("/test.Echo/Meta")
    seen = json.loads(await call(b"", metadata=(("x-who", "kubelet"), ("x-b-bin", b"\x01\x02")), timeout=10))
    assert seen["metadata"]["x-who"] == "kubelet"
    assert seen["metadata"]["x-b-bin"] == "0102"


async def test_deadline_reaches_the_backend(env: ProxyEnv) -> None:
    call = env.channel().unary_unary("/test.Echo/Meta")
    seen = json.loads(await call(b"", timeout=5))
    assert seen["deadline"] is not None
    assert 0 < seen["deadline"] <= 5.5  # the backend rounds the propagated grpc-timeout up


async def test_no_deadline_means_none_at_the_backend(env: ProxyEnv) -> None:
    call = env.channel().unary_unary("/test.Echo/Meta")
    seen = json.loads(await call(b""))
    assert seen["deadline"] is None


async def test_deadline_expires_while_the_backend_is_slow(env: ProxyEnv) -> None:
    call = env.channel().unary_unary("/test.Echo/Slow")
    start = time.monotonic()
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call(b"s", metadata=(("x-sleep", "5"),), timeout=0.3)
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert time.monotonic() - start < 3


async def test_unknown_method_is_unimplemented(env: ProxyEnv) -> None:
    call = env.channel().unary_unary("/test.Echo/NoSuchMethod")
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call(b"x", timeout=10)
    assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED


async def test_unknown_intercepted_method_is_unimplemented(env: ProxyEnv) -> None:
    call = env.channel().unary_unary("/test.Hooked/NoSuchMethod")
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call(b"x", timeout=10)
    assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
    # The call still works afterwards (no stream or HPACK state left behind).
    assert await env.channel().unary_unary("/test.Hooked/Unary")(b"ok", timeout=10) == b"ok"


# --- cancel ---------------------------------------------------------------------------------------
async def _wait_for(predicate: object, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached in time")


@pytest.mark.parametrize("service", ["test.Echo", "test.Hooked"], ids=["pass-through", "intercepted"])
async def test_client_cancel_resets_the_upstream_stream(env: ProxyEnv, service: str) -> None:
    call = env.channel().unary_unary(f"/{service}/Slow")
    c = call(b"cancel me", metadata=(("x-sleep", "30"),), timeout=60)
    await asyncio.wait_for(env.record.started_event("Slow").wait(), timeout=10)
    c.cancel()
    with pytest.raises(asyncio.CancelledError):
        await c
    await _wait_for(lambda: "Slow" in env.record.cancelled, timeout=5)


async def test_cancelled_bidi_stream_is_cancelled_upstream(env: ProxyEnv) -> None:
    ch = env.channel()
    c = ch.stream_stream("/test.Echo/Ticker")(timeout=60)
    await c.write(b"start")
    assert await c.read() == b"tick 0"
    assert await c.read() == b"tick 1"
    c.cancel()
    await _wait_for(lambda: "Ticker" in env.record.cancelled, timeout=5)
    # The connection carries on.
    b = ch.stream_stream("/test.Echo/Bidi")(timeout=10)
    await b.write(b"again")
    assert await b.read() == b"again"
    await b.done_writing()


# --- streams ---------------------------------------------------------------------------------------
async def test_bidi_stream_echoes_every_message_in_order(env: ProxyEnv) -> None:
    call = env.channel().stream_stream("/test.Echo/Bidi")
    c = call(timeout=30)
    for i in range(200):
        msg = f"message {i}".encode() * (i % 7 + 1)
        await c.write(msg)
        assert await c.read() == msg
    await c.done_writing()
    assert await c.read() == grpc.aio.EOF
    assert await c.code() == grpc.StatusCode.OK


async def test_server_stream_of_1000_messages(env: ProxyEnv) -> None:
    call = env.channel().unary_stream("/test.Echo/ServerStream")
    got = [m async for m in call(b"x" * 100, metadata=(("x-count", "1000"),), timeout=30)]
    assert got == [b"x" * 100] * 1000


async def test_client_stream_is_concatenated(env: ProxyEnv) -> None:
    call = env.channel().stream_unary("/test.Echo/ClientStream")
    parts = [bytes([i]) * (i * 100) for i in range(50)]

    async def gen() -> AsyncIterator[bytes]:
        for p in parts:
            yield p

    assert await call(gen(), timeout=30) == b"".join(parts)


# --- large messages and concurrency -------------------------------------------------------------
@pytest.mark.parametrize("service", ["test.Echo", "test.Hooked"], ids=["pass-through", "intercepted"])
async def test_4mib_message(env: ProxyEnv, service: str) -> None:
    payload = random.Random(4).randbytes(4 * MiB)
    assert await env.channel().unary_unary(f"/{service}/Unary")(payload, timeout=30) == payload


@pytest.mark.parametrize("service", ["test.Echo", "test.Hooked"], ids=["pass-through", "intercepted"])
async def test_4mib_messages_concurrently(env: ProxyEnv, service: str) -> None:
    call = env.channel().unary_unary(f"/{service}/Unary")
    payloads = [random.Random(i).randbytes(4 * MiB) for i in range(6)]
    results = await asyncio.wait_for(asyncio.gather(*(call(p, timeout=60) for p in payloads)), timeout=60)
    assert results == payloads


async def test_hundreds_of_calls_and_streams_with_fast_calls_not_blocked(env: ProxyEnv) -> None:
    ch = env.channel()
    unary = ch.unary_unary("/test.Echo/Unary")
    hooked = ch.unary_unary("/test.Hooked/Unary")
    slow = ch.unary_unary("/test.Echo/Slow")
    bidi = ch.stream_stream("/test.Echo/Bidi")
    slow_calls = [asyncio.ensure_future(slow(b"s", metadata=(("x-sleep", "2"),), timeout=30)) for _ in range(16)]
    await _wait_for(lambda: sum(1 for m, _ in env.record.calls if m == "Slow") >= 16, timeout=10)

    async def stream(i: int) -> None:
        c = bidi(timeout=30)
        for j in range(20):
            await c.write(b"%d-%d" % (i, j))
            assert await c.read() == b"%d-%d" % (i, j)
        await c.done_writing()

    start = time.monotonic()
    fast = await unary(b"fast", timeout=10)
    fast_latency = time.monotonic() - start
    assert fast == b"fast"
    calls = [unary(b"u%d" % i, timeout=30) for i in range(200)] + [hooked(b"h%d" % i, timeout=30) for i in range(50)]
    results = await asyncio.wait_for(asyncio.gather(*calls, *(stream(i) for i in range(20))), timeout=60)
    assert results[:200] == [b"u%d" % i for i in range(200)]
    assert results[200:250] == [b"h%d" % i for i in range(50)]
    assert not any(s.done() for s in slow_calls) or fast_latency < 1.0
    assert fast_latency < 1.0, f"a fast call waited {fast_latency:.2f}s behind slow ones"
    assert await asyncio.wait_for(asyncio.gather(*slow_calls), timeout=30) == [b"s"] * 16


# --- hooks --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "request_bytes",
    [
        pytest.param(b"grow:100:abc", id="hook-grows-the-message"),
        pytest.param(b"grow:70000:abc", id="hook-grows-past-one-frame-and-window"),
        pytest.param(b"shrink:5:0123456789", id="hook-shrinks-the-message"),
        pytest.param(b"shrink:100000:" + b"z" * 200000, id="hook-shrinks-a-large-message"),
        pytest.param(b"keep:" + b"k" * 10, id="hook-keeps-the-message"),
        pytest.param(b"", id="empty-message"),
    ],
)
async def test_hook_rewrites_the_request(
    env: ProxyEnv, interceptor: RecordingInterceptor, request_bytes: bytes
) -> None:
    want = expected(request_bytes)
    got = await env.channel().unary_unary("/test.Hooked/Unary")(request_bytes, timeout=30)
    assert got == want
    assert env.record.calls == [("Unary", want)]
    assert interceptor.before_calls == [("/test.Hooked/Unary", request_bytes)]
    assert interceptor.after_calls == [("/test.Hooked/Unary", want, want)]


async def test_hook_rejection_answers_the_caller_and_spares_the_backend(
    env: ProxyEnv, interceptor: RecordingInterceptor
) -> None:
    call = env.channel().unary_unary("/test.Hooked/Unary")
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call(b"reject:please", timeout=10)
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert info.value.details() == RecordingInterceptor.REJECT_MESSAGE
    assert env.record.calls == []
    assert interceptor.after_calls == []
    # The connection is still good for both kinds of calls.
    assert await call(b"fine", timeout=10) == b"fine"
    assert await env.channel().unary_unary("/test.Echo/Unary")(b"pass", timeout=10) == b"pass"


async def test_hook_that_raises_gives_internal(env: ProxyEnv) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await env.channel().unary_unary("/test.Hooked/Unary")(b"boom:", timeout=10)
    assert info.value.code() == grpc.StatusCode.INTERNAL
    assert env.record.calls == []


async def test_after_is_not_called_when_the_backend_fails(env: ProxyEnv, interceptor: RecordingInterceptor) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await env.channel().unary_unary("/test.Hooked/Error")(b"x", metadata=(("x-code", "NOT_FOUND"),), timeout=10)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    assert len(interceptor.before_calls) == 1
    assert interceptor.after_calls == []


async def test_compressed_request_on_intercepted_method_is_never_forwarded_unhooked_under_fail_policy(
    env: ProxyEnv, interceptor: RecordingInterceptor
) -> None:
    """The relay sees the compressed message and refuses it (``undecodable`` raises); the grpcio
    transport receives it already decompressed by grpcio and hooks it. Either way the backend
    never gets the request unhooked."""
    call = env.channel().unary_unary("/test.Hooked/Unary")
    payload = b"grow:10:" + b"squeeze " * 1000
    try:
        got = await call(payload, compression=grpc.Compression.Gzip, timeout=10)
    except grpc.aio.AioRpcError as exc:
        assert exc.code() == grpc.StatusCode.INTERNAL
        assert env.record.calls == []
        assert interceptor.undecodable_calls and interceptor.before_calls == []
    else:
        assert got == expected(payload)
        assert env.record.calls == [("Unary", expected(payload))]
        assert interceptor.before_calls == [("/test.Hooked/Unary", payload)]


async def test_compressed_request_under_ignore_policy_reaches_the_backend(
    env: ProxyEnv, interceptor: RecordingInterceptor
) -> None:
    interceptor.fail_policy = False
    call = env.channel().unary_unary("/test.Hooked/Unary")
    payload = b"grow:10:" + b"squeeze " * 1000
    got = await call(payload, compression=grpc.Compression.Gzip, timeout=10)
    if interceptor.undecodable_calls:  # forwarded unhooked, as the policy allows
        assert got == payload
        assert env.record.calls == [("Unary", payload)]
        assert interceptor.before_calls == []
    else:  # decompressed by the transport and hooked
        assert got == expected(payload)
        assert env.record.calls == [("Unary", expected(payload))]


async def test_compressed_pass_through_call_is_untouched(env: ProxyEnv) -> None:
    call = env.channel().unary_unary("/test.Echo/Unary")
    payload = b"squeeze " * 1000
    assert await call(payload, compression=grpc.Compression.Gzip, timeout=10) == payload


async def test_slow_hook_does_not_block_other_calls(env: ProxyEnv) -> None:
    ch = env.channel()
    slow_hook = asyncio.ensure_future(ch.unary_unary("/test.Hooked/Unary")(b"sleep:1.5:", timeout=30))
    await asyncio.sleep(0.1)
    start = time.monotonic()
    assert await ch.unary_unary("/test.Echo/Unary")(b"quick", timeout=10) == b"quick"
    assert await ch.unary_unary("/test.Hooked/Unary")(b"quick", timeout=10) == b"quick"
    assert time.monotonic() - start < 1.0
    assert await slow_hook == b"sleep:1.5:"


async def test_stress_size_changing_hooks_with_large_messages(env: ProxyEnv, interceptor: RecordingInterceptor) -> None:
    rng = random.Random(8)
    ch = env.channel()
    hooked = ch.unary_unary("/test.Hooked/Unary")
    plain = ch.unary_unary("/test.Echo/Unary")
    bidi = ch.stream_stream("/test.Echo/Bidi")
    jobs = []
    wants = []
    for i in range(48):
        body = rng.randbytes(rng.choice([10, 1000, 70_000, 300_000, 1 * MiB, 3 * MiB]))
        kind = i % 4
        if kind == 0:
            req = b"grow:%d:" % rng.randint(1, 100_000) + body
            jobs.append(hooked(req, timeout=60))
        elif kind == 1:
            req = b"shrink:%d:" % rng.randint(1, max(1, len(body) // 2)) + body
            jobs.append(hooked(req, timeout=60))
        elif kind == 2:
            req = body
            jobs.append(plain(req, timeout=60))
        else:
            req = b"keep:" + body
            jobs.append(hooked(req, timeout=60))
        wants.append(expected(req))

    async def streamer() -> list[bytes]:
        c = bidi(timeout=60)
        out = []
        for j in range(30):
            msg = rng.randbytes(50_000 + j)
            await c.write(msg)
            got = await c.read()
            out.append(hashlib.sha256(got).digest() == hashlib.sha256(msg).digest())
        await c.done_writing()
        return out  # type: ignore[return-value]

    results = await asyncio.wait_for(asyncio.gather(*jobs, streamer()), timeout=90)
    for i, (got, want) in enumerate(zip(results[:-1], wants, strict=True)):
        assert got == want, f"call {i}: {len(got)} bytes, wanted {len(want)}"
    assert all(results[-1])
    assert len(interceptor.after_calls) == 36
