"""The only module that talks to the API server.

Who calls this: ``scheduler_ext.cli serve`` builds a ``KubeClient`` (informer side) and a
``BindClient`` (bind side) from one official ``kubernetes`` ``ApiClient``; it hands
``list``/``watch`` to ``state.Watcher``, and the ``BindClient`` to ``binder.Binder`` (pod
calls) and ``ledger.LeaseLedger`` (Lease calls).

Informer side (``KubeClient``): lists and watches through the official client's generated
methods with ``_preload_content=False``, decoded by orjson; each watch asks for bookmarks, ends
after ``watch_timeout`` (``timeoutSeconds``) and gives up on a stream silent for ``idle_timeout``
(a read timeout: ``SilentError``, which the ``Watcher`` answers with a fresh list); the client's model objects are
never built (50,000 pods as models would cost seconds and hundreds of MiB), and unknown fields
survive.

Bind side (``BindClient``): pod GET/PATCH, Binding, Lease GET/POST/PUT; a bind is usually the
Binding (which carries the annotations) and one Lease write.
They run as coroutines on the server's event loop over aiohttp, not on the ``ApiClient``'s
urllib3 pool from worker threads. Measured in ``benchmarks/extender_scale.py``: a call from a
bind thread cost the extender about 1 ms of CPU, most of it ``http.client``'s header parsing
and the GIL hand-offs between the bind threads, the watch threads and the loop serving filter;
on the loop, with aiohttp's C parser, a call costs a fraction of that and no thread switch.
The requests are still built from the ``ApiClient``: its host, default headers (User-Agent),
auth (``update_params_for_auth``, so a refreshed token applies to the next call), TLS files
and HTTP proxy. ``ApiException``, urllib3 and aiohttp errors all become the library-neutral
errors of ``scheduler_ext.errors``.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable, Iterator, Mapping
from typing import Any
from urllib.parse import quote

import aiohttp
import kubernetes
import orjson
import urllib3
from kubernetes.client.exceptions import ApiException
from kubernetes.client.rest import should_bypass_proxies
from kubernetes.watch.watch import iter_resp_lines
from yarl import URL

from koord_formats import keys, nodemetric
from scheduler_ext.errors import APIError, ConflictError, GoneError, NotFoundError, SilentError
from scheduler_ext.guard import bad_object

__all__ = ["BindClient", "KubeClient", "KubeKeyAPI", "api_client_from_flags"]

MERGE_PATCH = "application/merge-patch+json"
JSON_TYPE = "application/json"
_AUTH = ["BearerToken"]  # the auth setting every generated core/coordination method names

_CUSTOM = {
    "noderesourcetopologies": ("topology.node.k8s.io", "v1alpha1", "noderesourcetopologies"),
    "devices": ("scheduling.koordinator.sh", "v1alpha1", "devices"),
    "reservations": (keys.RESERVATION_API_GROUP, keys.RESERVATION_API_VERSION, keys.RESERVATION_PLURAL),
    "nodemetrics": (nodemetric.API_GROUP, nodemetric.API_VERSION, nodemetric.PLURAL),  # load-aware only
}


def api_client_from_flags(
    kubeconfig: str | None, context: str | None, in_cluster: bool
) -> kubernetes.client.ApiClient:
    """An ``ApiClient`` from a kubeconfig file, or from the pod's service account."""
    cfg = kubernetes.client.Configuration()
    if in_cluster:
        kubernetes.config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
    else:
        kubernetes.config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=kubeconfig, context=context, client_configuration=cfg
        )
    cfg.connection_pool_maxsize = max(cfg.connection_pool_maxsize or 0, 32)
    return kubernetes.client.ApiClient(cfg)


def _status_error(status: int, reason: str, body: bytes | str | None) -> APIError:
    message = reason
    if body:
        try:
            doc = orjson.loads(body)
            message = str(doc.get("message") or message)
        except (ValueError, AttributeError):
            message = str(body)[:300]
    cls = {409: ConflictError, 404: NotFoundError, 410: GoneError}.get(status, APIError)
    return cls(status, message)


def _error(exc: ApiException) -> APIError:
    return _status_error(int(exc.status or 0), exc.reason or "", exc.body)


def _json(data: bytes) -> dict[str, Any]:
    out: dict[str, Any] = orjson.loads(data) if data else {}
    return out


def _seg(value: str) -> str:
    """One URL path segment (names are DNS labels; quote anyway, as the generated code does)."""
    return quote(value, safe="")


