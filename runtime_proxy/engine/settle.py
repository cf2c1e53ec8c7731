"""Telling the loops that a door's event moved the share pools, and settling them before a reply.

A door whose replies can carry container updates (the NRI door: CreateContainer, UpdateContainer
and StopContainer replies) keeps one ``PoolSettle``. After an event changed the store it calls
``notify``: once per store version, the lifecycle core's ``pools_moved`` says whether the bound
cpusets (the share pools' input) changed; ``on_store_change`` (the loops, set by the composition
root) hears it, asked for an immediate round only when no ``settle`` will run before the next
reply. Before a reply that can carry updates the door calls ``settled``: when the pools moved
since the last round and another container runs (one whose update can ride on this reply),
``settle`` (the reconciler's round) runs, awaited at most ``SETTLE_WAIT`` seconds; it goes on in
the background after that, and what it finds later goes in a later reply.

The CRI door tells ``on_store_change`` after every intercepted call (its requests carry no
updates of other containers, so it never settles).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import structlog

from runtime_proxy.engine.lifecycle import Lifecycle
from runtime_proxy.state.store import Store

log = structlog.get_logger(__name__)

__all__ = ["SETTLE_WAIT", "PoolSettle", "frees_bound_cpus"]

SETTLE_WAIT = 0.5


def _log_failure(task: asyncio.Future[object]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("reconcile before a reply failed", error=str(task.exception()))


class PoolSettle:
    """The share pools' notification and settling of one door (see the module docstring)."""

    def __init__(self, core: Lifecycle, on_store_change: Callable[[bool], None] | None = None) -> None:
        self.core = core
        # Called after an event changed the store with "did the bound cpusets (the share pools'
        # input) change?", so the reconciler pushes new pools to running containers at once.
        self.on_store_change = on_store_change
        self.notified_version = -1
        # Set when the share pools' input changed; ``settle`` (the reconciler's round, set by
        # the composition root) then runs before the next reply that can carry updates.
        self.pools_dirty = False
        self.settle: Callable[[], Awaitable[object]] | None = None

    async def notify(self) -> None:
        """Tell ``on_store_change`` about a store change (once per store version)."""
        version = self.core.store.version
        if self.on_store_change is None or version == self.notified_version:
            return
        self.notified_version = version
        changed = await self.core.pools_moved()
        self.pools_dirty = self.pools_dirty or changed
        # With ``settle`` the new pools reach running containers in the next reply that can
        # carry them, so the reconciler only needs its routine round (for the files) here.
        self.on_store_change(changed and self.settle is None)

    async def settled(self, exclude: str = "") -> None:
        """Run ``settle`` when the share pools' input changed since it last ran, waiting for it
        at most ``SETTLE_WAIT`` seconds. With no other running container (``exclude`` is the one
        this event is about) no update can ride on this reply: the round is left to the
        reconciler's routine round (``on_store_change``), which writes the files, and
        ``pools_dirty`` stays set for the next reply."""
        if not self.pools_dirty or self.settle is None:
            return
        if not any(c.id != exclude for _, c in self.core.store.running_containers()):
            return
        self.pools_dirty = False
        task = asyncio.ensure_future(self.settle())
        task.add_done_callback(_log_failure)
        await asyncio.wait({task}, timeout=SETTLE_WAIT)


def frees_bound_cpus(store: Store, sandbox_id: str, container_id: str) -> bool:
    """Whether stopping ``container_id`` releases CPUs its pod holds (the store's rule,
    ``runtime_proxy.state.store``): every other container of the pod is stopped (the caller
    checked that the pod has bound CPUs). The NRI door then processes the stop before its reply
    and runs ``settled`` first."""
    for owner, container in store.containers():
        if owner.sandbox_id == sandbox_id and container.id != container_id and not store.is_stopped(container.id):
            return False
    return True
