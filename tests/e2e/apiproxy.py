"""A plain-HTTP reverse proxy on 127.0.0.1 in front of kube-apiserver whose matching requests can
be frozen, as a half-open connection looks to a client: an open response stops delivering bytes
without ending, and a new matching request gets no answer, until :meth:`ApiProxy.thaw`.

The client speaks plain HTTP to the proxy with no credentials (``scheduler-ext serve
--api-server http://127.0.0.1:PORT``); the proxy calls the API server over TLS with the client
certificate it is given, so RBAC applies to that identity. Runs its own event loop in a thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import threading
from collections.abc import Callable
from pathlib import Path

import aiohttp
from aiohttp import web

# headers that describe one hop or the body's framing, which the proxy sets itself
_HOP = frozenset({"connection", "keep-alive", "transfer-encoding", "content-length", "content-encoding", "host",
                  "proxy-connection", "upgrade", "te", "trailer"})  # fmt: skip


class ApiProxy:
    """See the module docstring. ``freeze(match)`` freezes requests for which ``match(method,
    path_and_query)`` is true; ``thaw()`` lets everything flow again."""

    def __init__(self, upstream: str, ca: Path, cert: Path, key: Path) -> None:
        self.upstream = upstream.rstrip("/")
        self._ssl = ssl.create_default_context(cafile=str(ca))
        self._ssl.load_cert_chain(str(cert), str(key))
        self._match: Callable[[str, str], bool] | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="api-proxy", daemon=True)
        self._thawed: asyncio.Event | None = None
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self.port = 0
        self.frozen_requests = 0
        """Requests that met a freeze (held at their start or mid-stream)."""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> ApiProxy:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(30)
        return self

    async def _start(self) -> None:
        self._thawed = asyncio.Event()
        self._thawed.set()
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_connect=10))
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await self._runner.setup()
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        await web.SockSite(self._runner, sock).start()

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        self.thaw()

        async def _stop() -> None:
            if self._runner is not None:
                await self._runner.cleanup()
            if self._session is not None:
                await self._session.close()

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(_stop(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def freeze(self, match: Callable[[str, str], bool]) -> None:
        def _do() -> None:
            self._match = match
            assert self._thawed is not None
            self._thawed.clear()

        self._loop.call_soon_threadsafe(_do)

    def thaw(self) -> None:
        def _do() -> None:
            self._match = None
            if self._thawed is not None:
                self._thawed.set()

        self._loop.call_soon_threadsafe(_do)

    async def _hold(self, method: str, target: str) -> None:
        """Wait while a freeze matches this request."""
        match = self._match
        if match is not None and match(method, target):
            self.frozen_requests += 1
            while (m := self._match) is not None and m(method, target):
                assert self._thawed is not None
                await self._thawed.wait()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        target = request.path_qs
        await self._hold(request.method, target)
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        assert self._session is not None
        async with self._session.request(request.method, self.upstream + target, data=body or None,
                                          headers=headers, ssl=self._ssl) as upstream:  # fmt: skip
            response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
            for name, value in upstream.headers.items():
                if name.lower() not in _HOP:
                    response.headers[name] = value
            await response.prepare(request)
            with contextlib.suppress(ConnectionError, aiohttp.ClientError):
                async for chunk in upstream.content.iter_any():
                    await self._hold(request.method, target)
                    await response.write(chunk)
                await response.write_eof()
        return response