class KubeClient:
    """Lists and watches over one ``ApiClient`` (thread-safe: urllib3 pools connections)."""

    def __init__(
        self,
        api_client: kubernetes.client.ApiClient,
        *,
        watch_timeout: int = 60,
        idle_timeout: float | None = None,
        connect_timeout: float = 10.0,
    ) -> None:
        self.api_client = api_client
        self.core = kubernetes.client.CoreV1Api(api_client)
        self.custom = kubernetes.client.CustomObjectsApi(api_client)
        self.watch_timeout = watch_timeout  # timeoutSeconds: the server ends each stream by then
        # a stream silent for this long is dead (a half-open connection never ends): past the
        # server's own end of the stream plus a margin
        self.idle_timeout = idle_timeout if idle_timeout is not None else watch_timeout + 30.0
        self.connect_timeout = connect_timeout

    def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """The raw urllib3 response (streams: the caller closes it and releases the connection)."""
        try:
            return fn(*args, _preload_content=False, **kwargs)
        except ApiException as exc:
            raise _error(exc) from None
        except (OSError, urllib3.exceptions.HTTPError) as exc:  # refused, reset, timeout
            raise APIError(0, f"API server unreachable: {exc}") from None

    def _fetch(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> bytes:
        """The whole body of a non-streaming call; the connection always goes back to the pool.

        A response whose body is never read keeps its connection checked out, so urllib3
        opens a fresh TCP connection for the next call (and the fake or real API server a
        fresh handler): a bind then pays a connect per call.
        """
        resp = self._call(fn, *args, **kwargs)
        try:
            data: bytes = resp.data
        except OSError as exc:
            raise APIError(0, f"API server unreachable: {exc}") from None
        finally:
            resp.release_conn()
        return data

    def _lister(self, kind: str) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        if kind == "nodes":
            return self.core.list_node, ()
        if kind == "pods":
            return self.core.list_pod_for_all_namespaces, ()
        group, version, plural = _CUSTOM[kind]
        return self.custom.list_cluster_custom_object, (group, version, plural)

    # -- informer side ------------------------------------------------------------------------
    def list(self, kind: str, continue_token: str, limit: int = 500) -> tuple[list[dict[str, Any]], str, str]:
        """One page of ``kind``: (items, resourceVersion, continue token or "")."""
        fn, args = self._lister(kind)
        kwargs: dict[str, Any] = {"limit": limit}
        if continue_token:
            kwargs["_continue"] = continue_token
        doc = _json(self._fetch(fn, *args, **kwargs))
        meta = doc.get("metadata") or {}
        return (
            list(doc.get("items") or []),
            str(meta.get("resourceVersion") or ""),
            str(meta.get("continue") or ""),
        )

    def watch(self, kind: str, resource_version: str) -> Iterator[dict[str, Any]]:
        """Watch events of ``kind`` after ``resource_version`` until the server ends the stream."""
        fn, args = self._lister(kind)
        resp = self._call(
            fn,
            *args,
            watch=True,
            resource_version=resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=self.watch_timeout,
            _request_timeout=(self.connect_timeout, self.idle_timeout),  # each read, not the stream
        )
        try:
            for line in _lines(resp, kind, self.idle_timeout):
                if not line.strip():
                    continue
                try:
                    event = orjson.loads(line)
                except ValueError as exc:  # e.g. an object nested deeper than orjson's limit
                    bad_object(kind, "undecodable", "?", exc)  # later events move the version on
                    continue
                if not isinstance(event, dict):
                    bad_object(kind, "undecodable", "?", "watch event is not an object")
                    continue
                if event.get("type") == "ERROR":
                    obj = event.get("object")
                    obj = obj if isinstance(obj, dict) else {}
                    raw_code = obj.get("code")
                    code = raw_code if isinstance(raw_code, int) else 0
                    if code == 410:
                        raise GoneError(410, str(obj.get("message") or "watch expired"))
                    raise APIError(code, str(obj.get("message") or "watch error"))
                yield event
        finally:
            resp.close()
            resp.release_conn()


def _lines(resp: Any, kind: str, idle: float) -> Iterator[str]:
    """The stream's lines; ``SilentError`` when a read waited longer than ``idle`` seconds."""
    try:
        yield from iter_resp_lines(resp)  # type: ignore[no-untyped-call]
    except (urllib3.exceptions.ReadTimeoutError, TimeoutError) as exc:
        raise SilentError(0, f"{kind} watch silent for {idle:g} s: {exc}") from None
    except urllib3.exceptions.ProtocolError as exc:
        if isinstance(exc.__context__, TimeoutError) or "timed out" in str(exc):
            raise SilentError(0, f"{kind} watch silent for {idle:g} s: {exc}") from None
        raise APIError(0, f"{kind} watch stream broke: {exc}") from None


def _pod_path(namespace: str, name: str) -> str:
    return f"/api/v1/namespaces/{_seg(namespace)}/pods/{_seg(name)}"


def _leases(namespace: str) -> str:
    return f"/apis/coordination.k8s.io/v1/namespaces/{_seg(namespace)}/leases"


def _ssl_context(cfg: kubernetes.client.Configuration) -> ssl.SSLContext:
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


class BindClient:
    """The bind path's API calls as coroutines (aiohttp), configured from an ``ApiClient``.

    One ``aiohttp.ClientSession`` per event loop, made on first use (a session belongs to the
    loop it was made on); ``aclose`` closes it. ``timeout`` bounds each call, in seconds.
    """

    def __init__(
        self, api_client: kubernetes.client.ApiClient, *, timeout: float | None = 5.0, limit: int = 32
    ) -> None:
        self.api_client = api_client
        cfg = api_client.configuration
        self._base = str(cfg.host).rstrip("/")
        self._proxy: str | None = None
        self._proxy_headers: Mapping[str, str] | None = None
        if cfg.proxy and not should_bypass_proxies(cfg.host, cfg.no_proxy or ""):
            if str(cfg.proxy).lower().startswith("socks"):
                raise ValueError("a SOCKS proxy is not supported on the bind path; use an HTTP proxy")
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
                skip_auto_headers=("Accept-Encoding",),  # small JSON replies, as urllib3 asked
            )
        return self._session

    async def aclose(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()
        self._session = None

    async def _request(
        self, method: str, path: str, body: Any = None, content_type: str = JSON_TYPE
    ) -> bytes:
        """One call on ``path``; the body of a 2xx reply, else a typed error."""
        client = self.api_client
        headers: dict[str, Any] = dict(client.default_headers)
        headers["Accept"] = JSON_TYPE
        data = None
        if body is not None:
            data = orjson.dumps(body)
            headers["Content-Type"] = content_type
        client.update_params_for_auth(headers, [], _AUTH, path, method, body)
        try:
            async with self._client().request(
                method,
                URL(self._base + path, encoded=True),  # path segments are quoted already
                data=data,
                headers=headers,
                proxy=self._proxy,
                proxy_headers=self._proxy_headers,
                server_hostname=self._server_hostname,
            ) as resp:
                reply = await resp.read()
                status, reason = resp.status, resp.reason or ""
        except (aiohttp.ClientError, OSError) as exc:  # refused, reset, timeout (an OSError)
            raise APIError(0, f"API server unreachable: {exc!r}") from None
        if not 200 <= status <= 299:
            raise _status_error(status, reason, reply)
        return reply

    async def get_pod(self, namespace: str, name: str) -> dict[str, Any]:
        return _json(await self._request("GET", _pod_path(namespace, name)))

    async def patch_pod_annotations(
        self, namespace: str, name: str, annotations: Mapping[str, str | None], resource_version: str
    ) -> dict[str, Any]:
        """JSON merge patch of annotations (``None`` deletes a key), guarded by resourceVersion."""
        meta: dict[str, Any] = {"annotations": dict(annotations)}
        if resource_version:
            meta["resourceVersion"] = resource_version
        return _json(
            await self._request("PATCH", _pod_path(namespace, name), {"metadata": meta}, MERGE_PATCH)
        )

    async def bind_pod(
        self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str], resource_version: str
    ) -> None:
        """POST the ``pods/binding`` subresource. kube-apiserver's BindingREST copies the
        Binding's ``metadata.annotations`` onto the pod in the same storage update that sets
        ``spec.nodeName``, and takes its ``metadata.uid`` and ``metadata.resourceVersion`` as
        preconditions (409 when the pod was replaced, changed since that version, or bound)."""
        meta: dict[str, Any] = {"name": name, "namespace": namespace}
        if uid:
            meta["uid"] = uid
        if resource_version:
            meta["resourceVersion"] = resource_version
        if annotations:
            meta["annotations"] = dict(annotations)
        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": meta,
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        await self._request("POST", _pod_path(namespace, name) + "/binding", body)

    async def get_lease(self, namespace: str, name: str) -> dict[str, Any]:
        return _json(await self._request("GET", f"{_leases(namespace)}/{_seg(name)}"))

    async def create_lease(self, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]:
        return _json(await self._request("POST", _leases(namespace), body))

    async def replace_lease(self, namespace: str, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """PUT; ``metadata.resourceVersion`` in ``body`` makes it a compare-and-swap (409)."""
        return _json(await self._request("PUT", f"{_leases(namespace)}/{_seg(name)}", body))


class KubeKeyAPI:
    """Secrets and ConfigMaps (``scheduler_ext.keystore.KeyAPI``) through the official client,
    synchronously: ``serve`` calls it a few times at start, before anything else runs."""

    def __init__(self, api_client: kubernetes.client.ApiClient) -> None:
        core = kubernetes.client.CoreV1Api(api_client)
        self._get: dict[str, Callable[..., Any]] = {
            "secrets": core.read_namespaced_secret, "configmaps": core.read_namespaced_config_map}
        self._create: dict[str, Callable[..., Any]] = {
            "secrets": core.create_namespaced_secret, "configmaps": core.create_namespaced_config_map}
        self._replace: dict[str, Callable[..., Any]] = {
            "secrets": core.replace_namespaced_secret, "configmaps": core.replace_namespaced_config_map}

    @staticmethod
    def _do(fn: Callable[..., Any], *args: Any) -> dict[str, Any]:
        try:
            resp = fn(*args, _preload_content=False, _request_timeout=10)
            try:
                return _json(resp.data)
            finally:
                resp.release_conn()
        except ApiException as exc:
            raise _error(exc) from None
        except (OSError, urllib3.exceptions.HTTPError) as exc:
            raise APIError(0, f"API server unreachable: {exc}") from None

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any]:
        return self._do(self._get[kind], name, namespace)

    def create(self, kind: str, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]:
        return self._do(self._create[kind], namespace, dict(body))

    def replace(self, kind: str, namespace: str, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        return self._do(self._replace[kind], name, namespace, dict(body))
