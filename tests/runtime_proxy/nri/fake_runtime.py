"""A fake NRI runtime for unit tests: a unix-socket server that speaks the multiplexer and ttrpc
from the runtime's side (calls the Plugin service on connection 1, serves RegisterPlugin and
UpdateContainers on connection 2)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cri_protos import nri_pb2, ttrpc_pb2
from runtime_proxy.nri import mux, ttrpc

PLUGIN = "nri.pkg.api.v1alpha1.Plugin"


class FakeRuntime:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.server: asyncio.Server | None = None
        self.registrations: list[Any] = []
        self.sessions: asyncio.Queue[Session] = asyncio.Queue()
        # Called with the session before the RegisterPlugin reply is sent (early Configure).
        self.before_register_reply: Callable[[Session], Any] | None = None
        self.max_frame_seen = 0
        # UpdateContainers answers with every update in its failed list.
        self.refuse_updates = False
        self.updated = asyncio.Event()

    async def start(self) -> FakeRuntime:
        self.server = await asyncio.start_unix_server(self._accept, path=str(self.path))
        return self

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        session = Session(self, reader, writer)
        await self.sessions.put(session)
        await session.read_loop()

    async def next_session(self, timeout: float = 60.0) -> Session:  # generous: a loaded 2-core machine
        return await asyncio.wait_for(self.sessions.get(), timeout)


class Session:
    def __init__(self, runtime: FakeRuntime, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.runtime = runtime
        self.reader = reader
        self.writer = writer
        self.frames = mux.FrameDecoder()
        self.from_plugin_conn = ttrpc.MessageDecoder()
        self.from_runtime_conn = ttrpc.MessageDecoder()
        self.next_stream = 1
        self.replies: dict[int, asyncio.Future[ttrpc_pb2.Response]] = {}
        self.registered = asyncio.Event()
        self.closed = asyncio.Event()
        self.update_requests: list[Any] = []
        self.tasks: set[asyncio.Future[None]] = set()

    async def read_loop(self) -> None:
        try:
            while data := await self.reader.read(65536):
                for conn_id, payload in self.frames.feed(data):
                    self.runtime.max_frame_seen = max(self.runtime.max_frame_seen, len(payload))
                    if conn_id == mux.PLUGIN_CONN:
                        for msg in self.from_plugin_conn.feed(payload):
                            future = self.replies.pop(msg.stream_id, None)
                            if future is not None and not future.done():
                                future.set_result(ttrpc_pb2.Response.FromString(msg.payload))
                    elif conn_id == mux.RUNTIME_CONN:
                        for msg in self.from_runtime_conn.feed(payload):
                            task = asyncio.ensure_future(self._serve(msg))
                            self.tasks.add(task)
                            task.add_done_callback(self.tasks.discard)
        except (ConnectionError, OSError):
            return
        finally:
            self.closed.set()
            for future in self.replies.values():
                if not future.done():
                    future.set_exception(ConnectionError("the plugin closed the session"))

    async def _serve(self, msg: ttrpc.Message) -> None:
        request = ttrpc_pb2.Request.FromString(msg.payload)
        if request.method == "RegisterPlugin":
            self.runtime.registrations.append(nri_pb2.RegisterPluginRequest.FromString(request.payload))
            if self.runtime.before_register_reply is not None:
                await self.runtime.before_register_reply(self)
            reply = ttrpc_pb2.Response(payload=nri_pb2.Empty().SerializeToString())
            self.registered.set()
        elif request.method == "UpdateContainers":
            update = nri_pb2.UpdateContainersRequest.FromString(request.payload)
            self.update_requests.append(update)
            failed = list(update.update) if self.runtime.refuse_updates else []
            reply = ttrpc_pb2.Response(payload=nri_pb2.UpdateContainersResponse(failed=failed).SerializeToString())
            self.runtime.updated.set()
        else:
            reply = ttrpc_pb2.Response(status=ttrpc_pb2.Status(code=12, message="unknown"))
        self.send(mux.RUNTIME_CONN, ttrpc.encode_message(msg.stream_id, ttrpc.TYPE_RESPONSE, reply.SerializeToString()))

    def send(self, conn_id: int, data: bytes, max_payload: int = 1 << 20) -> None:
        self.writer.write(mux.encode(conn_id, data, max_payload))

    def send_raw(self, data: bytes) -> None:
        self.writer.write(data)

    async def call(self, method: str, message: Any, *, service: str = PLUGIN, timeout: float = 5.0,
                   timeout_nano: int = 2_000_000_000) -> ttrpc_pb2.Response:
        stream_id = self.next_stream
        self.next_stream += 2
        future: asyncio.Future[ttrpc_pb2.Response] = asyncio.get_running_loop().create_future()
        self.replies[stream_id] = future
        payload = message if isinstance(message, bytes) else message.SerializeToString()
        request = ttrpc_pb2.Request(service=service, method=method, payload=payload,
                                    timeout_nano=timeout_nano).SerializeToString()
        # Not ttrpc.encode_message: the fake may send more than a real runtime's 4 MiB.
        self.send(mux.PLUGIN_CONN, ttrpc.HEADER.pack(len(request), stream_id, ttrpc.TYPE_REQUEST, 0) + request)
        return await asyncio.wait_for(future, timeout)

    def close(self) -> None:
        self.writer.close()
