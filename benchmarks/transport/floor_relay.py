"""The floor reference for the transport benchmark: a unix-socket byte copy that parses nothing.

Run by ``run.py`` as ``python floor_relay.py LISTEN BACKEND``. Each downstream connection gets
its own upstream connection; bytes are copied both ways with asyncio protocols on uvloop, with
backpressure (a full write buffer pauses reading the other side). No proxy that looks at method
names can be cheaper than this.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from typing import cast

import uvloop


class _Half(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.peer: _Half | None = None
        self.pending = bytearray()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports are not subclasses

    def data_received(self, data: bytes) -> None:
        peer = self.peer
        if peer is not None and peer.transport is not None:
            peer.transport.write(data)
        else:
            self.pending += data

    def connection_lost(self, exc: Exception | None) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.close()

    def pause_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.resume_reading()


class _Down(_Half):
    def __init__(self, backend: str) -> None:
        super().__init__()
        self.backend = backend

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        asyncio.get_running_loop().create_task(self._connect())

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            _, up = await loop.create_unix_connection(_Half, self.backend)
        except OSError:
            if self.transport is not None:
                self.transport.close()
            return
        up.peer, self.peer = self, up
        if self.pending and up.transport is not None:
            up.transport.write(bytes(self.pending))
            self.pending.clear()


async def serve(listen: str, backend: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(listen)
    server = await asyncio.get_running_loop().create_unix_server(lambda: _Down(backend), listen)
    print("ready", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    uvloop.run(serve(sys.argv[1], sys.argv[2]))
