"""cpu_normalization: Koordinator's CPU normalization for LS and label-less pods.

Stages
    ``pre_run_pod_sandbox`` (pod ``cpu.cfs_quota_us``, only when the pod's containers are
    known, as in the planner; kubelet's sandbox request carries no quota),
    ``pre_create_container`` and ``pre_update_container_resources`` (CRI ``cpu_quota`` and the
    record annotation), ``reconcile_pod`` (pod ``cpu.cfs_quota_us``) and
    ``reconcile_container`` (CRI ``cpu_quota`` through the runtime and the container's
    ``cpu.cfs_quota_us``).
Inputs
    node annotation ``node.koordinator.sh/cpu-normalization-ratio`` ("1.00" to "5.00", at most
    two decimals; missing or "1.00" = off; anything else is a logged skip that changes
    nothing), which the manager (``colocation_manager``, or koord-manager) writes from
    slo-controller-config's ``cpu-normalization-config`` and the ``cpu-basic-info`` the node
    reports (``koord_formats.cpunormalization``); pod label ``koordinator.sh/qosClass`` (LS or
    none) and the pod annotation ``scheduling.koordinator.sh/resource-status`` (a pod with a
    ``cpuset`` is left alone);
    the container's CRI ``cpu_quota`` and its annotation
    ``runtimeproxy.koordinator.sh/cpu-quota-normalization`` (``"<kubelet's quota>/<applied>"``,
    written here at creation; containerd keeps it, so the proxy knows kubelet's quota after a
    restart).
Outputs
    quota' = ceil(quota / ratio) when ratio > 1 and quota > 0 (``hooks.facts.container_cpu_quota``,
    the one function that decides an LS container's quota; ``cpu_burst`` and the cfsQuotaBurst
    loop take the same value as their base and ceiling). CRI ``cpu_quota`` at create and
    update, and the record annotation (the proxy's store keeps an update's record until it
    restarts). At reconcile: the container's quota (CRI and ``cpu.cfs_quota_us``) and the
    pod's ``cpu.cfs_quota_us`` = the sum of its containers' normalized quotas (never below a
    container, so the kernel never refuses a child; Koordinator's ceil of the sum can be a few
    microseconds lower), only when every container has a quota and a record. A ratio change
    makes the reconciler run: it writes pod quotas that grow first, then the containers, then
    pod quotas that shrink (``runtime_proxy.loops.reconciler``), and inside a container the
    applier grows a quota before its ``cpu.cfs_burst_us`` and shrinks it after
    (``runtime_proxy.host.apply``): no child ever exceeds its parent, no burst its quota.
Composition with CPU burst
    When the pod's cfsQuotaBurst is on, the burst loop scales the container and pod quotas
    above the normalized base; the reconcile stages then write quotas only when the base
    itself changes (the runtime's quota differs from the target), so they never undo the
    loop's scaling. With cfsQuotaBurst off and a ratio above 1, the quotas are kept at their
    targets every round (a quota changed by hand is repaired); with the ratio off, only a
    quota this plugin had divided is given back its original.
Order
    After ``cpuset`` (which unsets the quota of bound pods; those are never normalized, so the
    two never claim the same field) and ``batch_resource`` (BE batch quotas, divided by the same
    ratio there), before ``cpu_burst`` (its burst is derived from the normalized quota).
Leaves alone
    LSE, LSR, BE and SYSTEM pods, pods with a cpuset, containers without a quota, containers
    without the record outside creation (they may be normalized already), and a quota the
    record does not explain (changed by an update before a restart).
"""

from __future__ import annotations

from hooks.facts import (
    ContainerFacts,
    CPUQuota,
    NodeFacts,
    PodFacts,
    container_cgroup_path,
    container_cpu_quota,
    cpu_normalization_applies,
    cpu_normalization_ratio,
    pod_cgroup_path,
    pod_cpu_burst_config,
)
from hooks.plan import Plan
from hooks.spec import hookimpl
from koord_formats import FormatError, keys
from koord_formats.node import format_cpu_quota_record

QUOTA_FILE = "cpu.cfs_quota_us"


def _decide(pod: PodFacts, container: ContainerFacts, node: NodeFacts, stage: str, plan: Plan) -> CPUQuota | None:
    try:
        decision = container_cpu_quota(pod, container, node, stage=stage)
    except FormatError as exc:
        plan.skip(f"pod {pod.namespace}/{pod.name}: {exc}; quota left alone")
        return None
    return decision if decision.decided else None


