"""Unary gRPC calls over HTTP/2 on a unix socket, on asyncio and the python-hyper ``h2`` state
machine: what ``RuntimeClient`` needs of the runtime, without the gRPC library (about 9 MiB of
the proxy's memory, ``benchmarks/README.md``).

One ``UnaryChannel`` holds at most one connection; any number of calls run on it at once, one
stream each. The runtime is hostile input like any other:

- an answer is at most ``max_answer`` bytes (16 MiB by default; a ListContainers of thousands of
  containers is a few MiB): its gRPC length prefix is checked before the body is kept, and the
  stream is reset past the bound (``RESOURCE_EXHAUSTED``);
- a header block is bounded by h2 (64 KiB decoded, 64 CONTINUATION frames of at most 16 KiB);
- received DATA is acknowledged as it arrives, so a large answer never stalls on flow control;
- each call has a deadline (``DEADLINE_EXCEEDED``; the stream is reset and ``grpc-timeout``
  tells the runtime);
- a malformed frame, GOAWAY, RST_STREAM or a lost connection ends the calls it concerns with an
  ``RpcError``; the next call connects again, after a back-off of 100 ms doubling to 1 s while
  connecting fails (the old gRPC channel's settings), waiting only as long as its deadline allows;
- the answer's status comes from the trailers (or a trailers-only answer); an answer without a
  ``grpc-status`` is ``INTERNAL``.

Nothing here parses more than one read (64 KiB) at a time on the event loop; the caller decodes
the protobuf answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings

from runtime_proxy.runtime.errors import MAX_ANSWER, RpcError, StatusCode

__all__ = ["MAX_ANSWER", "RpcError", "StatusCode", "UnaryChannel"]

_READ = 64 << 10
_WINDOW = 1 << 20  # our stream and connection receive windows
_MESSAGE_MAX = 1024  # characters of a grpc-message kept
_BACKOFF_MIN, _BACKOFF_MAX = 0.1, 1.0


# HTTP statuses of a non-gRPC answer, as gRPC maps them.
_HTTP_CODES = {400: StatusCode.INTERNAL, 401: StatusCode.UNAUTHENTICATED, 403: StatusCode.PERMISSION_DENIED,
               404: StatusCode.UNIMPLEMENTED, 429: StatusCode.UNAVAILABLE, 502: StatusCode.UNAVAILABLE,
               503: StatusCode.UNAVAILABLE, 504: StatusCode.UNAVAILABLE}
# RST_STREAM error codes, as gRPC maps them.
_RESET_CODES = {h2.errors.ErrorCodes.CANCEL: StatusCode.CANCELLED,
                h2.errors.ErrorCodes.REFUSED_STREAM: StatusCode.UNAVAILABLE,
                h2.errors.ErrorCodes.ENHANCE_YOUR_CALM: StatusCode.RESOURCE_EXHAUSTED,
                h2.errors.ErrorCodes.INADEQUATE_SECURITY: StatusCode.PERMISSION_DENIED}


def _status_of(headers: dict[bytes, bytes]) -> RpcError | None:
    """The status the ``grpc-status``/``grpc-message`` headers carry (None for OK); an
    unreadable status is ``UNKNOWN``."""
    raw = headers.get(b"grpc-status", b"")
    try:
        code = StatusCode(int(raw)) if raw.isdigit() and len(raw) <= 2 else None
    except ValueError:
        code = None
    message = urllib.parse.unquote(headers.get(b"grpc-message", b"")[: _MESSAGE_MAX * 3].decode("latin-1"))
    if code is None:
        return RpcError(StatusCode.UNKNOWN, f"unreadable grpc-status {raw[:16]!r}: {message[:_MESSAGE_MAX]}")
    return None if code == StatusCode.OK else RpcError(code, message[:_MESSAGE_MAX])


@dataclass
class _Call:
    """One stream's answer as it arrives."""

    max_answer: int
    done: asyncio.Future[bytes]
    body: bytearray = field(default_factory=bytearray)
    length: int = -1  # the message's length once its prefix has come
    headers: dict[bytes, bytes] | None = None
    status: RpcError | None = None
    status_seen: bool = False

    def fail(self, err: RpcError) -> None:
        if not self.done.done():
            self.done.set_result(b"")  # wakes the caller; the error is read from ``status``
            self.status, self.status_seen = err, True

    def on_headers(self, raw: list[tuple[bytes, bytes]]) -> RpcError | None:
        headers = dict(raw)
        if self.headers is None:
            self.headers = headers
            http = headers.get(b":status", b"")
            if http != b"200":
                number = int(http) if len(http) == 3 and http.isdigit() else 0
                code = _HTTP_CODES.get(number, StatusCode.UNKNOWN)
                return RpcError(code, f"HTTP status {http[:8].decode('latin-1')} from the runtime")
            kind = headers.get(b"content-type", b"")
            if not kind.startswith(b"application/grpc"):
                return RpcError(StatusCode.UNKNOWN, f"content-type {kind[:64]!r} is not gRPC")
        if b"grpc-status" in headers:  # trailers, or a trailers-only answer
            self.status, self.status_seen = _status_of(headers), True
        return None

    def on_data(self, data: bytes) -> RpcError | None:
        self.body += data
        if self.length < 0 and len(self.body) >= 5:
            if self.body[0] != 0:
                return RpcError(StatusCode.INTERNAL, "compressed answer (no grpc-encoding was offered)")
            self.length = int.from_bytes(self.body[1:5], "big")
            if self.length > self.max_answer:
                return RpcError(StatusCode.RESOURCE_EXHAUSTED,
                                f"answer of {self.length} bytes is over the bound of {self.max_answer}")
        if self.length >= 0 and len(self.body) > 5 + self.length:
            return RpcError(StatusCode.INTERNAL, "more than one message in a unary answer")
        return None

    def on_end(self) -> None:
        if self.done.done():
            return
        if not self.status_seen:
            self.fail(RpcError(StatusCode.INTERNAL, "answer ended without grpc-status"))
        elif self.status is None and (self.length < 0 or len(self.body) != 5 + self.length):
            self.fail(RpcError(StatusCode.INTERNAL, "answer ended without a whole message"))
        else:
            self.done.set_result(bytes(memoryview(self.body)[5:]) if self.status is None else b"")


