"""What the periodic loops (``runtime_proxy.wiring.loops``: the reconciler, the CPU burst loop,
the usage loop) see of NRI mode: the engine's store and node facts, and container updates.

Container updates are kept by the engine and sent in the next reply that can carry them
(CreateContainer, UpdateContainer, StopContainer; ``NriEngine.queue_update``); when the share
pools' input changed, the reconciler runs before that reply, so an LSR pod's own
CreateContainer reply moves the running LS containers off its CPUs, and the StopContainer reply
of its last container gives them back (``bound_pods``: a released pod no longer holds its
CPUs, ``runtime_proxy.state.store``).

With ``unsolicited`` they are sent at once as unsolicited ``UpdateContainers`` calls instead.
containerd 2.1 and 1.7 take their NRI lock and the NRI adaptation's lock in opposite orders for
such a call and for a CRI event, so the two can deadlock (containerd/containerd#13733, fixed in
containerd/nri#301); seen here once as a CreateContainer that never returned. Use it only on a
runtime with that fix. The loops run in their own tasks, never inside an NRI handler
(``NriConnection.call`` refuses that).
"""

from __future__ import annotations

from typing import Protocol

from google.protobuf.message import DecodeError

from cri_protos import nri_pb2
from hooks.facts import ContainerFacts, NodeFacts, PodFacts
from hooks.plan import ResourceChanges
from runtime_proxy.codecs.nri import linux_resources
from runtime_proxy.engine.table import record_sent
from runtime_proxy.nri.adapter import NriEngine
from runtime_proxy.nri.connection import NriConnection

__all__ = ["NriBackend", "UpdateRefused"]


class UpdateRefused(RuntimeError):
    """The runtime answered an ``UpdateContainers`` call with the update in its failed list."""


class HasConnection(Protocol):
    connection: NriConnection | None


class NriBackend:
    """``runtime_proxy.loops.reconciler.ReconcileBackend`` (and the burst loop's backend) over an
    ``NriEngine`` and the plugin whose session carries the updates."""

    def __init__(self, engine: NriEngine, plugin: HasConnection, *, timeout: float | None = None,
                 unsolicited: bool = False) -> None:
        self.engine = engine
        self.plugin = plugin
        self.timeout = timeout
        self.unsolicited = unsolicited

    def node(self) -> NodeFacts:
        return self.engine.node()

    def pods(self) -> list[PodFacts]:
        """The pods whose sandbox did not stop (``Store.live_pods``)."""
        return self.engine.store.live_pods()

    def bound_pods(self) -> list[PodFacts]:
        """The pods whose bound CPUs count for the share pools (``Store.holding_pods``)."""
        return self.engine.store.holding_pods()

    def containers(self) -> list[tuple[PodFacts, ContainerFacts]]:
        """The containers the runtime has not stopped."""
        return self.engine.store.running_containers()

    async def update_container_resources(self, container_id: str, changes: ResourceChanges) -> None:
        """Keep ``changes`` (CRI field names) for the engine's next reply; with ``unsolicited``,
        send them as one unsolicited ``ContainerUpdate`` naming the container and record them in
        the store once the runtime accepted them (raises ``ConnectionError`` without a session,
        ``UpdateRefused`` when the runtime lists the update as failed, ``RpcError`` or
        ``TimeoutError`` from the call)."""
        if not self.unsolicited:
            self.engine.queue_update(container_id, changes)
            return
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
        record_sent(self.engine.store, container_id, changes)
