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

from hooks.facts import ContainerFacts, NodeFacts, PodFacts
from hooks.plan import Plan
from hooks.spec import hookimpl
from koord_formats import FormatError, keys
from koord_formats.pod import parse_device_allocated

ENV_VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"


def gpu_minors(pod: PodFacts, plan: Plan) -> list[int] | None:
    """The GPU minors allocated to the pod, None when it has none or the annotation is bad."""
    raw = pod.annotations.get(keys.ANNOTATION_DEVICE_ALLOCATED)
    if not raw:
        return None
    try:
        devices = parse_device_allocated(raw)
    except FormatError as exc:
        plan.skip(f"pod {pod.namespace}/{pod.name}: {exc}")
        return None
    gpus = devices.get(keys.DEVICE_TYPE_GPU, ())
    return [g.minor for g in gpus] or None


@hookimpl
def rhp_pre_create_container(pod: PodFacts, container: ContainerFacts, node: NodeFacts) -> Plan | None:
    plan = Plan()
    minors = gpu_minors(pod, plan)
    if minors:
        plan.set_env(ENV_VISIBLE_DEVICES, ",".join(str(m) for m in minors))
    return plan
