"""The one HTTP transport to the API server: aiohttp on an event loop, configured from an
``ApiClient`` (``rhp_kube.credentials``).

``KubeHTTP.request`` makes one call and returns the reply's body, bounded (``max_bytes``);
``KubeHTTP.stream`` opens a watch stream with a read deadline. Requests are built from the
``ApiClient``: its host, default headers (User-Agent), auth (``update_params_for_auth``, so a
refreshed service-account token applies to the next call), TLS files and HTTP proxy. Every
failure is one of ``rhp_kube.errors``: the HTTP status (409 ``ConflictError``, 404
``NotFoundError``, 410 ``GoneError``, else ``APIError``), or status 0 when the server could not
be reached or the connection broke.

One ``aiohttp.ClientSession`` per event loop, made on first use (a session belongs to the loop
it was made on); ``aclose`` closes it. Measured in ``benchmarks/extender_scale.py``: a call on
the loop with aiohttp's C parser costs a fraction of a urllib3 call from a worker thread
(``http.client``'s header parsing and the GIL hand-offs), README's dependency table.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import threading
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode

import aiohttp
import orjson
from yarl import URL

from rhp_kube.errors import APIError, ConflictError, GoneError, NotFoundError, TooLargeError

if TYPE_CHECKING:
    from kubernetes.client import ApiClient, Configuration

__all__ = [
    "JSON_TYPE", "MAX_REPLY_BYTES", "MERGE_PATCH", "BlockingKubeHTTP", "KubeHTTP", "json_object", "lease_path", "seg",
    "status_error", "watch_transport",
]

MERGE_PATCH = "application/merge-patch+json"
JSON_TYPE = "application/json"
_AUTH = ["BearerToken"]  # the auth setting every generated core/coordination method names
# A reply body larger than this is refused (a list page of 500 objects at 128 KiB each).
MAX_REPLY_BYTES = 64 << 20
_CHUNK = 1 << 16


def seg(value: str) -> str:
    """One URL path segment (names are DNS labels; quoted anyway, as the generated client does)."""
    return quote(value, safe="")


def json_object(data: bytes) -> dict[str, Any]:
    """A reply body (``KubeHTTP.request``'s, already bounded) as a JSON object; empty is ``{}``."""
    out: dict[str, Any] = orjson.loads(data) if data else {}
    return out


def lease_path(namespace: str, name: str = "") -> str:
    """The ``coordination.k8s.io/v1`` Leases of ``namespace``, or the one named ``name``."""
    path = f"/apis/coordination.k8s.io/v1/namespaces/{seg(namespace)}/leases"
    return f"{path}/{seg(name)}" if name else path


def status_error(status: int, reason: str, body: bytes | str | None) -> APIError:
    """The typed error of a non-2xx reply; the ``Status`` object's message when it has one."""
    message = reason
    if body:
        try:
            doc = orjson.loads(body[:_CHUNK] if len(body) > _CHUNK else body)
            message = str(doc.get("message") or message)[:300]
        except (ValueError, AttributeError):
            message = str(body[:300])
    cls = {409: ConflictError, 404: NotFoundError, 410: GoneError}.get(status, APIError)
    return cls(status, message)


def _ssl_context(cfg: Configuration) -> ssl.SSLContext:
    """The TLS settings the ``ApiClient``'s urllib3 pool would use, as an ``SSLContext``."""
    ctx = ssl.create_default_context(cafile=cfg.ssl_ca_cert or None, cadata=cfg.ca_cert_data or None)
    if cfg.cert_file:
        ctx.load_cert_chain(cfg.cert_file, cfg.key_file or None)
    if not cfg.verify_ssl:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    elif cfg.assert_hostname is False:
        ctx.check_hostname = False
    return ctx


async def read_bounded(resp: aiohttp.ClientResponse, limit: int) -> bytes:
    """The whole body, or ``TooLargeError`` once it passes ``limit`` bytes (not read further)."""
    length = resp.content_length
    if length is not None and length > limit:
        raise TooLargeError(resp.status, f"reply of {length} bytes is larger than {limit}")
    out = bytearray()
    async for chunk in resp.content.iter_chunked(_CHUNK):
        out += chunk
        if len(out) > limit:
            raise TooLargeError(resp.status, f"reply larger than {limit} bytes")
    return bytes(out)


class KubeHTTP:
    """API calls as coroutines over aiohttp, configured from an ``ApiClient``.

    ``timeout`` bounds each call (seconds; streams have their own read deadline); ``limit`` is
    the number of connections kept to the API server."""

    def __init__(self, api_client: ApiClient, *, timeout: float | None = 5.0, limit: int = 32) -> None:
        from kubernetes.client.rest import should_bypass_proxies

        self.api_client = api_client
        cfg = api_client.configuration
        self._base = str(cfg.host).rstrip("/")
        self._proxy: str | None = None
        self._proxy_headers: Mapping[str, str] | None = None
        if cfg.proxy and not should_bypass_proxies(cfg.host, cfg.no_proxy or ""):
            if str(cfg.proxy).lower().startswith("socks"):
                raise ValueError("a SOCKS proxy is not supported; use an HTTP proxy")
            self._proxy, self._proxy_headers = cfg.proxy, cfg.proxy_headers
        self._ssl: ssl.SSLContext | bool = _ssl_context(cfg) if self._base.startswith("https:") else False
        hostname = cfg.tls_server_name or (cfg.assert_hostname if isinstance(cfg.assert_hostname, str) else None)
        self._server_hostname: str | None = hostname or None
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._limit = limit
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def _client(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self._session is None or self._session.closed or self._loop is not loop:
            self._loop = loop
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._limit, ssl=self._ssl),
                timeout=self._timeout,
                cookie_jar=aiohttp.DummyCookieJar(),  # the API server sets no cookies
                skip_auto_headers=("Accept-Encoding",),  # JSON replies, as urllib3 asked
            )
        return self._session

    async def aclose(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()
        self._session = None

    def _headers(self, method: str, path: str, body: Any, content_type: str) -> dict[str, Any]:
        client = self.api_client
        headers: dict[str, Any] = dict(client.default_headers)
        headers["Accept"] = JSON_TYPE
        if body is not None:
            headers["Content-Type"] = content_type
        client.update_params_for_auth(headers, [], _AUTH, path, method, body)
        return headers

    def _url(self, path: str, params: Mapping[str, str] | None) -> URL:
        query = f"?{urlencode(params)}" if params else ""
        return URL(self._base + path + query, encoded=True)  # path segments are quoted already

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        content_type: str = JSON_TYPE,
        *,
        params: Mapping[str, str] | None = None,
        max_bytes: int = MAX_REPLY_BYTES,
    ) -> bytes:
        """One call on ``path``; the body of a 2xx reply (at most ``max_bytes``), else a typed error."""
        headers = self._headers(method, path, body, content_type)
        data = None if body is None else orjson.dumps(body)
        try:
            async with self._client().request(
                method,
                self._url(path, params),
                data=data,
                headers=headers,
                proxy=self._proxy,
                proxy_headers=self._proxy_headers,
                server_hostname=self._server_hostname,
            ) as resp:
                status, reason = resp.status, resp.reason or ""
                if not 200 <= status <= 299:
                    raise status_error(status, reason, await read_bounded(resp, _CHUNK * 4))
                return await read_bounded(resp, max_bytes)
        except APIError:
            raise
        except (aiohttp.ClientError, OSError) as exc:  # refused, reset, timeout (an OSError)
            raise APIError(0, f"API server unreachable: {exc!r}") from None

    @contextlib.asynccontextmanager
    async def stream(
        self, path: str, params: Mapping[str, str], *, read_deadline: float, connect_timeout: float = 10.0
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """A 2xx streaming reply of ``GET path?params`` (a watch); each read of its body waits
        at most ``read_deadline`` seconds (then ``asyncio.TimeoutError``). Non-2xx replies and
        failures to connect are typed errors."""
        headers = self._headers("GET", path, None, JSON_TYPE)
        timeout = aiohttp.ClientTimeout(total=None, connect=connect_timeout, sock_read=read_deadline)
        try:
            ctx = self._client().get(
                self._url(path, params),
                headers=headers,
                proxy=self._proxy,
                proxy_headers=self._proxy_headers,
                server_hostname=self._server_hostname,
                timeout=timeout,
            )
            resp = await ctx.__aenter__()
        except (aiohttp.ClientError, OSError) as exc:
            raise APIError(0, f"API server unreachable: {exc!r}") from None
        try:
            if not 200 <= resp.status <= 299:
                try:
                    body = await read_bounded(resp, _CHUNK * 4)
                except (aiohttp.ClientError, OSError, APIError):
                    body = b""
                raise status_error(resp.status, resp.reason or "", body)
            yield resp
        finally:
            if resp.content.at_eof():
                resp.release()  # the connection goes back to the pool
            else:
                resp.close()  # unread data on it: never reused


class BlockingKubeHTTP:
    """``KubeHTTP.request`` for a caller on worker threads (the node reports, evictions, the
    lease-cleanup command): each calling thread runs its calls on an event loop of its own, made
    on its first call, with a ``KubeHTTP`` of its own over the same ``ApiClient`` (a session
    belongs to the loop it was made on), as ``rhp_kube.events.KubeEventsApi`` does on its one
    thread. A call blocks that thread only; ``close`` ends every thread's loop and connections
    (when no call runs)."""

    def __init__(self, api_client: ApiClient, *, timeout: float | None = 5.0, limit: int = 2) -> None:
        self.api_client = api_client
        self._timeout, self._limit = timeout, limit
        self._local = threading.local()
        self._lock = threading.Lock()
        self._all: list[tuple[asyncio.AbstractEventLoop, KubeHTTP]] = []

    def _mine(self) -> tuple[asyncio.AbstractEventLoop, KubeHTTP]:
        mine: tuple[asyncio.AbstractEventLoop, KubeHTTP] | None = getattr(self._local, "mine", None)
        if mine is None:
            mine = (asyncio.new_event_loop(), KubeHTTP(self.api_client, timeout=self._timeout, limit=self._limit))
            self._local.mine = mine
            with self._lock:
                self._all.append(mine)
        return mine

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        content_type: str = JSON_TYPE,
        *,
        params: Mapping[str, str] | None = None,
        max_bytes: int = MAX_REPLY_BYTES,
    ) -> bytes:
        """``KubeHTTP.request``, blocking: the same bounds and the same typed errors."""
        loop, http = self._mine()
        return loop.run_until_complete(http.request(method, path, body, content_type, params=params,
                                                    max_bytes=max_bytes))  # fmt: skip

    def close(self) -> None:
        with self._lock:
            every, self._all = self._all, []
        self._local = threading.local()
        for loop, http in every:
            loop.run_until_complete(http.aclose())
            loop.close()


def watch_transport(api_client: ApiClient | None, kubeconfig: str | None) -> KubeHTTP:
    """The transport of a long-running watch (no total timeout: the watch has its read
    deadline): over ``api_client`` when given, else over the process's credentials for
    ``kubeconfig`` (``credentials.load`` keeps them)."""
    from rhp_kube import credentials

    return KubeHTTP(api_client if api_client is not None else credentials.load(kubeconfig), timeout=None)
