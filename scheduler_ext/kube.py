"""The only module that talks to the API server, through the official ``kubernetes`` client.

Who calls this: ``scheduler_ext.cli serve`` builds a ``KubeClient`` and hands ``list``/``watch``
to ``state.Watcher``, the pod calls to ``extender.Binder`` and the Lease calls to
``ledger.LeaseLedger``.

Every call decodes the JSON itself (orjson): the watch and list paths pass
``_preload_content=False`` to the generated methods and never build the client's model objects
(50,000 pods as models would cost seconds and hundreds of MiB), and unknown fields survive.

The bind path (pod GET/PATCH, Binding, Lease GET/POST/PUT: three to four calls per bind) skips
the generated methods: their pydantic call validation, parameter serialisation and
``sanitize_for_serialization`` cost more CPU than the request itself. ``_request`` builds the
same request from the same ``ApiClient``: its host, default headers (User-Agent), auth
(``update_params_for_auth``, so refreshed tokens still apply) and the REST client's urllib3
pool (TLS, proxy), with the body serialised once by orjson. ``ApiException`` and urllib3
errors become the library-neutral errors of ``scheduler_ext.errors``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any
from urllib.parse import quote

import kubernetes
import orjson
import urllib3
from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines

from scheduler_ext.errors import APIError, ConflictError, GoneError, NotFoundError

__all__ = ["KubeClient", "api_client_from_flags"]

MERGE_PATCH = "application/merge-patch+json"
JSON_TYPE = "application/json"
_AUTH = ["BearerToken"]  # the auth setting every generated core/coordination method names

_CUSTOM = {
    "noderesourcetopologies": ("topology.node.k8s.io", "v1alpha1", "noderesourcetopologies"),
    "devices": ("scheduling.koordinator.sh", "v1alpha1", "devices"),
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
    """Thin, typed calls over one ``ApiClient`` (thread-safe: urllib3 pools connections)."""

    def __init__(self, api_client: kubernetes.client.ApiClient, *, watch_timeout: int = 300) -> None:
        self.api_client = api_client
        self.core = kubernetes.client.CoreV1Api(api_client)
        self.custom = kubernetes.client.CustomObjectsApi(api_client)
        self.coordination = kubernetes.client.CoordinationV1Api(api_client)
        self.watch_timeout = watch_timeout
        self.request_timeout: float | None = None  # seconds, per bind-path call (None: urllib3's)

    def _request(self, method: str, path: str, body: Any = None, content_type: str = JSON_TYPE) -> bytes:
        """One non-streaming call on ``path``; the body of a 2xx reply, else a typed error."""
        client = self.api_client
        headers: dict[str, Any] = dict(client.default_headers)
        headers["Accept"] = JSON_TYPE
        data = None
        if body is not None:
            data = orjson.dumps(body)
            headers["Content-Type"] = content_type
        client.update_params_for_auth(headers, [], _AUTH, path, method, body)
        url = client.configuration.host + path
        try:
            resp = client.rest_client.pool_manager.request(
                method, url, body=data, headers=headers, preload_content=False,
                timeout=self.request_timeout,
            )
        except (OSError, urllib3.exceptions.HTTPError) as exc:
            raise APIError(0, f"API server unreachable: {exc}") from None
        try:
            reply: bytes = resp.data
        except (OSError, urllib3.exceptions.HTTPError) as exc:
            raise APIError(0, f"API server unreachable: {exc}") from None
        finally:
            resp.release_conn()
        if not 200 <= resp.status <= 299:
            raise _status_error(resp.status, resp.reason or "", reply)
        return reply

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
        )
        try:
            for line in iter_resp_lines(resp):  # type: ignore[no-untyped-call]
                if not line.strip():
                    continue
                event = orjson.loads(line)
                if event.get("type") == "ERROR":
                    obj = event.get("object") or {}
                    code = int(obj.get("code") or 0)
                    if code == 410:
                        raise GoneError(410, str(obj.get("message") or "watch expired"))
                    raise APIError(code, str(obj.get("message") or "watch error"))
                yield event
        finally:
            resp.close()
            resp.release_conn()

    # -- bind side ----------------------------------------------------------------------------
    @staticmethod
    def _pod_path(namespace: str, name: str) -> str:
        return f"/api/v1/namespaces/{_seg(namespace)}/pods/{_seg(name)}"

    def get_pod(self, namespace: str, name: str) -> dict[str, Any]:
        return _json(self._request("GET", self._pod_path(namespace, name)))

    def patch_pod_annotations(
        self, namespace: str, name: str, annotations: Mapping[str, str | None], resource_version: str
    ) -> dict[str, Any]:
        """JSON merge patch of annotations (``None`` deletes a key), guarded by resourceVersion."""
        meta: dict[str, Any] = {"annotations": dict(annotations)}
        if resource_version:
            meta["resourceVersion"] = resource_version
        return _json(
            self._request("PATCH", self._pod_path(namespace, name), {"metadata": meta}, MERGE_PATCH)
        )

    def bind_pod(self, namespace: str, name: str, uid: str, node: str) -> None:
        """POST the ``pods/binding`` subresource; the UID precondition guards a replaced pod."""
        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name, "namespace": namespace},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        if uid:
            body["metadata"]["uid"] = uid
        self._request("POST", self._pod_path(namespace, name) + "/binding", body)

    # -- HA ledger ----------------------------------------------------------------------------
    @staticmethod
    def _leases(namespace: str) -> str:
        return f"/apis/coordination.k8s.io/v1/namespaces/{_seg(namespace)}/leases"

    def get_lease(self, namespace: str, name: str) -> dict[str, Any]:
        return _json(self._request("GET", f"{self._leases(namespace)}/{_seg(name)}"))

    def create_lease(self, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]:
        return _json(self._request("POST", self._leases(namespace), body))

    def replace_lease(self, namespace: str, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """PUT; ``metadata.resourceVersion`` in ``body`` makes it a compare-and-swap (409)."""
        return _json(self._request("PUT", f"{self._leases(namespace)}/{_seg(name)}", body))