def _quota_burst_on(pod: PodFacts, node: NodeFacts) -> bool:
    return pod_cpu_burst_config(pod, node).cfs_quota_burst_enabled


def _record_only(pod: PodFacts, container: ContainerFacts, plan: Plan) -> Plan:
    """At creation with an unusable ratio: the quota stays kubelet's, but it is recorded, so a
    later valid ratio can normalize the container."""
    quota = container.resources.cpu_quota
    try:
        applies = cpu_normalization_applies(pod)
    except FormatError:
        return plan
    if applies and quota > 0:
        plan.set_annotation(keys.ANNOTATION_CPU_QUOTA_NORMALIZATION, format_cpu_quota_record(quota, quota))
    return plan


def _request_plan(pod: PodFacts, container: ContainerFacts, node: NodeFacts, stage: str) -> Plan:
    plan = Plan()
    decision = _decide(pod, container, node, stage, plan)
    if decision is None:
        return _record_only(pod, container, plan) if stage == "create" and plan.skipped else plan
    if decision.quota != container.resources.cpu_quota:
        plan.set_resource("cpu_quota", decision.quota)
    plan.set_annotation(
        keys.ANNOTATION_CPU_QUOTA_NORMALIZATION, format_cpu_quota_record(decision.original, decision.quota)
    )
    return plan


def _ratio_on(node: NodeFacts) -> bool:
    try:
        return cpu_normalization_ratio(node) > 1
    except FormatError:
        return False


def _reconcile_container_plan(pod: PodFacts, container: ContainerFacts, node: NodeFacts) -> Plan:
    plan = Plan()
    if not container.id:
        return plan
    decision = _decide(pod, container, node, "running", plan)
    if decision is None:
        return plan
    changed = decision.quota != container.resources.cpu_quota
    if not changed and (_quota_burst_on(pod, node) or not _ratio_on(node)):
        return plan
    try:
        path = container_cgroup_path(pod, container.id, node.cgroup.driver)
    except ValueError as exc:
        return plan.skip(f"pod {pod.namespace}/{pod.name}: {exc}")
    plan.set_resource("cpu_quota", decision.quota)
    plan.write("container", path, QUOTA_FILE, decision.quota)
    return plan


def _pod_plan(pod: PodFacts, node: NodeFacts, stage: str) -> Plan:
    plan = Plan()
    if not pod.containers:
        return plan
    try:
        if not cpu_normalization_applies(pod):
            return plan
    except FormatError as exc:
        return plan.skip(f"pod {pod.namespace}/{pod.name}: {exc}; quota left alone")
    total = 0
    changed = False
    for container in pod.containers:
        decision = _decide(pod, container, node, stage, Plan())
        if decision is None or decision.quota <= 0:
            # A container without a quota makes the pod unlimited; one without a record has a
            # quota this plugin does not know: the pod's quota stays kubelet's.
            return plan
        total += decision.quota
        changed = changed or decision.quota != container.resources.cpu_quota
    if not changed and (_quota_burst_on(pod, node) or not _ratio_on(node)):
        return plan
    try:
        path = pod_cgroup_path(pod)
    except ValueError as exc:
        return plan.skip(f"pod {pod.namespace}/{pod.name}: {exc}")
    plan.write("pod", path, QUOTA_FILE, total)
    return plan


@hookimpl
def rhp_pre_run_pod_sandbox(pod: PodFacts, node: NodeFacts) -> Plan | None:
    return _pod_plan(pod, node, "create")


@hookimpl
def rhp_pre_create_container(pod: PodFacts, container: ContainerFacts, node: NodeFacts) -> Plan | None:
    return _request_plan(pod, container, node, "create")


@hookimpl
def rhp_pre_update_container_resources(pod: PodFacts, container: ContainerFacts, node: NodeFacts) -> Plan | None:
    return _request_plan(pod, container, node, "update")


@hookimpl
def rhp_reconcile_pod(pod: PodFacts, node: NodeFacts) -> Plan | None:
    return _pod_plan(pod, node, "running")


@hookimpl
def rhp_reconcile_container(pod: PodFacts, container: ContainerFacts, node: NodeFacts) -> Plan | None:
    return _reconcile_container_plan(pod, container, node)
