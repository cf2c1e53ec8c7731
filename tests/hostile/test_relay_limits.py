"""The relay's resource limits (``runtime_proxy/cri/relay/_limits.py``) under attack.

Each test attacks a relay in its own process (``relay_attacks.RelayProcess``) so that the
relay's memory can be read, while healthy calls go on over other connections. Each checks that
the limit was hit (its metric), that only the attacking connection or call ended, and that the
relay's memory stayed bounded. Without the limits these attacks took the relay from about
41 MiB to 789 MiB (8 intercepted calls of 40 MiB) and 105 MiB (an intercepted stream that never
stops and never reads); see ``relay_attacks.py`` for the figures.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from relay_attacks import (
    GRPC_OPTIONS,
    MiB,
    RelayProcess,
    big_intercepted_calls,
    continuation_flood,
    healthy_call,
    while_healthy,
    window_flood,
)

ENHANCE_YOUR_CALM = 0xB
FLOW_CONTROL_ERROR = 0x3


@pytest.fixture
def relay() -> Iterator[RelayProcess]:
    proc = RelayProcess()
    try:
        healthy_call(proc.path)  # warm: the figures below are growth over a working relay
        yield proc
    finally:
        proc.close()


def _growth_mib(proc: RelayProcess, before: dict[str, int]) -> float:
    return (proc.settle()["hwm_kib"] - before["hwm_kib"]) / 1024


@pytest.mark.parametrize(
    "backend",
    [
        pytest.param(True, id="a header block that never ends is cut off while the backend is up"),
        pytest.param(False, id="a header block that never ends is cut off while the backend is down"),
    ],
)
def test_header_block_without_end_gets_goaway(backend: bool) -> None:
    proc = RelayProcess(backend=backend)
    try:
        before = proc.stats()
        flood = continuation_flood(proc.path, 64 * MiB)
        assert flood.goaway_code() == ENHANCE_YOUR_CALM
        assert flood.sent < 8 * MiB  # the relay stopped reading long before the end
        flood.close()
        assert proc.settle()["hits"]["header_block"] == 1
        assert _growth_mib(proc, before) < 8
        if backend:
            assert healthy_call(proc.path) == b"ping"
        assert proc.alive()
    finally:
        proc.close()


def test_big_intercepted_calls_are_refused_and_memory_stays_bounded(relay: RelayProcess) -> None:
    before = relay.stats()
    codes, healthy = while_healthy(relay.path, lambda: big_intercepted_calls(relay.path, 8, 40 * MiB))
    assert codes == ["RESOURCE_EXHAUSTED"] * 8
    assert healthy >= 1
    after = relay.settle()
    assert after["hits"]["stream_buffer"] + after["hits"]["connection_buffer"] >= 8
    assert after["buffered"] == 0
    # The relay holds 32 MiB per connection at most; at the peak the bytearrays' over-allocation,
    # the unparsed input and the allocator's arenas can add as much again (measured 50 to 67 MiB,
    # more under load), against 748 MiB without limits.
    assert _growth_mib(relay, before) < 80


def test_data_past_the_connection_window_gets_flow_control_error(relay: RelayProcess) -> None:
    """The backend may grant connection window as fast as the flood arrives (it discards a
    message over its size limit and returns the window for it), and then nothing was violated;
    a loaded machine makes that likely. So the flood runs up to three times, on a new connection
    each time, until one is caught: every caught flood is counted once and answered with
    FLOW_CONTROL_ERROR, and healthy calls go on throughout."""
    before = relay.stats()
    codes: list[int | None] = []
    healthy = 0
    while len(codes) < 3 and FLOW_CONTROL_ERROR not in codes:
        flood, calls = while_healthy(relay.path, lambda: window_flood(relay.path, 64 * MiB, "/test.Echo/Bidi"))
        codes.append(flood.goaway_code())
        flood.close()
        healthy += calls
        if codes[-1] != FLOW_CONTROL_ERROR:
            assert flood.sent >= 64 * MiB, f"the relay ended an uncaught flood early: {codes}"
    assert FLOW_CONTROL_ERROR in codes, codes
    assert healthy >= 1
    assert relay.settle()["hits"]["flow_control"] == codes.count(FLOW_CONTROL_ERROR)
    assert _growth_mib(relay, before) < 8


def test_intercepted_stream_that_never_ends_and_never_reads_stays_bounded(relay: RelayProcess) -> None:
    before = relay.stats()
    flood, healthy = while_healthy(relay.path, lambda: window_flood(relay.path, 96 * MiB, "/test.Hooked/Unary"))
    assert healthy >= 1
    row = relay.stats()
    assert row["hits"]["stream_buffer"] == 1
    assert row["buffered"] == 0  # the refused call's bytes were let go at once
    assert _growth_mib(relay, before) < 40  # the 16 MiB stream cap, with the bytearray's slack
    flood.close()
    assert relay.alive()


def _calls(path: str, payloads: list[bytes]) -> list[str]:
    """The codes of ``payloads`` sent at once to an intercepted method over one new connection."""
    options = [*GRPC_OPTIONS, ("grpc.use_local_subchannel_pool", 1)]
    with grpc.insecure_channel(f"unix:{path}", options=options) as channel:
        call = channel.unary_unary("/test.Hooked/Unary")
        futures = [call.future(p, timeout=30) for p in payloads]
        codes = []
        for f in futures:
            try:
                f.result()
                codes.append("OK")
            except grpc.RpcError as err:
                codes.append(err.code().name)
        return codes


def test_intercepted_calls_past_the_concurrency_cap_are_refused() -> None:
    proc = RelayProcess(limits={"intercepted_streams": 4})
    try:
        codes = _calls(proc.path, [b"sleep:0.5:"] * 10)
        assert sorted(codes) == ["OK"] * 4 + ["RESOURCE_EXHAUSTED"] * 6
        assert proc.stats()["hits"]["intercepted_streams"] == 6
        assert _calls(proc.path, [b"after"]) == ["OK"]  # the cap counts open calls only
    finally:
        proc.close()


def test_intercepted_calls_past_the_connection_buffer_are_refused() -> None:
    proc = RelayProcess(limits={"connection_buffer": 1 * MiB})
    try:
        payload = b"sleep:0.5:" + bytes(600 * 1024)
        codes = _calls(proc.path, [payload] * 3)
        assert "OK" in codes and "RESOURCE_EXHAUSTED" in codes
        row = proc.stats()
        assert row["hits"]["connection_buffer"] >= 1
        assert row["buffered"] == 0
        with ThreadPoolExecutor(2) as pool:  # another connection has its own buffer
            assert list(pool.map(lambda _i: _calls(proc.path, [payload]), range(2))) == [["OK"], ["OK"]]
    finally:
        proc.close()


class _NoHooks:
    def intercepts(self, method: str) -> bool:
        return False

    async def before(self, method: str, request: bytes) -> object:
        raise AssertionError("nothing is intercepted")

    async def undecodable(self, method: str, reason: str) -> None:
        return None


async def test_listen_directory_is_created() -> None:
    from runtime_proxy.cri.relay import RelayTransport

    with tempfile.TemporaryDirectory(prefix="rhp-d-", dir="/tmp") as tmp:
        listen = os.path.join(tmp, "run", "rhp", "proxy.sock")
        transport = RelayTransport(listen, os.path.join(tmp, "none.sock"), _NoHooks())
        await transport.start()
        try:
            assert os.path.exists(listen)
        finally:
            await transport.stop(0)
