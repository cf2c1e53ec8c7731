"""The NRI codec (containerd's Node Resource Interface): pods and containers to facts, plans into
container adjustments and updates. Pure; called by the NRI door (``runtime_proxy.nri.adapter``)
and the loops' view of it (``runtime_proxy.nri.backend``)."""

from __future__ import annotations

from collections.abc import Mapping

from cri_protos import nri_pb2
from hooks.facts import ContainerFacts, PodFacts, Resources, frozen_map
from hooks.plan import Plan, ResourceChanges

__all__ = [
    "adjustment",
    "container_facts",
    "linux_resources",
    "pod_facts",
    "resources_from_nri",
    "stopped_sandboxes",
    "synchronized",
]


def resources_from_nri(res: nri_pb2.LinuxResources) -> Resources:
    """``Resources`` from an NRI ``LinuxResources`` (unset optional values read as 0)."""
    cpu, mem = res.cpu, res.memory
    return Resources(
        cpu_period=cpu.period.value if cpu.HasField("period") else 0,
        cpu_quota=cpu.quota.value if cpu.HasField("quota") else 0,
        cpu_shares=cpu.shares.value if cpu.HasField("shares") else 0,
        memory_limit_in_bytes=mem.limit.value if mem.HasField("limit") else 0,
        memory_swap_limit_in_bytes=mem.swap.value if mem.HasField("swap") else 0,
        cpuset_cpus=cpu.cpus,
        cpuset_mems=cpu.mems,
        unified=frozen_map(dict(res.unified)),
        hugepage_limits=tuple((h.page_size, h.limit) for h in res.hugepage_limits),
    )


def pod_facts(pod: nri_pb2.PodSandbox) -> PodFacts:
    return PodFacts(
        name=pod.name,
        namespace=pod.namespace,
        uid=pod.uid,
        labels=frozen_map(dict(pod.labels)),
        annotations=frozen_map(dict(pod.annotations)),
        cgroup_parent=pod.linux.cgroup_parent,
        runtime_handler=pod.runtime_handler,
        sandbox_id=pod.id,
    )


def container_facts(container: nri_pb2.Container) -> ContainerFacts:
    envs: dict[str, str] = {}
    for entry in container.env:
        key, sep, value = entry.partition("=")
        if sep and key:
            envs[key] = value
    resources = resources_from_nri(container.linux.resources)
    if container.linux.HasField("oom_score_adj"):
        resources = resources.with_changes({"oom_score_adj": container.linux.oom_score_adj.value})
    return ContainerFacts(
        name=container.name,
        id=container.id,
        labels=frozen_map(dict(container.labels)),
        annotations=frozen_map(dict(container.annotations)),
        resources=resources,
        envs=frozen_map(envs),
    )


def linux_resources(changes: Mapping[str, object]) -> tuple[nri_pb2.LinuxResources, list[str]]:
    """An NRI ``LinuxResources`` for the plan's resource changes (a ``ResourceChanges``, or what
    ``ResourceChanges.parse`` takes: ``PlanError`` otherwise), and the names NRI cannot carry (an
    empty cpuset, which NRI reads as "no change"; ``oom_score_adj``, which is not a resource)."""
    res = nri_pb2.LinuxResources()
    carried: set[str] = set()
    c = ResourceChanges.parse(changes)  # the same object when it already is one
    if c.cpu_period is not None and c.cpu_period > 0:
        res.cpu.period.value = c.cpu_period
        carried.add("cpu_period")
    if c.cpu_quota is not None and c.cpu_quota != 0:
        res.cpu.quota.value = c.cpu_quota
        carried.add("cpu_quota")
    if c.cpu_shares is not None and c.cpu_shares > 0:
        res.cpu.shares.value = c.cpu_shares
        carried.add("cpu_shares")
    if c.memory_limit_in_bytes is not None and c.memory_limit_in_bytes != 0:
        res.memory.limit.value = c.memory_limit_in_bytes
        carried.add("memory_limit_in_bytes")
    if c.memory_swap_limit_in_bytes is not None and c.memory_swap_limit_in_bytes != 0:
        res.memory.swap.value = c.memory_swap_limit_in_bytes
        carried.add("memory_swap_limit_in_bytes")
    if c.cpuset_cpus:
        res.cpu.cpus = c.cpuset_cpus
        carried.add("cpuset_cpus")
    if c.cpuset_mems:
        res.cpu.mems = c.cpuset_mems
        carried.add("cpuset_mems")
    if c.unified:
        res.unified.update(c.unified)
        carried.add("unified")
    if c.hugepage_limits:
        for page_size, limit in c.hugepage_limits:
            res.hugepage_limits.add(page_size=page_size, limit=limit)
        carried.add("hugepage_limits")
    return res, [name for name in c if name not in carried]


def adjustment(plan: Plan) -> tuple[nri_pb2.ContainerAdjustment, list[str]]:
    """The ``ContainerAdjustment`` for a ``PreCreateContainer`` plan, and what it cannot carry."""
    adjust = nri_pb2.ContainerAdjustment()
    res, skipped = linux_resources(plan.resources)
    skipped = [name for name in skipped if name != "oom_score_adj"]  # set below, outside the resources
    if res.ListFields():
        adjust.linux.resources.CopyFrom(res)
    if plan.resources.oom_score_adj is not None:
        adjust.linux.oom_score_adj.value = plan.resources.oom_score_adj
    for key, value in plan.envs.items():
        adjust.env.add(key=key, value=value)
    adjust.annotations.update(plan.annotations)
    if plan.cgroup_parent is not None:
        skipped.append("cgroup_parent")
    return adjust, skipped


def stopped_sandboxes(pods: list[nri_pb2.PodSandbox], containers: list[nri_pb2.Container]) -> list[str]:
    """The ids of the sandboxes a Synchronize reports stopped: no pid and no running container,
    when the runtime reports the pid of some sandbox (containerd reports none for a NotReady
    sandbox, whose task is gone; a runtime that reports no pid at all cannot be read so)."""
    if not any(pod.pid for pod in pods):
        return []
    running = {c.pod_sandbox_id for c in containers if c.state == nri_pb2.CONTAINER_RUNNING}
    return [pod.id for pod in pods if not pod.pid and pod.id not in running]


def synchronized(containers: list[nri_pb2.Container]) -> list[tuple[str, ContainerFacts, bool, bool]]:
    """A Synchronize's containers as facts: ``(sandbox id, facts, running, stopped)`` each."""
    return [(c.pod_sandbox_id, container_facts(c), c.state == nri_pb2.CONTAINER_RUNNING,
             c.state == nri_pb2.CONTAINER_STOPPED) for c in containers]
