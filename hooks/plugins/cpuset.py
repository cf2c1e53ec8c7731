"""cpuset: bind LSE/LSR containers to their CPUs and put everyone else on the share pools.

Stages
    ``pre_run_pod_sandbox`` (pod ``cpu.cfs_quota_us`` -1 for bound pods: those with a trusted
    cpuset, never LS, BE or label-less pods), ``pre_create_container``
    and ``pre_update_container_resources`` (``cpuset_cpus``; ``cpu_quota`` -1 for bound pods),
    ``reconcile_pod`` (pod quota, sandbox ``cpuset.cpus``), ``reconcile_container``
    (``cpuset_cpus`` through the runtime, so running LS containers follow the share pools).
Inputs
    pod label ``koordinator.sh/qosClass`` (raw, no fallback, as Koordinator's hook reads it) and
    the kube QoS implied by the cgroup parent; pod annotation
    ``scheduling.koordinator.sh/resource-status`` (``cpuset``, ``numaNodeResources``); node
    annotations ``node.koordinator.sh/cpu-shared-pools`` (else pools computed from
    ``node.cpu_topology`` minus ``node.bound_cpusets``, kubelet allocations, the reservation and
    exclusive system-QoS CPUs), ``node.koordinator.sh/system-qos-resource``,
    ``kubelet.koordinator.sh/cpu-manager-policy``.
Decision order (Koordinator ``cpusetRule.getContainerCPUSet``)
    1. resource-status ``cpuset`` verbatim when the node trusts it (``hooks.facts.trusted_cpuset``:
    an LSE or LSR pod, CPUs of this node, none held by an older pod; otherwise it is ignored,
    recorded as a skip, and the pod goes on as if it had no cpuset); 2. ``numaNodeResources`` with CPU ->
    the LS share pools of those NUMA nodes (BE pools only with ``BE_CPU_MANAGER``, off as in
    Koordinator); 3. SYSTEM with a system-QoS cpuset -> it; 4. LS -> all LS share pools;
    5. kube BestEffort -> "" (clears the request's cpuset); 6. kubelet ``static`` -> untouched;
    otherwise all LS share pools.
Outputs
    CRI ``cpuset_cpus`` and ``cpu_quota``; writes ``pod``/``cpu.cfs_quota_us`` and
    ``sandbox``/``cpuset.cpus``.
Leaves alone
    ``cpuset_mems`` (plugin ``numa``), pods under kubelet's static policy without a decision,
    and everything when the input is malformed (recorded as a skip).
"""

from __future__ import annotations

from hooks.facts import (
    ContainerFacts,
    NodeFacts,
    PodFacts,
    ResourceStatus,
    all_share_pool_cpus,
    container_cgroup_path,
    format_cpu_list,
    kubelet_cpu_manager_policy,
    pod_cgroup_path,
    pod_resource_status,
    share_pools,
    system_qos_cpuset,
    trusted_cpuset,
)
from hooks.plan import Plan
from hooks.spec import hookimpl
from koord_formats import keys

# Koordinator's feature gate BECPUManager (default off): BE pods bound to NUMA nodes take the
# BE share pools of those nodes instead of the LS ones.
BE_CPU_MANAGER = False


def _status(pod: PodFacts, plan: Plan) -> ResourceStatus | None:
    """The pod's resource-status, or None (absent or malformed, which is recorded)."""
    try:
        return pod_resource_status(pod.annotations)
    except ValueError as exc:
        plan.skip(f"pod {pod.namespace}/{pod.name}: bad resource-status: {exc}")
        return None


def bound_cpus(pod: PodFacts, node: NodeFacts, plan: Plan) -> frozenset[int]:
    """The CPUs the pod is bound to: its resource-status cpuset when the node trusts it
    (``hooks.facts.trusted_cpuset``), else none; an untrusted cpuset is recorded as a skip."""
    status = _status(pod, plan)
    cpus, refusal = trusted_cpuset(pod, status, node)
    if refusal and status is not None:
        plan.skip(
            f"pod {pod.namespace}/{pod.name} (uid {pod.uid}): resource-status cpuset "
            f"{format_cpu_list(status.cpuset)[:64]} ignored: {refusal}"
        )
    return cpus