class _Connection:
    """One HTTP/2 connection and its reader task."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, max_answer: int) -> None:
        self.reader, self.writer, self.max_answer = reader, writer, max_answer
        self.h2 = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
        self.h2.initiate_connection()
        self.h2.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: _WINDOW,
                                 h2.settings.SettingCodes.ENABLE_PUSH: 0})
        self.h2.increment_flow_control_window(_WINDOW - 65535)
        self.calls: dict[int, _Call] = {}
        self.usable = True  # False after GOAWAY or a failure: no new streams
        self.changed = asyncio.Event()  # a window opened or a stream closed
        self._head = b""  # a frame header read in part (``_scan``)
        self._body_left = 0  # bytes of the current frame's body still to come
        self._in_goaway = False  # the current frame is a GOAWAY
        self._flush()
        self.task = asyncio.get_running_loop().create_task(self._read())

    def _flush(self) -> None:
        data = self.h2.data_to_send()
        if data and not self.writer.is_closing():
            self.writer.write(data)

    async def _read(self) -> None:
        why = RpcError(StatusCode.UNAVAILABLE, "the runtime closed the connection")
        try:
            while True:
                data = await self.reader.read(_READ)
                if not data:
                    break
                cut = self._scan(data)
                if cut < 0:
                    self.h2.close_connection(h2.errors.ErrorCodes.FRAME_SIZE_ERROR)
                    why = RpcError(StatusCode.INTERNAL, "HTTP/2 protocol error from the runtime: frame over the size")
                    break
                try:
                    events = self.h2.receive_data(data if cut == len(data) else data[:cut])
                except h2.exceptions.ProtocolError as exc:
                    self.h2.close_connection(h2.errors.ErrorCodes.PROTOCOL_ERROR)
                    why = RpcError(StatusCode.INTERNAL, f"HTTP/2 protocol error from the runtime: {str(exc)[:200]}")
                    break
                for event in events:
                    self._on_event(event)
                self._flush()
                if not self.usable:  # after GOAWAY
                    break
        except OSError as exc:
            why = RpcError(StatusCode.UNAVAILABLE, f"connection to the runtime lost: {exc}")
        except Exception as exc:  # any other surprise of the state machine costs this connection only
            detail = f"{type(exc).__name__}: {str(exc)[:200]}"
            why = RpcError(StatusCode.INTERNAL, f"HTTP/2 error from the runtime: {detail}")
        finally:
            self.shut(why)

    def _scan(self, data: bytes) -> int:
        """How much of ``data`` h2 is to read: all of it, or up to the end of a GOAWAY frame (h2
        raises on any frame after one, losing the GOAWAY); -1 when a frame header gives a length
        over our SETTINGS_MAX_FRAME_SIZE (h2 checks that only once the whole frame, up to
        16 MiB, has come, so a runtime announcing a huge frame would hold the call till its
        deadline)."""
        at, size = 0, len(data)
        while at < size:
            if self._body_left:
                step = min(self._body_left, size - at)
                self._body_left -= step
                at += step
                if not self._body_left and self._in_goaway:
                    return at
                continue
            need = 9 - len(self._head)
            self._head += data[at:at + need]
            at = min(at + need, size)
            if len(self._head) < 9:
                break
            self._body_left = int.from_bytes(self._head[:3], "big")
            self._in_goaway = self._head[3] == 0x7
            self._head = b""
            if self._body_left > self.h2.max_inbound_frame_size:
                return -1
            if self._in_goaway and not self._body_left:
                return at
        return size

    def _on_event(self, event: h2.events.Event) -> None:
        if isinstance(event, h2.events.ConnectionTerminated):
            self._goaway(event)
            return
        if isinstance(event, (h2.events.WindowUpdated, h2.events.RemoteSettingsChanged)):
            self.changed.set()
            return
        stream_id: int = getattr(event, "stream_id", None) or 0
        if isinstance(event, h2.events.DataReceived) and stream_id:
            self.h2.acknowledge_received_data(event.flow_controlled_length or 0, stream_id)
        call = self.calls.get(stream_id)
        if call is None or call.done.done():
            return
        err: RpcError | None = None
        if isinstance(event, (h2.events.ResponseReceived, h2.events.TrailersReceived)):
            err = call.on_headers(event.headers or [])
        elif isinstance(event, h2.events.DataReceived):
            err = call.on_data(event.data or b"")
        elif isinstance(event, h2.events.StreamEnded):
            call.on_end()
        elif isinstance(event, h2.events.StreamReset):
            code = _RESET_CODES.get(event.error_code, StatusCode.INTERNAL)  # type: ignore[call-overload]
            err = RpcError(code, f"stream reset by the runtime (HTTP/2 error {event.error_code})")
        if err is not None:
            call.fail(err)
            self.reset(stream_id)

    def _goaway(self, event: h2.events.ConnectionTerminated) -> None:
        """GOAWAY ends every call in flight: h2 takes no frame after it, not even for the streams
        the runtime would still finish (the calls are the caller's to retry)."""
        self.shut(RpcError(StatusCode.UNAVAILABLE, f"the runtime sent GOAWAY (HTTP/2 error {event.error_code})"))

    def reset(self, stream_id: int) -> None:
        """Cancel a stream we no longer want (its answer failed, or its caller left)."""
        with contextlib.suppress(h2.exceptions.ProtocolError):
            self.h2.reset_stream(stream_id, h2.errors.ErrorCodes.CANCEL)
        self._flush()

    def shut(self, why: RpcError) -> None:
        """End every call with ``why`` and close the socket."""
        self.usable = False
        for call in self.calls.values():
            call.fail(why)
        self.changed.set()
        self.writer.close()

    async def call(self, path: bytes, headers: list[tuple[bytes, bytes]], request: bytes) -> bytes:
        """One unary call; the caller bounds it in time (``UnaryChannel.call``)."""
        while self.usable and self.h2.open_outbound_streams >= self.h2.remote_settings.max_concurrent_streams:
            self.changed.clear()
            await self.changed.wait()
        if not self.usable:
            raise RpcError(StatusCode.UNAVAILABLE, "connection to the runtime is closing")
        stream_id = self.h2.get_next_available_stream_id()
        call = _Call(self.max_answer, asyncio.get_running_loop().create_future())
        self.calls[stream_id] = call
        try:
            try:
                self.h2.send_headers(stream_id, [(b":method", b"POST"), (b":scheme", b"http"), (b":path", path),
                                                 (b":authority", b"localhost"), *headers])
                await self._send(stream_id, len(request).to_bytes(5, "big") + request)
            except (OSError, h2.exceptions.ProtocolError) as exc:
                call.fail(RpcError(StatusCode.UNAVAILABLE, f"cannot send to the runtime: {str(exc)[:200]}"))
            answer = await call.done
        except BaseException:  # the deadline, or the caller cancelled: the runtime may stop
            if not call.done.done() or call.done.cancelled():
                self.reset(stream_id)
            raise
        finally:
            del self.calls[stream_id]
            self.changed.set()
        if call.status is not None:
            raise call.status
        return answer

    async def _send(self, stream_id: int, body: bytes) -> None:
        """The request body within the runtime's flow-control windows, then END_STREAM."""
        sent = 0
        while sent < len(body):
            room = min(self.h2.local_flow_control_window(stream_id), self.h2.max_outbound_frame_size)
            if room <= 0:
                self._flush()
                self.changed.clear()
                await self.changed.wait()
                if not self.usable:
                    raise RpcError(StatusCode.UNAVAILABLE, "connection to the runtime lost while sending")
                continue
            self.h2.send_data(stream_id, body[sent:sent + room])
            sent += room
        self.h2.end_stream(stream_id)
        self._flush()
        await self.writer.drain()


def _timeout_header(seconds: float) -> bytes:
    """``grpc-timeout`` in milliseconds (at most 8 digits, as the protocol allows)."""
    return f"{min(max(int(seconds * 1000), 1), 99_999_999)}m".encode()


class UnaryChannel:
    """Unary gRPC calls to the server on the unix socket ``path`` (see the module docstring)."""

    def __init__(self, path: str, *, max_answer: int = MAX_ANSWER,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        self.max_answer = max_answer
        self._clock = clock
        self._conn: _Connection | None = None
        self._connecting = asyncio.Lock()
        self._backoff = 0.0
        self._next_try = 0.0
        self._last_error = ""
        self._closed = False

    async def call(self, method: str, request: bytes, *, timeout: float) -> bytes:
        """The answer's message to ``request`` on ``method`` (``/package.Service/Method``);
        ``RpcError`` when the call fails or takes longer than ``timeout`` seconds."""
        # wait_for, not asyncio.timeout: the relay starts a hook's coroutine outside any task
        # (``runtime_proxy.cri.relay._intercept``), where asyncio.timeout refuses to run.
        try:
            return await asyncio.wait_for(self._call(method, request, timeout), timeout)
        except TimeoutError:
            raise RpcError(StatusCode.DEADLINE_EXCEEDED, f"{method}: no answer within {timeout:g} s") from None

    async def _call(self, method: str, request: bytes, timeout: float) -> bytes:
        headers = [(b"content-type", b"application/grpc"), (b"te", b"trailers"),
                   (b"grpc-timeout", _timeout_header(timeout))]
        conn = await self._connection(self._clock() + timeout)
        return await conn.call(method.encode(), headers, request)

    async def _connection(self, deadline: float) -> _Connection:
        async with self._connecting:
            if self._closed:
                raise RpcError(StatusCode.CANCELLED, "channel closed")
            if self._conn is not None and self._conn.usable:
                return self._conn
            wait = self._next_try - self._clock()
            if wait > 0:
                if self._clock() + wait >= deadline:
                    raise RpcError(StatusCode.UNAVAILABLE, f"cannot connect to {self.path}: {self._last_error}")
                await asyncio.sleep(wait)
            try:
                reader, writer = await asyncio.open_unix_connection(self.path, limit=_READ)
            except OSError as exc:
                self._last_error = exc.strerror or str(exc)
                self._backoff = min(max(self._backoff * 2, _BACKOFF_MIN), _BACKOFF_MAX)
                self._next_try = self._clock() + self._backoff
                raise RpcError(StatusCode.UNAVAILABLE, f"cannot connect to {self.path}: {self._last_error}") from None
            self._backoff = 0.0
            if self._conn is not None and not self._conn.calls:
                self._conn.shut(RpcError(StatusCode.UNAVAILABLE, "connection replaced"))
            self._conn = _Connection(reader, writer, self.max_answer)
            return self._conn

    async def close(self) -> None:
        """End the calls in flight (``CANCELLED``) and the connection; later calls fail."""
        self._closed = True
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.shut(RpcError(StatusCode.CANCELLED, "channel closed"))
            conn.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, OSError):
                await conn.task
            with contextlib.suppress(OSError):
                await conn.writer.wait_closed()
