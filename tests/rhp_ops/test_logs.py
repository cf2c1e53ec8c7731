"""The shared log set-up (``rhp_ops.logs``): structlog and the standard ``logging`` module end up
as the same JSON lines on stderr, gRPC errors are shortened, and repeats are counted."""

from __future__ import annotations

import io
import json
import logging
import threading
import time
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


def test_a_kind_is_remembered_without_its_text() -> None:
    """512 kinds of per-pod warnings kept their text, about 0.4 MiB of a node agent (issue 35)."""
    limiter = logs.RepeatLimiter(10.0, max_kinds=512, clock=lambda: 0.0)
    for i in range(600):
        limiter(None, "warning", {"event": "x" * 400, "level": "warning", "pod": f"p{i}" * 100})
    assert len(limiter._seen) == 512 and all(type(k) is int for k in limiter._seen)
    with pytest.raises(structlog.DropEvent):  # the newest kinds are still known
        limiter(None, "warning", {"event": "x" * 400, "level": "warning", "pod": "p599" * 100})
    assert limiter(None, "warning", {"event": "x" * 400, "level": "warning", "pod": "p0" * 100})["pod"] == "p0" * 100


def test_repeats_end_to_end_through_structlog(stream: io.StringIO) -> None:
    log = structlog.get_logger("x")
    for _ in range(50):
        log.warning("runtime not reachable", error=str(_rpc_error()))
    (only,) = _lines(stream)
    assert only["error"] == "UNAVAILABLE: failed to connect to all addresses"


def _limiter_of_the_handler() -> logs.RepeatLimiter:
    (handler,) = [h for h in logging.getLogger().handlers if h.get_name() == "rhp_ops"]
    (found,) = [f for f in handler.filters if isinstance(f, logs.RepeatFilter)]
    return found.limiter


def _in_a_thread(body: Any) -> list[BaseException]:
    """Run ``body`` in a thread (as the Kubernetes client's watch threads log) and return what
    escaped it, of any kind."""
    escaped: list[BaseException] = []

    def run() -> None:
        try:
            body()
        except BaseException as exc:  # the test is that nothing escapes, of any kind
            escaped.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(timeout=60)
    assert not thread.is_alive()
    return escaped


def test_repeated_stdlib_warnings_from_a_thread_never_raise_and_are_counted(stream: io.StringIO) -> None:
    """urllib3's second identical "Retrying" warning, logged inside the client's watch thread,
    raised structlog.DropEvent out of logger.warning() on the old code and ended the thread."""
    retrying = logging.getLogger("urllib3.connectionpool")

    def storm() -> None:
        for _ in range(20):
            retrying.warning("Retrying (%s) after connection broken by '%s'", "Retry(total=2)", "reset")

    assert _in_a_thread(storm) == []  # the 20 lines take far less than the 30 s window
    (first,) = _lines(stream)
    assert first["event"].startswith("Retrying") and "repeated" not in first
    later = time.monotonic() + 60
    _limiter_of_the_handler().clock = lambda: later  # the window has passed
    assert _in_a_thread(storm) == []
    second = _lines(stream)[1]
    assert second["repeated"] == 19 and second["logger"] == "urllib3.connectionpool"
    assert len(_lines(stream)) == 2


def test_repeated_structlog_warnings_from_a_thread_never_raise_and_are_counted(stream: io.StringIO) -> None:
    now = [0.0]
    _limiter_of_the_handler().clock = lambda: now[0]
    log = structlog.get_logger("watch")

    def storm() -> None:
        for _ in range(20):
            log.warning("watch failed", error="connection refused")

    assert _in_a_thread(storm) == []
    now[0] += 60
    assert _in_a_thread(storm) == []
    first, second = _lines(stream)
    assert "repeated" not in first and second["repeated"] == 19


def test_a_record_the_filter_cannot_read_is_let_through_without_raising() -> None:
    # Arguments that do not match the format: the filter lets it through, and logging's own
    # error handling (Handler.handleError, inside emit) deals with it.
    record = logging.LogRecord("lib", logging.WARNING, __file__, 1, "%d items", ("not a number",), None)
    repeat_filter = logs.RepeatFilter(logs.RepeatLimiter(10.0, clock=lambda: 0.0))
    assert repeat_filter.filter(record) and repeat_filter.filter(record)