def _ls_pools(node: NodeFacts, plan: Plan, *, be: bool = False) -> str | None:
    try:
        pools = share_pools(node, be=be)
    except ValueError as exc:
        plan.skip(f"bad cpu share pools: {exc}")
        return None
    cpus = all_share_pool_cpus(pools)
    if not cpus:
        plan.skip("cpu share pools are unknown (no annotation and no CPU topology)")
        return None
    return format_cpu_list(cpus)


def plan_container_cpuset(pod: PodFacts, node: NodeFacts, plan: Plan) -> str | None:
    """The cpuset a container of ``pod`` gets, "" to clear it, None to leave it untouched."""
    status = _status(pod, Plan())
    if status is None and pod.annotations.get(keys.ANNOTATION_RESOURCE_STATUS):
        _status(pod, plan)
        return None  # malformed: recorded, leave alone
    bound = bound_cpus(pod, node, plan)
    if bound:
        return format_cpu_list(bound)
    if status is not None:
        numa_nodes = {n.node for n in status.numa_node_resources if n.has_cpu()}
        if numa_nodes:
            be = BE_CPU_MANAGER and pod.qos_label == keys.QOS_BE
            try:
                pools = share_pools(node, be=be)
            except ValueError as exc:
                plan.skip(f"bad cpu share pools: {exc}")
                return None
            cpus = all_share_pool_cpus(p for p in pools if p.node in numa_nodes)
            if not cpus:
                plan.skip(f"no share pool CPUs on NUMA nodes {sorted(numa_nodes)}")
                return None
            return format_cpu_list(cpus)
    qos = pod.qos_label
    if qos == keys.QOS_SYSTEM:
        try:
            system = system_qos_cpuset(node)
        except ValueError as exc:
            plan.skip(f"bad system-qos-resource: {exc}")
            system = frozenset()
        if system:
            return format_cpu_list(system)
    if qos == keys.QOS_LS:
        return _ls_pools(node, plan)
    if pod.effective_kube_qos == "BestEffort":
        return ""
    if kubelet_cpu_manager_policy(node) == "static":
        return None
    return _ls_pools(node, plan)


def _pod_path(pod: PodFacts, plan: Plan) -> str | None:
    try:
        return pod_cgroup_path(pod)
    except ValueError as exc:
        plan.skip(f"pod {pod.namespace}/{pod.name}: {exc}")
        return None


def _unset_pod_quota(pod: PodFacts, node: NodeFacts, plan: Plan, *, record: bool = True) -> None:
    if bound_cpus(pod, node, plan if record else Plan()) and (path := _pod_path(pod, plan)) is not None:
        plan.write("pod", path, "cpu.cfs_quota_us", -1)


def _container_plan(pod: PodFacts, node: NodeFacts, *, reconcile: bool) -> Plan:
    plan = Plan()
    cpuset = plan_container_cpuset(pod, node, plan)
    if cpuset is not None and not (reconcile and cpuset == ""):
        plan.set_resource("cpuset_cpus", cpuset)
    if bound_cpus(pod, node, Plan()):
        plan.set_resource("cpu_quota", -1)
    return plan


@hookimpl
def rhp_pre_run_pod_sandbox(pod: PodFacts, node: NodeFacts) -> Plan | None:
    plan = Plan()
    _unset_pod_quota(pod, node, plan)
    return plan


@hookimpl
def rhp_pre_create_container(pod: PodFacts, container: ContainerFacts, node: NodeFacts) -> Plan | None:
    return _container_plan(pod, node, reconcile=False)


@hookimpl
def rhp_pre_update_container_resources(pod: PodFacts, container: ContainerFacts, node: NodeFacts) -> Plan | None:
    return _container_plan(pod, node, reconcile=False)


@hookimpl
def rhp_reconcile_pod(pod: PodFacts, node: NodeFacts) -> Plan | None:
    plan = Plan()
    _unset_pod_quota(pod, node, plan, record=False)  # the container plans record a refusal
    if pod.sandbox_id:
        cpuset = plan_container_cpuset(pod, node, Plan())
        if cpuset:
            try:
                path = container_cgroup_path(pod, pod.sandbox_id, node.cgroup.driver)
                plan.write("sandbox", path, "cpuset.cpus", cpuset)
            except ValueError as exc:
                plan.skip(f"pod {pod.namespace}/{pod.name}: {exc}")
    return plan


@hookimpl
def rhp_reconcile_container(pod: PodFacts, container: ContainerFacts, node: NodeFacts) -> Plan | None:
    return _container_plan(pod, node, reconcile=True)
