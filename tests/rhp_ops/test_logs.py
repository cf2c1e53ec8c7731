"""The shared log set-up (``rhp_ops.logs``): structlog and the standard ``logging`` module end up
as the same JSON lines on stderr, gRPC errors are shortened, and repeats are counted."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
import structlog
from grpc import aio

from rhp_ops import logs


@pytest.fixture
def stream() -> Iterator[io.StringIO]:
    out = io.StringIO()
    logs.configure("json", "info", stream=out)
    yield out
    structlog.reset_defaults()
    root = logging.getLogger()
    for handler in list(root.handlers):
        if handler.get_name() == "rhp_ops":
            root.removeHandler(handler)


def _lines(stream: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def _rpc_error() -> aio.AioRpcError:
    return aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, aio.Metadata(), aio.Metadata(),
                           details="failed to connect to all addresses", debug_error_string="x" * 300)


def test_structlog_and_stdlib_lines_are_the_same_json(stream: io.StringIO) -> None:
    structlog.get_logger("a").warning("from structlog", n=1)
    logging.getLogger("urllib3.connectionpool").warning("Retrying (%s) after %s", "Retry(total=2)", "reset")
    first, second = _lines(stream)
    assert first["event"] == "from structlog" and first["level"] == "warning" and first["n"] == 1
    assert second["event"] == "Retrying (Retry(total=2)) after reset"
    assert second["level"] == "warning" and second["logger"] == "urllib3.connectionpool"
    assert first.keys() >= {"timestamp"} and second.keys() >= {"timestamp"}


def test_chatty_libraries_log_info_only_at_debug(stream: io.StringIO) -> None:
    logging.getLogger("urllib3.connectionpool").info("Starting new HTTP connection")
    logging.getLogger("myapp").info("kept")
    assert [line["event"] for line in _lines(stream)] == ["kept"]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param(_rpc_error(), "UNAVAILABLE: failed to connect to all addresses",
                     id="an AioRpcError object becomes its code and details"),
        pytest.param(str(_rpc_error()), "UNAVAILABLE: failed to connect to all addresses",
                     id="the multi-line text of an AioRpcError becomes its code and details"),
        pytest.param("<AioRpcError of RPC that terminated with:\n\tstatus = StatusCode.CANCELLED\n>", "CANCELLED",
                     id="an error text without details keeps its code"),
        pytest.param("plain text", "plain text", id="any other text is left alone"),
        pytest.param("<AioRpcError of RPC that terminated with:" + "x" * 100_000, None,
                     id="a text too long to be an error of ours is left alone"),
    ],
)
def test_rpc_errors_are_shortened(value: object, expected: str | None) -> None:
    out = logs.shorten_rpc_errors(None, "warning", {"event": "e", "error": value})
    assert out["error"] == (value if expected is None else expected)


def test_repeats_are_dropped_within_the_window_and_counted_after() -> None:
    now = [0.0]
    limiter = logs.RepeatLimiter(10.0, clock=lambda: now[0])
    line = {"event": "runtime down", "level": "warning", "error": "UNAVAILABLE"}
    assert limiter(None, "warning", dict(line, timestamp="t0")) == dict(line, timestamp="t0")
    for _ in range(4):
        now[0] += 1
        with pytest.raises(structlog.DropEvent):
            limiter(None, "warning", dict(line, timestamp="t1"))
    other = {**line, "error": "DEADLINE_EXCEEDED"}
    assert "repeated" not in limiter(None, "warning", other)
    now[0] += 10
    assert limiter(None, "warning", dict(line))["repeated"] == 4
    now[0] += 1
    with pytest.raises(structlog.DropEvent):
        limiter(None, "warning", dict(line))


def test_info_lines_are_never_limited() -> None:
    limiter = logs.RepeatLimiter(10.0, clock=lambda: 0.0)
    for _ in range(3):
        assert limiter(None, "info", {"event": "tick", "level": "info"})["event"] == "tick"


def test_a_flood_of_distinct_errors_keeps_bounded_memory() -> None:
    limiter = logs.RepeatLimiter(10.0, max_kinds=16, clock=lambda: 0.0)
    for i in range(1000):
        limiter(None, "error", {"event": "bad pod", "level": "error", "pod": f"p{i}"})
    assert len(limiter._seen) == 16


def test_repeats_end_to_end_through_structlog(stream: io.StringIO) -> None:
    log = structlog.get_logger("x")
    for _ in range(50):
        log.warning("runtime not reachable", error=str(_rpc_error()))
    (only,) = _lines(stream)
    assert only["error"] == "UNAVAILABLE: failed to connect to all addresses"
