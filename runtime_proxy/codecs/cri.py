"""The CRI codec (``runtime.v1``): requests and the runtime's records to facts, plans into
requests. Pure; called by the CRI door (``runtime_proxy.cri.door``), the store's rebuild
(``runtime_proxy.state.store``), the runtime client and the hook protocol's codec (the two
protocols share the container resources message)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TypeVar

import structlog
from google.protobuf import json_format
from google.protobuf.message import Message

from cri_protos import api_pb2, hookserver_pb2
from hooks.facts import SCALAR_RESOURCE_FIELDS, ContainerFacts, PodFacts, Resources, frozen_map
from hooks.plan import Plan, ResourceChanges

log = structlog.get_logger(__name__)

__all__ = [
    "LinuxResourcesMessage",
    "container_facts_from_config",
    "fill_resources_pb",
    "pod_facts_from_config",
    "resources_from_pb",
    "rewrite_create_container",
    "rewrite_run_pod_sandbox",
    "rewrite_update_container_resources",
    "set_linux_resources",
    "update_resources",
    "verbose_config",
    "verbose_sandbox_id",
]

_RESOURCE_SCALARS = SCALAR_RESOURCE_FIELDS
# Fields of LinuxContainerResources that a plan may set (the scalar ones and ``unified``).
_SCALAR_RESOURCES = frozenset(SCALAR_RESOURCE_FIELDS)


# The CRI's and the hook server protocol's container resources: the same fields, one reading.
LinuxResourcesMessage = api_pb2.LinuxContainerResources | hookserver_pb2.LinuxContainerResources


def resources_from_pb(res: LinuxResourcesMessage) -> Resources:
    """``Resources`` from a ``runtime.v1.LinuxContainerResources`` message (or the hook server
    protocol's ``runtime.v1alpha1`` one)."""
    return Resources(
        cpu_period=res.cpu_period,
        cpu_quota=res.cpu_quota,
        cpu_shares=res.cpu_shares,
        memory_limit_in_bytes=res.memory_limit_in_bytes,
        oom_score_adj=res.oom_score_adj,
        cpuset_cpus=res.cpuset_cpus,
        cpuset_mems=res.cpuset_mems,
        memory_swap_limit_in_bytes=res.memory_swap_limit_in_bytes,
        unified=frozen_map(dict(res.unified)),
        hugepage_limits=tuple((h.page_size, h.limit) for h in res.hugepage_limits),
    )


def pod_facts_from_config(
    config: api_pb2.PodSandboxConfig, runtime_handler: str = "", sandbox_id: str = ""
) -> PodFacts:
    """``PodFacts`` from a ``runtime.v1.PodSandboxConfig`` message."""
    md = config.metadata
    return PodFacts(
        name=md.name,
        namespace=md.namespace,
        uid=md.uid,
        attempt=md.attempt,
        labels=frozen_map(dict(config.labels)),
        annotations=frozen_map(dict(config.annotations)),
        cgroup_parent=config.linux.cgroup_parent,
        runtime_handler=runtime_handler,
        sandbox_id=sandbox_id,
    )


def container_facts_from_config(config: api_pb2.ContainerConfig, container_id: str = "") -> ContainerFacts:
    """``ContainerFacts`` from a ``runtime.v1.ContainerConfig`` message."""
    envs: dict[str, str] = {}
    for kv in config.envs:
        envs[kv.key] = kv.value
    return ContainerFacts(
        name=config.metadata.name,
        id=container_id,
        attempt=config.metadata.attempt,
        labels=frozen_map(dict(config.labels)),
        annotations=frozen_map(dict(config.annotations)),
        resources=resources_from_pb(config.linux.resources),
        envs=frozen_map(envs),
    )


def fill_resources_pb(msg: LinuxResourcesMessage, res: Resources) -> None:
    """Set every field of ``msg`` (CRI or hook server container resources) from ``res``."""
    for name in _RESOURCE_SCALARS:
        setattr(msg, name, getattr(res, name))
    msg.unified.clear()
    msg.unified.update(dict(res.unified))
    del msg.hugepage_limits[:]
    for page_size, limit in res.hugepage_limits:
        msg.hugepage_limits.add(page_size=page_size, limit=limit)


_M = TypeVar("_M", bound=Message)


def verbose_config(info: Mapping[str, str], message: _M) -> _M | None:
    """Parse the ``config`` object of containerd's verbose ``info`` JSON into ``message``."""
    raw = info.get("info")
    if not raw:
        return None
    try:
        config = json.loads(raw).get("config")
        if not isinstance(config, dict):
            return None
        json_format.ParseDict(config, message, ignore_unknown_fields=True)
    except (ValueError, json_format.ParseError, AttributeError) as exc:
        log.warning("cannot parse runtime's verbose config", error=str(exc))
        return None
    return message


def rewrite_run_pod_sandbox(msg: api_pb2.RunPodSandboxRequest, plan: Plan) -> None:
    msg.config.labels.update(plan.labels)
    msg.config.annotations.update(plan.annotations)
    if plan.cgroup_parent is not None:
        msg.config.linux.cgroup_parent = plan.cgroup_parent


def rewrite_create_container(msg: api_pb2.CreateContainerRequest, plan: Plan) -> None:
    set_linux_resources(msg.config.linux.resources, plan.resources)
    if plan.envs:
        _set_envs(msg.config, plan.envs)
    msg.config.annotations.update(plan.annotations)
    if plan.cgroup_parent is not None:
        msg.sandbox_config.linux.cgroup_parent = plan.cgroup_parent


def rewrite_update_container_resources(msg: api_pb2.UpdateContainerResourcesRequest, plan: Plan) -> None:
    if plan.resources:
        set_linux_resources(msg.linux, plan.resources)
    msg.annotations.update(plan.annotations)


def set_linux_resources(target: api_pb2.LinuxContainerResources, changes: ResourceChanges) -> None:
    """Write plan resource changes into a LinuxContainerResources message. Every field the plan
    names is set as given, including an empty cpuset, which clears it (Koordinator's rule)."""
    for name in _SCALAR_RESOURCES.intersection(changes):
        setattr(target, name, changes[name])  # an int or a str, as its field (ResourceChanges checked)
    if changes.unified is not None:
        target.unified.clear()
        target.unified.update(changes.unified)
    if changes.hugepage_limits is not None:
        del target.hugepage_limits[:]
        for page_size, limit in changes.hugepage_limits:
            target.hugepage_limits.add(page_size=page_size, limit=limit)


def _set_envs(config: api_pb2.ContainerConfig, envs: Mapping[str, str]) -> None:
    """Set env values: an existing key keeps its place and gets the new value; new keys are
    appended in the plan's order. Other entries, duplicates included, stay as kubelet sent them."""
    remaining = dict(envs)
    for kv in config.envs:
        if kv.key in remaining:
            kv.value = remaining[kv.key]
    present = {kv.key for kv in config.envs}
    for key, value in remaining.items():
        if key not in present:
            config.envs.add(key=key, value=value)


def update_resources(msg: api_pb2.UpdateContainerResourcesRequest) -> Resources | None:
    """The resources an UpdateContainerResources request carries (None when it has none); which
    of them change the container is the lifecycle table's rule
    (``runtime_proxy.engine.table.update_facts``)."""
    return resources_from_pb(msg.linux) if msg.HasField("linux") else None


def verbose_sandbox_id(info: Mapping[str, str]) -> str:
    """The sandbox id in containerd's verbose ``info`` JSON of a container ("" when unreadable)."""
    try:
        sandbox_id = json.loads(info.get("info", "{}")).get("sandboxID", "")
    except ValueError:
        return ""
    return str(sandbox_id) if sandbox_id else ""
