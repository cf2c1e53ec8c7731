"""A scripted API server for ``rhp_kube.watch`` tests: one collection of objects served over
aiohttp on 127.0.0.1, with list pages, watch streams and bookmarks, and faults the test queues.

``objects`` is what the server holds; ``put``/``delete`` change it and wake the watches. Each
request to the collection takes the next fault from ``faults`` (none when empty):

- ``"500"``: a 500 reply; ``"410"``: a 410 reply (a watch: an ``ERROR`` event with code 410);
- ``"drop"``: a watch sends what it has, then the connection is cut mid-stream;
- ``"silent"``: a watch answers 200 and then nothing, for good (a half-open connection);
- ``"garbage"``: a watch first sends lines that are not events (not JSON, JSON that is not an
  object, an event without an object), then serves normally;
- ``"huge"``: a watch first sends one line larger than ``huge_bytes``, then serves normally;
- ``"raw"``: a watch first sends the bytes of ``raw`` as they are, then serves normally;
- ``"biglist"``: a list answers with a body of ``huge_bytes`` bytes (``list_body`` when set).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import orjson
from aiohttp import web

PATH = "/api/v1/things"


class Scripted:
    def __init__(self, *, page_size_cap: int = 3, history: int = 1000, huge_bytes: int = 1 << 16,
                 path: str = PATH) -> None:
        self.path = path
        self.watched_from: list[str] = []  # the resourceVersion each watch asked for
        self.objects: dict[str, dict[str, Any]] = {}
        self.rv = 1
        self.events: list[tuple[int, str, dict[str, Any]]] = []
        self.faults: list[str] = []
        self.page_size_cap = page_size_cap
        self.history = history
        self.huge_bytes = huge_bytes
        self.requests: list[str] = []
        self.raw: list[bytes] = []
        self.list_body: bytes = b""
        self._changed = asyncio.Condition()
        self._runner: web.AppRunner | None = None
        self.url = ""

    # -- the test's side ------------------------------------------------------------------------
    async def start(self) -> Scripted:
        app = web.Application()
        app.router.add_get(self.path, self._handle)
        self._runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def put(self, name: str, data: str) -> None:
        self.rv += 1
        etype = "MODIFIED" if name in self.objects else "ADDED"
        obj = {"metadata": {"name": name, "resourceVersion": str(self.rv)}, "data": data}
        self.objects[name] = obj
        await self._emit(etype, obj)

    async def emit(self, etype: str, obj: dict[str, Any], name: str) -> str:
        """An event with ``obj`` as it is (its own content, whatever it holds), stored under
        ``name``, its ``metadata.resourceVersion`` set when ``metadata`` is an object; the new
        version."""
        self.rv += 1
        meta = obj.get("metadata")
        if isinstance(meta, dict):
            meta["resourceVersion"] = str(self.rv)
        if etype == "DELETED":
            self.objects.pop(name, None)
        else:
            self.objects[name] = obj
        await self._emit(etype, obj)
        return str(self.rv)

    async def delete(self, name: str) -> None:
        obj = self.objects.pop(name, None)
        if obj is None:
            return
        self.rv += 1
        gone = {"metadata": {"name": name, "resourceVersion": str(self.rv)}, "data": obj["data"]}
        await self._emit("DELETED", gone)

    def compact(self) -> None:
        """Forget the event history: every watch from an older version gets 410."""
        self.events.clear()

    def state(self) -> dict[str, str]:
        return {name: obj["data"] for name, obj in self.objects.items()}

    async def _emit(self, etype: str, obj: dict[str, Any]) -> None:
        self.events.append((self.rv, etype, obj))
        del self.events[: -self.history]
        async with self._changed:
            self._changed.notify_all()

    # -- the server's side ----------------------------------------------------------------------
    async def _handle(self, request: web.Request) -> web.StreamResponse:
        fault = self.faults.pop(0) if self.faults else ""
        watch = request.query.get("watch") == "true"
        self.requests.append(("watch" if watch else "list") + (f":{fault}" if fault else ""))
        if fault == "500":
            return web.json_response({"kind": "Status", "code": 500, "message": "scripted"}, status=500)
        if not watch:
            if fault == "410":
                return web.json_response({"kind": "Status", "code": 410, "message": "continue expired"}, status=410)
            if fault == "biglist":
                return web.Response(body=self.list_body or b"[" * self.huge_bytes, content_type="application/json")
            return self._list(request)
        return await self._watch(request, fault)

    def _list(self, request: web.Request) -> web.Response:
        names = sorted(self.objects)
        limit = min(int(request.query.get("limit") or len(names) or 1), self.page_size_cap)
        start = int(request.query.get("continue") or 0)
        page = names[start:start + limit]
        meta: dict[str, Any] = {"resourceVersion": str(self.rv)}
        if start + limit < len(names):
            meta["continue"] = str(start + limit)
        return web.Response(body=orjson.dumps({"metadata": meta, "items": [self.objects[n] for n in page]}),
                            content_type="application/json")

    async def _watch(self, request: web.Request, fault: str) -> web.StreamResponse:
        try:
            return await self._stream(request, fault)
        except ConnectionError:  # the client went away (it cut a silent stream, or stopped)
            return web.Response(status=499)

    async def _stream(self, request: web.Request, fault: str) -> web.StreamResponse:
        self.watched_from.append(request.query.get("resourceVersion", ""))
        since = int(request.query.get("resourceVersion") or 0)
        oldest = self.events[0][0] if self.events else self.rv + 1
        if fault == "410" or (since < oldest - 1 and since < self.rv):
            if fault == "410" and len(self.requests) % 2:
                return web.json_response({"kind": "Status", "code": 410, "message": "too old"}, status=410)
            resp = web.StreamResponse()
            await resp.prepare(request)
            await resp.write(orjson.dumps({"type": "ERROR", "object": {"kind": "Status", "code": 410,
                                                                       "message": "too old"}}) + b"\n")
            return resp
        resp = web.StreamResponse()
        resp.content_type = "application/json"
        await resp.prepare(request)
        if fault == "silent":
            with contextlib.suppress(asyncio.CancelledError, ConnectionError):
                await asyncio.sleep(3600)
            return resp
        if fault == "garbage":
            for line in (b"{not json", b"[1, 2]", b'{"type": "ADDED"}', b'"text"', b"\xff\xfe"):
                await resp.write(line + b"\n")
        if fault == "raw":
            for chunk in self.raw:
                await resp.write(chunk)
        if fault == "huge":
            await resp.write(b'{"type": "ADDED", "object": {"data": "' + b"x" * self.huge_bytes + b'"}}\n')
        timeout = float(request.query.get("timeoutSeconds") or 60)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        sent = since
        while True:
            for rv, etype, obj in [e for e in self.events if e[0] > sent]:
                await resp.write(orjson.dumps({"type": etype, "object": obj}) + b"\n")
                sent = rv
            if fault == "drop":
                assert request.transport is not None
                request.transport.abort()
                return resp
            left = deadline - loop.time()
            if left <= 0:
                if request.query.get("allowWatchBookmarks") == "true":
                    bookmark = {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": str(self.rv)}}}
                    await resp.write(orjson.dumps(bookmark) + b"\n")
                return resp
            async with self._changed:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), min(left, 0.5))
