"""One NRI session over a connected stream: the Plugin service served on connection 1, calls to
the Runtime service on connection 2, both as unary ttrpc over the multiplexer (``mux``).

Rules this class keeps:

- The reader never waits for a handler or a reply: every request runs in its own task, so the
  runtime's Configure can arrive (and be answered) before the reply to our RegisterPlugin.
- At most ``max_inflight`` requests (16) holding at most ``max_inflight_bytes`` (16 MiB: one
  request of the largest size and the events beside it) are handled at once. A request past
  either bound is dropped: no task, no reply (the runtime times it out), counted in
  ``rhp_nri_limit_hits_total{limit="requests_in_flight"}``. A runtime such as containerd sends
  one call at a time per plugin and never comes near it; the count is kept low because the
  handlers that wake together run in one turn of the event loop.
- ``limit_requests`` lowers the size of the requests accepted (the plugin does while a split
  Synchronize is in progress); a header announcing more closes the session at once.
- Every write (a message's frames, then the wait until the socket takes them) has
  ``write_timeout`` (2 s, NRI's default request timeout: the runtime has given up on a reply by
  then). A runtime that stops reading our replies has its session closed at the first write
  that waits longer (``rhp_nri_limit_hits_total{limit="write_timeout"}``); what was left unsent
  is discarded, and the plugin dials again as after a runtime restart. So a peer that sends
  requests and never reads holds at most the requests in flight and one transport buffer.
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
import contextvars
from collections.abc import Awaitable, Callable

import structlog
from google.protobuf.message import DecodeError

from cri_protos import ttrpc_pb2
from runtime_proxy import metrics
from runtime_proxy.nri import mux, ttrpc

log = structlog.get_logger(__name__)

__all__ = [
    "MAX_INFLIGHT",
    "MAX_INFLIGHT_BYTES",
    "PLUGIN_SERVICE",
    "RUNTIME_SERVICE",
    "WRITE_TIMEOUT",
    "Handler",
    "NriConnection",
    "RpcError",
    "SkipCall",
    "Unimplemented",
]

PLUGIN_SERVICE = "nri.pkg.api.v1alpha1.Plugin"
RUNTIME_SERVICE = "nri.pkg.api.v1alpha1.Runtime"
MAX_INFLIGHT = 16
MAX_INFLIGHT_BYTES = ttrpc.MAX_RECV_MESSAGE + (2 << 20)
WRITE_TIMEOUT = 2.0

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
        max_inflight: int = MAX_INFLIGHT,
        max_inflight_bytes: int = MAX_INFLIGHT_BYTES,
        write_timeout: float = WRITE_TIMEOUT,
        budget: float = 0.8,
        default_timeout: float = 2.0,
    ) -> None:
        self._reader = reader
        self._writer = writer
        self._handler = handler
        self._frames = mux.FrameDecoder(max_frame)
        self._server_in = ttrpc.MessageDecoder(max_request)
        self._max_frame, self._max_request = max_frame, max_request
        self._client_in = ttrpc.MessageDecoder(max_message)
        self._max_inflight = max_inflight
        self._max_inflight_bytes = max_inflight_bytes
        self.write_timeout = write_timeout
        self._budget = budget
        self.default_timeout = default_timeout
        self._next_stream = 1
        self._pending: dict[int, asyncio.Future[ttrpc_pb2.Response]] = {}
        # Request handlers in flight, each with the size of its request.
        self._tasks: dict[asyncio.Future[None], int] = {}
        self._inflight_bytes = 0
        self._write_lock = asyncio.Lock()
        self.closed = asyncio.Event()
        self.close_reason = ""
        self.dropped_frames = 0
        self.dropped_requests = 0
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
            metrics.NRI_LIMIT_HITS.labels("message_size").inc()
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
        if self.closed.is_set():
            return
        size = len(msg.payload)
        if len(self._tasks) >= self._max_inflight or self._inflight_bytes + size > self._max_inflight_bytes:
            self._drop(msg.stream_id, size)
            return
        task: asyncio.Future[None] = asyncio.ensure_future(self._handle(msg.stream_id, msg.payload))
        self._tasks[task] = size
        self._inflight_bytes += size
        task.add_done_callback(self._handled)

    def _handled(self, task: asyncio.Future[None]) -> None:
        self._inflight_bytes -= self._tasks.pop(task, 0)

    def _drop(self, stream_id: int, size: int) -> None:
        """Drop a request past the bounds of what is handled at once (see the module docstring)."""
        self.dropped_requests += 1
        metrics.NRI_LIMIT_HITS.labels("requests_in_flight").inc()
        if self.dropped_requests == 1:  # once per session: the runtime may send thousands
            log.warning("NRI runtime sent more requests than are handled at once; dropping the excess",
                        in_flight=len(self._tasks), in_flight_bytes=self._inflight_bytes, stream_id=stream_id,
                        size=size, limit=self._max_inflight, limit_bytes=self._max_inflight_bytes)

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

    # -- serving -------------------------------------------------------------------------------

    async def _handle(self, stream_id: int, envelope: bytes) -> None:
        _IN_HANDLER.set(True)
        try:
            await self._answer(stream_id, envelope)
        finally:
            if self._close_when_idle and len(self._tasks) <= 1:
                await self.close(self._close_when_idle)

    async def _answer(self, stream_id: int, envelope: bytes) -> None:
        try:
            request = ttrpc_pb2.Request.FromString(envelope)
        except DecodeError as exc:
            await self._reply_error(stream_id, RpcError(3, f"undecodable request: {exc}"))
            return
        del envelope  # the request holds its own copy; a large one is not kept twice
        if request.service != PLUGIN_SERVICE:
            await self._reply_error(stream_id, Unimplemented(f"{request.service}/{request.method}"))
            return
        timeout = request.timeout_nano / 1e9 if request.timeout_nano > 0 else self.default_timeout
        method, call = request.method, self._handler(request.method, request.payload)
        del request
        try:
            async with asyncio.timeout(timeout * self._budget):
                payload = await call
        except RpcError as exc:
            await self._reply_error(stream_id, exc)
            return
        except SkipCall as exc:
            log.warning("NRI call skipped; answered with no changes", method=method, reason=str(exc)[:300])
            payload = b""
        except TimeoutError:
            log.warning("NRI handler ran out of time; answered with no changes", method=method,
                        budget=round(timeout * self._budget, 3))
            payload = b""
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("NRI handler failed; answered with no changes", method=method)
            payload = b""
        await self._send(mux.PLUGIN_CONN, stream_id, ttrpc.TYPE_RESPONSE,
                         ttrpc_pb2.Response(payload=payload).SerializeToString())

    def limit_requests(self, max_bytes: int | None) -> None:
        """Accept requests of at most ``max_bytes`` (``None``: the bound given at construction,
        which it never exceeds) from now on: a frame or request whose header announces more
        closes the session before its body is buffered (``rhp_nri_limit_hits_total{limit=
        "message_size"}``). The plugin lowers it while a split Synchronize has used part of its
        bytes."""
        request = self._max_request if max_bytes is None else min(max_bytes, self._max_request)
        self._server_in.max_message = request
        self._frames.max_payload = min(self._max_frame, request + ttrpc.HEADER.size)

    def close_when_idle(self, reason: str) -> None:
        """Close once the requests in flight are answered."""
        self._close_when_idle = reason

    async def _reply_error(self, stream_id: int, error: RpcError) -> None:
        response = ttrpc_pb2.Response(status=ttrpc_pb2.Status(code=error.code, message=error.message))
        await self._send(mux.PLUGIN_CONN, stream_id, ttrpc.TYPE_RESPONSE, response.SerializeToString())

    async def _send(self, conn_id: int, stream_id: int, msg_type: int, payload: bytes) -> None:
        """Write one message, waiting at most ``write_timeout`` for the lock and for the socket to
        take it; past that the peer is not reading and the session is closed."""
        if self.closed.is_set():
            return
        data = mux.encode(conn_id, ttrpc.encode_message(stream_id, msg_type, payload))
        try:
            async with asyncio.timeout(self.write_timeout):
                async with self._write_lock:
                    if self.closed.is_set():
                        return
                    self._writer.write(data)
                    del data
                    await self._writer.drain()
        except TimeoutError:
            metrics.NRI_LIMIT_HITS.labels("write_timeout").inc()
            log.warning("NRI runtime is not reading our messages; closing the session",
                        waited=self.write_timeout, unsent=self._writer.transport.get_write_buffer_size(),
                        in_flight=len(self._tasks), dropped_requests=self.dropped_requests)
            await self.close(f"write stalled for {self.write_timeout:g} s", abort=True)
        except (ConnectionError, OSError) as exc:
            await self.close(f"write failed: {exc}", abort=True)

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
            # Not wait_for: on Python 3.11 it returns the reply when the caller is cancelled as
            # the reply arrives, and the cancellation (a stop) is lost.
            async with asyncio.timeout(limit):
                response = await future
        finally:
            self._pending.pop(stream_id, None)
        if response.HasField("status") and response.status.code != 0:
            raise RpcError(response.status.code, response.status.message)
        return response.payload

    # -- closing -------------------------------------------------------------------------------

    async def close(self, reason: str = "closed", *, abort: bool = False) -> None:
        """Close the session: pending calls fail, handlers are cancelled. With ``abort``, or
        when replies are still unsent, the socket is aborted instead of flushed: a peer that does
        not read would otherwise hold the close, and the unsent bytes, for ever."""
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
        transport = self._writer.transport
        if abort or transport.get_write_buffer_size():
            transport.abort()
        else:
            self._writer.close()
        try:
            async with asyncio.timeout(self.write_timeout):
                await self._writer.wait_closed()
        except TimeoutError:
            transport.abort()
        except (ConnectionError, OSError):
            pass
        log.info("NRI session closed", reason=reason, dropped_requests=self.dropped_requests)

    def __repr__(self) -> str:
        return f"NriConnection(closed={self.closed.is_set()}, pending={len(self._pending)})"


def status_of(response: ttrpc_pb2.Response) -> tuple[int, str]:
    """(code, message) of a ``ttrpc.Response`` (0 when it carries no status)."""
    if response.HasField("status"):
        return response.status.code, response.status.message
    return 0, ""
