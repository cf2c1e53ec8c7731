"""The NRI door: NRI events as facts for the lifecycle core (``runtime_proxy.engine.lifecycle``,
the same core as the CRI door's), stage results back into NRI replies; the core runs every stage
and applies the file part of every plan through the one applier, and the lifecycle table's walk
(``runtime_proxy.engine.walk``: ``before_reply``, ``after_event``, ``synchronize``) does what
the table says of each event (store changes, which facts are recorded, when files are applied or
held, events ignored for pods the store does not hold). This door decodes, encodes and queues.

Mapping (the lifecycle table, ``runtime_proxy.engine.table``, whose ``BY_NRI`` this door follows):

- RunPodSandbox -> ``PreRunPodSandbox`` then ``PostRunPodSandbox``. The pod already exists, so
  the plans' pod-level writes are applied at once; labels, annotations and a cgroup parent cannot
  be changed through NRI and are logged as not carried.
- CreateContainer -> ``PreCreateContainer``; resources, envs and annotations become the
  ``ContainerAdjustment`` of the reply. The plan's file writes wait until the container's cgroup
  exists and are applied at StartContainer (followed by ``PreStartContainer``) or
  PostStartContainer, whichever of the subscribed events comes first.
- UpdateContainer -> ``PreUpdateContainerResources``; the reply carries one ``ContainerUpdate``
  with the container's id set (the runtime matches updates by id).
- PostCreate/PostStart/PostUpdate, Stop and Remove of pods and containers -> the ``Post*``
  stages; their writes are applied.
- Synchronize -> the store is rebuilt from the runtime's pods and containers, then
  ``ReconcilePod`` for every pod and ``ReconcileContainer`` for every running container; the
  containers' resource changes go back in the Synchronize reply.

Bound CPUs. A pod holds the CPUs of its resource-status cpuset (the share pools' input, see
``runtime_proxy.engine.bound``) under the store's rule, the same as in proxy mode
(``runtime_proxy.state.store``, released pods): from RunPodSandbox until StopPodSandbox or until
the runtime stopped every container it had (removing those containers does not make it hold
them again, a new container does); a pod with no container yet holds them, so its first
CreateContainer reply can move the LS containers off them. At Synchronize a sandbox without a
pid and without a running container is stopped (containerd reports a NotReady sandbox so, and
keeps it until kubelet's garbage collection removes it), when the runtime reports the pid of
any other sandbox (a runtime that reports none cannot be read so); such a pod is not planned
(its cgroups are gone). Synchronize lists no exited container, so it cannot tell a pod whose
containers all exited from one that has none yet: after a plugin restart such a pod holds its
CPUs again until it is stopped, removed or gets a container. When the StopContainer of the last
running container of a pod that holds CPUs arrives, it is processed before the reply, the
reconciler's round runs, and the grown share pool goes back to the running LS containers in that
StopContainer reply (containerd sends StopContainer for kubelet's StopContainer, for a container
still running at StopPodSandbox, and when a container exits on its own). A change of the bound CPUs
that no reply can carry yet (no other container runs) is left to the reconciler's routine round
and to the next reply that can carry updates; so a pod's whole lifecycle on an otherwise idle
node costs no extra round.

Events. ``wanted_events`` names the events the pipeline has work for (plus those the store
needs: pods and containers arriving, stopping and leaving), so the runtime does not wait for a
reply that changes nothing. With ``background`` the events whose reply carries nothing (pod
events, StopContainer and the Post*/Start/Remove container events) are answered at once and
processed in order by one worker task; CreateContainer, UpdateContainer and Synchronize first
wait until the queue is empty, so they see every earlier event.

Pods not in the store. Only the creating events (RunPodSandbox, CreateContainer, Synchronize)
add a pod; every other event for a pod the store does not hold (a Stop or Remove arriving after
RemovePodSandbox, an UpdateContainer, a Post* event) is ignored with a log line and
``rhp_nri_events_ignored_total``, so it can never bring back a removed pod that would then hold
its bound CPUs. A StopContainer marks as stopped only a container the store holds.

A ``Fail``-policy failure at a ``Pre*`` stage (the core's ``StageRejected``) answers with an
error status (``RpcError``), so the runtime fails the CRI call; every other failure costs only the
plan of the step that failed (the pipeline's rules). With the recording applier (dry-run) plans
are logged and replies carry no changes.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Coroutine
from typing import ParamSpec, TypeVar

import structlog

from cri_protos import nri_pb2
from hooks.plan import Plan, PlanError, ResourceChanges
from rhp_kube.events import EventSink
from runtime_proxy.codecs.nri import (
    adjustment,
    container_facts,
    linux_resources,
    pod_facts,
    resources_from_nri,
    stopped_sandboxes,
    synchronized,
)
from runtime_proxy.engine.lifecycle import NO_POOLS, Lifecycle, LifecycleDoor, NodeSource, StageRejected
from runtime_proxy.engine.pipeline import Pipeline
from runtime_proxy.engine.settle import PoolSettle, frees_bound_cpus
from runtime_proxy.engine.table import BY_CRI, BY_NRI, EVENTS, HELD_STAGE, StoreChange
from runtime_proxy.engine.walk import after_event, before_reply, reply_lost, synchronize
from runtime_proxy.host.apply import Applier
from runtime_proxy.nri.connection import RpcError
from runtime_proxy.nri.updates import PendingUpdates, container_update
from runtime_proxy.nri.worker import EventWorker
from runtime_proxy.state.kubelet_root import KubeletRoot
from runtime_proxy.state.podspecs import PodSpecSource

log = structlog.get_logger(__name__)

__all__ = ["NriEngine"]

MAX_DEFERRED = 4096
E = nri_pb2.Event

# Events the store needs whatever the plugins do (the lifecycle table's store changes): pods and
# containers arriving, changing, stopping (a stopped sandbox releases its pod's bound CPUs; the
# loops leave stopped containers alone) and leaving.
ALWAYS: tuple[int, ...] = tuple(sorted({E.Value(row.nri_store) for row in EVENTS
                                         if row.nri_store is not None and row.store is not StoreChange.NONE}))
# Further events, each wanted when one of its stages has work.
WHEN_STAGES: tuple[tuple[int, tuple[str, ...]], ...] = tuple(
    (E.Value(name), stages) for name, (_, stages) in BY_NRI.items() if E.Value(name) not in ALWAYS)
# The file part of a PreCreateContainer plan waits for the container's cgroup: it is applied at
# StartContainer or PostStartContainer, whichever comes first; StartContainer is wanted for it
# when neither is wanted otherwise. (The events whose reply carries the plan, ``NRI_REPLIED``,
# each have their own method, never ``state_change``.)
DEFERRED_STAGE = HELD_STAGE


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _refusals_as_rpc_errors(
    method: Callable[_P, Coroutine[object, None, _R]],
) -> Callable[_P, Coroutine[object, None, _R]]:
    """A ``Fail``-policy refusal from the core becomes the NRI reply's error status."""

    @functools.wraps(method)
    async def replying(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return await method(*args, **kwargs)
        except StageRejected as refused:
            raise RpcError(refused.code, refused.message()) from None

    return replying



class NriEngine(LifecycleDoor):
    """Implements ``runtime_proxy.nri.plugin.Events`` over the lifecycle core (``Lifecycle``)."""

    def __init__(
        self,
        pipeline: Pipeline,
        *,
        node_source: NodeSource | None = None,
        applier: Applier | None = None,
        on_store_change: Callable[[bool], None] | None = None,
        background: bool = False,
        kubelet_root: KubeletRoot | None = None,
        events: EventSink | None = None,
        pod_specs: PodSpecSource | None = None,
    ) -> None:
        self.core = Lifecycle(pipeline, node_source=node_source, applier=applier, kubelet_root=kubelet_root,
                              where="nri", events=events, pod_specs=pod_specs)
        # No pools before the first event: only a pod that holds CPUs makes them change.
        self.core.pools = NO_POOLS
        self._worker = EventWorker(background)
        self._wanted: tuple[tuple[int, ...], tuple[int, ...]] | None = None
        self.runtime = ""
        # The share pools' notification (``on_store_change``) and settling (``settle``, run
        # before a reply that can carry updates when ``pools_dirty``): ``engine/settle.py``.
        self.pools = PoolSettle(self.core, on_store_change)
        # Container id -> resource changes the loops want, sent in the next reply that can
        # carry container updates (CreateContainer, UpdateContainer, StopContainer).
        self.pending_updates = PendingUpdates()

    @property
    def background(self) -> bool:
        """Whether replyless events are processed by the worker (``runtime_proxy.nri.worker``)."""
        return self._worker.background

    @background.setter
    def background(self, value: bool) -> None:
        self._worker.background = value

    @property
    def on_store_change(self) -> Callable[[bool], None] | None:
        return self.pools.on_store_change

    @on_store_change.setter
    def on_store_change(self, value: Callable[[bool], None] | None) -> None:
        self.pools.on_store_change = value

    @property
    def settle(self) -> Callable[[], Awaitable[object]] | None:
        return self.pools.settle

    @settle.setter
    def settle(self, value: Callable[[], Awaitable[object]] | None) -> None:
        self.pools.settle = value

    @property
    def pools_dirty(self) -> bool:
        return self.pools.pools_dirty

    # -- background events -----------------------------------------------------------------------

    def wanted_events(self) -> tuple[int, ...]:
        """The events to subscribe to (see the module docstring); recomputed only when the
        pipeline's steps changed."""
        key = tuple(map(id, self.pipeline.steps))
        if self._wanted is None or self._wanted[0] != key:
            self._wanted = (key, wanted_events(self.pipeline))
        return self._wanted[1]

    async def _later(self, name: str, work: Callable[[], Awaitable[None]]) -> None:
        await self._worker.later(name, work)

    async def drain(self) -> None:
        """Wait until every queued event is processed."""
        await self._worker.drain()

    async def close(self) -> None:
        """Process what is queued, then stop the worker."""
        await self._worker.close()

    # -- container updates from the loops ----------------------------------------------------

    def queue_update(self, container_id: str, changes: ResourceChanges) -> None:
        """Keep ``changes`` for the next reply that can carry container updates (later changes
        of the same field win), when the applier carries them (not in dry-run)."""
        try:
            changes = ResourceChanges.parse(changes)  # the same object when it already is one
        except PlanError as exc:
            log.warning("container update not queued: bad resource changes", container=container_id, error=str(exc))
            return
        if not self.core.allows(Plan(resources=changes), "ReconcileContainer"):
            return
        self.pending_updates.add(container_id, changes)

    # -- Events --------------------------------------------------------------------------------

    async def configure(self, request: nri_pb2.ConfigureRequest) -> None:
        self.runtime = f"{request.runtime_name} {request.runtime_version}".strip()

    def session_ended(self) -> None:
        """Nothing to drop: the next session's Synchronize rebuilds the store."""

    @_refusals_as_rpc_errors
    async def synchronize(
        self, pods: list[nri_pb2.PodSandbox], containers: list[nri_pb2.Container]
    ) -> list[nri_pb2.ContainerUpdate]:
        await self.drain()
        self.pending_updates.clear()  # every running container is reconciled here anyway
        result = await self._synchronize(pods, containers)
        await self.pools.notify()
        return result

    async def _synchronize(
        self, pods: list[nri_pb2.PodSandbox], containers: list[nri_pb2.Container]
    ) -> list[nri_pb2.ContainerUpdate]:
        """The store rebuilt from the runtime and every pod and running container reconciled
        (``runtime_proxy.engine.walk.synchronize``); the containers' changes go back as updates
        with ``ignore_failure`` (a container that cannot take its update keeps running as it is)."""
        self.pools.notified_version = -1
        return await synchronize(self.core, [pod_facts(pod) for pod in pods], synchronized(containers),
                                 stopped_sandboxes(pods, containers), container_update)

    @_refusals_as_rpc_errors
    async def create_container(
        self, pod: nri_pb2.PodSandbox, container: nri_pb2.Container
    ) -> nri_pb2.CreateContainerResponse:
        """The container's adjustment, and the pending updates of the others; the store change
        is told before the reconciler's round, so the first container of a pod that holds bound
        CPUs again (its containers were all stopped) moves the LS containers off them in this
        reply."""
        work = asyncio.ensure_future(self._create_and_reply(pod, container))
        try:
            return await asyncio.shield(work)
        except asyncio.CancelledError:
            # The reply is not sent (the handler ran out of the runtime's time, or the session
            # closed): the runtime creates the container as it was asked, without this plan.
            work.add_done_callback(functools.partial(self._reply_lost, pod, container))
            raise

    async def _create_and_reply(
        self, pod: nri_pb2.PodSandbox, container: nri_pb2.Container
    ) -> nri_pb2.CreateContainerResponse:
        await self.drain()
        result = await self._create_container(pod, container)
        await self.pools.notify()
        await self.pools.settled(exclude=container.id)
        result.update.extend(self.pending_updates.take(self.store, skip=container.id))
        return result

    def _reply_lost(self, pod: nri_pb2.PodSandbox, container: nri_pb2.Container, work: asyncio.Future[object]) -> None:
        """A CreateContainer whose reply never reached the runtime (its work finished after the
        handler gave up): the store holds the container as the runtime created it, so the
        reconciler finds the planned values missing and sends them (``runtime_proxy.nri.backend``:
        in a later reply, or by CRI once none carried them); the plan's file part still waits for
        the container's start. Updates of other containers that rode in the lost reply are found
        again the same way (the reconciler compares with their cgroup files)."""
        if not work.cancelled() and work.exception() is not None:
            log.warning("CreateContainer failed after its reply was given up", container=container.id,
                        error=str(work.exception())[:300])
        reply_lost(self.core, BY_CRI["CreateContainer"], pod_facts(pod), container_facts(container))
        log.warning("CreateContainer reply not sent in the runtime's time: the container starts without this "
                    "plan; the reconciler sends it as an update", container=container.id,
                    pod=f"{pod.namespace}/{pod.name}")

    async def _create_container(
        self, pod: nri_pb2.PodSandbox, container: nri_pb2.Container
    ) -> nri_pb2.CreateContainerResponse:
        reply = nri_pb2.CreateContainerResponse()
        result = await before_reply(self.core, BY_CRI["CreateContainer"], pod_facts(pod), container_facts(container),
                                    _not_adjusted)
        if result is None:
            return reply
        adjust, skipped = adjustment(result.plan)
        if skipped:
            log.info("plan fields NRI cannot carry at create; dropped", fields=skipped, container=container.id)
        if adjust.ListFields():
            reply.adjust.CopyFrom(adjust)
        return reply

    @_refusals_as_rpc_errors
    async def update_container(
        self, pod: nri_pb2.PodSandbox, container: nri_pb2.Container, resources: nri_pb2.LinuxResources
    ) -> list[nri_pb2.ContainerUpdate]:
        await self.drain()
        await self.pools.settled()
        result = await self._update_container(pod, container, resources)
        result = [*result, *self.pending_updates.take(self.store, skip=container.id)]
        await self.pools.notify()
        return result

    async def _update_container(
        self, pod: nri_pb2.PodSandbox, container: nri_pb2.Container, resources: nri_pb2.LinuxResources
    ) -> list[nri_pb2.ContainerUpdate]:
        result = await before_reply(self.core, BY_CRI["UpdateContainerResources"], pod_facts(pod),
                                    container_facts(container), _not_carried, resources_from_nri(resources))
        if result is None or not result.plan.resources:
            return []
        res, skipped = linux_resources(result.plan.resources)
        if skipped:
            log.info("plan fields NRI cannot carry at update; dropped", fields=skipped, container=container.id)
        if not res.ListFields():
            return []
        update = nri_pb2.ContainerUpdate(container_id=container.id)
        update.linux.resources.CopyFrom(res)
        return [update]

    @_refusals_as_rpc_errors
    async def stop_container(
        self, pod: nri_pb2.PodSandbox, container: nri_pb2.Container
    ) -> list[nri_pb2.ContainerUpdate]:
        """The pending updates of the other containers. When this stop releases CPUs bound to
        the pod (its last running container stops), the event is processed now and the
        reconciler's round runs first, so the LS containers grow back in this reply; any other
        stop is processed in the background."""
        change = functools.partial(self._state_change, E.STOP_CONTAINER, pod, container)
        if self.settle is None or not pod.uid or pod.uid not in self.core.bound_pods():
            await self._later("_state_change", change)
            return self.pending_updates.take(self.store, skip=container.id)
        await self.drain()
        if pod.uid not in self.core.bound_pods() or not frees_bound_cpus(self.store, pod.id, container.id):
            await self._later("_state_change", change)
            return self.pending_updates.take(self.store, skip=container.id)
        await change()
        await self.pools.settled(exclude=container.id)
        return self.pending_updates.take(self.store, skip=container.id)

    @_refusals_as_rpc_errors
    async def state_change(self, event: int, pod: nri_pb2.PodSandbox, container: nri_pb2.Container | None) -> None:
        await self._later("_state_change", functools.partial(self._state_change, event, pod, container))

    async def _state_change(self, event: int, pod: nri_pb2.PodSandbox, container: nri_pb2.Container | None) -> None:
        await self._state_change_now(event, pod, container)
        await self.pools.notify()

    async def _state_change_now(
        self, event: int, pod: nri_pb2.PodSandbox, container: nri_pb2.Container | None
    ) -> None:
        """One event whose reply carries nothing, as the lifecycle table says
        (``runtime_proxy.engine.walk.after_event``)."""
        name = E.Name(event) if event in E.values() else ""
        container_f = container_facts(container) if container is not None else None
        await after_event(self.core, name, pod_facts(pod), container_f)


def _not_carried(plan: Plan) -> list[str]:
    """The plan's resources an NRI ``ContainerUpdate`` cannot carry."""
    return linux_resources(plan.resources)[1]


def _not_adjusted(plan: Plan) -> list[str]:
    """The plan's fields an NRI ``ContainerAdjustment`` cannot carry."""
    return adjustment(plan)[1]


def wanted_events(pipeline: Pipeline) -> tuple[int, ...]:
    """The events to subscribe to for ``pipeline`` (see the module docstring)."""
    wanted = set(ALWAYS)
    for event, stages in WHEN_STAGES:
        if any(pipeline.has_work(stage) for stage in stages):
            wanted.add(event)
    if pipeline.has_work(DEFERRED_STAGE) and not wanted & {E.START_CONTAINER, E.POST_START_CONTAINER}:
        wanted.add(E.START_CONTAINER)
    return tuple(sorted(wanted))
