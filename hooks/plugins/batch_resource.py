"""batch_resource: give BE pods the CPU and memory limits of their batch resources.

Stages
    ``pre_run_pod_sandbox`` and ``reconcile_pod`` (pod cgroup files), ``pre_create_container``,
    ``pre_update_container_resources`` and ``reconcile_container`` (CRI resources).
Inputs
    pods labelled ``koordinator.sh/qosClass: BE`` only (the raw label, as Koordinator); their
    batch resources from the pod annotation ``node.koordinator.sh/extended-resource-spec``
    (``{"containers":{"c1":{"requests":{"kubernetes.io/batch-cpu":"1000"},"limits":{...}}}}``,
    batch-cpu in milli-cores, batch-memory in bytes or a quantity such as "4Gi"; Koordinator's
    webhook, or ours, writes it), else from the pod spec's container resources as the node agent
    read them from the cluster (``PodFacts.batch_resources``; CRI does not carry them): the
    annotation wins when present, even when it does not parse (a skip); NodeSLO
    ``resourceUsedThresholdWithBE.{enable,cpuSuppressPolicy}`` (``cfsQuota`` forces quotas to
    -1); node annotation ``node.koordinator.sh/cpu-normalization-ratio`` (> 1 divides quotas,
    rounding up).
Outputs
    container: CRI ``cpu_shares`` (from the batch-cpu request, when given), ``cpu_quota`` (from
    the limit, -1 without one), ``memory_limit_in_bytes`` (from the batch-memory limit, -1
    without one). Pod: writes ``pod``/``cpu.shares`` (sum of requests), ``cpu.cfs_quota_us`` and
    ``memory.limit_in_bytes`` (sums of limits, -1 if any container is unlimited). When the
    NodeSLO makes BE pods SCHED_IDLE (``policies.cpuPolicy: coreSched`` with
    ``beClass.cpuQOS.enable`` and ``schedIdle: 1``, written by group_identity), the pod's
    ``cpu.shares`` is left out, because the kernel refuses shares on an idle cgroup; the
    omission is recorded as a skip.
Leaves alone
    pods that are not labelled BE, pods with neither the annotation nor known batch resources,
    containers neither lists, ``mid-cpu``/``mid-memory``. Malformed annotations and amounts above
    ``koord_formats.pod.MAX_BATCH_MILLI_CPU`` / ``MAX_BATCH_MEMORY_BYTES`` are recorded as skips.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction

from hooks.facts import (
    ContainerFacts,
    NodeFacts,
    PodFacts,
    cpu_normalization_ratio,
    milli_cpu_to_quota,
    milli_cpu_to_shares,
    normalize_cpu_quota,
    pod_cgroup_path,
)
from hooks.plan import Plan
from hooks.spec import hookimpl
from koord_formats import FormatError, keys
from koord_formats.keys import SLO
from koord_formats.pod import ContainerResourceSpec, batch_amounts
from koord_formats.pod import parse_extended_resource_spec as parse_spec_annotation


@dataclass(frozen=True)
class BatchSpec:
    """One container's batch resources; None means "not given"."""

    cpu_request: int | None = None  # milli-cores
    cpu_limit: int | None = None  # milli-cores
    memory_limit: int | None = None  # bytes


def _batch_specs(specs: Mapping[str, ContainerResourceSpec], what: str, *, listed: bool = True) -> dict[str, BatchSpec]:
    """Container name -> batch spec; ``FormatError`` for an amount above its bound. With
    ``listed`` false (the pod spec, which also carries the plain memory request for
    ``memory_qos``), a container that asks for no batch resource is left out."""
    out: dict[str, BatchSpec] = {}
    for name, spec in specs.items():
        requests = batch_amounts(spec.requests, f"{what} {name[:64]} requests")
        limits = batch_amounts(spec.limits, f"{what} {name[:64]} limits")
        if not listed and not requests and not limits:
            continue
        out[name] = BatchSpec(requests.get(keys.RESOURCE_BATCH_CPU), limits.get(keys.RESOURCE_BATCH_CPU),
                              limits.get(keys.RESOURCE_BATCH_MEMORY))
    return out


def parse_extended_resource_spec(pod: PodFacts) -> dict[str, BatchSpec] | None:
    """Container name -> batch spec from the annotation; None when absent. ``FormatError`` when
    malformed."""
    raw = pod.annotations.get(keys.ANNOTATION_EXTENDED_RESOURCE_SPEC)
    if not raw:
        return None
    return _batch_specs(parse_spec_annotation(raw), keys.ANNOTATION_EXTENDED_RESOURCE_SPEC)


def batch_specs(pod: PodFacts) -> dict[str, BatchSpec] | None:
    """Container name -> batch spec: from the annotation when present, else from the pod spec's
    batch resources when known (``PodFacts.batch_resources``); None when neither.
    ``FormatError`` (naming its source) when the one used is malformed."""
    annotation = parse_extended_resource_spec(pod)
    if annotation is not None:
        return annotation
    if pod.batch_resources:
        return _batch_specs(pod.batch_resources, "pod spec", listed=False) or None
    return None


