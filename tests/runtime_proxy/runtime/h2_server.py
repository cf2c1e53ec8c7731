"""An in-process HTTP/2 server on a unix socket for ``runtime_proxy.runtime.unary``'s tests: each
request goes to a handler that answers well, badly or not at all (``Stream``'s helpers)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import h2.config
import h2.connection
import h2.events


@dataclass
class Stream:
    """One request as the handler sees it, and the means to answer it."""

    server: Session
    stream_id: int
    path: str
    headers: dict[bytes, bytes]
    request: bytes = b""

    @property
    def conn(self) -> h2.connection.H2Connection:
        return self.server.conn

    def flush(self) -> None:
        self.server.flush()

    def raw(self, data: bytes) -> None:
        """Bytes straight onto the socket, past the state machine."""
        self.server.writer.write(data)

    def headers_out(self, *, end: bool = False, status: bytes = b"200",
                    extra: tuple[tuple[bytes, bytes], ...] = ()) -> None:
        self.conn.send_headers(self.stream_id, [(b":status", status), (b"content-type", b"application/grpc"),
                                                *extra], end_stream=end)
        self.flush()

    async def data(self, payload: bytes, *, end: bool = False) -> None:
        """``payload`` as DATA frames within the client's windows."""
        sent = 0
        while sent < len(payload):
            room = min(self.conn.local_flow_control_window(self.stream_id), self.conn.max_outbound_frame_size)
            if room <= 0:
                self.server.window.clear()
                self.flush()
                await self.server.window.wait()
                continue
            self.conn.send_data(self.stream_id, payload[sent:sent + room])
            sent += room
            self.flush()
            await asyncio.sleep(0)
        if end:
            self.conn.end_stream(self.stream_id)
        self.flush()

    def trailers(self, code: int = 0, message: bytes = b"") -> None:
        extra = [(b"grpc-message", message)] if message else []
        self.conn.send_headers(self.stream_id, [(b"grpc-status", str(code).encode()), *extra], end_stream=True)
        self.flush()

    async def answer(self, message: bytes, code: int = 0) -> None:
        """A whole well-formed unary answer."""
        self.headers_out()
        await self.data(b"\0" + len(message).to_bytes(4, "big") + message)
        self.trailers(code)


Handler = Callable[[Stream], Coroutine[Any, Any, None]]


@dataclass
class Session:
    """One accepted connection."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    handler: Handler
    conn: h2.connection.H2Connection = field(default_factory=lambda: h2.connection.H2Connection(
        h2.config.H2Configuration(client_side=False, header_encoding=None)))
    window: asyncio.Event = field(default_factory=asyncio.Event)
    resets: list[int] = field(default_factory=list)
    tasks: set[asyncio.Task[None]] = field(default_factory=set)

    def flush(self) -> None:
        data = self.conn.data_to_send()
        if data and not self.writer.is_closing():
            self.writer.write(data)

    async def run(self) -> None:
        self.conn.initiate_connection()
        self.flush()
        streams: dict[int, Stream] = {}
        try:
            while data := await self.reader.read(65536):
                for event in self.conn.receive_data(data):
                    self._event(event, streams)
                self.flush()
        except (OSError, h2.exceptions.ProtocolError):
            pass
        finally:
            self.writer.close()

    def _event(self, event: h2.events.Event, streams: dict[int, Stream]) -> None:
        if isinstance(event, h2.events.RequestReceived):
            headers = dict(event.headers or [])
            sid = event.stream_id
            streams[sid] = Stream(self, sid, headers[b":path"].decode(), headers)
        elif isinstance(event, h2.events.DataReceived):
            streams[event.stream_id].request += event.data or b""
            self.conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
        elif isinstance(event, h2.events.StreamEnded):
            task = asyncio.get_running_loop().create_task(self.handler(streams[event.stream_id]))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
        elif isinstance(event, h2.events.StreamReset):
            self.resets.append(event.stream_id)
        elif isinstance(event, (h2.events.WindowUpdated, h2.events.RemoteSettingsChanged)):
            self.window.set()


class Server:
    """Serves ``handler`` on ``path``; ``sessions`` are the connections it accepted."""

    def __init__(self, path: str, handler: Handler) -> None:
        self.path = path
        self.handler = handler
        self.sessions: list[Session] = []
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_unix_server(self._accept, self.path)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        session = Session(reader, writer, self.handler)
        self.sessions.append(session)
        await session.run()

    async def stop(self) -> None:
        """Stop listening and drop every connection."""
        if self._server is not None:
            self._server.close()
        for session in self.sessions:
            for task in list(session.tasks):
                task.cancel()
            session.writer.close()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)
        self._server = None
