"""The node agent's lifecycle as data: each event, its stages, its store change and when its
plan's files are applied, with its names at the three doors. The doors look their events up
here and ``finish`` carries out the part after the runtime's answer, in the table's order.

One row per lifecycle event (CRI's name). For each:

- ``pre``: the ``Pre*`` stage, run before the runtime acts (its plan may change the request).
- ``store``: the store's change once the runtime acted (``StoreChange``).
- ``files``: when the ``Pre*`` plan's file part is applied (``Files``): after the runtime
  answered OK (so a refused call writes nothing), or, for CreateContainer at a door that sees
  it before the container's cgroup exists (NRI, the hook server), when the container starts
  (``runtime_proxy.engine.pending``).
- ``post``: the ``Post*`` stage, run after the store change and the files (its failures are
  logged, never fail the call).
- ``nri_pre`` / ``nri_post``: the NRI events that run the ``pre`` / ``post`` stage (None: NRI
  does not tell it; RunPodSandbox's one event runs both). NRI tells events once they happened
  (except CreateContainer and UpdateContainer, whose replies carry the plan), so the store
  changes at the event that runs ``nri_post`` (``nri_store``, or the ``nri_pre`` event for the
  two whose replies carry the plan).
- ``hook_pre`` / ``hook_post``: Koordinator's ``RuntimeHookService`` methods of the stages
  (the hook server keeps no store).

The order of the part after the runtime answered is the same at every door: store change, then
the ``Pre*`` plan's files, then the ``Post*`` stage (``finish``).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from hooks.facts import ContainerFacts, PodFacts
from runtime_proxy.engine.lifecycle import Lifecycle
from runtime_proxy.engine.pending import complete
from runtime_proxy.engine.pipeline import StageResult
from runtime_proxy.state.store import Store

__all__ = [
    "BY_CRI",
    "BY_HOOK",
    "BY_NRI",
    "BY_STAGE",
    "EVENTS",
    "FORGETS_HELD",
    "RELEASES_HELD",
    "Event",
    "Files",
    "StoreChange",
    "change_store",
    "finish",
]


class StoreChange(Enum):
    """What the store records once the runtime acted."""

    NONE = "nothing"
    PUT_POD = "the pod is recorded"
    STOP_POD = "the pod's sandbox stopped: it releases its bound CPUs for good"
    DROP_POD = "the pod and its containers are forgotten"
    ADD_CONTAINER = "the created container is recorded; its pod holds its CPUs again"
    PUT_CONTAINER = "the container's new resources (and the plan's annotations) are recorded"
    STOP_CONTAINER = "the container stopped; its pod releases its CPUs when none runs"
    DROP_CONTAINER = "the container is forgotten"


class Files(Enum):
    """When the ``Pre*`` plan's file part is applied."""

    AFTER_CALL = "after the runtime answered OK"
    AT_START = "when the container starts (where the door sees the call before its cgroup exists)"


@dataclass(frozen=True)
class Event:
    """One row of the lifecycle table (see the module docstring)."""

    name: str
    pre: str | None
    store: StoreChange
    files: Files
    post: str | None
    nri_pre: str | None
    nri_post: str | None
    hook_pre: str | None
    hook_post: str | None

    @property
    def container(self) -> bool:
        """Whether the event is about a container (else about a pod)."""
        return self.name.endswith(("Container", "ContainerResources"))

    @property
    def nri_store(self) -> str | None:
        """The NRI event at which the store changes: the one whose reply carries the plan
        (CreateContainer, UpdateContainer), else the one that tells the event happened."""
        if self.name in ("CreateContainer", "UpdateContainerResources"):
            return self.nri_pre
        return self.nri_post


EVENTS: tuple[Event, ...] = (
    Event("RunPodSandbox", "PreRunPodSandbox", StoreChange.PUT_POD, Files.AFTER_CALL, "PostRunPodSandbox",
          "RUN_POD_SANDBOX", "RUN_POD_SANDBOX", "PreRunPodSandboxHook", None),
    Event("StopPodSandbox", "PreStopPodSandbox", StoreChange.STOP_POD, Files.AFTER_CALL, "PostStopPodSandbox",
          None, "STOP_POD_SANDBOX", None, "PostStopPodSandboxHook"),
    Event("RemovePodSandbox", "PreRemovePodSandbox", StoreChange.DROP_POD, Files.AFTER_CALL,
          "PostRemovePodSandbox", None, "REMOVE_POD_SANDBOX", None, None),
    Event("CreateContainer", "PreCreateContainer", StoreChange.ADD_CONTAINER, Files.AT_START, "PostCreateContainer",
          "CREATE_CONTAINER", "POST_CREATE_CONTAINER", "PreCreateContainerHook", None),
    Event("StartContainer", "PreStartContainer", StoreChange.NONE, Files.AFTER_CALL, "PostStartContainer",
          "START_CONTAINER", "POST_START_CONTAINER", "PreStartContainerHook", "PostStartContainerHook"),
    Event("UpdateContainerResources", "PreUpdateContainerResources", StoreChange.PUT_CONTAINER, Files.AFTER_CALL,
          "PostUpdateContainerResources", "UPDATE_CONTAINER", "POST_UPDATE_CONTAINER",
          "PreUpdateContainerResourcesHook", None),
    Event("StopContainer", "PreStopContainer", StoreChange.STOP_CONTAINER, Files.AFTER_CALL, "PostStopContainer",
          None, "STOP_CONTAINER", None, "PostStopContainerHook"),
    Event("RemoveContainer", "PreRemoveContainer", StoreChange.DROP_CONTAINER, Files.AFTER_CALL,
          "PostRemoveContainer", None, "REMOVE_CONTAINER", None, None),
)

