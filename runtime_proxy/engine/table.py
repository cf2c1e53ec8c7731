"""The node agent's lifecycle as data: each event, its stages, its store change and when its
plan's files are applied, with its names at the three doors, and the rules of the facts an event
records. Pure (no I/O): each door's walk of the table is ``runtime_proxy.engine.walk``.

One row per lifecycle event (CRI's name). For each:

- ``pre``: the ``Pre*`` stage, run before the runtime acts (its plan may change the request).
- ``store``: the store's change once the runtime acted (``StoreChange``).
- ``files``: when the ``Pre*`` plan's file part is applied (``Files``): after the runtime
  answered OK (so a refused call writes nothing), or, for CreateContainer at a door that sees
  it before the container's cgroup exists (NRI, the hook server), when the container starts
  (``runtime_proxy.engine.pending``; held at ``RELEASES_HELD``'s event, forgotten at
  ``FORGETS_HELD``'s).
- ``post``: the ``Post*`` stage, run after the store change and the files (its failures are
  logged, never fail the call).
- ``nri_pre`` / ``nri_post``: the NRI events that run the ``pre`` / ``post`` stage (None: NRI
  does not tell it; RunPodSandbox's one event runs both). NRI tells events once they happened
  (except CreateContainer and UpdateContainer, ``REPLIED_AT_NRI``, whose replies carry the
  plan), so the store changes at the event that runs ``nri_post`` (``nri_store``, or the
  ``nri_pre`` event for the two whose replies carry the plan).
- ``hook_pre`` / ``hook_post``: Koordinator's ``RuntimeHookService`` methods of the stages
  (the hook server keeps no store).

The order of the part after the runtime answered is the same at every door: store change, then
the ``Pre*`` plan's files, then the ``Post*`` stage.

UpdateContainerResources changes a container the store already holds, and each door knows a
different part of it, so its row has one more table, ``UPDATES``, one ``Update`` per door (named
by the door's event names): which container the ``Pre*`` stage sees (``update_facts``: the stored
one under the request's fields at the CRI door, the one the message carries at the NRI door and
the hook server), what the store records of it and when (``updated``: at the CRI door, after the
runtime answered OK, the stored container under what the runtime was sent plus the carried
plan's annotations; at the NRI door, before the reply, the ``Pre*`` stage's container with the
plan's part the reply carries plus its annotations, as it records a created container too; the
hook server keeps no store), when the plan's files are applied, and which container the
``Post*`` stage sees.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from enum import Enum

from hooks.facts import ContainerFacts, PodFacts, Resources, frozen_map
from hooks.plan import Plan
from runtime_proxy.engine.pipeline import StageResult
from runtime_proxy.state.store import Store

__all__ = [
    "BY_CRI",
    "BY_HOOK",
    "BY_NRI",
    "BY_STAGE",
    "EVENTS",
    "FORGETS_HELD",
    "HELD_STAGE",
    "NRI_REPLIED",
    "RELEASES_HELD",
    "REPLIED_AT_NRI",
    "UPDATES",
    "At",
    "Door",
    "Event",
    "Files",
    "Records",
    "Sees",
    "StoreChange",
    "Update",
    "carried",
    "change_store",
    "record_sent",
    "stored",
    "update_facts",
    "updated",
]


# The events whose NRI reply carries the ``Pre*`` stage's plan (CRI names).
REPLIED_AT_NRI = ("CreateContainer", "UpdateContainerResources")


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
        if self.name in REPLIED_AT_NRI:
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
# The stage whose plan's files are held (CreateContainer's, the one row with ``Files.AT_START``).
HELD_STAGE = "PreCreateContainer"

BY_CRI: dict[str, Event] = {e.name: e for e in EVENTS}
# The NRI events whose reply carries the plan.
NRI_REPLIED = frozenset(BY_CRI[name].nri_pre for name in REPLIED_AT_NRI)
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


# -- UpdateContainerResources at each door ---------------------------------------------------------


class Door(Enum):
    """The three doors of the node agent."""

    CRI = "the CRI proxy (runtime_proxy.cri)"
    NRI = "the NRI plugin (runtime_proxy.nri)"
    HOOK = "the hook server (runtime_proxy.hookserver)"


class Sees(Enum):
    """Which container a stage sees."""

    STORED = "the container as the store holds it"
    MESSAGE = "the container the door's message carries"
    NOTHING = "no stage runs"


class Records(Enum):
    """What the store records of the container an update changed (``updated``)."""

    SENT = ("the stored container under the resources the runtime was sent (their non-zero fields) "
            "and the carried plan's annotations; no change when there are neither")
    CARRIED = ("the Pre stage's container (as its plan left it) with the plan's resources the reply "
               "carries and its annotations; as the Pre stage left it when the plan is not carried")
    NOTHING = "nothing: the door keeps no store"


class At(Enum):
    """When a door does a part of an event."""

    AFTER_CALL = "after the runtime answered OK"
    BEFORE_REPLY = "before the door replies (the reply carries the plan; the container exists)"
    NEVER = "never"


# The request's resource fields an update lays over a container: a number or cpuset only when
# non-zero (oom_score_adj cannot be updated); ``unified`` keys over the container's, hugepage
# limits instead of its own, each only when the request has some.
SCALAR_UPDATES = ("cpu_period", "cpu_quota", "cpu_shares", "memory_limit_in_bytes", "memory_swap_limit_in_bytes",
                  "cpuset_cpus", "cpuset_mems")
ALL_UPDATES = (*SCALAR_UPDATES, "unified", "hugepage_limits")


@dataclass(frozen=True)
class Update:
    """What one door's UpdateContainerResources does with the container's facts."""

    door: Door
    pre_event: str  # the door's name of the call that runs the ``Pre*`` stage
    post_event: str | None  # the door's name of the event that runs the ``Post*`` stage
    pre_sees: Sees  # the container the ``Pre*`` stage starts from
    lays_over: tuple[str, ...]  # the request's fields laid over it (``update_facts``)
    records: Records  # what the store records (``updated``)
    store_at: At  # when
    files_at: At  # when the ``Pre*`` plan's files are applied
    post_sees: Sees  # the container the ``Post*`` stage sees


UPDATES: dict[Door, Update] = {
    Door.CRI: Update(Door.CRI, "UpdateContainerResources", "UpdateContainerResources", Sees.STORED, ALL_UPDATES,
                     Records.SENT, At.AFTER_CALL, At.AFTER_CALL, Sees.STORED),
    Door.NRI: Update(Door.NRI, "UPDATE_CONTAINER", "POST_UPDATE_CONTAINER", Sees.MESSAGE, SCALAR_UPDATES,
                     Records.CARRIED, At.BEFORE_REPLY, At.BEFORE_REPLY, Sees.MESSAGE),
    Door.HOOK: Update(Door.HOOK, "PreUpdateContainerResourcesHook", None, Sees.MESSAGE, (),
                      Records.NOTHING, At.NEVER, At.BEFORE_REPLY, Sees.NOTHING),
}


def _laid_over(base: Resources, incoming: Resources, names: tuple[str, ...]) -> dict[str, object]:
    changes: dict[str, object] = {}
    for name in names:
        value = getattr(incoming, name)
        if not value:
            continue
        changes[name] = {**base.unified, **incoming.unified} if name == "unified" else value
    return changes


def update_facts(rule: Update, container: ContainerFacts, incoming: Resources | None) -> ContainerFacts:
    """The container ``rule``'s ``Pre*`` stage sees: ``container`` (``rule.pre_sees``) under the
    fields ``rule.lays_over`` of the request's resources ``incoming`` (None: the request has
    none)."""
    if incoming is None:
        return container
    changes = _laid_over(container.resources, incoming, rule.lays_over)
    return container.replace(resources=container.resources.with_changes(changes)) if changes else container


def carried(container: ContainerFacts, plan: Plan, not_carried: Collection[str]) -> ContainerFacts:
    """``container`` as the runtime gets it from ``plan`` through a reply: its resources but
    ``not_carried`` (what the reply cannot carry), and its annotations (which an update cannot
    carry to the runtime: the store keeps them, so cpu_normalization's quota record follows the
    container)."""
    changes = {k: v for k, v in plan.resources.items() if k not in not_carried}
    if changes:
        container = container.replace(resources=container.resources.with_changes(changes))
    if plan.annotations:
        container = container.replace(annotations=frozen_map({**container.annotations, **plan.annotations}))
    return container


def updated(rule: Update, container: ContainerFacts, result: StageResult | None, *, sent: Resources | None = None,
            not_carried: Collection[str] = ()) -> ContainerFacts | None:
    """What the store records of ``container`` (``rule.records``) after an update whose
    ``Pre*`` stage gave ``result`` (None: not carried); None for no change. ``sent``: the
    resources the runtime was sent (``Records.SENT``); ``not_carried``: the plan's resources the
    reply cannot carry (``Records.CARRIED``)."""
    if rule.records is Records.CARRIED:
        return container if result is None else carried(container, result.plan, not_carried)
    if rule.records is Records.NOTHING:
        return None
    notes = result.plan.annotations if result is not None else {}
    if sent is None and not notes:
        return None
    if notes:
        container = container.replace(annotations=frozen_map({**container.annotations, **notes}))
    return update_facts(rule, container, sent)


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


def record_sent(store: Store, container_id: str, sent: Mapping[str, object]) -> None:
    """Record in ``store`` the resources the runtime was sent for a container outside its
    lifecycle calls (the loops' updates, at either door; NRI's Synchronize reply), so the
    reconciler's next round does not send them again: the stored container with them; nothing
    for a container the store does not hold."""
    found, sandbox_id = store.container(container_id), store.sandbox_of(container_id)
    if found is not None and sandbox_id is not None:
        store.put_container(sandbox_id, found[1].replace(resources=found[1].resources.with_changes(sent)))


def stored(store: Store, event: Event, sandbox_id: str,
           container_id: str) -> tuple[PodFacts | None, ContainerFacts | None] | None:
    """The pod and container of the event as ``store`` holds them (None: the container is
    unknown)."""
    if not event.container:
        return store.pod(sandbox_id), None
    if event.store is StoreChange.ADD_CONTAINER:
        return store.pod(sandbox_id), (store.container(container_id) or (None, None))[1]
    found = store.container(container_id)
    return None if found is None else found
