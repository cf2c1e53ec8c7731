"""The one writer of the reports: GET, create and replace of this node's objects on the API
server, each answer bounded before it is parsed, and a token bucket per object.

Requests go through ``rhp_kube.http`` (``BlockingKubeHTTP``: the one transport, on an event loop
of the calling thread's own) over the ``kubernetes`` client's credentials only (in-cluster or
kubeconfig, loaded on first use); every answer is read at most ``MAX_OBJECT_BYTES`` far (a
larger answer is refused unparsed), then decoded by ``koord_formats.bounded.load_json`` (size,
depth and number bounds). Every call has ``timeout`` seconds. Call it from a worker thread
(``Reporter`` does): it blocks.

``RateLimit`` is koordlet's status limiter (``states_nodemetric.go``: 0.1 writes per second,
burst 2), used for every object, so a node never writes one object more than 6 times a
minute in the long run, whatever changes.

Errors: ``ApiError`` (with the HTTP status; 0 for no answer, or an answer that could not be
read), never anything else.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias

from koord_formats.bounded import load_json, read_object
from koord_formats.errors import FormatError

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

    from rhp_kube.http import BlockingKubeHTTP

__all__ = ["MAX_OBJECT_BYTES", "ApiError", "KubeObject", "KubeObjects", "RateLimit", "Ref"]

KubeObject: TypeAlias = dict[str, Any]  # Any: a Kubernetes object as JSON; each reader checks the fields it uses

# The largest object read back: a NodeMetric of a few hundred pods is tens of KiB, an NRT with a
# 4096-CPU topology about 400 KiB; etcd refuses objects above 1.5 MiB anyway.
MAX_OBJECT_BYTES = 2 * 1024 * 1024


class ApiError(Exception):
    """A request that did not succeed; ``status`` is the HTTP status (0: no usable answer)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True)
class Ref:
    """Where an object kind lives: group ("" for the core API), version and plural."""

    group: str
    version: str
    plural: str

    def path(self, name: str = "", sub: str = "") -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        out = f"{base}/{self.plural}"
        if name:
            out += f"/{name}"
        if sub:
            out += f"/{sub}"
        return out


class RateLimit:
    """A token bucket: ``rate`` tokens a second, at most ``burst`` held."""

    def __init__(self, rate: float = 0.1, burst: int = 2, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate
        self.burst = float(burst)
        self.clock = clock
        self._tokens = float(burst)
        self._at = clock()

    def allow(self) -> bool:
        now = self.clock()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now
        if self._tokens >= 1:
            self._tokens -= 1
            return True
        return False


def _load_api_client(kubeconfig: str | None) -> ApiClient:
    """The node's ``ApiClient`` (``rhp_kube.credentials``: in-cluster, else ``kubeconfig`` /
    ``KUBECONFIG``; a FIFO or a huge file there is refused, never read)."""
    from rhp_kube import credentials

    return credentials.load(kubeconfig)


class KubeObjects:
    """Bounded GET, POST and PUT of single objects (see the module docstring)."""

    def __init__(self, api_client: ApiClient | None = None, *,
                 kubeconfig: str | None = None, timeout: float = 10.0,
                 max_bytes: int = MAX_OBJECT_BYTES) -> None:
        self._api_client = api_client
        self._kubeconfig = kubeconfig
        self._lock = threading.Lock()
        self.timeout = timeout
        self.max_bytes = max_bytes
        self._http: BlockingKubeHTTP | None = None

    def _client(self) -> ApiClient:
        with self._lock:
            if self._api_client is None:
                try:
                    self._api_client = _load_api_client(self._kubeconfig)
                except Exception as exc:  # bad or missing credentials: this request fails, the next retries
                    raise ApiError(0, f"no usable credentials: {exc}") from None
            return self._api_client

    def _transport(self) -> BlockingKubeHTTP:
        client = self._client()
        with self._lock:
            if self._http is None:
                from rhp_kube.http import BlockingKubeHTTP

                self._http = BlockingKubeHTTP(client, timeout=self.timeout)
            return self._http

    def _request(self, method: str, path: str, body: Mapping[str, object] | None = None) -> object:
        from rhp_kube.errors import APIError, TooLargeError

        http = self._transport()
        try:
            data = http.request(method, path, None if body is None else dict(body), max_bytes=self.max_bytes)
        except TooLargeError as exc:  # a 2xx answer past max_bytes, or an error answer past its own bound
            if 200 <= exc.status <= 299:
                raise ApiError(0, f"{method} {path}: answer larger than {self.max_bytes} bytes, not parsed") from None
            raise ApiError(0, f"{method} {path}: HTTP {exc}, not parsed") from None
        except APIError as exc:  # status 0: refused, TLS, timeout, broken answer: no usable answer
            if exc.status:
                raise ApiError(exc.status, f"{method} {path}: HTTP {exc.status}: {str(exc)[:300]}") from None
            raise ApiError(0, f"{method} {path}: {exc}") from None
        try:
            return load_json(data.decode("utf-8"), f"{method} {path}", max_chars=self.max_bytes)
        except (FormatError, UnicodeDecodeError) as exc:
            raise ApiError(0, f"{method} {path}: {exc}") from None

    def close(self) -> None:
        """Close the connections (when no call runs)."""
        with self._lock:
            http, self._http = self._http, None
        if http is not None:
            http.close()

    def get(self, ref: Ref, name: str) -> KubeObject | None:
        """The object, or ``None`` when it does not exist."""
        try:
            obj = self._request("GET", ref.path(name))
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise
        try:
            return dict(read_object(obj, ref.plural))
        except FormatError as exc:
            raise ApiError(0, str(exc)) from None

    def create(self, ref: Ref, body: Mapping[str, object]) -> None:
        self._request("POST", ref.path(), body)

    def replace(self, ref: Ref, name: str, body: Mapping[str, object], *, status: bool = False) -> None:
        """PUT the object (or its ``status`` subresource); the body's ``resourceVersion`` makes it
        fail with 409 when the object changed since it was read."""
        self._request("PUT", ref.path(name, "status" if status else ""), body)

    def node_owner(self, name: str) -> dict[str, str] | None:
        """An ``ownerReferences`` entry for Node ``name`` (so the object goes with the Node), or
        ``None`` when the Node cannot be read."""
        try:
            node = self.get(Ref("", "v1", "nodes"), name)
        except ApiError:
            return None
        meta = node.get("metadata") if node else None
        uid = meta.get("uid") if isinstance(meta, dict) else None
        if not isinstance(uid, str) or not uid or len(uid) > 64:
            return None
        # Neither controller nor blockOwnerDeletion: the latter needs rights on the Node's
        # finalizers where OwnerReferencesPermissionEnforcement runs; garbage collection needs neither.
        return {"apiVersion": "v1", "kind": "Node", "name": name, "uid": uid}
