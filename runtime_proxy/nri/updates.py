"""What the NRI door sends to containers other than the one an event is about: the resource
changes the loops want (``PendingUpdates``, sent in the next reply that can carry container
updates: CreateContainer, UpdateContainer, StopContainer) and the store a Synchronize rebuilds.
Used by ``runtime_proxy.nri.adapter.NriEngine``."""

from __future__ import annotations

from collections import OrderedDict

import structlog

from cri_protos import nri_pb2
from hooks.facts import ContainerFacts
from hooks.plan import ResourceChanges
from runtime_proxy.codecs.nri import container_facts, linux_resources, pod_facts, stopped_sandboxes
from runtime_proxy.state.store import Store

log = structlog.get_logger(__name__)

__all__ = ["MAX_PENDING", "PendingUpdates", "container_update", "record_sent", "store_from_sync"]

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


def record_sent(store: Store, sandbox_id: str, container: ContainerFacts, sent: dict[str, object]) -> None:
    """Record in ``store`` the resources sent to ``container``, so the reconciler's next round
    does not send them again."""
    store.put_container(sandbox_id, container.replace(resources=container.resources.with_changes(sent)))


class PendingUpdates:
    """Container id -> the resource changes to send it (later changes of a field win), oldest
    first, at most ``MAX_PENDING``."""

    def __init__(self) -> None:
        self._changes: OrderedDict[str, ResourceChanges] = OrderedDict()

    def __len__(self) -> int:
        return len(self._changes)

    def add(self, container_id: str, changes: ResourceChanges) -> None:
        self._changes[container_id] = self._changes.pop(container_id, ResourceChanges()).merged(changes)
        while len(self._changes) > MAX_PENDING:
            dropped, _ = self._changes.popitem(last=False)
            log.warning("pending container update dropped (too many pending)", container=dropped)

    def clear(self) -> None:
        self._changes.clear()

    def take(self, store: Store, skip: str = "") -> list[nri_pb2.ContainerUpdate]:
        """The pending updates as ``ContainerUpdate``s (``ignore_failure``: a container that is
        gone or cannot take it is only logged by the runtime), recorded in the store as sent;
        none for ``skip`` (the container the event is about) or a stopped container."""
        updates: list[nri_pb2.ContainerUpdate] = []
        pending, self._changes = self._changes, OrderedDict()
        for container_id, changes in pending.items():
            if container_id == skip or store.is_stopped(container_id):
                continue
            update, sent = container_update(container_id, changes)
            if update is None:
                continue
            updates.append(update)
            found, sandbox_id = store.container(container_id), store.sandbox_of(container_id)
            if found is not None and sandbox_id is not None:
                record_sent(store, sandbox_id, found[1], sent)
        return updates


def store_from_sync(pods: list[nri_pb2.PodSandbox],
                    containers: list[nri_pb2.Container]) -> tuple[Store, list[tuple[str, ContainerFacts]]]:
    """The store a Synchronize's pods and containers make (stopped containers and sandboxes
    marked so), and its running containers with their sandbox ids."""
    store = Store()
    for pod in pods:
        store.put_pod(pod_facts(pod))
    running: list[tuple[str, ContainerFacts]] = []
    for container in containers:
        facts = container_facts(container)
        store.put_container(container.pod_sandbox_id, facts)
        if container.state == nri_pb2.CONTAINER_RUNNING:
            running.append((container.pod_sandbox_id, facts))
        elif container.state == nri_pb2.CONTAINER_STOPPED:
            store.stop_container(container.id)
    for sandbox_id in stopped_sandboxes(pods, containers):
        store.stop_pod(sandbox_id)
    return store, running
