"""The call metrics (``runtime_proxy.metrics``): both transports record the same calls the same way.

Timed calls are the known unary CRI methods and the intercepted ones, as the grpc transport's
unary handler serves them: one ``rhp_cri_call_duration_seconds`` observation each, and one
``rhp_cri_call_errors_total{code}`` count when the caller's status is not OK. Other calls
(streams, unknown methods) are not timed.
"""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest
from conftest import ProxyEnv
from prometheus_client import REGISTRY

VERSION = "/runtime.v1.RuntimeService/Version"  # a known unary CRI method; the test backend lacks it


def _count(method: str) -> float:
    return REGISTRY.get_sample_value("rhp_cri_call_duration_seconds_count", {"method": method}) or 0.0


def _sum(method: str) -> float:
    return REGISTRY.get_sample_value("rhp_cri_call_duration_seconds_sum", {"method": method}) or 0.0


def _errors(method: str, code: str) -> float:
    return REGISTRY.get_sample_value("rhp_cri_call_errors_total", {"method": method, "code": code}) or 0.0


async def _until(check: object, timeout: float = 5.0) -> None:
    """Wait until ``check()`` holds: a transport may record just after the caller has its answer."""
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError("metric not recorded in time")
        await asyncio.sleep(0.01)


async def test_intercepted_ok_call_is_timed_without_error(env: ProxyEnv) -> None:
    method = "/test.Hooked/Unary"
    count, total = _count(method), _sum(method)
    call = env.channel().unary_unary(method)
    for _ in range(3):
        assert await call(b"grow:2:x", timeout=10) == b"grow:2:x\x03\x0a"
    await _until(lambda: _count(method) == count + 3)
    assert _sum(method) > total
    assert _errors(method, "OK") == 0


@pytest.mark.parametrize(
    ("request_body", "code"), [(b"reject:", "FAILED_PRECONDITION"), (b"boom:", "INTERNAL")]
)
async def test_call_refused_by_the_hook_counts_as_an_error(env: ProxyEnv, request_body: bytes, code: str) -> None:
    method = "/test.Hooked/Unary"
    count, errors = _count(method), _errors(method, code)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await env.channel().unary_unary(method)(request_body, timeout=10)
    assert info.value.code().name == code
    await _until(lambda: _errors(method, code) == errors + 1)
    assert _count(method) == count + 1


async def test_backend_status_is_the_code(env: ProxyEnv) -> None:
    method = "/test.Hooked/Error"
    errors = _errors(method, "NOT_FOUND")
    with pytest.raises(grpc.aio.AioRpcError):
        await env.channel().unary_unary(method)(b"e", metadata=(("x-code", "NOT_FOUND"),), timeout=10)
    await _until(lambda: _errors(method, "NOT_FOUND") == errors + 1)


async def test_known_cri_method_passing_through_is_timed(env: ProxyEnv) -> None:
    count, errors = _count(VERSION), _errors(VERSION, "UNIMPLEMENTED")
    call = env.channel().unary_unary(VERSION)
    for _ in range(3):  # the later answers' header blocks are fully indexed: the cached path
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call(b"", timeout=10)
        assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
    await _until(lambda: _errors(VERSION, "UNIMPLEMENTED") == errors + 3)
    assert _count(VERSION) == count + 3


async def test_other_calls_are_not_timed(env: ProxyEnv) -> None:
    method = "/test.Echo/Unary"
    assert await env.channel().unary_unary(method)(b"x", timeout=10) == b"x"
    assert _count(method) == 0


async def test_backend_missing_counts_unavailable(bare_env: ProxyEnv) -> None:
    env = bare_env
    await env.start_proxy()
    errors = _errors(VERSION, "UNAVAILABLE")
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await env.channel().unary_unary(VERSION)(b"", timeout=10)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    await _until(lambda: _errors(VERSION, "UNAVAILABLE") >= errors + 1)


async def test_cancelled_call_counts_cancelled(env: ProxyEnv) -> None:
    method = "/test.Hooked/Slow"
    errors = _errors(method, "CANCELLED")
    call = env.channel().unary_unary(method)(b"s", metadata=(("x-sleep", "10"),), timeout=30)
    await asyncio.wait_for(env.record.started_event("Slow").wait(), 10)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    await _until(lambda: _errors(method, "CANCELLED") == errors + 1)