# -- the Kubernetes client's errors: one line with status and reason (issue 36, item 5) -------------


def _api_error() -> Exception:
    """A 404 as the kubernetes client raises it, with the headers and body the API server sent."""
    from kubernetes.client.exceptions import ApiException

    exc = ApiException(status=404, reason="Not Found")
    exc.headers = {"Audit-Id": "4f1d2c3b-aaaa-bbbb-cccc-0123456789ab", "Cache-Control": "no-cache, private",
                   "Content-Type": "application/json", "X-Kubernetes-Pf-Flowschema-Uid": "x" * 36}
    exc.body = json.dumps({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound",
                           "message": 'nodemetrics.slo.koordinator.sh "n1" not found', "code": 404})
    return exc


SHORT_404 = '404 Not Found: nodemetrics.slo.koordinator.sh "n1" not found'


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param(_api_error(), SHORT_404, id="the exception object"),
        pytest.param(str(_api_error()), SHORT_404, id="its multi-line str"),
        pytest.param(f"cannot write the NodeMetric: {_api_error()}", f"cannot write the NodeMetric: {SHORT_404}",
                     id="its str inside a message keeps what comes before"),
        pytest.param(str(_api_error())[:120], "404 Not Found", id="its str cut short before the body"),
        pytest.param("(500)\nReason: Internal Server Error\nHTTP response headers: {}\nHTTP response body: "
                     + "x" * 100_000, "500 Internal Server Error", id="a body that is no Status"),
        pytest.param("an ordinary error", None, id="anything else is left alone"),
        pytest.param(ValueError("(404)"), None, id="another exception is left alone"),
    ],
)
def test_api_errors_are_shortened(value: object, expected: str | None) -> None:
    assert logs._short_api(value) == expected


def test_api_errors_are_one_line_through_structlog_and_logging(stream: io.StringIO) -> None:
    """On the old main each of these lines carried the response headers (and the structlog
    exception a traceback ending in them)."""
    exc = _api_error()
    structlog.get_logger("t").warning("report failed", error=exc)
    structlog.get_logger("t").warning(f"report failed: {exc}")
    try:
        raise exc
    except Exception:
        structlog.get_logger("t").exception("report failed")
        logging.getLogger("kubernetes.t").error("report failed", exc_info=True)
    text = stream.getvalue()
    assert "Audit-Id" not in text and "HTTP response headers" not in text and "Traceback" not in text
    lines = _lines(stream)
    assert len(lines) == 4 == len(text.splitlines())
    assert lines[0]["error"] == SHORT_404
    assert lines[1]["event"] == f"report failed: {SHORT_404}"
    assert lines[2]["error"] == SHORT_404 and lines[3]["error"] == SHORT_404


def test_a_404_from_an_api_server_is_one_line(stream: io.StringIO) -> None:
    """The same with the exception the official client raises for a real HTTP 404 (the in-process
    fake API server's reply: its headers and Status body)."""
    import kubernetes

    from tests.fakeapi import FakeAPIServer

    server = FakeAPIServer().start()
    try:
        conf = kubernetes.client.Configuration()
        conf.host = server.url
        api = kubernetes.client.CoordinationV1Api(kubernetes.client.ApiClient(conf))
        with pytest.raises(kubernetes.client.exceptions.ApiException) as caught:
            api.read_namespaced_lease("missing", "kube-system")
    finally:
        server.stop()
    assert "HTTP response headers" in str(caught.value)  # what the old logs carried
    structlog.get_logger("t").warning("cannot read the Lease", error=caught.value)
    structlog.get_logger("t").warning("cannot read the Lease, as text", error=str(caught.value))
    lines = _lines(stream)
    assert len(lines) == 2 == len(stream.getvalue().splitlines())
    assert lines[0]["error"] == lines[1]["error"]
    assert lines[0]["error"].startswith("404 Not Found") and "HTTP response" not in stream.getvalue()