# The held file part of a CreateContainer (``Files.AT_START``) is applied at this event and
# forgotten at that one.
RELEASES_HELD = "StartContainer"
FORGETS_HELD = "RemoveContainer"

BY_CRI: dict[str, Event] = {e.name: e for e in EVENTS}
# NRI event name -> the row and the stages that event runs, in order.
BY_NRI: dict[str, tuple[Event, tuple[str, ...]]] = {}
# Stage -> its row.
BY_STAGE: dict[str, Event] = {stage: e for e in EVENTS for stage in (e.pre, e.post) if stage is not None}
# Hook-server method -> the row and the stage it runs.
BY_HOOK: dict[str, tuple[Event, str]] = {}
for _e in EVENTS:
    for _nri, _stage in ((_e.nri_pre, _e.pre), (_e.nri_post, _e.post)):
        if _nri is not None and _stage is not None:
            _row, _stages = BY_NRI.get(_nri, (_e, ()))
            BY_NRI[_nri] = (_row, (*_stages, _stage))
    for _hook, _stage in ((_e.hook_pre, _e.pre), (_e.hook_post, _e.post)):
        if _hook is not None and _stage is not None:
            BY_HOOK[_hook] = (_e, _stage)
del _e, _nri, _stage, _hook, _row, _stages


def change_store(store: Store, change: StoreChange, sandbox_id: str, container_id: str = "",
                 pod: PodFacts | None = None, container: ContainerFacts | None = None) -> None:
    """Carry out ``change`` on ``store`` (``pod``/``container``: the facts a put records; a put
    without them changes nothing)."""
    if change is StoreChange.PUT_POD:
        if pod is not None:
            store.put_pod(pod)
    elif change is StoreChange.STOP_POD:
        store.stop_pod(sandbox_id)
    elif change is StoreChange.DROP_POD:
        store.drop_pod(sandbox_id)
    elif change is StoreChange.ADD_CONTAINER:
        if container is not None:
            store.add_container(sandbox_id, container)
    elif change is StoreChange.PUT_CONTAINER:
        if container is not None:
            store.put_container(sandbox_id, container)
    elif change is StoreChange.STOP_CONTAINER:
        store.stop_container(container_id)
    elif change is StoreChange.DROP_CONTAINER:
        store.drop_container(container_id)


async def finish(core: Lifecycle, event: Event, result: StageResult | None, *, sandbox_id: str,
                 container_id: str = "", pod: PodFacts | None = None,
                 container: ContainerFacts | None = None) -> None:
    """The part of ``event`` after the runtime answered OK, at a door that keeps the store and
    sees the runtime's answer (the CRI door): the store change, the ``Pre*`` plan's files (a
    created container's writes completed with its id), then the ``Post*`` stage about the pod
    and container as the store holds them after the change (as it held them before, for an
    event that forgets them)."""
    store = core.store
    forgets = event.store in (StoreChange.DROP_POD, StoreChange.DROP_CONTAINER)
    before = _stored(store, event, sandbox_id, container_id) if forgets else None
    change_store(store, event.store, sandbox_id, container_id, pod, container)
    if result is not None and event.pre is not None:
        plan = complete(result.plan, container_id, event.pre) if event.files is Files.AT_START else result.plan
        await core.apply(plan, event.pre)
    if event.post is None:
        return
    after = before if forgets else _stored(store, event, sandbox_id, container_id)
    if after is None:
        return
    if event.container and after[1] is None:
        return
    await core.stage_and_apply(event.post, after[0], after[1])


def _stored(store: Store, event: Event, sandbox_id: str,
            container_id: str) -> tuple[PodFacts | None, ContainerFacts | None] | None:
    """The pod and container of the event as ``store`` holds them (None: the container is
    unknown)."""
    if not event.container:
        return store.pod(sandbox_id), None
    if event.store is StoreChange.ADD_CONTAINER:
        return store.pod(sandbox_id), (store.container(container_id) or (None, None))[1]
    found = store.container(container_id)
    return None if found is None else found
