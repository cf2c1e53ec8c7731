"""What the real-cluster benchmarks share (``kube_pod_startup.py``, ``kube_scheduler_throughput.py``):
a small API client on the cluster's admin certificate, a pod watch that notes when each pod first
meets a condition (arrival time on this machine's monotonic clock), percentiles with a bootstrap
interval of a ratio, and the load average.

Everything talks to the API server on 127.0.0.1 only. Not a test: nothing here asserts speed.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import random
import ssl
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit


def loadavg() -> str:
    """The 1, 5 and 15 minute load averages, as /proc/loadavg says them."""
    with open("/proc/loadavg", encoding="ascii") as fh:
        return " ".join(fh.read().split()[:3])


def pct(values: Sequence[float], q: float) -> float:
    """The *q*-th percentile (nearest rank on the sorted values); NaN for none."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def bootstrap_ratio(
    arm: Sequence[float], base: Sequence[float], q: float, *, n: int = 2000, seed: int = 7
) -> tuple[float, float]:
    """The 90 % bootstrap interval of ``pct(arm, q) / pct(base, q)`` (each side resampled alone)."""
    if not arm or not base:
        return float("nan"), float("nan")
    rng = random.Random(seed)
    ratios = []
    for _ in range(n):
        a = [arm[rng.randrange(len(arm))] for _ in arm]
        b = [base[rng.randrange(len(base))] for _ in base]
        ratios.append(pct(a, q) / pct(b, q))
    return pct(ratios, 5), pct(ratios, 95)


class Api:
    """JSON over one keep-alive HTTPS connection per thread to the API server (admin identity)."""

    def __init__(self, server: str, tls: ssl.SSLContext, timeout: float = 60.0) -> None:
        parts = urlsplit(server)
        assert parts.hostname == "127.0.0.1", "the benchmarks talk to 127.0.0.1 only"
        self.host, self.port = parts.hostname, parts.port or 443
        self.tls = tls
        self.timeout = timeout
        self._local = threading.local()

    def connection(self, timeout: float | None = None) -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection(self.host, self.port, context=self.tls,
                                           timeout=self.timeout if timeout is None else timeout)  # fmt: skip

    def request(self, method: str, path: str, body: Any = None, *, ok: Sequence[int] = (200, 201, 202)) -> Any:
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if method == "PATCH":
            headers["Content-Type"] = "application/merge-patch+json"
        for attempt in (1, 2):
            conn = getattr(self._local, "conn", None)
            if conn is None:
                conn = self._local.conn = self.connection()
            try:
                conn.request(method, path, body=data, headers=headers)
                response = conn.getresponse()
                raw = response.read()
            except (OSError, http.client.HTTPException):
                conn.close()
                self._local.conn = None
                if attempt == 2:
                    raise
                continue
            if response.status not in ok:
                raise RuntimeError(f"{method} {path}: HTTP {response.status}: {raw[:500]!r}")
            return json.loads(raw) if raw else None
        raise AssertionError("unreachable")

    def create(self, path: str, obj: Mapping[str, Any]) -> Any:
        return self.request("POST", path, obj)


class PodWatch:
    """A thread watching the pods of one namespace from *resource_version* on; for each pod it
    records the monotonic time at which a watch event first showed it meeting *condition*
    (arrival of the event here, so it includes the API server's watch delay, alike for all arms).
    """

    def __init__(
        self, api: Api, namespace: str, resource_version: str, condition: Callable[[Mapping[str, Any]], bool]
    ) -> None:
        self.api = api
        self.namespace = namespace
        self.resource_version = resource_version
        self.condition = condition
        self.seen: dict[str, float] = {}
        self.objects: dict[str, Mapping[str, Any]] = {}
        self.error: BaseException | None = None
        self._changed = threading.Condition()
        self._stop = False
        self._conn: http.client.HTTPSConnection | None = None
        self._thread = threading.Thread(target=self._run, name=f"watch-{namespace}", daemon=True)

    def start(self) -> PodWatch:
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            while not self._stop:
                self._watch_once()
        except BaseException as exc:
            if not self._stop:
                self.error = exc
            with self._changed:
                self._changed.notify_all()

    def _watch_once(self) -> None:
        conn = self._conn = self.api.connection(timeout=None)
        path = (f"/api/v1/namespaces/{self.namespace}/pods?watch=1&allowWatchBookmarks=true"
                f"&resourceVersion={self.resource_version}&timeoutSeconds=3600")  # fmt: skip
        conn.request("GET", path, headers={"Accept": "application/json"})
        response = conn.getresponse()
        if response.status != 200:
            raise RuntimeError(f"watch: HTTP {response.status}: {response.read(500)!r}")
        while not self._stop:
            line = response.readline()
            if not line:
                return
            now = time.monotonic()
            event = json.loads(line)
            obj = event.get("object", {})
            if event.get("type") == "ERROR":
                raise RuntimeError(f"watch error: {obj}")
            self.resource_version = obj.get("metadata", {}).get("resourceVersion", self.resource_version)
            if event.get("type") not in ("ADDED", "MODIFIED"):
                continue
            name = obj["metadata"]["name"]
            with self._changed:
                self.objects[name] = obj
                if name not in self.seen and self.condition(obj):
                    self.seen[name] = now
                    self._changed.notify_all()

    def wait(self, names: Sequence[str], timeout: float) -> dict[str, float]:
        """Wait until every pod of *names* met the condition; their times."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while not all(n in self.seen for n in names):
                if self.error is not None:
                    raise RuntimeError(f"pod watch failed: {self.error}") from self.error
                left = deadline - time.monotonic()
                if left <= 0:
                    missing = [n for n in names if n not in self.seen]
                    raise TimeoutError(f"{len(missing)} pods never met the condition, e.g. {missing[:3]}")
                self._changed.wait(min(left, 1.0))
            return {n: self.seen[n] for n in names}

    def stop(self) -> None:
        self._stop = True
        if self._conn is not None and self._conn.sock is not None:
            with contextlib.suppress(OSError):
                self._conn.sock.shutdown(2)
        self._thread.join(5)


def make_namespace(api: Api, name: str, timeout: float = 120.0) -> None:
    """Create namespace *name* and wait for its ``default`` ServiceAccount (controller-manager's)."""
    api.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    deadline = time.monotonic() + timeout
    while True:
        try:
            api.request("GET", f"/api/v1/namespaces/{name}/serviceaccounts/default")
            return
        except RuntimeError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def delete_pods(api: Api, namespace: str, timeout: float = 300.0) -> None:
    """Delete every pod of *namespace* at once (grace period 0) and wait until the API has none."""
    api.request("DELETE", f"/api/v1/namespaces/{namespace}/pods",
                {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0})  # fmt: skip
    deadline = time.monotonic() + timeout
    while api.request("GET", f"/api/v1/namespaces/{namespace}/pods?limit=1")["items"]:
        if time.monotonic() > deadline:
            raise TimeoutError(f"pods of {namespace} still there after {timeout:.0f} s")
        time.sleep(0.2)
