"""The one list-and-watch: keeps a sink in step with the API server, whatever happens.

Used by the extender (its cluster cache), the manager (its cache and the webhook's) and the
node agent (its Node, NodeSLO and NodeResourceTopology). An ``Informer`` watches a few
``Resource`` collections, each in its own supervised task on one event loop: its own thread's
(``start_thread``; every component uses that, so applying a list of 50,000 pods never holds the
loop that serves requests) or the caller's (``run``).

Per resource, forever:

1. **List** in pages (``limit``, ``continue``) and hand the whole list to ``Sink.replace``; its
   ``metadata.resourceVersion`` is where the watch starts. A list reply is bounded
   (``max_page_bytes``); a 410 of an expired continue token lists again from the start.
2. **Watch** from that version with ``allowWatchBookmarks`` and ``timeoutSeconds``; each event
   goes to ``Sink.apply``, a bookmark only moves the version on. The server ends the stream at
   ``timeoutSeconds`` and the watch resumes at once from the last version.
3. **Read deadline**: a stream that sends nothing (no event, no bookmark, no end) for
   ``read_deadline`` seconds is cut (a half-open connection or a hung API server) and the watch
   resumes from the last version. ``read_deadline`` is above ``timeoutSeconds`` plus the
   server's bookmark period (about a minute), so a healthy stream never meets it.
4. **410 Gone** (the reply or an ``ERROR`` event): the version is too old: list again.
5. **Everything else** (refused or reset connections, 5xx, a garbled reply, and any exception
   raised by a sink, a logging handler or the client, ``BaseException`` subclasses such as
   ``structlog.DropEvent`` included): logged, counted
   (``rhp_kube_watch_restarts_total{component,kind,reason}``), then, after an exponential backoff
   with full jitter (``backoff_initial`` doubling up to ``backoff_max``), a transport fault
   resumes the watch from the last version and any other fault lists again (the sink may have
   seen half of an event). Only the cancellation of the informer's own task
   (``close``/``stop``) ends it. A task that ended anyway is started again by ``run``.

Hostile replies: each watch line is bounded (``max_line_bytes``) before it is decoded; a longer
line is skipped unread (memory stays within the bound), a line that is not a JSON event is
skipped; both are counted (``rhp_kube_watch_skipped_lines_total{component,kind,reason}``) and
the kind is listed again after the backoff, so the store still converges (the list brings what
the line may have carried). A list reply is bounded too (``max_page_bytes``) and a garbled one is
a fault like any other.
Objects are decoded by orjson into plain dicts (never the client's model objects) and unknown
fields survive; the sinks judge the content.

Liveness: for each resource the informer records when the API server last said anything on it
(a list, an event, a bookmark, the end of a stream, a 404 of an optional kind) and when a list
last succeeded (gauges ``rhp_kube_watch_last_heard_timestamp_seconds`` and
``rhp_kube_watch_last_sync_timestamp_seconds``). ``liveness`` fails when a resource has had no
word for ``dead_after`` seconds (a few minutes, well above ``read_deadline``: a live watch hears
at least a bookmark or the end of its stream every ``timeoutSeconds``), or when the informer's
loop is not running: each component's ``/healthz`` answers 503 then, so kubelet restarts it.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn, Protocol

import aiohttp
import orjson
import structlog
from prometheus_client import Counter, Gauge

from rhp_kube.errors import APIError, GoneError, NotFoundError, SilentError
from rhp_kube.http import KubeHTTP, seg
from rhp_kube.liveness import DEAD_AFTER

__all__ = ["DEAD_AFTER", "Informer", "KindHealth", "Resource", "Sink", "WatchOptions", "collection"]

log = structlog.get_logger("rhp_kube.watch")

RESTARTS = Counter(
    "rhp_kube_watch_restarts_total",
    "List-and-watch restarts after a fault, by component, kind and reason (gone: 410, relisted; silent: no word "
    "within the read deadline; unreachable: connection refused, reset or broken; api: an error status; absent: an "
    "optional kind not served; skipped: a watch line skipped, relisted; fault: any other exception, relisted).",
    ["component", "kind", "reason"],
)
SKIPPED = Counter(
    "rhp_kube_watch_skipped_lines_total",
    "Watch lines skipped unapplied, by component, kind and reason (too-large, undecodable, not-an-event).",
    ["component", "kind", "reason"],
)
LISTS = Counter("rhp_kube_watch_lists_total", "Full lists applied, by component and kind.", ["component", "kind"])
LAST_HEARD = Gauge(
    "rhp_kube_watch_last_heard_timestamp_seconds",
    "When the API server last said anything on a watched kind (a list, an event, a bookmark, the end of a stream).",
    ["component", "kind"],
)
LAST_SYNC = Gauge(
    "rhp_kube_watch_last_sync_timestamp_seconds",
    "When a full list of a watched kind last succeeded.",
    ["component", "kind"],
)


def collection(group: str, version: str, plural: str, namespace: str = "") -> str:
    """The URL path of a collection: core (``group`` "") or of an API group, cluster-wide or in
    ``namespace``."""
    root = f"/api/{version}" if not group else f"/apis/{group}/{version}"
    return f"{root}/namespaces/{seg(namespace)}/{plural}" if namespace else f"{root}/{plural}"


@dataclass(frozen=True)
class Resource:
    """One collection to list and watch. ``kind`` names it to the sink, in logs and metrics;
    ``optional``: a kind whose CRD may not be installed (404 lists it as empty and absent, and
    it is asked again every ``WatchOptions.absent_retry`` seconds)."""

    kind: str
    path: str
    field_selector: str = ""
    optional: bool = False


class Sink(Protocol):
    """Where the informer puts what it learns (called on the informer's loop, one resource at
    a time per kind). ``replace`` gets a whole list (``absent``: the kind is not served);
    ``apply`` one ``ADDED``, ``MODIFIED`` or ``DELETED`` object."""

    def replace(self, kind: str, items: list[dict[str, Any]], *, absent: bool) -> None: ...

    def apply(self, kind: str, event: str, obj: dict[str, Any]) -> None: ...


@dataclass(frozen=True)
class WatchOptions:
    """The knobs of every resource of an informer (seconds unless named otherwise)."""

    watch_timeout: int = 60  # timeoutSeconds: the server ends each stream by then
    read_deadline: float = 90.0  # a stream silent this long is cut
    connect_timeout: float = 10.0
    list_timeout: float = 120.0  # one list page
    page_size: int = 500
    max_page_bytes: int = 128 << 20
    max_line_bytes: int = 4 << 20  # one watch event (etcd stores objects up to 1.5 MiB)
    backoff_initial: float = 0.5
    backoff_max: float = 30.0
    absent_retry: float = 10.0
    dead_after: float = DEAD_AFTER  # liveness: no word for this long fails /healthz


class SkippedLine(APIError):
    """A watch line skipped unapplied (too large, undecodable, not an event): the kind is listed
    again, after the usual backoff."""


@dataclass
class KindHealth:
    """What one resource's watch has been through (monotonic seconds; 0: never)."""

    heard: float = 0.0
    synced: float = 0.0
    restarts: int = 0
    last_error: str = ""
    absent: bool = False


