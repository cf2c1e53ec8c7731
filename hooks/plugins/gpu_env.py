"""gpu_env: tell the NVIDIA container runtime which GPUs the scheduler allocated.

Stages
    ``pre_create_container``.
Inputs
    pod annotation ``scheduling.koordinator.sh/device-allocated``, its ``gpu`` list of
    ``{"minor": <int>, ...}``.
Outputs
    env ``NVIDIA_VISIBLE_DEVICES=<minor>,<minor>`` (minor numbers, in allocation order, as
    Koordinator's ``hooks/gpu``).
Leaves alone
    pods without GPUs; the HAMi-core envs and mounts (``koordinator.sh/gpu-isolation-provider``)
    and RDMA devices are not injected. Malformed annotations are recorded as skips.
"""

from __future__ import annotations

from collections.abc import Mapping

from hooks.facts import ANNOTATION_DEVICE_ALLOCATED, ContainerFacts, NodeFacts, PodFacts, load_json_annotation
from hooks.plan import Plan
from hooks.spec import hookimpl

ENV_VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"


def gpu_minors(pod: PodFacts, plan: Plan) -> list[int] | None:
    """The GPU minors allocated to the pod, None when it has none or the annotation is bad."""
    try:
        data = load_json_annotation(pod.annotations, ANNOTATION_DEVICE_ALLOCATED)
    except ValueError as exc:
        plan.skip(f"pod {pod.namespace}/{pod.name}: {exc}")
        return None
    if data is None:
        return None
    if not isinstance(data, Mapping):
        plan.skip(f"pod {pod.namespace}/{pod.name}: device-allocated must be a JSON object")
        return None
    gpus = data.get("gpu")
    if not gpus:
        return None
    if not isinstance(gpus, list):
        plan.skip(f"pod {pod.namespace}/{pod.name}: device-allocated gpu must be a list")
        return None
    minors: list[int] = []
    for item in gpus:
        minor = item.get("minor") if isinstance(item, Mapping) else None
        if isinstance(minor, bool) or not isinstance(minor, int) or minor < 0:
            plan.skip(f"pod {pod.namespace}/{pod.name}: bad GPU allocation {item!r}")
            return None
        minors.append(minor)
    return minors


@hookimpl
def rhp_pre_create_container(pod: PodFacts, container: ContainerFacts, node: NodeFacts) -> Plan | None:
    plan = Plan()
    minors = gpu_minors(pod, plan)
    if minors:
        plan.set_env(ENV_VISIBLE_DEVICES, ",".join(str(m) for m in minors))
    return plan
