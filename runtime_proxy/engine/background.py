"""Background tasks of the proxy's long-running parts: start once, stop by cancel-and-await.

Used by the reconciler (``runtime_proxy.loops.reconciler``), the cfsQuotaBurst loop
(``runtime_proxy.loops.burst``) and the hook-server registry (``runtime_proxy.hookclient``):

- ``every(interval, body)``: run ``body`` forever, ``interval`` seconds apart, logging (never
  raising) what it raises, so one bad round never ends the loop;
- ``Background``: the named tasks a part owns; ``start`` creates one, ``stop`` cancels them all
  and waits until they are gone.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Coroutine
from typing import NoReturn, Protocol

__all__ = ["Background", "every"]


class ExceptionLogger(Protocol):
    """What ``every`` logs a failed round with (a structlog or a stdlib logger)."""

    def exception(self, event: str, /) -> object: ...


async def every(
    interval: float,
    body: Callable[[], Awaitable[object]],
    *,
    logger: ExceptionLogger,
    error: str,
    delay_first: bool = False,
) -> NoReturn:
    """Await ``body()`` every ``interval`` seconds (measured from the end of the previous
    round), forever. An exception from ``body`` is logged with ``logger.exception(error)`` and
    the loop goes on. ``delay_first`` sleeps before the first round."""
    if delay_first:
        await asyncio.sleep(interval)
    while True:
        try:
            await body()
        except Exception:  # a loop must survive anything one round does
            logger.exception(error)
        await asyncio.sleep(interval)


class Background:
    """The asyncio tasks of one part, stopped together by cancel-and-await."""

    def __init__(self) -> None:
        self._tasks: list[asyncio.Task[object]] = []

    @property
    def running(self) -> bool:
        """True while a task started here has not finished."""
        return any(not t.done() for t in self._tasks)

    def start(self, coro: Coroutine[object, None, object], *, name: str) -> asyncio.Task[object]:
        """Run ``coro`` as a task named ``name`` until ``stop``."""
        task = asyncio.create_task(coro, name=name)
        self._tasks.append(task)
        return task

    async def stop(self) -> None:
        """Cancel every task and wait for each to end (its cancellation or any error is
        swallowed: stopping never raises)."""
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