def _safely(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
    """Log or count without letting anything out: a logging handler may raise anything
    (``structlog.DropEvent`` from a repeat limiter, a broken stream)."""
    with contextlib.suppress(BaseException):
        fn(*args, **kwargs)


def _reason(exc: BaseException) -> tuple[str, bool]:
    """(metric reason, whether the watch may resume from its last version)."""
    if isinstance(exc, SilentError):
        return "silent", True
    if isinstance(exc, SkippedLine):
        return "skipped", False
    if isinstance(exc, APIError):
        return ("unreachable" if exc.status == 0 else "api"), True
    if isinstance(exc, (aiohttp.ClientError, OSError, TimeoutError)):
        return "unreachable", True
    return "fault", False


class _Backoff:
    """Exponential with full jitter: each delay is uniform in [0, min(max, initial * 2**n)]."""

    def __init__(self, initial: float, maximum: float) -> None:
        self.initial, self.maximum, self.n = initial, maximum, 0

    def reset(self) -> None:
        self.n = 0

    def next(self) -> float:
        ceiling = min(self.maximum, self.initial * (2 ** min(self.n, 30)))
        self.n += 1
        return random.uniform(ceiling / 2, ceiling)


async def _lines(resp: aiohttp.ClientResponse, limit: int) -> AsyncIterator[bytes | None]:
    """The stream's lines without their newline; ``None`` for a line longer than ``limit``
    bytes, which is dropped as it arrives (memory stays within ``limit`` plus one chunk)."""
    buf = bytearray()
    skipping = False
    async for chunk in resp.content.iter_any():
        start = 0
        while True:
            nl = chunk.find(b"\n", start)
            if nl < 0:
                if not skipping:
                    buf += chunk[start:]
                    if len(buf) > limit:
                        buf.clear()
                        skipping = True
                        yield None
                break
            if skipping:
                skipping = False
            else:
                buf += chunk[start:nl]
                if len(buf) > limit:
                    yield None
                else:
                    yield bytes(buf)
            buf.clear()
            start = nl + 1
    if buf and not skipping:
        yield bytes(buf)


def _rv(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata")
    rv = meta.get("resourceVersion") if isinstance(meta, Mapping) else None
    return rv if isinstance(rv, str) and len(rv) <= 64 else ""


class Informer:
    """List-and-watch of ``resources`` into ``sink`` (see the module docstring).

    :param http: the transport (its own; the informer's loop owns its session), or a callable
        that makes it, called on the informer's loop under its supervision: credentials that
        cannot be loaded yet are a fault like any other (logged, counted, retried).
    :param component: the ``component`` label of the metrics and logs ("extender", "node", ...).
    :param on_heard: called with the kind each time the API server said something on it.
    """

    def __init__(
        self,
        http: KubeHTTP | Callable[[], KubeHTTP],
        resources: Sequence[Resource],
        sink: Sink,
        *,
        component: str,
        options: WatchOptions | None = None,
        on_heard: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._http: KubeHTTP | None = http if isinstance(http, KubeHTTP) else None
        self._make_http: Callable[[], KubeHTTP] | None = None if isinstance(http, KubeHTTP) else http
        self.resources = tuple(resources)
        self.sink = sink
        self.component = component
        self.options = options or WatchOptions()
        self.on_heard = on_heard
        self.clock = clock
        self.kinds: dict[str, KindHealth] = {r.kind: KindHealth() for r in self.resources}
        self._rvs: dict[str, str] = {r.kind: "" for r in self.resources}  # where each watch resumes
        self.started = 0.0  # monotonic time ``run`` began; 0: not running yet
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._main: asyncio.Task[None] | None = None
        self._running = False

    # -- liveness ----------------------------------------------------------------------------
    def _heard(self, kind: str) -> None:
        self.kinds[kind].heard = self.clock()
        _safely(LAST_HEARD.labels(self.component, kind).set_to_current_time)
        if self.on_heard is not None:
            self.on_heard(kind)

    def liveness(self) -> tuple[bool, str]:
        """(alive, why): not alive when the informer's loop stopped although nobody closed it,
        or a resource has had no word from the API server for ``dead_after`` seconds (counted
        from the start when it never had one). Cheap and thread-safe: for ``/healthz``."""
        if not self.started:
            return True, "not started"
        if self._stopping:
            return True, "stopping"
        if not self._running or (self._thread is not None and not self._thread.is_alive()):
            return False, f"{self.component} watches are not running"
        now = self.clock()
        dead = []
        for kind, health in self.kinds.items():
            quiet = now - max(health.heard, self.started)
            if quiet > self.options.dead_after:
                why = f"; last error: {health.last_error}" if health.last_error else ""
                dead.append(f"{kind}: no word from the API server for {quiet:.0f} s{why}")
        if dead:
            return False, "watch dead or stale past " + f"{self.options.dead_after:g} s: " + "; ".join(dead)
        return True, "ok"

    # -- running -----------------------------------------------------------------------------
    async def run(self) -> None:
        """Watch every resource until cancelled; a resource's task that ended is started again."""
        self.started = self.clock()
        self._running = True
        tasks: dict[asyncio.Task[None], Resource] = {}
        try:
            for res in self.resources:
                tasks[asyncio.create_task(self._supervise(res), name=f"watch-{self.component}-{res.kind}")] = res
            while tasks:
                done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    res = tasks.pop(task)
                    if self._stopping:
                        continue
                    _safely(RESTARTS.labels(self.component, res.kind, "fault").inc)
                    _safely(log.error, "watch task ended; started again", component=self.component, kind=res.kind)
                    await asyncio.sleep(self.options.backoff_initial)
                    tasks[asyncio.create_task(self._supervise(res))] = res
        finally:
            self._running = False
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(BaseException):
                    await task
            if self._http is not None:
                with contextlib.suppress(BaseException):
                    await self._http.aclose()

    def start_thread(self) -> None:
        """Run the informer on its own event loop in a daemon thread."""
        self._stopping = False
        self.started = self.clock()
        self._running = True
        self._thread = threading.Thread(target=self._thread_main, name=f"watch-{self.component}", daemon=True)
        self._thread.start()

    def _thread_main(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            self._main = loop.create_task(self.run())
            with contextlib.suppress(BaseException):
                loop.run_until_complete(self._main)
        finally:
            self._running = False
            with contextlib.suppress(BaseException):  # the loop was stopped under its tasks
                left = asyncio.all_tasks(loop)
                for task in left:
                    task.cancel()
                loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
            with contextlib.suppress(BaseException):
                loop.close()

    def close(self, timeout: float = 2.0) -> None:
        """Stop every watch (from any thread) and wait up to ``timeout`` seconds for the thread."""
        self._stopping = True
        loop, main = self._loop, self._main
        if loop is not None and main is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # closed meanwhile
                loop.call_soon_threadsafe(main.cancel)
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def http(self) -> KubeHTTP:
        """The transport, made on first use when a callable was given."""
        if self._http is None:
            assert self._make_http is not None
            self._http = self._make_http()
        return self._http

    # -- one resource ------------------------------------------------------------------------
    async def _supervise(self, res: Resource) -> None:
        backoff = _Backoff(self.options.backoff_initial, self.options.backoff_max)
        health = self.kinds[res.kind]
        rvs = self._rvs
        while True:
            try:
                if not rvs[res.kind]:
                    rvs[res.kind] = await self._list(res)
                    backoff.reset()
                if await self._watch(res):
                    backoff.reset()
                continue
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if self._stopping or (task is not None and task.cancelling()):
                    raise
                exc: BaseException = asyncio.CancelledError("cancelled from inside the client")
            except GeneratorExit:
                raise
            except GoneError as gone:
                health.restarts += 1
                health.last_error = str(gone)[:300]
                _safely(RESTARTS.labels(self.component, res.kind, "gone").inc)
                _safely(log.info, "watch expired; listing again", component=self.component, kind=res.kind)
                rvs[res.kind] = ""
                continue
            except NotFoundError as missing:
                if not res.optional:
                    exc = missing
                else:
                    health.absent = True
                    health.last_error = ""
                    _safely(RESTARTS.labels(self.component, res.kind, "absent").inc)
                    self.sink.replace(res.kind, [], absent=True)
                    self._heard(res.kind)
                    rvs[res.kind] = ""
                    await asyncio.sleep(self.options.absent_retry)
                    continue
            except BaseException as other:  # anything at all: logged, counted, backed off, restarted
                exc = other
            if self._stopping or sys.is_finalizing():
                return
            reason, resume = _reason(exc)
            health.restarts += 1
            health.last_error = f"{type(exc).__name__}: {exc}"[:300]
            _safely(RESTARTS.labels(self.component, res.kind, reason).inc)
            delay = backoff.next()
            _safely(log.warning, "watch failed; retrying", component=self.component, kind=res.kind, reason=reason,
                    error=health.last_error, retry_in=round(delay, 2), relist=not resume)
            if not resume:
                rvs[res.kind] = ""
            try:
                await asyncio.sleep(delay)
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if self._stopping or (task is not None and task.cancelling()):
                    raise

    async def _list(self, res: Resource) -> str:
        items: list[dict[str, Any]] = []
        token, rv = "", ""
        while True:
            params = {"limit": str(self.options.page_size)}
            if res.field_selector:
                params["fieldSelector"] = res.field_selector
            if token:
                params["continue"] = token
            async with asyncio.timeout(self.options.list_timeout):
                body = await self.http.request("GET", res.path, params=params, max_bytes=self.options.max_page_bytes)
            try:
                doc = orjson.loads(body)
            except ValueError as exc:
                raise APIError(200, f"list of {res.kind} is not JSON: {exc}") from None
            if not isinstance(doc, dict):
                raise APIError(200, f"list of {res.kind} is not an object")
            meta = doc.get("metadata")
            meta = meta if isinstance(meta, dict) else {}
            page = doc.get("items")
            if isinstance(page, list):
                items.extend(i for i in page if isinstance(i, dict))
            raw_rv, raw_token = meta.get("resourceVersion"), meta.get("continue")
            rv = raw_rv if isinstance(raw_rv, str) else ""
            token = raw_token if isinstance(raw_token, str) else ""
            if not token:
                break
        if not rv:
            raise APIError(200, f"list of {res.kind} without a resourceVersion")
        health = self.kinds[res.kind]
        health.absent = False
        self.sink.replace(res.kind, items, absent=False)
        health.synced = self.clock()
        health.last_error = ""
        _safely(LISTS.labels(self.component, res.kind).inc)
        _safely(LAST_SYNC.labels(self.component, res.kind).set_to_current_time)
        self._heard(res.kind)
        _safely(log.info, "listed", component=self.component, kind=res.kind, objects=len(items), resource_version=rv)
        return rv

    def _skip(self, kind: str, reason: str, what: str) -> NoReturn:
        """A line that cannot be applied: counted, and the stream dropped so that a fresh list
        brings what it may have carried (the watch goes on; only that line is lost)."""
        _safely(SKIPPED.labels(self.component, kind, reason).inc)
        raise SkippedLine(0, f"{what} skipped; listing again")

    async def _watch(self, res: Resource) -> bool:
        """One watch stream from the kind's last version, which moves with each bookmark and
        each event applied (a transport fault resumes from there); whether anything arrived."""
        kind = res.kind
        rv = self._rvs[kind]
        params = {
            "watch": "true",
            "resourceVersion": rv,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(self.options.watch_timeout),
        }
        if res.field_selector:
            params["fieldSelector"] = res.field_selector
        progressed = False
        async with self.http.stream(res.path, params, read_deadline=self.options.read_deadline,
                                    connect_timeout=self.options.connect_timeout) as resp:
            lines = _lines(resp, self.options.max_line_bytes)
            while True:
                try:
                    line = await anext(lines)
                except StopAsyncIteration:
                    break
                except (TimeoutError, aiohttp.ServerTimeoutError):
                    raise SilentError(0, f"{kind} watch silent for {self.options.read_deadline:g} s") from None
                except aiohttp.ClientPayloadError as exc:
                    raise APIError(0, f"{kind} watch stream broke: {exc}") from None
                self._heard(kind)
                progressed = True
                if line is None:
                    self._skip(kind, "too-large", f"a watch line over {self.options.max_line_bytes} bytes")
                if not line.strip():
                    continue
                try:
                    event = orjson.loads(line)
                except ValueError:
                    self._skip(kind, "undecodable", f"an undecodable watch line of {len(line)} bytes")
                obj = event.get("object") if isinstance(event, dict) else None
                etype = event.get("type") if isinstance(event, dict) else None
                if not isinstance(obj, dict) or not isinstance(etype, str):
                    self._skip(kind, "not-an-event", "a watch line that is not an event")
                if etype == "ERROR":
                    code = obj.get("code")
                    message = str(obj.get("message") or "watch error")[:300]
                    if code == 410:
                        raise GoneError(410, message)
                    raise APIError(code if isinstance(code, int) else 0, message)
                new_rv = _rv(obj)
                if etype == "BOOKMARK":
                    if new_rv:
                        self._rvs[kind] = new_rv
                    continue
                if etype in ("ADDED", "MODIFIED", "DELETED"):
                    # a sink that raises makes _supervise list again (it may have seen half the event)
                    self.sink.apply(kind, etype, obj)
                    if new_rv:
                        self._rvs[kind] = new_rv
        self._heard(kind)  # the server ended the stream (timeoutSeconds)
        return progressed
