"""What the periodic loops (``runtime_proxy.wiring.loops``: the reconciler, the CPU burst loop,
the usage loop) see of NRI mode: the engine's store and node facts, and container updates.

Container updates are kept by the engine and sent in the next reply that can carry them
(CreateContainer, UpdateContainer, StopContainer; ``NriEngine.queue_update``); when the share
pools' input changed, the reconciler runs before that reply, so an LSR pod's own
CreateContainer reply moves the running LS containers off its CPUs, and the StopContainer reply
of its last container gives them back (``bound_pods``: a released pod no longer holds its
CPUs, ``runtime_proxy.state.store``).

An update that no reply has carried for ``carry_wait`` seconds (a quiet node: no container
event comes; or a CreateContainer whose reply ran out of the runtime's time) is sent through the
runtime's CRI socket instead, as kubelet's UpdateContainerResources would be (``runtime``: a
``RuntimeClient`` on ``--backend``, made at the first such update when its socket exists, so
the plugin loads its HTTP/2 client only then; never the gRPC library). containerd passes that
CRI call through its NRI UpdateContainer event, whose reply (``NriEngine.update_container``)
carries the container's plan and the other pending updates.
Without a runtime client such updates keep waiting for a reply or the next Synchronize.

With ``unsolicited`` they are sent at once as unsolicited ``UpdateContainers`` calls instead.
containerd 2.1 and 1.7 take their NRI lock and the NRI adaptation's lock in opposite orders for
such a call and for a CRI event, so the two can deadlock (containerd/containerd#13733, fixed in
containerd/nri#301); seen here once as a CreateContainer that never returned. Use it only on a
runtime with that fix. The loops run in their own tasks, never inside an NRI handler
(``NriConnection.call`` refuses that).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol

import structlog
from google.protobuf.message import DecodeError

from cri_protos import nri_pb2
from hooks.facts import ContainerFacts, NodeFacts, PodFacts
from hooks.plan import ResourceChanges
from runtime_proxy.codecs.nri import linux_resources
from runtime_proxy.engine.table import record_sent
from runtime_proxy.nri.adapter import NriEngine
from runtime_proxy.nri.connection import NriConnection

__all__ = ["CARRY_WAIT", "NriBackend", "RuntimeUpdates", "UpdateRefused"]

log = structlog.get_logger(__name__)

CARRY_WAIT = 2.0
"""Seconds a container update waits for an NRI reply to carry it before it goes by CRI."""


class UpdateRefused(RuntimeError):
    """The runtime answered an ``UpdateContainers`` call with the update in its failed list."""


class HasConnection(Protocol):
    connection: NriConnection | None


class RuntimeUpdates(Protocol):
    """The runtime's CRI as the fallback needs it (``runtime_proxy.runtime.client.RuntimeClient``)."""

    async def update_changed_resources(self, container_id: str, changes: ResourceChanges) -> None: ...

    async def close(self) -> None: ...


class NriBackend:
    """``runtime_proxy.loops.reconciler.ReconcileBackend`` (and the burst loop's backend) over an
    ``NriEngine`` and the plugin whose session carries the updates."""

    def __init__(self, engine: NriEngine, plugin: HasConnection, *, timeout: float | None = None,
                 unsolicited: bool = False, runtime: Callable[[], RuntimeUpdates | None] | None = None,
                 carry_wait: float = CARRY_WAIT) -> None:
        self.engine = engine
        self.plugin = plugin
        self.timeout = timeout
        self.unsolicited = unsolicited
        self._make_runtime = runtime
        self._runtime: RuntimeUpdates | None = None
        self.carry_wait = carry_wait
        self._sending: set[asyncio.Future[None]] = set()
        self._told_no_runtime = False

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
            self._send_overdue()
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

    def _send_overdue(self) -> None:
        """Send the updates no reply carried for ``carry_wait`` seconds through the runtime's
        CRI, each in its own task (never inside the reconciler's round: containerd asks this
        plugin about the call before it answers, and the reply may run the round). Without a
        client (no ``--backend``, or its socket is not there: the chart's
        ``node.nri.runtimeSocketPath`` set empty) they stay queued for a reply."""
        if self._make_runtime is None:
            return
        pending = self.engine.pending_updates
        overdue = pending.overdue(self.carry_wait)
        if not overdue:
            return
        if self._runtime is None:
            self._runtime = self._make_runtime()
            if self._runtime is None:
                if not self._told_no_runtime:
                    self._told_no_runtime = True
                    log.info("no runtime CRI socket: container updates wait for an NRI reply to carry them",
                             waiting=len(overdue))
                for container_id, changes in overdue:
                    pending.add(container_id, changes)
                return
        store = self.engine.store
        for container_id, changes in overdue:
            if store.is_stopped(container_id) or store.container(container_id) is None:
                continue
            task = asyncio.ensure_future(self._send_by_cri(self._runtime, container_id, changes))
            self._sending.add(task)
            task.add_done_callback(self._sending.discard)

    async def _send_by_cri(self, runtime: RuntimeUpdates, container_id: str, changes: ResourceChanges) -> None:
        try:
            await runtime.update_changed_resources(container_id, changes)
        except Exception as exc:  # the reconciler finds the difference again in its next round
            log.warning("container update by CRI failed; retried after the next round finds it",
                        container=container_id, changes=dict(changes), error=str(exc)[:300])
            return
        log.info("container update no NRI reply carried sent by CRI UpdateContainerResources",
                 container=container_id, changes=dict(changes), waited_at_least=self.carry_wait)
        record_sent(self.engine.store, container_id, changes)

    @property
    def runtime_client(self) -> RuntimeUpdates | None:
        """The CRI client made for the fallback (None until an update needed it)."""
        return self._runtime

    async def drain(self) -> None:
        """Wait for the CRI updates in flight (each bounded by the client's timeout)."""
        if self._sending:
            await asyncio.gather(*self._sending, return_exceptions=True)
