"""The NRI door's background worker: with ``background`` the events whose reply carries nothing
are answered at once and processed here, in order, by one task; without it each is processed
before its reply. Used by ``runtime_proxy.nri.adapter.NriEngine``."""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Awaitable, Callable

import structlog

from runtime_proxy.engine.lifecycle import call_scope

log = structlog.get_logger(__name__)

__all__ = ["MAX_QUEUED", "EventWorker"]

MAX_QUEUED = 4096

# Work queued for the worker: its name (for the log) and the call.
_Queued = tuple[str, Callable[[], Awaitable[None]]]


class EventWorker:
    """One task that runs queued work in order; a failure costs only its own item."""

    def __init__(self, background: bool = False) -> None:
        self.background = background
        self._queue: asyncio.Queue[_Queued] | None = None
        self._task: asyncio.Task[None] | None = None

    async def later(self, name: str, work: Callable[[], Awaitable[None]]) -> None:
        """Queue ``work`` for the worker (or run it now without ``background``)."""
        if not self.background:
            await work()
            return
        if self._queue is None:
            self._queue = asyncio.Queue(MAX_QUEUED)
        if self._task is None or self._task.done():
            # A fresh context: the worker is no handler, whoever queued its first item.
            self._task = asyncio.get_running_loop().create_task(
                self._work(self._queue), name="nri-events", context=contextvars.Context())
        await self._queue.put((name, work))

    async def _work(self, queue: asyncio.Queue[_Queued]) -> None:
        while True:
            name, work = await queue.get()
            try:
                with call_scope():
                    await work()
            except Exception:  # one event's failure never stops the ones after it
                log.exception("NRI event processing failed", step=name)
            finally:
                queue.task_done()

    async def drain(self) -> None:
        """Wait until every queued item is processed."""
        if self._queue is not None and self._task is not None and not self._task.done():
            await self._queue.join()

    async def close(self) -> None:
        """Process what is queued, then stop the worker."""
        await self.drain()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
