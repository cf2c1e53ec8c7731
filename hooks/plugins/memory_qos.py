"""memory_qos: ``memory.min``, ``memory.low`` and ``memory.high`` by QoS class on cgroup v2
(Koordinator's memory QoS, koordlet's CgroupReconcile).

Stage
    ``reconcile_usage`` (the usage loop, every sampling round): it is the stage that sees every
    pod at once, which the kube-QoS directories' sums need, and the node's memory, which
    ``memory.high`` of a container without a limit needs.
Inputs
    NodeSLO ``resourceQOSStrategy.{lsrClass,lsClass,beClass,systemClass}.memoryQOS``: ``enable``,
    ``minLimitPercent``, ``lowLimitPercent``, ``throttlingPercent`` (0..100; the typed rule
    ``node.rules.memory_qos(class)``, parsed once per NodeSLO update by
    ``koord_formats.nodeslo.memory_qos``; a class whose ``enable`` is false takes 0 for each, as
    koordlet's ``NoneMemoryQOS``). The pod's class: its label ``koordinator.sh/qosClass`` (LSE
    reads the LSR section), else its Kubernetes QoS class (Guaranteed and Burstable read
    ``lsClass``, BestEffort ``beClass``). The pod annotation ``koordinator.sh/memoryQOS``
    (``koord_formats.nodeslo.memory_qos_for_pod``): policy ``none`` turns memory QoS off for the
    pod (0, 0, max), ``auto`` starts from the class's defaults even where the NodeSLO disables
    the class, ``default`` (or no policy) from the NodeSLO's class values; the annotation's
    fields (``minLimitPercent``, ``lowLimitPercent``, ``throttlingPercent``) replace those. A
    malformed annotation is recorded as a skip and the class values apply. Each container's
    memory request and limit: for a pod labelled BE its ``kubernetes.io/batch-memory``, else
    its plain ``memory``, from the pod annotation ``node.koordinator.sh/extended-resource-spec``
    when present, else from the pod spec the node agent read from the cluster
    (``PodFacts.batch_resources``); CRI carries neither request. A container without a limit
    there takes its CRI memory limit, else the
    node's MemTotal (koordlet takes the node's allocatable memory, which the node agent does not
    read).
Decision (koordlet's cgreconcile, per field)
    container: ``memory.min`` = request x minLimitPercent / 100, ``memory.low`` = request x
    lowLimitPercent / 100, ``memory.high`` = request + (limit - request) x throttlingPercent /
    100 rounded down to a page, ``max`` when throttlingPercent is 0; ``memory.low`` and
    ``memory.high`` are raised to ``memory.min`` when below it. Pod: ``memory.min`` and
    ``memory.low`` of the sum of its containers' requests (no ``memory.high``). kube-QoS
    directories: ``burstable`` and ``besteffort`` take the sums of ``memory.min`` and
    ``memory.low`` of their pods; the kubepods directory (Guaranteed's, the others' parent) takes
    the sums over every pod, so a child's protection is never cut by its parent.
Outputs
    writes ``kubeqos``, then ``pod``, then ``container`` levels, each ``memory.min``,
    ``memory.low`` (and ``memory.high`` for containers), in that order. Nothing at all while no
    class of the NodeSLO has a ``memoryQOS`` section (kubelet's and the runtime's values stay).
cgroup v1
    nothing is written: mainline kernels have ``memory.min``/``low``/``high`` on cgroup v2 only
    (koordlet writes them on v1 only where the Anolis / Alibaba Cloud Linux kernel adds them to
    the v1 memory controller). The plan records one skip saying so; ``runtime-proxy doctor``
    reports the plugin as not ready.
Leaves alone
    ``memory.max`` (kubelet's and ``batch_resource``'s), the Anolis-only fields
    (``wmarkRatio``, ``wmarkScalePermill``, ``wmarkMinAdj``, ``priorityEnable``, ``priority``,
    ``oomKillGroup``: parsed and validated, not written), pods whose memory request is unknown
    (recorded as a skip), containers without an id. A pod annotation alone does not make the
    plugin plan: some class of the NodeSLO must have a ``memoryQOS`` section.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction

from hooks.facts import NodeFacts, PodFacts, container_cgroup_path, kube_qos_cgroup_path, pod_cgroup_path
from hooks.plan import Plan
from hooks.spec import hookimpl
from hooks.usage import Usage
from koord_formats import FormatError, keys, nodeslo
from koord_formats.pod import MAX_BATCH_MEMORY_BYTES, ContainerResourceSpec, parse_extended_resource_spec

__all__ = [
    "PAGE_SIZE",
    "V1_SKIP",
    "ContainerMemory",
    "container_memory",
    "container_values",
    "pod_values",
    "rhp_reconcile_usage",
]

PAGE_SIZE = 4096
V1_SKIP = ("memory QoS needs cgroup v2 (memory.min, memory.low, memory.high); this node runs cgroup v1, "
           "where only Anolis kernels have them: nothing written")
_KUBE_QOS = ("Guaranteed", "Burstable", "BestEffort")


@dataclass(frozen=True)
class ContainerMemory:
    """One container's memory request and limit in bytes (0: not given)."""

    request: int = 0
    limit: int = 0