def _specs(pod: PodFacts, plan: Plan) -> dict[str, BatchSpec] | None:
    if pod.qos_label != keys.QOS_BE:
        return None
    try:
        return batch_specs(pod)
    except FormatError as exc:
        source = (keys.ANNOTATION_EXTENDED_RESOURCE_SPEC if pod.annotations.get(keys.ANNOTATION_EXTENDED_RESOURCE_SPEC)
                  else "batch resources in the pod spec")
        plan.skip(f"pod {pod.namespace}/{pod.name}: bad {source}: {exc}")
        return None


def _cpu_suppress_cfs_quota(node: NodeFacts) -> bool:
    suppress = node.rules.cpu_suppress.value
    return suppress.enable and suppress.cpu_suppress_policy == keys.CPU_SUPPRESS_POLICY_CFS_QUOTA


def _normalization_ratio(node: NodeFacts, plan: Plan) -> Fraction:
    try:
        return cpu_normalization_ratio(node)
    except FormatError as exc:
        plan.skip(f"bad {keys.NODE_ANNOTATION_CPU_NORMALIZATION_RATIO}: {exc}; ignored")
        return Fraction(1)


def batch_quota(milli_limit: int | None, node: NodeFacts, plan: Plan) -> int:
    """CFS quota for a batch-cpu limit with CPU suppress and normalization applied."""
    if milli_limit is None or _cpu_suppress_cfs_quota(node):
        return -1
    return normalize_cpu_quota(milli_cpu_to_quota(milli_limit), _normalization_ratio(node, plan))


def _container_plan(pod: PodFacts, container: ContainerFacts, node: NodeFacts) -> Plan:
    plan = Plan()
    specs = _specs(pod, plan)
    if not specs or container.name not in specs:
        return plan
    spec = specs[container.name]
    if spec.cpu_request is not None:
        plan.set_resource("cpu_shares", milli_cpu_to_shares(spec.cpu_request))
    plan.set_resource("cpu_quota", batch_quota(spec.cpu_limit, node, plan))
    plan.set_resource("memory_limit_in_bytes", spec.memory_limit if spec.memory_limit else -1)
    return plan


def be_pods_are_idle(node: NodeFacts) -> bool:
    """Whether group_identity makes BE pod cgroups SCHED_IDLE (``cpu.idle`` 1) on this node."""
    if node.rules.cpu_policy != keys.CPU_POLICY_CORE_SCHED:
        return False
    q = node.rules.cpu_qos(SLO.BE_CLASS)
    return q.enable and bool(q.sched_idle)


def _pod_plan(pod: PodFacts, node: NodeFacts) -> Plan:
    plan = Plan()
    specs = _specs(pod, plan)
    if not specs:
        return plan
    try:
        path = pod_cgroup_path(pod)
    except ValueError as exc:
        return plan.skip(f"pod {pod.namespace}/{pod.name}: {exc}")
    values = list(specs.values())
    if be_pods_are_idle(node):
        plan.skip(f"pod {pod.namespace}/{pod.name}: BE pods are SCHED_IDLE here; pod cpu.shares left alone")
    else:
        plan.write("pod", path, "cpu.shares", milli_cpu_to_shares(sum(v.cpu_request or 0 for v in values)))
    cpu_limits = [v.cpu_limit for v in values]
    if any(v is None or v <= 0 for v in cpu_limits):
        quota = -1
    else:
        quota = batch_quota(sum(v for v in cpu_limits if v is not None), node, plan)
    plan.write("pod", path, "cpu.cfs_quota_us", quota)
    mem_limits = [v.memory_limit for v in values]
    memory = -1 if any(not v for v in mem_limits) else sum(v for v in mem_limits if v)
    plan.write("pod", path, "memory.limit_in_bytes", memory)
    return plan


@hookimpl
def rhp_pre_run_pod_sandbox(pod: PodFacts, node: NodeFacts) -> Plan | None:
    return _pod_plan(pod, node)


@hookimpl
def rhp_reconcile_pod(pod: PodFacts, node: NodeFacts) -> Plan | None:
    return _pod_plan(pod, node)


@hookimpl
def rhp_pre_create_container(pod: PodFacts, container: ContainerFacts, node: NodeFacts) -> Plan | None:
    return _container_plan(pod, container, node)


@hookimpl
def rhp_pre_update_container_resources(pod: PodFacts, container: ContainerFacts, node: NodeFacts) -> Plan | None:
    return _container_plan(pod, container, node)


@hookimpl
def rhp_reconcile_container(pod: PodFacts, container: ContainerFacts, node: NodeFacts) -> Plan | None:
    return _container_plan(pod, container, node)
