"""``rhp_kube.watch``: the one list-and-watch recovers from every fault and the sink ends equal
to the server's objects (a scripted aiohttp API server on 127.0.0.1, ``tests/rhp_kube/scripted.py``)."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import structlog
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from rhp_kube import credentials, watch  # noqa: E402
from rhp_kube.http import KubeHTTP  # noqa: E402
from rhp_kube.watch import Informer, Resource, WatchOptions  # noqa: E402
from tests.rhp_kube.scripted import PATH, Scripted  # noqa: E402

FAST = WatchOptions(watch_timeout=1, read_deadline=2.5, backoff_initial=0.02, backoff_max=0.2, page_size=2,
                    absent_retry=0.1, max_line_bytes=4096, dead_after=3.0)


class Store:
    """A sink that keeps ``name -> data``, and can be told to raise."""

    def __init__(self) -> None:
        self.items: dict[str, str] = {}
        self.raise_next: list[BaseException] = []
        self.replaced = 0

    def _maybe_raise(self) -> None:
        if self.raise_next:
            raise self.raise_next.pop(0)

    def replace(self, kind: str, items: list[dict[str, Any]], *, absent: bool) -> None:
        self._maybe_raise()
        self.items = {i["metadata"]["name"]: i["data"] for i in items}
        self.replaced += 1

    def apply(self, kind: str, event: str, obj: dict[str, Any]) -> None:
        self._maybe_raise()
        name = obj["metadata"]["name"]
        if event == "DELETED":
            self.items.pop(name, None)
        else:
            self.items[name] = obj["data"]


async def wait_for(check: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.02)


@contextlib.asynccontextmanager
async def running(options: WatchOptions = FAST, store: Store | None = None
                  ) -> AsyncIterator[tuple[Scripted, Store, Informer]]:
    server = await Scripted().start()
    store = store or Store()
    informer = Informer(KubeHTTP(credentials.plain(server.url), timeout=5), [Resource("things", PATH)], store,
                        component="test", options=options)
    task = asyncio.create_task(informer.run())
    try:
        await wait_for(lambda: informer.kinds["things"].synced > 0)
        yield server, store, informer
    finally:
        informer._stopping = True
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await server.stop()


async def converged(server: Scripted, store: Store, timeout: float = 30.0) -> None:
    await wait_for(lambda: store.items == server.state(), timeout)


async def test_lists_in_pages_then_follows_the_watch() -> None:
    async with running() as (server, store, informer):
        for i in range(7):
            await server.put(f"o{i}", "v0")
        await converged(server, store)
        await server.put("o1", "v1")
        await server.delete("o2")
        await converged(server, store)
        assert informer.liveness() == (True, "ok")


@pytest.mark.parametrize("fault", ["drop", "410", "silent", "500", "garbage", "huge"])
async def test_recovers_from_a_fault_and_converges(fault: str) -> None:
    async with running() as (server, store, informer):
        await server.put("a", "1")
        await converged(server, store)
        server.faults += [fault] * 3
        await server.put("b", "2")
        await server.delete("a")
        server.compact() if fault == "410" else None
        await server.put("c", "3")
        await converged(server, store)
        await wait_for(lambda: not server.faults)
        await server.put("d", "4")
        await converged(server, store)
        if fault in ("drop", "silent", "500", "410"):
            assert informer.kinds["things"].restarts >= 1


async def test_a_stream_silent_past_the_deadline_is_cut() -> None:
    async with running() as (server, store, informer):
        await converged(server, store)
        server.faults.append("silent")
        await wait_for(lambda: any(r == "watch:silent" for r in server.requests))
        await server.put("late", "x")  # only a new stream carries it
        await converged(server, store)
        assert "SilentError" in informer.kinds["things"].last_error or informer.kinds["things"].restarts


@pytest.mark.parametrize("exc", [structlog.DropEvent(), KeyboardInterrupt(), SystemExit(3), GeneratorExit,
                                 asyncio.CancelledError(), RuntimeError("sink bug")],
                         ids=["DropEvent", "KeyboardInterrupt", "SystemExit", "GeneratorExit-class", "CancelledError",
                              "RuntimeError"])
async def test_any_exception_from_the_sink_is_survived(exc: BaseException | type[BaseException]) -> None:
    """A handler raising a BaseException (what killed every watch thread: ``structlog.DropEvent``
    from the repeat limiter, raised out of a ``logger.warning`` inside the client) is logged,
    counted and backed off; the watch lists again and converges. GeneratorExit is raised as a
    class here, in the form a handler would raise it by mistake."""
    error = exc() if isinstance(exc, type) else exc
    if isinstance(error, GeneratorExit):
        error = RuntimeError("stands in: GeneratorExit ends a generator, and so this watch, by design")
    store = Store()
    async with running(store=store) as (server, store, informer):
        await server.put("a", "1")
        await converged(server, store)
        store.raise_next += [error, error]
        await server.put("b", "2")
        await converged(server, store)
        await server.put("c", "3")
        await converged(server, store)
        assert informer.kinds["things"].restarts >= 1
        assert informer.liveness()[0]


async def test_a_raising_logger_inside_the_client_is_survived(monkeypatch: pytest.MonkeyPatch) -> None:
    """The request itself and the watch's own log lines raise ``structlog.DropEvent``: the loop
    goes on."""
    calls = {"n": 0}
    real = KubeHTTP.request

    async def flaky(self: KubeHTTP, *args: Any, **kwargs: Any) -> bytes:
        calls["n"] += 1
        if calls["n"] <= 2:
            raise structlog.DropEvent
        return await real(self, *args, **kwargs)

    class Raising:
        def __getattr__(self, name: str) -> Callable[..., None]:
            def raise_(*args: Any, **kwargs: Any) -> None:
                raise structlog.DropEvent

            return raise_

    monkeypatch.setattr(KubeHTTP, "request", flaky)
    monkeypatch.setattr(watch, "log", Raising())
    async with running() as (server, store, _informer):
        await server.put("a", "1")
        await converged(server, store)
        server.faults += ["drop", "500"]
        await server.put("b", "2")
        await converged(server, store)
    assert calls["n"] > 2


async def test_500s_for_a_while_then_recovery_with_backoff() -> None:
    async with running() as (server, store, informer):
        server.faults += ["500"] * 8
        await server.put("a", "1")
        await wait_for(lambda: not server.faults)
        await server.put("b", "1")
        await converged(server, store)
        assert informer.kinds["things"].restarts >= 8
        assert informer.kinds["things"].synced > 0


async def test_an_optional_kind_not_served_is_absent_and_picked_up_later() -> None:
    server = await Scripted().start()
    store = Store()
    missing = Resource("missing", "/apis/example.com/v1/missings", optional=True)
    informer = Informer(KubeHTTP(credentials.plain(server.url)), [missing, Resource("things", PATH)], store,
                        component="test", options=FAST)
    task = asyncio.create_task(informer.run())
    try:
        await wait_for(lambda: informer.kinds["missing"].absent)
        await server.put("a", "1")
        await converged(server, store)
        assert informer.liveness()[0]
    finally:
        informer._stopping = True
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await server.stop()


async def test_liveness_fails_when_the_api_server_says_nothing_past_the_bound() -> None:
    """Every stream silent and every list failing: after ``dead_after`` liveness says so."""
    options = WatchOptions(watch_timeout=1, read_deadline=1.5, backoff_initial=0.02, backoff_max=0.1,
                           dead_after=4.0)
    async with running(options) as (server, store, informer):
        await converged(server, store)
        assert informer.liveness()[0]
        server.faults += ["silent", "500"] * 200
        await wait_for(lambda: not informer.liveness()[0], timeout=30)
        _alive, why = informer.liveness()
        assert "things: no word from the API server" in why
        server.faults.clear()
        await wait_for(lambda: informer.liveness()[0], timeout=30)


def test_liveness_fails_when_the_thread_is_gone() -> None:
    informer = Informer(KubeHTTP(credentials.plain("http://127.0.0.1:9")), [Resource("things", PATH)], Store(),
                        component="test", options=FAST)
    assert informer.liveness() == (True, "not started")
    informer.start_thread()
    try:
        assert informer.liveness()[0]
        # the loop's thread ends without close (as a crash would): liveness says so
        loop = informer._loop
        deadline = time.monotonic() + 10
        while loop is None or informer._main is None:
            assert time.monotonic() < deadline
            time.sleep(0.01)
            loop = informer._loop
        loop.call_soon_threadsafe(loop.stop)
        assert informer._thread is not None
        informer._thread.join(10)
        alive, why = informer.liveness()
        assert not alive and "not running" in why
    finally:
        informer.close()


# ---- property: any sequence of faults ends with the store equal to the server's objects ----

FAULTS = st.sampled_from(["drop", "410", "silent", "500", "garbage", "huge", "raise", "compact"])
STEPS = st.lists(st.tuples(FAULTS, st.sampled_from(["put", "delete"]), st.sampled_from("abcde"),
                           st.integers(0, 3)), min_size=1, max_size=8)


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(steps=STEPS)
def test_any_sequence_of_faults_converges(steps: list[tuple[str, str, str, int]]) -> None:
    async def scenario() -> None:
        async with running() as (server, store, _informer):
            for fault, op, name, value in steps:
                if fault == "raise":
                    store.raise_next.append(structlog.DropEvent())
                elif fault == "compact":
                    server.compact()
                else:
                    server.faults.append(fault)
                if op == "put":
                    await server.put(name, str(value))
                else:
                    await server.delete(name)
                await asyncio.sleep(0.01)
            await converged(server, store, timeout=60)
            await wait_for(lambda: not server.faults, timeout=60)
            await server.put("final", "z")
            await converged(server, store, timeout=60)

    asyncio.run(scenario())
