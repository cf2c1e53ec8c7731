"""One NRI session over a connected stream: the Plugin service served on connection 1, calls to
the Runtime service on connection 2, both as unary ttrpc over the multiplexer (``mux``).

Rules this class keeps:

- The reader never waits for a handler or a reply: every request runs in its own task, so the
  runtime's Configure can arrive (and be answered) before the reply to our RegisterPlugin.
- Frames sent stay within ``mux.MAX_SEND_PAYLOAD``; one message's frames are written together.
- Received frames and messages are bounded; an oversized one, or bytes that are not the
  protocol, closes the session (the runtime then drops the plugin and goes on without it).
- Frames for unknown connection ids are dropped.
- A handler never calls the runtime: ``call`` refuses to run inside a handler, because the
  runtime holds its lock while it waits for the handler's reply.
- A handler gets at most ``budget`` of the runtime's request timeout; when it runs out, or
  fails with an unexpected error, the reply is an empty (all-default) response, which tells the
  runtime "no changes", so the pod goes on without our changes instead of the plugin being
  dropped. ``SkipCall`` (a payload the handler will not use) gets the same reply with a
  warning and no traceback. ``RpcError`` replies with its status (the runtime then fails the
  CRI call).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections.abc import Awaitable, Callable
from typing import Any

import structlog
from google.protobuf.message import DecodeError

from cri_protos import ttrpc_pb2
from runtime_proxy.nri import mux, ttrpc

log = structlog.get_logger(__name__)

__all__ = ["PLUGIN_SERVICE", "RUNTIME_SERVICE", "Handler", "NriConnection", "RpcError", "SkipCall", "Unimplemented"]

PLUGIN_SERVICE = "nri.pkg.api.v1alpha1.Plugin"
RUNTIME_SERVICE = "nri.pkg.api.v1alpha1.Runtime"

_IN_HANDLER: contextvars.ContextVar[bool] = contextvars.ContextVar("rhp_nri_in_handler", default=False)


class RpcError(Exception):
    """An error the peer sees as a ttrpc status."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class SkipCall(Exception):
    """The call's payload is not used (too large, undecodable): answered with no changes."""


class Unimplemented(RpcError):
    def __init__(self, method: str) -> None:
        super().__init__(ttrpc.CODE_UNIMPLEMENTED, f"method {method} not implemented")


# (method, serialized request) -> serialized response.
Handler = Callable[[str, bytes], Awaitable[bytes]]


