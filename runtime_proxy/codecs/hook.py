"""The hook protocol's codec (Koordinator's ``RuntimeHookService``, ``runtime.v1alpha1``): facts
to hook requests and back, plans to hook responses and responses to plans. Pure; called by the
hook server (``runtime_proxy.hookserver.door``) and the hook-server client
(``runtime_proxy.hookclient``). Container resources are read and written by
``runtime_proxy.codecs.cri``'s functions, which serve the CRI's message and this protocol's alike."""

from __future__ import annotations

from collections.abc import Mapping

import structlog

from cri_protos import hookserver_pb2
from hooks.facts import ContainerFacts, PodFacts, Resources, frozen_map
from hooks.plan import Plan, ResourceChanges
from runtime_proxy.codecs.cri import fill_resources_pb, resources_from_pb

log = structlog.get_logger(__name__)

__all__ = [
    "POD_HOOKS",
    "container_facts_from_request",
    "container_plan_from_response",
    "container_request",
    "container_response",
    "merge_resources",
    "pod_facts_from_request",
    "pod_plan_from_response",
    "pod_request",
    "pod_response",
]



POD_HOOKS = frozenset({"PreRunPodSandbox", "PostStopPodSandbox"})


def _pod_meta(pod: PodFacts) -> hookserver_pb2.PodSandboxMetadata:
    return hookserver_pb2.PodSandboxMetadata(name=pod.name, uid=pod.uid, namespace=pod.namespace, attempt=pod.attempt)


def pod_request(pod: PodFacts) -> hookserver_pb2.PodSandboxHookRequest:
    """A ``PodSandboxHookRequest`` as Koordinator's containerd mode fills it (no resources)."""
    return hookserver_pb2.PodSandboxHookRequest(
        pod_meta=_pod_meta(pod),
        runtime_handler=pod.runtime_handler,
        labels=dict(pod.labels),
        annotations=dict(pod.annotations),
        cgroup_parent=pod.cgroup_parent,
    )


def container_request(pod: PodFacts, container: ContainerFacts) -> hookserver_pb2.ContainerResourceHookRequest:
    """A ``ContainerResourceHookRequest`` (pod resources are unknown in CRI mode: left empty)."""
    req = hookserver_pb2.ContainerResourceHookRequest(
        pod_meta=_pod_meta(pod),
        container_meta=hookserver_pb2.ContainerMetadata(
            name=container.name, attempt=container.attempt, id=container.id
        ),
        container_annotations=dict(container.annotations),
        pod_annotations=dict(pod.annotations),
        pod_labels=dict(pod.labels),
        pod_cgroup_parent=pod.cgroup_parent,
        container_envs=dict(container.envs),
    )
    fill_resources_pb(req.container_resources, container.resources)
    return req


def pod_facts_from_request(
    req: hookserver_pb2.PodSandboxHookRequest | hookserver_pb2.ContainerResourceHookRequest,
) -> PodFacts:
    """``PodFacts`` from a ``PodSandboxHookRequest`` or a ``ContainerResourceHookRequest``
    (the sandbox id is not part of the protocol and stays empty)."""
    md = req.pod_meta
    if isinstance(req, hookserver_pb2.PodSandboxHookRequest):
        labels, annotations, cgroup_parent = req.labels, req.annotations, req.cgroup_parent
        handler = req.runtime_handler
    else:
        labels, annotations, cgroup_parent = req.pod_labels, req.pod_annotations, req.pod_cgroup_parent
        handler = ""
    return PodFacts(
        name=md.name,
        namespace=md.namespace,
        uid=md.uid,
        attempt=md.attempt,
        labels=frozen_map(dict(labels)),
        annotations=frozen_map(dict(annotations)),
        cgroup_parent=cgroup_parent,
        runtime_handler=handler,
    )


def container_facts_from_request(req: hookserver_pb2.ContainerResourceHookRequest) -> ContainerFacts:
    md = req.container_meta
    return ContainerFacts(
        name=md.name,
        id=md.id,
        attempt=md.attempt,
        annotations=frozen_map(dict(req.container_annotations)),
        resources=resources_from_pb(req.container_resources),
        envs=frozen_map(dict(req.container_envs)),
    )


