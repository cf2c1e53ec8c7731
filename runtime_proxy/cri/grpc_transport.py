"""The grpcio transport: a ``grpc.aio`` server that forwards every call to the runtime as bytes.

Called by ``runtime_proxy.commands.serve`` when ``--transport grpc`` is chosen (the fallback to the
frame relay). One generic handler serves every method with no serializers, so messages stay
raw bytes: known unary CRI methods are forwarded unary, ``GetContainerEvents`` server-streaming,
and any method we do not know (other services, future RPCs, ``runtime.v1alpha2``) as a
bidirectional stream, which carries any cardinality unchanged. Methods the ``CallInterceptor``
intercepts go through ``before``/``after`` around the upstream call.

What passes unchanged: status code, message, trailing metadata (including
``grpc-status-details-bin``), initial metadata, and custom request metadata. The caller's
deadline is passed on only when the caller set one. A caller that goes away cancels the upstream
call. A dead runtime answers UNAVAILABLE at once and the channel reconnects quickly.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, TypeAlias

import grpc
import structlog

from runtime_proxy import metrics
from runtime_proxy.cri.methods import SERVER_STREAMING, is_known_unary
from runtime_proxy.cri.transport import CallInterceptor, HookRejected, InterceptedCall
from runtime_proxy.runtime.client import RUNTIME_CHANNEL_OPTIONS

if TYPE_CHECKING:
    # Messages stay bytes both ways: no serializers on either side.
    _Context: TypeAlias = grpc.aio.ServicerContext[bytes, bytes]
    _Unary: TypeAlias = Callable[[bytes, _Context], Awaitable[bytes]]
    _UnaryStream: TypeAlias = Callable[[bytes, _Context], AsyncIterator[bytes]]
    _StreamStream: TypeAlias = Callable[[AsyncIterator[bytes], _Context], AsyncIterator[bytes]]
    _UpstreamCall: TypeAlias = grpc.aio.UnaryStreamCall[bytes, bytes] | grpc.aio.StreamStreamCall[bytes, bytes]
    _MultiCallable: TypeAlias = (
        grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] | grpc.aio.UnaryStreamMultiCallable[bytes, bytes]
        | grpc.aio.StreamStreamMultiCallable[bytes, bytes]
    )

log = structlog.get_logger(__name__)

__all__ = ["CHANNEL_OPTIONS", "GrpcTransport"]

# The upstream channel: the options of every channel to the runtime (messages of any size,
# quick reconnects).
CHANNEL_OPTIONS = RUNTIME_CHANNEL_OPTIONS
SERVER_OPTIONS: list[tuple[str, int]] = [
    ("grpc.max_receive_message_length", -1),
    ("grpc.max_send_message_length", -1),
    ("grpc.so_reuseport", 0),
]

# Request metadata that grpc itself owns and must not be sent again as custom metadata.
_RESERVED = frozenset({"user-agent", "content-type", "te", "grpc-timeout", "grpc-encoding",
                       "grpc-accept-encoding", "host", "authority"})
# A caller with no deadline shows a time_remaining of about 9.2e18 s; anything this large is
# treated as "no deadline".
_NO_DEADLINE = 1e9
# How long an unknown method waits for a second request message before it is treated as a
# client-streaming or bidirectional call.
_PEEK_SECONDS = 0.05



def _request_metadata(context: _Context) -> list[tuple[str, str | bytes]]:
    return [
        (k, v)
        for k, v in (context.invocation_metadata() or ())
        if not k.startswith(":") and k not in _RESERVED
    ]


# How close to the caller's deadline an upstream CANCELLED counts as the deadline (seconds).
_DEADLINE_SLACK = 0.1


def _timeout(context: _Context) -> float | None:
    remaining: float | None = context.time_remaining()
    if remaining is None or remaining > _NO_DEADLINE:
        return None
    return max(remaining, 0.0)


async def _relay_error(context: _Context, err: grpc.aio.AioRpcError) -> None:
    code = err.code()
    if code == grpc.StatusCode.CANCELLED:
        # The upstream call carries the caller's deadline. When it runs out, containerd 2.x
        # sometimes ends the call with CANCELLED before the caller's own timer fires; a direct
        # caller would have seen its deadline, so that is what we answer.
        remaining = context.time_remaining()
        if remaining is not None and remaining <= _DEADLINE_SLACK:
            code = grpc.StatusCode.DEADLINE_EXCEEDED
    trailing = err.trailing_metadata()
    await context.abort(code, err.details() or "", tuple(trailing) if trailing else ())


class GrpcTransport:
    """Serve ``listen`` (a unix socket path) and forward to ``backend`` (a unix socket path)."""

    def __init__(self, listen: str, backend: str, interceptor: CallInterceptor) -> None:
        self.listen = listen
        self.backend = backend
        self.interceptor = interceptor
        self._server: grpc.aio.Server | None = None
        self._channel: grpc.aio.Channel | None = None
        self._callables: dict[tuple[str, str], _MultiCallable] = {}

    # -- upstream ------------------------------------------------------------------------------

    def _channel_or_open(self) -> grpc.aio.Channel:
        if self._channel is None:
            self._channel = grpc.aio.insecure_channel(f"unix://{self.backend}", options=CHANNEL_OPTIONS)
        return self._channel

    def _callable(self, kind: str, method: str) -> _MultiCallable:
        key = (kind, method)
        mc = self._callables.get(key)
        if mc is None:
            ch = self._channel_or_open()
            factory = {"uu": ch.unary_unary, "us": ch.unary_stream, "ss": ch.stream_stream}[kind]
            mc = factory(method)
            self._callables[key] = mc
        return mc

    # -- handlers --------------------------------------------------------------------------------

    def _unary(self, method: str) -> _Unary:
        intercepted = self.interceptor.intercepts(method)
        interceptor = self.interceptor

        async def handle(request: bytes, context: _Context) -> bytes:
            started = time.perf_counter()
            code = "OK"
            hooked: InterceptedCall | None = None
            try:
                if intercepted:
                    try:
                        hooked = await interceptor.before(method, request)
                        request = hooked.request
                    except HookRejected as rej:
                        code = _code(rej.code).name
                        await context.abort(_code(rej.code), rej.message)
                    except Exception as exc:  # a bug in the hook side must not reach the runtime
                        log.exception("interceptor failed", method=method)
                        code = "INTERNAL"
                        await context.abort(grpc.StatusCode.INTERNAL, f"runtime-hook-proxy: hook error: {exc}")
                call = self._callable("uu", method)(
                    request, metadata=_request_metadata(context), timeout=_timeout(context)
                )
                try:
                    response: bytes = await call
                except grpc.aio.AioRpcError as err:
                    code = err.code().name
                    await _relay_error(context, err)
                    raise AssertionError("unreachable") from None
                except asyncio.CancelledError:
                    call.cancel()
                    code = "CANCELLED"
                    raise
                initial = await call.initial_metadata()
                if initial:
                    await context.send_initial_metadata(tuple(initial))
                trailing = await call.trailing_metadata()
                if trailing:
                    context.set_trailing_metadata(tuple(trailing))
                if hooked is not None:
                    await hooked.after(response)
                return response
            finally:
                metrics.observe_call(method, code, time.perf_counter() - started)

        return handle

    def _unary_stream(self, method: str) -> _UnaryStream:
        async def handle(request: bytes, context: _Context) -> AsyncIterator[bytes]:
            call = self._callable("us", method)(
                request, metadata=_request_metadata(context), timeout=_timeout(context)
            )
            async for item in self._drain(call, context):
                yield item

        return handle

    def _stream_stream(self, method: str) -> _StreamStream:
        async def handle(
            requests: AsyncIterator[bytes], context: _Context
        ) -> AsyncIterator[bytes]:
            metadata, timeout = _request_metadata(context), _timeout(context)
            it = requests.__aiter__()
            first = await anext(it, None)
            second: asyncio.Future[bytes] = asyncio.ensure_future(anext(it))
            await asyncio.wait({second}, timeout=_PEEK_SECONDS)
            if first is not None and second.done() and isinstance(second.exception(), StopAsyncIteration):
                # One request message then half-close: unary or server-streaming. Forward it in a
                # single send-and-close, which keeps an early status (UNIMPLEMENTED for an unknown
                # method, say) exact; a separate write could race it and surface as INTERNAL.
                call = self._callable("us", method)(first, metadata=metadata, timeout=timeout)
                async for item in self._drain(call, context):
                    yield item
                return
            call = self._callable("ss", method)(metadata=metadata, timeout=timeout)
            writer = asyncio.create_task(_pump(first, second, it, call))
            try:
                async for item in self._drain(call, context):
                    yield item
            finally:
                writer.cancel()

        return handle

    async def _drain(self, call: _UpstreamCall, context: _Context) -> AsyncIterator[bytes]:
        try:
            initial = await call.initial_metadata()
            if initial:
                await context.send_initial_metadata(tuple(initial))
            async for item in call:
                yield item
            trailing = await call.trailing_metadata()
            if trailing:
                context.set_trailing_metadata(tuple(trailing))
        except grpc.aio.AioRpcError as err:
            await _relay_error(context, err)
        except (asyncio.CancelledError, GeneratorExit):
            call.cancel()
            raise

    def _handler_for(self, method: str) -> grpc.RpcMethodHandler:
        if method in SERVER_STREAMING:
            return grpc.unary_stream_rpc_method_handler(self._unary_stream(method))
        if is_known_unary(method) or self.interceptor.intercepts(method):
            return grpc.unary_unary_rpc_method_handler(self._unary(method))
        return grpc.stream_stream_rpc_method_handler(self._stream_stream(method))

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        transport = self
        handlers: dict[str, grpc.RpcMethodHandler] = {}

        class _Generic(grpc.GenericRpcHandler):  # type: ignore[misc]
            def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
                method: str = details.method
                handler = handlers.get(method)
                if handler is None:
                    handler = handlers[method] = transport._handler_for(method)
                return handler

        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.listen)
        os.makedirs(os.path.dirname(self.listen) or ".", exist_ok=True)
        server = grpc.aio.server(options=SERVER_OPTIONS)
        server.add_generic_rpc_handlers((_Generic(),))
        server.add_insecure_port(f"unix://{self.listen}")
        await server.start()
        os.chmod(self.listen, 0o660)
        self._server = server
        self._channel_or_open()
        log.info("transport started", transport="grpc", listen=self.listen, backend=self.backend)

    async def stop(self, grace: float = 5.0) -> None:
        if self._server is not None:
            await self._server.stop(grace)
            self._server = None
        if self._channel is not None:
            await self._channel.close()
            self._channel = None
            self._callables.clear()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.listen)


async def _pump(
    first: bytes | None, second: asyncio.Future[bytes], rest: AsyncIterator[bytes],
    call: grpc.aio.StreamStreamCall[bytes, bytes],
) -> None:
    """Write a client-streaming or bidirectional call's requests upstream."""
    try:
        if first is not None:
            await call.write(first)
            try:
                await call.write(await second)
            except StopAsyncIteration:
                pass
            else:
                async for item in rest:
                    await call.write(item)
        elif second.done() and not second.cancelled():
            second.exception()  # an empty request stream; mark its end as seen
        await call.done_writing()
    except (grpc.aio.AioRpcError, asyncio.InvalidStateError, grpc.aio.UsageError):
        # The upstream call already ended; its status reaches the caller through the reader.
        return


def _code(number: int) -> grpc.StatusCode:
    for code in grpc.StatusCode:
        if code.value[0] == number:
            return code
    return grpc.StatusCode.UNKNOWN

