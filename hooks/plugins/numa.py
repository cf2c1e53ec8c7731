"""numa: bind a NUMA-aligned pod's memory to its NUMA nodes (our addition; koordlet never sets
``cpuset.mems``).

Stages
    ``pre_create_container``, ``pre_update_container_resources``, ``reconcile_container``.
Inputs
    pod annotation ``scheduling.koordinator.sh/resource-status`` ``numaNodeResources`` (the
    NUMA nodes the scheduler placed the pod on; entries with all-zero resources are ignored) and
    the node's NUMA topology (``node.cpu_topology``, read from sysfs by the proxy) to check the
    nodes exist.
Outputs
    CRI ``cpuset_mems`` ("0" or "0-1").
Leaves alone
    pods without ``numaNodeResources`` (memory placement stays with the kernel policy),
    ``cpuset_cpus`` (plugin ``cpuset``); malformed annotations and unknown NUMA nodes are
    recorded as skips.
"""

from __future__ import annotations

from hooks.facts import ContainerFacts, NodeFacts, PodFacts, format_cpu_list, pod_resource_status
from hooks.plan import Plan
from hooks.spec import hookimpl


def plan_cpuset_mems(pod: PodFacts, node: NodeFacts, plan: Plan) -> str | None:
    """The ``cpuset.mems`` of the pod's containers, or None for no opinion."""
    try:
        status = pod_resource_status(pod.annotations)
    except ValueError as exc:
        plan.skip(f"pod {pod.namespace}/{pod.name}: bad resource-status: {exc}")
        return None
    if status is None:
        return None
    nodes = {n.node for n in status.numa_node_resources if any(v for v in n.resources.values())}
    if not nodes:
        return None
    topo = node.cpu_topology
    if topo is not None and topo.cpus:
        unknown = nodes - set(topo.numa_nodes)
        if unknown:
            plan.skip(f"pod {pod.namespace}/{pod.name}: NUMA nodes {sorted(unknown)} do not exist on this node")
            return None
    return format_cpu_list(nodes)


def _plan(pod: PodFacts, node: NodeFacts) -> Plan:
    plan = Plan()
    mems = plan_cpuset_mems(pod, node, plan)
    if mems is not None:
        plan.set_resource("cpuset_mems", mems)
    return plan


@hookimpl
def rhp_pre_create_container(pod: PodFacts, container: ContainerFacts, node: NodeFacts) -> Plan | None:
    return _plan(pod, node)


@hookimpl
def rhp_pre_update_container_resources(pod: PodFacts, container: ContainerFacts, node: NodeFacts) -> Plan | None:
    return _plan(pod, node)


@hookimpl
def rhp_reconcile_container(pod: PodFacts, container: ContainerFacts, node: NodeFacts) -> Plan | None:
    return _plan(pod, node)