class NriConnection:
    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        handler: Handler,
        *,
        max_frame: int = mux.MAX_RECV_PAYLOAD,
        max_message: int = ttrpc.MAX_MESSAGE,
        max_request: int = ttrpc.MAX_RECV_MESSAGE,
        max_inflight: int = 64,
        budget: float = 0.8,
        default_timeout: float = 2.0,
    ) -> None:
        self._reader = reader
        self._writer = writer
        self._handler = handler
        self._frames = mux.FrameDecoder(max_frame)
        self._server_in = ttrpc.MessageDecoder(max_request)
        self._client_in = ttrpc.MessageDecoder(max_message)
        self._max_inflight = max_inflight
        self._budget = budget
        self.default_timeout = default_timeout
        self._next_stream = 1
        self._pending: dict[int, asyncio.Future[ttrpc_pb2.Response]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._write_lock = asyncio.Lock()
        self.closed = asyncio.Event()
        self.close_reason = ""
        self.dropped_frames = 0
        self._close_when_idle = ""

    # -- reading -------------------------------------------------------------------------------

    async def serve(self) -> None:
        """Read until the peer closes or breaks the protocol; then close."""
        reason = "closed by peer"
        try:
            while True:
                data = await self._reader.read(65536)
                if not data:
                    break
                for conn_id, payload in self._frames.feed(data):
                    self._frame(conn_id, payload)
        except (mux.FrameTooLarge, ttrpc.MessageTooLarge) as exc:
            reason = f"protocol: {exc}"
            log.warning("NRI peer sent an oversized frame or message; closing", reason=str(exc))
        except (ConnectionError, OSError) as exc:
            reason = f"connection: {exc}"
        finally:
            await self.close(reason)

    def _frame(self, conn_id: int, payload: bytes) -> None:
        if conn_id == mux.PLUGIN_CONN:
            for msg in self._server_in.feed(payload):
                self._request(msg)
        elif conn_id == mux.RUNTIME_CONN:
            for msg in self._client_in.feed(payload):
                self._response(msg)
        else:
            self.dropped_frames += 1
            log.debug("frame for unknown NRI connection dropped", conn_id=conn_id, size=len(payload))

    def _request(self, msg: ttrpc.Message) -> None:
        if msg.type != ttrpc.TYPE_REQUEST:
            log.debug("non-request message on the plugin connection ignored", type=msg.type)
            return
        if len(self._tasks) >= self._max_inflight:
            self._spawn(self._reply_error(msg.stream_id, RpcError(8, "too many requests in flight")))
            return
        self._spawn(self._handle(msg))

    def _response(self, msg: ttrpc.Message) -> None:
        future = self._pending.pop(msg.stream_id, None)
        if future is None or future.done():
            log.debug("reply for no pending call ignored", stream_id=msg.stream_id)
            return
        if msg.type != ttrpc.TYPE_RESPONSE:
            future.set_exception(RpcError(ttrpc.CODE_INTERNAL, f"unexpected message type {msg.type}"))
            return
        try:
            future.set_result(ttrpc_pb2.Response.FromString(msg.payload))
        except DecodeError as exc:
            future.set_exception(RpcError(ttrpc.CODE_INTERNAL, f"undecodable response: {exc}"))

    def _spawn(self, coro: Awaitable[None]) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- serving -------------------------------------------------------------------------------

    async def _handle(self, msg: ttrpc.Message) -> None:
        _IN_HANDLER.set(True)
        try:
            request = ttrpc_pb2.Request.FromString(msg.payload)
        except DecodeError as exc:
            await self._reply_error(msg.stream_id, RpcError(3, f"undecodable request: {exc}"))
            return
        if request.service != PLUGIN_SERVICE:
            await self._reply_error(msg.stream_id, Unimplemented(f"{request.service}/{request.method}"))
            return
        timeout = request.timeout_nano / 1e9 if request.timeout_nano > 0 else self.default_timeout
        try:
            async with asyncio.timeout(timeout * self._budget):
                payload = await self._handler(request.method, request.payload)
        except RpcError as exc:
            await self._reply_error(msg.stream_id, exc)
            return
        except SkipCall as exc:
            log.warning("NRI call skipped; answered with no changes", method=request.method, reason=str(exc)[:300])
            payload = b""
        except TimeoutError:
            log.warning("NRI handler ran out of time; answered with no changes", method=request.method,
                        budget=round(timeout * self._budget, 3))
            payload = b""
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("NRI handler failed; answered with no changes", method=request.method)
            payload = b""
        await self._send(mux.PLUGIN_CONN, msg.stream_id, ttrpc.TYPE_RESPONSE,
                         ttrpc_pb2.Response(payload=payload).SerializeToString())
        if self._close_when_idle and len(self._tasks) <= 1:
            await self.close(self._close_when_idle)

    def close_when_idle(self, reason: str) -> None:
        """Close once the requests in flight are answered."""
        self._close_when_idle = reason

    async def _reply_error(self, stream_id: int, error: RpcError) -> None:
        response = ttrpc_pb2.Response(status=ttrpc_pb2.Status(code=error.code, message=error.message))
        await self._send(mux.PLUGIN_CONN, stream_id, ttrpc.TYPE_RESPONSE, response.SerializeToString())

    async def _send(self, conn_id: int, stream_id: int, msg_type: int, payload: bytes) -> None:
        if self.closed.is_set():
            return
        data = mux.encode(conn_id, ttrpc.encode_message(stream_id, msg_type, payload))
        async with self._write_lock:
            try:
                self._writer.write(data)
                await self._writer.drain()
            except (ConnectionError, OSError) as exc:
                await self.close(f"write failed: {exc}")

    # -- calling -------------------------------------------------------------------------------

    async def call(self, method: str, payload: bytes, timeout: float | None = None) -> bytes:
        """Call ``method`` of the Runtime service; the serialized reply. Raises ``RpcError`` on
        an error status, ``ConnectionError`` when the session closes, ``TimeoutError``."""
        if _IN_HANDLER.get():
            raise RuntimeError("calling the runtime from inside an NRI handler would deadlock it")
        if self.closed.is_set():
            raise ConnectionError(f"NRI session closed: {self.close_reason}")
        limit = timeout if timeout is not None else self.default_timeout
        stream_id = self._next_stream
        self._next_stream += 2
        request = ttrpc_pb2.Request(service=RUNTIME_SERVICE, method=method, payload=payload,
                                    timeout_nano=int(limit * 1e9))
        future: asyncio.Future[ttrpc_pb2.Response] = asyncio.get_running_loop().create_future()
        self._pending[stream_id] = future
        try:
            await self._send(mux.RUNTIME_CONN, stream_id, ttrpc.TYPE_REQUEST, request.SerializeToString())
            response = await asyncio.wait_for(future, limit)
        finally:
            self._pending.pop(stream_id, None)
        if response.HasField("status") and response.status.code != 0:
            raise RpcError(response.status.code, response.status.message)
        return response.payload

    # -- closing -------------------------------------------------------------------------------

    async def close(self, reason: str = "closed") -> None:
        if self.closed.is_set():
            return
        self.close_reason = reason
        self.closed.set()
        for future in self._pending.values():
            if not future.done():
                future.set_exception(ConnectionError(f"NRI session closed: {reason}"))
        self._pending.clear()
        current = asyncio.current_task()
        for task in list(self._tasks):
            if task is not current:
                task.cancel()
        self._writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await self._writer.wait_closed()
        log.info("NRI session closed", reason=reason)

    def __repr__(self) -> str:
        return f"NriConnection(closed={self.closed.is_set()}, pending={len(self._pending)})"


def status_of(response: Any) -> tuple[int, str]:
    """(code, message) of a ``ttrpc.Response`` (0 when it carries no status)."""
    if response.HasField("status"):
        return response.status.code, response.status.message
    return 0, ""
