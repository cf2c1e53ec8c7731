"""What the periodic loops (``runtime_proxy.wiring.loops``: the reconciler and the CPU burst
loop) see of NRI mode: the engine's store and node facts, and container updates sent to the
runtime as unsolicited ``UpdateContainers`` calls on the current session.

The loops run in their own tasks, never inside an NRI handler: the runtime holds its NRI lock
while it waits for a handler's reply, and takes the same lock for an unsolicited update, so an
update sent from a handler would wait for itself (``NriConnection.call`` refuses that). From a
loop the call simply waits until the event in progress is answered.
"""

from __future__ import annotations

from typing import Any, Protocol

from google.protobuf.message import DecodeError

from cri_protos import nri_pb2
from hooks.facts import ContainerFacts, NodeFacts, PodFacts
from runtime_proxy.nri.adapter import NriEngine, linux_resources
from runtime_proxy.nri.connection import NriConnection

__all__ = ["NriBackend", "UpdateRefused"]


class UpdateRefused(RuntimeError):
    """The runtime answered an ``UpdateContainers`` call with the update in its failed list."""


class HasConnection(Protocol):
    connection: NriConnection | None


class NriBackend:
    """``runtime_proxy.loops.reconciler.ReconcileBackend`` (and the burst loop's backend) over an
    ``NriEngine`` and the plugin whose session carries the updates."""

    def __init__(self, engine: NriEngine, plugin: HasConnection, *, timeout: float | None = None) -> None:
        self.engine = engine
        self.plugin = plugin
        self.timeout = timeout

    def node(self) -> NodeFacts:
        return self.engine.node()

    def pods(self) -> list[PodFacts]:
        return self.engine.store.pods()

    def containers(self) -> list[tuple[PodFacts, ContainerFacts]]:
        """The containers the runtime has not stopped."""
        stopped = self.engine.stopped
        return [(pod, c) for pod, c in self.engine.store.containers() if c.id not in stopped]

    async def update_container_resources(self, container_id: str, changes: dict[str, Any]) -> None:
        """Send ``changes`` (CRI field names) as one unsolicited ``ContainerUpdate`` naming the
        container; record them in the store once the runtime accepted them. Raises
        ``ConnectionError`` without a session, ``UpdateRefused`` when the runtime lists the
        update as failed, ``RpcError`` or ``TimeoutError`` from the call."""
        connection = self.plugin.connection
        if connection is None or connection.closed.is_set():
            raise ConnectionError("no NRI session to send the update on")
        resources, _ = linux_resources(changes)
        if not resources.ListFields():
            return
        update = nri_pb2.ContainerUpdate(container_id=container_id)
        update.linux.resources.CopyFrom(resources)
        request = nri_pb2.UpdateContainersRequest(update=[update])
        payload = await connection.call("UpdateContainers", request.SerializeToString(), timeout=self.timeout)
        try:
            failed = nri_pb2.UpdateContainersResponse.FromString(payload).failed
        except DecodeError as exc:
            raise UpdateRefused(f"undecodable UpdateContainers reply: {exc}") from None
        if failed:
            raise UpdateRefused(f"the runtime did not apply the update of container {container_id}")
        store = self.engine.store
        found, sandbox_id = store.container(container_id), store.sandbox_of(container_id)
        if found is not None and sandbox_id is not None:
            store.put_container(sandbox_id, found[1].replace(resources=found[1].resources.with_changes(changes)))