def pod_response(pod: PodFacts, plan: Plan) -> hookserver_pb2.PodSandboxHookResponse:
    """The server's answer for a pod hook: the full (changed) labels and annotations, and the
    cgroup parent when the plan changes it."""
    return hookserver_pb2.PodSandboxHookResponse(
        labels=dict(pod.labels),
        annotations=dict(pod.annotations),
        cgroup_parent=plan.cgroup_parent or "",
    )


def container_response(
    pod: PodFacts, container: ContainerFacts, plan: Plan
) -> hookserver_pb2.ContainerResourceHookResponse:
    """The server's answer for a container hook. Echoes the full resources (Koordinator copies
    the cpuset even when empty, so a partial answer would clear it) and annotations; envs only
    when the plan sets some (a non-empty map replaces the environment)."""
    resp = hookserver_pb2.ContainerResourceHookResponse(
        container_annotations=dict(container.annotations),
        pod_cgroup_parent=plan.cgroup_parent or "",
    )
    fill_resources_pb(resp.container_resources, container.resources)
    if plan.envs:
        resp.container_envs.update(dict(container.envs))
    return resp


def _overlay(seen: Mapping[str, str], answer: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in answer.items() if seen.get(k) != v}


def merge_resources(seen: Resources, answer: hookserver_pb2.LinuxContainerResources) -> ResourceChanges:
    """Koordinator's ``updateResource`` as a set of changes: the fields of ``seen`` that the
    answer (a ``runtime.v1alpha1.LinuxContainerResources``) changes, with their new values."""
    new: dict[str, int | str | Mapping[str, str]] = {}
    for name in ("cpu_period", "cpu_shares", "memory_limit_in_bytes", "memory_swap_limit_in_bytes"):
        value = getattr(answer, name)
        if value > 0:
            new[name] = value
    if answer.cpu_quota != 0:
        new["cpu_quota"] = answer.cpu_quota
    if -1000 <= answer.oom_score_adj <= 1000:
        new["oom_score_adj"] = answer.oom_score_adj
    new["cpuset_cpus"] = answer.cpuset_cpus
    new["cpuset_mems"] = answer.cpuset_mems
    changes = {k: v for k, v in new.items() if getattr(seen, k) != v}
    if answer.unified:
        unified = {**seen.unified, **dict(answer.unified)}
        if unified != dict(seen.unified):
            changes["unified"] = unified
    return ResourceChanges.parse(changes)


def pod_plan_from_response(pod: PodFacts, resp: hookserver_pb2.PodSandboxHookResponse) -> Plan:
    """What a ``PodSandboxHookResponse`` changes relative to the pod the server saw."""
    plan = Plan()
    plan.labels.update(_overlay(pod.labels, resp.labels))
    plan.annotations.update(_overlay(pod.annotations, resp.annotations))
    if resp.cgroup_parent and resp.cgroup_parent != pod.cgroup_parent:
        plan.set_cgroup_parent(resp.cgroup_parent)
    return plan


def container_plan_from_response(
    stage: str,
    pod: PodFacts,
    container: ContainerFacts,
    resp: hookserver_pb2.ContainerResourceHookResponse,
    *,
    server: str = "",
) -> Plan:
    """What a ``ContainerResourceHookResponse`` changes relative to the request the server saw.
    ``PreUpdateContainerResources`` takes resources only; ``PreCreateContainer`` everything."""
    plan = Plan()
    if resp.HasField("container_resources"):
        plan.resources = merge_resources(container.resources, resp.container_resources)
    if stage != "PreCreateContainer":
        return plan
    plan.annotations.update(_overlay(container.annotations, resp.container_annotations))
    if resp.pod_cgroup_parent and resp.pod_cgroup_parent != pod.cgroup_parent:
        plan.set_cgroup_parent(resp.pod_cgroup_parent)
    if resp.container_envs:
        plan.envs.update(_overlay(container.envs, resp.container_envs))
        dropped = sorted(set(container.envs) - set(resp.container_envs))
        if dropped:
            log.info("hook server left env keys out of its answer; they are kept", server=server, keys=dropped)
    return plan
