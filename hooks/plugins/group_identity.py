"""group_identity: ``cpu.bvt_warp_ns`` per QoS class (Alibaba Cloud Linux / Anolis "group
identity"), with Koordinator's NodeSLO keys and defaults.

Stages
    ``pre_run_pod_sandbox`` (pod cgroup), ``reconcile_pod`` (pod cgroup), ``reconcile_node``
    (kube-QoS directories).
Inputs
    NodeSLO ``resourceQOSStrategy.{lsrClass,lsClass,beClass,systemClass}.cpuQOS.{enable,
    groupIdentity,schedIdle}`` (defaults: groupIdentity LSR 2, LS 2, BE -1, SYSTEM 0; ``enable``
    false; a class that is not enabled gets 0) and ``resourceQOSStrategy.policies.cpuPolicy``
    (group identity applies when it is empty or ``groupIdentity``); pod label
    ``koordinator.sh/qosClass`` (LSE and LSR take the LSR value; without a label the kube QoS
    decides: Guaranteed -> LSR value if LSR is enabled else LS value, Burstable -> LS,
    BestEffort -> BE); pod annotation ``koordinator.sh/cpuQOS`` (``{"enable":true,
    "groupIdentity":-1}``, honoured for LS pods only; ``enable`` false -> 0).
Outputs
    writes ``pod``/``cpu.bvt_warp_ns``; ``kubeqos``/``cpu.bvt_warp_ns`` (guaranteed dir 0,
    burstable dir the LS value, besteffort dir the BE value). When no class is enabled,
    ``pre_run_pod_sandbox`` plans nothing and the reconcile stages reset every value to 0.
cpu.idle alternative (kernels without group identity, such as this one)
    with ``policies.cpuPolicy: coreSched`` group identity is off and each pod of a class whose
    cpuQOS is enabled gets ``cpu.idle`` = that class's ``schedIdle`` (0 or 1, default 0; the
    Koordinator docs use 1 for BE) at pod level. We do not set ``cpu.idle`` on the kube-QoS
    directories: on ``kubepods/besteffort`` it makes kubelet's cpu.shares writes fail
    (Koordinator issue #2732).
Leaves alone
    containers, core-scheduling cookies, the ``kernel.sched_group_identity_enabled`` sysctl.
"""

from __future__ import annotations

from hooks.facts import NodeFacts, PodFacts, kube_qos_cgroup_path, pod_cgroup_path
from hooks.plan import Plan
from hooks.spec import hookimpl
from koord_formats import FormatError, keys, nodeslo
from koord_formats.keys import SLO
from koord_formats.pod import parse_pod_cpu_qos

BVT_FILE = "cpu.bvt_warp_ns"
IDLE_FILE = "cpu.idle"


def pod_class_key(pod: PodFacts, node: NodeFacts) -> str | None:
    """The NodeSLO class whose value the pod takes, None for "0"."""
    qos = pod.qos_label
    if qos:
        return keys.SLO_CLASS_KEYS[qos]
    kube = pod.effective_kube_qos
    if kube == "Guaranteed":
        return SLO.LSR_CLASS if node.rules.cpu_qos(SLO.LSR_CLASS).enable else SLO.LS_CLASS
    return {"Burstable": SLO.LS_CLASS, "BestEffort": SLO.BE_CLASS}.get(kube)


def pod_bvt_value(pod: PodFacts, node: NodeFacts, plan: Plan) -> int:
    """The pod's ``cpu.bvt_warp_ns``."""
    raw = pod.annotations.get(keys.ANNOTATION_POD_CPU_QOS)
    if pod.qos_label == keys.QOS_LS and raw:
        try:
            cfg = parse_pod_cpu_qos(raw)
        except FormatError as exc:
            plan.skip(f"pod {pod.namespace}/{pod.name}: bad {keys.ANNOTATION_POD_CPU_QOS}: {exc}; using the LS value")
        else:
            if not cfg.enable:
                return 0
            if cfg.group_identity is not None:
                return cfg.group_identity
            return nodeslo.DEFAULT_GROUP_IDENTITY[SLO.LS_CLASS]
    key = pod_class_key(pod, node)
    return node.rules.class_bvt_value(key) if key else 0


def _pod_plan(pod: PodFacts, node: NodeFacts, *, reconcile: bool) -> Plan:
    plan = Plan()
    policy = node.rules.cpu_policy
    try:
        path = pod_cgroup_path(pod)
    except ValueError as exc:
        return plan.skip(f"pod {pod.namespace}/{pod.name}: {exc}")
    if policy == keys.CPU_POLICY_CORE_SCHED:
        key = pod_class_key(pod, node)
        if key:
            q = node.rules.cpu_qos(key)
            if q.enable:
                plan.write("pod", path, IDLE_FILE, 1 if q.sched_idle else 0)
        return plan
    if policy not in ("", keys.CPU_POLICY_GROUP_IDENTITY):
        return plan
    if not node.rules.group_identity_enabled:
        if reconcile:
            plan.write("pod", path, BVT_FILE, 0)
        return plan
    plan.write("pod", path, BVT_FILE, pod_bvt_value(pod, node, plan))
    return plan


@hookimpl
def rhp_pre_run_pod_sandbox(pod: PodFacts, node: NodeFacts) -> Plan | None:
    return _pod_plan(pod, node, reconcile=False)


@hookimpl
def rhp_reconcile_pod(pod: PodFacts, node: NodeFacts) -> Plan | None:
    return _pod_plan(pod, node, reconcile=True)


@hookimpl
def rhp_reconcile_node(node: NodeFacts) -> Plan | None:
    plan = Plan()
    if node.rules.cpu_policy not in ("", keys.CPU_POLICY_GROUP_IDENTITY):
        return plan
    enabled = node.rules.group_identity_enabled
    values = {
        "Guaranteed": 0,
        "Burstable": node.rules.class_bvt_value(SLO.LS_CLASS) if enabled else 0,
        "BestEffort": node.rules.class_bvt_value(SLO.BE_CLASS) if enabled else 0,
    }
    for kube_qos, value in values.items():
        plan.write("kubeqos", kube_qos_cgroup_path(kube_qos, node.cgroup), BVT_FILE, value)
    return plan
