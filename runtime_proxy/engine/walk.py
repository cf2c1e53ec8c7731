"""Each door's walk of the lifecycle table (``runtime_proxy.engine.table``): the store change,
the ``Pre*`` plan's files (now, or held for the container's start) and the ``Post*`` stage, in
the table's order, for the facts the door decoded. A door decodes its message into facts, calls
one of these, and encodes what it gets back; it keeps no lifecycle rule of its own.

- ``finish`` (the CRI door, after the runtime answered OK): store change, files, ``Post*``.
- ``before_reply`` (the NRI door's CreateContainer and UpdateContainer, whose replies carry the
  plan): the ``Pre*`` stage, the store's record of the container as the reply gives it to the
  runtime, then the files (applied, or held until the container starts).
- ``after_event`` (the NRI door's other events, told once they happened): the store change at
  the event that tells it, the held files at the container's start (forgotten at its removal),
  then the stages the event runs. Only the creating events add a pod to the store: any other
  NRI event about a pod the store does not hold is ignored.
- ``synchronize`` (the NRI door's Synchronize): the store rebuilt from the runtime, then every
  pod and running container reconciled, the containers' changes sent and recorded as sent.
- ``before_answer`` (the hook server, which keeps no store): the stage, then its files before
  answering, the container-level writes that lack the container's id held until its start.

The held files are the lifecycle core's ``Lifecycle.held`` (``runtime_proxy.engine.pending``'s
one rule): the NRI door holds the whole file part by container id (the container's cgroup does
not exist yet); the hook server holds only the writes that lack the id, by pod uid, container
name and attempt (its PreCreateContainer request carries no id), and applies the rest at once,
since its caller may not send it a StartContainer hook.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import TypeVar

import structlog

from hooks.facts import ContainerFacts, PodFacts, Resources
from hooks.plan import Plan, ResourceChanges
from runtime_proxy import metrics
from runtime_proxy.engine.lifecycle import Lifecycle
from runtime_proxy.engine.pending import complete, lacks_id
from runtime_proxy.engine.pipeline import StageResult
from runtime_proxy.engine.table import (
    BY_NRI,
    BY_STAGE,
    FORGETS_HELD,
    HELD_STAGE,
    NRI_REPLIED,
    RELEASES_HELD,
    REPLIED_AT_NRI,
    UPDATES,
    At,
    Door,
    Event,
    Files,
    StoreChange,
    change_store,
    record_sent,
    stored,
    update_facts,
    updated,
)
from runtime_proxy.state.store import Store

log = structlog.get_logger(__name__)

__all__ = ["after_event", "before_answer", "before_reply", "finish", "reply_lost", "synchronize"]

_T = TypeVar("_T")

async def finish(core: Lifecycle, event: Event, result: StageResult | None, *, sandbox_id: str = "",
                 container_id: str = "", pod: PodFacts | None = None,
                 container: ContainerFacts | None = None, sent: Resources | None = None) -> None:
    """The part of ``event`` after the runtime answered OK, at a door that keeps the store and
    sees the runtime's answer (the CRI door): the store change, the ``Pre*`` plan's files (a
    created container's writes completed with its id), then the ``Post*`` stage about the pod
    and container as the store holds them after the change (as it held them before, for an
    event that forgets them). A container event without ``sandbox_id`` is about the stored
    container's pod; an UpdateContainerResources records ``updated`` of the stored container
    under ``sent`` (the resources the runtime was sent, ``UPDATES[Door.CRI]``)."""
    store = core.store
    if event.container and not sandbox_id:
        sandbox_id = store.sandbox_of(container_id) or ""
    if event.store is StoreChange.PUT_CONTAINER and container is None:
        found = store.container(container_id)
        if found is not None and sandbox_id:
            container = updated(UPDATES[Door.CRI], found[1], result, sent=sent)
    forgets = event.store in (StoreChange.DROP_POD, StoreChange.DROP_CONTAINER)
    before = stored(store, event, sandbox_id, container_id) if forgets else None
    change_store(store, event.store, sandbox_id, container_id, pod, container)
    if result is not None and event.pre is not None:
        plan = complete(result.plan, container_id, event.pre) if event.files is Files.AT_START else result.plan
        await core.apply(plan, event.pre)
    if event.post is None:
        return
    after = before if forgets else stored(store, event, sandbox_id, container_id)
    if after is None:
        return
    if event.container and after[1] is None:
        return
    await core.stage_and_apply(event.post, after[0], after[1])


async def before_reply(
    core: Lifecycle, event: Event, pod: PodFacts, container: ContainerFacts,
    not_carried: Callable[[Plan], Collection[str]], incoming: Resources | None = None,
) -> StageResult | None:
    """``event`` (one of ``REPLIED_AT_NRI``) at a door whose reply carries the plan (the NRI
    door): an update of a pod the store does not hold is ignored (``_ignored``); a created
    container brings its pod into the store when the store lacks it; the
    ``Pre*`` stage runs on the container (an update's ``update_facts`` of ``incoming``, the
    request's resources); the store records it as the reply gives it to the runtime
    (``updated`` under ``UPDATES[Door.NRI]``: ``not_carried(plan)`` names what the reply cannot
    carry); then the plan's files are applied, or held until the container starts
    (``Files.AT_START``). Returns the carried result (None: no plan goes ahead) to encode."""
    assert event.name in REPLIED_AT_NRI and event.pre is not None
    rule = UPDATES[Door.NRI]
    if event.store is StoreChange.PUT_CONTAINER and _ignored(core, event.nri_pre or "", pod, container):
        return None
    if event.store is StoreChange.ADD_CONTAINER and core.store.pod(pod.sandbox_id) is None:
        core.store.put_pod(pod)
    if event.store is StoreChange.PUT_CONTAINER:
        container = update_facts(rule, container, incoming)
    ran = await core.run(event.pre, pod, container)
    result = core.carries(ran, event.pre)
    base = (ran.container if ran is not None else None) or container
    record = updated(rule, base, result, not_carried=not_carried(result.plan) if result is not None else ())
    change_store(core.store, event.store, pod.sandbox_id, container.id, container=record)
    if result is None:
        return None
    if event.files is Files.AT_START:
        core.held.hold(container.id, result.plan.files())
    elif rule.files_at is At.BEFORE_REPLY:
        await core.apply(result.plan, event.pre)
    return result


def reply_lost(core: Lifecycle, event: Event, pod: PodFacts, container: ContainerFacts) -> None:
    """A created container whose reply (``before_reply``) never reached the runtime (the NRI
    handler ran out of the runtime's time): the runtime created it as the request gave it, so
    the store holds it so (its pod too, when the store lacks it). The reconciler then finds the
    plan's values missing and sends them as an update; the plan's held files still wait for the
    container's start."""
    assert event.name in REPLIED_AT_NRI
    if event.store is not StoreChange.ADD_CONTAINER:
        return
    if core.store.pod(pod.sandbox_id) is None:
        core.store.put_pod(pod)
    change = StoreChange.ADD_CONTAINER if core.store.container(container.id) is None else StoreChange.PUT_CONTAINER
    change_store(core.store, change, pod.sandbox_id, container.id, container=container)


async def after_event(core: Lifecycle, name: str, pod: PodFacts, container: ContainerFacts | None) -> None:
    """The NRI event ``name`` whose reply carries nothing (``BY_NRI``; the two whose replies
    carry the plan go through ``before_reply``): ignored for a pod the store does not hold
    (``_ignored``) unless it is the event that records the pod (RunPodSandbox); else the store
    change (at the event that tells it), the held file part of the container's CreateContainer
    (applied at its start, forgotten at its removal), then the stages the event runs."""
    found = BY_NRI.get(name)
    puts_pod = found is not None and found[0].store is StoreChange.PUT_POD and name == found[0].nri_store
    if not puts_pod and _ignored(core, name, pod, container):
        return
    if found is None or name in NRI_REPLIED:
        return
    row, stages = found
    if row.container and container is None:
        return
    container_id = container.id if container is not None else ""
    if name == row.nri_store:
        change_store(core.store, row.store, pod.sandbox_id, container_id, pod, container)
    if row.name == RELEASES_HELD:
        held = core.held.take(container_id, container_id)
        if held is not None:
            await core.apply(held, HELD_STAGE)
    elif row.name == FORGETS_HELD:
        core.held.drop(container_id)
    for stage in stages:
        if stage == row.pre and not row.container:
            await _pod_pre(core, stage, pod)
        else:
            await core.stage_and_apply(stage, pod, container)


def _ignored(core: Lifecycle, name: str, pod: PodFacts, container: ContainerFacts | None) -> bool:
    """Whether the NRI event ``name`` is ignored because the store does not hold ``pod`` (logged
    and counted). Only the creating events (RunPodSandbox, CreateContainer, Synchronize) add a
    pod, so a Stop or Remove that arrives after RemovePodSandbox cannot put the pod back, where
    it would hold its bound CPUs until the next Synchronize."""
    if core.store.pod(pod.sandbox_id) is not None:
        return False
    label = name.lower() or "other"
    metrics.NRI_EVENTS_IGNORED.labels(label).inc()
    log.debug("NRI event for a pod not in the store ignored", nri_event=label, pod=f"{pod.namespace}/{pod.name}",
              uid=pod.uid, sandbox=pod.sandbox_id, container=container.id if container is not None else None)
    return True


async def synchronize(
    core: Lifecycle, pods: list[PodFacts], containers: list[tuple[str, ContainerFacts, bool, bool]],
    stopped_pods: Collection[str], send: Callable[[str, ResourceChanges], tuple[_T | None, Mapping[str, object]]],
) -> list[_T]:
    """NRI's Synchronize: the store rebuilt from the runtime's ``pods`` and ``containers``
    (``(sandbox id, facts, running, stopped)``; ``stopped_pods`` the sandboxes it reports
    stopped), then reconciled: every pod through ``ReconcilePod`` (its writes applied) and every
    running container through ``ReconcileContainer``, whose resource changes ``send`` makes into
    the reply's updates (None: it carries none of them), recorded as sent (``record_sent``).
    Values changed by hand in the cgroup files are repaired this way, because every planned
    resource is sent, not only those that differ from the runtime's record."""
    store = Store()
    for pod in pods:
        store.put_pod(pod)
    running: list[tuple[str, ContainerFacts]] = []
    for sandbox_id, facts, is_running, is_stopped in containers:
        store.put_container(sandbox_id, facts)
        if is_running:
            running.append((sandbox_id, facts))
        elif is_stopped:
            store.stop_container(facts.id)
    for sandbox_id in stopped_pods:
        store.stop_pod(sandbox_id)
    core.replace_store(store)
    for each_pod in store.live_pods():
        await core.stage_and_apply("ReconcilePod", each_pod, None)
    updates: list[_T] = []
    for sandbox_id, container in running:
        owner = store.pod(sandbox_id)
        if owner is None:
            continue
        result = core.carries(await core.run("ReconcileContainer", owner, container), "ReconcileContainer")
        if result is None:
            continue
        await core.apply(result.plan, "ReconcileContainer")
        update, sent = send(container.id, result.plan.resources)
        if update is not None:
            updates.append(update)
            record_sent(store, container.id, sent)
    return updates


async def _pod_pre(core: Lifecycle, stage: str, pod: PodFacts) -> None:
    """A pod's ``Pre*`` stage at an event whose reply cannot change the pod: its files are
    applied, its CRI changes logged as not carried."""
    result = core.carries(await core.run(stage, pod, None), stage)
    if result is None:
        return
    plan = result.plan
    not_carried = [name for name, present in (
        ("labels", bool(plan.labels)), ("annotations", bool(plan.annotations)),
        ("cgroup_parent", plan.cgroup_parent is not None)) if present]
    if not_carried:
        log.info("pod plan fields NRI cannot carry; dropped", fields=not_carried, pod=pod.sandbox_id)
    await core.apply(plan, stage)


async def before_answer(core: Lifecycle, stage: str, pod: PodFacts,
                        container: ContainerFacts | None) -> StageResult | None:
    """A hook server's call (a door that keeps no store and answers before the runtime acts):
    runs ``stage`` (``StageRejected`` on a ``Fail``-policy refusal), then applies the plan's
    files, those held for this container included, before the answer; the carried result
    (None: the answer carries no change)."""
    ran = await core.run(stage, pod, container)
    result = core.carries(ran, stage)
    if result is None:
        if ran is None:  # no hook ran (none has work): writes held for this container still go
            await _answer_files(core, stage, pod, container, Plan())
        return None
    await _answer_files(core, stage, pod, container, result.plan)
    return result


async def _answer_files(core: Lifecycle, stage: str, pod: PodFacts, container: ContainerFacts | None,
                        plan: Plan) -> None:
    writes = list(plan.writes)
    container_id = ""
    if container is not None:
        key, container_id = (pod.uid, container.name, container.attempt), container.id
        row = BY_STAGE.get(stage)
        if row is not None and stage == row.pre and row.files is Files.AT_START:
            core.held.hold(key, Plan(writes=[w for w in writes if w.level == "container" and lacks_id(w)]))
            writes = [w for w in writes if not (w.level == "container" and lacks_id(w))]
        elif container.id and row is not None and row.name == RELEASES_HELD:
            held = core.held.take(key, container.id)
            if held is not None:
                writes = held.writes + writes
    files = complete(plan.files(writes), container_id, stage)
    if files.is_empty():
        return
    if core.applier is None:
        log.info("file part of the plan left to the caller (--no-apply)", stage=stage, plan=files.to_json())
        return
    await core.apply(files, stage)

