"""What the NRI door sends to containers other than the one an event is about: the resource
changes the loops want (``PendingUpdates``, sent in the next reply that can carry container
updates: CreateContainer, UpdateContainer, StopContainer, and recorded in the store as the
lifecycle table's ``record_sent`` says). Used by ``runtime_proxy.nri.adapter.NriEngine``."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

import structlog

from cri_protos import nri_pb2
from hooks.plan import ResourceChanges
from runtime_proxy.codecs.nri import linux_resources
from runtime_proxy.engine.table import record_sent
from runtime_proxy.state.store import Store

log = structlog.get_logger(__name__)

__all__ = ["MAX_PENDING", "PendingUpdates", "container_update"]

MAX_PENDING = 4096


def container_update(container_id: str, changes: ResourceChanges, *,
                     ignore_failure: bool = True) -> tuple[nri_pb2.ContainerUpdate | None, dict[str, object]]:
    """The ``ContainerUpdate`` carrying ``changes`` (None when NRI can carry none of them) and
    the changes it carries."""
    res, skipped = linux_resources(changes)
    if not res.ListFields():
        return None, {}
    update = nri_pb2.ContainerUpdate(container_id=container_id, ignore_failure=ignore_failure)
    update.linux.resources.CopyFrom(res)
    return update, {k: v for k, v in changes.items() if k not in skipped}


class PendingUpdates:
    """Container id -> the resource changes to send it (later changes of a field win), oldest
    first, at most ``MAX_PENDING``, each with the time it was first queued (``overdue``)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._changes: OrderedDict[str, ResourceChanges] = OrderedDict()
        self._since: dict[str, float] = {}
        self._clock = clock

    def __len__(self) -> int:
        return len(self._changes)

    def add(self, container_id: str, changes: ResourceChanges) -> None:
        self._changes[container_id] = self._changes.pop(container_id, ResourceChanges()).merged(changes)
        self._since.setdefault(container_id, self._clock())
        while len(self._changes) > MAX_PENDING:
            dropped, _ = self._changes.popitem(last=False)
            self._since.pop(dropped, None)
            log.warning("pending container update dropped (too many pending)", container=dropped)

    def clear(self) -> None:
        self._changes.clear()
        self._since.clear()

    def overdue(self, wait: float) -> list[tuple[str, ResourceChanges]]:
        """Remove and return the updates that have waited at least ``wait`` seconds for a reply
        to carry them, oldest first."""
        now = self._clock()
        due = [cid for cid in self._changes if now - self._since.get(cid, now) >= wait]
        return [(cid, self._pop(cid)) for cid in due]

    def _pop(self, container_id: str) -> ResourceChanges:
        self._since.pop(container_id, None)
        return self._changes.pop(container_id)

    def take(self, store: Store, skip: str = "") -> list[nri_pb2.ContainerUpdate]:
        """The pending updates as ``ContainerUpdate``s (``ignore_failure``: a container that is
        gone or cannot take it is only logged by the runtime), recorded in the store as sent;
        none for ``skip`` (the container the event is about) or a stopped container."""
        updates: list[nri_pb2.ContainerUpdate] = []
        pending, self._changes = self._changes, OrderedDict()
        self._since.clear()
        for container_id, changes in pending.items():
            if container_id == skip or store.is_stopped(container_id):
                continue
            update, sent = container_update(container_id, changes)
            if update is None:
                continue
            updates.append(update)
            record_sent(store, container_id, sent)
        return updates
