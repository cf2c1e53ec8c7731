"""The test backend for the transport suite: a grpcio aio server on a unix socket with generic
(bytes in, bytes out) handlers, plus the recording interceptor the suite's hooks use.

Used by ``conftest.py`` in process, and run as a script (``python transport_backend.py SOCKET``)
when a test needs a backend it can SIGKILL.

Methods (service ``test.Echo``; the same handlers are also served as ``test.Hooked``, the
service the test interceptor intercepts):
  Unary         echo the request; echo ``x-*`` metadata back as initial and trailing metadata
  ServerStream  send the request ``x-count`` times (default 3)
  ClientStream  answer the concatenation of all request messages
  Bidi          echo every request message as it arrives
  Ticker        after the first request message, stream ticks for 30 s; records cancellation
  Slow          sleep ``x-sleep`` seconds (default 1), then echo; records cancellation
  Error         fail with code ``x-code``, message ``x-message-bin`` (UTF-8), status details and trailers
  Meta          answer a JSON object of the metadata and the deadline the handler saw
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import grpc

from runtime_proxy.cri.transport import HookRejected

MAX_MESSAGE = 64 * 1024 * 1024
OPTIONS = [
    ("grpc.max_receive_message_length", MAX_MESSAGE),
    ("grpc.max_send_message_length", MAX_MESSAGE),
]
STATUS_DETAILS = b"\x08\x05\x12\x0bnot here \xc3\xbc"  # a google.rpc.Status-shaped blob


@dataclass
class BackendLog:
    """What the backend saw; tests assert on it."""

    calls: list[tuple[str, bytes]] = field(default_factory=list)  # (method, first request message)
    cancelled: list[str] = field(default_factory=list)  # methods whose handler was cancelled
    started: dict[str, asyncio.Event] = field(default_factory=dict)

    def started_event(self, method: str) -> asyncio.Event:
        return self.started.setdefault(method, asyncio.Event())


def _md(context: grpc.aio.ServicerContext[Any, Any]) -> dict[str, str | bytes]:
    return {k: v for k, v in (context.invocation_metadata() or ())}


def build_handlers(record: BackendLog) -> list[grpc.GenericRpcHandler]:
    def note(name: str, req: bytes) -> None:
        record.calls.append((name, req))
        record.started_event(name).set()

    async def unary(req: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
        note("Unary", req)
        md = [(k, v) for k, v in (context.invocation_metadata() or ()) if k.startswith("x-")]
        if md:
            await context.send_initial_metadata(tuple(md))
            context.set_trailing_metadata(tuple(("x-t-" + k[2:], v) for k, v in md))
        return req

    async def server_stream(req: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[bytes]:
        note("ServerStream", req)
        count = int(str(_md(context).get("x-count", "3")))
        for _ in range(count):
            yield req

    async def client_stream(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
        parts = [r async for r in requests]
        note("ClientStream", parts[0] if parts else b"")
        return b"".join(parts)

    async def bidi(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[bytes]:
        first = True
        async for r in requests:
            if first:
                note("Bidi", r)
                first = False
            yield r

    async def ticker(
        requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[bytes]:
        async for r in requests:
            note("Ticker", r)
            break
        try:
            for i in range(3000):
                yield b"tick %d" % i
                await asyncio.sleep(0.01)
        except BaseException:
            record.cancelled.append("Ticker")
            raise

    async def slow(req: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
        note("Slow", req)
        try:
            await asyncio.sleep(float(str(_md(context).get("x-sleep", "1"))))
        except asyncio.CancelledError:
            record.cancelled.append("Slow")
            raise
        return req

    async def error(req: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
        note("Error", req)
        md = _md(context)
        code = grpc.StatusCode.__members__[str(md.get("x-code", "NOT_FOUND"))]
        raw = md.get("x-message-bin", b"no such thing")
        message = raw.decode() if isinstance(raw, bytes) else raw
        context.set_trailing_metadata(
            (("x-trailer", "t-value"), ("x-trailer-bin", b"\x00\xff\x10"), ("grpc-status-details-bin", STATUS_DETAILS))
        )
        await context.abort(code, message)
        raise AssertionError("abort returns never")

    async def meta(req: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
        note("Meta", req)
        remaining = context.time_remaining()
        md = {k: (v.hex() if isinstance(v, bytes) else v) for k, v in _md(context).items()}
        has_deadline = remaining is not None and remaining < 1e9
        return json.dumps({"metadata": md, "deadline": remaining if has_deadline else None}).encode()

    methods = {
        "Unary": grpc.unary_unary_rpc_method_handler(unary),
        "ServerStream": grpc.unary_stream_rpc_method_handler(server_stream),
        "ClientStream": grpc.stream_unary_rpc_method_handler(client_stream),
        "Bidi": grpc.stream_stream_rpc_method_handler(bidi),
        "Slow": grpc.unary_unary_rpc_method_handler(slow),
        "Ticker": grpc.stream_stream_rpc_method_handler(ticker),
        "Error": grpc.unary_unary_rpc_method_handler(error),
        "Meta": grpc.unary_unary_rpc_method_handler(meta),
    }
    return [
        grpc.method_handlers_generic_handler("test.Echo", methods),
        grpc.method_handlers_generic_handler("test.Hooked", methods),
    ]


async def start_backend(path: str, record: BackendLog) -> grpc.aio.Server:
    server = grpc.aio.server(options=OPTIONS)
    server.add_generic_rpc_handlers(build_handlers(record))
    server.add_insecure_port(f"unix:{path}")
    await server.start()
    return server


class RecordedCall:
    """The call ``RecordingInterceptor.before`` returns: its ``after`` is recorded."""

    def __init__(self, method: str, request: bytes, after_calls: list[tuple[str, bytes, bytes]]) -> None:
        self.method = method
        self.request = request
        self._after_calls = after_calls

    async def after(self, response: bytes) -> None:
        self._after_calls.append((self.method, self.request, response))


class RecordingInterceptor:
    """The suite's hook: intercepts ``/test.Hooked/*``; the request's first word says what to do.

    ``grow:N:`` appends N bytes, ``shrink:N:`` drops the last N bytes, ``reject:`` raises
    HookRejected(FAILED_PRECONDITION), ``boom:`` raises RuntimeError, ``sleep:S:`` waits S
    seconds; anything else passes unchanged. ``undecodable`` refuses (policy Fail) unless
    ``fail_policy`` is False (policy Ignore).
    """

    REJECT_MESSAGE = "rejected by hook: ünïcödé 100% \n ok"

    def __init__(self, *, fail_policy: bool = True) -> None:
        self.fail_policy = fail_policy
        self.before_calls: list[tuple[str, bytes]] = []
        self.after_calls: list[tuple[str, bytes, bytes]] = []
        self.undecodable_calls: list[tuple[str, str]] = []

    def intercepts(self, method: str) -> bool:
        return method.startswith("/test.Hooked/")

    async def before(self, method: str, request: bytes) -> RecordedCall:
        self.before_calls.append((method, request))
        return RecordedCall(method, await transform(request), self.after_calls)

    async def undecodable(self, method: str, reason: str) -> None:
        self.undecodable_calls.append((method, reason))
        if self.fail_policy:
            raise HookRejected(13, f"cannot decode request: {reason}")


async def transform(request: bytes) -> bytes:
    """What ``RecordingInterceptor.before`` makes of ``request`` (tests use it for expectations)."""
    word, _, rest = request.partition(b":")
    if word == b"grow":
        n = int(rest.partition(b":")[0])
        return request + bytes((i * 7 + 3) & 0xFF for i in range(n))
    if word == b"shrink":
        n = int(rest.partition(b":")[0])
        return request[: max(0, len(request) - n)]
    if word == b"reject":
        raise HookRejected(9, RecordingInterceptor.REJECT_MESSAGE)
    if word == b"boom":
        raise RuntimeError("hook bug")
    if word == b"sleep":
        await asyncio.sleep(float(rest.partition(b":")[0]))
    return request


def expected(request: bytes) -> bytes:
    """The synchronous twin of ``transform``, for requests that are not rejected."""
    word, _, rest = request.partition(b":")
    if word == b"grow":
        n = int(rest.partition(b":")[0])
        return request + bytes((i * 7 + 3) & 0xFF for i in range(n))
    if word == b"shrink":
        n = int(rest.partition(b":")[0])
        return request[: max(0, len(request) - n)]
    return request


async def _main(path: str) -> None:
    server = await start_backend(path, BackendLog())
    print("ready", flush=True)
    await server.wait_for_termination()


if __name__ == "__main__":
    asyncio.run(_main(sys.argv[1]))