def _bytes(section: Mapping[str, Fraction], name: str) -> int:
    value = section.get(name)
    if value is None or value <= 0:
        return 0
    amount = -(-value.numerator // value.denominator)
    if amount > MAX_BATCH_MEMORY_BYTES:
        raise FormatError(f"{name}: {amount} is above {MAX_BATCH_MEMORY_BYTES}")
    return amount


def container_memory(pod: PodFacts) -> dict[str, ContainerMemory] | None:
    """Container name -> its memory request and limit (batch-memory for a pod labelled BE,
    plain memory otherwise), from the extended-resource-spec annotation when present, else
    from the pod spec; None when neither is known. ``FormatError`` when the one used is
    malformed or an amount is above its bound."""
    raw = pod.annotations.get(keys.ANNOTATION_EXTENDED_RESOURCE_SPEC)
    specs: Mapping[str, ContainerResourceSpec] | None
    specs = parse_extended_resource_spec(raw) if raw else pod.batch_resources
    if specs is None:
        return None
    name = keys.RESOURCE_BATCH_MEMORY if pod.qos_label == keys.QOS_BE else keys.RESOURCE_MEMORY
    return {c: ContainerMemory(_bytes(s.requests, name), _bytes(s.limits, name)) for c, s in specs.items()}


def pod_values(request: int, cfg: nodeslo.MemoryQOS) -> tuple[int, int]:
    """The pod's (memory.min, memory.low) from the sum of its containers' requests."""
    low_min = request * cfg.min_limit_percent // 100
    low = request * cfg.low_limit_percent // 100
    if 0 < low < low_min:
        low = low_min
    return low_min, low


def container_values(mem: ContainerMemory, cfg: nodeslo.MemoryQOS, node_memory: int) -> tuple[int, int, int | None]:
    """A container's (memory.min, memory.low, memory.high); memory.high None for "max", and
    -1 when there is no limit and no node memory to take instead (then it is not written)."""
    low_min, low = pod_values(mem.request, cfg)
    if cfg.throttling_percent == 0:
        return low_min, low, None
    limit = mem.limit if mem.limit > 0 else node_memory
    if limit <= 0:
        return low_min, low, -1
    high = (mem.request + (limit - mem.request) * cfg.throttling_percent // 100) // PAGE_SIZE * PAGE_SIZE
    if 0 < high < low_min:
        high = low_min
    return low_min, low, high


def _node_memory(usage: Usage) -> int:
    return usage.samples[-1].node_memory_total_bytes if usage.samples else 0


@hookimpl
def rhp_reconcile_usage(node: NodeFacts, pods: tuple[PodFacts, ...], usage: Usage) -> Plan | None:
    rules = node.rules
    if not rules.memory_qos_configured:
        return None
    plan = Plan()
    if node.cgroup.version != 2:
        return plan.skip(V1_SKIP)
    node_memory = _node_memory(usage)
    sums = {q: [0, 0] for q in _KUBE_QOS}
    seen: set[str] = set()
    pod_writes: list[tuple[str, int, int]] = []
    container_writes: list[tuple[str, int, int, int | None]] = []
    for pod in pods:
        who = f"pod {pod.namespace}/{pod.name}"
        qos_class = pod.qos_class
        class_key = keys.SLO_CLASS_KEYS.get(qos_class)
        if class_key is None:
            plan.skip(f"{who}: no QoS class; memory QoS left alone")
            continue
        problems: list[str] = []
        cfg = nodeslo.memory_qos_for_pod(rules.memory_qos(class_key), class_key,
                                         pod.annotations.get(keys.ANNOTATION_POD_MEMORY_QOS), problems)
        for problem in problems:
            plan.skip(f"{who}: {problem}; the node's memory QoS for its class applies")
        try:
            memory = container_memory(pod)
            path = pod_cgroup_path(pod)
        except (FormatError, ValueError) as exc:
            plan.skip(f"{who}: {exc}; memory QoS left alone")
            continue
        if memory is None:
            plan.skip(f"{who}: memory requests unknown (no pod spec from the cluster); memory QoS left alone")
            continue
        pod_min, pod_low = pod_values(sum(m.request for m in memory.values()), cfg)
        pod_writes.append((path, pod_min, pod_low))
        kube_qos = pod.effective_kube_qos
        if kube_qos in sums:
            sums[kube_qos][0] += pod_min
            sums[kube_qos][1] += pod_low
            seen.add(kube_qos)
        for container in pod.containers:
            if not container.id:
                continue
            mem = memory.get(container.name, ContainerMemory())
            if mem.limit <= 0 and container.resources.memory_limit_in_bytes > 0:
                mem = ContainerMemory(mem.request, container.resources.memory_limit_in_bytes)
            try:
                cpath = container_cgroup_path(pod, container.id, node.cgroup.driver)
            except ValueError as exc:
                plan.skip(f"{who} container {container.name}: {exc}")
                continue
            container_writes.append((cpath, *container_values(mem, cfg, node_memory)))
    if seen:
        # the kubepods directory is Guaranteed's and the parent of the other two: every pod's sum
        totals = (sum(v[0] for v in sums.values()), sum(v[1] for v in sums.values()))
        for kube_qos in _KUBE_QOS:
            if kube_qos == "Guaranteed":
                value_min, value_low = totals
            elif kube_qos in seen:
                value_min, value_low = sums[kube_qos]
            else:
                continue
            qpath = kube_qos_cgroup_path(kube_qos, node.cgroup)
            plan.write("kubeqos", qpath, "memory.min", value_min).write("kubeqos", qpath, "memory.low", value_low)
    for path, value_min, value_low in pod_writes:
        plan.write("pod", path, "memory.min", value_min).write("pod", path, "memory.low", value_low)
    for path, value_min, value_low, high in container_writes:
        plan.write("container", path, "memory.min", value_min).write("container", path, "memory.low", value_low)
        if high is None:
            plan.write("container", path, "memory.high", "max")
        elif high > 0:
            plan.write("container", path, "memory.high", high)
    return plan
